//===- AdamW.h - one AdamW element update, host and device ------*- C++ -*-===//
//
// PyTorch's single-tensor AdamW arithmetic (torch.optim.AdamW, foreach off),
// written once for the trainer's reference (runtime/train/Optimizer.cpp) and
// the `adamw` kernels of both backends, so that they cannot drift apart.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CHECKS_CORE_ADAMW_H_
#define RUNTIME_KERNELS_CHECKS_CORE_ADAMW_H_

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define MOEC_HOST_DEVICE __host__ __device__
#else
#define MOEC_HOST_DEVICE
#endif

namespace moec::runtime {

/// The per-step constants, in float as PyTorch passes its Python floats to the kernels.
struct AdamWConstants {
  float w1, w2, beta2, stepSize, sqrtCorrection2, decay, eps;
  double gradScale; // clip_grad_norm_'s factor (1: no clipping)
};

/// Optimizer step `step` (0-based) at learning rate `lr`.
inline AdamWConstants adamwConstants(double lr, int64_t step, double beta1, double beta2, double eps,
                                     double weightDecay, double gradScale) {
  const double t = static_cast<double>(step + 1);
  AdamWConstants c;
  c.w1 = static_cast<float>(1.0 - beta1); // 1 - beta in double, then to float
  c.w2 = static_cast<float>(1.0 - beta2);
  c.beta2 = static_cast<float>(beta2);
  c.stepSize = static_cast<float>(lr / (1.0 - std::pow(beta1, t)));
  c.sqrtCorrection2 = static_cast<float>(std::sqrt(1.0 - std::pow(beta2, t)));
  c.decay = static_cast<float>(1.0 - lr * weightDecay);
  c.eps = static_cast<float>(eps);
  c.gradScale = gradScale;
  return c;
}

/// Decoupled weight decay, then the moments (m.lerp_(g, 1 - beta1), v = v beta2 + (1 - beta2) g²),
/// then p -= stepSize m / (sqrt(v) / sqrt(1 - beta2^t) + eps). The gradient is scaled first
/// (in double, rounded to float) when clipping applies.
MOEC_HOST_DEVICE inline void adamwElement(const AdamWConstants &c, float &param, float grad, float &m,
                                          float &v) {
  if (c.gradScale != 1.0)
    grad = static_cast<float>(grad * c.gradScale);
  param *= c.decay;
  m = m + c.w1 * (grad - m);
  v = v * c.beta2 + c.w2 * (grad * grad);
  float denom = sqrtf(v) / c.sqrtCorrection2 + c.eps;
  param -= c.stepSize * (m / denom);
}

} // namespace moec::runtime

#endif // RUNTIME_KERNELS_CHECKS_CORE_ADAMW_H_
