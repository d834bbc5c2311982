//===- Common.cuh - shared pieces of the CUDA attention kernels --*- CUDA -*-===//
//
// Host side: the launch checks of checks/attention/Launch.h with f32-or-bf16
// storage, RoPE constants from checks/attention/Rope.h, stream-ordered
// scratch buffers and dynamic shared memory.
// Device side: tensors whose storage type (f32 / bf16, i32 / i64) is a
// run-time flag (a warp-uniform branch per load), warp reductions and the
// RoPE rotation with the CPU's exact f32 rounding (no FMA contraction).
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CUDA_ATTENTION_COMMON_CUH_
#define RUNTIME_KERNELS_CUDA_ATTENTION_COMMON_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/kernels/Kernel.h"
#include "runtime/kernels/checks/attention/Launch.h"
#include "runtime/kernels/checks/attention/Rope.h"
#include "runtime/kernels/cuda/CudaCommon.cuh"

namespace moec::runtime::cuda::attention {

//===----------------------------------------------------------------------===//
// Device views of tensors
//===----------------------------------------------------------------------===//

/// A float tensor on the device: f32 or bf16 storage, read and written as f32.
struct FloatIn {
  const void *p = nullptr;
  int bf16 = 0;
};
struct FloatOut {
  void *p = nullptr;
  int bf16 = 0;
};
/// An index tensor: i32 or i64.
struct IndexIn {
  const void *p = nullptr;
  int wide = 0;
};
struct IndexOut {
  void *p = nullptr;
  int wide = 0;
};

/// Element (row, head, col) of a row-major strided view is at p[row*ld + head*hs + col].
struct Mat {
  FloatIn t;
  int64_t ld = 0, hs = 0;
};
struct OutMat {
  FloatOut t;
  int64_t ld = 0, hs = 0;
};

__device__ __forceinline__ float ld(FloatIn a, int64_t i) {
  return a.bf16 ? __bfloat162float(static_cast<const __nv_bfloat16 *>(a.p)[i])
                : static_cast<const float *>(a.p)[i];
}
__device__ __forceinline__ void st(FloatOut a, int64_t i, float v) {
  if (a.bf16)
    static_cast<__nv_bfloat16 *>(a.p)[i] = __float2bfloat16(v);
  else
    static_cast<float *>(a.p)[i] = v;
}
__device__ __forceinline__ float ld(const Mat &m, int64_t row, int64_t head, int64_t col) {
  return ld(m.t, row * m.ld + head * m.hs + col);
}
__device__ __forceinline__ void st(const OutMat &m, int64_t row, int64_t head, int64_t col,
                                   float v) {
  st(m.t, row * m.ld + head * m.hs + col, v);
}
__device__ __forceinline__ int64_t ldIndex(IndexIn a, int64_t i) {
  return a.wide ? static_cast<const int64_t *>(a.p)[i]
                : static_cast<int64_t>(static_cast<const int32_t *>(a.p)[i]);
}
__device__ __forceinline__ void stIndex(IndexOut a, int64_t i, int64_t v) {
  if (a.wide)
    static_cast<int64_t *>(a.p)[i] = v;
  else
    static_cast<int32_t *>(a.p)[i] = static_cast<int32_t>(v);
}

constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float warpSum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1)
    v += __shfl_xor_sync(kFullMask, v, off);
  return v;
}
__device__ __forceinline__ float warpMax(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1)
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, off));
  return v;
}

//===----------------------------------------------------------------------===//
// RoPE
//===----------------------------------------------------------------------===//

using checks::attention::attentionFactor;
using checks::attention::inverseFrequencies;
using checks::attention::readRope;
using checks::attention::RopeSpec;
using checks::attention::YarnParams;

constexpr int kMaxRopeHalf = 256; // rope.dim <= 512

/// What a kernel needs to form cos/sin: passed by value (kernel parameter).
struct RopeConsts {
  int half = 0;
  int interleaved = 0;
  float factor = 1;
  float inv[kMaxRopeHalf];
};

/// Fails unless spec.dim fits; fills the inverse frequencies and the factor.
RopeConsts ropeConsts(const KernelContext &ctx, const RopeSpec &spec);

/// cos/sin of frequency i at `position`, rounded as RopeTable does: the f32
/// angle, cos/sin in double rounded to f32, times the f32 attention factor.
__device__ __forceinline__ void ropeCosSin(const RopeConsts &r, int i, float position, float &c,
                                           float &s) {
  float angle = __fmul_rn(r.inv[i], position);
  double sd, cd;
  sincos(static_cast<double>(angle), &sd, &cd);
  c = __fmul_rn(static_cast<float>(cd), r.factor);
  s = __fmul_rn(static_cast<float>(sd), r.factor);
}

/// Feature e (< 2*half) of the transposed rotation of dy (RopeTable::rotateBack).
__device__ __forceinline__ float ropeRotateBack(const float *dy, int e, int half, int interleaved,
                                                const float *cs, const float *sn) {
  int i;
  bool first; // da (the a slot) or db
  if (interleaved) {
    i = e / 2;
    first = (e % 2) == 0;
  } else {
    i = e < half ? e : e - half;
    first = e < half;
  }
  float g0 = dy[i], g1 = dy[i + half];
  if (first)
    return __fadd_rn(__fmul_rn(g0, cs[i]), __fmul_rn(g1, sn[i]));
  return __fsub_rn(__fmul_rn(g1, cs[i]), __fmul_rn(g0, sn[i]));
}

//===----------------------------------------------------------------------===//
// Host launch checks (checks/attention/Launch.h with f32-or-bf16 storage)
//===----------------------------------------------------------------------===//

/// Fails unless `t` is an f32 or bf16 tensor of these dims (-1 = any).
FloatIn floatIn(const KernelContext &ctx, const TensorRef &t, const char *what,
                std::vector<int64_t> dims);
FloatOut floatOut(const KernelContext &ctx, const TensorRef &t, const char *what,
                  std::vector<int64_t> dims);
/// Fails unless `t` is an i32/i64 tensor of exactly these dims.
IndexIn indexIn(const KernelContext &ctx, const TensorRef &t, const char *what,
                std::vector<int64_t> dims);
IndexOut indexOut(const KernelContext &ctx, const TensorRef &t, const char *what,
                  std::vector<int64_t> dims);
using checks::attention::backwardOperands;
using checks::attention::nonNegativeAttr;
using checks::attention::positiveAttr;
using checks::attention::Sequences;
using checks::attention::sequencesOf;

/// As the CPU's checkBackward: checks grad_of_inputs and the outputs (f32 or
/// bf16, shaped like their operands), zeroes every output on the stream and
/// returns the result gradient, or a null view when grad_of_outputs is empty.
FloatIn checkBackward(const KernelContext &ctx, size_t numOperands,
                      const std::vector<int64_t> &differentiable, int64_t rows, int64_t cols);
/// An attention's logsumexp result (or its saved copy): fails unless f32 [tokens, heads].
FloatOut f32Statistics(const KernelContext &ctx, const TensorRef &t, int64_t tokens, int64_t heads);
/// The gradient output of forward operand `operand`; p is null when not asked for.
FloatOut gradFor(const KernelContext &ctx, int64_t operand);

/// A view shifted by `elements` elements.
inline FloatIn offsetBy(FloatIn t, int64_t elements) {
  t.p = static_cast<const char *>(t.p) + elements * (t.bf16 ? 2 : 4);
  return t;
}
inline FloatOut offsetBy(FloatOut t, int64_t elements) {
  if (t.p)
    t.p = static_cast<char *>(t.p) + elements * (t.bf16 ? 2 : 4);
  return t;
}
inline FloatIn f32In(const float *p) { return FloatIn{p, 0}; }
inline FloatOut f32Out(float *p) { return FloatOut{p, 0}; }

//===----------------------------------------------------------------------===//
// Scratch memory and launches
//===----------------------------------------------------------------------===//

/// Stream-ordered device buffers (cudaMallocAsync), freed on the stream
/// (cudaFreeAsync) when the scratch goes out of scope.
class Scratch {
public:
  explicit Scratch(const KernelContext &ctx) : ctx(ctx), stream(streamOf(ctx)) {}
  ~Scratch();
  Scratch(const Scratch &) = delete;
  Scratch &operator=(const Scratch &) = delete;

  void *bytes(size_t n);
  float *floats(int64_t n) { return static_cast<float *>(bytes(static_cast<size_t>(n) * 4)); }
  int32_t *ints(int64_t n) { return static_cast<int32_t *>(bytes(static_cast<size_t>(n) * 4)); }

private:
  const KernelContext &ctx;
  cudaStream_t stream;
  std::vector<void *> buffers;
};

/// The largest dynamic shared memory a block may opt into on this device.
size_t maxSharedBytes(const KernelContext &ctx);

/// Lets `kernel` use `bytes` of dynamic shared memory (opting in above 48 KiB);
/// fails the launch when the device has less.
template <typename Kernel>
void allowSharedMemory(const KernelContext &ctx, Kernel kernel, size_t bytes, const char *what) {
  if (bytes > maxSharedBytes(ctx))
    ctx.fail(std::string(what) + " needs " + std::to_string(bytes) +
             " bytes of shared memory per block; the device allows " +
             std::to_string(maxSharedBytes(ctx)) + " (head dimensions too large)");
  if (bytes > 48 * 1024) {
    cudaError_t error = cudaFuncSetAttribute(reinterpret_cast<const void *>(kernel),
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(bytes));
    if (error != cudaSuccess)
      ctx.fail(std::string(what) + ": cannot opt into " + std::to_string(bytes) +
               " bytes of shared memory: " + cudaGetErrorString(error));
  }
}

/// Zeroes `elements` floats of `t` on the stream.
void zeroFill(const KernelContext &ctx, FloatOut t, int64_t elements);

} // namespace moec::runtime::cuda::attention

#endif // RUNTIME_KERNELS_CUDA_ATTENTION_COMMON_CUH_
