//===- RouterTest.cpp - CUDA router (and backward) against the CPU router -===//
//
// The CPU router tests' cases plus larger expert counts (64, 256, 896, with
// and without expert groups), token counts that are not multiples of any
// block size. The indices must match exactly: every random case is checked
// to be decisive (no near-ties, naiveRoute's margin) on its bf16-rounded
// inputs, which both storages see.
//
//===----------------------------------------------------------------------===//

#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "runtime/kernels/cuda/routing/RoutingCudaTestUtil.h"

namespace moec::runtime::cuda::routing::testing {
namespace {

using cpu::routing::testing::naiveRoute;
using cpu::routing::testing::RouterCase;
using cpu::routing::testing::routerCall;
using cpu::routing::testing::tensorOf;

RouterCase randomCase(std::string scoring, int64_t tokens, int64_t experts, int64_t topK,
                      uint64_t seed, double weightScale = 1.0, int64_t features = 6) {
  RouterCase c;
  c.tokens = tokens;
  c.features = features;
  c.experts = experts;
  c.topK = topK;
  c.scoring = std::move(scoring);
  c.x = randomBf16(tokens * c.features, seed);
  c.w = randomBf16(experts * c.features, seed + 1, weightScale);
  return c;
}

/// The smallest gap that decides a routing must clear the logits' rounding
/// differences between cuBLAS and the CPU GEMM by far.
constexpr double kMargin = 1e-4;

/// The first inputs (from seed, seed + 1000, ...) whose routing has no near-tie.
RouterCase decisive(const std::function<RouterCase(uint64_t)> &make, uint64_t seed) {
  for (uint64_t s = seed; s < seed + 200000; s += 1000) {
    RouterCase c = make(s);
    if (naiveRoute(c).margin > kMargin)
      return c;
  }
  ADD_FAILURE() << "no decisive routing near seed " << seed;
  return make(seed);
}

/// The router's forward operands: x, W and the biases present.
size_t forwardInputs(const RouterCase &c) {
  return 2 + (c.logitBias.empty() ? 0 : 1) + (c.correction.empty() ? 0 : 1);
}

/// Forward: weights (an f32 output in both storages) and indices (exact).
void expectForward(const RouterCase &c) {
  expectGpuMatchesCpu([&] { return routerCall(c); }, {}, {0});
}

/// Backward with the routing fixed by the CPU forward's indices; the forward
/// results and the weights' gradient stay f32.
void expectBackward(const RouterCase &c, const std::vector<int64_t> &wrt, bool withGrad = true) {
  size_t n = forwardInputs(c);
  expectGpuMatchesCpu(
      [&] {
        KernelCall forward = routerCall(c);
        forward.run();
        std::vector<OwnedTensor> grads;
        if (withGrad)
          grads.push_back(tensorOf({c.tokens, c.topK}, randomBf16(c.tokens * c.topK, 99)));
        return backwardCall(cpu::routing::testing::registry(), forward, wrt,
                            withGrad ? std::vector<int64_t>{0} : std::vector<int64_t>{}, grads,
                            /*withResults=*/true);
      },
      {n, n + 2});
}

// The CPU tests' cases ------------------------------------------------------

RouterCase softmaxRenormalised(uint64_t seed) {
  RouterCase c = randomCase("softmax", 7, 8, 2, seed);
  c.normalize = true;
  return c;
}

RouterCase topkSoftmaxWithLogitBias(uint64_t seed) {
  RouterCase c = randomCase("topk_softmax", 5, 8, 4, seed);
  c.logitBias = randomBf16(8, seed + 1, 0.5);
  return c;
}

RouterCase sigmoidGroupLimited(uint64_t seed) {
  RouterCase c = randomCase("sigmoid", 11, 8, 3, seed, 2.0);
  c.groups = 4;
  c.keepGroups = 2;
  c.normalize = true;
  c.scaling = 2.5;
  c.correction = randomBf16(8, seed + 2, 0.3);
  return c;
}

RouterCase sigmoidWithoutRenormalisation(uint64_t seed) {
  RouterCase c = randomCase("sigmoid", 6, 6, 2, seed);
  c.correction = randomBf16(6, seed + 2, 0.2);
  c.scaling = 1.5;
  return c;
}

TEST(CudaRouter, SoftmaxRenormalised) { expectForward(decisive(softmaxRenormalised, 11)); }

TEST(CudaRouter, SoftmaxWithoutRenormalisation) {
  expectForward(decisive([](uint64_t s) { return randomCase("softmax", 9, 8, 3, s); }, 21));
}

TEST(CudaRouter, TopkSoftmaxWithLogitBias) {
  expectForward(decisive(topkSoftmaxWithLogitBias, 31));
}

TEST(CudaRouter, SigmoidGroupLimited) { expectForward(decisive(sigmoidGroupLimited, 41)); }

TEST(CudaRouter, SigmoidWithoutRenormalisation) {
  expectForward(decisive(sigmoidWithoutRenormalisation, 51));
}

// The CPU test's hand-made scores: the dropped group holds the best expert,
// and the kept group's third expert has a negative biased score.
TEST(CudaRouter, GroupLimitedNegativeBiasedScoresNeverPickDroppedGroup) {
  RouterCase c;
  c.tokens = 1;
  c.features = c.experts = 8;
  c.topK = 3;
  c.scoring = "sigmoid";
  c.groups = 2;
  c.keepGroups = 1;
  c.normalize = true;
  c.scaling = 2.0;
  c.w.assign(64, 0.0);
  for (int64_t e = 0; e < 8; ++e)
    c.w[e * 8 + e] = 1;
  c.x = {1.5, 0.5, -1.0, -2.0, 1.0, 0.25, -0.5, 0.75};
  double biased[8] = {0.9, 0.6, -0.15, -0.3, 0.95, 0.5, 0.2, 0.1};
  for (int64_t e = 0; e < 8; ++e) {
    float s = static_cast<float>(1 / (1 + std::exp(-c.x[e])));
    c.correction.push_back(roundBf16(static_cast<float>(biased[e] - s)));
  }
  ASSERT_EQ(naiveRoute(c).indices, (std::vector<int64_t>{0, 1, 2}));
  expectForward(c);
}

// Exact ties (all logits equal): the lower expert index first.
TEST(CudaRouter, ExactTiesGoToLowerIndex) {
  for (const char *scoring : {"softmax", "sigmoid", "topk_softmax"}) {
    RouterCase c = randomCase(scoring, 3, 5, 3, 61);
    c.w.assign(c.w.size(), 0.0);
    expectForward(c);
    RouterCase wide = randomCase(scoring, 13, 64, 8, 62);
    wide.w.assign(wide.w.size(), 0.0);
    expectForward(wide);
  }
}

TEST(CudaRouter, SigmoidTwoGroups37Tokens) {
  expectForward(decisive(
      [](uint64_t s) {
        RouterCase c = randomCase("sigmoid", 37, 8, 2, s);
        c.groups = 2;
        c.correction = randomBf16(8, s + 2, 0.1);
        c.normalize = true;
        return c;
      },
      71));
}

// Larger expert counts -------------------------------------------------------

TEST(CudaRouter, Softmax64Experts) {
  expectForward(decisive(
      [](uint64_t s) {
        RouterCase c = randomCase("softmax", 33, 64, 6, s, 2.0, 40);
        c.normalize = true;
        return c;
      },
      81));
}

TEST(CudaRouter, TopkSoftmax64ExpertsWithLogitBias) {
  expectForward(decisive(
      [](uint64_t s) {
        RouterCase c = randomCase("topk_softmax", 100, 64, 4, s, 1.0, 13);
        c.logitBias = randomBf16(64, s + 2, 0.5);
        return c;
      },
      91));
}

// DeepSeek-V3's shape: 256 experts in 8 groups, 4 kept, k = 8.
TEST(CudaRouter, Sigmoid256ExpertsGroupLimited) {
  expectForward(decisive(
      [](uint64_t s) {
        RouterCase c = randomCase("sigmoid", 100, 256, 8, s, 1.0, 33);
        c.groups = 8;
        c.keepGroups = 4;
        c.normalize = true;
        c.scaling = 2.5;
        c.correction = randomBf16(256, s + 2, 0.3);
        return c;
      },
      101));
}

TEST(CudaRouter, Softmax256Experts) {
  expectForward(
      decisive([](uint64_t s) { return randomCase("softmax", 13, 256, 8, s, 3.0, 24); }, 111));
}

// The seed model's 896 experts (more than any block has threads).
TEST(CudaRouter, Softmax896Experts) {
  expectForward(decisive(
      [](uint64_t s) {
        RouterCase c = randomCase("softmax", 7, 896, 8, s, 4.0, 24);
        c.normalize = true;
        return c;
      },
      121));
}

TEST(CudaRouter, Sigmoid896ExpertsWithCorrection) {
  expectForward(decisive(
      [](uint64_t s) {
        RouterCase c = randomCase("sigmoid", 13, 896, 8, s, 1.0, 24);
        c.correction = randomBf16(896, s + 2, 0.3);
        c.normalize = true;
        c.scaling = 2.5;
        return c;
      },
      131));
}

TEST(CudaRouter, Sigmoid896ExpertsGroupLimited) {
  expectForward(decisive(
      [](uint64_t s) {
        RouterCase c = randomCase("sigmoid", 7, 896, 6, s, 1.0, 24);
        c.groups = 8;
        c.keepGroups = 3;
        c.correction = randomBf16(896, s + 2, 0.3);
        c.normalize = true;
        return c;
      },
      141));
}

TEST(CudaRouter, TopkSoftmax896Experts) {
  expectForward(decisive(
      [](uint64_t s) {
        RouterCase c = randomCase("topk_softmax", 5, 896, 4, s, 4.0, 24);
        c.logitBias = randomBf16(896, s + 2, 0.5);
        return c;
      },
      151));
}

// Backward ---------------------------------------------------------------------

TEST(CudaRouterBackward, SoftmaxRenormalised) {
  expectBackward(softmaxRenormalised(201), {0, 1});
}

TEST(CudaRouterBackward, SoftmaxWithoutRenormalisation) {
  expectBackward(randomCase("softmax", 5, 6, 3, 211, 2.0), {0, 1});
}

TEST(CudaRouterBackward, TopkSoftmaxWithLogitBias) {
  expectBackward(topkSoftmaxWithLogitBias(221), {0, 1, 2});
}

TEST(CudaRouterBackward, SigmoidGroupLimitedRenormalisedScaled) {
  expectBackward(sigmoidGroupLimited(231), {1, 0});
}

TEST(CudaRouterBackward, SigmoidWithoutRenormalisation) {
  expectBackward(sigmoidWithoutRenormalisation(241), {0, 1});
}

TEST(CudaRouterBackward, NoGradientOfWeightsGivesZeros) {
  expectBackward(randomCase("softmax", 3, 4, 2, 251), {0, 1}, /*withGrad=*/false);
}

TEST(CudaRouterBackward, Softmax64Experts) {
  RouterCase c = randomCase("softmax", 33, 64, 6, 261, 2.0, 40);
  c.normalize = true;
  expectBackward(c, {0, 1});
}

TEST(CudaRouterBackward, TopkSoftmax64ExpertsWithLogitBias) {
  RouterCase c = randomCase("topk_softmax", 100, 64, 4, 271, 1.0, 13);
  c.logitBias = randomBf16(64, 272, 0.5);
  expectBackward(c, {2, 0, 1});
}

TEST(CudaRouterBackward, Sigmoid256ExpertsGroupLimited) {
  RouterCase c = randomCase("sigmoid", 100, 256, 8, 281, 1.0, 33);
  c.groups = 8;
  c.keepGroups = 4;
  c.normalize = true;
  c.scaling = 2.5;
  c.correction = randomBf16(256, 282, 0.3);
  expectBackward(c, {0, 1});
}

TEST(CudaRouterBackward, Softmax896Experts) {
  RouterCase c = randomCase("softmax", 13, 896, 8, 291, 4.0, 24);
  c.normalize = true;
  expectBackward(c, {0, 1});
}

TEST(CudaRouterBackward, Sigmoid896ExpertsWithLogitBias) {
  RouterCase c = randomCase("sigmoid", 7, 896, 8, 301, 1.0, 24);
  c.logitBias = randomBf16(896, 302, 0.5);
  c.correction = randomBf16(896, 303, 0.3);
  c.normalize = true;
  c.groups = 8;
  c.keepGroups = 3;
  expectBackward(c, {1, 2, 0});
}

// Launch checks happen on the host, before anything touches the GPU: these
// run (and must fail with the CPU's messages) without a GPU too.
TEST(CudaRouterErrors, BadLaunchesNameTheProblem) {
  RouterCase c = randomCase("softmax", 3, 4, 2, 161);
  {
    KernelCall call = routerCall(c);
    call.attributes().erase("top_k");
    expectRefused(call, "top_k");
  }
  {
    KernelCall call = routerCall(c);
    call.attr("scoring", "cosine");
    expectRefused(call, "unknown scoring 'cosine'");
  }
  {
    KernelCall call = routerCall(c);
    call.attributes().erase("operand_segments");
    expectRefused(call, "operand_segments");
  }
  {
    KernelCall call = routerCall(c);
    call.attr("top_k", int64_t(5));
    expectRefused(call, "top_k (5)");
  }
  {
    KernelCall call = routerCall(c); // weight [4, 5] against input [3, 6]
    call.inputsRef()[1] = tensorOf({4, 5}, randomBf16(4 * 5, 1));
    expectRefused(call, "weight has shape [4,5], expected [?,6]");
  }
  {
    RouterCase bad = c;
    bad.correction = randomBf16(4, 2);
    expectRefused(routerCall(bad), "need sigmoid scoring");
  }
  {
    RouterCase bad = c;
    bad.scoring = "sigmoid";
    bad.groups = 2;
    bad.keepGroups = 3;
    expectRefused(routerCall(bad), "topk_group (3)");
  }
  {
    RouterCase bad = c;
    bad.scoring = "sigmoid";
    bad.groups = 4;
    expectRefused(routerCall(bad), "at least 2 experts per group");
  }
  {
    KernelCall call = routerCall(c);
    call.result(1).dtype = plan::I64;
    expectRefused(call, "indices must be i32");
  }
}

TEST(CudaRouterErrors, NoGradientForTheCorrectionBias) {
  RouterCase c = randomCase("sigmoid", 3, 4, 2, 171);
  c.correction = randomBf16(4, 172, 0.1);
  KernelCall forward = routerCall(c);
  forward.run();
  std::vector<OwnedTensor> grads{tensorOf({3, 2}, randomBf16(6, 1))};
  expectRefused(backwardCall(cpu::routing::testing::registry(), forward, {2}, {0}, grads, true),
                "correction_bias is a frozen buffer");
  expectRefused(backwardCall(cpu::routing::testing::registry(), forward, {0}, {0}, grads, false),
                "needs the forward results");
}

} // namespace
} // namespace moec::runtime::cuda::routing::testing
