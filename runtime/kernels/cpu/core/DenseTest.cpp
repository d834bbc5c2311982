//===- DenseTest.cpp - linear and lora against naive references -----------===//

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/kernels/cpu/core/CoreCommon.h"
#include "runtime/kernels/cpu/core/CoreTestUtil.h"

namespace moec::runtime::cpu::core::testing {
namespace {

using ::testing::HasSubstr;

/// y[r, o] = Σ_i x[r, i] w[o, i] (+ b[o]), in double.
std::vector<double> linearReference(const std::vector<float> &x, const std::vector<float> &w,
                                    const std::vector<float> *b, int64_t in, int64_t out) {
  int64_t rows = static_cast<int64_t>(x.size()) / in;
  std::vector<double> y(rows * out);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double sum = b ? (*b)[o] : 0.0;
      for (int64_t i = 0; i < in; ++i)
        sum += double(x[r * in + i]) * w[o * in + i];
      y[r * out + o] = sum;
    }
  return y;
}

/// Σ_r a[r, i] b[r, j] for a [rows, m], b [rows, n]: the weight gradients.
std::vector<double> transposedProduct(const std::vector<float> &a, const std::vector<double> &b,
                                      int64_t m, int64_t n) {
  int64_t rows = static_cast<int64_t>(a.size()) / m;
  std::vector<double> c(m * n, 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j)
        c[i * n + j] += a[r * m + i] * b[r * n + j];
  return c;
}

/// Σ_j a[r, j] w[j, i] for a [rows, k], w [k, n]: the input gradients.
std::vector<double> product(const std::vector<double> &a, const std::vector<float> &w, int64_t k,
                            int64_t n) {
  int64_t rows = static_cast<int64_t>(a.size()) / k;
  std::vector<double> c(rows * n, 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < k; ++j)
      for (int64_t i = 0; i < n; ++i)
        c[r * n + i] += a[r * k + j] * w[j * n + i];
  return c;
}

KernelCall linearCall(std::vector<int64_t> xShape, int64_t out, bool bias, uint64_t seed) {
  int64_t in = xShape.back();
  std::vector<int64_t> yShape = xShape;
  yShape.back() = out;
  KernelCall call(registry(), "linear");
  call.input(randomTensor(xShape, seed)).input(randomTensor({out, in}, seed + 1, 0.5f));
  if (bias)
    call.input(randomTensor({out}, seed + 2));
  call.output(plan::F32, yShape);
  return call;
}

struct LinearCase {
  std::vector<int64_t> xShape;
  int64_t out;
  bool bias;
};

const std::vector<LinearCase> kLinearCases = {
    {{5, 7}, 3, false}, {{5, 7}, 3, true}, {{2, 3, 4}, 5, true}, {{4}, 6, false}, {{1, 1}, 1, true},
};

TEST(Linear, MatchesReference) {
  for (const LinearCase &c : kLinearCases) {
    KernelCall call = linearCall(c.xShape, c.out, c.bias, 1);
    call.run();
    std::vector<float> bias = c.bias ? call.inputsRef()[2].floats() : std::vector<float>();
    expectNear(call.result(0).floats(),
               linearReference(call.inputsRef()[0].floats(), call.inputsRef()[1].floats(),
                               c.bias ? &bias : nullptr, c.xShape.back(), c.out),
               1e-5, "linear");
  }
}

TEST(Linear, BackwardMatchesFiniteDifferencesAndReference) {
  for (const LinearCase &c : kLinearCases) {
    KernelCall call = linearCall(c.xShape, c.out, c.bias, 2);
    std::vector<int64_t> wrt = c.bias ? std::vector<int64_t>{0, 1, 2} : std::vector<int64_t>{0, 1};
    GradientCheck check = checkGradients(registry(), call, wrt);
    EXPECT_LT(check.worstRelativeError, 1e-2) << check.report;

    int64_t in = c.xShape.back();
    OwnedTensor dy = randomTensor(call.result(0).shape, 50);
    std::vector<double> dyd = widen(dy), db(c.out, 0.0);
    for (size_t i = 0; i < dyd.size(); ++i)
      db[i % c.out] += dyd[i];
    KernelCall backward = backwardOf(call, wrt, {{0, dy}});
    backward.run();
    expectNear(backward.result(0).floats(), product(dyd, call.inputsRef()[1].floats(), c.out, in),
               1e-5, "linear dx");
    expectNear(backward.result(1).floats(),
               transposedProduct(dy.floats(), widen(call.inputsRef()[0]), c.out, in), 1e-5,
               "linear dw");
    if (c.bias)
      expectNear(backward.result(2).floats(), db, 1e-5, "linear db");

    // Any subset of the gradients, in the order asked.
    std::vector<int64_t> subset = c.bias ? std::vector<int64_t>{2, 1} : std::vector<int64_t>{1};
    KernelCall some = backwardOf(call, subset, {{0, dy}});
    some.run();
    EXPECT_EQ(some.result(subset.size() - 1).floats(), backward.result(1).floats());
    if (c.bias) {
      EXPECT_EQ(some.result(0).floats(), backward.result(2).floats());
    }
  }
}

TEST(Linear, RejectsBadLaunches) {
  KernelCall wrongIn = linearCall({5, 7}, 3, false, 1);
  wrongIn.inputsRef()[1] = randomTensor({3, 6}, 1);
  EXPECT_THAT(failureOf(wrongIn), HasSubstr("input has shape [5,7], expected 6 features"));

  KernelCall wrongBias = linearCall({5, 7}, 3, true, 1);
  wrongBias.inputsRef()[2] = randomTensor({4}, 1);
  EXPECT_THAT(failureOf(wrongBias), HasSubstr("bias has shape [4], expected [3]"));

  KernelCall wrongResult = linearCall({5, 7}, 3, false, 1);
  wrongResult.result(0) = zeroTensor(plan::F32, {5, 4});
  EXPECT_THAT(failureOf(wrongResult), HasSubstr("result has shape [5,4], expected [5,3]"));

  KernelCall tooMany = linearCall({5, 7}, 3, true, 1);
  tooMany.input(randomTensor({3}, 1));
  EXPECT_THAT(failureOf(tooMany), HasSubstr("expected 2 or 3 operands"));

  KernelCall call = linearCall({5, 7}, 3, false, 1);
  KernelCall wrongGrad = backwardOf(call, {0}, {{0, randomTensor({5, 4}, 1)}});
  EXPECT_THAT(failureOf(wrongGrad),
              HasSubstr("the result gradient has shape [5,4], expected [5,3]"));
  KernelCall badSegments = backwardOf(call, {0}, {{0, randomTensor({5, 3}, 1)}});
  badSegments.attr("backward_segments", std::vector<int64_t>{3, 0, 1});
  EXPECT_THAT(failureOf(badSegments), HasSubstr("backward_segments [3,0,1] do not match 3 inputs"));
}

//===----------------------------------------------------------------------===//
// lora
//===----------------------------------------------------------------------===//

KernelCall loraCall(int64_t rows, int64_t in, int64_t rank, int64_t out, double scale,
                    uint64_t seed) {
  KernelCall call(registry(), "lora");
  call.input(randomTensor({rows, in}, seed))
      .input(randomTensor({rank, in}, seed + 1, 0.5f))
      .input(randomTensor({out, rank}, seed + 2, 0.5f))
      .attr("scale", scale)
      .output(plan::F32, {rows, out});
  return call;
}

TEST(Lora, MatchesReference) {
  for (double scale : {2.0, 0.5}) {
    const int64_t rows = 6, in = 10, rank = 3, out = 7;
    KernelCall call = loraCall(rows, in, rank, out, scale, 7);
    call.run();
    std::vector<float> x = call.inputsRef()[0].floats(), a = call.inputsRef()[1].floats(),
                       b = call.inputsRef()[2].floats();
    std::vector<double> want(rows * out, 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t o = 0; o < out; ++o)
        for (int64_t k = 0; k < rank; ++k) {
          double h = 0;
          for (int64_t i = 0; i < in; ++i)
            h += double(x[r * in + i]) * a[k * in + i];
          want[r * out + o] += scale * h * b[o * rank + k];
        }
    expectNear(call.result(0).floats(), want, 1e-5, "lora");

    // dropout = 0 (what the plan carries when the adapter has none) is the same launch.
    KernelCall noDropout = loraCall(rows, in, rank, out, scale, 7);
    noDropout.attr("dropout", 0.0).run();
    EXPECT_EQ(noDropout.result(0).floats(), call.result(0).floats());
  }
}

TEST(Lora, BackwardMatchesFiniteDifferencesAndReference) {
  const int64_t rows = 5, in = 6, rank = 2, out = 4;
  const double scale = 2.0;
  KernelCall call = loraCall(rows, in, rank, out, scale, 3);
  GradientCheck check = checkGradients(registry(), call, {0, 1, 2});
  EXPECT_LT(check.worstRelativeError, 1e-2) << check.report;

  // h = x Aᵀ; dh = scale dy B; dx = dh A; dA = dhᵀ x; dB = scale dyᵀ h.
  std::vector<float> x = call.inputsRef()[0].floats(), a = call.inputsRef()[1].floats(),
                     b = call.inputsRef()[2].floats();
  OwnedTensor dyTensor = randomTensor({rows, out}, 60);
  std::vector<double> dy = widen(dyTensor), h(rows * rank, 0.0), dh(rows * rank, 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < rank; ++k) {
      for (int64_t i = 0; i < in; ++i)
        h[r * rank + k] += double(x[r * in + i]) * a[k * in + i];
      for (int64_t o = 0; o < out; ++o)
        dh[r * rank + k] += scale * dy[r * out + o] * b[o * rank + k];
    }
  std::vector<double> dB = transposedProduct(dyTensor.floats(), h, out, rank);
  for (double &v : dB)
    v *= scale;
  std::vector<float> dhf(dh.begin(), dh.end());
  KernelCall backward = backwardOf(call, {0, 1, 2}, {{0, dyTensor}});
  backward.run();
  expectNear(backward.result(0).floats(), product(dh, a, rank, in), 1e-5, "lora dx");
  expectNear(backward.result(1).floats(),
             transposedProduct(dhf, widen(call.inputsRef()[0]), rank, in), 1e-5, "lora dA");
  expectNear(backward.result(2).floats(), dB, 1e-5, "lora dB");

  // The training step asks for the adapter's gradients only.
  KernelCall adapterOnly = backwardOf(call, {1, 2}, {{0, dyTensor}});
  adapterOnly.run();
  EXPECT_EQ(adapterOnly.result(0).floats(), backward.result(1).floats());
  EXPECT_EQ(adapterOnly.result(1).floats(), backward.result(2).floats());
}

TEST(Lora, RefusesDropout) {
  KernelCall call = loraCall(3, 4, 2, 5, 2.0, 1);
  call.attr("dropout", 0.1);
  EXPECT_THAT(failureOf(call),
              HasSubstr("lora dropout 0.1 is not supported by the CPU backend yet"));
  KernelCall backward = backwardOf(call, {1}, {{0, randomTensor({3, 5}, 2)}});
  EXPECT_THAT(failureOf(backward), HasSubstr("is not supported by the CPU backend yet"));
}

TEST(Lora, RejectsBadLaunches) {
  KernelCall wrongRank = loraCall(3, 4, 2, 5, 2.0, 1);
  wrongRank.inputsRef()[2] = randomTensor({5, 3}, 1);
  EXPECT_THAT(failureOf(wrongRank), HasSubstr("lora_b has shape [5,3], expected [?,2]"));

  KernelCall wrongIn = loraCall(3, 4, 2, 5, 2.0, 1);
  wrongIn.inputsRef()[1] = randomTensor({2, 6}, 1);
  EXPECT_THAT(failureOf(wrongIn), HasSubstr("input has shape [3,4], expected 6 features"));

  KernelCall noScale(registry(), "lora");
  noScale.input(randomTensor({3, 4}, 1))
      .input(randomTensor({2, 4}, 2))
      .input(randomTensor({5, 2}, 3))
      .output(plan::F32, {3, 5});
  EXPECT_THAT(failureOf(noScale), HasSubstr("missing attribute 'scale'"));
}

//===----------------------------------------------------------------------===//
// lora_linear: the projection and its update in one (--moe-fuse-lora)
//===----------------------------------------------------------------------===//

KernelCall loraLinearCall(int64_t rows, int64_t in, int64_t rank, int64_t out, double scale, uint64_t seed) {
  KernelCall call(registry(), "lora_linear");
  call.input(randomTensor({rows, in}, seed))
      .input(randomTensor({out, in}, seed + 3, 0.5f))
      .input(randomTensor({rank, in}, seed + 1, 0.5f))
      .input(randomTensor({out, rank}, seed + 2, 0.5f))
      .attr("scale", scale)
      .output(plan::F32, {rows, out});
  return call;
}

/// What the fused op replaces: linear(x, W) + lora(x, A, B), each the tested kernel above.
std::vector<double> unfusedForward(KernelCall &fused, double scale) {
  const std::vector<OwnedTensor> &in = fused.inputsRef();
  int64_t rows = in[0].shape[0], out = in[1].shape[0];
  KernelCall linear(registry(), "linear");
  linear.input(in[0]).input(in[1]).output(plan::F32, {rows, out}).run();
  KernelCall lora(registry(), "lora");
  lora.input(in[0]).input(in[2]).input(in[3]).attr("scale", scale).output(plan::F32, {rows, out}).run();
  std::vector<double> sum = widen(linear.result(0));
  std::vector<float> update = lora.result(0).floats();
  for (size_t i = 0; i < sum.size(); ++i)
    sum[i] += update[i];
  return sum;
}

TEST(LoraLinear, EqualsTheProjectionPlusItsUpdate) {
  for (double scale : {2.0, 0.5}) {
    KernelCall call = loraLinearCall(6, 10, 3, 7, scale, 11);
    call.run();
    expectNear(call.result(0).floats(), unfusedForward(call, scale), 1e-5, "lora_linear");
  }
}

// base_type bf16: the projection's part is rounded before the update is added, as the unfused
// linear's bf16 result was (and the input gradient's projection part likewise).
TEST(LoraLinear, RoundsTheProjectionWhereItsUnfusedResultWas) {
  KernelCall call = loraLinearCall(6, 10, 3, 7, 2.0, 12);
  call.attr("base_type", "bf16").run();
  const std::vector<OwnedTensor> &in = call.inputsRef();
  KernelCall linear(registry(), "linear");
  linear.input(in[0]).input(in[1]).output(plan::F32, {6, 7}).run();
  KernelCall lora(registry(), "lora");
  lora.input(in[0]).input(in[2]).input(in[3]).attr("scale", 2.0).output(plan::F32, {6, 7}).run();
  std::vector<float> y = linear.result(0).floats(), update = lora.result(0).floats();
  std::vector<double> want(y.size());
  for (size_t i = 0; i < y.size(); ++i)
    want[i] = double(core::roundToBf16(y[i])) + update[i];
  expectNear(call.result(0).floats(), want, 1e-6, "lora_linear, base_type bf16");

  OwnedTensor dy = randomTensor({6, 7}, 65);
  KernelCall backward = backwardOf(call, {0}, {{0, dy}});
  backward.run();
  KernelCall linearBackward = backwardOf(linear, {0}, {{0, dy}});
  KernelCall loraBackward = backwardOf(lora, {0}, {{0, dy}});
  linearBackward.run();
  loraBackward.run();
  std::vector<float> dxBase = linearBackward.result(0).floats(), dxLora = loraBackward.result(0).floats();
  std::vector<double> dx(dxBase.size());
  for (size_t i = 0; i < dx.size(); ++i)
    dx[i] = double(core::roundToBf16(dxBase[i])) + dxLora[i];
  expectNear(backward.result(0).floats(), dx, 1e-6, "lora_linear dx, base_type bf16");

  KernelCall bad = loraLinearCall(6, 10, 3, 7, 2.0, 12);
  bad.attr("base_type", "f16");
  EXPECT_THAT(failureOf(bad), HasSubstr("base_type must be f32 or bf16, got f16"));
}

TEST(LoraLinear, BackwardEqualsTheUnfusedPairsAndFiniteDifferences) {
  const int64_t rows = 5, in = 6, rank = 2, out = 4;
  const double scale = 2.0;
  KernelCall call = loraLinearCall(rows, in, rank, out, scale, 5);
  GradientCheck check = checkGradients(registry(), call, {0, 1, 2, 3});
  EXPECT_LT(check.worstRelativeError, 1e-2) << check.report;

  // dx = linear's dx + lora's dx; dW is linear's, dA and dB lora's.
  const std::vector<OwnedTensor> &in_ = call.inputsRef();
  OwnedTensor dy = randomTensor({rows, out}, 61);
  KernelCall linear(registry(), "linear");
  linear.input(in_[0]).input(in_[1]).output(plan::F32, {rows, out});
  KernelCall lora(registry(), "lora");
  lora.input(in_[0]).input(in_[2]).input(in_[3]).attr("scale", scale).output(plan::F32, {rows, out});
  KernelCall linearBackward = backwardOf(linear, {0, 1}, {{0, dy}});
  KernelCall loraBackward = backwardOf(lora, {0, 1, 2}, {{0, dy}});
  linearBackward.run();
  loraBackward.run();
  KernelCall backward = backwardOf(call, {0, 1, 2, 3}, {{0, dy}});
  backward.run();
  std::vector<double> dx = widen(linearBackward.result(0));
  std::vector<float> loraDx = loraBackward.result(0).floats();
  for (size_t i = 0; i < dx.size(); ++i)
    dx[i] += loraDx[i];
  expectNear(backward.result(0).floats(), dx, 1e-5, "lora_linear dx");
  expectNear(backward.result(1).floats(), widen(linearBackward.result(1)), 1e-5, "lora_linear dW");
  expectNear(backward.result(2).floats(), widen(loraBackward.result(1)), 1e-5, "lora_linear dA");
  expectNear(backward.result(3).floats(), widen(loraBackward.result(2)), 1e-5, "lora_linear dB");

  // What the training step asks for (the weight frozen): the same values.
  KernelCall asked = backwardOf(call, {0, 2, 3}, {{0, dy}});
  asked.run();
  EXPECT_EQ(asked.result(0).floats(), backward.result(0).floats());
  EXPECT_EQ(asked.result(1).floats(), backward.result(2).floats());
  EXPECT_EQ(asked.result(2).floats(), backward.result(3).floats());
}

TEST(LoraLinear, RejectsBadLaunches) {
  KernelCall wrongOut = loraLinearCall(3, 4, 2, 5, 2.0, 1);
  wrongOut.inputsRef()[3] = randomTensor({6, 2}, 1);
  EXPECT_THAT(failureOf(wrongOut), HasSubstr("lora_b has 6 output features, the weight 5"));

  KernelCall wrongIn = loraLinearCall(3, 4, 2, 5, 2.0, 1);
  wrongIn.inputsRef()[2] = randomTensor({2, 6}, 1);
  EXPECT_THAT(failureOf(wrongIn), HasSubstr("input has shape [3,4], expected 6 features"));

  KernelCall missing = loraLinearCall(3, 4, 2, 5, 2.0, 1);
  missing.inputsRef().pop_back();
  EXPECT_THAT(failureOf(missing), HasSubstr("expected 4 operands (input, weight, lora_a, lora_b), got 3"));

  KernelCall dropout = loraLinearCall(3, 4, 2, 5, 2.0, 1);
  dropout.attr("dropout", 0.1);
  EXPECT_THAT(failureOf(dropout), HasSubstr("lora dropout 0.1 is not supported by the CPU backend yet"));
}

} // namespace
} // namespace moec::runtime::cpu::core::testing
