//===- DenseTest.cpp - linear, lora and lora_linear on CUDA against the CPU -===//

#include "runtime/kernels/cuda/core/CoreCompare.h"

namespace moec::runtime::cuda::core::testing {
namespace {

KernelCall linearCall(std::vector<int64_t> xShape, int64_t out, bool bias, uint64_t seed) {
  int64_t in = xShape.back();
  std::vector<int64_t> yShape = xShape;
  yShape.back() = out;
  KernelCall call(registry(), "linear");
  call.input(randomTensor(xShape, seed)).input(randomTensor({out, in}, seed + 1, 0.5f));
  if (bias)
    call.input(randomTensor({out}, seed + 2));
  call.output(plan::F32, yShape);
  return call;
}

struct LinearCase {
  std::vector<int64_t> xShape;
  int64_t out;
  bool bias;
};

const std::vector<LinearCase> kLinearCases = {
    // The CPU test's cases.
    {{5, 7}, 3, false},
    {{5, 7}, 3, true},
    {{2, 3, 4}, 5, true},
    {{4}, 6, false},
    {{1, 1}, 1, true},
    // Odd sizes, several row chunks for the bias gradient.
    {{13, 33}, 65, true},
    {{100, 64}, 7, false},
    {{7, 13, 20}, 1, true},
    {{300, 256}, 130, true},
    {{33, 100}, 300, false},
};

std::string name(const LinearCase &c) {
  return "linear " + shapeText(c.xShape) + " -> " + std::to_string(c.out) +
         (c.bias ? " with bias" : "");
}

TEST(CudaLinear, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (const LinearCase &c : kLinearCases)
    expectMatchesCpu([&] { return linearCall(c.xShape, c.out, c.bias, 1); }, name(c));
}

// Mixed storage types: f32 weights with bf16 activations (the product in f32,
// rounded into the bf16 result), and an f32 result of bf16 operands.
TEST(CudaLinear, MixedStorageTypes) {
  SKIP_WITHOUT_GPU();
  for (const LinearCase &c : kLinearCases) {
    CudaCompareOptions f32Weight;
    f32Weight.f32Inputs = {1, 2};
    expectMatchesCpuIn(
        plan::BF16, [&] { return linearCall(c.xShape, c.out, c.bias, 1); },
        name(c) + " f32 weight", f32Weight);
    CudaCompareOptions f32Result;
    f32Result.f32Outputs = {0};
    expectMatchesCpuIn(
        plan::BF16, [&] { return linearCall(c.xShape, c.out, c.bias, 1); },
        name(c) + " f32 result", f32Result);
  }
}

TEST(CudaLinear, BackwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (const LinearCase &c : kLinearCases) {
    std::vector<std::vector<int64_t>> subsets = {{0, 1}, {1}, {0}};
    if (c.bias)
      subsets.insert(subsets.end(), {{0, 1, 2}, {2, 1}, {2}});
    for (const std::vector<int64_t> &wrt : subsets)
      expectMatchesCpu(
          [&] {
            KernelCall forward = linearCall(c.xShape, c.out, c.bias, 2);
            std::vector<int64_t> yShape = c.xShape;
            yShape.back() = c.out;
            return backwardOf(forward, wrt, {{0, randomTensor(yShape, 50)}});
          },
          name(c) + " backward wrt " + shapeText(wrt));
  }
}

TEST(CudaLinear, BackwardMixedStorageTypes) {
  SKIP_WITHOUT_GPU();
  for (const LinearCase &c : kLinearCases) {
    std::vector<int64_t> wrt = c.bias ? std::vector<int64_t>{0, 1, 2} : std::vector<int64_t>{0, 1};
    auto make = [&] {
      KernelCall forward = linearCall(c.xShape, c.out, c.bias, 2);
      std::vector<int64_t> yShape = c.xShape;
      yShape.back() = c.out;
      return backwardOf(forward, wrt, {{0, randomTensor(yShape, 50)}});
    };
    // f32 weight (and bias) with their f32 gradients; bf16 activations.
    CudaCompareOptions f32Params;
    f32Params.f32Inputs = {1, 2};
    f32Params.f32Outputs = {1, 2};
    expectMatchesCpuIn(plan::BF16, make, name(c) + " backward, f32 parameters", f32Params);
    // An f32 result gradient with bf16 operands and gradients.
    CudaCompareOptions f32Grad;
    f32Grad.f32Inputs = {static_cast<size_t>(c.bias ? 3 : 2)};
    expectMatchesCpuIn(plan::BF16, make, name(c) + " backward, f32 result gradient", f32Grad);
  }
}

KernelCall loraCall(int64_t rows, int64_t in, int64_t rank, int64_t out, double scale,
                    uint64_t seed) {
  KernelCall call(registry(), "lora");
  call.input(randomTensor({rows, in}, seed))
      .input(randomTensor({rank, in}, seed + 1, 0.5f))
      .input(randomTensor({out, rank}, seed + 2, 0.5f))
      .attr("scale", scale)
      .output(plan::F32, {rows, out});
  return call;
}

struct LoraCase {
  int64_t rows, in, rank, out;
  double scale;
};

const std::vector<LoraCase> kLoraCases = {
    {6, 10, 3, 7, 2.0}, {6, 10, 3, 7, 0.5}, {5, 6, 2, 4, 2.0}, {100, 96, 8, 72, 2.0},
    {13, 33, 1, 65, 0.25}, {300, 256, 16, 100, 1.0}, {1, 1, 1, 1, 2.0},
};

std::string name(const LoraCase &c) {
  return "lora rows " + std::to_string(c.rows) + " in " + std::to_string(c.in) + " r " +
         std::to_string(c.rank) + " out " + std::to_string(c.out);
}

TEST(CudaLora, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (const LoraCase &c : kLoraCases) {
    expectMatchesCpu([&] { return loraCall(c.rows, c.in, c.rank, c.out, c.scale, 7); }, name(c));
    expectMatchesCpu(
        [&] {
          KernelCall call = loraCall(c.rows, c.in, c.rank, c.out, c.scale, 7);
          call.attr("dropout", 0.0);
          return call;
        },
        name(c) + " dropout 0");
  }
}

TEST(CudaLora, MixedStorageTypes) {
  SKIP_WITHOUT_GPU();
  for (const LoraCase &c : kLoraCases) {
    CudaCompareOptions f32Adapter; // f32 adapter weights on bf16 activations
    f32Adapter.f32Inputs = {1, 2};
    expectMatchesCpuIn(
        plan::BF16, [&] { return loraCall(c.rows, c.in, c.rank, c.out, c.scale, 8); },
        name(c) + " f32 adapter", f32Adapter);
  }
}

// With f32 adapters, LoRA's result and input gradient are f32 x f32 products with k = rank:
// bf16 planes of both operands stacked along k, one tensor-core product (gemmAny). With f32
// outputs they must keep f32 precision (a product at bf16 precision is ~4e-3 off).
TEST(CudaLora, F32AdapterProductsKeepF32Precision) {
  SKIP_WITHOUT_GPU();
  for (const LoraCase &c : kLoraCases) {
    CudaCompareOptions f32Adapter;
    f32Adapter.f32Inputs = {1, 2};
    f32Adapter.f32Outputs = {0};
    f32Adapter.tolerance = 1e-5;
    expectMatchesCpuIn(
        plan::BF16, [&] { return loraCall(c.rows, c.in, c.rank, c.out, c.scale, 9); },
        name(c) + " f32 adapter and result at 1e-5", f32Adapter);
    CudaCompareOptions f32InputGrad = f32Adapter;
    f32InputGrad.f32Inputs = {1, 2, 3};
    expectMatchesCpuIn(
        plan::BF16,
        [&] {
          KernelCall forward = loraCall(c.rows, c.in, c.rank, c.out, c.scale, 10);
          return backwardOf(forward, {0}, {{0, randomTensor({c.rows, c.out}, 63)}});
        },
        name(c) + " f32 adapter, input gradient at 1e-5", f32InputGrad);
  }
}

TEST(CudaLora, BackwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (const LoraCase &c : kLoraCases)
    for (const std::vector<int64_t> &wrt :
         std::vector<std::vector<int64_t>>{{0, 1, 2}, {1, 2}, {2}, {1}, {0}, {2, 0}})
      expectMatchesCpu(
          [&] {
            KernelCall forward = loraCall(c.rows, c.in, c.rank, c.out, c.scale, 3);
            return backwardOf(forward, wrt, {{0, randomTensor({c.rows, c.out}, 60)}});
          },
          name(c) + " backward wrt " + shapeText(wrt));
}

// f32 adapter weights and gradients (the trainable parameters) on bf16 activations: the
// gradients keep f32 precision (PEFT computes them in f32; TF32 products would be ~1e-3 off),
// the f32 operand going through bf16 planes that sum to it.
TEST(CudaLora, BackwardMixedStorageTypesKeepF32Precision) {
  SKIP_WITHOUT_GPU();
  for (const LoraCase &c : kLoraCases) {
    CudaCompareOptions f32Adapter;
    f32Adapter.f32Inputs = {1, 2};
    f32Adapter.f32Outputs = {0, 1};
    f32Adapter.tolerance = 1e-5;
    expectMatchesCpuIn(
        plan::BF16,
        [&] {
          KernelCall forward = loraCall(c.rows, c.in, c.rank, c.out, c.scale, 4);
          return backwardOf(forward, {1, 2}, {{0, randomTensor({c.rows, c.out}, 62)}});
        },
        name(c) + " backward, f32 adapter gradients at 1e-5", f32Adapter);
  }
}

/// baseType null: no base_type (the compare runs the launch in f32 and in bf16 storage).
KernelCall loraLinearCall(const LoraCase &c, uint64_t seed, const char *baseType = nullptr) {
  KernelCall call(registry(), "lora_linear");
  if (baseType)
    call.attr("base_type", baseType);
  call.input(randomTensor({c.rows, c.in}, seed))
      .input(randomTensor({c.out, c.in}, seed + 3, 0.5f))
      .input(randomTensor({c.rank, c.in}, seed + 1, 0.5f))
      .input(randomTensor({c.out, c.rank}, seed + 2, 0.5f))
      .attr("scale", c.scale)
      .output(plan::F32, {c.rows, c.out});
  return call;
}

// The projection with its update (--moe-fuse-lora): in f32, and as a bf16 plan has it (bf16
// activations and weight, f32 adapters and their gradients, base_type bf16: the CPU rounds the
// projection's part where the GPU's bf16 output holds it), forward and backward.
TEST(CudaLoraLinear, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (const LoraCase &c : kLoraCases) {
    std::string what = "lora_linear rows " + std::to_string(c.rows) + " in " + std::to_string(c.in) + " r " +
                       std::to_string(c.rank) + " out " + std::to_string(c.out);
    expectMatchesCpu([&] { return loraLinearCall(c, 21); }, what);
    CudaCompareOptions f32Adapter;
    f32Adapter.f32Inputs = {2, 3};
    expectMatchesCpuIn(plan::BF16, [&] { return loraLinearCall(c, 22, "bf16"); }, what + " f32 adapter", f32Adapter);
    for (const std::vector<int64_t> &wrt :
         std::vector<std::vector<int64_t>>{{0, 2, 3}, {2, 3}, {0}, {0, 1, 2, 3}, {3, 1}}) {
      auto make = [&](const char *baseType) {
        return [&wrt, &c, baseType] {
          KernelCall forward = loraLinearCall(c, 23, baseType);
          return backwardOf(forward, wrt, {{0, randomTensor({c.rows, c.out}, 64)}});
        };
      };
      expectMatchesCpu(make(nullptr), what + " backward wrt " + shapeText(wrt));
      CudaCompareOptions bf16Plan;
      bf16Plan.f32Inputs = {2, 3};
      for (size_t k = 0; k < wrt.size(); ++k) // the adapters' gradients in f32
        if (wrt[k] >= 2)
          bf16Plan.f32Outputs.push_back(k);
      expectMatchesCpuIn(plan::BF16, make("bf16"), what + " backward wrt " + shapeText(wrt) + ", f32 adapter",
                         bf16Plan);
    }
  }
}

} // namespace
} // namespace moec::runtime::cuda::core::testing
