//===- Norms.cpp - rms_norm (whole or sharded) and layer_norm, and backward ===//
//
// Statistics are accumulated in double per normalised group; x̂ is rounded
// to f32 before the weight multiplies it, as transformers' Llama-style
// RMSNorm does (it computes x̂ in f32, casts, then multiplies by w).
//
//===----------------------------------------------------------------------===//

#include <cmath>

#include "runtime/kernels/cpu/core/CoreCommon.h"

namespace moec::runtime::cpu::core {

namespace {

/// The launch of rms_norm or its backward: x [..., F] normalised in groups
/// of G = weight size contiguous features (G = F: the whole row; G = hd on
/// x [T, H*hd]: each head separately).
struct RmsNormArgs {
  const float *x, *w;
  int64_t groupSize, groups;
  float eps;
  bool unitOffset;

  RmsNormArgs(const KernelContext &ctx) {
    const TensorRef &input = ctx.in(0), &weight = ctx.in(1);
    x = floats(ctx, input, "input");
    w = floats(ctx, weight, "weight");
    ctx.expectShape(weight, "weight", {-1});
    groupSize = weight.dim(0);
    rowsOf(ctx, input, "input"); // rank >= 1
    int64_t features = input.dim(-1);
    if (groupSize <= 0 || features % groupSize != 0)
      ctx.fail("weight size " + std::to_string(groupSize) + " does not divide the input's " +
               std::to_string(features) + " features");
    groups = input.numel() / groupSize;
    eps = static_cast<float>(ctx.attrFloat("eps"));
    unitOffset = ctx.attrBool("unit_offset");
  }

  /// 1 / sqrt(mean(x²) + eps) of group g, rounded to f32 as transformers has it.
  float inverseRms(int64_t g) const {
    const float *xg = x + g * groupSize;
    double sum = 0;
    for (int64_t j = 0; j < groupSize; ++j)
      sum += static_cast<double>(xg[j]) * xg[j];
    return static_cast<float>(1.0 / std::sqrt(sum / groupSize + eps));
  }

  float scale(int64_t j) const { return unitOffset ? 1.0f + w[j] : w[j]; }
};

void rmsNorm(KernelContext &ctx) {
  RmsNormArgs a(ctx);
  const TensorRef &result = ctx.out(0);
  expectSameShape(ctx, result, "result", ctx.in(0), "input");
  float *y = floats(ctx, result, "result");
  ctx.parallelFor(a.groups, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      float r = a.inverseRms(g);
      const float *xg = a.x + g * a.groupSize;
      float *yg = y + g * a.groupSize;
      for (int64_t j = 0; j < a.groupSize; ++j)
        yg[j] = a.scale(j) * (xg[j] * r);
    }
  });
}

void rmsNormBackward(KernelContext &ctx) {
  BackwardLaunch launch(ctx, 1, {0, 1});
  RmsNormArgs a(ctx);
  const float *dy = floats(ctx, launch.resultGrad0(ctx.in(0).shape), "the result gradient");
  const TensorRef *dxRef = launch.operandGrad(0), *dwRef = launch.operandGrad(1);
  float *dx = dxRef ? floats(ctx, *dxRef, "the input gradient") : nullptr;
  float *dwOut = dwRef ? floats(ctx, *dwRef, "the weight gradient") : nullptr;
  int64_t n = a.groupSize;
  // dx = r (g - x̂ mean(g x̂)) with g = dy * w; dw = Σ dy x̂ over every group.
  std::vector<double> dw =
      rowBlocks(ctx, a.groups, dwOut ? n : 0, [&](int64_t begin, int64_t end, double *partial) {
        for (int64_t g = begin; g < end; ++g) {
          float r = a.inverseRms(g);
          const float *xg = a.x + g * n, *dyg = dy + g * n;
          double dot = 0;
          for (int64_t j = 0; j < n; ++j) {
            double xhat = static_cast<double>(xg[j]) * r;
            dot += static_cast<double>(dyg[j]) * a.scale(j) * xhat;
            if (dwOut)
              partial[j] += dyg[j] * xhat;
          }
          if (!dx)
            continue;
          double mean = dot / n;
          for (int64_t j = 0; j < n; ++j) {
            double xhat = static_cast<double>(xg[j]) * r;
            dx[g * n + j] =
                static_cast<float>(r * (static_cast<double>(dyg[j]) * a.scale(j) - xhat * mean));
          }
        }
      });
  if (dwOut)
    for (int64_t j = 0; j < n; ++j)
      dwOut[j] = static_cast<float>(dw[j]);
}

// A norm whose rows are split over tensor-parallel ranks (OLMoE's q/k norms over every head):
// row_sum_of_squares gives each rank's part of the rows' statistic, moe.tp_sum adds the parts,
// and sharded_rms_norm normalises this rank's features by the whole rows' statistic. Its
// backward's sum_of_squares gradient returns through the sum to every rank's features:
//   y = s x r,  r = (S / N + eps)^-1/2,  dx = s dy r,  dS = -r³ / (2N) Σ s dy x,  dw = Σ dy x r.

void rowSumOfSquares(KernelContext &ctx) {
  RowSumOfSquaresShape s = checks::core::checkRowSumOfSquares(ctx, ctx.in(0), ctx.out(0), "result");
  const float *x = floats(ctx, ctx.in(0), "input");
  float *out = floats(ctx, ctx.out(0), "result");
  ctx.parallelFor(s.rows, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      double sum = 0;
      for (int64_t j = 0; j < s.features; ++j)
        sum += static_cast<double>(x[t * s.features + j]) * x[t * s.features + j];
      out[t] = static_cast<float>(sum);
    }
  });
}

void rowSumOfSquaresBackward(KernelContext &ctx) {
  BackwardLaunch launch(ctx, 1, {0});
  const TensorRef &input = ctx.in(0);
  const float *x = floats(ctx, input, "input");
  const TensorRef &sumGrad = launch.resultGrad0({input.dim(0), 1});
  RowSumOfSquaresShape s = checks::core::checkRowSumOfSquares(ctx, input, sumGrad, "the result gradient");
  const float *ds = floats(ctx, sumGrad, "the result gradient");
  const TensorRef *dxRef = launch.operandGrad(0);
  if (!dxRef)
    return;
  float *dx = floats(ctx, *dxRef, "the input gradient");
  ctx.parallelFor(s.rows, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      for (int64_t j = 0; j < s.features; ++j)
        dx[t * s.features + j] = 2.0f * x[t * s.features + j] * ds[t];
  });
}

struct ShardedRmsNormArgs {
  ShardedRmsNormShape s;
  const float *x, *w, *ss;

  ShardedRmsNormArgs(const KernelContext &ctx) : s(checks::core::checkShardedRmsNorm(ctx)) {
    x = floats(ctx, ctx.in(0), "input");
    w = floats(ctx, ctx.in(1), "weight");
    ss = floats(ctx, ctx.in(2), "sum_of_squares");
  }
  /// 1 / sqrt(S / N + eps) of row t, rounded to f32 as rms_norm rounds it.
  float inverseRms(int64_t t) const {
    return static_cast<float>(1.0 / std::sqrt(static_cast<double>(ss[t]) / s.wholeFeatures + s.eps));
  }
  float scale(int64_t j) const { return s.unitOffset ? 1.0f + w[j] : w[j]; }
};

void shardedRmsNorm(KernelContext &ctx) {
  ShardedRmsNormArgs a(ctx);
  expectSameShape(ctx, ctx.out(0), "result", ctx.in(0), "input");
  float *y = floats(ctx, ctx.out(0), "result");
  int64_t n = a.s.features;
  ctx.parallelFor(a.s.rows, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float r = a.inverseRms(t);
      for (int64_t j = 0; j < n; ++j)
        y[t * n + j] = a.scale(j) * (a.x[t * n + j] * r);
    }
  });
}

void shardedRmsNormBackward(KernelContext &ctx) {
  BackwardLaunch launch(ctx, 1, {0, 1, 2});
  ShardedRmsNormArgs a(ctx);
  const float *dy = floats(ctx, launch.resultGrad0(ctx.in(0).shape), "the result gradient");
  const TensorRef *dxRef = launch.operandGrad(0), *dwRef = launch.operandGrad(1), *dsRef = launch.operandGrad(2);
  float *dx = dxRef ? floats(ctx, *dxRef, "the input gradient") : nullptr;
  float *dwOut = dwRef ? floats(ctx, *dwRef, "the weight gradient") : nullptr;
  float *ds = dsRef ? floats(ctx, *dsRef, "the sum_of_squares gradient") : nullptr;
  int64_t n = a.s.features;
  std::vector<double> dw =
      rowBlocks(ctx, a.s.rows, dwOut ? n : 0, [&](int64_t begin, int64_t end, double *partial) {
        for (int64_t t = begin; t < end; ++t) {
          float r = a.inverseRms(t);
          const float *xt = a.x + t * n, *dyt = dy + t * n;
          double dot = 0;
          for (int64_t j = 0; j < n; ++j) {
            double g = static_cast<double>(dyt[j]) * a.scale(j);
            dot += g * xt[j];
            if (dx)
              dx[t * n + j] = static_cast<float>(g * r);
            if (dwOut)
              partial[j] += static_cast<double>(dyt[j]) * (static_cast<double>(xt[j]) * r);
          }
          if (ds)
            ds[t] = static_cast<float>(-0.5 * static_cast<double>(r) * r * r / a.s.wholeFeatures * dot);
        }
      });
  if (dwOut)
    for (int64_t j = 0; j < n; ++j)
      dwOut[j] = static_cast<float>(dw[j]);
}

/// layer_norm: x [..., F], weight [F], bias [F]; biased variance as torch has it.
struct LayerNormArgs {
  const float *x, *w, *b;
  int64_t features, rows;
  double eps;

  LayerNormArgs(const KernelContext &ctx) {
    const TensorRef &input = ctx.in(0);
    x = floats(ctx, input, "input");
    w = floats(ctx, ctx.in(1), "weight");
    b = floats(ctx, ctx.in(2), "bias");
    rows = rowsOf(ctx, input, "input");
    features = input.dim(-1);
    ctx.expectShape(ctx.in(1), "weight", {features});
    ctx.expectShape(ctx.in(2), "bias", {features});
    eps = ctx.attrFloat("eps");
  }

  /// Mean and 1 / sqrt(var + eps) of row `row`.
  void stats(int64_t row, double &mean, double &inverseStd) const {
    const float *xr = x + row * features;
    double sum = 0, squares = 0;
    for (int64_t j = 0; j < features; ++j)
      sum += xr[j];
    mean = sum / features;
    for (int64_t j = 0; j < features; ++j)
      squares += (xr[j] - mean) * (xr[j] - mean);
    inverseStd = 1.0 / std::sqrt(squares / features + eps);
  }
};

void layerNorm(KernelContext &ctx) {
  LayerNormArgs a(ctx);
  const TensorRef &result = ctx.out(0);
  expectSameShape(ctx, result, "result", ctx.in(0), "input");
  float *y = floats(ctx, result, "result");
  ctx.parallelFor(a.rows, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      double mean, r;
      a.stats(row, mean, r);
      const float *xr = a.x + row * a.features;
      float *yr = y + row * a.features;
      for (int64_t j = 0; j < a.features; ++j)
        yr[j] = static_cast<float>((xr[j] - mean) * r * a.w[j] + a.b[j]);
    }
  });
}

void layerNormBackward(KernelContext &ctx) {
  BackwardLaunch launch(ctx, 1, {0, 1, 2});
  LayerNormArgs a(ctx);
  const float *dy = floats(ctx, launch.resultGrad0(ctx.in(0).shape), "the result gradient");
  const TensorRef *dxRef = launch.operandGrad(0), *dwRef = launch.operandGrad(1),
                  *dbRef = launch.operandGrad(2);
  float *dx = dxRef ? floats(ctx, *dxRef, "the input gradient") : nullptr;
  float *dwOut = dwRef ? floats(ctx, *dwRef, "the weight gradient") : nullptr;
  float *dbOut = dbRef ? floats(ctx, *dbRef, "the bias gradient") : nullptr;
  int64_t n = a.features;
  bool params = dwOut || dbOut;
  // dx = r (g - mean(g) - x̂ mean(g x̂)) with g = dy * w; partial = [dw | db].
  std::vector<double> sums =
      rowBlocks(ctx, a.rows, params ? 2 * n : 0, [&](int64_t begin, int64_t end, double *partial) {
        for (int64_t row = begin; row < end; ++row) {
          double mean, r;
          a.stats(row, mean, r);
          const float *xr = a.x + row * n, *dyr = dy + row * n;
          double sumG = 0, sumGx = 0;
          for (int64_t j = 0; j < n; ++j) {
            double xhat = (xr[j] - mean) * r, g = static_cast<double>(dyr[j]) * a.w[j];
            sumG += g;
            sumGx += g * xhat;
            if (params) {
              partial[j] += dyr[j] * xhat;
              partial[n + j] += dyr[j];
            }
          }
          if (!dx)
            continue;
          for (int64_t j = 0; j < n; ++j) {
            double xhat = (xr[j] - mean) * r, g = static_cast<double>(dyr[j]) * a.w[j];
            dx[row * n + j] = static_cast<float>(r * (g - sumG / n - xhat * sumGx / n));
          }
        }
      });
  for (int64_t j = 0; params && j < n; ++j) {
    if (dwOut)
      dwOut[j] = static_cast<float>(sums[j]);
    if (dbOut)
      dbOut[j] = static_cast<float>(sums[n + j]);
  }
}

} // namespace

void registerNormKernels(KernelRegistry &registry) {
  registry.add("rms_norm", rmsNorm);
  registry.add("rms_norm.backward", rmsNormBackward);
  registry.add("row_sum_of_squares", rowSumOfSquares);
  registry.add("row_sum_of_squares.backward", rowSumOfSquaresBackward);
  registry.add("sharded_rms_norm", shardedRmsNorm);
  registry.add("sharded_rms_norm.backward", shardedRmsNormBackward);
  registry.add("layer_norm", layerNorm);
  registry.add("layer_norm.backward", layerNormBackward);
}

} // namespace moec::runtime::cpu::core
