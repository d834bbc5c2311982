//===- TokensTest.cpp - embedding, cross_entropy, shift_labels against references -===//

#include <cmath>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/kernels/cpu/core/CoreTestUtil.h"

namespace moec::runtime::cpu::core::testing {
namespace {

using ::testing::HasSubstr;

KernelCall embeddingCall(plan::DType idType, const std::vector<int64_t> &ids, int64_t vocab,
                         int64_t dim) {
  KernelCall call(registry(), "embedding");
  call.input(indexTensor(idType, {static_cast<int64_t>(ids.size())}, ids))
      .input(randomTensor({vocab, dim}, 30))
      .output(plan::F32, {static_cast<int64_t>(ids.size()), dim});
  return call;
}

const std::vector<int64_t> kIds = {3, 0, 7, 3, 3, 5, 0}; // repeats, both ends of the table

TEST(Embedding, LooksRowsUp) {
  for (plan::DType idType : {plan::I32, plan::I64}) {
    KernelCall call = embeddingCall(idType, kIds, 8, 5);
    call.run();
    std::vector<float> table = call.inputsRef()[1].floats();
    std::vector<double> want;
    for (int64_t id : kIds)
      for (int64_t j = 0; j < 5; ++j)
        want.push_back(table[id * 5 + j]);
    expectNear(call.result(0).floats(), want, 0, "embedding");
  }
}

TEST(Embedding, BackwardScatterAddsIntoTheTable) {
  KernelCall call = embeddingCall(plan::I64, kIds, 8, 5);
  GradientCheck check = checkGradients(registry(), call, {1});
  EXPECT_LT(check.worstRelativeError, 1e-2) << check.report;

  OwnedTensor dy = randomTensor({7, 5}, 31);
  std::vector<float> g = dy.floats();
  std::vector<double> want(8 * 5, 0.0);
  for (size_t t = 0; t < kIds.size(); ++t)
    for (int64_t j = 0; j < 5; ++j)
      want[kIds[t] * 5 + j] += g[t * 5 + j];
  KernelCall backward = backwardOf(call, {1}, {{0, dy}});
  backward.run();
  expectNear(backward.result(0).floats(), want, 1e-6, "embedding table gradient");
}

TEST(Embedding, BackwardSameBitsForAnyThreadCount) {
  std::vector<int64_t> ids;
  for (int64_t t = 0; t < 500; ++t)
    ids.push_back((t * 7919) % 13); // every row used many times
  ThreadPool two(2), three(3);
  std::vector<std::vector<float>> runs;
  for (ThreadPool *pool : {static_cast<ThreadPool *>(nullptr), &two, &three}) {
    KernelCall call = embeddingCall(plan::I32, ids, 16, 9);
    KernelCall backward = backwardOf(call, {1}, {{0, randomTensor({500, 9}, 32)}});
    backward.threads(pool).run();
    runs.push_back(backward.result(0).floats());
  }
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_EQ(runs[0], runs[2]);
}

TEST(Embedding, RejectsBadLaunches) {
  KernelCall outside = embeddingCall(plan::I64, {1, 2, 8}, 8, 4);
  EXPECT_THAT(failureOf(outside), HasSubstr("id 8 of token 2 is outside the table's 8 rows"));
  KernelCall negative = embeddingCall(plan::I32, {-1}, 8, 4);
  EXPECT_THAT(failureOf(negative), HasSubstr("id -1 of token 0 is outside"));

  KernelCall floatIds(registry(), "embedding");
  floatIds.input(randomTensor({3}, 1)).input(randomTensor({8, 4}, 2)).output(plan::F32, {3, 4});
  EXPECT_THAT(failureOf(floatIds), HasSubstr("ids must be i32 or i64, got f32"));

  KernelCall wrongResult = embeddingCall(plan::I64, {1, 2}, 8, 4);
  wrongResult.result(0) = zeroTensor(plan::F32, {2, 5});
  EXPECT_THAT(failureOf(wrongResult), HasSubstr("result has shape [2,5], expected [2,4]"));

  KernelCall call = embeddingCall(plan::I64, {1, 2}, 8, 4);
  KernelCall idsGrad = backwardOf(call, {0}, {{0, randomTensor({2, 4}, 3)}});
  idsGrad.result(0) = zeroTensor(plan::F32, {2});
  EXPECT_THAT(failureOf(idsGrad), HasSubstr("operand 0 has no gradient"));
}

//===----------------------------------------------------------------------===//
// cross_entropy
//===----------------------------------------------------------------------===//

/// transformers' ForCausalLMLoss on logits [B, S, V] and labels [B, S]: each
/// row of labels padded with ignore_index and shifted left by one, then
/// cross-entropy with mean reduction over the labels that are not ignored.
/// (transformers gives nan when none count; the kernel gives 0.)
double causalLmLossReference(const std::vector<float> &logits, const std::vector<int64_t> &labels,
                             int64_t batch, int64_t seq, int64_t vocab, int64_t ignore,
                             bool shift) {
  std::vector<int64_t> targets;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t s = 0; s < seq; ++s)
      targets.push_back(!shift        ? labels[b * seq + s]
                        : s + 1 < seq ? labels[b * seq + s + 1]
                                      : ignore);
  double sum = 0;
  int count = 0;
  for (size_t t = 0; t < targets.size(); ++t) {
    if (targets[t] == ignore)
      continue;
    double z = 0;
    for (int64_t v = 0; v < vocab; ++v)
      z += std::exp(double(logits[t * vocab + v]));
    sum += std::log(z) - logits[t * vocab + targets[t]];
    ++count;
  }
  return count ? sum / count : 0.0;
}

struct LossCase {
  int64_t batch, seq, vocab;
  std::vector<int64_t> labels;
  bool shift;
  int64_t ignore; // the attribute is left out when it is -100
  plan::DType labelType;
};

const std::vector<LossCase> kLossCases = {
    {2, 5, 7, {1, 2, 3, -100, 6, 0, 4, 4, 5, -100}, true, -100, plan::I64},
    {1, 6, 5, {4, 0, 1, 2, 3, 3}, true, -100, plan::I32},
    {3, 3, 4, {0, 1, 2, 3, -1, 0, 2, 2, -1}, true, -1, plan::I64}, // another ignore_index
    {2, 4, 6, {5, -100, 0, 1, 2, 3, -100, 4}, false, -100, plan::I64},
};

KernelCall lossCall(const LossCase &c, uint64_t seed) {
  int64_t rows = c.batch * c.seq;
  KernelCall call(registry(), "cross_entropy");
  call.input(randomTensor({rows, c.vocab}, seed, 3.0f))
      .input(indexTensor(c.labelType, {rows}, c.labels))
      .sequences(c.seq, c.batch)
      .output(plan::F32, {});
  if (c.shift)
    call.attr("shift_labels", true);
  if (c.ignore != -100)
    call.attr("ignore_index", c.ignore);
  return call;
}

TEST(CrossEntropy, MatchesCausalLmLoss) {
  for (const LossCase &c : kLossCases) {
    KernelCall call = lossCall(c, 40);
    call.run();
    double want = causalLmLossReference(call.inputsRef()[0].floats(), c.labels, c.batch, c.seq,
                                        c.vocab, c.ignore, c.shift);
    expectNear(call.result(0).floats(), {want}, 1e-6, "cross_entropy");
  }
}

// With shift_labels the first label of every sequence is never a target and
// the last position of every sequence is never scored: the shift stays
// inside its sequence.
TEST(CrossEntropy, ShiftStaysInsideEachSequence) {
  LossCase c = kLossCases[0];
  KernelCall call = lossCall(c, 41);
  call.run();
  float loss = call.result(0).floats()[0];
  std::vector<int64_t> changed = c.labels;
  changed[0] = 6;
  changed[c.seq] = 6; // first label of sequence 1
  call.inputsRef()[1] = indexTensor(c.labelType, {c.batch * c.seq}, changed);
  call.run();
  EXPECT_EQ(call.result(0).floats()[0], loss);

  // One sequence of 10 rows would score row 4 against labels[5].
  KernelCall oneSequence = lossCall(c, 41);
  oneSequence.sequences(c.batch * c.seq, 1).run();
  EXPECT_NE(oneSequence.result(0).floats()[0], loss);
  expectNear(oneSequence.result(0).floats(),
             {causalLmLossReference(oneSequence.inputsRef()[0].floats(), c.labels, 1,
                                    c.batch * c.seq, c.vocab, -100, true)},
             1e-6, "one sequence");
}

TEST(CrossEntropy, NothingCountedGivesZeroLossAndGradient) {
  LossCase c{2, 3, 4, {1, -100, -100, 2, -100, -100}, true, -100, plan::I64};
  KernelCall call = lossCall(c, 42);
  call.run();
  EXPECT_EQ(call.result(0).floats()[0], 0.0f);
  KernelCall backward = backwardOf(call, {0}, {{0, floatTensor({}, {1.0f})}});
  backward.run();
  expectNear(backward.result(0).floats(), std::vector<double>(24, 0.0), 0, "zero gradient");
}

TEST(CrossEntropy, BackwardMatchesFiniteDifferencesAndReference) {
  for (const LossCase &c : kLossCases) {
    KernelCall call = lossCall(c, 43);
    GradientCheck check = checkGradients(registry(), call, {0});
    EXPECT_LT(check.worstRelativeError, 1e-2) << check.report;

    // d loss / d logits[t, v] = (softmax - onehot(target)) / counted, times dloss.
    const double dloss = 0.7;
    std::vector<float> logits = call.inputsRef()[0].floats();
    int64_t rows = c.batch * c.seq;
    std::vector<int64_t> targets;
    for (int64_t t = 0; t < rows; ++t)
      targets.push_back(!c.shift ? c.labels[t] : (t + 1) % c.seq ? c.labels[t + 1] : c.ignore);
    double counted = 0;
    for (int64_t target : targets)
      counted += target != c.ignore;
    std::vector<double> want(rows * c.vocab, 0.0);
    for (int64_t t = 0; t < rows; ++t) {
      if (targets[t] == c.ignore)
        continue;
      double z = 0;
      for (int64_t v = 0; v < c.vocab; ++v)
        z += std::exp(double(logits[t * c.vocab + v]));
      for (int64_t v = 0; v < c.vocab; ++v)
        want[t * c.vocab + v] =
            dloss * (std::exp(double(logits[t * c.vocab + v])) / z - (v == targets[t])) / counted;
    }
    KernelCall backward = backwardOf(call, {0}, {{0, floatTensor({}, {float(dloss)})}});
    backward.run();
    expectNear(backward.result(0).floats(), want, 1e-6, "cross_entropy d logits");
  }
}

TEST(CrossEntropy, RejectsBadLaunches) {
  LossCase c = kLossCases[0];
  KernelCall outside = lossCall(c, 1);
  std::vector<int64_t> labels = c.labels;
  labels[3] = 7;
  outside.inputsRef()[1] = indexTensor(plan::I64, {10}, labels);
  EXPECT_THAT(failureOf(outside),
              HasSubstr("label 7 at row 3 is neither ignore_index (-100) nor in [0, 7)"));

  KernelCall ragged = lossCall(c, 1);
  ragged.sequences(4, 2);
  EXPECT_THAT(failureOf(ragged), HasSubstr("10 rows are not a multiple of seq_len 4"));

  KernelCall wrongLoss = lossCall(c, 1);
  wrongLoss.result(0) = zeroTensor(plan::F32, {1});
  EXPECT_THAT(failureOf(wrongLoss), HasSubstr("loss has shape [1], expected []"));

  KernelCall wrongLabels = lossCall(c, 1);
  wrongLabels.inputsRef()[1] = indexTensor(plan::I64, {9}, std::vector<int64_t>(9, 0));
  EXPECT_THAT(failureOf(wrongLabels), HasSubstr("labels has shape [9], expected [10]"));

  KernelCall call = lossCall(c, 1);
  KernelCall noSeed = backwardOf(call, {0}, {{0, floatTensor({2}, {1.0f, 1.0f})}});
  EXPECT_THAT(failureOf(noSeed), HasSubstr("the result gradient has shape [2], expected []"));
}

KernelCall shiftCall(plan::DType type, const std::vector<int64_t> &labels, int64_t seq) {
  int64_t rows = static_cast<int64_t>(labels.size());
  KernelCall call(registry(), "shift_labels");
  call.input(indexTensor(type, {rows}, labels)).sequences(seq, rows / seq).output(type, {rows});
  return call;
}

TEST(ShiftLabels, TakesEachNextLabelWithinItsSequence) {
  for (plan::DType type : {plan::I32, plan::I64}) {
    KernelCall call = shiftCall(type, {10, 11, -100, 13, 20, 21, 22, 23}, 4);
    call.run();
    EXPECT_EQ(call.result(0).indices(), (std::vector<int64_t>{11, -100, 13, -100, 21, 22, 23, -100}));
    KernelCall other = shiftCall(type, {1, 2, 3, 4}, 2);
    other.attr("ignore_index", int64_t{-1});
    other.run();
    EXPECT_EQ(other.result(0).indices(), (std::vector<int64_t>{2, -1, 4, -1}));
  }
}

// Sequence parallel's loss: the shift done first, then scored without one, is the loss.
TEST(ShiftLabels, ThenUnshiftedLossIsTheShiftedLoss) {
  for (const LossCase &c : kLossCases) {
    if (!c.shift)
      continue;
    KernelCall shifted = lossCall(c, 41);
    shifted.run();
    KernelCall shift = shiftCall(c.labelType, c.labels, c.seq);
    if (c.ignore != -100)
      shift.attr("ignore_index", c.ignore);
    shift.run();
    LossCase plain = c;
    plain.shift = false;
    plain.labels = shift.result(0).indices();
    KernelCall unshifted = lossCall(plain, 41);
    unshifted.run();
    expectNear(unshifted.result(0).floats(), {shifted.result(0).floats()[0]}, 1e-7, "loss of shifted labels");
  }
}

TEST(ShiftLabels, RejectsBadLaunches) {
  KernelCall ragged = shiftCall(plan::I64, {1, 2, 3, 4, 5, 6}, 4);
  EXPECT_THAT(failureOf(ragged), HasSubstr("6 labels are not a multiple of seq_len 4"));
  KernelCall mixed = shiftCall(plan::I64, {1, 2, 3, 4}, 4);
  mixed.result(0) = zeroTensor(plan::I32, {4});
  EXPECT_THAT(failureOf(mixed), HasSubstr("the result must have the labels' index type"));
  KernelCall floats(registry(), "shift_labels");
  floats.input(floatTensor({4}, {1, 2, 3, 4})).sequences(4, 1).output(plan::F32, {4});
  EXPECT_THAT(failureOf(floats), HasSubstr("labels"));
}

TEST(CrossEntropy, SameBitsForAnyThreadCount) {
  std::vector<int64_t> labels;
  for (int64_t t = 0; t < 400; ++t)
    labels.push_back(t % 11 == 0 ? -100 : (t * 31) % 50);
  LossCase c{4, 100, 50, labels, true, -100, plan::I64};
  ThreadPool two(2), three(3);
  std::vector<std::vector<float>> runs;
  for (ThreadPool *pool : {static_cast<ThreadPool *>(nullptr), &two, &three}) {
    KernelCall call = lossCall(c, 44);
    call.threads(pool).run();
    KernelCall backward = backwardOf(call, {0}, {{0, floatTensor({}, {1.0f})}});
    backward.threads(pool).run();
    std::vector<float> all = backward.result(0).floats();
    all.push_back(call.result(0).floats()[0]);
    runs.push_back(all);
  }
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_EQ(runs[0], runs[2]);
}

} // namespace
} // namespace moec::runtime::cpu::core::testing
