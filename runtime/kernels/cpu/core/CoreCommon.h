//===- CoreCommon.h - helpers shared by the core CPU kernels ----*- C++ -*-===//
//
// f32 tensors, the launch checks shared with the CUDA kernels, and a
// row-blocked reduction whose result does not depend on the thread count.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CPU_CORE_CORECOMMON_H_
#define RUNTIME_KERNELS_CPU_CORE_CORECOMMON_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/kernels/Kernel.h"
#include "runtime/kernels/checks/core/CoreChecks.h"

namespace moec::runtime::cpu::core {

/// The f32 data of `t`, or a failure naming `what`.
float *floats(const KernelContext &ctx, const TensorRef &t, const std::string &what);

/// `v` as bf16 storage holds it: rounded to the nearest (ties to even); NaN stays NaN. For the
/// values a fused kernel keeps where the unfused ops' bf16 results were rounded (the executor
/// rounds every bf16 buffer after its step, not what a kernel holds inside).
float roundToBf16(float v);

// The launch checks shared with the CUDA kernels (../../checks/core). The
// CPU kernels check gradients' storage type themselves, through floats().
using checks::core::BackwardLaunch;
using checks::core::expectIndices;
using checks::core::expectRowsShape;
using checks::core::expectSameShape;
using checks::core::rowsOf;
using checks::core::shapeText;
using checks::core::RowSumOfSquaresShape;
using checks::core::ShardedRmsNormShape;

/// The class each of `rows` rows is scored against (-1: it does not count) and how many
/// count, from `labels` [rows] under the launch's ignore_index and shift_labels
/// (transformers' causal-LM shift, per sequence); fails on a label that is neither
/// ignore_index nor in [0, vocab). cross_entropy and lm_head_cross_entropy share it.
struct LossTargets {
  std::vector<int64_t> targets;
  int64_t counted = 0;
};
LossTargets lossTargets(const KernelContext &ctx, const TensorRef &labels, int64_t rows, int64_t vocab);

/// Runs fn(begin, end, partial) over rows [0, rows) in fixed blocks of rows,
/// in parallel, each block adding into its own `width` doubles; returns the
/// blocks' sums added in block order. Blocks do not depend on the thread
/// count, so neither does the result.
std::vector<double> rowBlocks(const KernelContext &ctx, int64_t rows, int64_t width,
                              const std::function<void(int64_t, int64_t, double *)> &fn);

/// The registration functions of each file.
void registerNormKernels(KernelRegistry &registry);
void registerDenseKernels(KernelRegistry &registry);
void registerElementwiseKernels(KernelRegistry &registry);
void registerTokenKernels(KernelRegistry &registry);
/// lm_head_cross_entropy (LmHeadLoss.cpp): the LM head fused with the loss (--moe-fuse).
void registerLmHeadLossKernels(KernelRegistry &registry);
/// fill_random (Random.cpp): random weights, as on the GPU (../../RandomFill.h).
void registerRandomKernels(KernelRegistry &registry);
/// sum_squares and adamw (Optimizer.cpp): the trainer's optimizer step.
void registerOptimizerKernels(KernelRegistry &registry);

} // namespace moec::runtime::cpu::core

#endif // RUNTIME_KERNELS_CPU_CORE_CORECOMMON_H_
