//===- GatedDeltaNet.cu - gated_delta_net and its backward on the GPU -------===//
//
// The twin of cpu/linear_attention/GatedDeltaNet.cpp (Qwen3-Next): the
// grouped qkvz / ba layout (per key head: [q dk | k dk | v r*dv | z r*dv] and
// [b r | a r], r = Hv / Hk), one causal conv + SiLU over concat(q, k, v)
// read straight from the grouped columns, beta = sigmoid(b),
// g = -exp(A_log) * softplus(a + dt_bias), L2-normalised q (scaled by
// dk^-1/2) and k, the gated delta rule, then rmsnorm(o) * w * silu(z).
//
// The delta rule runs in chunks (ChunkedDeltaRule.cu: per-chunk products on
// cuBLAS, a sequential pass over chunks for the state) for f32 and bf16
// storage alike whenever key_head_dim <= 256; otherwise, or when a test
// pins it (DeltaRulePath.h), token by token (DeltaRule.cu). Both compute in
// f32 with an f32 state; the chunked form matches the CPU twin as closely as
// the recurrent one (its host twin is ~2e-7 from the double recurrence).
//
// Launches, in order (T tokens, C = 2*Hk*dk + Hv*dv conv channels):
//   forward: [bf16 -> f32 copies]; conv (T*C threads, 256 per block);
//   l2 norm q and k (one warp per (token, key head), 4 warps per block);
//   beta/g (T*Hv threads); delta rule (chunked or recurrent); gated RMSNorm
//   (one warp per (token, value head)), writing the result in its storage type.
//   backward: the forward up to the delta rule; gated RMSNorm backward (+ a
//   column sum for norm_weight); delta rule backward (the chunked one reuses
//   what its forward kept; the recurrent one's per-channel dg is then summed
//   over the key channels); l2 norm backward (summing the value heads of each
//   key head in order); conv backward (SiLU', input, weight); the ba gradients
//   (+ column sums for a_log and dt_bias); f32 -> storage copies of the
//   requested gradients.
// Every gradient is computed in f32 scratch, then copied (or rounded to bf16)
// into the outputs; all scratch is stream-ordered (cudaMallocAsync/cudaFreeAsync).
//
//===----------------------------------------------------------------------===//

#include <cmath>

#include "runtime/kernels/cuda/linear_attention/DeltaRulePath.h"
#include "runtime/kernels/cuda/linear_attention/LinearAttentionCommon.cuh"

namespace moec::runtime::cuda::linattn {

namespace {

enum Operand { Qkvz, Ba, ConvWeight, ALog, DtBias, NormWeight, NumOperands };

const char *const operandNames[] = {"qkvz", "ba", "conv_weight", "a_log", "dt_bias", "norm_weight"};

struct Shape {
  int64_t hk = 0, hv = 0, dk = 0, dv = 0, width = 0, r = 0;
  double eps = 0;
  Tokens tokens;

  int64_t group() const { return 2 * dk + 2 * r * dv; }
  int64_t keyWidth() const { return hk * dk; }
  int64_t valueWidth() const { return hv * dv; }
  int64_t inWidth() const { return 2 * keyWidth() + 2 * valueWidth(); }
  int64_t channels() const { return 2 * keyWidth() + valueWidth(); }
  ColumnMap map() const { return {true, keyWidth(), dk, dv, r}; }
  /// z of value head h, channel j, inside a qkvz row.
  GateMap gateMap() const { return {inWidth(), group(), 2 * dk + r * dv, r}; }
};

Shape checkShape(const KernelContext &ctx) {
  Shape s;
  s.hk = positiveAttr(ctx, "num_key_heads");
  s.hv = positiveAttr(ctx, "num_value_heads");
  s.dk = positiveAttr(ctx, "key_head_dim");
  s.dv = positiveAttr(ctx, "value_head_dim");
  s.eps = ctx.attrFloat("eps");
  if (s.hv % s.hk != 0)
    ctx.fail("num_value_heads " + std::to_string(s.hv) + " is not a multiple of num_key_heads " +
             std::to_string(s.hk));
  s.r = s.hv / s.hk;
  const TensorRef &qkvz = ctx.in(Qkvz);
  ctx.expectShape(qkvz, "qkvz (2*Hk*dk + 2*Hv*dv)", {-1, 2 * s.keyWidth() + 2 * s.valueWidth()});
  s.tokens = tokensOf(ctx, qkvz.dim(0));
  ctx.expectShape(ctx.in(Ba), "ba (2*Hv)", {s.tokens.count, 2 * s.hv});
  s.width = convWidth(ctx, ctx.in(ConvWeight), "conv_weight", s.channels());
  expectNumel(ctx, ctx.in(ALog), "a_log", s.hv, "one per value head");
  expectNumel(ctx, ctx.in(DtBias), "dt_bias", s.hv, "one per value head");
  expectNumel(ctx, ctx.in(NormWeight), "norm_weight", s.dv, "value_head_dim");
  for (int i = 0; i < NumOperands; ++i)
    expectFloat(ctx, ctx.in(i), operandNames[i]);
  return s;
}

constexpr int kThreads = 256;

/// beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias), per (t, h).
__global__ void betaDecayKernel(const float *ba, const float *aLog, const float *dtBias, int64_t tokens,
                                int64_t hv, int64_t r, float *beta, float *g) {
  int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= tokens * hv)
    return;
  int64_t t = idx / hv, h = idx % hv, bCol = (h / r) * 2 * r + h % r;
  const float *row = ba + t * 2 * hv;
  beta[idx] = sigmoidf(row[bCol]);
  g[idx] = -expf(aLog[h]) * softplusf(row[bCol + r] + dtBias[h]);
}

/// d ba (both columns of every (t, h)), and per (t, h): da (for dt_bias) and dg * g (for a_log).
__global__ void baBackwardKernel(const float *ba, const float *aLog, const float *dtBias, const float *beta,
                                 const float *g, const float *dBetaRule, const float *dg, int64_t tokens,
                                 int64_t hv, int64_t r, float *dBa, float *da, float *aLogTerm) {
  int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= tokens * hv)
    return;
  int64_t t = idx / hv, h = idx % hv, bCol = (h / r) * 2 * r + h % r;
  const float *row = ba + t * 2 * hv;
  float b = beta[idx];
  dBa[t * 2 * hv + bCol] = dBetaRule[idx] * b * (1.0f - b);
  float d = -dg[idx] * expf(aLog[h]) * softplusGradf(row[bCol + r] + dtBias[h]);
  dBa[t * 2 * hv + bCol + r] = d;
  da[idx] = d;
  aLogTerm[idx] = dg[idx] * g[idx];
}

/// Everything up to the delta rule's output, kept for the backward.
struct Forward {
  const float *qkvz = nullptr, *ba = nullptr, *convWeight = nullptr, *aLog = nullptr, *dtBias = nullptr,
              *normWeight = nullptr;
  float *conv = nullptr;               // [T, C]: q | k | v after conv and SiLU
  float *q = nullptr, *k = nullptr;    // normalised, [T, Hk*dk]
  float *beta = nullptr, *g = nullptr; // [T, Hv]
  float *o = nullptr;                  // [T, Hv*dv]
  DeltaRule rule;
  Conv convArgs;
  bool chunked = false; // which form ran the delta rule
  ChunkedSaved saved;   // the chunked form's buffers, for the backward
};

/// Chunked where it applies, unless a test pins the recurrent form.
bool useChunked(const DeltaRule &rule) {
  switch (deltaRulePath()) {
  case DeltaRulePath::Recurrent:
    return false;
  case DeltaRulePath::Chunked:
    return true; // the chunked launch fails if it does not apply
  case DeltaRulePath::Auto:
    break;
  }
  return chunkedDeltaRuleApplies(rule);
}

void runForward(const KernelContext &ctx, Scratch &scratch, const Shape &s, Forward &f) {
  int64_t T = s.tokens.count, C = s.channels(), KW = s.keyWidth(), VW = s.valueWidth();
  f.qkvz = asF32(ctx, scratch, ctx.in(Qkvz), "qkvz");
  f.ba = asF32(ctx, scratch, ctx.in(Ba), "ba");
  f.convWeight = asF32(ctx, scratch, ctx.in(ConvWeight), "conv_weight");
  f.aLog = asF32(ctx, scratch, ctx.in(ALog), "a_log");
  f.dtBias = asF32(ctx, scratch, ctx.in(DtBias), "dt_bias");
  f.normWeight = asF32(ctx, scratch, ctx.in(NormWeight), "norm_weight");

  f.convArgs.x = f.qkvz;
  f.convArgs.ld = s.inWidth();
  f.convArgs.map = s.map();
  f.convArgs.w = f.convWeight;
  f.convArgs.width = s.width;
  f.convArgs.channels = C;
  f.convArgs.tokens = T;
  f.convArgs.seqLen = s.tokens.seqLen;
  f.conv = scratch.floats(T * C);
  convSiluForward(ctx, f.convArgs, f.conv);

  f.q = scratch.floats(T * KW);
  f.k = scratch.floats(T * KW);
  l2NormForward(ctx, f.conv, C, 0, T, s.hk, s.dk,
                static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.dk))), f.q);
  l2NormForward(ctx, f.conv, C, KW, T, s.hk, s.dk, 1.0f, f.k);

  f.beta = scratch.floats(T * s.hv);
  f.g = scratch.floats(T * s.hv);
  if (T * s.hv > 0) {
    betaDecayKernel<<<blocksFor(T * s.hv, kThreads), kThreads, 0, streamOf(ctx)>>>(f.ba, f.aLog, f.dtBias, T,
                                                                                   s.hv, s.r, f.beta, f.g);
    checkLaunch(ctx, "gated_delta_net beta and decay");
  }

  f.rule.tokens = T;
  f.rule.seqLen = s.tokens.seqLen;
  f.rule.heads = s.hv;
  f.rule.keyHeads = s.hk;
  f.rule.dk = s.dk;
  f.rule.dv = s.dv;
  f.rule.channelDecay = false;
  f.rule.q = f.q;
  f.rule.k = f.k;
  f.rule.v = f.conv;
  f.rule.vLd = C;
  f.rule.vOff = 2 * KW;
  f.rule.beta = f.beta;
  f.rule.logDecay = f.g;
  f.o = scratch.floats(T * VW);
  f.chunked = useChunked(f.rule);
  if (f.chunked)
    chunkedDeltaRuleForward(ctx, scratch, f.rule, f.o, f.saved);
  else
    deltaRuleForward(ctx, f.rule, f.o);
}

void gatedDeltaNet(KernelContext &ctx) {
  Shape s = checkShape(ctx);
  ctx.expectShape(ctx.out(0), "result", {s.tokens.count, s.valueWidth()});
  expectFloat(ctx, ctx.out(0), "result");
  Scratch scratch(ctx);
  Forward f;
  runForward(ctx, scratch, s, f);
  gatedNormForward(ctx, f.o, f.qkvz, s.gateMap(), f.normWeight, s.tokens.count, s.hv, s.dv, s.eps,
                   GateActivation::Silu, ctx.out(0));
}

void gatedDeltaNetBackward(KernelContext &ctx) {
  Shape s = checkShape(ctx);
  int64_t T = s.tokens.count, C = s.channels(), KW = s.keyWidth(), VW = s.valueWidth(), H = s.hv;
  BackwardLayout layout(ctx, NumOperands, {T, VW});
  if (!layout.resultGrad()) {
    zeroOutputs(ctx); // no gradient flows
    return;
  }
  Scratch scratch(ctx);
  Forward f;
  runForward(ctx, scratch, s, f);
  const float *dy = asF32(ctx, scratch, *layout.resultGrad(), "the result's gradient");

  // Gradients of every operand, f32.
  float *dQkvz = scratch.floats(T * s.inWidth()), *dBa = scratch.floats(T * 2 * H);
  float *dConvWeight = scratch.floats(C * s.width), *dALog = scratch.floats(H), *dDtBias = scratch.floats(H),
        *dNorm = scratch.floats(s.dv);

  // rmsnorm(o) * w * silu(z): dO, dz (into the z columns of dQkvz), d norm_weight.
  float *dO = scratch.floats(T * VW);
  gatedNormBackward(ctx, scratch, f.o, f.qkvz, s.gateMap(), f.normWeight, T, H, s.dv, s.eps,
                    GateActivation::Silu, dy, dO, dQkvz, dNorm);

  // The delta rule; dv lands in the v columns of the conv output's gradient, dg [T, H].
  float *dConv = scratch.floats(T * C);
  float *dg = scratch.floats(T * H);
  DeltaRuleGrads rule;
  rule.q = scratch.floats(T * H * s.dk);
  rule.k = scratch.floats(T * H * s.dk);
  rule.beta = scratch.floats(T * H);
  rule.v = dConv;
  rule.vLd = C;
  rule.vOff = 2 * KW;
  if (f.chunked) {
    rule.logDecay = dg; // per head already
    chunkedDeltaRuleBackward(ctx, scratch, f.rule, f.saved, dO, rule);
  } else {
    rule.logDecay = scratch.floats(T * H * s.dk); // per key channel: summed below
    deltaRuleBackward(ctx, scratch, f.rule, dO, rule);
    rowSum(ctx, rule.logDecay, T * H, s.dk, dg);
  }

  // The value heads sharing a key head add their q, k gradients; then the L2 norms.
  l2NormBackward(ctx, f.conv, C, 0, T, s.hk, s.dk,
                 static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.dk))), rule.q, s.r, dConv, C, 0);
  l2NormBackward(ctx, f.conv, C, KW, T, s.hk, s.dk, 1.0f, rule.k, s.r, dConv, C, KW);

  // The conv: dq, dk, dv into their grouped qkvz columns, and d conv_weight.
  convSiluBackward(ctx, scratch, f.convArgs, dConv, dQkvz, s.inWidth(), dConvWeight);

  // beta = sigmoid(b); g = -exp(A_log) * softplus(a + dt_bias).
  float *da = scratch.floats(T * H), *aLogTerm = scratch.floats(T * H);
  if (T * H > 0) {
    baBackwardKernel<<<blocksFor(T * H, kThreads), kThreads, 0, streamOf(ctx)>>>(
        f.ba, f.aLog, f.dtBias, f.beta, f.g, rule.beta, dg, T, H, s.r, dBa, da, aLogTerm);
    checkLaunch(ctx, "gated_delta_net ba backward");
  }
  columnSum(ctx, scratch, da, T, H, dDtBias);
  columnSum(ctx, scratch, aLogTerm, T, H, dALog);

  const float *grads[NumOperands] = {dQkvz, dBa, dConvWeight, dALog, dDtBias, dNorm};
  std::vector<int64_t> ofInputs = ctx.gradOfInputs();
  for (size_t i = 0; i < ofInputs.size(); ++i)
    storeF32(ctx, grads[ofInputs[i]], ctx.out(i));
}

} // namespace

void registerGatedDeltaNetKernels(KernelRegistry &registry) {
  registry.add("gated_delta_net", gatedDeltaNet);
  registry.add("gated_delta_net.backward", gatedDeltaNetBackward);
}

} // namespace moec::runtime::cuda::linattn
