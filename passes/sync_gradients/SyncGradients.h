//===- SyncGradients.h - gradients summed over ranks ------------*- C++ -*-===//

#ifndef PASSES_SYNC_GRADIENTS_SYNCGRADIENTS_H_
#define PASSES_SYNC_GRADIENTS_SYNCGRADIENTS_H_

#include "dialects/moe/MoeOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Pass/Pass.h"

namespace moec::passes {

#define GEN_PASS_DECL_SYNCGRADIENTSPASS
#define GEN_PASS_REGISTRATION
#include "passes/sync_gradients/SyncGradients.h.inc"

} // namespace moec::passes

#endif // PASSES_SYNC_GRADIENTS_SYNCGRADIENTS_H_
