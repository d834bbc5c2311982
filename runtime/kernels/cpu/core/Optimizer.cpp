//===- Optimizer.cpp - AdamW and gradient norms on the device's buffers ---===//
//
// The trainer's optimizer step runs where the adapter lives:
//  - sum_squares: out[i] = Σ in_i², each input's sum in double (stored f32), for the
//    global gradient norm of clip_grad_norm_ (the host takes the square root of the sum);
//  - adamw: in place on (param, adam_m, adam_v) from grad, PyTorch's arithmetic
//    (checks/core/AdamW.h), with clip_grad_norm_'s factor as `grad_scale`.
//
//===----------------------------------------------------------------------===//

#include "runtime/kernels/checks/core/AdamW.h"
#include "runtime/kernels/cpu/core/CoreCommon.h"

namespace moec::runtime::cpu::core {

namespace {

void sumSquares(KernelContext &ctx) {
  const TensorRef &result = ctx.out(0);
  ctx.expectShape(result, "result", {static_cast<int64_t>(ctx.inputs.size())});
  float *out = floats(ctx, result, "result");
  for (size_t i = 0; i < ctx.inputs.size(); ++i) {
    const float *g = floats(ctx, ctx.inputs[i], "a gradient");
    double sum = 0;
    for (int64_t j = 0; j < ctx.inputs[i].numel(); ++j)
      sum += static_cast<double>(g[j]) * g[j];
    out[i] = static_cast<float>(sum);
  }
}

void adamw(KernelContext &ctx) {
  AdamWConstants c = checks::core::adamwLaunch(ctx);
  const TensorRef &grad = ctx.in(0), &param = ctx.out(0), &m = ctx.out(1), &v = ctx.out(2);
  const float *g = floats(ctx, grad, "grad");
  float *p = floats(ctx, param, "param"), *pm = floats(ctx, m, "adam_m"), *pv = floats(ctx, v, "adam_v");
  ctx.parallelFor(param.numel(), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      adamwElement(c, p[i], g[i], pm[i], pv[i]);
  });
}

} // namespace

void registerOptimizerKernels(KernelRegistry &registry) {
  registry.add("sum_squares", sumSquares);
  registry.add("adamw", adamw);
}

} // namespace moec::runtime::cpu::core
