//===- Sparse.cu - softmax attention over selected keys (sparse_attention) ===//
//
// Selection: one block per query row sorts its K index slots in shared
// memory (bitonic), drops -1, future and out-of-range keys and repeats, and
// keeps the distinct keys ascending (global key rows). For the backward the
// (key, query) pairs are sorted by key with cub's stable radix sort, so each
// key finds the queries that selected it in ascending order.
//
// Forward / statistics / dQ: one warp per (query row, head) walking its
// selected keys 4 at a time (lane c holds features c, c+32, ... of q, k, v;
// dot products are warp reductions), with an online softmax. dK/dV: one
// warp per (key row, head) walking the queries that selected the key. Only
// selected keys are visited: no dense mask. Fixed orders, no atomics.
//
//===----------------------------------------------------------------------===//

#include <cub/device/device_radix_sort.cuh>

#include <climits>

#include "runtime/kernels/cuda/attention/Core.cuh"

namespace moec::runtime::cuda::attention {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kU = 4; // keys (queries) per step

//===----------------------------------------------------------------------===//
// Selection
//===----------------------------------------------------------------------===//

constexpr int kSelectThreads = 256;

/// Ascending bitonic sort of a[0, n), n a power of two, by the whole block.
__device__ void bitonicSort(int32_t *a, int n) {
  for (int k = 2; k <= n; k <<= 1)
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < n; i += blockDim.x) {
        int ixj = i ^ j;
        if (ixj > i) {
          int32_t x = a[i], y = a[ixj];
          bool ascending = (i & k) == 0;
          if ((x > y) == ascending) {
            a[i] = y;
            a[ixj] = x;
          }
        }
      }
      __syncthreads();
    }
}

__global__ void __launch_bounds__(kSelectThreads)
    selectKernel(IndexIn indices, int64_t K, int n2, int64_t L, int32_t sentinel, int32_t *sel,
                 int32_t *count, int32_t *queries) {
  extern __shared__ int32_t keys[]; // [n2] then [n2]
  int32_t *unique = keys + n2;
  __shared__ int kept;
  const int64_t t = blockIdx.x, first = t - t % L, last = t - first;
  if (threadIdx.x == 0)
    kept = 0;
  for (int j = threadIdx.x; j < n2; j += blockDim.x) {
    int32_t v = INT_MAX;
    if (j < K) {
      int64_t s = ldIndex(indices, t * K + j);
      if (s >= 0 && s <= last) // -1, future keys (and out-of-range ones) select nothing
        v = static_cast<int32_t>(first + s);
    }
    keys[j] = v;
  }
  __syncthreads();
  bitonicSort(keys, n2);
  for (int j = threadIdx.x; j < n2; j += blockDim.x)
    unique[j] = j > 0 && keys[j] == keys[j - 1] ? INT_MAX : keys[j]; // a key counts once
  __syncthreads();
  bitonicSort(unique, n2);
  int mine = 0;
  for (int j = threadIdx.x; j < n2; j += blockDim.x)
    mine += unique[j] != INT_MAX;
  atomicAdd(&kept, mine); // an integer count: exact whatever the order
  __syncthreads();
  for (int64_t j = threadIdx.x; j < K; j += blockDim.x) {
    sel[t * K + j] = j < kept ? unique[j] : sentinel;
    if (queries)
      queries[t * K + j] = static_cast<int32_t>(t);
  }
  if (threadIdx.x == 0)
    count[t] = kept;
}

__device__ __forceinline__ int64_t lowerBound(const int32_t *a, int64_t n, int32_t v) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    int64_t mid = (lo + hi) / 2;
    if (a[mid] < v)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

//===----------------------------------------------------------------------===//
// Forward and statistics
//===----------------------------------------------------------------------===//

template <int N, bool kStats>
__global__ void __launch_bounds__(kThreads) forwardKernel(AttnParams P, SparseSel S) {
  const int lane = threadIdx.x & 31;
  const int h = blockIdx.y * kWarps + (threadIdx.x >> 5);
  if (h >= P.H)
    return; // the whole warp
  const int64_t t = blockIdx.x;
  const int g = h / P.group, d = P.dA + P.dB, dv = P.dv;
  float q[N], o[N];
#pragma unroll
  for (int c = 0; c < N; ++c) {
    const int col = lane + 32 * c;
    q[c] = col < d ? loadQ(P, t, h, col) : 0.0f;
    o[c] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const int count = S.count[t];
  const int32_t *sel = S.sel + t * S.K;
  for (int j0 = 0; j0 < count; j0 += kU) {
    int64_t srow[kU];
    float z[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      srow[u] = j0 + u < count ? sel[j0 + u] : -1;
      float part = 0.0f;
      if (srow[u] >= 0)
#pragma unroll
        for (int c = 0; c < N; ++c) {
          const int col = lane + 32 * c;
          if (col < d)
            part = fmaf(q[c], loadK(P, srow[u], g, col), part);
        }
      z[u] = part;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
#pragma unroll
      for (int u = 0; u < kU; ++u)
        z[u] += __shfl_xor_sync(kFullMask, z[u], off);
    float top = -INFINITY;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      z[u] = srow[u] >= 0 ? z[u] * P.scale : -INFINITY;
      top = fmaxf(top, z[u]);
    }
    const float mNew = fmaxf(m, top); // finite: slot j0 is selected
    const float alpha = expf(m - mNew);
    float p[kU];
    l *= alpha;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      p[u] = srow[u] >= 0 ? expf(z[u] - mNew) : 0.0f;
      l += p[u];
    }
#pragma unroll
    for (int c = 0; c < N; ++c) {
      const int col = lane + 32 * c;
      float acc = o[c] * alpha;
      if (col < dv)
#pragma unroll
        for (int u = 0; u < kU; ++u)
          if (srow[u] >= 0)
            acc = fmaf(p[u], ld(P.v, srow[u], g, col), acc);
      o[c] = acc;
    }
    m = mNew;
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f; // a row with no key outputs zero
  if (!kStats) {
#pragma unroll
    for (int c = 0; c < N; ++c) {
      const int col = lane + 32 * c;
      if (col < dv)
        st(P.out, t, h, col, o[c] * inv);
    }
    if (P.lseOut && lane == 0)
      P.lseOut[t * P.H + h] = l > 0.0f ? m + logf(l) : INFINITY;
    return;
  }
  float dot = 0.0f;
#pragma unroll
  for (int c = 0; c < N; ++c) {
    const int col = lane + 32 * c;
    if (col < dv)
      dot = fmaf(ld(P.dO, t, h, col), o[c] * inv, dot);
  }
  dot = warpSum(dot);
  if (lane == 0) {
    P.lse[t * P.H + h] = l > 0.0f ? m + logf(l) : INFINITY;
    P.D[t * P.H + h] = dot;
  }
}

//===----------------------------------------------------------------------===//
// Backward
//===----------------------------------------------------------------------===//

template <int N> __global__ void __launch_bounds__(kThreads) dqKernel(AttnParams P, SparseSel S) {
  const int lane = threadIdx.x & 31;
  const int h = blockIdx.y * kWarps + (threadIdx.x >> 5);
  if (h >= P.H)
    return;
  const int64_t t = blockIdx.x;
  const int g = h / P.group, d = P.dA + P.dB, dv = P.dv;
  float q[N], dO[N], dq[N];
#pragma unroll
  for (int c = 0; c < N; ++c) {
    const int col = lane + 32 * c;
    q[c] = col < d ? loadQ(P, t, h, col) : 0.0f;
    dO[c] = col < dv ? ld(P.dO, t, h, col) : 0.0f;
    dq[c] = 0.0f;
  }
  const float lse = P.lse[t * P.H + h], Dt = P.D[t * P.H + h];
  const int count = S.count[t];
  const int32_t *sel = S.sel + t * S.K;
  for (int j0 = 0; j0 < count; j0 += kU) {
    int64_t srow[kU];
    float k[kU][N], z[kU], dp[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      srow[u] = j0 + u < count ? sel[j0 + u] : -1;
      z[u] = dp[u] = 0.0f;
#pragma unroll
      for (int c = 0; c < N; ++c) {
        const int col = lane + 32 * c;
        k[u][c] = srow[u] >= 0 && col < d ? loadK(P, srow[u], g, col) : 0.0f;
        z[u] = fmaf(q[c], k[u][c], z[u]);
        if (srow[u] >= 0 && col < dv)
          dp[u] = fmaf(dO[c], ld(P.v, srow[u], g, col), dp[u]);
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        z[u] += __shfl_xor_sync(kFullMask, z[u], off);
        dp[u] += __shfl_xor_sync(kFullMask, dp[u], off);
      }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      if (srow[u] < 0)
        continue;
      const float p = expf(z[u] * P.scale - lse);
      const float dS = P.scale * p * (dp[u] - Dt);
#pragma unroll
      for (int c = 0; c < N; ++c)
        dq[c] = fmaf(dS, k[u][c], dq[c]);
    }
  }
#pragma unroll
  for (int c = 0; c < N; ++c) {
    const int col = lane + 32 * c;
    if (col < d)
      storeParts(P.dqA, P.dqB, P.dA, t, h, col, dq[c]);
  }
}

/// One warp per (key row, head): P.group must be 1 (each head its own key).
template <int N> __global__ void __launch_bounds__(kThreads) dkdvKernel(AttnParams P, SparseSel S) {
  const int lane = threadIdx.x & 31;
  const int h = blockIdx.y * kWarps + (threadIdx.x >> 5);
  if (h >= P.H)
    return;
  const int32_t srow = static_cast<int32_t>(blockIdx.x);
  const int d = P.dA + P.dB, dv = P.dv;
  float k[N], v[N], dk[N], dvv[N];
#pragma unroll
  for (int c = 0; c < N; ++c) {
    const int col = lane + 32 * c;
    k[c] = col < d ? loadK(P, srow, h, col) : 0.0f;
    v[c] = col < dv ? ld(P.v, srow, h, col) : 0.0f;
    dk[c] = dvv[c] = 0.0f;
  }
  const int64_t lo = lowerBound(S.byKey, S.entries, srow),
                hi = lowerBound(S.byKey, S.entries, srow + 1);
  for (int64_t i0 = lo; i0 < hi; i0 += kU) {
    int64_t t[kU];
    float q[kU][N], dO[kU][N], z[kU], dp[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      t[u] = i0 + u < hi ? S.queries[i0 + u] : -1;
      z[u] = dp[u] = 0.0f;
#pragma unroll
      for (int c = 0; c < N; ++c) {
        const int col = lane + 32 * c;
        q[u][c] = t[u] >= 0 && col < d ? loadQ(P, t[u], h, col) : 0.0f;
        dO[u][c] = t[u] >= 0 && col < dv ? ld(P.dO, t[u], h, col) : 0.0f;
        z[u] = fmaf(q[u][c], k[c], z[u]);
        dp[u] = fmaf(dO[u][c], v[c], dp[u]);
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        z[u] += __shfl_xor_sync(kFullMask, z[u], off);
        dp[u] += __shfl_xor_sync(kFullMask, dp[u], off);
      }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      if (t[u] < 0)
        continue;
      const float p = expf(z[u] * P.scale - P.lse[t[u] * P.H + h]);
      const float dS = P.scale * p * (dp[u] - P.D[t[u] * P.H + h]);
#pragma unroll
      for (int c = 0; c < N; ++c) {
        dk[c] = fmaf(dS, q[u][c], dk[c]);
        dvv[c] = fmaf(p, dO[u][c], dvv[c]);
      }
    }
  }
#pragma unroll
  for (int c = 0; c < N; ++c) {
    const int col = lane + 32 * c;
    if (col < d)
      storeParts(P.dkA, P.dkB, P.dA, srow, h, col, dk[c]);
    if (col < dv && P.dV.t.p)
      st(P.dV, srow, h, col, dvv[c]);
  }
}

dim3 warpGrid(int64_t rows, int heads) {
  return dim3(static_cast<unsigned>(rows), static_cast<unsigned>((heads + kWarps - 1) / kWarps));
}

} // namespace

SparseSel prepareSparse(const KernelContext &ctx, Scratch &scratch, IndexIn indices, int64_t tokens,
                        int64_t K, int64_t L, bool transpose) {
  SparseSel S;
  S.K = K;
  if (tokens >= INT_MAX || tokens * K >= INT_MAX)
    ctx.fail("sparse_attention on CUDA supports fewer than 2^31 tokens and index slots");
  int32_t *sel = scratch.ints(tokens * K), *count = scratch.ints(tokens);
  int32_t *queries = transpose ? scratch.ints(tokens * K) : nullptr;
  int n2 = 1;
  while (n2 < K)
    n2 <<= 1;
  size_t shared = 2 * sizeof(int32_t) * static_cast<size_t>(n2);
  allowSharedMemory(ctx, selectKernel, shared, "sparse_attention (index selection)");
  selectKernel<<<static_cast<unsigned>(tokens), kSelectThreads, shared, streamOf(ctx)>>>(
      indices, K, n2, L, static_cast<int32_t>(tokens), sel, count, queries);
  checkLaunch(ctx, "sparse_attention (index selection)");
  S.sel = sel;
  S.count = count;
  if (!transpose)
    return S;

  // (key row, query row) pairs by key row; slots past a row's count hold the
  // sentinel `tokens` and sort last. The radix sort is stable: queries ascend.
  int entries = static_cast<int>(tokens * K);
  int32_t *byKey = scratch.ints(entries), *byKeyQueries = scratch.ints(entries);
  int endBit = 1;
  while ((int64_t{1} << endBit) <= tokens)
    ++endBit;
  size_t tempBytes = 0;
  cudaError_t error = cub::DeviceRadixSort::SortPairs(nullptr, tempBytes, sel, byKey, queries,
                                                      byKeyQueries, entries, 0, endBit,
                                                      streamOf(ctx));
  if (error != cudaSuccess)
    ctx.fail(std::string("sparse_attention: cannot size the key sort: ") +
             cudaGetErrorString(error));
  void *temp = scratch.bytes(tempBytes);
  error = cub::DeviceRadixSort::SortPairs(temp, tempBytes, sel, byKey, queries, byKeyQueries,
                                          entries, 0, endBit, streamOf(ctx));
  if (error != cudaSuccess)
    ctx.fail(std::string("sparse_attention: key sort failed: ") + cudaGetErrorString(error));
  S.byKey = byKey;
  S.queries = byKeyQueries;
  S.entries = entries;
  return S;
}

void sparseForward(const KernelContext &ctx, const AttnParams &P, const SparseSel &S) {
  const int64_t tokens = P.L * P.B;
  if (tokens <= 0 || P.H <= 0)
    return;
  withLanes(ctx, P.dA + P.dB, P.dv, [&](auto lanes) {
    constexpr int N = decltype(lanes)::value;
    forwardKernel<N, false><<<warpGrid(tokens, P.H), kThreads, 0, streamOf(ctx)>>>(P, S);
    checkLaunch(ctx, "sparse_attention");
  });
}

void sparseBackward(const KernelContext &ctx, AttnParams P, const SparseSel &S, Scratch &scratch) {
  const int64_t tokens = P.L * P.B;
  const bool wantDq = P.dqA.t.p || P.dqB.t.p, wantDkDv = P.dkA.t.p || P.dkB.t.p || P.dV.t.p;
  if (tokens <= 0 || P.H <= 0 || (!wantDq && !wantDkDv))
    return;
  if (P.group != 1)
    ctx.fail("sparse attention's backward needs one key head per query head");
  if (wantDkDv && !S.byKey)
    ctx.fail("sparse attention's backward needs the transposed selection");
  P.lse = scratch.floats(tokens * P.H);
  P.D = scratch.floats(tokens * P.H);
  withLanes(ctx, P.dA + P.dB, P.dv, [&](auto lanes) {
    constexpr int N = decltype(lanes)::value;
    if (P.savedLse) { // from the forward's saved result and logsumexp, natural log, [T, H]
      statisticsFromResult(ctx, P, P.lse, P.D, nullptr, /*headMajor=*/false, P.L, 1.0f);
    } else {
      forwardKernel<N, true><<<warpGrid(tokens, P.H), kThreads, 0, streamOf(ctx)>>>(P, S);
      checkLaunch(ctx, "sparse_attention backward (statistics)");
    }
    if (wantDq) {
      dqKernel<N><<<warpGrid(tokens, P.H), kThreads, 0, streamOf(ctx)>>>(P, S);
      checkLaunch(ctx, "sparse_attention backward (dq)");
    }
    if (wantDkDv) {
      dkdvKernel<N><<<warpGrid(tokens, P.H), kThreads, 0, streamOf(ctx)>>>(P, S);
      checkLaunch(ctx, "sparse_attention backward (dk, dv)");
    }
  });
}

} // namespace moec::runtime::cuda::attention
