//===- CudaBench.cpp - what the kernel micro-benchmarks share -------------===//

#include "runtime/kernels/testing/CudaBench.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

namespace moec::runtime::bench {

void check(cudaError_t error, const char *what) {
  if (error != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(error));
    std::exit(1);
  }
}

bool gpuAvailable(const char *name) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0)
    return true;
  std::printf("%s: no GPU available, nothing to time\n", name);
  return false;
}

void keepPoolMemory() {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  cudaMemPool_t pool;
  check(cudaDeviceGetDefaultMemPool(&pool, device), "cudaDeviceGetDefaultMemPool");
  uint64_t keep = UINT64_MAX;
  check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), "cudaMemPoolSetAttribute");
}

double medianMs(cudaStream_t stream, int warmup, int iters, const std::function<void()> &fn) {
  for (int i = 0; i < warmup; ++i)
    fn();
  check(cudaStreamSynchronize(stream), "warm-up");
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<float> ms;
  for (int i = 0; i < iters; ++i) {
    check(cudaEventRecord(start, stream), "cudaEventRecord");
    fn();
    check(cudaEventRecord(stop, stream), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "timed run");
    float t = 0;
    check(cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime");
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms.empty() ? 0.0 : ms[ms.size() / 2];
}

uint16_t toBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

float fromBf16(uint16_t bits) {
  uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, 4);
  return value;
}

void *randomBf16(size_t n, uint64_t seed, float scale, float offset) {
  // One random block repeated: fast to make at the sizes of real models.
  const size_t block = size_t{1} << 22;
  std::vector<uint16_t> host(std::max<size_t>(std::min(n, block), 1));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(offset - scale, offset + scale);
  for (uint16_t &h : host)
    h = toBf16(uniform(rng));
  void *device = nullptr;
  check(cudaMalloc(&device, std::max<size_t>(n, 1) * 2), "cudaMalloc");
  for (size_t at = 0; at < n; at += host.size())
    check(cudaMemcpy(static_cast<char *>(device) + at * 2, host.data(), std::min(host.size(), n - at) * 2,
                     cudaMemcpyHostToDevice),
          "cudaMemcpy");
  return device;
}

} // namespace moec::runtime::bench
