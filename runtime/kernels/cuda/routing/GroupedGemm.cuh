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
// A and B share one storage type: bf16 runs on the tensor cores (the row
// forms on Hopper's wgmma with TMA copies where the operands allow 16-byte
// copies, GroupedGemmWgmma.cu; else mma.sync m16n8k16), f32 accumulators; f32
// on plain FMAs (no TF32). C is f32 or the operands' type.
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
  /// The rows of the row-indexed operands (X and Y of the row forms, A and B of the
  /// reduction), at least offsets[experts]: sizes the grid, and bounds what the tensor
  /// memory accelerator may read.
  int64_t rows = 0;
};

/// LoRA's low-rank products in the last k tile of a wgmma grouped GEMM (GroupedGemmWgmma.cuh,
/// WgmmaExtra::loraZ): z [rows, 64] (row stride 64) holds each row's scale x Aᵀ (the gate's in
/// columns [0, 32), the up's in [32, 64) for the gated SiLU; zeros past a rank), b / b2 the
/// experts' B factors [n, rank] (the gate's or the only one, and the up's), expert stride n rank.
struct LoraTile {
  const void *z = nullptr, *b = nullptr, *b2 = nullptr;
  int64_t rank = 0, rank2 = 0;
};

/// Whether a LoRA factor of this rank fits the tile: at most 32, a multiple of 8 (16-byte rows).
inline bool loraTileRank(int64_t rank) { return rank > 0 && rank <= 32 && rank % 8 == 0; }

/// For every expert e: Y[rows_e, :n] = alpha * X[rows_e, :k] · op(W_e) + beta * Y[rows_e, :n].
/// W_e starts wStride elements after W_{e-1}; with transW it is [n, k] (a
/// weight [out, in]) and op(W_e) = W_eᵀ, else it is [k, n]. ldx / ldw / ldy are
/// the row strides in elements. x, w: abType (F32 or BF16); y: F32 or abType. With `lora`
/// (transW, bf16 operands that groupedLoraFits takes): + z Bᵀ (alpha applies to both).
void groupedGemm(const KernelContext &ctx, const ExpertRows &g, int64_t n, int64_t k, float alpha,
                 const void *x, int64_t ldx, const void *w, int64_t ldw, int64_t wStride,
                 bool transW, plan::DType abType, float beta, void *y, int64_t ldy,
                 plan::DType yType, const LoraTile *lora = nullptr);

/// Whether groupedGemm (transW) and groupedGluGemm can add `lora`'s tile to these operands.
bool groupedLoraFits(int64_t k, const void *x, int64_t ldx, const void *w, int64_t ldw, int64_t wStride,
                     plan::DType abType, const LoraTile &lora);

/// For every expert e: Y[rows_e, :n] = X1[rows_e, :k] · op(W1_e) + X2[rows_e, :k] · op(W2_e), both
/// products in one f32 accumulator (X1, X2 share ldx; W1, W2 share ldw, wStride; op as in
/// groupedGemm). Returns false without launching anything unless the operands are bf16 and
/// 16-byte copyable (the wgmma kernel's conditions); the caller then runs two groupedGemm. With
/// `lora` (W [k, n], both factors [r, n] of tile ranks, z the rows' dz): + z [A1; A2] as well.
bool groupedGemmSum(const KernelContext &ctx, const ExpertRows &g, int64_t n, int64_t k,
                    const void *x1, const void *x2, int64_t ldx, const void *w1, const void *w2,
                    int64_t ldw, int64_t wStride, bool transW, plan::DType abType, void *y,
                    int64_t ldy, plan::DType yType, const LoraTile *lora = nullptr);

/// Whether groupedGluGemm can take these operands: bf16, 16-byte copyable.
bool groupedGluFits(int64_t k, const void *x, int64_t ldx, const void *wGate, const void *wUp,
                    int64_t ldw, int64_t wStride, plan::DType abType);

/// The gated SiLU of two projections of X [rows_e, :k] in one pass: H[rows_e, :n] =
/// silu(X Wg_eᵀ) ⊙ (X Wu_eᵀ) (Wg_e, Wu_e [n, k], wStride apart, row stride ldw; H row stride
/// ldh), the products and the activation in f32, H in the operands' type. With dH (f32,
/// [rows, n]): instead the gradients of the gate and up pre-activations, dG = dH ⊙ U ⊙
/// silu'(G) into `out`, dU = dH ⊙ silu(G) into `out2` (both row stride ldh); with rowScale
/// ([rows] f32) the row's dH scaled by it, and with rowDots ([ceil(n / kRowDotColumns)][rows]
/// f32) each row's Σ dH ⊙ H over each kRowDotColumns columns (dH unscaled). Only rows that
/// experts own are written. The operands must fit (groupedGluFits). kRowDotColumns:
/// GroupedGemmWgmma.cuh. With `lora` (both ranks fitting): the gate's and up's LoRA products in
/// the pre-activations (G += z_g B_gᵀ, U += z_u B_uᵀ). With dH and `h`: H itself into `h` too
/// (row stride ldh), for the gradients that need it (the down projection's). Without dH and
/// with `pre`: G and U themselves into pre [rows, 2n] f32 too (G in columns [0, n), U in [n, 2n)).
void groupedGluGemm(const KernelContext &ctx, const ExpertRows &g, int64_t n, int64_t k,
                    const void *x, int64_t ldx, const void *wGate, const void *wUp, int64_t ldw,
                    int64_t wStride, plan::DType abType, const float *dh, void *out, void *out2,
                    int64_t ldh, const float *rowScale = nullptr, float *rowDots = nullptr,
                    const LoraTile *lora = nullptr, void *h = nullptr, void *pre = nullptr);

/// groupedGluGemm's gradient from saved pre-activations, with dH the product itself: for every
/// expert e, dH[rows_e, :n] = X[rows_e, :k] · op(W_e) (op as in groupedGemm: the down
/// projection's input gradient dy W_down), and in the epilogue, from pre [rows, 2n] f32 (G in
/// columns [0, n), U in [n, 2n)), dG = dH ⊙ U ⊙ silu'(G) into `out` and dU = dH ⊙ silu(G) into
/// `out2` (bf16, row stride ldo), rowScale and rowDots as groupedGluGemm's; dH itself never
/// goes through memory. Returns false without launching unless the operands are bf16 and
/// 16-byte copyable (the wgmma kernel's conditions).
bool groupedSavedGluGradGemm(const KernelContext &ctx, const ExpertRows &g, int64_t n, int64_t k, const void *x,
                             int64_t ldx, const void *w, int64_t ldw, int64_t wStride, bool transW,
                             plan::DType abType, const float *pre, void *out, void *out2, int64_t ldo,
                             const float *rowScale, float *rowDots);

/// For every expert e: C_e[:m, :n] = alpha * A[rows_e, :m]ᵀ · B[rows_e, :n] + beta * C_e, the
/// sum over the expert's rows; C_e starts cStride elements after C_{e-1}
/// (row stride ldc). An expert without rows gets beta * C_e.
void groupedGemmReduce(const KernelContext &ctx, const ExpertRows &g, int64_t m, int64_t n,
                       float alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                       plan::DType abType, float beta, void *c, int64_t ldc, int64_t cStride,
                       plan::DType cType);

} // namespace moec::runtime::cuda::routing

#endif // RUNTIME_KERNELS_CUDA_ROUTING_GROUPEDGEMM_CUH_
