//===- DispatchCombineTest.cpp - expert-major permutation and its inverse -===//

#include <gtest/gtest.h>

#include "runtime/kernels/cpu/routing/RoutingTestUtil.h"

namespace moec::runtime::cpu::routing::testing {
namespace {

using moec::runtime::testing::checkGradients;
using moec::runtime::testing::GradientCheck;
using moec::runtime::testing::indexTensor;

struct Case {
  int64_t tokens, topK, features, experts;
  std::vector<int64_t> indices;

  /// Expert copies made: one per non-negative index (a row each).
  int64_t copies() const {
    int64_t n = 0;
    for (int64_t e : indices)
      n += e >= 0;
    return n;
  }
};

/// Expert 2 of 5 gets nothing; tokens repeat experts across slots.
Case sampleCase() {
  return {7, 3, 5, 5, {4, 0, 1, 1, 3, 0, 0, 4, 3, 3, 1, 4, 0, 1, 3, 4, 3, 0, 1, 0, 4}};
}

/// What an expert-parallel rank receives: experts on other ranks are -1 (token 2 has none
/// here, token 3 all three).
Case maskedCase() {
  return {7, 3, 5, 5, {4, -1, 1, 1, 3, -1, -1, -1, -1, 3, 1, 4, -1, 1, 3, 4, 3, 0, 1, 0, -1}};
}

std::vector<Case> cases() { return {sampleCase(), maskedCase()}; }

/// Rows per expert, counted from the indices.
std::vector<int64_t> countsOf(const Case &c) {
  std::vector<int64_t> counts(c.experts, 0);
  for (int64_t e : c.indices)
    if (e >= 0)
      ++counts[e];
  return counts;
}

/// The copies (t, j) in expert-major order, straight from the definition.
std::vector<std::pair<int64_t, int64_t>> naiveOrder(const Case &c) {
  std::vector<std::pair<int64_t, int64_t>> order;
  for (int64_t e = 0; e < c.experts; ++e)
    for (int64_t t = 0; t < c.tokens; ++t)
      for (int64_t j = 0; j < c.topK; ++j)
        if (c.indices[t * c.topK + j] == e)
          order.push_back({t, j});
  return order;
}

KernelCall dispatchCall(const Case &c, const Values &x, plan::DType indexType = plan::I32) {
  KernelCall call(registry(), "dispatch");
  call.input(tensorOf({c.tokens, c.features}, x))
      .input(indexTensor(indexType, {c.tokens, c.topK}, c.indices))
      .attr("num_experts", c.experts)
      .output(plan::F32, {c.copies(), c.features})
      .output(plan::I64, {c.experts});
  return call;
}

KernelCall combineCall(const Case &c, const Values &expertOutput, const Values &weights) {
  KernelCall call(registry(), "combine");
  call.input(tensorOf({c.copies(), c.features}, expertOutput))
      .input(indexTensor(plan::I32, {c.tokens, c.topK}, c.indices))
      .input(tensorOf({c.tokens, c.topK}, weights))
      .output(plan::F32, {c.tokens, c.features});
  return call;
}

TEST(Dispatch, RowsAreExpertMajorAndStable) {
  for (const Case &c : cases()) {
    Values x = randomValues(c.tokens * c.features, 1);
    for (plan::DType type : {plan::I32, plan::I64}) {
      KernelCall call = dispatchCall(c, x, type);
      call.run();
      Values want;
      for (auto [t, j] : naiveOrder(c))
        want.insert(want.end(), x.begin() + t * c.features, x.begin() + (t + 1) * c.features);
      EXPECT_EQ(relativeError(call.result(0).floats(), want), 0.0);
      EXPECT_EQ(call.result(1).indices(), countsOf(c));
    }
  }
  EXPECT_EQ(countsOf(sampleCase()), (std::vector<int64_t>{6, 5, 0, 5, 5}));
}

TEST(Combine, WeightedSumOfEachTokensCopies) {
  for (const Case &c : cases()) {
    Values out = randomValues(c.copies() * c.features, 2);
    Values weights = randomValues(c.tokens * c.topK, 3);
    KernelCall call = combineCall(c, out, weights);
    call.run();
    Values want(c.tokens * c.features, 0.0);
    std::vector<std::pair<int64_t, int64_t>> order = naiveOrder(c);
    for (size_t row = 0; row < order.size(); ++row) {
      auto [t, j] = order[row];
      for (int64_t d = 0; d < c.features; ++d)
        want[t * c.features + d] += weights[t * c.topK + j] * out[row * c.features + d];
    }
    EXPECT_LT(relativeError(call.result(0).floats(), want), 1e-6);
  }
}

// combine(dispatch(x)) = x * Σ_j w[t, j]: combine inverts dispatch's order.
TEST(DispatchCombine, RoundTrip) {
  for (const Case &c : cases()) {
    Values x = randomValues(c.tokens * c.features, 4);
    Values weights = randomValues(c.tokens * c.topK, 5);
    ThreadPool pool(2);
    KernelCall dispatch = dispatchCall(c, x);
    dispatch.threads(&pool);
    dispatch.run();
    KernelCall combine = combineCall(c, valuesOf(dispatch.result(0)), weights);
    combine.threads(&pool);
    combine.run();
    Values want(x.size());
    for (int64_t t = 0; t < c.tokens; ++t) {
      double sum = 0;
      for (int64_t j = 0; j < c.topK; ++j)
        if (c.indices[t * c.topK + j] >= 0)
          sum += weights[t * c.topK + j];
      for (int64_t d = 0; d < c.features; ++d)
        want[t * c.features + d] = x[t * c.features + d] * sum;
    }
    EXPECT_LT(relativeError(combine.result(0).floats(), want), 1e-6);
  }
}

TEST(DispatchBackward, SumsEachTokensCopies) {
  for (const Case &c : cases()) {
    KernelCall call = dispatchCall(c, randomValues(c.tokens * c.features, 6));
    GradientCheck check = checkGradients(registry(), call, {0});
    EXPECT_LT(check.worstRelativeError, 1e-2) << check.report;

    Values dy = randomValues(c.copies() * c.features, 7);
    std::vector<std::vector<float>> grads =
        runBackward(call, {0}, {0}, {tensorOf({c.copies(), c.features}, dy)});
    Values want(c.tokens * c.features, 0.0);
    std::vector<std::pair<int64_t, int64_t>> order = naiveOrder(c);
    for (size_t row = 0; row < order.size(); ++row)
      for (int64_t d = 0; d < c.features; ++d)
        want[order[row].first * c.features + d] += dy[row * c.features + d];
    EXPECT_LT(relativeError(grads[0], want), 1e-6);
  }
}

TEST(CombineBackward, ExpertOutputsAndWeights) {
  for (const Case &c : cases()) {
    Values out = randomValues(c.copies() * c.features, 8);
    Values weights = randomValues(c.tokens * c.topK, 9);
    KernelCall call = combineCall(c, out, weights);
    GradientCheck check = checkGradients(registry(), call, {0, 2});
    EXPECT_LT(check.worstRelativeError, 1e-2) << check.report;

    Values dy = randomValues(c.tokens * c.features, 10);
    std::vector<std::vector<float>> grads =
        runBackward(call, {2, 0}, {0}, {tensorOf({c.tokens, c.features}, dy)});
    Values wantOut(out.size(), 0.0), wantWeights(weights.size(), 0.0);
    std::vector<std::pair<int64_t, int64_t>> order = naiveOrder(c);
    for (size_t row = 0; row < order.size(); ++row) {
      auto [t, j] = order[row];
      for (int64_t d = 0; d < c.features; ++d) {
        wantOut[row * c.features + d] = weights[t * c.topK + j] * dy[t * c.features + d];
        wantWeights[t * c.topK + j] += dy[t * c.features + d] * out[row * c.features + d];
      }
    }
    // Other ranks' experts: zero weight gradients, no rows.
    EXPECT_LT(relativeError(grads[0], wantWeights), 1e-6);
    EXPECT_LT(relativeError(grads[1], wantOut), 1e-6);
  }
}

void expectFailure(KernelCall &call, const std::string &needle) {
  try {
    call.run();
    ADD_FAILURE() << "expected a failure mentioning '" << needle << "'";
  } catch (const KernelError &e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(DispatchCombineErrors, BadLaunchesNameTheProblem) {
  Case c = sampleCase();
  Values x = randomValues(c.tokens * c.features, 11);
  {
    Case bad = c;
    bad.indices[4] = 5;
    KernelCall call = dispatchCall(bad, x);
    expectFailure(call, "expert index 5 of token 1 is outside [0, 5)");
  }
  {
    KernelCall call = dispatchCall(c, x);
    call.attributes().erase("num_experts");
    expectFailure(call, "missing attribute 'num_experts'");
  }
  {
    KernelCall call(registry(), "dispatch");
    call.input(tensorOf({c.tokens, c.features}, x))
        .input(indexTensor(plan::I32, {c.tokens, c.topK}, c.indices))
        .attr("num_experts", c.experts)
        .output(plan::F32, {c.tokens, c.features})
        .output(plan::I64, {c.experts});
    expectFailure(call, "tokens has shape [7,5], expected [rows, 5] with 21 <= rows <= 21 (a row per expert copy)");
  }
  {
    KernelCall call = combineCall(c, randomValues(c.tokens * c.topK * c.features, 12),
                                  randomValues(c.tokens * c.topK, 13));
    call.inputsRef()[0] = tensorOf({c.tokens, c.features}, x);
    expectFailure(call, "expert_output has shape [7,5], expected [rows, 5] with 21 <= rows <= 21");
  }
  {
    KernelCall call = combineCall(c, randomValues(c.tokens * c.topK * c.features, 14),
                                  randomValues(c.tokens * c.topK, 15));
    call.run();
    try {
      runBackward(call, {1}, {0}, {tensorOf({c.tokens, c.features}, x)});
      ADD_FAILURE() << "expected a failure";
    } catch (const KernelError &e) {
      EXPECT_NE(std::string(e.what()).find("indices are integers"), std::string::npos) << e.what();
    }
  }
}

} // namespace
} // namespace moec::runtime::cpu::routing::testing
