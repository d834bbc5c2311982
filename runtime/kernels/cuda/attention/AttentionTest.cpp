//===- AttentionTest.cpp - CUDA attention (+ backward) against the CPU kernels ===//
//
// The CPU test's variants (GQA ratios, value dim != head dim, sliding
// windows, sinks) plus sequence lengths that are no multiple of the tiles
// (16 queries, 32 keys), several sequences, windows wider than a tile and
// head dims covering every register layout (d, dv up to 320); backward with
// every gradient and with subsets of them; F32 and BF16 storage.
//
//===----------------------------------------------------------------------===//

#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "runtime/kernels/cuda/attention/CompareTesting.h"

namespace moec::runtime::cuda::attention::testing {
namespace {

using runtime::testing::filledTensor;
using runtime::testing::randomTensor;

struct Config {
  int64_t heads, kvHeads, headDim, valueDim, len, window;
  bool sinks;
  int64_t seqs = 2;
};

std::ostream &operator<<(std::ostream &os, const Config &c) {
  return os << "H" << c.heads << " KV" << c.kvHeads << " d" << c.headDim << " dv" << c.valueDim
            << " L" << c.len << " x" << c.seqs << " window " << c.window
            << (c.sinks ? " sinks" : "");
}

std::string nameOf(const Config &c) {
  std::ostringstream os;
  os << c;
  return os.str();
}

class CudaAttentionTest : public ::testing::TestWithParam<Config> {
protected:
  KernelCall call(const Config &c, uint64_t seed = 1) {
    int64_t tokens = c.seqs * c.len;
    KernelCall k(reg.cpu, "attention");
    k.input(randomTensor({tokens, c.heads * c.headDim}, seed))
        .input(randomTensor({tokens, c.kvHeads * c.headDim}, seed + 1))
        .input(randomTensor({tokens, c.kvHeads * c.valueDim}, seed + 2));
    if (c.sinks)
      k.input(randomTensor({c.heads}, seed + 3, 1.5f));
    k.output(plan::F32, {tokens, c.heads * c.valueDim})
        .attr("num_heads", c.heads)
        .attr("num_kv_heads", c.kvHeads)
        .attr("head_dim", c.headDim)
        .attr("scale", 1.0 / std::sqrt(static_cast<double>(c.headDim)))
        .sequences(c.len, c.seqs);
    if (c.window)
      k.attr("sliding_window", c.window);
    return k;
  }

  Registries reg;
};

TEST_P(CudaAttentionTest, ForwardMatchesCpu) {
  Config c = GetParam();
  compareBoth(reg.gpu, [&] { return call(c); }, nameOf(c));
}

TEST_P(CudaAttentionTest, BackwardMatchesCpu) {
  Config c = GetParam();
  std::vector<int64_t> wrt = {0, 1, 2};
  if (c.sinks)
    wrt.push_back(3);
  compareBoth(reg.gpu, [&] { return backwardOf(reg.cpu, call(c), wrt, 42); },
              nameOf(c) + " backward");
}

TEST_P(CudaAttentionTest, BackwardSubsetsMatchCpu) {
  Config c = GetParam();
  std::vector<std::vector<int64_t>> subsets = {{0}, {2, 1}, {1}};
  if (c.sinks)
    subsets.push_back({3, 0});
  for (const std::vector<int64_t> &wrt : subsets)
    compareBoth(reg.gpu, [&] { return backwardOf(reg.cpu, call(c), wrt, 43); },
                nameOf(c) + " backward of a subset");
}

INSTANTIATE_TEST_SUITE_P(
    Variants, CudaAttentionTest,
    ::testing::Values(
        // The CPU test's variants.
        Config{4, 2, 8, 8, 7, 0, false},  // GQA 2:1
        Config{3, 3, 5, 3, 6, 0, false},  // MHA, value dim != head dim
        Config{6, 2, 4, 4, 9, 0, false},  // GQA 3:1
        Config{4, 1, 8, 6, 16, 3, false}, // MQA, sliding window 3
        Config{2, 2, 8, 8, 5, 1, false},  // window 1: each token sees itself
        Config{2, 2, 8, 8, 5, 0, true},   // gpt-oss sinks
        Config{4, 2, 6, 6, 9, 4, true},   // sinks and a sliding window
        // Several tiles, lengths no multiple of 16 or 32, more sequences, wider heads.
        Config{8, 2, 64, 64, 100, 0, false},      // GQA 4:1, 7 query tiles, 4 key tiles
        Config{4, 4, 128, 128, 33, 0, true, 3},   // 3 sequences of 33
        Config{6, 3, 64, 64, 130, 40, true},      // window wider than a key tile
        Config{4, 2, 64, 32, 70, 17, false, 3},   // dv < d, window across tiles
        Config{2, 1, 256, 256, 45, 0, false},     // 8 registers per lane
        Config{2, 2, 320, 160, 20, 0, true, 1},   // 16 registers per lane
        Config{8, 1, 16, 48, 13, 100, false, 4}), // MQA 8:1, window longer than the sequence
    [](const ::testing::TestParamInfo<Config> &info) { return "v" + std::to_string(info.index); });

class CudaAttentionEdgeTest : public CudaAttentionTest {};

TEST_F(CudaAttentionEdgeTest, VanishingSinks) {
  Config c{2, 2, 8, 8, 5, 0, true};
  auto make = [&] {
    KernelCall k = call(c);
    k.inputsRef()[3] = filledTensor({2}, -1e30f);
    return k;
  };
  compareBoth(reg.gpu, make, "vanishing sinks");
  compareBoth(reg.gpu, [&] { return backwardOf(reg.cpu, make(), {0, 1, 2, 3}, 5); },
              "vanishing sinks backward");
}

TEST_F(CudaAttentionEdgeTest, LargeSinks) {
  // Sinks that take most of the probability mass.
  Config c{4, 2, 16, 16, 21, 0, true};
  auto make = [&] {
    KernelCall k = call(c);
    k.inputsRef()[3] = randomTensor({4}, 9, 6.0f);
    return k;
  };
  compareBoth(reg.gpu, make, "large sinks");
  compareBoth(reg.gpu, [&] { return backwardOf(reg.cpu, make(), {0, 1, 2, 3}, 6); },
              "large sinks backward");
}

TEST_F(CudaAttentionEdgeTest, BackwardWithoutAResultGradientIsZero) {
  Config c{4, 2, 8, 8, 7, 3, true};
  compareBoth(reg.gpu, [&] { return backwardOf(reg.cpu, call(c), {0, 1, 2, 3}, 1, false); },
              "attention.backward without gradient");
}

TEST_F(CudaAttentionEdgeTest, BadLaunchesFailWithAMessage) {
  // The CPU test's bad launches, on the CUDA kernels (they fail before any CUDA call).
  auto gpu = [&](KernelCall k) { return onRegistry(reg.gpu, k); };
  Config c{4, 2, 8, 8, 4, 0, false};
  KernelCall ratio = call(c);
  ratio.attr("num_kv_heads", 3);
  expectFailure(gpu(ratio), "multiple of num_kv_heads");
  KernelCall scale = call(c);
  scale.attributes().erase("scale");
  expectFailure(gpu(scale), "missing attribute 'scale'");
  KernelCall window = call(c);
  window.attr("sliding_window", 0);
  expectFailure(gpu(window), "'sliding_window' must be positive");
  KernelCall key = call(c);
  key.inputsRef()[1] = randomTensor({8, 8}, 3);
  expectFailure(gpu(key), "key has shape [8,8], expected [8,16]");
  KernelCall sequences = call(c);
  sequences.sequences(3, 2);
  expectFailure(gpu(sequences), "do not cover the 8 token rows");
  KernelCall sinks = call(c);
  sinks.input(randomTensor({3}, 1));
  expectFailure(gpu(sinks), "sinks has shape [3], expected [4]");
  KernelCall result = call(c);
  result.result(0) = runtime::testing::zeroTensor(plan::F32, {8, 16});
  expectFailure(gpu(result), "result has shape [8,16], expected [8,32]");
  KernelCall dtype = call(c);
  dtype.inputsRef()[2] = runtime::testing::zeroTensor(plan::I64, {8, 16});
  expectFailure(gpu(dtype), "value must be f32 or bf16");
  // A backward asked for the gradient of sinks the forward does not have.
  KernelCall noSinks = backwardOf(reg.gpu, call(c), {0}, 5);
  noSinks.attr("grad_of_inputs", std::vector<int64_t>{0, 3}).output(plan::F32, {4});
  expectFailure(noSinks, "operand 3");
  // Heads wider than the CUDA kernels' register layouts.
  expectFailure(gpu(call(Config{1, 1, 600, 8, 4, 0, false})), "head dimensions up to 512");
}

} // namespace
} // namespace moec::runtime::cuda::attention::testing
