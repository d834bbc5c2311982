//===- Common.cu - host side of the CUDA attention kernels' shared pieces -===//

#include "runtime/kernels/cuda/attention/Common.cuh"

#include <algorithm>
#include <cmath>

#include "runtime/plan/PlanFormat.h"

namespace moec::runtime::cuda::attention {

//===----------------------------------------------------------------------===//
// RoPE (cpu/attention/Rope.cpp: the same attributes, checks and host arithmetic)
//===----------------------------------------------------------------------===//

std::optional<RopeSpec> readRope(const KernelContext &ctx, const std::string &prefix, bool required,
                                 int64_t maxDim) {
  if (!required && !ctx.has(prefix + ".dim"))
    return std::nullopt;
  RopeSpec spec;
  spec.dim = ctx.attrInt(prefix + ".dim");
  if (spec.dim <= 0 || spec.dim % 2 != 0 || spec.dim > maxDim)
    ctx.fail("attribute '" + prefix + ".dim' (" + std::to_string(spec.dim) +
             ") must be even, positive and at most " + std::to_string(maxDim));
  spec.theta = ctx.attrFloat(prefix + ".theta");
  if (!(spec.theta > 1))
    ctx.fail("attribute '" + prefix + ".theta' must be greater than 1");
  std::string style = ctx.attrString(prefix + ".style");
  if (style != "half" && style != "interleaved")
    ctx.fail("attribute '" + prefix + ".style' is '" + style + "'; supported: half, interleaved");
  spec.interleaved = style == "interleaved";
  if (ctx.has(prefix + ".yarn.factor")) {
    YarnParams y;
    y.factor = ctx.attrFloat(prefix + ".yarn.factor");
    y.originalMaxPosition = ctx.attrInt(prefix + ".yarn.original_max_position");
    // transformers reads `beta_fast or 32`, `beta_slow or 1`: zero means the default.
    y.betaFast = ctx.attrFloat(prefix + ".yarn.beta_fast");
    y.betaSlow = ctx.attrFloat(prefix + ".yarn.beta_slow");
    y.betaFast = y.betaFast == 0 ? 32 : y.betaFast;
    y.betaSlow = y.betaSlow == 0 ? 1 : y.betaSlow;
    y.mscale = ctx.attrFloat(prefix + ".yarn.mscale");
    y.mscaleAllDim = ctx.attrFloat(prefix + ".yarn.mscale_all_dim");
    y.truncate = !ctx.has(prefix + ".yarn.truncate") || ctx.attrBool(prefix + ".yarn.truncate");
    if (!(y.factor > 0) || y.originalMaxPosition <= 0 || !(y.betaFast > 0) || !(y.betaSlow > 0))
      ctx.fail("YaRN attributes '" + prefix +
               ".yarn.*' need factor, original_max_position, beta_fast and beta_slow positive");
    spec.yarn = y;
  }
  return spec;
}

std::vector<float> inverseFrequencies(const RopeSpec &spec) {
  int64_t half = spec.dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  double low = 0, high = 0;
  if (spec.yarn) {
    const YarnParams &y = *spec.yarn;
    auto correctionDim = [&](double rotations) {
      return spec.dim * std::log(y.originalMaxPosition / (rotations * 2 * M_PI)) /
             (2 * std::log(spec.theta));
    };
    low = correctionDim(y.betaFast);
    high = correctionDim(y.betaSlow);
    if (y.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(spec.dim - 1));
    if (low == high)
      high += 0.001; // transformers' guard against a zero-width ramp
  }
  for (int64_t i = 0; i < half; ++i) {
    float exponent = static_cast<float>(2 * i) / static_cast<float>(spec.dim);
    float posFreq = static_cast<float>(std::pow(static_cast<double>(static_cast<float>(spec.theta)),
                                                static_cast<double>(exponent)));
    float extrapolated = 1.0f / posFreq;
    if (!spec.yarn) {
      inv[i] = extrapolated;
      continue;
    }
    float interpolated = 1.0f / (static_cast<float>(spec.yarn->factor) * posFreq);
    float ramp = (static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low);
    float keep = 1.0f - std::clamp(ramp, 0.0f, 1.0f);
    inv[i] = interpolated * (1.0f - keep) + extrapolated * keep;
  }
  return inv;
}

float attentionFactor(const RopeSpec &spec) {
  if (!spec.yarn)
    return 1.0f;
  const YarnParams &y = *spec.yarn;
  auto mscale = [&](double m) { return y.factor <= 1 ? 1.0 : 0.1 * m * std::log(y.factor) + 1.0; };
  if (y.mscale != 0 && y.mscaleAllDim != 0)
    return static_cast<float>(mscale(y.mscale) / mscale(y.mscaleAllDim));
  return static_cast<float>(mscale(1.0));
}

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

int isWide(const KernelContext &ctx, const TensorRef &t, const char *what) {
  if (t.dtype == plan::I32)
    return 0;
  if (t.dtype == plan::I64)
    return 1;
  ctx.fail(std::string(what) + " must be i32 or i64, got " + plan::dtypeName(t.dtype));
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
  ctx.expectShape(t, what, std::move(dims));
  return IndexIn{t.data, isWide(ctx, t, what)};
}

IndexOut indexOut(const KernelContext &ctx, const TensorRef &t, const char *what,
                  std::vector<int64_t> dims) {
  ctx.expectShape(t, what, std::move(dims));
  return IndexOut{t.data, isWide(ctx, t, what)};
}

int64_t positiveAttr(const KernelContext &ctx, const std::string &name) {
  int64_t value = ctx.attrInt(name);
  if (value <= 0)
    ctx.fail("attribute '" + name + "' must be positive, got " + std::to_string(value));
  return value;
}

int64_t nonNegativeAttr(const KernelContext &ctx, const std::string &name) {
  int64_t value = ctx.attrInt(name);
  if (value < 0)
    ctx.fail("attribute '" + name + "' must not be negative, got " + std::to_string(value));
  return value;
}

Sequences sequencesOf(const KernelContext &ctx, int64_t tokens) {
  if (ctx.seqLen <= 0 || ctx.microBatch <= 0 || ctx.seqLen * ctx.microBatch != tokens)
    ctx.fail("the step's sequences (micro_batch " + std::to_string(ctx.microBatch) + " x seq_len " +
             std::to_string(ctx.seqLen) + ") do not cover the " + std::to_string(tokens) +
             " token rows");
  return {ctx.microBatch, ctx.seqLen};
}

size_t backwardOperands(const KernelContext &ctx, size_t minOperands, size_t maxOperands) {
  size_t operands = ctx.inputs.empty() ? 0 : ctx.inputs.size() - 1;
  if (ctx.has("backward_segments")) {
    std::vector<int64_t> segments = ctx.attrInts("backward_segments");
    if (segments.size() != 3 || segments[0] < 0 || segments[1] < 0 || segments[2] < 0 ||
        segments[2] > 1 ||
        static_cast<size_t>(segments[0] + segments[1] + segments[2]) != ctx.inputs.size())
      ctx.fail("backward_segments must be [operands, results, grads] (at most one grad) adding "
               "up to the " +
               std::to_string(ctx.inputs.size()) + " inputs");
    operands = static_cast<size_t>(segments[0]);
  }
  if (operands < minOperands || operands > maxOperands)
    ctx.fail("expected " + std::to_string(minOperands) +
             (maxOperands > minOperands ? " or " + std::to_string(maxOperands) : std::string()) +
             " forward operands, got " + std::to_string(operands));
  return operands;
}

FloatIn checkBackward(const KernelContext &ctx, size_t numOperands,
                      const std::vector<int64_t> &differentiable, int64_t rows, int64_t cols) {
  std::vector<int64_t> wanted = ctx.gradOfInputs();
  if (wanted.size() != ctx.outputs.size())
    ctx.fail("grad_of_inputs names " + std::to_string(wanted.size()) + " operands but there are " +
             std::to_string(ctx.outputs.size()) + " outputs");
  for (size_t i = 0; i < wanted.size(); ++i) {
    int64_t operand = wanted[i];
    if (std::find(differentiable.begin(), differentiable.end(), operand) == differentiable.end() ||
        static_cast<size_t>(operand) >= numOperands)
      ctx.fail("grad_of_inputs names operand " + std::to_string(operand) +
               ", which has no gradient (an index operand or out of range)");
    if (std::count(wanted.begin(), wanted.end(), operand) > 1)
      ctx.fail("grad_of_inputs names operand " + std::to_string(operand) + " twice");
    const TensorRef &grad = ctx.out(i), &of = ctx.in(static_cast<size_t>(operand));
    if ((grad.dtype != plan::F32 && grad.dtype != plan::BF16) || grad.shape != of.shape)
      ctx.fail("gradient output " + std::to_string(i) +
               " must be f32 or bf16 shaped like operand " + std::to_string(operand));
  }
  bool hasGrad = ctx.has("backward_segments") ? ctx.attrInts("backward_segments")[2] == 1
                                              : ctx.inputs.size() > numOperands;
  FloatIn gradOut;
  if (hasGrad)
    gradOut = floatIn(ctx, ctx.inputs.back(), "result gradient", {rows, cols});
  // Every output starts at zero, as on the CPU; the kernels then write what they compute.
  for (size_t i = 0; i < wanted.size(); ++i) {
    const TensorRef &grad = ctx.out(i);
    zeroFill(ctx, FloatOut{grad.data, grad.dtype == plan::BF16 ? 1 : 0}, grad.numel());
  }
  return gradOut;
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
