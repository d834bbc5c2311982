//===- Flash.cu - tensor-core attention for bf16 storage (Dense.cu's fast path) ===//
//
// FlashAttention-2 style kernels for the dense core when q, k, v (and dO)
// are bf16 with (head dim, value dim) = (64, 64), (128, 128), (256, 256) or
// (192, 128); flashFits in Dense.cu has every condition. With 192 / 128
// (MLA: 128 nope + 64 rope features, value 128) query and key may come in
// two parts (A: the first dA features, B: the rest, MLA's rotated rope part,
// the key's shared by every head), as may their gradients. Products run on
// mma.sync m16n8k16 (bf16 operands, f32 accumulators) with fragments read by
// ldmatrix from padded shared-memory tiles (rows of d + 8 elements:
// conflict-free) that cp.async fills two stages deep; softmax math stays in
// f32 registers, in base 2 (logits times scale·log2 e, ex2.approx). Causal,
// sliding-window and sink semantics are Dense.cu's: allowed(t, s) = s <= t
// && t - s < window, the sink logit joins the denominator only.
//
//   forward (and the backward's statistics): one block per (128-query tile,
//     head, sequence), by default 8 warps of 16 queries, 64-key K/V tiles
//     streamed (32-key at head dim 256; other shapes: 4 warps of 32 queries,
//     32- or 64-key tiles; tileShape()), the Q fragments in registers up to
//     head dim 128 (beyond, re-read from shared memory: the registers go to
//     the output accumulators); S = Q Kᵀ, online softmax, O += P V with P
//     taken straight from the S accumulators (and the logsumexp, when the
//     op has that result). The statistics variant writes lse (base 2) and
//     D = dO · O per (sequence, head, query) instead of O, and the sink part
//     -p_sink · D; with the forward's result and logsumexp saved, a small
//     kernel (statisticsFromResult) forms them from those instead.
//   dK, dV (head dims 64, 128): one block of 8 warps per (128-key tile, kv
//     head, slice of the group's heads, sequence), 16 keys per warp; 64-query
//     tiles of Q, dO, lse, D streamed for each head of the slice: Sᵀ = K Qᵀ,
//     dPᵀ = V dOᵀ, Pᵀ = exp2(Sᵀ c - lse), dSᵀ = Pᵀ (dPᵀ - D), dV += Pᵀ dO,
//     dK += dSᵀ Q. With one slice the block writes dK, dV; with several
//     (enough blocks to fill the GPU) each slice writes f32 partials that a
//     second kernel sums in slice order.
//   dK, dV (wider heads: 256/256, 192/128): dK and dV of 16 keys do not fit
//     one warp's registers, so warps pair up: one block of 4 pairs per 64-key
//     tile; of each pair one warp forms Pᵀ (Sᵀ = K Qᵀ) and dV += Pᵀ dO, the
//     other dPᵀ = V dOᵀ, then (Pᵀ through shared memory) dSᵀ and dK += dSᵀ Q:
//     two of the four products each. Slices as above.
//   dQ: blocks as the forward (its own tile shape: 32-key tiles beyond head
//     dim 128); dS = P (dP - D) from S = Q Kᵀ and dP = dO Vᵀ, dQ += dS K over
//     the visible key tiles.
//   Where FlashWgmma.cu covers a backward (head dims 128, causal, Hopper),
//   its dK/dV and dQ kernels run instead of these two (with
//   MOEC_ATTENTION_SINGLE_PASS=1 one pass forms dK, dV and dQ, dQ summed by
//   atomic reductions into f32 and converted here: not deterministic).
//
// Only visible tiles are visited, and within a block a warp skips a tile it
// cannot see; masks are applied per element only on tiles that need them.
// No atomics in this file's kernels: every sum has a fixed order, so their
// results are deterministic.
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

constexpr int kPad = 8;          // elements of padding per shared-memory row (16 bytes)
constexpr int kQTile = 128;      // queries per block (forward, dQ)
constexpr int kThreads = 256;    // dK/dV blocks: 8 warps
constexpr int kKvKeys = 128;     // keys per block (dK, dV): 16 per warp
constexpr int kPairKeys = 64;    // keys per block (dK, dV of wide heads): 16 per warp pair
constexpr int kKvQueries = 64;   // queries per streamed tile (dK, dV)
constexpr int kPPad = 8;         // floats of padding per row of a pair's shared Pᵀ
constexpr int kStatsAlign = 128; // statistics rows per (sequence, head), padded
constexpr size_t kSharedLimit = 227 * 1024; // dynamic shared memory per block (sm_90 opt-in)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
// Blocks of the dK/dV kernel worth having before the heads of a group are
// split into slices (fixed, so the summation order does not depend on the GPU).
constexpr int64_t kKvBlocksWanted = 512;

/// Whether query and key may come in two parts (MLA's nope | rope): only
/// with the head dims MLA has (the others keep the plain loads' registers).
template <int DK, int DV> constexpr bool kParts = DK != DV;

/// Whether the dK/dV kernel of these head dims pairs warps (the accumulators
/// of dK and dV of 16 keys, plus Sᵀ and dPᵀ, exceed a warp's registers).
constexpr bool pairedDkDv(int dk, int dv) { return dk + dv > 256; }

/// Device views of the fast path; pointers at row 0, head 0, feature 0.
struct FlashParams {
  const bf16 *q = nullptr, *k = nullptr, *v = nullptr, *dO = nullptr;
  // Query / key features [dA, dk): part B (MLA's rope part); = q, k when dA = dk (never read).
  const bf16 *qb = nullptr, *kb = nullptr;
  int64_t ldq = 0, ldk = 0, ldv = 0, lddo = 0, ldqb = 0, ldkb = 0; // row strides (elements)
  int64_t hsq = 0, hsk = 0, hsv = 0, hsdo = 0, hsqb = 0, hskb = 0; // head strides (elements)
  int dA = 0;                                  // features of part A (a multiple of 8)
  OutMat out, dq, dk, dv, dqb, dkb;            // p null = not wanted; dqb, dkb: part B
  FloatIn sinks;                               // [H]; p null = none
  int L = 0, H = 0, KV = 0, group = 1;
  int window = 0; // 0 = none (also when it is at least L)
  float scaleLog2 = 0, scale = 0;
  // Statistics, [B * H][Lp] with Lp a multiple of kStatsAlign: rows >= L hold lse = +inf, D = 0.
  float *lse = nullptr, *dsum = nullptr;
  int64_t Lp = 0;
  float *lseOut = nullptr; // the forward's logsumexp result, [B * L][H], natural log; or null
  float *sinkPart = nullptr; // [B * L][H] or null
  // dK/dV slices: block (kv head, slice) handles heads kv*group + slice*headsPerBlock + [0, headsPerBlock).
  int slices = 1, headsPerBlock = 1;
  int64_t rows = 0;                           // B * L
  float *dkPart = nullptr, *dvPart = nullptr; // [slices][B * L][KV * dk], [...][KV * dv] (slices > 1)
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

/// Copies `ROWS` rows of D bf16 into a padded shared tile with cp.async (a
/// block of THREADS), zero-filling rows >= valid (`fallback`: any readable
/// address). Features [0, split) come from src (row stride ld); with PARTS,
/// the rest from srcB (row stride ldB) at feature - split: a query or key in
/// two parts (the B pointers are not used without PARTS).
template <int D, int ROWS, int THREADS, bool PARTS = false>
__device__ __forceinline__ void loadRows(bf16 *dst, const bf16 *src, int64_t ld, int valid,
                                         const bf16 *fallback, const bf16 *srcB = nullptr,
                                         int64_t ldB = 0, int split = D) {
  constexpr int kChunks = D / 8, kPerThread = ROWS * kChunks / THREADS;
  static_assert(ROWS * kChunks % THREADS == 0, "tile chunks must split evenly over the block");
#pragma unroll
  for (int it = 0; it < kPerThread; ++it) {
    const int i = it * THREADS + static_cast<int>(threadIdx.x);
    const int r = i / kChunks, c = i % kChunks;
    const bool ok = r < valid;
    if constexpr (PARTS) {
      const bf16 *from = fallback;
      if (ok)
        from = c * 8 < split ? src + r * ld + c * 8 : srcB + r * ldB + (c * 8 - split);
      cpAsync16(dst + r * (D + kPad) + c * 8, from, ok);
    } else {
      cpAsync16(dst + r * (D + kPad) + c * 8, ok ? src + r * ld + c * 8 : fallback, ok);
    }
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
/// ... of an output in two parts (features [0, split) in a, the rest in b), each if wanted.
__device__ __forceinline__ void storePairParts(const OutMat &a, const OutMat &b, int split, int64_t row,
                                               int head, int col, float x, float y) {
  if (col < split) {
    if (a.t.p)
      storePair(a, row, head, col, x, y);
  } else if (b.t.p) {
    storePair(b, row, head, col - split, x, y);
  }
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

constexpr size_t forwardShared(int dk, int dv, int bn) { // Q, 2 x (K, V)
  return sizeof(bf16) * (static_cast<size_t>(dk + kPad) * (kQTile + 2 * bn) +
                         static_cast<size_t>(dv + kPad) * 2 * bn);
}

template <int DK, int DV, int MT, int BN, bool kStats>
__global__ void __launch_bounds__(kQueryThreads<MT>, 1) flashForwardKernel(FlashParams p) {
  constexpr int LDK = DK + kPad, LDV = DV + kPad, BM = kQTile, kT = kQueryThreads<MT>, RW = 16 * MT;
  // With one m tile per warp and head dims up to 128 the Q fragments stay in
  // registers; otherwise registers go to the accumulators (the second m tile's,
  // or wider heads': with Q in registers 192 / 128 spills) and Q is re-read per k step.
  constexpr bool kQInRegisters = MT == 1 && DK <= 128;
  FLASH_SHARED_MEMORY(smem);
  bf16 *sQ = reinterpret_cast<bf16 *>(smem); // [BM][LDK]
  bf16 *sK = sQ + BM * LDK;                  // [2][BN][LDK]
  bf16 *sV = sK + 2 * BN * LDK;              // [2][BN][LDV]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c2 = 2 * (lane & 3);
  const int h = blockIdx.x, b = blockIdx.y, kvh = h / p.group;
  const int q0 = (gridDim.z - 1 - blockIdx.z) * BM; // the longest rows first
  const int L = p.L, wnd = p.window;
  const int64_t row0 = static_cast<int64_t>(b) * L;
  const int qLast = min(q0 + BM - 1, L - 1);
  const int jLo = (wnd > 0 ? max(0, q0 - wnd + 1) : 0) / BN, jHi = qLast / BN;
  const int tiles = jHi - jLo + 1;

  loadRows<DK, BM, kT, kParts<DK, DV>>(sQ, p.q + (row0 + q0) * p.ldq + h * p.hsq, p.ldq, L - q0, p.q,
                                       p.qb + (row0 + q0) * p.ldqb + h * p.hsqb, p.ldqb, p.dA);
  auto loadKV = [&](int j, int buf) {
    const int k0 = j * BN;
    loadRows<DK, BN, kT, kParts<DK, DV>>(sK + buf * BN * LDK, p.k + (row0 + k0) * p.ldk + kvh * p.hsk, p.ldk,
                                         L - k0, p.k, p.kb + (row0 + k0) * p.ldkb + kvh * p.hskb, p.ldkb,
                                         p.dA);
    loadRows<DV, BN, kT>(sV + buf * BN * LDV, p.v + (row0 + k0) * p.ldv + kvh * p.hsv, p.ldv, L - k0, p.v);
  };
  loadKV(jLo, 0);
  cpAsyncCommit();

  const int offAK = laneOffsetA<LDK>(lane), offBK = laneOffsetB<LDK>(lane), offAV = laneOffsetA<LDV>(lane);
  const uint32_t qBase = sharedAddress(sQ), kBase = sharedAddress(sK), vBase = sharedAddress(sV);
  constexpr uint32_t kTileBytesK = 2u * BN * LDK, kTileBytesV = 2u * BN * LDV;
  const int wr0 = q0 + warp * RW; // this warp's first query; m tile mt: wr0 + 16 mt + [0, 16)
  int tRow[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      tRow[mt][r] = wr0 + 16 * mt + g + 8 * r;
  const bool hasSink = p.sinks.p != nullptr;
  const float sinkL2 = hasSink ? ld(p.sinks, h) * kLog2e : -INFINITY;

  uint32_t qf[kQInRegisters ? DK / 16 : 1][4];
  float o[MT][DV / 8][4];
  // Running max (base-2 logits; the sink's counts from the start) and this lane's partial sums.
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int n = 0; n < DV / 8; ++n)
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
      for (int kk = 0; kk < (kQInRegisters ? DK / 16 : 0); ++kk)
        loadA<LDK>(qf[kk], qBase, offAK, warp * RW, kk * 16);
    }
    const int k0 = j * BN;
    const bool active = wr0 < L && k0 <= wr0 + RW - 1 && (wnd == 0 || k0 + BN - 1 > wr0 - wnd);
    if (active) {
      const uint32_t kb = kBase + buf * kTileBytesK, vb = vBase + buf * kTileBytesV;
      float s[MT][BN / 8][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int n = 0; n < BN / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            s[mt][n][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < DK / 16; ++kk) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if constexpr (kQInRegisters) {
#pragma unroll
            for (int i = 0; i < 4; ++i)
              a[mt][i] = qf[kk][i];
          } else {
            loadA<LDK>(a[mt], qBase, offAK, warp * RW + 16 * mt, kk * 16);
          }
        }
#pragma unroll
        for (int n = 0; n < BN / 8; n += 2) {
          uint32_t r[4];
          loadB<LDK>(r, kb, offBK, n * 8, kk * 16);
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
          for (int n = 0; n < DV / 8; ++n) {
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
        for (int n = 0; n < DV / 8; n += 2) {
          uint32_t r[4];
          loadBT<LDV>(r, vb, offAV, kk * 16, n * 8);
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
          for (int n = 0; n < DV / 8; ++n)
            storePair(p.out, row0 + t, h, n * 8 + c2, o[mt][n][2 * r] * inv, o[mt][n][2 * r + 1] * inv);
          if (p.lseOut && (lane & 3) == 0)
            p.lseOut[(row0 + t) * p.H + h] = total > 0.0f ? (mUse + log2f(total)) * kLn2 : INFINITY;
        }
      } else {
        float dot = 0.0f;
        if (t < L) {
          const bf16 *dor = p.dO + (row0 + t) * p.lddo + h * p.hsdo;
#pragma unroll
          for (int n = 0; n < DV / 8; ++n) {
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

constexpr size_t dqShared(int dk, int dv, int bn) { // Q, dO, 2 x (K, V)
  return sizeof(bf16) * static_cast<size_t>(dk + dv + 2 * kPad) * (kQTile + 2 * bn);
}

template <int DK, int DV, int MT, int BN>
__global__ void __launch_bounds__(kQueryThreads<MT>, 1) flashDqKernel(FlashParams p) {
  constexpr int LDK = DK + kPad, LDV = DV + kPad, BM = kQTile, kT = kQueryThreads<MT>, RW = 16 * MT;
  FLASH_SHARED_MEMORY(smem);
  bf16 *sQ = reinterpret_cast<bf16 *>(smem); // [BM][LDK]
  bf16 *sdO = sQ + BM * LDK;                 // [BM][LDV]
  bf16 *sK = sdO + BM * LDV;                 // [2][BN][LDK]
  bf16 *sV = sK + 2 * BN * LDK;              // [2][BN][LDV]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c2 = 2 * (lane & 3);
  const int h = blockIdx.x, b = blockIdx.y, kvh = h / p.group;
  const int q0 = (gridDim.z - 1 - blockIdx.z) * BM;
  const int L = p.L, wnd = p.window;
  const int64_t row0 = static_cast<int64_t>(b) * L;
  const int qLast = min(q0 + BM - 1, L - 1);
  const int jLo = (wnd > 0 ? max(0, q0 - wnd + 1) : 0) / BN, jHi = qLast / BN;
  const int tiles = jHi - jLo + 1;

  loadRows<DK, BM, kT, kParts<DK, DV>>(sQ, p.q + (row0 + q0) * p.ldq + h * p.hsq, p.ldq, L - q0, p.q,
                                       p.qb + (row0 + q0) * p.ldqb + h * p.hsqb, p.ldqb, p.dA);
  loadRows<DV, BM, kT>(sdO, p.dO + (row0 + q0) * p.lddo + h * p.hsdo, p.lddo, L - q0, p.dO);
  auto loadKV = [&](int j, int buf) {
    const int k0 = j * BN;
    loadRows<DK, BN, kT, kParts<DK, DV>>(sK + buf * BN * LDK, p.k + (row0 + k0) * p.ldk + kvh * p.hsk, p.ldk,
                                         L - k0, p.k, p.kb + (row0 + k0) * p.ldkb + kvh * p.hskb, p.ldkb,
                                         p.dA);
    loadRows<DV, BN, kT>(sV + buf * BN * LDV, p.v + (row0 + k0) * p.ldv + kvh * p.hsv, p.ldv, L - k0, p.v);
  };
  loadKV(jLo, 0);
  cpAsyncCommit();

  const int offAK = laneOffsetA<LDK>(lane), offBK = laneOffsetB<LDK>(lane);
  const int offAV = laneOffsetA<LDV>(lane), offBV = laneOffsetB<LDV>(lane);
  const uint32_t qBase = sharedAddress(sQ), doBase = sharedAddress(sdO);
  const uint32_t kBase = sharedAddress(sK), vBase = sharedAddress(sV);
  constexpr uint32_t kTileBytesK = 2u * BN * LDK, kTileBytesV = 2u * BN * LDV;
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
  float acc[MT][DK / 8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < DK / 8; ++n)
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
      const uint32_t kb = kBase + buf * kTileBytesK, vb = vBase + buf * kTileBytesV;
      float s[MT][BN / 8][4], dp[MT][BN / 8][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int n = 0; n < BN / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            s[mt][n][e] = dp[mt][n][e] = 0.0f;
      // S over DK features and dP over DV, interleaved per k step.
#pragma unroll
      for (int kk = 0; kk < (DK > DV ? DK : DV) / 16; ++kk) {
        uint32_t a[MT][4];
        if (kk < DK / 16) {
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
            loadA<LDK>(a[mt], qBase, offAK, warp * RW + 16 * mt, kk * 16);
#pragma unroll
          for (int n = 0; n < BN / 8; n += 2) {
            uint32_t r[4];
            loadB<LDK>(r, kb, offBK, n * 8, kk * 16);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
              mma(s[mt][n], a[mt], r[0], r[1]);
              mma(s[mt][n + 1], a[mt], r[2], r[3]);
            }
          }
        }
        if (kk < DV / 16) {
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
            loadA<LDV>(a[mt], doBase, offAV, warp * RW + 16 * mt, kk * 16);
#pragma unroll
          for (int n = 0; n < BN / 8; n += 2) {
            uint32_t r[4];
            loadB<LDV>(r, vb, offBV, n * 8, kk * 16);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
              mma(dp[mt][n], a[mt], r[0], r[1]);
              mma(dp[mt][n + 1], a[mt], r[2], r[3]);
            }
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
        for (int n = 0; n < DK / 8; n += 2) {
          uint32_t r[4];
          loadBT<LDK>(r, kb, offAK, kk * 16, n * 8);
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
        for (int n = 0; n < DK / 8; ++n) {
          const float x = acc[mt][n][2 * r] * p.scale, y = acc[mt][n][2 * r + 1] * p.scale;
          if constexpr (kParts<DK, DV>)
            storePairParts(p.dq, p.dqb, p.dA, row0 + t, h, n * 8 + c2, x, y);
          else
            storePair(p.dq, row0 + t, h, n * 8 + c2, x, y);
        }
      }
    }
}

//===----------------------------------------------------------------------===//
// dK, dV
//===----------------------------------------------------------------------===//

constexpr size_t dkdvShared(int dk, int dv) { // K, V, then 2 x (Q, dO) and 2 x (lse, D)
  return sizeof(bf16) * static_cast<size_t>(dk + dv + 2 * kPad) * (kKvKeys + 2 * kKvQueries) +
         sizeof(float) * 4 * kKvQueries;
}

/// The store of two features of a key's dK or dV (both kernels): to dK (in
/// two parts with PARTS) or dV, each if wanted, or to the f32 partials of
/// this block's slice.
template <bool PARTS>
__device__ __forceinline__ void storeKeyPair(const FlashParams &p, bool isDk, int slice, int64_t row,
                                             int kvh, int width, int col, float x, float y) {
  if (p.slices == 1) {
    if (isDk && PARTS)
      storePairParts(p.dk, p.dkb, p.dA, row, kvh, col, x, y);
    else if (isDk ? p.dk.t.p : p.dv.t.p)
      storePair(isDk ? p.dk : p.dv, row, kvh, col, x, y);
    return;
  }
  float *part = isDk ? p.dkPart : p.dvPart;
  if (part) {
    const int64_t at = (static_cast<int64_t>(slice) * p.rows + row) * (static_cast<int64_t>(p.KV) * width) +
                       static_cast<int64_t>(kvh) * width + col;
    *reinterpret_cast<float2 *>(part + at) = make_float2(x, y);
  }
}

template <int DK, int DV> __global__ void __launch_bounds__(kThreads, 1) flashDkDvKernel(FlashParams p) {
  constexpr int LDK = DK + kPad, LDV = DV + kPad, BN = kKvKeys, BM = kKvQueries;
  FLASH_SHARED_MEMORY(smem);
  bf16 *sK = reinterpret_cast<bf16 *>(smem);                 // [BN][LDK]
  bf16 *sV = sK + BN * LDK;                                  // [BN][LDV]
  bf16 *sQ = sV + BN * LDV;                                  // [2][BM][LDK]
  bf16 *sdO = sQ + 2 * BM * LDK;                             // [2][BM][LDV]
  float *sL = reinterpret_cast<float *>(sdO + 2 * BM * LDV); // [2][BM]
  float *sD = sL + 2 * BM;                                   // [2][BM]
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

  loadRows<DK, BN, kThreads, kParts<DK, DV>>(sK, p.k + (row0 + s0) * p.ldk + kvh * p.hsk, p.ldk, L - s0, p.k,
                                             p.kb + (row0 + s0) * p.ldkb + kvh * p.hskb, p.ldkb, p.dA);
  loadRows<DV, BN, kThreads>(sV, p.v + (row0 + s0) * p.ldv + kvh * p.hsv, p.ldv, L - s0, p.v);
  auto loadStep = [&](int step, int buf) {
    const int h = h0 + step / perHead, t0 = (iLo + step % perHead) * BM;
    loadRows<DK, BM, kThreads, kParts<DK, DV>>(sQ + buf * BM * LDK, p.q + (row0 + t0) * p.ldq + h * p.hsq,
                                               p.ldq, L - t0, p.q, p.qb + (row0 + t0) * p.ldqb + h * p.hsqb,
                                               p.ldqb, p.dA);
    loadRows<DV, BM, kThreads>(sdO + buf * BM * LDV, p.dO + (row0 + t0) * p.lddo + h * p.hsdo, p.lddo,
                               L - t0, p.dO);
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

  const int offAK = laneOffsetA<LDK>(lane), offBK = laneOffsetB<LDK>(lane);
  const int offAV = laneOffsetA<LDV>(lane), offBV = laneOffsetB<LDV>(lane);
  const uint32_t kBase = sharedAddress(sK), vBase = sharedAddress(sV);
  const uint32_t qBase = sharedAddress(sQ), doBase = sharedAddress(sdO);
  constexpr uint32_t kTileBytesQ = 2u * BM * LDK, kTileBytesO = 2u * BM * LDV;
  const int ws0 = s0 + warp * 16; // this warp's first key
  const int sRow[2] = {ws0 + g, ws0 + g + 8};
  float dk[DK / 8][4], dv[DV / 8][4];
#pragma unroll
  for (int n = 0; n < DK / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      dk[n][e] = 0.0f;
#pragma unroll
  for (int n = 0; n < DV / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      dv[n][e] = 0.0f;

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
      const uint32_t qb = qBase + buf * kTileBytesQ, dob = doBase + buf * kTileBytesO;
      const float *lseRow = sL + buf * BM, *dRow = sD + buf * BM;
      // Sᵀ (keys x queries) and dPᵀ.
      float s[BM / 8][4], dp[BM / 8][4];
#pragma unroll
      for (int n = 0; n < BM / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          s[n][e] = dp[n][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < (DK > DV ? DK : DV) / 16; ++kk) {
        uint32_t a[4];
        if (kk < DK / 16) {
          loadA<LDK>(a, kBase, offAK, warp * 16, kk * 16);
#pragma unroll
          for (int n = 0; n < BM / 8; n += 2) {
            uint32_t r[4];
            loadB<LDK>(r, qb, offBK, n * 8, kk * 16);
            mma(s[n], a, r[0], r[1]);
            mma(s[n + 1], a, r[2], r[3]);
          }
        }
        if (kk < DV / 16) {
          loadA<LDV>(a, vBase, offAV, warp * 16, kk * 16);
#pragma unroll
          for (int n = 0; n < BM / 8; n += 2) {
            uint32_t r[4];
            loadB<LDV>(r, dob, offBV, n * 8, kk * 16);
            mma(dp[n], a, r[0], r[1]);
            mma(dp[n + 1], a, r[2], r[3]);
          }
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
        for (int n = 0; n < (DK > DV ? DK : DV) / 8; n += 2) {
          uint32_t r[4];
          if (n < DV / 8) {
            loadBT<LDV>(r, dob, offAV, kk * 16, n * 8);
            mma(dv[n], pa, r[0], r[1]);
            mma(dv[n + 1], pa, r[2], r[3]);
          }
          if (n < DK / 8) {
            loadBT<LDK>(r, qb, offAK, kk * 16, n * 8);
            mma(dk[n], da, r[0], r[1]);
            mma(dk[n + 1], da, r[2], r[3]);
          }
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
    for (int n = 0; n < (DK > DV ? DK : DV) / 8; ++n) {
      const int col = n * 8 + c2;
      const float k0 = dk[n < DK / 8 ? n : 0][2 * r] * p.scale,
                  k1 = dk[n < DK / 8 ? n : 0][2 * r + 1] * p.scale;
      const float v0 = dv[n < DV / 8 ? n : 0][2 * r], v1 = dv[n < DV / 8 ? n : 0][2 * r + 1];
      if (p.slices == 1) {
        if (n < DK / 8) {
          if constexpr (kParts<DK, DV>)
            storePairParts(p.dk, p.dkb, p.dA, row0 + s, kvh, col, k0, k1);
          else if (p.dk.t.p)
            storePair(p.dk, row0 + s, kvh, col, k0, k1);
        }
        if (n < DV / 8 && p.dv.t.p)
          storePair(p.dv, row0 + s, kvh, col, v0, v1);
      } else {
        const int64_t row = static_cast<int64_t>(slice) * p.rows + row0 + s;
        if (n < DK / 8 && p.dkPart)
          *reinterpret_cast<float2 *>(p.dkPart + row * (static_cast<int64_t>(p.KV) * DK) + kvh * DK + col) =
              make_float2(k0, k1);
        if (n < DV / 8 && p.dvPart)
          *reinterpret_cast<float2 *>(p.dvPart + row * (static_cast<int64_t>(p.KV) * DV) + kvh * DV + col) =
              make_float2(v0, v1);
      }
    }
  }
}

constexpr size_t dkdvPairShared(int dk, int dv) {
  // K, V, then 2 x (Q, dO), 2 x (lse, D) and each pair's Pᵀ (16 keys x 64 queries, f32).
  return sizeof(bf16) * static_cast<size_t>(dk + dv + 2 * kPad) * (kPairKeys + 2 * kKvQueries) +
         sizeof(float) * (4 * kKvQueries + 4 * 16 * (kKvQueries + kPPad));
}

/// dK, dV of wide heads: warp w < 4 and warp w + 4 share keys s0 + 16w + [0, 16);
/// the first forms Pᵀ (into shared memory) and dV, the second dPᵀ, dSᵀ and dK.
template <int DK, int DV> __global__ void __launch_bounds__(kThreads, 1) flashDkDvPairKernel(FlashParams p) {
  constexpr int LDK = DK + kPad, LDV = DV + kPad, BN = kPairKeys, BM = kKvQueries, LDP = BM + kPPad;
  FLASH_SHARED_MEMORY(smem);
  bf16 *sK = reinterpret_cast<bf16 *>(smem);                 // [BN][LDK]
  bf16 *sV = sK + BN * LDK;                                  // [BN][LDV]
  bf16 *sQ = sV + BN * LDV;                                  // [2][BM][LDK]
  bf16 *sdO = sQ + 2 * BM * LDK;                             // [2][BM][LDV]
  float *sL = reinterpret_cast<float *>(sdO + 2 * BM * LDV); // [2][BM]
  float *sD = sL + 2 * BM;                                   // [2][BM]
  float *sP = sD + 2 * BM;                                   // [4 pairs][16][LDP]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c2 = 2 * (lane & 3);
  const int pair = warp & 3;
  const bool pWarp = warp < 4; // Pᵀ and dV; else dPᵀ, dSᵀ and dK (warp-uniform)
  const int kvh = blockIdx.x / p.slices, slice = blockIdx.x % p.slices, b = blockIdx.y;
  const int s0 = blockIdx.z * BN; // key tile 0 (seen by the most queries) first
  const int L = p.L, wnd = p.window;
  const int64_t row0 = static_cast<int64_t>(b) * L;
  const int sLast = min(s0 + BN - 1, L - 1);
  const int tHi = wnd > 0 ? min(L - 1, sLast + wnd - 1) : L - 1;
  const int iLo = s0 / BM, perHead = tHi / BM - iLo + 1;
  const int steps = p.headsPerBlock * perHead;
  const int h0 = kvh * p.group + slice * p.headsPerBlock;

  loadRows<DK, BN, kThreads, kParts<DK, DV>>(sK, p.k + (row0 + s0) * p.ldk + kvh * p.hsk, p.ldk, L - s0, p.k,
                                             p.kb + (row0 + s0) * p.ldkb + kvh * p.hskb, p.ldkb, p.dA);
  loadRows<DV, BN, kThreads>(sV, p.v + (row0 + s0) * p.ldv + kvh * p.hsv, p.ldv, L - s0, p.v);
  auto loadStep = [&](int step, int buf) {
    const int h = h0 + step / perHead, t0 = (iLo + step % perHead) * BM;
    loadRows<DK, BM, kThreads, kParts<DK, DV>>(sQ + buf * BM * LDK, p.q + (row0 + t0) * p.ldq + h * p.hsq,
                                               p.ldq, L - t0, p.q, p.qb + (row0 + t0) * p.ldqb + h * p.hsqb,
                                               p.ldqb, p.dA);
    loadRows<DV, BM, kThreads>(sdO + buf * BM * LDV, p.dO + (row0 + t0) * p.lddo + h * p.hsdo, p.lddo,
                               L - t0, p.dO);
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

  const int offAK = laneOffsetA<LDK>(lane), offBK = laneOffsetB<LDK>(lane);
  const int offAV = laneOffsetA<LDV>(lane), offBV = laneOffsetB<LDV>(lane);
  const uint32_t kBase = sharedAddress(sK), vBase = sharedAddress(sV);
  const uint32_t qBase = sharedAddress(sQ), doBase = sharedAddress(sdO);
  constexpr uint32_t kTileBytesQ = 2u * BM * LDK, kTileBytesO = 2u * BM * LDV;
  const int ws0 = s0 + pair * 16; // this pair's first key
  const int sRow[2] = {ws0 + g, ws0 + g + 8};
  float *sPair = sP + pair * 16 * LDP; // Pᵀ of this pair's keys: [16][LDP]
  // dV (the P warp: DV / 8 tiles) or dK (the other: DK / 8).
  constexpr int kAccTiles = (DK > DV ? DK : DV) / 8;
  float acc[kAccTiles][4];
#pragma unroll
  for (int n = 0; n < kAccTiles; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      acc[n][e] = 0.0f;

  for (int step = 0; step < steps; ++step) {
    const int buf = step & 1;
    if (step + 1 < steps) {
      loadStep(step + 1, buf ^ 1);
      cpAsyncCommit();
      cpAsyncWait<1>();
    } else {
      cpAsyncWait<0>();
    }
    __syncthreads(); // also: the previous step's Pᵀ is consumed
    const int t0 = (iLo + step % perHead) * BM;
    const bool active = ws0 < L && ws0 <= t0 + BM - 1 && (wnd == 0 || ws0 + 15 > t0 - wnd);
    const uint32_t qb = qBase + buf * kTileBytesQ, dob = doBase + buf * kTileBytesO;
    const float *lseRow = sL + buf * BM, *dRow = sD + buf * BM;
    // The P warp: Sᵀ, then Pᵀ; the other: dPᵀ, then dSᵀ / scale (keys x queries).
    float x[BM / 8][4];
    if (active) {
#pragma unroll
      for (int n = 0; n < BM / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          x[n][e] = 0.0f;
      if (pWarp) {
#pragma unroll
        for (int kk = 0; kk < DK / 16; ++kk) {
          uint32_t a[4];
          loadA<LDK>(a, kBase, offAK, pair * 16, kk * 16);
#pragma unroll
          for (int n = 0; n < BM / 8; n += 2) {
            uint32_t r[4];
            loadB<LDK>(r, qb, offBK, n * 8, kk * 16);
            mma(x[n], a, r[0], r[1]);
            mma(x[n + 1], a, r[2], r[3]);
          }
        }
        const bool needMask = ws0 + 15 > t0 || (wnd > 0 && t0 + BM - 1 - ws0 >= wnd);
#pragma unroll
        for (int n = 0; n < BM / 8; ++n) {
          const float2 lz = *reinterpret_cast<const float2 *>(lseRow + n * 8 + c2);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float pv = exp2Approx(fmaf(x[n][e], p.scaleLog2, -((e & 1) ? lz.y : lz.x)));
            if (needMask) {
              const int t = t0 + n * 8 + c2 + (e & 1), key = sRow[e >> 1];
              if (key > t || (wnd > 0 && t - key >= wnd))
                pv = 0.0f;
            }
            x[n][e] = pv;
          }
#pragma unroll
          for (int r = 0; r < 2; ++r)
            *reinterpret_cast<float2 *>(sPair + (g + 8 * r) * LDP + n * 8 + c2) =
                make_float2(x[n][2 * r], x[n][2 * r + 1]);
        }
      } else {
#pragma unroll
        for (int kk = 0; kk < DV / 16; ++kk) {
          uint32_t a[4];
          loadA<LDV>(a, vBase, offAV, pair * 16, kk * 16);
#pragma unroll
          for (int n = 0; n < BM / 8; n += 2) {
            uint32_t r[4];
            loadB<LDV>(r, dob, offBV, n * 8, kk * 16);
            mma(x[n], a, r[0], r[1]);
            mma(x[n + 1], a, r[2], r[3]);
          }
        }
      }
    }
    __syncthreads(); // Pᵀ is in shared memory
    if (active) {
      if (pWarp) {
#pragma unroll
        for (int kk = 0; kk < BM / 16; ++kk) {
          uint32_t pa[4];
          accumulatorsAsA(pa, x, kk);
#pragma unroll
          for (int n = 0; n < DV / 8; n += 2) {
            uint32_t r[4];
            loadBT<LDV>(r, dob, offAV, kk * 16, n * 8);
            mma(acc[n], pa, r[0], r[1]);
            mma(acc[n + 1], pa, r[2], r[3]);
          }
        }
      } else {
#pragma unroll
        for (int n = 0; n < BM / 8; ++n) {
          const float2 dz = *reinterpret_cast<const float2 *>(dRow + n * 8 + c2);
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const float2 pv = *reinterpret_cast<const float2 *>(sPair + (g + 8 * r) * LDP + n * 8 + c2);
            x[n][2 * r] = pv.x * (x[n][2 * r] - dz.x);
            x[n][2 * r + 1] = pv.y * (x[n][2 * r + 1] - dz.y);
          }
        }
#pragma unroll
        for (int kk = 0; kk < BM / 16; ++kk) {
          uint32_t da[4];
          accumulatorsAsA(da, x, kk);
#pragma unroll
          for (int n = 0; n < DK / 8; n += 2) {
            uint32_t r[4];
            loadBT<LDK>(r, qb, offAK, kk * 16, n * 8);
            mma(acc[n], da, r[0], r[1]);
            mma(acc[n + 1], da, r[2], r[3]);
          }
        }
      }
    }
    __syncthreads(); // buffer `buf` is refilled by the next step's prefetch
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int s = sRow[r];
    if (s >= L)
      continue;
    if (pWarp) {
#pragma unroll
      for (int n = 0; n < DV / 8; ++n)
        storeKeyPair<kParts<DK, DV>>(p, false, slice, row0 + s, kvh, DV, n * 8 + c2, acc[n][2 * r],
                                     acc[n][2 * r + 1]);
    } else {
#pragma unroll
      for (int n = 0; n < DK / 8; ++n)
        storeKeyPair<kParts<DK, DV>>(p, true, slice, row0 + s, kvh, DK, n * 8 + c2, acc[n][2 * r] * p.scale,
                                     acc[n][2 * r + 1] * p.scale);
    }
  }
}

constexpr int kSumThreads = 256;

/// out[row, head, col] = Σ_slice part[slice][row][head * d + col], slices in
/// order; features [split, d) go to outB (part B) at col - split.
__global__ void __launch_bounds__(kSumThreads)
    sumSlicesKernel(const float *part, int slices, int64_t rows, int heads, int d, OutMat out,
                    OutMat outB, int split) {
  const int64_t width = static_cast<int64_t>(heads) * d, n = rows * width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kSumThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kSumThreads) {
    float acc = 0.0f;
    for (int s = 0; s < slices; ++s)
      acc += part[s * n + i];
    const int64_t row = i / width;
    const int c = static_cast<int>(i - row * width), col = c % d;
    if (col < split) {
      if (out.t.p)
        st(out, row, c / d, col, acc);
    } else if (outB.t.p) {
      st(outB, row, c / d, col - split, acc);
    }
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
  f.dA = P.dA;
  if (P.dB > 0) {
    f.qb = static_cast<const bf16 *>(P.qB.t.p);
    f.kb = static_cast<const bf16 *>(P.kB.t.p);
    f.ldqb = P.qB.ld, f.hsqb = P.qB.hs;
    f.ldkb = P.kB.ld, f.hskb = P.kB.hs;
  } else { // never read (every feature is in part A), but valid addresses
    f.qb = f.q, f.ldqb = f.ldq, f.hsqb = f.hsq;
    f.kb = f.k, f.ldkb = f.ldk, f.hskb = f.hsk;
  }
  f.out = P.out;
  f.lseOut = P.lseOut;
  f.dq = P.dqA;
  f.dqb = P.dqB;
  f.dk = P.dkA;
  f.dkb = P.dkB;
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

/// Heads of a group per dK/dV block (of `keys` keys): all of them unless that
/// leaves fewer than kKvBlocksWanted blocks (then the largest divisor that
/// gives enough, else 1). MOEC_ATTENTION_HEADS_PER_BLOCK overrides it when it
/// divides the group (tests use it to reach both paths on small shapes).
int headsPerKvBlock(const AttnParams &P, int keys) {
  if (const char *v = std::getenv("MOEC_ATTENTION_HEADS_PER_BLOCK")) {
    const int forced = std::atoi(v);
    if (forced > 0 && P.group % forced == 0)
      return forced;
  }
  const int64_t perSlice = (P.L + keys - 1) / keys * P.B * P.KV;
  for (int hpb = P.group; hpb > 1; --hpb)
    if (P.group % hpb == 0 && perSlice * (P.group / hpb) >= kKvBlocksWanted)
      return hpb;
  return 1;
}

/// The shape of a query-tile kernel: queries per warp (16 or 32) x keys per K/V tile.
struct TileShape {
  int rows, keys;
};

/// Whether a query-tile kernel (the forward or dQ) of these head dims has this
/// shape: two m tiles per warp only with head dims up to 128 (beyond, their
/// accumulators spill), and the shared memory fits.
constexpr bool queryShapeOk(int dk, int dv, TileShape t, bool dq) {
  return (t.rows == 16 || (dk <= 128 && dv <= 128)) &&
         (dq ? dqShared(dk, dv, t.keys) : forwardShared(dk, dv, t.keys)) <= kSharedLimit;
}

// MOEC_ATTENTION_FORWARD_TILES / MOEC_ATTENTION_DQ_TILES = 16x64, 16x32, 32x64 or 32x32
// override the defaults where queryShapeOk (attention_bench times each). Registers (ptxas
// -v, sm_90; 255 = the cap of one 256-thread block per SM):
//   d 64, 128: 16x64 157-238 without spills (the defaults); 32x32 at d 128: 255, 8-88
//     bytes of spills; 32x64 224-716 bytes at d 128, 0-40 at d 64.
//   d 192/128 (MLA): forward 16x64 254, none; dQ 16x64 40 bytes, 16x32 248, none.
//   d 256: forward 16x64 240-296 bytes of spills, 16x32 248-252, none; dQ only 16x32
//     (16x64 needs 264 KiB of shared memory): 250, none.
// so the defaults are 16x64, except 16x32 for dQ beyond d 128 and for the forward at 256.
TileShape tileShape(const char *env, int dk, int dv, bool dq) {
  TileShape t{16, (dq ? dk <= 128 : dk <= 192) ? 64 : 32};
  const char *v = std::getenv(env);
  const std::string s = v ? v : "";
  for (TileShape forced : {TileShape{16, 64}, TileShape{16, 32}, TileShape{32, 64}, TileShape{32, 32}})
    if (s == std::to_string(forced.rows) + "x" + std::to_string(forced.keys) &&
        queryShapeOk(dk, dv, forced, dq))
      t = forced;
  return t;
}

/// Calls f(MT, BN) as integral constants for a tile shape.
template <typename F> void withTileShape(TileShape t, F &&f) {
  if (t.rows == 32 && t.keys == 64)
    f(std::integral_constant<int, 2>{}, std::integral_constant<int, 64>{});
  else if (t.rows == 32)
    f(std::integral_constant<int, 2>{}, std::integral_constant<int, 32>{});
  else if (t.keys == 32)
    f(std::integral_constant<int, 1>{}, std::integral_constant<int, 32>{});
  else
    f(std::integral_constant<int, 1>{}, std::integral_constant<int, 64>{});
}

template <int DK, int DV, bool kStats>
void launchForward(const KernelContext &ctx, const FlashParams &f, int B) {
  const char *what = kStats ? "attention backward (statistics)" : "attention";
  withTileShape(tileShape("MOEC_ATTENTION_FORWARD_TILES", DK, DV, false), [&](auto mt, auto bn) {
    constexpr int MT = decltype(mt)::value, BN = decltype(bn)::value;
    if constexpr (queryShapeOk(DK, DV, {16 * MT, BN}, false)) { // others are never chosen
      auto kernel = flashForwardKernel<DK, DV, MT, BN, kStats>;
      constexpr size_t shared = forwardShared(DK, DV, BN);
      allowSharedMemory(ctx, kernel, shared, what);
      dim3 grid(static_cast<unsigned>(f.H), static_cast<unsigned>(B),
                static_cast<unsigned>((f.L + kQTile - 1) / kQTile));
      FLASH_LAUNCH(kernel, grid, kQueryThreads<MT>, shared, streamOf(ctx), f);
    }
  });
  checkLaunch(ctx, what);
}

template <int DK, int DV> void launchDq(const KernelContext &ctx, const FlashParams &f, int B) {
  withTileShape(tileShape("MOEC_ATTENTION_DQ_TILES", DK, DV, true), [&](auto mt, auto bn) {
    constexpr int MT = decltype(mt)::value, BN = decltype(bn)::value;
    if constexpr (queryShapeOk(DK, DV, {16 * MT, BN}, true)) {
      auto kernel = flashDqKernel<DK, DV, MT, BN>;
      constexpr size_t shared = dqShared(DK, DV, BN);
      allowSharedMemory(ctx, kernel, shared, "attention backward (dq)");
      dim3 grid(static_cast<unsigned>(f.H), static_cast<unsigned>(B),
                static_cast<unsigned>((f.L + kQTile - 1) / kQTile));
      FLASH_LAUNCH(kernel, grid, kQueryThreads<MT>, shared, streamOf(ctx), f);
    }
  });
  checkLaunch(ctx, "attention backward (dq)");
}

template <int DK, int DV> void launchDkDv(const KernelContext &ctx, const FlashParams &f, int B) {
  constexpr bool kPairs = pairedDkDv(DK, DV);
  constexpr int keys = kPairs ? kPairKeys : kKvKeys;
  constexpr size_t shared = kPairs ? dkdvPairShared(DK, DV) : dkdvShared(DK, DV);
  static_assert(shared <= kSharedLimit, "dK/dV tiles exceed the shared memory");
  const dim3 grid(static_cast<unsigned>(f.KV * f.slices), static_cast<unsigned>(B),
                  static_cast<unsigned>((f.L + keys - 1) / keys));
  const char *what = "attention backward (dk, dv)";
  if constexpr (kPairs) { // (only the kernel that runs is instantiated)
    auto kernel = flashDkDvPairKernel<DK, DV>;
    allowSharedMemory(ctx, kernel, shared, what);
    FLASH_LAUNCH(kernel, grid, kThreads, shared, streamOf(ctx), f);
  } else {
    auto kernel = flashDkDvKernel<DK, DV>;
    allowSharedMemory(ctx, kernel, shared, what);
    FLASH_LAUNCH(kernel, grid, kThreads, shared, streamOf(ctx), f);
  }
  checkLaunch(ctx, what);
}

void sumSlices(const KernelContext &ctx, const float *part, const FlashParams &f, int d, OutMat out,
               OutMat outB, int split) {
  const int64_t n = f.rows * f.KV * d;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((n + kSumThreads - 1) / kSumThreads, 4096));
  FLASH_LAUNCH(sumSlicesKernel, dim3(blocks), kSumThreads, 0, streamOf(ctx), part, f.slices, f.rows,
               f.KV, d, out, outB, split);
  checkLaunch(ctx, "attention backward (dk, dv slices)");
}

/// out[row, head, :] = sums[row][head * d + :] ([rows][heads * d] f32), e.g. dQ added up by atomics.
void convertSums(const KernelContext &ctx, const float *sums, int64_t rows, int heads, int d, OutMat out) {
  const int64_t n = rows * heads * d;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((n + kSumThreads - 1) / kSumThreads, 4096));
  FLASH_LAUNCH(sumSlicesKernel, dim3(blocks), kSumThreads, 0, streamOf(ctx), sums, 1, rows, heads, d, out,
               OutMat{}, d);
  checkLaunch(ctx, "attention backward (dq sums)");
}

/// Calls f(DK, DV) as integral constants for head dims flashHeadDims accepts.
template <typename F> void withHeadDims(int dk, int dv, F &&f) {
  using std::integral_constant;
  if (dk == 64)
    f(integral_constant<int, 64>{}, integral_constant<int, 64>{});
  else if (dk == 128)
    f(integral_constant<int, 128>{}, integral_constant<int, 128>{});
  else if (dk == 256)
    f(integral_constant<int, 256>{}, integral_constant<int, 256>{});
  else
    f(integral_constant<int, 192>{}, integral_constant<int, 128>{});
  (void)dv;
}

} // namespace

bool flashHeadDims(int dA, int dB, int dv) {
  const int dk = dA + dB;
  if (dA < 0 || dB < 0 || dA % 8 != 0 || dB % 8 != 0)
    return false;
  if (dk == 192 && dv == 128) // MLA's: query and key in one part or two (kParts)
    return true;
  return dB == 0 && dk == dv && (dk == 64 || dk == 128 || dk == 256);
}

bool flashFits(const AttnParams &P, bool backward) {
  if (envFlag("MOEC_ATTENTION_GENERAL"))
    return false;
  if (!flashHeadDims(P.dA, P.dB, P.dv))
    return false;
  if (!(P.scale > 0.0f) || !std::isfinite(P.scale))
    return false;
  // Grid limits: query / key tiles in z, sequences in y.
  const int keys = pairedDkDv(P.dA + P.dB, P.dv) ? kPairKeys : kKvKeys;
  if ((P.L + kQTile - 1) / kQTile > 65535 || (P.L + keys - 1) / keys > 65535 || P.B > 65535)
    return false;
  if (!bf16Rows(P.qA) || !bf16Rows(P.kA) || !bf16Rows(P.v))
    return false;
  if (P.dB > 0 && (!bf16Rows(P.qB) || !bf16Rows(P.kB)))
    return false;
  if (!backward)
    return pairOutput(P.out);
  return bf16Rows(P.dO) && pairOutput(P.dqA) && pairOutput(P.dqB) && pairOutput(P.dkA) &&
         pairOutput(P.dkB) && pairOutput(P.dV);
}

void flashForward(const KernelContext &ctx, const AttnParams &P) {
  FlashParams f = flashParams(P);
  const int B = static_cast<int>(P.B);
  withHeadDims(P.dA + P.dB, P.dv, [&](auto dk, auto dv) {
    launchForward<decltype(dk)::value, decltype(dv)::value, false>(ctx, f, B);
  });
}

void flashBackward(const KernelContext &ctx, const AttnParams &P, Scratch &scratch, FloatOut dSinks) {
  FlashParams f = flashParams(P);
  const int B = static_cast<int>(P.B);
  const bool wantDq = P.dqA.t.p || P.dqB.t.p;
  const bool wantDk = P.dkA.t.p || P.dkB.t.p, wantDkDv = wantDk || P.dV.t.p;
  const bool wantSinks = dSinks.p && P.sinks.p;
  const int64_t stats = P.B * P.H * f.Lp;
  f.lse = scratch.floats(stats);
  f.dsum = scratch.floats(stats);
  f.sinkPart = wantSinks ? scratch.floats(f.rows * P.H) : nullptr;
  withHeadDims(P.dA + P.dB, P.dv, [&](auto dk, auto dv) {
    constexpr int DK = decltype(dk)::value, DV = decltype(dv)::value;
    if (P.savedLse) // base 2, by (sequence, head), as the kernels read them
      statisticsFromResult(ctx, P, f.lse, f.dsum, f.sinkPart, /*headMajor=*/true, f.Lp, kLog2e);
    else
      launchForward<DK, DV, true>(ctx, f, B);
    if (wantSinks)
      reduceSinks(ctx, f.sinkPart, f.rows, P.H, dSinks);
    if (wantDkDv) {
      // FlashWgmma.cu's dK/dV takes 128 keys a CTA, as this file's (not paired) does.
      const bool wgmma = wgmmaDkDvFits(P);
      f.headsPerBlock = headsPerKvBlock(P, wgmma || !pairedDkDv(DK, DV) ? kKvKeys : kPairKeys);
      f.slices = P.group / f.headsPerBlock;
      if (f.slices > 1) {
        f.dkPart = wantDk ? scratch.floats(f.slices * f.rows * P.KV * DK) : nullptr;
        f.dvPart = P.dV.t.p ? scratch.floats(f.slices * f.rows * P.KV * DV) : nullptr;
      }
      // MOEC_ATTENTION_SINGLE_PASS=1: the wgmma dK/dV kernel also forms dQ (atomic f32 sums).
      float *dqAccum = nullptr;
      if (wgmma && wantDq && wgmmaDqFits(P) && envFlag("MOEC_ATTENTION_SINGLE_PASS")) {
        dqAccum = scratch.floats(f.rows * P.H * DK);
        zeroFill(ctx, f32Out(dqAccum), f.rows * P.H * DK);
      }
      if (wgmma)
        wgmmaDkDv(ctx, P, f.lse, f.dsum, f.Lp, f.headsPerBlock, f.dkPart, f.dvPart, dqAccum);
      else
        launchDkDv<DK, DV>(ctx, f, B);
      if (f.dkPart)
        sumSlices(ctx, f.dkPart, f, DK, P.dkA, P.dkB, P.dA);
      if (f.dvPart)
        sumSlices(ctx, f.dvPart, f, DV, P.dV, OutMat{}, DV);
      if (dqAccum) {
        convertSums(ctx, dqAccum, f.rows, P.H, DK, P.dqA);
        return;
      }
    }
    if (wantDq && wgmmaDqFits(P))
      wgmmaDq(ctx, P, f.lse, f.dsum, f.Lp);
    else if (wantDq)
      launchDq<DK, DV>(ctx, f, B);
  });
}

} // namespace moec::runtime::cuda::attention
