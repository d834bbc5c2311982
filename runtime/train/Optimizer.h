//===- Optimizer.h - AdamW, the learning-rate schedule, clipping -*- C++ -*-===//
//
// The plan's Optimizer message says what to do; these functions do it the
// way PyTorch does (torch.optim.AdamW, clip_grad_norm_, and transformers'
// cosine schedule with warmup), so losses match a reference run step by step.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_TRAIN_OPTIMIZER_H_
#define RUNTIME_TRAIN_OPTIMIZER_H_

#include <cstdint>
#include <vector>

#include "runtime/plan/plan.pb.h"

namespace moec::runtime {

/// The learning rate for optimizer step `step` (0-based): linear warmup from 0
/// over `warmup_steps` (as transformers' schedules), then a cosine from lr down
/// to `min_lr_ratio * lr` at `total_steps`, or constant.
double learningRate(const plan::Optimizer &optimizer, int64_t step);

/// One AdamW update of `n` parameters, PyTorch's arithmetic: decoupled weight
/// decay, then moments, then p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps),
/// with t = step + 1.
void adamwUpdate(const plan::Optimizer &optimizer, double lr, int64_t step, float *param,
                 const float *grad, float *m, float *v, int64_t n);

/// The L2 norm of all gradients together, accumulated in double.
double globalNorm(const std::vector<std::pair<const float *, int64_t>> &grads);

/// The factor clip_grad_norm_ multiplies gradients by: min(1, max / (norm + 1e-6)); 1 when max is 0.
double clipFactor(double norm, double maxNorm);

} // namespace moec::runtime

#endif // RUNTIME_TRAIN_OPTIMIZER_H_
