//===- GatedDeltaNet.cpp - gated_delta_net and its backward (Qwen3-Next) ---===//
//
// Follows transformers' Qwen3NextGatedDeltaNet (the golden reference):
// fix_query_key_value_ordering's grouped layout, one causal conv over
// concat(q, k, v), beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias),
// q and k repeated to the value heads, L2-normalised (eps 1e-6 inside the
// root), q scaled by dk^-1/2, the gated delta rule (exact recurrence in double:
// equal to torch_chunk_gated_delta_rule up to rounding), then
// Qwen3NextRMSNormGated: rmsnorm(o) * w * silu(z). transformers normalises in
// f32, casts back to the input dtype before multiplying by w, and applies the
// gate in f32; with f32 activations every cast is a no-op, so all of it runs
// in double here. The softplus keeps torch's threshold (x above 20).
//
//===----------------------------------------------------------------------===//

#include <cmath>

#include "runtime/kernels/cpu/linear_attention/DeltaRule.h"
#include "runtime/kernels/cpu/linear_attention/LinearAttention.h"

namespace moec::runtime::cpu::linattn {

namespace {

enum Operand { Qkvz, Ba, ConvWeight, ALog, DtBias, NormWeight, NumOperands };

/// Attributes and shapes of one launch, checked, and the grouped layout: per
/// key head, qkvz holds [q dk | k dk | v r*dv | z r*dv] and ba holds [b r | a r]
/// (r = Hv / Hk value heads per key head, value head h in group h / r).
struct Shape {
  int64_t hk = 0, hv = 0, dk = 0, dv = 0, width = 0, r = 0;
  double eps = 0;
  Tokens tokens;

  int64_t group() const { return 2 * dk + 2 * r * dv; }
  int64_t keyWidth() const { return hk * dk; }
  int64_t valueWidth() const { return hv * dv; }
  int64_t channels() const { return 2 * keyWidth() + valueWidth(); }
  int64_t qCol(int64_t kh, int64_t i) const { return kh * group() + i; }
  int64_t kCol(int64_t kh, int64_t i) const { return kh * group() + dk + i; }
  int64_t vCol(int64_t h, int64_t c) const { return (h / r) * group() + 2 * dk + (h % r) * dv + c; }
  int64_t zCol(int64_t h, int64_t c) const { return vCol(h, c) + r * dv; }
  int64_t bCol(int64_t h) const { return (h / r) * 2 * r + h % r; }
  int64_t aCol(int64_t h) const { return bCol(h) + r; }
};

Shape checkLaunch(const KernelContext &ctx) {
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
  const char *names[] = {"qkvz", "ba", "conv_weight", "a_log", "dt_bias", "norm_weight"};
  for (int i = 0; i < NumOperands; ++i)
    floatsOf(ctx, ctx.in(i), names[i]);
  return s;
}

/// Everything up to the delta rule's output, kept for the backward.
struct Forward {
  Doubles mixed, z;                        // conv input [T, C] (q | k | v), gate [T, Hv*dv]
  Doubles qRaw, kRaw, qInv, kInv, q, k, v; // conv outputs and normalised q, k
  Doubles a, beta, g;                      // [T, Hv]
  Doubles o;                               // delta rule output [T, Hv*dv]
  DeltaRule rule;
};

void runForward(const KernelContext &ctx, const Shape &s, Forward &f) {
  int64_t T = s.tokens.count, C = s.channels(), KW = s.keyWidth(), VW = s.valueWidth();
  const float *qkvz = floatsOf(ctx, ctx.in(Qkvz), "qkvz"), *ba = floatsOf(ctx, ctx.in(Ba), "ba");
  const float *aLog = floatsOf(ctx, ctx.in(ALog), "a_log");
  const float *dtBias = floatsOf(ctx, ctx.in(DtBias), "dt_bias");
  int64_t in = 2 * KW + 2 * VW;
  f.mixed.assign(static_cast<size_t>(T * C), 0.0);
  f.z.assign(static_cast<size_t>(T * VW), 0.0);
  f.a.assign(static_cast<size_t>(T * s.hv), 0.0);
  f.beta.assign(f.a.size(), 0.0);
  f.g.assign(f.a.size(), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    const float *row = qkvz + t * in;
    double *m = &f.mixed[t * C];
    for (int64_t kh = 0; kh < s.hk; ++kh)
      for (int64_t i = 0; i < s.dk; ++i) {
        m[kh * s.dk + i] = row[s.qCol(kh, i)];
        m[KW + kh * s.dk + i] = row[s.kCol(kh, i)];
      }
    for (int64_t h = 0; h < s.hv; ++h) {
      for (int64_t c = 0; c < s.dv; ++c) {
        m[2 * KW + h * s.dv + c] = row[s.vCol(h, c)];
        f.z[t * VW + h * s.dv + c] = row[s.zCol(h, c)];
      }
      double a = ba[t * 2 * s.hv + s.aCol(h)];
      f.a[t * s.hv + h] = a;
      f.beta[t * s.hv + h] = sigmoid(ba[t * 2 * s.hv + s.bCol(h)]);
      f.g[t * s.hv + h] = -std::exp(static_cast<double>(aLog[h])) * softplus(a + dtBias[h]);
    }
  }
  Doubles conv;
  convSiluForward(ctx, s.tokens, f.mixed, C, floatsOf(ctx, ctx.in(ConvWeight), "conv_weight"),
                  s.width, conv);
  f.qRaw.resize(static_cast<size_t>(T * KW));
  f.kRaw.resize(f.qRaw.size());
  f.v.resize(static_cast<size_t>(T * VW));
  for (int64_t t = 0; t < T; ++t) {
    std::copy(&conv[t * C], &conv[t * C + KW], &f.qRaw[t * KW]);
    std::copy(&conv[t * C + KW], &conv[t * C + 2 * KW], &f.kRaw[t * KW]);
    std::copy(&conv[t * C + 2 * KW], &conv[(t + 1) * C], &f.v[t * VW]);
  }
  l2NormForward(f.qRaw, s.dk, 1.0 / std::sqrt(static_cast<double>(s.dk)), f.q, f.qInv);
  l2NormForward(f.kRaw, s.dk, 1.0, f.k, f.kInv);
  f.rule.heads = s.hv;
  f.rule.keyHeads = s.hk;
  f.rule.keyDim = s.dk;
  f.rule.valueDim = s.dv;
  f.rule.channelDecay = false;
  f.rule.q = f.q.data();
  f.rule.k = f.k.data();
  f.rule.v = f.v.data();
  f.rule.beta = f.beta.data();
  f.rule.logDecay = f.g.data();
  deltaRuleForward(ctx, s.tokens, f.rule, f.o);
}

void gatedDeltaNet(KernelContext &ctx) {
  Shape s = checkLaunch(ctx);
  ctx.expectShape(ctx.out(0), "result", {s.tokens.count, s.valueWidth()});
  float *y = floatsOf(ctx, ctx.out(0), "result");
  Forward f;
  runForward(ctx, s, f);
  gatedNormForward(ctx, f.o, f.z, floatsOf(ctx, ctx.in(NormWeight), "norm_weight"), s.dv, s.eps,
                   GateActivation::Silu, y);
}

void gatedDeltaNetBackward(KernelContext &ctx) {
  Shape s = checkLaunch(ctx);
  int64_t T = s.tokens.count, C = s.channels(), KW = s.keyWidth(), VW = s.valueWidth();
  BackwardLayout layout(ctx, NumOperands, {T, VW});
  if (!layout.resultGrad())
    return; // no gradient flows: the zeroed outputs are the answer
  Forward f;
  runForward(ctx, s, f);

  Doubles dO, dz, dNorm;
  gatedNormBackward(ctx, f.o, f.z, floatsOf(ctx, ctx.in(NormWeight), "norm_weight"), s.dv, s.eps,
                    GateActivation::Silu, layout.resultGrad(), dO, dz, dNorm);
  DeltaRuleGrads rule;
  deltaRuleBackward(ctx, s.tokens, f.rule, dO, rule);

  // The value heads sharing a key head add their q, k gradients, in head order.
  Doubles dqn(static_cast<size_t>(T * KW), 0.0), dkn(dqn.size(), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < s.hv; ++h)
      for (int64_t i = 0; i < s.dk; ++i) {
        dqn[t * KW + (h / s.r) * s.dk + i] += rule.q[(t * s.hv + h) * s.dk + i];
        dkn[t * KW + (h / s.r) * s.dk + i] += rule.k[(t * s.hv + h) * s.dk + i];
      }
  Doubles dq, dk;
  l2NormBackward(f.qRaw, s.dk, 1.0 / std::sqrt(static_cast<double>(s.dk)), f.qInv, dqn, dq);
  l2NormBackward(f.kRaw, s.dk, 1.0, f.kInv, dkn, dk);
  Doubles dConv(static_cast<size_t>(T * C));
  for (int64_t t = 0; t < T; ++t) {
    std::copy(&dq[t * KW], &dq[(t + 1) * KW], &dConv[t * C]);
    std::copy(&dk[t * KW], &dk[(t + 1) * KW], &dConv[t * C + KW]);
    std::copy(&rule.v[t * VW], &rule.v[(t + 1) * VW], &dConv[t * C + 2 * KW]);
  }
  Doubles dMixed, dConvWeight;
  convSiluBackward(ctx, s.tokens, f.mixed, C, floatsOf(ctx, ctx.in(ConvWeight), "conv_weight"),
                   s.width, dConv, dMixed, dConvWeight);

  const float *aLog = floatsOf(ctx, ctx.in(ALog), "a_log");
  const float *dtBias = floatsOf(ctx, ctx.in(DtBias), "dt_bias");
  Doubles dQkvz(static_cast<size_t>(T * (2 * KW + 2 * VW))), dBa(static_cast<size_t>(T * 2 * s.hv));
  Doubles dALog(static_cast<size_t>(s.hv), 0.0), dDtBias(static_cast<size_t>(s.hv), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    double *row = &dQkvz[t * (2 * KW + 2 * VW)];
    const double *m = &dMixed[t * C];
    for (int64_t kh = 0; kh < s.hk; ++kh)
      for (int64_t i = 0; i < s.dk; ++i) {
        row[s.qCol(kh, i)] = m[kh * s.dk + i];
        row[s.kCol(kh, i)] = m[KW + kh * s.dk + i];
      }
    for (int64_t h = 0; h < s.hv; ++h) {
      for (int64_t c = 0; c < s.dv; ++c) {
        row[s.vCol(h, c)] = m[2 * KW + h * s.dv + c];
        row[s.zCol(h, c)] = dz[t * VW + h * s.dv + c];
      }
      int64_t th = t * s.hv + h;
      double beta = f.beta[th], dg = rule.logDecay[th];
      dBa[t * 2 * s.hv + s.bCol(h)] = rule.beta[th] * beta * (1.0 - beta);
      // g = -exp(A_log) * softplus(a + dt_bias).
      double da = -dg * std::exp(static_cast<double>(aLog[h])) * softplusGrad(f.a[th] + dtBias[h]);
      dBa[t * 2 * s.hv + s.aCol(h)] = da;
      dDtBias[h] += da;
      dALog[h] += dg * f.g[th];
    }
  }
  layout.write(Qkvz, dQkvz);
  layout.write(Ba, dBa);
  layout.write(ConvWeight, dConvWeight);
  layout.write(ALog, dALog);
  layout.write(DtBias, dDtBias);
  layout.write(NormWeight, dNorm);
}

} // namespace

void registerGatedDeltaNetKernels(KernelRegistry &registry) {
  registry.add("gated_delta_net", gatedDeltaNet);
  registry.add("gated_delta_net.backward", gatedDeltaNetBackward);
}

} // namespace moec::runtime::cpu::linattn
