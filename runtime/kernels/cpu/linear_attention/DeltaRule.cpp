//===- DeltaRule.cpp - pieces shared by the Gated DeltaNet and KDA kernels ===//

#include "runtime/kernels/cpu/linear_attention/DeltaRule.h"

#include <algorithm>
#include <cmath>

namespace moec::runtime::cpu::linattn {

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

double softplus(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }

double softplusGrad(double x) { return x > 20.0 ? 1.0 : sigmoid(x); }

namespace {

double silu(double x) { return x * sigmoid(x); }

double siluGrad(double x) {
  double s = sigmoid(x);
  return s * (1.0 + x * (1.0 - s));
}

} // namespace

float *floatsOf(const KernelContext &ctx, const TensorRef &t, const char *what) {
  if (t.dtype != plan::F32)
    ctx.fail(std::string(what) + " must be f32 (the CPU kernels support f32 only)");
  return static_cast<float *>(t.data);
}

BackwardLayout::BackwardLayout(const KernelContext &ctx, size_t numOperands,
                               const std::vector<int64_t> &resultShape)
    : ctx(ctx) {
  auto expectF32 = [](const KernelContext &ctx, const TensorRef &t, const char *what) {
    floatsOf(ctx, t, what);
  };
  if (const TensorRef *g = checks::linattn::checkBackwardLayout(ctx, numOperands, resultShape, expectF32))
    grad = static_cast<const float *>(g->data);
}

void BackwardLayout::write(int64_t operand, const Doubles &values) const {
  int64_t index = ctx.gradOutputFor(operand);
  if (index < 0)
    return;
  float *out = static_cast<float *>(ctx.outputs[index].data);
  for (size_t i = 0; i < values.size(); ++i)
    out[i] = static_cast<float>(values[i]);
}

void convSiluForward(const KernelContext &ctx, const Tokens &tokens, const Doubles &x,
                     int64_t channels, const float *w, int64_t width, Doubles &out) {
  out.assign(x.size(), 0.0);
  ctx.parallelFor(channels, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c)
      for (int64_t b = 0; b < tokens.sequences; ++b) {
        int64_t start = b * tokens.seqLen;
        for (int64_t t = start; t < start + tokens.seqLen; ++t) {
          double pre = 0;
          for (int64_t j = 0; j < width; ++j) {
            int64_t s = t - (width - 1) + j;
            if (s >= start)
              pre += static_cast<double>(w[c * width + j]) * x[s * channels + c];
          }
          out[t * channels + c] = silu(pre);
        }
      }
  });
}

void convSiluBackward(const KernelContext &ctx, const Tokens &tokens, const Doubles &x,
                      int64_t channels, const float *w, int64_t width, const Doubles &dout,
                      Doubles &dx, Doubles &dw) {
  dx.assign(x.size(), 0.0);
  dw.assign(static_cast<size_t>(channels * width), 0.0);
  ctx.parallelFor(channels, [&](int64_t begin, int64_t end) {
    Doubles dpre(static_cast<size_t>(tokens.seqLen));
    for (int64_t c = begin; c < end; ++c)
      for (int64_t b = 0; b < tokens.sequences; ++b) {
        int64_t start = b * tokens.seqLen, stop = start + tokens.seqLen;
        for (int64_t t = start; t < stop; ++t) {
          double pre = 0;
          for (int64_t j = 0; j < width; ++j) {
            int64_t s = t - (width - 1) + j;
            if (s >= start)
              pre += static_cast<double>(w[c * width + j]) * x[s * channels + c];
          }
          dpre[t - start] = dout[t * channels + c] * siluGrad(pre);
        }
        for (int64_t t = start; t < stop; ++t)
          for (int64_t j = 0; j < width; ++j) {
            int64_t s = t - (width - 1) + j;
            if (s >= start) {
              dw[c * width + j] += dpre[t - start] * x[s * channels + c];
              dx[s * channels + c] += dpre[t - start] * w[c * width + j];
            }
          }
      }
  });
}

void l2NormForward(const Doubles &x, int64_t dim, double scale, Doubles &y, Doubles &inv) {
  size_t rows = x.size() / dim;
  y.resize(x.size());
  inv.resize(rows);
  for (size_t r = 0; r < rows; ++r) {
    const double *xr = &x[r * dim];
    double sum = 0;
    for (int64_t i = 0; i < dim; ++i)
      sum += xr[i] * xr[i];
    inv[r] = 1.0 / std::sqrt(sum + 1e-6);
    for (int64_t i = 0; i < dim; ++i)
      y[r * dim + i] = xr[i] * inv[r] * scale;
  }
}

void l2NormBackward(const Doubles &x, int64_t dim, double scale, const Doubles &inv,
                    const Doubles &dy, Doubles &dx) {
  size_t rows = x.size() / dim;
  dx.resize(x.size());
  for (size_t r = 0; r < rows; ++r) {
    const double *xr = &x[r * dim], *dyr = &dy[r * dim];
    double dot = 0;
    for (int64_t i = 0; i < dim; ++i)
      dot += xr[i] * dyr[i];
    double n = inv[r];
    for (int64_t i = 0; i < dim; ++i)
      dx[r * dim + i] = scale * n * (dyr[i] - xr[i] * n * n * dot);
  }
}

namespace {

/// One (sequence, value head) of a DeltaRule: pointers to a token's vectors.
struct HeadView {
  const DeltaRule &rule;
  int64_t head, keyHead;

  HeadView(const DeltaRule &rule, int64_t head)
      : rule(rule), head(head), keyHead(head / (rule.heads / rule.keyHeads)) {}
  const double *q(int64_t t) const { return rule.q + (t * rule.keyHeads + keyHead) * rule.keyDim; }
  const double *k(int64_t t) const { return rule.k + (t * rule.keyHeads + keyHead) * rule.keyDim; }
  const double *v(int64_t t) const { return rule.v + (t * rule.heads + head) * rule.valueDim; }
  double beta(int64_t t) const { return rule.beta[t * rule.heads + head]; }
  /// exp(g) of key channel i at token t.
  double decay(int64_t t, int64_t i) const {
    return std::exp(rule.channelDecay ? rule.logDecay[(t * rule.heads + head) * rule.keyDim + i]
                                      : rule.logDecay[t * rule.heads + head]);
  }
};

/// S <- the state after token t; o (if given) <- S^T q_t. S is [dk, dv] row-major.
void stepForward(const HeadView &view, int64_t t, double *S, double *mem, double *o) {
  int64_t dk = view.rule.keyDim, dv = view.rule.valueDim;
  const double *k = view.k(t), *v = view.v(t);
  for (int64_t i = 0; i < dk; ++i) {
    double d = view.decay(t, i);
    for (int64_t j = 0; j < dv; ++j)
      S[i * dv + j] *= d;
  }
  std::fill(mem, mem + dv, 0.0);
  for (int64_t i = 0; i < dk; ++i)
    for (int64_t j = 0; j < dv; ++j)
      mem[j] += S[i * dv + j] * k[i];
  double beta = view.beta(t);
  for (int64_t j = 0; j < dv; ++j)
    mem[j] = beta * (v[j] - mem[j]); // u
  for (int64_t i = 0; i < dk; ++i)
    for (int64_t j = 0; j < dv; ++j)
      S[i * dv + j] += k[i] * mem[j];
  if (!o)
    return;
  const double *q = view.q(t);
  std::fill(o, o + dv, 0.0);
  for (int64_t i = 0; i < dk; ++i)
    for (int64_t j = 0; j < dv; ++j)
      o[j] += S[i * dv + j] * q[i];
}

} // namespace

void deltaRuleForward(const KernelContext &ctx, const Tokens &tokens, const DeltaRule &rule,
                      Doubles &o) {
  int64_t dk = rule.keyDim, dv = rule.valueDim;
  o.assign(static_cast<size_t>(tokens.count * rule.heads * dv), 0.0);
  ctx.parallelFor(tokens.sequences * rule.heads, [&](int64_t begin, int64_t end) {
    Doubles S(static_cast<size_t>(dk * dv)), mem(static_cast<size_t>(dv));
    for (int64_t task = begin; task < end; ++task) {
      int64_t b = task / rule.heads, h = task % rule.heads;
      HeadView view(rule, h);
      std::fill(S.begin(), S.end(), 0.0);
      for (int64_t t = b * tokens.seqLen; t < (b + 1) * tokens.seqLen; ++t)
        stepForward(view, t, S.data(), mem.data(), &o[(t * rule.heads + h) * dv]);
    }
  });
}

void deltaRuleBackward(const KernelContext &ctx, const Tokens &tokens, const DeltaRule &rule,
                       const Doubles &dO, DeltaRuleGrads &grads) {
  int64_t H = rule.heads, dk = rule.keyDim, dv = rule.valueDim, T = tokens.count;
  grads.q.assign(static_cast<size_t>(T * H * dk), 0.0);
  grads.k.assign(static_cast<size_t>(T * H * dk), 0.0);
  grads.v.assign(static_cast<size_t>(T * H * dv), 0.0);
  grads.beta.assign(static_cast<size_t>(T * H), 0.0);
  grads.logDecay.assign(static_cast<size_t>(T * rule.decayWidth()), 0.0);
  // The states are recomputed from checkpoints every `chunk` tokens, so a task
  // holds about 2 sqrt(seqLen) states instead of seqLen.
  int64_t chunk = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(std::sqrt(tokens.seqLen))));
  int64_t numChunks = (tokens.seqLen + chunk - 1) / chunk, size = dk * dv;
  ctx.parallelFor(tokens.sequences * H, [&](int64_t begin, int64_t end) {
    Doubles checkpoints(static_cast<size_t>(numChunks * size)),
        states(static_cast<size_t>(chunk * size));
    Doubles S(static_cast<size_t>(size)), dS(static_cast<size_t>(size)),
        P(static_cast<size_t>(size));
    Doubles u(static_cast<size_t>(dv)), e(static_cast<size_t>(dv)), du(static_cast<size_t>(dv)),
        dm(static_cast<size_t>(dv)), d(static_cast<size_t>(dk));
    for (int64_t task = begin; task < end; ++task) {
      int64_t b = task / H, h = task % H, first = b * tokens.seqLen;
      HeadView view(rule, h);
      std::fill(S.begin(), S.end(), 0.0);
      for (int64_t c = 0; c < numChunks; ++c) {
        std::copy(S.begin(), S.end(), checkpoints.begin() + c * size);
        for (int64_t t = first + c * chunk;
             t < std::min(first + (c + 1) * chunk, first + tokens.seqLen); ++t)
          stepForward(view, t, S.data(), u.data(), nullptr);
      }
      std::fill(dS.begin(), dS.end(), 0.0); // gradient of the state after the current token
      for (int64_t c = numChunks - 1; c >= 0; --c) {
        int64_t c0 = first + c * chunk, c1 = std::min(c0 + chunk, first + tokens.seqLen);
        std::copy(checkpoints.begin() + c * size, checkpoints.begin() + (c + 1) * size, S.begin());
        for (int64_t t = c0; t < c1; ++t) {
          std::copy(S.begin(), S.end(), states.begin() + (t - c0) * size);
          stepForward(view, t, S.data(), u.data(), nullptr);
        }
        for (int64_t t = c1 - 1; t >= c0; --t) {
          const double *prev = &states[(t - c0) * size];
          const double *q = view.q(t), *k = view.k(t), *v = view.v(t), *dOt = &dO[(t * H + h) * dv];
          double beta = view.beta(t);
          // Forward quantities of this token: P = Diag(d) S_prev, e = v - P^T k, u = beta e.
          for (int64_t i = 0; i < dk; ++i) {
            d[i] = view.decay(t, i);
            for (int64_t j = 0; j < dv; ++j)
              P[i * dv + j] = d[i] * prev[i * dv + j];
          }
          for (int64_t j = 0; j < dv; ++j) {
            double m = 0;
            for (int64_t i = 0; i < dk; ++i)
              m += P[i * dv + j] * k[i];
            e[j] = v[j] - m;
            u[j] = beta * e[j];
          }
          // o = S^T q with S = P + k u^T.
          double *gq = &grads.q[(t * H + h) * dk], *gk = &grads.k[(t * H + h) * dk];
          for (int64_t i = 0; i < dk; ++i) {
            double sum = 0;
            for (int64_t j = 0; j < dv; ++j) {
              sum += (P[i * dv + j] + k[i] * u[j]) * dOt[j];
              dS[i * dv + j] += q[i] * dOt[j];
            }
            gq[i] = sum;
          }
          // S = P + k u^T.
          std::fill(du.begin(), du.end(), 0.0);
          for (int64_t i = 0; i < dk; ++i) {
            double sum = 0;
            for (int64_t j = 0; j < dv; ++j) {
              du[j] += dS[i * dv + j] * k[i];
              sum += dS[i * dv + j] * u[j];
            }
            gk[i] = sum;
          }
          // u = beta (v - P^T k).
          double dBeta = 0;
          double *gv = &grads.v[(t * H + h) * dv];
          for (int64_t j = 0; j < dv; ++j) {
            dBeta += du[j] * e[j];
            gv[j] = beta * du[j];
            dm[j] = -beta * du[j];
          }
          grads.beta[t * H + h] = dBeta;
          // P feeds S and m = P^T k; S_prev feeds P = Diag(exp(g)) S_prev.
          double decaySum = 0;
          for (int64_t i = 0; i < dk; ++i) {
            double dk_i = 0, dg = 0;
            for (int64_t j = 0; j < dv; ++j) {
              double dP = dS[i * dv + j] + k[i] * dm[j];
              dk_i += P[i * dv + j] * dm[j];
              dg += dP * P[i * dv + j];
              dS[i * dv + j] = d[i] * dP;
            }
            gk[i] += dk_i;
            if (rule.channelDecay)
              grads.logDecay[(t * H + h) * dk + i] = dg;
            else
              decaySum += dg;
          }
          if (!rule.channelDecay)
            grads.logDecay[t * H + h] = decaySum;
        }
      }
    }
  });
}

namespace {

double activate(GateActivation act, double x) {
  return act == GateActivation::Silu ? silu(x) : sigmoid(x);
}

double activateGrad(GateActivation act, double x) {
  if (act == GateActivation::Silu)
    return siluGrad(x);
  double s = sigmoid(x);
  return s * (1.0 - s);
}

/// 1 / sqrt(mean(o^2) + eps) of one head.
double invRms(const double *o, int64_t dim, double eps) {
  double sum = 0;
  for (int64_t j = 0; j < dim; ++j)
    sum += o[j] * o[j];
  return 1.0 / std::sqrt(sum / static_cast<double>(dim) + eps);
}

} // namespace

void gatedNormForward(const KernelContext &ctx, const Doubles &o, const Doubles &gate,
                      const float *w, int64_t dim, double eps, GateActivation act, float *y) {
  int64_t groups = static_cast<int64_t>(o.size()) / dim;
  ctx.parallelFor(groups, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const double *og = &o[g * dim];
      double r = invRms(og, dim, eps);
      for (int64_t j = 0; j < dim; ++j)
        y[g * dim + j] = static_cast<float>(og[j] * r * w[j] * activate(act, gate[g * dim + j]));
    }
  });
}

void gatedNormBackward(const KernelContext &ctx, const Doubles &o, const Doubles &gate,
                       const float *w, int64_t dim, double eps, GateActivation act, const float *dy,
                       Doubles &dO, Doubles &dGate, Doubles &dW) {
  int64_t groups = static_cast<int64_t>(o.size()) / dim;
  dO.assign(o.size(), 0.0);
  dGate.assign(o.size(), 0.0);
  dW.assign(static_cast<size_t>(dim), 0.0);
  Doubles inv(static_cast<size_t>(groups));
  ctx.parallelFor(groups, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const double *og = &o[g * dim];
      double r = inv[g] = invRms(og, dim, eps), dot = 0;
      for (int64_t j = 0; j < dim; ++j) {
        double x = gate[g * dim + j];
        double dn = dy[g * dim + j] * w[j] * activate(act, x);
        dGate[g * dim + j] = dy[g * dim + j] * og[j] * r * w[j] * activateGrad(act, x);
        dO[g * dim + j] = r * dn;
        dot += dn * og[j];
      }
      double k = r * r * r * dot / static_cast<double>(dim);
      for (int64_t j = 0; j < dim; ++j)
        dO[g * dim + j] -= og[j] * k;
    }
  });
  // dW sums over every token and head in a fixed order, one column per task.
  ctx.parallelFor(dim, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      double sum = 0;
      for (int64_t g = 0; g < groups; ++g)
        sum += dy[g * dim + j] * o[g * dim + j] * inv[g] * activate(act, gate[g * dim + j]);
      dW[j] = sum;
    }
  });
}

} // namespace moec::runtime::cpu::linattn
