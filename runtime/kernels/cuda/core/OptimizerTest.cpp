//===- OptimizerTest.cpp - adamw and sum_squares on CUDA against the CPU --===//
//
// Both kernels work in place or into a caller's scratch, which the poisoning
// harness does not model: the same inputs go to the CPU and the CUDA kernel
// through explicit buffers, and every element is compared.

#include <cuda_runtime.h>

#include <cmath>

#include "runtime/kernels/cpu/CpuKernels.h"
#include "runtime/kernels/cuda/core/CoreCompare.h"

namespace moec::runtime::cuda::core::testing {
namespace {

const KernelRegistry &cpuRegistry() {
  static KernelRegistry registry = [] {
    KernelRegistry r;
    cpu::registerCoreKernels(r);
    return r;
  }();
  return registry;
}

/// Runs `kernel` with inputs/outputs given as host f32 vectors (outputs updated in place).
void run(const KernelRegistry &registry, bool onGpu, const std::string &kernel,
         const google::protobuf::Map<std::string, plan::Attr> &attrs, std::vector<std::vector<float>> &inputs,
         std::vector<std::vector<float>> &outputs, cudaStream_t stream) {
  KernelContext ctx;
  ctx.kernel = kernel;
  ctx.attrs = &attrs;
  ctx.seqLen = 1;
  ctx.microBatch = 1;
  ctx.stream = onGpu ? stream : nullptr;
  std::vector<void *> device;
  auto ref = [&](std::vector<float> &host) {
    void *p = host.data();
    if (onGpu) {
      cudaMalloc(&p, std::max<size_t>(host.size(), 1) * 4);
      cudaMemcpy(p, host.data(), host.size() * 4, cudaMemcpyHostToDevice);
      device.push_back(p);
    }
    return TensorRef{plan::F32, {static_cast<int64_t>(host.size())}, p};
  };
  for (auto &in : inputs)
    ctx.inputs.push_back(ref(in));
  for (auto &out : outputs)
    ctx.outputs.push_back(ref(out));
  const KernelFn *fn = registry.find(kernel);
  ASSERT_NE(fn, nullptr) << kernel;
  std::string error;
  try {
    (*fn)(ctx);
  } catch (const KernelError &e) {
    error = e.what();
  }
  EXPECT_EQ(error, "");
  if (!onGpu)
    return;
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  for (size_t i = 0; i < outputs.size(); ++i)
    cudaMemcpy(outputs[i].data(), ctx.outputs[i].data, outputs[i].size() * 4, cudaMemcpyDeviceToHost);
  for (void *p : device)
    cudaFree(p);
}

double relativeError(const std::vector<float> &got, const std::vector<float> &want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    norm += double(want[i]) * want[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-300));
}

TEST(CudaAdamW, MatchesCpuOverSteps) {
  SKIP_WITHOUT_GPU();
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  for (int64_t n : {1, 1000, 100003})
    for (double scale : {1.0, 0.37}) {
      std::vector<float> p = randomTensor({n}, 30).floats();
      std::vector<std::vector<float>> cpuOut = {p, std::vector<float>(n), std::vector<float>(n)};
      std::vector<std::vector<float>> gpuOut = cpuOut;
      for (int step = 0; step < 3; ++step) {
        std::vector<std::vector<float>> grad = {randomTensor({n}, 40 + step).floats()};
        google::protobuf::Map<std::string, plan::Attr> attrs;
        attrs["lr"].set_f(1e-3);
        attrs["step"].set_i(step);
        attrs["beta1"].set_f(0.9);
        attrs["beta2"].set_f(0.999);
        attrs["eps"].set_f(1e-8);
        attrs["weight_decay"].set_f(0.01);
        attrs["grad_scale"].set_f(scale);
        run(cpuRegistry(), false, "adamw", attrs, grad, cpuOut, stream);
        run(cudaRegistry(), true, "adamw", attrs, grad, gpuOut, stream);
      }
      const char *names[] = {"param", "adam_m", "adam_v"};
      for (int i = 0; i < 3; ++i)
        EXPECT_LE(relativeError(gpuOut[i], cpuOut[i]), 1e-6) << names[i] << " n=" << n << " scale=" << scale;
    }
  cudaStreamDestroy(stream);
}

TEST(CudaSumSquares, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  std::vector<std::vector<float>> inputs = {randomTensor({7}, 50).floats(), randomTensor({100000}, 51).floats(),
                                            std::vector<float>(0), randomTensor({4097}, 52).floats()};
  std::vector<std::vector<float>> cpuOut = {std::vector<float>(inputs.size(), -1.0f)}, gpuOut = cpuOut;
  google::protobuf::Map<std::string, plan::Attr> none;
  run(cpuRegistry(), false, "sum_squares", none, inputs, cpuOut, stream);
  run(cudaRegistry(), true, "sum_squares", none, inputs, gpuOut, stream);
  for (size_t i = 0; i < inputs.size(); ++i)
    EXPECT_NEAR(gpuOut[0][i], cpuOut[0][i], 1e-6 * std::abs(cpuOut[0][i])) << "input " << i;
  EXPECT_EQ(cpuOut[0][2], 0.0f);
  cudaStreamDestroy(stream);
}

} // namespace
} // namespace moec::runtime::cuda::core::testing
