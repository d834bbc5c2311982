//===- GroupedGemm.cuh - per-expert GEMMs over device row offsets -*- CUDA -*-===//
//
// The products of expert_mlp and its backward, one launch for every expert:
// expert e owns rows [offsets[e], offsets[e + 1]) of each row-indexed operand,
// and the offsets live on the DEVICE (computed there from the routing's
// counts), so nothing here synchronises with the host. The grid is sized from
// what the host knows (the total rows and the number of experts); each CTA
// finds its expert and tile from the offsets and exits when it has none.
//
// Two forms, row-major, f32 accumulation (like the cuBLAS calls they replace):
//  - groupedGemm:        Y[rows_e, n] = alpha X[rows_e, k] op(W_e) + beta Y[rows_e, n]
//                        (op(W_e) = W_eᵀ for W_e [n, k], W_e for W_e [k, n]);
//                        the projections (x W_eᵀ, in_out_layout's x W_e) and the
//                        input gradients (dy W_e, in_out_layout's dy W_eᵀ).
//  - groupedGemmReduce:  C_e[m, n] = alpha A[rows_e, m]ᵀ B[rows_e, n] + beta C_e
//                        (a sum over the expert's rows); the weight gradients.
//                        An expert without rows gets beta C_e.
// beta == 0 never reads the output (it may hold garbage).
//
// A and B share one storage type: bf16 runs on the tensor cores (mma.sync
// m16n8k16, f32 accumulators), f32 on plain FMAs (no TF32). C is f32 or the
// operands' type.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CUDA_ROUTING_GROUPEDGEMM_CUH_
#define RUNTIME_KERNELS_CUDA_ROUTING_GROUPEDGEMM_CUH_

#include <cstdint>

#include "runtime/kernels/Kernel.h"

namespace moec::runtime::cuda::routing {

/// Rows grouped by expert.
struct ExpertRows {
  /// Device, experts + 1 nondecreasing row indices: expert e owns rows
  /// [offsets[e], offsets[e + 1]).
  const int64_t *offsets = nullptr;
  int64_t experts = 0;
  /// Host-known bound on the rows all experts own together
  /// (offsets[experts] - offsets[0] <= rows): sizes the grid.
  int64_t rows = 0;
};

/// For every expert e: Y[rows_e, :n] = alpha * X[rows_e, :k] · op(W_e) + beta * Y[rows_e, :n].
/// W_e starts wStride elements after W_{e-1}; with transW it is [n, k] (a
/// weight [out, in]) and op(W_e) = W_eᵀ, else it is [k, n]. ldx / ldw / ldy are
/// the row strides in elements. x, w: abType (F32 or BF16); y: F32 or abType.
void groupedGemm(const KernelContext &ctx, const ExpertRows &g, int64_t n, int64_t k, float alpha,
                 const void *x, int64_t ldx, const void *w, int64_t ldw, int64_t wStride,
                 bool transW, plan::DType abType, float beta, void *y, int64_t ldy,
                 plan::DType yType);

/// For every expert e: C_e[:m, :n] = alpha * A[rows_e, :m]ᵀ · B[rows_e, :n] + beta * C_e, the
/// sum over the expert's rows; C_e starts cStride elements after C_{e-1}
/// (row stride ldc). An expert without rows gets beta * C_e.
void groupedGemmReduce(const KernelContext &ctx, const ExpertRows &g, int64_t m, int64_t n,
                       float alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                       plan::DType abType, float beta, void *c, int64_t ldc, int64_t cStride,
                       plan::DType cType);

} // namespace moec::runtime::cuda::routing

#endif // RUNTIME_KERNELS_CUDA_ROUTING_GROUPEDGEMM_CUH_
