//===- CoreCommon.cpp - helpers shared by the core CPU kernels ------------===//

#include "runtime/kernels/cpu/core/CoreCommon.h"

#include <algorithm>
#include <cstring>

#include "runtime/kernels/cpu/CpuKernels.h"
#include "runtime/plan/PlanFormat.h"

namespace moec::runtime::cpu {

void registerCoreKernels(KernelRegistry &registry) {
  core::registerNormKernels(registry);
  core::registerDenseKernels(registry);
  core::registerElementwiseKernels(registry);
  core::registerTokenKernels(registry);
  core::registerLmHeadLossKernels(registry);
  core::registerRandomKernels(registry);
  core::registerOptimizerKernels(registry);
}

namespace core {

float roundToBf16(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u)
    return v;
  bits = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
  std::memcpy(&v, &bits, sizeof(bits));
  return v;
}

float *floats(const KernelContext &ctx, const TensorRef &t, const std::string &what) {
  if (t.dtype != plan::F32)
    ctx.fail(what + " must be f32, got " + plan::dtypeName(t.dtype) +
             " (the CPU backend computes in f32 only)");
  return static_cast<float *>(t.data);
}

LossTargets lossTargets(const KernelContext &ctx, const TensorRef &labels, int64_t rows, int64_t vocab) {
  int64_t ignore = ctx.attrInt("ignore_index", -100);
  bool shift = ctx.attrBool("shift_labels");
  // transformers' ForCausalLMLoss pads each sequence's labels with
  // ignore_index and scores position t against labels[t + 1]: the shift
  // never crosses into the next sequence, its last position never counts.
  LossTargets out;
  out.targets.assign(static_cast<size_t>(rows), -1);
  for (int64_t t = 0; t < rows; ++t) {
    bool lastOfSequence = shift && (t + 1) % ctx.seqLen == 0;
    if (lastOfSequence)
      continue;
    int64_t label = labels.index(shift ? t + 1 : t);
    if (label == ignore)
      continue;
    if (label < 0 || label >= vocab)
      ctx.fail("label " + std::to_string(label) + " at row " + std::to_string(shift ? t + 1 : t) +
               " is neither ignore_index (" + std::to_string(ignore) + ") nor in [0, " +
               std::to_string(vocab) + ")");
    out.targets[t] = label;
    ++out.counted;
  }
  return out;
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
