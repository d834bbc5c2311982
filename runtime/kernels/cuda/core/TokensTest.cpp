//===- TokensTest.cpp - embedding, cross_entropy, shift_labels on CUDA against the CPU -===//

#include "runtime/kernels/cuda/core/CoreCompare.h"

namespace moec::runtime::cuda::core::testing {
namespace {

KernelCall embeddingCall(plan::DType idType, const std::vector<int64_t> &ids, int64_t vocab,
                         int64_t dim) {
  KernelCall call(registry(), "embedding");
  call.input(indexTensor(idType, {static_cast<int64_t>(ids.size())}, ids))
      .input(randomTensor({vocab, dim}, 30))
      .output(plan::F32, {static_cast<int64_t>(ids.size()), dim});
  return call;
}

struct EmbeddingCase {
  std::vector<int64_t> ids;
  int64_t vocab, dim;
};

std::vector<EmbeddingCase> embeddingCases() {
  std::vector<EmbeddingCase> cases = {{{3, 0, 7, 3, 3, 5, 0}, 8, 5}}; // the CPU test's
  std::vector<int64_t> ids;
  for (int64_t t = 0; t < 500; ++t)
    ids.push_back((t * 7919) % 13); // every row used many times, 3 rows unused
  cases.push_back({ids, 16, 9});
  ids.clear();
  for (int64_t t = 0; t < 1000; ++t)
    ids.push_back((t * 104729 + 7) % 257); // rows of more than 256 features
  cases.push_back({ids, 300, 300});
  cases.push_back({std::vector<int64_t>(700, 3), 5, 33}); // one long run of a single id
  cases.push_back({{0}, 1, 1});
  ids.clear();
  for (int64_t t = 0; t < 100; ++t)
    ids.push_back(t % 2 ? 99999 - t : t * 977); // a large table, both ends
  cases.push_back({ids, 100000, 13});
  return cases;
}

std::string name(const EmbeddingCase &c) {
  return "embedding of " + std::to_string(c.ids.size()) + " ids, table [" +
         std::to_string(c.vocab) + "," + std::to_string(c.dim) + "]";
}

TEST(CudaEmbedding, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (const EmbeddingCase &c : embeddingCases())
    for (plan::DType idType : {plan::I32, plan::I64})
      expectMatchesCpu([&] { return embeddingCall(idType, c.ids, c.vocab, c.dim); }, name(c));
}

TEST(CudaEmbedding, BackwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (const EmbeddingCase &c : embeddingCases())
    for (plan::DType idType : {plan::I32, plan::I64})
      expectMatchesCpu(
          [&] {
            KernelCall forward = embeddingCall(idType, c.ids, c.vocab, c.dim);
            int64_t tokens = static_cast<int64_t>(c.ids.size());
            return backwardOf(forward, {1}, {{0, randomTensor({tokens, c.dim}, 31)}});
          },
          name(c) + " backward");
}

// The table gradient adds each row's tokens in token order, as the CPU does:
// the same bits in f32.
TEST(CudaEmbedding, BackwardIsExactInF32) {
  SKIP_WITHOUT_GPU();
  for (const EmbeddingCase &c : embeddingCases()) {
    CudaCompareOptions exact;
    exact.tolerance = 1e-30;
    expectMatchesCpuIn(
        plan::F32,
        [&] {
          KernelCall forward = embeddingCall(plan::I32, c.ids, c.vocab, c.dim);
          int64_t tokens = static_cast<int64_t>(c.ids.size());
          return backwardOf(forward, {1}, {{0, randomTensor({tokens, c.dim}, 32)}});
        },
        name(c) + " backward, exact", exact);
  }
}

//===----------------------------------------------------------------------===//
// cross_entropy
//===----------------------------------------------------------------------===//

struct LossCase {
  int64_t batch, seq, vocab;
  std::vector<int64_t> labels;
  bool shift;
  int64_t ignore; // the attribute is left out when it is -100
  plan::DType labelType;
};

std::vector<LossCase> lossCases() {
  std::vector<LossCase> cases = {
      // The CPU test's cases.
      {2, 5, 7, {1, 2, 3, -100, 6, 0, 4, 4, 5, -100}, true, -100, plan::I64},
      {1, 6, 5, {4, 0, 1, 2, 3, 3}, true, -100, plan::I32},
      {3, 3, 4, {0, 1, 2, 3, -1, 0, 2, 2, -1}, true, -1, plan::I64}, // another ignore_index
      {2, 4, 6, {5, -100, 0, 1, 2, 3, -100, 4}, false, -100, plan::I64},
      // Nothing counted: loss and gradient 0.
      {2, 3, 4, {1, -100, -100, 2, -100, -100}, true, -100, plan::I64},
  };
  // A large vocabulary (not a multiple of the block), several sequences.
  std::vector<int64_t> labels;
  for (int64_t t = 0; t < 21; ++t)
    labels.push_back(t % 5 == 2 ? -100 : (t * 7919 + 11) % 40007);
  cases.push_back({3, 7, 40007, labels, true, -100, plan::I64});
  cases.push_back({1, 21, 40007, labels, false, -100, plan::I32});
  // Many rows of a mid-sized vocabulary.
  labels.clear();
  for (int64_t t = 0; t < 400; ++t)
    labels.push_back(t % 11 == 0 ? -100 : (t * 31) % 50);
  cases.push_back({4, 100, 50, labels, true, -100, plan::I64});
  labels.clear();
  for (int64_t t = 0; t < 99; ++t)
    labels.push_back((t * 13) % 1000);
  cases.push_back({3, 33, 1000, labels, true, -100, plan::I32});
  return cases;
}

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

std::string name(const LossCase &c) {
  return "cross_entropy " + std::to_string(c.batch) + " x " + std::to_string(c.seq) +
         " rows, vocab " + std::to_string(c.vocab) + (c.shift ? ", shifted" : "");
}

TEST(CudaCrossEntropy, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  CudaCompareOptions options;
  options.f32Outputs = {0}; // the loss stays f32
  for (const LossCase &c : lossCases())
    expectMatchesCpu([&] { return lossCall(c, 40); }, name(c), options);
}

// The per-sequence shift: one sequence of all rows scores other positions.
TEST(CudaCrossEntropy, ShiftFollowsTheSequences) {
  SKIP_WITHOUT_GPU();
  CudaCompareOptions options;
  options.f32Outputs = {0};
  LossCase c = lossCases()[0];
  expectMatchesCpu(
      [&] {
        KernelCall call = lossCall(c, 41);
        call.sequences(c.batch * c.seq, 1);
        return call;
      },
      name(c) + " as one sequence", options);
}

TEST(CudaCrossEntropy, BackwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  CudaCompareOptions options;
  options.f32Inputs = {2}; // d loss stays f32
  for (const LossCase &c : lossCases())
    for (float dloss : {1.0f, 0.7f})
      expectMatchesCpu(
          [&] {
            KernelCall forward = lossCall(c, 43);
            return backwardOf(forward, {0}, {{0, floatTensor({}, {dloss})}});
          },
          name(c) + " backward, d loss " + std::to_string(dloss), options);
}

// d loss in the logits' storage type works too.
TEST(CudaCrossEntropy, BackwardWithBf16Seed) {
  SKIP_WITHOUT_GPU();
  for (const LossCase &c : lossCases())
    expectMatchesCpuIn(
        plan::BF16,
        [&] {
          KernelCall forward = lossCall(c, 44);
          return backwardOf(forward, {0}, {{0, floatTensor({}, {0.5f})}});
        },
        name(c) + " backward, bf16 d loss");
}

TEST(CudaShiftLabels, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::vector<int64_t> labels;
  for (int64_t t = 0; t < 3000; ++t)
    labels.push_back(t % 7 == 0 ? -100 : (t * 31) % 50000);
  for (plan::DType type : {plan::I32, plan::I64})
    for (int64_t seq : {1000, 3000, 1})
      expectMatchesCpuIn(
          plan::F32,
          [&] {
            KernelCall call(registry(), "shift_labels");
            call.input(indexTensor(type, {3000}, labels)).sequences(seq, 3000 / seq).output(type, {3000});
            return call;
          },
          "shift_labels of 3000 labels, sequences of " + std::to_string(seq));
}

} // namespace
} // namespace moec::runtime::cuda::core::testing
