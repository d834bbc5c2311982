//===- LaunchChecksTest.cpp - the CUDA kernels refuse bad launches on the host -===//
//
// The launch checks run on the host before anything is enqueued, with the CPU
// kernels' messages. These launches carry host pointers and must be refused
// before any launch, so the tests need no GPU.
//
//===----------------------------------------------------------------------===//

#include <gmock/gmock.h>

#include "runtime/kernels/cuda/core/CoreCompare.h"

namespace moec::runtime::cuda::core::testing {
namespace {

using ::testing::HasSubstr;

TEST(CudaLaunchChecks, EveryCoreKernelIsRegistered) {
  for (const std::string &name : registry().names())
    EXPECT_NE(cudaRegistry().find(name), nullptr) << name;
  EXPECT_EQ(cudaRegistry().names(), registry().names());
}

TEST(CudaLaunchChecks, Norms) {
  KernelCall notDividing(registry(), "rms_norm");
  notDividing.input(randomTensor({3, 12}, 1))
      .input(filledTensor({5}, 1))
      .attr("eps", 1e-6)
      .output(plan::F32, {3, 12});
  EXPECT_THAT(cudaFailureOf(notDividing),
              HasSubstr("weight size 5 does not divide the input's 12 features"));

  KernelCall noEps(registry(), "rms_norm");
  noEps.input(randomTensor({3, 4}, 1)).input(filledTensor({4}, 1)).output(plan::F32, {3, 4});
  EXPECT_THAT(cudaFailureOf(noEps), HasSubstr("missing attribute 'eps'"));

  KernelCall wrongResult(registry(), "rms_norm");
  wrongResult.input(randomTensor({3, 4}, 1))
      .input(filledTensor({4}, 1))
      .attr("eps", 1e-6)
      .output(plan::F32, {3, 5});
  EXPECT_THAT(cudaFailureOf(wrongResult), HasSubstr("result has shape [3,5]"));

  KernelCall intInput(registry(), "rms_norm");
  intInput.input(zeroTensor(plan::I32, {3, 4}))
      .input(filledTensor({4}, 1))
      .attr("eps", 1e-6)
      .output(plan::F32, {3, 4});
  EXPECT_THAT(cudaFailureOf(intInput), HasSubstr("input must be f32 or bf16, got i32"));

  KernelCall forward(registry(), "rms_norm");
  forward.input(randomTensor({3, 4}, 1)).input(filledTensor({4}, 1)).attr("eps", 1e-6)
      .output(plan::F32, {3, 4});
  KernelCall noGrad = backwardOf(forward, {0}, {});
  EXPECT_THAT(cudaFailureOf(noGrad), HasSubstr("grad_of_outputs must name result 0"));

  KernelCall noBias(registry(), "layer_norm");
  noBias.input(randomTensor({3, 4}, 1))
      .input(filledTensor({4}, 1))
      .attr("eps", 1e-6)
      .output(plan::F32, {3, 4});
  EXPECT_THAT(cudaFailureOf(noBias), HasSubstr("expected at least 3 inputs, got 2"));

  KernelCall layer(registry(), "layer_norm");
  layer.input(randomTensor({3, 4}, 1))
      .input(filledTensor({4}, 1))
      .input(filledTensor({5}, 0))
      .attr("eps", 1e-6)
      .output(plan::F32, {3, 4});
  EXPECT_THAT(cudaFailureOf(layer), HasSubstr("bias has shape [5], expected [4]"));
  layer.inputsRef()[2] = filledTensor({4}, 0);
  KernelCall wrongGrad = backwardOf(layer, {1}, {{0, randomTensor({3, 4}, 2)}});
  wrongGrad.result(0) = zeroTensor(plan::F32, {5});
  EXPECT_THAT(
      cudaFailureOf(wrongGrad),
      HasSubstr("the gradient of operand 1 has shape [5], expected the shape of operand 1 [4]"));
}

KernelCall linearCall(std::vector<int64_t> xShape, int64_t out, bool bias) {
  int64_t in = xShape.back();
  std::vector<int64_t> yShape = xShape;
  yShape.back() = out;
  KernelCall call(registry(), "linear");
  call.input(randomTensor(xShape, 1)).input(randomTensor({out, in}, 2));
  if (bias)
    call.input(randomTensor({out}, 3));
  call.output(plan::F32, yShape);
  return call;
}

TEST(CudaLaunchChecks, Dense) {
  KernelCall wrongIn = linearCall({5, 7}, 3, false);
  wrongIn.inputsRef()[1] = randomTensor({3, 6}, 1);
  EXPECT_THAT(cudaFailureOf(wrongIn), HasSubstr("input has shape [5,7], expected 6 features"));

  KernelCall wrongBias = linearCall({5, 7}, 3, true);
  wrongBias.inputsRef()[2] = randomTensor({4}, 1);
  EXPECT_THAT(cudaFailureOf(wrongBias), HasSubstr("bias has shape [4], expected [3]"));

  KernelCall wrongResult = linearCall({5, 7}, 3, false);
  wrongResult.result(0) = zeroTensor(plan::F32, {5, 4});
  EXPECT_THAT(cudaFailureOf(wrongResult), HasSubstr("result has shape [5,4], expected [5,3]"));

  KernelCall tooMany = linearCall({5, 7}, 3, true);
  tooMany.input(randomTensor({3}, 1));
  EXPECT_THAT(cudaFailureOf(tooMany), HasSubstr("expected 2 or 3 operands"));

  KernelCall call = linearCall({5, 7}, 3, false);
  KernelCall wrongGrad = backwardOf(call, {0}, {{0, randomTensor({5, 4}, 1)}});
  EXPECT_THAT(cudaFailureOf(wrongGrad),
              HasSubstr("the result gradient has shape [5,4], expected [5,3]"));
  KernelCall badSegments = backwardOf(call, {0}, {{0, randomTensor({5, 3}, 1)}});
  badSegments.attr("backward_segments", std::vector<int64_t>{3, 0, 1});
  EXPECT_THAT(cudaFailureOf(badSegments),
              HasSubstr("backward_segments [3,0,1] do not match 3 inputs"));

  KernelCall lora(registry(), "lora");
  lora.input(randomTensor({3, 4}, 1))
      .input(randomTensor({2, 4}, 2))
      .input(randomTensor({5, 2}, 3))
      .attr("scale", 2.0)
      .attr("dropout", 0.1)
      .output(plan::F32, {3, 5});
  EXPECT_THAT(cudaFailureOf(lora),
              HasSubstr("lora dropout 0.1 is not supported by the CUDA backend yet"));
  KernelCall loraBackward = backwardOf(lora, {1}, {{0, randomTensor({3, 5}, 2)}});
  EXPECT_THAT(cudaFailureOf(loraBackward), HasSubstr("is not supported by the CUDA backend yet"));

  lora.attr("dropout", 0.0);
  lora.inputsRef()[2] = randomTensor({5, 3}, 1);
  EXPECT_THAT(cudaFailureOf(lora), HasSubstr("lora_b has shape [5,3], expected [?,2]"));

  KernelCall noScale(registry(), "lora");
  noScale.input(randomTensor({3, 4}, 1))
      .input(randomTensor({2, 4}, 2))
      .input(randomTensor({5, 2}, 3))
      .output(plan::F32, {3, 5});
  EXPECT_THAT(cudaFailureOf(noScale), HasSubstr("missing attribute 'scale'"));

  KernelCall loraLinear(registry(), "lora_linear");
  loraLinear.input(randomTensor({3, 4}, 1))
      .input(randomTensor({5, 4}, 4))
      .input(randomTensor({2, 4}, 2))
      .input(randomTensor({6, 2}, 3))
      .attr("scale", 2.0)
      .output(plan::F32, {3, 5});
  EXPECT_THAT(cudaFailureOf(loraLinear), HasSubstr("lora_b has 6 output features, the weight 5"));
  loraLinear.inputsRef()[3] = randomTensor({5, 2}, 3);
  loraLinear.attr("base_type", "f16");
  EXPECT_THAT(cudaFailureOf(loraLinear), HasSubstr("base_type must be f32 or bf16, got f16"));
}

TEST(CudaLaunchChecks, Elementwise) {
  KernelCall mismatch(registry(), "add");
  mismatch.input(randomTensor({3, 5}, 1)).input(randomTensor({3, 4}, 2)).output(plan::F32, {3, 5});
  EXPECT_THAT(cudaFailureOf(mismatch),
              HasSubstr("rhs has shape [3,4], expected the shape of lhs [3,5]"));

  KernelCall unknown(registry(), "activation");
  unknown.input(randomTensor({2, 3}, 1)).attr("kind", "gelu").output(plan::F32, {2, 3});
  EXPECT_THAT(cudaFailureOf(unknown),
              HasSubstr("unknown activation 'gelu' (supported: silu, gelu_tanh, relu2, sigmoid)"));
  KernelCall clamped(registry(), "glu");
  clamped.input(randomTensor({2, 3}, 1))
      .input(randomTensor({2, 3}, 2))
      .attr("kind", "clamped_swiglu")
      .output(plan::F32, {2, 3});
  EXPECT_THAT(cudaFailureOf(clamped), HasSubstr("'clamped_swiglu' is only used inside expert_mlp"));

  KernelCall gate(registry(), "sigmoid_gate");
  gate.input(randomTensor({4, 6}, 1)).input(randomTensor({4, 2}, 2)).output(plan::F32, {4, 6});
  EXPECT_THAT(cudaFailureOf(gate), HasSubstr("gate has shape [4,2], expected [4,1]"));

  KernelCall split(registry(), "split");
  split.input(randomTensor({3, 8}, 1))
      .attr("sizes", std::vector<int64_t>{5, 2, 1})
      .output(plan::F32, {3, 5})
      .output(plan::F32, {3, 3});
  EXPECT_THAT(cudaFailureOf(split), HasSubstr("expected 3 results (one per size), got 2"));
  split.attr("sizes", std::vector<int64_t>{8, 0});
  EXPECT_THAT(cudaFailureOf(split), HasSubstr("sizes [8,0] must all be positive"));
  split.attr("sizes", std::vector<int64_t>{5, 3});
  KernelCall noSuchResult = backwardOf(split, {0}, {{2, randomTensor({3, 3}, 1)}});
  EXPECT_THAT(cudaFailureOf(noSuchResult),
              HasSubstr("grad_of_outputs names result 2, but the op has 2 results"));

  KernelCall noValue(registry(), "fill");
  noValue.output(plan::F32, {});
  EXPECT_THAT(cudaFailureOf(noValue), HasSubstr("missing attribute 'value'"));

  KernelCall accumulate(registry(), "accumulate_grad");
  accumulate.input(randomTensor({3, 4}, 22)).output(plan::F32, {3, 5});
  EXPECT_THAT(cudaFailureOf(accumulate),
              HasSubstr("the gradient has shape [3,4], expected the shape of the accumulator [3,5]"));
}

TEST(CudaLaunchChecks, Tokens) {
  KernelCall floatIds(registry(), "embedding");
  floatIds.input(randomTensor({3}, 1)).input(randomTensor({8, 4}, 2)).output(plan::F32, {3, 4});
  EXPECT_THAT(cudaFailureOf(floatIds), HasSubstr("ids must be i32 or i64, got f32"));

  KernelCall embedding(registry(), "embedding");
  embedding.input(indexTensor(plan::I64, {2}, {1, 2}))
      .input(randomTensor({8, 4}, 2))
      .output(plan::F32, {2, 5});
  EXPECT_THAT(cudaFailureOf(embedding), HasSubstr("result has shape [2,5], expected [2,4]"));
  embedding.result(0) = zeroTensor(plan::F32, {2, 4});
  KernelCall idsGrad = backwardOf(embedding, {0}, {{0, randomTensor({2, 4}, 3)}});
  idsGrad.result(0) = zeroTensor(plan::F32, {2});
  EXPECT_THAT(cudaFailureOf(idsGrad), HasSubstr("operand 0 has no gradient"));

  KernelCall loss(registry(), "cross_entropy");
  loss.input(randomTensor({10, 7}, 1))
      .input(indexTensor(plan::I64, {10}, std::vector<int64_t>(10, 0)))
      .attr("shift_labels", true)
      .sequences(4, 2)
      .output(plan::F32, {});
  EXPECT_THAT(cudaFailureOf(loss), HasSubstr("10 rows are not a multiple of seq_len 4"));
  loss.sequences(5, 2);
  loss.result(0) = zeroTensor(plan::F32, {1});
  EXPECT_THAT(cudaFailureOf(loss), HasSubstr("loss has shape [1], expected []"));
  loss.result(0) = zeroTensor(plan::F32, {});
  loss.inputsRef()[1] = indexTensor(plan::I64, {9}, std::vector<int64_t>(9, 0));
  EXPECT_THAT(cudaFailureOf(loss), HasSubstr("labels has shape [9], expected [10]"));
  loss.inputsRef()[1] = indexTensor(plan::I64, {10}, std::vector<int64_t>(10, 0));
  KernelCall noSeed = backwardOf(loss, {0}, {{0, floatTensor({2}, {1.0f, 1.0f})}});
  EXPECT_THAT(cudaFailureOf(noSeed), HasSubstr("the result gradient has shape [2], expected []"));
}

} // namespace
} // namespace moec::runtime::cuda::core::testing
