//===- CoreCommon.cpp - helpers shared by the core CPU kernels ------------===//

#include "runtime/kernels/cpu/core/CoreCommon.h"

#include <algorithm>

#include "runtime/kernels/cpu/CpuKernels.h"
#include "runtime/plan/PlanFormat.h"

namespace moec::runtime::cpu {

void registerCoreKernels(KernelRegistry &registry) {
  core::registerNormKernels(registry);
  core::registerDenseKernels(registry);
  core::registerElementwiseKernels(registry);
  core::registerTokenKernels(registry);
  core::registerRandomKernels(registry);
  core::registerOptimizerKernels(registry);
}

namespace core {

float *floats(const KernelContext &ctx, const TensorRef &t, const std::string &what) {
  if (t.dtype != plan::F32)
    ctx.fail(what + " must be f32, got " + plan::dtypeName(t.dtype) +
             " (the CPU backend computes in f32 only)");
  return static_cast<float *>(t.data);
}

std::vector<double> rowBlocks(const KernelContext &ctx, int64_t rows, int64_t width,
                              const std::function<void(int64_t, int64_t, double *)> &fn) {
  constexpr int64_t kBlockRows = 64;
  int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
  std::vector<double> partial(static_cast<size_t>(blocks * width), 0.0);
  ctx.parallelFor(blocks, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b)
      fn(b * kBlockRows, std::min(rows, (b + 1) * kBlockRows), partial.data() + b * width);
  });
  std::vector<double> sum(static_cast<size_t>(width), 0.0);
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t j = 0; j < width; ++j)
      sum[j] += partial[b * width + j];
  return sum;
}

} // namespace core
} // namespace moec::runtime::cpu
