//===- Hopper.cuh - wgmma, mbarrier and TMA wrappers (sm_90a) ----*- CUDA -*-===//
//
// The Hopper instructions the warp-specialised kernels share (the grouped
// expert GEMM, the attention forward): shared-memory matrix descriptors with
// the 128-byte swizzle, wgmma.mma_async m64n128k16 (bf16 in, f32 accumulators)
// with both operands in shared memory or A in registers, mbarrier phases, and
// bulk tensor copies (TMA) with the host side that describes a tensor to them.
// Only sm_90a code may issue the device instructions: include from a
// cuda_library built with `gencode = SM90A`.
//
// Shared tiles use the 128-byte swizzle that both TMA and the descriptors
// name: a row of 64 bf16 is 128 bytes, its 16-byte chunk c stored at chunk
// c ^ (row % 8), every tile 1024-byte aligned. A K-major operand ([rows][k])
// has 8-row groups 1024 bytes apart (stride offset) and a k16 step 32 bytes
// further; an MN-major one ([k][n], transposed by wgmma) comes as boxes of 64
// n columns (leading offset: the distance between boxes), 8-k groups 1024
// bytes apart, a k16 step 2048 bytes further.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CUDA_HOPPER_CUH_
#define RUNTIME_KERNELS_CUDA_HOPPER_CUH_

#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <string>

#include "runtime/kernels/cuda/CudaCommon.cuh"

namespace moec::runtime::cuda::hopper {

/// The shared-memory address of a generic pointer into shared memory.
__device__ __forceinline__ uint32_t sharedAddress(const void *p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

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
/// Waits until at most N committed groups of this warpgroup's products are pending.
template <int N> __device__ __forceinline__ void wgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
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

/// d[64 x 64] = A[64 x 16] B[16 x 64] (+ d when accumulate), both from shared memory; kTransB /
/// kTransA: B / A stored MN-major. With accumulate false, d's old values are ignored but still
/// tied to the result: a caller may reuse a dead accumulator's registers that way.
template <bool kTransB, bool kTransA = false>
__device__ __forceinline__ void wgmma64(float (&d)[32], uint64_t descA, uint64_t descB, bool accumulate = true) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %36, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, %35, %34;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(descA), "l"(descB), "n"(kTransB ? 1 : 0), "n"(kTransA ? 1 : 0), "r"(accumulate ? 1 : 0));
}

/// d[64 x 128] += A[64 x 16] B[16 x 128] with A in registers (each warp's 16 rows as
/// mma.m16n8k16's A fragment: the accumulator layout of two n8 blocks, packed to bf16 pairs) and
/// B MN-major in shared memory.
__device__ __forceinline__ void wgmma128Registers(float (&d)[64], const uint32_t (&a)[4], uint64_t descB) {
  asm volatile(
      "{\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
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
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(descB));
}

__device__ __forceinline__ void mbarrierInit(uint64_t *bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(sharedAddress(bar)), "r"(count)
               : "memory");
}
/// Arrives on `bar` and raises the bytes its phase waits for by `bytes`.
__device__ __forceinline__ void mbarrierExpectBytes(uint64_t *bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(sharedAddress(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbarrierArrive(uint64_t *bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(sharedAddress(bar)) : "memory");
}
/// Waits for the completion of the phase of `bar` with this parity.
__device__ __forceinline__ void mbarrierWait(uint64_t *bar, int parity) {
  uint32_t done = 0;
  while (!done)
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(sharedAddress(bar)), "r"(parity)
                 : "memory");
}
/// A box of `map` at coordinates (c0 innermost, c1[, c2]) into shared `dst`; completes on `bar`.
__device__ __forceinline__ void tmaLoad(void *dst, const CUtensorMap &map, int c0, int c1, uint64_t *bar) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
               "{%2, %3}], [%4];\n" ::"r"(sharedAddress(dst)),
               "l"(reinterpret_cast<uint64_t>(&map)), "r"(c0), "r"(c1), "r"(sharedAddress(bar))
               : "memory");
}
__device__ __forceinline__ void tmaLoad(void *dst, const CUtensorMap &map, int c0, int c1, int c2,
                                        uint64_t *bar) {
  asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
               "{%2, %3, %4}], [%5];\n" ::"r"(sharedAddress(dst)),
               "l"(reinterpret_cast<uint64_t>(&map)), "r"(c0), "r"(c1), "r"(c2), "r"(sharedAddress(bar))
               : "memory");
}

/// cuTensorMapEncodeTiled from the driver (through the runtime: no libcuda link), or null.
inline PFN_cuTensorMapEncodeTiled_v12000 encodeTiled() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void *f = nullptr;
    cudaDriverEntryPointQueryResult status;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &status) != cudaSuccess ||
        status != cudaDriverEntryPointSuccess)
      f = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

/// A tensor map (bf16 unless `type` says otherwise) with the 128-byte swizzle: dims / strides
/// (bytes, from the second dimension on) / box, innermost first; `what` names the kernel in the
/// error.
inline CUtensorMap tensorMap(const KernelContext &ctx, const char *what, const void *base, int rank,
                             const uint64_t *dims, const uint64_t *strides, const uint32_t *box,
                             CUtensorMapDataType type = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16) {
  CUtensorMap map;
  uint32_t elementStrides[3] = {1, 1, 1};
  CUresult r = encodeTiled()(&map, type, rank, const_cast<void *>(base), dims,
                             strides, box, elementStrides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    ctx.fail(std::string(what) + ": cannot describe an operand to the tensor memory accelerator "
             "(cuTensorMapEncodeTiled error " + std::to_string(static_cast<int>(r)) + ")");
  return map;
}

} // namespace moec::runtime::cuda::hopper

#endif // RUNTIME_KERNELS_CUDA_HOPPER_CUH_
