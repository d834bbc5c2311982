//===- ExpertMlp.cu - every expert's MLP over its rows, and the backward --===//
//
// The twin of cpu/routing/ExpertMlp.cpp (read its header for the variants:
// gated silu / relu2, ungated, gpt-oss fused interleaved clamped SwiGLU with
// in_out_layout and biases, expert LoRA on gate / up / down), and of
// cpu/routing/ExpertMlpCombine.cpp (expert_mlp_combine.backward, at the end:
// the expert MLP's backward with its combine's).
//
// Grouping, with no host synchronisation: the expert row offsets are computed
// on the device from `counts` (one tiny kernel), and every per-expert product
// (projections, LoRA factors, input and weight gradients) is ONE grouped GEMM
// launch over all experts (GroupedGemm.cuh) that reads those offsets; there is
// no per-expert host loop. Experts with no rows contribute nothing; their
// weight gradients are written as zero.
//
// Invalid counts: the host cannot see the counts without a synchronisation,
// so the CPU's checks (non-negative, adding up to at most the tokens' rows; rows
// past the counted ones are zero in the results) run on the
// device in the offsets kernel. An invalid count is a device-side fault: the
// kernel printf's the expert and count (or the sum) and executes __trap(). The
// context's sticky CUDA error surfaces at the next synchronisation, where the
// executor reports it (naming the step with MOEC_SYNC_STEPS=1). No later
// kernel runs on bad offsets: the fault ends the context's work.
//
// The gated SiLU in bf16 runs in one pass (gluInOnePass: gate and up products
// and the activation, or its gradient, in one grouped GEMM); with LoRA on gate
// and up of ranks up to 32 in multiples of 8 too (gluLoraInOnePass: the LoRA
// products z Bᵀ as the GEMM's last k tile, z = scale x Aᵀ), where the backward's
// GluGrad also writes h for the down projection's gradients (the forward is
// not recomputed) and dx = dg W_gate + dp W_up + dz [A_gate; A_up] is one GEMM.
// Elsewhere: f32 pre-activations through memory, as below.
//
// Saved pre-activations (expert_mlp's optional second output, [rows, 2 inter]
// f32: gate x, then up x): the one-pass forward writes its accumulators, and expert_mlp_combine.backward's one-pass form then derives
// the gate's and up's gradients from them in an element-wise pass
// (savedGluGrad) instead of running the two products again.
//
// Precision: GEMMs accumulate in f32. The pre-activations (p, g), the down
// projection's output and the gradients of h and of the tokens are f32
// scratch (outside the one-pass forms); the GEMM operands that are activations (h, the LoRA products z,
// dp, dg, dz) are kept in the storage type of the tokens (what a bf16 model
// holds). Biases are added and activations computed in f32 / double like the
// CPU, except in the bf16 grouped GEMM's gated epilogues (GroupedGemmWgmma.cu),
// which compute the activation in f32. Weights whose dtype differs from the
// tokens' are converted first.
// Element-wise kernels: grid-stride loops; per-expert bias gradients: one
// thread per (expert, column), rows summed in order in double (deterministic,
// no atomics).
//
//===----------------------------------------------------------------------===//

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "runtime/kernels/cuda/routing/GroupedGemm.cuh"
#include "runtime/kernels/cuda/routing/GroupedGemmWgmma.cuh"
#include "runtime/kernels/cuda/routing/RoutingCommon.cuh"
#include "runtime/kernels/cuda/routing/RoutingKernels.h"
#include "runtime/kernels/cuda/routing/Silu.cuh"

namespace moec::runtime::cuda::routing {

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

enum Act : int { Silu = 0, Relu2 = 1, ClampedSwiglu = 2 };

/// gpt-oss's fixed sigmoid slope in clamped SwiGLU.
constexpr double kSwigluAlpha = 1.702;

struct Lora {
  const TensorRef *a = nullptr, *b = nullptr;
  int64_t rank = 0;
  explicit operator bool() const { return a != nullptr; }
};

struct Experts {
  int64_t rows = 0, features = 0, experts = 0, inter = 0, upOut = 0;
  bool fused = false, inOut = false, gated = false;
  Act act = Silu;
  double limit = 0, loraScale = 0;
  const TensorRef *x = nullptr, *up = nullptr, *down = nullptr, *gate = nullptr;
  const TensorRef *upBias = nullptr, *downBias = nullptr, *counts = nullptr;
  Lora gateLora, upLora, downLora;
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
  expectFloat(ctx, x, "tokens");
  expectFloat(ctx, up, "up");
  expectFloat(ctx, down, "down");
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
  m.x = &x;
  m.up = &up;
  m.down = &down;
  if (const TensorRef *gate = ops.get(ctx, Gate)) {
    if (m.fused)
      ctx.fail("a separate gate operand cannot be combined with fused_gate_up");
    expectFloat(ctx, *gate, "gate");
    ctx.expectShape(*gate, "gate", layout(m.inter, m.features));
    m.gate = gate;
  }
  m.gated = m.gate || m.fused;
  auto bias = [&](Operand group, const char *what, int64_t size) -> const TensorRef * {
    const TensorRef *b = ops.get(ctx, group);
    if (!b)
      return nullptr;
    expectFloat(ctx, *b, what);
    if (b->numel() != m.experts * size)
      ctx.fail(std::string(what) + " has " + std::to_string(b->numel()) + " elements, expected " +
               std::to_string(m.experts * size));
    return b;
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
    expectFloat(ctx, *a, (what + " A").c_str());
    expectFloat(ctx, *b, (what + " B").c_str());
    ctx.expectShape(*a, (what + " A").c_str(), {m.experts, -1, in});
    l.rank = a->dim(1);
    ctx.expectShape(*b, (what + " B").c_str(), {m.experts, out, l.rank});
    l.a = a;
    l.b = b;
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
    m.act = Silu;
  } else if (act == "relu2") {
    m.act = Relu2;
  } else if (act == "clamped_swiglu") {
    m.act = ClampedSwiglu;
    if (!m.gated)
      ctx.fail("clamped_swiglu needs a gate (fused_gate_up or a gate operand)");
    m.limit = ctx.attrFloat("limit");
  } else {
    ctx.fail("unsupported expert activation '" + act + "' (silu, relu2 or clamped_swiglu)");
  }

  if (counts.dtype != plan::I64 && counts.dtype != plan::I32)
    ctx.fail("counts must be i64 (or i32)");
  ctx.expectShape(counts, "counts", {m.experts});
  m.counts = &counts;
  return m;
}

/// The float operands in the tokens' storage type (the GEMMs' common type),
/// converted where a weight has another dtype.
struct Operands {
  plan::DType type = plan::F32;
  const void *x = nullptr, *up = nullptr, *down = nullptr, *gate = nullptr;
  const void *gateA = nullptr, *gateB = nullptr, *upA = nullptr, *upB = nullptr;
  const void *downA = nullptr, *downB = nullptr;
  DeviceBuffer holders[9];
};

void loadOperands(const KernelContext &ctx, const Experts &m, Operands &s) {
  s.type = m.x->dtype;
  s.x = m.x->data;
  auto as = [&](const TensorRef *t, DeviceBuffer &holder) -> const void * {
    return t ? asDtype(ctx, *t, s.type, holder) : nullptr;
  };
  s.up = as(m.up, s.holders[0]);
  s.down = as(m.down, s.holders[1]);
  s.gate = as(m.gate, s.holders[2]);
  s.gateA = as(m.gateLora.a, s.holders[3]);
  s.gateB = as(m.gateLora.b, s.holders[4]);
  s.upA = as(m.upLora.a, s.holders[5]);
  s.upB = as(m.upLora.b, s.holders[6]);
  s.downA = as(m.downLora.a, s.holders[7]);
  s.downB = as(m.downLora.b, s.holders[8]);
}

/// The row offsets from the counts (one block: a prefix sum, kThreads
/// experts at a time), and the CPU's checks on them: a bad count is a device
/// fault (printf, then __trap; see the header).
__global__ void offsetsKernel(IndexIn counts, int64_t experts, int64_t rows, int64_t *offsets) {
  __shared__ int64_t warpSums[kThreads / 32];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int64_t carry = 0;
  if (threadIdx.x == 0)
    offsets[0] = 0;
  for (int64_t base = 0; base < experts; base += kThreads) {
    int64_t e = base + threadIdx.x;
    int64_t c = e < experts ? counts[e] : 0;
    if (c < 0) {
      printf("expert_mlp: counts[%lld] = %lld is negative\n", static_cast<long long>(e),
             static_cast<long long>(c));
      __trap();
    }
    int64_t v = c; // inclusive scan over the warp, then over the warps
    for (int d = 1; d < 32; d <<= 1) {
      int64_t o = __shfl_up_sync(0xffffffffu, v, d);
      if (lane >= d)
        v += o;
    }
    if (lane == 31)
      warpSums[warp] = v;
    __syncthreads();
    int64_t before = carry, total = carry;
    for (int w = 0; w < kThreads / 32; ++w) {
      if (w < warp)
        before += warpSums[w];
      total += warpSums[w];
    }
    if (e < experts)
      offsets[e + 1] = before + v;
    carry = total;
    __syncthreads(); // warpSums is rewritten next round
  }
  if (threadIdx.x == 0 && carry > rows) {
    printf("expert_mlp: counts add up to %lld rows, more than the %lld rows of tokens\n",
           static_cast<long long>(carry), static_cast<long long>(rows));
    __trap();
  }
}

/// Blocks for a grid-stride loop over n elements.
unsigned gridFor(int64_t n) { return std::min<unsigned>(blocksFor(n, kThreads), 1u << 20); }

/// Zeroes rows [offsets[experts], rows) of y [rows, width]: rows past the counted ones (an
/// expert-parallel rank's received rows are sized for every row any rank could send).
__global__ void zeroUncountedRowsKernel(FloatOut y, const int64_t *offsets, int64_t experts, int64_t rows,
                                        int64_t width) {
  int64_t first = offsets[experts] * width, total = rows * width;
  for (int64_t i = first + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y.store(i, 0.0f);
}

void zeroUncountedRows(const KernelContext &ctx, const Experts &m, FloatOut y, int64_t width,
                       const int64_t *offsets) {
  if (m.rows * width == 0)
    return;
  // The host does not know how many rows are uncounted (usually none: every row of one GPU's
  // top-k copies is counted), so the grid is a fixed 1024 blocks: a grid sized for all rows
  // (2^20 blocks at P4's 131072 x 2048) spent ~0.5 ms a call on the H200 scheduling blocks that
  // had nothing to do.
  unsigned grid = std::min<unsigned>(gridFor(m.rows * width), 1024);
  zeroUncountedRowsKernel<<<grid, kThreads, 0, streamOf(ctx)>>>(y, offsets, m.experts, m.rows, width);
  checkLaunch(ctx, "expert_mlp: uncounted rows");
}

/// out [rows, width] = y's counted rows in out's storage type, zero past them (y is not read
/// there: on an expert-parallel rank most of the room may be uncounted).
__global__ void storeCountedRowsKernel(const float *y, FloatOut out, const int64_t *offsets, int64_t experts,
                                       int64_t rows, int64_t width) {
  int64_t counted = offsets[experts] * width, total = rows * width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out.store(i, i < counted ? y[i] : 0.0f);
}

/// The f32 rows `y` into `out` (an f32 `out` is `y` itself): counted rows kept, the rest zero.
void storeCountedRows(const KernelContext &ctx, const Experts &m, float *y, int64_t width, const int64_t *offsets,
                      void *out, plan::DType outType) {
  if (out == y)
    return zeroUncountedRows(ctx, m, FloatOut{y, false}, width, offsets);
  if (m.rows * width == 0)
    return;
  storeCountedRowsKernel<<<gridFor(m.rows * width), kThreads, 0, streamOf(ctx)>>>(
      y, floatOut(out, outType), offsets, m.experts, m.rows, width);
  checkLaunch(ctx, "expert_mlp: store rows");
}

/// The E + 1 row offsets on the device (from the device counts, checked there).
DeviceBuffer deviceOffsets(const KernelContext &ctx, const Experts &m) {
  DeviceBuffer offsets(ctx, (m.experts + 1) * sizeof(int64_t));
  offsetsKernel<<<1, kThreads, 0, streamOf(ctx)>>>(indexIn(*m.counts), m.experts, m.rows,
                                                   offsets.as<int64_t>());
  checkLaunch(ctx, "expert_mlp: offsets");
  return offsets;
}

/// Every expert's rows of x [R, in] through its projection into y [R, out]
/// (y = beta * y + x W_eᵀ, or x W_e with in_out_layout).
void project(const KernelContext &ctx, const Experts &m, const ExpertRows &g, plan::DType type,
             const void *x, int64_t in, const void *w, int64_t out, float beta, void *y,
             plan::DType yType) {
  groupedGemm(ctx, g, out, in, 1.0f, x, in, w, m.inOut ? out : in, in * out, !m.inOut, type, beta,
              y, out, yType);
}

/// y [R, out] (f32) += scale * (x A_eᵀ) B_eᵀ; z [R, r] (storage type) keeps x A_eᵀ.
void addLora(const KernelContext &ctx, const Experts &m, const ExpertRows &g, plan::DType type,
             const void *a, const void *b, int64_t rank, const void *x, int64_t in, int64_t out,
             void *z, float *y) {
  groupedGemm(ctx, g, rank, in, 1.0f, x, in, a, in, rank * in, true, type, 0.0f, z, rank, type);
  groupedGemm(ctx, g, out, rank, static_cast<float>(m.loraScale), z, rank, b, rank, out * rank,
              true, type, 1.0f, y, out, plan::F32);
}

/// y[row, c] += bias[expert of row, c] (f32 add, as the CPU).
__global__ void addBiasKernel(float *y, int64_t width, FloatIn bias, const int64_t *offsets,
                              int64_t experts) {
  int64_t row = blockIdx.x, e = expertOfRow(offsets, experts, row);
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x)
    y[row * width + c] = __fadd_rn(y[row * width + c], bias[e * width + c]);
}

void addBias(const KernelContext &ctx, const Experts &m, float *y, int64_t width,
             const TensorRef &bias, const int64_t *offsets) {
  if (m.rows == 0 || width == 0)
    return;
  addBiasKernel<<<static_cast<unsigned>(m.rows), 128, 0, streamOf(ctx)>>>(
      y, width, floatIn(bias), offsets, m.experts);
  checkLaunch(ctx, "expert_mlp: bias");
}

/// What the activation kernels need.
struct ActParams {
  int64_t inter = 0, upOut = 0;
  // offsets[experts]: the counted rows (an expert-parallel rank's buffers have room for more;
  // the work past them would be wasted).
  const int64_t *offsets = nullptr;
  int64_t experts = 0;
  bool fused = false, gated = false;
  int act = Silu;
  double limit = 0;
};

ActParams actParams(const Experts &m, const int64_t *offsets) {
  ActParams a;
  a.offsets = offsets;
  a.experts = m.experts;
  a.inter = m.inter;
  a.upOut = m.upOut;
  a.fused = m.fused;
  a.gated = m.gated;
  a.act = m.act;
  a.limit = m.limit;
  return a;
}

/// The ungated activation f, or the gated one's f(gate).
__device__ __forceinline__ double unary(int act, double v) {
  if (act == Silu)
    return siluD(v);
  double r = v > 0 ? v : 0.0; // relu2
  return r * r;
}

__device__ __forceinline__ double unaryGrad(int act, double v) {
  if (act == Silu)
    return siluGradD(v);
  return v > 0 ? 2.0 * v : 0.0; // relu2
}

/// Row i, column c's gate and up pre-activations (interleaved when fused).
__device__ __forceinline__ double gateAt(const ActParams &a, const float *p, const float *g,
                                         int64_t i, int64_t c) {
  return a.fused ? p[i * a.upOut + 2 * c] : g[i * a.inter + c];
}
__device__ __forceinline__ double upAt(const ActParams &a, const float *p, int64_t i, int64_t c) {
  return a.fused ? p[i * a.upOut + 2 * c + 1] : p[i * a.upOut + c];
}

/// h [R, inter] = act(gate, up).
__global__ void activateKernel(ActParams a, const float *p, const float *g, FloatOut h) {
  int64_t total = a.offsets[a.experts] * a.inter;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < total;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t i = k / a.inter, c = k % a.inter;
    double u = upAt(a, p, i, c), out;
    if (!a.gated) {
      out = unary(a.act, u);
    } else if (a.act == ClampedSwiglu) {
      double gc = fmin(gateAt(a, p, g, i, c), a.limit);
      u = fmin(fmax(u, -a.limit), a.limit);
      out = (u + 1.0) * gc * sigmoidD(kSwigluAlpha * gc);
    } else {
      out = unary(a.act, gateAt(a, p, g, i, c)) * u;
    }
    h.store(k, static_cast<float>(out));
  }
}

/// From dh [R, inter]: dp [R, upOut] (interleaved like p when fused) and
/// dg [R, inter] for a separate gate. Clamp masks follow torch.clamp (the
/// gradient passes where the input lies within the bounds, ends included).
__global__ void activationGradKernel(ActParams a, const float *p, const float *g,
                                     const float *dh, FloatOut dp, FloatOut dg) {
  int64_t total = a.offsets[a.experts] * a.inter;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < total;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t i = k / a.inter, c = k % a.inter;
    double u = upAt(a, p, i, c), d = dh[k], dGate = 0, dUp;
    if (!a.gated) {
      dUp = d * unaryGrad(a.act, u);
    } else if (a.act == ClampedSwiglu) {
      double gv = gateAt(a, p, g, i, c);
      double gc = fmin(gv, a.limit), uc = fmin(fmax(u, -a.limit), a.limit);
      double s = sigmoidD(kSwigluAlpha * gc), glu = gc * s;
      double dGlu = s + kSwigluAlpha * gc * s * (1.0 - s);
      dGate = gv <= a.limit ? d * (uc + 1.0) * dGlu : 0.0;
      dUp = u >= -a.limit && u <= a.limit ? d * glu : 0.0;
    } else {
      double gv = gateAt(a, p, g, i, c);
      dGate = d * u * unaryGrad(a.act, gv);
      dUp = d * unary(a.act, gv);
    }
    if (a.fused) {
      dp.store(i * a.upOut + 2 * c, static_cast<float>(dGate));
      dp.store(i * a.upOut + 2 * c + 1, static_cast<float>(dUp));
    } else {
      dp.store(i * a.upOut + c, static_cast<float>(dUp));
      if (dg)
        dg.store(i * a.inter + c, static_cast<float>(dGate));
    }
  }
}


/// db[e, c] = Σ over expert e's rows of dy[row, c] (in row order, double);
/// zero for an expert without rows.
__global__ void biasGradKernel(FloatIn dy, const int64_t *offsets, int64_t experts, int64_t width,
                               FloatOut db) {
  int64_t total = experts * width;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < total;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t e = k / width, c = k % width;
    double sum = 0;
    for (int64_t row = offsets[e]; row < offsets[e + 1]; ++row)
      sum += dy[row * width + c];
    db.store(k, static_cast<float>(sum));
  }
}

void biasGrad(const KernelContext &ctx, const Experts &m, FloatIn dy, int64_t width,
              const TensorRef &db, const int64_t *offsets) {
  if (m.experts * width == 0)
    return;
  biasGradKernel<<<gridFor(m.experts * width), kThreads, 0, streamOf(ctx)>>>(
      dy, offsets, m.experts, width, floatOut(db));
  checkLaunch(ctx, "expert_mlp.backward: bias gradient");
}

/// Scratch of the forward pass (also recomputed by the backward).
struct Forward {
  DeviceBuffer p, g, h, zUp, zGate;
};

/// p [R, upOut] and g [R, inter] (f32: projections, up bias, LoRA, in the
/// CPU's order), zUp / zGate (LoRA products x Aᵀ), h [R, inter] (storage type).
void forwardActivations(const KernelContext &ctx, const Experts &m, const Operands &s,
                        const ExpertRows &g, Forward &f) {
  const int64_t *offsets = g.offsets;
  plan::DType type = s.type;
  int64_t R = m.rows, D = m.features, I = m.inter, U = m.upOut;
  f.p = DeviceBuffer(ctx, plan::F32, R * U);
  if (m.gate)
    f.g = DeviceBuffer(ctx, plan::F32, R * I);
  f.h = DeviceBuffer(ctx, type, R * I);
  if (m.upLora)
    f.zUp = DeviceBuffer(ctx, type, R * m.upLora.rank);
  if (m.gateLora)
    f.zGate = DeviceBuffer(ctx, type, R * m.gateLora.rank);
  project(ctx, m, g, type, s.x, D, s.up, U, 0.0f, f.p.get(), plan::F32);
  if (m.gate)
    project(ctx, m, g, type, s.x, D, s.gate, I, 0.0f, f.g.get(), plan::F32);
  if (m.upBias)
    addBias(ctx, m, f.p.as<float>(), U, *m.upBias, offsets);
  if (m.upLora)
    addLora(ctx, m, g, type, s.upA, s.upB, m.upLora.rank, s.x, D, I, f.zUp.get(),
            f.p.as<float>());
  if (m.gateLora)
    addLora(ctx, m, g, type, s.gateA, s.gateB, m.gateLora.rank, s.x, D, I, f.zGate.get(),
            f.g.as<float>());
  if (R * I > 0) {
    activateKernel<<<gridFor(R * I), kThreads, 0, streamOf(ctx)>>>(
        actParams(m, offsets), f.p.as<float>(), f.g.as<float>(), floatOut(f.h.get(), type));
    checkLaunch(ctx, "expert_mlp: activation");
  }
}

//===----------------------------------------------------------------------===//
// Saved pre-activations: pre [R, 2 inter] f32, gate x in columns [0, inter), up x in [inter, 2 inter)
//===----------------------------------------------------------------------===//

/// Whether the experts' pre-activations may be saved: all of them are g and p (see
/// checks::routing::forwardPreActivations).
bool savable(const Experts &m) { return m.gate && !m.upBias && !m.upLora && !m.gateLora; }

/// pre from the f32 p [R, inter] and g [R, inter] of forwardActivations; zero past the counted rows.
__global__ void storePreActivationsKernel(const float *p, const float *g, const int64_t *offsets, int64_t experts,
                                          int64_t rows, int64_t inter, FloatOut pre) {
  int64_t counted = offsets[experts], width = 2 * inter, total = rows * width;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < total;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t i = k / width, c = k % width;
    pre.store(k, i >= counted ? 0.0f : c < inter ? g[i * inter + c] : p[i * inter + c - inter]);
  }
}

/// The f32 p and g of the counted rows from pre (the backward's forwardActivations when saved).
__global__ void loadPreActivationsKernel(FloatIn pre, const int64_t *offsets, int64_t experts, int64_t inter,
                                         float *p, float *g) {
  int64_t total = offsets[experts] * inter;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < total;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t i = k / inter, c = k % inter;
    g[k] = pre[i * 2 * inter + c];
    p[k] = pre[i * 2 * inter + inter + c];
  }
}

/// forwardActivations from the saved pre-activations: f.p, f.g (f32) and f.h (storage type).
void savedActivations(const KernelContext &ctx, const Experts &m, const Operands &s, const ExpertRows &g,
                      const TensorRef &pre, Forward &f) {
  int64_t R = m.rows, I = m.inter;
  f.p = DeviceBuffer(ctx, plan::F32, R * I);
  f.g = DeviceBuffer(ctx, plan::F32, R * I);
  f.h = DeviceBuffer(ctx, s.type, R * I);
  if (R * I == 0)
    return;
  loadPreActivationsKernel<<<gridFor(R * I), kThreads, 0, streamOf(ctx)>>>(floatIn(pre), g.offsets, m.experts, I,
                                                                           f.p.as<float>(), f.g.as<float>());
  checkLaunch(ctx, "expert_mlp.backward: saved pre-activations");
  activateKernel<<<gridFor(R * I), kThreads, 0, streamOf(ctx)>>>(actParams(m, g.offsets), f.p.as<float>(),
                                                                 f.g.as<float>(), floatOut(f.h.get(), s.type));
  checkLaunch(ctx, "expert_mlp.backward: activation");
}

/// groupedGluGemm's gradient (GluGrad) from the saved pre-activations instead of the gate and up
/// products: a warp per (row, kRowDotColumns columns), lanes on consecutive columns. dg = s dh ⊙
/// u ⊙ silu'(g), dp = s dh ⊙ silu(g) (s: rowScale[row], else 1), and rowDots[tile * rows + row]
/// = Σ dh ⊙ h over the tile's columns (dh unscaled, h = silu(g) u), in f32 with the SFU's
/// exponential as the GEMM's epilogue computes them. Counted rows only.
__global__ void savedGluGradKernel(FloatIn pre, const float *dh, const int64_t *offsets, int64_t experts,
                                   int64_t rows, int64_t inter, const float *rowScale, FloatOut dg, FloatOut dp,
                                   float *rowDots) {
  const int64_t tiles = (inter + kRowDotColumns - 1) / kRowDotColumns;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  const int64_t row = warp / tiles, tile = warp % tiles;
  if (row >= rows || row >= offsets[experts]) // uniform across the warp
    return;
  const float scale = rowScale ? rowScale[row] : 1.0f;
  const int64_t end = min(inter, (tile + 1) * kRowDotColumns);
  float dot = 0.0f;
  for (int64_t c = tile * kRowDotColumns + lane; c < end; c += 32) {
    float gv = pre[row * 2 * inter + c], u = pre[row * 2 * inter + inter + c], d = dh[row * inter + c];
    float sg = 1.0f / (1.0f + __expf(-gv)), silu = gv * sg, ds = scale * d;
    dg.store(row * inter + c, ds * u * (sg * (1.0f + gv * (1.0f - sg))));
    dp.store(row * inter + c, ds * silu);
    dot = fmaf(d, silu * u, dot);
  }
  if (rowDots) {
    for (int offset = 16; offset > 0; offset >>= 1)
      dot += __shfl_xor_sync(0xffffffffu, dot, offset);
    if (lane == 0)
      rowDots[tile * rows + row] = dot;
  }
}

void savedGluGrad(const KernelContext &ctx, const Experts &m, const ExpertRows &g, const TensorRef &pre,
                  const float *dh, const float *rowScale, void *dg, void *dp, plan::DType type, float *rowDots) {
  const int64_t tiles = (m.inter + kRowDotColumns - 1) / kRowDotColumns, warps = m.rows * tiles;
  if (warps == 0)
    return;
  constexpr int kWarps = 8;
  savedGluGradKernel<<<static_cast<unsigned>((warps + kWarps - 1) / kWarps), 32 * kWarps, 0, streamOf(ctx)>>>(
      floatIn(pre), dh, g.offsets, m.experts, m.rows, m.inter, rowScale, floatOut(dg, type), floatOut(dp, type),
      rowDots);
  checkLaunch(ctx, "expert_mlp_combine.backward: gradient from the saved pre-activations");
}

/// Whether the gated SiLU runs as one grouped GEMM over x with the activation (or its gradient)
/// in the epilogue (GroupedGemmWgmma.cu): a separate gate, [out, in] weights, no up bias, no
/// LoRA on gate or up, bf16 operands it can copy in 16-byte chunks. Then no f32
/// pre-activations go through memory.
bool gluInOnePass(const Experts &m, const Operands &s) {
  return m.gate && !m.inOut && m.act == Silu && !m.upBias && !m.upLora && !m.gateLora &&
         groupedGluFits(m.features, s.x, m.features, s.gate, s.up, m.features,
                        m.inter * m.features, s.type);
}

/// h [R, inter] (storage type) = silu(x W_gateᵀ) ⊙ (x W_upᵀ) in one pass (gluInOnePass), and the
/// products themselves into `pre` [R, 2 inter] where given (the expert rows only).
void gluForward(const KernelContext &ctx, const Experts &m, const Operands &s, const ExpertRows &g,
                Forward &f, void *pre = nullptr) {
  f.h = DeviceBuffer(ctx, s.type, m.rows * m.inter);
  groupedGluGemm(ctx, g, m.inter, m.features, s.x, m.features, s.gate, s.up, m.features,
                 m.inter * m.features, s.type, nullptr, f.h.get(), nullptr, m.inter, nullptr, nullptr, nullptr,
                 nullptr, pre);
}

/// Whether the gated SiLU with LoRA on gate and up runs as gluInOnePass does, the LoRA
/// products in the GEMM's last k tile (GroupedGemm.cuh, LoraTile): ranks of at most 32 in
/// multiples of 8. Then neither the f32 pre-activations nor the f32 LoRA sums go through memory.
bool gluLoraInOnePass(const Experts &m, const Operands &s) {
  return m.gate && !m.inOut && m.act == Silu && !m.upBias && m.upLora && m.gateLora &&
         loraTileRank(m.upLora.rank) && loraTileRank(m.gateLora.rank) &&
         groupedGluFits(m.features, s.x, m.features, s.gate, s.up, m.features, m.inter * m.features, s.type);
}

/// LoRA's tile operand for one or two factors A [r, in] of the rows x [R, in]: z [R, 64] with
/// scale x Aᵀ in columns [0, r) (and scale x A2ᵀ in [32, 32 + r2)), zeros elsewhere.
DeviceBuffer loraTileZ(const KernelContext &ctx, const Experts &m, const ExpertRows &g, plan::DType type,
                       const void *x, int64_t in, const void *a, int64_t rank, const void *a2 = nullptr,
                       int64_t rank2 = 0) {
  DeviceBuffer z(ctx, type, m.rows * 64);
  cudaMemsetAsync(z.get(), 0, static_cast<size_t>(m.rows) * 64 * 2, streamOf(ctx));
  checkLaunch(ctx, "expert_mlp: LoRA tile");
  float scale = static_cast<float>(m.loraScale);
  groupedGemm(ctx, g, rank, in, scale, x, in, a, in, rank * in, true, type, 0.0f, z.get(), 64, type);
  if (a2)
    groupedGemm(ctx, g, rank2, in, scale, x, in, a2, in, rank2 * in, true, type, 0.0f,
                static_cast<__nv_bfloat16 *>(z.get()) + 32, 64, type);
  return z;
}

/// gluForward with the gate's and up's LoRA (gluLoraInOnePass); z keeps their tile operand.
void gluLoraForward(const KernelContext &ctx, const Experts &m, const Operands &s, const ExpertRows &g,
                    Forward &f, DeviceBuffer &z) {
  z = loraTileZ(ctx, m, g, s.type, s.x, m.features, s.gateA, m.gateLora.rank, s.upA, m.upLora.rank);
  LoraTile tile{z.get(), s.gateB, s.upB, m.gateLora.rank, m.upLora.rank};
  f.h = DeviceBuffer(ctx, s.type, m.rows * m.inter);
  groupedGluGemm(ctx, g, m.inter, m.features, s.x, m.features, s.gate, s.up, m.features,
                 m.inter * m.features, s.type, nullptr, f.h.get(), nullptr, m.inter, nullptr, nullptr, &tile);
}

/// Whether the down projection adds its LoRA in its GEMM's last k tile (W_down [out, in], bf16).
bool downLoraInOnePass(const Experts &m, const Operands &s, const void *h) {
  return m.downLora && !m.inOut && !m.downBias && loraTileRank(m.downLora.rank) &&
         groupedLoraFits(m.inter, h, m.inter, s.down, m.inter, m.features * m.inter, s.type,
                         LoraTile{h, s.downB, nullptr, m.downLora.rank, 0});
}

/// Where one projection's gradients go.
struct ProjectionGrad {
  GemmTarget *dW = nullptr, *dA = nullptr, *dB = nullptr;
};

/// Backward of one projection y = x W_eᵀ (+ LoRA) over every expert's rows:
/// dW_e, the LoRA factors' gradients, and dx = dxBeta * dx + dy W_e (+ LoRA
/// path), dx in f32. x [R, in], dy [R, out], z [R, r], dz [R, r] scratch, all
/// in the storage type.
void projectionBackward(const KernelContext &ctx, const Experts &m, const ExpertRows &g,
                        plan::DType type, const void *w, const Lora &l, const void *la,
                        const void *lb, const ProjectionGrad &grad, const void *x, const void *dy,
                        const void *z, int64_t in, int64_t out, void *dz, float *dx,
                        float dxBeta) {
  if (grad.dW) {
    GemmTarget &t = *grad.dW;
    if (m.inOut) // dW_e [in, out] = xᵀ dy
      groupedGemmReduce(ctx, g, in, out, 1.0f, x, in, dy, out, type, 0.0f, t.data(), out,
                        in * out, t.dtype());
    else // dW_e [out, in] = dyᵀ x
      groupedGemmReduce(ctx, g, out, in, 1.0f, dy, out, x, in, type, 0.0f, t.data(), in,
                        in * out, t.dtype());
  }
  if (dx) // W_e [out, in]: dy W_e; [in, out]: dy W_eᵀ
    groupedGemm(ctx, g, in, out, 1.0f, dy, out, w, m.inOut ? out : in, in * out, m.inOut, type,
                dxBeta, dx, in, plan::F32);
  if (!l)
    return;
  float scale = static_cast<float>(m.loraScale);
  int64_t r = l.rank;
  // y += scale z B_eᵀ with z = x A_eᵀ.
  if (grad.dB) // dB_e [out, r] = scale dyᵀ z
    groupedGemmReduce(ctx, g, out, r, scale, dy, out, z, r, type, 0.0f, grad.dB->data(), r,
                      out * r, grad.dB->dtype());
  if (!grad.dA && !dx)
    return;
  // dz = scale dy B_e (B_e [out, r]).
  groupedGemm(ctx, g, r, out, scale, dy, out, lb, r, out * r, false, type, 0.0f, dz, r, type);
  if (grad.dA) // dA_e [r, in] = dzᵀ x
    groupedGemmReduce(ctx, g, r, in, 1.0f, dz, r, x, in, type, 0.0f, grad.dA->data(), in, r * in,
                      grad.dA->dtype());
  if (dx) // dx += dz A_e (A_e [r, in])
    groupedGemm(ctx, g, in, r, 1.0f, dz, r, la, in, r * in, false, type, 1.0f, dx, in, plan::F32);
}

} // namespace

void expertMlpForward(KernelContext &ctx) {
  OperandGroups ops = expertOperands(ctx);
  Experts m = parseExperts(ctx, ops);
  const TensorRef &result = ctx.out(0);
  expectFloat(ctx, result, "result");
  ctx.expectShape(result, "result", {m.rows, m.features});
  const TensorRef *pre = checks::routing::forwardPreActivations(ctx, *m.x, m.inter, savable(m));
  DeviceBuffer offsets = deviceOffsets(ctx, m); // checks the counts even without rows
  if (m.rows == 0 || m.features == 0)
    return;
  Operands s;
  loadOperands(ctx, m, s);
  plan::DType type = s.type;
  int64_t R = m.rows, D = m.features, I = m.inter;
  ExpertRows g{offsets.as<int64_t>(), m.experts, R};
  Forward f;
  DeviceBuffer zGateUp;
  if (gluInOnePass(m, s)) {
    gluForward(ctx, m, s, g, f, pre ? pre->data : nullptr);
    if (pre)
      zeroUncountedRows(ctx, m, floatOut(*pre), 2 * I, g.offsets);
  } else if (gluLoraInOnePass(m, s)) {
    gluLoraForward(ctx, m, s, g, f, zGateUp);
  } else {
    forwardActivations(ctx, m, s, g, f);
    if (pre && R * I > 0) {
      storePreActivationsKernel<<<gridFor(R * 2 * I), kThreads, 0, streamOf(ctx)>>>(
          f.p.as<float>(), f.g.as<float>(), g.offsets, m.experts, R, I, floatOut(*pre));
      checkLaunch(ctx, "expert_mlp: pre-activations");
    }
  }
  if (!m.downBias && !m.downLora && result.dtype == type) { // nothing added: straight into it
    project(ctx, m, g, type, f.h.get(), I, s.down, D, 0.0f, result.data, result.dtype);
    return zeroUncountedRows(ctx, m, floatOut(result.data, result.dtype), D, g.offsets);
  }
  if (result.dtype == type && downLoraInOnePass(m, s, f.h.get())) { // LoRA in the GEMM, then straight in
    DeviceBuffer z = loraTileZ(ctx, m, g, type, f.h.get(), I, s.downA, m.downLora.rank);
    LoraTile tile{z.get(), s.downB, nullptr, m.downLora.rank, 0};
    groupedGemm(ctx, g, D, I, 1.0f, f.h.get(), I, s.down, I, D * I, true, type, 0.0f, result.data, D,
                result.dtype, &tile);
    return zeroUncountedRows(ctx, m, floatOut(result.data, result.dtype), D, g.offsets);
  }

  // y (f32): the result itself when it is f32, else scratch converted at the end.
  DeviceBuffer yScratch;
  float *y = result.dtype == plan::F32 ? static_cast<float *>(result.data) : nullptr;
  if (!y) {
    yScratch = DeviceBuffer(ctx, plan::F32, R * D);
    y = yScratch.as<float>();
  }
  project(ctx, m, g, type, f.h.get(), I, s.down, D, 0.0f, y, plan::F32);
  if (m.downBias)
    addBias(ctx, m, y, D, *m.downBias, g.offsets);
  if (m.downLora) {
    DeviceBuffer z(ctx, type, R * m.downLora.rank);
    addLora(ctx, m, g, type, s.downA, s.downB, m.downLora.rank, f.h.get(), I, D, z.get(), y);
  }
  storeCountedRows(ctx, m, y, D, g.offsets, result.data, result.dtype);
}

void expertMlpBackward(KernelContext &ctx) {
  OperandGroups ops = expertOperands(ctx);
  Experts m = parseExperts(ctx, ops);
  std::vector<const TensorRef *> byOperand =
      gradOutputs(ctx, ops.present, {{ops.input[Counts], "counts are integers"}});
  auto grad = [&](Operand group) { return ops.has(group) ? byOperand[ops.input[group]] : nullptr; };
  const TensorRef *dResult = resultGrad(ctx, 0);
  if (!dResult)
    return zeroOutputs(ctx); // no gradient flows
  expectFloat(ctx, *dResult, "gradient of result");
  ctx.expectShape(*dResult, "gradient of result", {m.rows, m.features});
  DeviceBuffer offsets = deviceOffsets(ctx, m); // checks the counts even without rows
  if (m.rows == 0)
    return zeroOutputs(ctx); // the weights' gradients are empty sums
  Operands s;
  loadOperands(ctx, m, s);
  plan::DType type = s.type;
  int64_t R = m.rows, D = m.features, I = m.inter, U = m.upOut;
  const int64_t *off = offsets.as<int64_t>();
  ExpertRows g{off, m.experts, R};
  DeviceBuffer dyHolder;
  const void *dy = asDtype(ctx, *dResult, type, dyHolder);

  GemmTarget dUp(ctx, grad(Up), type), dGate(ctx, grad(Gate), type), dDown(ctx, grad(Down), type);
  GemmTarget dUpA(ctx, grad(UpLoraA), type), dUpB(ctx, grad(UpLoraB), type);
  GemmTarget dGateA(ctx, grad(GateLoraA), type), dGateB(ctx, grad(GateLoraB), type);
  GemmTarget dDownA(ctx, grad(DownLoraA), type), dDownB(ctx, grad(DownLoraB), type);
  auto target = [](GemmTarget &t) { return t ? &t : nullptr; };
  ProjectionGrad upGrad{target(dUp), target(dUpA), target(dUpB)};
  ProjectionGrad gateGrad{target(dGate), target(dGateA), target(dGateB)};
  ProjectionGrad downGrad{target(dDown), target(dDownA), target(dDownB)};
  const TensorRef *dUpBias = grad(UpBias), *dDownBias = grad(DownBias), *dTokens = grad(Tokens);

  // Recompute the forward's activations: in one pass, only h and only where the down
  // projection's weight or LoRA gradients need it (the activation's gradient is recomputed
  // below from x, with dh). With LoRA on gate and up in one pass, the gradient's GEMM writes h
  // as it goes: the down projection's gradients that need h wait for it.
  // Saved pre-activations (the forward's, where it saved them) take the general path below with
  // p, g read instead of recomputed: the expert MLP's own backward gets them only from
  // expert_mlp_combine.backward's composed form, which the one-pass forms rarely leave.
  const TensorRef *saved = checks::routing::savedPreActivations(ctx, *m.x, m.inter, savable(m));
  bool onePass = !saved && gluInOnePass(m, s), loraOnePass = !saved && !onePass && gluLoraInOnePass(m, s);
  Forward f;
  DeviceBuffer zGateUp; // with loraOnePass: the gate's and up's scale x Aᵀ (a LoRA tile)
  if (saved)
    savedActivations(ctx, m, s, g, *saved, f);
  else if (loraOnePass)
    zGateUp = loraTileZ(ctx, m, g, type, s.x, D, s.gateA, m.gateLora.rank, s.upA, m.upLora.rank);
  else if (!onePass)
    forwardActivations(ctx, m, s, g, f);
  else if (m.downLora || dDown)
    gluForward(ctx, m, s, g, f);
  DeviceBuffer zDown;
  if (m.downLora && !loraOnePass) { // z = h A_downᵀ, as the forward computed it
    int64_t r = m.downLora.rank;
    zDown = DeviceBuffer(ctx, type, R * r);
    groupedGemm(ctx, g, r, I, 1.0f, f.h.get(), I, s.downA, I, r * I, true, type, 0.0f,
                zDown.get(), r, type);
  }
  int64_t maxRank = std::max({m.gateLora.rank, m.upLora.rank, m.downLora.rank});
  DeviceBuffer dz(ctx, type, R * maxRank);
  DeviceBuffer dh(ctx, plan::F32, R * I), dp(ctx, type, R * U);
  DeviceBuffer dg;
  if (m.gate)
    dg = DeviceBuffer(ctx, type, R * I);

  if (dDownBias)
    biasGrad(ctx, m, floatIn(*dResult), D, *dDownBias, off);
  if (loraOnePass) { // dh = dy W_down (+ dz A_down, dz = scale dy B_down): no h needed yet
    groupedGemm(ctx, g, I, D, 1.0f, dy, D, s.down, I, I * D, false, type, 0.0f, dh.get(), I, plan::F32);
    if (m.downLora) {
      int64_t r = m.downLora.rank;
      groupedGemm(ctx, g, r, D, static_cast<float>(m.loraScale), dy, D, s.downB, r, D * r, false, type, 0.0f,
                  dz.get(), r, type);
      groupedGemm(ctx, g, I, r, 1.0f, dz.get(), r, s.downA, I, r * I, false, type, 1.0f, dh.get(), I, plan::F32);
    }
    if (m.downLora || dDown)
      f.h = DeviceBuffer(ctx, type, R * I);
  } else {
    projectionBackward(ctx, m, g, type, s.down, m.downLora, s.downA, s.downB, downGrad, f.h.get(), dy,
                       zDown.get(), I, D, dz.get(), dh.as<float>(), 0.0f);
  }
  if (onePass) { // dg, dp from x and dh, the pre-activations recomputed in the epilogue
    groupedGluGemm(ctx, g, I, D, s.x, D, s.gate, s.up, D, I * D, type, dh.as<float>(), dg.get(),
                   dp.get(), I);
  } else if (loraOnePass) { // the same with the LoRA products in the last k tile; h on the way
    LoraTile tile{zGateUp.get(), s.gateB, s.upB, m.gateLora.rank, m.upLora.rank};
    groupedGluGemm(ctx, g, I, D, s.x, D, s.gate, s.up, D, I * D, type, dh.as<float>(), dg.get(),
                   dp.get(), I, nullptr, nullptr, &tile, f.h.get());
    // The down projection's gradients that need h: dW = dyᵀ h, dB = scale dyᵀ (h A_downᵀ),
    // dA = dzᵀ h.
    if (downGrad.dW)
      groupedGemmReduce(ctx, g, D, I, 1.0f, dy, D, f.h.get(), I, type, 0.0f, downGrad.dW->data(), I, I * D,
                        downGrad.dW->dtype());
    if (m.downLora) {
      int64_t r = m.downLora.rank;
      if (downGrad.dB) {
        zDown = DeviceBuffer(ctx, type, R * r);
        groupedGemm(ctx, g, r, I, 1.0f, f.h.get(), I, s.downA, I, r * I, true, type, 0.0f, zDown.get(), r, type);
        groupedGemmReduce(ctx, g, D, r, static_cast<float>(m.loraScale), dy, D, zDown.get(), r, type, 0.0f,
                          downGrad.dB->data(), r, D * r, downGrad.dB->dtype());
      }
      if (downGrad.dA)
        groupedGemmReduce(ctx, g, r, I, 1.0f, dz.get(), r, f.h.get(), I, type, 0.0f, downGrad.dA->data(), I, r * I,
                          downGrad.dA->dtype());
    }
  } else if (R * I > 0) {
    activationGradKernel<<<gridFor(R * I), kThreads, 0, streamOf(ctx)>>>(
        actParams(m, off), f.p.as<float>(), f.g.as<float>(), dh.as<float>(), floatOut(dp.get(), type),
        m.gate ? floatOut(dg.get(), type) : FloatOut{});
    checkLaunch(ctx, "expert_mlp.backward: activation");
  }
  if (dUpBias)
    biasGrad(ctx, m, floatIn(dp.get(), type), U, *dUpBias, off);
  if (loraOnePass) {
    // The gate's and up's dz = scale dy B (one LoRA tile: the gate's in columns 0.., the up's in
    // 32..) and their factors' gradients, then dx = dg W_gate + dp W_up + dz [A_gate; A_up] in
    // one GEMM straight into the tokens' gradient: no f32 dx through memory.
    DeviceBuffer dzTile(ctx, type, R * 64);
    cudaMemsetAsync(dzTile.get(), 0, static_cast<size_t>(R) * 64 * 2, streamOf(ctx));
    checkLaunch(ctx, "expert_mlp.backward: LoRA tile");
    struct Side {
      const void *dy, *z, *a, *b;
      int64_t rank, column;
      const ProjectionGrad &grad;
    };
    for (const Side &side : {Side{dg.get(), zGateUp.get(), s.gateA, s.gateB, m.gateLora.rank, 0, gateGrad},
                             Side{dp.get(), zGateUp.as<__nv_bfloat16>() + 32, s.upA, s.upB, m.upLora.rank, 32,
                                  upGrad}}) {
      int64_t r = side.rank;
      void *dzSide = dzTile.as<__nv_bfloat16>() + side.column;
      if (side.grad.dW) // dW_e [out, in] = dyᵀ x
        groupedGemmReduce(ctx, g, I, D, 1.0f, side.dy, I, s.x, D, type, 0.0f, side.grad.dW->data(), D, I * D,
                          side.grad.dW->dtype());
      if (side.grad.dB) // dB_e [out, r] = dyᵀ z (z holds scale x Aᵀ)
        groupedGemmReduce(ctx, g, I, r, 1.0f, side.dy, I, side.z, 64, type, 0.0f, side.grad.dB->data(), r, I * r,
                          side.grad.dB->dtype());
      groupedGemm(ctx, g, r, I, static_cast<float>(m.loraScale), side.dy, I, side.b, r, I * r, false, type, 0.0f,
                  dzSide, 64, type);
      if (side.grad.dA) // dA_e [r, in] = dzᵀ x
        groupedGemmReduce(ctx, g, r, D, 1.0f, dzSide, 64, s.x, D, type, 0.0f, side.grad.dA->data(), D, r * D,
                          side.grad.dA->dtype());
    }
    LoraTile tile{dzTile.get(), s.gateA, s.upA, m.gateLora.rank, m.upLora.rank};
    if (dTokens && groupedGemmSum(ctx, g, D, I, dg.get(), dp.get(), I, s.gate, s.up, D, I * D, false, type,
                                  dTokens->data, D, dTokens->dtype, &tile)) {
      zeroUncountedRows(ctx, m, floatOut(*dTokens), D, off);
    } else if (dTokens) { // sizes the one GEMM cannot copy in 16-byte chunks: the four products in f32
      DeviceBuffer scratch(ctx, plan::F32, R * D);
      float *dx = scratch.as<float>();
      groupedGemm(ctx, g, D, I, 1.0f, dg.get(), I, s.gate, D, I * D, false, type, 0.0f, dx, D, plan::F32);
      groupedGemm(ctx, g, D, I, 1.0f, dp.get(), I, s.up, D, I * D, false, type, 1.0f, dx, D, plan::F32);
      groupedGemm(ctx, g, D, m.gateLora.rank, 1.0f, dzTile.get(), 64, s.gateA, D, m.gateLora.rank * D, false, type,
                  1.0f, dx, D, plan::F32);
      groupedGemm(ctx, g, D, m.upLora.rank, 1.0f, dzTile.as<__nv_bfloat16>() + 32, 64, s.upA, D,
                  m.upLora.rank * D, false, type, 1.0f, dx, D, plan::F32);
      storeCountedRows(ctx, m, dx, D, off, dTokens->data, dTokens->dtype);
    }
    for (GemmTarget *t : {&dUp, &dGate, &dDown, &dUpA, &dUpB, &dGateA, &dGateB, &dDownA, &dDownB})
      t->finish(ctx);
    return;
  }
  // dx = dp W_up (+ dg W_gate): with no LoRA on them, one GEMM of both products straight into
  // the tokens' gradient; else accumulated in f32 (the output itself when f32).
  bool dxInOnePass = dTokens && onePass &&
                     groupedGemmSum(ctx, g, D, I, dp.get(), dg.get(), I, s.up, s.gate, D, I * D,
                                    false, type, dTokens->data, D, dTokens->dtype);
  DeviceBuffer dxScratch;
  float *dx = nullptr;
  if (dTokens && !dxInOnePass) {
    if (dTokens->dtype == plan::F32) {
      dx = static_cast<float *>(dTokens->data);
    } else {
      dxScratch = DeviceBuffer(ctx, plan::F32, R * D);
      dx = dxScratch.as<float>();
    }
  }
  projectionBackward(ctx, m, g, type, s.up, m.upLora, s.upA, s.upB, upGrad, s.x, dp.get(), f.zUp.get(), D, U,
                     dz.get(), dx, 0.0f);
  if (m.gate)
    projectionBackward(ctx, m, g, type, s.gate, m.gateLora, s.gateA, s.gateB, gateGrad, s.x, dg.get(),
                       f.zGate.get(), D, I, dz.get(), dx, 1.0f);
  for (GemmTarget *t : {&dUp, &dGate, &dDown, &dUpA, &dUpB, &dGateA, &dGateB, &dDownA, &dDownB})
    t->finish(ctx);
  if (dxInOnePass)
    zeroUncountedRows(ctx, m, floatOut(*dTokens), D, off);
  else if (dx)
    storeCountedRows(ctx, m, dx, D, off, dTokens->data, dTokens->dtype);
}

//===----------------------------------------------------------------------===//
// expert_mlp_combine.backward: an expert MLP's backward with its combine's
//===----------------------------------------------------------------------===//

namespace {

/// A warp per token copy (t, j) with an expert: its row (expert-major order) of dy's
/// unweighted copy gets dy[t], and rowWeight[row] the copy's router weight. kEight: 16-byte
/// pieces (eightAtATime; 2-byte copies took 0.4 ms a layer at P4's 131072 copies of 2048).
template <bool kEight>
__global__ void slotGradientsKernel(FloatIn dy, const int32_t *rows, IndexIn indices, const float *weights,
                                    int64_t topK, int64_t features, int64_t copies, FloatOut dRows,
                                    float *rowWeight) {
  int64_t copy = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  int lane = threadIdx.x & 31;
  if (copy >= copies || indices[copy] < 0) // uniform across the warp
    return;
  int64_t t = copy / topK, row = rows[copy];
  if constexpr (kEight) {
    for (int64_t d = 8 * lane; d < features; d += 8 * 32)
      store8(dRows.p, dRows.bf16, row * features + d, load8(dy.p, dy.bf16, t * features + d));
  } else {
    for (int64_t d = lane; d < features; d += 32)
      dRows.store(row * features + d, dy[t * features + d]);
  }
  if (lane == 0)
    rowWeight[row] = weights[copy];
}

/// d weights[copy] = Σ over n tiles, in order, of its row's dots (0 for a copy without expert).
__global__ void weightGradKernel(const float *dots, const int32_t *rows, IndexIn indices, int64_t tiles,
                                 int64_t rowCount, int64_t copies, FloatOut dWeights) {
  int64_t copy = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (copy >= copies)
    return;
  float sum = 0.0f;
  if (indices[copy] >= 0)
    for (int64_t n = 0; n < tiles; ++n)
      sum += dots[n * rowCount + rows[copy]];
  dWeights.store(copy, sum);
}

} // namespace

/// The twin of cpu/routing/ExpertMlpCombine.cpp. Where the gated SiLU runs in one pass
/// (gluInOnePass: bf16, a separate gate, no bias or LoRA) and only the tokens' and the weights'
/// gradients are wanted, the router weights' gradient comes from the experts' backward: dy's
/// unweighted copies go through the down projection (dh' = dy W_down), the gated GEMM's epilogue
/// scales dh' by the row's weight for the gate and up gradients and adds up dh' . h by n tile, a
/// last kernel sums the tiles in order per copy (dy . (h W_downᵀ) = dh' . h). Otherwise the three
/// kernels it replaces run in turn, the expert outputs computed again.
void expertMlpCombineBackward(KernelContext &ctx) {
  const checks::routing::ExpertCombineLaunch launch = checks::routing::expertCombineLaunch(ctx);
  const TensorRef &indices = *launch.indices, &weights = *launch.weights, &dy = *launch.dResult;
  OperandGroups ops = expertOperands(ctx);
  Experts m = parseExperts(ctx, ops);
  expectFloat(ctx, dy, "gradient of result");
  ctx.expectShape(dy, "gradient of result", {indices.dim(0), m.features});
  // Every entry of the indices (-1: an expert on another rank, whose copy the experts do not
  // hold: R may be fewer than the entries); the kernels below skip the -1 entries.
  const int64_t copies = indices.numel(), R = m.rows, D = m.features, I = m.inter;

  Operands s;
  if (R > 0)
    loadOperands(ctx, m, s);
  const bool onePass = R > 0 && !m.downBias && !m.downLora && gluInOnePass(m, s) && launch.wantWeights &&
                       launch.expertGrads == std::vector<int64_t>{ops.input[Tokens]};
  if (onePass) {
    DeviceBuffer offsets = deviceOffsets(ctx, m);
    ExpertRows g{offsets.as<int64_t>(), m.experts, R};
    DeviceBuffer rows(ctx, copies * sizeof(int32_t));
    expertMajorOrder(ctx, indices, rows.as<int32_t>(), nullptr);
    DeviceBuffer dRows(ctx, s.type, R * D), rowWeight(ctx, plan::F32, R);
    constexpr int kWarps = 8;
    if (copies > 0) {
      auto kernel = eightAtATime(D, {dy.data, dRows.get()}) ? slotGradientsKernel<true> : slotGradientsKernel<false>;
      kernel<<<static_cast<unsigned>((copies + kWarps - 1) / kWarps), 32 * kWarps, 0, streamOf(ctx)>>>(
          floatIn(dy), rows.as<int32_t>(), indexIn(indices), weights.f32(), indices.dim(1), D, copies,
          floatOut(dRows.get(), s.type), rowWeight.as<float>());
      checkLaunch(ctx, "expert_mlp_combine.backward: dy's copies");
    }
    // dh' = dy W_down (f32), then the gate's and up's gradients (scaled) and dh' . h by n tile:
    // with the forward's gate and up products saved, from them in the dh' GEMM's epilogue (dh'
    // never written), or in an element-wise pass where that GEMM does not fit; else the gated
    // GEMM runs the products again.
    DeviceBuffer dp(ctx, s.type, R * I), dg(ctx, s.type, R * I);
    const int64_t tiles = (I + kRowDotColumns - 1) / kRowDotColumns;
    DeviceBuffer dots(ctx, plan::F32, tiles * R);
    const TensorRef *pre = launch.preActivations ? checks::routing::savedPreActivations(ctx, *m.x, I, savable(m))
                                                 : nullptr;
    if (!pre || !groupedSavedGluGradGemm(ctx, g, I, D, dRows.get(), D, s.down, I, I * D, false, s.type,
                                          pre->f32(), dg.get(), dp.get(), I, rowWeight.as<float>(),
                                          dots.as<float>())) {
      DeviceBuffer dh(ctx, plan::F32, R * I);
      projectionBackward(ctx, m, g, s.type, s.down, m.downLora, nullptr, nullptr, ProjectionGrad{}, nullptr,
                         dRows.get(), nullptr, I, D, nullptr, dh.as<float>(), 0.0f);
      if (pre)
        savedGluGrad(ctx, m, g, *pre, dh.as<float>(), rowWeight.as<float>(), dg.get(), dp.get(), s.type,
                     dots.as<float>());
      else
        groupedGluGemm(ctx, g, I, D, s.x, D, s.gate, s.up, D, I * D, s.type, dh.as<float>(), dg.get(), dp.get(), I,
                       rowWeight.as<float>(), dots.as<float>());
    }
    if (copies > 0) {
      weightGradKernel<<<gridFor(copies), kThreads, 0, streamOf(ctx)>>>(
          dots.as<float>(), rows.as<int32_t>(), indexIn(indices), tiles, R, copies, floatOut(ctx.outputs.back()));
      checkLaunch(ctx, "expert_mlp_combine.backward: the weights' gradient");
    }
    const TensorRef &dTokens = ctx.out(0);
    if (groupedGemmSum(ctx, g, D, I, dp.get(), dg.get(), I, s.up, s.gate, D, I * D, false, s.type, dTokens.data, D,
                       dTokens.dtype))
      return zeroUncountedRows(ctx, m, floatOut(dTokens), D, offsets.as<int64_t>());
    // Sizes the one GEMM cannot copy in 16-byte rows (inter not a multiple of 8): both products in f32.
    DeviceBuffer scratch(ctx, plan::F32, R * D);
    groupedGemm(ctx, g, D, I, 1.0f, dp.get(), I, s.up, D, I * D, false, s.type, 0.0f, scratch.get(), D, plan::F32);
    groupedGemm(ctx, g, D, I, 1.0f, dg.get(), I, s.gate, D, I * D, false, s.type, 1.0f, scratch.get(), D, plan::F32);
    return storeCountedRows(ctx, m, scratch.as<float>(), D, offsets.as<int64_t>(), dTokens.data, dTokens.dtype);
  }

  // The definition: the expert outputs again, the combine's backward, the expert MLP's backward.
  const TensorRef &x = *m.x;
  DeviceBuffer outputs(ctx, x.dtype, R * D), dOutputs(ctx, x.dtype, R * D);
  checks::routing::composeExpertCombineBackward(ctx, launch, TensorRef{x.dtype, x.shape, outputs.get()},
                                                TensorRef{x.dtype, x.shape, dOutputs.get()}, expertMlpForward,
                                                combineBackward, expertMlpBackward);
}

} // namespace moec::runtime::cuda::routing
