//===- DeviceProbe.cu - GPU count and a vector-add kernel -----------------===//

#include "runtime/backends/cuda/DeviceProbe.h"

#include <cuda_runtime.h>

#include <string>
#include <vector>

namespace moec::runtime::cuda {
namespace {

constexpr int kNumElements = 1024;

__global__ void addVectors(const float *a, const float *b, float *sum, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    sum[i] = a[i] + b[i];
}

std::string describe(cudaError_t err) {
  return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
}

/// Freed on every exit path, so an early error return leaks no device memory.
struct DeviceBuffers {
  float *a = nullptr, *b = nullptr, *sum = nullptr;
  ~DeviceBuffers() {
    cudaFree(a);
    cudaFree(b);
    cudaFree(sum);
  }
};

ProbeResult fail(int deviceCount, const char *step, cudaError_t err) {
  return {ProbeOutcome::CudaError, deviceCount,
          std::string(step) + " failed: " + describe(err)};
}

} // namespace

ProbeResult probeDevices() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  // No driver (CI, dev machines) or a driver without devices: report, do not
  // fail. cudaErrorStubLibrary means only the toolkit's libcuda stub was found,
  // which is the same situation.
  if (err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice ||
      err == cudaErrorStubLibrary) {
    // Clear it, so later CUDA calls in this process start clean.
    cudaGetLastError();
    return {ProbeOutcome::NoGpu, 0, "no GPU available: " + describe(err)};
  }
  if (err != cudaSuccess)
    return fail(0, "cudaGetDeviceCount", err);
  if (count == 0)
    return {ProbeOutcome::NoGpu, 0, "no GPU available: 0 CUDA devices"};

  cudaDeviceProp prop;
  if ((err = cudaGetDeviceProperties(&prop, 0)) != cudaSuccess)
    return fail(count, "cudaGetDeviceProperties", err);

  // Small integers: float sums are exact, so the check can use ==.
  std::vector<float> a(kNumElements), b(kNumElements), sum(kNumElements);
  for (int i = 0; i < kNumElements; ++i) {
    a[i] = static_cast<float>(i);
    b[i] = static_cast<float>(2 * i + 1);
  }

  const size_t bytes = kNumElements * sizeof(float);
  DeviceBuffers dev;
  if ((err = cudaMalloc(&dev.a, bytes)) != cudaSuccess ||
      (err = cudaMalloc(&dev.b, bytes)) != cudaSuccess ||
      (err = cudaMalloc(&dev.sum, bytes)) != cudaSuccess)
    return fail(count, "cudaMalloc", err);
  if ((err = cudaMemcpy(dev.a, a.data(), bytes, cudaMemcpyHostToDevice)) !=
          cudaSuccess ||
      (err = cudaMemcpy(dev.b, b.data(), bytes, cudaMemcpyHostToDevice)) !=
          cudaSuccess)
    return fail(count, "cudaMemcpy to device", err);

  constexpr int kThreads = 256;
  addVectors<<<(kNumElements + kThreads - 1) / kThreads, kThreads>>>(
      dev.a, dev.b, dev.sum, kNumElements);
  // A bad launch (e.g. no sm_90 code for this GPU) is reported here.
  if ((err = cudaGetLastError()) != cudaSuccess)
    return fail(count, "kernel launch", err);
  if ((err = cudaDeviceSynchronize()) != cudaSuccess)
    return fail(count, "kernel execution", err);
  if ((err = cudaMemcpy(sum.data(), dev.sum, bytes, cudaMemcpyDeviceToHost)) !=
      cudaSuccess)
    return fail(count, "cudaMemcpy to host", err);

  std::string where =
      std::to_string(count) + " GPU(s), device 0: " + prop.name + " (sm_" +
      std::to_string(prop.major) + std::to_string(prop.minor) + ")";
  for (int i = 0; i < kNumElements; ++i) {
    if (sum[i] != a[i] + b[i])
      return {ProbeOutcome::KernelWrong, count,
              where + ": wrong sum at index " + std::to_string(i) + ": got " +
                  std::to_string(sum[i]) + ", want " +
                  std::to_string(a[i] + b[i])};
  }
  return {ProbeOutcome::KernelOk, count, where + ": vector-add kernel ok"};
}

} // namespace moec::runtime::cuda
