//===- Optimizer.cpp - the learning-rate schedule, clipping ----------------===//

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

double clipFactor(double norm, double maxNorm) {
  if (maxNorm <= 0)
    return 1.0;
  return std::min(1.0, maxNorm / (norm + 1e-6));
}

} // namespace moec::runtime
