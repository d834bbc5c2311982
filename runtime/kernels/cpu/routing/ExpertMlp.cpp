//===- ExpertMlp.cpp - every expert's MLP over its rows, and the backward -===//
//
// Rows [offset_e, offset_e + counts[e]) of the dispatched tokens go through
// expert e, one GEMM per expert and projection:
//   gated (gate, or fused_gate_up):  y = down(act(gate x, up x))
//   ungated:                         y = down(act(up x))
// Weights are [E, out, in] (checkpoint layout), or [E, in, out] with
// in_out_layout (gpt-oss). fused_gate_up: `up` holds gate and up interleaved
// along its outputs (gate = columns 0::2, up = 1::2, as GptOssExperts slices
// them), with up_bias in the same order. Activations:
//   silu            gated: silu(g) * u           ungated: silu(u)
//   relu2           gated: relu(g)^2 * u         ungated: relu(u)^2
//   clamped_swiglu  gated only (gpt-oss): g' = min(g, limit),
//                   u' = clamp(u, -limit, limit), (u' + 1) * g' σ(1.702 g')
// Expert LoRA adds lora_scale * B_e (A_e x) to a projection's output for
// expert e (A [E, r, in], B [E, out, r]); only with [out, in] unfused weights.
//
// The forward may save the pre-activations (its optional second output,
// [rows, 2 inter] f32: gate x, then up x), which the backward then reads; else the
// backward recomputes the projections and activations per expert. It writes
// the gradients of the tokens and of any requested weight, bias or LoRA
// factor. Gradient masks at the clamps follow torch.clamp: the gradient passes
// where the input lies within the bounds, ends included.
//
//===----------------------------------------------------------------------===//

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "runtime/kernels/cpu/Gemm.h"
#include "runtime/kernels/cpu/routing/Routing.h"

namespace moec::runtime::cpu::routing {

namespace {

enum Operand {
  Tokens,
  Counts,
  Up,
  Down,
  Gate,
  UpBias,
  DownBias,
  GateLoraA,
  GateLoraB,
  UpLoraA,
  UpLoraB,
  DownLoraA,
  DownLoraB,
  NumOperands
};

enum class Act { Silu, Relu2, ClampedSwiglu };

/// gpt-oss's fixed sigmoid slope in clamped SwiGLU.
constexpr double kSwigluAlpha = 1.702;

struct Lora {
  const float *a = nullptr, *b = nullptr;
  int64_t rank = 0;
  explicit operator bool() const { return a != nullptr; }
};

struct Experts {
  int64_t rows = 0, features = 0, experts = 0, inter = 0, upOut = 0;
  bool fused = false, inOut = false, gated = false;
  Act act = Act::Silu;
  double limit = 0, loraScale = 0;
  const float *x = nullptr, *up = nullptr, *down = nullptr, *gate = nullptr;
  const float *upBias = nullptr, *downBias = nullptr;
  Lora gateLora, upLora, downLora;
  std::vector<int64_t> offset; // E + 1 row offsets

  int64_t count(int64_t e) const { return offset[e + 1] - offset[e]; }
};

OperandGroups expertOperands(const KernelContext &ctx) {
  std::vector<bool> optional(NumOperands, true);
  optional[Tokens] = optional[Counts] = optional[Up] = optional[Down] = false;
  return operandGroups(ctx, optional);
}

Experts parseExperts(const KernelContext &ctx, const OperandGroups &ops) {
  Experts m;
  const TensorRef &x = *ops.get(ctx, Tokens), &counts = *ops.get(ctx, Counts);
  const TensorRef &up = *ops.get(ctx, Up), &down = *ops.get(ctx, Down);
  expectF32(ctx, x, "tokens");
  expectF32(ctx, up, "up");
  expectF32(ctx, down, "down");
  ctx.expectShape(x, "tokens", {-1, -1});
  m.rows = x.dim(0);
  m.features = x.dim(1);
  m.fused = ctx.attrBool("fused_gate_up");
  m.inOut = ctx.attrBool("in_out_layout");
  ctx.expectShape(up, "up", {-1, -1, -1});
  m.experts = up.dim(0);
  // Per expert [out, in], or [in, out] with in_out_layout.
  auto layout = [&](int64_t out, int64_t in) {
    return m.inOut ? std::vector<int64_t>{m.experts, in, out}
                   : std::vector<int64_t>{m.experts, out, in};
  };
  m.upOut = up.dim(m.inOut ? 2 : 1);
  ctx.expectShape(up, "up", layout(m.upOut, m.features));
  if (m.fused && m.upOut % 2 != 0)
    ctx.fail("fused_gate_up needs an even number of up outputs (gate and up interleaved), got " +
             std::to_string(m.upOut));
  m.inter = m.fused ? m.upOut / 2 : m.upOut;
  ctx.expectShape(down, "down", layout(m.features, m.inter));
  m.x = x.f32();
  m.up = up.f32();
  m.down = down.f32();
  if (const TensorRef *gate = ops.get(ctx, Gate)) {
    if (m.fused)
      ctx.fail("a separate gate operand cannot be combined with fused_gate_up");
    expectF32(ctx, *gate, "gate");
    ctx.expectShape(*gate, "gate", layout(m.inter, m.features));
    m.gate = gate->f32();
  }
  m.gated = m.gate || m.fused;
  auto bias = [&](Operand group, const char *what, int64_t size) -> const float * {
    const TensorRef *b = ops.get(ctx, group);
    if (!b)
      return nullptr;
    expectF32(ctx, *b, what);
    if (b->numel() != m.experts * size)
      ctx.fail(std::string(what) + " has " + std::to_string(b->numel()) + " elements, expected " +
               std::to_string(m.experts * size));
    return b->f32();
  };
  m.upBias = bias(UpBias, "up_bias", m.upOut);
  m.downBias = bias(DownBias, "down_bias", m.features);

  auto lora = [&](Operand aGroup, const char *name, int64_t in, int64_t out) {
    Lora l;
    const TensorRef *a = ops.get(ctx, aGroup), *b = ops.get(ctx, aGroup + 1);
    if (!a && !b)
      return l;
    std::string what(name);
    if (!a || !b)
      ctx.fail(what + " needs both its A and B factors");
    if (m.fused || m.inOut)
      ctx.fail("expert LoRA needs separate [out, in] expert weights, not fused_gate_up or "
               "in_out_layout");
    expectF32(ctx, *a, (what + " A").c_str());
    expectF32(ctx, *b, (what + " B").c_str());
    ctx.expectShape(*a, (what + " A").c_str(), {m.experts, -1, in});
    l.rank = a->dim(1);
    ctx.expectShape(*b, (what + " B").c_str(), {m.experts, out, l.rank});
    l.a = a->f32();
    l.b = b->f32();
    return l;
  };
  m.gateLora = lora(GateLoraA, "gate_lora", m.features, m.inter);
  m.upLora = lora(UpLoraA, "up_lora", m.features, m.inter);
  m.downLora = lora(DownLoraA, "down_lora", m.inter, m.features);
  if (m.gateLora && !m.gate)
    ctx.fail("gate_lora needs a gate projection");
  if (m.gateLora || m.upLora || m.downLora)
    m.loraScale = ctx.attrFloat("lora_scale");

  std::string act = ctx.attrString("activation");
  if (act == "silu") {
    m.act = Act::Silu;
  } else if (act == "relu2") {
    m.act = Act::Relu2;
  } else if (act == "clamped_swiglu") {
    m.act = Act::ClampedSwiglu;
    if (!m.gated)
      ctx.fail("clamped_swiglu needs a gate (fused_gate_up or a gate operand)");
    m.limit = ctx.attrFloat("limit");
  } else {
    ctx.fail("unsupported expert activation '" + act + "' (silu, relu2 or clamped_swiglu)");
  }

  if (counts.dtype != plan::I64 && counts.dtype != plan::I32)
    ctx.fail("counts must be i64 (or i32)");
  ctx.expectShape(counts, "counts", {m.experts});
  m.offset.assign(m.experts + 1, 0);
  for (int64_t e = 0; e < m.experts; ++e) {
    if (counts.index(e) < 0)
      ctx.fail("counts[" + std::to_string(e) + "] is negative");
    m.offset[e + 1] = m.offset[e] + counts.index(e);
  }
  // Fewer counted rows than tokens: an expert-parallel rank's received rows, sized for
  // every row any rank could send; the rest are zero in the result.
  if (m.offset[m.experts] > m.rows)
    ctx.fail("counts add up to " + std::to_string(m.offset[m.experts]) + " rows, more than the " +
             std::to_string(m.rows) + " rows of tokens");
  return m;
}

double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

/// The ungated activation f, or the gated one's f(gate).
double unary(Act act, double v) {
  if (act == Act::Silu)
    return v * sigmoid(v);
  double r = v > 0 ? v : 0.0; // relu2
  return r * r;
}

double unaryGrad(Act act, double v) {
  if (act == Act::Silu) {
    double s = sigmoid(v);
    return s * (1.0 + v * (1.0 - s));
  }
  return v > 0 ? 2.0 * v : 0.0; // relu2
}

/// One expert's rows: x [n, in] times one projection of expert e into
/// y [n, out] (y = beta * y + x W_eᵀ, or x W_e with in_out_layout).
void project(const Experts &m, const float *x, int64_t n, int64_t in, const float *w, int64_t e,
             int64_t out, float beta, float *y) {
  const float *we = w + e * in * out;
  gemm(false, !m.inOut, n, out, in, 1.0f, x, in, we, m.inOut ? out : in, beta, y, out);
}

/// y [n, out] += scale * (x A_eᵀ) B_eᵀ; z [n, r] keeps x A_eᵀ.
void addLora(const Experts &m, const Lora &l, const float *x, int64_t n, int64_t in, int64_t e,
             int64_t out, float *z, float *y) {
  gemm(false, true, n, l.rank, in, 1.0f, x, in, l.a + e * l.rank * in, in, 0.0f, z, l.rank);
  gemm(false, true, n, out, l.rank, static_cast<float>(m.loraScale), z, l.rank,
       l.b + e * out * l.rank, l.rank, 1.0f, y, out);
}

void addBias(const KernelContext &ctx, const float *bias, int64_t n, int64_t width, float *y) {
  ctx.parallelFor(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      for (int64_t c = 0; c < width; ++c)
        y[i * width + c] += bias[c];
  });
}

/// The pre-activations of expert e's rows: p [n, upOut] (with fused_gate_up,
/// gate and up interleaved), g [n, inter] for a separate gate. zUp / zGate
/// keep the LoRA products x Aᵀ for the backward.
void preActivations(const KernelContext &ctx, const Experts &m, int64_t e, float *p, float *g,
                    float *zUp, float *zGate) {
  int64_t n = m.count(e);
  const float *x = m.x + m.offset[e] * m.features;
  project(m, x, n, m.features, m.up, e, m.upOut, 0.0f, p);
  if (m.upBias)
    addBias(ctx, m.upBias + e * m.upOut, n, m.upOut, p);
  if (m.upLora)
    addLora(m, m.upLora, x, n, m.features, e, m.inter, zUp, p);
  if (m.gate) {
    project(m, x, n, m.features, m.gate, e, m.inter, 0.0f, g);
    if (m.gateLora)
      addLora(m, m.gateLora, x, n, m.features, e, m.inter, zGate, g);
  }
}

/// Whether the experts' pre-activations may be saved: all of them are g and p (see
/// checks::routing::forwardPreActivations).
bool savable(const Experts &m) { return m.gate && !m.upBias && !m.upLora && !m.gateLora; }

/// Rows [first, first + n) of pre [rows, 2 inter] to or from g [n, inter] and p [n, inter].
void storePreActivations(const Experts &m, int64_t first, int64_t n, const float *p, const float *g, float *pre) {
  for (int64_t i = 0; i < n; ++i) {
    float *row = pre + (first + i) * 2 * m.inter;
    std::copy(g + i * m.inter, g + (i + 1) * m.inter, row);
    std::copy(p + i * m.inter, p + (i + 1) * m.inter, row + m.inter);
  }
}
void loadPreActivations(const Experts &m, int64_t first, int64_t n, const float *pre, float *p, float *g) {
  for (int64_t i = 0; i < n; ++i) {
    const float *row = pre + (first + i) * 2 * m.inter;
    std::copy(row, row + m.inter, g + i * m.inter);
    std::copy(row + m.inter, row + 2 * m.inter, p + i * m.inter);
  }
}

/// Reads row i, column c's gate and up pre-activations.
struct PreAct {
  const Experts &m;
  const float *p, *g;
  double gateAt(int64_t i, int64_t c) const {
    return m.fused ? p[i * m.upOut + 2 * c] : g[i * m.inter + c];
  }
  double upAt(int64_t i, int64_t c) const {
    return m.fused ? p[i * m.upOut + 2 * c + 1] : p[i * m.upOut + c];
  }
};

/// h [n, inter] = act(gate, up) of expert e's n rows.
void activate(const KernelContext &ctx, const Experts &m, int64_t n, const PreAct &pre, float *h) {
  ctx.parallelFor(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      for (int64_t c = 0; c < m.inter; ++c) {
        double u = pre.upAt(i, c), out;
        if (!m.gated) {
          out = unary(m.act, u);
        } else if (m.act == Act::ClampedSwiglu) {
          double g = std::min(pre.gateAt(i, c), m.limit);
          u = std::min(std::max(u, -m.limit), m.limit);
          out = (u + 1.0) * g * sigmoid(kSwigluAlpha * g);
        } else {
          out = unary(m.act, pre.gateAt(i, c)) * u;
        }
        h[i * m.inter + c] = static_cast<float>(out);
      }
  });
}

/// From dh [n, inter], the gradients of the pre-activations: dp [n, upOut]
/// (interleaved like p when fused) and dg [n, inter] for a separate gate.
void activationGrad(const KernelContext &ctx, const Experts &m, int64_t n, const PreAct &pre,
                    const float *dh, float *dp, float *dg) {
  ctx.parallelFor(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      for (int64_t c = 0; c < m.inter; ++c) {
        double u = pre.upAt(i, c), d = dh[i * m.inter + c], dGate = 0, dUp;
        if (!m.gated) {
          dUp = d * unaryGrad(m.act, u);
        } else if (m.act == Act::ClampedSwiglu) {
          double g = pre.gateAt(i, c);
          double gc = std::min(g, m.limit), uc = std::min(std::max(u, -m.limit), m.limit);
          double s = sigmoid(kSwigluAlpha * gc), glu = gc * s;
          double dGlu = s + kSwigluAlpha * gc * s * (1.0 - s);
          dGate = g <= m.limit ? d * (uc + 1.0) * dGlu : 0.0;
          dUp = u >= -m.limit && u <= m.limit ? d * glu : 0.0;
        } else {
          double g = pre.gateAt(i, c);
          dGate = d * u * unaryGrad(m.act, g);
          dUp = d * unary(m.act, g);
        }
        if (m.fused) {
          dp[i * m.upOut + 2 * c] = static_cast<float>(dGate);
          dp[i * m.upOut + 2 * c + 1] = static_cast<float>(dUp);
        } else {
          dp[i * m.upOut + c] = static_cast<float>(dUp);
          if (m.gate)
            dg[i * m.inter + c] = static_cast<float>(dGate);
        }
      }
  });
}

/// Column sums of dy [n, width] into db (one expert's bias gradient).
void biasGrad(const KernelContext &ctx, const float *dy, int64_t n, int64_t width, float *db) {
  ctx.parallelFor(width, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      double sum = 0;
      for (int64_t i = 0; i < n; ++i)
        sum += dy[i * width + c];
      db[c] = static_cast<float>(sum);
    }
  });
}

/// Backward of one projection y = x W_eᵀ (+ LoRA) of expert e's rows: dW_e,
/// the LoRA factors' gradients, and dx += dy W_e (+ LoRA path), given dy.
struct ProjectionGrad {
  float *dW = nullptr, *dA = nullptr, *dB = nullptr;
};

void projectionBackward(const Experts &m, const float *w, const Lora &l, const ProjectionGrad &grad,
                        const float *x, const float *dy, const float *z, int64_t e, int64_t n,
                        int64_t in, int64_t out, float *dz, float *dx, float dxBeta) {
  if (grad.dW) {
    if (m.inOut) // dW_e [in, out] = xᵀ dy
      gemm(true, false, in, out, n, 1.0f, x, in, dy, out, 0.0f, grad.dW + e * in * out, out);
    else // dW_e [out, in] = dyᵀ x
      gemm(true, false, out, in, n, 1.0f, dy, out, x, in, 0.0f, grad.dW + e * in * out, in);
  }
  if (dx) {
    const float *we = w + e * in * out;
    gemm(false, m.inOut, n, in, out, 1.0f, dy, out, we, m.inOut ? out : in, dxBeta, dx, in);
  }
  if (!l)
    return;
  float scale = static_cast<float>(m.loraScale);
  // y += scale z B_eᵀ with z = x A_eᵀ.
  if (grad.dB)
    gemm(true, false, out, l.rank, n, scale, dy, out, z, l.rank, 0.0f, grad.dB + e * out * l.rank,
         l.rank);
  if (!grad.dA && !dx)
    return;
  gemm(false, false, n, l.rank, out, scale, dy, out, l.b + e * out * l.rank, l.rank, 0.0f, dz,
       l.rank);
  if (grad.dA)
    gemm(true, false, l.rank, in, n, 1.0f, dz, l.rank, x, in, 0.0f, grad.dA + e * l.rank * in, in);
  if (dx)
    gemm(false, false, n, in, l.rank, 1.0f, dz, l.rank, l.a + e * l.rank * in, in, 1.0f, dx, in);
}

} // namespace

void expertMlpForward(KernelContext &ctx) {
  OperandGroups ops = expertOperands(ctx);
  Experts m = parseExperts(ctx, ops);
  expectF32(ctx, ctx.out(0), "result");
  ctx.expectShape(ctx.out(0), "result", {m.rows, m.features});
  float *y = ctx.out(0).f32();
  const TensorRef *pre = checks::routing::forwardPreActivations(ctx, *ops.get(ctx, Tokens), m.inter, savable(m));
  std::vector<float> p(m.rows * m.upOut), g(m.gate ? m.rows * m.inter : 0), h(m.rows * m.inter);
  int64_t maxRank = std::max({m.gateLora.rank, m.upLora.rank, m.downLora.rank});
  std::vector<float> z(m.rows * maxRank);
  for (int64_t e = 0; e < m.experts; ++e) {
    int64_t n = m.count(e), first = m.offset[e];
    if (n == 0)
      continue;
    float *pe = p.data() + first * m.upOut, *ge = g.data() + first * m.inter;
    float *he = h.data() + first * m.inter, *ye = y + first * m.features;
    preActivations(ctx, m, e, pe, ge, z.data(), z.data());
    if (pre)
      storePreActivations(m, first, n, pe, ge, pre->f32());
    activate(ctx, m, n, PreAct{m, pe, ge}, he);
    project(m, he, n, m.inter, m.down, e, m.features, 0.0f, ye);
    if (m.downBias)
      addBias(ctx, m.downBias + e * m.features, n, m.features, ye);
    if (m.downLora)
      addLora(m, m.downLora, he, n, m.inter, e, m.features, z.data(), ye);
  }
  std::fill(y + m.offset[m.experts] * m.features, y + m.rows * m.features, 0.0f);
  if (pre)
    std::fill(pre->f32() + m.offset[m.experts] * 2 * m.inter, pre->f32() + m.rows * 2 * m.inter, 0.0f);
}

void expertMlpBackward(KernelContext &ctx) {
  OperandGroups ops = expertOperands(ctx);
  Experts m = parseExperts(ctx, ops);
  std::vector<float *> byOperand =
      gradOutputs(ctx, ops.present, {{ops.input[Counts], "counts are integers"}});
  auto grad = [&](Operand group) { return ops.has(group) ? byOperand[ops.input[group]] : nullptr; };
  const TensorRef *dResult = resultGrad(ctx, 0);
  if (!dResult)
    return;
  expectF32(ctx, *dResult, "gradient of result");
  ctx.expectShape(*dResult, "gradient of result", {m.rows, m.features});
  const float *dy = dResult->f32();
  float *dx = grad(Tokens);
  ProjectionGrad upGrad{grad(Up), grad(UpLoraA), grad(UpLoraB)};
  ProjectionGrad gateGrad{grad(Gate), grad(GateLoraA), grad(GateLoraB)};
  ProjectionGrad downGrad{grad(Down), grad(DownLoraA), grad(DownLoraB)};
  float *dUpBias = grad(UpBias), *dDownBias = grad(DownBias);
  // The forward's saved pre-activations, where it saved them: read instead of recomputed.
  const TensorRef *saved = checks::routing::savedPreActivations(ctx, *ops.get(ctx, Tokens), m.inter, savable(m));

  // Scratch for the largest expert: activations are recomputed per expert.
  int64_t most = 0;
  for (int64_t e = 0; e < m.experts; ++e)
    most = std::max(most, m.count(e));
  std::vector<float> p(most * m.upOut), g(m.gate ? most * m.inter : 0), h(most * m.inter);
  std::vector<float> dh(most * m.inter), dp(most * m.upOut), dg(m.gate ? most * m.inter : 0);
  std::vector<float> zUp(most * m.upLora.rank), zGate(most * m.gateLora.rank);
  std::vector<float> zDown(most * m.downLora.rank);
  std::vector<float> dz(most * std::max({m.gateLora.rank, m.upLora.rank, m.downLora.rank}));
  for (int64_t e = 0; e < m.experts; ++e) {
    int64_t n = m.count(e), first = m.offset[e];
    if (n == 0)
      continue;
    const float *x = m.x + first * m.features, *dye = dy + first * m.features;
    if (saved)
      loadPreActivations(m, first, n, saved->f32(), p.data(), g.data());
    else
      preActivations(ctx, m, e, p.data(), g.data(), zUp.data(), zGate.data());
    PreAct pre{m, p.data(), g.data()};
    activate(ctx, m, n, pre, h.data());
    if (m.downLora) // z = h A_downᵀ, as the forward computed it
      gemm(false, true, n, m.downLora.rank, m.inter, 1.0f, h.data(), m.inter,
           m.downLora.a + e * m.downLora.rank * m.inter, m.inter, 0.0f, zDown.data(),
           m.downLora.rank);
    if (dDownBias)
      biasGrad(ctx, dye, n, m.features, dDownBias + e * m.features);
    projectionBackward(m, m.down, m.downLora, downGrad, h.data(), dye, zDown.data(), e, n, m.inter,
                       m.features, dz.data(), dh.data(), 0.0f);
    activationGrad(ctx, m, n, pre, dh.data(), dp.data(), dg.data());
    if (dUpBias)
      biasGrad(ctx, dp.data(), n, m.upOut, dUpBias + e * m.upOut);
    float *dxe = dx ? dx + first * m.features : nullptr;
    projectionBackward(m, m.up, m.upLora, upGrad, x, dp.data(), zUp.data(), e, n, m.features,
                       m.upOut, dz.data(), dxe, 0.0f);
    if (m.gate)
      projectionBackward(m, m.gate, m.gateLora, gateGrad, x, dg.data(), zGate.data(), e, n,
                         m.features, m.inter, dz.data(), dxe, 1.0f);
  }
  if (dx)
    std::fill(dx + m.offset[m.experts] * m.features, dx + m.rows * m.features, 0.0f);
}

} // namespace moec::runtime::cpu::routing
