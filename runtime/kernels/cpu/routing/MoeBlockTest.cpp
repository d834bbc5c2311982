//===- MoeBlockTest.cpp - router -> dispatch -> expert_mlp -> combine -----===//
//
// The four kernels chained as the importer chains them, against a naive
// per-token MoE: y_t = Σ_j w_tj Expert_{e_tj}(x_t). Then the four backwards
// chained in reverse against double differences of the naive MoE with the
// routing held fixed.
//
//===----------------------------------------------------------------------===//

#include <gtest/gtest.h>

#include <memory>

#include "runtime/kernels/cpu/routing/RoutingTestUtil.h"

namespace moec::runtime::cpu::routing::testing {
namespace {

struct MoeCase {
  RouterCase router;
  ExpertCase experts; // x and counts come from dispatch
  Values latent;      // Nemotron-H LatentMoE: experts read these rows, not the router's input
  const Values &expertInput() const { return latent.empty() ? router.x : latent; }
  int64_t width() const { return experts.features; }
};

Values naiveMoe(const MoeCase &m, const std::vector<int64_t> *fixed = nullptr) {
  Routing r = naiveRoute(m.router, fixed);
  int64_t k = m.router.topK, d = m.width();
  Values y(m.router.tokens * d, 0.0);
  for (int64_t t = 0; t < m.router.tokens; ++t)
    for (int64_t j = 0; j < k; ++j) {
      Values out = naiveExpertRow(m.experts, r.indices[t * k + j], m.expertInput().data() + t * d);
      for (int64_t i = 0; i < d; ++i)
        y[t * d + i] += r.weights[t * k + j] * out[i];
    }
  return y;
}

struct Pipeline {
  std::unique_ptr<KernelCall> router, dispatch, experts, combine;
  std::vector<int64_t> expertOperands;
};

Pipeline runMoe(const MoeCase &m, ThreadPool *pool) {
  Pipeline p;
  int64_t tokens = m.router.tokens, k = m.router.topK, d = m.width();
  p.router = std::make_unique<KernelCall>(routerCall(m.router));
  p.router->threads(pool).run();
  p.dispatch = std::make_unique<KernelCall>(registry(), "dispatch");
  p.dispatch->input(tensorOf({tokens, d}, m.expertInput()))
      .input(p.router->result(1))
      .attr("num_experts", m.router.experts)
      .output(plan::F32, {tokens * k, d})
      .output(plan::I64, {m.router.experts})
      .threads(pool)
      .run();
  ExpertCase experts = m.experts;
  experts.counts = p.dispatch->result(1).indices();
  experts.x = valuesOf(p.dispatch->result(0));
  p.experts = std::make_unique<KernelCall>(expertCall(experts, &p.expertOperands));
  p.experts->threads(pool).run();
  p.combine = std::make_unique<KernelCall>(registry(), "combine");
  p.combine->input(p.experts->result(0))
      .input(p.router->result(1))
      .input(p.router->result(0))
      .output(plan::F32, {tokens, d})
      .threads(pool)
      .run();
  return p;
}

MoeCase qwenCase() {
  MoeCase m;
  RouterCase &r = m.router;
  r.tokens = 9;
  r.features = 6;
  r.experts = 4;
  r.topK = 2;
  r.scoring = "softmax";
  r.normalize = true;
  r.x = randomValues(r.tokens * r.features, 1);
  r.w = randomValues(r.experts * r.features, 2, 2.0);
  ExpertCase &e = m.experts;
  e.features = 6;
  e.experts = 4;
  e.inter = 5;
  e.activation = "silu";
  e.up = randomValues(4 * 5 * 6, 3, 0.7);
  e.gate = randomValues(4 * 5 * 6, 4, 0.7);
  e.down = randomValues(4 * 6 * 5, 5, 0.7);
  return m;
}

MoeCase deepseekCase() {
  MoeCase m = qwenCase();
  RouterCase &r = m.router;
  r.experts = m.experts.experts = 8;
  r.topK = 3;
  r.scoring = "sigmoid";
  r.groups = 4;
  r.keepGroups = 2;
  r.scaling = 2.5;
  r.w = randomValues(8 * 6, 12, 2.0);
  r.correction = randomValues(8, 13, 0.3);
  ExpertCase &e = m.experts;
  e.up = randomValues(8 * 5 * 6, 14, 0.7);
  e.gate = randomValues(8 * 5 * 6, 15, 0.7);
  e.down = randomValues(8 * 6 * 5, 16, 0.7);
  e.rank = 2;
  e.loraScale = 2.0;
  e.upA = randomValues(8 * 2 * 6, 17, 0.5);
  e.upB = randomValues(8 * 5 * 2, 18, 0.5);
  e.downA = randomValues(8 * 2 * 5, 19, 0.5);
  e.downB = randomValues(8 * 6 * 2, 20, 0.5);
  return m;
}

MoeCase nemotronCase() {
  MoeCase m = qwenCase();
  RouterCase &r = m.router;
  r.scoring = "sigmoid";
  r.groups = 2;
  r.correction = randomValues(4, 21, 0.2);
  ExpertCase &e = m.experts;
  e.features = 3; // latent width
  e.activation = "relu2";
  e.gate.clear();
  e.up = randomValues(4 * 5 * 3, 22, 0.7);
  e.down = randomValues(4 * 3 * 5, 23, 0.7);
  m.latent = randomValues(r.tokens * 3, 24);
  return m;
}

MoeCase gptOssCase() {
  MoeCase m = qwenCase();
  RouterCase &r = m.router;
  r.scoring = "topk_softmax";
  r.normalize = false;
  r.logitBias = randomValues(4, 31, 0.5);
  ExpertCase &e = m.experts;
  e.activation = "clamped_swiglu";
  e.limit = 1.0;
  e.fusedGateUp = e.inOutLayout = true;
  e.gate.clear();
  e.up = randomValues(4 * 6 * 10, 32, 0.7);
  e.upBias = randomValues(4 * 10, 33, 0.2);
  e.down = randomValues(4 * 5 * 6, 34, 0.7);
  e.downBias = randomValues(4 * 6, 35, 0.2);
  return m;
}

void expectForwardMatches(const MoeCase &m) {
  ASSERT_GT(naiveRoute(m.router).margin, 1e-4);
  ThreadPool pool(2);
  Pipeline p = runMoe(m, &pool);
  EXPECT_LT(relativeError(p.combine->result(0).floats(), naiveMoe(m)), 1e-5);
}

TEST(MoeBlock, QwenSoftmaxSiluExperts) { expectForwardMatches(qwenCase()); }
TEST(MoeBlock, DeepSeekGroupLimitedSigmoidWithExpertLora) { expectForwardMatches(deepseekCase()); }
TEST(MoeBlock, NemotronLatentRelu2Experts) { expectForwardMatches(nemotronCase()); }
TEST(MoeBlock, GptOssTopkSoftmaxClampedSwiglu) { expectForwardMatches(gptOssCase()); }

/// The chained backwards: dy -> combine -> expert_mlp -> dispatch, and the
/// routing weights' gradient -> router; against the naive MoE's double
/// differences with the routing fixed to the forward's choice.
void expectBackwardMatches(MoeCase m) {
  ThreadPool pool(2);
  Pipeline p = runMoe(m, &pool);
  int64_t tokens = m.router.tokens, d = m.width();
  Values dy = randomValues(tokens * d, 40);
  std::vector<std::vector<float>> combineGrads =
      runBackward(*p.combine, {0, 2}, {0}, {tensorOf({tokens, d}, dy)});
  int64_t upB = p.expertOperands[10]; // up_lora_b, or -1
  std::vector<int64_t> expertWrt = {0};
  if (upB >= 0)
    expertWrt.push_back(upB);
  std::vector<std::vector<float>> expertGrads =
      runBackward(*p.experts, expertWrt, {0},
                  {tensorOf({tokens * m.router.topK, d},
                            Values(combineGrads[0].begin(), combineGrads[0].end()))});
  std::vector<std::vector<float>> dispatchGrads =
      runBackward(*p.dispatch, {0}, {0},
                  {tensorOf({tokens * m.router.topK, d},
                            Values(expertGrads[0].begin(), expertGrads[0].end()))});
  std::vector<std::vector<float>> routerGrads = runBackward(
      *p.router, {0, 1}, {0},
      {tensorOf({tokens, m.router.topK}, Values(combineGrads[1].begin(), combineGrads[1].end()))},
      /*withResults=*/true);

  std::vector<int64_t> fixed = p.router->result(1).indices();
  ASSERT_EQ(fixed, naiveRoute(m.router).indices);
  auto loss = [&] {
    Values y = naiveMoe(m, &fixed);
    double sum = 0;
    for (size_t i = 0; i < y.size(); ++i)
      sum += y[i] * dy[i];
    return sum;
  };
  std::vector<float> dx = dispatchGrads[0];
  if (m.latent.empty())
    for (size_t i = 0; i < dx.size(); ++i)
      dx[i] += routerGrads[0][i];
  Values &expertInput = m.latent.empty() ? m.router.x : m.latent;
  EXPECT_LT(relativeError(dx, numericGradient(expertInput, loss)), 1e-4);
  if (!m.latent.empty()) {
    EXPECT_LT(relativeError(routerGrads[0], numericGradient(m.router.x, loss)), 1e-4);
  }
  EXPECT_LT(relativeError(routerGrads[1], numericGradient(m.router.w, loss)), 1e-4);
  if (upB >= 0) {
    EXPECT_LT(relativeError(expertGrads[1], numericGradient(m.experts.upB, loss)), 1e-4);
  }
}

TEST(MoeBlockBackward, QwenSoftmaxSiluExperts) { expectBackwardMatches(qwenCase()); }
TEST(MoeBlockBackward, DeepSeekGroupLimitedSigmoidWithExpertLora) {
  expectBackwardMatches(deepseekCase());
}
TEST(MoeBlockBackward, NemotronLatentRelu2Experts) { expectBackwardMatches(nemotronCase()); }
TEST(MoeBlockBackward, GptOssTopkSoftmaxClampedSwiglu) { expectBackwardMatches(gptOssCase()); }

} // namespace
} // namespace moec::runtime::cpu::routing::testing
