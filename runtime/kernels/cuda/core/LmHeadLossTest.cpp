//===- LmHeadLossTest.cpp - the fused LM head and loss on CUDA against the CPU -===//
//
// The CPU twin (itself checked against linear then cross_entropy in
// cpu/core/LmHeadLossTest.cpp) is the oracle, in f32 and in bf16 storage, on
// token counts no chunk divides, vocabularies that are not multiples of any
// block, several sequences, ignored labels, and every gradient combination;
// the frozen head's form too (input_grad from the forward, the backward from it).
//
//===----------------------------------------------------------------------===//

#include <cmath>
#include <cstring>

#include "runtime/kernels/cuda/core/CoreCompare.h"

namespace moec::runtime::cuda::core::testing {
namespace {

using moec::runtime::cpu::core::testing::backwardWithResultsOf;

struct HeadCase {
  int64_t batch, seq, hidden, vocab, chunk; // chunk 0: the attribute left out (default 1024)
  bool shift;
  int64_t ignore;
  plan::DType labelType;
  bool nothingCounted = false;
};

std::vector<HeadCase> headCases() {
  return {
      // The CPU test's shapes.
      {3, 7, 12, 37, 4, true, -100, plan::I64},
      {2, 9, 16, 50, 5, false, -100, plan::I32},
      {1, 13, 8, 29, 1, true, -1, plan::I64},
      {2, 10, 20, 64, 0, true, -100, plan::I64},
      {4, 6, 10, 33, 24, true, -100, plan::I32},
      {2, 11, 9, 300, 7, true, -100, plan::I64},
      // A large vocabulary (no multiple of a block or a GEMM tile), chunks that leave a ragged last one.
      {2, 150, 64, 40007, 96, true, -100, plan::I64},
      {1, 257, 128, 1000, 64, false, -100, plan::I32},
      {3, 33, 48, 5003, 0, true, -100, plan::I64},
      // Vocabularies of multiples of 8: the forward's input gradient in bf16 takes 16-byte passes.
      {2, 150, 64, 40000, 96, true, -100, plan::I64},
      // Nothing counted: loss and gradients 0.
      {2, 9, 16, 50, 4, true, -100, plan::I64, true},
      {2, 9, 16, 64, 4, true, -100, plan::I64, true},
  };
}

std::string name(const HeadCase &c) {
  return "lm_head_cross_entropy " + std::to_string(c.batch) + " x " + std::to_string(c.seq) +
         " rows, hidden " + std::to_string(c.hidden) + ", vocab " + std::to_string(c.vocab) + ", chunk " +
         std::to_string(c.chunk) + (c.shift ? ", shifted" : "") +
         (c.nothingCounted ? ", nothing counted" : "");
}

std::vector<int64_t> labelsFor(const HeadCase &c) {
  std::vector<int64_t> labels;
  for (int64_t t = 0; t < c.batch * c.seq; ++t)
    labels.push_back(c.nothingCounted ? c.ignore
                     : t % 4 == 1     ? c.ignore
                     : t % 7 == 3     ? c.vocab - 1
                                      : (t * 7919 + 3) % c.vocab);
  return labels;
}

/// Values bf16 can hold, so that the forward the backward launch reads (its logsumexp) saw
/// the inputs both sides see in bf16 storage.
OwnedTensor bf16Valued(OwnedTensor t) {
  auto *values = reinterpret_cast<float *>(t.bytes.data());
  for (int64_t i = 0; i < t.numel(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &values[i], sizeof(bits));
    bits = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u; // round to nearest even
    std::memcpy(&values[i], &bits, sizeof(bits));
  }
  return t;
}

/// Logits of a few units, as a trained head gives: input in [-2, 2), weight scaled by 1/sqrt(H).
/// In bf16 storage the launch says logits_type bf16, as a bf16 plan's does: the CPU oracle then
/// rounds the logits and their gradient where the GPU's bf16 scratch holds them.
KernelCall fusedCall(const HeadCase &c, uint64_t seed, plan::DType storage) {
  int64_t rows = c.batch * c.seq;
  KernelCall call(registry(), "lm_head_cross_entropy");
  call.input(bf16Valued(randomTensor({rows, c.hidden}, seed, 2.0f)))
      .input(bf16Valued(randomTensor({c.vocab, c.hidden}, seed + 1,
                                     1.5f / std::sqrt(static_cast<float>(c.hidden)))))
      .input(indexTensor(c.labelType, {rows}, labelsFor(c)))
      .output(plan::F32, {})
      .output(plan::F32, {rows})
      .sequences(c.seq, c.batch);
  if (c.shift)
    call.attr("shift_labels", true);
  if (c.ignore != -100)
    call.attr("ignore_index", c.ignore);
  if (c.chunk)
    call.attr("chunk_tokens", c.chunk);
  call.attr("logits_type", storage == plan::BF16 ? "bf16" : "f32");
  return call;
}

/// Compares in f32 and in bf16 storage, each launch made for its storage.
void expectMatchesCpuBoth(const std::function<KernelCall(plan::DType)> &make, const std::string &what,
                          const CudaCompareOptions &options) {
  for (plan::DType storage : {plan::F32, plan::BF16})
    expectMatchesCpuIn(storage, [&] { return make(storage); }, what, options);
}

TEST(CudaLmHeadCrossEntropy, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  CudaCompareOptions options;
  options.f32Outputs = {0, 1}; // the loss and the logsumexp stay f32
  for (const HeadCase &c : headCases())
    expectMatchesCpuBoth([&](plan::DType storage) { return fusedCall(c, 70, storage); }, name(c), options);
}

// The shift follows the sequences: the same rows as one sequence score other positions.
TEST(CudaLmHeadCrossEntropy, ShiftFollowsTheSequences) {
  SKIP_WITHOUT_GPU();
  CudaCompareOptions options;
  options.f32Outputs = {0, 1};
  HeadCase c = headCases()[0];
  expectMatchesCpuBoth(
      [&](plan::DType storage) {
        KernelCall call = fusedCall(c, 71, storage);
        call.sequences(c.batch * c.seq, 1);
        return call;
      },
      name(c) + " as one sequence", options);
}

TEST(CudaLmHeadCrossEntropy, BackwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  CudaCompareOptions options;
  options.f32Inputs = {3, 4, 5}; // the forward's loss and logsumexp, d loss: f32
  for (const HeadCase &c : headCases())
    for (std::vector<int64_t> wrt : {std::vector<int64_t>{0}, {1}, {0, 1}})
      for (float dloss : {1.0f, 0.7f})
        expectMatchesCpuBoth(
            [&](plan::DType storage) {
              KernelCall forward = fusedCall(c, 72, storage);
              return backwardWithResultsOf(forward, wrt, {{0, floatTensor({}, {dloss})}});
            },
            name(c) + " backward of " + shapeText(wrt) + ", d loss " + std::to_string(dloss), options);
}

// d loss in the storage type works too (a bf16 seed).
TEST(CudaLmHeadCrossEntropy, BackwardWithBf16Seed) {
  SKIP_WITHOUT_GPU();
  CudaCompareOptions options;
  options.f32Inputs = {3, 4};
  for (const HeadCase &c : headCases())
    expectMatchesCpuIn(
        plan::BF16,
        [&] {
          KernelCall forward = fusedCall(c, 73, plan::BF16);
          return backwardWithResultsOf(forward, {0, 1}, {{0, floatTensor({}, {0.5f})}});
        },
        name(c) + " backward, bf16 d loss", options);
}

/// fusedCall with the input_grad result (a frozen head's form: the input's gradient from the forward).
KernelCall savingCall(const HeadCase &c, uint64_t seed, plan::DType storage) {
  KernelCall call = fusedCall(c, seed, storage);
  call.output(plan::F32, {c.batch * c.seq, c.hidden});
  return call;
}

TEST(CudaLmHeadCrossEntropy, InputGradMatchesCpu) {
  SKIP_WITHOUT_GPU();
  CudaCompareOptions options;
  options.f32Outputs = {0, 1}; // input_grad is in the storage type
  for (const HeadCase &c : headCases())
    expectMatchesCpuBoth([&](plan::DType storage) { return savingCall(c, 75, storage); },
                         name(c) + " with input_grad", options);
}

TEST(CudaLmHeadCrossEntropy, BackwardFromInputGradMatchesCpu) {
  SKIP_WITHOUT_GPU();
  CudaCompareOptions options;
  options.f32Inputs = {3, 4, 6}; // the loss, the logsumexp and d loss (input_grad: the storage type)
  for (const HeadCase &c : headCases())
    for (std::vector<int64_t> wrt : {std::vector<int64_t>{0}, {0, 1}})
      for (float dloss : {1.0f, 0.7f})
        expectMatchesCpuBoth(
            [&](plan::DType storage) {
              KernelCall forward = savingCall(c, 76, storage);
              return backwardWithResultsOf(forward, wrt, {{0, floatTensor({}, {dloss})}});
            },
            name(c) + " backward from input_grad of " + shapeText(wrt) + ", d loss " + std::to_string(dloss),
            options);
}

// Every launch above runs on the CPU oracle (checked here, without a GPU, so that a GPU run
// compares kernels instead of finding a bad test launch).
TEST(CudaLmHeadCrossEntropy, LaunchesAreValidOnTheCpu) {
  for (const HeadCase &c : headCases())
    for (plan::DType storage : {plan::F32, plan::BF16}) {
      KernelCall forward = fusedCall(c, 74, storage);
      for (std::vector<int64_t> wrt : {std::vector<int64_t>{0}, {1}, {0, 1}}) {
        KernelCall backward = backwardWithResultsOf(forward, wrt, {{0, floatTensor({}, {0.7f})}});
        backward.run();
      }
      KernelCall saving = savingCall(c, 74, storage);
      KernelCall fromSaved = backwardWithResultsOf(saving, {0, 1}, {{0, floatTensor({}, {0.7f})}});
      fromSaved.run();
      EXPECT_EQ(forward.result(0).floats()[0] == 0.0f, c.nothingCounted) << name(c);
    }
}

// The host-side checks refuse what the CPU refuses, with its messages.
TEST(CudaLmHeadCrossEntropy, RefusesWhatTheCpuRefuses) {
  HeadCase c = headCases()[0];
  KernelCall chunk = fusedCall(c, 1, plan::F32);
  chunk.attr("chunk_tokens", int64_t(0));
  EXPECT_NE(cudaFailureOf(chunk).find("chunk_tokens must be positive, got 0"), std::string::npos);
  KernelCall ragged = fusedCall(c, 1, plan::F32);
  ragged.sequences(4, 1);
  EXPECT_NE(cudaFailureOf(ragged).find("shift_labels needs whole sequences"), std::string::npos);
  // The chunk is held in the storage type: logits_type must name it.
  KernelCall mismatch = fusedCall(c, 1, plan::BF16); // f32 tensors here
  EXPECT_NE(cudaFailureOf(mismatch).find("logits_type bf16 differs from the input's f32"), std::string::npos);
  KernelCall forward = fusedCall(c, 1, plan::F32);
  KernelCall lseGrad =
      backwardWithResultsOf(forward, {0}, {{0, floatTensor({}, {1.0f})}, {1, randomTensor({21}, 3)}});
  EXPECT_NE(cudaFailureOf(lseGrad).find("only the loss result takes a gradient"), std::string::npos);
}

} // namespace
} // namespace moec::runtime::cuda::core::testing
