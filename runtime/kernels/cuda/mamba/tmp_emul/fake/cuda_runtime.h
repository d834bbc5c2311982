// A host emulation of the CUDA pieces the mamba kernels use: every CUDA thread of a block is a
// fiber (ucontext); __syncthreads and warp shuffles are barriers the scheduler releases; a
// barrier that cannot be released (divergence) aborts.
#pragma once
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>
#include <string>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static

struct EmuIdx { unsigned x = 0, y = 0, z = 0; };
inline EmuIdx threadIdx, blockIdx, blockDim, gridDim;

struct EmuStream {};
using cudaStream_t = EmuStream *;
enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2 };
enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2 };
enum cudaDeviceAttr { cudaDevAttrMaxSharedMemoryPerBlockOptin = 97 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

namespace emu {
/// Electric-fence allocation: the buffer ends (or, with EMU_FRONT set, starts) at a PROT_NONE page.
inline std::map<void *, std::pair<void *, size_t>> mappings;
inline void *fenceAlloc(size_t bytes) {
  size_t page = 4096, rounded = (bytes + page - 1) / page * page;
  size_t total = rounded + 2 * page;
  char *base = static_cast<char *>(mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  mprotect(base, page, PROT_NONE);
  mprotect(base + page + rounded, page, PROT_NONE);
  char *p = std::getenv("EMU_FRONT") ? base + page : base + page + rounded - bytes;
  mappings[p] = {base, total};
  return p;
}
inline void fenceFree(void *p) {
  if (!p)
    return;
  auto it = mappings.find(p);
  if (it == mappings.end()) {
    std::fprintf(stderr, "EMULATION ERROR: free of an unknown pointer\n");
    std::abort();
  }
  munmap(it->second.first, it->second.second);
  mappings.erase(it);
}
inline cudaError_t lastError = cudaSuccess;
inline std::map<const void *, int> sharedLimit;
inline void *dynamicBuffer = nullptr;
inline void *dynamicShared() { return dynamicBuffer; }
inline long launches = 0, allocations = 0, frees = 0;

enum State { Runnable, WaitBlock, WaitWarp, Done };
constexpr size_t kStack = 128 * 1024;
inline bool direct = false; // barrier-free kernel: threads run one after another, no fibers
inline ucontext_t scheduler;
inline std::vector<ucontext_t> contexts;
inline std::vector<char *> stacks;
inline std::vector<State> states;
inline std::vector<double> slots;
inline unsigned current = 0;
inline const std::function<void()> *body = nullptr;

inline void trampoline() {
  (*body)();
  states[current] = Done;
}
inline void fail(const char *what);
inline void yieldAs(State s) {
  if (direct)
    fail("barrier or shuffle in a kernel run without fibers");
  states[current] = s;
  swapcontext(&contexts[current], &scheduler);
}
inline void fail(const char *what) {
  std::fprintf(stderr, "EMULATION ERROR: %s (block %u)\n", what, blockIdx.x);
  std::abort();
}
inline void runBlock(unsigned threads) {
  contexts.resize(threads);
  while (stacks.size() < threads)
    stacks.push_back(static_cast<char *>(std::malloc(kStack)));
  states.assign(threads, Runnable);
  slots.assign(threads, NAN);
  for (unsigned t = 0; t < threads; ++t) {
    getcontext(&contexts[t]);
    contexts[t].uc_stack.ss_sp = stacks[t];
    contexts[t].uc_stack.ss_size = kStack;
    contexts[t].uc_link = &scheduler;
    makecontext(&contexts[t], trampoline, 0);
  }
  while (true) {
    for (unsigned t = 0; t < threads; ++t)
      if (states[t] == Runnable) {
        current = t;
        threadIdx.x = t;
        swapcontext(&scheduler, &contexts[t]);
      }
    unsigned done = 0, waitBlock = 0;
    for (State s : states) {
      done += s == Done;
      waitBlock += s == WaitBlock;
    }
    if (done == threads)
      return;
    bool released = false;
    for (unsigned w = 0; w * 32 < threads; ++w) {
      unsigned end = std::min(threads, w * 32 + 32), waiting = 0;
      for (unsigned t = w * 32; t < end; ++t)
        waiting += states[t] == WaitWarp;
      if (waiting == end - w * 32) {
        for (unsigned t = w * 32; t < end; ++t)
          states[t] = Runnable;
        released = true;
      } else if (waiting > 0) {
        // Some lanes wait at a shuffle, others elsewhere: only fine if they wait there too later.
      }
    }
    if (released)
      continue;
    if (waitBlock == threads) {
      for (State &s : states)
        s = Runnable;
      continue;
    }
    if (waitBlock > 0 && done > 0)
      fail("__syncthreads with exited threads");
    fail("deadlock: a warp shuffle or barrier that not every thread reaches");
  }
}
template <typename T> T shflXor(T v, int offset) {
  unsigned partner = current ^ static_cast<unsigned>(offset);
  if (partner >= blockDim.x || (partner >> 5) != (current >> 5))
    fail("shuffle partner outside the warp");
  slots[current] = static_cast<double>(v);
  yieldAs(WaitWarp);
  T r = static_cast<T>(slots[partner]);
  yieldAs(WaitWarp);
  return r;
}
inline bool barrierFree(const void *kernel);
template <typename F>
void launch(const void *kernel, unsigned grid, unsigned block, size_t shared, cudaStream_t, F &&f) {
  ++launches;
  if (grid == 0 || block == 0 || block > 1024) {
    lastError = cudaErrorInvalidValue;
    return;
  }
  int limit = 48 * 1024;
  auto it = sharedLimit.find(kernel);
  if (it != sharedLimit.end())
    limit = it->second;
  if (shared > static_cast<size_t>(limit)) {
    std::fprintf(stderr, "EMULATION: launch with %zu bytes of shared memory over the limit %d\n", shared, limit);
    lastError = cudaErrorInvalidValue;
    return;
  }
  std::function<void()> fn = f;
  body = &fn;
  gridDim.x = grid;
  blockDim.x = block;
  for (unsigned b = 0; b < grid; ++b) {
    blockIdx.x = b;
    dynamicBuffer = shared ? fenceAlloc(shared) : nullptr;
    if (shared)
      std::memset(dynamicBuffer, 0xff, shared); // NaN: unwritten shared memory shows
    if (barrierFree(kernel)) {
      direct = true;
      for (unsigned t = 0; t < block; ++t) {
        current = t;
        threadIdx.x = t;
        fn();
      }
      direct = false;
    } else {
      runBlock(block);
    }
    fenceFree(dynamicBuffer);
    dynamicBuffer = nullptr;
  }
}
} // namespace emu

inline void __syncthreads() { emu::yieldAs(emu::WaitBlock); }
template <typename T> T __shfl_xor_sync(unsigned mask, T v, int offset) {
  if (mask != 0xffffffffu)
    emu::fail("partial shuffle mask");
  return emu::shflXor(v, offset);
}
inline float __fmaf_rn(float a, float b, float c) { return std::fmaf(a, b, c); }
inline float __fmul_rn(float a, float b) { return a * b; }

inline const char *cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "emulated error"; }
inline const char *cudaGetErrorName(cudaError_t e) { return cudaGetErrorString(e); }
inline cudaError_t cudaGetLastError() {
  cudaError_t e = emu::lastError;
  emu::lastError = cudaSuccess;
  return e;
}
inline cudaError_t cudaGetDeviceCount(int *count) {
  *count = 1;
  return cudaSuccess;
}
inline cudaError_t cudaGetDevice(int *device) {
  *device = 0;
  return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr, int) {
  *value = 232448;
  return cudaSuccess;
}
inline cudaError_t cudaFuncSetAttribute(const void *func, cudaFuncAttribute, int value) {
  emu::sharedLimit[func] = value;
  return cudaSuccess;
}
inline cudaError_t cudaMalloc(void **p, size_t bytes) {
  *p = emu::fenceAlloc(bytes);
  return cudaSuccess;
}
inline cudaError_t cudaFree(void *p) {
  emu::fenceFree(p);
  return cudaSuccess;
}
inline cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t) {
  ++emu::allocations;
  *p = emu::fenceAlloc(bytes);
  std::memset(*p, 0xff, bytes); // NaN: scratch read before written shows
  return cudaSuccess;
}
inline cudaError_t cudaFreeAsync(void *p, cudaStream_t) {
  ++emu::frees;
  emu::fenceFree(p);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind) {
  std::memcpy(dst, src, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaMemset(void *p, int value, size_t bytes) {
  std::memset(p, value, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaStreamCreate(cudaStream_t *s) {
  *s = new EmuStream;
  return cudaSuccess;
}
inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete s;
  return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaGetLastError(); }
