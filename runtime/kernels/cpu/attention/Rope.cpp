//===- Rope.cpp - rotary position embedding: tables and the rope kernels --===//
//
// rope: x [T, H*head_dim], positions [T] -> the first rope.dim features of
// every head rotated, the rest copied (partial RoPE). Its backward applies
// the transposed rotation to the result's gradient.
//
//===----------------------------------------------------------------------===//

#include "runtime/kernels/cpu/attention/Rope.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "runtime/kernels/cpu/attention/Kernels.h"
#include "runtime/kernels/cpu/attention/Launch.h"

namespace moec::runtime::cpu::attention {

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
  // YaRN's ramp between the dimensions that keep their frequency (fast
  // rotations) and those interpolated by `factor` (slow ones).
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
  // transformers: mscale(factor, mscale) / mscale(factor, mscale_all_dim) when
  // both are set (1 for DeepSeek-V3, whose MLA scale carries mscale² instead),
  // else mscale(factor, 1).
  if (y.mscale != 0 && y.mscaleAllDim != 0)
    return static_cast<float>(mscale(y.mscale) / mscale(y.mscaleAllDim));
  return static_cast<float>(mscale(1.0));
}

RopeTable::RopeTable(const RopeSpec &spec, const TensorRef &positions)
    : half(spec.dim / 2), interleaved(spec.interleaved) {
  std::vector<float> inv = inverseFrequencies(spec);
  float factor = attentionFactor(spec);
  int64_t tokens = positions.numel();
  cosines.resize(static_cast<size_t>(tokens * half));
  sines.resize(cosines.size());
  for (int64_t t = 0; t < tokens; ++t) {
    float position = static_cast<float>(positions.index(t));
    for (int64_t i = 0; i < half; ++i) {
      float angle = inv[i] * position;
      cosines[t * half + i] = static_cast<float>(std::cos(static_cast<double>(angle))) * factor;
      sines[t * half + i] = static_cast<float>(std::sin(static_cast<double>(angle))) * factor;
    }
  }
}

void RopeTable::rotate(int64_t t, const float *x, float *y) const {
  const float *c = &cosines[t * half], *s = &sines[t * half];
  for (int64_t i = 0; i < half; ++i) {
    float a = interleaved ? x[2 * i] : x[i];
    float b = interleaved ? x[2 * i + 1] : x[i + half];
    y[i] = a * c[i] - b * s[i];
    y[i + half] = b * c[i] + a * s[i];
  }
}

void RopeTable::rotateBack(int64_t t, const float *dy, float *dx) const {
  const float *c = &cosines[t * half], *s = &sines[t * half];
  for (int64_t i = 0; i < half; ++i) {
    float g0 = dy[i], g1 = dy[i + half];
    float da = g0 * c[i] + g1 * s[i], db = g1 * c[i] - g0 * s[i];
    dx[interleaved ? 2 * i : i] = da;
    dx[interleaved ? 2 * i + 1 : i + half] = db;
  }
}

namespace {

struct RopeLaunch {
  int64_t tokens = 0, features = 0, headDim = 0;
  RopeSpec spec;
};

/// Checks the forward operands (input, positions) and attributes.
RopeLaunch readRopeLaunch(const KernelContext &ctx) {
  RopeLaunch l;
  const TensorRef &x = ctx.in(0);
  floatTensor(ctx, x, "input", {-1, -1});
  l.tokens = x.dim(0);
  l.features = x.dim(1);
  l.headDim = positiveAttr(ctx, "head_dim");
  if (l.features % l.headDim != 0)
    ctx.fail("input features (" + std::to_string(l.features) +
             ") must be a multiple of head_dim (" + std::to_string(l.headDim) + ")");
  expectIndices(ctx, ctx.in(1), "positions", {l.tokens});
  l.spec = *readRope(ctx, "rope", /*required=*/true, l.headDim);
  return l;
}

/// Per row: copies `from` to `to`, then writes the first rope.dim features of
/// each head through `apply` (rotate or rotateBack).
template <typename Apply>
void perHead(const KernelContext &ctx, const RopeLaunch &l, const float *from, float *to,
             Apply apply) {
  ctx.parallelFor(l.tokens, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float *src = from + t * l.features;
      float *dst = to + t * l.features;
      std::memcpy(dst, src, static_cast<size_t>(l.features) * sizeof(float));
      for (int64_t h = 0; h < l.features; h += l.headDim)
        apply(t, src + h, dst + h);
    }
  });
}

void ropeForward(KernelContext &ctx) {
  if (ctx.inputs.size() != 2)
    ctx.fail("expected 2 inputs (input, positions), got " + std::to_string(ctx.inputs.size()));
  RopeLaunch l = readRopeLaunch(ctx);
  if (ctx.outputs.size() != 1)
    ctx.fail("expected 1 output, got " + std::to_string(ctx.outputs.size()));
  float *out = floatTensor(ctx, ctx.out(0), "result", {l.tokens, l.features});
  RopeTable table(l.spec, ctx.in(1));
  perHead(ctx, l, ctx.in(0).f32(), out,
          [&](int64_t t, const float *x, float *y) { table.rotate(t, x, y); });
}

void ropeBackward(KernelContext &ctx) {
  size_t operands = backwardOperands(ctx, 2, 2);
  RopeLaunch l = readRopeLaunch(ctx);
  const float *gradOut = checkBackward(ctx, operands, {0}, l.tokens, l.features);
  float *gradIn = gradFor(ctx, 0);
  if (!gradIn || !gradOut)
    return;
  RopeTable table(l.spec, ctx.in(1));
  perHead(ctx, l, gradOut, gradIn,
          [&](int64_t t, const float *dy, float *dx) { table.rotateBack(t, dy, dx); });
}

} // namespace

void registerRopeKernels(KernelRegistry &registry) {
  registry.add("rope", ropeForward);
  registry.add("rope.backward", ropeBackward);
}

} // namespace moec::runtime::cpu::attention
