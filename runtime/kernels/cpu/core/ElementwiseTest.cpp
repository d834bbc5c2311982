//===- ElementwiseTest.cpp - add, activations, gates, split, fill, accumulate -===//

#include <cmath>
#include <functional>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/kernels/cpu/core/CoreTestUtil.h"

namespace moec::runtime::cpu::core::testing {
namespace {

using ::testing::HasSubstr;

const std::vector<std::string> kKinds = {"silu", "gelu_tanh", "relu2", "sigmoid"};

/// The activations straight from their definitions.
double activationReference(const std::string &kind, double x) {
  if (kind == "silu")
    return x / (1.0 + std::exp(-x));
  if (kind == "gelu_tanh")
    return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
  if (kind == "relu2")
    return x > 0 ? x * x : 0.0;
  return 1.0 / (1.0 + std::exp(-x));
}

/// Their derivatives by central differences in double.
double derivativeReference(const std::string &kind, double x) {
  const double h = 1e-6;
  return (activationReference(kind, x + h) - activationReference(kind, x - h)) / (2 * h);
}

/// Random values in [-3, 3) plus the edges: 0, large of both signs.
OwnedTensor activationInput(uint64_t seed) {
  std::vector<float> x = randomTensor({3, 7}, seed, 3.0f).floats();
  x[0] = 0.0f;
  x[1] = -30.0f;
  x[2] = 30.0f;
  return floatTensor({3, 7}, x);
}

TEST(Add, MatchesReference) {
  for (const std::vector<int64_t> &shape :
       std::vector<std::vector<int64_t>>{{3, 5}, {2, 2, 3}, {}}) {
    KernelCall call(registry(), "add");
    call.input(randomTensor(shape, 1)).input(randomTensor(shape, 2)).output(plan::F32, shape);
    call.run();
    std::vector<double> a = widen(call.inputsRef()[0]), b = widen(call.inputsRef()[1]), want;
    for (size_t i = 0; i < a.size(); ++i)
      want.push_back(a[i] + b[i]);
    expectNear(call.result(0).floats(), want, 1e-7, "add");
  }
  KernelCall mismatch(registry(), "add");
  mismatch.input(randomTensor({3, 5}, 1)).input(randomTensor({3, 4}, 2)).output(plan::F32, {3, 5});
  EXPECT_THAT(failureOf(mismatch),
              HasSubstr("rhs has shape [3,4], expected the shape of lhs [3,5]"));
}

TEST(Activation, MatchesReference) {
  for (const std::string &kind : kKinds) {
    KernelCall call(registry(), "activation");
    call.input(activationInput(3)).attr("kind", kind).output(plan::F32, {3, 7});
    call.run();
    std::vector<double> want;
    for (float x : call.inputsRef()[0].floats())
      want.push_back(activationReference(kind, x));
    expectNear(call.result(0).floats(), want, 1e-6, kind);
  }
}

TEST(Activation, BackwardMatchesFiniteDifferencesAndReference) {
  for (const std::string &kind : kKinds) {
    KernelCall call(registry(), "activation");
    call.input(randomTensor({4, 5}, 4, 2.0f)).attr("kind", kind).output(plan::F32, {4, 5});
    GradientCheck check = checkGradients(registry(), call, {0});
    EXPECT_LT(check.worstRelativeError, 1e-2) << kind << "\n" << check.report;

    KernelCall edges(registry(), "activation");
    edges.input(activationInput(5)).attr("kind", kind).output(plan::F32, {3, 7});
    OwnedTensor dy = randomTensor({3, 7}, 6);
    KernelCall backward = backwardOf(edges, {0}, {{0, dy}});
    backward.run();
    std::vector<float> x = edges.inputsRef()[0].floats(), g = dy.floats();
    std::vector<double> want;
    for (size_t i = 0; i < x.size(); ++i)
      want.push_back(g[i] * derivativeReference(kind, x[i]));
    expectNear(backward.result(0).floats(), want, 1e-4, kind + " backward");
  }
}

TEST(Activation, RefusesUnsupportedKinds) {
  for (const char *kernel : {"activation", "glu"}) {
    KernelCall clamped(registry(), kernel);
    clamped.input(randomTensor({2, 3}, 1));
    if (std::string(kernel) == "glu")
      clamped.input(randomTensor({2, 3}, 2));
    clamped.attr("kind", "clamped_swiglu").output(plan::F32, {2, 3});
    EXPECT_THAT(failureOf(clamped), HasSubstr("'clamped_swiglu' is only used inside expert_mlp"));
  }
  KernelCall unknown(registry(), "activation");
  unknown.input(randomTensor({2, 3}, 1)).attr("kind", "gelu").output(plan::F32, {2, 3});
  EXPECT_THAT(failureOf(unknown),
              HasSubstr("unknown activation 'gelu' (supported: silu, gelu_tanh, relu2, sigmoid)"));
  KernelCall missing(registry(), "activation");
  missing.input(randomTensor({2, 3}, 1)).output(plan::F32, {2, 3});
  EXPECT_THAT(failureOf(missing), HasSubstr("missing attribute 'kind'"));
}

TEST(Glu, MatchesReferenceAndBackward) {
  for (const std::string &kind : kKinds) {
    KernelCall call(registry(), "glu");
    call.input(activationInput(7))
        .input(randomTensor({3, 7}, 8, 2.0f))
        .attr("kind", kind)
        .output(plan::F32, {3, 7});
    call.run();
    std::vector<float> gate = call.inputsRef()[0].floats(), up = call.inputsRef()[1].floats();
    std::vector<double> want;
    for (size_t i = 0; i < gate.size(); ++i)
      want.push_back(activationReference(kind, gate[i]) * up[i]);
    expectNear(call.result(0).floats(), want, 1e-6, "glu " + kind);

    OwnedTensor dy = randomTensor({3, 7}, 9);
    std::vector<float> g = dy.floats();
    std::vector<double> dGate, dUp;
    for (size_t i = 0; i < gate.size(); ++i) {
      dGate.push_back(g[i] * up[i] * derivativeReference(kind, gate[i]));
      dUp.push_back(g[i] * activationReference(kind, gate[i]));
    }
    KernelCall backward = backwardOf(call, {0, 1}, {{0, dy}});
    backward.run();
    expectNear(backward.result(0).floats(), dGate, 1e-4, "glu " + kind + " d gate");
    expectNear(backward.result(1).floats(), dUp, 1e-6, "glu " + kind + " d up");

    KernelCall smooth(registry(), "glu");
    smooth.input(randomTensor({4, 5}, 10, 2.0f))
        .input(randomTensor({4, 5}, 11))
        .attr("kind", kind)
        .output(plan::F32, {4, 5});
    GradientCheck check = checkGradients(registry(), smooth, {0, 1});
    EXPECT_LT(check.worstRelativeError, 1e-2) << kind << "\n" << check.report;
  }
  KernelCall mismatch(registry(), "glu");
  mismatch.input(randomTensor({3, 7}, 1))
      .input(randomTensor({3, 6}, 2))
      .attr("kind", "silu")
      .output(plan::F32, {3, 7});
  EXPECT_THAT(failureOf(mismatch),
              HasSubstr("up has shape [3,6], expected the shape of gate [3,7]"));
}

//===----------------------------------------------------------------------===//
// sigmoid_gate
//===----------------------------------------------------------------------===//

KernelCall gateCall(const std::vector<int64_t> &xShape, const std::vector<int64_t> &gateShape) {
  KernelCall call(registry(), "sigmoid_gate");
  call.input(randomTensor(xShape, 12))
      .input(randomTensor(gateShape, 13, 3.0f))
      .output(plan::F32, xShape);
  return call;
}

TEST(SigmoidGate, MatchesReferenceAndBackward) {
  struct Case {
    std::vector<int64_t> x, gate;
  };
  for (const Case &c : std::vector<Case>{{{4, 6}, {4, 6}}, // Qwen3-Next's attention output gate
                                         {{4, 6}, {4, 1}}, // its shared-expert gate: one per token
                                         {{2, 3, 5}, {2, 3, 5}}}) {
    KernelCall call = gateCall(c.x, c.gate);
    call.run();
    std::vector<float> x = call.inputsRef()[0].floats(), gate = call.inputsRef()[1].floats();
    int64_t width = gate.size() == x.size() ? 1 : c.x.back();
    auto sigma = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
    std::vector<double> want, dx, dGate(gate.size(), 0.0);
    OwnedTensor dy = randomTensor(c.x, 14);
    std::vector<float> g = dy.floats();
    for (size_t i = 0; i < x.size(); ++i) {
      double s = sigma(gate[i / width]);
      want.push_back(x[i] * s);
      dx.push_back(g[i] * s);
      dGate[i / width] += g[i] * x[i] * s * (1 - s);
    }
    expectNear(call.result(0).floats(), want, 1e-6, "sigmoid_gate");
    KernelCall backward = backwardOf(call, {0, 1}, {{0, dy}});
    backward.run();
    expectNear(backward.result(0).floats(), dx, 1e-6, "sigmoid_gate dx");
    expectNear(backward.result(1).floats(), dGate, 1e-5, "sigmoid_gate d gate");

    GradientCheck check = checkGradients(registry(), call, {0, 1});
    EXPECT_LT(check.worstRelativeError, 1e-2) << check.report;
  }
  KernelCall wrong = gateCall({4, 6}, {4, 2});
  EXPECT_THAT(failureOf(wrong), HasSubstr("gate has shape [4,2], expected [4,1]"));
}

//===----------------------------------------------------------------------===//
// split
//===----------------------------------------------------------------------===//

KernelCall splitCall(int64_t rows, const std::vector<int64_t> &sizes, int64_t groups) {
  int64_t total = 0;
  for (int64_t s : sizes)
    total += s;
  KernelCall call(registry(), "split");
  call.input(randomTensor({rows, groups * total}, 15)).attr("sizes", sizes);
  if (groups != 1) // absent means 1
    call.attr("groups", groups);
  for (int64_t s : sizes)
    call.output(plan::F32, {rows, groups * s});
  return call;
}

/// Part i of x [rows, groups * Σsizes]: sizes[i] features of every group.
std::vector<double> splitReference(const std::vector<float> &x, const std::vector<int64_t> &sizes,
                                   int64_t groups, size_t i) {
  int64_t total = 0, offset = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    total += sizes[k];
    if (k < i)
      offset += sizes[k];
  }
  int64_t rows = static_cast<int64_t>(x.size()) / (groups * total);
  std::vector<double> part;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t j = 0; j < sizes[i]; ++j)
        part.push_back(x[r * groups * total + g * total + offset + j]);
  return part;
}

struct SplitCase {
  std::vector<int64_t> sizes;
  int64_t groups;
};

const std::vector<SplitCase> kSplitCases = {
    {{5, 3}, 1},    // kv_a_proj_with_mqa into latent and rope key
    {{4, 4}, 3},    // Qwen3-Next's q_proj per head into query and gate
    {{2, 1, 3}, 2}, // uneven parts within groups
};

TEST(Split, MatchesReference) {
  for (const SplitCase &c : kSplitCases) {
    KernelCall call = splitCall(3, c.sizes, c.groups);
    call.run();
    for (size_t i = 0; i < c.sizes.size(); ++i)
      expectNear(call.result(i).floats(),
                 splitReference(call.inputsRef()[0].floats(), c.sizes, c.groups, i), 0,
                 "split part " + std::to_string(i));
  }
}

TEST(Split, BackwardAssemblesThePresentGradients) {
  for (const SplitCase &c : kSplitCases) {
    KernelCall call = splitCall(3, c.sizes, c.groups);
    GradientCheck all = checkGradients(registry(), call, {0});
    EXPECT_LT(all.worstRelativeError, 1e-2) << all.report;
    GradientCheck last =
        checkGradients(registry(), call, {0}, {static_cast<int64_t>(c.sizes.size()) - 1});
    EXPECT_LT(last.worstRelativeError, 1e-2) << last.report;

    // Only result 1's gradient: dx holds it at part 1's places and zeros elsewhere.
    int64_t width = call.inputsRef()[0].shape[1];
    std::vector<float> marked(3 * width);
    for (int64_t i = 0; i < 3 * width; ++i)
      marked[i] = static_cast<float>(i + 1);
    std::vector<double> indexInX = splitReference(marked, c.sizes, c.groups, 1);
    OwnedTensor g1 = randomTensor(call.result(1).shape, 16);
    std::vector<float> g = g1.floats();
    std::vector<double> want(3 * width, 0.0);
    for (size_t k = 0; k < g.size(); ++k)
      want[static_cast<size_t>(indexInX[k]) - 1] = g[k];
    KernelCall backward = backwardOf(call, {0}, {{1, g1}});
    backward.run();
    expectNear(backward.result(0).floats(), want, 0, "split dx from result 1 only");
  }
}

TEST(Split, RejectsBadLaunches) {
  KernelCall wrongWidth = splitCall(3, {4, 4}, 3);
  wrongWidth.inputsRef()[0] = randomTensor({3, 20}, 1);
  EXPECT_THAT(failureOf(wrongWidth), HasSubstr("input has shape [3,20], expected 24 features"));

  KernelCall missingResult = splitCall(3, {5, 3}, 1);
  missingResult.attr("sizes", std::vector<int64_t>{5, 2, 1});
  EXPECT_THAT(failureOf(missingResult), HasSubstr("expected 3 results (one per size), got 2"));

  KernelCall wrongResult = splitCall(3, {5, 3}, 1);
  wrongResult.result(1) = zeroTensor(plan::F32, {3, 2});
  EXPECT_THAT(failureOf(wrongResult), HasSubstr("result 1 has shape [3,2], expected [3,3]"));

  KernelCall call = splitCall(3, {5, 3}, 1);
  KernelCall noSuchResult = backwardOf(call, {0}, {{2, randomTensor({3, 3}, 1)}});
  EXPECT_THAT(failureOf(noSuchResult),
              HasSubstr("grad_of_outputs names result 2, but the op has 2 results"));

  KernelCall noSizes(registry(), "split");
  noSizes.input(randomTensor({3, 8}, 1)).output(plan::F32, {3, 8});
  EXPECT_THAT(failureOf(noSizes), HasSubstr("missing attribute 'sizes'"));

  KernelCall zeroSize = splitCall(3, {5, 3}, 1);
  zeroSize.attr("sizes", std::vector<int64_t>{8, 0});
  EXPECT_THAT(failureOf(zeroSize), HasSubstr("sizes [8,0] must all be positive"));
}

//===----------------------------------------------------------------------===//
// fill and accumulate_grad
//===----------------------------------------------------------------------===//

TEST(Fill, WritesEveryElement) {
  for (double value : {1.0, -2.5}) {
    for (const std::vector<int64_t> &shape : std::vector<std::vector<int64_t>>{{}, {3, 4}}) {
      KernelCall call(registry(), "fill");
      call.attr("value", value).output(plan::F32, shape);
      call.run();
      std::vector<double> want(call.result(0).numel(), value);
      expectNear(call.result(0).floats(), want, 0, "fill");
    }
  }
  KernelCall noValue(registry(), "fill");
  noValue.output(plan::F32, {});
  EXPECT_THAT(failureOf(noValue), HasSubstr("missing attribute 'value'"));
}

TEST(Microbatch, TakesOneBlockOfRowsOrOneElement) {
  OwnedTensor rows = randomTensor({6, 4}, 3);
  std::vector<float> all = rows.floats();
  for (int64_t index : {0, 2}) {
    KernelCall call(registry(), "microbatch");
    call.input(rows).attr("index", index).attr("count", int64_t{3}).output(plan::F32, {2, 4});
    call.run();
    std::vector<double> want(all.begin() + index * 8, all.begin() + (index + 1) * 8);
    expectNear(call.result(0).floats(), want, 0, "microbatch rows");
  }
  KernelCall scalar(registry(), "microbatch");
  scalar.input(floatTensor({3}, {0.5f, -1.5f, 2.0f})).attr("index", int64_t{1}).attr("count", int64_t{3});
  scalar.output(plan::F32, {});
  scalar.run();
  EXPECT_EQ(scalar.result(0).floats().at(0), -1.5f);
  KernelCall uneven(registry(), "microbatch");
  uneven.input(randomTensor({5, 4}, 5)).attr("index", int64_t{0}).attr("count", int64_t{2}).output(plan::F32, {2, 4});
  EXPECT_THAT(failureOf(uneven), HasSubstr("microbatch: the result must be block 0 of 2 equal blocks"));
}

KernelCall sliceFeaturesCall(OwnedTensor input, const std::vector<int64_t> &pieces, int64_t ranks, int64_t index) {
  int64_t rows = input.shape[0], columns = input.shape[1];
  KernelCall call(registry(), "tp_slice_features");
  call.input(std::move(input))
      .attr("pieces", pieces)
      .attr("ranks", ranks)
      .attr("index", index)
      .attr("axis", "tp")
      .output(plan::F32, {rows, columns / ranks});
  return call;
}

// Columns of 5 parts (Mamba-2's z, x, B, C, dt) over 2 ranks: rank k keeps the k-th half of
// each part, in order; tp_place_features puts both ranks' columns back: the input again.
TEST(SliceFeatures, TakesEachRanksShareOfEveryPart) {
  const std::vector<int64_t> pieces = {8, 8, 4, 4, 2};
  const int64_t rows = 3, columns = 26;
  OwnedTensor input = randomTensor({rows, columns}, 40);
  std::vector<float> x = input.floats(), rebuilt(x.size(), 0.0f);
  for (int64_t index : {0, 1}) {
    KernelCall call = sliceFeaturesCall(input, pieces, 2, index);
    call.run();
    std::vector<double> want;
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t base = 0, p = 0; p < 5; base += pieces[p], ++p)
        for (int64_t j = 0; j < pieces[p] / 2; ++j)
          want.push_back(x[t * columns + base + index * pieces[p] / 2 + j]);
    expectNear(call.result(0).floats(), want, 0, "rank " + std::to_string(index) + "'s columns");
    KernelCall place(registry(), "tp_place_features");
    place.input(call.result(0)).attributes() = call.attributes();
    place.output(plan::F32, {rows, columns});
    place.run();
    std::vector<float> back = place.result(0).floats();
    for (size_t i = 0; i < back.size(); ++i)
      rebuilt[i] += back[i]; // each rank's columns in place, zeros elsewhere
  }
  EXPECT_EQ(rebuilt, x);
  KernelCall uneven = sliceFeaturesCall(randomTensor({2, 26}, 1), {8, 8, 4, 4, 2}, 4, 0);
  uneven.result(0) = zeroTensor(plan::F32, {2, 6});
  EXPECT_THAT(failureOf(uneven), HasSubstr("a piece of 2 columns does not split over 4 ranks"));
  KernelCall wrongIndex = sliceFeaturesCall(randomTensor({2, 26}, 1), pieces, 2, 2);
  EXPECT_THAT(failureOf(wrongIndex), HasSubstr("index 2 is not one of 2 ranks"));
}

TEST(TokenBlocks, SplitsRowsAndConcatJoinsThem) {
  // 7 rows in 3 blocks: rows [0, 2), [2, 4), [4, 7).
  OwnedTensor rows = randomTensor({7, 3}, 30);
  std::vector<float> all = rows.floats();
  KernelCall split(registry(), "token_blocks");
  split.input(rows).output(plan::F32, {2, 3}).output(plan::F32, {2, 3}).output(plan::F32, {3, 3});
  split.run();
  const int64_t first[] = {0, 2, 4, 7};
  for (int b = 0; b < 3; ++b) {
    std::vector<double> want(all.begin() + first[b] * 3, all.begin() + first[b + 1] * 3);
    expectNear(split.result(b).floats(), want, 0, "token block " + std::to_string(b));
  }
  KernelCall concat(registry(), "concat_tokens");
  for (int b = 0; b < 3; ++b)
    concat.input(split.result(b));
  concat.output(plan::F32, {7, 3});
  concat.run();
  expectNear(concat.result(0).floats(), std::vector<double>(all.begin(), all.end()), 0, "concat_tokens");
  // Expert indices split alike (any dtype: the rows are copied as bytes).
  KernelCall indices(registry(), "token_blocks");
  indices.input(indexTensor(plan::I64, {3, 2}, {1, 2, 3, 4, 5, 6})).output(plan::I64, {1, 2}).output(plan::I64, {2, 2});
  indices.run();
  EXPECT_EQ(indices.result(0).indices(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(indices.result(1).indices(), (std::vector<int64_t>{3, 4, 5, 6}));
  // Blocks that are not the split's rows fail, naming the block and the rows it must be.
  KernelCall wrong(registry(), "token_blocks");
  wrong.input(randomTensor({7, 3}, 31)).output(plan::F32, {4, 3}).output(plan::F32, {3, 3});
  EXPECT_THAT(failureOf(wrong), HasSubstr("block 0 of 2 must be rows [0, 3) of [7,3] in the same dtype, got [4,3]"));
  KernelCall one(registry(), "concat_tokens");
  one.input(randomTensor({2, 3}, 32)).output(plan::F32, {2, 3});
  EXPECT_THAT(failureOf(one), HasSubstr("expected at least 2 blocks in and one output"));
}

/// accumulate_grad adds into its output, so it runs on a hand-made context
/// (KernelCall zeroes outputs first).
void runAccumulate(OwnedTensor &grad, OwnedTensor &acc) {
  google::protobuf::Map<std::string, plan::Attr> attrs;
  KernelContext ctx;
  ctx.kernel = "accumulate_grad";
  ctx.inputs = {grad.ref()};
  ctx.outputs = {acc.ref()};
  ctx.attrs = &attrs;
  (*registry().find("accumulate_grad"))(ctx);
}

TEST(AccumulateGrad, AddsIntoTheAccumulator) {
  OwnedTensor acc = randomTensor({3, 5}, 20), grad = randomTensor({3, 5}, 21);
  std::vector<double> want = widen(acc), g = widen(grad);
  for (size_t i = 0; i < want.size(); ++i)
    want[i] += 2 * g[i];
  runAccumulate(grad, acc);
  runAccumulate(grad, acc);
  expectNear(acc.floats(), want, 1e-6, "accumulate_grad");

  OwnedTensor wrong = randomTensor({3, 4}, 22);
  try {
    runAccumulate(wrong, acc);
    ADD_FAILURE() << "a shape mismatch ran";
  } catch (const KernelError &e) {
    EXPECT_THAT(e.what(), HasSubstr("the gradient has shape [3,4], expected the shape of the "
                                    "accumulator [3,5]"));
  }
}

} // namespace
} // namespace moec::runtime::cpu::core::testing
