//===- RopeTest.cpp - rope and rope.backward against a naive reference ----===//

#include <gtest/gtest.h>

#include "runtime/kernels/cpu/CpuKernels.h"
#include "runtime/kernels/cpu/attention/Reference.h"
#include "runtime/kernels/cpu/attention/Rope.h"
#include "runtime/kernels/testing/KernelTesting.h"

namespace moec::runtime::cpu::attention {
namespace {

using namespace testing;
namespace ref = reference;

class RopeTest : public ::testing::Test {
protected:
  void SetUp() override { registerAttentionKernels(registry); }

  /// rope over 2 sequences of `len` tokens with `heads` heads of `headDim`.
  KernelCall call(const ref::Rope &r, int64_t heads, int64_t headDim, int64_t len,
                  const std::vector<int64_t> &positions, plan::DType posType = plan::I64) {
    int64_t tokens = 2 * len;
    KernelCall c(registry, "rope");
    c.input(randomTensor({tokens, heads * headDim}, 7))
        .input(indexTensor(posType, {tokens}, positions))
        .output(plan::F32, {tokens, heads * headDim})
        .attr("head_dim", headDim)
        .attr("rope.theta", r.theta)
        .attr("rope.dim", r.dim)
        .attr("rope.style", r.interleaved ? "interleaved" : "half")
        .sequences(len, 2);
    if (r.yarn)
      c.attr("rope.yarn.factor", r.factor)
          .attr("rope.yarn.original_max_position", r.originalMax)
          .attr("rope.yarn.beta_fast", r.betaFast)
          .attr("rope.yarn.beta_slow", r.betaSlow)
          .attr("rope.yarn.mscale", r.mscale)
          .attr("rope.yarn.mscale_all_dim", r.mscaleAllDim);
    if (r.yarn && !r.truncate)
      c.attr("rope.yarn.truncate", false);
    return c;
  }

  /// Runs the kernel and compares every head of every token with ref::rope.
  void expectMatches(const ref::Rope &r, int64_t heads, int64_t headDim,
                     const std::vector<int64_t> &positions, double tolerance = 2e-5) {
    int64_t tokens = static_cast<int64_t>(positions.size());
    KernelCall c = call(r, heads, headDim, tokens / 2, positions);
    c.run();
    std::vector<float> x = c.inputsRef()[0].floats(), y = c.result(0).floats();
    int64_t width = heads * headDim;
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t h = 0; h < heads; ++h) {
        ref::Vec head = ref::slice(x, width, t, 1, h * headDim, headDim)[0];
        ref::Vec want = ref::rope(r, head, static_cast<double>(positions[t]));
        EXPECT_LT(ref::maxError(y, width, t, h * headDim, {want}), tolerance)
            << "token " << t << " head " << h;
      }
  }

  KernelRegistry registry;
};

std::vector<int64_t> positionsOf(int64_t len, int64_t offset) {
  std::vector<int64_t> p;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < len; ++t)
      p.push_back(t * 3 + b * offset);
  return p;
}

TEST_F(RopeTest, HalfFullHeadMatchesReference) {
  ref::Rope r;
  r.dim = 8;
  expectMatches(r, 3, 8, positionsOf(5, 11));
}

TEST_F(RopeTest, PartialRotationKeepsTheRest) {
  // Qwen3-Next: a quarter of the head rotates.
  ref::Rope r;
  r.theta = 1e6;
  r.dim = 4;
  expectMatches(r, 2, 16, positionsOf(6, 40));
}

TEST_F(RopeTest, InterleavedMatchesPermutedRotateHalf) {
  ref::Rope r;
  r.dim = 6;
  r.interleaved = true;
  expectMatches(r, 2, 10, positionsOf(4, 7));
}

TEST_F(RopeTest, InterleavedEqualsTransformersDeepseekLayout) {
  // transformers 5.17 apply_rotary_pos_emb_interleave on x = 0..7 (theta 1e4,
  // dim 8) at positions 0, 1, 2: rotated even features, then rotated odd ones.
  const float expected[3][8] = {{0.0f, 2.0f, 4.0f, 6.0f, 1.0f, 3.0f, 5.0f, 7.0f},
                                {-0.8414709568f, 1.6905081272f, 3.9498007298f, 5.9929971695f,
                                 0.5403023362f, 3.1846792698f, 5.0397496223f, 7.0059967041f},
                                {-0.9092974067f, 1.3641252518f, 3.8992068768f, 5.9859881401f,
                                 -0.4161468446f, 3.3375384808f, 5.0789947510f, 7.0119862556f}};
  KernelCall c(registry, "rope");
  std::vector<float> x;
  for (int t = 0; t < 3; ++t)
    for (int i = 0; i < 8; ++i)
      x.push_back(static_cast<float>(i));
  c.input(floatTensor({3, 8}, x))
      .input(indexTensor(plan::I32, {3}, {0, 1, 2}))
      .output(plan::F32, {3, 8})
      .attr("head_dim", 8)
      .attr("rope.theta", 10000.0)
      .attr("rope.dim", 8)
      .attr("rope.style", "interleaved");
  c.run();
  std::vector<float> y = c.result(0).floats();
  for (int t = 0; t < 3; ++t)
    for (int i = 0; i < 8; ++i)
      EXPECT_NEAR(y[t * 8 + i], expected[t][i], 1e-6) << t << "," << i;
}

TEST_F(RopeTest, InterleavedDotProductsEqualDeepseekComplexRotation) {
  // What attention sees: q·k after rotation equals DeepSeek's in-place
  // adjacent-pair rotation, whatever the layout of the rotated features.
  ref::Rope r;
  r.dim = 8;
  r.interleaved = true;
  KernelCall c = call(r, 1, 8, 3, {0, 5, 9, 2, 17, 30});
  c.run();
  std::vector<float> x = c.inputsRef()[0].floats(), y = c.result(0).floats();
  std::vector<int64_t> pos = {0, 5, 9, 2, 17, 30};
  for (int64_t a = 0; a < 6; ++a)
    for (int64_t b = 0; b < 6; ++b) {
      ref::Vec xa = ref::slice(x, 8, a, 1, 0, 8)[0], xb = ref::slice(x, 8, b, 1, 0, 8)[0];
      double want = ref::dot(ref::complexRope(r, xa, pos[a]), ref::complexRope(r, xb, pos[b]));
      double got = ref::dot(ref::slice(y, 8, a, 1, 0, 8)[0], ref::slice(y, 8, b, 1, 0, 8)[0]);
      EXPECT_NEAR(got, want, 1e-5);
    }
}

TEST_F(RopeTest, YarnFrequenciesEqualTransformers) {
  // transformers 5.17 _compute_yarn_parameters (head_dim 8): inv_freq and attention factor.
  struct Case {
    double theta, factor, betaFast, mscale, mscaleAllDim;
    float inv[4];
    float factorOut;
  } cases[] = {
      {1e4, 4, 32, 1, 0, {1.0f, 0.0625f, 0.0025f, 0.00025f}, 1.138629436f},
      {1e4, 40, 32, 1, 1, {1.0f, 0.1f, 0.005124999676f, 2.499999937e-05f}, 1.0f},
      {5e4, 32, 1, 1, 0.7, {1.0f, 0.06687403470f, 0.004472136032f, 9.345930266e-06f}, 1.083672904f},
      // gpt-oss: truncate = false, mscale and mscale_all_dim unset (1 and 0 here).
      {1.5e5, 32, 32, 1, 0, {1.0f, 0.0508132726f, 0.000456483918f, 4.09997847e-06f}, 1.34657359f},
  };
  int64_t originalMax[] = {64, 4096, 4096, 4096};
  for (int i = 0; i < 4; ++i) {
    const Case &c = cases[i];
    RopeSpec spec;
    spec.theta = c.theta;
    spec.dim = 8;
    spec.yarn =
        YarnParams{c.factor, c.betaFast, 1, c.mscale, c.mscaleAllDim, originalMax[i], i != 3};
    std::vector<float> inv = inverseFrequencies(spec);
    for (int j = 0; j < 4; ++j)
      EXPECT_NEAR(inv[j], c.inv[j], 1e-6 * c.inv[j]) << "case " << i << " frequency " << j;
    EXPECT_NEAR(attentionFactor(spec), c.factorOut, 1e-6) << "case " << i;
  }
}

TEST_F(RopeTest, YarnMatchesReference) {
  ref::Rope r;
  r.dim = 8;
  r.yarn = true;
  r.factor = 4;
  r.originalMax = 64;
  expectMatches(r, 2, 12, positionsOf(5, 23)); // attention factor 1.1386 on cos and sin
  r.interleaved = true;
  r.theta = 5e4;
  r.factor = 32;
  r.betaFast = 1;
  r.originalMax = 4096;
  r.mscale = 1;
  r.mscaleAllDim = 0.7;
  expectMatches(r, 1, 8, positionsOf(4, 500));
  r.truncate = false; // gpt-oss
  r.interleaved = false;
  r.theta = 1.5e5;
  r.betaFast = 32;
  r.mscaleAllDim = 0;
  expectMatches(r, 2, 16, positionsOf(5, 300));
}

TEST_F(RopeTest, BackwardMatchesNumericGradients) {
  ref::Rope r;
  r.dim = 6;
  for (bool interleaved : {false, true}) {
    r.interleaved = interleaved;
    r.yarn = interleaved;
    r.factor = 8;
    r.originalMax = 32;
    KernelCall c = call(r, 2, 10, 4, positionsOf(4, 9));
    GradientCheck check = checkGradients(registry, c, {0});
    EXPECT_LT(check.worstRelativeError, 1e-2) << check.report;
  }
}

TEST_F(RopeTest, BackwardIsTheTransposedRotation) {
  // For the half style, Rᵀ at position p is the rotation at -p (times the attention factor).
  ref::Rope r;
  r.dim = 4;
  r.yarn = true;
  r.factor = 4;
  r.originalMax = 64;
  std::vector<int64_t> pos = positionsOf(3, 5);
  KernelCall forward = call(r, 2, 6, 3, pos);
  KernelCall backward(registry, "rope.backward");
  backward.input(forward.inputsRef()[0])
      .input(forward.inputsRef()[1])
      .input(randomTensor({6, 12}, 99))
      .output(plan::F32, {6, 12})
      .sequences(3, 2);
  backward.attributes() = forward.attributes();
  backward.attr("grad_of_inputs", std::vector<int64_t>{0})
      .attr("grad_of_outputs", std::vector<int64_t>{0})
      .attr("backward_segments", std::vector<int64_t>{2, 0, 1});
  backward.run();
  std::vector<float> dy = backward.inputsRef()[2].floats(), dx = backward.result(0).floats();
  for (int64_t t = 0; t < 6; ++t)
    for (int64_t h = 0; h < 2; ++h) {
      ref::Vec want = ref::rope(r, ref::slice(dy, 12, t, 1, h * 6, 6)[0], -double(pos[t]));
      EXPECT_LT(ref::maxError(dx, 12, t, h * 6, {want}), 1e-5) << t << "," << h;
    }
}

TEST_F(RopeTest, ThreadsChangeNothing) {
  ref::Rope r;
  r.dim = 6;
  r.interleaved = true;
  KernelCall serial = call(r, 3, 8, 7, positionsOf(7, 4)),
             parallel = call(r, 3, 8, 7, positionsOf(7, 4));
  ThreadPool pool(3);
  parallel.threads(&pool);
  serial.run();
  parallel.run();
  EXPECT_EQ(serial.result(0).floats(), parallel.result(0).floats());
}

TEST_F(RopeTest, BadLaunchesFailWithAMessage) {
  ref::Rope r;
  r.dim = 4;
  auto expectFailure = [&](KernelCall c, const std::string &text) {
    try {
      c.run();
      ADD_FAILURE() << "no failure, expected: " << text;
    } catch (const KernelError &e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  KernelCall missing = call(r, 2, 8, 2, positionsOf(2, 0));
  missing.attributes().erase("rope.theta");
  expectFailure(missing, "rope.theta");
  r.dim = 5;
  expectFailure(call(r, 2, 8, 2, positionsOf(2, 0)), "rope.dim");
  r.dim = 10;
  expectFailure(call(r, 2, 8, 2, positionsOf(2, 0)), "at most 8");
  r.dim = 4;
  KernelCall style = call(r, 2, 8, 2, positionsOf(2, 0));
  style.attr("rope.style", "yarn");
  expectFailure(style, "supported: half, interleaved");
  KernelCall headDim = call(r, 2, 8, 2, positionsOf(2, 0));
  headDim.attr("head_dim", 3);
  expectFailure(headDim, "multiple of head_dim");
  KernelCall positions(registry, "rope");
  positions.input(randomTensor({4, 8}, 1))
      .input(indexTensor(plan::I64, {3}, {0, 1, 2}))
      .output(plan::F32, {4, 8})
      .attributes() = call(r, 1, 8, 2, positionsOf(2, 0)).attributes();
  expectFailure(positions, "positions has shape [3]");
  KernelCall dtype(registry, "rope");
  dtype.input(zeroTensor(plan::BF16, {4, 8}))
      .input(indexTensor(plan::I64, {4}, {0, 1, 2, 3}))
      .output(plan::F32, {4, 8})
      .attributes() = call(r, 1, 8, 2, positionsOf(2, 0)).attributes();
  expectFailure(dtype, "input must be f32");
  KernelCall yarn = call(r, 2, 8, 2, positionsOf(2, 0));
  yarn.attr("rope.yarn.factor", 4.0);
  expectFailure(yarn, "rope.yarn.original_max_position");
}

} // namespace
} // namespace moec::runtime::cpu::attention
