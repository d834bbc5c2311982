//===- GroupedGemmWgmma.cuh - the wgmma path of the grouped GEMM row forms -*- CUDA -*-===//
//
// Internal to the grouped GEMM (GroupedGemm.cu decides when it applies: bf16
// operands that allow 16-byte copies, wgmmaAvailable()). A separate file
// because it needs the sm_90a target.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CUDA_ROUTING_GROUPEDGEMMWGMMA_CUH_
#define RUNTIME_KERNELS_CUDA_ROUTING_GROUPEDGEMMWGMMA_CUH_

#include <cstdint>

#include "runtime/kernels/Kernel.h"
#include "runtime/kernels/cuda/routing/GroupedGemmTiles.cuh"

namespace moec::runtime::cuda::routing {

/// Whether the wgmma kernels can run: the driver gives cuTensorMapEncodeTiled (CUDA 12 and
/// later drivers do). Else the callers keep to GroupedGemm.cu's mma.sync kernels.
bool wgmmaAvailable();

/// What a launch computes, per expert e (X = p.a, W = p.b, Y = p.c):
enum WgmmaMode : int {
  Plain = 0,    // Y = alpha X op(W_e) + beta Y
  SumOfTwo = 1, // Y = alpha (X op(W_e) + X2 op(W2_e)) + beta Y; X2, W2 with X's, W's strides
  Glu = 2,      // Y = silu(X W_eᵀ) ⊙ (X W2_eᵀ): W the gate's weights, W2 the up's, [n, k]
  GluGrad = 3,  // with G = X W_eᵀ, U = X W2_eᵀ recomputed and dH [rows, n] f32:
                // Y = dH ⊙ U ⊙ silu'(G) (the gate's gradient), C2 = dH ⊙ silu(G) (the up's)
  SavedGluGrad = 4, // GluGrad's outputs with dH = X op(W_e) the product (the down projection's
                    // input gradient) and G, U read from the saved pre-activations (`savedPre`)
};

/// The operands of the modes beyond Plain.
/// Columns of one n tile of the wgmma kernel: GluGrad's row dots hold a partial sum per n tile.
constexpr int64_t kRowDotColumns = 128;

struct WgmmaExtra {
  const void *a2 = nullptr; // SumOfTwo: X2
  const void *b2 = nullptr; // SumOfTwo: W2; Glu, GluGrad: the up weights
  const float *dh = nullptr; // GluGrad: dH, row stride n
  void *c2 = nullptr;        // GluGrad: the up projection's gradient, Y's row stride
  // GluGrad, optional: the gradients use rowScale[row] dH (dH a row's unweighted gradient, the
  // scale its router weight), and rowDots[n tile * rows + row] gets Σ dH H over the tile's
  // columns (H = silu(G) U): an expert row's output . its unweighted gradient, by n tile.
  const float *rowScale = nullptr;
  float *rowDots = nullptr;
  int64_t rows = 0;
  void *h = nullptr; // GluGrad, optional: H = silu(G) U itself too (Y's row stride)
  // Glu, optional: the pre-activations too, [rows, 2n] f32 (G in columns [0, n), U in [n, 2n)), for a
  // backward that reads them instead of running the products again.
  void *pre = nullptr;
  const float *savedPre = nullptr; // SavedGluGrad: those pre-activations, read
  // Optional (Plain with W_e [n, k], Glu, GluGrad): LoRA's products as one more k tile of 64
  // into the same accumulators. A: loraZ [rows, 64] (row stride 64), the rows' scale x Aᵀ: the
  // gate's in columns [0, 32), the up's in [32, 64) (Plain: [0, 32)); columns past a rank hold
  // zeros. B: the experts' factors [n, r] (r <= 32, r % 8 == 0, expert stride n r): loraB
  // (Plain's, or the gate's) as the tile's columns [0, r), loraB2 (the up's) as [32, 32 + r2);
  // the tensor memory accelerator fills the rest of each tile with zeros. SumOfTwo with W_e
  // [k, n] (an input gradient dy W_e): the factors are [r, n] (A_e), loraB's as the tile's k
  // rows [0, r), loraB2's as [32, 32 + r2), against loraZ's columns (the rows' dz).
  const void *loraZ = nullptr, *loraB = nullptr, *loraB2 = nullptr;
  int64_t loraRank = 0, loraRank2 = 0;
};

/// Runs `mode` for every expert (p as groupedGemm fills it; transW: W_e [n, k]);
/// rows: the rows of the row-indexed buffers (X, X2, Y), offsets[experts] <= rows.
/// yType: F32 or BF16 (Glu, GluGrad: BF16 outputs).
void wgmmaGroupedGemm(const KernelContext &ctx, const GroupedParams &p, const WgmmaExtra &x,
                      WgmmaMode mode, bool transW, int64_t rows, plan::DType yType);

} // namespace moec::runtime::cuda::routing

#endif // RUNTIME_KERNELS_CUDA_ROUTING_GROUPEDGEMMWGMMA_CUH_
