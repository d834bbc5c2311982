//===- Optimizer.cpp - AdamW, the learning-rate schedule, clipping --------===//

#include "runtime/train/Optimizer.h"

#include <algorithm>
#include <cmath>

namespace moec::runtime {

double learningRate(const plan::Optimizer &o, int64_t step) {
  int64_t warmup = o.warmup_steps(), total = std::max<int64_t>(o.total_steps(), 1);
  // transformers' schedules: step / warmup (so the first step trains at lr 0, as the
  // Trainer does), then a cosine that stays at its floor past total_steps.
  if (step < warmup)
    return o.lr() * static_cast<double>(step) / static_cast<double>(warmup);
  if (o.schedule() != "cosine")
    return o.lr();
  double progress = total > warmup ? static_cast<double>(step - warmup) / (total - warmup) : 1.0;
  progress = std::min(progress, 1.0);
  double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return o.lr() * (o.min_lr_ratio() + (1.0 - o.min_lr_ratio()) * cosine);
}

void adamwUpdate(const plan::Optimizer &o, double lr, int64_t step, float *param, const float *grad,
                 float *m, float *v, int64_t n) {
  // In float, in PyTorch's order of operations (single-tensor AdamW, foreach off).
  // 1 - beta in double, then to float, as PyTorch passes these Python floats to its kernels.
  const float w1 = static_cast<float>(1.0 - o.beta1()), w2 = static_cast<float>(1.0 - o.beta2());
  const float b2 = static_cast<float>(o.beta2());
  const double t = static_cast<double>(step + 1);
  const double correction1 = 1.0 - std::pow(o.beta1(), t);
  const double correction2 = 1.0 - std::pow(o.beta2(), t);
  const float stepSize = static_cast<float>(lr / correction1);
  const float sqrtCorrection2 = static_cast<float>(std::sqrt(correction2));
  const float decay = static_cast<float>(1.0 - lr * o.weight_decay());
  const float eps = static_cast<float>(o.eps());
  for (int64_t i = 0; i < n; ++i) {
    param[i] *= decay;
    m[i] = m[i] + w1 * (grad[i] - m[i]); // torch: m.lerp_(grad, 1 - beta1)
    v[i] = v[i] * b2 + w2 * (grad[i] * grad[i]);
    float denom = std::sqrt(v[i]) / sqrtCorrection2 + eps;
    param[i] -= stepSize * (m[i] / denom);
  }
}

double globalNorm(const std::vector<std::pair<const float *, int64_t>> &grads) {
  double sum = 0;
  for (auto [data, n] : grads)
    for (int64_t i = 0; i < n; ++i)
      sum += static_cast<double>(data[i]) * data[i];
  return std::sqrt(sum);
}

double clipFactor(double norm, double maxNorm) {
  if (maxNorm <= 0)
    return 1.0;
  return std::min(1.0, maxNorm / (norm + 1e-6));
}

} // namespace moec::runtime
