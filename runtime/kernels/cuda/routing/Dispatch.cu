//===- Dispatch.cu - token copies to expert-major order and back ----------===//
//
// The twin of cpu/routing/Dispatch.cpp. The expert-major order (rows grouped
// by expert in expert order, within an expert in (token, slot) order) comes
// from a stable radix sort of the copies by expert on the device
// (expertMajorOrder); the counts from an integer histogram.
//   dispatch:          one block per output row, threads over features.
//   dispatch.backward: one block per token, the k copies summed in slot order.
//   combine:           one block per token, Σ_j w[t, j] * row(t, j) in slot order.
//   combine.backward:  one block per token: d expert_output rows = w * dy and
//                      d weights = <dy, row> (double block reduction).
// Rows whose features are a multiple of 8 move eight values per thread in 16-byte
// loads and stores (dispatch, dispatch.backward, combine; same arithmetic).
// Everything is written (no pre-zeroed outputs), nothing uses float atomics.
// A negative index (an expert on another rank) makes no copy: it sorts after
// every expert, its combine term is absent and its weight gradient zero. The
// copies' buffers then hold a row per copy made: the host cannot count them
// (the indices live on the device), so it checks only the upper bound, and
// the executor hands over as many rows as the route received. Index values
// are not range-checked on the host either.
//
//===----------------------------------------------------------------------===//

#include <algorithm>
#include <string>
#include <vector>

#include "runtime/kernels/cuda/routing/RoutingCommon.cuh"
#include "runtime/kernels/cuda/routing/RoutingKernels.h"

namespace moec::runtime::cuda::routing {

namespace {

// Each kernel walks a row's features one at a time, or, with kEight (eightAtATime: features a
// multiple of 8, 16-byte aligned rows), eight at a time in 16-byte loads and stores; the
// arithmetic per feature is the same either way.

/// y[p] = x[token of the copy at row p]; the copies of other ranks' experts sort last.
template <bool kEight>
__global__ void dispatchKernel(FloatIn x, const int32_t *perm, IndexIn indices, int64_t topK,
                               int64_t features, FloatOut y) {
  int64_t p = blockIdx.x, t = perm[p] / topK;
  if (indices[perm[p]] < 0)
    return;
  if constexpr (kEight) {
    for (int64_t d = 8 * threadIdx.x; d < features; d += 8 * blockDim.x)
      store8(y.p, y.bf16, p * features + d, load8(x.p, x.bf16, t * features + d));
  } else {
    for (int64_t d = threadIdx.x; d < features; d += blockDim.x)
      y.store(p * features + d, x[t * features + d]);
  }
}

/// dx[t] = Σ_j dy[row(t, j)], in slot order.
template <bool kEight>
__global__ void dispatchBackwardKernel(FloatIn dy, const int32_t *rows, IndexIn indices,
                                       int64_t topK, int64_t features, FloatOut dx) {
  int64_t t = blockIdx.x;
  if constexpr (kEight) {
    for (int64_t d = 8 * threadIdx.x; d < features; d += 8 * blockDim.x) {
      Floats8 sum = {};
      for (int64_t j = 0; j < topK; ++j)
        if (indices[t * topK + j] >= 0) {
          Floats8 v = load8(dy.p, dy.bf16, rows[t * topK + j] * features + d);
#pragma unroll
          for (int k = 0; k < 8; ++k)
            sum.v[k] = __fadd_rn(sum.v[k], v.v[k]);
        }
      store8(dx.p, dx.bf16, t * features + d, sum);
    }
  } else {
    for (int64_t d = threadIdx.x; d < features; d += blockDim.x) {
      float sum = 0.0f;
      for (int64_t j = 0; j < topK; ++j)
        if (indices[t * topK + j] >= 0)
          sum = __fadd_rn(sum, dy[rows[t * topK + j] * features + d]);
      dx.store(t * features + d, sum);
    }
  }
}

/// y[t] = Σ_j w[t, j] * out[row(t, j)], in slot order (f32, no contraction:
/// the CPU's rounding).
template <bool kEight>
__global__ void combineKernel(FloatIn out, const int32_t *rows, IndexIn indices, FloatIn weights,
                              int64_t topK, int64_t features, FloatOut y) {
  int64_t t = blockIdx.x;
  if constexpr (kEight) {
    for (int64_t d = 8 * threadIdx.x; d < features; d += 8 * blockDim.x) {
      Floats8 sum = {};
      for (int64_t j = 0; j < topK; ++j)
        if (indices[t * topK + j] >= 0) {
          float w = weights[t * topK + j];
          Floats8 v = load8(out.p, out.bf16, rows[t * topK + j] * features + d);
#pragma unroll
          for (int k = 0; k < 8; ++k)
            sum.v[k] = __fadd_rn(sum.v[k], __fmul_rn(w, v.v[k]));
        }
      store8(y.p, y.bf16, t * features + d, sum);
    }
  } else {
    for (int64_t d = threadIdx.x; d < features; d += blockDim.x) {
      float sum = 0.0f;
      for (int64_t j = 0; j < topK; ++j)
        if (indices[t * topK + j] >= 0)
          sum = __fadd_rn(sum, __fmul_rn(weights[t * topK + j], out[rows[t * topK + j] * features + d]));
      y.store(t * features + d, sum);
    }
  }
}

/// A warp per copy (token t, slot j): dOut[row] = w * dy[t], dWeights[t, j] = dy[t] · out[row]
/// (the dot in double, each lane's part in feature order, then the lanes in a fixed order).
template <bool kEight>
__global__ void combineBackwardKernel(FloatIn out, const int32_t *rows, IndexIn indices,
                                      FloatIn weights, FloatIn dy, int64_t topK, int64_t features,
                                      int64_t copies, FloatOut dOut, FloatOut dWeights) {
  int64_t copy = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  int lane = threadIdx.x & 31;
  if (copy >= copies) // uniform across the warp
    return;
  if (indices[copy] < 0) {
    if (dWeights && lane == 0)
      dWeights.store(copy, 0.0f);
    return;
  }
  int64_t t = copy / topK, row = rows[copy];
  float w = weights[copy];
  double dot = 0;
  if constexpr (kEight) {
    for (int64_t d = 8 * lane; d < features; d += 8 * 32) {
      Floats8 g = load8(dy.p, dy.bf16, t * features + d);
      if (dOut) {
        Floats8 scaled;
#pragma unroll
        for (int k = 0; k < 8; ++k)
          scaled.v[k] = __fmul_rn(w, g.v[k]);
        store8(dOut.p, dOut.bf16, row * features + d, scaled);
      }
      if (dWeights) {
        Floats8 o = load8(out.p, out.bf16, row * features + d);
#pragma unroll
        for (int k = 0; k < 8; ++k)
          dot += static_cast<double>(g.v[k]) * o.v[k];
      }
    }
  } else {
    for (int64_t d = lane; d < features; d += 32) {
      float g = dy[t * features + d];
      if (dOut)
        dOut.store(row * features + d, __fmul_rn(w, g));
      if (dWeights)
        dot += static_cast<double>(g) * out[row * features + d];
    }
  }
  if (dWeights) {
    dot = warpReduce(dot, SumOp{});
    if (lane == 0)
      dWeights.store(copy, static_cast<float>(dot));
  }
}

/// The copies' rows: [rows, features] with rows <= one per (token, slot).
void expectCopyRows(const KernelContext &ctx, const TensorRef &t, const char *what, int64_t most,
                    int64_t features) {
  if (t.rank() == 2 && t.dim(0) <= most && t.dim(1) == features)
    return;
  std::string shape = "[";
  for (int64_t d = 0; d < t.rank(); ++d)
    shape += (d ? "," : "") + std::to_string(t.dim(d));
  ctx.fail(std::string(what) + " has shape " + shape + "], expected [rows, " + std::to_string(features) +
           "] with rows <= " + std::to_string(most) + " (a row per expert copy)");
}

struct Combine {
  int64_t tokens, topK, features;
  const TensorRef *expertOutput, *indices, *weights;
};

Combine parseCombine(const KernelContext &ctx) {
  const TensorRef &out = ctx.in(0), &indices = ctx.in(1), &weights = ctx.in(2);
  expectFloat(ctx, out, "expert_output");
  expectFloat(ctx, weights, "weights");
  ctx.expectShape(indices, "indices", {-1, -1});
  Combine c;
  c.tokens = indices.dim(0);
  c.topK = indices.dim(1);
  ctx.expectShape(weights, "weights", {c.tokens, c.topK});
  c.features = out.rank() == 2 ? out.dim(1) : -1;
  expectCopyRows(ctx, out, "expert_output", c.tokens * c.topK, c.features);
  expectIndices(ctx, indices);
  c.expertOutput = &out;
  c.indices = &indices;
  c.weights = &weights;
  return c;
}

} // namespace

void dispatchForward(KernelContext &ctx) {
  const TensorRef &input = ctx.in(0), &indices = ctx.in(1);
  expectFloat(ctx, input, "input");
  ctx.expectShape(input, "input", {-1, -1});
  ctx.expectShape(indices, "indices", {input.dim(0), -1});
  int64_t experts = ctx.attrInt("num_experts");
  if (experts < 1)
    ctx.fail("num_experts must be positive, got " + std::to_string(experts));
  int64_t tokens = input.dim(0), topK = indices.dim(1), features = input.dim(1);
  if (ctx.outputs.size() != 2)
    ctx.fail("expected 2 outputs (tokens, counts), got " + std::to_string(ctx.outputs.size()));
  expectFloat(ctx, ctx.out(0), "tokens");
  expectCopyRows(ctx, ctx.out(0), "tokens", tokens * topK, features);
  if (ctx.out(1).dtype != plan::I64)
    ctx.fail("counts must be i64");
  ctx.expectShape(ctx.out(1), "counts", {experts});
  expectIndices(ctx, indices);
  int64_t copies = tokens * topK;
  DeviceBuffer perm(ctx, copies * sizeof(int32_t));
  expertMajorOrder(ctx, indices, nullptr, perm.as<int32_t>(), ctx.out(1).i64(), experts);
  // The copies made come first in the order; a row each (the rest sort last and make none).
  int64_t rows = std::min(copies, ctx.out(0).dim(0));
  if (rows == 0 || features == 0)
    return;
  auto kernel = eightAtATime(features, {input.data, ctx.out(0).data}) ? dispatchKernel<true> : dispatchKernel<false>;
  kernel<<<static_cast<unsigned>(rows), 128, 0, streamOf(ctx)>>>(floatIn(input), perm.as<int32_t>(), indexIn(indices),
                                                                 topK, features, floatOut(ctx.out(0)));
  checkLaunch(ctx, "dispatch");
}

void dispatchBackward(KernelContext &ctx) {
  const TensorRef &input = ctx.in(0), &indices = ctx.in(1);
  ctx.expectShape(input, "input", {-1, -1});
  ctx.expectShape(indices, "indices", {input.dim(0), -1});
  ctx.attrInt("num_experts"); // required, as on the CPU
  std::vector<const TensorRef *> grads = gradOutputs(ctx, 2, {{1, "indices are integers"}});
  const TensorRef *dTokens = resultGrad(ctx, 0);
  if (!grads[0] || !dTokens)
    return;
  int64_t tokens = input.dim(0), topK = indices.dim(1), features = input.dim(1);
  expectFloat(ctx, *dTokens, "gradient of tokens");
  expectCopyRows(ctx, *dTokens, "gradient of tokens", tokens * topK, features);
  expectIndices(ctx, indices);
  int64_t copies = tokens * topK;
  if (copies == 0 || features == 0)
    return;
  DeviceBuffer rows(ctx, copies * sizeof(int32_t));
  expertMajorOrder(ctx, indices, rows.as<int32_t>(), nullptr);
  auto kernel = eightAtATime(features, {dTokens->data, grads[0]->data}) ? dispatchBackwardKernel<true>
                                                                        : dispatchBackwardKernel<false>;
  kernel<<<static_cast<unsigned>(tokens), 128, 0, streamOf(ctx)>>>(floatIn(*dTokens), rows.as<int32_t>(),
                                                                   indexIn(indices), topK, features,
                                                                   floatOut(*grads[0]));
  checkLaunch(ctx, "dispatch.backward");
}

void combineForward(KernelContext &ctx) {
  Combine c = parseCombine(ctx);
  expectFloat(ctx, ctx.out(0), "result");
  ctx.expectShape(ctx.out(0), "result", {c.tokens, c.features});
  if (c.tokens == 0 || c.features == 0)
    return;
  int64_t copies = c.tokens * c.topK;
  DeviceBuffer rows(ctx, copies * sizeof(int32_t));
  expertMajorOrder(ctx, *c.indices, rows.as<int32_t>(), nullptr);
  auto kernel = eightAtATime(c.features, {c.expertOutput->data, ctx.out(0).data}) ? combineKernel<true>
                                                                                  : combineKernel<false>;
  kernel<<<static_cast<unsigned>(c.tokens), 128, 0, streamOf(ctx)>>>(
      floatIn(*c.expertOutput), rows.as<int32_t>(), indexIn(*c.indices), floatIn(*c.weights), c.topK,
      c.features, floatOut(ctx.out(0)));
  checkLaunch(ctx, "combine");
}

void combineBackward(KernelContext &ctx) {
  Combine c = parseCombine(ctx);
  std::vector<const TensorRef *> grads = gradOutputs(ctx, 3, {{1, "indices are integers"}});
  const TensorRef *dResult = resultGrad(ctx, 0);
  if (!dResult)
    return;
  expectFloat(ctx, *dResult, "gradient of result");
  ctx.expectShape(*dResult, "gradient of result", {c.tokens, c.features});
  FloatOut dOut = grads[0] ? floatOut(*grads[0]) : FloatOut{};
  FloatOut dWeights = grads[2] ? floatOut(*grads[2]) : FloatOut{};
  if (c.tokens == 0 || c.topK == 0 || (!dOut && !dWeights))
    return;
  int64_t copies = c.tokens * c.topK;
  DeviceBuffer rows(ctx, copies * sizeof(int32_t));
  expertMajorOrder(ctx, *c.indices, rows.as<int32_t>(), nullptr);
  bool eight = eightAtATime(c.features, {c.expertOutput->data, dResult->data, dOut.p});
  auto kernel = eight ? combineBackwardKernel<true> : combineBackwardKernel<false>;
  constexpr int kWarps = 8;
  kernel<<<static_cast<unsigned>((copies + kWarps - 1) / kWarps), 32 * kWarps, 0, streamOf(ctx)>>>(
      floatIn(*c.expertOutput), rows.as<int32_t>(), indexIn(*c.indices), floatIn(*c.weights),
      floatIn(*dResult), c.topK, c.features, copies, dOut, dWeights);
  checkLaunch(ctx, "combine.backward");
}

} // namespace moec::runtime::cuda::routing
