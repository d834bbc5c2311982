//===- DeltaRule.cu - the gated delta rule on the GPU, recurrent form -------===//
//
// The recurrent form of cpu/linear_attention/DeltaRule.cpp, token by token:
// the simple, obviously-correct form, kept as the fallback of the chunked one
// (ChunkedDeltaRule.cu) and the only form of KDA's per-channel decay. The
// state S of one (sequence, value head) is [dk, dv] f32 in shared memory;
// thread j owns column j of S: the delta rule never mixes columns of S in the
// forward (m_j = sum_i S_ij k_i, u_j = beta (v_j - m_j), S_:j += k u_j,
// o_j = sum_i S_ij q_i), so a column needs no other thread. Dot products
// accumulate in double.
//
// Forward: grid (sequences * heads, ceil(dv / 32)), 32 threads (one per
// column), shared memory (32 * dk + 3 * dk) floats.
//
// Backward: one block per (sequence, value head), roundUp(dv, 32) <= 512 threads;
// shared memory holds the state (reused for P = Diag(d) S_prev in the reverse
// pass) and its gradient dS, both [dk, dv] f32 with an odd row stride (no bank
// conflicts when threads walk rows), plus per-token vectors:
//   bytes = 4 * (2 * dk * ld + 3 * dk) + 8 * 4 * dv,  ld = dv | 1
// (134.5 KiB at dk = dv = 128, allowed with cudaFuncAttributeMaxDynamicSharedMemorySize;
// the H200 opt-in limit is 227 KiB, so dk = dv = 128 fits, 192 does not).
// Per token in reverse: a column phase (thread j: P_:j, m_j, e_j, u_j,
// dS_:j += q dO_j, du_j, dv_j), a row phase (thread i: dq_i, dk_i, dg_i
// summed over the columns in order), then dS = Diag(d) (dS + k dm^T).
// The states are recomputed from checkpoints every chunk = ceil(sqrt(seqLen))
// tokens, as on the CPU; global scratch (cudaMallocAsync on ctx.stream):
//   4 * sequences * heads * (numChunks + chunk) * dk * dv bytes
// (~ 4 * T * heads * dk * dv * 2 / sqrt(seqLen): 512 MiB for 2 x 4096 tokens,
// 32 heads, dk = dv = 128).
//
//===----------------------------------------------------------------------===//

#include <algorithm>
#include <cmath>

#include "runtime/kernels/cuda/linear_attention/LinearAttentionCommon.cuh"

namespace moec::runtime::cuda::linattn {

namespace {

constexpr int kForwardColumns = 32;
// One thread per value column in the backward; the bound keeps its registers below 128.
constexpr int kMaxBackwardThreads = 512;

__device__ __forceinline__ float decayOf(const DeltaRule &a, int64_t t, int64_t h, int64_t i) {
  return expf(a.channelDecay ? a.logDecay[(t * a.heads + h) * a.dk + i] : a.logDecay[t * a.heads + h]);
}

/// Loads k_t (and q_t) of key head kh and the decay of head h into shared memory.
__device__ __forceinline__ void loadToken(const DeltaRule &a, int64_t t, int64_t h, int64_t kh, float *ks,
                                          float *qs, float *ds) {
  for (int64_t i = threadIdx.x; i < a.dk; i += blockDim.x) {
    ks[i] = a.k[(t * a.keyHeads + kh) * a.dk + i];
    if (qs)
      qs[i] = a.q[(t * a.keyHeads + kh) * a.dk + i];
    ds[i] = decayOf(a, t, h, i);
  }
}

/// Advances column `col` (stride `ld`) of the state over token t; returns u_j.
__device__ __forceinline__ double stepColumn(const DeltaRule &a, int64_t t, int64_t h, int64_t j, float *col,
                                             int64_t ld, const float *ks, const float *ds) {
  double m = 0;
  for (int64_t i = 0; i < a.dk; ++i) {
    float s = col[i * ld] * ds[i];
    col[i * ld] = s;
    m += static_cast<double>(s) * ks[i];
  }
  double u = a.beta[t * a.heads + h] * (a.v[t * a.vLd + a.vOff + h * a.dv + j] - m);
  for (int64_t i = 0; i < a.dk; ++i)
    col[i * ld] = static_cast<float>(col[i * ld] + ks[i] * u);
  return u;
}

__global__ void deltaForwardKernel(DeltaRule a, float *o) {
  extern __shared__ float smem[];
  const int cols = blockDim.x;
  float *S = smem; // [dk, cols]
  float *ks = S + a.dk * cols, *qs = ks + a.dk, *ds = qs + a.dk;
  int64_t b = blockIdx.x / a.heads, h = blockIdx.x % a.heads, kh = h / (a.heads / a.keyHeads);
  int64_t j = static_cast<int64_t>(blockIdx.y) * cols + threadIdx.x;
  bool live = j < a.dv;
  float *col = S + threadIdx.x;
  for (int64_t i = 0; i < a.dk; ++i)
    col[i * cols] = 0.0f;
  for (int64_t t = b * a.seqLen; t < (b + 1) * a.seqLen; ++t) {
    __syncthreads(); // every thread is done with the previous token's vectors
    loadToken(a, t, h, kh, ks, qs, ds);
    __syncthreads();
    if (!live)
      continue;
    stepColumn(a, t, h, j, col, cols, ks, ds);
    double out = 0;
    for (int64_t i = 0; i < a.dk; ++i)
      out += static_cast<double>(col[i * cols]) * qs[i];
    o[(t * a.heads + h) * a.dv + j] = static_cast<float>(out);
  }
}

struct BackwardArgs {
  DeltaRule a;
  const float *dO;
  DeltaRuleGrads g;
  int64_t chunk, numChunks, ld;
  float *checkpoints; // [sequences * heads, numChunks, dk, dv]
  float *states;      // [sequences * heads, chunk, dk, dv]
};

__global__ void __launch_bounds__(kMaxBackwardThreads) deltaBackwardKernel(BackwardArgs p) {
  extern __shared__ double dsmem[];
  const DeltaRule &a = p.a;
  const int64_t dk = a.dk, dv = a.dv, H = a.heads, ld = p.ld, nt = blockDim.x;
  double *uS = dsmem, *dOS = uS + dv, *dmS = dOS + dv, *beS = dmS + dv; // per column
  float *S = reinterpret_cast<float *>(beS + dv);                       // [dk, ld]: S, then P
  float *dS = S + dk * ld;                                              // [dk, ld]
  float *ks = dS + dk * ld, *qs = ks + dk, *ds = qs + dk;

  int64_t b = blockIdx.x / H, h = blockIdx.x % H, kh = h / (H / a.keyHeads);
  int64_t j = threadIdx.x, first = b * a.seqLen;
  bool live = j < dv;
  size_t slab = static_cast<size_t>(dk) * dv;
  float *checkpoints = p.checkpoints + blockIdx.x * p.numChunks * slab;
  float *states = p.states + blockIdx.x * p.chunk * slab;
  float *col = S + j, *dcol = dS + j;

  if (live)
    for (int64_t i = 0; i < dk; ++i) {
      col[i * ld] = 0.0f;
      dcol[i * ld] = 0.0f; // gradient of the state after the current token
    }
  // Checkpoints: the state before each chunk's first token.
  for (int64_t c = 0; c < p.numChunks; ++c) {
    int64_t c0 = first + c * p.chunk, c1 = min(c0 + p.chunk, first + a.seqLen);
    if (live)
      for (int64_t i = 0; i < dk; ++i)
        checkpoints[(c * dk + i) * dv + j] = col[i * ld];
    for (int64_t t = c0; t < c1; ++t) {
      __syncthreads();
      loadToken(a, t, h, kh, ks, nullptr, ds);
      __syncthreads();
      if (live)
        stepColumn(a, t, h, j, col, ld, ks, ds);
    }
  }
  for (int64_t c = p.numChunks - 1; c >= 0; --c) {
    int64_t c0 = first + c * p.chunk, c1 = min(c0 + p.chunk, first + a.seqLen);
    // The states before each token of the chunk, from its checkpoint.
    if (live)
      for (int64_t i = 0; i < dk; ++i)
        col[i * ld] = checkpoints[(c * dk + i) * dv + j];
    for (int64_t t = c0; t < c1; ++t) {
      if (live)
        for (int64_t i = 0; i < dk; ++i)
          states[((t - c0) * dk + i) * dv + j] = col[i * ld];
      __syncthreads();
      loadToken(a, t, h, kh, ks, nullptr, ds);
      __syncthreads();
      if (live)
        stepColumn(a, t, h, j, col, ld, ks, ds);
    }
    for (int64_t t = c1 - 1; t >= c0; --t) {
      __syncthreads();
      loadToken(a, t, h, kh, ks, qs, ds);
      __syncthreads();
      // Column phase: P = Diag(d) S_prev, e = v - P^T k, u = beta e; o = (P + k u^T)^T q.
      if (live) {
        const float *prev = states + (t - c0) * slab;
        double m = 0;
        for (int64_t i = 0; i < dk; ++i) {
          float P = ds[i] * prev[i * dv + j];
          col[i * ld] = P;
          m += static_cast<double>(P) * ks[i];
        }
        double beta = a.beta[t * H + h];
        double e = a.v[t * a.vLd + a.vOff + h * dv + j] - m, u = beta * e;
        double dOj = p.dO[(t * H + h) * dv + j], du = 0;
        for (int64_t i = 0; i < dk; ++i) {
          float x = static_cast<float>(dcol[i * ld] + qs[i] * dOj);
          dcol[i * ld] = x;
          du += static_cast<double>(x) * ks[i];
        }
        p.g.v[t * p.g.vLd + p.g.vOff + h * dv + j] = static_cast<float>(beta * du);
        uS[j] = u;
        dOS[j] = dOj;
        dmS[j] = -beta * du;
        beS[j] = du * e;
      }
      __syncthreads();
      // Row phase: sums over the columns, in column order.
      for (int64_t i = threadIdx.x; i < dk; i += nt) {
        const float *Prow = S + i * ld, *dSrow = dS + i * ld;
        double ki = ks[i], gq = 0, gk = 0, gg = 0;
        for (int64_t jj = 0; jj < dv; ++jj) {
          double P = Prow[jj], x = dSrow[jj];
          gq += (P + ki * uS[jj]) * dOS[jj];
          gk += x * uS[jj] + P * dmS[jj];
          gg += (x + ki * dmS[jj]) * P;
        }
        int64_t at = (t * H + h) * dk + i;
        p.g.q[at] = static_cast<float>(gq);
        p.g.k[at] = static_cast<float>(gk);
        p.g.logDecay[at] = static_cast<float>(gg);
      }
      if (threadIdx.x == 0) {
        double sum = 0;
        for (int64_t jj = 0; jj < dv; ++jj)
          sum += beS[jj];
        p.g.beta[t * H + h] = static_cast<float>(sum);
      }
      __syncthreads();
      // dS_prev = Diag(d) (dS + k dm^T).
      if (live) {
        double dm = dmS[j];
        for (int64_t i = 0; i < dk; ++i)
          dcol[i * ld] = static_cast<float>(ds[i] * (dcol[i * ld] + ks[i] * dm));
      }
    }
  }
}

} // namespace

void deltaRuleForward(const KernelContext &ctx, const DeltaRule &rule, float *o) {
  int64_t sequences = rule.tokens / rule.seqLen;
  if (sequences * rule.heads == 0)
    return;
  size_t bytes = sizeof(float) * static_cast<size_t>(kForwardColumns * rule.dk + 3 * rule.dk);
  allowSharedBytes(ctx, reinterpret_cast<const void *>(deltaForwardKernel), bytes, "the delta rule");
  dim3 grid(static_cast<unsigned>(sequences * rule.heads), blocksFor(rule.dv, kForwardColumns));
  deltaForwardKernel<<<grid, kForwardColumns, bytes, streamOf(ctx)>>>(rule, o);
  checkLaunch(ctx, "delta rule");
}

void deltaRuleBackward(const KernelContext &ctx, Scratch &scratch, const DeltaRule &rule, const float *dO,
                       const DeltaRuleGrads &grads) {
  int64_t sequences = rule.tokens / rule.seqLen;
  if (sequences * rule.heads == 0)
    return;
  int64_t threads = (rule.dv + 31) / 32 * 32;
  if (threads > kMaxBackwardThreads)
    ctx.fail("value_head_dim " + std::to_string(rule.dv) + " is above " +
             std::to_string(kMaxBackwardThreads) + " (the backward runs one thread per value column)");
  BackwardArgs p;
  p.a = rule;
  p.dO = dO;
  p.g = grads;
  p.chunk =
      std::max<int64_t>(1, static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(rule.seqLen)))));
  p.numChunks = (rule.seqLen + p.chunk - 1) / p.chunk;
  p.ld = rule.dv | 1;
  size_t slab = static_cast<size_t>(rule.dk * rule.dv) * sizeof(float);
  size_t blocks = static_cast<size_t>(sequences * rule.heads);
  p.checkpoints = static_cast<float *>(scratch.bytes(blocks * p.numChunks * slab));
  p.states = static_cast<float *>(scratch.bytes(blocks * p.chunk * slab));
  size_t bytes = sizeof(double) * 4 * rule.dv + sizeof(float) * (2 * rule.dk * p.ld + 3 * rule.dk);
  allowSharedBytes(ctx, reinterpret_cast<const void *>(deltaBackwardKernel), bytes,
                   "the delta rule backward");
  deltaBackwardKernel<<<static_cast<unsigned>(blocks), static_cast<unsigned>(threads), bytes,
                        streamOf(ctx)>>>(p);
  checkLaunch(ctx, "delta rule backward");
}

} // namespace moec::runtime::cuda::linattn
