//===- BuildTrainingStep.h - the training step pass -------------*- C++ -*-===//

#ifndef PASSES_BUILD_TRAINING_STEP_BUILDTRAININGSTEP_H_
#define PASSES_BUILD_TRAINING_STEP_BUILDTRAININGSTEP_H_

#include "dialects/moe/MoeOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Pass/Pass.h"

namespace moec::passes {

#define GEN_PASS_DECL_BUILDTRAININGSTEPPASS
#define GEN_PASS_REGISTRATION
#include "passes/build_training_step/BuildTrainingStep.h.inc"

} // namespace moec::passes

#endif // PASSES_BUILD_TRAINING_STEP_BUILDTRAININGSTEP_H_
