//===- GroupedGemm.cu - per-expert GEMMs over device row offsets ----------===//
//
// Scheduling. groupedGemm: the grid is (n tiles, an upper bound on the row
// tiles of all experts: ceil(rows / BM) + min(experts, rows)). Each CTA scans
// the per-expert tile counts (ceil(count_e / BM), from the device offsets) in
// shared memory, finds the expert and row tile its blockIdx.y names, and
// exits when it names none. n is the fastest grid dimension, so the CTAs that
// run together share one expert's weights in L2. groupedGemmReduce: grid (n
// tiles, m tiles, experts); a CTA sums over its expert's rows.
//
// bf16: 128x128x32 CTA tiles, 8 warps of 64x32, mma.sync m16n8k16 (f32
// accumulators) fed by ldmatrix from padded shared memory (conflict-free row
// strides), 4-stage cp.async pipeline. cp.async moves 16-byte chunks, so it
// needs every contiguous extent, leading dimension and expert stride to be a
// multiple of 8 elements and the bases 16-byte aligned; otherwise the same
// kernel fills the tiles by bounds-checked element loads. Out-of-range rows
// and columns are zero-filled, so ragged tiles need no special case in the
// main loop; the epilogue checks bounds.
//
// bf16 row forms whose operands allow 16-byte copies go to GroupedGemmWgmma.cu
// instead (wgmma, TMA, a persistent grid), as do the fused forms
// (groupedGemmSum, groupedGluGemm), which only it runs.
//
// f32: 64x64x16 CTA tiles of plain FMAs (4x4 per thread), f32 throughout.
//
// Deterministic: every output element is written by one thread with a fixed
// summation order; no atomics.
//
//===----------------------------------------------------------------------===//

#include "runtime/kernels/cuda/routing/GroupedGemm.cuh"

#include <algorithm>
#include <string>

#include "runtime/kernels/cuda/CudaCommon.cuh"
#include "runtime/kernels/cuda/routing/GroupedGemmTiles.cuh"
#include "runtime/kernels/cuda/routing/GroupedGemmWgmma.cuh"

namespace moec::runtime::cuda::routing {

namespace {

/// Which product a kernel computes (operand layouts and grouping).
enum Form : int {
  RowsNT = 0, // Y[rows_e] = X[rows_e] W_eᵀ, W_e [n, k]
  RowsNN = 1, // Y[rows_e] = X[rows_e] W_e,  W_e [k, n]
  Reduce = 2, // C_e = A[rows_e]ᵀ B[rows_e]
};

using Params = GroupedParams;
constexpr int kThreadsPerCta = 256;

/// The expert and first row of the row tile `tile` (tiles of `bm` rows, expert
/// by expert, in expert order), or false when the experts have fewer tiles.
/// Every thread of the block must call it; all get the same answer.
__device__ inline bool findRowTile(const int64_t *offsets, int experts, int64_t tile, int bm,
                                   int &expert, int64_t &rowBegin, int64_t &rowEnd) {
  __shared__ int warpSums[kThreadsPerCta / 32];
  __shared__ int found;
  __shared__ int64_t foundFirst;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (threadIdx.x == 0)
    found = -1;
  __syncthreads();
  int64_t carry = 0;
  for (int base = 0; base < experts; base += blockDim.x) {
    int e = base + threadIdx.x;
    int64_t tiles = 0;
    if (e < experts) {
      int64_t rows = offsets[e + 1] - offsets[e];
      tiles = rows > 0 ? (rows + bm - 1) / bm : 0;
    }
    // Inclusive scan over the warp, then over the warps.
    int v = static_cast<int>(tiles);
    for (int d = 1; d < 32; d <<= 1) {
      int o = __shfl_up_sync(0xffffffffu, v, d);
      if (lane >= d)
        v += o;
    }
    if (lane == 31)
      warpSums[warp] = v;
    __syncthreads();
    int64_t before = carry, total = carry;
    for (int w = 0; w < warps; ++w) {
      if (w < warp)
        before += warpSums[w];
      total += warpSums[w];
    }
    int64_t first = before + v - tiles;
    if (tiles > 0 && tile >= first && tile < first + tiles) {
      found = e;
      foundFirst = first;
    }
    __syncthreads(); // warpSums is rewritten next round only after everyone read it
    if (found >= 0)
      break;
    carry = total;
  }
  if (found < 0)
    return false;
  expert = found;
  rowBegin = offsets[expert] + (tile - foundFirst) * bm;
  rowEnd = offsets[expert + 1];
  return true;
}

/// A 16-byte global -> shared copy; `valid` false writes zeros (reads nothing).
__device__ __forceinline__ void cpAsync16(void *smem, const void *global, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sharedAddress(smem)),
               "l"(global), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void cpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}


//===--------------------------------------------------------------------===//
// bf16 on the tensor cores
//===--------------------------------------------------------------------===//

constexpr int kBM = 128, kBN = 128, kBK = 32, kStages = 4;
constexpr int kPad = 8; // elements of row padding: ldmatrix rows land in distinct banks
/// Shared-memory elements of one operand's tile in one stage: the larger of
/// [128][32 + 8] (k contiguous) and [32][128 + 8] (m / n contiguous).
constexpr int kTileElems = kBM * (kBK + kPad);
constexpr int kStageElems = 2 * kTileElems;
constexpr size_t kBf16SmemBytes = size_t(kStages) * kStageElems * sizeof(__nv_bfloat16);

__device__ __forceinline__ void ldmatrixX4(uint32_t (&r)[4], const void *smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(sharedAddress(smem)));
}
__device__ __forceinline__ void ldmatrixX4Trans(uint32_t (&r)[4], const void *smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(sharedAddress(smem)));
}

__device__ __forceinline__ void mmaBf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
               "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// Copies a ROWS x COLS tile (COLS contiguous in memory) from global `g`
/// (row stride ld; rows >= rowsValid or columns >= colsValid read as zero)
/// into shared `s` (row stride COLS + kPad). `safe`: any readable address,
/// the source of the zero-filling copies.
template <int ROWS, int COLS, bool kVec>
__device__ __forceinline__ void loadTile(__nv_bfloat16 *s, const __nv_bfloat16 *g, int64_t ld,
                                         int rowsValid, int colsValid,
                                         const __nv_bfloat16 *safe) {
  constexpr int kChunksPerRow = COLS / 8, kChunks = ROWS * kChunksPerRow;
  static_assert(kChunks % kThreadsPerCta == 0, "tile chunks must split evenly over the threads");
#pragma unroll
  for (int i = 0; i < kChunks / kThreadsPerCta; ++i) {
    int chunk = threadIdx.x + i * kThreadsPerCta;
    int r = chunk / kChunksPerRow, col = (chunk % kChunksPerRow) * 8;
    __nv_bfloat16 *dst = s + r * (COLS + kPad) + col;
    bool rowOk = r < rowsValid;
    if (kVec) {
      // Contiguous extents are multiples of 8: a chunk is all in or all out.
      bool ok = rowOk && col < colsValid;
      cpAsync16(dst, ok ? g + r * ld + col : safe, ok);
    } else {
      alignas(16) __nv_bfloat16 v[8];
#pragma unroll
      for (int j = 0; j < 8; ++j)
        v[j] = rowOk && col + j < colsValid ? g[r * ld + col + j] : __float2bfloat16(0.0f);
      *reinterpret_cast<uint4 *>(dst) = *reinterpret_cast<const uint4 *>(v);
    }
  }
}

template <int F, bool kVec, typename CT>
__global__ void __launch_bounds__(kThreadsPerCta, 2) bf16GroupedKernel(Params p) {
  constexpr bool kAKMajor = F != Reduce; // A [m][k] (else [k][m])
  constexpr bool kBKMajor = F == RowsNT; // B [n][k] (else [k][n])
  extern __shared__ __align__(16) unsigned char smemRaw[];
  auto *smem = reinterpret_cast<__nv_bfloat16 *>(smemRaw);

  // This CTA's expert, rows (row forms) or k range (Reduce), and tile origin.
  int expert;
  int64_t rowBegin = 0, rowEnd = 0, m0 = 0;
  int64_t n0 = static_cast<int64_t>(blockIdx.x) * kBN;
  const auto *a = static_cast<const __nv_bfloat16 *>(p.a);
  const auto *b = static_cast<const __nv_bfloat16 *>(p.b);
  CT *c = static_cast<CT *>(p.c);
  int64_t kTotal;
  int mValid;
  if (F != Reduce) {
    if (!findRowTile(p.offsets, p.experts, blockIdx.y, kBM, expert, rowBegin, rowEnd))
      return;
    kTotal = p.k;
    mValid = static_cast<int>(minI64(rowEnd - rowBegin, kBM));
    b += expert * p.bStride;
  } else {
    expert = blockIdx.z;
    rowBegin = p.offsets[expert];
    rowEnd = p.offsets[expert + 1];
    kTotal = rowEnd > rowBegin ? rowEnd - rowBegin : 0;
    m0 = static_cast<int64_t>(blockIdx.y) * kBM;
    mValid = static_cast<int>(minI64(p.m - m0, kBM));
    c += expert * p.cStride;
  }
  int nValid = static_cast<int>(minI64(p.n - n0, kBN));
  int numK = static_cast<int>((kTotal + kBK - 1) / kBK);

  // Issues the copies of k tile `kt` into stage `stage`.
  auto loadStage = [&](int stage, int kt) {
    __nv_bfloat16 *sA = smem + stage * kStageElems, *sB = sA + kTileElems;
    int64_t k0 = static_cast<int64_t>(kt) * kBK;
    int kValid = static_cast<int>(minI64(kTotal - k0, kBK));
    if (kAKMajor) // A tile [m][k]: rows of X
      loadTile<kBM, kBK, kVec>(sA, a + rowBegin * p.lda + k0, p.lda, mValid, kValid, a);
    else // A tile [k][m]: the expert's rows of A, columns m0..
      loadTile<kBK, kBM, kVec>(sA, a + (rowBegin + k0) * p.lda + m0, p.lda, kValid, mValid, a);
    if (kBKMajor) // B tile [n][k]
      loadTile<kBN, kBK, kVec>(sB, b + n0 * p.ldb + k0, p.ldb, nValid, kValid, b);
    else if (F == RowsNN) // B tile [k][n] of W_e
      loadTile<kBK, kBN, kVec>(sB, b + k0 * p.ldb + n0, p.ldb, kValid, nValid, b);
    else // B tile [k][n]: the expert's rows of B
      loadTile<kBK, kBN, kVec>(sB, b + (rowBegin + k0) * p.ldb + n0, p.ldb, kValid, nValid, b);
  };

  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int wm = (warp >> 2) * 64, wn = (warp & 3) * 32; // the warp's 64x32 corner
  float acc[4][4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r)
        acc[i][j][r] = 0.0f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < numK)
      loadStage(s, s);
    cpAsyncCommit();
  }
  // ldmatrix: lane l gives row (l % 8) of 8x8 matrix l / 8.
  int q = lane >> 3, r8 = lane & 7;
  for (int kt = 0; kt < numK; ++kt) {
    cpAsyncWait<kStages - 2>();
    __syncthreads(); // stage kt landed for every thread; stage kt - 1 is free
    if (kt + kStages - 1 < numK)
      loadStage((kt + kStages - 1) % kStages, kt + kStages - 1);
    cpAsyncCommit();
    const __nv_bfloat16 *sA = smem + (kt % kStages) * kStageElems, *sB = sA + kTileElems;
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      uint32_t af[4][4], bf[2][4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        int mb = wm + i * 16;
        if (kAKMajor) // matrices (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15)
          ldmatrixX4(af[i], sA + (mb + r8 + (q & 1) * 8) * (kBK + kPad) + kk + (q >> 1) * 8);
        else // the same four, stored [k][m]: transposed loads
          ldmatrixX4Trans(af[i], sA + (kk + r8 + (q >> 1) * 8) * (kBM + kPad) + mb + (q & 1) * 8);
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        int nb = wn + j * 16;
        if (kBKMajor) // (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15)
          ldmatrixX4(bf[j], sB + (nb + r8 + (q >> 1) * 8) * (kBK + kPad) + kk + (q & 1) * 8);
        else
          ldmatrixX4Trans(bf[j], sB + (kk + r8 + (q & 1) * 8) * (kBN + kPad) + nb + (q >> 1) * 8);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
          mmaBf16(acc[i][j], af[i], bf[j >> 1][(j & 1) * 2], bf[j >> 1][(j & 1) * 2 + 1]);
    }
  }
  cpAsyncWait<0>(); // no copy may outlive the CTA's shared memory

  // Epilogue: thread holds (row g, cols 2t, 2t+1) and (row g + 8, same cols)
  // of each 16x8 accumulator.
  int g = lane >> 2, t = lane & 3;
  float alpha = p.alpha, beta = p.beta;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      int mLocal = wm + i * 16 + g + half * 8;
      if (mLocal >= mValid)
        continue;
      CT *row = F != Reduce ? c + (rowBegin + mLocal) * p.ldc : c + (m0 + mLocal) * p.ldc;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        int nLocal = wn + j * 8 + 2 * t;
        if (nLocal >= nValid)
          continue;
        storeTwo(row + n0 + nLocal, nLocal + 1 < nValid, alpha * acc[i][j][half * 2],
                 alpha * acc[i][j][half * 2 + 1], beta);
      }
    }
}

//===--------------------------------------------------------------------===//
// f32 on FMAs
//===--------------------------------------------------------------------===//

constexpr int kFM = 64, kFN = 64, kFK = 16;

template <int F> __global__ void __launch_bounds__(kThreadsPerCta) f32GroupedKernel(Params p) {
  __shared__ float sA[kFK][kFM + 4], sB[kFK][kFN + 4];
  int expert;
  int64_t rowBegin = 0, rowEnd = 0, m0 = 0;
  int64_t n0 = static_cast<int64_t>(blockIdx.x) * kFN;
  const auto *a = static_cast<const float *>(p.a);
  const auto *b = static_cast<const float *>(p.b);
  float *c = static_cast<float *>(p.c);
  int64_t kTotal;
  int mValid;
  if (F != Reduce) {
    if (!findRowTile(p.offsets, p.experts, blockIdx.y, kFM, expert, rowBegin, rowEnd))
      return;
    kTotal = p.k;
    mValid = static_cast<int>(minI64(rowEnd - rowBegin, kFM));
    b += expert * p.bStride;
  } else {
    expert = blockIdx.z;
    rowBegin = p.offsets[expert];
    rowEnd = p.offsets[expert + 1];
    kTotal = rowEnd > rowBegin ? rowEnd - rowBegin : 0;
    m0 = static_cast<int64_t>(blockIdx.y) * kFM;
    mValid = static_cast<int>(minI64(p.m - m0, kFM));
    c += expert * p.cStride;
  }
  int nValid = static_cast<int>(minI64(p.n - n0, kFN));
  int tx = threadIdx.x & 15, ty = threadIdx.x >> 4; // rows ty + 16i, columns tx + 16j
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < kTotal; k0 += kFK) {
    int kValid = static_cast<int>(minI64(kTotal - k0, kFK));
#pragma unroll
    for (int i = 0; i < kFM * kFK / kThreadsPerCta; ++i) {
      int idx = threadIdx.x + i * kThreadsPerCta;
      if (F != Reduce) { // A [m][k]: k fastest in memory
        int mm = idx / kFK, kk = idx % kFK;
        sA[kk][mm] = mm < mValid && kk < kValid ? a[(rowBegin + mm) * p.lda + k0 + kk] : 0.0f;
      } else { // A [k][m]
        int kk = idx / kFM, mm = idx % kFM;
        sA[kk][mm] =
            kk < kValid && mm < mValid ? a[(rowBegin + k0 + kk) * p.lda + m0 + mm] : 0.0f;
      }
      if (F == RowsNT) { // B [n][k]
        int nn = idx / kFK, kk = idx % kFK;
        sB[kk][nn] = nn < nValid && kk < kValid ? b[(n0 + nn) * p.ldb + k0 + kk] : 0.0f;
      } else { // B [k][n]: W_e's rows, or the expert's rows of B
        int kk = idx / kFN, nn = idx % kFN;
        int64_t kRow = F == RowsNN ? k0 + kk : rowBegin + k0 + kk;
        sB[kk][nn] = kk < kValid && nn < nValid ? b[kRow * p.ldb + n0 + nn] : 0.0f;
      }
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kFK; ++kk) {
      float av[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
        av[i] = sA[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j)
        bv[j] = sB[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
          acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    int mLocal = ty + 16 * i;
    if (mLocal >= mValid)
      continue;
    float *row = F != Reduce ? c + (rowBegin + mLocal) * p.ldc : c + (m0 + mLocal) * p.ldc;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      int nLocal = tx + 16 * j;
      if (nLocal >= nValid)
        continue;
      float v = p.alpha * acc[i][j];
      if (p.beta != 0.0f)
        v = fmaf(p.beta, row[n0 + nLocal], v);
      row[n0 + nLocal] = v;
    }
  }
}

//===--------------------------------------------------------------------===//
// Launch
//===--------------------------------------------------------------------===//

bool aligned16(const void *p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

/// Whether a bf16 operand can be copied in 16-byte chunks: the base aligned,
/// and its contiguous extent, row stride and expert stride multiples of 8.
bool chunkable(const void *p, int64_t contiguous, int64_t ld, int64_t stride = 0) {
  return aligned16(p) && contiguous % 8 == 0 && ld % 8 == 0 && stride % 8 == 0;
}

/// The launch parameters of the row forms.
Params rowParams(const ExpertRows &g, int64_t n, int64_t k, float alpha, const void *x, int64_t ldx,
                 const void *w, int64_t ldw, int64_t wStride, float beta, void *y, int64_t ldy) {
  Params p;
  p.a = x;
  p.lda = ldx;
  p.b = w;
  p.ldb = ldw;
  p.bStride = wStride;
  p.c = y;
  p.ldc = ldy;
  p.n = n;
  p.k = k;
  p.alpha = alpha;
  p.beta = beta;
  p.offsets = g.offsets;
  p.experts = static_cast<int>(g.experts);
  return p;
}

void checkTypes(const KernelContext &ctx, plan::DType abType, plan::DType cType,
                const char *what) {
  if (abType != plan::F32 && abType != plan::BF16)
    ctx.fail(std::string(what) + ": operands must be f32 or bf16");
  if (cType != plan::F32 && cType != abType)
    ctx.fail(std::string(what) + ": the output must be f32 or the operands' type");
}

template <int F, bool kVec, typename CT>
void launchBf16(const KernelContext &ctx, dim3 grid, const Params &p) {
  auto kernel = bf16GroupedKernel<F, kVec, CT>;
  // Above 48 KB of dynamic shared memory needs the opt-in (per device, cheap).
  cudaError_t error = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(kBf16SmemBytes));
  if (error != cudaSuccess)
    ctx.fail(std::string("grouped GEMM: cannot raise the shared memory limit: ") +
             cudaGetErrorString(error));
  kernel<<<grid, kThreadsPerCta, kBf16SmemBytes, streamOf(ctx)>>>(p);
}

template <int F>
void launch(const KernelContext &ctx, plan::DType abType, plan::DType cType, bool vec,
            int64_t mTiles, const Params &p) {
  bool bf16 = abType == plan::BF16;
  int64_t nTiles = (p.n + (bf16 ? kBN : kFN) - 1) / (bf16 ? kBN : kFN);
  int64_t zDim = F == Reduce ? p.experts : 1;
  if (nTiles > 0x7fffffff || mTiles > 65535 || zDim > 65535)
    ctx.fail("grouped GEMM: too large (" + std::to_string(nTiles) + " x " + std::to_string(mTiles) +
             " x " + std::to_string(zDim) + " tiles)");
  dim3 grid(static_cast<unsigned>(nTiles), static_cast<unsigned>(mTiles),
            static_cast<unsigned>(zDim));
  if (!bf16) {
    f32GroupedKernel<F><<<grid, kThreadsPerCta, 0, streamOf(ctx)>>>(p);
  } else if (cType == plan::F32) {
    vec ? launchBf16<F, true, float>(ctx, grid, p) : launchBf16<F, false, float>(ctx, grid, p);
  } else {
    vec ? launchBf16<F, true, __nv_bfloat16>(ctx, grid, p)
        : launchBf16<F, false, __nv_bfloat16>(ctx, grid, p);
  }
  checkLaunch(ctx, "grouped GEMM");
}

} // namespace

namespace {

/// The wgmma kernel's LoRA operands (WgmmaExtra).
void addLoraTile(WgmmaExtra &extra, const LoraTile *lora) {
  if (!lora)
    return;
  extra.loraZ = lora->z;
  extra.loraB = lora->b;
  extra.loraB2 = lora->b2;
  extra.loraRank = lora->rank;
  extra.loraRank2 = lora->rank2;
}

} // namespace

bool groupedLoraFits(int64_t k, const void *x, int64_t ldx, const void *w, int64_t ldw, int64_t wStride,
                     plan::DType abType, const LoraTile &lora) {
  return abType == plan::BF16 && wgmmaAvailable() && chunkable(x, k, ldx) && chunkable(w, k, ldw, wStride) &&
         lora.z && chunkable(lora.z, 64, 64) && lora.b && loraTileRank(lora.rank) &&
         chunkable(lora.b, lora.rank, lora.rank) &&
         (!lora.b2 || (loraTileRank(lora.rank2) && chunkable(lora.b2, lora.rank2, lora.rank2)));
}

void groupedGemm(const KernelContext &ctx, const ExpertRows &g, int64_t n, int64_t k, float alpha,
                 const void *x, int64_t ldx, const void *w, int64_t ldw, int64_t wStride,
                 bool transW, plan::DType abType, float beta, void *y, int64_t ldy,
                 plan::DType yType, const LoraTile *lora) {
  checkTypes(ctx, abType, yType, "grouped GEMM");
  if (g.rows <= 0 || g.experts <= 0 || n <= 0)
    return;
  if (g.experts > 0x7fffffff)
    ctx.fail("grouped GEMM: too many experts");
  Params p = rowParams(g, n, k, alpha, x, ldx, w, ldw, wStride, beta, y, ldy);
  int bm = abType == plan::BF16 ? kBM : kFM;
  // Σ_e ceil(rows_e / bm) <= ceil(rows / bm) + (experts with rows).
  int64_t mTiles = (g.rows + bm - 1) / bm + std::min(g.experts, g.rows);
  bool vec = chunkable(x, k, ldx) && chunkable(w, transW ? k : n, ldw, wStride);
  if (lora) {
    if (!transW || !groupedLoraFits(k, x, ldx, w, ldw, wStride, abType, *lora))
      ctx.fail("internal: grouped GEMM with a LoRA tile on operands it does not take");
    WgmmaExtra extra;
    addLoraTile(extra, lora);
    return wgmmaGroupedGemm(ctx, p, extra, Plain, transW, g.rows, yType);
  }
  if (abType == plan::BF16 && vec && wgmmaAvailable()) // Hopper's wgmma (GroupedGemmWgmma.cu)
    return wgmmaGroupedGemm(ctx, p, WgmmaExtra{}, Plain, transW, g.rows, yType);
  if (transW)
    launch<RowsNT>(ctx, abType, yType, vec, mTiles, p);
  else
    launch<RowsNN>(ctx, abType, yType, vec, mTiles, p);
}

bool groupedGemmSum(const KernelContext &ctx, const ExpertRows &g, int64_t n, int64_t k,
                    const void *x1, const void *x2, int64_t ldx, const void *w1, const void *w2,
                    int64_t ldw, int64_t wStride, bool transW, plan::DType abType, void *y,
                    int64_t ldy, plan::DType yType, const LoraTile *lora) {
  checkTypes(ctx, abType, yType, "grouped GEMM sum");
  int64_t wContiguous = transW ? k : n;
  if (abType != plan::BF16 || !wgmmaAvailable() || !chunkable(x1, k, ldx) || !chunkable(x2, k, ldx) ||
      !chunkable(w1, wContiguous, ldw, wStride) || !chunkable(w2, wContiguous, ldw, wStride) ||
      g.experts > 0x7fffffff ||
      (lora && (transW || !lora->z || !lora->b || !lora->b2 || !loraTileRank(lora->rank) ||
                !loraTileRank(lora->rank2) || !chunkable(lora->z, 64, 64) || !chunkable(lora->b, n, n) ||
                !chunkable(lora->b2, n, n))))
    return false;
  if (g.rows <= 0 || g.experts <= 0 || n <= 0)
    return true;
  WgmmaExtra extra;
  extra.a2 = x2;
  extra.b2 = w2;
  addLoraTile(extra, lora);
  wgmmaGroupedGemm(ctx, rowParams(g, n, k, 1.0f, x1, ldx, w1, ldw, wStride, 0.0f, y, ldy), extra,
                   SumOfTwo, transW, g.rows, yType);
  return true;
}

bool groupedGluFits(int64_t k, const void *x, int64_t ldx, const void *wGate, const void *wUp,
                    int64_t ldw, int64_t wStride, plan::DType abType) {
  return abType == plan::BF16 && wgmmaAvailable() && chunkable(x, k, ldx) &&
         chunkable(wGate, k, ldw, wStride) && chunkable(wUp, k, ldw, wStride);
}

void groupedGluGemm(const KernelContext &ctx, const ExpertRows &g, int64_t n, int64_t k,
                    const void *x, int64_t ldx, const void *wGate, const void *wUp, int64_t ldw,
                    int64_t wStride, plan::DType abType, const float *dh, void *out, void *out2,
                    int64_t ldh, const float *rowScale, float *rowDots, const LoraTile *lora, void *h,
                    void *pre) {
  if (!groupedGluFits(k, x, ldx, wGate, wUp, ldw, wStride, abType) || g.experts > 0x7fffffff ||
      (lora && (!lora->b2 || !groupedLoraFits(k, x, ldx, wGate, ldw, wStride, abType, *lora))))
    ctx.fail("internal: grouped gated SiLU GEMM on operands it does not take");
  if (g.rows <= 0 || g.experts <= 0 || n <= 0)
    return;
  WgmmaExtra extra;
  extra.b2 = wUp;
  extra.dh = dh;
  extra.c2 = out2;
  extra.rowScale = rowScale;
  extra.rowDots = rowDots;
  extra.rows = g.rows;
  extra.h = dh ? h : nullptr;
  extra.pre = dh ? nullptr : pre;
  addLoraTile(extra, lora);
  wgmmaGroupedGemm(ctx, rowParams(g, n, k, 1.0f, x, ldx, wGate, ldw, wStride, 0.0f, out, ldh), extra,
                   dh ? GluGrad : Glu, true, g.rows, abType);
}

bool groupedSavedGluGradGemm(const KernelContext &ctx, const ExpertRows &g, int64_t n, int64_t k, const void *x,
                             int64_t ldx, const void *w, int64_t ldw, int64_t wStride, bool transW,
                             plan::DType abType, const float *pre, void *out, void *out2, int64_t ldo,
                             const float *rowScale, float *rowDots) {
  if (abType != plan::BF16 || !wgmmaAvailable() || !chunkable(x, k, ldx) ||
      !chunkable(w, transW ? k : n, ldw, wStride) || g.experts > 0x7fffffff)
    return false;
  if (g.rows <= 0 || g.experts <= 0 || n <= 0)
    return true;
  WgmmaExtra extra;
  extra.savedPre = pre;
  extra.c2 = out2;
  extra.rowScale = rowScale;
  extra.rowDots = rowDots;
  extra.rows = g.rows;
  wgmmaGroupedGemm(ctx, rowParams(g, n, k, 1.0f, x, ldx, w, ldw, wStride, 0.0f, out, ldo), extra, SavedGluGrad,
                   transW, g.rows, abType);
  return true;
}

void groupedGemmReduce(const KernelContext &ctx, const ExpertRows &g, int64_t m, int64_t n,
                       float alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                       plan::DType abType, float beta, void *c, int64_t ldc, int64_t cStride,
                       plan::DType cType) {
  checkTypes(ctx, abType, cType, "grouped weight GEMM");
  if (g.experts <= 0 || m <= 0 || n <= 0)
    return;
  Params p;
  p.a = a;
  p.lda = lda;
  p.b = b;
  p.ldb = ldb;
  p.c = c;
  p.ldc = ldc;
  p.cStride = cStride;
  p.m = m;
  p.n = n;
  p.alpha = alpha;
  p.beta = beta;
  p.offsets = g.offsets;
  p.experts = static_cast<int>(std::min<int64_t>(g.experts, 0x7fffffff));
  int bm = abType == plan::BF16 ? kBM : kFM;
  bool vec = chunkable(a, m, lda) && chunkable(b, n, ldb);
  launch<Reduce>(ctx, abType, cType, vec, (m + bm - 1) / bm, p);
}

} // namespace moec::runtime::cuda::routing
