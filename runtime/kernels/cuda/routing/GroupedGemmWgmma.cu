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
// CTA tile 128 x 128 x 64, two warpgroups of 64 x 128 (wgmma.m64n128k16, f32
// accumulators in registers, both operands from shared memory), 3 stages of
// cp.async copies, two CTAs a multiprocessor. Shared tiles use the 128-byte
// swizzle the wgmma descriptors name: a row of 64 bf16 is 128 bytes, its
// 16-byte chunk c stored at chunk c ^ (row % 8), every tile 1024-byte aligned.
//  - X [rows][k] and W_e [n][k] (RowsNT) are K-major: 8-row groups 1024 bytes
//    apart (the descriptor's stride offset), a k16 step 32 bytes further.
//  - W_e [k][n] (RowsNN) is MN-major (wgmma transposes it): two 64-column
//    blocks of [64 k][64 n], 8192 bytes apart (leading offset), 8-k groups
//    1024 bytes apart (stride offset), a k16 step 2048 bytes further.
// The wgmma of a k tile completes before the barrier that lets the next copy
// overwrite its stage, so copies run two tiles ahead of the tensor cores.
//
// The two-B modes hold two accumulators (128 registers a thread) and 3 stages
// of 48 KB: one CTA a multiprocessor.
//
// Needs sm_90a (compiled with -gencode=arch=compute_90a,code=sm_90a).
//
//===----------------------------------------------------------------------===//

#include "runtime/kernels/cuda/routing/GroupedGemmWgmma.cuh"

#include <string>

#include "runtime/kernels/cuda/CudaCommon.cuh"
#include "runtime/kernels/cuda/routing/GroupedGemmTiles.cuh"
#include "runtime/kernels/cuda/routing/Silu.cuh"

namespace moec::runtime::cuda::routing {

namespace {

constexpr int kBM = 128, kBN = 128, kBK = 64, kStages = 3;
constexpr int kTileBytes = kBM * kBK * 2; // one operand's tile: 128 rows of 128 bytes

/// A shared-memory matrix descriptor with the 128-byte swizzle.
__device__ __forceinline__ uint64_t descriptor(uint32_t address, uint32_t leading,
                                               uint32_t stride) {
  return static_cast<uint64_t>((address & 0x3ffff) >> 4) |
         static_cast<uint64_t>(leading >> 4) << 16 | static_cast<uint64_t>(stride >> 4) << 32 |
         1ull << 62;
}

__device__ __forceinline__ void wgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmmaWaitAll() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}

/// d[64 x 128] += A[64 x 16] B[16 x 128]; kTransB: B stored MN-major.
template <bool kTransB>
__device__ __forceinline__ void wgmma128(float (&d)[64], uint64_t descA, uint64_t descB) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1, 0, %67;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
        "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),
        "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]),
        "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),
        "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]),
        "+f"(d[62]), "+f"(d[63])
      : "l"(descA), "l"(descB), "r"(1), "n"(kTransB ? 1 : 0));
}

/// One output element of the gated modes, from its accumulators: Glu stores h in `c`; GluGrad
/// stores the gate's gradient (from dh's element `d`) in `c`, the up projection's in `c2` (like
/// ExpertMlp.cu's activation kernels, in double).
template <int kMode, typename CT>
__device__ __forceinline__ void gatedElement(const GroupedParams &p, const WgmmaExtra &x,
                                             int64_t row, int64_t col, float gate, float up,
                                             double d) {
  double gv = gate, u = up, s = sigmoidD(gv), silu = gv * s;
  if (kMode == Glu) {
    static_cast<CT *>(p.c)[row * p.ldc + col] = fromFloat<CT>(static_cast<float>(silu * u));
  } else { // silu' = s (1 + v (1 - s)) (siluGradD, with s computed once)
    double siluGrad = s * (1.0 + gv * (1.0 - s));
    static_cast<CT *>(p.c)[row * p.ldc + col] = fromFloat<CT>(static_cast<float>(d * u * siluGrad));
    static_cast<CT *>(x.c2)[row * p.ldc + col] = fromFloat<CT>(static_cast<float>(d * silu));
  }
}

template <bool kTransB, typename CT, int kMode>
__global__ void __launch_bounds__(kGroupedThreads, kMode == Glu || kMode == GluGrad ? 1 : 2)
    wgmmaGroupedKernel(GroupedParams p, WgmmaExtra x) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr bool kTwoB = kMode == Glu || kMode == GluGrad; // gate and up weights, one X
  constexpr int kStageBytes = (kTwoB ? 3 : 2) * kTileBytes;
  extern __shared__ unsigned char smemRaw[];
  // 1024-byte aligned stages (the swizzle pattern follows the address bits).
  uint32_t rawAddress = sharedAddress(smemRaw);
  unsigned char *smem = smemRaw + ((1024 - (rawAddress & 1023)) & 1023);
  uint32_t smemAddress = sharedAddress(smem);

  int expert;
  int64_t rowBegin = 0, rowEnd = 0;
  if (!findRowTile(p.offsets, p.experts, blockIdx.y, kBM, expert, rowBegin, rowEnd))
    return;
  int64_t n0 = static_cast<int64_t>(blockIdx.x) * kBN;
  const auto *a = static_cast<const __nv_bfloat16 *>(p.a) + rowBegin * p.lda;
  const auto *b = static_cast<const __nv_bfloat16 *>(p.b) + expert * p.bStride;
  // SumOfTwo: the second product's X and W (same strides); two B: the up weights.
  const auto *a2 = kMode == SumOfTwo ? static_cast<const __nv_bfloat16 *>(x.a2) + rowBegin * p.lda : a;
  const auto *b2 = kMode != Plain ? static_cast<const __nv_bfloat16 *>(x.b2) + expert * p.bStride : b;
  int mValid = static_cast<int>(minI64(rowEnd - rowBegin, kBM));
  int nValid = static_cast<int>(minI64(p.n - n0, kBN));
  int tilesPerProduct = static_cast<int>((p.k + kBK - 1) / kBK);
  int numK = kMode == SumOfTwo ? 2 * tilesPerProduct : tilesPerProduct;

  // Copies one [128][64] K-major tile (rows from `src`, row stride ld) into `dst`.
  auto loadKMajor = [&](unsigned char *dst, const __nv_bfloat16 *src, int64_t ld, int rowsValid,
                        int64_t k0, int kValid) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      int chunk = threadIdx.x + i * kGroupedThreads;
      int r = chunk >> 3, c = chunk & 7; // row of 128 bytes, its 16-byte chunk
      bool ok = r < rowsValid && c * 8 < kValid;
      cpAsync16(dst + r * 128 + ((c ^ (r & 7)) << 4), ok ? src + r * ld + k0 + c * 8 : src, ok);
    }
  };
  // Copies k tile `kt` into stage `stage`: 1024 chunks of 16 bytes per operand.
  auto loadStage = [&](int stage, int kt) {
    unsigned char *sA = smem + stage * kStageBytes, *sB = sA + kTileBytes;
    bool second = kMode == SumOfTwo && kt >= tilesPerProduct;
    const __nv_bfloat16 *ta = second ? a2 : a, *tb = second ? b2 : b;
    int64_t k0 = static_cast<int64_t>(second ? kt - tilesPerProduct : kt) * kBK;
    int kValid = static_cast<int>(minI64(p.k - k0, kBK));
    loadKMajor(sA, ta, p.lda, mValid, k0, kValid);
    if (!kTransB) { // W_e [n][k]: row r is output column n0 + r
      loadKMajor(sB, tb + n0 * p.ldb, p.ldb, nValid, k0, kValid);
      if (kTwoB)
        loadKMajor(sB + kTileBytes, b2 + n0 * p.ldb, p.ldb, nValid, k0, kValid);
    } else { // W_e [k][n]: k row kr, 64-column block blk
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        int chunk = threadIdx.x + i * kGroupedThreads;
        int kr = chunk >> 4, blk = (chunk >> 3) & 1, c = chunk & 7;
        int col = blk * 64 + c * 8;
        bool ok = kr < kValid && col < nValid;
        cpAsync16(sB + blk * 8192 + kr * 128 + ((c ^ (kr & 7)) << 4),
                  ok ? tb + (k0 + kr) * p.ldb + n0 + col : tb, ok);
      }
    }
  };

  int warpGroup = threadIdx.x >> 7;
  float acc[64], acc2[64];
#pragma unroll
  for (int i = 0; i < 64; ++i)
    acc[i] = acc2[i] = 0.0f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < numK)
      loadStage(s, s);
    cpAsyncCommit();
  }
  for (int kt = 0; kt < numK; ++kt) {
    cpAsyncWait<kStages - 2>();
    // This thread's copies of stage kt are done; make them visible to the
    // tensor cores (the async proxy), then to every thread.
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads(); // also: every warpgroup finished tile kt - 1, so its stage is free
    if (kt + kStages - 1 < numK)
      loadStage((kt + kStages - 1) % kStages, kt + kStages - 1);
    cpAsyncCommit();
    uint32_t aBase = smemAddress + (kt % kStages) * kStageBytes + warpGroup * 64 * 128;
    uint32_t bBase = smemAddress + (kt % kStages) * kStageBytes + kTileBytes;
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
    wgmmaWaitAll();
  }
  cpAsyncWait<0>(); // no copy may outlive the CTA's shared memory

  // Accumulator d[4j + 2h + c]: row 16 (warp % 4) + lane / 4 + 8h, column 8j + 2 (lane % 4) + c.
  int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3;
  if constexpr (kTwoB) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int mLocal = warpGroup * 64 + warp * 16 + (lane >> 2) + h * 8;
      if (mLocal >= mValid)
        continue;
      int64_t row = rowBegin + mLocal;
      // GluGrad: the row's dh values all loaded before the first store (stores could alias
      // them, so loads issued between stores would each wait out the memory latency).
      float dh[32];
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        int nLocal = (i >> 1) * 8 + 2 * (lane & 3) + (i & 1);
        dh[i] = kMode == GluGrad && nLocal < nValid ? __ldg(x.dh + row * p.n + n0 + nLocal) : 0.0f;
      }
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        int nLocal = (i >> 1) * 8 + 2 * (lane & 3) + (i & 1);
        int r = 4 * (i >> 1) + 2 * h + (i & 1);
        if (nLocal < nValid)
          gatedElement<kMode, CT>(p, x, row, n0 + nLocal, acc[r], acc2[r], dh[i]);
      }
    }
    return;
  }
  CT *c = static_cast<CT *>(p.c);
  float alpha = p.alpha, beta = p.beta;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    int mLocal = warpGroup * 64 + warp * 16 + (lane >> 2) + h * 8;
    if (mLocal >= mValid)
      continue;
    int64_t row = rowBegin + mLocal;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      int nLocal = j * 8 + 2 * (lane & 3);
      if (nLocal >= nValid)
        continue;
      CT *out = c + row * p.ldc + n0 + nLocal;
      float v0 = alpha * acc[4 * j + 2 * h], v1 = alpha * acc[4 * j + 2 * h + 1];
      if (nLocal + 1 < nValid && reinterpret_cast<uintptr_t>(out) % (2 * sizeof(CT)) == 0) {
        if (beta != 0.0f) {
          v0 = fmaf(beta, loadC(out), v0);
          v1 = fmaf(beta, loadC(out + 1), v1);
        }
        storePair(out, v0, v1);
      } else {
        if (beta != 0.0f)
          v0 = fmaf(beta, loadC(out), v0);
        *out = fromFloat<CT>(v0);
        if (nLocal + 1 < nValid) {
          if (beta != 0.0f)
            v1 = fmaf(beta, loadC(out + 1), v1);
          out[1] = fromFloat<CT>(v1);
        }
      }
    }
  }
#else
  __trap(); // built without sm_90a: the launcher never picks this kernel there
#endif
}

template <bool kTransB, typename CT, int kMode>
void launch(const KernelContext &ctx, dim3 grid, const GroupedParams &p, const WgmmaExtra &x) {
  auto kernel = wgmmaGroupedKernel<kTransB, CT, kMode>;
  constexpr bool kTwoB = kMode == Glu || kMode == GluGrad;
  size_t bytes = size_t(kStages) * (kTwoB ? 3 : 2) * kTileBytes + 1024; // + alignment slack
  cudaError_t error = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(bytes));
  if (error != cudaSuccess)
    ctx.fail(std::string("grouped GEMM (wgmma): cannot raise the shared memory limit: ") +
             cudaGetErrorString(error));
  kernel<<<grid, kGroupedThreads, bytes, streamOf(ctx)>>>(p, x);
  checkLaunch(ctx, "grouped GEMM (wgmma)");
}

template <int kMode>
void launchMode(const KernelContext &ctx, dim3 grid, const GroupedParams &p, const WgmmaExtra &x,
                bool transW, plan::DType yType) {
  // transW: W_e [n, k], K-major like X; else W_e [k, n], MN-major.
  if (yType == plan::F32)
    transW ? launch<false, float, kMode>(ctx, grid, p, x) : launch<true, float, kMode>(ctx, grid, p, x);
  else
    transW ? launch<false, __nv_bfloat16, kMode>(ctx, grid, p, x)
           : launch<true, __nv_bfloat16, kMode>(ctx, grid, p, x);
}

} // namespace

int64_t wgmmaRowTile() { return kBM; }

void wgmmaGroupedGemm(const KernelContext &ctx, const GroupedParams &p, const WgmmaExtra &x,
                      WgmmaMode mode, bool transW, int64_t rowTiles, plan::DType yType) {
  int64_t nTiles = (p.n + kBN - 1) / kBN;
  if (nTiles > 0x7fffffff || rowTiles > 65535)
    ctx.fail("grouped GEMM: too large (" + std::to_string(nTiles) + " x " +
             std::to_string(rowTiles) + " tiles)");
  dim3 grid(static_cast<unsigned>(nTiles), static_cast<unsigned>(rowTiles));
  switch (mode) {
  case Plain:
    return launchMode<Plain>(ctx, grid, p, x, transW, yType);
  case SumOfTwo:
    return launchMode<SumOfTwo>(ctx, grid, p, x, transW, yType);
  case Glu: // the gate and up weights are [n, k]
    return launch<false, __nv_bfloat16, Glu>(ctx, grid, p, x);
  case GluGrad:
    return launch<false, __nv_bfloat16, GluGrad>(ctx, grid, p, x);
  }
}

} // namespace moec::runtime::cuda::routing
