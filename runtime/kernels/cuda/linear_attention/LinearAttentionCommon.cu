//===- LinearAttentionCommon.cu - launch checks, scratch and shared stages ---===//

#include "runtime/kernels/cuda/linear_attention/LinearAttentionCommon.cuh"

#include <algorithm>
#include <cmath>
#include <type_traits>

namespace moec::runtime::cuda::linattn {

namespace {

constexpr int kThreads = 256;     // elementwise kernels
constexpr int kWarpsPerBlock = 4; // kernels with one warp per row

__device__ __forceinline__ double warpSum(double v) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v; // every lane holds the sum, added in the same (butterfly) order
}

//===--- storage -------------------------------------------------------------===//

template <typename T> __global__ void toF32Kernel(const T *in, float *out, int64_t n) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n)
    out[i] = toFloat(in[i]);
}

template <typename T> __global__ void fromF32Kernel(const float *in, T *out, int64_t n) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n)
    out[i] = fromFloat<T>(in[i]);
}

//===--- conv ----------------------------------------------------------------===//

__device__ __forceinline__ float convPre(const Conv &cv, int64_t t, int64_t c) {
  int64_t start = (t / cv.seqLen) * cv.seqLen, col = cv.map(c);
  double pre = 0;
  for (int64_t j = 0; j < cv.width; ++j) {
    int64_t s = t - (cv.width - 1) + j;
    if (s >= start)
      pre += static_cast<double>(cv.w[c * cv.width + j]) * cv.x[s * cv.ld + col];
  }
  return static_cast<float>(pre);
}

__global__ void convForwardKernel(Conv cv, float *out) {
  int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= cv.tokens * cv.channels)
    return;
  float pre = convPre(cv, idx / cv.channels, idx % cv.channels);
  out[idx] = pre * sigmoidf(pre);
}

/// dpre[t, c] = dout[t, c] * SiLU'(pre[t, c]).
__global__ void convDpreKernel(Conv cv, const float *dout, float *dpre) {
  int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= cv.tokens * cv.channels)
    return;
  float pre = convPre(cv, idx / cv.channels, idx % cv.channels);
  float s = sigmoidf(pre);
  dpre[idx] = dout[idx] * (s * (1.0f + pre * (1.0f - s)));
}

/// dx[s, c] = sum over the taps t = s .. s+K-1 of its sequence of dpre[t, c] w[c, K-1-(t-s)].
__global__ void convDxKernel(Conv cv, const float *dpre, float *dx, int64_t dxLd) {
  int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= cv.tokens * cv.channels)
    return;
  int64_t s = idx / cv.channels, c = idx % cv.channels;
  int64_t stop = (s / cv.seqLen + 1) * cv.seqLen;
  double acc = 0;
  for (int64_t t = s; t < s + cv.width && t < stop; ++t)
    acc += static_cast<double>(dpre[t * cv.channels + c]) * cv.w[c * cv.width + (cv.width - 1 - (t - s))];
  dx[s * dxLd + cv.map(c)] = static_cast<float>(acc);
}

// Deterministic sums over rows: rows are cut into fixed chunks (depending
// only on the row count); blocks of 32 columns x 8 lanes sum one chunk each
// in a fixed order into double partials, then one thread per column adds the
// chunks in order.
constexpr int kSumColumns = 32, kSumLanes = 8;

int64_t rowChunks(int64_t rows) { return std::min<int64_t>(256, std::max<int64_t>(1, (rows + 63) / 64)); }

/// partial[chunk, c * K + j] = sum over t in chunk of dpre[t, c] x[t-K+1+j, c] (same sequence).
__global__ void convDwPartialKernel(Conv cv, const float *dpre, int64_t rowsPerChunk, double *partial) {
  __shared__ double lanes[kSumLanes][kSumColumns];
  int64_t c = blockIdx.x * static_cast<int64_t>(kSumColumns) + threadIdx.x;
  int64_t first = blockIdx.y * rowsPerChunk;
  int64_t last = first + rowsPerChunk < cv.tokens ? first + rowsPerChunk : cv.tokens;
  int64_t col = c < cv.channels ? cv.map(c) : 0;
  for (int64_t j = 0; j < cv.width; ++j) {
    double acc = 0;
    if (c < cv.channels)
      for (int64_t t = first + threadIdx.y; t < last; t += kSumLanes) {
        int64_t s = t - (cv.width - 1) + j;
        if (s >= (t / cv.seqLen) * cv.seqLen)
          acc += static_cast<double>(dpre[t * cv.channels + c]) * cv.x[s * cv.ld + col];
      }
    lanes[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < cv.channels) {
      double sum = 0;
      for (int l = 0; l < kSumLanes; ++l)
        sum += lanes[l][threadIdx.x];
      partial[blockIdx.y * cv.channels * cv.width + c * cv.width + j] = sum;
    }
    __syncthreads();
  }
}

__global__ void columnSumPartialKernel(const float *m, int64_t rows, int64_t cols, int64_t rowsPerChunk,
                                       double *partial) {
  __shared__ double lanes[kSumLanes][kSumColumns];
  int64_t c = blockIdx.x * static_cast<int64_t>(kSumColumns) + threadIdx.x;
  int64_t first = blockIdx.y * rowsPerChunk;
  int64_t last = first + rowsPerChunk < rows ? first + rowsPerChunk : rows;
  double acc = 0;
  if (c < cols)
    for (int64_t row = first + threadIdx.y; row < last; row += kSumLanes)
      acc += m[row * cols + c];
  lanes[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    double sum = 0;
    for (int l = 0; l < kSumLanes; ++l)
      sum += lanes[l][threadIdx.x];
    partial[blockIdx.y * cols + c] = sum;
  }
}

__global__ void sumChunksKernel(const double *partial, int64_t chunks, int64_t cols, float *out) {
  int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= cols)
    return;
  double sum = 0;
  for (int64_t k = 0; k < chunks; ++k)
    sum += partial[k * cols + c];
  out[c] = static_cast<float>(sum);
}

__global__ void rowSumKernel(const float *m, int64_t rows, int64_t cols, float *out) {
  int64_t row = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= rows)
    return; // whole warps leave together
  double acc = 0;
  for (int64_t c = lane; c < cols; c += 32)
    acc += m[row * cols + c];
  acc = warpSum(acc);
  if (lane == 0)
    out[row] = static_cast<float>(acc);
}

//===--- L2 norm -------------------------------------------------------------===//

__global__ void l2NormForwardKernel(const float *x, int64_t ld, int64_t off, int64_t rows, int64_t groups,
                                    int64_t dim, float scale, float *y) {
  int64_t row = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= rows)
    return;
  const float *xr = x + (row / groups) * ld + off + (row % groups) * dim;
  double sum = 0;
  for (int64_t i = lane; i < dim; i += 32)
    sum += static_cast<double>(xr[i]) * xr[i];
  double inv = 1.0 / sqrt(warpSum(sum) + 1e-6);
  for (int64_t i = lane; i < dim; i += 32)
    y[row * dim + i] = static_cast<float>(xr[i] * inv * scale);
}

__global__ void l2NormBackwardKernel(const float *x, int64_t ld, int64_t off, int64_t rows, int64_t groups,
                                     int64_t dim, float scale, const float *dy, int64_t r, float *dx,
                                     int64_t dxLd, int64_t dxOff) {
  int64_t row = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= rows)
    return;
  int64_t t = row / groups, g = row % groups;
  const float *xr = x + t * ld + off + g * dim;
  const float *dyr = dy + row * r * dim; // value heads g*r .. g*r+r-1 of token t
  auto grad = [&](int64_t i) {
    double sum = 0;
    for (int64_t hh = 0; hh < r; ++hh)
      sum += dyr[hh * dim + i];
    return sum;
  };
  double sq = 0, dot = 0;
  for (int64_t i = lane; i < dim; i += 32) {
    sq += static_cast<double>(xr[i]) * xr[i];
    dot += xr[i] * grad(i);
  }
  double n = 1.0 / sqrt(warpSum(sq) + 1e-6);
  dot = warpSum(dot);
  for (int64_t i = lane; i < dim; i += 32)
    dx[t * dxLd + dxOff + g * dim + i] = static_cast<float>(scale * n * (grad(i) - xr[i] * n * n * dot));
}

//===--- gated RMSNorm -------------------------------------------------------===//

__device__ __forceinline__ float activate(GateActivation act, float x) {
  return act == GateActivation::Silu ? x * sigmoidf(x) : sigmoidf(x);
}

__device__ __forceinline__ float activateGrad(GateActivation act, float x) {
  float s = sigmoidf(x);
  return act == GateActivation::Silu ? s * (1.0f + x * (1.0f - s)) : s * (1.0f - s);
}

template <typename OutT>
__global__ void gatedNormForwardKernel(const float *o, const float *gate, GateMap gm, const float *w,
                                       int64_t rows, int64_t heads, int64_t dim, double eps,
                                       GateActivation act, OutT *y) {
  int64_t row = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= rows)
    return;
  int64_t t = row / heads, h = row % heads;
  const float *orow = o + row * dim;
  double sum = 0;
  for (int64_t j = lane; j < dim; j += 32)
    sum += static_cast<double>(orow[j]) * orow[j];
  double r = 1.0 / sqrt(warpSum(sum) / static_cast<double>(dim) + eps);
  for (int64_t j = lane; j < dim; j += 32)
    y[row * dim + j] =
        fromFloat<OutT>(static_cast<float>(orow[j] * r * w[j] * activate(act, gate[gm.at(t, h, j, dim)])));
}

/// dO, dGate and the terms of dW (term[row, j] = dy o r act(gate)) of one (t, h) per warp.
__global__ void gatedNormBackwardKernel(const float *o, const float *gate, GateMap gm, const float *w,
                                        int64_t rows, int64_t heads, int64_t dim, double eps,
                                        GateActivation act, const float *dy, float *dO, float *dGate,
                                        float *term) {
  int64_t row = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= rows)
    return;
  int64_t t = row / heads, h = row % heads;
  const float *orow = o + row * dim, *dyrow = dy + row * dim;
  double sum = 0;
  for (int64_t j = lane; j < dim; j += 32)
    sum += static_cast<double>(orow[j]) * orow[j];
  double r = 1.0 / sqrt(warpSum(sum) / static_cast<double>(dim) + eps), dot = 0;
  for (int64_t j = lane; j < dim; j += 32) {
    int64_t at = gm.at(t, h, j, dim);
    float x = gate[at];
    double dn = static_cast<double>(dyrow[j]) * w[j] * activate(act, x);
    dGate[at] = static_cast<float>(static_cast<double>(dyrow[j]) * orow[j] * r * w[j] * activateGrad(act, x));
    term[row * dim + j] = static_cast<float>(static_cast<double>(dyrow[j]) * orow[j] * r * activate(act, x));
    dot += dn * orow[j];
  }
  double k = r * r * r * warpSum(dot) / static_cast<double>(dim);
  for (int64_t j = lane; j < dim; j += 32) {
    double dn = static_cast<double>(dyrow[j]) * w[j] * activate(act, gate[gm.at(t, h, j, dim)]);
    dO[row * dim + j] = static_cast<float>(r * dn - orow[j] * k);
  }
}

unsigned warpBlocksFor(int64_t rows) { return blocksFor(rows, kWarpsPerBlock); }

} // namespace

//===--- launch checks -------------------------------------------------------===//

void expectFloat(const KernelContext &ctx, const TensorRef &t, const char *what) {
  if (t.dtype != plan::F32 && t.dtype != plan::BF16)
    ctx.fail(std::string(what) + " must be f32 or bf16");
  if (!t.data && t.numel() > 0)
    ctx.fail(std::string(what) + " has no device buffer");
}

BackwardLayout::BackwardLayout(const KernelContext &ctx, size_t numOperands,
                               const std::vector<int64_t> &resultShape)
    : grad(checks::linattn::checkBackwardLayout(ctx, numOperands, resultShape, expectFloat)) {}

//===--- scratch and storage -------------------------------------------------===//

Scratch::~Scratch() {
  for (void *p : buffers)
    cudaFreeAsync(p, streamOf(ctx));
}

void *Scratch::bytes(size_t n) {
  void *p = nullptr;
  cudaError_t error = cudaMallocAsync(&p, std::max<size_t>(n, 16), streamOf(ctx));
  if (error != cudaSuccess)
    ctx.fail("cannot allocate " + std::to_string(n) +
             " bytes of scratch memory: " + cudaGetErrorString(error));
  buffers.push_back(p);
  return p;
}

const float *asF32(const KernelContext &ctx, Scratch &scratch, const TensorRef &t, const char *what) {
  expectFloat(ctx, t, what);
  if (t.dtype == plan::F32)
    return static_cast<const float *>(t.data);
  int64_t n = t.numel();
  float *out = scratch.floats(n);
  if (n > 0) {
    toF32Kernel<__nv_bfloat16><<<gridFor(n, kThreads), kThreads, 0, streamOf(ctx)>>>(
        static_cast<const __nv_bfloat16 *>(t.data), out, n);
    checkLaunch(ctx, "bf16 to f32");
  }
  return out;
}

void storeF32(const KernelContext &ctx, const float *src, const TensorRef &out) {
  int64_t n = out.numel();
  if (n == 0)
    return;
  withFloatType(ctx, out, "a result", [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_same_v<T, float>) {
      if (src != out.data) {
        cudaError_t error = cudaMemcpyAsync(out.data, src, static_cast<size_t>(n) * sizeof(float),
                                            cudaMemcpyDeviceToDevice, streamOf(ctx));
        if (error != cudaSuccess)
          ctx.fail(std::string("copying a result: ") + cudaGetErrorString(error));
      }
    } else {
      fromF32Kernel<T>
          <<<gridFor(n, kThreads), kThreads, 0, streamOf(ctx)>>>(src, static_cast<T *>(out.data), n);
      checkLaunch(ctx, "f32 to bf16");
    }
  });
}

void allowSharedBytes(const KernelContext &ctx, const void *kernel, size_t bytes, const char *what) {
  if (bytes <= 48 * 1024)
    return;
  int device = 0, limit = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess)
    ctx.fail("cannot query the device's shared memory per block");
  if (bytes > static_cast<size_t>(limit))
    ctx.fail(std::string(what) + " needs " + std::to_string(bytes) +
             " bytes of shared memory per block (key_head_dim x value_head_dim too large), the device has " +
             std::to_string(limit));
  cudaError_t error =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (error != cudaSuccess)
    ctx.fail(std::string(what) + ": " + cudaGetErrorString(error));
}

//===--- stages --------------------------------------------------------------===//

void convSiluForward(const KernelContext &ctx, const Conv &conv, float *out) {
  int64_t n = conv.tokens * conv.channels;
  if (n == 0)
    return;
  convForwardKernel<<<gridFor(n, kThreads), kThreads, 0, streamOf(ctx)>>>(conv, out);
  checkLaunch(ctx, "conv forward");
}

void convSiluBackward(const KernelContext &ctx, Scratch &scratch, const Conv &conv, const float *dout,
                      float *dx, int64_t dxLd, float *dw) {
  int64_t n = conv.tokens * conv.channels;
  if (n == 0)
    return;
  cudaStream_t stream = streamOf(ctx);
  float *dpre = scratch.floats(n);
  convDpreKernel<<<gridFor(n, kThreads), kThreads, 0, stream>>>(conv, dout, dpre);
  checkLaunch(ctx, "conv backward (SiLU)");
  convDxKernel<<<gridFor(n, kThreads), kThreads, 0, stream>>>(conv, dpre, dx, dxLd);
  checkLaunch(ctx, "conv backward (input)");
  int64_t chunks = rowChunks(conv.tokens), rowsPerChunk = (conv.tokens + chunks - 1) / chunks;
  int64_t cols = conv.channels * conv.width;
  double *partial = static_cast<double *>(scratch.bytes(static_cast<size_t>(chunks * cols) * sizeof(double)));
  dim3 grid(blocksFor(conv.channels, kSumColumns), static_cast<unsigned>(chunks));
  convDwPartialKernel<<<grid, dim3(kSumColumns, kSumLanes), 0, stream>>>(conv, dpre, rowsPerChunk, partial);
  checkLaunch(ctx, "conv backward (weight)");
  sumChunksKernel<<<gridFor(cols, kThreads), kThreads, 0, stream>>>(partial, chunks, cols, dw);
  checkLaunch(ctx, "conv backward (weight sum)");
}

void l2NormForward(const KernelContext &ctx, const float *x, int64_t ld, int64_t off, int64_t tokens,
                   int64_t groups, int64_t dim, float scale, float *y) {
  int64_t rows = tokens * groups;
  if (rows == 0)
    return;
  l2NormForwardKernel<<<warpBlocksFor(rows), 32 * kWarpsPerBlock, 0, streamOf(ctx)>>>(x, ld, off, rows,
                                                                                      groups, dim, scale, y);
  checkLaunch(ctx, "l2 norm");
}

void l2NormBackward(const KernelContext &ctx, const float *x, int64_t ld, int64_t off, int64_t tokens,
                    int64_t groups, int64_t dim, float scale, const float *dy, int64_t r, float *dx,
                    int64_t dxLd, int64_t dxOff) {
  int64_t rows = tokens * groups;
  if (rows == 0)
    return;
  l2NormBackwardKernel<<<warpBlocksFor(rows), 32 * kWarpsPerBlock, 0, streamOf(ctx)>>>(
      x, ld, off, rows, groups, dim, scale, dy, r, dx, dxLd, dxOff);
  checkLaunch(ctx, "l2 norm backward");
}

void gatedNormForward(const KernelContext &ctx, const float *o, const float *gate, const GateMap &gateMap,
                      const float *w, int64_t tokens, int64_t heads, int64_t dim, double eps,
                      GateActivation act, const TensorRef &y) {
  int64_t rows = tokens * heads;
  if (rows == 0)
    return;
  withFloatType(ctx, y, "result", [&](auto zero) {
    using T = decltype(zero);
    gatedNormForwardKernel<T><<<warpBlocksFor(rows), 32 * kWarpsPerBlock, 0, streamOf(ctx)>>>(
        o, gate, gateMap, w, rows, heads, dim, eps, act, static_cast<T *>(y.data));
  });
  checkLaunch(ctx, "gated rmsnorm");
}

void gatedNormBackward(const KernelContext &ctx, Scratch &scratch, const float *o, const float *gate,
                       const GateMap &gateMap, const float *w, int64_t tokens, int64_t heads, int64_t dim,
                       double eps, GateActivation act, const float *dy, float *dO, float *dGate, float *dW) {
  int64_t rows = tokens * heads;
  if (rows == 0)
    return;
  float *term = scratch.floats(rows * dim);
  gatedNormBackwardKernel<<<warpBlocksFor(rows), 32 * kWarpsPerBlock, 0, streamOf(ctx)>>>(
      o, gate, gateMap, w, rows, heads, dim, eps, act, dy, dO, dGate, term);
  checkLaunch(ctx, "gated rmsnorm backward");
  columnSum(ctx, scratch, term, rows, dim, dW);
}

void columnSum(const KernelContext &ctx, Scratch &scratch, const float *m, int64_t rows, int64_t cols,
               float *out) {
  if (cols == 0)
    return;
  cudaStream_t stream = streamOf(ctx);
  int64_t chunks = rowChunks(rows), rowsPerChunk = (rows + chunks - 1) / chunks;
  double *partial = static_cast<double *>(scratch.bytes(static_cast<size_t>(chunks * cols) * sizeof(double)));
  dim3 grid(blocksFor(cols, kSumColumns), static_cast<unsigned>(chunks));
  columnSumPartialKernel<<<grid, dim3(kSumColumns, kSumLanes), 0, stream>>>(m, rows, cols, rowsPerChunk,
                                                                            partial);
  checkLaunch(ctx, "column sum");
  sumChunksKernel<<<gridFor(cols, kThreads), kThreads, 0, stream>>>(partial, chunks, cols, out);
  checkLaunch(ctx, "column sum (chunks)");
}

void rowSum(const KernelContext &ctx, const float *m, int64_t rows, int64_t cols, float *out) {
  if (rows == 0)
    return;
  rowSumKernel<<<warpBlocksFor(rows), 32 * kWarpsPerBlock, 0, streamOf(ctx)>>>(m, rows, cols, out);
  checkLaunch(ctx, "row sum");
}

} // namespace moec::runtime::cuda::linattn
