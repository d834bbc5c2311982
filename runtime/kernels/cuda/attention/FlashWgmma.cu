//===- FlashWgmma.cu - causal attention on Hopper's wgmma (sm_90a) --------===//
//
// Causal attention for bf16 query, key and value with head dim =
// value dim = 128, no sliding window and no sinks (Qwen3's layers), in the
// FlashAttention-3 arrangement; Dense.cu sends such launches here before
// Flash.cu's mma.sync kernels (MOEC_ATTENTION_WGMMA=0 turns it off, as does
// MOEC_ATTENTION_GENERAL=1, which asks for the general kernels).
//
// One CTA per (128-query tile, head, sequence), the longest rows first.
// Warpgroup 0 (one thread) copies the query tile once and then the key and
// value tiles of 128 rows by TMA into a ring of three stages, each completing
// on its own mbarrier (so S = Q Kᵀ can start before V lands). Warpgroups 1 and
// 2 take 64 queries each: S on wgmma.m64n128k16 with both operands in shared
// memory, the online softmax in base 2 on the accumulators, then O += P V
// with P straight from the S registers (bf16 pairs: the accumulator layout of
// two n8 blocks is mma's A fragment) and V transposed from shared memory;
// each stage is released on a second mbarrier after its products. As in
// FlashAttention-3, step j issues S_j with P_{j-1} V_{j-1} and runs S_j's
// softmax under that product, and the two warpgroups take turns to issue
// (named barriers): one's softmax runs under the other's products. Key tiles
// run 0 .. the diagonal one, masked per element only there. The result is
// written in bf16, and the logsumexp when the op has that result.
//
// The backward (given lse and D = dO . O, base 2 as Flash.cu keeps them) has
// the same arrangement. dQ: key tiles of 64 with dO beside Q: S = Q Kᵀ and
// dP = dO Vᵀ on wgmma.m64n64k16 from shared memory, dS = P (dP - D) in
// registers, dQ += dS K with dS as the A operand and K transposed. dK, dV: a
// CTA per 128-key tile of a key/value head walks the query tiles of 64 that
// see it, head after head of the group: Sᵀ = K Qᵀ, dPᵀ = V dOᵀ, then
// dV += Pᵀ dO and dK += dSᵀ Q from registers. Every sum has a fixed order.
// With MOEC_ATTENTION_SINGLE_PASS=1 that kernel also forms dQ instead of the
// dQ kernel (FlashAttention-3's single pass: dSᵀ through shared memory, dQ's
// part of each 64-query tile added to an f32 sum by vector atomics: 5
// products a tile pair instead of the two kernels' 7, but not deterministic,
// and slower on the H200 so far: 16.9 against 14.8 ms at 16384 tokens).
//
// No wgmma here sits behind a branch (a tile that a warpgroup cannot see is
// masked whole, not skipped): ptxas serialises every wgmma of a kernel that
// has one there. And no two accumulator arrays more than the registers hold
// are live: dQ's accumulators in the dK/dV kernel are dPᵀ's.
//
// Tiles use the 128-byte swizzle (Hopper.cuh): Q, dO, K and V as K-major
// boxes of [rows][64 features]; as the B operand of P V and dS K, V and K are
// MN-major, their two boxes of 64 features apart by a box.
//
//===----------------------------------------------------------------------===//

#include <cstdlib>

#include "runtime/kernels/cuda/Hopper.cuh"
#include "runtime/kernels/cuda/attention/Kernels.cuh"

namespace moec::runtime::cuda::attention {
namespace {

using namespace hopper;

constexpr int kRows = 128;                     // queries per CTA, and keys per tile (the diagonal is one tile)
constexpr int kD = 128;                        // head dim = value dim
constexpr int kBox = 128 * 128;                // bytes of a [128 rows][64 features] bf16 box
constexpr int kStages = 3;                     // key/value tiles in flight (a step holds two)
constexpr int kStageBytes = 4 * kBox;          // K and V: two boxes each
constexpr size_t kShared = 2 * kBox + kStages * kStageBytes + 1024; // Q, the ring, alignment slack
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kLog2e = 1.4426950408889634f;

struct Maps {
  CUtensorMap q, k, v;
};

struct Params {
  __nv_bfloat16 *out = nullptr;
  int64_t ldo = 0, hso = 0;
  float *lse = nullptr; // [B * L][H], natural log, or null
  int L = 0, H = 0, group = 1, qTiles = 0;
  float scaleLog2 = 0;
};

__device__ __forceinline__ uint32_t packBf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t *>(&v);
}

/// 2^x by the SFU (ex2.approx: 2 ulp; 0 at -inf), as Flash.cu's softmax.
__device__ __forceinline__ float exp2Approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float quadMax(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quadSum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

__global__ void __launch_bounds__(3 * 128, 1) wgmmaForwardKernel(const __grid_constant__ Maps maps, Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smemRaw[];
  __shared__ uint64_t qFull, kFull[kStages], vFull[kStages], empty[kStages];
  unsigned char *smem = smemRaw + ((1024 - (sharedAddress(smemRaw) & 1023)) & 1023);
  unsigned char *sQ = smem, *sRing = smem + 2 * kBox;
  const int qTile = p.qTiles - 1 - static_cast<int>(blockIdx.x); // the longest rows first
  const int h = blockIdx.y, g = h / p.group;
  const int rowBase = static_cast<int>(blockIdx.z) * p.L, q0 = qTile * kRows;
  const int tiles = qTile + 1; // key tiles 0 .. the diagonal
  if (threadIdx.x == 0) {
    mbarrierInit(&qFull, 1);
    for (int s = 0; s < kStages; ++s) {
      mbarrierInit(&kFull[s], 1);
      mbarrierInit(&vFull[s], 1);
      mbarrierInit(&empty[s], 8); // a lane of each consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  const int warpGroup = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;

  if (warpGroup == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
    if (threadIdx.x != 0)
      return;
    mbarrierExpectBytes(&qFull, 2 * kBox);
    tmaLoad(sQ, maps.q, h * kD, rowBase + q0, &qFull);
    tmaLoad(sQ + kBox, maps.q, h * kD + 64, rowBase + q0, &qFull);
    for (int j = 0; j < tiles; ++j) {
      const int s = j % kStages, k0 = rowBase + j * kRows;
      mbarrierWait(&empty[s], ((j / kStages) + 1) & 1); // the first round passes at once
      unsigned char *sK = sRing + s * kStageBytes, *sV = sK + 2 * kBox;
      mbarrierExpectBytes(&kFull[s], 2 * kBox);
      tmaLoad(sK, maps.k, g * kD, k0, &kFull[s]);
      tmaLoad(sK + kBox, maps.k, g * kD + 64, k0, &kFull[s]);
      mbarrierExpectBytes(&vFull[s], 2 * kBox);
      tmaLoad(sV, maps.v, g * kD, k0, &vFull[s]);
      tmaLoad(sV + kBox, maps.v, g * kD + 64, k0, &vFull[s]);
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
  const int consumer = warpGroup - 1;
  // Accumulator d[4j + 2r + c]: row 16 warp + lane / 4 + 8r of the warpgroup's 64, column 8j + 2 (lane % 4) + c.
  const int rowInTile = consumer * 64 + warp * 16 + (lane >> 2);
  const uint32_t qAddress = sharedAddress(sQ) + consumer * 64 * 128, ringAddress = sharedAddress(sRing);
  float o[64], s[64], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < 64; ++i)
    o[i] = 0.0f;
  mbarrierWait(&qFull, 0);
  // Each step issues S_j = Q K_jᵀ and O += P_{j-1} V_{j-1} as two groups, runs the softmax of S_j
  // while the second is in flight, and only then packs P_j (registers an issued wgmma reads must
  // not change); O's rescale by the previous step's alpha comes before the product that adds to it.
  // The two warpgroups take turns to issue (FlashAttention-3's ping-pong: named barrier 1 + c lets
  // consumer c issue, the other consumer opens it), so that one's softmax runs under the other's
  // products.
  float alpha[2] = {1.0f, 1.0f};
  uint32_t a[kRows / 16][4]; // P as A fragments: keys 16 kk ..: the n8 blocks 2 kk and 2 kk + 1 of S
  const int turns = tiles + 1; // issue points: S_0, then S_j with P_{j-1} V_{j-1}, then the last P V
  int turn = 0;
  auto myTurn = [&] { asm volatile("bar.sync %0, 256;\n" ::"r"(1 + consumer) : "memory"); };
  auto yourTurn = [&] {
    if (consumer == 0 || ++turn < turns) // consumer 1 opened consumer 0's first turn up front
      asm volatile("bar.arrive %0, 256;\n" ::"r"(2 - consumer) : "memory");
  };
  if (consumer == 1)
    asm volatile("bar.arrive 1, 256;\n" ::: "memory");
  auto issueS = [&](int j) {
    const int st = j % kStages;
    const uint32_t kAddress = ringAddress + st * kStageBytes;
#pragma unroll
    for (int i = 0; i < 64; ++i)
      s[i] = 0.0f;
    mbarrierWait(&kFull[st], (j / kStages) & 1);
    wgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint32_t step = (kk >> 2) * kBox + (kk & 3) * 32;
      wgmma128<false>(s, descriptor(qAddress + step, 16, 1024), descriptor(kAddress + step, 16, 1024));
    }
    wgmmaCommit();
  };
  auto issuePV = [&](int j) { // after rescaling O by the alpha of step j
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int jj = 0; jj < 16; ++jj)
#pragma unroll
        for (int c = 0; c < 2; ++c)
          o[4 * jj + 2 * r + c] *= alpha[r];
    const int st = j % kStages;
    const uint32_t vAddress = ringAddress + st * kStageBytes + 2 * kBox;
    mbarrierWait(&vFull[st], (j / kStages) & 1);
    wgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kRows / 16; ++kk)
      wgmma128Registers(o, a[kk], descriptor(vAddress + kk * 2048, kBox, 1024));
    wgmmaCommit();
  };
  // Online softmax of S_j in base 2 (only the diagonal tile masks: key > query); alpha, m and l
  // move to step j.
  auto softmax = [&](int j) {
    const bool diagonal = j == qTile;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = q0 + rowInTile + 8 * r;
      float top = -INFINITY;
#pragma unroll
      for (int jj = 0; jj < 16; ++jj)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int i = 4 * jj + 2 * r + c, key = j * kRows + 8 * jj + 2 * (lane & 3) + c;
          float v = s[i] * p.scaleLog2;
          if (diagonal && key > row)
            v = -INFINITY;
          s[i] = v;
          top = fmaxf(top, v);
        }
      const float mNew = fmaxf(m[r], quadMax(top)); // finite: key 0 <= every row
      alpha[r] = exp2Approx(m[r] - mNew);
      m[r] = mNew;
      float sum = 0.0f;
#pragma unroll
      for (int jj = 0; jj < 16; ++jj)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int i = 4 * jj + 2 * r + c;
          s[i] = exp2Approx(s[i] - mNew);
          sum += s[i];
        }
      l[r] = l[r] * alpha[r] + sum; // this lane's part of the row; the quad's parts are summed at the end
    }
  };
  auto pack = [&] {
#pragma unroll
    for (int kk = 0; kk < kRows / 16; ++kk)
#pragma unroll
      for (int q = 0; q < 4; ++q)
        a[kk][q] = packBf16(s[8 * kk + 2 * q], s[8 * kk + 2 * q + 1]);
  };
  auto release = [&](int j) {
    if (lane == 0)
      mbarrierArrive(&empty[j % kStages]);
  };

  myTurn();
  issueS(0);
  yourTurn();
  wgmmaWait<0>();
  softmax(0);
  pack();
  for (int j = 1; j < tiles; ++j) {
    myTurn();
    issueS(j);
    issuePV(j - 1);
    yourTurn();
    wgmmaWait<1>(); // S_j
    softmax(j);
    wgmmaWait<0>(); // P_{j-1} V_{j-1}
    release(j - 1);
    pack();
  }
  myTurn();
  issuePV(tiles - 1);
  yourTurn();
  wgmmaWait<0>();
  release(tiles - 1);

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = q0 + rowInTile + 8 * r;
    const float total = quadSum(l[r]), inv = 1.0f / total;
    if (row >= p.L)
      continue;
    __nv_bfloat16 *out = p.out + static_cast<int64_t>(rowBase + row) * p.ldo + h * p.hso + 2 * (lane & 3);
#pragma unroll
    for (int jj = 0; jj < 16; ++jj)
      *reinterpret_cast<__nv_bfloat162 *>(out + 8 * jj) =
          __floats2bfloat162_rn(o[4 * jj + 2 * r] * inv, o[4 * jj + 2 * r + 1] * inv);
    if (p.lse && (lane & 3) == 0)
      p.lse[static_cast<int64_t>(rowBase + row) * p.H + h] = (m[r] + log2f(total)) * kLn2;
  }
#else
  __trap(); // built without sm_90a: wgmmaForwardFits never picks this kernel there
#endif
}

constexpr int kDqKeys = 64;                       // keys per tile of the dQ kernel
constexpr int kDqBox = kDqKeys * 128;              // a [64 keys][64 features] box
constexpr int kDqStages = 4;
constexpr int kDqStageBytes = 4 * kDqBox;          // K and V: two boxes each
constexpr size_t kDqShared = 4 * kBox + kDqStages * kDqStageBytes + 1024; // Q, dO, the ring, slack

struct DqMaps {
  CUtensorMap q, dO, k, v;
};

struct DqParams {
  __nv_bfloat16 *dq = nullptr;
  int64_t ldq = 0, hsq = 0;
  const float *lse = nullptr, *dsum = nullptr; // [B * H][Lp], base 2
  int64_t Lp = 0;
  int L = 0, H = 0, group = 1, qTiles = 0;
  float scaleLog2 = 0, scale = 0;
};

/// dQ of one 128-query tile: warpgroup 0 (one thread) copies Q and dO once, then K and V tiles
/// of 64 keys into a ring of four stages; warpgroups 1 and 2 take 64 queries each.
__global__ void __launch_bounds__(3 * 128, 1) wgmmaDqKernel(const __grid_constant__ DqMaps maps, DqParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smemRaw[];
  __shared__ uint64_t qFull, kFull[kDqStages], vFull[kDqStages], empty[kDqStages];
  unsigned char *smem = smemRaw + ((1024 - (sharedAddress(smemRaw) & 1023)) & 1023);
  unsigned char *sQ = smem, *sdO = smem + 2 * kBox, *sRing = smem + 4 * kBox;
  const int qTile = p.qTiles - 1 - static_cast<int>(blockIdx.x); // the longest rows first
  const int h = blockIdx.y, g = h / p.group, b = blockIdx.z;
  const int rowBase = b * p.L, q0 = qTile * kRows;
  // Key tiles up to the tile's last query, none past the sequence (no copy of a box wholly
  // outside it is ever issued).
  const int tiles = min((q0 + kRows) / kDqKeys, (p.L + kDqKeys - 1) / kDqKeys);
  if (threadIdx.x == 0) {
    mbarrierInit(&qFull, 1);
    for (int s = 0; s < kDqStages; ++s) {
      mbarrierInit(&kFull[s], 1);
      mbarrierInit(&vFull[s], 1);
      mbarrierInit(&empty[s], 8); // a lane of each consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  const int warpGroup = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;

  if (warpGroup == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
    if (threadIdx.x != 0)
      return;
    mbarrierExpectBytes(&qFull, 4 * kBox);
    for (int half = 0; half < 2; ++half) {
      tmaLoad(sQ + half * kBox, maps.q, h * kD + 64 * half, rowBase + q0, &qFull);
      tmaLoad(sdO + half * kBox, maps.dO, h * kD + 64 * half, rowBase + q0, &qFull);
    }
    for (int j = 0; j < tiles; ++j) {
      const int s = j % kDqStages, k0 = rowBase + j * kDqKeys;
      mbarrierWait(&empty[s], ((j / kDqStages) + 1) & 1); // the first round passes at once
      unsigned char *sK = sRing + s * kDqStageBytes, *sV = sK + 2 * kDqBox;
      mbarrierExpectBytes(&kFull[s], 2 * kDqBox);
      tmaLoad(sK, maps.k, g * kD, k0, &kFull[s]);
      tmaLoad(sK + kDqBox, maps.k, g * kD + 64, k0, &kFull[s]);
      mbarrierExpectBytes(&vFull[s], 2 * kDqBox);
      tmaLoad(sV, maps.v, g * kD, k0, &vFull[s]);
      tmaLoad(sV + kDqBox, maps.v, g * kD + 64, k0, &vFull[s]);
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
  const int consumer = warpGroup - 1;
  const int rowInTile = consumer * 64 + warp * 16 + (lane >> 2);
  const int firstRow = q0 + consumer * 64; // this warpgroup's rows: firstRow .. firstRow + 63
  const uint32_t qAddress = sharedAddress(sQ) + consumer * 64 * 128;
  const uint32_t doAddress = sharedAddress(sdO) + consumer * 64 * 128, ringAddress = sharedAddress(sRing);
  float lse[2], dsum[2], dq[64];
#pragma unroll
  for (int r = 0; r < 2; ++r) { // rows past L (< Lp): lse +inf, D 0, so P = 0
    const int64_t at = (static_cast<int64_t>(b) * p.H + h) * p.Lp + q0 + rowInTile + 8 * r;
    lse[r] = p.lse[at];
    dsum[r] = p.dsum[at];
  }
#pragma unroll
  for (int i = 0; i < 64; ++i)
    dq[i] = 0.0f;
  mbarrierWait(&qFull, 0);
  for (int j = 0; j < tiles; ++j) {
    const int st = j % kDqStages, parity = (j / kDqStages) & 1, k0 = j * kDqKeys;
    // A tile whose keys all come after this warpgroup's rows (warpgroup 1's last) is masked
    // whole, not skipped: a branch around the products would serialise every wgmma.
    mbarrierWait(&kFull[st], parity);
    mbarrierWait(&vFull[st], parity);
    const uint32_t kAddress = ringAddress + st * kDqStageBytes, vAddress = kAddress + 2 * kDqBox;
    float s[32], dp[32];
#pragma unroll
    for (int i = 0; i < 32; ++i)
      s[i] = dp[i] = 0.0f;
    wgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint32_t rowStep = (kk >> 2) * kBox + (kk & 3) * 32, keyStep = (kk >> 2) * kDqBox + (kk & 3) * 32;
      wgmma64<false>(s, descriptor(qAddress + rowStep, 16, 1024), descriptor(kAddress + keyStep, 16, 1024));
      wgmma64<false>(dp, descriptor(doAddress + rowStep, 16, 1024), descriptor(vAddress + keyStep, 16, 1024));
    }
    wgmmaCommit();
    wgmmaWait<0>();

    // dS / scale = P (dP - D), P = 2^(S scale log2 e - lse); masked (key > row) only near the diagonal.
    const bool mask = k0 + kDqKeys - 1 > firstRow;
    uint32_t a[kDqKeys / 16][4];
#pragma unroll
    for (int jj = 0; jj < kDqKeys / 8; ++jj)
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int i = 4 * jj + 2 * r + c;
          float pv = exp2Approx(fmaf(s[i], p.scaleLog2, -lse[r]));
          if (mask && k0 + 8 * jj + 2 * (lane & 3) + c > q0 + rowInTile + 8 * r)
            pv = 0.0f;
          dp[i] = pv * (dp[i] - dsum[r]);
        }
#pragma unroll
    for (int kk = 0; kk < kDqKeys / 16; ++kk)
#pragma unroll
      for (int q = 0; q < 4; ++q)
        a[kk][q] = packBf16(dp[8 * kk + 2 * q], dp[8 * kk + 2 * q + 1]);
    wgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kDqKeys / 16; ++kk)
      wgmma128Registers(dq, a[kk], descriptor(kAddress + kk * 2048, kDqBox, 1024));
    wgmmaCommit();
    wgmmaWait<0>();
    if (lane == 0)
      mbarrierArrive(&empty[st]);
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = q0 + rowInTile + 8 * r;
    if (row >= p.L)
      continue;
    __nv_bfloat16 *out = p.dq + static_cast<int64_t>(rowBase + row) * p.ldq + h * p.hsq + 2 * (lane & 3);
#pragma unroll
    for (int jj = 0; jj < 16; ++jj)
      *reinterpret_cast<__nv_bfloat162 *>(out + 8 * jj) =
          __floats2bfloat162_rn(dq[4 * jj + 2 * r] * p.scale, dq[4 * jj + 2 * r + 1] * p.scale);
  }
#else
  __trap(); // built without sm_90a: wgmmaDqFits never picks this kernel there
#endif
}

constexpr int kKvQueries = 64;                    // queries per tile of the dK/dV kernel
constexpr int kKvBox = kKvQueries * 128;          // a [64 queries][64 features] box
constexpr int kKvStages = 4;
constexpr int kKvStageBytes = 4 * kKvBox;         // Q and dO: two boxes each
constexpr size_t kKvShared = 4 * kBox + kKvStages * kKvStageBytes + 1024; // K, V, the ring, slack
// With dQ: a ring of three stages; dSᵀ of both warpgroups ([128 keys][64 queries], bf16) in two
// buffers, so that one barrier a step orders a buffer's writes after the products that read it
// two steps before; and each warpgroup's f32 part of dQ ([64 queries][64 features] as two
// swizzled boxes of 32 features) that the tensor memory accelerator adds to global memory.
constexpr int kKvDqStages = 3;
constexpr int kDqPartBytes = 64 * 64 * 4;
constexpr size_t kKvDqShared = 4 * kBox + kKvDqStages * kKvStageBytes + 2 * kBox + 2 * kDqPartBytes + 1024;

struct KvMaps {
  CUtensorMap q, dO, k, v;
  CUtensorMap dq; // kDq: the f32 sum [B * L][H * 128], boxes of 64 rows x 32 features
};

struct KvParams {
  __nv_bfloat16 *dk = nullptr, *dv = nullptr;
  int64_t lddk = 0, hsdk = 0, lddv = 0, hsdv = 0;
  // With slices > 1, CTA (key tile, kv head g, slice) takes heads g group + slice headsPerBlock
  // + [0, headsPerBlock) and writes f32 partials [slices][B * L][KV * 128] that Flash.cu sums.
  float *dkPart = nullptr, *dvPart = nullptr;
  int slices = 1, headsPerBlock = 1, KV = 1;
  const float *lse = nullptr, *dsum = nullptr; // [B * H][Lp], base 2
  int64_t Lp = 0;
  int L = 0, H = 0, group = 1, kTiles = 0;
  float scaleLog2 = 0, scale = 0;
  float *dqAccum = nullptr; // kDq: [B * L][H][128] f32, zeroed; each CTA adds its keys' part of dQ
};

/// Adds the shared box at `src` to the box of `map` at (c0, c1) in global memory (TMA
/// reduction, tracked by this thread's bulk groups).
__device__ __forceinline__ void tmaReduceAdd(const CUtensorMap &map, int c0, int c1, const void *src) {
  asm volatile("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
                   reinterpret_cast<uint64_t>(&map)),
               "r"(c0), "r"(c1), "r"(sharedAddress(src))
               : "memory");
}

/// dK and dV of one 128-key tile of a key/value head: warpgroup 0 (one thread) copies K and V
/// once, then Q and dO tiles of 64 queries, for each head of the group (or of its slice), of
/// the queries that see the keys, into a ring of four stages; warpgroups 1 and 2 take 64 keys each:
/// Sᵀ = K Qᵀ and dPᵀ = V dOᵀ (wgmma.m64n64k16), Pᵀ and dSᵀ in registers, then
/// dV += Pᵀ dO and dK += dSᵀ Q with Pᵀ, dSᵀ as A operands and dO, Q transposed. Every head's
/// sum runs in the same order: no atomics.
///
/// kDq (MOEC_ATTENTION_SINGLE_PASS=1): the same pass also forms dQ (the backward in one
/// kernel, as FlashAttention-3's): both warpgroups store their dSᵀ to shared memory, meet at a
/// barrier, and warpgroup w takes dQ's features [64 w, 64 w + 64) of the query tile over all
/// 128 keys, dS (dSᵀ transposed) against K's box w, and adds it to dqAccum with vector
/// reductions. That sum's order is the GPU's: dQ is not bitwise reproducible.
template <bool kDq>
__global__ void __launch_bounds__(3 * 128, 1) wgmmaDkDvKernel(const __grid_constant__ KvMaps maps, KvParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smemRaw[];
  __shared__ uint64_t kvFull, full[kKvStages], empty[kKvStages];
  unsigned char *smem = smemRaw + ((1024 - (sharedAddress(smemRaw) & 1023)) & 1023);
  unsigned char *sK = smem, *sV = smem + 2 * kBox, *sRing = smem + 4 * kBox;
  constexpr int kRing = kDq ? kKvDqStages : kKvStages;
  unsigned char *sdS = sRing + kRing * kKvStageBytes; // kDq: two [128 keys][64 queries] buffers
  unsigned char *sdQ = sdS + 2 * kBox;                  // kDq: a part of dQ per warpgroup
  const int kTile = blockIdx.x; // the keys most queries see first
  const int g = blockIdx.y / p.slices, slice = blockIdx.y % p.slices, b = blockIdx.z;
  const int firstHead = g * p.group + slice * p.headsPerBlock;
  const int rowBase = b * p.L, k0 = kTile * kRows;
  const int jFirst = k0 / kKvQueries, jEnd = (p.L + kKvQueries - 1) / kKvQueries; // query tiles that see a key
  const int perHead = jEnd - jFirst, steps = p.headsPerBlock * perHead;
  if (threadIdx.x == 0) {
    mbarrierInit(&kvFull, 1);
    for (int s = 0; s < kRing; ++s) {
      mbarrierInit(&full[s], 1);
      mbarrierInit(&empty[s], 8); // a lane of each consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  const int warpGroup = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;

  if (warpGroup == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
    if (threadIdx.x != 0)
      return;
    mbarrierExpectBytes(&kvFull, 4 * kBox);
    for (int half = 0; half < 2; ++half) {
      tmaLoad(sK + half * kBox, maps.k, g * kD + 64 * half, rowBase + k0, &kvFull);
      tmaLoad(sV + half * kBox, maps.v, g * kD + 64 * half, rowBase + k0, &kvFull);
    }
    for (int step = 0; step < steps; ++step) {
      const int s = step % kRing, h = firstHead + step / perHead;
      const int q0 = rowBase + (jFirst + step % perHead) * kKvQueries;
      mbarrierWait(&empty[s], ((step / kRing) + 1) & 1); // the first round passes at once
      unsigned char *sQ = sRing + s * kKvStageBytes, *sdO = sQ + 2 * kKvBox;
      mbarrierExpectBytes(&full[s], 4 * kKvBox);
      for (int half = 0; half < 2; ++half) {
        tmaLoad(sQ + half * kKvBox, maps.q, h * kD + 64 * half, q0, &full[s]);
        tmaLoad(sdO + half * kKvBox, maps.dO, h * kD + 64 * half, q0, &full[s]);
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
  const int consumer = warpGroup - 1;
  // Accumulator rows are keys: 16 warp + lane / 4 + 8r of the warpgroup's 64; columns queries or features.
  const int keyInTile = consumer * 64 + warp * 16 + (lane >> 2);
  const int firstKey = k0 + consumer * 64; // this warpgroup's keys: firstKey .. firstKey + 63
  const uint32_t kAddress = sharedAddress(sK) + consumer * 64 * 128;
  const uint32_t vAddress = sharedAddress(sV) + consumer * 64 * 128;
  const uint32_t ringAddress = sharedAddress(sRing);
  float dk[64], dv[64];
#pragma unroll
  for (int i = 0; i < 64; ++i)
    dk[i] = dv[i] = 0.0f;
  mbarrierWait(&kvFull, 0);
  for (int step = 0; step < steps; ++step) {
    const int st = step % kRing, parity = (step / kRing) & 1;
    const int h = firstHead + step / perHead, q0 = (jFirst + step % perHead) * kKvQueries;
    // A tile whose queries all come before this warpgroup's keys (warpgroup 2's first) is not
    // skipped but masked whole: a branch around the products would serialise every wgmma.
    mbarrierWait(&full[st], parity);
    const uint32_t qAddress = ringAddress + st * kKvStageBytes, doAddress = qAddress + 2 * kKvBox;
    float s[32], dp[32];
#pragma unroll
    for (int i = 0; i < 32; ++i)
      s[i] = dp[i] = 0.0f;
    // Sᵀ and dPᵀ in two groups: Pᵀ is formed while dPᵀ's products run, and lse and D are never
    // in registers together (the accumulators of dK and dV leave little room).
    wgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint32_t keyStep = (kk >> 2) * kBox + (kk & 3) * 32, queryStep = (kk >> 2) * kKvBox + (kk & 3) * 32;
      wgmma64<false>(s, descriptor(kAddress + keyStep, 16, 1024), descriptor(qAddress + queryStep, 16, 1024));
    }
    wgmmaCommit();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint32_t keyStep = (kk >> 2) * kBox + (kk & 3) * 32, queryStep = (kk >> 2) * kKvBox + (kk & 3) * 32;
      wgmma64<false>(dp, descriptor(vAddress + keyStep, 16, 1024), descriptor(doAddress + queryStep, 16, 1024));
    }
    wgmmaCommit();
    wgmmaWait<1>();

    // Pᵀ = 2^(Sᵀ scale log2 e - lse[query]) (in s), masked (query < key) only near the diagonal.
    // Rows past L have lse +inf and D 0: P = 0.
    const bool mask = q0 < firstKey + 63;
    const int64_t statRow = (static_cast<int64_t>(b) * p.H + h) * p.Lp + q0;
    uint32_t pa[kKvQueries / 16][4], da[kKvQueries / 16][4];
#pragma unroll
    for (int jj = 0; jj < kKvQueries / 8; ++jj) {
      const int col = 8 * jj + 2 * (lane & 3);
      const float2 l2 = __ldg(reinterpret_cast<const float2 *>(p.lse + statRow + col));
#pragma unroll
      for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int i = 4 * jj + 2 * r + c;
          s[i] = exp2Approx(fmaf(s[i], p.scaleLog2, -(c ? l2.y : l2.x)));
          if (mask && q0 + col + c < k0 + keyInTile + 8 * r)
            s[i] = 0.0f;
        }
        // A fragment of k step jj / 2: blocks 2kk (regs 0, 1) and 2kk + 1 (regs 2, 3), rows r.
        pa[jj >> 1][2 * (jj & 1) + r] = packBf16(s[4 * jj + 2 * r], s[4 * jj + 2 * r + 1]);
      }
    }
    // dSᵀ / scale = Pᵀ (dPᵀ - D[query]).
    wgmmaWait<0>();
#pragma unroll
    for (int jj = 0; jj < kKvQueries / 8; ++jj) {
      const float2 d2 = __ldg(reinterpret_cast<const float2 *>(p.dsum + statRow + 8 * jj + 2 * (lane & 3)));
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int i = 4 * jj + 2 * r;
        da[jj >> 1][2 * (jj & 1) + r] = packBf16(s[i] * (dp[i] - d2.x), s[i + 1] * (dp[i + 1] - d2.y));
      }
    }
    uint32_t dsAddress = 0;
    if constexpr (kDq) {
      // dSᵀ rows (keys) into this step's buffer, 16-byte chunks of 8 queries swizzled by row.
      unsigned char *buffer = sdS + (step & 1) * kBox;
      dsAddress = sharedAddress(buffer);
#pragma unroll
      for (int jj = 0; jj < kKvQueries / 8; ++jj)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int key = keyInTile + 8 * r;
          *reinterpret_cast<uint32_t *>(buffer + key * 128 + ((jj ^ (key & 7)) << 4) + 4 * (lane & 3)) =
              da[jj >> 1][2 * (jj & 1) + r];
        }
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); // visible to wgmma
      asm volatile("bar.sync 1, 256;\n" ::: "memory");              // both warpgroups' halves
    }
    wgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kKvQueries / 16; ++kk) {
      wgmma128Registers(dv, pa[kk], descriptor(doAddress + kk * 2048, kKvBox, 1024));
      wgmma128Registers(dk, da[kk], descriptor(qAddress + kk * 2048, kKvBox, 1024));
    }
    // dQ[:, 64 w ..] = dS K: A = dSᵀ stored key-major (transposed), B = K's box w (MN-major).
    // Its accumulators are dPᵀ's, overwritten (the first product ignores them): a fresh array
    // would need more registers than the consumers have, and serialise every wgmma.
    float(&dq)[32] = dp;
    if constexpr (kDq) {
      const uint32_t kBoxAddress = sharedAddress(sK) + consumer * kBox;
#pragma unroll
      for (int kk = 0; kk < kRows / 16; ++kk)
        wgmma64<true, true>(dq, descriptor(dsAddress + kk * 2048, kBox, 1024),
                            descriptor(kBoxAddress + kk * 2048, kBox, 1024), kk > 0);
    }
    wgmmaCommit();
    wgmmaWait<0>();
    if (lane == 0)
      mbarrierArrive(&empty[st]);
    if constexpr (kDq) {
      // This warpgroup's part of dQ into its shared boxes (once the reduction of the last step's
      // has read them), then one thread has the TMA add them to the sum. Rows past the last
      // sequence are clipped by the TMA; rows past L of another sequence get zeros (P = 0 there).
      const bool issuer = (threadIdx.x & 127) == 0;
      unsigned char *part = sdQ + consumer * kDqPartBytes;
      if (issuer)
        asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
      asm volatile("bar.sync %0, 128;\n" ::"r"(2 + consumer) : "memory");
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = warp * 16 + (lane >> 2) + 8 * r;
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
          const int chunk = 2 * (jj & 3) + ((lane & 3) >> 1); // 16-byte chunk of the 128-byte row
          *reinterpret_cast<float2 *>(part + (jj >> 2) * (kDqPartBytes / 2) + row * 128 +
                                      ((chunk ^ (row & 7)) << 4) + 8 * (lane & 1)) =
              make_float2(dq[4 * jj + 2 * r] * p.scale, dq[4 * jj + 2 * r + 1] * p.scale);
        }
      }
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      asm volatile("bar.sync %0, 128;\n" ::"r"(2 + consumer) : "memory");
      if (issuer) {
        for (int box = 0; box < 2; ++box)
          tmaReduceAdd(maps.dq, h * kD + consumer * 64 + 32 * box, rowBase + q0, part + box * (kDqPartBytes / 2));
        asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
      }
    }
  }
  if constexpr (kDq) {
    if ((threadIdx.x & 127) == 0) // the reductions complete before the CTA's shared memory goes
      asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = k0 + keyInTile + 8 * r;
    if (key >= p.L)
      continue;
    const int64_t row = rowBase + key;
    if (p.slices > 1) { // this slice's part, f32
      const int64_t at = ((static_cast<int64_t>(slice) * gridDim.z * p.L + row) * p.KV + g) * kD + 2 * (lane & 3);
#pragma unroll
      for (int jj = 0; jj < 16; ++jj) {
        *reinterpret_cast<float2 *>(p.dkPart + at + 8 * jj) =
            make_float2(dk[4 * jj + 2 * r] * p.scale, dk[4 * jj + 2 * r + 1] * p.scale);
        *reinterpret_cast<float2 *>(p.dvPart + at + 8 * jj) =
            make_float2(dv[4 * jj + 2 * r], dv[4 * jj + 2 * r + 1]);
      }
      continue;
    }
    __nv_bfloat16 *outK = p.dk + row * p.lddk + g * p.hsdk + 2 * (lane & 3);
    __nv_bfloat16 *outV = p.dv + row * p.lddv + g * p.hsdv + 2 * (lane & 3);
#pragma unroll
    for (int jj = 0; jj < 16; ++jj) {
      *reinterpret_cast<__nv_bfloat162 *>(outK + 8 * jj) =
          __floats2bfloat162_rn(dk[4 * jj + 2 * r] * p.scale, dk[4 * jj + 2 * r + 1] * p.scale);
      *reinterpret_cast<__nv_bfloat162 *>(outV + 8 * jj) =
          __floats2bfloat162_rn(dv[4 * jj + 2 * r], dv[4 * jj + 2 * r + 1]);
    }
  }
#else
  __trap(); // built without sm_90a: wgmmaDkDvFits never picks this kernel there
#endif
}

/// Whether this process's GPU runs sm_90a code (compute capability 9.0) and TMA maps can be made.
bool hopperHere() {
  static const bool here = [] {
    int device = 0, major = 0, minor = 0;
    return cudaGetDevice(&device) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
           cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess &&
           major == 9 && minor == 0 && encodeTiled() != nullptr;
  }();
  return here;
}

/// A bf16 [rows, ld] operand read in boxes of 128 rows x 64 features whose head h starts at
/// feature h * 128: 16-byte aligned base and rows, heads 128 features apart.
bool boxable(const Mat &m) {
  return m.t.p && m.t.bf16 && reinterpret_cast<uintptr_t>(m.t.p) % 16 == 0 && m.ld % 8 == 0 && m.hs == kD;
}

CUtensorMap boxes(const KernelContext &ctx, const Mat &m, int64_t rows, uint32_t boxRows = kRows) {
  uint64_t dims[2] = {static_cast<uint64_t>(m.ld), static_cast<uint64_t>(rows)};
  uint64_t strides[1] = {static_cast<uint64_t>(m.ld) * 2};
  uint32_t box[2] = {64, boxRows};
  return tensorMap(ctx, "attention (wgmma)", m.t.p, 2, dims, strides, box);
}

/// A bf16 output that pairs of adjacent features can be stored to.
bool bf16Pairs(const OutMat &m) {
  return m.t.p && m.t.bf16 && reinterpret_cast<uintptr_t>(m.t.p) % 4 == 0 && m.ld % 2 == 0 && m.hs % 2 == 0;
}

/// What both wgmma kernels need: query, key and value of 128 features in 128-row boxes, causal
/// without window or sinks, grid dimensions in range, a Hopper GPU, and no flag against them.
bool wgmmaShapes(const AttnParams &P) {
  const char *general = std::getenv("MOEC_ATTENTION_GENERAL"), *wgmma = std::getenv("MOEC_ATTENTION_WGMMA");
  if ((general && general[0] == '1') || (wgmma && wgmma[0] == '0'))
    return false;
  return P.dA == kD && P.dB == 0 && P.dv == kD && P.window == 0 && !P.sinks.p && P.scale > 0.0f &&
         boxable(P.qA) && boxable(P.kA) && boxable(P.v) && P.B * P.L < (int64_t{1} << 31) && P.H <= 65535 &&
         P.B <= 65535 && hopperHere();
}

template <typename Kernel>
void allowShared(const KernelContext &ctx, Kernel kernel, size_t bytes, const char *what) {
  cudaError_t error =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (error != cudaSuccess)
    ctx.fail(std::string(what) + ": cannot opt into " + std::to_string(bytes) + " bytes of shared memory: " +
             cudaGetErrorString(error));
}

} // namespace

bool wgmmaForwardFits(const AttnParams &P) { return wgmmaShapes(P) && bf16Pairs(P.out); }

bool wgmmaDqFits(const AttnParams &P) {
  return wgmmaShapes(P) && boxable(P.dO) && bf16Pairs(P.dqA) && !P.dqB.t.p;
}

bool wgmmaDkDvFits(const AttnParams &P) {
  return wgmmaShapes(P) && boxable(P.dO) && bf16Pairs(P.dkA) && bf16Pairs(P.dV) && !P.dkB.t.p;
}

void wgmmaDkDv(const KernelContext &ctx, const AttnParams &P, const float *lse, const float *dsum, int64_t Lp,
               int headsPerBlock, float *dkPart, float *dvPart, float *dqAccum) {
  const int64_t rows = P.B * P.L;
  KvMaps maps{boxes(ctx, P.qA, rows, kKvQueries), boxes(ctx, P.dO, rows, kKvQueries), boxes(ctx, P.kA, rows),
              boxes(ctx, P.v, rows)};
  KvParams p;
  p.dk = static_cast<__nv_bfloat16 *>(P.dkA.t.p);
  p.dv = static_cast<__nv_bfloat16 *>(P.dV.t.p);
  p.lddk = P.dkA.ld;
  p.hsdk = P.dkA.hs;
  p.lddv = P.dV.ld;
  p.hsdv = P.dV.hs;
  p.lse = lse;
  p.dsum = dsum;
  p.Lp = Lp;
  p.L = static_cast<int>(P.L);
  p.H = P.H;
  p.group = P.group;
  p.kTiles = static_cast<int>((P.L + kRows - 1) / kRows);
  p.scaleLog2 = P.scale * kLog2e;
  p.scale = P.scale;
  p.headsPerBlock = headsPerBlock;
  p.slices = P.group / headsPerBlock;
  p.KV = P.KV;
  p.dkPart = dkPart;
  p.dvPart = dvPart;
  if (dqAccum) { // f32 [B * L][H * 128], boxes of 32 features (128 bytes: the swizzle's row) x 64 rows
    uint64_t dims[2] = {static_cast<uint64_t>(P.H) * kD, static_cast<uint64_t>(rows)};
    uint64_t strides[1] = {static_cast<uint64_t>(P.H) * kD * 4};
    uint32_t box[2] = {32, kKvQueries};
    maps.dq = tensorMap(ctx, "attention backward (dq sums, wgmma)", dqAccum, 2, dims, strides, box,
                        CU_TENSOR_MAP_DATA_TYPE_FLOAT32);
  }
  dim3 grid(static_cast<unsigned>(p.kTiles), static_cast<unsigned>(P.KV * p.slices), static_cast<unsigned>(P.B));
  if (dqAccum) {
    allowShared(ctx, wgmmaDkDvKernel<true>, kKvDqShared, "attention backward (dq, dk, dv, wgmma)");
    wgmmaDkDvKernel<true><<<grid, 3 * 128, kKvDqShared, streamOf(ctx)>>>(maps, p);
    checkLaunch(ctx, "attention backward (dq, dk, dv, wgmma)");
  } else {
    allowShared(ctx, wgmmaDkDvKernel<false>, kKvShared, "attention backward (dk, dv, wgmma)");
    wgmmaDkDvKernel<false><<<grid, 3 * 128, kKvShared, streamOf(ctx)>>>(maps, p);
    checkLaunch(ctx, "attention backward (dk, dv, wgmma)");
  }
}

void wgmmaDq(const KernelContext &ctx, const AttnParams &P, const float *lse, const float *dsum, int64_t Lp) {
  const int64_t rows = P.B * P.L;
  DqMaps maps{boxes(ctx, P.qA, rows), boxes(ctx, P.dO, rows), boxes(ctx, P.kA, rows, kDqKeys),
              boxes(ctx, P.v, rows, kDqKeys)};
  DqParams p;
  p.dq = static_cast<__nv_bfloat16 *>(P.dqA.t.p);
  p.ldq = P.dqA.ld;
  p.hsq = P.dqA.hs;
  p.lse = lse;
  p.dsum = dsum;
  p.Lp = Lp;
  p.L = static_cast<int>(P.L);
  p.H = P.H;
  p.group = P.group;
  p.qTiles = static_cast<int>((P.L + kRows - 1) / kRows);
  p.scaleLog2 = P.scale * kLog2e;
  p.scale = P.scale;
  allowShared(ctx, wgmmaDqKernel, kDqShared, "attention backward (dq, wgmma)");
  dim3 grid(static_cast<unsigned>(p.qTiles), static_cast<unsigned>(P.H), static_cast<unsigned>(P.B));
  wgmmaDqKernel<<<grid, 3 * 128, kDqShared, streamOf(ctx)>>>(maps, p);
  checkLaunch(ctx, "attention backward (dq, wgmma)");
}

void wgmmaForward(const KernelContext &ctx, const AttnParams &P) {
  const int64_t rows = P.B * P.L;
  Maps maps{boxes(ctx, P.qA, rows), boxes(ctx, P.kA, rows), boxes(ctx, P.v, rows)};
  Params p;
  p.out = static_cast<__nv_bfloat16 *>(P.out.t.p);
  p.ldo = P.out.ld;
  p.hso = P.out.hs;
  p.lse = P.lseOut;
  p.L = static_cast<int>(P.L);
  p.H = P.H;
  p.group = P.group;
  p.qTiles = static_cast<int>((P.L + kRows - 1) / kRows);
  p.scaleLog2 = P.scale * kLog2e;
  allowShared(ctx, wgmmaForwardKernel, kShared, "attention (wgmma)");
  dim3 grid(static_cast<unsigned>(p.qTiles), static_cast<unsigned>(P.H), static_cast<unsigned>(P.B));
  wgmmaForwardKernel<<<grid, 3 * 128, kShared, streamOf(ctx)>>>(maps, p);
  checkLaunch(ctx, "attention (wgmma)");
}

} // namespace moec::runtime::cuda::attention
