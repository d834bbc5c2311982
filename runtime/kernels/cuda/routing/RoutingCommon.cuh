//===- RoutingCommon.cuh - the CUDA routing kernels' shared pieces -*- CUDA -*-===//
//
// router, dispatch, expert_mlp and combine on the GPU: the twins of
// cpu/routing (same names, launches, checks and semantics). This header holds
// what the four files share:
//  - FloatIn / FloatOut: a float tensor read or written with its own storage
//    type (f32 or bf16, chosen per tensor at run time), arithmetic in f32.
//    One launch may mix them (f32 router weights next to bf16 activations,
//    f32 gradients of bf16 weights).
//  - DeviceBuffer: stream-ordered scratch (cudaMallocAsync / cudaFreeAsync on
//    the launch's stream, no synchronisation).
//  - the launch checks of checks/routing (operand groups, result gradients,
//    gradient outputs), accepting f32 or bf16 storage.
//  - expertMajorOrder: dispatch's expert-major row of every token copy, by a
//    stable radix sort on the device (identical to the CPU's counting sort).
//  - block reductions (deterministic: fixed shapes, no atomics).
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CUDA_ROUTING_ROUTINGCOMMON_CUH_
#define RUNTIME_KERNELS_CUDA_ROUTING_ROUTINGCOMMON_CUH_

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "runtime/kernels/checks/routing/RoutingChecks.h"
#include "runtime/kernels/cuda/CudaCommon.cuh"

namespace moec::runtime::cuda::routing {

//===--------------------------------------------------------------------===//
// Storage-typed access
//===--------------------------------------------------------------------===//

/// A float tensor to read: f32 or bf16 storage, values as f32.
struct FloatIn {
  const void *p = nullptr;
  bool bf16 = false;

  __host__ __device__ explicit operator bool() const { return p != nullptr; }
  __device__ __forceinline__ float operator[](int64_t i) const {
    return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i])
                : static_cast<const float *>(p)[i];
  }
};

/// Eight consecutive values of a float tensor, moved in 16-byte pieces (load8 / store8 at an
/// index that is a multiple of 8 of a 16-byte aligned tensor: see eightAtATime).
struct Floats8 {
  float v[8];
};

__device__ __forceinline__ Floats8 load8(const void *p, bool bf16, int64_t i) {
  Floats8 f;
  if (bf16) {
    uint4 raw = *reinterpret_cast<const uint4 *>(static_cast<const __nv_bfloat16 *>(p) + i);
    const auto *h = reinterpret_cast<const __nv_bfloat16 *>(&raw);
#pragma unroll
    for (int k = 0; k < 8; ++k)
      f.v[k] = __bfloat162float(h[k]);
  } else {
    const auto *q = reinterpret_cast<const float4 *>(static_cast<const float *>(p) + i);
    float4 a = q[0], b = q[1];
    f.v[0] = a.x, f.v[1] = a.y, f.v[2] = a.z, f.v[3] = a.w;
    f.v[4] = b.x, f.v[5] = b.y, f.v[6] = b.z, f.v[7] = b.w;
  }
  return f;
}

__device__ __forceinline__ void store8(void *p, bool bf16, int64_t i, const Floats8 &f) {
  if (bf16) {
    uint4 raw;
    auto *h = reinterpret_cast<__nv_bfloat16 *>(&raw);
#pragma unroll
    for (int k = 0; k < 8; ++k)
      h[k] = __float2bfloat16(f.v[k]);
    *reinterpret_cast<uint4 *>(static_cast<__nv_bfloat16 *>(p) + i) = raw;
  } else {
    auto *q = reinterpret_cast<float4 *>(static_cast<float *>(p) + i);
    q[0] = make_float4(f.v[0], f.v[1], f.v[2], f.v[3]);
    q[1] = make_float4(f.v[4], f.v[5], f.v[6], f.v[7]);
  }
}

/// Whether rows of `features` values at these tensors can move eight at a time (every row starts
/// on a 16-byte boundary).
inline bool eightAtATime(int64_t features, std::initializer_list<const void *> tensors) {
  if (features % 8 != 0)
    return false;
  for (const void *t : tensors)
    if (t && reinterpret_cast<uintptr_t>(t) % 16 != 0)
      return false;
  return true;
}

/// A float tensor to write (and read back): f32 or bf16 storage.
struct FloatOut {
  void *p = nullptr;
  bool bf16 = false;

  __host__ __device__ explicit operator bool() const { return p != nullptr; }
  __device__ __forceinline__ void store(int64_t i, float v) const {
    if (bf16)
      static_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16(v);
    else
      static_cast<float *>(p)[i] = v;
  }
  __device__ __forceinline__ float load(int64_t i) const {
    return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i])
                : static_cast<const float *>(p)[i];
  }
};

inline FloatIn floatIn(const void *p, plan::DType dtype) { return {p, dtype == plan::BF16}; }
inline FloatIn floatIn(const TensorRef &t) { return floatIn(t.data, t.dtype); }
inline FloatIn floatIn(const TensorRef *t) { return t ? floatIn(*t) : FloatIn{}; }
inline FloatOut floatOut(void *p, plan::DType dtype) { return {p, dtype == plan::BF16}; }
inline FloatOut floatOut(const TensorRef &t) { return floatOut(t.data, t.dtype); }

/// An index tensor (I32 or I64) to read.
struct IndexIn {
  const void *p = nullptr;
  bool i64 = false;
  __device__ __forceinline__ int64_t operator[](int64_t i) const {
    return i64 ? static_cast<const int64_t *>(p)[i] : static_cast<const int32_t *>(p)[i];
  }
};

/// Bytes per element of a float or index dtype.
int64_t elementSize(plan::DType dtype);

/// `p` advanced by `elements` elements of `dtype`.
inline const void *advance(const void *p, plan::DType dtype, int64_t elements) {
  return static_cast<const char *>(p) + elements * elementSize(dtype);
}
inline void *advance(void *p, plan::DType dtype, int64_t elements) {
  return static_cast<char *>(p) + elements * elementSize(dtype);
}

//===--------------------------------------------------------------------===//
// Scratch
//===--------------------------------------------------------------------===//

/// Device scratch, allocated and freed in stream order on the launch's stream.
class DeviceBuffer {
public:
  DeviceBuffer() = default;
  DeviceBuffer(const KernelContext &ctx, size_t bytes);
  DeviceBuffer(const KernelContext &ctx, plan::DType dtype, int64_t elements)
      : DeviceBuffer(ctx, static_cast<size_t>(elements * elementSize(dtype))) {}
  DeviceBuffer(DeviceBuffer &&other) noexcept { *this = std::move(other); }
  DeviceBuffer &operator=(DeviceBuffer &&other) noexcept;
  DeviceBuffer(const DeviceBuffer &) = delete;
  DeviceBuffer &operator=(const DeviceBuffer &) = delete;
  ~DeviceBuffer() { release(); }

  void *get() const { return ptr; }
  template <typename T> T *as() const { return static_cast<T *>(ptr); }

private:
  void release();
  void *ptr = nullptr;
  cudaStream_t stream = nullptr;
};

/// The data of `t` in storage type `dtype`: `t` itself when it has that
/// dtype, else a converted copy kept in `holder`.
const void *asDtype(const KernelContext &ctx, const TensorRef &t, plan::DType dtype,
                    DeviceBuffer &holder);

/// Converts n floats from one storage type to another (f32 / bf16) on the stream.
void convertFloats(const KernelContext &ctx, const void *src, plan::DType srcType, void *dst,
                   plan::DType dstType, int64_t n);

/// Where GEMMs writing the float output `out` put their results: the output
/// itself when its dtype is F32 or the operands' `abType` (cuBLAS' C types),
/// else a zeroed F32 scratch that finish() converts into the output.
class GemmTarget {
public:
  GemmTarget() = default;
  GemmTarget(const KernelContext &ctx, const TensorRef *out, plan::DType abType);
  explicit operator bool() const { return out != nullptr; }
  void *data() const { return scratch.get() ? scratch.get() : out->data; }
  plan::DType dtype() const { return scratch.get() ? plan::F32 : out->dtype; }
  void *at(int64_t elements) const { return advance(data(), dtype(), elements); }
  void finish(const KernelContext &ctx) const;

private:
  const TensorRef *out = nullptr;
  DeviceBuffer scratch;
};

//===--------------------------------------------------------------------===//
// Launch checks (checks/routing, shared with cpu/routing)
//===--------------------------------------------------------------------===//

using checks::routing::expectIndices;
using checks::routing::OperandGroups;
using checks::routing::operandGroups;
using checks::routing::resultGrad;

/// The checked gradient outputs (f32 or bf16, the operand's size), zeroed on
/// the stream; per forward operand, its gradient output or null.
std::vector<const TensorRef *>
gradOutputs(const KernelContext &ctx, int64_t numOperands,
            const std::vector<std::pair<int64_t, const char *>> &noGrad);

/// Fails unless `t` is an F32 or BF16 tensor.
void expectFloat(const KernelContext &ctx, const TensorRef &t, const char *what);

inline IndexIn indexIn(const TensorRef &t) { return {t.data, t.dtype == plan::I64}; }

//===--------------------------------------------------------------------===//
// Expert-major order
//===--------------------------------------------------------------------===//

/// For each copy c = (t, j) of `indices` [T, k] (I32/I64 on the device), its
/// row in dispatch's expert-major order: grouped by expert in increasing
/// expert order, within an expert in (token, slot) order. `rows` [T*k] gets
/// that row; `perm` [T*k] (if given) the copy at each row. With `counts`
/// (I64 [numExperts]) also the rows per expert. Index values are not checked
/// (that would need a synchronisation): indices outside [0, numExperts) are
/// not counted and sort after every valid one.
void expertMajorOrder(const KernelContext &ctx, const TensorRef &indices, int32_t *rows,
                      int32_t *perm, int64_t *counts = nullptr, int64_t numExperts = 0);

//===--------------------------------------------------------------------===//
// Block reductions (blockDim.x a multiple of 32, at most 1024; every thread
// of the block must call them; all get the same result)
//===--------------------------------------------------------------------===//

template <typename T, typename Op> __device__ __forceinline__ T warpReduce(T v, Op op) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v = op(v, __shfl_down_sync(0xffffffffu, v, offset));
  return v;
}

/// Lane 0 of each warp reduces its warp; then every thread combines the warp
/// results in warp order (deterministic, identical in every thread).
template <typename T, typename Op> __device__ T blockReduce(T v, Op op, T *shared32) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warpReduce(v, op);
  __syncthreads(); // shared32 may still be read by a previous reduction
  if (lane == 0)
    shared32[warp] = v;
  __syncthreads();
  T r = shared32[0];
  for (int w = 1; w < warps; ++w)
    r = op(r, shared32[w]);
  return r;
}

struct SumOp {
  template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

/// A candidate expert for top-k: larger value first, ties to the lower
/// index; index < 0 is "none".
struct Candidate {
  float value;
  int index;
};

__device__ __forceinline__ bool better(const Candidate &a, const Candidate &b) {
  if (a.index < 0)
    return false;
  if (b.index < 0)
    return true;
  return a.value > b.value || (a.value == b.value && a.index < b.index);
}

__device__ __forceinline__ Candidate bestOf(const Candidate &a, const Candidate &b) {
  return better(b, a) ? b : a;
}

/// The best candidate of the block (see blockReduce).
__device__ inline Candidate blockBest(Candidate c, Candidate *shared32) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  for (int offset = 16; offset > 0; offset >>= 1) {
    Candidate o;
    o.value = __shfl_down_sync(0xffffffffu, c.value, offset);
    o.index = __shfl_down_sync(0xffffffffu, c.index, offset);
    c = bestOf(c, o);
  }
  __syncthreads();
  if (lane == 0)
    shared32[warp] = c;
  __syncthreads();
  Candidate r = shared32[0];
  for (int w = 1; w < warps; ++w)
    r = bestOf(r, shared32[w]);
  return r;
}

/// Largest expert `e` with offsets[e] <= row (offsets [E + 1], nondecreasing):
/// the expert whose rows hold `row` (empty experts are skipped).
__device__ __forceinline__ int64_t expertOfRow(const int64_t *offsets, int64_t experts, int64_t row) {
  int64_t lo = 0, hi = experts - 1;
  while (lo < hi) {
    int64_t mid = (lo + hi + 1) / 2;
    if (offsets[mid] <= row)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

/// Threads per block of the row-wise kernels.
constexpr int kThreads = 256;

} // namespace moec::runtime::cuda::routing

#endif // RUNTIME_KERNELS_CUDA_ROUTING_ROUTINGCOMMON_CUH_
