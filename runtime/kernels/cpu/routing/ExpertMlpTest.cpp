//===- ExpertMlpTest.cpp - grouped expert MLPs against a per-row reference ===//

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "runtime/kernels/cpu/routing/RoutingTestUtil.h"

namespace moec::runtime::cpu::routing::testing {
namespace {

using moec::runtime::testing::checkGradients;
using moec::runtime::testing::GradientCheck;
using moec::runtime::testing::indexTensor;

enum Group {
  Tokens,
  Counts,
  Up,
  Down,
  Gate,
  UpBias,
  DownBias,
  GateA,
  GateB,
  UpA,
  UpB,
  DownA,
  DownB
};

/// 3 experts, the middle one without rows; odd sizes.
ExpertCase baseCase(std::string activation, bool gated, uint64_t seed) {
  ExpertCase c;
  c.features = 5;
  c.experts = 3;
  c.inter = 4;
  c.counts = {4, 0, 3};
  c.activation = std::move(activation);
  c.x = randomValues(c.rows() * c.features, seed);
  c.up = randomValues(c.experts * c.inter * c.features, seed + 1, 0.7);
  c.down = randomValues(c.experts * c.features * c.inter, seed + 2, 0.7);
  if (gated)
    c.gate = randomValues(c.experts * c.inter * c.features, seed + 3, 0.7);
  return c;
}

void addLora(ExpertCase &c, bool gate, bool up, bool down, uint64_t seed) {
  c.rank = 2;
  c.loraScale = 2.0;
  int64_t e = c.experts, r = c.rank, d = c.features, n = c.inter;
  if (gate) {
    c.gateA = randomValues(e * r * d, seed, 0.5);
    c.gateB = randomValues(e * n * r, seed + 1, 0.5);
  }
  if (up) {
    c.upA = randomValues(e * r * d, seed + 2, 0.5);
    c.upB = randomValues(e * n * r, seed + 3, 0.5);
  }
  if (down) {
    c.downA = randomValues(e * r * n, seed + 4, 0.5);
    c.downB = randomValues(e * d * r, seed + 5, 0.5);
  }
}

/// gpt-oss: fused interleaved gate/up in [E, in, out], biases, clamped SwiGLU
/// with a limit that some pre-activations exceed (both clamps active).
ExpertCase gptOssCase(bool inOut, uint64_t seed) {
  ExpertCase c;
  c.features = 5;
  c.experts = 3;
  c.inter = 3;
  c.counts = {2, 4, 1};
  c.activation = "clamped_swiglu";
  c.fusedGateUp = true;
  c.inOutLayout = inOut;
  c.limit = 0.8;
  c.x = randomValues(c.rows() * c.features, seed, 1.5);
  c.up = randomValues(c.experts * c.features * 2 * c.inter, seed + 1);
  c.down = randomValues(c.experts * c.inter * c.features, seed + 2, 0.7);
  c.upBias = randomValues(c.experts * 2 * c.inter, seed + 3, 0.3);
  c.downBias = randomValues(c.experts * c.features, seed + 4, 0.3);
  return c;
}

Values *operandValues(ExpertCase &c, int group) {
  Values *all[] = {&c.x,     nullptr,  &c.up,  &c.down, &c.gate,  &c.upBias, &c.downBias,
                   &c.gateA, &c.gateB, &c.upA, &c.upB,  &c.downA, &c.downB};
  return all[group];
}

/// Every up/gate pre-activation's distance to a kink (relu at 0, the clamps
/// at ±limit): the gradient check needs them away from the kinks.
double kinkMargin(const ExpertCase &c) {
  double margin = 1e30;
  int64_t row = 0;
  for (int64_t e = 0; e < c.experts; ++e)
    for (int64_t i = 0; i < c.counts[e]; ++i, ++row) {
      const double *x = c.x.data() + row * c.features;
      for (int64_t o = 0; o < c.upOut(); ++o) {
        double p = c.upBias.empty() ? 0.0 : c.upBias[e * c.upOut() + o];
        for (int64_t d = 0; d < c.features; ++d)
          p += x[d] * (c.inOutLayout ? c.up[(e * c.features + d) * c.upOut() + o]
                                     : c.up[(e * c.upOut() + o) * c.features + d]);
        for (int64_t r = 0; !c.upA.empty() && r < c.rank; ++r) {
          double z = 0;
          for (int64_t d = 0; d < c.features; ++d)
            z += c.upA[(e * c.rank + r) * c.features + d] * x[d];
          p += c.loraScale * c.upB[(e * c.upOut() + o) * c.rank + r] * z;
        }
        if (c.activation == "relu2")
          margin = std::min(margin, std::abs(p));
        if (c.activation == "clamped_swiglu")
          margin = std::min({margin, std::abs(p - c.limit), std::abs(p + c.limit)});
      }
    }
  return margin;
}

/// The first inputs (from seed, seed + 1000, ...) with no pre-activation
/// within 0.02 of a kink, where checkGradients' steps (about 0.01 in the
/// pre-activations) would cross it.
ExpertCase awayFromKinks(const std::function<ExpertCase(uint64_t)> &make, uint64_t seed) {
  for (uint64_t s = seed; s < seed + 100000; s += 1000) {
    ExpertCase c = make(s);
    if (kinkMargin(c) > 0.02)
      return c;
  }
  ADD_FAILURE() << "no inputs away from the kinks near seed " << seed;
  return make(seed);
}

/// Forward against the naive reference; backward with central differences of
/// the forward (checkGradients) and elementwise against double differences of
/// the naive reference, for every float operand present.
void expectMatches(ExpertCase c) {
  std::vector<int64_t> operands;
  KernelCall call = expertCall(c, &operands);
  ThreadPool pool(2);
  call.threads(&pool);
  call.run();
  EXPECT_LT(relativeError(call.result(0).floats(), naiveExperts(c)), 1e-5);

  std::vector<int64_t> wrt;
  std::vector<int> groups;
  for (int g = 0; g < 13; ++g)
    if (g != Counts && operands[g] >= 0) {
      wrt.push_back(operands[g]);
      groups.push_back(g);
    }
  if (c.activation != "silu") {
    ASSERT_GT(kinkMargin(c), 0.02) << "a pre-activation sits at a kink: pick other inputs";
  }
  GradientCheck check = checkGradients(registry(), call, wrt, {}, false, 1e-3);
  EXPECT_LT(check.worstRelativeError, 1e-2) << check.report;

  Values dy = randomValues(c.rows() * c.features, 77);
  std::vector<std::vector<float>> grads =
      runBackward(call, wrt, {0}, {tensorOf({c.rows(), c.features}, dy)});
  auto loss = [&] {
    Values y = naiveExperts(c);
    double sum = 0;
    for (size_t i = 0; i < y.size(); ++i)
      sum += y[i] * dy[i];
    return sum;
  };
  for (size_t i = 0; i < wrt.size(); ++i)
    EXPECT_LT(relativeError(grads[i], numericGradient(*operandValues(c, groups[i]), loss)), 1e-4)
        << "operand group " << groups[i];
}

// Qwen3-MoE / Mixtral / DeepSeek experts.
TEST(ExpertMlp, SiluGated) { expectMatches(baseCase("silu", true, 1)); }

// Rows past the counted ones (expert parallel's received rows): zero in the result, no
// effect on any gradient, zero in the tokens' gradient.
TEST(ExpertMlp, UncountedRowsAreZeroWithLora) {
  ExpertCase c = baseCase("silu", true, 2);
  c.padding = 3;
  c.x = randomValues(c.rows() * c.features, 3);
  addLora(c, true, true, true, 4);
  expectMatches(c);
}

// Nemotron-H (LatentMoE) experts: down(relu(up x)^2).
TEST(ExpertMlp, Relu2Ungated) {
  expectMatches(awayFromKinks([](uint64_t seed) { return baseCase("relu2", false, seed); }, 11));
}

TEST(ExpertMlp, SiluUngated) { expectMatches(baseCase("silu", false, 21)); }

TEST(ExpertMlp, GptOssFusedInOutClampedSwiglu) {
  expectMatches(awayFromKinks([](uint64_t seed) { return gptOssCase(true, seed); }, 31));
}

TEST(ExpertMlp, FusedOutInLayoutClampedSwiglu) {
  expectMatches(awayFromKinks([](uint64_t seed) { return gptOssCase(false, seed); }, 41));
}

TEST(ExpertMlp, SiluGatedWithLoraOnEveryProjection) {
  ExpertCase c = baseCase("silu", true, 51);
  addLora(c, true, true, true, 52);
  expectMatches(c);
}

TEST(ExpertMlp, Relu2WithUpAndDownLora) {
  expectMatches(awayFromKinks(
      [](uint64_t seed) {
        ExpertCase c = baseCase("relu2", false, seed);
        addLora(c, false, true, true, seed + 10);
        return c;
      },
      61));
}

TEST(ExpertMlp, SiluGatedWithGateLoraOnly) {
  ExpertCase c = baseCase("silu", true, 71);
  addLora(c, true, false, false, 72);
  c.counts = {0, 5, 2};
  expectMatches(c);
}

// The LoRA delta alone: lora_scale * B_e (A_e x) on the up projection of an
// ungated relu2 expert whose up weight is zero, so h = relu(lora)^2.
TEST(ExpertMlp, LoraAddsScaledProductPerExpert) {
  ExpertCase c = baseCase("relu2", false, 81);
  addLora(c, false, true, false, 82);
  std::fill(c.up.begin(), c.up.end(), 0.0);
  KernelCall call = expertCall(c);
  call.run();
  std::vector<float> y = call.result(0).floats();
  int64_t row = 0;
  for (int64_t e = 0; e < c.experts; ++e)
    for (int64_t i = 0; i < c.counts[e]; ++i, ++row) {
      std::vector<double> h(c.inter);
      for (int64_t o = 0; o < c.inter; ++o) {
        double u = 0;
        for (int64_t r = 0; r < c.rank; ++r) {
          double z = 0;
          for (int64_t d = 0; d < c.features; ++d)
            z += c.upA[(e * c.rank + r) * c.features + d] * c.x[row * c.features + d];
          u += c.loraScale * c.upB[(e * c.inter + o) * c.rank + r] * z;
        }
        h[o] = u > 0 ? u * u : 0;
      }
      for (int64_t d = 0; d < c.features; ++d) {
        double want = 0;
        for (int64_t o = 0; o < c.inter; ++o)
          want += c.down[(e * c.features + d) * c.inter + o] * h[o];
        EXPECT_NEAR(y[row * c.features + d], want, 1e-5);
      }
    }
}

TEST(ExpertMlpBackward, OnlySomeGradientsRequested) {
  ExpertCase c = baseCase("silu", true, 91);
  addLora(c, false, true, false, 92);
  std::vector<int64_t> operands;
  KernelCall call = expertCall(c, &operands);
  call.run();
  Values dy = randomValues(c.rows() * c.features, 93);
  std::vector<std::vector<float>> grads = runBackward(call, {operands[UpB], operands[Tokens]}, {0},
                                                      {tensorOf({c.rows(), c.features}, dy)});
  auto loss = [&] {
    Values y = naiveExperts(c);
    double sum = 0;
    for (size_t i = 0; i < y.size(); ++i)
      sum += y[i] * dy[i];
    return sum;
  };
  EXPECT_LT(relativeError(grads[0], numericGradient(c.upB, loss)), 1e-4);
  EXPECT_LT(relativeError(grads[1], numericGradient(c.x, loss)), 1e-4);
}

// The forward's optional second output: each counted row's gate x in columns [0, I) and up x in
// [I, 2 I), zero past the counted rows. A backward given them reads them: with the true ones it
// gives the recomputing backward's gradients; with the gate's half zeroed (silu(0) = 0) the up
// weights' gradient (dp = dh silu(g), dW_up = dpᵀ x) is zero.
TEST(ExpertMlp, SavedPreActivations) {
  ExpertCase c = baseCase("silu", true, 121);
  c.padding = 2;
  c.x = randomValues(c.rows() * c.features, 122);
  std::vector<int64_t> operands;
  KernelCall call = expertCall(c, &operands);
  const int64_t n = c.inter, width = 2 * n;
  call.output(plan::F32, {c.rows(), width});
  call.run();
  EXPECT_LT(relativeError(call.result(0).floats(), naiveExperts(c)), 1e-5);
  std::vector<float> pre = call.result(1).floats();
  int64_t row = 0;
  for (int64_t e = 0; e < c.experts; ++e)
    for (int64_t i = 0; i < c.counts[e]; ++i, ++row)
      for (int64_t o = 0; o < n; ++o) {
        double gate = 0, up = 0;
        for (int64_t d = 0; d < c.features; ++d) {
          gate += c.gate[(e * n + o) * c.features + d] * c.x[row * c.features + d];
          up += c.up[(e * n + o) * c.features + d] * c.x[row * c.features + d];
        }
        EXPECT_NEAR(pre[row * width + o], gate, 1e-5) << "row " << row << " gate " << o;
        EXPECT_NEAR(pre[row * width + n + o], up, 1e-5) << "row " << row << " up " << o;
      }
  for (; row < c.rows(); ++row)
    for (int64_t o = 0; o < width; ++o)
      EXPECT_EQ(pre[row * width + o], 0.0f) << "uncounted row " << row;

  const std::vector<int64_t> wrt = {operands[Tokens], operands[Up], operands[Gate], operands[Down]};
  Values dy = randomValues(c.rows() * c.features, 123);
  const OwnedTensor dResult = tensorOf({c.rows(), c.features}, dy);
  std::vector<std::vector<float>> recomputed = runBackward(call, wrt, {0}, {dResult});
  std::vector<std::vector<float>> fromSaved = runBackward(call, wrt, {0}, {dResult}, false, {call.result(1)});
  for (size_t i = 0; i < wrt.size(); ++i)
    EXPECT_LT(relativeError(fromSaved[i], Values(recomputed[i].begin(), recomputed[i].end())), 1e-6) << i;

  std::vector<float> values = call.result(1).floats();
  for (int64_t r = 0; r < c.rows(); ++r)
    std::fill(values.begin() + r * width, values.begin() + r * width + n, 0.0f);
  std::vector<std::vector<float>> gateless =
      runBackward(call, wrt, {0}, {dResult}, false, {tensorOf({c.rows(), width}, Values(values.begin(), values.end()))});
  for (float v : gateless[1])
    EXPECT_EQ(v, 0.0f) << "the up weights' gradient with silu(gate) = 0";
  EXPECT_GT(relativeError(gateless[0], Values(recomputed[0].begin(), recomputed[0].end())), 1e-2);
}

void expectFailure(KernelCall &call, const std::string &needle) {
  try {
    call.run();
    ADD_FAILURE() << "expected a failure mentioning '" << needle << "'";
  } catch (const KernelError &e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(ExpertMlpErrors, BadLaunchesNameTheProblem) {
  {
    KernelCall call = expertCall(baseCase("silu", true, 101));
    call.inputsRef()[1] = indexTensor(plan::I64, {3}, {4, 1, 3});
    expectFailure(call, "counts add up to 8 rows, more than the 7 rows of tokens");
  }
  {
    KernelCall call = expertCall(baseCase("gelu_tanh", true, 102));
    expectFailure(call, "unsupported expert activation 'gelu_tanh'");
  }
  {
    ExpertCase c = gptOssCase(true, 103);
    KernelCall call = expertCall(c);
    call.attributes().erase("limit");
    expectFailure(call, "missing attribute 'limit'");
  }
  {
    ExpertCase c = baseCase("silu", true, 104);
    addLora(c, true, false, false, 105);
    KernelCall call = expertCall(c);
    call.attributes().erase("lora_scale");
    expectFailure(call, "missing attribute 'lora_scale'");
  }
  {
    KernelCall call = expertCall(baseCase("silu", true, 106));
    call.inputsRef()[3] = tensorOf({3, 5, 3}, randomValues(3 * 5 * 3, 107));
    expectFailure(call, "down has shape [3,5,3], expected [3,5,4]");
  }
  {
    ExpertCase c = gptOssCase(false, 108);
    c.rank = 1;
    c.loraScale = 1.0;
    c.upA = randomValues(c.experts * c.features, 109);
    c.upB = randomValues(c.experts * c.inter, 110);
    KernelCall call = expertCall(c);
    expectFailure(call, "expert LoRA needs separate [out, in] expert weights");
  }
  {
    ExpertCase c = baseCase("silu", true, 113);
    addLora(c, false, true, false, 114);
    KernelCall call = expertCall(c);
    call.output(plan::F32, {c.rows(), 2 * c.inter});
    expectFailure(call, "pre_activations need a separate gate, no up bias and no LoRA on gate or up");
  }
  {
    ExpertCase c = baseCase("silu", true, 115);
    KernelCall call = expertCall(c);
    call.output(plan::F32, {c.rows(), c.inter});
    expectFailure(call, "pre_activations has shape [7,4], expected [7,8]");
  }
  {
    ExpertCase c = baseCase("silu", true, 111);
    KernelCall call = expertCall(c);
    call.attributes().erase("operand_segments");
    expectFailure(call, "missing attribute 'operand_segments'");
  }
  {
    ExpertCase c = baseCase("silu", true, 112);
    KernelCall call = expertCall(c);
    call.run();
    try {
      runBackward(call, {1}, {0}, {tensorOf({c.rows(), c.features}, c.x)});
      ADD_FAILURE() << "expected a failure";
    } catch (const KernelError &e) {
      EXPECT_NE(std::string(e.what()).find("counts are integers"), std::string::npos) << e.what();
    }
  }
}

} // namespace
} // namespace moec::runtime::cpu::routing::testing
