//===- RopeTest.cpp - CUDA rope and rope.backward against the CPU kernels -===//
//
// The CPU test's layouts (half, partial, interleaved = DeepSeek's), YaRN
// parameter sets (incl. truncate = false) and position types, plus row
// counts that are no multiple of any block size, several sequences and
// long-context positions; F32 and BF16 storage.
//
//===----------------------------------------------------------------------===//

#include <gtest/gtest.h>

#include "runtime/kernels/cuda/attention/CompareTesting.h"

namespace moec::runtime::cuda::attention::testing {
namespace {

using runtime::testing::indexTensor;
using runtime::testing::randomTensor;

struct Rope {
  double theta = 10000;
  int64_t dim = 0;
  bool interleaved = false;
  bool yarn = false;
  double factor = 1, betaFast = 32, betaSlow = 1, mscale = 1, mscaleAllDim = 0;
  int64_t originalMax = 0;
  bool truncate = true;
};

class CudaRopeTest : public ::testing::Test {
protected:
  /// rope over `seqs` sequences of `len` tokens with `heads` heads of `headDim`.
  KernelCall call(const Rope &r, int64_t heads, int64_t headDim, int64_t len, int64_t seqs,
                  int64_t step, int64_t offset, plan::DType posType = plan::I64,
                  const char *kernel = "rope") {
    int64_t tokens = seqs * len;
    std::vector<int64_t> positions;
    for (int64_t b = 0; b < seqs; ++b)
      for (int64_t t = 0; t < len; ++t)
        positions.push_back(t * step + b * offset);
    KernelCall c(reg.cpu, kernel);
    c.input(randomTensor({tokens, heads * headDim}, 7))
        .input(indexTensor(posType, {tokens}, positions))
        .output(plan::F32, {tokens, heads * headDim})
        .attr("head_dim", headDim)
        .attr("rope.theta", r.theta)
        .attr("rope.dim", r.dim)
        .attr("rope.style", r.interleaved ? "interleaved" : "half")
        .sequences(len, seqs);
    if (r.yarn)
      c.attr("rope.yarn.factor", r.factor)
          .attr("rope.yarn.original_max_position", r.originalMax)
          .attr("rope.yarn.beta_fast", r.betaFast)
          .attr("rope.yarn.beta_slow", r.betaSlow)
          .attr("rope.yarn.mscale", r.mscale)
          .attr("rope.yarn.mscale_all_dim", r.mscaleAllDim);
    if (r.yarn && !r.truncate)
      c.attr("rope.yarn.truncate", false);
    return c;
  }

  /// Forward and backward (as checkGradients launches it) on the GPU vs the CPU.
  void compareRope(const Rope &r, int64_t heads, int64_t headDim, int64_t len, int64_t seqs,
                   int64_t step, int64_t offset, plan::DType posType = plan::I64) {
    std::string what = "rope dim " + std::to_string(r.dim) + " of head " +
                       std::to_string(headDim) + " x" + std::to_string(heads) + ", " +
                       std::to_string(seqs) + " x " + std::to_string(len) + " tokens";
    compareBoth(
        reg.gpu, [&] { return call(r, heads, headDim, len, seqs, step, offset, posType); }, what);
    compareBoth(
        reg.gpu,
        [&] {
          return backwardOf(reg.cpu, call(r, heads, headDim, len, seqs, step, offset, posType),
                            {0}, 99);
        },
        what + " (backward)");
  }

  Registries reg;
};

TEST_F(CudaRopeTest, HalfFullHead) {
  Rope r;
  r.dim = 8;
  compareRope(r, 3, 8, 5, 2, 3, 11);
  compareRope(r, 3, 8, 33, 3, 1, 100, plan::I32);
}

TEST_F(CudaRopeTest, WholeHeadsOfSixteenOrMoreTakeTheVectorisedKernel) {
  // bf16 storage (compareBoth's second run) of heads that rope.dim covers whole, half % 8 == 0:
  // ropePairsBf16. Qwen3's 128-wide heads (32 q heads: one token a block; 4 k heads: eight), and
  // 16-wide heads, many tokens a block, a count no multiple of it.
  Rope r;
  r.theta = 1e6;
  r.dim = 128;
  compareRope(r, 32, 128, 37, 2, 1, 5000);
  compareRope(r, 4, 128, 41, 3, 3, 70, plan::I32);
  r.dim = 16;
  compareRope(r, 3, 16, 301, 2, 1, 17);
}

TEST_F(CudaRopeTest, PartialRotationKeepsTheRest) {
  Rope r;
  r.theta = 1e6;
  r.dim = 4;
  compareRope(r, 2, 16, 6, 2, 3, 40);
  r.dim = 64; // Qwen3-Next-like: a quarter of a 256-wide head, many heads per row
  compareRope(r, 5, 256, 13, 2, 7, 1000);
}

TEST_F(CudaRopeTest, Interleaved) {
  Rope r;
  r.dim = 6;
  r.interleaved = true;
  compareRope(r, 2, 10, 4, 2, 3, 7);
  r.dim = 64; // DeepSeek's rope slice
  compareRope(r, 3, 64, 100, 1, 1, 0, plan::I32);
}

TEST_F(CudaRopeTest, InterleavedTransformersExample) {
  // The CPU test's transformers example: x = 0..7 at positions 0, 1, 2.
  auto make = [&] {
    std::vector<float> x;
    for (int t = 0; t < 3; ++t)
      for (int i = 0; i < 8; ++i)
        x.push_back(static_cast<float>(i));
    KernelCall c(reg.cpu, "rope");
    c.input(runtime::testing::floatTensor({3, 8}, x))
        .input(indexTensor(plan::I32, {3}, {0, 1, 2}))
        .output(plan::F32, {3, 8})
        .attr("head_dim", 8)
        .attr("rope.theta", 10000.0)
        .attr("rope.dim", 8)
        .attr("rope.style", "interleaved");
    return c;
  };
  compareBoth(reg.gpu, make, "interleaved example");
}

TEST_F(CudaRopeTest, Yarn) {
  Rope r;
  r.dim = 8;
  r.yarn = true;
  r.factor = 4;
  r.originalMax = 64;
  compareRope(r, 2, 12, 5, 2, 3, 23);
  r.interleaved = true;
  r.theta = 5e4;
  r.factor = 32;
  r.betaFast = 1;
  r.originalMax = 4096;
  r.mscale = 1;
  r.mscaleAllDim = 0.7;
  compareRope(r, 1, 8, 4, 2, 3, 500);
  r.truncate = false; // gpt-oss
  r.interleaved = false;
  r.theta = 1.5e5;
  r.betaFast = 32;
  r.mscaleAllDim = 0;
  compareRope(r, 2, 16, 5, 2, 3, 300);
  compareRope(r, 4, 64, 37, 3, 997, 40000); // long-context positions
}

TEST_F(CudaRopeTest, BackwardVariants) {
  Rope r;
  r.dim = 6;
  for (bool interleaved : {false, true}) {
    r.interleaved = interleaved;
    r.yarn = interleaved;
    r.factor = 8;
    r.originalMax = 32;
    compareRope(r, 2, 10, 4, 2, 3, 9);
    compareRope(r, 3, 10, 7, 2, 1, 0, plan::I32);
  }
}

TEST_F(CudaRopeTest, BackwardWithoutAResultGradientIsZero) {
  Rope r;
  r.dim = 4;
  compareBoth(
      reg.gpu, [&] { return backwardOf(reg.cpu, call(r, 2, 6, 3, 2, 1, 5), {0}, 1, false); },
      "rope.backward without gradient");
}

TEST_F(CudaRopeTest, BadLaunchesFailWithAMessage) {
  // The CPU test's bad launches, on the CUDA kernels (they fail before any CUDA call).
  Rope r;
  r.dim = 4;
  auto gpu = [&](KernelCall c) { return onRegistry(reg.gpu, c); };
  KernelCall missing = call(r, 2, 8, 2, 2, 1, 0);
  missing.attributes().erase("rope.theta");
  expectFailure(gpu(missing), "rope.theta");
  r.dim = 5;
  expectFailure(gpu(call(r, 2, 8, 2, 2, 1, 0)), "rope.dim");
  r.dim = 10;
  expectFailure(gpu(call(r, 2, 8, 2, 2, 1, 0)), "at most 8");
  r.dim = 4;
  KernelCall style = call(r, 2, 8, 2, 2, 1, 0);
  style.attr("rope.style", "yarn");
  expectFailure(gpu(style), "supported: half, interleaved");
  KernelCall headDim = call(r, 2, 8, 2, 2, 1, 0);
  headDim.attr("head_dim", 3);
  expectFailure(gpu(headDim), "multiple of head_dim");
  KernelCall positions = call(r, 1, 8, 2, 2, 1, 0);
  positions.inputsRef()[1] = indexTensor(plan::I64, {3}, {0, 1, 2});
  expectFailure(gpu(positions), "positions has shape [3]");
  KernelCall dtype = call(r, 1, 8, 2, 2, 1, 0);
  dtype.inputsRef()[0] = runtime::testing::zeroTensor(plan::I32, {4, 8});
  expectFailure(gpu(dtype), "input must be f32 or bf16");
  KernelCall yarn = call(r, 2, 8, 2, 2, 1, 0);
  yarn.attr("rope.yarn.factor", 4.0);
  expectFailure(gpu(yarn), "rope.yarn.original_max_position");
  r.dim = 1024;
  expectFailure(gpu(call(r, 1, 1024, 2, 2, 1, 0)), "exceeds the CUDA kernels' limit of 512");
  KernelCall backward = backwardOf(reg.gpu, call(r, 1, 1024, 2, 2, 1, 0), {1}, 3);
  expectFailure(backward, "operand 1, which has no gradient");
}

} // namespace
} // namespace moec::runtime::cuda::attention::testing
