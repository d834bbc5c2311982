//===- ChunkedDeltaRule.cu - the gated delta rule in chunks on the GPU -------===//
//
// ChunkedDeltaRule.h's driver (the math is there) with device primitives,
// one kernel each, the twins of ChunkedReference.cpp's loops:
//
//   packRows / unpackRows   one warp per row (token-major <-> packed chunks)
//   packDecay               one thread per chunk: gam = cumulative sum of g, in double
//   gemm                    cuBLAS strided batched (cublasGemmStridedBatchedEx, f32
//                           operands, CUBLAS_COMPUTE_32F: no TF32), one batch entry per chunk
//   lowerDecay              one block per chunk, decay factors from the double gam
//   rowScale                one warp per row, its factor from the double gam
//   invertUnitLower         one block of 64 threads per chunk, thread j solves column j
//                           of (I + A) T = I by forward substitution (f32, shared memory)
//   sweep                   the sequential pass (below)
//   rowScalars              one block of 256 threads per chunk (8 warps, a row per warp
//                           at a time), double sums in a fixed order
//
// The sweep: grid (ceil(dv / 32), sequences * heads), 256 threads. A block
// owns 32 value columns of one task's state S [dk, 32], f32, in registers:
// thread (rg = tid / 16, cg = tid % 16) holds rows rg + 16 i (i < NK) of
// columns 2 cg, 2 cg + 1. Per chunk it stages m1, m2 ([64, dk], zero-padded to
// 16 NK columns, odd row stride) and S in shared memory, computes
// E = a0 + s1 m1 S (4 rows x 2 columns per thread), then
// S = exp(gam_L) S + y + s2 m2^T E. Shared memory 4 (2 * 64 (16 NK + 1) + 16 NK * 32
// + 64 * 32) bytes: 90.6 KiB at dk = 128 (NK = 8), 172.5 KiB at dk = 256.
//
// Scratch (stream-ordered, freed when the launch returns), T tokens, H value
// heads, rows = T rounded up to 64 per sequence, times H: the forward keeps
// about rows * (6 dk + 4 dv + 4 * 64) + (rows / 64) dk dv floats (~1.0 GiB
// at 4096 tokens, 32 heads, dk = dv = 128); the backward as much again.
//
//===----------------------------------------------------------------------===//

#include <atomic>
#include <cmath>

#include "runtime/kernels/cuda/CudaGemm.h"
#include "runtime/kernels/cuda/linear_attention/DeltaRulePath.h"
#include "runtime/kernels/cuda/linear_attention/LinearAttentionCommon.cuh"

namespace moec::runtime::cuda::linattn {

namespace {

using chunked::Dims;
using chunked::RowFactor;
using chunked::ScalarArgs;
using chunked::SweepArgs;

constexpr int kChunk = 64;
constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kSweepThreads = 256, kSweepCols = 32;
constexpr int64_t kMaxKeyDim = 256; // the sweep keeps 16 * NK <= 256 key rows

std::atomic<int> pathSetting{static_cast<int>(DeltaRulePath::Auto)};

__device__ __forceinline__ double warpSumD(double v) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

/// The packed row of this warp (kWarps rows per block of kThreads), and its lane.
__device__ __forceinline__ int64_t warpRow(int *lane) {
  *lane = threadIdx.x % 32;
  return blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32;
}

// Element-wise kernels go a row (a warp) at a time: the index arithmetic (64-bit
// divisions) once per row, the lanes along the row.
__global__ void packRowsKernel(Dims d, const float *src, int64_t ld, int64_t off, int64_t headDiv,
                               int64_t width, float *dst) {
  int lane = 0;
  int64_t row = warpRow(&lane);
  if (row >= d.rows())
    return;
  int64_t h = 0, t = d.tokenOf(row, &h);
  float *out = dst + row * width;
  if (t < 0) {
    for (int64_t j = lane; j < width; j += 32)
      out[j] = 0.0f;
    return;
  }
  const float *in = src + t * ld + off + (h / headDiv) * width;
  for (int64_t j = lane; j < width; j += 32)
    out[j] = in[j];
}

__global__ void packDecayKernel(Dims d, const float *g, double *gam) {
  int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= d.blocks())
    return;
  double sum = 0;
  for (int64_t i = 0; i < d.chunk; ++i) {
    int64_t row = c * d.chunk + i, h = 0, t = d.tokenOf(row, &h);
    if (t >= 0)
      sum += static_cast<double>(g[t * d.heads + h]);
    gam[row] = sum;
  }
}

/// One warp per (token, value head).
__global__ void unpackRowsKernel(Dims d, const float *src, int64_t width, float *dst, int64_t ld,
                                 int64_t off) {
  int lane = 0;
  int64_t pair = warpRow(&lane);
  if (pair >= d.tokens() * d.heads)
    return;
  int64_t t = pair / d.heads, h = pair % d.heads;
  const float *in = src + d.rowOf(t, h) * width;
  float *out = dst + t * ld + off + h * width;
  for (int64_t j = lane; j < width; j += 32)
    out[j] = in[j];
}

/// One block per chunk.
__global__ void lowerDecayKernel(Dims d, const double *gam, const float *beta, bool strict, const float *src,
                                 float *dst) {
  const int C = static_cast<int>(d.chunk);
  const int64_t c = blockIdx.x, base = c * C * C;
  const double *g = gam + c * C;
  for (int e = threadIdx.x; e < C * C; e += blockDim.x) {
    int t = e / C, s = e % C;
    bool keep = strict ? s < t : s <= t;
    float out = 0.0f;
    if (keep) {
      double f = beta ? static_cast<double>(beta[c * C + t]) : 1.0;
      out = static_cast<float>(static_cast<double>(src[base + e]) * f * exp(g[t] - g[s]));
    }
    dst[base + e] = out;
  }
}

// Thread j: T_jj = 1, T_ij = -sum_l A_il T_lj for i > j (T_lj = 0 for l < j, so the
// sum over l < i adds exact zeros first: the same value as the host's l >= j).
__global__ void __launch_bounds__(kChunk) invertUnitLowerKernel(const float *a, float *t) {
  __shared__ float as[kChunk][kChunk + 1], ts[kChunk][kChunk + 1];
  const float *A = a + blockIdx.x * static_cast<int64_t>(kChunk * kChunk);
  float *T = t + blockIdx.x * static_cast<int64_t>(kChunk * kChunk);
  const int j = threadIdx.x;
  for (int idx = j; idx < kChunk * kChunk; idx += kChunk)
    as[idx / kChunk][idx % kChunk] = A[idx];
  for (int i = 0; i < kChunk; ++i)
    ts[i][j] = i == j ? 1.0f : 0.0f;
  __syncthreads();
  for (int i = 1; i < kChunk; ++i) {
    float sum = 0.0f;
    for (int l = 0; l < i; ++l)
      sum += as[i][l] * ts[l][j];
    if (i > j)
      ts[i][j] = -sum;
  }
  __syncthreads();
  for (int idx = j; idx < kChunk * kChunk; idx += kChunk)
    T[idx] = ts[idx / kChunk][idx % kChunk];
}

__global__ void rowScaleKernel(Dims d, RowFactor factor, const double *gam, const float *beta,
                               const float *src, int64_t width, bool accumulate, float *dst) {
  int lane = 0;
  int64_t row = warpRow(&lane);
  if (row >= d.rows())
    return;
  double f = 0;
  switch (factor) {
  case RowFactor::Beta:
    f = beta[row];
    break;
  case RowFactor::Gamma:
    f = exp(gam[row]);
    break;
  case RowFactor::BetaGamma:
    f = static_cast<double>(beta[row]) * exp(gam[row]);
    break;
  case RowFactor::ToEnd:
    f = exp(gam[(row / d.chunk) * d.chunk + d.chunk - 1] - gam[row]);
    break;
  }
  const float scale = static_cast<float>(f);
  const float *in = src + row * width;
  float *out = dst + row * width;
  for (int64_t j = lane; j < width; j += 32) {
    float x = scale * in[j];
    out[j] = accumulate ? out[j] + x : x;
  }
}

template <int NK> constexpr size_t sweepSharedBytes() {
  return sizeof(float) * (2 * kChunk * (16 * NK + 1) + 16 * NK * kSweepCols + kChunk * kSweepCols);
}

template <int NK> __global__ void __launch_bounds__(kSweepThreads) sweepKernel(Dims d, SweepArgs<float> a) {
  extern __shared__ float smem[];
  constexpr int C = kChunk, KP = 16 * NK, LD = KP + 1;
  float *m1s = smem, *m2s = m1s + C * LD, *ss = m2s + C * LD, *es = ss + KP * kSweepCols;
  const int64_t dk = d.dk, dv = d.dv, N = d.chunks(), task = blockIdx.y;
  const int tid = threadIdx.x, cg = tid % 16, rg = tid / 16;
  const int64_t col = blockIdx.x * static_cast<int64_t>(kSweepCols) + 2 * cg; // this thread's first column

  float sr[NK][2]; // S rows rg + 16 i, columns col, col + 1
#pragma unroll
  for (int i = 0; i < NK; ++i)
    sr[i][0] = sr[i][1] = 0.0f;

  for (int64_t step = 0; step < N; ++step) {
    const int64_t c = task * N + (a.reverse ? N - 1 - step : step);
    const float *m1 = a.m1 + c * C * dk, *m2 = a.m2 + c * C * dk;
    __syncthreads(); // the previous chunk is done with the shared tiles
#pragma unroll 8
    for (int idx = tid; idx < C * KP; idx += kSweepThreads) {
      int r = idx / KP, kk = idx % KP;
      bool in = kk < dk;
      m1s[r * LD + kk] = in ? m1[r * dk + kk] : 0.0f;
      m2s[r * LD + kk] = in ? m2[r * dk + kk] : 0.0f;
    }
    float *states = a.states + c * dk * dv;
#pragma unroll
    for (int i = 0; i < NK; ++i) {
      int k = rg + 16 * i;
      *reinterpret_cast<float2 *>(ss + k * kSweepCols + 2 * cg) = make_float2(sr[i][0], sr[i][1]);
      if (k < dk)
        for (int j = 0; j < 2; ++j)
          if (col + j < dv)
            states[k * dv + col + j] = sr[i][j];
    }
    __syncthreads();

    // E = a0 + s1 m1 S, rows rg + 16 i.
    float acc[4][2] = {};
    for (int k = 0; k < dk; ++k) {
      float2 s = *reinterpret_cast<const float2 *>(ss + k * kSweepCols + 2 * cg);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float m = m1s[(rg + 16 * i) * LD + k];
        acc[i][0] += m * s.x;
        acc[i][1] += m * s.y;
      }
    }
    const float *a0 = a.a0 + c * C * dv;
    float *e = a.e + c * C * dv;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      int r = rg + 16 * i;
      float x[2] = {0.0f, 0.0f};
      for (int j = 0; j < 2; ++j)
        if (col + j < dv) {
          x[j] = a0[r * dv + col + j] + a.s1 * acc[i][j];
          e[r * dv + col + j] = x[j];
        }
      *reinterpret_cast<float2 *>(es + r * kSweepCols + 2 * cg) = make_float2(x[0], x[1]);
    }
    __syncthreads();

    // S = exp(gam_L) S + y + s2 m2^T E.
    float acc2[NK][2] = {};
    for (int r = 0; r < C; ++r) {
      float2 x = *reinterpret_cast<const float2 *>(es + r * kSweepCols + 2 * cg);
#pragma unroll
      for (int i = 0; i < NK; ++i) {
        float m = m2s[r * LD + rg + 16 * i];
        acc2[i][0] += m * x.x;
        acc2[i][1] += m * x.y;
      }
    }
    const float decay = static_cast<float>(exp(a.gam[c * C + C - 1]));
    const float *y = a.y ? a.y + c * dk * dv : nullptr;
#pragma unroll
    for (int i = 0; i < NK; ++i) {
      int k = rg + 16 * i;
      for (int j = 0; j < 2; ++j) {
        float yv = y && k < dk && col + j < dv ? y[k * dv + col + j] : 0.0f;
        sr[i][j] = decay * sr[i][j] + yv + a.s2 * acc2[i][j];
      }
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    rowScalarsKernel(Dims d, ScalarArgs<float> a, float *dBeta, float *dg) {
  constexpr int C = kChunk;
  __shared__ double dGam[C], rhoS[C], partial[kWarps];
  const int64_t c = blockIdx.x, dk = d.dk, dv = d.dv, kv = dk * dv;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const double *gam = a.gam + c * C;
  const double last = gam[C - 1];
  const float *P = a.p + c * C * C, *dP = a.dp + c * C * C, *A = a.a + c * C * C, *dA = a.da + c * C * C;
  const float *KK = a.kk + c * C * C;
  for (int t = warp; t < C; t += kWarps) {
    const int64_t row = c * C + t;
    double qdq = 0, kdkd = 0, kdkg = 0, vdvb = 0, rowZ = 0, colZ = 0, rowY = 0, colY = 0, rowB = 0;
    for (int64_t i = lane; i < dk; i += 32) {
      double k = a.k[row * dk + i];
      qdq += static_cast<double>(a.q[row * dk + i]) * a.dqg[row * dk + i];
      kdkd += k * a.dkd[row * dk + i];
      kdkg += k * a.dkg[row * dk + i];
    }
    for (int64_t j = lane; j < dv; j += 32)
      vdvb += static_cast<double>(a.v[row * dv + j]) * a.dvb[row * dv + j];
    for (int s = lane; s < C; s += 32) {
      if (s <= t)
        rowZ += static_cast<double>(dP[t * C + s]) * P[t * C + s];
      if (s >= t)
        colZ += static_cast<double>(dP[s * C + t]) * P[s * C + t];
      if (s < t) {
        rowY += static_cast<double>(dA[t * C + s]) * A[t * C + s];
        rowB += static_cast<double>(dA[t * C + s]) * KK[t * C + s] * exp(gam[t] - gam[s]);
      }
      if (s > t)
        colY += static_cast<double>(dA[s * C + t]) * A[s * C + t];
    }
    qdq = warpSumD(qdq);
    kdkd = warpSumD(kdkd);
    kdkg = warpSumD(kdkg);
    vdvb = warpSumD(vdvb);
    rowZ = warpSumD(rowZ);
    colZ = warpSumD(colZ);
    rowY = warpSumD(rowY);
    colY = warpSumD(colY);
    rowB = warpSumD(rowB);
    if (lane == 0) {
      double G = exp(gam[t]), beta = a.beta[row], rho = exp(last - gam[t]) * kdkd;
      rhoS[t] = rho;
      dBeta[row] = static_cast<float>(vdvb + G * kdkg + rowB);
      dGam[t] = G * qdq - rho + beta * G * kdkg + rowZ - colZ + rowY - colY;
    }
  }
  // <S, dS_next> of the chunk.
  const float *S = a.states + c * kv, *dS = a.dStates + c * kv;
  double dot = 0;
  for (int64_t i = threadIdx.x; i < kv; i += kThreads)
    dot += static_cast<double>(S[i]) * dS[i];
  dot = warpSumD(dot);
  if (lane == 0)
    partial[warp] = dot;
  __syncthreads();
  if (threadIdx.x == 0) {
    double stateDot = 0, rhoSum = 0;
    for (int w = 0; w < kWarps; ++w)
      stateDot += partial[w];
    for (int t = 0; t < C; ++t)
      rhoSum += rhoS[t];
    dGam[C - 1] += rhoSum + exp(last) * stateDot;
    double sum = 0;
    for (int t = C - 1; t >= 0; --t) {
      sum += dGam[t];
      dg[c * C + t] = static_cast<float>(sum);
    }
  }
}

/// The driver's primitives on ctx.stream; buffers from `scratch`.
struct DeviceOps {
  const KernelContext &ctx;
  Scratch &scratch;

  template <typename T> T *alloc(int64_t n) {
    return static_cast<T *>(scratch.bytes(static_cast<size_t>(n) * sizeof(T)));
  }

  void packRows(const Dims &d, const float *src, int64_t ld, int64_t off, int64_t headDiv, int64_t width,
                float *dst) {
    packRowsKernel<<<gridFor(d.rows(), kWarps), kThreads, 0, streamOf(ctx)>>>(d, src, ld, off, headDiv, width,
                                                                              dst);
    checkLaunch(ctx, "chunked delta rule (pack)");
  }

  void packDecay(const Dims &d, const float *g, double *gam) {
    packDecayKernel<<<gridFor(d.blocks(), kThreads), kThreads, 0, streamOf(ctx)>>>(d, g, gam);
    checkLaunch(ctx, "chunked delta rule (decay)");
  }

  void unpackRows(const Dims &d, const float *src, int64_t width, float *dst, int64_t ld, int64_t off) {
    unpackRowsKernel<<<gridFor(d.tokens() * d.heads, kWarps), kThreads, 0, streamOf(ctx)>>>(d, src, width,
                                                                                            dst, ld, off);
    checkLaunch(ctx, "chunked delta rule (unpack)");
  }

  void gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
            int64_t lda, int64_t strideA, const float *b, int64_t ldb, int64_t strideB, float beta, float *c,
            int64_t ldc, int64_t strideC, int64_t batch) {
    gemmStridedBatched(ctx, transA, transB, m, n, k, alpha, a, lda, strideA, b, ldb, strideB, plan::F32, beta,
                       c, ldc, strideC, plan::F32, batch);
  }

  void lowerDecay(const Dims &d, const double *gam, const float *beta, bool strict, const float *src,
                  float *dst) {
    lowerDecayKernel<<<static_cast<unsigned>(d.blocks()), kThreads, 0, streamOf(ctx)>>>(d, gam, beta, strict,
                                                                                        src, dst);
    checkLaunch(ctx, "chunked delta rule (decay mask)");
  }

  void invertUnitLower(const Dims &d, const float *a, float *t) {
    invertUnitLowerKernel<<<static_cast<unsigned>(d.blocks()), kChunk, 0, streamOf(ctx)>>>(a, t);
    checkLaunch(ctx, "chunked delta rule (triangular inverse)");
  }

  void rowScale(const Dims &d, RowFactor factor, const double *gam, const float *beta, const float *src,
                int64_t width, bool accumulate, float *dst) {
    rowScaleKernel<<<gridFor(d.rows(), kWarps), kThreads, 0, streamOf(ctx)>>>(d, factor, gam, beta, src,
                                                                              width, accumulate, dst);
    checkLaunch(ctx, "chunked delta rule (row scale)");
  }

  template <int NK> void sweepWith(const Dims &d, const SweepArgs<float> &a) {
    size_t bytes = sweepSharedBytes<NK>();
    allowSharedBytes(ctx, reinterpret_cast<const void *>(sweepKernel<NK>), bytes,
                     "the chunked delta rule's sweep");
    dim3 grid(blocksFor(d.dv, kSweepCols), static_cast<unsigned>(d.tasks()));
    sweepKernel<NK><<<grid, kSweepThreads, bytes, streamOf(ctx)>>>(d, a);
    checkLaunch(ctx, "chunked delta rule (sweep)");
  }

  void sweep(const Dims &d, const SweepArgs<float> &a) {
    if (d.dk <= 32)
      sweepWith<2>(d, a);
    else if (d.dk <= 64)
      sweepWith<4>(d, a);
    else if (d.dk <= 128)
      sweepWith<8>(d, a);
    else
      sweepWith<16>(d, a);
  }

  void rowScalars(const Dims &d, const ScalarArgs<float> &a, float *dBeta, float *dg) {
    rowScalarsKernel<<<static_cast<unsigned>(d.blocks()), kThreads, 0, streamOf(ctx)>>>(d, a, dBeta, dg);
    checkLaunch(ctx, "chunked delta rule (beta and decay gradients)");
  }
};

chunked::Problem<float> problemOf(const DeltaRule &rule) {
  chunked::Problem<float> p;
  p.dims.sequences = rule.seqLen > 0 ? rule.tokens / rule.seqLen : 0;
  p.dims.seqLen = rule.seqLen;
  p.dims.heads = rule.heads;
  p.dims.keyHeads = rule.keyHeads;
  p.dims.dk = rule.dk;
  p.dims.dv = rule.dv;
  p.dims.chunk = kChunk;
  p.q = rule.q;
  p.k = rule.k;
  p.v = rule.v;
  p.vLd = rule.vLd;
  p.vOff = rule.vOff;
  p.beta = rule.beta;
  p.g = rule.logDecay;
  return p;
}

void expectApplies(const KernelContext &ctx, const DeltaRule &rule) {
  if (!chunkedDeltaRuleApplies(rule))
    ctx.fail("the chunked delta rule needs one decay per head and key_head_dim <= " +
             std::to_string(kMaxKeyDim) + ", got key_head_dim " + std::to_string(rule.dk));
}

} // namespace

void setDeltaRulePath(DeltaRulePath path) { pathSetting.store(static_cast<int>(path)); }

DeltaRulePath deltaRulePath() { return static_cast<DeltaRulePath>(pathSetting.load()); }

bool chunkedDeltaRuleApplies(const DeltaRule &rule) {
  return !rule.channelDecay && rule.dk >= 1 && rule.dk <= kMaxKeyDim && rule.dv >= 1 && rule.keyHeads >= 1 &&
         rule.heads % rule.keyHeads == 0;
}

void chunkedDeltaRuleForward(const KernelContext &ctx, Scratch &scratch, const DeltaRule &rule, float *o,
                             ChunkedSaved &saved) {
  expectApplies(ctx, rule);
  DeviceOps ops{ctx, scratch};
  chunked::forward(ops, problemOf(rule), o, saved);
}

void chunkedDeltaRuleBackward(const KernelContext &ctx, Scratch &scratch, const DeltaRule &rule,
                              const ChunkedSaved &saved, const float *dO, const DeltaRuleGrads &grads) {
  expectApplies(ctx, rule);
  chunked::Grads<float> g;
  g.q = grads.q;
  g.k = grads.k;
  g.v = grads.v;
  g.vLd = grads.vLd;
  g.vOff = grads.vOff;
  g.beta = grads.beta;
  g.g = grads.logDecay;
  DeviceOps ops{ctx, scratch};
  chunked::backward(ops, problemOf(rule), saved, dO, g);
}

} // namespace moec::runtime::cuda::linattn
