//===- FlashEmulation.h - Flash.cu's kernels on the CPU, for a test -*- C++ -*-===//
//
// With MOEC_FLASH_EMULATION defined, Flash.cu compiles as plain C++ (g++) and
// its kernels run here: every thread of a block is a coroutine (started with
// ucontext, then switched with __builtin_setjmp / __builtin_longjmp, which
// unlike swapcontext make no system call: ~8x faster), switched at each
// barrier, so __syncthreads and the warp-collective instructions (ldmatrix,
// mma.sync, shuffles) keep their CUDA semantics:
//   ldmatrix x4 (.trans): lane l addresses row l % 8 of matrix l / 8 and
//     receives (row l / 4, columns 2(l % 4), +1) of each matrix (.trans: rows
//     2(l % 4), +1 of column l / 4), low half first;
//   mma m16n8k16 (row.col, bf16 -> f32): the PTX ISA's fragment layouts;
//   cp.async: copied when issued (Eager) or only at the wait that covers
//     its group (Lazy), so a missing wait or an early overwrite shows.
// Each collective also checks that all 32 lanes reach the same one (the
// kernels' branches around them must be warp-uniform), and a barrier that
// never completes aborts. flash_emulation_test runs this on small shapes in
// CI; the GPU tests check the real thing.
//
// Included by Flash.cu first (before any CUDA header of the kernels), never
// by the CUDA build.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CUDA_ATTENTION_FLASHEMULATION_H_
#define RUNTIME_KERNELS_CUDA_ATTENTION_FLASHEMULATION_H_

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

namespace moec::runtime::cuda::attention::emulation {

struct Dim3 {
  unsigned x = 0, y = 0, z = 0;
};

enum class CopyMode { Eager, Lazy };

constexpr int kMaxWarps = 32;
constexpr size_t kSharedBytes = 227 * 1024;

[[noreturn]] inline void die(const char *what) {
  std::fprintf(stderr, "flash emulation: %s\n", what);
  std::abort();
}

/// Which collective a lane is in (all 32 must agree).
enum Collective { None, LdMatrix, LdMatrixT, Mma, Shuffle };

struct Warp {
  int arrived = 0;
  uint64_t generation = 0;
  Collective kind[32] = {};
  uint32_t address[32] = {};
  uint32_t a[32][4] = {}, b[32][2] = {};
  float c[32][4] = {}, value[32] = {};
  int laneMask = 0;
  uint32_t outWords[32][4] = {};
  float outFloats[32][4] = {};
};

struct Copy {
  void *dst;
  const void *src;
  bool valid;
};

struct Thread {
  ucontext_t context; // the first entry
  void *resume[5];    // where a started thread continues (__builtin_setjmp)
  bool started = false, done = false;
  std::vector<Copy> open;
  std::deque<std::vector<Copy>> groups;
};

struct State {
  Dim3 threadIdx, blockIdx, gridDim, blockDim;
  CopyMode mode = CopyMode::Eager;
  std::vector<Thread> threads;
  std::vector<std::unique_ptr<char[]>> stacks; // one per thread, kept across blocks
  int current = 0;
  void *scheduler[5]; // where launch() continues when a thread yields (__builtin_setjmp)
  std::function<void()> body;
  int blockArrived = 0;
  uint64_t blockGeneration = 0, progress = 0;
  Warp warps[kMaxWarps];
  std::unique_ptr<unsigned char[]> shared{new unsigned char[kSharedBytes + 16]};
  unsigned char *sharedBase() {
    return shared.get() + (16 - reinterpret_cast<uintptr_t>(shared.get()) % 16) % 16;
  }
};

inline State &state() {
  static State s;
  return s;
}

/// Continues at a __builtin_setjmp buffer (never in the function that set it).
[[noreturn]] __attribute__((noinline)) inline void jumpTo(void **buffer) { __builtin_longjmp(buffer, 1); }

/// The current thread waits; launch() runs the next one.
__attribute__((noinline)) inline void yield() {
  State &s = state();
  if (__builtin_setjmp(s.threads[s.current].resume) == 0)
    jumpTo(s.scheduler);
}

/// launch(): runs thread t until it yields or ends.
__attribute__((noinline)) inline void runThread(State &s, int t) {
  Thread &th = s.threads[static_cast<size_t>(t)];
  if (__builtin_setjmp(s.scheduler) == 0) {
    if (!th.started) {
      th.started = true;
      setcontext(&th.context);
    }
    jumpTo(th.resume);
  }
}

inline void syncBlock() {
  State &s = state();
  const uint64_t generation = s.blockGeneration;
  ++s.progress;
  if (++s.blockArrived == static_cast<int>(s.threads.size())) {
    s.blockArrived = 0;
    ++s.blockGeneration;
    return;
  }
  while (s.blockGeneration == generation)
    yield();
}

/// Waits for the warp's 32 lanes; the last to arrive runs `compute` (on the slots) for all.
template <typename F> void syncWarp(Collective kind, F &&compute) {
  State &s = state();
  const int lane = s.current % 32;
  Warp &w = s.warps[s.current / 32];
  w.kind[lane] = kind;
  const uint64_t generation = w.generation;
  ++s.progress;
  if (++w.arrived == 32) {
    for (int i = 0; i < 32; ++i)
      if (w.kind[i] != kind)
        die("lanes of a warp reached different collectives (divergent branch)");
    compute(w);
    w.arrived = 0;
    ++w.generation;
    return;
  }
  while (w.generation == generation)
    yield();
}

inline Warp &myWarp() { return state().warps[state().current / 32]; }
inline int myLane() { return state().current % 32; }

//===----------------------------------------------------------------------===//
// Stand-ins for Flash.cu's PTX wrappers
//===----------------------------------------------------------------------===//

inline uint32_t sharedAddress(const void *p) {
  const auto *bytes = static_cast<const unsigned char *>(p);
  unsigned char *base = state().sharedBase();
  if (bytes < base || bytes >= base + kSharedBytes)
    die("shared address outside the block's shared memory");
  return static_cast<uint32_t>(bytes - base);
}

inline void performCopy(const Copy &c) {
  if (c.valid)
    std::memcpy(c.dst, c.src, 16);
  else
    std::memset(c.dst, 0, 16);
}

inline void cpAsync16(void *dst, const void *src, bool valid) {
  sharedAddress(dst); // checks the destination
  if (reinterpret_cast<uintptr_t>(dst) % 16 || (valid && reinterpret_cast<uintptr_t>(src) % 16))
    die("cp.async with a misaligned address");
  State &s = state();
  if (s.mode == CopyMode::Eager)
    performCopy({dst, src, valid});
  else
    s.threads[s.current].open.push_back({dst, src, valid});
}
inline void cpAsyncCommit() {
  Thread &t = state().threads[state().current];
  t.groups.push_back(std::move(t.open));
  t.open.clear();
}
template <int N> void cpAsyncWait() {
  Thread &t = state().threads[state().current];
  while (static_cast<int>(t.groups.size()) > N) {
    for (const Copy &c : t.groups.front())
      performCopy(c);
    t.groups.pop_front();
  }
}

inline uint16_t sharedHalf(uint32_t address) {
  if (address + 2 > kSharedBytes)
    die("ldmatrix past the shared memory");
  uint16_t v;
  std::memcpy(&v, state().sharedBase() + address, 2);
  return v;
}

inline void ldmatrix4Any(uint32_t (&r)[4], uint32_t address, bool trans) {
  if (address % 16)
    die("ldmatrix row address not 16-byte aligned");
  Warp &w = myWarp();
  const int lane = myLane();
  w.address[lane] = address;
  syncWarp(trans ? LdMatrixT : LdMatrix, [trans](Warp &w) {
    for (int i = 0; i < 32; ++i)
      for (int j = 0; j < 4; ++j) {
        uint16_t lo, hi;
        if (!trans) {
          const uint32_t row = w.address[8 * j + i / 4];
          lo = sharedHalf(row + 4 * (i % 4));
          hi = sharedHalf(row + 4 * (i % 4) + 2);
        } else {
          lo = sharedHalf(w.address[8 * j + 2 * (i % 4)] + 2 * (i / 4));
          hi = sharedHalf(w.address[8 * j + 2 * (i % 4) + 1] + 2 * (i / 4));
        }
        w.outWords[i][j] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
      }
  });
  for (int j = 0; j < 4; ++j)
    r[j] = w.outWords[lane][j];
}
inline void ldmatrix4(uint32_t (&r)[4], uint32_t address) { ldmatrix4Any(r, address, false); }
inline void ldmatrix4T(uint32_t (&r)[4], uint32_t address) { ldmatrix4Any(r, address, true); }

inline float bf16Bits(uint32_t word, int half) {
  const uint32_t bits = (half ? word >> 16 : word & 0xffffu) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  Warp &w = myWarp();
  const int lane = myLane();
  for (int j = 0; j < 4; ++j) {
    w.a[lane][j] = a[j];
    w.c[lane][j] = c[j];
  }
  w.b[lane][0] = b0;
  w.b[lane][1] = b1;
  syncWarp(Mma, [](Warp &w) {
    double A[16][16], B[16][8], C[16][8];
    for (int i = 0; i < 32; ++i) {
      const int g = i / 4, k = 2 * (i % 4);
      for (int h = 0; h < 2; ++h) {
        A[g][k + h] = bf16Bits(w.a[i][0], h);
        A[g + 8][k + h] = bf16Bits(w.a[i][1], h);
        A[g][k + 8 + h] = bf16Bits(w.a[i][2], h);
        A[g + 8][k + 8 + h] = bf16Bits(w.a[i][3], h);
        B[k + h][g] = bf16Bits(w.b[i][0], h);
        B[k + 8 + h][g] = bf16Bits(w.b[i][1], h);
        C[g][k + h] = w.c[i][h];
        C[g + 8][k + h] = w.c[i][2 + h];
      }
    }
    for (int i = 0; i < 32; ++i) {
      const int g = i / 4, k = 2 * (i % 4);
      for (int e = 0; e < 4; ++e) {
        const int row = g + (e >> 1) * 8, col = k + (e & 1);
        double sum = C[row][col];
        for (int kk = 0; kk < 16; ++kk)
          sum += A[row][kk] * B[kk][col];
        w.outFloats[i][e] = static_cast<float>(sum);
      }
    }
  });
  for (int e = 0; e < 4; ++e)
    c[e] = w.outFloats[lane][e];
}

inline uint32_t packBf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t word;
  std::memcpy(&word, &v, 4);
  return word;
}

inline float exp2Approx(float x) { return std::exp2(x); }

//===----------------------------------------------------------------------===//
// Launches
//===----------------------------------------------------------------------===//

inline void threadEntry() {
  State &s = state();
  s.body();
  s.threads[s.current].done = true;
  ++s.progress;
  jumpTo(s.scheduler);
}

/// Runs body() as every thread of every block of `grid`, one block at a time.
inline void launch(dim3 grid, int threads, size_t sharedBytes, std::function<void()> body) {
  State &s = state();
  if (threads % 32 || threads / 32 > kMaxWarps)
    die("bad block size");
  if (sharedBytes > kSharedBytes)
    die("more shared memory than a block can have");
  s.body = std::move(body);
  s.gridDim = Dim3{grid.x, grid.y, grid.z};
  s.blockDim = Dim3{static_cast<unsigned>(threads), 1, 1};
  constexpr size_t kStack = 512 * 1024;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        s.blockIdx = Dim3{x, y, z};
        s.threads.clear();
        s.threads.resize(static_cast<size_t>(threads));
        s.blockArrived = 0;
        for (Warp &w : s.warps)
          w.arrived = 0;
        // Fresh shared memory each block, filled with NaN-ish garbage.
        std::memset(s.sharedBase(), 0xff, kSharedBytes);
        while (s.stacks.size() < s.threads.size())
          s.stacks.emplace_back(new char[kStack]);
        for (int t = 0; t < threads; ++t) {
          Thread &th = s.threads[static_cast<size_t>(t)];
          getcontext(&th.context);
          th.context.uc_stack.ss_sp = s.stacks[static_cast<size_t>(t)].get();
          th.context.uc_stack.ss_size = kStack;
          th.context.uc_link = nullptr;
          makecontext(&th.context, threadEntry, 0);
        }
        for (;;) {
          bool any = false;
          const uint64_t before = s.progress;
          for (int t = 0; t < threads; ++t) {
            if (s.threads[static_cast<size_t>(t)].done)
              continue;
            any = true;
            s.current = t;
            s.threadIdx = Dim3{static_cast<unsigned>(t), 0, 0};
            runThread(s, t);
          }
          if (!any)
            break;
          if (s.progress == before)
            die("deadlock: threads wait at barriers that never complete");
        }
        for (const Thread &th : s.threads)
          if (!th.open.empty() || !th.groups.empty()) {
            // Copies never waited for: harmless on the GPU only if nobody reads them.
            for (const std::vector<Copy> &g : th.groups)
              for (const Copy &c : g)
                performCopy(c);
          }
      }
  s.threads.clear();
}

} // namespace moec::runtime::cuda::attention::emulation

//===----------------------------------------------------------------------===//
// CUDA built-ins the kernels (and the headers they include) use
//===----------------------------------------------------------------------===//

#define __launch_bounds__(...)
#define threadIdx (::moec::runtime::cuda::attention::emulation::state().threadIdx)
#define blockIdx (::moec::runtime::cuda::attention::emulation::state().blockIdx)
#define gridDim (::moec::runtime::cuda::attention::emulation::state().gridDim)

inline void __syncthreads() { ::moec::runtime::cuda::attention::emulation::syncBlock(); }

inline float __shfl_xor_sync(unsigned, float v, int laneMask, int = 32) {
  using namespace ::moec::runtime::cuda::attention::emulation;
  Warp &w = myWarp();
  const int lane = myLane();
  w.value[lane] = v;
  w.laneMask = laneMask; // the same in every lane
  syncWarp(Shuffle, [](Warp &w) {
    for (int i = 0; i < 32; ++i)
      w.outFloats[i][0] = w.value[i ^ w.laneMask];
  });
  return w.outFloats[lane][0];
}

// The host side's CUDA calls (Common.cuh, CudaCommon.cuh) succeed; Scratch and
// maxSharedBytes are defined by the test.
#define cudaFuncSetAttribute(...) cudaSuccess
#define cudaGetLastError() cudaSuccess

// Common.cuh's RoPE helpers (unused here) name these device intrinsics.
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }

using std::max;
using std::min;

#endif // RUNTIME_KERNELS_CUDA_ATTENTION_FLASHEMULATION_H_
