//===- CoreCommon.cuh - helpers shared by the core CUDA kernels -*- CUDA -*-===//
//
// The launch checks shared with cpu/core (checks/core) without the f32-only
// restriction, float tensors as (pointer, storage type) pairs so that every
// float tensor of a launch may be F32 or BF16 on its own (a bf16 gradient
// accumulated into an f32 buffer, an f32 router weight gating a bf16
// activation), deterministic block reductions, stream-ordered scratch
// memory, a deterministic column sum over rows and a GEMM over operands of
// any mix of the two storage types.
//
// Every kernel computes in f32; reductions use a fixed tree for a fixed
// launch shape, so results do not depend on scheduling.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CUDA_CORE_CORECOMMON_CUH_
#define RUNTIME_KERNELS_CUDA_CORE_CORECOMMON_CUH_

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/kernels/checks/core/CoreChecks.h"
#include "runtime/kernels/cuda/CudaCommon.cuh"

namespace moec::runtime::cuda::core {

//===----------------------------------------------------------------------===//
// Float tensors of either storage type
//===----------------------------------------------------------------------===//

/// A float tensor read on the device: f32 or bf16 storage, values as f32.
struct FloatIn {
  const void *p = nullptr;
  bool bf16 = false;

  __device__ __forceinline__ float operator[](int64_t i) const {
    return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i])
                : static_cast<const float *>(p)[i];
  }
};

/// A float tensor written (and, for accumulation, read) on the device.
struct FloatOut {
  void *p = nullptr;
  bool bf16 = false;

  __device__ __forceinline__ float get(int64_t i) const {
    return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i])
                : static_cast<const float *>(p)[i];
  }
  __device__ __forceinline__ void set(int64_t i, float v) const {
    if (bf16)
      static_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16(v); // round to nearest even
    else
      static_cast<float *>(p)[i] = v;
  }
  __host__ __device__ operator FloatIn() const { return FloatIn{p, bf16}; }
};

/// Index tensors (i32 or i64) read on the device as int64.
struct IndexIn {
  const void *p = nullptr;
  bool i64 = false;

  __device__ __forceinline__ int64_t operator[](int64_t i) const {
    return i64 ? static_cast<const int64_t *>(p)[i]
               : static_cast<int64_t>(static_cast<const int32_t *>(p)[i]);
  }
};

/// `t` as a float input, or a failure naming `what` unless it is f32 or bf16.
FloatIn floatIn(const KernelContext &ctx, const TensorRef &t, const std::string &what);
FloatOut floatOut(const KernelContext &ctx, const TensorRef &t, const std::string &what);
/// `t` as indices, or a failure unless it is i32 or i64.
IndexIn indexIn(const KernelContext &ctx, const TensorRef &t, const std::string &what);

//===----------------------------------------------------------------------===//
// Launch checks (the CPU kernels' messages)
//===----------------------------------------------------------------------===//

/// Fails unless `t` holds F32 or BF16 values.
void expectFloats(const KernelContext &ctx, const TensorRef &t, const std::string &what);

// The launch checks shared with the CPU kernels (../../checks/core).
using checks::core::expectIndices;
using checks::core::expectRowsShape;
using checks::core::expectSameShape;
using checks::core::rowsOf;
using checks::core::shapeText;
using checks::core::RowSumOfSquaresShape;
using checks::core::ShardedRmsNormShape;

/// The inputs and outputs of a `.backward` launch (see Kernel.h), checked as
/// the CPU kernels check them, with every gradient f32 or bf16.
class BackwardLaunch : public checks::core::BackwardLaunch {
public:
  BackwardLaunch(const KernelContext &ctx, size_t numResults,
                 const std::vector<int64_t> &differentiable)
      : checks::core::BackwardLaunch(ctx, numResults, differentiable, expectFloats) {}
};

//===----------------------------------------------------------------------===//
// Launch helpers
//===----------------------------------------------------------------------===//

constexpr int kThreads = 256; // the default block size of the elementwise kernels

/// Blocks for a grid-stride loop over n elements (at least 1; n = 0 launches nothing).
inline unsigned gridFor(int64_t n, int threads = kThreads) {
  int64_t blocks = (n + threads - 1) / threads;
  const int64_t cap = int64_t(1) << 20; // grid-stride loops cover the rest
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > cap ? cap : blocks));
}

/// Threads for one block per row of n features: a multiple of 32 in [32, maxThreads].
inline int rowThreads(int64_t n, int maxThreads = 256) {
  int64_t t = (n + 31) / 32 * 32;
  return static_cast<int>(t < 32 ? 32 : (t > maxThreads ? maxThreads : t));
}

/// n as a grid dimension of one block per row (fails past 2^31 - 1 rows).
inline unsigned blockCount(const KernelContext &ctx, int64_t n) {
  if (n > 0x7fffffff)
    ctx.fail(std::to_string(n) + " rows are too many for one launch");
  return static_cast<unsigned>(n);
}

/// Stream-ordered scratch memory of one launch: cudaMallocAsync on the
/// launch's stream, cudaFreeAsync there when the launch returns (or fails).
class Workspace {
public:
  explicit Workspace(const KernelContext &ctx) : ctx(ctx) {}
  ~Workspace();
  Workspace(const Workspace &) = delete;
  Workspace &operator=(const Workspace &) = delete;

  void *bytes(size_t n);
  template <typename T> T *alloc(int64_t n) {
    return static_cast<T *>(bytes(static_cast<size_t>(n < 1 ? 1 : n) * sizeof(T)));
  }

private:
  const KernelContext &ctx;
  std::vector<void *> blocks;
};

/// Writes `value` to the n elements of `out`.
void fillFloats(const KernelContext &ctx, FloatOut out, int64_t n, float value);

/// A float matrix operand of gemmAny: device pointer, storage type, element count.
struct Matrix {
  const void *p;
  plan::DType dtype;
  int64_t elements;
};

/// C[m,n] (row-major, ldc = n) = alpha op(A) op(B) + beta C through cuda::gemm for
/// any F32/BF16 mix. When A and B differ the product keeps f32 precision, as PEFT
/// computes an f32 adapter on bf16 data (TF32 there moved kimi_linear's bf16 LoRA
/// gradients past 2e-2 on 60 of 132 tensors): the f32 operand, when it is the
/// smaller, is split into three bf16 planes (hi + mid + lo: its value to the last
/// bits) stacked side by side, one tensor-core product gives the three parts (the
/// bf16 operand read once) and a kernel sums them into C; else the bf16 one is
/// widened to f32 in scratch. An f32 x f32 product with a small k (an f32 adapter's,
/// LoRA rank k) runs as one bf16 tensor-core product of both operands' planes
/// stacked along k (six plane pairs, about f32 precision), into C's type directly;
/// with a larger k, an f32 product (into a bf16 C through an f32 copy).
void gemmAny(const KernelContext &ctx, Workspace &ws, bool transA, bool transB, int64_t m,
             int64_t n, int64_t k, float alpha, Matrix a, int64_t lda, Matrix b, int64_t ldb,
             float beta, void *c, plan::DType cType);

//===----------------------------------------------------------------------===//
// Device reductions
//===----------------------------------------------------------------------===//

struct SumOp {
  template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

/// Reduces one value per thread over the block (blockDim.x a multiple of 32,
/// at most 1024) in a fixed order; every thread gets the result. `shared`
/// holds 32 values; the call synchronises the block, so every thread must make it.
template <typename T, typename Op>
__device__ __forceinline__ T blockReduce(T v, T *shared, Op op, T identity) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  __syncthreads(); // `shared` may still be read by a previous reduction
  if (lane == 0)
    shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : identity;
  for (int offset = 16; offset > 0; offset >>= 1)
    v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

template <typename T> __device__ __forceinline__ T blockSum(T v, T *shared) {
  return blockReduce(v, shared, SumOp{}, T(0));
}
__device__ __forceinline__ float blockMax(float v, float *shared) {
  return blockReduce(v, shared, MaxOp{}, -INFINITY);
}

//===----------------------------------------------------------------------===//
// Column sums over rows: out[j] = Σ_r value(r, j), deterministic
//===----------------------------------------------------------------------===//

constexpr int kColumnTile = 32, kColumnLanes = 8;

/// Pass 1: block (32, 8) per (column tile, chunk of rows); partial[chunk * cols + j].
/// Sums in double (cheap here: the pass is bound by reading `value`'s operands).
template <typename Value>
__global__ void columnPartials(Value value, int64_t rows, int64_t cols, int64_t rowsPerChunk,
                               double *partial) {
  __shared__ double sums[kColumnLanes][kColumnTile + 1];
  int64_t col = static_cast<int64_t>(blockIdx.x) * kColumnTile + threadIdx.x;
  int64_t begin = static_cast<int64_t>(blockIdx.y) * rowsPerChunk;
  int64_t end = min(rows, begin + rowsPerChunk);
  double sum = 0.0;
  if (col < cols)
    for (int64_t r = begin + threadIdx.y; r < end; r += kColumnLanes)
      sum += value(r, col);
  sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    double total = 0.0;
    for (int lane = 0; lane < kColumnLanes; ++lane)
      total += sums[lane][threadIdx.x];
    partial[static_cast<int64_t>(blockIdx.y) * cols + col] = total;
  }
}

/// Pass 2: out[j] = Σ_chunk partial[chunk * cols + j] in chunk order.
template <typename Out>
__global__ void columnFinish(const double *partial, int64_t chunks, int64_t cols, Out out) {
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < cols;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    double total = 0.0;
    for (int64_t c = 0; c < chunks; ++c)
      total += partial[c * cols + j];
    out.set(j, static_cast<float>(total));
  }
}

/// value(row, j) = dy[row * n + j]: bias gradients.
struct RowSum {
  FloatIn dy;
  int64_t n;
  __device__ float operator()(int64_t row, int64_t j) const { return dy[row * n + j]; }
};

/// Runs both passes on the launch's stream (rows = 0 writes zeros).
template <typename Value>
void columnSums(const KernelContext &ctx, Workspace &ws, Value value, int64_t rows, int64_t cols,
                FloatOut out, const char *what) {
  if (cols == 0)
    return;
  int64_t rowsPerChunk = 128;
  while ((rows + rowsPerChunk - 1) / rowsPerChunk > 4096)
    rowsPerChunk *= 2;
  int64_t chunks = (rows + rowsPerChunk - 1) / rowsPerChunk;
  double *partial = ws.alloc<double>(chunks * cols);
  if (chunks > 0) {
    dim3 grid(static_cast<unsigned>((cols + kColumnTile - 1) / kColumnTile),
              static_cast<unsigned>(chunks));
    columnPartials<<<grid, dim3(kColumnTile, kColumnLanes), 0, streamOf(ctx)>>>(
        value, rows, cols, rowsPerChunk, partial);
    checkLaunch(ctx, what);
  }
  columnFinish<<<gridFor(cols), kThreads, 0, streamOf(ctx)>>>(partial, chunks, cols, out);
  checkLaunch(ctx, what);
}

//===----------------------------------------------------------------------===//
// The causal-LM loss: targets, row statistics, mean (cross_entropy, lm_head_cross_entropy)
//===----------------------------------------------------------------------===//

/// The class row t is scored against: -1 when it does not count, -2 when its
/// label is neither ignore_index nor a class (the CPU refuses such a launch).
struct LossTargets {
  IndexIn labels;
  int64_t vocab, seqLen, ignore;
  bool shift;

  // transformers' ForCausalLMLoss pads each sequence's labels with
  // ignore_index and scores position t against labels[t + 1]: the shift
  // never crosses into the next sequence, its last position never counts.
  __device__ __forceinline__ int64_t operator()(int64_t t) const {
    if (shift && (t + 1) % seqLen == 0)
      return -1;
    int64_t label = labels[shift ? t + 1 : t];
    if (label == ignore)
      return -1;
    if (label < 0 || label >= vocab)
      return -2;
    return label;
  }
};

/// The targets of `labels` under the launch's ignore_index and shift_labels (whole
/// sequences already checked).
LossTargets lossTargets(const KernelContext &ctx, const TensorRef &labels, int64_t vocab);

/// max_v logits[base + v] and Σ_v exp(logits[base + v] - max) over one row, by one block;
/// every thread gets both.
__device__ __forceinline__ void rowSoftmaxStats(FloatIn logits, int64_t base, int64_t vocab,
                                                float *shared, float &top, float &sum) {
  float m = -INFINITY;
  for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x)
    m = fmaxf(m, logits[base + v]);
  top = blockMax(m, shared);
  float s = 0.0f;
  for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x)
    s += expf(logits[base + v] - top);
  sum = blockSum(s, shared);
}

/// loss = the mean of rowLoss over the counted rows (0 when none counts, NaN when a label
/// is bad), in a fixed order (Tokens.cu).
void meanLoss(const KernelContext &ctx, const LossTargets &targets, const float *rowLoss, int64_t rows,
              FloatOut loss);
/// *scale = dloss / counted rows (0 when none counts, NaN when a label is bad), on the device.
void lossGradScale(const KernelContext &ctx, const LossTargets &targets, int64_t rows, FloatIn dloss,
                   float *scale);

/// The registration functions of each file.
void registerNormKernels(KernelRegistry &registry);
void registerDenseKernels(KernelRegistry &registry);
void registerElementwiseKernels(KernelRegistry &registry);
void registerTokenKernels(KernelRegistry &registry);
/// lm_head_cross_entropy (LmHeadLoss.cu): the LM head fused with the loss (--moe-fuse).
void registerLmHeadLossKernels(KernelRegistry &registry);
/// fill_random (Random.cu): random weights, as on the CPU (runtime/kernels/RandomFill.h).
void registerRandomKernels(KernelRegistry &registry);
/// sum_squares and adamw (Optimizer.cu): the trainer's optimizer step.
void registerOptimizerKernels(KernelRegistry &registry);

} // namespace moec::runtime::cuda::core

#endif // RUNTIME_KERNELS_CUDA_CORE_CORECOMMON_CUH_
