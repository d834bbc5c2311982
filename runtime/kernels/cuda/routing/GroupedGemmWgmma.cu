//===- GroupedGemmWgmma.cu - bf16 grouped GEMM row forms on Hopper's wgmma --===//
//
// The row forms of GroupedGemm.cuh (Y[rows_e] = alpha X[rows_e] op(W_e) + beta
// Y) for bf16 operands whose extents, strides and bases allow 16-byte copies;
// GroupedGemm.cu sends them here and keeps mma.sync for everything else. Three
// more modes serve the gated SiLU expert MLP without f32 round trips through
// memory (GroupedGemmWgmma.cuh): the sum of two products in one accumulator,
// and gate and up projections of one X in one pass (a second B tile and
// accumulator) with the activation, or its gradient, in the epilogue.
//
// A persistent grid of one CTA per multiprocessor walks 128 x 128 output tiles
// (row tile major). In each CTA, warpgroup 0 (one thread) copies 64-wide k
// tiles of X and W_e by the tensor memory accelerator (TMA) into a ring of
// shared-memory stages (6 of 32 KB; 4 of 48 KB with two B tiles), completing
// on an mbarrier per stage; warpgroups 1 and 2 take 64 rows each
// (wgmma.m64n128k16, f32 accumulators in registers, both operands from shared
// memory) and release each stage on a second mbarrier after its products.
// setmaxnreg moves registers from the copying warpgroup to the two computing
// ones. With LoRA (WgmmaExtra::loraZ), one more k tile after the weights' adds
// the low-rank products z Bᵀ to the same accumulators: no f32 round trip of the
// projections through memory for LoRA experts either. Rows past an expert's last row are copied too (another expert's, or
// zeros past the buffer): they only reach output rows the epilogue skips.
//
// Shared tiles use the 128-byte swizzle (Hopper.cuh): X [rows][k] and W_e
// [n][k] (RowsNT) are K-major; W_e [k][n] (RowsNN) is MN-major, two 64-column
// boxes of [64 k][64 n] 8192 bytes apart (the descriptor's leading offset).
//
// Needs sm_90a (compiled with -gencode=arch=compute_90a,code=sm_90a).
//
//===----------------------------------------------------------------------===//

#include "runtime/kernels/cuda/routing/GroupedGemmWgmma.cuh"

#include <algorithm>
#include <string>

#include "runtime/kernels/cuda/CudaCommon.cuh"
#include "runtime/kernels/cuda/Hopper.cuh"
#include "runtime/kernels/cuda/routing/GroupedGemmTiles.cuh"

namespace moec::runtime::cuda::routing {

namespace {

using hopper::descriptor;
using hopper::mbarrierArrive;
using hopper::mbarrierExpectBytes;
using hopper::mbarrierInit;
using hopper::mbarrierWait;
using hopper::tmaLoad;
using hopper::wgmma128;
using hopper::wgmmaCommit;
using hopper::wgmmaFence;
using hopper::wgmmaWait;

constexpr int kBM = 128, kBN = 128, kBK = 64;
static_assert(kBN == kRowDotColumns, "GluGrad's row dots are one column of partial sums per n tile");
constexpr int kTileBytes = kBM * kBK * 2; // one operand's tile: 128 rows of 128 bytes

/// Two adjacent output elements of the gated modes (the second when `both`), from their
/// accumulators: Glu stores h in `c` (and gate and up in `pre`); GluGrad stores the gate's gradient (from dh's elements
/// times `scale`) in `c`, the up projection's in `c2`, as pairs where they are aligned, and adds
/// dh . h of the pair to `dot`. The activation is in f32 with the SFU's exponential (relative
/// error ~1e-7, far below the bf16 results' rounding): in double, as ExpertMlp.cu's activation
/// kernels compute it, it held the H200's glu at 480 and glu' at 404 TFLOP/s
/// (grouped_gemm_bench, balanced), against 590 and 477 in f32.
template <int kMode, typename CT>
__device__ __forceinline__ void gatedPair(const GroupedParams &p, const WgmmaExtra &x, int64_t row,
                                          int64_t col, bool both, const float (&gate)[2],
                                          const float (&up)[2], const float (&dh)[2], float scale,
                                          float &dot) {
  float out[2], out2[2], h[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float gv = gate[i], u = up[i], s = 1.0f / (1.0f + __expf(-gv)), silu = gv * s;
    h[i] = silu * u;
    if (kMode == Glu) {
      out[i] = h[i];
    } else { // silu' = s (1 + v (1 - s)) (siluGradD, with s computed once)
      float siluGrad = s * (1.0f + gv * (1.0f - s)), d = scale * dh[i];
      out[i] = d * u * siluGrad;
      out2[i] = d * silu;
      if (i == 0 || both)
        dot = fmaf(dh[i], h[i], dot);
    }
  }
  storeTwo(static_cast<CT *>(p.c) + row * p.ldc + col, both, out[0], out[1], 0.0f);
  if (kMode == Glu && x.pre) {
    float *pre = static_cast<float *>(x.pre) + row * 2 * p.n + col;
    storeTwo(pre, both, gate[0], gate[1], 0.0f);
    storeTwo(pre + p.n, both, up[0], up[1], 0.0f);
  }
  if (kMode == GluGrad) {
    storeTwo(static_cast<CT *>(x.c2) + row * p.ldc + col, both, out2[0], out2[1], 0.0f);
    if (x.h)
      storeTwo(static_cast<CT *>(x.h) + row * p.ldc + col, both, h[0], h[1], 0.0f);
  }
}

/// Stores a warpgroup's 64 x 128 accumulators (rows 64 warpGroup.. of the CTA tile at rowBegin,
/// columns n0..; mValid, nValid: the tile's rows and columns inside the output) as `kMode` says.
template <int kMode, typename CT>
__device__ __forceinline__ void storeTile(const GroupedParams &p, const WgmmaExtra &x,
                                          const float (&acc)[64], const float (&acc2)[64],
                                          int warpGroup, int64_t rowBegin, int mValid, int64_t n0,
                                          int nValid) {
  constexpr bool kTwoB = kMode == Glu || kMode == GluGrad;
  // Accumulator d[4j + 2h + c]: row 16 (warp % 4) + lane / 4 + 8h, column 8j + 2 (lane % 4) + c.
  int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3;
  CT *c = static_cast<CT *>(p.c);
  float alpha = p.alpha, beta = p.beta;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    int mLocal = warpGroup * 64 + warp * 16 + (lane >> 2) + h * 8;
    if (mLocal >= mValid)
      continue;
    int64_t row = rowBegin + mLocal;
    // What the row's stores read (GluGrad: dh; SavedGluGrad: G and U; with beta: the old
    // outputs), all loaded before the first store: stores may alias them, so loads between
    // stores would each wait out the memory latency.
    float read[32], read2[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      int nLocal = (i >> 1) * 8 + 2 * (lane & 3) + (i & 1);
      bool inside = nLocal < nValid;
      if constexpr (kMode == SavedGluGrad) {
        const float *pre = x.savedPre + row * 2 * p.n + n0 + nLocal;
        read[i] = inside ? __ldg(pre) : 0.0f;
        read2[i] = inside ? __ldg(pre + p.n) : 0.0f;
      } else if constexpr (kMode == GluGrad)
        read[i] = inside ? __ldg(x.dh + row * p.n + n0 + nLocal) : 0.0f;
      else if constexpr (!kTwoB)
        read[i] = inside && beta != 0.0f ? loadC(c + row * p.ldc + n0 + nLocal) : 0.0f;
      else
        read[i] = 0.0f;
    }
    constexpr bool kGrad = kMode == GluGrad || kMode == SavedGluGrad;
    const float scale = kGrad && x.rowScale ? x.rowScale[row] : 1.0f;
    float dot = 0.0f;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      int nLocal = j * 8 + 2 * (lane & 3);
      if (nLocal >= nValid)
        continue;
      int r = 4 * j + 2 * h;
      if constexpr (kTwoB) {
        gatedPair<kMode, CT>(p, x, row, n0 + nLocal, nLocal + 1 < nValid, {acc[r], acc[r + 1]},
                             {acc2[r], acc2[r + 1]}, {read[2 * j], read[2 * j + 1]}, scale, dot);
      } else if constexpr (kMode == SavedGluGrad) { // the accumulators are dh
        gatedPair<GluGrad, CT>(p, x, row, n0 + nLocal, nLocal + 1 < nValid, {read[2 * j], read[2 * j + 1]},
                               {read2[2 * j], read2[2 * j + 1]}, {acc[r], acc[r + 1]}, scale, dot);
      } else {
        float v0 = alpha * acc[r], v1 = alpha * acc[r + 1];
        if (beta != 0.0f) {
          v0 = fmaf(beta, read[2 * j], v0);
          v1 = fmaf(beta, read[2 * j + 1], v1);
        }
        storeTwo(c + row * p.ldc + n0 + nLocal, nLocal + 1 < nValid, v0, v1, 0.0f);
      }
    }
    if (kGrad && x.rowDots) { // the row's four lanes (a quad, all active or none)
      unsigned quad = __activemask();
      dot += __shfl_xor_sync(quad, dot, 1);
      dot += __shfl_xor_sync(quad, dot, 2);
      if ((lane & 3) == 0)
        x.rowDots[(n0 / kBN) * x.rows + row] = dot;
    }
  }
}

//===--------------------------------------------------------------------===//
// Copies by the tensor memory accelerator, warp-specialised and persistent
//===--------------------------------------------------------------------===//

/// The operands' tensor maps (a2: SumOfTwo's X2; b2: SumOfTwo's W2 or the up weights; z, lb,
/// lb2: the LoRA tile's, WgmmaExtra::loraZ, loraB, loraB2).
struct TmaMaps {
  CUtensorMap a, b, a2, b2, z, lb, lb2;
};

/// findRowTile for one warp, no shared memory or block barrier (the persistent kernel's
/// warps walk the tiles at their own pace).
__device__ bool warpFindRowTile(const int64_t *offsets, int experts, int64_t tile, int &expert,
                                int64_t &rowBegin, int64_t &rowEnd) {
  int lane = threadIdx.x & 31;
  int64_t carry = 0;
  for (int base = 0; base < experts; base += 32) {
    int e = base + lane;
    int64_t tiles = 0;
    if (e < experts) {
      int64_t rows = offsets[e + 1] - offsets[e];
      tiles = rows > 0 ? (rows + kBM - 1) / kBM : 0;
    }
    int64_t v = tiles; // inclusive scan over the warp
    for (int d = 1; d < 32; d <<= 1) {
      int64_t o = __shfl_up_sync(0xffffffffu, v, d);
      if (lane >= d)
        v += o;
    }
    int64_t first = carry + v - tiles;
    unsigned mine = __ballot_sync(0xffffffffu, tiles > 0 && tile >= first && tile < first + tiles);
    if (mine) {
      int src = __ffs(mine) - 1;
      expert = base + src;
      rowBegin = offsets[expert] + (tile - __shfl_sync(0xffffffffu, first, src)) * kBM;
      rowEnd = offsets[expert + 1];
      return true;
    }
    carry += __shfl_sync(0xffffffffu, v, 31);
  }
  return false;
}

/// Warpgroup 0 (one thread) streams A and B tiles by TMA into a ring of stages; warpgroups 1
/// and 2 take 64 rows each of the 128 x 128 tile on wgmma and release each stage after its
/// products. A grid of one CTA per multiprocessor walks the tiles (row tile major, the n tiles
/// of one row tile together, so X rows and W_e stay in L2).
template <bool kTransB, typename CT, int kMode>
__global__ void __launch_bounds__(3 * 128, 1)
    tmaGroupedKernel(const __grid_constant__ TmaMaps maps, GroupedParams p, WgmmaExtra x) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr bool kTwoB = kMode == Glu || kMode == GluGrad;
  constexpr int kStageBytes = (kTwoB ? 3 : 2) * kTileBytes;
  constexpr int kRing = kTwoB ? 4 : 6;
  extern __shared__ unsigned char smemRaw[];
  __shared__ uint64_t full[kRing], empty[kRing];
  uint32_t rawAddress = sharedAddress(smemRaw);
  unsigned char *smem = smemRaw + ((1024 - (rawAddress & 1023)) & 1023);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kRing; ++s) {
      mbarrierInit(&full[s], 1);  // the producer's arrival (+ the copied bytes)
      mbarrierInit(&empty[s], 8); // a lane of each consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  int64_t nTiles = (p.n + kBN - 1) / kBN;
  int tilesPerProduct = static_cast<int>((p.k + kBK - 1) / kBK);
  const bool lora = x.loraZ != nullptr; // one more k tile: LoRA's products, last
  int numK = (kMode == SumOfTwo ? 2 * tilesPerProduct : tilesPerProduct) + (lora ? 1 : 0);
  int warpGroup = threadIdx.x >> 7, lane = threadIdx.x & 31;
  int use = 0; // uses of the ring so far: stage use % kRing, its round use / kRing

  if (warpGroup == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (threadIdx.x >= 32)
      return;
    for (int64_t tile = blockIdx.x;; tile += gridDim.x) {
      int expert;
      int64_t rowBegin, rowEnd;
      if (!warpFindRowTile(p.offsets, p.experts, tile / nTiles, expert, rowBegin, rowEnd))
        break;
      int n0 = static_cast<int>((tile % nTiles) * kBN);
      for (int kt = 0; kt < numK; ++kt, ++use) {
        int s = use % kRing;
        mbarrierWait(&empty[s], ((use / kRing) + 1) & 1); // round 0 passes at once
        if (lane != 0)
          continue;
        bool second = kMode == SumOfTwo && kt >= tilesPerProduct;
        int k0 = (second ? kt - tilesPerProduct : kt) * kBK;
        unsigned char *sA = smem + s * kStageBytes, *sB = sA + kTileBytes;
        mbarrierExpectBytes(&full[s], kStageBytes); // whole boxes, zero-filled past the bounds
        if (lora && kt == numK - 1) { // z against the factors
          tmaLoad(sA, maps.z, 0, static_cast<int>(rowBegin), &full[s]);
          if (kTransB) { // [k][n] (SumOfTwo): the first factor as k rows 0..31, the second as 32..63
            tmaLoad(sB, maps.lb, n0, 0, expert, &full[s]);
            tmaLoad(sB + 4096, maps.lb2, n0, 0, expert, &full[s]);
            tmaLoad(sB + 8192, maps.lb, n0 + 64, 0, expert, &full[s]);
            tmaLoad(sB + 8192 + 4096, maps.lb2, n0 + 64, 0, expert, &full[s]);
          } else { // [n][k]: B as the tile's columns 0.., the up's B shifted to columns 32..
            tmaLoad(sB, maps.lb, 0, n0, expert, &full[s]);
            if (kTwoB)
              tmaLoad(sB + kTileBytes, maps.lb2, -32, n0, expert, &full[s]);
          }
          continue;
        }
        tmaLoad(sA, second ? maps.a2 : maps.a, k0, static_cast<int>(rowBegin), &full[s]);
        const CUtensorMap &w = second ? maps.b2 : maps.b;
        if (!kTransB) {
          tmaLoad(sB, w, k0, n0, expert, &full[s]);
        } else { // two [64 k][64 n] boxes
          tmaLoad(sB, w, n0, k0, expert, &full[s]);
          tmaLoad(sB + 8192, w, n0 + 64, k0, expert, &full[s]);
        }
        if (kTwoB)
          tmaLoad(sB + kTileBytes, maps.b2, k0, n0, expert, &full[s]);
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  int consumer = warpGroup - 1; // rows 64 consumer.. of each tile
  uint32_t smemAddress = sharedAddress(smem);
  float acc[64], acc2[64];
  for (int64_t tile = blockIdx.x;; tile += gridDim.x) {
    int expert;
    int64_t rowBegin, rowEnd;
    if (!warpFindRowTile(p.offsets, p.experts, tile / nTiles, expert, rowBegin, rowEnd))
      break;
    int64_t n0 = (tile % nTiles) * kBN;
#pragma unroll
    for (int i = 0; i < 64; ++i)
      acc[i] = acc2[i] = 0.0f;
    for (int kt = 0; kt < numK; ++kt, ++use) {
      int s = use % kRing;
      mbarrierWait(&full[s], (use / kRing) & 1);
      uint32_t aBase = smemAddress + s * kStageBytes + consumer * 64 * 128;
      uint32_t bBase = smemAddress + s * kStageBytes + kTileBytes;
      wgmmaFence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) {
        uint64_t descA = descriptor(aBase + kk * 32, 16, 1024);
        uint64_t descB = kTransB ? descriptor(bBase + kk * 2048, 8192, 1024)
                                 : descriptor(bBase + kk * 32, 16, 1024);
        wgmma128<kTransB>(acc, descA, descB);
        if (kTwoB)
          wgmma128<kTransB>(acc2, descA, descriptor(bBase + kTileBytes + kk * 32, 16, 1024));
      }
      wgmmaCommit();
      wgmmaWait<0>(); // (keeping one k tile in flight measured the same)
      if (lane == 0)
        mbarrierArrive(&empty[s]);
    }
    int mValid = static_cast<int>(minI64(rowEnd - rowBegin, kBM));
    int nValid = static_cast<int>(minI64(p.n - n0, kBN));
    storeTile<kMode, CT>(p, x, acc, acc2, consumer, rowBegin, mValid, n0, nValid);
  }
#else
  __trap(); // built without sm_90a: the launcher never picks this kernel there
#endif
}

/// X [rows, k] (row stride ld) in boxes of 128 rows x 64 k.
CUtensorMap rowsMap(const KernelContext &ctx, const void *x, int64_t rows, int64_t k, int64_t ld) {
  uint64_t dims[2] = {static_cast<uint64_t>(k), static_cast<uint64_t>(rows)};
  uint64_t strides[1] = {static_cast<uint64_t>(ld) * 2};
  uint32_t box[2] = {kBK, kBM};
  return hopper::tensorMap(ctx, "grouped GEMM (wgmma)", x, 2, dims, strides, box);
}

/// The experts' W_e [n, k] (K-major: boxes 64 k x 128 n) or [k, n] (boxes 64 n x 64 k).
CUtensorMap weightsMap(const KernelContext &ctx, const void *w, const GroupedParams &p, bool kMajor) {
  uint64_t dims[3] = {static_cast<uint64_t>(kMajor ? p.k : p.n), static_cast<uint64_t>(kMajor ? p.n : p.k),
                      static_cast<uint64_t>(p.experts)};
  uint64_t strides[2] = {static_cast<uint64_t>(p.ldb) * 2, static_cast<uint64_t>(p.bStride) * 2};
  uint32_t box[3] = {64, kMajor ? 128u : 64u, 1};
  return hopper::tensorMap(ctx, "grouped GEMM (wgmma)", w, 3, dims, strides, box);
}

/// The experts' LoRA factors (r <= 32): B_e [n, r] (K-major) in boxes of 64 k x 128 n, the
/// columns past r zero-filled; or (kMajor false) A_e [r, n] (MN-major) in boxes of 64 n x 32 k,
/// the rows past r zero-filled.
CUtensorMap loraMap(const KernelContext &ctx, const void *b, const GroupedParams &p, int64_t rank, bool kMajor) {
  uint64_t dims[3] = {static_cast<uint64_t>(kMajor ? rank : p.n), static_cast<uint64_t>(kMajor ? p.n : rank),
                      static_cast<uint64_t>(p.experts)};
  uint64_t strides[2] = {static_cast<uint64_t>(kMajor ? rank : p.n) * 2, static_cast<uint64_t>(p.n * rank) * 2};
  uint32_t box[3] = {64, kMajor ? 128u : 32u, 1};
  return hopper::tensorMap(ctx, "grouped GEMM (wgmma, LoRA tile)", b, 3, dims, strides, box);
}

template <bool kTransB, typename CT, int kMode>
void launchTma(const KernelContext &ctx, const GroupedParams &p, const WgmmaExtra &x, int64_t rows,
               int64_t tiles) {
  TmaMaps maps;
  maps.a = rowsMap(ctx, p.a, rows, p.k, p.lda);
  maps.b = weightsMap(ctx, p.b, p, !kTransB);
  if (kMode == SumOfTwo)
    maps.a2 = rowsMap(ctx, x.a2, rows, p.k, p.lda);
  if (kMode == SumOfTwo || kMode == Glu || kMode == GluGrad)
    maps.b2 = weightsMap(ctx, x.b2, p, !kTransB);
  if (x.loraZ) {
    constexpr bool kTwoB = kMode == Glu || kMode == GluGrad;
    auto rankFits = [](int64_t r) { return r > 0 && r <= 32 && r % 8 == 0; };
    bool two = kTwoB || kTransB; // the gated modes, and SumOfTwo's [k, n] factors: two of them
    bool fits = (kTransB ? kMode == SumOfTwo : kMode != SumOfTwo) && x.loraB && rankFits(x.loraRank) &&
                (!two || (x.loraB2 && rankFits(x.loraRank2)));
    if (!fits)
      ctx.fail("internal: grouped GEMM (wgmma): a LoRA tile needs W_e [n, k] (Plain, the gated modes) or two "
               "[k, n] factors (SumOfTwo), of ranks of at most 32 in multiples of 8");
    maps.z = rowsMap(ctx, x.loraZ, rows, 64, 64);
    maps.lb = loraMap(ctx, x.loraB, p, x.loraRank, !kTransB);
    if (two)
      maps.lb2 = loraMap(ctx, x.loraB2, p, x.loraRank2, !kTransB);
  }
  constexpr bool kTwoB = kMode == Glu || kMode == GluGrad;
  size_t bytes = size_t(kTwoB ? 4 : 6) * (kTwoB ? 3 : 2) * kTileBytes + 1024; // + alignment slack
  auto kernel = tmaGroupedKernel<kTransB, CT, kMode>;
  cudaError_t error = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(bytes));
  if (error != cudaSuccess)
    ctx.fail(std::string("grouped GEMM (wgmma): cannot raise the shared memory limit: ") +
             cudaGetErrorString(error));
  static const int multiprocessors = [] {
    int device = 0, count = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device);
    return count > 0 ? count : 1;
  }();
  unsigned grid = static_cast<unsigned>(std::min<int64_t>(tiles, multiprocessors));
  kernel<<<grid, 3 * 128, bytes, streamOf(ctx)>>>(maps, p, x);
  checkLaunch(ctx, "grouped GEMM (wgmma, TMA)");
}

template <int kMode>
void launchTmaMode(const KernelContext &ctx, const GroupedParams &p, const WgmmaExtra &x, bool transW,
                   plan::DType yType, int64_t rows, int64_t tiles) {
  if constexpr (kMode == Glu || kMode == GluGrad) // the gate and up weights are [n, k]; bf16 outputs
    launchTma<false, __nv_bfloat16, kMode>(ctx, p, x, rows, tiles);
  else if constexpr (kMode == SavedGluGrad) // bf16 outputs, W either way
    transW ? launchTma<false, __nv_bfloat16, kMode>(ctx, p, x, rows, tiles)
           : launchTma<true, __nv_bfloat16, kMode>(ctx, p, x, rows, tiles);
  else if (yType == plan::F32)
    transW ? launchTma<false, float, kMode>(ctx, p, x, rows, tiles)
           : launchTma<true, float, kMode>(ctx, p, x, rows, tiles);
  else
    transW ? launchTma<false, __nv_bfloat16, kMode>(ctx, p, x, rows, tiles)
           : launchTma<true, __nv_bfloat16, kMode>(ctx, p, x, rows, tiles);
}

} // namespace

void wgmmaGroupedGemm(const KernelContext &ctx, const GroupedParams &p, const WgmmaExtra &x,
                      WgmmaMode mode, bool transW, int64_t rows, plan::DType yType) {
  int64_t nTiles = (p.n + kBN - 1) / kBN;
  // Σ_e ceil(rows_e / kBM) <= ceil(rows / kBM) + (experts with rows).
  int64_t rowTiles = (rows + kBM - 1) / kBM + std::min<int64_t>(p.experts, rows);
  if (rows > 0x7fffffff || nTiles > 0x7fffffff || rowTiles > 65535)
    ctx.fail("grouped GEMM: too large (" + std::to_string(rows) + " rows, " +
             std::to_string(nTiles) + " x " + std::to_string(rowTiles) + " tiles)");
  if (!wgmmaAvailable())
    ctx.fail("internal: grouped GEMM (wgmma) without the tensor memory accelerator's driver entry");
  int64_t tiles = nTiles * rowTiles;
  switch (mode) {
  case Plain:
    return launchTmaMode<Plain>(ctx, p, x, transW, yType, rows, tiles);
  case SumOfTwo:
    return launchTmaMode<SumOfTwo>(ctx, p, x, transW, yType, rows, tiles);
  case Glu:
    return launchTmaMode<Glu>(ctx, p, x, transW, yType, rows, tiles);
  case GluGrad:
    return launchTmaMode<GluGrad>(ctx, p, x, transW, yType, rows, tiles);
  case SavedGluGrad:
    return launchTmaMode<SavedGluGrad>(ctx, p, x, transW, yType, rows, tiles);
  }
}

bool wgmmaAvailable() { return hopper::encodeTiled() != nullptr; }

} // namespace moec::runtime::cuda::routing
