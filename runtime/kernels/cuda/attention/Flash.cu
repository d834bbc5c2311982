//===- Flash.cu - tensor-core attention for bf16 storage (Dense.cu's fast path) ===//
//
// FlashAttention-2 style kernels for the dense core when q, k, v (and dO)
// are bf16 with head dim 64 or 128 (flashFits in Dense.cu has every
// condition). Products run on mma.sync m16n8k16 (bf16 operands, f32
// accumulators) with fragments read by ldmatrix from padded shared-memory
// tiles (rows of d + 8 elements: conflict-free) that cp.async fills two
// stages deep; softmax math stays in f32 registers, in base 2 (logits times
// scale·log2 e, ex2.approx). Causal, sliding-window and sink semantics are
// Dense.cu's: allowed(t, s) = s <= t && t - s < window, the sink logit joins
// the denominator only.
//
//   forward (and the backward's statistics): one block per (128-query tile,
//     head, sequence), by default 8 warps of 16 queries with the Q fragments
//     in registers, 64-key K/V tiles streamed (other shapes: 4 warps of 32
//     queries, 32- or 64-key tiles; tileShape()); S = Q Kᵀ, online softmax,
//     O += P V with P taken straight from the S accumulators. The statistics
//     variant writes lse (base 2) and D = dO · O per (sequence, head, query)
//     instead of O, and the sink part -p_sink · D.
//   dK, dV: one block of 8 warps per (128-key tile, kv head, slice of the
//     group's heads, sequence), 16 keys per warp; 64-query tiles of Q, dO,
//     lse, D streamed for each head of the slice: Sᵀ = K Qᵀ, dPᵀ = V dOᵀ,
//     Pᵀ = exp2(Sᵀ c - lse), dSᵀ = Pᵀ (dPᵀ - D), dV += Pᵀ dO, dK += dSᵀ Q.
//     With one slice the block writes dK, dV; with several (enough blocks
//     to fill the GPU) each slice writes f32 partials that a second kernel
//     sums in slice order.
//   dQ: blocks as the forward (its own tile shape); dS = P (dP - D) from
//     S = Q Kᵀ and dP = dO Vᵀ, dQ += dS K over the visible key tiles.
//
// Only visible tiles are visited, and within a block a warp skips a tile it
// cannot see; masks are applied per element only on tiles that need them.
// No atomics: every sum has a fixed order, so results are deterministic.
//
//===----------------------------------------------------------------------===//

#ifdef MOEC_FLASH_EMULATION // flash_emulation_test: the kernels as C++ on the CPU
#include "runtime/kernels/cuda/attention/FlashEmulation.h"
#endif

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "runtime/kernels/cuda/attention/Core.cuh"

namespace moec::runtime::cuda::attention {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kPad = 8;         // elements of padding per shared-memory row (16 bytes)
constexpr int kQTile = 128;     // queries per block (forward, dQ)
constexpr int kThreads = 256;   // dK/dV blocks: 8 warps
constexpr int kKvKeys = 128;    // keys per block (dK, dV): 16 per warp
constexpr int kKvQueries = 64;  // queries per streamed tile (dK, dV)
constexpr int kStatsAlign = 128; // statistics rows per (sequence, head), padded
constexpr float kLog2e = 1.4426950408889634f;
// Blocks of the dK/dV kernel worth having before the heads of a group are
// split into slices (fixed, so the summation order does not depend on the GPU).
constexpr int64_t kKvBlocksWanted = 512;

/// Device views of the fast path; pointers at row 0, head 0, feature 0.
struct FlashParams {
  const bf16 *q = nullptr, *k = nullptr, *v = nullptr, *dO = nullptr;
  int64_t ldq = 0, ldk = 0, ldv = 0, lddo = 0; // row strides (elements)
  int64_t hsq = 0, hsk = 0, hsv = 0, hsdo = 0; // head strides (elements)
  OutMat out, dq, dk, dv;                      // p null = not wanted
  FloatIn sinks;                               // [H]; p null = none
  int L = 0, H = 0, KV = 0, group = 1;
  int window = 0; // 0 = none (also when it is at least L)
  float scaleLog2 = 0, scale = 0;
  // Statistics, [B * H][Lp] with Lp a multiple of kStatsAlign: rows >= L hold lse = +inf, D = 0.
  float *lse = nullptr, *dsum = nullptr;
  int64_t Lp = 0;
  float *sinkPart = nullptr; // [B * L][H] or null
  // dK/dV slices: block (kv head, slice) handles heads kv*group + slice*headsPerBlock + [0, headsPerBlock).
  int slices = 1, headsPerBlock = 1;
  int64_t rows = 0;                          // B * L
  float *dkPart = nullptr, *dvPart = nullptr; // [slices][B * L][KV * d] (slices > 1)
};

//===----------------------------------------------------------------------===//
// PTX wrappers
//===----------------------------------------------------------------------===//

#ifdef MOEC_FLASH_EMULATION
using namespace emulation; // FlashEmulation.h's stand-ins for the wrappers below
#define FLASH_SHARED_MEMORY(name) unsigned char *name = emulation::state().sharedBase()
#define FLASH_LAUNCH(kernel, grid, threads, shared, stream, ...)                                   \
  emulation::launch(grid, threads, shared, [&] { kernel(__VA_ARGS__); })
#else
#define FLASH_SHARED_MEMORY(name) extern __shared__ __align__(16) unsigned char name[]
#define FLASH_LAUNCH(kernel, grid, threads, shared, stream, ...)                                   \
  kernel<<<grid, threads, shared, stream>>>(__VA_ARGS__)

__device__ __forceinline__ uint32_t sharedAddress(const void *p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// 16 bytes global -> shared, asynchronously; zero-fills when !valid (no bytes read).
__device__ __forceinline__ void cpAsync16(void *dst, const void *src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sharedAddress(dst)),
               "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
__device__ __forceinline__ void ldmatrix4T(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

/// c += a b for one m16n8k16 tile: a row-major 16x16, b "col" 16x8, f32 accumulators.
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// Two floats as bf16 in one register, `lo` in the low half (the lower index).
__device__ __forceinline__ uint32_t packBf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t *>(&v);
}

/// 2^x; 2^-inf = 0.
__device__ __forceinline__ float exp2Approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
#endif // MOEC_FLASH_EMULATION

//===----------------------------------------------------------------------===//
// Fragments
//
// mma.sync m16n8k16 layouts (g = lane / 4, c = 2 * (lane % 4)):
//   A (16 x 16): a0 = (g, c..c+1), a1 = (g+8, c..), a2 = (g, c+8..), a3 = (g+8, c+8..)
//   B (16 x 8):  b0 = (k c..c+1, n g), b1 = (k c+8.., n g)
//   C (16 x 8):  c0, c1 = (g, c), (g, c+1); c2, c3 = (g+8, c), (g+8, c+1)
// so the C fragments of two adjacent n8 tiles are the A fragment of the next
// product (P V with P from S). ldmatrix x4: lane l gives the address of row
// l % 8 of matrix l / 8 and gets (row l / 4, columns c..c+1) of each matrix
// (.trans: rows c..c+1 of column l / 4).
//===----------------------------------------------------------------------===//

/// Per-lane element offset of the ldmatrix addresses for an A fragment of a
/// row-major tile (matrices: rows 0-7 | 8-15 at k 0-7, then at k 8-15), which
/// is also that of two B fragments of a [k][n] tile read transposed.
template <int LDS> __device__ __forceinline__ int laneOffsetA(int lane) {
  return ((lane & 7) + ((lane >> 3) & 1) * 8) * LDS + (lane >> 4) * 8;
}
/// ... and for two B fragments (n tiles n0, n0+8) of an [n][k] tile (K for S = Q Kᵀ).
template <int LDS> __device__ __forceinline__ int laneOffsetB(int lane) {
  return ((lane & 7) + (lane >> 4) * 8) * LDS + ((lane >> 3) & 1) * 8;
}

/// The A fragment at (row0, k0) of a row-major bf16 tile at shared address
/// `base` (bytes), with this lane's laneOffsetA.
template <int LDS>
__device__ __forceinline__ void loadA(uint32_t (&a)[4], uint32_t base, int offA, int row0, int k0) {
  ldmatrix4(a, base + 2u * static_cast<uint32_t>(row0 * LDS + k0 + offA));
}
/// B fragments of n tiles n0 and n0+8 at k0 from an [n][k] tile: {r0, r1}, {r2, r3}.
template <int LDS>
__device__ __forceinline__ void loadB(uint32_t (&r)[4], uint32_t base, int offB, int n0, int k0) {
  ldmatrix4(r, base + 2u * static_cast<uint32_t>(n0 * LDS + k0 + offB));
}
/// B fragments of n tiles n0 and n0+8 at k0 from a [k][n] tile (V for O = P V).
template <int LDS>
__device__ __forceinline__ void loadBT(uint32_t (&r)[4], uint32_t base, int offA, int k0, int n0) {
  ldmatrix4T(r, base + 2u * static_cast<uint32_t>(k0 * LDS + n0 + offA));
}

/// The A fragment of k step kk of a product whose A is held as C fragments
/// (16 rows x 8 columns per n tile): n tiles 2kk and 2kk+1, rounded to bf16.
template <int N>
__device__ __forceinline__ void accumulatorsAsA(uint32_t (&a)[4], const float (&c)[N][4], int kk) {
  a[0] = packBf16(c[2 * kk][0], c[2 * kk][1]);
  a[1] = packBf16(c[2 * kk][2], c[2 * kk][3]);
  a[2] = packBf16(c[2 * kk + 1][0], c[2 * kk + 1][1]);
  a[3] = packBf16(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

/// Copies `ROWS` rows of D bf16 (row stride ld) into a padded shared tile
/// with cp.async (a block of THREADS), zero-filling rows >= valid (`fallback`:
/// any readable address).
template <int D, int ROWS, int THREADS>
__device__ __forceinline__ void loadRows(bf16 *dst, const bf16 *src, int64_t ld, int valid,
                                         const bf16 *fallback) {
  constexpr int kChunks = D / 8, kPerThread = ROWS * kChunks / THREADS;
  static_assert(ROWS * kChunks % THREADS == 0, "tile chunks must split evenly over the block");
#pragma unroll
  for (int it = 0; it < kPerThread; ++it) {
    const int i = it * THREADS + static_cast<int>(threadIdx.x);
    const int r = i / kChunks, c = i % kChunks;
    const bool ok = r < valid;
    cpAsync16(dst + r * (D + kPad) + c * 8, ok ? src + r * ld + c * 8 : fallback, ok);
  }
}

/// Two adjacent features of an output (f32 or bf16 storage).
__device__ __forceinline__ void storePair(const OutMat &m, int64_t row, int head, int col, float a,
                                          float b) {
  const int64_t i = row * m.ld + head * m.hs + col;
  if (m.t.bf16)
    *reinterpret_cast<__nv_bfloat162 *>(static_cast<bf16 *>(m.t.p) + i) = __floats2bfloat162_rn(a, b);
  else
    *reinterpret_cast<float2 *>(static_cast<float *>(m.t.p) + i) = make_float2(a, b);
}

__device__ __forceinline__ float quadSum(float v) {
  v += __shfl_xor_sync(kFullMask, v, 1);
  return v + __shfl_xor_sync(kFullMask, v, 2);
}
__device__ __forceinline__ float quadMax(float v) {
  v = fmaxf(v, __shfl_xor_sync(kFullMask, v, 1));
  return fmaxf(v, __shfl_xor_sync(kFullMask, v, 2));
}

//===----------------------------------------------------------------------===//
// Forward and statistics
//===----------------------------------------------------------------------===//

// The query-tile kernels (forward, statistics, dQ) take 128 queries per block
// either as 8 warps of one m16 tile (MT = 1) or as 4 warps of two (MT = 2,
// FlashAttention-2's layout: each K/V fragment read from shared memory feeds
// two mma, at the cost of twice the accumulators per thread); BN keys per
// streamed K/V tile. tileShape() picks the shape of each kernel.
template <int MT> constexpr int kQueryThreads = 32 * kQTile / (16 * MT);

template <int D, int BN> constexpr size_t forwardShared() {
  return sizeof(bf16) * (D + kPad) * (kQTile + 4 * BN); // Q, 2 x (K, V)
}

template <int D, int MT, int BN, bool kStats>
__global__ void __launch_bounds__(kQueryThreads<MT>, 1) flashForwardKernel(FlashParams p) {
  constexpr int LDS = D + kPad, BM = kQTile, kT = kQueryThreads<MT>, RW = 16 * MT;
  // With one m tile per warp the Q fragments stay in registers; with two,
  // registers go to the second tile's accumulators and Q is re-read per k step.
  constexpr bool kQInRegisters = MT == 1;
  FLASH_SHARED_MEMORY(smem);
  bf16 *sQ = reinterpret_cast<bf16 *>(smem); // [BM][LDS]
  bf16 *sK = sQ + BM * LDS;                  // [2][BN][LDS]
  bf16 *sV = sK + 2 * BN * LDS;              // [2][BN][LDS]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c2 = 2 * (lane & 3);
  const int h = blockIdx.x, b = blockIdx.y, kvh = h / p.group;
  const int q0 = (gridDim.z - 1 - blockIdx.z) * BM; // the longest rows first
  const int L = p.L, wnd = p.window;
  const int64_t row0 = static_cast<int64_t>(b) * L;
  const int qLast = min(q0 + BM - 1, L - 1);
  const int jLo = (wnd > 0 ? max(0, q0 - wnd + 1) : 0) / BN, jHi = qLast / BN;
  const int tiles = jHi - jLo + 1;

  loadRows<D, BM, kT>(sQ, p.q + (row0 + q0) * p.ldq + h * p.hsq, p.ldq, L - q0, p.q);
  auto loadKV = [&](int j, int buf) {
    const int k0 = j * BN;
    loadRows<D, BN, kT>(sK + buf * BN * LDS, p.k + (row0 + k0) * p.ldk + kvh * p.hsk, p.ldk, L - k0, p.k);
    loadRows<D, BN, kT>(sV + buf * BN * LDS, p.v + (row0 + k0) * p.ldv + kvh * p.hsv, p.ldv, L - k0, p.v);
  };
  loadKV(jLo, 0);
  cpAsyncCommit();

  const int offA = laneOffsetA<LDS>(lane), offB = laneOffsetB<LDS>(lane);
  const uint32_t qBase = sharedAddress(sQ), kBase = sharedAddress(sK), vBase = sharedAddress(sV);
  constexpr uint32_t kTileBytes = 2u * BN * LDS;
  const int wr0 = q0 + warp * RW; // this warp's first query; m tile mt: wr0 + 16 mt + [0, 16)
  int tRow[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      tRow[mt][r] = wr0 + 16 * mt + g + 8 * r;
  const bool hasSink = p.sinks.p != nullptr;
  const float sinkL2 = hasSink ? ld(p.sinks, h) * kLog2e : -INFINITY;

  uint32_t qf[kQInRegisters ? D / 16 : 1][4];
  float o[MT][D / 8][4];
  // Running max (base-2 logits; the sink's counts from the start) and this lane's partial sums.
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        o[mt][n][e] = 0.0f;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      m[mt][r] = sinkL2;
      l[mt][r] = 0.0f;
    }
  }

  for (int it = 0; it < tiles; ++it) {
    const int j = jLo + it, buf = it & 1;
    if (it + 1 < tiles) {
      loadKV(j + 1, buf ^ 1);
      cpAsyncCommit();
      cpAsyncWait<1>();
    } else {
      cpAsyncWait<0>();
    }
    __syncthreads();
    if (kQInRegisters && it == 0) {
#pragma unroll
      for (int kk = 0; kk < (kQInRegisters ? D / 16 : 0); ++kk)
        loadA<LDS>(qf[kk], qBase, offA, warp * RW, kk * 16);
    }
    const int k0 = j * BN;
    const bool active = wr0 < L && k0 <= wr0 + RW - 1 && (wnd == 0 || k0 + BN - 1 > wr0 - wnd);
    if (active) {
      const uint32_t kb = kBase + buf * kTileBytes, vb = vBase + buf * kTileBytes;
      float s[MT][BN / 8][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int n = 0; n < BN / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            s[mt][n][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if constexpr (kQInRegisters) {
#pragma unroll
            for (int i = 0; i < 4; ++i)
              a[mt][i] = qf[kk][i];
          } else {
            loadA<LDS>(a[mt], qBase, offA, warp * RW + 16 * mt, kk * 16);
          }
        }
#pragma unroll
        for (int n = 0; n < BN / 8; n += 2) {
          uint32_t r[4];
          loadB<LDS>(r, kb, offB, n * 8, kk * 16);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma(s[mt][n], a[mt], r[0], r[1]);
            mma(s[mt][n + 1], a[mt], r[2], r[3]);
          }
        }
      }
      const bool needMask = k0 + BN - 1 > wr0 || (wnd > 0 && wr0 + RW - 1 - k0 >= wnd);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int n = 0; n < BN / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float z = s[mt][n][e] * p.scaleLog2;
            if (needMask) {
              const int key = k0 + n * 8 + c2 + (e & 1), t = tRow[mt][e >> 1];
              if (key > t || (wnd > 0 && t - key >= wnd))
                z = -INFINITY;
            }
            s[mt][n][e] = z;
          }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float mx = -INFINITY;
#pragma unroll
          for (int n = 0; n < BN / 8; ++n)
            mx = fmaxf(mx, fmaxf(s[mt][n][2 * r], s[mt][n][2 * r + 1]));
          const float mNew = fmaxf(m[mt][r], quadMax(mx));
          const float mUse = mNew == -INFINITY ? 0.0f : mNew; // nothing seen yet: all terms are 0
          const float alpha = exp2Approx(m[mt][r] - mUse);
          m[mt][r] = mNew;
          float sum = 0.0f;
#pragma unroll
          for (int n = 0; n < BN / 8; ++n) {
            s[mt][n][2 * r] = exp2Approx(s[mt][n][2 * r] - mUse);
            s[mt][n][2 * r + 1] = exp2Approx(s[mt][n][2 * r + 1] - mUse);
            sum += s[mt][n][2 * r] + s[mt][n][2 * r + 1];
          }
          l[mt][r] = l[mt][r] * alpha + sum;
#pragma unroll
          for (int n = 0; n < D / 8; ++n) {
            o[mt][n][2 * r] *= alpha;
            o[mt][n][2 * r + 1] *= alpha;
          }
        }
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
          accumulatorsAsA(a[mt], s[mt], kk);
#pragma unroll
        for (int n = 0; n < D / 8; n += 2) {
          uint32_t r[4];
          loadBT<LDS>(r, vb, offA, kk * 16, n * 8);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma(o[mt][n], a[mt], r[0], r[1]);
            mma(o[mt][n + 1], a[mt], r[2], r[3]);
          }
        }
      }
    }
    __syncthreads(); // buffer `buf` is refilled by the next iteration's prefetch
  }

#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int t = tRow[mt][r];
      const float mUse = m[mt][r] == -INFINITY ? 0.0f : m[mt][r];
      float total = quadSum(l[mt][r]);
      if (hasSink)
        total += exp2Approx(sinkL2 - mUse);
      const float inv = total > 0.0f ? 1.0f / total : 0.0f; // no key and no sink: zeros
      if constexpr (!kStats) {
        if (t < L) {
#pragma unroll
          for (int n = 0; n < D / 8; ++n)
            storePair(p.out, row0 + t, h, n * 8 + c2, o[mt][n][2 * r] * inv, o[mt][n][2 * r + 1] * inv);
        }
      } else {
        float dot = 0.0f;
        if (t < L) {
          const bf16 *dor = p.dO + (row0 + t) * p.lddo + h * p.hsdo;
#pragma unroll
          for (int n = 0; n < D / 8; ++n) {
            const float2 d2 =
                __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(dor + n * 8 + c2));
            dot = fmaf(d2.x, o[mt][n][2 * r] * inv, dot);
            dot = fmaf(d2.y, o[mt][n][2 * r + 1] * inv, dot);
          }
        }
        dot = quadSum(dot);
        if ((lane & 3) == 0) { // t < Lp: the grid covers Lp rows
          const int64_t at = (static_cast<int64_t>(b) * p.H + h) * p.Lp + t;
          const float lse = t < L && total > 0.0f ? mUse + log2f(total) : INFINITY;
          p.lse[at] = lse;
          p.dsum[at] = t < L ? dot : 0.0f;
          if (p.sinkPart && t < L)
            p.sinkPart[(row0 + t) * p.H + h] = hasSink ? -exp2Approx(sinkL2 - lse) * dot : 0.0f;
        }
      }
    }
}

//===----------------------------------------------------------------------===//
// dQ
//===----------------------------------------------------------------------===//

template <int D, int BN> constexpr size_t dqShared() {
  return sizeof(bf16) * (D + kPad) * (2 * kQTile + 4 * BN); // Q, dO, 2 x (K, V)
}

template <int D, int MT, int BN>
__global__ void __launch_bounds__(kQueryThreads<MT>, 1) flashDqKernel(FlashParams p) {
  constexpr int LDS = D + kPad, BM = kQTile, kT = kQueryThreads<MT>, RW = 16 * MT;
  FLASH_SHARED_MEMORY(smem);
  bf16 *sQ = reinterpret_cast<bf16 *>(smem); // [BM][LDS]
  bf16 *sdO = sQ + BM * LDS;                 // [BM][LDS]
  bf16 *sK = sdO + BM * LDS;                 // [2][BN][LDS]
  bf16 *sV = sK + 2 * BN * LDS;              // [2][BN][LDS]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c2 = 2 * (lane & 3);
  const int h = blockIdx.x, b = blockIdx.y, kvh = h / p.group;
  const int q0 = (gridDim.z - 1 - blockIdx.z) * BM;
  const int L = p.L, wnd = p.window;
  const int64_t row0 = static_cast<int64_t>(b) * L;
  const int qLast = min(q0 + BM - 1, L - 1);
  const int jLo = (wnd > 0 ? max(0, q0 - wnd + 1) : 0) / BN, jHi = qLast / BN;
  const int tiles = jHi - jLo + 1;

  loadRows<D, BM, kT>(sQ, p.q + (row0 + q0) * p.ldq + h * p.hsq, p.ldq, L - q0, p.q);
  loadRows<D, BM, kT>(sdO, p.dO + (row0 + q0) * p.lddo + h * p.hsdo, p.lddo, L - q0, p.dO);
  auto loadKV = [&](int j, int buf) {
    const int k0 = j * BN;
    loadRows<D, BN, kT>(sK + buf * BN * LDS, p.k + (row0 + k0) * p.ldk + kvh * p.hsk, p.ldk, L - k0, p.k);
    loadRows<D, BN, kT>(sV + buf * BN * LDS, p.v + (row0 + k0) * p.ldv + kvh * p.hsv, p.ldv, L - k0, p.v);
  };
  loadKV(jLo, 0);
  cpAsyncCommit();

  const int offA = laneOffsetA<LDS>(lane), offB = laneOffsetB<LDS>(lane);
  const uint32_t qBase = sharedAddress(sQ), doBase = sharedAddress(sdO);
  const uint32_t kBase = sharedAddress(sK), vBase = sharedAddress(sV);
  constexpr uint32_t kTileBytes = 2u * BN * LDS;
  const int wr0 = q0 + warp * RW;
  int tRow[MT][2];
  float lse[MT][2], dsum[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) { // rows < Lp: +inf and 0 past L, so P = 0 there
      tRow[mt][r] = wr0 + 16 * mt + g + 8 * r;
      const int64_t at = (static_cast<int64_t>(b) * p.H + h) * p.Lp + tRow[mt][r];
      lse[mt][r] = p.lse[at];
      dsum[mt][r] = p.dsum[at];
    }
  float acc[MT][D / 8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        acc[mt][n][e] = 0.0f;

  for (int it = 0; it < tiles; ++it) {
    const int j = jLo + it, buf = it & 1;
    if (it + 1 < tiles) {
      loadKV(j + 1, buf ^ 1);
      cpAsyncCommit();
      cpAsyncWait<1>();
    } else {
      cpAsyncWait<0>();
    }
    __syncthreads();
    const int k0 = j * BN;
    const bool active = wr0 < L && k0 <= wr0 + RW - 1 && (wnd == 0 || k0 + BN - 1 > wr0 - wnd);
    if (active) {
      const uint32_t kb = kBase + buf * kTileBytes, vb = vBase + buf * kTileBytes;
      float s[MT][BN / 8][4], dp[MT][BN / 8][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int n = 0; n < BN / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            s[mt][n][e] = dp[mt][n][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
          loadA<LDS>(a[mt], qBase, offA, warp * RW + 16 * mt, kk * 16);
#pragma unroll
        for (int n = 0; n < BN / 8; n += 2) {
          uint32_t r[4];
          loadB<LDS>(r, kb, offB, n * 8, kk * 16);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma(s[mt][n], a[mt], r[0], r[1]);
            mma(s[mt][n + 1], a[mt], r[2], r[3]);
          }
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
          loadA<LDS>(a[mt], doBase, offA, warp * RW + 16 * mt, kk * 16);
#pragma unroll
        for (int n = 0; n < BN / 8; n += 2) {
          uint32_t r[4];
          loadB<LDS>(r, vb, offB, n * 8, kk * 16);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma(dp[mt][n], a[mt], r[0], r[1]);
            mma(dp[mt][n + 1], a[mt], r[2], r[3]);
          }
        }
      }
      const bool needMask = k0 + BN - 1 > wr0 || (wnd > 0 && wr0 + RW - 1 - k0 >= wnd);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int n = 0; n < BN / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float pv = exp2Approx(fmaf(s[mt][n][e], p.scaleLog2, -lse[mt][e >> 1]));
            if (needMask) {
              const int key = k0 + n * 8 + c2 + (e & 1), t = tRow[mt][e >> 1];
              if (key > t || (wnd > 0 && t - key >= wnd))
                pv = 0.0f;
            }
            dp[mt][n][e] = pv * (dp[mt][n][e] - dsum[mt][e >> 1]); // dS / scale
          }
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
          accumulatorsAsA(a[mt], dp[mt], kk);
#pragma unroll
        for (int n = 0; n < D / 8; n += 2) {
          uint32_t r[4];
          loadBT<LDS>(r, kb, offA, kk * 16, n * 8);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma(acc[mt][n], a[mt], r[0], r[1]);
            mma(acc[mt][n + 1], a[mt], r[2], r[3]);
          }
        }
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int t = tRow[mt][r];
      if (t < L) {
#pragma unroll
        for (int n = 0; n < D / 8; ++n)
          storePair(p.dq, row0 + t, h, n * 8 + c2, acc[mt][n][2 * r] * p.scale,
                    acc[mt][n][2 * r + 1] * p.scale);
      }
    }
}

//===----------------------------------------------------------------------===//
// dK, dV
//===----------------------------------------------------------------------===//

template <int D> constexpr size_t dkdvShared() {
  // K, V, then 2 x (Q, dO) and 2 x (lse, D).
  return sizeof(bf16) * (D + kPad) * (2 * kKvKeys + 4 * kKvQueries) + sizeof(float) * 4 * kKvQueries;
}

template <int D> __global__ void __launch_bounds__(kThreads, 1) flashDkDvKernel(FlashParams p) {
  constexpr int LDS = D + kPad, BN = kKvKeys, BM = kKvQueries;
  FLASH_SHARED_MEMORY(smem);
  bf16 *sK = reinterpret_cast<bf16 *>(smem);              // [BN][LDS]
  bf16 *sV = sK + BN * LDS;                               // [BN][LDS]
  bf16 *sQ = sV + BN * LDS;                               // [2][BM][LDS]
  bf16 *sdO = sQ + 2 * BM * LDS;                          // [2][BM][LDS]
  float *sL = reinterpret_cast<float *>(sdO + 2 * BM * LDS); // [2][BM]
  float *sD = sL + 2 * BM;                                // [2][BM]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c2 = 2 * (lane & 3);
  const int kvh = blockIdx.x / p.slices, slice = blockIdx.x % p.slices, b = blockIdx.y;
  const int s0 = blockIdx.z * BN; // key tile 0 (seen by the most queries) first
  const int L = p.L, wnd = p.window;
  const int64_t row0 = static_cast<int64_t>(b) * L;
  const int sLast = min(s0 + BN - 1, L - 1);
  const int tHi = wnd > 0 ? min(L - 1, sLast + wnd - 1) : L - 1;
  const int iLo = s0 / BM, perHead = tHi / BM - iLo + 1;
  const int steps = p.headsPerBlock * perHead;
  const int h0 = kvh * p.group + slice * p.headsPerBlock;

  loadRows<D, BN, kThreads>(sK, p.k + (row0 + s0) * p.ldk + kvh * p.hsk, p.ldk, L - s0, p.k);
  loadRows<D, BN, kThreads>(sV, p.v + (row0 + s0) * p.ldv + kvh * p.hsv, p.ldv, L - s0, p.v);
  auto loadStep = [&](int step, int buf) {
    const int h = h0 + step / perHead, t0 = (iLo + step % perHead) * BM;
    loadRows<D, BM, kThreads>(sQ + buf * BM * LDS, p.q + (row0 + t0) * p.ldq + h * p.hsq, p.ldq, L - t0, p.q);
    loadRows<D, BM, kThreads>(sdO + buf * BM * LDS, p.dO + (row0 + t0) * p.lddo + h * p.hsdo, p.lddo, L - t0,
                    p.dO);
    constexpr int kChunks = BM / 4; // 16-byte chunks of one statistics row
    const int i = threadIdx.x;
    if (i < 2 * kChunks) { // t0 + BM <= Lp: always in bounds
      const int64_t at = (static_cast<int64_t>(b) * p.H + h) * p.Lp + t0 + (i % kChunks) * 4;
      float *dst = (i < kChunks ? sL : sD) + buf * BM + (i % kChunks) * 4;
      cpAsync16(dst, (i < kChunks ? p.lse : p.dsum) + at, true);
    }
  };
  loadStep(0, 0);
  cpAsyncCommit();

  const int offA = laneOffsetA<LDS>(lane), offB = laneOffsetB<LDS>(lane);
  const uint32_t kBase = sharedAddress(sK), vBase = sharedAddress(sV);
  const uint32_t qBase = sharedAddress(sQ), doBase = sharedAddress(sdO);
  constexpr uint32_t kTileBytes = 2u * BM * LDS;
  const int ws0 = s0 + warp * 16; // this warp's first key
  const int sRow[2] = {ws0 + g, ws0 + g + 8};
  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      dk[n][e] = dv[n][e] = 0.0f;

  for (int step = 0; step < steps; ++step) {
    const int buf = step & 1;
    if (step + 1 < steps) {
      loadStep(step + 1, buf ^ 1);
      cpAsyncCommit();
      cpAsyncWait<1>();
    } else {
      cpAsyncWait<0>();
    }
    __syncthreads();
    const int t0 = (iLo + step % perHead) * BM;
    const bool active = ws0 < L && ws0 <= t0 + BM - 1 && (wnd == 0 || ws0 + 15 > t0 - wnd);
    if (active) {
      const uint32_t qb = qBase + buf * kTileBytes, dob = doBase + buf * kTileBytes;
      const float *lseRow = sL + buf * BM, *dRow = sD + buf * BM;
      // Sᵀ (keys x queries) and dPᵀ.
      float s[BM / 8][4], dp[BM / 8][4];
#pragma unroll
      for (int n = 0; n < BM / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          s[n][e] = dp[n][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t a[4];
        loadA<LDS>(a, kBase, offA, warp * 16, kk * 16);
#pragma unroll
        for (int n = 0; n < BM / 8; n += 2) {
          uint32_t r[4];
          loadB<LDS>(r, qb, offB, n * 8, kk * 16);
          mma(s[n], a, r[0], r[1]);
          mma(s[n + 1], a, r[2], r[3]);
        }
        loadA<LDS>(a, vBase, offA, warp * 16, kk * 16);
#pragma unroll
        for (int n = 0; n < BM / 8; n += 2) {
          uint32_t r[4];
          loadB<LDS>(r, dob, offB, n * 8, kk * 16);
          mma(dp[n], a, r[0], r[1]);
          mma(dp[n + 1], a, r[2], r[3]);
        }
      }
      const bool needMask = ws0 + 15 > t0 || (wnd > 0 && t0 + BM - 1 - ws0 >= wnd);
#pragma unroll
      for (int n = 0; n < BM / 8; ++n) {
        const float2 lz = *reinterpret_cast<const float2 *>(lseRow + n * 8 + c2);
        const float2 dz = *reinterpret_cast<const float2 *>(dRow + n * 8 + c2);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float lse = (e & 1) ? lz.y : lz.x, dd = (e & 1) ? dz.y : dz.x;
          float pv = exp2Approx(fmaf(s[n][e], p.scaleLog2, -lse));
          if (needMask) {
            const int t = t0 + n * 8 + c2 + (e & 1), key = sRow[e >> 1];
            if (key > t || (wnd > 0 && t - key >= wnd))
              pv = 0.0f;
          }
          s[n][e] = pv;
          dp[n][e] = pv * (dp[n][e] - dd); // dSᵀ / scale
        }
      }
#pragma unroll
      for (int kk = 0; kk < BM / 16; ++kk) {
        uint32_t pa[4], da[4];
        accumulatorsAsA(pa, s, kk);
        accumulatorsAsA(da, dp, kk);
#pragma unroll
        for (int n = 0; n < D / 8; n += 2) {
          uint32_t r[4];
          loadBT<LDS>(r, dob, offA, kk * 16, n * 8);
          mma(dv[n], pa, r[0], r[1]);
          mma(dv[n + 1], pa, r[2], r[3]);
          loadBT<LDS>(r, qb, offA, kk * 16, n * 8);
          mma(dk[n], da, r[0], r[1]);
          mma(dk[n + 1], da, r[2], r[3]);
        }
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int s = sRow[r];
    if (s >= L)
      continue;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      const int col = n * 8 + c2;
      const float k0 = dk[n][2 * r] * p.scale, k1 = dk[n][2 * r + 1] * p.scale;
      const float v0 = dv[n][2 * r], v1 = dv[n][2 * r + 1];
      if (p.slices == 1) {
        if (p.dk.t.p)
          storePair(p.dk, row0 + s, kvh, col, k0, k1);
        if (p.dv.t.p)
          storePair(p.dv, row0 + s, kvh, col, v0, v1);
      } else {
        const int64_t at =
            (static_cast<int64_t>(slice) * p.rows + row0 + s) * (static_cast<int64_t>(p.KV) * D) +
            kvh * D + col;
        if (p.dkPart)
          *reinterpret_cast<float2 *>(p.dkPart + at) = make_float2(k0, k1);
        if (p.dvPart)
          *reinterpret_cast<float2 *>(p.dvPart + at) = make_float2(v0, v1);
      }
    }
  }
}

constexpr int kSumThreads = 256;

/// out[row, head, col] = Σ_slice part[slice][row][head * d + col], slices in order.
__global__ void __launch_bounds__(kSumThreads)
    sumSlicesKernel(const float *part, int slices, int64_t rows, int heads, int d, OutMat out) {
  const int64_t width = static_cast<int64_t>(heads) * d, n = rows * width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kSumThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kSumThreads) {
    float acc = 0.0f;
    for (int s = 0; s < slices; ++s)
      acc += part[s * n + i];
    const int64_t row = i / width;
    const int c = static_cast<int>(i - row * width);
    st(out, row, c / d, c % d, acc);
  }
}

//===----------------------------------------------------------------------===//
// Host side
//===----------------------------------------------------------------------===//

bool envFlag(const char *name) {
  const char *v = std::getenv(name);
  return v && v[0] == '1';
}

bool alignedTo(const void *p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

/// A bf16 operand that 16-byte cp.async reads can load.
bool bf16Rows(const Mat &m) {
  return m.t.p && m.t.bf16 && alignedTo(m.t.p, 16) && m.ld % 8 == 0 && m.hs % 8 == 0;
}
/// An output that pairs of adjacent features can be stored to (or none).
bool pairOutput(const OutMat &m) {
  return !m.t.p || (alignedTo(m.t.p, 8) && m.ld % 2 == 0 && m.hs % 2 == 0);
}

FlashParams flashParams(const AttnParams &P) {
  FlashParams f;
  f.q = static_cast<const bf16 *>(P.qA.t.p);
  f.k = static_cast<const bf16 *>(P.kA.t.p);
  f.v = static_cast<const bf16 *>(P.v.t.p);
  f.dO = static_cast<const bf16 *>(P.dO.t.p);
  f.ldq = P.qA.ld, f.hsq = P.qA.hs;
  f.ldk = P.kA.ld, f.hsk = P.kA.hs;
  f.ldv = P.v.ld, f.hsv = P.v.hs;
  f.lddo = P.dO.ld, f.hsdo = P.dO.hs;
  f.out = P.out;
  f.dq = P.dqA;
  f.dk = P.dkA;
  f.dv = P.dV;
  f.sinks = P.sinks;
  f.L = static_cast<int>(P.L);
  f.H = P.H;
  f.KV = P.KV;
  f.group = P.group;
  f.window = P.window > 0 && P.window < P.L ? static_cast<int>(P.window) : 0;
  f.scale = P.scale;
  f.scaleLog2 = P.scale * kLog2e;
  f.Lp = (P.L + kStatsAlign - 1) / kStatsAlign * kStatsAlign;
  f.rows = P.L * P.B;
  return f;
}

/// Heads of a group per dK/dV block: all of them unless that leaves fewer
/// than kKvBlocksWanted blocks (then the largest divisor that gives enough,
/// else 1). MOEC_ATTENTION_HEADS_PER_BLOCK overrides it when it divides the
/// group (tests use it to reach both paths on small shapes).
int headsPerKvBlock(const AttnParams &P) {
  if (const char *v = std::getenv("MOEC_ATTENTION_HEADS_PER_BLOCK")) {
    const int forced = std::atoi(v);
    if (forced > 0 && P.group % forced == 0)
      return forced;
  }
  const int64_t perSlice = (P.L + kKvKeys - 1) / kKvKeys * P.B * P.KV;
  for (int hpb = P.group; hpb > 1; --hpb)
    if (P.group % hpb == 0 && perSlice * (P.group / hpb) >= kKvBlocksWanted)
      return hpb;
  return 1;
}

/// The shape of a query-tile kernel: queries per warp (16 or 32) x keys per K/V tile.
struct TileShape {
  int rows, keys;
};
// Defaults; MOEC_ATTENTION_FORWARD_TILES / MOEC_ATTENTION_DQ_TILES = 16x64, 32x64 or 32x32
// override them (attention_bench times each). With d = 128 (ptxas, sm_90): 16x64 uses
// 233-238 registers without spills; 32x32 255 with 8-68 bytes of spills; 32x64 spills
// 224-716 bytes (fine at d = 64: 253 registers, none or 32 bytes).
constexpr TileShape kForwardTiles{16, 64}, kDqTiles{16, 64};

TileShape tileShape(const char *env, TileShape otherwise) {
  const char *v = std::getenv(env);
  const std::string s = v ? v : "";
  if (s == "16x64")
    return {16, 64};
  if (s == "32x64")
    return {32, 64};
  if (s == "32x32")
    return {32, 32};
  return otherwise;
}

/// Calls f(MT, BN) as integral constants for a tile shape.
template <typename F> void withTileShape(TileShape t, F &&f) {
  if (t.rows == 32 && t.keys == 64)
    f(std::integral_constant<int, 2>{}, std::integral_constant<int, 64>{});
  else if (t.rows == 32)
    f(std::integral_constant<int, 2>{}, std::integral_constant<int, 32>{});
  else
    f(std::integral_constant<int, 1>{}, std::integral_constant<int, 64>{});
}

template <int D, bool kStats>
void launchForward(const KernelContext &ctx, const FlashParams &f, int B) {
  const char *what = kStats ? "attention backward (statistics)" : "attention";
  withTileShape(tileShape("MOEC_ATTENTION_FORWARD_TILES", kForwardTiles), [&](auto mt, auto bn) {
    constexpr int MT = decltype(mt)::value, BN = decltype(bn)::value;
    auto kernel = flashForwardKernel<D, MT, BN, kStats>;
    constexpr size_t shared = forwardShared<D, BN>();
    allowSharedMemory(ctx, kernel, shared, what);
    dim3 grid(static_cast<unsigned>(f.H), static_cast<unsigned>(B),
              static_cast<unsigned>((f.L + kQTile - 1) / kQTile));
    FLASH_LAUNCH(kernel, grid, kQueryThreads<MT>, shared, streamOf(ctx), f);
  });
  checkLaunch(ctx, what);
}

template <int D> void launchDq(const KernelContext &ctx, const FlashParams &f, int B) {
  withTileShape(tileShape("MOEC_ATTENTION_DQ_TILES", kDqTiles), [&](auto mt, auto bn) {
    constexpr int MT = decltype(mt)::value, BN = decltype(bn)::value;
    auto kernel = flashDqKernel<D, MT, BN>;
    constexpr size_t shared = dqShared<D, BN>();
    allowSharedMemory(ctx, kernel, shared, "attention backward (dq)");
    dim3 grid(static_cast<unsigned>(f.H), static_cast<unsigned>(B),
              static_cast<unsigned>((f.L + kQTile - 1) / kQTile));
    FLASH_LAUNCH(kernel, grid, kQueryThreads<MT>, shared, streamOf(ctx), f);
  });
  checkLaunch(ctx, "attention backward (dq)");
}

template <int D> void launchDkDv(const KernelContext &ctx, const FlashParams &f, int B) {
  auto kernel = flashDkDvKernel<D>;
  constexpr size_t shared = dkdvShared<D>();
  allowSharedMemory(ctx, kernel, shared, "attention backward (dk, dv)");
  dim3 grid(static_cast<unsigned>(f.KV * f.slices), static_cast<unsigned>(B),
            static_cast<unsigned>((f.L + kKvKeys - 1) / kKvKeys));
  FLASH_LAUNCH(kernel, grid, kThreads, shared, streamOf(ctx), f);
  checkLaunch(ctx, "attention backward (dk, dv)");
}

void sumSlices(const KernelContext &ctx, const float *part, const FlashParams &f, int d, OutMat out) {
  const int64_t n = f.rows * f.KV * d;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((n + kSumThreads - 1) / kSumThreads, 4096));
  FLASH_LAUNCH(sumSlicesKernel, dim3(blocks), kSumThreads, 0, streamOf(ctx), part, f.slices, f.rows,
               f.KV, d, out);
  checkLaunch(ctx, "attention backward (dk, dv slices)");
}

template <typename F> void withHeadDim(int d, F &&f) {
  if (d == 64)
    f(std::integral_constant<int, 64>{});
  else
    f(std::integral_constant<int, 128>{});
}

} // namespace

bool flashFits(const AttnParams &P, bool backward) {
  if (envFlag("MOEC_ATTENTION_GENERAL"))
    return false;
  const int d = P.dA;
  if (P.dB != 0 || P.dv != d || (d != 64 && d != 128))
    return false;
  if (!(P.scale > 0.0f) || !std::isfinite(P.scale))
    return false;
  // Grid limits: query / key tiles in z, sequences in y.
  if ((P.L + kQTile - 1) / kQTile > 65535 || P.B > 65535)
    return false;
  if (!bf16Rows(P.qA) || !bf16Rows(P.kA) || !bf16Rows(P.v))
    return false;
  if (!backward)
    return pairOutput(P.out);
  return bf16Rows(P.dO) && pairOutput(P.dqA) && pairOutput(P.dkA) && pairOutput(P.dV);
}

void flashForward(const KernelContext &ctx, const AttnParams &P) {
  FlashParams f = flashParams(P);
  const int B = static_cast<int>(P.B);
  withHeadDim(P.dA, [&](auto dim) { launchForward<decltype(dim)::value, false>(ctx, f, B); });
}

void flashBackward(const KernelContext &ctx, const AttnParams &P, Scratch &scratch, FloatOut dSinks) {
  FlashParams f = flashParams(P);
  const int B = static_cast<int>(P.B), d = P.dA;
  const bool wantDq = P.dqA.t.p, wantDkDv = P.dkA.t.p || P.dV.t.p;
  const bool wantSinks = dSinks.p && P.sinks.p;
  const int64_t stats = P.B * P.H * f.Lp;
  f.lse = scratch.floats(stats);
  f.dsum = scratch.floats(stats);
  f.sinkPart = wantSinks ? scratch.floats(f.rows * P.H) : nullptr;
  withHeadDim(d, [&](auto dim) {
    constexpr int D = decltype(dim)::value;
    launchForward<D, true>(ctx, f, B);
    if (wantSinks)
      reduceSinks(ctx, f.sinkPart, f.rows, P.H, dSinks);
    if (wantDkDv) {
      f.headsPerBlock = headsPerKvBlock(P);
      f.slices = P.group / f.headsPerBlock;
      if (f.slices > 1) {
        const int64_t part = f.slices * f.rows * P.KV * d;
        f.dkPart = P.dkA.t.p ? scratch.floats(part) : nullptr;
        f.dvPart = P.dV.t.p ? scratch.floats(part) : nullptr;
      }
      launchDkDv<D>(ctx, f, B);
      if (f.dkPart)
        sumSlices(ctx, f.dkPart, f, d, P.dkA);
      if (f.dvPart)
        sumSlices(ctx, f.dvPart, f, d, P.dV);
    }
    if (wantDq)
      launchDq<D>(ctx, f, B);
  });
}

} // namespace moec::runtime::cuda::attention
