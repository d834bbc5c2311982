//===- EmitPlan.h - serialise a placed Program as a plan --------*- C++ -*-===//

#ifndef COMPILER_PLAN_EMITPLAN_H_
#define COMPILER_PLAN_EMITPLAN_H_

#include "compiler/plan/Program.h"

namespace moec::compiler {

/// The plan of `program` (offsets assigned) for `model`, world size 1: its
/// optimizer comes from the model's moe.optimizer, its LoRA layout from the
/// `lora` attribute --moe-inject-lora leaves on the model.
mlir::FailureOr<plan::Plan> emitPlan(moe::ModelOp model, const Program &program);

} // namespace moec::compiler

#endif // COMPILER_PLAN_EMITPLAN_H_
