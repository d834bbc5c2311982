//===- RoutingCudaTestUtil.h - CUDA routing kernels vs the CPU twins -*- C++ -*-===//
//
// The comparison tests build each launch exactly as the CPU routing tests do
// (cpu/routing/RoutingTestUtil.h: routerCall, expertCall, the same cases) and
// run it through compareCudaWithCpu in f32 and in bf16 storage. Inputs are
// rounded to bf16 up front, so the routing (and the decisiveness checks on
// it) is the same in both storages.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CUDA_ROUTING_ROUTINGCUDATESTUTIL_H_
#define RUNTIME_KERNELS_CUDA_ROUTING_ROUTINGCUDATESTUTIL_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "runtime/kernels/cpu/routing/RoutingTestUtil.h"
#include "runtime/kernels/cuda/CudaKernels.h"
#include "runtime/kernels/testing/CudaCompare.h"

namespace moec::runtime::cuda::routing::testing {

using moec::runtime::cpu::routing::testing::Values;
using moec::runtime::testing::CudaCompareOptions;
using moec::runtime::testing::CudaComparison;
using moec::runtime::testing::KernelCall;
using moec::runtime::testing::OwnedTensor;

/// The kernels under test.
inline const KernelRegistry &cudaRegistry() {
  static const KernelRegistry kernels = [] {
    KernelRegistry r;
    registerRoutingKernels(r);
    return r;
  }();
  return kernels;
}

/// v rounded to the nearest bf16 (ties to even), as f32.
inline float roundBf16(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  bits += 0x7fff + ((bits >> 16) & 1);
  bits &= 0xffff0000u;
  float r;
  std::memcpy(&r, &bits, 4);
  return r;
}

/// Values rounded to bf16: exactly representable in both storages.
inline Values bf16Values(Values v) {
  for (double &x : v)
    x = roundBf16(static_cast<float>(x));
  return v;
}

/// Uniform in [-scale, scale), rounded to bf16.
inline Values randomBf16(int64_t n, uint64_t seed, double scale = 1.0) {
  return bf16Values(cpu::routing::testing::randomValues(n, seed, scale));
}

/// Runs `make()` (a fresh launch each time: the harness rounds inputs in
/// place) on the CPU and the GPU in f32 and in bf16 storage. `f32Inputs` /
/// `f32Outputs` stay f32 with bf16 storage (router weights, ...).
inline void expectGpuMatchesCpu(const std::function<KernelCall()> &make,
                                std::vector<size_t> f32Inputs = {},
                                std::vector<size_t> f32Outputs = {}) {
  for (plan::DType storage : {plan::F32, plan::BF16}) {
    KernelCall call = make();
    CudaCompareOptions options;
    options.storage = storage;
    options.f32Inputs = f32Inputs;
    options.f32Outputs = f32Outputs;
    CudaComparison r = moec::runtime::testing::compareCudaWithCpu(cudaRegistry(), call, options);
    if (r.skipped)
      GTEST_SKIP() << r.why;
    EXPECT_TRUE(r.ok) << call.kernelName() << " with "
                      << (storage == plan::F32 ? "f32" : "bf16") << " storage:\n"
                      << r.report;
  }
}

/// The `.backward` launch of `forward` as the differentiation rule makes it
/// (see checkGradients): forward operands, the forward results if
/// `withResults` (the forward must have run), the output gradients; outputs
/// the f32 gradients of `wrt`.
inline KernelCall backwardCall(const KernelRegistry &cpu, KernelCall &forward,
                               const std::vector<int64_t> &wrt,
                               const std::vector<int64_t> &outputsWithGrad,
                               const std::vector<OwnedTensor> &outputGrads,
                               bool withResults = false) {
  KernelCall backward(cpu, forward.kernelName() + ".backward");
  backward.attributes() = forward.attributes();
  backward.attr("grad_of_inputs", wrt).attr("grad_of_outputs", outputsWithGrad);
  backward.sequences(forward.seqLen(), forward.microBatch());
  for (OwnedTensor &t : forward.inputsRef())
    backward.input(t);
  int64_t results = 0;
  if (withResults)
    for (; results < static_cast<int64_t>(forward.numOutputs()); ++results)
      backward.input(forward.result(results));
  for (const OwnedTensor &g : outputGrads)
    backward.input(g);
  backward.attr("backward_segments",
                std::vector<int64_t>{static_cast<int64_t>(forward.inputsRef().size()), results,
                                     static_cast<int64_t>(outputGrads.size())});
  for (int64_t i : wrt)
    backward.output(plan::F32, forward.inputsRef().at(i).shape);
  return backward;
}

/// Runs the CUDA kernel of `call` on its host tensors and expects it to
/// refuse the launch with a message containing `needle`: the launch checks
/// run on the host before anything touches the device, so this needs no GPU.
inline void expectRefused(KernelCall call, const std::string &needle) {
  const KernelFn *fn = cudaRegistry().find(call.kernelName());
  ASSERT_NE(fn, nullptr) << "no CUDA kernel '" << call.kernelName() << "'";
  KernelContext ctx;
  ctx.kernel = call.kernelName();
  for (OwnedTensor &t : call.inputsRef())
    ctx.inputs.push_back(t.ref());
  for (size_t i = 0; i < call.numOutputs(); ++i)
    ctx.outputs.push_back(call.result(i).ref());
  ctx.attrs = &call.attributes();
  ctx.seqLen = call.inputsRef().empty() || call.inputsRef()[0].shape.empty()
                   ? 1
                   : call.inputsRef()[0].shape[0];
  ctx.microBatch = 1;
  try {
    (*fn)(ctx);
    ADD_FAILURE() << "expected a failure mentioning '" << needle << "'";
  } catch (const KernelError &e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

/// `count` expert indices per token for `tokens` tokens, distinct within a
/// token (as a router makes them), skewed towards the low experts so that the
/// loads are ragged and the high experts often get nothing.
inline std::vector<int64_t> skewedIndices(int64_t tokens, int64_t topK, int64_t experts,
                                          uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<int64_t> out;
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<int64_t> chosen;
    while (static_cast<int64_t>(chosen.size()) < topK) {
      double v = u(rng);
      int64_t e = static_cast<int64_t>(v * v * v * experts);
      if (e >= experts)
        e = experts - 1;
      bool seen = false;
      for (int64_t c : chosen)
        seen |= c == e;
      if (!seen)
        chosen.push_back(e);
    }
    out.insert(out.end(), chosen.begin(), chosen.end());
  }
  return out;
}

} // namespace moec::runtime::cuda::routing::testing

#endif // RUNTIME_KERNELS_CUDA_ROUTING_ROUTINGCUDATESTUTIL_H_
