//===- Dense.cu - causal (sliding-window) softmax attention in key tiles --===//
//
// Forward launches FlashWgmma.cu covers (bf16, head dims 128, causal, Hopper)
// go there first. Then two paths, chosen per launch by flashFits (Flash.cu):
//
//   Fast (Flash.cu, tensor cores): query, key, value (and the result
//   gradient) in bf16 storage, 16-byte aligned rows (both parts of query and
//   key, when MLA splits them), (head dim, value dim) = (64, 64), (128, 128),
//   (256, 256) or (192, 128) with parts of multiples of 8 features, scale > 0.
//   Causal, GQA/MQA, sliding windows and sinks are all covered; outputs may
//   be f32 or bf16. MOEC_ATTENTION_GENERAL=1 turns it off (benchmarks, bisecting).
//   General (this file, f32 CUDA cores): everything else: f32 storage (the
//   fp32 alignment runs), other head dims (up to 512) and value dims.
//
// The general kernels:
//
// Forward (and the backward's statistics): one block of 4 warps per
// (16-query tile, head, sequence); each warp owns 4 queries. Key/value
// tiles of 32 rows go through shared memory; lane j scores key j of the
// tile against the warp's queries, the online softmax rescales the running
// output (lane c holds features c, c+32, ... of each query's output).
//
// dQ: the same tiling; lane j forms dS for key j, then every lane adds
// Σ_j dS_j k_j to its features of dq.
//
// dK/dV: one block per (16-key tile, kv head, sequence), each warp owning 4
// keys; query tiles of 32 rows (of every head of the group, in order) go
// through shared memory, lane j forms p and dS of query j, then every lane
// adds Σ_j dS_j q_j to dk and Σ_j p_j dO_j to dv.
//
// Only the key (query) tiles a query (key) tile can see are visited: causal
// and window bounds per tile, exact masks per element. Sums run in a fixed
// order: deterministic, no atomics.
//
//===----------------------------------------------------------------------===//

#include <algorithm>

#include "runtime/kernels/cuda/attention/Core.cuh"

namespace moec::runtime::cuda::attention {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kQpw = 4;           // queries per warp (forward, dQ)
constexpr int kBq = 4 * kQpw;     // queries per block
constexpr int kBk = 32;           // keys per tile
constexpr int kKpw = 4;           // keys per warp (dK/dV)
constexpr int kBkt = 4 * kKpw;    // keys per block
constexpr int kBqt = 32;          // queries per tile (dK/dV)

__device__ __forceinline__ bool allowedKey(const AttnParams &P, int64_t t, int64_t s) {
  return s <= t && (P.window <= 0 || t - s < P.window);
}

/// Forward over the visible key tiles; kStats writes lse, D (and the sink
/// part) for the backward instead of the result.
template <int N, bool kStats>
__global__ void __launch_bounds__(kThreads) forwardKernel(AttnParams P) {
  extern __shared__ float smem[];
  const int d = P.dA + P.dB, dv = P.dv, ldk = d + 1;
  float *qs = smem;             // [kBq][d]
  float *ks = qs + kBq * d;     // [kBk][d + 1]
  float *vs = ks + kBk * ldk;   // [kBk][dv]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int h = blockIdx.y, g = h / P.group;
  const int64_t row0 = static_cast<int64_t>(blockIdx.z) * P.L;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kBq;

  for (int i = warp; i < kBq; i += kWarps) {
    const int64_t t = t0 + i;
    const bool in = t < P.L;
    for (int e = lane; e < d; e += 32)
      qs[i * d + e] = in ? loadQ(P, row0 + t, h, e) : 0.0f;
  }
  const bool hasSink = P.sinks.p != nullptr;
  const float sink = hasSink ? ld(P.sinks, h) : -INFINITY;
  float m[kQpw], l[kQpw], o[kQpw][N];
#pragma unroll
  for (int qi = 0; qi < kQpw; ++qi) {
    m[qi] = sink;
    l[qi] = hasSink ? 1.0f : 0.0f;
#pragma unroll
    for (int c = 0; c < N; ++c)
      o[qi][c] = 0.0f;
  }
  const int64_t tLast = min(t0 + kBq - 1, P.L - 1);
  const int64_t kLo = P.window > 0 ? max(int64_t{0}, t0 - P.window + 1) : 0;
  const float *qw = qs + warp * kQpw * d;

  for (int64_t k0 = kLo; k0 <= tLast; k0 += kBk) {
    __syncthreads(); // the previous tile is consumed (and qs is loaded)
    for (int j = warp; j < kBk; j += kWarps) {
      const int64_t s = k0 + j;
      const bool in = s <= tLast;
      for (int e = lane; e < d; e += 32)
        ks[j * ldk + e] = in ? loadK(P, row0 + s, g, e) : 0.0f;
    }
    for (int j = warp; j < kBk; j += kWarps) {
      const int64_t s = k0 + j;
      const bool in = s <= tLast;
      for (int c = lane; c < dv; c += 32)
        vs[j * dv + c] = in ? ld(P.v, row0 + s, g, c) : 0.0f;
    }
    __syncthreads();

    const int64_t s = k0 + lane;
    float acc[kQpw];
#pragma unroll
    for (int qi = 0; qi < kQpw; ++qi)
      acc[qi] = 0.0f;
    const float *kr = ks + lane * ldk;
    for (int e = 0; e < d; ++e) {
      float kv = kr[e];
#pragma unroll
      for (int qi = 0; qi < kQpw; ++qi)
        acc[qi] = fmaf(qw[qi * d + e], kv, acc[qi]);
    }
    float p[kQpw];
#pragma unroll
    for (int qi = 0; qi < kQpw; ++qi) {
      const int64_t t = t0 + warp * kQpw + qi;
      const bool ok = t < P.L && allowedKey(P, t, s);
      const float z = ok ? acc[qi] * P.scale : -INFINITY;
      const float mNew = fmaxf(m[qi], warpMax(z));
      p[qi] = 0.0f;
      if (mNew == -INFINITY) // nothing seen yet (warp-uniform)
        continue;
      const float alpha = expf(m[qi] - mNew);
      p[qi] = ok ? expf(z - mNew) : 0.0f;
      l[qi] = l[qi] * alpha + warpSum(p[qi]);
#pragma unroll
      for (int c = 0; c < N; ++c)
        o[qi][c] *= alpha;
      m[qi] = mNew;
    }
    for (int j = 0; j < kBk; ++j) {
      float pj[kQpw];
#pragma unroll
      for (int qi = 0; qi < kQpw; ++qi)
        pj[qi] = __shfl_sync(kFullMask, p[qi], j);
      const float *vr = vs + j * dv;
#pragma unroll
      for (int c = 0; c < N; ++c) {
        const int col = lane + 32 * c;
        const float vv = col < dv ? vr[col] : 0.0f;
#pragma unroll
        for (int qi = 0; qi < kQpw; ++qi)
          o[qi][c] = fmaf(pj[qi], vv, o[qi][c]);
      }
    }
  }

#pragma unroll
  for (int qi = 0; qi < kQpw; ++qi) {
    const int64_t t = t0 + warp * kQpw + qi;
    if (t >= P.L)
      continue;
    const float inv = l[qi] > 0.0f ? 1.0f / l[qi] : 0.0f;
    if (!kStats) {
#pragma unroll
      for (int c = 0; c < N; ++c) {
        const int col = lane + 32 * c;
        if (col < dv)
          st(P.out, row0 + t, h, col, o[qi][c] * inv);
      }
      if (P.lseOut && lane == 0)
        P.lseOut[(row0 + t) * P.H + h] = l[qi] > 0.0f ? m[qi] + logf(l[qi]) : INFINITY;
    } else {
      float dot = 0.0f;
#pragma unroll
      for (int c = 0; c < N; ++c) {
        const int col = lane + 32 * c;
        if (col < dv)
          dot = fmaf(ld(P.dO, row0 + t, h, col), o[qi][c] * inv, dot);
      }
      dot = warpSum(dot);
      if (lane == 0) {
        const int64_t r = (row0 + t) * P.H + h;
        const float lse = l[qi] > 0.0f ? m[qi] + logf(l[qi]) : INFINITY;
        P.lse[r] = lse;
        P.D[r] = dot;
        if (P.sinkPart)
          P.sinkPart[r] = hasSink ? -expf(sink - lse) * dot : 0.0f;
      }
    }
  }
}

template <int N> __global__ void __launch_bounds__(kThreads) dqKernel(AttnParams P) {
  extern __shared__ float smem[];
  const int d = P.dA + P.dB, dv = P.dv, ldk = d + 1, ldv = dv + 1;
  float *qs = smem;              // [kBq][d]
  float *dos = qs + kBq * d;     // [kBq][dv]
  float *ks = dos + kBq * dv;    // [kBk][d + 1]
  float *vs = ks + kBk * ldk;    // [kBk][dv + 1]
  float *lses = vs + kBk * ldv;  // [kBq]
  float *ds = lses + kBq;        // [kBq]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int h = blockIdx.y, g = h / P.group;
  const int64_t row0 = static_cast<int64_t>(blockIdx.z) * P.L;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kBq;

  for (int i = warp; i < kBq; i += kWarps) {
    const int64_t t = t0 + i;
    const bool in = t < P.L;
    for (int e = lane; e < d; e += 32)
      qs[i * d + e] = in ? loadQ(P, row0 + t, h, e) : 0.0f;
  }
  for (int i = warp; i < kBq; i += kWarps) {
    const int64_t t = t0 + i;
    const bool in = t < P.L;
    for (int c = lane; c < dv; c += 32)
      dos[i * dv + c] = in ? ld(P.dO, row0 + t, h, c) : 0.0f;
  }
  for (int i = tid; i < kBq; i += kThreads) {
    int64_t t = t0 + i;
    lses[i] = t < P.L ? P.lse[(row0 + t) * P.H + h] : INFINITY;
    ds[i] = t < P.L ? P.D[(row0 + t) * P.H + h] : 0.0f;
  }
  float dq[kQpw][N];
#pragma unroll
  for (int qi = 0; qi < kQpw; ++qi)
#pragma unroll
    for (int c = 0; c < N; ++c)
      dq[qi][c] = 0.0f;
  const int64_t tLast = min(t0 + kBq - 1, P.L - 1);
  const int64_t kLo = P.window > 0 ? max(int64_t{0}, t0 - P.window + 1) : 0;
  const float *qw = qs + warp * kQpw * d, *dow = dos + warp * kQpw * dv;

  for (int64_t k0 = kLo; k0 <= tLast; k0 += kBk) {
    __syncthreads();
    for (int j = warp; j < kBk; j += kWarps) {
      const int64_t s = k0 + j;
      const bool in = s <= tLast;
      for (int e = lane; e < d; e += 32)
        ks[j * ldk + e] = in ? loadK(P, row0 + s, g, e) : 0.0f;
    }
    for (int j = warp; j < kBk; j += kWarps) {
      const int64_t s = k0 + j;
      const bool in = s <= tLast;
      for (int c = lane; c < dv; c += 32)
        vs[j * ldv + c] = in ? ld(P.v, row0 + s, g, c) : 0.0f;
    }
    __syncthreads();

    const int64_t s = k0 + lane;
    float accz[kQpw], accp[kQpw];
#pragma unroll
    for (int qi = 0; qi < kQpw; ++qi)
      accz[qi] = accp[qi] = 0.0f;
    const float *kr = ks + lane * ldk, *vr = vs + lane * ldv;
    for (int e = 0; e < d; ++e) {
      float kv = kr[e];
#pragma unroll
      for (int qi = 0; qi < kQpw; ++qi)
        accz[qi] = fmaf(qw[qi * d + e], kv, accz[qi]);
    }
    for (int c = 0; c < dv; ++c) {
      float vv = vr[c];
#pragma unroll
      for (int qi = 0; qi < kQpw; ++qi)
        accp[qi] = fmaf(dow[qi * dv + c], vv, accp[qi]);
    }
    float dS[kQpw];
#pragma unroll
    for (int qi = 0; qi < kQpw; ++qi) {
      const int i = warp * kQpw + qi;
      const int64_t t = t0 + i;
      const bool ok = t < P.L && allowedKey(P, t, s);
      const float p = ok ? expf(accz[qi] * P.scale - lses[i]) : 0.0f;
      dS[qi] = ok ? P.scale * p * (accp[qi] - ds[i]) : 0.0f;
    }
    for (int j = 0; j < kBk; ++j) {
      float dj[kQpw];
#pragma unroll
      for (int qi = 0; qi < kQpw; ++qi)
        dj[qi] = __shfl_sync(kFullMask, dS[qi], j);
      const float *kj = ks + j * ldk;
#pragma unroll
      for (int c = 0; c < N; ++c) {
        const int col = lane + 32 * c;
        const float kv = col < d ? kj[col] : 0.0f;
#pragma unroll
        for (int qi = 0; qi < kQpw; ++qi)
          dq[qi][c] = fmaf(dj[qi], kv, dq[qi][c]);
      }
    }
  }

#pragma unroll
  for (int qi = 0; qi < kQpw; ++qi) {
    const int64_t t = t0 + warp * kQpw + qi;
    if (t >= P.L)
      continue;
#pragma unroll
    for (int c = 0; c < N; ++c) {
      const int col = lane + 32 * c;
      if (col < d)
        storeParts(P.dqA, P.dqB, P.dA, row0 + t, h, col, dq[qi][c]);
    }
  }
}

template <int N> __global__ void __launch_bounds__(kThreads) dkdvKernel(AttnParams P) {
  extern __shared__ float smem[];
  const int d = P.dA + P.dB, dv = P.dv, ldq = d + 1, ldo = dv + 1;
  float *ks = smem;               // [kBkt][d]
  float *vs = ks + kBkt * d;      // [kBkt][dv]
  float *qs = vs + kBkt * dv;     // [kBqt][d + 1]
  float *dos = qs + kBqt * ldq;   // [kBqt][dv + 1]
  float *lses = dos + kBqt * ldo; // [kBqt]
  float *ds = lses + kBqt;        // [kBqt]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = blockIdx.y;
  const int64_t row0 = static_cast<int64_t>(blockIdx.z) * P.L;
  const int64_t s0 = static_cast<int64_t>(blockIdx.x) * kBkt;
  const int64_t sLast = min(s0 + kBkt - 1, P.L - 1);
  const int64_t qHi = P.window > 0 ? min(P.L - 1, sLast + P.window - 1) : P.L - 1;

  for (int j = warp; j < kBkt; j += kWarps) {
    const int64_t s = s0 + j;
    const bool in = s <= sLast;
    for (int e = lane; e < d; e += 32)
      ks[j * d + e] = in ? loadK(P, row0 + s, g, e) : 0.0f;
  }
  for (int j = warp; j < kBkt; j += kWarps) {
    const int64_t s = s0 + j;
    const bool in = s <= sLast;
    for (int c = lane; c < dv; c += 32)
      vs[j * dv + c] = in ? ld(P.v, row0 + s, g, c) : 0.0f;
  }
  float dk[kKpw][N], dvv[kKpw][N];
#pragma unroll
  for (int ki = 0; ki < kKpw; ++ki)
#pragma unroll
    for (int c = 0; c < N; ++c)
      dk[ki][c] = dvv[ki][c] = 0.0f;
  const float *kw = ks + warp * kKpw * d, *vw = vs + warp * kKpw * dv;

  for (int hh = 0; hh < P.group; ++hh) {
    const int h = g * P.group + hh;
    for (int64_t tq0 = s0; tq0 <= qHi; tq0 += kBqt) {
      __syncthreads(); // the previous query tile is consumed (and ks, vs are loaded)
      for (int j = warp; j < kBqt; j += kWarps) {
        const int64_t t = tq0 + j;
        const bool in = t <= qHi;
        for (int e = lane; e < d; e += 32)
          qs[j * ldq + e] = in ? loadQ(P, row0 + t, h, e) : 0.0f;
      }
      for (int j = warp; j < kBqt; j += kWarps) {
        const int64_t t = tq0 + j;
        const bool in = t <= qHi;
        for (int c = lane; c < dv; c += 32)
          dos[j * ldo + c] = in ? ld(P.dO, row0 + t, h, c) : 0.0f;
      }
      for (int j = tid; j < kBqt; j += kThreads) {
        int64_t t = tq0 + j;
        lses[j] = t <= qHi ? P.lse[(row0 + t) * P.H + h] : INFINITY;
        ds[j] = t <= qHi ? P.D[(row0 + t) * P.H + h] : 0.0f;
      }
      __syncthreads();

      const int64_t t = tq0 + lane;
      float accz[kKpw], accp[kKpw];
#pragma unroll
      for (int ki = 0; ki < kKpw; ++ki)
        accz[ki] = accp[ki] = 0.0f;
      const float *qr = qs + lane * ldq, *dor = dos + lane * ldo;
      for (int e = 0; e < d; ++e) {
        float qv = qr[e];
#pragma unroll
        for (int ki = 0; ki < kKpw; ++ki)
          accz[ki] = fmaf(qv, kw[ki * d + e], accz[ki]);
      }
      for (int c = 0; c < dv; ++c) {
        float dov = dor[c];
#pragma unroll
        for (int ki = 0; ki < kKpw; ++ki)
          accp[ki] = fmaf(dov, vw[ki * dv + c], accp[ki]);
      }
      float p[kKpw], dS[kKpw];
#pragma unroll
      for (int ki = 0; ki < kKpw; ++ki) {
        const int64_t s = s0 + warp * kKpw + ki;
        const bool ok = t <= qHi && s <= sLast && allowedKey(P, t, s);
        p[ki] = ok ? expf(accz[ki] * P.scale - lses[lane]) : 0.0f;
        dS[ki] = ok ? P.scale * p[ki] * (accp[ki] - ds[lane]) : 0.0f;
      }
      for (int j = 0; j < kBqt; ++j) {
        float pj[kKpw], dj[kKpw];
#pragma unroll
        for (int ki = 0; ki < kKpw; ++ki) {
          pj[ki] = __shfl_sync(kFullMask, p[ki], j);
          dj[ki] = __shfl_sync(kFullMask, dS[ki], j);
        }
        const float *qj = qs + j * ldq, *doj = dos + j * ldo;
#pragma unroll
        for (int c = 0; c < N; ++c) {
          const int col = lane + 32 * c;
          const float qv = col < d ? qj[col] : 0.0f;
          const float dov = col < dv ? doj[col] : 0.0f;
#pragma unroll
          for (int ki = 0; ki < kKpw; ++ki) {
            dk[ki][c] = fmaf(dj[ki], qv, dk[ki][c]);
            dvv[ki][c] = fmaf(pj[ki], dov, dvv[ki][c]);
          }
        }
      }
    }
  }

#pragma unroll
  for (int ki = 0; ki < kKpw; ++ki) {
    const int64_t s = s0 + warp * kKpw + ki;
    if (s > sLast)
      continue;
#pragma unroll
    for (int c = 0; c < N; ++c) {
      const int col = lane + 32 * c;
      if (col < d)
        storeParts(P.dkA, P.dkB, P.dA, row0 + s, g, col, dk[ki][c]);
      if (col < dv && P.dV.t.p)
        st(P.dV, row0 + s, g, col, dvv[ki][c]);
    }
  }
}

/// A warp per (row t < Lp, head, sequence): statisticsFromResult.
__global__ void __launch_bounds__(kThreads)
    statisticsKernel(AttnParams P, float *lse, float *D, float *sinkPart, bool headMajor, int64_t Lp,
                     float lseScale) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int64_t t = warp % Lp, bh = warp / Lp;
  if (bh >= P.B * P.H)
    return;
  const int h = static_cast<int>(bh % P.H);
  const int64_t b = bh / P.H, row = b * P.L + t;
  const int64_t at = headMajor ? bh * Lp + t : row * P.H + h;
  if (t >= P.L) { // Flash.cu's padding rows
    if (lane == 0) {
      lse[at] = INFINITY;
      D[at] = 0.0f;
    }
    return;
  }
  float dot = 0.0f;
  for (int col = lane; col < P.dv; col += 32)
    dot = fmaf(ld(P.dO, row, h, col), ld(P.savedO, row, h, col), dot);
  dot = warpSum(dot);
  if (lane == 0) {
    const float saved = P.savedLse[row * P.H + h];
    lse[at] = saved * lseScale; // +inf stays +inf
    D[at] = dot;
    if (sinkPart)
      sinkPart[row * P.H + h] = P.sinks.p ? -expf(ld(P.sinks, h) - saved) * dot : 0.0f;
  }
}

constexpr int kReduceThreads = 256;

__global__ void __launch_bounds__(kReduceThreads)
    sinkReduceKernel(const float *part, int64_t rows, int heads, FloatOut out) {
  __shared__ double sums[kReduceThreads];
  const int h = blockIdx.x;
  double acc = 0;
  for (int64_t r = threadIdx.x; r < rows; r += kReduceThreads)
    acc += part[r * heads + h];
  sums[threadIdx.x] = acc;
  __syncthreads();
  for (int width = kReduceThreads / 2; width > 0; width >>= 1) {
    if (threadIdx.x < width)
      sums[threadIdx.x] += sums[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x == 0)
    st(out, h, static_cast<float>(sums[0]));
}

size_t forwardShared(int d, int dv) {
  return sizeof(float) * (static_cast<size_t>(kBq) * d + static_cast<size_t>(kBk) * (d + 1) +
                          static_cast<size_t>(kBk) * dv);
}
size_t dqShared(int d, int dv) {
  return sizeof(float) * (static_cast<size_t>(kBq) * (d + dv) +
                          static_cast<size_t>(kBk) * (d + 1 + dv + 1) + 2 * kBq);
}
size_t dkdvShared(int d, int dv) {
  return sizeof(float) * (static_cast<size_t>(kBkt) * (d + dv) +
                          static_cast<size_t>(kBqt) * (d + 1 + dv + 1) + 2 * kBqt);
}

template <bool kStats> void launchForward(const KernelContext &ctx, const AttnParams &P) {
  const int d = P.dA + P.dB;
  withLanes(ctx, d, P.dv, [&](auto lanes) {
    constexpr int N = decltype(lanes)::value;
    auto kernel = forwardKernel<N, kStats>;
    size_t shared = forwardShared(d, P.dv);
    allowSharedMemory(ctx, kernel, shared, "attention");
    dim3 grid(static_cast<unsigned>((P.L + kBq - 1) / kBq), static_cast<unsigned>(P.H),
              static_cast<unsigned>(P.B));
    kernel<<<grid, kThreads, shared, streamOf(ctx)>>>(P);
    checkLaunch(ctx, kStats ? "attention backward (statistics)" : "attention");
  });
}

} // namespace

void reduceSinks(const KernelContext &ctx, const float *part, int64_t rows, int heads,
                 FloatOut dSinks) {
  sinkReduceKernel<<<static_cast<unsigned>(heads), kReduceThreads, 0, streamOf(ctx)>>>(
      part, rows, heads, dSinks);
  checkLaunch(ctx, "attention backward (sinks)");
}

void statisticsFromResult(const KernelContext &ctx, const AttnParams &P, float *lse, float *D,
                          float *sinkPart, bool headMajor, int64_t Lp, float lseScale) {
  const int64_t warps = P.B * P.H * Lp;
  statisticsKernel<<<static_cast<unsigned>((warps + kWarps - 1) / kWarps), kThreads, 0, streamOf(ctx)>>>(
      P, lse, D, sinkPart, headMajor, Lp, lseScale);
  checkLaunch(ctx, "attention backward (statistics from the saved result)");
}

void denseForward(const KernelContext &ctx, const AttnParams &P) {
  if (P.L <= 0 || P.B <= 0 || P.H <= 0)
    return;
  if (wgmmaForwardFits(P)) {
    wgmmaForward(ctx, P);
    return;
  }
  if (flashFits(P, /*backward=*/false)) {
    flashForward(ctx, P);
    return;
  }
  launchForward<false>(ctx, P);
}

void denseBackward(const KernelContext &ctx, AttnParams P, Scratch &scratch, FloatOut dSinks) {
  if (P.L <= 0 || P.B <= 0 || P.H <= 0)
    return;
  const int64_t tokens = P.L * P.B;
  const int d = P.dA + P.dB;
  const bool wantDq = P.dqA.t.p || P.dqB.t.p, wantDkDv = P.dkA.t.p || P.dkB.t.p || P.dV.t.p;
  const bool wantSinks = dSinks.p && P.sinks.p;
  if (!wantDq && !wantDkDv && !wantSinks)
    return;
  if (flashFits(P, /*backward=*/true)) {
    flashBackward(ctx, P, scratch, dSinks);
    return;
  }
  P.lse = scratch.floats(tokens * P.H);
  P.D = scratch.floats(tokens * P.H);
  P.sinkPart = wantSinks ? scratch.floats(tokens * P.H) : nullptr;
  if (P.savedLse)
    statisticsFromResult(ctx, P, P.lse, P.D, P.sinkPart, /*headMajor=*/false, P.L, 1.0f);
  else
    launchForward<true>(ctx, P);
  if (wantSinks)
    reduceSinks(ctx, P.sinkPart, tokens, P.H, dSinks);
  withLanes(ctx, d, P.dv, [&](auto lanes) {
    constexpr int N = decltype(lanes)::value;
    if (wantDq) {
      auto kernel = dqKernel<N>;
      size_t shared = dqShared(d, P.dv);
      allowSharedMemory(ctx, kernel, shared, "attention backward (dq)");
      dim3 grid(static_cast<unsigned>((P.L + kBq - 1) / kBq), static_cast<unsigned>(P.H),
                static_cast<unsigned>(P.B));
      kernel<<<grid, kThreads, shared, streamOf(ctx)>>>(P);
      checkLaunch(ctx, "attention backward (dq)");
    }
    if (wantDkDv) {
      auto kernel = dkdvKernel<N>;
      size_t shared = dkdvShared(d, P.dv);
      allowSharedMemory(ctx, kernel, shared, "attention backward (dk, dv)");
      dim3 grid(static_cast<unsigned>((P.L + kBkt - 1) / kBkt), static_cast<unsigned>(P.KV),
                static_cast<unsigned>(P.B));
      kernel<<<grid, kThreads, shared, streamOf(ctx)>>>(P);
      checkLaunch(ctx, "attention backward (dk, dv)");
    }
  });
}

} // namespace moec::runtime::cuda::attention
