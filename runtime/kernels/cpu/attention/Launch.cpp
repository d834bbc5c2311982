//===- Launch.cpp - launch checks shared by the attention kernels ---------===//

#include "runtime/kernels/cpu/attention/Launch.h"

#include <cstring>

#include "runtime/plan/PlanFormat.h"

namespace moec::runtime::cpu::attention {

float *floatTensor(const KernelContext &ctx, const TensorRef &t, const char *what,
                   std::vector<int64_t> dims) {
  ctx.expectShape(t, what, std::move(dims));
  if (t.dtype != plan::F32)
    ctx.fail(std::string(what) + " must be f32, got " + plan::dtypeName(t.dtype));
  return static_cast<float *>(t.data);
}

const float *checkBackward(const KernelContext &ctx, size_t numOperands,
                           const std::vector<int64_t> &differentiable, int64_t rows, int64_t cols) {
  std::vector<int64_t> wanted =
      checks::attention::checkGradOutputs(ctx, numOperands, differentiable, /*bf16=*/false);
  for (size_t i = 0; i < wanted.size(); ++i) {
    const TensorRef &grad = ctx.out(i);
    std::memset(grad.data, 0, static_cast<size_t>(grad.numel()) * sizeof(float));
  }
  if (!checks::attention::hasResultGradient(ctx, numOperands))
    return nullptr;
  return floatTensor(ctx, ctx.inputs.back(), "result gradient", {rows, cols});
}

float *gradFor(const KernelContext &ctx, int64_t operand) {
  int64_t out = ctx.gradOutputFor(operand);
  return out < 0 ? nullptr : ctx.out(static_cast<size_t>(out)).f32();
}

} // namespace moec::runtime::cpu::attention
