//===- RouterTest.cpp - router forward/backward against naive references --===//

#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "runtime/kernels/cpu/routing/RoutingTestUtil.h"

namespace moec::runtime::cpu::routing::testing {
namespace {

using moec::runtime::testing::checkGradients;
using moec::runtime::testing::GradientCheck;

RouterCase randomCase(std::string scoring, int64_t tokens, int64_t experts, int64_t topK,
                      uint64_t seed, double weightScale = 1.0) {
  RouterCase c;
  c.tokens = tokens;
  c.features = 6;
  c.experts = experts;
  c.topK = topK;
  c.scoring = std::move(scoring);
  c.x = randomValues(tokens * c.features, seed);
  c.w = randomValues(experts * c.features, seed + 1, weightScale);
  return c;
}

/// Runs the router kernel and compares it with the naive router: the same
/// experts in the same order, and the same weights.
Routing expectMatchesNaive(const RouterCase &c, ThreadPool *pool = nullptr) {
  Routing ref = naiveRoute(c);
  EXPECT_GT(ref.margin, 1e-4) << "near-tie: pick other inputs";
  KernelCall call = routerCall(c);
  call.threads(pool);
  call.run();
  EXPECT_EQ(call.result(1).indices(), ref.indices);
  EXPECT_LT(relativeError(call.result(0).floats(), ref.weights), 1e-6);
  return ref;
}

/// The first inputs (from seed, seed + 1000, ...) whose routing is decisive
/// enough for the gradient check: random inputs often hold a near-tie.
RouterCase decisive(const std::function<RouterCase(uint64_t)> &make, uint64_t seed) {
  for (uint64_t s = seed; s < seed + 100000; s += 1000) {
    RouterCase c = make(s);
    if (naiveRoute(c).margin > 0.03)
      return c;
  }
  ADD_FAILURE() << "no decisive routing near seed " << seed;
  return make(seed);
}

/// The backward (routing fixed by the forward's indices) against central
/// differences of the forward, and elementwise against double differences of
/// the naive router with the same experts fixed.
void expectGradients(RouterCase c, const std::vector<int64_t> &wrt) {
  Routing ref = naiveRoute(c);
  // checkGradients moves x and W by 1e-3 * [-1, 1): logits move by < 0.02.
  ASSERT_GT(ref.margin, 0.03) << "the routing would change under the gradient check";
  KernelCall call = routerCall(c);
  GradientCheck check = checkGradients(registry(), call, wrt, /*outputsWithGrad=*/{0},
                                       /*backwardUsesResults=*/true, /*epsilon=*/1e-3);
  EXPECT_LT(check.worstRelativeError, 1e-2) << check.report;

  Values dWeights = randomValues(c.tokens * c.topK, 99);
  std::vector<std::vector<float>> grads =
      runBackward(call, wrt, {0}, {tensorOf({c.tokens, c.topK}, dWeights)}, /*withResults=*/true);
  auto loss = [&] {
    Routing r = naiveRoute(c, &ref.indices);
    double sum = 0;
    for (size_t i = 0; i < r.weights.size(); ++i)
      sum += r.weights[i] * dWeights[i];
    return sum;
  };
  Values *params[] = {&c.x, &c.w, &c.logitBias};
  for (size_t i = 0; i < wrt.size(); ++i)
    EXPECT_LT(relativeError(grads[i], numericGradient(*params[wrt[i]], loss)), 1e-5)
        << "operand " << wrt[i];
}

// Qwen3-MoE / Mixtral: softmax over all experts, top-k, renormalised.
TEST(Router, SoftmaxRenormalised) {
  RouterCase c = randomCase("softmax", 7, 8, 2, 11);
  c.normalize = true;
  Routing ref = expectMatchesNaive(c);
  for (int64_t t = 0; t < c.tokens; ++t)
    EXPECT_NEAR(ref.weights[2 * t] + ref.weights[2 * t + 1], 1.0, 1e-12);
}

// OLMoE: no renormalisation; the weights are the softmax probabilities.
TEST(Router, SoftmaxWithoutRenormalisation) {
  RouterCase c = randomCase("softmax", 9, 8, 3, 21);
  expectMatchesNaive(c);
}

// gpt-oss: logits plus the router bias, top-k on logits, softmax over the k.
TEST(Router, TopkSoftmaxWithLogitBias) {
  RouterCase c = randomCase("topk_softmax", 5, 8, 4, 31);
  c.logitBias = randomValues(8, 32, 0.5);
  expectMatchesNaive(c);
}

// DeepSeek-V3: sigmoid, correction bias, group-limited top-k, renormalised
// with the 1e-20 guard, scaled.
TEST(Router, SigmoidGroupLimited) {
  RouterCase c = randomCase("sigmoid", 11, 8, 3, 41, 2.0);
  c.groups = 4;
  c.keepGroups = 2;
  c.normalize = true;
  c.scaling = 2.5;
  c.correction = randomValues(8, 42, 0.3);
  Routing ref = expectMatchesNaive(c);
  for (int64_t t = 0; t < c.tokens; ++t) {
    double sum = 0;
    for (int64_t j = 0; j < 3; ++j)
      sum += ref.weights[3 * t + j];
    EXPECT_NEAR(sum, 2.5, 1e-9);
  }
}

// Kimi / Nemotron-H style: one group, correction bias, no renormalisation.
TEST(Router, SigmoidWithoutRenormalisation) {
  RouterCase c = randomCase("sigmoid", 6, 6, 2, 51);
  c.correction = randomValues(6, 52, 0.2);
  c.scaling = 1.5;
  expectMatchesNaive(c);
}

// Hand-made scores: W = I, so the logits are x. Experts 0-3 form group 0,
// 4-7 group 1; one group is kept. Biased scores (s + b):
//   group 0: 0.9, 0.6, -0.15, -0.3  (two best sum to 1.5)
//   group 1: 0.95, 0.5, 0.2, 0.1    (two best sum to 1.45: dropped, though it
//                                    holds the best expert)
// k = 3 must pick 0, 1 and then 2 despite its negative biased score: masked
// experts are -inf (transformers 5.17, official DeepSeek). The older 0.0 fill
// would have picked a dropped-group expert instead.
TEST(Router, GroupLimitedNegativeBiasedScoresNeverPickDroppedGroup) {
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
    c.correction.push_back(static_cast<float>(biased[e] - s));
  }
  Routing ref = expectMatchesNaive(c);
  EXPECT_EQ(ref.indices, (std::vector<int64_t>{0, 1, 2}));
  // The weights are the unbiased scores, renormalised and scaled.
  double s[3], sum = 0;
  for (int e = 0; e < 3; ++e)
    sum += s[e] = 1 / (1 + std::exp(-c.x[e]));
  for (int e = 0; e < 3; ++e)
    EXPECT_NEAR(ref.weights[e], 2.0 * s[e] / sum, 1e-12);
}

// Exact ties (all logits equal): the lower expert index first, like a stable
// descending sort; the weights are equal.
TEST(Router, ExactTiesGoToLowerIndex) {
  RouterCase c = randomCase("softmax", 3, 5, 3, 61);
  c.w.assign(c.w.size(), 0.0);
  KernelCall call = routerCall(c);
  call.run();
  EXPECT_EQ(call.result(1).indices(), (std::vector<int64_t>{0, 1, 2, 0, 1, 2, 0, 1, 2}));
  for (float w : call.result(0).floats())
    EXPECT_FLOAT_EQ(w, 0.2f);
}

TEST(Router, ThreadPoolGivesIdenticalResults) {
  RouterCase c = randomCase("sigmoid", 37, 8, 2, 71);
  c.groups = 2;
  c.correction = randomValues(8, 72, 0.1);
  c.normalize = true;
  ThreadPool pool(3);
  KernelCall serial = routerCall(c), parallel = routerCall(c);
  parallel.threads(&pool);
  serial.run();
  parallel.run();
  EXPECT_EQ(serial.result(0).bytes, parallel.result(0).bytes);
  EXPECT_EQ(serial.result(1).bytes, parallel.result(1).bytes);
  expectMatchesNaive(c, &pool);
}

TEST(RouterBackward, SoftmaxRenormalised) {
  expectGradients(decisive(
                      [](uint64_t seed) {
                        RouterCase c = randomCase("softmax", 5, 6, 2, seed, 2.0);
                        c.normalize = true;
                        return c;
                      },
                      101),
                  {0, 1});
}

TEST(RouterBackward, SoftmaxWithoutRenormalisation) {
  expectGradients(
      decisive([](uint64_t seed) { return randomCase("softmax", 5, 6, 3, seed, 2.0); }, 111),
      {0, 1});
}

TEST(RouterBackward, TopkSoftmaxWithLogitBias) {
  expectGradients(decisive(
                      [](uint64_t seed) {
                        RouterCase c = randomCase("topk_softmax", 5, 8, 3, seed, 2.0);
                        c.logitBias = randomValues(8, seed + 2, 0.5);
                        return c;
                      },
                      121),
                  {0, 1, 2});
}

TEST(RouterBackward, SigmoidGroupLimitedRenormalisedScaled) {
  expectGradients(decisive(
                      [](uint64_t seed) {
                        RouterCase c = randomCase("sigmoid", 5, 8, 2, seed, 2.0);
                        c.groups = 4;
                        c.keepGroups = 2;
                        c.normalize = true;
                        c.scaling = 2.5;
                        c.correction = randomValues(8, seed + 2, 0.3);
                        return c;
                      },
                      131),
                  {1, 0});
}

TEST(RouterBackward, SigmoidWithoutRenormalisation) {
  expectGradients(decisive(
                      [](uint64_t seed) {
                        RouterCase c = randomCase("sigmoid", 4, 6, 2, seed, 2.0);
                        c.correction = randomValues(6, seed + 2, 0.2);
                        c.scaling = 1.5;
                        return c;
                      },
                      141),
                  {0, 1});
}

TEST(RouterBackward, NoGradientOfWeightsGivesZeros) {
  RouterCase c = randomCase("softmax", 3, 4, 2, 151);
  KernelCall call = routerCall(c);
  call.run();
  std::vector<std::vector<float>> grads = runBackward(call, {0, 1}, {}, {}, true);
  for (const auto &g : grads)
    for (float v : g)
      EXPECT_EQ(v, 0.0f);
}

void expectFailure(KernelCall &call, const std::string &needle) {
  try {
    call.run();
    ADD_FAILURE() << "expected a failure mentioning '" << needle << "'";
  } catch (const KernelError &e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(RouterErrors, BadLaunchesNameTheProblem) {
  RouterCase c = randomCase("softmax", 3, 4, 2, 161);
  {
    KernelCall call = routerCall(c);
    call.attributes().erase("top_k");
    expectFailure(call, "top_k");
  }
  {
    KernelCall call = routerCall(c);
    call.attr("scoring", "cosine");
    expectFailure(call, "unknown scoring 'cosine'");
  }
  {
    KernelCall call = routerCall(c);
    call.attributes().erase("operand_segments");
    expectFailure(call, "operand_segments");
  }
  {
    KernelCall call = routerCall(c);
    call.attr("top_k", int64_t(5));
    expectFailure(call, "top_k (5)");
  }
  {
    KernelCall call = routerCall(c); // weight [4, 5] against input [3, 6]
    call.inputsRef()[1] = tensorOf({4, 5}, randomValues(4 * 5, 1));
    expectFailure(call, "weight has shape [4,5], expected [?,6]");
  }
  {
    RouterCase bad = c;
    bad.correction = randomValues(4, 2);
    KernelCall call = routerCall(bad);
    expectFailure(call, "need sigmoid scoring");
  }
  {
    RouterCase bad = c;
    bad.scoring = "sigmoid";
    bad.groups = 2;
    bad.keepGroups = 3;
    KernelCall call = routerCall(bad);
    expectFailure(call, "topk_group (3)");
  }
  {
    RouterCase bad = c;
    bad.scoring = "sigmoid";
    bad.groups = 4;
    KernelCall call = routerCall(bad);
    expectFailure(call, "at least 2 experts per group");
  }
}

TEST(RouterErrors, NoGradientForTheCorrectionBias) {
  RouterCase c = randomCase("sigmoid", 3, 4, 2, 171);
  c.correction = randomValues(4, 172, 0.1);
  KernelCall call = routerCall(c);
  call.run();
  try {
    runBackward(call, {2}, {0}, {tensorOf({3, 2}, randomValues(6, 1))}, true);
    ADD_FAILURE() << "expected a failure";
  } catch (const KernelError &e) {
    EXPECT_NE(std::string(e.what()).find("correction_bias is a frozen buffer"), std::string::npos)
        << e.what();
  }
  try {
    runBackward(call, {0}, {0}, {tensorOf({3, 2}, randomValues(6, 1))}, false);
    ADD_FAILURE() << "expected a failure";
  } catch (const KernelError &e) {
    EXPECT_NE(std::string(e.what()).find("needs the forward results"), std::string::npos)
        << e.what();
  }
}

} // namespace
} // namespace moec::runtime::cpu::routing::testing
