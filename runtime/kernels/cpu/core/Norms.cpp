//===- Norms.cpp - rms_norm and layer_norm, forward and backward ----------===//
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
  registry.add("layer_norm", layerNorm);
  registry.add("layer_norm.backward", layerNormBackward);
}

} // namespace moec::runtime::cpu::core
