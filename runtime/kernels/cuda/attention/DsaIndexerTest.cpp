//===- DsaIndexerTest.cpp - CUDA dsa_indexer against the CPU, index for index ===//
//
// Integer outputs compare byte for byte. Random inputs make near-ties
// (distinct scores within rounding) unlikely; exact ties are common (keys
// whose ReLU terms all vanish score exactly 0) and, with the CPU test's
// tie-heavy torch rows, check that the GPU breaks ties as the CPU does.
// Both selection paths (nth_element + sort, and partial_sort when
// topk*64 <= L), i32 and i64 outputs, several sequences, lengths that are
// no multiple of the block size, DeepSeek-sized heads; F32 and BF16 storage.
//
//===----------------------------------------------------------------------===//

#include <gtest/gtest.h>

#include "runtime/kernels/cuda/attention/CompareTesting.h"

namespace moec::runtime::cuda::attention::testing {
namespace {

using runtime::testing::filledTensor;
using runtime::testing::floatTensor;
using runtime::testing::indexTensor;
using runtime::testing::randomTensor;

class CudaDsaIndexerTest : public ::testing::Test {
protected:
  KernelCall call(OwnedTensor query, OwnedTensor key, OwnedTensor weights,
                  std::vector<int64_t> positions, int64_t heads, int64_t dim, int64_t ropeDim,
                  int64_t topk, int64_t len, plan::DType outType = plan::I32) {
    int64_t tokens = static_cast<int64_t>(positions.size());
    KernelCall k(reg.cpu, "dsa_indexer");
    k.input(std::move(query))
        .input(std::move(key))
        .input(std::move(weights))
        .input(indexTensor(plan::I64, {tokens}, positions))
        .output(outType, {tokens, topk})
        .attr("num_heads", heads)
        .attr("head_dim", dim)
        .attr("topk", topk)
        .attr("rope.theta", 10000.0)
        .attr("rope.dim", ropeDim)
        .attr("rope.style", "half")
        .sequences(len, tokens / len);
    return k;
  }

  /// Random inputs: `seqs` sequences of `len`, positions offset per sequence.
  void compareRandom(int64_t heads, int64_t dim, int64_t ropeDim, int64_t topk, int64_t len,
                     int64_t seqs, uint64_t seed, plan::DType outType = plan::I32) {
    int64_t tokens = len * seqs;
    std::vector<int64_t> positions;
    for (int64_t t = 0; t < tokens; ++t)
      positions.push_back((t % len) * 2 + 1 + 7 * (t / len));
    std::string what = "dsa_indexer H" + std::to_string(heads) + " D" + std::to_string(dim) +
                       " rope " + std::to_string(ropeDim) + " topk " + std::to_string(topk) +
                       " L" + std::to_string(len) + " x" + std::to_string(seqs);
    compareBoth(
        reg.gpu,
        [&] {
          return call(randomTensor({tokens, heads * dim}, seed),
                      randomTensor({tokens, dim}, seed + 1),
                      randomTensor({tokens, heads}, seed + 2), positions, heads, dim, ropeDim,
                      topk, len, outType);
        },
        what);
  }

  /// The CPU test's torch rows: one query head (1, 0), keys (k0[s], 0) at
  /// position 0, unit weights: scores relu(k0 * 2^-1/2), full of ties.
  void compareTies(const std::vector<float> &keys, int64_t topk) {
    int64_t len = static_cast<int64_t>(keys.size()), tokens = 2 * len;
    std::vector<float> q, k;
    for (int64_t t = 0; t < tokens; ++t) {
      q.insert(q.end(), {1.0f, 0.0f});
      k.insert(k.end(), {keys[t % len], 0.0f});
    }
    compareBoth(
        reg.gpu,
        [&] {
          return call(floatTensor({tokens, 2}, q), floatTensor({tokens, 2}, k),
                      filledTensor({tokens, 1}, 1.0f), std::vector<int64_t>(tokens, 0), 1, 2, 2,
                      topk, len);
        },
        "dsa_indexer ties, L" + std::to_string(len) + " topk " + std::to_string(topk));
  }

  Registries reg;
};

TEST_F(CudaDsaIndexerTest, TiesResolveAsTheCpu) {
  const std::vector<float> mixed = {0.3f,  -1.0f, 0.7f, -0.2f, 0.0f, 1.1f,  -0.5f, 0.9f,
                                    -0.1f, 0.2f,  -0.3f, 0.0f, 0.5f, -0.8f, 0.4f,  -0.6f};
  compareTies(mixed, 5);
  compareTies(mixed, 16);
  compareTies(std::vector<float>(16, 0.0f), 5);
  std::vector<float> sparse(200, -1.0f);
  for (int64_t s = 0; s < 200; s += 37)
    sparse[s] = 0.5f;
  compareTies(sparse, 3);                         // partial_sort (3 * 64 <= 200)
  compareTies(std::vector<float>(200, 0.0f), 3);  // partial_sort, all tied
  compareTies(std::vector<float>(200, 0.0f), 40); // nth_element + sort, all tied
}

TEST_F(CudaDsaIndexerTest, CpuTestShapes) {
  // 2 sequences of 12, 3 heads of 8 whose leading 4 features rotate.
  for (int64_t topk : {5, 12, 15})
    for (plan::DType outType : {plan::I32, plan::I64})
      compareRandom(3, 8, 4, topk, 12, 2, 31, outType);
}

TEST_F(CudaDsaIndexerTest, LongerSequences) {
  compareRandom(4, 32, 16, 7, 100, 3, 41);             // nth_element path, 3 sequences
  compareRandom(4, 32, 16, 64, 100, 2, 42, plan::I64); // topk close to the length
  compareRandom(2, 16, 8, 1, 77, 2, 43);               // topk 1
  compareRandom(4, 32, 32, 4, 300, 1, 44);             // partial_sort path (4 * 64 <= 300)
  compareRandom(3, 24, 8, 500, 33, 2, 45);             // topk beyond the length: -1 padding
}

TEST_F(CudaDsaIndexerTest, DeepSeekSizedHeads) {
  compareRandom(64, 128, 64, 32, 130, 2, 51);
}

TEST_F(CudaDsaIndexerTest, PositionsAndRope) {
  // The CPU test's PositionsAndRopeMatter inputs, at near and far positions.
  const int64_t tokens = 16;
  for (int64_t step : {1, 50}) {
    std::vector<int64_t> positions(tokens);
    for (int64_t t = 0; t < tokens; ++t)
      positions[t] = step * t;
    compareBoth(
        reg.gpu,
        [&] {
          return call(randomTensor({tokens, 16}, 41), randomTensor({tokens, 8}, 42),
                      filledTensor({tokens, 2}, 1.0f), positions, 2, 8, 8, 4, tokens);
        },
        "dsa_indexer positions step " + std::to_string(step));
  }
}

TEST_F(CudaDsaIndexerTest, BadLaunchesFailWithAMessage) {
  // The CPU test's bad launches, on the CUDA kernel (it fails before any CUDA call).
  auto good = [&] {
    KernelCall k = call(randomTensor({8, 16}, 1), randomTensor({8, 8}, 2),
                        randomTensor({8, 2}, 3), std::vector<int64_t>(8, 0), 2, 8, 4, 3, 4);
    return onRegistry(reg.gpu, k);
  };
  KernelCall topk = good();
  topk.attributes().erase("topk");
  expectFailure(topk, "missing attribute 'topk'");
  KernelCall key = good();
  key.inputsRef()[1] = randomTensor({8, 6}, 2);
  expectFailure(key, "key has shape [8,6], expected [8,8]");
  KernelCall weights = good();
  weights.inputsRef()[2] = randomTensor({8, 3}, 2);
  expectFailure(weights, "head_weights has shape [8,3], expected [8,2]");
  KernelCall out = good();
  out.result(0) = runtime::testing::zeroTensor(plan::I32, {8, 4});
  expectFailure(out, "indices has shape [8,4], expected [8,3]");
  KernelCall dtype = good();
  dtype.result(0) = runtime::testing::zeroTensor(plan::F32, {8, 3});
  expectFailure(dtype, "indices must be i32 or i64");
  KernelCall rope = good();
  rope.attr("rope.dim", 10);
  expectFailure(rope, "at most 8");
}

} // namespace
} // namespace moec::runtime::cuda::attention::testing
