//===- Flops.h - FLOPs of one step, for reports and MFU ---------*- C++ -*-===//
//
// Counts multiply-adds (2 FLOPs each) of matrix products and attention,
// which dominate a training step; elementwise ops and norms count as 0.
// Causal attention visits S/2 keys per query on average (a sliding window
// at most `window`); a backward costs its forward times the number of
// inputs it differentiates (at most 2), and 2.5 times for attention and
// linear attention, which also recompute their scores.
//
//===----------------------------------------------------------------------===//

#ifndef COMPILER_PLAN_FLOPS_H_
#define COMPILER_PLAN_FLOPS_H_

#include <cstdint>

#include "compiler/plan/Program.h"

namespace moec::compiler {

int64_t estimateFlops(mlir::Operation *op, const ProgramStep &step, const Program &program);

} // namespace moec::compiler

#endif // COMPILER_PLAN_FLOPS_H_
