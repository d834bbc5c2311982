//===- EmitPlan.h - serialise a placed Program as a plan --------*- C++ -*-===//

#ifndef COMPILER_PLAN_EMITPLAN_H_
#define COMPILER_PLAN_EMITPLAN_H_

#include "compiler/plan/Program.h"

namespace moec::compiler {

/// The plan of `programs` (one per pipeline stage, offsets assigned) for `model`: one rank
/// per rank of the model's mesh, each running its stage's program. The optimizer comes from
/// the model's moe.optimizer, the LoRA layout from the `lora` attribute --moe-inject-lora
/// leaves on the model.
mlir::FailureOr<plan::Plan> emitPlan(moe::ModelOp model, const std::vector<Program> &programs);

} // namespace moec::compiler

#endif // COMPILER_PLAN_EMITPLAN_H_
