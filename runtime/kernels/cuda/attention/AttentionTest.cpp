//===- AttentionTest.cpp - CUDA attention (+ backward) against the CPU kernels ===//
//
// The CPU test's variants (GQA ratios, value dim != head dim, sliding
// windows, sinks) plus sequence lengths that are no multiple of the tiles
// (16 queries, 32 keys), several sequences, windows wider than a tile and
// head dims covering every register layout (d, dv up to 320); backward with
// every gradient and with subsets of them; the logsumexp result, and the
// backward from the saved result and logsumexp (the training step's form);
// F32 and BF16 storage. With BF16
// storage, (head dim, value dim) = (64, 64), (128, 128), (256, 256) and
// (192, 128) take the tensor-core path (Flash.cu), the rest the general kernels.
//
// The bf16 forward and backward with head dims 128 and neither window nor
// sinks run on wgmma (FlashWgmma.cu) on a Hopper GPU: the fast-path shapes of
// that kind (ragged, exact and single-token tiles, GQA 1, 4, 8, the dK/dV
// head slicing forced each way) check them, and with MOEC_ATTENTION_SINGLE_PASS=1
// its backward that forms dQ in the dK/dV kernel (atomic sums); the default
// backward gives the same bits twice.
//
// CudaAttentionFastPathTest: the tensor-core path on its own, BF16 only, at
// sizes that cross its tiles (128 queries / 64 or 32 keys forward and dQ, 128
// or 64 keys / 64 queries dK/dV): head dims 64, 128, 256 (Qwen3-Next) and
// 192 with value dim 128, GQA 1, 4 and 8, lengths 1, 100, 130, 257 and 1000,
// two sequences, windows and sinks, every gradient and subsets, the dK/dV
// head slicing and the query-tile shapes forced each way; checked over each
// output and per head of every row (expectBlocksClose).
//
// Without a GPU the GPU tests skip in SetUp, before building any launch (the
// CPU references of the larger shapes take seconds).
//
//===----------------------------------------------------------------------===//

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
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

/// Whether there is a GPU (asked once).
bool haveGpu(std::string *why) {
  static std::string reason;
  static const bool available = runtime::testing::cudaDeviceAvailable(&reason);
  *why = reason;
  return available;
}

class CudaAttentionTest : public ::testing::TestWithParam<Config> {
protected:
  void SetUp() override {
    std::string why;
    if (!haveGpu(&why))
      GTEST_SKIP() << why;
  }

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

  /// call(c) with the logsumexp result too (the training step's form; f32 in any storage).
  KernelCall withStatistics(const Config &c) {
    KernelCall k = call(c);
    k.output(plan::F32, {c.seqs * c.len, c.heads});
    return k;
  }

  /// The backward as the training step launches it: the forward operands, the saved result
  /// and logsumexp (from the CPU forward on bf16-exact operands, so that both storages see
  /// the statistics of their own inputs), then the result gradient.
  KernelCall savedBackward(const Config &c, const std::vector<int64_t> &wrt, uint64_t seed) {
    KernelCall forward = withStatistics(c);
    for (OwnedTensor &t : forward.inputsRef())
      roundToBf16(t);
    forward.run();
    KernelCall backward = backwardOf(reg.cpu, forward, wrt, seed);
    std::vector<OwnedTensor> &in = backward.inputsRef();
    const auto gradOut = in.end() - 1;
    OwnedTensor grad = *gradOut;
    in.erase(gradOut);
    in.push_back(forward.result(0));
    in.push_back(forward.result(1));
    in.push_back(grad);
    const int64_t operands = static_cast<int64_t>(forward.inputsRef().size());
    backward.attr("backward_segments", std::vector<int64_t>{operands, 2, 1});
    return backward;
  }
  /// The forward's logsumexp result against the CPU's (f32 in both storages).
  void checkLogsumexp(const Config &c) {
    runtime::testing::CudaCompareOptions o;
    o.f32Outputs = {1};
    compareBoth(reg.gpu, [&] { return withStatistics(c); }, nameOf(c) + " with logsumexp", o);
  }
  /// Every gradient of savedBackward's launch against the CPU's; the saved logsumexp stays f32.
  void checkSavedBackward(const Config &c) {
    std::vector<int64_t> wrt = {0, 1, 2};
    if (c.sinks)
      wrt.push_back(3);
    runtime::testing::CudaCompareOptions o;
    o.f32Inputs = {static_cast<size_t>(c.sinks ? 5 : 4)};
    compareBoth(reg.gpu, [&] { return savedBackward(c, wrt, 44); }, nameOf(c) + " backward from saved statistics",
                o);
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

TEST_P(CudaAttentionTest, LogsumexpMatchesCpu) {
  checkLogsumexp(GetParam());
}

TEST_P(CudaAttentionTest, BackwardFromSavedStatisticsMatchesCpu) {
  checkSavedBackward(GetParam());
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

class CudaAttentionFastPathTest : public CudaAttentionTest {
protected:
  /// One block per head of each row for the result and the gradients of
  /// query, key, value; one for sinks.
  std::vector<int64_t> blocksOf(const Config &c, const std::vector<int64_t> &outputs) {
    std::vector<int64_t> blocks;
    for (int64_t o : outputs)
      blocks.push_back(o == 3 ? c.heads : o == 2 ? c.valueDim : c.headDim);
    return blocks;
  }
  void checkForward(const Config &c) {
    Bf16Run r = runBf16(reg.gpu, call(c));
    if (r.skipped)
      GTEST_SKIP() << r.why;
    expectBlocksClose(r, {c.valueDim}, nameOf(c) + " forward");
  }
  void checkBackward(const Config &c, const std::vector<int64_t> &wrt, const std::string &what) {
    Bf16Run r = runBf16(reg.gpu, backwardOf(reg.cpu, call(c), wrt, 42));
    if (r.skipped)
      GTEST_SKIP() << r.why;
    expectBlocksClose(r, blocksOf(c, wrt), nameOf(c) + " " + what);
  }
};

TEST_P(CudaAttentionFastPathTest, ForwardMatchesCpu) { checkForward(GetParam()); }

TEST_P(CudaAttentionFastPathTest, BackwardMatchesCpu) {
  Config c = GetParam();
  std::vector<int64_t> wrt = {0, 1, 2};
  if (c.sinks)
    wrt.push_back(3);
  checkBackward(c, wrt, "backward");
}

TEST_P(CudaAttentionFastPathTest, BackwardSubsetsMatchCpu) {
  Config c = GetParam();
  std::vector<std::vector<int64_t>> subsets = {{0}, {2, 1}, {2}};
  if (c.sinks)
    subsets.push_back({3, 0});
  for (const std::vector<int64_t> &wrt : subsets)
    checkBackward(c, wrt, "backward of a subset");
}

TEST_P(CudaAttentionFastPathTest, LogsumexpMatchesCpu) {
  checkLogsumexp(GetParam());
}

TEST_P(CudaAttentionFastPathTest, BackwardFromSavedStatisticsMatchesCpu) {
  checkSavedBackward(GetParam());
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaAttentionFastPathTest,
    ::testing::Values(
        // heads, kv heads, head dim, value dim, length, window, sinks, sequences
        Config{8, 8, 128, 128, 100, 0, false, 2},   // MHA, one partial query tile
        Config{8, 2, 128, 128, 257, 0, false, 2},   // GQA 4:1, 3 query / 5 key tiles
        Config{8, 1, 128, 128, 1000, 0, false, 2},  // GQA 8:1 (MQA), long
        Config{8, 8, 64, 64, 257, 0, false, 2},     // d 64
        Config{8, 2, 64, 64, 1000, 0, true, 2},     // d 64, GQA 4:1, sinks
        Config{16, 2, 64, 64, 100, 0, false, 2},    // d 64, GQA 8:1
        Config{8, 2, 128, 128, 257, 100, true, 2},  // window and sinks
        Config{8, 1, 64, 64, 1000, 129, false, 2},  // window just over two key tiles
        Config{4, 1, 64, 64, 130, 64, false, 2},    // window of one key tile
        Config{4, 2, 128, 128, 130, 1, true, 2},    // window 1: each token sees itself
        Config{4, 4, 128, 128, 1, 0, true, 3},      // single-token sequences
        // The wgmma forward (head dims 128, no window or sinks): one exact 128-query tile,
        // single tokens, and many tiles with GQA 8:1 (the others above cover ragged tiles).
        Config{4, 1, 128, 128, 128, 0, false, 3},
        Config{2, 2, 128, 128, 1, 0, false, 3},
        Config{16, 2, 128, 128, 700, 0, false, 2},
        // Head dim 256 (Qwen3-Next: 16 heads, 2 kv heads): 32-key tiles, dK/dV in warp pairs.
        Config{16, 2, 256, 256, 257, 0, false, 2},  // GQA 8:1, 3 query / 9 key / 5 dK tiles
        Config{8, 8, 256, 256, 100, 0, true, 2},    // MHA, sinks, one partial query tile
        Config{4, 1, 256, 256, 1000, 129, false, 1}, // MQA, window just over two dK tiles
        Config{8, 2, 256, 256, 130, 64, true, 2},   // window of one dK tile and sinks
        Config{4, 4, 256, 256, 1, 0, true, 3},      // single-token sequences
        // Head dim 192, value dim 128 (MLA's; here in one part: mla_test covers its layout).
        Config{8, 8, 192, 128, 257, 0, false, 2},
        Config{8, 2, 192, 128, 130, 37, true, 2},
        Config{4, 4, 192, 128, 1, 0, false, 3}),
    [](const ::testing::TestParamInfo<Config> &info) { return "f" + std::to_string(info.index); });

TEST_F(CudaAttentionFastPathTest, EveryDkDvHeadSlicing) {
  // The dK/dV kernel takes heads-per-block (1 = partial sums per head, summed in order;
  // the group size = one block loops over all heads) from the problem size; force each.
  // (the second config runs on FlashWgmma.cu's dK/dV: head dims 128, neither window nor sinks)
  for (const Config &c : {Config{8, 1, 128, 128, 257, 0, true, 2}, Config{8, 1, 128, 128, 300, 0, false, 2},
                          Config{8, 1, 256, 256, 257, 0, true, 2}, Config{4, 2, 192, 128, 200, 0, true, 2}})
    for (const char *heads : {"1", "2", "8"}) {
      setenv("MOEC_ATTENTION_HEADS_PER_BLOCK", heads, 1); // ignored where it does not divide the group
      checkBackward(c, c.sinks ? std::vector<int64_t>{0, 1, 2, 3} : std::vector<int64_t>{0, 1, 2},
                    std::string("backward, heads per dK/dV block ") + heads);
    }
  unsetenv("MOEC_ATTENTION_HEADS_PER_BLOCK");
}

TEST_F(CudaAttentionFastPathTest, SinglePassBackward) {
  // MOEC_ATTENTION_SINGLE_PASS=1: FlashWgmma.cu's dK/dV kernel also forms dQ (atomic sums)
  // instead of its dQ kernel; against the CPU, GQA 4:1 and 8:1, ragged tiles, two sequences,
  // and single tokens, every head slicing.
  setenv("MOEC_ATTENTION_SINGLE_PASS", "1", 1);
  for (const Config &c : {Config{8, 2, 128, 128, 257, 0, false, 2}, Config{16, 2, 128, 128, 700, 0, false, 2},
                          Config{8, 8, 128, 128, 100, 0, false, 2}, Config{2, 2, 128, 128, 1, 0, false, 3}})
    checkBackward(c, {0, 1, 2}, "single-pass backward");
  for (const char *heads : {"1", "2", "8"}) {
    setenv("MOEC_ATTENTION_HEADS_PER_BLOCK", heads, 1);
    checkBackward(Config{8, 1, 128, 128, 300, 0, false, 2}, {0, 1, 2},
                  std::string("single-pass backward, heads per dK/dV block ") + heads);
  }
  unsetenv("MOEC_ATTENTION_HEADS_PER_BLOCK");
  unsetenv("MOEC_ATTENTION_SINGLE_PASS");
}

TEST_F(CudaAttentionFastPathTest, BackwardIsDeterministic) {
  // The default backward's sums have a fixed order: a second run gives the same bits.
  for (const Config &c : {Config{8, 2, 128, 128, 257, 0, false, 2}, Config{8, 2, 64, 64, 300, 0, true, 2}}) {
    const std::vector<int64_t> wrt = c.sinks ? std::vector<int64_t>{0, 1, 2, 3} : std::vector<int64_t>{0, 1, 2};
    Bf16Run first = runBf16(reg.gpu, backwardOf(reg.cpu, call(c), wrt, 42));
    Bf16Run second = runBf16(reg.gpu, backwardOf(reg.cpu, call(c), wrt, 42));
    ASSERT_TRUE(first.why.empty() && second.why.empty()) << first.why << second.why;
    EXPECT_TRUE(first.gpu == second.gpu) << nameOf(c) << ": two runs of the backward differ";
  }
}

TEST_F(CudaAttentionFastPathTest, EveryTileShape) {
  // The query-tile kernels (forward, statistics, dQ) in each shape attention_bench times
  // (a shape that does not fit a head dim falls back to its default).
  for (const char *tiles : {"16x64", "16x32", "32x32", "32x64"}) {
    setenv("MOEC_ATTENTION_FORWARD_TILES", tiles, 1);
    setenv("MOEC_ATTENTION_DQ_TILES", tiles, 1);
    for (const Config &c :
         {Config{8, 2, 128, 128, 257, 100, true, 2}, Config{8, 1, 64, 64, 300, 0, false, 2},
          Config{4, 2, 256, 256, 200, 0, true, 2}, Config{4, 4, 192, 128, 200, 70, false, 2}}) {
      checkForward(c);
      checkBackward(c, c.sinks ? std::vector<int64_t>{0, 1, 2, 3} : std::vector<int64_t>{0, 1, 2},
                    std::string("backward, tiles ") + tiles);
    }
  }
  unsetenv("MOEC_ATTENTION_FORWARD_TILES");
  unsetenv("MOEC_ATTENTION_DQ_TILES");
}

TEST_F(CudaAttentionFastPathTest, GeneralPathAgrees) {
  // MOEC_ATTENTION_GENERAL=1 sends the same launches to the general kernels.
  setenv("MOEC_ATTENTION_GENERAL", "1", 1);
  for (const Config &c : {Config{8, 2, 64, 64, 257, 100, true, 2}, Config{4, 2, 256, 256, 130, 0, true, 2}}) {
    checkForward(c);
    checkBackward(c, {0, 1, 2, 3}, "backward on the general path");
  }
  unsetenv("MOEC_ATTENTION_GENERAL");
}

// Small shapes, and a test that runs without a GPU: no skipping in SetUp
// (compareBoth skips the GPU comparisons itself).
class CudaAttentionEdgeTest : public CudaAttentionTest {
protected:
  void SetUp() override {}
};

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
