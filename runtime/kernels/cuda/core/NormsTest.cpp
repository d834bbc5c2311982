//===- NormsTest.cpp - rms_norm (whole, sharded), layer_norm on CUDA vs CPU ===//

#include "runtime/kernels/cuda/core/CoreCompare.h"

namespace moec::runtime::cuda::core::testing {
namespace {

/// Weights near 1 (plain) or near 0 (unit_offset), as trained norms have them.
OwnedTensor normWeight(int64_t size, bool unitOffset, uint64_t seed) {
  std::vector<float> w = randomTensor({size}, seed, 0.3f).floats();
  if (!unitOffset)
    for (float &v : w)
      v += 1.0f;
  return floatTensor({size}, w);
}

KernelCall rmsNormCall(const std::vector<int64_t> &shape, int64_t groupSize, bool unitOffset,
                       uint64_t seed) {
  KernelCall call(registry(), "rms_norm");
  call.input(randomTensor(shape, seed, 2.0f))
      .input(normWeight(groupSize, unitOffset, seed + 1))
      .attr("eps", 1e-6)
      .output(plan::F32, shape);
  if (unitOffset)
    call.attr("unit_offset", true);
  return call;
}

struct RmsCase {
  std::vector<int64_t> shape;
  int64_t groupSize;
  bool unitOffset;
};

const std::vector<RmsCase> kRmsCases = {
    // The CPU test's cases.
    {{7, 12}, 12, false},
    {{5, 24}, 8, false},
    {{6, 20}, 20, true},
    {{3, 12}, 4, true},
    {{2, 3, 10}, 5, false},
    {{1, 1}, 1, false},
    // Rows and groups that are not multiples of a block; several row chunks for dw.
    {{13, 1000}, 1000, false},
    {{33, 4 * 96}, 96, true},
    {{100, 300}, 300, false},
    {{301, 64}, 16, true},
    {{7, 3000}, 3000, true},
    {{1000, 48}, 48, false},
    // A warp per group up to 256 features (per-head q/k norms), a block per group above.
    {{64, 16 * 128}, 128, false},
    {{9, 2 * 256}, 256, true},
    {{5, 257}, 257, false},
    // bf16 groups of a multiple of 8 features up to 8192 take the vectorised kernels (the runs
    // with bf16 storage): segments of 2, 8, 16 lanes above, and here 4 and 32 lanes, a block of
    // 256 threads (Qwen3's hidden size), the largest block; 8200 features take the scalar ones.
    {{37, 3 * 32}, 32, false},
    {{19, 2048}, 2048, false},
    {{3, 8192}, 8192, true},
    {{2, 8200}, 8200, false},
};

std::string name(const RmsCase &c) {
  return "rms_norm " + shapeText(c.shape) + " G=" + std::to_string(c.groupSize) +
         (c.unitOffset ? " unit_offset" : "");
}

TEST(CudaRmsNorm, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (const RmsCase &c : kRmsCases)
    expectMatchesCpu([&] { return rmsNormCall(c.shape, c.groupSize, c.unitOffset, 3); }, name(c));
}

TEST(CudaRmsNorm, F32WeightWithBf16Activations) {
  SKIP_WITHOUT_GPU();
  CudaCompareOptions options;
  options.f32Inputs = {1};
  expectMatchesCpuIn(
      plan::BF16, [] { return rmsNormCall({33, 4 * 96}, 96, false, 4); }, "rms_norm f32 weight",
      options);
}

TEST(CudaRmsNorm, BackwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (const RmsCase &c : kRmsCases)
    for (const std::vector<int64_t> &wrt :
         std::vector<std::vector<int64_t>>{{0, 1}, {1}, {0}, {1, 0}})
      expectMatchesCpu(
          [&] {
            KernelCall forward = rmsNormCall(c.shape, c.groupSize, c.unitOffset, 5);
            return backwardOf(forward, wrt, {{0, randomTensor(c.shape, 99)}});
          },
          name(c) + " backward wrt " + shapeText(wrt));
}

// row_sum_of_squares and sharded_rms_norm: rows of `whole` features of which the launch holds
// `features` (a tp rank's heads); the sum of squares and its gradient stay f32 in bf16 runs.
struct ShardedCase {
  int64_t rows, features, whole;
  bool unitOffset;
};

const std::vector<ShardedCase> kShardedCases = {
    {7, 12, 24, false}, {5, 1, 3, true}, {13, 1000, 2000, true}, {64, 1024, 2048, false}, {300, 257, 514, false},
};

std::string name(const ShardedCase &c) {
  return "[" + std::to_string(c.rows) + "," + std::to_string(c.features) + "] of " + std::to_string(c.whole) +
         (c.unitOffset ? " unit_offset" : "");
}

KernelCall shardedRmsNormCall(const ShardedCase &c, uint64_t seed) {
  std::vector<float> ss = randomTensor({c.rows, 1}, seed + 2, 1.0f).floats();
  for (float &v : ss)
    v = static_cast<float>(c.whole) * (2.0f + v); // rows of values about 1.4 in size
  KernelCall call(registry(), "sharded_rms_norm");
  call.input(randomTensor({c.rows, c.features}, seed, 2.0f))
      .input(normWeight(c.features, c.unitOffset, seed + 1))
      .input(floatTensor({c.rows, 1}, ss))
      .attr("eps", 1e-6)
      .attr("features", c.whole)
      .output(plan::F32, {c.rows, c.features});
  if (c.unitOffset)
    call.attr("unit_offset", true);
  return call;
}

KernelCall rowSumOfSquaresCall(const ShardedCase &c, uint64_t seed) {
  KernelCall call(registry(), "row_sum_of_squares");
  call.input(randomTensor({c.rows, c.features}, seed, 2.0f)).output(plan::F32, {c.rows, 1});
  return call;
}

TEST(CudaShardedRmsNorm, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  CudaCompareOptions sum, norm;
  sum.f32Outputs = {0};
  norm.f32Inputs = {2};
  for (const ShardedCase &c : kShardedCases) {
    expectMatchesCpu([&] { return rowSumOfSquaresCall(c, 7); }, "row_sum_of_squares " + name(c), sum);
    expectMatchesCpu([&] { return shardedRmsNormCall(c, 8); }, "sharded_rms_norm " + name(c), norm);
  }
}

TEST(CudaShardedRmsNorm, BackwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (const ShardedCase &c : kShardedCases) {
    CudaCompareOptions sum;
    sum.f32Inputs = {1}; // the sum's gradient
    expectMatchesCpu(
        [&] {
          KernelCall forward = rowSumOfSquaresCall(c, 9);
          return backwardOf(forward, {0}, {{0, randomTensor({c.rows, 1}, 97)}});
        },
        "row_sum_of_squares " + name(c) + " backward", sum);
    for (const std::vector<int64_t> &wrt : std::vector<std::vector<int64_t>>{{0, 1, 2}, {2}, {1}, {2, 0}}) {
      CudaCompareOptions norm;
      norm.f32Inputs = {2};
      for (size_t i = 0; i < wrt.size(); ++i)
        if (wrt[i] == 2)
          norm.f32Outputs = {i};
      expectMatchesCpu(
          [&] {
            KernelCall forward = shardedRmsNormCall(c, 10);
            return backwardOf(forward, wrt, {{0, randomTensor({c.rows, c.features}, 96)}});
          },
          "sharded_rms_norm " + name(c) + " backward wrt " + shapeText(wrt), norm);
    }
  }
}

KernelCall layerNormCall(const std::vector<int64_t> &shape, uint64_t seed) {
  int64_t f = shape.back();
  KernelCall call(registry(), "layer_norm");
  call.input(randomTensor(shape, seed, 2.0f))
      .input(normWeight(f, false, seed + 1))
      .input(randomTensor({f}, seed + 2, 0.5f))
      .attr("eps", 1e-6)
      .output(plan::F32, shape);
  return call;
}

const std::vector<std::vector<int64_t>> kLayerNormShapes = {
    {7, 12}, {2, 3, 5}, {1, 2}, {5, 9}, {13, 1000}, {100, 33}, {300, 257}, {33, 2048},
};

TEST(CudaLayerNorm, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (const std::vector<int64_t> &shape : kLayerNormShapes)
    expectMatchesCpu([&] { return layerNormCall(shape, 4); },
                     "layer_norm " + shapeText(shape));
}

TEST(CudaLayerNorm, BackwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (const std::vector<int64_t> &shape : kLayerNormShapes)
    for (const std::vector<int64_t> &wrt :
         std::vector<std::vector<int64_t>>{{0, 1, 2}, {1, 2}, {0}, {2}, {2, 0, 1}})
      expectMatchesCpu(
          [&] {
            KernelCall forward = layerNormCall(shape, 6);
            return backwardOf(forward, wrt, {{0, randomTensor(shape, 98)}});
          },
          "layer_norm " + shapeText(shape) + " backward wrt " +
              shapeText(wrt));
}

} // namespace
} // namespace moec::runtime::cuda::core::testing
