//===- Mamba2.cpp - Nemotron-H's Mamba-2 mixer, forward and backward ------===//
//
// `mamba2` takes the fused in_proj output zxbcdt = [z | xBC | dt] (the
// transformers split [d_mlp, d_mlp, H*p, conv_dim, H] with d_mlp = 0, which
// the op's width 2*H*p + 2*G*N + H implies) and computes, per sequence:
//
//   xBC  = silu(causal_depthwise_conv(xBC) + conv_bias), split into x [H,p],
//          B [G,N], C [G,N]; head h reads group h / (H/G)
//   dt   = max(softplus(dt + dt_bias), time_step_min),  A = -exp(A_log)
//   s_t  = exp(dt_t A) s_{t-1} + dt_t x_t B_tᵀ      (s: [p,N] per head)
//   y_t  = s_t C_t + D x_t
//   out  = rmsnorm_groups(y * silu(z)) * norm_weight, groups of H*p/G
//
// transformers' torch_forward computes the SSD scan chunk by chunk; that is
// this recurrence regrouped, so we run the recurrence (state in double) and
// use chunk_size only to space the backward's checkpoints. The gated norm
// multiplies by silu(z) before normalising (Zamba2RMSNormGated, Mamba-2's
// norm_before_gate=False). torch_forward clamps dt from below at the config's
// time_step_min (the CUDA path clamps to time_step_limit = (0, inf) instead);
// the optional `time_step_min` attribute carries it, absent = 0 (no clamp).
//
//===----------------------------------------------------------------------===//

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "runtime/kernels/checks/mamba/Mamba2Checks.h"
#include "runtime/kernels/cpu/CpuKernels.h"

namespace moec::runtime::cpu {
namespace {

using namespace checks::mamba2;

/// The CPU kernels take f32 only.
const Rules kRules{};

/// Float views of the forward operands (convBias null when absent).
struct Mamba2Inputs {
  const float *zxbcdt, *convWeight, *convBias, *dtBias, *aLog, *dSkip, *normWeight;
};

double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }
double silu(double v) { return v * sigmoid(v); }
double siluGrad(double v) {
  double s = sigmoid(v);
  return s * (1.0 + v * (1.0 - s));
}
// torch's softplus: linear above threshold 20.
double softplus(double v) { return v > 20.0 ? v : std::log1p(std::exp(v)); }
double softplusGrad(double v) { return v > 20.0 ? 1.0 : sigmoid(v); }

Mamba2Inputs readInputs(const KernelContext &ctx, const std::vector<int64_t> &present) {
  auto at = [&](int op) { return present[op] < 0 ? nullptr : ctx.in(present[op]).f32(); };
  return {at(Zxbcdt), at(ConvWeight), at(ConvBias),  at(DtBias),
          at(ALog),   at(DSkip),      at(NormWeight)};
}

/// The causal depthwise conv (pre-activation) of xBC: pre [T, channels].
void convolve(const KernelContext &ctx, const Mamba2Shape &s, const Mamba2Inputs &in,
              std::vector<float> &pre) {
  pre.assign(s.tokens * s.channels, 0.0f);
  ctx.parallelFor(s.tokens, [&](int64_t begin, int64_t end) {
    std::vector<double> acc(s.channels);
    for (int64_t row = begin; row < end; ++row) {
      int64_t t = row % s.seqLen; // the conv restarts with each sequence
      for (int64_t c = 0; c < s.channels; ++c)
        acc[c] = in.convBias ? in.convBias[c] : 0.0;
      for (int64_t k = 0; k < s.kernel; ++k) {
        int64_t back = s.kernel - 1 - k; // tap k reads position t - back
        if (back > t)
          continue;
        const float *src = in.zxbcdt + (row - back) * s.width + s.inner;
        for (int64_t c = 0; c < s.channels; ++c)
          acc[c] += static_cast<double>(in.convWeight[c * s.kernel + k]) * src[c];
      }
      for (int64_t c = 0; c < s.channels; ++c)
        pre[row * s.channels + c] = static_cast<float>(acc[c]);
    }
  });
}

/// act = silu(pre), elementwise.
void activate(const KernelContext &ctx, const std::vector<float> &pre, std::vector<float> &act) {
  act.resize(pre.size());
  ctx.parallelFor(static_cast<int64_t>(pre.size()), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      act[i] = static_cast<float>(silu(pre[i]));
  });
}

/// dt [T, H] = max(softplus(dt_raw + dt_bias), time_step_min).
void timeSteps(const KernelContext &ctx, const Mamba2Shape &s, const Mamba2Inputs &in,
               std::vector<float> &dt) {
  dt.resize(s.tokens * s.heads);
  ctx.parallelFor(s.tokens, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row)
      for (int64_t h = 0; h < s.heads; ++h) {
        double u =
            static_cast<double>(in.zxbcdt[row * s.width + s.inner + s.channels + h]) + in.dtBias[h];
        dt[row * s.heads + h] = static_cast<float>(std::max(softplus(u), s.dtMin));
      }
  });
}

/// One recurrence step of head h at token `row`: s = a s + dt x Bᵀ.
struct Step {
  const float *x, *b, *c;
  double dt, a;
};

Step stepAt(const Mamba2Shape &s, const std::vector<float> &act, const std::vector<float> &dt,
            double aCoef, int64_t row, int64_t h) {
  int64_t g = h / s.headsPerGroup;
  const float *base = act.data() + row * s.channels;
  double d = dt[row * s.heads + h];
  return {base + h * s.headDim, base + s.bColumn(g), base + s.cColumn(g), d, std::exp(d * aCoef)};
}

void advance(const Mamba2Shape &s, const Step &st, double *state) {
  for (int64_t i = 0; i < s.headDim; ++i) {
    double dx = st.dt * st.x[i];
    double *si = state + i * s.state;
    for (int64_t n = 0; n < s.state; ++n)
      si[n] = st.a * si[n] + dx * st.b[n];
  }
}

/// The SSM scan: y [T, H*p] = s_t C_t + D x_t, per (sequence, head).
void scan(const KernelContext &ctx, const Mamba2Shape &s, const Mamba2Inputs &in,
          const std::vector<float> &act, const std::vector<float> &dt, std::vector<float> &y) {
  y.assign(s.tokens * s.inner, 0.0f);
  ctx.parallelFor(s.batch * s.heads, [&](int64_t begin, int64_t end) {
    std::vector<double> state(s.headDim * s.state);
    for (int64_t task = begin; task < end; ++task) {
      int64_t b = task / s.heads, h = task % s.heads;
      double aCoef = -std::exp(static_cast<double>(in.aLog[h])), skip = in.dSkip[h];
      std::fill(state.begin(), state.end(), 0.0);
      for (int64_t row = b * s.seqLen; row < (b + 1) * s.seqLen; ++row) {
        Step st = stepAt(s, act, dt, aCoef, row, h);
        advance(s, st, state.data());
        float *out = y.data() + row * s.inner + h * s.headDim;
        for (int64_t i = 0; i < s.headDim; ++i) {
          double acc = skip * st.x[i];
          for (int64_t n = 0; n < s.state; ++n)
            acc += state[i * s.state + n] * st.c[n];
          out[i] = static_cast<float>(acc);
        }
      }
    }
  });
}

/// Everything the forward computes before the gated norm.
struct Mamba2Trace {
  std::vector<float> pre, act, dt, y;
};

Mamba2Trace trace(const KernelContext &ctx, const Mamba2Shape &s, const Mamba2Inputs &in) {
  Mamba2Trace tr;
  convolve(ctx, s, in, tr.pre);
  activate(ctx, tr.pre, tr.act);
  timeSteps(ctx, s, in, tr.dt);
  scan(ctx, s, in, tr.act, tr.dt, tr.y);
  return tr;
}

void mamba2Forward(KernelContext &ctx) {
  std::vector<int64_t> present;
  Mamba2Shape s = readShape(ctx, ctx.inputs.size(), present, kRules);
  ctx.expectShape(ctx.out(0), "result", {s.tokens, s.inner});
  expectFloat(ctx, ctx.out(0), "result", kRules);
  Mamba2Inputs in = readInputs(ctx, present);
  float *out = ctx.out(0).f32();
  Mamba2Trace tr = trace(ctx, s, in);

  ctx.parallelFor(s.tokens, [&](int64_t begin, int64_t end) {
    std::vector<double> v(s.normGroup);
    for (int64_t row = begin; row < end; ++row)
      for (int64_t g = 0; g < s.groups; ++g) {
        int64_t first = g * s.normGroup;
        double sumSq = 0;
        for (int64_t j = 0; j < s.normGroup; ++j) {
          v[j] = static_cast<double>(tr.y[row * s.inner + first + j]) *
                 silu(in.zxbcdt[row * s.width + first + j]);
          sumSq += v[j] * v[j];
        }
        double r = 1.0 / std::sqrt(sumSq / s.normGroup + s.eps);
        for (int64_t j = 0; j < s.normGroup; ++j)
          out[row * s.inner + first + j] = static_cast<float>(v[j] * r * in.normWeight[first + j]);
      }
  });
}

void mamba2Backward(KernelContext &ctx) {
  // Inputs: the forward operands, then the gradient of the one result.
  std::vector<int64_t> present;
  Mamba2Shape s = readBackwardShape(ctx, present, kRules);
  const TensorRef &gradOut = ctx.inputs.back();
  Mamba2Inputs in = readInputs(ctx, present);
  const float *gOut = gradOut.f32();

  // Each gradient goes to its output when asked for, else to scratch.
  std::vector<std::vector<float>> scratch(NumOperands);
  auto gradFor = [&](int op, int64_t n) -> float * {
    int64_t out = present[op] < 0 ? -1 : ctx.gradOutputFor(present[op]);
    if (out >= 0)
      return ctx.out(out).f32();
    scratch[op].assign(n, 0.0f);
    return scratch[op].data();
  };
  float *gZxbcdt = gradFor(Zxbcdt, s.tokens * s.width);
  float *gWeight = gradFor(ConvWeight, s.channels * s.kernel);
  float *gBias = s.convBias ? gradFor(ConvBias, s.channels) : nullptr;
  float *gDtBias = gradFor(DtBias, s.heads);
  float *gALog = gradFor(ALog, s.heads);
  float *gDSkip = gradFor(DSkip, s.heads);
  float *gNorm = gradFor(NormWeight, s.inner);

  Mamba2Trace tr = trace(ctx, s, in);

  // Gated norm: gy [T, H*p] and the z part of gZxbcdt; normed [T, H*p] for norm_weight.
  std::vector<float> gy(s.tokens * s.inner), normed(s.tokens * s.inner);
  ctx.parallelFor(s.tokens, [&](int64_t begin, int64_t end) {
    std::vector<double> v(s.normGroup), gn(s.normGroup);
    for (int64_t row = begin; row < end; ++row)
      for (int64_t g = 0; g < s.groups; ++g) {
        int64_t first = row * s.inner + g * s.normGroup;
        const float *z = in.zxbcdt + row * s.width + g * s.normGroup;
        double sumSq = 0, dot = 0;
        for (int64_t j = 0; j < s.normGroup; ++j) {
          v[j] = static_cast<double>(tr.y[first + j]) * silu(z[j]);
          gn[j] = static_cast<double>(gOut[first + j]) * in.normWeight[g * s.normGroup + j];
          sumSq += v[j] * v[j];
          dot += gn[j] * v[j];
        }
        double r = 1.0 / std::sqrt(sumSq / s.normGroup + s.eps);
        double coef = r * r * r * dot / s.normGroup;
        for (int64_t j = 0; j < s.normGroup; ++j) {
          double gv = r * gn[j] - coef * v[j];
          gy[first + j] = static_cast<float>(gv * silu(z[j]));
          gZxbcdt[row * s.width + g * s.normGroup + j] =
              static_cast<float>(gv * tr.y[first + j] * siluGrad(z[j]));
          normed[first + j] = static_cast<float>(v[j] * r);
        }
      }
  });
  ctx.parallelFor(s.inner, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      double acc = 0;
      for (int64_t row = 0; row < s.tokens; ++row)
        acc += static_cast<double>(gOut[row * s.inner + j]) * normed[row * s.inner + j];
      gNorm[j] = static_cast<float>(acc);
    }
  });

  // The scan in reverse, per (sequence, head). States are checkpointed at
  // chunk starts and recomputed one chunk at a time, so memory stays at
  // (seq_len / chunk + chunk) states per task. gB and gC are per head here
  // and summed over each group's heads afterwards (a fixed order).
  std::vector<float> gAct(s.tokens * s.channels, 0.0f), gDt(s.tokens * s.heads);
  std::vector<float> gBHead(s.tokens * s.heads * s.state), gCHead(s.tokens * s.heads * s.state);
  std::vector<double> gASeq(s.batch * s.heads), gDSeq(s.batch * s.heads);
  ctx.parallelFor(s.batch * s.heads, [&](int64_t begin, int64_t end) {
    int64_t size = s.headDim * s.state, chunk = std::min(s.chunk, s.seqLen);
    int64_t numChunks = (s.seqLen + chunk - 1) / chunk;
    std::vector<double> checkpoints(numChunks * size), states(chunk * size), state(size), gs(size),
        gBAcc(s.state);
    for (int64_t task = begin; task < end; ++task) {
      int64_t b = task / s.heads, h = task % s.heads, first = b * s.seqLen;
      double aCoef = -std::exp(static_cast<double>(in.aLog[h])), skip = in.dSkip[h];
      std::fill(state.begin(), state.end(), 0.0);
      for (int64_t t = 0; t < s.seqLen; ++t) {
        if (t % chunk == 0)
          std::copy(state.begin(), state.end(), checkpoints.begin() + (t / chunk) * size);
        advance(s, stepAt(s, tr.act, tr.dt, aCoef, first + t, h), state.data());
      }
      std::fill(gs.begin(), gs.end(), 0.0); // holds a_{t+1} * dL/ds_{t+1}
      double gA = 0, gD = 0;
      for (int64_t c = numChunks - 1; c >= 0; --c) {
        int64_t t0 = c * chunk, t1 = std::min(s.seqLen, t0 + chunk);
        const double *start = checkpoints.data() + c * size;
        std::copy(start, start + size, state.begin());
        for (int64_t t = t0; t < t1; ++t) {
          advance(s, stepAt(s, tr.act, tr.dt, aCoef, first + t, h), state.data());
          std::copy(state.begin(), state.end(), states.begin() + (t - t0) * size);
        }
        for (int64_t t = t1 - 1; t >= t0; --t) {
          int64_t row = first + t;
          Step st = stepAt(s, tr.act, tr.dt, aCoef, row, h);
          const double *cur = states.data() + (t - t0) * size;
          const double *prev = t == t0 ? start : cur - size;
          const float *g = gy.data() + row * s.inner + h * s.headDim;
          float *gx = gAct.data() + row * s.channels + h * s.headDim;
          float *gB = gBHead.data() + (row * s.heads + h) * s.state;
          float *gC = gCHead.data() + (row * s.heads + h) * s.state;
          for (int64_t n = 0; n < s.state; ++n) {
            double acc = 0;
            for (int64_t i = 0; i < s.headDim; ++i)
              acc += static_cast<double>(g[i]) * cur[i * s.state + n];
            gC[n] = static_cast<float>(acc);
          }
          double gDecay = 0, gStep = 0; // dL/da_t, and dL/ddt_t through dt x Bᵀ
          std::fill(gBAcc.begin(), gBAcc.end(), 0.0);
          for (int64_t i = 0; i < s.headDim; ++i) {
            double *gsi = gs.data() + i * s.state, gsB = 0, gsIn = 0;
            for (int64_t n = 0; n < s.state; ++n) {
              gsi[n] += static_cast<double>(g[i]) * st.c[n];
              gsB += gsi[n] * st.b[n];
              gsIn += gsi[n] * prev[i * s.state + n];
              gBAcc[n] += gsi[n] * st.x[i];
            }
            gD += static_cast<double>(g[i]) * st.x[i];
            gx[i] = static_cast<float>(skip * g[i] + st.dt * gsB);
            gStep += gsB * st.x[i];
            gDecay += gsIn;
          }
          for (int64_t n = 0; n < s.state; ++n)
            gB[n] = static_cast<float>(st.dt * gBAcc[n]);
          // a_t = exp(dt_t A): da/ddt = a A, da/dA = a dt.
          gDt[row * s.heads + h] = static_cast<float>(gStep + gDecay * st.a * aCoef);
          gA += gDecay * st.a * st.dt;
          for (double &v : gs)
            v *= st.a;
        }
      }
      gASeq[task] = gA;
      gDSeq[task] = gD;
    }
  });

  // gB/gC summed over each group's heads, then through the SiLU to the conv.
  ctx.parallelFor(s.tokens, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      float *ga = gAct.data() + row * s.channels;
      for (int64_t g = 0; g < s.groups; ++g)
        for (int64_t n = 0; n < s.state; ++n) {
          double accB = 0, accC = 0;
          for (int64_t h = g * s.headsPerGroup; h < (g + 1) * s.headsPerGroup; ++h) {
            accB += gBHead[(row * s.heads + h) * s.state + n];
            accC += gCHead[(row * s.heads + h) * s.state + n];
          }
          ga[s.bColumn(g) + n] = static_cast<float>(accB);
          ga[s.cColumn(g) + n] = static_cast<float>(accC);
        }
      for (int64_t c = 0; c < s.channels; ++c)
        ga[c] = static_cast<float>(ga[c] * siluGrad(tr.pre[row * s.channels + c]));
    }
  });

  // Conv input gradient: tap k of output t reads input t - (K-1-k) of the same sequence.
  ctx.parallelFor(s.tokens, [&](int64_t begin, int64_t end) {
    std::vector<double> acc(s.channels);
    for (int64_t row = begin; row < end; ++row) {
      int64_t t = row % s.seqLen;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t k = 0; k < s.kernel; ++k) {
        int64_t ahead = s.kernel - 1 - k;
        if (t + ahead >= s.seqLen)
          continue;
        const float *src = gAct.data() + (row + ahead) * s.channels;
        for (int64_t c = 0; c < s.channels; ++c)
          acc[c] += static_cast<double>(in.convWeight[c * s.kernel + k]) * src[c];
      }
      for (int64_t c = 0; c < s.channels; ++c)
        gZxbcdt[row * s.width + s.inner + c] = static_cast<float>(acc[c]);
    }
  });
  // Conv weight and bias: sums over tokens, split by channel.
  ctx.parallelFor(s.channels, [&](int64_t begin, int64_t end) {
    std::vector<double> accW((end - begin) * s.kernel, 0.0), accB(end - begin, 0.0);
    for (int64_t row = 0; row < s.tokens; ++row) {
      int64_t t = row % s.seqLen;
      const float *ga = gAct.data() + row * s.channels;
      for (int64_t k = 0; k < s.kernel; ++k) {
        int64_t back = s.kernel - 1 - k;
        if (back > t)
          continue;
        const float *src = in.zxbcdt + (row - back) * s.width + s.inner;
        for (int64_t c = begin; c < end; ++c)
          accW[(c - begin) * s.kernel + k] += static_cast<double>(ga[c]) * src[c];
      }
      for (int64_t c = begin; c < end; ++c)
        accB[c - begin] += ga[c];
    }
    for (int64_t c = begin; c < end; ++c) {
      for (int64_t k = 0; k < s.kernel; ++k)
        gWeight[c * s.kernel + k] = static_cast<float>(accW[(c - begin) * s.kernel + k]);
      if (gBias)
        gBias[c] = static_cast<float>(accB[c - begin]);
    }
  });

  // dt: through the clamp (torch passes the gradient where dt >= min) and softplus.
  ctx.parallelFor(s.heads, [&](int64_t begin, int64_t end) {
    for (int64_t h = begin; h < end; ++h) {
      double accBias = 0, accA = 0, accD = 0;
      for (int64_t row = 0; row < s.tokens; ++row) {
        int64_t column = row * s.width + s.inner + s.channels + h;
        double u = static_cast<double>(in.zxbcdt[column]) + in.dtBias[h];
        double g = softplus(u) >= s.dtMin ? gDt[row * s.heads + h] * softplusGrad(u) : 0.0;
        gZxbcdt[column] = static_cast<float>(g);
        accBias += g;
      }
      for (int64_t b = 0; b < s.batch; ++b) {
        accA += gASeq[b * s.heads + h];
        accD += gDSeq[b * s.heads + h];
      }
      gDtBias[h] = static_cast<float>(accBias);
      // A = -exp(A_log), so dA/dA_log = A.
      gALog[h] = static_cast<float>(accA * -std::exp(static_cast<double>(in.aLog[h])));
      gDSkip[h] = static_cast<float>(accD);
    }
  });
}

} // namespace

void registerMambaKernels(KernelRegistry &registry) {
  registry.add("mamba2", mamba2Forward);
  registry.add("mamba2.backward", mamba2Backward);
}

} // namespace moec::runtime::cpu
