//===- LmHeadLossTest.cpp - the fused LM head and loss against the unfused kernels -===//
//
// lm_head_cross_entropy must compute cross_entropy(linear(x, W), labels) and its
// backward the gradients that cross_entropy.backward then linear.backward give: the
// oracle here is those two CPU kernels run one after the other, on ragged chunkings
// (token counts that no chunk divides), several sequences, ignored labels.
//
//===----------------------------------------------------------------------===//

#include <cmath>
#include <cstring>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/kernels/cpu/core/CoreTestUtil.h"

namespace moec::runtime::cpu::core::testing {
namespace {

using ::testing::HasSubstr;

struct HeadCase {
  int64_t batch, seq, hidden, vocab, chunk; // chunk 0: the attribute left out (default 1024)
  bool shift;
  int64_t ignore;
  plan::DType labelType;
  std::string name;
};

std::vector<HeadCase> headCases() {
  return {
      {3, 7, 12, 37, 4, true, -100, plan::I64, "3x7 rows in chunks of 4, shifted"},
      {2, 9, 16, 50, 5, false, -100, plan::I32, "2x9 rows in chunks of 5, unshifted, i32 labels"},
      {1, 13, 8, 29, 1, true, -1, plan::I64, "chunks of one row, ignore_index -1"},
      {2, 10, 20, 64, 0, true, -100, plan::I64, "the default chunk, larger than the batch"},
      {4, 6, 10, 33, 24, true, -100, plan::I32, "one chunk of exactly every row"},
      {2, 11, 9, 300, 7, true, -100, plan::I64, "a wide vocabulary"},
  };
}

/// Labels with ignored positions, both ends of the vocabulary and the sequence edges.
std::vector<int64_t> labelsFor(const HeadCase &c) {
  std::vector<int64_t> labels;
  int64_t rows = c.batch * c.seq;
  for (int64_t t = 0; t < rows; ++t)
    labels.push_back(t % 4 == 1 ? c.ignore : t % 7 == 3 ? c.vocab - 1 : (t * 7919 + 3) % c.vocab);
  return labels;
}

void setLossAttrs(KernelCall &call, const HeadCase &c) {
  call.sequences(c.seq, c.batch);
  if (c.shift)
    call.attr("shift_labels", true);
  if (c.ignore != -100)
    call.attr("ignore_index", c.ignore);
}

KernelCall fusedCall(const HeadCase &c, uint64_t seed, const std::vector<int64_t> &labels) {
  int64_t rows = c.batch * c.seq;
  KernelCall call(registry(), "lm_head_cross_entropy");
  call.input(randomTensor({rows, c.hidden}, seed, 2.0f))
      .input(randomTensor({c.vocab, c.hidden}, seed + 1, 0.7f))
      .input(indexTensor(c.labelType, {rows}, labels))
      .output(plan::F32, {})
      .output(plan::F32, {rows});
  setLossAttrs(call, c);
  if (c.chunk)
    call.attr("chunk_tokens", c.chunk);
  return call;
}

/// The unfused oracle: linear, then cross_entropy, on the fused call's inputs.
struct Unfused {
  KernelCall linear, loss;
};

Unfused unfusedOf(KernelCall &fused, const HeadCase &c) {
  int64_t rows = c.batch * c.seq;
  Unfused u{KernelCall(registry(), "linear"), KernelCall(registry(), "cross_entropy")};
  u.linear.input(fused.inputsRef()[0]).input(fused.inputsRef()[1]).output(plan::F32, {rows, c.vocab});
  u.linear.run();
  u.loss.input(u.linear.result(0)).input(fused.inputsRef()[2]).output(plan::F32, {});
  setLossAttrs(u.loss, c);
  u.loss.run();
  return u;
}

TEST(LmHeadCrossEntropy, MatchesLinearThenCrossEntropy) {
  for (const HeadCase &c : headCases()) {
    KernelCall fused = fusedCall(c, 10, labelsFor(c));
    fused.run();
    Unfused u = unfusedOf(fused, c);
    expectNear(fused.result(0).floats(), widen(u.loss.result(0)), 1e-6, c.name + ": loss");
    // The logsumexp of each counted row, 0 elsewhere.
    std::vector<float> logits = u.linear.result(0).floats(), lse = fused.result(1).floats();
    std::vector<int64_t> labels = fused.inputsRef()[2].indices();
    int64_t rows = c.batch * c.seq;
    for (int64_t t = 0; t < rows; ++t) {
      bool counted = !(c.shift && (t + 1) % c.seq == 0) && labels[c.shift ? t + 1 : t] != c.ignore;
      double top = -INFINITY, sum = 0;
      for (int64_t v = 0; v < c.vocab; ++v)
        top = std::max<double>(top, logits[t * c.vocab + v]);
      for (int64_t v = 0; v < c.vocab; ++v)
        sum += std::exp(logits[t * c.vocab + v] - top);
      double want = counted ? top + std::log(sum) : 0.0;
      EXPECT_NEAR(lse[t], want, 1e-5 * std::max(1.0, std::abs(want))) << c.name << ": row " << t;
    }
  }
}

TEST(LmHeadCrossEntropy, BackwardMatchesTheUnfusedBackwards) {
  for (const HeadCase &c : headCases())
    for (std::vector<int64_t> wrt : {std::vector<int64_t>{0}, {1}, {0, 1}})
      for (float dloss : {1.0f, 0.7f}) {
        std::string what = c.name + ", grads of " + std::to_string(wrt.size() == 2 ? -1 : wrt[0]) +
                           ", d loss " + std::to_string(dloss);
        KernelCall fused = fusedCall(c, 20, labelsFor(c));
        KernelCall backward = backwardWithResultsOf(fused, wrt, {{0, floatTensor({}, {dloss})}});
        backward.run();
        Unfused u = unfusedOf(fused, c);
        KernelCall lossBackward = backwardOf(u.loss, {0}, {{0, floatTensor({}, {dloss})}});
        lossBackward.run();
        KernelCall linearBackward = backwardOf(u.linear, wrt, {{0, lossBackward.result(0)}});
        linearBackward.run();
        for (size_t k = 0; k < wrt.size(); ++k)
          expectNear(backward.result(k).floats(), widen(linearBackward.result(k)), 1e-6,
                     what + ": gradient " + std::to_string(k));
      }
}

/// `t` rounded to bf16 in place (nearest, ties to even), as the CPU's bf16 emulation rounds buffers.
void roundToBf16(OwnedTensor &t) {
  auto *values = reinterpret_cast<float *>(t.bytes.data());
  for (int64_t i = 0; i < t.numel(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &values[i], sizeof(bits));
    bits = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
    std::memcpy(&values[i], &bits, sizeof(bits));
  }
}

// A bf16 model on the CPU (f32 buffers rounded to bf16 after each kernel): with logits_type
// bf16 the fused kernel rounds its logits and their gradient where the unfused kernels' output
// buffers would be rounded, so both paths compute the same function.
TEST(LmHeadCrossEntropy, Bf16LogitsRoundWhereTheUnfusedBuffersDo) {
  for (const HeadCase &c : headCases()) {
    KernelCall fused = fusedCall(c, 80, labelsFor(c));
    fused.attr("logits_type", "bf16");
    roundToBf16(fused.inputsRef()[0]);
    roundToBf16(fused.inputsRef()[1]);
    KernelCall backward = backwardWithResultsOf(fused, {0, 1}, {{0, floatTensor({}, {1.0f})}});
    backward.run();

    int64_t rows = c.batch * c.seq;
    Unfused u{KernelCall(registry(), "linear"), KernelCall(registry(), "cross_entropy")};
    u.linear.input(fused.inputsRef()[0]).input(fused.inputsRef()[1]).output(plan::F32, {rows, c.vocab});
    u.linear.run();
    roundToBf16(u.linear.result(0)); // the logits buffer is bf16
    u.loss.input(u.linear.result(0)).input(fused.inputsRef()[2]).output(plan::F32, {});
    setLossAttrs(u.loss, c);
    u.loss.run();
    expectNear(fused.result(0).floats(), widen(u.loss.result(0)), 1e-6, c.name + ": bf16 loss");
    KernelCall lossBackward = backwardOf(u.loss, {0}, {{0, floatTensor({}, {1.0f})}});
    lossBackward.run();
    roundToBf16(lossBackward.result(0)); // so is its gradient
    KernelCall linearBackward = backwardOf(u.linear, {0, 1}, {{0, lossBackward.result(0)}});
    linearBackward.run();
    for (size_t k = 0; k < 2; ++k)
      expectNear(backward.result(k).floats(), widen(linearBackward.result(k)), 1e-6,
                 c.name + ": bf16 gradient " + std::to_string(k));

    // Not rounding would be a different function: the test can tell them apart.
    KernelCall unrounded = fusedCall(c, 80, labelsFor(c));
    roundToBf16(unrounded.inputsRef()[0]);
    roundToBf16(unrounded.inputsRef()[1]);
    KernelCall unroundedBackward = backwardWithResultsOf(unrounded, {0}, {{0, floatTensor({}, {1.0f})}});
    unroundedBackward.run();
    EXPECT_NE(unroundedBackward.result(0).floats(), backward.result(0).floats()) << c.name;
  }
}

// A frozen head's form (--moe-fuse): the forward's input_grad is the backward's input gradient
// for a loss gradient of 1, and the backward that reads it gives the gradients of the form
// without it (exactly at d loss 1, where the scaling is exact; in bf16 logits too).
TEST(LmHeadCrossEntropy, InputGradFromTheForwardMatchesTheBackward) {
  for (const HeadCase &c : headCases())
    for (bool bf16 : {false, true})
      for (std::vector<int64_t> wrt : {std::vector<int64_t>{0}, {0, 1}})
        for (float dloss : {1.0f, 0.7f}) {
          std::string what = c.name + (bf16 ? ", bf16 logits" : "") + (wrt.size() == 2 ? ", both grads" : "") +
                             ", d loss " + std::to_string(dloss);
          auto make = [&] {
            KernelCall fused = fusedCall(c, 90, labelsFor(c));
            if (bf16)
              fused.attr("logits_type", "bf16");
            return fused;
          };
          KernelCall plain = make();
          KernelCall plainBackward = backwardWithResultsOf(plain, wrt, {{0, floatTensor({}, {dloss})}});
          plainBackward.run();
          KernelCall saving = make();
          saving.output(plan::F32, {c.batch * c.seq, c.hidden});
          KernelCall savedBackward = backwardWithResultsOf(saving, wrt, {{0, floatTensor({}, {dloss})}});
          savedBackward.run();
          EXPECT_EQ(saving.result(0).floats(), plain.result(0).floats()) << what << ": loss";
          EXPECT_EQ(saving.result(1).floats(), plain.result(1).floats()) << what << ": logsumexp";
          if (dloss == 1.0f) {
            EXPECT_EQ(saving.result(2).floats(), plainBackward.result(0).floats()) << what << ": input_grad";
            EXPECT_EQ(savedBackward.result(0).floats(), plainBackward.result(0).floats()) << what;
          } else { // with bf16 logits, d logits round at scale 1 / counted instead of dloss / counted
            expectNear(savedBackward.result(0).floats(), widen(plainBackward.result(0)), bf16 ? 5e-4 : 1e-6,
                       what + ": input gradient");
          }
          if (wrt.size() == 2)
            EXPECT_EQ(savedBackward.result(1).floats(), plainBackward.result(1).floats()) << what << ": weight";
        }
}

TEST(LmHeadCrossEntropy, BackwardMatchesFiniteDifferences) {
  for (const HeadCase &c : headCases()) {
    KernelCall fused = fusedCall(c, 30, labelsFor(c));
    GradientCheck check = checkGradients(registry(), fused, {0, 1}, /*outputsWithGrad=*/{0},
                                         /*backwardUsesResults=*/true);
    EXPECT_LT(check.worstRelativeError, 1e-2) << c.name << "\n" << check.report;
  }
}

// The chunk size changes only the blocking of the products, not the result.
TEST(LmHeadCrossEntropy, ChunkSizeDoesNotChangeTheResult) {
  HeadCase c = headCases()[0];
  std::vector<std::vector<float>> losses, inputGrads, weightGrads;
  for (int64_t chunk : {1, 2, 5, 20, 21, 1000}) {
    c.chunk = chunk;
    KernelCall fused = fusedCall(c, 40, labelsFor(c));
    KernelCall backward = backwardWithResultsOf(fused, {0, 1}, {{0, floatTensor({}, {1.0f})}});
    backward.run();
    losses.push_back(fused.result(0).floats());
    inputGrads.push_back(backward.result(0).floats());
    weightGrads.push_back(backward.result(1).floats());
  }
  for (size_t k = 1; k < losses.size(); ++k) {
    expectNear(losses[k], {losses[0].begin(), losses[0].end()}, 1e-6, "loss");
    expectNear(inputGrads[k], {inputGrads[0].begin(), inputGrads[0].end()}, 1e-6, "input gradient");
    expectNear(weightGrads[k], {weightGrads[0].begin(), weightGrads[0].end()}, 1e-6, "weight gradient");
  }
}

TEST(LmHeadCrossEntropy, NothingCountedGivesZeroLossAndGradients) {
  HeadCase c = headCases()[0];
  KernelCall fused = fusedCall(c, 50, std::vector<int64_t>(c.batch * c.seq, -100));
  KernelCall backward = backwardWithResultsOf(fused, {0, 1}, {{0, floatTensor({}, {1.0f})}});
  backward.run();
  EXPECT_EQ(fused.result(0).floats(), std::vector<float>{0.0f});
  for (float v : fused.result(1).floats())
    EXPECT_EQ(v, 0.0f);
  for (size_t k = 0; k < 2; ++k)
    for (float v : backward.result(k).floats())
      EXPECT_EQ(v, 0.0f);
}

TEST(LmHeadCrossEntropy, SameBitsForAnyThreadCount) {
  HeadCase c = headCases()[5];
  ThreadPool two(2), three(3);
  std::vector<std::vector<float>> runs;
  for (ThreadPool *pool : {static_cast<ThreadPool *>(nullptr), &two, &three}) {
    KernelCall fused = fusedCall(c, 60, labelsFor(c));
    fused.threads(pool);
    KernelCall backward = backwardWithResultsOf(fused, {0}, {{0, floatTensor({}, {1.0f})}});
    backward.threads(pool).run();
    std::vector<float> out = fused.result(0).floats();
    for (float v : backward.result(0).floats())
      out.push_back(v);
    runs.push_back(out);
  }
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_EQ(runs[0], runs[2]);
}

TEST(LmHeadCrossEntropy, RejectsBadLaunches) {
  HeadCase c = headCases()[0];
  std::vector<int64_t> labels = labelsFor(c);
  labels[4] = c.vocab;
  KernelCall outside = fusedCall(c, 1, labels);
  EXPECT_THAT(failureOf(outside),
              HasSubstr("label 37 at row 4 is neither ignore_index (-100) nor in [0, 37)"));

  KernelCall ragged = fusedCall(c, 1, labelsFor(c));
  ragged.sequences(4, 1);
  EXPECT_THAT(failureOf(ragged), HasSubstr("shift_labels needs whole sequences: 21 rows are not a "
                                           "multiple of seq_len 4"));

  KernelCall chunk = fusedCall(c, 1, labelsFor(c));
  chunk.attr("chunk_tokens", int64_t(0));
  EXPECT_THAT(failureOf(chunk), HasSubstr("chunk_tokens must be positive, got 0"));

  KernelCall half = fusedCall(c, 1, labelsFor(c));
  half.attr("logits_type", "f16");
  EXPECT_THAT(failureOf(half), HasSubstr("logits_type must be f32 or bf16, got f16"));

  KernelCall wrongHidden(registry(), "lm_head_cross_entropy");
  wrongHidden.input(randomTensor({21, 12}, 1))
      .input(randomTensor({37, 11}, 2))
      .input(indexTensor(plan::I64, {21}, labelsFor(c)))
      .output(plan::F32, {})
      .output(plan::F32, {21});
  EXPECT_THAT(failureOf(wrongHidden), HasSubstr("weight"));

  KernelCall wrongLse = fusedCall(c, 1, labelsFor(c));
  wrongLse.result(1).shape = {20};
  wrongLse.result(1).bytes.resize(20 * sizeof(float));
  EXPECT_THAT(failureOf(wrongLse), HasSubstr("logsumexp"));

  // The backward needs the forward's results and takes no gradient of the logsumexp.
  KernelCall fused = fusedCall(c, 1, labelsFor(c));
  KernelCall noResults = backwardOf(fused, {0}, {{0, floatTensor({}, {1.0f})}});
  EXPECT_THAT(failureOf(noResults), HasSubstr("needs the forward's results"));
  KernelCall lseGrad =
      backwardWithResultsOf(fused, {0}, {{0, floatTensor({}, {1.0f})}, {1, randomTensor({21}, 3)}});
  EXPECT_THAT(failureOf(lseGrad), HasSubstr("only the loss result takes a gradient"));
  KernelCall labelsGrad = backwardWithResultsOf(fused, {2}, {{0, floatTensor({}, {1.0f})}});
  EXPECT_THAT(failureOf(labelsGrad), HasSubstr("operand 2 has no gradient"));
}

} // namespace
} // namespace moec::runtime::cpu::core::testing
