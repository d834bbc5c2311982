//===- Rope.cpp - rotary position embedding: tables and the rope kernels --===//
//
// rope: x [T, H*head_dim], positions [T] -> the first rope.dim features of
// every head rotated, the rest copied (partial RoPE). Its backward applies
// the transposed rotation to the result's gradient.
//
//===----------------------------------------------------------------------===//

#include "runtime/kernels/cpu/attention/Rope.h"

#include <cmath>
#include <cstring>

#include "runtime/kernels/cpu/attention/Kernels.h"
#include "runtime/kernels/cpu/attention/Launch.h"

namespace moec::runtime::cpu::attention {

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
