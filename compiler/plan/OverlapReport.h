//===- OverlapReport.h - what runs under the communication --------*- C++ -*-===//

#ifndef COMPILER_PLAN_OVERLAPREPORT_H_
#define COMPILER_PLAN_OVERLAPREPORT_H_

#include <cstdint>
#include <vector>

#include "compiler/plan/Program.h"
#include "llvm/Support/raw_ostream.h"

namespace moec::compiler {

/// The rates the prediction assumes: the H200's measured ceilings (shared/docs/GPU.md).
struct OverlapRates {
  double flops = 802e12;        // bf16 GEMM, FLOP/s
  double memory = 4.27e12;      // device copy (read + write), bytes/s
  double allToAll = 279e9;      // NCCL all-to-all bus bandwidth, 2 GPUs over NVLink (the expert exchange)
  double allReduce = 314e9;     // NCCL all-reduce bus bandwidth, 2 GPUs (and pipeline sends)
};

/// Replays `program`'s steps on its streams with its events, each kernel taking its floor
/// (FLOPs at `rates.flops` or the bytes of its buffers at `rates.memory`, the larger) and each
/// collective the bytes this rank sends (`sentBytes`, one entry per step) at its bus bandwidth.
/// Prints the step's predicted time, the communication it leaves exposed (against the same step
/// on one stream), and per collective and phase what runs under it on the other stream.
void printOverlap(const Program &program, const std::vector<int64_t> &sentBytes, llvm::raw_ostream &os,
                  const OverlapRates &rates = {});

} // namespace moec::compiler

#endif // COMPILER_PLAN_OVERLAPREPORT_H_
