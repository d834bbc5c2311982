//===- CoreCompare.cpp - helpers for the core CUDA kernel tests -----------===//

#include "runtime/kernels/cuda/core/CoreCompare.h"

#include "runtime/kernels/cuda/CudaKernels.h"

namespace moec::runtime::cuda::core::testing {

const KernelRegistry &cudaRegistry() {
  static const KernelRegistry kernels = [] {
    KernelRegistry r;
    registerCoreKernels(r);
    return r;
  }();
  return kernels;
}

void expectMatchesCpuIn(plan::DType storage, const std::function<KernelCall()> &make,
                        const std::string &what, CudaCompareOptions options) {
  options.storage = storage;
  KernelCall call = make();
  CudaComparison r = compareCudaWithCpu(cudaRegistry(), call, options);
  if (r.skipped)
    GTEST_SKIP() << r.why;
  EXPECT_TRUE(r.ok) << what << " with " << (storage == plan::BF16 ? "bf16" : "f32")
                    << " storage:\n"
                    << r.report;
}

void expectMatchesCpu(const std::function<KernelCall()> &make, const std::string &what,
                      CudaCompareOptions options) {
  expectMatchesCpuIn(plan::F32, make, what, options);
  expectMatchesCpuIn(plan::BF16, make, what, options);
}

std::string cudaFailureOf(KernelCall &call) {
  const KernelFn *fn = cudaRegistry().find(call.kernelName());
  if (!fn)
    return "the CUDA backend has no kernel '" + call.kernelName() + "'";
  KernelContext ctx;
  ctx.kernel = call.kernelName();
  for (OwnedTensor &t : call.inputsRef())
    ctx.inputs.push_back(t.ref());
  for (size_t i = 0; i < call.numOutputs(); ++i)
    ctx.outputs.push_back(call.result(i).ref());
  ctx.attrs = &call.attributes();
  ctx.seqLen = call.seqLen() > 0 ? call.seqLen()
                                 : (call.inputsRef().empty() || call.inputsRef()[0].shape.empty()
                                        ? 1
                                        : call.inputsRef()[0].shape[0]);
  ctx.microBatch = call.seqLen() > 0 ? call.microBatch() : 1;
  try {
    (*fn)(ctx);
  } catch (const KernelError &e) {
    return e.what();
  }
  return "";
}

} // namespace moec::runtime::cuda::core::testing
