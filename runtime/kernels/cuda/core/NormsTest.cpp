//===- NormsTest.cpp - rms_norm and layer_norm on CUDA against the CPU ----===//

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
