//===- GroupedGemmWgmma.cuh - the wgmma path of the grouped GEMM row forms -*- CUDA -*-===//
//
// Internal to the grouped GEMM (GroupedGemm.cu decides when it applies: bf16
// operands that allow 16-byte copies). A separate file because it needs the
// sm_90a target.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CUDA_ROUTING_GROUPEDGEMMWGMMA_CUH_
#define RUNTIME_KERNELS_CUDA_ROUTING_GROUPEDGEMMWGMMA_CUH_

#include <cstdint>

#include "runtime/kernels/Kernel.h"
#include "runtime/kernels/cuda/routing/GroupedGemmTiles.cuh"

namespace moec::runtime::cuda::routing {

/// Rows per CTA tile of the wgmma kernel (sizes the grid's row tiles).
int64_t wgmmaRowTile();

/// Y[rows_e] = alpha X[rows_e] op(W_e) + beta Y[rows_e] for every expert
/// (p as groupedGemm fills it; transW: W_e [n, k]); rowTiles bounds the row
/// tiles of all experts at wgmmaRowTile() rows each. yType: F32 or BF16.
void wgmmaGroupedGemm(const KernelContext &ctx, const GroupedParams &p, bool transW,
                      int64_t rowTiles, plan::DType yType);

} // namespace moec::runtime::cuda::routing

#endif // RUNTIME_KERNELS_CUDA_ROUTING_GROUPEDGEMMWGMMA_CUH_
