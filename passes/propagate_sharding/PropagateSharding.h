//===- PropagateSharding.h - sharding over the mesh -------------*- C++ -*-===//

#ifndef PASSES_PROPAGATE_SHARDING_PROPAGATESHARDING_H_
#define PASSES_PROPAGATE_SHARDING_PROPAGATESHARDING_H_

#include "dialects/moe/MoeOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Pass/Pass.h"

namespace moec::passes {

#define GEN_PASS_DECL_PROPAGATESHARDINGPASS
#define GEN_PASS_REGISTRATION
#include "passes/propagate_sharding/PropagateSharding.h.inc"

} // namespace moec::passes

#endif // PASSES_PROPAGATE_SHARDING_PROPAGATESHARDING_H_
