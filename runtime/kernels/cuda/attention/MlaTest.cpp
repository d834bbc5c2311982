//===- MlaTest.cpp - CUDA mla / sparse_attention (+ backward) against the CPU ===//
//
// The CPU test's variants (half, interleaved and YaRN RoPE, Kimi's NoPE),
// DeepSeek-sized heads (nope 128, rope 64, v 128), lengths that are no
// multiple of the tiles, several sequences, empty rope or nope parts; sparse
// attention with -1s, repeated and future indices, a row that selects
// nothing, every key selected, i32 and i64 indices; backward with every
// gradient and with subsets; dense mla's logsumexp result and its backward
// from the saved result and logsumexp; F32 and BF16 storage. Dense mla with BF16
// storage and DeepSeek's head sizes takes the tensor-core path (Flash.cu, its
// query and key in two parts: nope in the operands, rope in bf16 scratch);
// lengths crossing its tiles check it here. Without a GPU the GPU tests skip
// in SetUp, before building any launch.
//
//===----------------------------------------------------------------------===//

#include <gtest/gtest.h>

#include <random>
#include <sstream>

#include "runtime/kernels/cuda/attention/CompareTesting.h"

namespace moec::runtime::cuda::attention::testing {
namespace {

using runtime::testing::indexTensor;
using runtime::testing::randomTensor;

enum class Pe { None, Half, Interleaved };

struct Config {
  int64_t heads, nope, rope, vDim, len;
  Pe pe;
  bool yarn;
  int64_t seqs = 2;
};

std::string nameOf(const Config &c) {
  const char *pe[] = {"NoPE", "half", "interleaved"};
  std::ostringstream os;
  os << "H" << c.heads << " nope" << c.nope << " rope" << c.rope << " v" << c.vDim << " L"
     << c.len << " x" << c.seqs << " " << pe[static_cast<int>(c.pe)] << (c.yarn ? " yarn" : "");
  return os.str();
}

constexpr double kScale = 0.3;

/// Each row selects `topk` slots: random keys of its sequence, -1s, repeats, future keys.
std::vector<int64_t> someIndices(const Config &c, int64_t topk, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> indices;
  for (int64_t t = 0; t < c.seqs * c.len; ++t)
    for (int64_t j = 0; j < topk; ++j) {
      int64_t s = static_cast<int64_t>(rng() % (c.len + 2)) - 1;
      indices.push_back(s >= c.len ? -1 : s);
    }
  return indices;
}

class CudaMlaTest : public ::testing::TestWithParam<Config> {
protected:
  void SetUp() override {
    static std::string why;
    static const bool gpu = runtime::testing::cudaDeviceAvailable(&why);
    if (!gpu)
      GTEST_SKIP() << why;
  }

  KernelCall call(const Config &c, const std::vector<int64_t> *indices = nullptr, int64_t topk = 0,
                  plan::DType indexType = plan::I32) {
    int64_t tokens = c.seqs * c.len;
    std::vector<int64_t> positions;
    for (int64_t b = 0; b < c.seqs; ++b)
      for (int64_t t = 0; t < c.len; ++t)
        positions.push_back(2 * t + 5 * b);
    KernelCall k(reg.cpu, indices ? "sparse_attention" : "mla");
    k.input(randomTensor({tokens, c.heads * (c.nope + c.rope)}, 11))
        .input(randomTensor({tokens, c.rope}, 12))
        .input(randomTensor({tokens, c.heads * (c.nope + c.vDim)}, 13))
        .input(indexTensor(plan::I64, {tokens}, positions));
    if (indices)
      k.input(indexTensor(indexType, {tokens, topk}, *indices));
    k.output(plan::F32, {tokens, c.heads * c.vDim})
        .attr("num_heads", c.heads)
        .attr("qk_nope_head_dim", c.nope)
        .attr("qk_rope_head_dim", c.rope)
        .attr("v_head_dim", c.vDim)
        .attr("scale", kScale)
        .sequences(c.len, c.seqs);
    if (c.pe != Pe::None) {
      k.attr("rope.theta", 10000.0)
          .attr("rope.dim", c.rope)
          .attr("rope.style", c.pe == Pe::Half ? "half" : "interleaved");
      if (c.yarn)
        k.attr("rope.yarn.factor", 8.0)
            .attr("rope.yarn.original_max_position", int64_t{16})
            .attr("rope.yarn.beta_fast", 32.0)
            .attr("rope.yarn.beta_slow", 1.0)
            .attr("rope.yarn.mscale", 1.0)
            .attr("rope.yarn.mscale_all_dim", 0.5);
    }
    return k;
  }

  /// call(c, ...) with the logsumexp result too (the training step's form).
  KernelCall withStatistics(const Config &c, const std::vector<int64_t> *indices = nullptr, int64_t topk = 0) {
    KernelCall k = call(c, indices, topk);
    k.output(plan::F32, {c.seqs * c.len, c.heads});
    return k;
  }

  /// The backward as the training step launches it: the forward operands, the saved result and
  /// logsumexp (from the CPU forward on bf16-exact operands), then the result gradient.
  KernelCall savedBackward(const Config &c, const std::vector<int64_t> &wrt,
                           const std::vector<int64_t> *indices = nullptr, int64_t topk = 0) {
    KernelCall forward = withStatistics(c, indices, topk);
    for (OwnedTensor &t : forward.inputsRef())
      roundToBf16(t);
    forward.run();
    KernelCall backward = backwardOf(reg.cpu, forward, wrt, 22);
    std::vector<OwnedTensor> &in = backward.inputsRef();
    OwnedTensor grad = in.back();
    in.pop_back();
    in.push_back(forward.result(0));
    in.push_back(forward.result(1));
    in.push_back(grad);
    backward.attr("backward_segments", std::vector<int64_t>{indices ? 5 : 4, 2, 1});
    return backward;
  }

  /// Forward, full backward and backward subsets of one launch.
  void compareAll(const std::function<KernelCall()> &make, const std::string &what) {
    compareBoth(reg.gpu, make, what);
    for (const std::vector<int64_t> &wrt :
         std::vector<std::vector<int64_t>>{{0, 1, 2}, {0}, {1}, {2}, {2, 0}})
      compareBoth(reg.gpu, [&] { return backwardOf(reg.cpu, make(), wrt, 21); },
                  what + " backward");
  }

  Registries reg;
};

TEST_P(CudaMlaTest, DenseMatchesCpu) {
  Config c = GetParam();
  compareAll([&] { return call(c); }, "mla " + nameOf(c));
}

TEST_P(CudaMlaTest, LogsumexpMatchesCpu) {
  Config c = GetParam();
  CudaCompareOptions o;
  o.f32Outputs = {1};
  compareBoth(reg.gpu, [&] { return withStatistics(c); }, "mla with logsumexp " + nameOf(c), o);
}

TEST_P(CudaMlaTest, BackwardFromSavedStatisticsMatchesCpu) {
  // In BF16 storage the GPU rotates the rope parts into bf16 scratch, so a CPU logsumexp is
  // another function's there: only NoPE launches (nothing rotated) compare in BF16.
  Config c = GetParam();
  CudaCompareOptions o;
  o.f32Inputs = {5}; // the saved logsumexp
  for (plan::DType storage : {plan::F32, plan::BF16}) {
    if (storage == plan::BF16 && c.pe != Pe::None)
      continue;
    for (const std::vector<int64_t> &wrt : std::vector<std::vector<int64_t>>{{0, 1, 2}, {2, 0}}) {
      KernelCall launch = savedBackward(c, wrt);
      o.storage = storage;
      runtime::testing::CudaComparison r = runtime::testing::compareCudaWithCpu(reg.gpu, launch, o);
      if (r.skipped)
        GTEST_SKIP() << r.why;
      EXPECT_TRUE(r.ok) << "mla backward from saved statistics " << nameOf(c) << " in "
                        << plan::dtypeName(storage) << ":\n" << r.report;
    }
  }
}

TEST_P(CudaMlaTest, SparseLogsumexpAndSavedBackwardMatchCpu) {
  // sparse_attention's kernels compute in f32 (its rope parts rotate in f32 scratch), so a CPU
  // logsumexp is the GPU's own in both storages.
  Config c = GetParam();
  int64_t topk = 4;
  std::vector<int64_t> indices = someIndices(c, topk, 3);
  for (int64_t j = 0; j < topk; ++j)
    indices[j] = -1; // row 0 of sequence 0 selects nothing: logsumexp +inf
  CudaCompareOptions lse;
  lse.f32Outputs = {1};
  compareBoth(reg.gpu, [&] { return withStatistics(c, &indices, topk); },
              "sparse_attention with logsumexp " + nameOf(c), lse);
  CudaCompareOptions saved;
  saved.f32Inputs = {6}; // the saved logsumexp, after five operands and the result
  compareBoth(reg.gpu, [&] { return savedBackward(c, {0, 1, 2}, &indices, topk); },
              "sparse_attention backward from saved statistics " + nameOf(c), saved);
}

TEST_P(CudaMlaTest, SparseMatchesCpu) {
  Config c = GetParam();
  int64_t topk = 4;
  std::vector<int64_t> indices = someIndices(c, topk, 3);
  for (int64_t j = 0; j < topk; ++j)
    indices[j] = -1; // row 0 of sequence 0 selects nothing: its output is zero
  compareAll([&] { return call(c, &indices, topk); }, "sparse_attention " + nameOf(c));
  std::vector<int64_t> more = someIndices(c, 13, 4); // I64 indices, more slots than keys at first
  compareAll([&] { return call(c, &more, 13, plan::I64); },
             "sparse_attention (13 slots, i64) " + nameOf(c));
}

TEST_P(CudaMlaTest, SparseWithEveryKeySelected) {
  Config c = GetParam();
  // Every position of the sequence in a scrambled order, plus -1s and a duplicate.
  int64_t topk = c.len + 3;
  std::vector<int64_t> indices;
  for (int64_t t = 0; t < c.seqs * c.len; ++t) {
    for (int64_t j = 0; j < c.len; ++j)
      indices.push_back((j * 5 + t) % c.len);
    indices.insert(indices.end(), {-1, t % c.len, -1});
  }
  compareAll([&] { return call(c, &indices, topk); }, "sparse_attention, every key " + nameOf(c));
}

INSTANTIATE_TEST_SUITE_P(
    Variants, CudaMlaTest,
    ::testing::Values(
        // The CPU test's variants.
        Config{2, 6, 4, 5, 7, Pe::Half, false}, Config{3, 4, 6, 4, 6, Pe::Interleaved, false},
        Config{2, 8, 4, 8, 9, Pe::Interleaved, true},
        Config{2, 6, 4, 6, 8, Pe::None, false}, // Kimi NoPE
        // Several tiles, more sequences, DeepSeek-sized heads, empty parts.
        Config{4, 32, 16, 32, 70, Pe::Interleaved, true},
        Config{2, 128, 64, 128, 37, Pe::Interleaved, true, 1}, // DeepSeek-V3 head sizes
        // The tensor-core path (BF16): 3 query tiles, 5 dK/dV tiles; half RoPE; NoPE (the
        // key's rope part straight from key_rope).
        Config{4, 128, 64, 128, 257, Pe::Interleaved, true, 2},
        Config{2, 128, 64, 128, 130, Pe::Half, false, 1},
        Config{2, 128, 64, 128, 100, Pe::None, false, 2},
        Config{3, 16, 8, 16, 33, Pe::None, false, 3},
        Config{2, 24, 8, 16, 45, Pe::Half, false, 3},
        Config{2, 0, 8, 8, 10, Pe::Half, false},   // no nope part
        Config{2, 8, 0, 8, 10, Pe::None, false}),  // no rope part
    [](const ::testing::TestParamInfo<Config> &info) { return "v" + std::to_string(info.index); });

TEST_F(CudaMlaTest, FastPathPerHead) {
  // Dense mla on the tensor-core path, BF16, checked per head of every row as well
  // (expectBlocksClose): the rope parts' rotation, scratch and gradients included.
  for (const Config &c : {Config{4, 128, 64, 128, 257, Pe::Interleaved, true, 2},
                          Config{2, 128, 64, 128, 100, Pe::None, false, 2}}) {
    Bf16Run r = runBf16(reg.gpu, call(c));
    if (r.skipped)
      GTEST_SKIP() << r.why;
    expectBlocksClose(r, {c.vDim}, "mla " + nameOf(c));
    for (const std::vector<int64_t> &wrt : std::vector<std::vector<int64_t>>{{0, 1, 2}, {1}, {2, 0}}) {
      std::vector<int64_t> blocks;
      for (int64_t i : wrt)
        blocks.push_back(i == 0 ? c.nope + c.rope : i == 1 ? c.rope : c.nope + c.vDim);
      expectBlocksClose(runBf16(reg.gpu, backwardOf(reg.cpu, call(c), wrt, 21)), blocks,
                        "mla backward " + nameOf(c));
    }
  }
}

// Small shapes, and a test that runs without a GPU: no skipping in SetUp
// (compareBoth skips the GPU comparisons itself).
class CudaMlaEdgeTest : public CudaMlaTest {
protected:
  void SetUp() override {}
};

TEST_F(CudaMlaEdgeTest, SparseBackwardWithoutAResultGradientIsZero) {
  Config c{2, 6, 4, 5, 7, Pe::Half, false};
  std::vector<int64_t> indices = someIndices(c, 3, 8);
  compareBoth(reg.gpu, [&] { return backwardOf(reg.cpu, call(c, &indices, 3), {0, 1, 2}, 1, false); },
              "sparse_attention.backward without gradient");
  compareBoth(reg.gpu, [&] { return backwardOf(reg.cpu, call(c), {2, 1}, 1, false); },
              "mla.backward without gradient");
}

TEST_F(CudaMlaEdgeTest, BadLaunchesFailWithAMessage) {
  // The CPU test's bad launches, on the CUDA kernels (they fail before any CUDA call).
  // Unlike the CPU, index values are not checked on the host (they live on the device).
  auto gpu = [&](KernelCall k) { return onRegistry(reg.gpu, k); };
  Config c{2, 6, 4, 5, 4, Pe::Half, false};
  KernelCall rope = call(c);
  rope.attr("rope.dim", 2);
  expectFailure(gpu(rope), "rope.dim (2) must equal qk_rope_head_dim (4)");
  KernelCall kv = call(c);
  kv.inputsRef()[2] = randomTensor({8, 20}, 1);
  expectFailure(gpu(kv), "key_value has shape [8,20], expected [8,22]");
  KernelCall heads = call(c);
  heads.attributes().erase("num_heads");
  expectFailure(gpu(heads), "missing attribute 'num_heads'");
  std::vector<int64_t> bad(8 * 2, 0);
  KernelCall count = call(c);
  count.input(indexTensor(plan::I32, {8, 2}, bad));
  expectFailure(gpu(count), "expected 4 inputs");
  KernelCall positions = call(c);
  positions.inputsRef()[3] = randomTensor({8}, 1);
  expectFailure(gpu(positions), "positions must be i32 or i64");
  KernelCall indices = call(c, &bad, 2);
  indices.inputsRef()[4] = indexTensor(plan::I32, {7, 2}, std::vector<int64_t>(14, 0));
  expectFailure(gpu(indices), "indices has shape [7,2], expected [8,?]");
  KernelCall back = backwardOf(reg.gpu, call(c), {0}, 2);
  back.attr("grad_of_inputs", std::vector<int64_t>{0, 3}).output(plan::F32, {8});
  expectFailure(back, "operand 3, which has no gradient");
}

} // namespace
} // namespace moec::runtime::cuda::attention::testing
