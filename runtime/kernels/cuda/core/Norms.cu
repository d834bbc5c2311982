//===- Norms.cu - rms_norm (whole or sharded) and layer_norm, and backward ==//
//
// One thread block per normalised group (rms_norm; a warp per group for groups of
// at most 256 features) or row (layer_norm); statistics reduced in f32 in a fixed order. x̂ is rounded to
// f32 before the weight multiplies it, as on the CPU. Weight and bias
// gradients are column sums over the rows (columnSums: two passes, no atomics).
//
//===----------------------------------------------------------------------===//

#include "runtime/kernels/cuda/core/CoreCommon.cuh"

#include <cstdint>
#include <initializer_list>

namespace moec::runtime::cuda::core {

namespace {

//===----------------------------------------------------------------------===//
// rms_norm
//===----------------------------------------------------------------------===//

/// x [..., F] normalised in groups of G = weight size contiguous features.
struct RmsNormArgs {
  FloatIn x, w;
  int64_t groupSize, groups;
  float eps;
  bool unitOffset;

  RmsNormArgs(const KernelContext &ctx) {
    const TensorRef &input = ctx.in(0), &weight = ctx.in(1);
    x = floatIn(ctx, input, "input");
    w = floatIn(ctx, weight, "weight");
    ctx.expectShape(weight, "weight", {-1});
    groupSize = weight.dim(0);
    rowsOf(ctx, input, "input"); // rank >= 1
    int64_t features = input.dim(-1);
    if (groupSize <= 0 || features % groupSize != 0)
      ctx.fail("weight size " + std::to_string(groupSize) + " does not divide the input's " +
               std::to_string(features) + " features");
    groups = input.numel() / groupSize;
    eps = static_cast<float>(ctx.attrFloat("eps"));
    unitOffset = ctx.attrBool("unit_offset");
  }
};

__device__ __forceinline__ float normScale(FloatIn w, int64_t j, bool unitOffset) {
  return unitOffset ? 1.0f + w[j] : w[j];
}

/// 1 / sqrt(mean(x²) + eps) of the group starting at `base`; every thread gets it.
__device__ __forceinline__ float inverseRms(FloatIn x, int64_t base, int64_t n, float eps,
                                            float *shared) {
  float squares = 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    float v = x[base + j];
    squares += v * v;
  }
  squares = blockSum(squares, shared);
  return 1.0f / sqrtf(squares / static_cast<float>(n) + eps);
}

/// Grid: one block per group.
__global__ void rmsNormKernel(FloatIn x, FloatIn w, FloatOut y, int64_t n, float eps,
                              bool unitOffset) {
  __shared__ float shared[32];
  int64_t base = static_cast<int64_t>(blockIdx.x) * n;
  float r = inverseRms(x, base, n, eps, shared);
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    y.set(base + j, normScale(w, j, unitOffset) * (x[base + j] * r));
}

/// dx = r (g - x̂ mean(g x̂)) with g = dy * scale; stores r per group for dw.
/// Grid: one block per group. dx.p or rinv may be null (not asked).
__global__ void rmsNormBackwardKernel(FloatIn x, FloatIn w, FloatIn dy, FloatOut dx, float *rinv,
                                      int64_t n, float eps, bool unitOffset) {
  __shared__ float shared[32];
  int64_t g = blockIdx.x, base = g * n;
  float r = inverseRms(x, base, n, eps, shared);
  if (rinv && threadIdx.x == 0)
    rinv[g] = r;
  if (!dx.p)
    return; // uniform over the block
  float dot = 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    dot += dy[base + j] * normScale(w, j, unitOffset) * (x[base + j] * r);
  dot = blockSum(dot, shared);
  float mean = dot / static_cast<float>(n);
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    float xhat = x[base + j] * r;
    dx.set(base + j, r * (dy[base + j] * normScale(w, j, unitOffset) - xhat * mean));
  }
}

// Small groups (per-head q/k norms: 128 features, hundreds of thousands of groups) get a warp
// each, eight groups a block: a block per group left most of its threads idle and paid two block
// synchronisations per 128 elements.
constexpr int64_t kWarpGroupLimit = 256;
constexpr int kGroupsPerBlock = 8;

__device__ __forceinline__ float warpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

/// inverseRms for a warp's group: every lane gets it.
__device__ __forceinline__ float warpInverseRms(FloatIn x, int64_t base, int64_t n, float eps) {
  float squares = 0.0f;
  for (int64_t j = threadIdx.x % 32; j < n; j += 32) {
    float v = x[base + j];
    squares += v * v;
  }
  return 1.0f / sqrtf(warpSum(squares) / static_cast<float>(n) + eps);
}

/// rmsNormKernel with a warp per group. Grid: ceil(groups / kGroupsPerBlock) blocks of
/// 32 kGroupsPerBlock threads.
__global__ void rmsNormWarpKernel(FloatIn x, FloatIn w, FloatOut y, int64_t groups, int64_t n, float eps,
                                  bool unitOffset) {
  int64_t g = static_cast<int64_t>(blockIdx.x) * kGroupsPerBlock + threadIdx.x / 32;
  if (g >= groups)
    return; // a whole warp: the shuffles below stay within live warps
  int lane = threadIdx.x % 32;
  int64_t base = g * n;
  float r = warpInverseRms(x, base, n, eps);
  for (int64_t j = lane; j < n; j += 32)
    y.set(base + j, normScale(w, j, unitOffset) * (x[base + j] * r));
}

/// rmsNormBackwardKernel with a warp per group (same grid as rmsNormWarpKernel).
__global__ void rmsNormBackwardWarpKernel(FloatIn x, FloatIn w, FloatIn dy, FloatOut dx, float *rinv,
                                          int64_t groups, int64_t n, float eps, bool unitOffset) {
  int64_t g = static_cast<int64_t>(blockIdx.x) * kGroupsPerBlock + threadIdx.x / 32;
  if (g >= groups)
    return;
  int lane = threadIdx.x % 32;
  int64_t base = g * n;
  float r = warpInverseRms(x, base, n, eps);
  if (rinv && lane == 0)
    rinv[g] = r;
  if (!dx.p)
    return;
  float dot = 0.0f;
  for (int64_t j = lane; j < n; j += 32)
    dot += dy[base + j] * normScale(w, j, unitOffset) * (x[base + j] * r);
  float mean = warpSum(dot) / static_cast<float>(n);
  for (int64_t j = lane; j < n; j += 32) {
    float xhat = x[base + j] * r;
    dx.set(base + j, r * (dy[base + j] * normScale(w, j, unitOffset) - xhat * mean));
  }
}

// bf16 activations with groups of a multiple of 8 features (up to 8192) take vectorised twins
// of the kernels above: each thread holds 8 features of its group in registers from one 16-byte
// load (per operand) and stores 8 results at once; groups up to 256 features get a power-of-two
// segment of a warp's lanes, larger ones a block of n / 8 threads (rounded up to whole warps).
// The scalar kernels' 2-byte accesses and second pass over x ran rms_norm at about a quarter of
// the memory bandwidth (P4, 16384 tokens: 0.11 ms a call forward, 0.20 ms backward).
constexpr int64_t kVectorGroupLimit = 8192;

struct Bf16x8 {
  float v[8];
};

__device__ __forceinline__ Bf16x8 loadBf16x8(const __nv_bfloat16 *p) {
  uint4 raw = *reinterpret_cast<const uint4 *>(p);
  const __nv_bfloat16 *h = reinterpret_cast<const __nv_bfloat16 *>(&raw);
  Bf16x8 f;
#pragma unroll
  for (int i = 0; i < 8; ++i)
    f.v[i] = __bfloat162float(h[i]);
  return f;
}

__device__ __forceinline__ void storeBf16x8(__nv_bfloat16 *p, const float (&v)[8]) {
  __align__(16) __nv_bfloat16 h[8];
#pragma unroll
  for (int i = 0; i < 8; ++i)
    h[i] = __float2bfloat16(v[i]);
  *reinterpret_cast<uint4 *>(p) = *reinterpret_cast<const uint4 *>(h);
}

/// The sum of v over the `lanes` (a power of two <= 32) aligned lanes of the caller's segment.
__device__ __forceinline__ float segmentSum(float v, int lanes) {
  for (int offset = lanes / 2; offset > 0; offset >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

/// Where a thread's 8 features are: group g (or -1 past the last), features j0..j0+7 (j0 >= n:
/// none), and how its sums are reduced (segment lanes; 0 = the whole block).
struct VectorSlot {
  int64_t g;
  int64_t j0;
  int lanes;
};

/// segment > 0: a warp holds 32 / segment groups of n <= 8 segment features; 0: a block per group.
__device__ __forceinline__ VectorSlot vectorSlot(int64_t groups, int segment) {
  if (segment == 0)
    return {static_cast<int64_t>(blockIdx.x), 8 * static_cast<int64_t>(threadIdx.x), 0};
  int64_t g = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / segment;
  return {g < groups ? g : -1, 8 * static_cast<int64_t>(threadIdx.x % segment), segment};
}

__device__ __forceinline__ float vectorSum(float v, const VectorSlot &slot, float *shared) {
  return slot.lanes ? segmentSum(v, slot.lanes) : blockSum(v, shared);
}

/// rmsNormKernel on bf16 x and y, 8 features a thread (see vectorSlot for the grid).
__global__ void rmsNormVectorKernel(const __nv_bfloat16 *x, FloatIn w, __nv_bfloat16 *y, int64_t groups,
                                    int64_t n, int segment, float eps, bool unitOffset) {
  __shared__ float shared[32];
  VectorSlot slot = vectorSlot(groups, segment);
  bool mine = slot.g >= 0 && slot.j0 < n; // whole warps stay in the shuffles either way
  Bf16x8 v{};
  if (mine)
    v = loadBf16x8(x + slot.g * n + slot.j0);
  float squares = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i)
    squares += v.v[i] * v.v[i];
  float r = 1.0f / sqrtf(vectorSum(squares, slot, shared) / static_cast<float>(n) + eps);
  if (!mine)
    return;
  float out[8];
#pragma unroll
  for (int i = 0; i < 8; ++i)
    out[i] = normScale(w, slot.j0 + i, unitOffset) * (v.v[i] * r);
  storeBf16x8(y + slot.g * n + slot.j0, out);
}

/// rmsNormBackwardKernel on bf16 x, dy and dx, 8 features a thread (rinv may be null).
__global__ void rmsNormBackwardVectorKernel(const __nv_bfloat16 *x, FloatIn w, const __nv_bfloat16 *dy,
                                            __nv_bfloat16 *dx, float *rinv, int64_t groups, int64_t n,
                                            int segment, float eps, bool unitOffset) {
  __shared__ float shared[32];
  VectorSlot slot = vectorSlot(groups, segment);
  bool mine = slot.g >= 0 && slot.j0 < n;
  Bf16x8 v{}, g{};
  float scale[8] = {};
  if (mine) {
    v = loadBf16x8(x + slot.g * n + slot.j0);
    g = loadBf16x8(dy + slot.g * n + slot.j0);
#pragma unroll
    for (int i = 0; i < 8; ++i)
      scale[i] = normScale(w, slot.j0 + i, unitOffset);
  }
  float squares = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i)
    squares += v.v[i] * v.v[i];
  float r = 1.0f / sqrtf(vectorSum(squares, slot, shared) / static_cast<float>(n) + eps);
  float dot = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i)
    dot += g.v[i] * scale[i] * (v.v[i] * r);
  float mean = vectorSum(dot, slot, shared) / static_cast<float>(n);
  if (!mine)
    return;
  if (rinv && slot.j0 == 0)
    rinv[slot.g] = r;
  float out[8];
#pragma unroll
  for (int i = 0; i < 8; ++i)
    out[i] = r * (g.v[i] * scale[i] - v.v[i] * r * mean);
  storeBf16x8(dx + slot.g * n + slot.j0, out);
}

/// The vectorised kernels' segment for groups of n features (0: a block per group), or -1
/// when they do not apply.
int vectorSegment(int64_t n, std::initializer_list<const void *> bf16Tensors) {
  for (const void *p : bf16Tensors)
    if (!p || reinterpret_cast<uintptr_t>(p) % 16 != 0)
      return -1;
  if (n % 8 != 0 || n > kVectorGroupLimit)
    return -1;
  if (n > kWarpGroupLimit)
    return 0;
  int lanes = 1;
  while (lanes < n / 8)
    lanes *= 2;
  return lanes;
}

/// Grid and block of the vectorised kernels.
void vectorLaunchShape(const KernelContext &ctx, int64_t groups, int64_t n, int segment, unsigned &grid,
                       int &threads) {
  if (segment == 0) {
    grid = blockCount(ctx, groups);
    threads = static_cast<int>((n / 8 + 31) / 32 * 32);
  } else {
    threads = 256;
    grid = blockCount(ctx, (groups * segment + threads - 1) / threads);
  }
}

unsigned warpGroupBlocks(const KernelContext &ctx, int64_t groups) {
  return blockCount(ctx, (groups + kGroupsPerBlock - 1) / kGroupsPerBlock);
}

/// dw[j] = Σ_g dy[g, j] x̂[g, j].
struct RmsWeightGrad {
  FloatIn x, dy;
  const float *rinv;
  int64_t n;
  __device__ float operator()(int64_t g, int64_t j) const {
    return dy[g * n + j] * (x[g * n + j] * rinv[g]);
  }
};

void rmsNorm(KernelContext &ctx) {
  RmsNormArgs a(ctx);
  const TensorRef &result = ctx.out(0);
  expectSameShape(ctx, result, "result", ctx.in(0), "input");
  FloatOut y = floatOut(ctx, result, "result");
  if (a.groups == 0)
    return;
  int segment = a.x.bf16 && y.bf16 ? vectorSegment(a.groupSize, {a.x.p, y.p}) : -1;
  if (segment >= 0) {
    unsigned grid;
    int threads;
    vectorLaunchShape(ctx, a.groups, a.groupSize, segment, grid, threads);
    rmsNormVectorKernel<<<grid, threads, 0, streamOf(ctx)>>>(
        static_cast<const __nv_bfloat16 *>(a.x.p), a.w, static_cast<__nv_bfloat16 *>(y.p), a.groups,
        a.groupSize, segment, a.eps, a.unitOffset);
  } else if (a.groupSize <= kWarpGroupLimit)
    rmsNormWarpKernel<<<warpGroupBlocks(ctx, a.groups), 32 * kGroupsPerBlock, 0, streamOf(ctx)>>>(
        a.x, a.w, y, a.groups, a.groupSize, a.eps, a.unitOffset);
  else
    rmsNormKernel<<<blockCount(ctx, a.groups), rowThreads(a.groupSize), 0, streamOf(ctx)>>>(
        a.x, a.w, y, a.groupSize, a.eps, a.unitOffset);
  checkLaunch(ctx, "rms_norm");
}

void rmsNormBackward(KernelContext &ctx) {
  BackwardLaunch launch(ctx, 1, {0, 1});
  RmsNormArgs a(ctx);
  FloatIn dy = floatIn(ctx, launch.resultGrad0(ctx.in(0).shape), "the result gradient");
  const TensorRef *dxRef = launch.operandGrad(0), *dwRef = launch.operandGrad(1);
  FloatOut dx = dxRef ? floatOut(ctx, *dxRef, "the input gradient") : FloatOut{};
  FloatOut dw = dwRef ? floatOut(ctx, *dwRef, "the weight gradient") : FloatOut{};
  if (!dxRef && !dwRef)
    return;
  Workspace ws(ctx);
  float *rinv = dwRef ? ws.alloc<float>(a.groups) : nullptr;
  int segment = a.x.bf16 && dy.bf16 && dx.bf16 ? vectorSegment(a.groupSize, {a.x.p, dy.p, dx.p}) : -1;
  if (a.groups > 0) {
    if (segment >= 0) {
      unsigned grid;
      int threads;
      vectorLaunchShape(ctx, a.groups, a.groupSize, segment, grid, threads);
      rmsNormBackwardVectorKernel<<<grid, threads, 0, streamOf(ctx)>>>(
          static_cast<const __nv_bfloat16 *>(a.x.p), a.w, static_cast<const __nv_bfloat16 *>(dy.p),
          static_cast<__nv_bfloat16 *>(dx.p), rinv, a.groups, a.groupSize, segment, a.eps, a.unitOffset);
    } else if (a.groupSize <= kWarpGroupLimit)
      rmsNormBackwardWarpKernel<<<warpGroupBlocks(ctx, a.groups), 32 * kGroupsPerBlock, 0, streamOf(ctx)>>>(
          a.x, a.w, dy, dx, rinv, a.groups, a.groupSize, a.eps, a.unitOffset);
    else
      rmsNormBackwardKernel<<<blockCount(ctx, a.groups), rowThreads(a.groupSize), 0,
                              streamOf(ctx)>>>(a.x, a.w, dy, dx, rinv, a.groupSize, a.eps,
                                               a.unitOffset);
    checkLaunch(ctx, "rms_norm.backward");
  }
  if (dwRef)
    columnSums(ctx, ws, RmsWeightGrad{a.x, dy, rinv, a.groupSize}, a.groups, a.groupSize, dw,
               "rms_norm.backward (weight)");
}

//===----------------------------------------------------------------------===//
// row_sum_of_squares and sharded_rms_norm (rows split over tp; see the CPU twin)
//===----------------------------------------------------------------------===//

/// out[t] = Σ_j x[t, j]². Grid: one block per row.
__global__ void rowSumOfSquaresKernel(FloatIn x, float *out, int64_t n) {
  __shared__ float shared[32];
  int64_t base = static_cast<int64_t>(blockIdx.x) * n;
  float squares = 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    float v = x[base + j];
    squares += v * v;
  }
  squares = blockSum(squares, shared);
  if (threadIdx.x == 0)
    out[blockIdx.x] = squares;
}

/// dx = 2 x dS of its row (grid-stride over rows x n elements).
__global__ void rowSumOfSquaresBackwardKernel(FloatIn x, const float *ds, FloatOut dx, int64_t total, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dx.set(i, 2.0f * x[i] * ds[i / n]);
}

__device__ __forceinline__ float shardedInverseRms(const float *ss, int64_t t, int64_t whole, float eps) {
  return 1.0f / sqrtf(ss[t] / static_cast<float>(whole) + eps);
}

/// y = s x r of its row (grid-stride).
__global__ void shardedRmsNormKernel(FloatIn x, FloatIn w, const float *ss, FloatOut y, int64_t total, int64_t n,
                                     int64_t whole, float eps, bool unitOffset) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float r = shardedInverseRms(ss, i / n, whole, eps);
    y.set(i, normScale(w, i % n, unitOffset) * (x[i] * r));
  }
}

/// dx = s dy r, dS = -r³ / (2N) Σ s dy x; r per row for dw. Grid: one block per row; dx.p,
/// ds and rinv may be null (not asked).
__global__ void shardedRmsNormBackwardKernel(FloatIn x, FloatIn w, const float *ss, FloatIn dy, FloatOut dx,
                                             float *ds, float *rinv, int64_t n, int64_t whole, float eps,
                                             bool unitOffset) {
  __shared__ float shared[32];
  int64_t t = blockIdx.x, base = t * n;
  float r = shardedInverseRms(ss, t, whole, eps);
  if (rinv && threadIdx.x == 0)
    rinv[t] = r;
  float dot = 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    float g = dy[base + j] * normScale(w, j, unitOffset);
    dot += g * x[base + j];
    if (dx.p)
      dx.set(base + j, g * r);
  }
  if (!ds)
    return; // uniform over the block
  dot = blockSum(dot, shared);
  if (threadIdx.x == 0)
    ds[t] = -0.5f * r * r * r / static_cast<float>(whole) * dot;
}

/// A row statistic's data (always f32: it sums a whole row).
float *rowStatistic(const KernelContext &ctx, const TensorRef &t, const std::string &what) {
  if (t.dtype != plan::F32)
    ctx.fail(what + " must be f32");
  return static_cast<float *>(t.data);
}

void rowSumOfSquares(KernelContext &ctx) {
  RowSumOfSquaresShape s = checks::core::checkRowSumOfSquares(ctx, ctx.in(0), ctx.out(0), "result");
  FloatIn x = floatIn(ctx, ctx.in(0), "input");
  if (s.rows == 0)
    return;
  rowSumOfSquaresKernel<<<blockCount(ctx, s.rows), rowThreads(s.features), 0, streamOf(ctx)>>>(
      x, static_cast<float *>(ctx.out(0).data), s.features);
  checkLaunch(ctx, "row_sum_of_squares");
}

void rowSumOfSquaresBackward(KernelContext &ctx) {
  BackwardLaunch launch(ctx, 1, {0});
  const TensorRef &input = ctx.in(0), &sumGrad = launch.resultGrad0({input.dim(0), 1});
  RowSumOfSquaresShape s = checks::core::checkRowSumOfSquares(ctx, input, sumGrad, "the result gradient");
  FloatIn x = floatIn(ctx, input, "input");
  const TensorRef *dxRef = launch.operandGrad(0);
  if (!dxRef || s.rows * s.features == 0)
    return;
  rowSumOfSquaresBackwardKernel<<<gridFor(s.rows * s.features), kThreads, 0, streamOf(ctx)>>>(
      x, static_cast<const float *>(sumGrad.data), floatOut(ctx, *dxRef, "the input gradient"), s.rows * s.features,
      s.features);
  checkLaunch(ctx, "row_sum_of_squares.backward");
}

void shardedRmsNorm(KernelContext &ctx) {
  ShardedRmsNormShape s = checks::core::checkShardedRmsNorm(ctx);
  expectSameShape(ctx, ctx.out(0), "result", ctx.in(0), "input");
  FloatIn x = floatIn(ctx, ctx.in(0), "input"), w = floatIn(ctx, ctx.in(1), "weight");
  FloatOut y = floatOut(ctx, ctx.out(0), "result");
  if (s.rows * s.features == 0)
    return;
  shardedRmsNormKernel<<<gridFor(s.rows * s.features), kThreads, 0, streamOf(ctx)>>>(
      x, w, rowStatistic(ctx, ctx.in(2), "sum_of_squares"), y, s.rows * s.features, s.features, s.wholeFeatures, s.eps,
      s.unitOffset);
  checkLaunch(ctx, "sharded_rms_norm");
}

void shardedRmsNormBackward(KernelContext &ctx) {
  BackwardLaunch launch(ctx, 1, {0, 1, 2});
  ShardedRmsNormShape s = checks::core::checkShardedRmsNorm(ctx);
  FloatIn x = floatIn(ctx, ctx.in(0), "input"), w = floatIn(ctx, ctx.in(1), "weight");
  const float *ss = rowStatistic(ctx, ctx.in(2), "sum_of_squares");
  FloatIn dy = floatIn(ctx, launch.resultGrad0(ctx.in(0).shape), "the result gradient");
  const TensorRef *dxRef = launch.operandGrad(0), *dwRef = launch.operandGrad(1), *dsRef = launch.operandGrad(2);
  FloatOut dx = dxRef ? floatOut(ctx, *dxRef, "the input gradient") : FloatOut{};
  FloatOut dw = dwRef ? floatOut(ctx, *dwRef, "the weight gradient") : FloatOut{};
  float *ds = dsRef ? rowStatistic(ctx, *dsRef, "the sum_of_squares gradient") : nullptr;
  if (s.rows == 0 || (!dxRef && !dwRef && !dsRef))
    return;
  Workspace ws(ctx);
  float *rinv = dwRef ? ws.alloc<float>(s.rows) : nullptr;
  shardedRmsNormBackwardKernel<<<blockCount(ctx, s.rows), rowThreads(s.features), 0, streamOf(ctx)>>>(
      x, w, ss, dy, dx, ds, rinv, s.features, s.wholeFeatures, s.eps, s.unitOffset);
  checkLaunch(ctx, "sharded_rms_norm.backward");
  if (dwRef)
    columnSums(ctx, ws, RmsWeightGrad{x, dy, rinv, s.features}, s.rows, s.features, dw,
               "sharded_rms_norm.backward (weight)");
}

//===----------------------------------------------------------------------===//
// layer_norm
//===----------------------------------------------------------------------===//

/// x [..., F], weight [F], bias [F]; biased variance as torch has it.
struct LayerNormArgs {
  FloatIn x, w, b;
  int64_t features, rows;
  float eps;

  LayerNormArgs(const KernelContext &ctx) {
    const TensorRef &input = ctx.in(0);
    x = floatIn(ctx, input, "input");
    w = floatIn(ctx, ctx.in(1), "weight");
    b = floatIn(ctx, ctx.in(2), "bias");
    rows = rowsOf(ctx, input, "input");
    features = input.dim(-1);
    ctx.expectShape(ctx.in(1), "weight", {features});
    ctx.expectShape(ctx.in(2), "bias", {features});
    eps = static_cast<float>(ctx.attrFloat("eps"));
  }
};

/// Mean and 1 / sqrt(var + eps) of the row starting at `base`; every thread gets them.
__device__ __forceinline__ void rowStats(FloatIn x, int64_t base, int64_t n, float eps,
                                         float *shared, float &mean, float &inverseStd) {
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    sum += x[base + j];
  mean = blockSum(sum, shared) / static_cast<float>(n);
  float squares = 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    float d = x[base + j] - mean;
    squares += d * d;
  }
  squares = blockSum(squares, shared);
  inverseStd = 1.0f / sqrtf(squares / static_cast<float>(n) + eps);
}

/// Grid: one block per row.
__global__ void layerNormKernel(FloatIn x, FloatIn w, FloatIn b, FloatOut y, int64_t n,
                                float eps) {
  __shared__ float shared[32];
  int64_t base = static_cast<int64_t>(blockIdx.x) * n;
  float mean, r;
  rowStats(x, base, n, eps, shared, mean, r);
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    y.set(base + j, (x[base + j] - mean) * r * w[j] + b[j]);
}

/// dx = r (g - mean(g) - x̂ mean(g x̂)) with g = dy * w; stores mean and r per
/// row for the parameter gradients. Grid: one block per row; dx.p or stats may be null.
__global__ void layerNormBackwardKernel(FloatIn x, FloatIn w, FloatIn dy, FloatOut dx,
                                        float2 *stats, int64_t n, float eps) {
  __shared__ float shared[32];
  int64_t row = blockIdx.x, base = row * n;
  float mean, r;
  rowStats(x, base, n, eps, shared, mean, r);
  if (stats && threadIdx.x == 0)
    stats[row] = make_float2(mean, r);
  if (!dx.p)
    return; // uniform over the block
  float sumG = 0.0f, sumGx = 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    float g = dy[base + j] * w[j];
    sumG += g;
    sumGx += g * ((x[base + j] - mean) * r);
  }
  sumG = blockSum(sumG, shared);
  sumGx = blockSum(sumGx, shared);
  float meanG = sumG / static_cast<float>(n), meanGx = sumGx / static_cast<float>(n);
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    float xhat = (x[base + j] - mean) * r, g = dy[base + j] * w[j];
    dx.set(base + j, r * (g - meanG - xhat * meanGx));
  }
}

/// dw[j] = Σ_row dy x̂.
struct LayerWeightGrad {
  FloatIn x, dy;
  const float2 *stats;
  int64_t n;
  __device__ float operator()(int64_t row, int64_t j) const {
    float2 s = stats[row];
    return dy[row * n + j] * ((x[row * n + j] - s.x) * s.y);
  }
};

void layerNorm(KernelContext &ctx) {
  LayerNormArgs a(ctx);
  const TensorRef &result = ctx.out(0);
  expectSameShape(ctx, result, "result", ctx.in(0), "input");
  FloatOut y = floatOut(ctx, result, "result");
  if (a.rows == 0)
    return;
  layerNormKernel<<<blockCount(ctx, a.rows), rowThreads(a.features), 0, streamOf(ctx)>>>(
      a.x, a.w, a.b, y, a.features, a.eps);
  checkLaunch(ctx, "layer_norm");
}

void layerNormBackward(KernelContext &ctx) {
  BackwardLaunch launch(ctx, 1, {0, 1, 2});
  LayerNormArgs a(ctx);
  FloatIn dy = floatIn(ctx, launch.resultGrad0(ctx.in(0).shape), "the result gradient");
  const TensorRef *dxRef = launch.operandGrad(0), *dwRef = launch.operandGrad(1),
                  *dbRef = launch.operandGrad(2);
  FloatOut dx = dxRef ? floatOut(ctx, *dxRef, "the input gradient") : FloatOut{};
  FloatOut dw = dwRef ? floatOut(ctx, *dwRef, "the weight gradient") : FloatOut{};
  FloatOut db = dbRef ? floatOut(ctx, *dbRef, "the bias gradient") : FloatOut{};
  Workspace ws(ctx);
  float2 *stats = dwRef ? ws.alloc<float2>(a.rows) : nullptr;
  if (a.rows > 0 && (dxRef || dwRef)) {
    layerNormBackwardKernel<<<blockCount(ctx, a.rows), rowThreads(a.features), 0,
                              streamOf(ctx)>>>(a.x, a.w, dy, dx, stats, a.features, a.eps);
    checkLaunch(ctx, "layer_norm.backward");
  }
  if (dwRef)
    columnSums(ctx, ws, LayerWeightGrad{a.x, dy, stats, a.features}, a.rows, a.features, dw,
               "layer_norm.backward (weight)");
  if (dbRef)
    columnSums(ctx, ws, RowSum{dy, a.features}, a.rows, a.features, db,
               "layer_norm.backward (bias)");
}

} // namespace

void registerNormKernels(KernelRegistry &registry) {
  registry.add("rms_norm", rmsNorm, OutputInit::Any); // every row normalised
  registry.add("rms_norm.backward", rmsNormBackward);
  registry.add("row_sum_of_squares", rowSumOfSquares, OutputInit::Any); // every row written
  registry.add("row_sum_of_squares.backward", rowSumOfSquaresBackward);
  registry.add("sharded_rms_norm", shardedRmsNorm, OutputInit::Any);
  registry.add("sharded_rms_norm.backward", shardedRmsNormBackward);
  registry.add("layer_norm", layerNorm);
  registry.add("layer_norm.backward", layerNormBackward);
}

} // namespace moec::runtime::cuda::core
