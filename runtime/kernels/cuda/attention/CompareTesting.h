//===- CompareTesting.h - CUDA-vs-CPU comparisons for the attention tests -*- C++ -*-===//
//
// Each comparison builds a fresh launch (the harness rounds a call's inputs
// to bf16 in place) and runs it with F32 and with BF16 storage.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CUDA_ATTENTION_COMPARETESTING_H_
#define RUNTIME_KERNELS_CUDA_ATTENTION_COMPARETESTING_H_

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "runtime/kernels/cpu/CpuKernels.h"
#include "runtime/kernels/cuda/CudaKernels.h"
#include "runtime/kernels/testing/CudaCompare.h"
#include "runtime/kernels/testing/KernelTesting.h"
#include "runtime/plan/PlanFormat.h"

namespace moec::runtime::cuda::attention::testing {

using runtime::testing::CudaCompareOptions;
using runtime::testing::CudaComparison;
using runtime::testing::KernelCall;
using runtime::testing::OwnedTensor;

/// The CPU (oracle) and CUDA registries of the attention family.
struct Registries {
  Registries() {
    cpu::registerAttentionKernels(cpu);
    cuda::registerAttentionKernels(gpu);
  }
  KernelRegistry cpu, gpu;
};

/// Compares make()'s launch on the GPU with the CPU, in F32 then in BF16
/// storage; skips the test when there is no GPU.
inline void compareBoth(const KernelRegistry &gpu, const std::function<KernelCall()> &make,
                        const std::string &what, CudaCompareOptions options = {}) {
  for (plan::DType storage : {plan::F32, plan::BF16}) {
    KernelCall call = make();
    options.storage = storage;
    CudaComparison r = runtime::testing::compareCudaWithCpu(gpu, call, options);
    if (r.skipped)
      GTEST_SKIP() << r.why;
    EXPECT_TRUE(r.ok) << what << " with " << plan::dtypeName(storage) << " storage:\n" << r.report;
  }
}

/// Runs `call` (on whatever registry it was built for) and expects a
/// KernelError whose message contains `text`. With the CUDA registry this
/// checks the host-side launch checks, which fail before any CUDA call.
inline void expectFailure(KernelCall call, const std::string &text) {
  try {
    call.run();
    ADD_FAILURE() << "no failure, expected: " << text;
  } catch (const KernelError &e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

/// The same launch set up for another registry (same inputs, outputs, attributes).
inline KernelCall onRegistry(const KernelRegistry &registry, KernelCall &call) {
  KernelCall other(registry, call.kernelName());
  for (OwnedTensor &t : call.inputsRef())
    other.input(t);
  for (size_t i = 0; i < call.numOutputs(); ++i)
    other.output(call.result(i).dtype, call.result(i).shape);
  other.attributes() = call.attributes();
  if (call.seqLen() > 0)
    other.sequences(call.seqLen(), call.microBatch());
  return other;
}

/// The `.backward` launch of `forward` as checkGradients builds it: the
/// forward operands, then the result's gradient; outputs are the gradients of
/// `wrt`. An empty `gradOut` shape means grad_of_outputs is empty (no gradient flows).
inline KernelCall backwardOf(const KernelRegistry &registry, KernelCall forward,
                             const std::vector<int64_t> &wrt, uint64_t seed, bool withGrad = true) {
  KernelCall backward(registry, forward.kernelName() + ".backward");
  backward.attributes() = forward.attributes();
  int64_t operands = static_cast<int64_t>(forward.inputsRef().size());
  for (OwnedTensor &t : forward.inputsRef())
    backward.input(t);
  if (withGrad)
    backward.input(runtime::testing::randomTensor(forward.result(0).shape, seed));
  backward.attr("grad_of_inputs", wrt)
      .attr("grad_of_outputs", withGrad ? std::vector<int64_t>{0} : std::vector<int64_t>{})
      .attr("backward_segments", std::vector<int64_t>{operands, 0, withGrad ? 1 : 0})
      .sequences(forward.seqLen(), forward.microBatch());
  for (int64_t i : wrt)
    backward.output(plan::F32, forward.inputsRef().at(static_cast<size_t>(i)).shape);
  return backward;
}

} // namespace moec::runtime::cuda::attention::testing

#endif // RUNTIME_KERNELS_CUDA_ATTENTION_COMPARETESTING_H_
