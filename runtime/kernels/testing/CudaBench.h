//===- CudaBench.h - what the kernel micro-benchmarks share -----*- C++ -*-===//
//
// The `*_bench` binaries next to the CUDA kernels (docs/adding_a_kernel.md,
// step 5) time kernels on a real model's shapes on the GPU machine. They
// share: failing loudly on a CUDA error, the median of event-timed runs after
// a warm-up, a memory pool that keeps its memory (as the executor's does),
// bf16 conversion, and random device data.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_TESTING_CUDABENCH_H_
#define RUNTIME_KERNELS_TESTING_CUDABENCH_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>

namespace moec::runtime::bench {

/// Exits the benchmark with `what` and CUDA's message unless `error` is cudaSuccess.
void check(cudaError_t error, const char *what);

/// Whether a GPU is there; prints "<name>: no GPU available, nothing to time" when not.
bool gpuAvailable(const char *name);

/// Stream-ordered scratch stays in the pool between launches, as in the CUDA device.
void keepPoolMemory();

/// Median milliseconds of `iters` runs of `fn` on `stream` (CUDA events), after `warmup` runs.
double medianMs(cudaStream_t stream, int warmup, int iters, const std::function<void()> &fn);

/// bf16 (round to nearest even) and back.
uint16_t toBf16(float value);
float fromBf16(uint16_t bits);

/// `n` device bf16 values uniform in [offset - scale, offset + scale) from `seed`; cudaFree it.
void *randomBf16(size_t n, uint64_t seed, float scale, float offset = 0.0f);

} // namespace moec::runtime::bench

#endif // RUNTIME_KERNELS_TESTING_CUDABENCH_H_
