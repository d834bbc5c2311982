//===- Optimizer.h - the learning-rate schedule, clipping ------*- C++ -*-===//
//
// The plan's Optimizer message says what to do; these functions do it the
// way PyTorch does (transformers' cosine schedule with warmup, clip_grad_norm_'s
// factor), so losses match a reference run step by step. AdamW's update itself
// is runtime/kernels/checks/core/AdamW.h, run by the `adamw` kernels.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_TRAIN_OPTIMIZER_H_
#define RUNTIME_TRAIN_OPTIMIZER_H_

#include <cstdint>

#include "runtime/plan/plan.pb.h"

namespace moec::runtime {

/// The learning rate for optimizer step `step` (0-based): linear warmup from 0
/// over `warmup_steps` (as transformers' schedules), then a cosine from lr down
/// to `min_lr_ratio * lr` at `total_steps`, or constant.
double learningRate(const plan::Optimizer &optimizer, int64_t step);

/// The factor clip_grad_norm_ multiplies gradients by: min(1, max / (norm + 1e-6)); 1 when max is 0.
double clipFactor(double norm, double maxNorm);

} // namespace moec::runtime

#endif // RUNTIME_TRAIN_OPTIMIZER_H_
