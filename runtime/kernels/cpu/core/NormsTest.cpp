//===- NormsTest.cpp - rms_norm and layer_norm against naive references ---===//

#include <cmath>
#include <cstring>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/kernels/cpu/core/CoreTestUtil.h"

namespace moec::runtime::cpu::core::testing {
namespace {

using ::testing::HasSubstr;

/// y = x / sqrt(mean(x²) + eps) * w (or (1 + w)) over contiguous groups of w.size().
std::vector<double> rmsNormReference(const std::vector<float> &x, const std::vector<float> &w,
                                     double eps, bool unitOffset) {
  size_t g = w.size();
  std::vector<double> y(x.size());
  for (size_t start = 0; start < x.size(); start += g) {
    double squares = 0;
    for (size_t j = 0; j < g; ++j)
      squares += double(x[start + j]) * x[start + j];
    double r = 1.0 / std::sqrt(squares / g + eps);
    for (size_t j = 0; j < g; ++j)
      y[start + j] = x[start + j] * r * (unitOffset ? 1.0 + w[j] : double(w[j]));
  }
  return y;
}

/// Gradients of Σ dy·y through the Jacobian dx̂_k/dx_j = r δ_kj - x_k x_j r³ / G.
void rmsNormGradReference(const std::vector<float> &x, const std::vector<float> &w,
                          const std::vector<float> &dy, double eps, bool unitOffset,
                          std::vector<double> &dx, std::vector<double> &dw) {
  size_t g = w.size();
  dx.assign(x.size(), 0.0);
  dw.assign(g, 0.0);
  for (size_t start = 0; start < x.size(); start += g) {
    double squares = 0;
    for (size_t j = 0; j < g; ++j)
      squares += double(x[start + j]) * x[start + j];
    double r = 1.0 / std::sqrt(squares / g + eps);
    for (size_t k = 0; k < g; ++k) {
      double scale = unitOffset ? 1.0 + w[k] : double(w[k]);
      dw[k] += dy[start + k] * x[start + k] * r;
      for (size_t j = 0; j < g; ++j) {
        double jacobian = (j == k ? r : 0.0) - double(x[start + k]) * x[start + j] * r * r * r / g;
        dx[start + j] += dy[start + k] * scale * jacobian;
      }
    }
  }
}

/// Weights near 1 (plain) or near 0 (unit_offset), as trained norms have them.
OwnedTensor normWeight(int64_t size, bool unitOffset, uint64_t seed) {
  std::vector<float> w = randomTensor({size}, seed, 0.3f).floats();
  if (!unitOffset)
    for (float &v : w)
      v += 1.0f;
  return floatTensor({size}, w);
}

KernelCall rmsNormCall(const std::vector<int64_t> &shape, int64_t groupSize, bool unitOffset,
                       uint64_t seed) {
  KernelCall call(registry(), "rms_norm");
  call.input(randomTensor(shape, seed, 2.0f))
      .input(normWeight(groupSize, unitOffset, seed + 1))
      .attr("eps", 1e-6)
      .output(plan::F32, shape);
  if (unitOffset)
    call.attr("unit_offset", true);
  return call;
}

struct RmsCase {
  std::vector<int64_t> shape;
  int64_t groupSize;
  bool unitOffset;
};

const std::vector<RmsCase> kRmsCases = {
    {{7, 12}, 12, false},   // whole rows, odd token count
    {{5, 24}, 8, false},    // per-head q/k norm: 3 heads of 8
    {{6, 20}, 20, true},    // Qwen3-Next's (1 + w)
    {{3, 12}, 4, true},     // per head with (1 + w)
    {{2, 3, 10}, 5, false}, // rank 3, odd group
    {{1, 1}, 1, false},     // a single feature
};

TEST(RmsNorm, MatchesReference) {
  for (const RmsCase &c : kRmsCases) {
    KernelCall call = rmsNormCall(c.shape, c.groupSize, c.unitOffset, 3);
    call.run();
    expectNear(call.result(0).floats(),
               rmsNormReference(call.inputsRef()[0].floats(), call.inputsRef()[1].floats(), 1e-6,
                                c.unitOffset),
               1e-5, "rms_norm G=" + std::to_string(c.groupSize));
  }
}

// A weight of head_dim on x [T, H*hd] normalises each head on its own: the
// result equals rms_norm run on each head's columns alone, and rescaling one
// head's inputs leaves every other head's outputs untouched.
TEST(RmsNorm, PerHeadWeightNormalisesEachHeadSeparately) {
  const int64_t tokens = 4, heads = 3, hd = 8;
  KernelCall call = rmsNormCall({tokens, heads * hd}, hd, false, 11);
  call.run();
  std::vector<float> x = call.inputsRef()[0].floats(), y = call.result(0).floats();
  for (int64_t h = 0; h < heads; ++h) {
    std::vector<float> headX, headY;
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t j = 0; j < hd; ++j) {
        headX.push_back(x[t * heads * hd + h * hd + j]);
        headY.push_back(y[t * heads * hd + h * hd + j]);
      }
    KernelCall single(registry(), "rms_norm");
    single.input(floatTensor({tokens, hd}, headX))
        .input(call.inputsRef()[1])
        .attr("eps", 1e-6)
        .output(plan::F32, {tokens, hd});
    single.run();
    EXPECT_EQ(single.result(0).floats(), headY) << "head " << h;
  }

  std::vector<float> scaled = x;
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t j = 0; j < hd; ++j)
      scaled[t * heads * hd + 1 * hd + j] *= 10.0f; // head 1 only
  call.inputsRef()[0] = floatTensor({tokens, heads * hd}, scaled);
  call.run();
  std::vector<float> y2 = call.result(0).floats();
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t f = 0; f < heads * hd; ++f) {
      if (f / hd != 1)
        EXPECT_EQ(y2[t * heads * hd + f], y[t * heads * hd + f])
            << "token " << t << " feature " << f;
      else // RMSNorm is scale-invariant within the head (up to eps)
        EXPECT_NEAR(y2[t * heads * hd + f], y[t * heads * hd + f], 1e-5);
    }
}

TEST(RmsNorm, BackwardMatchesFiniteDifferencesAndReference) {
  for (const RmsCase &c : kRmsCases) {
    std::string what = "rms_norm G=" + std::to_string(c.groupSize);
    KernelCall call = rmsNormCall(c.shape, c.groupSize, c.unitOffset, 5);
    GradientCheck check = checkGradients(registry(), call, {0, 1});
    EXPECT_LT(check.worstRelativeError, 1e-2) << what << "\n" << check.report;

    OwnedTensor dy = randomTensor(c.shape, 99);
    std::vector<double> dx, dw;
    rmsNormGradReference(call.inputsRef()[0].floats(), call.inputsRef()[1].floats(), dy.floats(),
                         1e-6, c.unitOffset, dx, dw);
    KernelCall backward = backwardOf(call, {0, 1}, {{0, dy}});
    backward.run();
    expectNear(backward.result(0).floats(), dx, 1e-4, what + " dx");
    expectNear(backward.result(1).floats(), dw, 1e-4, what + " dw");

    KernelCall weightOnly = backwardOf(call, {1}, {{0, dy}});
    weightOnly.run();
    EXPECT_EQ(weightOnly.result(0).floats(), backward.result(1).floats()) << what;
  }
}

TEST(RmsNorm, RejectsBadLaunches) {
  KernelCall notDividing = rmsNormCall({3, 12}, 5, false, 1);
  EXPECT_THAT(failureOf(notDividing),
              HasSubstr("weight size 5 does not divide the input's 12 features"));

  KernelCall noEps(registry(), "rms_norm");
  noEps.input(randomTensor({3, 4}, 1)).input(filledTensor({4}, 1)).output(plan::F32, {3, 4});
  EXPECT_THAT(failureOf(noEps), HasSubstr("missing attribute 'eps'"));

  KernelCall wrongResult = rmsNormCall({3, 4}, 4, false, 1);
  wrongResult.result(0) = zeroTensor(plan::F32, {3, 5});
  EXPECT_THAT(failureOf(wrongResult), HasSubstr("result has shape [3,5]"));

  KernelCall notF32(registry(), "rms_norm");
  notF32.input(zeroTensor(plan::BF16, {3, 4}))
      .input(filledTensor({4}, 1))
      .attr("eps", 1e-6)
      .output(plan::F32, {3, 4});
  EXPECT_THAT(failureOf(notF32), HasSubstr("input must be f32, got bf16"));

  KernelCall call = rmsNormCall({3, 4}, 4, false, 1);
  KernelCall noGrad = backwardOf(call, {0}, {});
  EXPECT_THAT(failureOf(noGrad), HasSubstr("grad_of_outputs must name result 0"));
}

/// The same bits whatever the thread count (forward and both gradients).
TEST(RmsNorm, SameBitsForAnyThreadCount) {
  ThreadPool two(2), three(3);
  std::vector<std::vector<float>> runs;
  for (ThreadPool *pool : {static_cast<ThreadPool *>(nullptr), &two, &three}) {
    KernelCall call = rmsNormCall({301, 64}, 16, true, 21);
    call.threads(pool).run();
    KernelCall backward = backwardOf(call, {0, 1}, {{0, randomTensor({301, 64}, 8)}});
    backward.threads(pool).run();
    std::vector<float> all = call.result(0).floats();
    for (int i = 0; i < 2; ++i) {
      std::vector<float> g = backward.result(i).floats();
      all.insert(all.end(), g.begin(), g.end());
    }
    runs.push_back(all);
  }
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_EQ(runs[0], runs[2]);
}

//===----------------------------------------------------------------------===//
// row_sum_of_squares and sharded_rms_norm: a norm over rows split in parts
//===----------------------------------------------------------------------===//

/// Columns [begin, begin + width) of a [rows, cols] tensor.
std::vector<float> columns(const std::vector<float> &x, int64_t rows, int64_t cols, int64_t begin, int64_t width) {
  std::vector<float> part;
  for (int64_t t = 0; t < rows; ++t)
    part.insert(part.end(), x.begin() + t * cols + begin, x.begin() + t * cols + begin + width);
  return part;
}

std::vector<double> doubles(const std::vector<float> &v) { return {v.begin(), v.end()}; }

KernelCall rowSumOfSquaresCall(OwnedTensor x) {
  int64_t rows = x.shape[0];
  KernelCall call(registry(), "row_sum_of_squares");
  call.input(std::move(x)).output(plan::F32, {rows, 1});
  return call;
}

KernelCall shardedRmsNormCall(OwnedTensor x, OwnedTensor w, OwnedTensor sumOfSquares, int64_t wholeFeatures,
                              bool unitOffset) {
  std::vector<int64_t> shape = x.shape;
  KernelCall call(registry(), "sharded_rms_norm");
  call.input(std::move(x))
      .input(std::move(w))
      .input(std::move(sumOfSquares))
      .attr("eps", 1e-6)
      .attr("features", wholeFeatures)
      .output(plan::F32, shape);
  if (unitOffset)
    call.attr("unit_offset", true);
  return call;
}

// Rows of 24 features split in parts of 10, 8 and 6 (tp ranks holding uneven heads would not
// occur, but nothing in the arithmetic depends on equal parts): the parts' sums of squares
// added, each part normalised by them, give rms_norm's rows, and the parts' gradients (with the
// sum's gradient added up over the parts and sent back through each row_sum_of_squares) give
// rms_norm's.
TEST(ShardedRmsNorm, PartsComposeToRmsNormForwardAndBackward) {
  const int64_t rows = 7, cols = 24;
  const std::vector<int64_t> widths = {10, 8, 6};
  for (bool unitOffset : {false, true}) {
    KernelCall whole = rmsNormCall({rows, cols}, cols, unitOffset, 31);
    whole.run();
    OwnedTensor dy = randomTensor({rows, cols}, 32);
    KernelCall wholeBackward = backwardOf(whole, {0, 1}, {{0, dy}});
    wholeBackward.run();
    std::vector<float> x = whole.inputsRef()[0].floats(), w = whole.inputsRef()[1].floats();

    std::vector<double> sum(rows, 0.0);
    for (int64_t begin = 0, p = 0; p < 3; begin += widths[p], ++p) {
      KernelCall part = rowSumOfSquaresCall(floatTensor({rows, widths[p]}, columns(x, rows, cols, begin, widths[p])));
      part.run();
      for (int64_t t = 0; t < rows; ++t)
        sum[t] += part.result(0).floats()[t];
    }
    std::vector<float> sumF(sum.begin(), sum.end());
    std::vector<double> sumGrad(rows, 0.0);
    std::vector<std::vector<float>> directGrads;
    for (int64_t begin = 0, p = 0; p < 3; begin += widths[p], ++p) {
      std::string what = "part " + std::to_string(p) + (unitOffset ? " (1 + w)" : "");
      std::vector<float> wPart(w.begin() + begin, w.begin() + begin + widths[p]);
      KernelCall norm = shardedRmsNormCall(floatTensor({rows, widths[p]}, columns(x, rows, cols, begin, widths[p])),
                                           floatTensor({widths[p]}, wPart), floatTensor({rows, 1}, sumF), cols,
                                           unitOffset);
      norm.run();
      expectNear(norm.result(0).floats(), doubles(columns(whole.result(0).floats(), rows, cols, begin, widths[p])),
                 1e-6, what + " y");
      KernelCall backward = backwardOf(
          norm, {0, 1, 2}, {{0, floatTensor({rows, widths[p]}, columns(dy.floats(), rows, cols, begin, widths[p]))}});
      backward.run();
      std::vector<float> dwWhole = wholeBackward.result(1).floats();
      expectNear(backward.result(1).floats(), doubles({dwWhole.begin() + begin, dwWhole.begin() + begin + widths[p]}),
                 1e-5, what + " dw");
      directGrads.push_back(backward.result(0).floats());
      for (int64_t t = 0; t < rows; ++t)
        sumGrad[t] += backward.result(2).floats()[t];
    }
    std::vector<float> sumGradF(sumGrad.begin(), sumGrad.end());
    std::vector<float> dxWhole = wholeBackward.result(0).floats();
    for (int64_t begin = 0, p = 0; p < 3; begin += widths[p], ++p) {
      KernelCall part = rowSumOfSquaresCall(floatTensor({rows, widths[p]}, columns(x, rows, cols, begin, widths[p])));
      KernelCall backward = backwardOf(part, {0}, {{0, floatTensor({rows, 1}, sumGradF)}});
      backward.run();
      std::vector<float> dx = directGrads[p]; // the executor adds a value's gradients up
      for (size_t i = 0; i < dx.size(); ++i)
        dx[i] += backward.result(0).floats()[i];
      expectNear(dx, doubles(columns(dxWhole, rows, cols, begin, widths[p])), 1e-5, "part " + std::to_string(p) + " dx");
    }
  }
}

TEST(ShardedRmsNorm, BackwardMatchesFiniteDifferences) {
  KernelCall sum = rowSumOfSquaresCall(randomTensor({5, 6}, 41, 2.0f));
  GradientCheck sumCheck = checkGradients(registry(), sum, {0});
  EXPECT_LT(sumCheck.worstRelativeError, 1e-2) << sumCheck.report;

  // A sum of squares of rows of 16 features, this part being 6 of them.
  std::vector<float> s = randomTensor({5, 1}, 42, 1.0f).floats();
  for (float &v : s)
    v = 8.0f + 4.0f * v;
  for (bool unitOffset : {false, true}) {
    KernelCall norm = shardedRmsNormCall(randomTensor({5, 6}, 43, 2.0f), normWeight(6, unitOffset, 44),
                                         floatTensor({5, 1}, s), 16, unitOffset);
    GradientCheck check = checkGradients(registry(), norm, {0, 1, 2});
    EXPECT_LT(check.worstRelativeError, 1e-2) << check.report;
  }
}

TEST(ShardedRmsNorm, RejectsBadLaunches) {
  KernelCall fewer = shardedRmsNormCall(randomTensor({3, 8}, 1), filledTensor({8}, 1), filledTensor({3, 1}, 4), 4,
                                        false);
  EXPECT_THAT(failureOf(fewer), HasSubstr("features (4, the whole rows') is less than the input's 8"));
  KernelCall wrongSum = shardedRmsNormCall(randomTensor({3, 8}, 1), filledTensor({8}, 1), filledTensor({3, 2}, 4),
                                           16, false);
  EXPECT_THAT(failureOf(wrongSum), HasSubstr("sum_of_squares"));
  KernelCall wrongWeight = shardedRmsNormCall(randomTensor({3, 8}, 1), filledTensor({4}, 1),
                                              filledTensor({3, 1}, 4), 16, false);
  EXPECT_THAT(failureOf(wrongWeight), HasSubstr("weight"));
  KernelCall narrowSum(registry(), "row_sum_of_squares");
  narrowSum.input(randomTensor({3, 8}, 1)).output(plan::BF16, {3, 1});
  EXPECT_THAT(failureOf(narrowSum), HasSubstr("result must be f32"));
}

//===----------------------------------------------------------------------===//
// layer_norm
//===----------------------------------------------------------------------===//

std::vector<double> layerNormReference(const std::vector<float> &x, const std::vector<float> &w,
                                       const std::vector<float> &b, double eps) {
  size_t f = w.size();
  std::vector<double> y(x.size());
  for (size_t start = 0; start < x.size(); start += f) {
    double mean = 0, var = 0;
    for (size_t j = 0; j < f; ++j)
      mean += x[start + j] / double(f);
    for (size_t j = 0; j < f; ++j)
      var += (x[start + j] - mean) * (x[start + j] - mean) / f;
    for (size_t j = 0; j < f; ++j)
      y[start + j] = (x[start + j] - mean) / std::sqrt(var + eps) * w[j] + b[j];
  }
  return y;
}

KernelCall layerNormCall(const std::vector<int64_t> &shape, uint64_t seed) {
  int64_t f = shape.back();
  KernelCall call(registry(), "layer_norm");
  call.input(randomTensor(shape, seed, 2.0f))
      .input(normWeight(f, false, seed + 1))
      .input(randomTensor({f}, seed + 2, 0.5f))
      .attr("eps", 1e-6)
      .output(plan::F32, shape);
  return call;
}

TEST(LayerNorm, MatchesReference) {
  for (const std::vector<int64_t> &shape :
       std::vector<std::vector<int64_t>>{{7, 12}, {2, 3, 5}, {1, 2}}) {
    KernelCall call = layerNormCall(shape, 4);
    call.run();
    expectNear(call.result(0).floats(),
               layerNormReference(call.inputsRef()[0].floats(), call.inputsRef()[1].floats(),
                                  call.inputsRef()[2].floats(), 1e-6),
               1e-5, "layer_norm");
  }
}

TEST(LayerNorm, BackwardMatchesFiniteDifferencesAndReference) {
  const int64_t rows = 5, f = 9;
  KernelCall call = layerNormCall({rows, f}, 6);
  GradientCheck check = checkGradients(registry(), call, {0, 1, 2});
  EXPECT_LT(check.worstRelativeError, 1e-2) << check.report;

  // Reference: dx̂_k/dx_j = r (δ_kj - 1/F) - x̂_k x̂_j r / F.
  std::vector<float> x = call.inputsRef()[0].floats(), w = call.inputsRef()[1].floats();
  OwnedTensor dyTensor = randomTensor({rows, f}, 98);
  std::vector<float> dy = dyTensor.floats();
  std::vector<double> dx(rows * f, 0.0), dw(f, 0.0), db(f, 0.0);
  for (int64_t t = 0; t < rows; ++t) {
    double mean = 0, var = 0;
    for (int64_t j = 0; j < f; ++j)
      mean += x[t * f + j] / double(f);
    for (int64_t j = 0; j < f; ++j)
      var += (x[t * f + j] - mean) * (x[t * f + j] - mean) / f;
    double r = 1.0 / std::sqrt(var + 1e-6);
    for (int64_t k = 0; k < f; ++k) {
      double xk = (x[t * f + k] - mean) * r;
      dw[k] += dy[t * f + k] * xk;
      db[k] += dy[t * f + k];
      for (int64_t j = 0; j < f; ++j) {
        double xj = (x[t * f + j] - mean) * r;
        double jacobian = r * ((j == k ? 1.0 : 0.0) - 1.0 / f) - xk * xj * r / f;
        dx[t * f + j] += dy[t * f + k] * w[k] * jacobian;
      }
    }
  }
  KernelCall backward = backwardOf(call, {0, 1, 2}, {{0, dyTensor}});
  backward.run();
  expectNear(backward.result(0).floats(), dx, 1e-4, "layer_norm dx");
  expectNear(backward.result(1).floats(), dw, 1e-4, "layer_norm dw");
  expectNear(backward.result(2).floats(), db, 1e-4, "layer_norm db");
}

TEST(LayerNorm, RejectsBadLaunches) {
  KernelCall wrongBias = layerNormCall({3, 4}, 1);
  wrongBias.inputsRef()[2] = filledTensor({5}, 0);
  EXPECT_THAT(failureOf(wrongBias), HasSubstr("bias has shape [5], expected [4]"));

  KernelCall noBias(registry(), "layer_norm");
  noBias.input(randomTensor({3, 4}, 1))
      .input(filledTensor({4}, 1))
      .attr("eps", 1e-6)
      .output(plan::F32, {3, 4});
  EXPECT_THAT(failureOf(noBias), HasSubstr("expected at least 3 inputs, got 2"));

  KernelCall call = layerNormCall({3, 4}, 1);
  KernelCall wrongGrad = backwardOf(call, {1}, {{0, randomTensor({3, 4}, 2)}});
  wrongGrad.result(0) = zeroTensor(plan::F32, {5});
  EXPECT_THAT(
      failureOf(wrongGrad),
      HasSubstr("the gradient of operand 1 has shape [5], expected the shape of operand 1 [4]"));
}

} // namespace
} // namespace moec::runtime::cpu::core::testing
