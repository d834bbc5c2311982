//===- Kda.cu - kda and its backward on the GPU (Kimi Delta Attention) ------===//
//
// The twin of cpu/linear_attention/Kda.cpp (Kimi-Linear): q, k, v each
// through its own causal depthwise conv + SiLU, per-channel
// g = -exp(A_log[h]) * softplus(decay + dt_bias), beta = sigmoid(beta_logits),
// L2-normalised q (scaled by d^-1/2) and k, the delta rule with a per-key-
// channel decay (DeltaRule.cu), then rmsnorm(o) * w * sigmoid(gate).
//
// Launches (T tokens, W = H*d): [bf16 -> f32 copies]; three convs (T*W
// threads each, 256 per block); l2 norm q and k (one warp per (token, head));
// g (T*W threads) and beta (T*H threads); the delta rule; the gated RMSNorm
// (one warp per (token, head)) writing the result in its storage type. The
// backward recomputes the forward, then: gated RMSNorm backward (+ column sum
// for norm_weight), delta rule backward, l2 norm backward, three conv
// backwards, the decay / beta gradients (+ column sums for dt_bias and a_log),
// then f32 -> storage copies of the requested gradients.
//
//===----------------------------------------------------------------------===//

#include <cmath>

#include "runtime/kernels/cuda/linear_attention/LinearAttentionCommon.cuh"

namespace moec::runtime::cuda::linattn {

namespace {

enum Operand {
  Query,
  Key,
  Value,
  QueryConv,
  KeyConv,
  ValueConv,
  Decay,
  BetaLogits,
  Gate,
  ALog,
  DtBias,
  NormWeight,
  NumOperands
};

const char *const operandNames[] = {"query", "key",         "value", "query_conv", "key_conv", "value_conv",
                                    "decay", "beta_logits", "gate",  "a_log",      "dt_bias",  "norm_weight"};

struct Shape {
  int64_t heads = 0, dim = 0, convWidth[3] = {0, 0, 0};
  double eps = 0;
  Tokens tokens;

  int64_t width() const { return heads * dim; }
  GateMap gateMap() const { return {width(), dim, 0, 1}; }
};

Shape checkShape(const KernelContext &ctx) {
  Shape s;
  s.heads = positiveAttr(ctx, "num_heads");
  s.dim = positiveAttr(ctx, "head_dim");
  s.eps = ctx.attrFloat("eps");
  int64_t W = s.width();
  ctx.expectShape(ctx.in(Query), "query (num_heads * head_dim)", {-1, W});
  s.tokens = tokensOf(ctx, ctx.in(Query).dim(0));
  int64_t T = s.tokens.count;
  ctx.expectShape(ctx.in(Key), "key (num_heads * head_dim)", {T, W});
  ctx.expectShape(ctx.in(Value), "value (num_heads * head_dim)", {T, W});
  for (int i = 0; i < 3; ++i)
    s.convWidth[i] = convWidth(ctx, ctx.in(QueryConv + i), operandNames[QueryConv + i], W);
  ctx.expectShape(ctx.in(Decay), "decay (one per key channel)", {T, W});
  ctx.expectShape(ctx.in(BetaLogits), "beta_logits (one per head)", {T, s.heads});
  ctx.expectShape(ctx.in(Gate), "gate (num_heads * head_dim)", {T, W});
  expectNumel(ctx, ctx.in(ALog), "a_log", s.heads, "one per head");
  expectNumel(ctx, ctx.in(DtBias), "dt_bias", W, "one per key channel");
  expectNumel(ctx, ctx.in(NormWeight), "norm_weight", s.dim, "head_dim");
  for (int i = 0; i < NumOperands; ++i)
    expectFloat(ctx, ctx.in(i), operandNames[i]);
  return s;
}

constexpr int kThreads = 256;

/// g = -exp(A_log[c / d]) * softplus(decay + dt_bias[c]), per (t, c).
__global__ void logDecayKernel(const float *decay, const float *dtBias, const float *aLog, int64_t tokens,
                               int64_t width, int64_t dim, float *g) {
  int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= tokens * width)
    return;
  int64_t c = idx % width;
  g[idx] = -expf(aLog[c / dim]) * softplusf(decay[idx] + dtBias[c]);
}

__global__ void sigmoidKernel(const float *x, int64_t n, float *y) {
  int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx < n)
    y[idx] = sigmoidf(x[idx]);
}

/// d decay (= the dt_bias terms) and dg * g (the a_log terms), per (t, c).
__global__ void decayBackwardKernel(const float *decay, const float *dtBias, const float *aLog,
                                    const float *g, const float *dg, int64_t tokens, int64_t width,
                                    int64_t dim, float *dDecay, float *aLogTerm) {
  int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= tokens * width)
    return;
  int64_t c = idx % width;
  dDecay[idx] = -dg[idx] * expf(aLog[c / dim]) * softplusGradf(decay[idx] + dtBias[c]);
  aLogTerm[idx] = dg[idx] * g[idx];
}

__global__ void betaBackwardKernel(const float *dBetaRule, const float *beta, int64_t n, float *dBeta) {
  int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx < n)
    dBeta[idx] = dBetaRule[idx] * beta[idx] * (1.0f - beta[idx]);
}

struct Forward {
  const float *in[NumOperands] = {};
  Conv conv[3];
  float *convOut[3] = {nullptr, nullptr, nullptr}; // q, k, v after conv and SiLU, [T, W]
  float *q = nullptr, *k = nullptr;                // normalised
  float *g = nullptr, *beta = nullptr;             // [T, W], [T, H]
  float *o = nullptr;
  DeltaRule rule;
};

void runForward(const KernelContext &ctx, Scratch &scratch, const Shape &s, Forward &f) {
  int64_t T = s.tokens.count, W = s.width(), H = s.heads, D = s.dim;
  for (int i = 0; i < NumOperands; ++i)
    f.in[i] = asF32(ctx, scratch, ctx.in(i), operandNames[i]);
  for (int i = 0; i < 3; ++i) {
    Conv &cv = f.conv[i];
    cv.x = f.in[Query + i];
    cv.ld = W;
    cv.w = f.in[QueryConv + i];
    cv.width = s.convWidth[i];
    cv.channels = W;
    cv.tokens = T;
    cv.seqLen = s.tokens.seqLen;
    f.convOut[i] = scratch.floats(T * W);
    convSiluForward(ctx, cv, f.convOut[i]);
  }
  f.q = scratch.floats(T * W);
  f.k = scratch.floats(T * W);
  l2NormForward(ctx, f.convOut[0], W, 0, T, H, D, static_cast<float>(1.0 / std::sqrt(static_cast<double>(D))),
                f.q);
  l2NormForward(ctx, f.convOut[1], W, 0, T, H, D, 1.0f, f.k);
  f.g = scratch.floats(T * W);
  f.beta = scratch.floats(T * H);
  if (T * W > 0) {
    logDecayKernel<<<blocksFor(T * W, kThreads), kThreads, 0, streamOf(ctx)>>>(f.in[Decay], f.in[DtBias],
                                                                               f.in[ALog], T, W, D, f.g);
    checkLaunch(ctx, "kda decay");
    sigmoidKernel<<<blocksFor(T * H, kThreads), kThreads, 0, streamOf(ctx)>>>(f.in[BetaLogits], T * H,
                                                                              f.beta);
    checkLaunch(ctx, "kda beta");
  }
  f.rule.tokens = T;
  f.rule.seqLen = s.tokens.seqLen;
  f.rule.heads = f.rule.keyHeads = H;
  f.rule.dk = f.rule.dv = D;
  f.rule.channelDecay = true;
  f.rule.q = f.q;
  f.rule.k = f.k;
  f.rule.v = f.convOut[2];
  f.rule.vLd = W;
  f.rule.vOff = 0;
  f.rule.beta = f.beta;
  f.rule.logDecay = f.g;
  f.o = scratch.floats(T * W);
  deltaRuleForward(ctx, f.rule, f.o);
}

void kda(KernelContext &ctx) {
  Shape s = checkShape(ctx);
  ctx.expectShape(ctx.out(0), "result", {s.tokens.count, s.width()});
  expectFloat(ctx, ctx.out(0), "result");
  Scratch scratch(ctx);
  Forward f;
  runForward(ctx, scratch, s, f);
  gatedNormForward(ctx, f.o, f.in[Gate], s.gateMap(), f.in[NormWeight], s.tokens.count, s.heads, s.dim, s.eps,
                   GateActivation::Sigmoid, ctx.out(0));
}

void kdaBackward(KernelContext &ctx) {
  Shape s = checkShape(ctx);
  int64_t T = s.tokens.count, W = s.width(), H = s.heads, D = s.dim;
  BackwardLayout layout(ctx, NumOperands, {T, W});
  if (!layout.resultGrad()) {
    zeroOutputs(ctx); // no gradient flows
    return;
  }
  Scratch scratch(ctx);
  Forward f;
  runForward(ctx, scratch, s, f);
  const float *dy = asF32(ctx, scratch, *layout.resultGrad(), "the result's gradient");

  float *grads[NumOperands];
  for (int i = 0; i < NumOperands; ++i)
    grads[i] = scratch.floats(ctx.in(i).numel());

  float *dO = scratch.floats(T * W);
  gatedNormBackward(ctx, scratch, f.o, f.in[Gate], s.gateMap(), f.in[NormWeight], T, H, D, s.eps,
                    GateActivation::Sigmoid, dy, dO, grads[Gate], grads[NormWeight]);

  float *dConv[3] = {scratch.floats(T * W), scratch.floats(T * W), scratch.floats(T * W)};
  DeltaRuleGrads rule;
  rule.q = scratch.floats(T * W);
  rule.k = scratch.floats(T * W);
  rule.logDecay = scratch.floats(T * W);
  rule.beta = scratch.floats(T * H);
  rule.v = dConv[2];
  rule.vLd = W;
  rule.vOff = 0;
  deltaRuleBackward(ctx, scratch, f.rule, dO, rule);

  l2NormBackward(ctx, f.convOut[0], W, 0, T, H, D,
                 static_cast<float>(1.0 / std::sqrt(static_cast<double>(D))), rule.q, 1, dConv[0], W, 0);
  l2NormBackward(ctx, f.convOut[1], W, 0, T, H, D, 1.0f, rule.k, 1, dConv[1], W, 0);
  for (int i = 0; i < 3; ++i)
    convSiluBackward(ctx, scratch, f.conv[i], dConv[i], grads[Query + i], W, grads[QueryConv + i]);

  // g = -exp(A_log[h]) * softplus(decay + dt_bias); beta = sigmoid(beta_logits).
  float *aLogTerm = scratch.floats(T * W);
  if (T * W > 0) {
    decayBackwardKernel<<<blocksFor(T * W, kThreads), kThreads, 0, streamOf(ctx)>>>(
        f.in[Decay], f.in[DtBias], f.in[ALog], f.g, rule.logDecay, T, W, D, grads[Decay], aLogTerm);
    checkLaunch(ctx, "kda decay backward");
    betaBackwardKernel<<<blocksFor(T * H, kThreads), kThreads, 0, streamOf(ctx)>>>(rule.beta, f.beta, T * H,
                                                                                   grads[BetaLogits]);
    checkLaunch(ctx, "kda beta backward");
  }
  columnSum(ctx, scratch, grads[Decay], T, W, grads[DtBias]);
  float *aLogChannels = scratch.floats(W);
  columnSum(ctx, scratch, aLogTerm, T, W, aLogChannels);
  rowSum(ctx, aLogChannels, H, D, grads[ALog]);

  std::vector<int64_t> ofInputs = ctx.gradOfInputs();
  for (size_t i = 0; i < ofInputs.size(); ++i)
    storeF32(ctx, grads[ofInputs[i]], ctx.out(i));
}

} // namespace

void registerKdaKernels(KernelRegistry &registry) {
  registry.add("kda", kda);
  registry.add("kda.backward", kdaBackward);
}

} // namespace moec::runtime::cuda::linattn
