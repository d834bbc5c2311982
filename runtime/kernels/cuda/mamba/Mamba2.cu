//===- Mamba2.cu - Nemotron-H's Mamba-2 mixer on CUDA, forward and backward ===//
//
// The CUDA twin of cpu/mamba/Mamba2.cpp (read its header for the maths):
//
//   xBC  = silu(causal_depthwise_conv(xBC) + conv_bias)   (restarts per sequence)
//   dt   = max(softplus(dt + dt_bias), time_step_min),  A = -exp(A_log)
//   s_t  = exp(dt_t A) s_{t-1} + dt_t x_t B_tᵀ            (s: [p,N] per head)
//   y_t  = s_t C_t + D x_t
//   out  = rmsnorm_groups(y * silu(z)) * norm_weight, groups of H*p/G
//
// First version, recurrent form: one thread block per (sequence, head) holds
// the p x N state in shared memory and steps through the tokens (warp w owns
// the state rows i = w (mod #warps), lane l the columns n = l (mod 32), so
// every row reduction is one warp's shuffle). A chunked SSD form (intra-chunk
// matmuls on tensor cores, inter-chunk state passing) can replace the scan
// later; chunk_size is used, as on the CPU, only to space the backward's
// state checkpoints. The conv, time steps, gated norm and the parameter
// reductions are separate kernels.
//
// Storage: every float tensor (operands, result, gradients) may be F32 or
// BF16, each on its own (read through FloatIn / written through FloatOut);
// arithmetic is f32, the cross-token sums of the parameter gradients are
// accumulated in double (as the CPU does). Intermediates live in f32 scratch
// taken with cudaMallocAsync / cudaFreeAsync on ctx.stream:
//
//   forward:  4 * T * (C + H + H*p) bytes                 (act, dt, y)
//   backward: 4 * T * (3*C + 2*H + 3*H*p + 2*H*N)          (pre, act, gAct, dt, gDt,
//             + 16 * B * H                                  y, gy, normed, gB/gC per head,
//             + 4 * B * H * (ceil(L/c) + c) * p * N bytes   gA/gD per task, checkpoints + one
//                                                            chunk of states per task)
//
// with T tokens, L = seq_len, B = micro_batch, C = H*p + 2*G*N conv channels,
// c = min(chunk_size, L). Everything is deterministic: no atomics, every
// reduction has a fixed order.
//
//===----------------------------------------------------------------------===//

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/kernels/checks/mamba/Mamba2Checks.h"
#include "runtime/kernels/cuda/CudaCommon.cuh"
#include "runtime/kernels/cuda/CudaKernels.h"

namespace moec::runtime::cuda {
namespace {

using namespace checks::mamba2;

/// The CUDA kernels take f32 or bf16 and count the inputs before reading any.
const Rules kRules{/*bf16=*/true, /*countInputs=*/true};

/// A device float tensor read as f32, whatever its storage (f32 or bf16); null when absent.
struct FloatIn {
  const void *data = nullptr;
  bool bf16 = false;
  __device__ __forceinline__ float operator[](int64_t i) const {
    return bf16 ? toFloat(static_cast<const __nv_bfloat16 *>(data)[i]) : static_cast<const float *>(data)[i];
  }
};

/// A device float tensor written from f32 (rounded to bf16 when so stored); null when not wanted.
struct FloatOut {
  void *data = nullptr;
  bool bf16 = false;
  __device__ __forceinline__ void set(int64_t i, float v) const {
    if (bf16)
      static_cast<__nv_bfloat16 *>(data)[i] = fromFloat<__nv_bfloat16>(v);
    else
      static_cast<float *>(data)[i] = v;
  }
};

FloatIn floatIn(const TensorRef &t) { return {t.data, t.dtype == plan::BF16}; }
FloatOut floatOut(const TensorRef &t) { return {t.data, t.dtype == plan::BF16}; }

/// The device views of the forward operands (convBias.data null when absent).
struct Mamba2Inputs {
  FloatIn zxbcdt, convWeight, convBias, dtBias, aLog, dSkip, normWeight;
};

//===----------------------------------------------------------------------===//
// Device helpers
//===----------------------------------------------------------------------===//

constexpr int kThreads = 256;   // elementwise kernels and the scans
constexpr int kMaxBlocks = 1 << 20; // grid-stride beyond this

__device__ __forceinline__ float sigmoidF(float v) { return 1.0f / (1.0f + expf(-v)); }
__device__ __forceinline__ float siluF(float v) { return v * sigmoidF(v); }
__device__ __forceinline__ float siluGradF(float v) {
  float s = sigmoidF(v);
  return s * (1.0f + v * (1.0f - s));
}
// torch's softplus: linear above threshold 20.
__device__ __forceinline__ float softplusF(float v) { return v > 20.0f ? v : log1pf(expf(v)); }
__device__ __forceinline__ float softplusGradF(float v) { return v > 20.0f ? 1.0f : sigmoidF(v); }

/// One state element's recurrence step, s' = a s + (dt x_i) B_n; one function so that the
/// forward sweep and the backward's recomputation from a checkpoint round identically.
__device__ __forceinline__ float stepState(float a, float s, float dx, float b) {
  return __fmaf_rn(a, s, __fmul_rn(dx, b));
}

template <typename T> __device__ __forceinline__ T warpSum(T v) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, offset); // butterfly: every lane ends with the same sum
  return v;
}

/// The sum of `v` over the block (blockDim.x a multiple of 32), the same in every thread;
/// `red` holds 32 T in shared memory. Every thread must call it (it synchronises).
template <typename T> __device__ T blockSum(T v, T *red) {
  v = warpSum(v);
  __syncthreads(); // a previous blockSum's readers are done with `red`
  if ((threadIdx.x & 31) == 0)
    red[threadIdx.x >> 5] = v;
  __syncthreads();
  T total = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w)
    total += red[w];
  return total;
}

//===----------------------------------------------------------------------===//
// Forward pieces (also the backward's recomputation)
//===----------------------------------------------------------------------===//

/// pre [T, C] = causal depthwise conv of xBC (+ bias), act = silu(pre); pre may be null.
__global__ void convKernel(Mamba2Shape s, Mamba2Inputs in, float *pre, float *act) {
  int64_t n = s.tokens * s.channels;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    int64_t row = e / s.channels, c = e % s.channels;
    int64_t t = row % s.seqLen; // the conv restarts with each sequence
    float acc = in.convBias.data ? in.convBias[c] : 0.0f;
    for (int64_t k = 0; k < s.kernel; ++k) {
      int64_t back = s.kernel - 1 - k; // tap k reads position t - back
      if (back > t)
        continue;
      acc += in.convWeight[c * s.kernel + k] * in.zxbcdt[(row - back) * s.width + s.inner + c];
    }
    if (pre)
      pre[e] = acc;
    act[e] = siluF(acc);
  }
}

/// dt [T, H] = max(softplus(dt_raw + dt_bias), time_step_min).
__global__ void timeStepKernel(Mamba2Shape s, Mamba2Inputs in, float *dt) {
  int64_t n = s.tokens * s.heads;
  float dtMin = static_cast<float>(s.dtMin);
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    int64_t row = e / s.heads, h = e % s.heads;
    float u = in.zxbcdt[row * s.width + s.inner + s.channels + h] + in.dtBias[h];
    dt[e] = fmaxf(softplusF(u), dtMin);
  }
}

/// Loads token `row`'s x [p] (head h), B [N], C [N] (group g) and, when `gy` is given, its
/// output gradient [p] into shared memory. Synchronises before (earlier readers are done) and
/// after (the values are visible).
__device__ __forceinline__ void loadToken(const Mamba2Shape &s, const float *act, const float *gy,
                                          int64_t row, int64_t h, int64_t g, float *xs, float *bs,
                                          float *cs, float *gys) {
  __syncthreads();
  const float *base = act + row * s.channels;
  for (int64_t j = threadIdx.x; j < s.headDim; j += blockDim.x) {
    xs[j] = base[h * s.headDim + j];
    if (gy)
      gys[j] = gy[row * s.inner + h * s.headDim + j];
  }
  for (int64_t j = threadIdx.x; j < s.state; j += blockDim.x) {
    bs[j] = base[s.bColumn(g) + j];
    if (cs)
      cs[j] = base[s.cColumn(g) + j];
  }
  __syncthreads();
}

/// y [T, H*p] = s_t C_t + D x_t. Grid: batch * heads blocks (one per (sequence, head));
/// block: kThreads; dynamic shared memory: (p*N + p + 2N) floats.
__global__ void scanForwardKernel(Mamba2Shape s, Mamba2Inputs in, const float *act, const float *dt,
                                  float *y) {
  extern __shared__ float smem[];
  const int64_t p = s.headDim, N = s.state;
  float *state = smem, *xs = state + p * N, *bs = xs + p, *cs = bs + N;
  const int64_t b = blockIdx.x / s.heads, h = blockIdx.x % s.heads, g = h / s.headsPerGroup;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  const float aCoef = -expf(in.aLog[h]), skip = in.dSkip[h];

  for (int64_t i = warp; i < p; i += warps)
    for (int64_t n = lane; n < N; n += 32)
      state[i * N + n] = 0.0f;
  for (int64_t row = b * s.seqLen; row < (b + 1) * s.seqLen; ++row) {
    loadToken(s, act, nullptr, row, h, g, xs, bs, cs, nullptr);
    float d = dt[row * s.heads + h], a = expf(d * aCoef);
    for (int64_t i = warp; i < p; i += warps) { // warp-uniform: every lane takes part in warpSum
      float dx = d * xs[i], acc = 0.0f;
      for (int64_t n = lane; n < N; n += 32) {
        float v = stepState(a, state[i * N + n], dx, bs[n]);
        state[i * N + n] = v;
        acc += v * cs[n];
      }
      acc = warpSum(acc);
      if (lane == 0)
        y[row * s.inner + h * p + i] = skip * xs[i] + acc;
    }
  }
}

/// out = rmsnorm_groups(y * silu(z)) * norm_weight. Grid: tokens * groups blocks (one per
/// (row, group)); block: normThreads(s); static shared memory: 32 floats.
__global__ void normForwardKernel(Mamba2Shape s, Mamba2Inputs in, const float *y, FloatOut out) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x / s.groups, g = blockIdx.x % s.groups, m = s.normGroup;
  const int64_t first = row * s.inner + g * m, zFirst = row * s.width + g * m;
  float sumSq = 0.0f;
  for (int64_t j = threadIdx.x; j < m; j += blockDim.x) {
    float v = y[first + j] * siluF(in.zxbcdt[zFirst + j]);
    sumSq += v * v;
  }
  sumSq = blockSum(sumSq, red);
  float r = 1.0f / sqrtf(sumSq / static_cast<float>(m) + static_cast<float>(s.eps));
  for (int64_t j = threadIdx.x; j < m; j += blockDim.x) {
    float v = y[first + j] * siluF(in.zxbcdt[zFirst + j]);
    out.set(first + j, v * r * in.normWeight[g * m + j]);
  }
}

//===----------------------------------------------------------------------===//
// Backward pieces
//===----------------------------------------------------------------------===//

/// Through the gated norm: gy [T, H*p] (gradient of y), normed [T, H*p] (for norm_weight) and,
/// when wanted, the z columns of the zxbcdt gradient. Grid / block as normForwardKernel.
__global__ void normBackwardKernel(Mamba2Shape s, Mamba2Inputs in, const float *y, FloatIn gOut,
                                   float *gy, float *normed, FloatOut gZxbcdt) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x / s.groups, g = blockIdx.x % s.groups, m = s.normGroup;
  const int64_t first = row * s.inner + g * m, zFirst = row * s.width + g * m;
  float sumSq = 0.0f, dot = 0.0f;
  for (int64_t j = threadIdx.x; j < m; j += blockDim.x) {
    float v = y[first + j] * siluF(in.zxbcdt[zFirst + j]);
    float gn = gOut[first + j] * in.normWeight[g * m + j];
    sumSq += v * v;
    dot += gn * v;
  }
  sumSq = blockSum(sumSq, red);
  dot = blockSum(dot, red);
  float r = 1.0f / sqrtf(sumSq / static_cast<float>(m) + static_cast<float>(s.eps));
  float coef = r * r * r * dot / static_cast<float>(m);
  for (int64_t j = threadIdx.x; j < m; j += blockDim.x) {
    float z = in.zxbcdt[zFirst + j], yv = y[first + j];
    float v = yv * siluF(z);
    float gn = gOut[first + j] * in.normWeight[g * m + j];
    float gv = r * gn - coef * v;
    gy[first + j] = gv * siluF(z);
    if (gZxbcdt.data)
      gZxbcdt.set(zFirst + j, gv * yv * siluGradF(z));
    normed[first + j] = v * r;
  }
}

/// norm_weight gradient: column sums of gOut * normed. One thread per column (a fixed row
/// order, double accumulation).
__global__ void normWeightGradKernel(Mamba2Shape s, FloatIn gOut, const float *normed, FloatOut gNorm) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < s.inner; j += int64_t(gridDim.x) * blockDim.x) {
    double acc = 0;
    for (int64_t row = 0; row < s.tokens; ++row)
      acc += static_cast<double>(gOut[row * s.inner + j]) * normed[row * s.inner + j];
    gNorm.set(j, static_cast<float>(acc));
  }
}

/// The scan in reverse, one block per (sequence, head): a forward sweep stores the state at
/// each chunk start (checkpoints), then chunk by chunk from the last, the chunk's states are
/// recomputed from its checkpoint into `states` and the recurrence is run backwards. Writes
/// the x columns of gAct (pre-SiLU factor not applied yet), gB/gC per head [T, H, N], gDt [T, H]
/// and the per-task sums gA, gD. Every thread touches only its own (i, n) elements of the
/// checkpoints and states, so they need no synchronisation.
/// Grid: batch * heads blocks; block: kThreads; dynamic shared memory:
/// (32 + p*N + 3p + 2N + 2 * warps * N) floats.
__global__ void scanBackwardKernel(Mamba2Shape s, Mamba2Inputs in, const float *act, const float *dt,
                                   const float *gy, float *checkpoints, float *states, float *gAct,
                                   float *gBHead, float *gCHead, float *gDt, double *gASeq,
                                   double *gDSeq) {
  extern __shared__ float smem[];
  const int64_t p = s.headDim, N = s.state, size = p * N;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  float *red = smem, *gs = red + 32, *xs = gs + size, *gys = xs + p, *gsBs = gys + p, *bs = gsBs + p,
        *cs = bs + N, *redC = cs + N, *redB = redC + warps * N;
  const int64_t task = blockIdx.x, b = task / s.heads, h = task % s.heads, g = h / s.headsPerGroup;
  const int64_t first = b * s.seqLen, chunk = s.chunkLen(), numChunks = s.numChunks();
  float *cp = checkpoints + task * numChunks * size, *st = states + task * chunk * size;
  const float aCoef = -expf(in.aLog[h]), skip = in.dSkip[h];

  // The forward sweep, `gs` holding the running state; checkpoints at chunk starts.
  for (int64_t i = warp; i < p; i += warps)
    for (int64_t n = lane; n < N; n += 32)
      gs[i * N + n] = 0.0f;
  for (int64_t t = 0; t < s.seqLen; ++t) {
    if (t % chunk == 0)
      for (int64_t i = warp; i < p; i += warps)
        for (int64_t n = lane; n < N; n += 32)
          cp[(t / chunk) * size + i * N + n] = gs[i * N + n];
    loadToken(s, act, nullptr, first + t, h, g, xs, bs, nullptr, nullptr);
    float d = dt[(first + t) * s.heads + h], a = expf(d * aCoef);
    for (int64_t i = warp; i < p; i += warps) {
      float dx = d * xs[i];
      for (int64_t n = lane; n < N; n += 32)
        gs[i * N + n] = stepState(a, gs[i * N + n], dx, bs[n]);
    }
  }

  // Backwards; gs now holds a_{t+1} * dL/ds_{t+1}.
  for (int64_t i = warp; i < p; i += warps)
    for (int64_t n = lane; n < N; n += 32)
      gs[i * N + n] = 0.0f;
  double gA = 0, gD = 0; // meaningful in thread 0
  for (int64_t c = numChunks - 1; c >= 0; --c) {
    const int64_t t0 = c * chunk, t1 = t0 + chunk < s.seqLen ? t0 + chunk : s.seqLen;
    const float *start = cp + c * size;
    for (int64_t t = t0; t < t1; ++t) {
      loadToken(s, act, nullptr, first + t, h, g, xs, bs, nullptr, nullptr);
      float d = dt[(first + t) * s.heads + h], a = expf(d * aCoef);
      const float *prev = t == t0 ? start : st + (t - t0 - 1) * size;
      float *cur = st + (t - t0) * size;
      for (int64_t i = warp; i < p; i += warps) {
        float dx = d * xs[i];
        for (int64_t n = lane; n < N; n += 32)
          cur[i * N + n] = stepState(a, prev[i * N + n], dx, bs[n]);
      }
    }
    for (int64_t t = t1 - 1; t >= t0; --t) {
      const int64_t row = first + t;
      loadToken(s, act, gy, row, h, g, xs, bs, cs, gys);
      const float d = dt[row * s.heads + h], a = expf(d * aCoef);
      const float *cur = st + (t - t0) * size, *prev = t == t0 ? start : cur - size;
      // Own partial sums over this warp's rows, per column n (only this thread touches them).
      for (int64_t n = lane; n < N; n += 32) {
        redC[warp * N + n] = 0.0f;
        redB[warp * N + n] = 0.0f;
      }
      float decay = 0.0f; // dL/da_t, partial
      for (int64_t i = warp; i < p; i += warps) { // warp-uniform
        const float gi = gys[i], xi = xs[i];
        float rowB = 0.0f; // Σ_n gs[i,n] B_n
        for (int64_t n = lane; n < N; n += 32) {
          const int64_t e = i * N + n;
          redC[warp * N + n] += gi * cur[e];
          float v = gs[e] + gi * cs[n];
          rowB += v * bs[n];
          decay += v * prev[e];
          redB[warp * N + n] += v * xi;
          gs[e] = v * a;
        }
        rowB = warpSum(rowB);
        if (lane == 0)
          gsBs[i] = rowB;
      }
      const float gDecay = blockSum(decay, red); // also makes redC, redB, gsBs visible
      for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
        float accC = 0.0f, accB = 0.0f;
        for (int w = 0; w < warps; ++w) {
          accC += redC[w * N + n];
          accB += redB[w * N + n];
        }
        gCHead[(row * s.heads + h) * N + n] = accC;
        gBHead[(row * s.heads + h) * N + n] = d * accB;
      }
      float stepPart = 0.0f, skipPart = 0.0f;
      for (int64_t i = threadIdx.x; i < p; i += blockDim.x) {
        gAct[row * s.channels + h * p + i] = skip * gys[i] + d * gsBs[i];
        stepPart += gsBs[i] * xs[i];
        skipPart += gys[i] * xs[i];
      }
      const float gStep = blockSum(stepPart, red); // dL/ddt_t through dt x Bᵀ
      const float gSkip = blockSum(skipPart, red);
      if (threadIdx.x == 0) {
        // a_t = exp(dt_t A): da/ddt = a A, da/dA = a dt.
        gDt[row * s.heads + h] = gStep + gDecay * a * aCoef;
        gA += static_cast<double>(gDecay) * a * d;
        gD += gSkip;
      }
    }
  }
  if (threadIdx.x == 0) {
    gASeq[task] = gA;
    gDSeq[task] = gD;
  }
}

/// gAct [T, C]: the B and C columns summed over each group's heads, then every column through
/// the SiLU (times silu'(pre)). One thread per element, in place.
__global__ void activationGradKernel(Mamba2Shape s, const float *pre, const float *gBHead,
                                     const float *gCHead, float *gAct) {
  int64_t n = s.tokens * s.channels;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    int64_t row = e / s.channels, c = e % s.channels;
    float v;
    if (c < s.inner) {
      v = gAct[e];
    } else {
      int64_t k = c - s.inner;
      const float *src = gBHead;
      if (k >= s.groups * s.state) {
        k -= s.groups * s.state;
        src = gCHead;
      }
      int64_t g = k / s.state, st = k % s.state;
      v = 0.0f;
      for (int64_t h = g * s.headsPerGroup; h < (g + 1) * s.headsPerGroup; ++h)
        v += src[(row * s.heads + h) * s.state + st];
    }
    gAct[e] = v * siluGradF(pre[e]);
  }
}

/// The xBC columns of the zxbcdt gradient: tap k of output t reads input t - (K-1-k) of the
/// same sequence. One thread per element.
__global__ void convInputGradKernel(Mamba2Shape s, Mamba2Inputs in, const float *gAct, FloatOut gZxbcdt) {
  int64_t n = s.tokens * s.channels;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    int64_t row = e / s.channels, c = e % s.channels, t = row % s.seqLen;
    float acc = 0.0f;
    for (int64_t k = 0; k < s.kernel; ++k) {
      int64_t ahead = s.kernel - 1 - k;
      if (t + ahead >= s.seqLen)
        continue;
      acc += in.convWeight[c * s.kernel + k] * gAct[(row + ahead) * s.channels + c];
    }
    gZxbcdt.set(row * s.width + s.inner + c, acc);
  }
}

/// conv_weight [C, 1, K] and conv_bias [C] gradients: one thread per (tap k, channel c), k = K
/// being the bias; a fixed row order, double accumulation.
__global__ void convParamGradKernel(Mamba2Shape s, Mamba2Inputs in, const float *gAct, FloatOut gWeight,
                                    FloatOut gBias) {
  int64_t n = (s.kernel + 1) * s.channels;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    int64_t k = e / s.channels, c = e % s.channels;
    if (k == s.kernel ? !gBias.data : !gWeight.data)
      continue;
    double acc = 0;
    int64_t back = s.kernel - 1 - k; // -1 for the bias
    for (int64_t row = 0; row < s.tokens; ++row) {
      float ga = gAct[row * s.channels + c];
      if (k == s.kernel)
        acc += ga;
      else if (back <= row % s.seqLen)
        acc += static_cast<double>(ga) * in.zxbcdt[(row - back) * s.width + s.inner + c];
    }
    if (k == s.kernel)
      gBias.set(c, static_cast<float>(acc));
    else
      gWeight.set(c * s.kernel + k, static_cast<float>(acc));
  }
}

/// Per head h (one block each, kThreads threads): the dt columns of the zxbcdt gradient
/// (through the clamp, where dt >= min, and softplus), dt_bias, a_log and d_skip gradients.
__global__ void headGradKernel(Mamba2Shape s, Mamba2Inputs in, const float *gDt, const double *gASeq,
                               const double *gDSeq, FloatOut gZxbcdt, FloatOut gDtBias, FloatOut gALog,
                               FloatOut gDSkip) {
  __shared__ double red[32];
  const int64_t h = blockIdx.x;
  const float dtMin = static_cast<float>(s.dtMin), bias = in.dtBias[h];
  double acc = 0;
  for (int64_t row = threadIdx.x; row < s.tokens; row += blockDim.x) {
    int64_t column = row * s.width + s.inner + s.channels + h;
    float u = in.zxbcdt[column] + bias;
    float g = softplusF(u) >= dtMin ? gDt[row * s.heads + h] * softplusGradF(u) : 0.0f;
    if (gZxbcdt.data)
      gZxbcdt.set(column, g);
    acc += g;
  }
  acc = blockSum(acc, red);
  if (threadIdx.x == 0) {
    double accA = 0, accD = 0;
    for (int64_t b = 0; b < s.batch; ++b) {
      accA += gASeq[b * s.heads + h];
      accD += gDSeq[b * s.heads + h];
    }
    if (gDtBias.data)
      gDtBias.set(h, static_cast<float>(acc));
    // A = -exp(A_log), so dA/dA_log = A.
    if (gALog.data)
      gALog.set(h, static_cast<float>(accA * -exp(static_cast<double>(in.aLog[h]))));
    if (gDSkip.data)
      gDSkip.set(h, static_cast<float>(accD));
  }
}

//===----------------------------------------------------------------------===//
// Host side
//===----------------------------------------------------------------------===//

/// Stream-ordered scratch: reserve byte ranges, allocate once, freed (on the stream) on scope exit.
class Scratch {
public:
  explicit Scratch(cudaStream_t stream) : stream(stream) {}
  Scratch(const Scratch &) = delete;
  Scratch &operator=(const Scratch &) = delete;
  ~Scratch() {
    if (base)
      cudaFreeAsync(base, stream);
  }
  size_t reserve(int64_t bytes) {
    size_t at = total;
    total += (static_cast<size_t>(bytes) + 255) / 256 * 256;
    return at;
  }
  void allocate(const KernelContext &ctx) {
    cudaError_t error = cudaMallocAsync(&base, std::max<size_t>(total, 256), stream);
    if (error != cudaSuccess) {
      base = nullptr;
      ctx.fail("cannot allocate " + std::to_string(total) + " bytes of scratch: " + cudaGetErrorString(error));
    }
  }
  template <typename T> T *at(size_t offset) const {
    return reinterpret_cast<T *>(static_cast<char *>(base) + offset);
  }

private:
  cudaStream_t stream;
  void *base = nullptr;
  size_t total = 0;
};

Mamba2Inputs readInputs(const KernelContext &ctx, const std::vector<int64_t> &present) {
  auto at = [&](int op) { return present[op] < 0 ? FloatIn{} : floatIn(ctx.in(present[op])); };
  return {at(Zxbcdt), at(ConvWeight), at(ConvBias), at(DtBias), at(ALog), at(DSkip), at(NormWeight)};
}

unsigned elementBlocks(int64_t n) { return std::min<unsigned>(blocksFor(n, kThreads), kMaxBlocks); }

/// Threads for one (row, group) of the gated norm: a multiple of 32, at most kThreads.
unsigned normThreads(const Mamba2Shape &s) {
  int64_t warps = std::min<int64_t>((s.normGroup + 31) / 32, kThreads / 32);
  return static_cast<unsigned>(std::max<int64_t>(warps, 1) * 32);
}

size_t scanForwardShared(const Mamba2Shape &s) {
  return sizeof(float) * static_cast<size_t>(s.headDim * s.state + s.headDim + 2 * s.state);
}

size_t scanBackwardShared(const Mamba2Shape &s) {
  return sizeof(float) * static_cast<size_t>(32 + s.headDim * s.state + 3 * s.headDim + 2 * s.state +
                                             2 * (kThreads / 32) * s.state);
}

/// Lets `kernel` use `bytes` of dynamic shared memory (opting in above 48 KiB); fails when the
/// device has less.
void allowShared(const KernelContext &ctx, const void *kernel, size_t bytes, const char *what) {
  if (bytes <= 48 * 1024)
    return;
  int device = 0, limit = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (bytes > static_cast<size_t>(limit))
    ctx.fail(std::string(what) + " needs " + std::to_string(bytes) +
             " bytes of shared memory (head_dim * state_size too large), the device has " +
             std::to_string(limit));
  cudaError_t error = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (error != cudaSuccess)
    ctx.fail(std::string(what) + ": " + cudaGetErrorString(error));
}

/// conv + SiLU (pre optional), time steps and the forward scan, on ctx.stream.
void launchTrace(const KernelContext &ctx, const Mamba2Shape &s, const Mamba2Inputs &in, float *pre, float *act,
                 float *dt, float *y) {
  cudaStream_t stream = streamOf(ctx);
  convKernel<<<elementBlocks(s.tokens * s.channels), kThreads, 0, stream>>>(s, in, pre, act);
  checkLaunch(ctx, "mamba2 conv");
  timeStepKernel<<<elementBlocks(s.tokens * s.heads), kThreads, 0, stream>>>(s, in, dt);
  checkLaunch(ctx, "mamba2 time steps");
  size_t shared = scanForwardShared(s);
  allowShared(ctx, reinterpret_cast<const void *>(scanForwardKernel), shared, "mamba2 scan");
  scanForwardKernel<<<static_cast<unsigned>(s.batch * s.heads), kThreads, shared, stream>>>(s, in, act, dt, y);
  checkLaunch(ctx, "mamba2 scan");
}

void mamba2Forward(KernelContext &ctx) {
  std::vector<int64_t> present;
  Mamba2Shape s = readShape(ctx, ctx.inputs.size(), present, kRules);
  if (ctx.outputs.size() != 1)
    ctx.fail("expected one output, got " + std::to_string(ctx.outputs.size()));
  ctx.expectShape(ctx.out(0), "result", {s.tokens, s.inner});
  expectFloat(ctx, ctx.out(0), "result", kRules);
  Mamba2Inputs in = readInputs(ctx, present);
  cudaStream_t stream = streamOf(ctx);

  Scratch scratch(stream);
  size_t oAct = scratch.reserve(4 * s.tokens * s.channels), oDt = scratch.reserve(4 * s.tokens * s.heads),
         oY = scratch.reserve(4 * s.tokens * s.inner);
  scratch.allocate(ctx);
  float *act = scratch.at<float>(oAct), *dt = scratch.at<float>(oDt), *y = scratch.at<float>(oY);

  launchTrace(ctx, s, in, nullptr, act, dt, y);
  normForwardKernel<<<static_cast<unsigned>(s.tokens * s.groups), normThreads(s), 0, stream>>>(
      s, in, y, floatOut(ctx.out(0)));
  checkLaunch(ctx, "mamba2 gated norm");
}

void mamba2Backward(KernelContext &ctx) {
  // Inputs: the forward operands, then the gradient of the one result.
  std::vector<int64_t> present;
  Mamba2Shape s = readBackwardShape(ctx, present, kRules);
  const TensorRef &gradOut = ctx.inputs.back();
  Mamba2Inputs in = readInputs(ctx, present);
  FloatIn gOut = floatIn(gradOut);
  // Each gradient goes to its output when asked for; the kernels skip the others.
  auto gradFor = [&](int op) -> FloatOut {
    int64_t out = present[op] < 0 ? -1 : ctx.gradOutputFor(present[op]);
    return out >= 0 ? floatOut(ctx.out(out)) : FloatOut{};
  };
  FloatOut gZxbcdt = gradFor(Zxbcdt), gWeight = gradFor(ConvWeight), gBias = gradFor(ConvBias),
           gDtBias = gradFor(DtBias), gALog = gradFor(ALog), gDSkip = gradFor(DSkip),
           gNorm = gradFor(NormWeight);
  cudaStream_t stream = streamOf(ctx);
  const int64_t T = s.tokens, stateSize = s.headDim * s.state, tasks = s.batch * s.heads;

  Scratch scratch(stream);
  size_t oPre = scratch.reserve(4 * T * s.channels), oAct = scratch.reserve(4 * T * s.channels),
         oGAct = scratch.reserve(4 * T * s.channels), oDt = scratch.reserve(4 * T * s.heads),
         oGDt = scratch.reserve(4 * T * s.heads), oY = scratch.reserve(4 * T * s.inner),
         oGy = scratch.reserve(4 * T * s.inner), oNormed = scratch.reserve(4 * T * s.inner),
         oGB = scratch.reserve(4 * T * s.heads * s.state), oGC = scratch.reserve(4 * T * s.heads * s.state),
         oGA = scratch.reserve(8 * tasks), oGD = scratch.reserve(8 * tasks),
         oCheckpoints = scratch.reserve(4 * tasks * s.numChunks() * stateSize),
         oStates = scratch.reserve(4 * tasks * s.chunkLen() * stateSize);
  size_t shared = scanBackwardShared(s);
  allowShared(ctx, reinterpret_cast<const void *>(scanBackwardKernel), shared, "mamba2 backward scan");
  scratch.allocate(ctx);
  float *pre = scratch.at<float>(oPre), *act = scratch.at<float>(oAct), *gAct = scratch.at<float>(oGAct),
        *dt = scratch.at<float>(oDt), *gDt = scratch.at<float>(oGDt), *y = scratch.at<float>(oY),
        *gy = scratch.at<float>(oGy), *normed = scratch.at<float>(oNormed), *gBHead = scratch.at<float>(oGB),
        *gCHead = scratch.at<float>(oGC), *checkpoints = scratch.at<float>(oCheckpoints),
        *states = scratch.at<float>(oStates);
  double *gASeq = scratch.at<double>(oGA), *gDSeq = scratch.at<double>(oGD);

  launchTrace(ctx, s, in, pre, act, dt, y);

  normBackwardKernel<<<static_cast<unsigned>(T * s.groups), normThreads(s), 0, stream>>>(s, in, y, gOut, gy,
                                                                                           normed, gZxbcdt);
  checkLaunch(ctx, "mamba2 gated norm backward");
  if (gNorm.data) {
    normWeightGradKernel<<<elementBlocks(s.inner), kThreads, 0, stream>>>(s, gOut, normed, gNorm);
    checkLaunch(ctx, "mamba2 norm_weight gradient");
  }

  scanBackwardKernel<<<static_cast<unsigned>(tasks), kThreads, shared, stream>>>(
      s, in, act, dt, gy, checkpoints, states, gAct, gBHead, gCHead, gDt, gASeq, gDSeq);
  checkLaunch(ctx, "mamba2 backward scan");

  activationGradKernel<<<elementBlocks(T * s.channels), kThreads, 0, stream>>>(s, pre, gBHead, gCHead, gAct);
  checkLaunch(ctx, "mamba2 activation gradient");
  if (gZxbcdt.data) {
    convInputGradKernel<<<elementBlocks(T * s.channels), kThreads, 0, stream>>>(s, in, gAct, gZxbcdt);
    checkLaunch(ctx, "mamba2 conv input gradient");
  }
  if (gWeight.data || gBias.data) {
    convParamGradKernel<<<elementBlocks((s.kernel + 1) * s.channels), kThreads, 0, stream>>>(s, in, gAct, gWeight,
                                                                                             gBias);
    checkLaunch(ctx, "mamba2 conv parameter gradients");
  }
  headGradKernel<<<static_cast<unsigned>(s.heads), kThreads, 0, stream>>>(s, in, gDt, gASeq, gDSeq, gZxbcdt,
                                                                           gDtBias, gALog, gDSkip);
  checkLaunch(ctx, "mamba2 dt / a_log / d_skip gradients");
}

} // namespace

void registerMambaKernels(KernelRegistry &registry) {
  registry.add("mamba2", mamba2Forward);
  registry.add("mamba2.backward", mamba2Backward);
}

} // namespace moec::runtime::cuda
