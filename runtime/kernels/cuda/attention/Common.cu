//===- Common.cu - host side of the CUDA attention kernels' shared pieces -===//

#include "runtime/kernels/cuda/attention/Common.cuh"

#include <algorithm>

#include "runtime/plan/PlanFormat.h"

namespace moec::runtime::cuda::attention {

//===----------------------------------------------------------------------===//
// RoPE
//===----------------------------------------------------------------------===//

RopeConsts ropeConsts(const KernelContext &ctx, const RopeSpec &spec) {
  if (spec.dim / 2 > kMaxRopeHalf)
    ctx.fail("rope.dim (" + std::to_string(spec.dim) + ") exceeds the CUDA kernels' limit of " +
             std::to_string(2 * kMaxRopeHalf));
  RopeConsts r{};
  r.half = static_cast<int>(spec.dim / 2);
  r.interleaved = spec.interleaved ? 1 : 0;
  r.factor = attentionFactor(spec);
  std::vector<float> inv = inverseFrequencies(spec);
  for (int i = 0; i < r.half; ++i)
    r.inv[i] = inv[static_cast<size_t>(i)];
  return r;
}

//===----------------------------------------------------------------------===//
// Launch checks
//===----------------------------------------------------------------------===//

namespace {

int isBf16(const KernelContext &ctx, const TensorRef &t, const char *what) {
  if (t.dtype == plan::F32)
    return 0;
  if (t.dtype == plan::BF16)
    return 1;
  ctx.fail(std::string(what) + " must be f32 or bf16, got " + plan::dtypeName(t.dtype));
}

} // namespace

FloatIn floatIn(const KernelContext &ctx, const TensorRef &t, const char *what,
                std::vector<int64_t> dims) {
  ctx.expectShape(t, what, std::move(dims));
  return FloatIn{t.data, isBf16(ctx, t, what)};
}

FloatOut floatOut(const KernelContext &ctx, const TensorRef &t, const char *what,
                  std::vector<int64_t> dims) {
  ctx.expectShape(t, what, std::move(dims));
  return FloatOut{t.data, isBf16(ctx, t, what)};
}

IndexIn indexIn(const KernelContext &ctx, const TensorRef &t, const char *what,
                std::vector<int64_t> dims) {
  return IndexIn{t.data, checks::attention::expectIndices(ctx, t, what, std::move(dims)) ? 1 : 0};
}

IndexOut indexOut(const KernelContext &ctx, const TensorRef &t, const char *what,
                  std::vector<int64_t> dims) {
  return IndexOut{t.data, checks::attention::expectIndices(ctx, t, what, std::move(dims)) ? 1 : 0};
}

FloatIn checkBackward(const KernelContext &ctx, size_t numOperands,
                      const std::vector<int64_t> &differentiable, int64_t rows, int64_t cols) {
  std::vector<int64_t> wanted =
      checks::attention::checkGradOutputs(ctx, numOperands, differentiable, /*bf16=*/true);
  FloatIn gradOut;
  if (checks::attention::hasResultGradient(ctx, numOperands))
    gradOut = floatIn(ctx, ctx.inputs.back(), "result gradient", {rows, cols});
  // Every output starts at zero, as on the CPU; the kernels then write what they compute.
  for (size_t i = 0; i < wanted.size(); ++i) {
    const TensorRef &grad = ctx.out(i);
    zeroFill(ctx, FloatOut{grad.data, grad.dtype == plan::BF16 ? 1 : 0}, grad.numel());
  }
  return gradOut;
}

FloatOut f32Statistics(const KernelContext &ctx, const TensorRef &t, int64_t tokens, int64_t heads) {
  FloatOut lse = floatOut(ctx, t, "logsumexp", {tokens, heads});
  if (lse.bf16)
    ctx.fail("logsumexp must be f32, got bf16");
  return lse;
}

FloatOut gradFor(const KernelContext &ctx, int64_t operand) {
  int64_t out = ctx.gradOutputFor(operand);
  if (out < 0)
    return FloatOut{};
  const TensorRef &t = ctx.out(static_cast<size_t>(out));
  return FloatOut{t.data, t.dtype == plan::BF16 ? 1 : 0};
}

//===----------------------------------------------------------------------===//
// Scratch and launches
//===----------------------------------------------------------------------===//

Scratch::~Scratch() {
  for (void *p : buffers)
    cudaFreeAsync(p, stream);
}

void *Scratch::bytes(size_t n) {
  void *p = nullptr;
  cudaError_t error = cudaMallocAsync(&p, std::max<size_t>(n, 16), stream);
  if (error != cudaSuccess)
    ctx.fail("cannot allocate " + std::to_string(n) + " bytes of scratch memory: " +
             cudaGetErrorString(error));
  buffers.push_back(p);
  return p;
}

size_t maxSharedBytes(const KernelContext &ctx) {
  int device = 0, bytes = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess)
    ctx.fail("cannot query the device's shared memory per block");
  return static_cast<size_t>(bytes);
}

void zeroFill(const KernelContext &ctx, FloatOut t, int64_t elements) {
  if (!t.p || elements <= 0)
    return;
  cudaError_t error = cudaMemsetAsync(t.p, 0, static_cast<size_t>(elements) * (t.bf16 ? 2 : 4),
                                      streamOf(ctx));
  if (error != cudaSuccess)
    ctx.fail(std::string("cannot zero a gradient: ") + cudaGetErrorString(error));
}

} // namespace moec::runtime::cuda::attention
