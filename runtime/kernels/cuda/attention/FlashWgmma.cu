//===- FlashWgmma.cu - the attention forward on Hopper's wgmma (sm_90a) ---===//
//
// Causal attention forward for bf16 query, key and value with head dim =
// value dim = 128, no sliding window and no sinks (Qwen3's layers), in the
// FlashAttention-3 arrangement; Dense.cu sends such launches here before
// Flash.cu's mma.sync kernels (MOEC_ATTENTION_WGMMA=0 turns it off, as does
// MOEC_ATTENTION_GENERAL=1, which asks for the general kernels).
//
// One CTA per (128-query tile, head, sequence), the longest rows first.
// Warpgroup 0 (one thread) copies the query tile once and then the key and
// value tiles of 128 rows by TMA into a ring of two stages, each completing
// on its own mbarrier (so S = Q Kᵀ can start before V lands). Warpgroups 1 and
// 2 take 64 queries each: S on wgmma.m64n128k16 with both operands in shared
// memory, the online softmax in base 2 on the accumulators, then O += P V
// with P straight from the S registers (bf16 pairs: the accumulator layout of
// two n8 blocks is mma's A fragment) and V transposed from shared memory;
// each stage is released on a second mbarrier after its products. Key tiles
// run 0 .. the diagonal one, masked per element only there. The result is
// written in bf16, and the logsumexp when the op has that result.
//
// Tiles use the 128-byte swizzle (Hopper.cuh): Q and K as two K-major boxes
// of [128 rows][64 features]; V as two MN-major boxes of [128 keys][64
// features], 16 KB apart.
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
constexpr int kStages = 2;                     // key/value tiles in flight
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
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
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

  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  const int consumer = warpGroup - 1;
  // Accumulator d[4j + 2r + c]: row 16 warp + lane / 4 + 8r of the warpgroup's 64, column 8j + 2 (lane % 4) + c.
  const int rowInTile = consumer * 64 + warp * 16 + (lane >> 2);
  const uint32_t qAddress = sharedAddress(sQ) + consumer * 64 * 128, ringAddress = sharedAddress(sRing);
  float o[64], s[64], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < 64; ++i)
    o[i] = 0.0f;
  mbarrierWait(&qFull, 0);
  for (int j = 0; j < tiles; ++j) {
    const int st = j % kStages, parity = (j / kStages) & 1;
    const uint32_t kAddress = ringAddress + st * kStageBytes, vAddress = kAddress + 2 * kBox;
#pragma unroll
    for (int i = 0; i < 64; ++i)
      s[i] = 0.0f;
    mbarrierWait(&kFull[st], parity);
    wgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint32_t step = (kk >> 2) * kBox + (kk & 3) * 32;
      wgmma128<false>(s, descriptor(qAddress + step, 16, 1024), descriptor(kAddress + step, 16, 1024));
    }
    wgmmaCommit();
    wgmmaWait<0>();

    // Online softmax in base 2; only the diagonal tile masks (key > query).
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
      const float alpha = exp2Approx(m[r] - mNew);
      m[r] = mNew;
      float sum = 0.0f;
#pragma unroll
      for (int jj = 0; jj < 16; ++jj)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int i = 4 * jj + 2 * r + c;
          s[i] = exp2Approx(s[i] - mNew);
          sum += s[i];
          o[i] *= alpha;
        }
      l[r] = l[r] * alpha + sum; // this lane's part of the row; the quad's parts are summed at the end
    }

    // P as A fragments, all before the products (registers an issued wgmma reads must not change).
    uint32_t a[kRows / 16][4]; // keys 16 kk ..: the n8 blocks 2 kk and 2 kk + 1 of S
#pragma unroll
    for (int kk = 0; kk < kRows / 16; ++kk)
#pragma unroll
      for (int q = 0; q < 4; ++q)
        a[kk][q] = packBf16(s[8 * kk + 2 * q], s[8 * kk + 2 * q + 1]);
    mbarrierWait(&vFull[st], parity);
    wgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kRows / 16; ++kk)
      wgmma128Registers(o, a[kk], descriptor(vAddress + kk * 2048, kBox, 1024));
    wgmmaCommit();
    wgmmaWait<0>();
    if (lane == 0)
      mbarrierArrive(&empty[st]);
  }

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

CUtensorMap boxes(const KernelContext &ctx, const Mat &m, int64_t rows) {
  uint64_t dims[2] = {static_cast<uint64_t>(m.ld), static_cast<uint64_t>(rows)};
  uint64_t strides[1] = {static_cast<uint64_t>(m.ld) * 2};
  uint32_t box[2] = {64, kRows};
  return tensorMap(ctx, "attention (wgmma)", m.t.p, 2, dims, strides, box);
}

} // namespace

bool wgmmaForwardFits(const AttnParams &P) {
  const char *general = std::getenv("MOEC_ATTENTION_GENERAL"), *wgmma = std::getenv("MOEC_ATTENTION_WGMMA");
  if ((general && general[0] == '1') || (wgmma && wgmma[0] == '0'))
    return false;
  return P.dA == kD && P.dB == 0 && P.dv == kD && P.window == 0 && !P.sinks.p && P.scale > 0.0f &&
         P.out.t.p && P.out.t.bf16 && reinterpret_cast<uintptr_t>(P.out.t.p) % 4 == 0 && P.out.ld % 2 == 0 &&
         P.out.hs % 2 == 0 && boxable(P.qA) && boxable(P.kA) && boxable(P.v) && P.B * P.L < (int64_t{1} << 31) &&
         P.H <= 65535 && P.B <= 65535 && hopperHere();
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
  cudaError_t error =
      cudaFuncSetAttribute(wgmmaForwardKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kShared));
  if (error != cudaSuccess)
    ctx.fail(std::string("attention (wgmma): cannot opt into ") + std::to_string(kShared) +
             " bytes of shared memory: " + cudaGetErrorString(error));
  dim3 grid(static_cast<unsigned>(p.qTiles), static_cast<unsigned>(P.H), static_cast<unsigned>(P.B));
  wgmmaForwardKernel<<<grid, 3 * 128, kShared, streamOf(ctx)>>>(maps, p);
  checkLaunch(ctx, "attention (wgmma)");
}

} // namespace moec::runtime::cuda::attention
