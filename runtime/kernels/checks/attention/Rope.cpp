//===- Rope.cpp - RoPE attributes and frequencies of the attention kernels ===//

#include "runtime/kernels/checks/attention/Rope.h"

#include <algorithm>
#include <cmath>

namespace moec::runtime::checks::attention {

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

} // namespace moec::runtime::checks::attention
