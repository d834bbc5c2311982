//===- Report.h - what one training step costs ------------------*- C++ -*-===//

#ifndef COMPILER_PLAN_REPORT_H_
#define COMPILER_PLAN_REPORT_H_

#include "compiler/plan/Program.h"
#include "llvm/Support/raw_ostream.h"

namespace moec::compiler {

/// Parameters (total, trainable), FLOPs per step by kernel and phase, and
/// memory per role for `program`, placed. The numbers come from the same
/// buffers and steps the plan holds.
void printReport(moe::ModelOp model, const Program &program, llvm::raw_ostream &os);

/// The collectives of a sharded program: per kind, axis and phase, how many per step, the
/// bytes this rank sends, and why the sharding needs them.
void printCollectives(moe::ModelOp model, const Program &program, llvm::raw_ostream &os);

} // namespace moec::compiler

#endif // COMPILER_PLAN_REPORT_H_
