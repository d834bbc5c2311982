//===- Dispatch.cpp - token copies to expert-major order and back ---------===//
//
// dispatch: input [T, D], indices [T, k] -> tokens [T*k, D], counts [E]: copy
// (t, j) goes to expert indices[t, j]; rows are grouped by expert in expert
// order, and within an expert in (token, slot) order (expertMajorRows).
// combine: expert_output [T*k, D] in that order, indices, weights [T, k] ->
// result[t] = Σ_j weights[t, j] * expert_output[row of (t, j)], the slots
// summed in slot order. Both backwards are the transposed gathers. A negative
// index is an expert on another rank (expert parallel): no copy, no term, a
// zero weight gradient; the copies' buffers then have a row per copy made (at
// least; the executor hands over as many as the route received).
//
//===----------------------------------------------------------------------===//

#include <algorithm>
#include <string>
#include <vector>

#include "runtime/kernels/cpu/routing/Routing.h"

namespace moec::runtime::cpu::routing {

namespace {

/// The largest expert index + 1: combine has no num_experts, and the
/// expert-major order depends only on the indices' relative order.
int64_t expertsSeen(const KernelContext &ctx, const TensorRef &indices) {
  if (indices.dtype != plan::I32 && indices.dtype != plan::I64)
    ctx.fail("indices must be i32 or i64");
  int64_t top = -1;
  for (int64_t i = 0; i < indices.numel(); ++i)
    top = std::max(top, indices.index(i));
  return top + 1;
}

/// The copies' rows: at least one per copy made (non-negative index), at most one per
/// (token, slot).
void expectCopyRows(const KernelContext &ctx, const TensorRef &t, const char *what, const TensorRef &indices,
                    int64_t features) {
  int64_t made = 0;
  for (int64_t i = 0; i < indices.numel(); ++i)
    made += indices.index(i) >= 0;
  if (t.rank() == 2 && t.dim(0) >= made && t.dim(0) <= indices.numel() && t.dim(1) == features)
    return;
  std::string shape = "[";
  for (int64_t d = 0; d < t.rank(); ++d)
    shape += (d ? "," : "") + std::to_string(t.dim(d));
  ctx.fail(std::string(what) + " has shape " + shape + "], expected [rows, " + std::to_string(features) + "] with " +
           std::to_string(made) + " <= rows <= " + std::to_string(indices.numel()) + " (a row per expert copy)");
}

struct Combine {
  int64_t tokens, topK, features;
  const float *expertOutput, *weights;
  std::vector<int64_t> rows;
};

Combine parseCombine(const KernelContext &ctx) {
  const TensorRef &out = ctx.in(0), &indices = ctx.in(1), &weights = ctx.in(2);
  expectF32(ctx, out, "expert_output");
  expectF32(ctx, weights, "weights");
  ctx.expectShape(indices, "indices", {-1, -1});
  Combine c;
  c.tokens = indices.dim(0);
  c.topK = indices.dim(1);
  ctx.expectShape(weights, "weights", {c.tokens, c.topK});
  c.features = out.rank() == 2 ? out.dim(1) : -1;
  expectCopyRows(ctx, out, "expert_output", indices, c.features);
  c.expertOutput = out.f32();
  c.weights = weights.f32();
  c.rows = expertMajorRows(ctx, indices, expertsSeen(ctx, indices));
  return c;
}

} // namespace

void dispatchForward(KernelContext &ctx) {
  const TensorRef &input = ctx.in(0), &indices = ctx.in(1);
  expectF32(ctx, input, "input");
  ctx.expectShape(input, "input", {-1, -1});
  ctx.expectShape(indices, "indices", {input.dim(0), -1});
  int64_t experts = ctx.attrInt("num_experts");
  if (experts < 1)
    ctx.fail("num_experts must be positive, got " + std::to_string(experts));
  int64_t tokens = input.dim(0), topK = indices.dim(1), features = input.dim(1);
  if (ctx.outputs.size() != 2)
    ctx.fail("expected 2 outputs (tokens, counts), got " + std::to_string(ctx.outputs.size()));
  expectF32(ctx, ctx.out(0), "tokens");
  expectCopyRows(ctx, ctx.out(0), "tokens", indices, features);
  if (ctx.out(1).dtype != plan::I64)
    ctx.fail("counts must be i64");
  ctx.expectShape(ctx.out(1), "counts", {experts});
  std::vector<int64_t> counts;
  std::vector<int64_t> rows = expertMajorRows(ctx, indices, experts, &counts);
  std::copy(counts.begin(), counts.end(), ctx.out(1).i64());
  const float *x = input.f32();
  float *y = ctx.out(0).f32();
  ctx.parallelFor(tokens, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      for (int64_t j = 0; j < topK; ++j)
        if (rows[t * topK + j] >= 0)
          std::copy_n(x + t * features, features, y + rows[t * topK + j] * features);
  });
}

void dispatchBackward(KernelContext &ctx) {
  const TensorRef &input = ctx.in(0), &indices = ctx.in(1);
  ctx.expectShape(input, "input", {-1, -1});
  ctx.expectShape(indices, "indices", {input.dim(0), -1});
  int64_t experts = ctx.attrInt("num_experts");
  std::vector<float *> grads = gradOutputs(ctx, 2, {{1, "indices are integers"}});
  const TensorRef *dTokens = resultGrad(ctx, 0);
  if (!grads[0] || !dTokens)
    return;
  int64_t tokens = input.dim(0), topK = indices.dim(1), features = input.dim(1);
  expectF32(ctx, *dTokens, "gradient of tokens");
  expectCopyRows(ctx, *dTokens, "gradient of tokens", indices, features);
  std::vector<int64_t> rows = expertMajorRows(ctx, indices, experts);
  const float *dy = dTokens->f32();
  float *dx = grads[0];
  ctx.parallelFor(tokens, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      for (int64_t j = 0; j < topK; ++j) {
        if (rows[t * topK + j] < 0)
          continue;
        const float *src = dy + rows[t * topK + j] * features;
        for (int64_t d = 0; d < features; ++d)
          dx[t * features + d] += src[d];
      }
  });
}

void combineForward(KernelContext &ctx) {
  Combine c = parseCombine(ctx);
  expectF32(ctx, ctx.out(0), "result");
  ctx.expectShape(ctx.out(0), "result", {c.tokens, c.features});
  float *y = ctx.out(0).f32();
  ctx.parallelFor(c.tokens, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float *yt = y + t * c.features;
      std::fill_n(yt, c.features, 0.0f);
      for (int64_t j = 0; j < c.topK; ++j) {
        if (c.rows[t * c.topK + j] < 0)
          continue;
        float w = c.weights[t * c.topK + j];
        const float *src = c.expertOutput + c.rows[t * c.topK + j] * c.features;
        for (int64_t d = 0; d < c.features; ++d)
          yt[d] += w * src[d];
      }
    }
  });
}

void combineBackward(KernelContext &ctx) {
  Combine c = parseCombine(ctx);
  std::vector<float *> grads = gradOutputs(ctx, 3, {{1, "indices are integers"}});
  const TensorRef *dResult = resultGrad(ctx, 0);
  if (!dResult)
    return;
  expectF32(ctx, *dResult, "gradient of result");
  ctx.expectShape(*dResult, "gradient of result", {c.tokens, c.features});
  const float *dy = dResult->f32();
  float *dOut = grads[0], *dWeights = grads[2];
  ctx.parallelFor(c.tokens, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float *g = dy + t * c.features;
      for (int64_t j = 0; j < c.topK; ++j) {
        int64_t row = c.rows[t * c.topK + j];
        if (row < 0) {
          if (dWeights)
            dWeights[t * c.topK + j] = 0.0f;
          continue;
        }
        if (dOut) {
          float w = c.weights[t * c.topK + j];
          for (int64_t d = 0; d < c.features; ++d)
            dOut[row * c.features + d] = w * g[d];
        }
        if (dWeights) {
          const float *src = c.expertOutput + row * c.features;
          double dot = 0;
          for (int64_t d = 0; d < c.features; ++d)
            dot += static_cast<double>(g[d]) * src[d];
          dWeights[t * c.topK + j] = static_cast<float>(dot);
        }
      }
    }
  });
}

} // namespace moec::runtime::cpu::routing
