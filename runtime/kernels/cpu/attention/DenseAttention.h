//===- DenseAttention.h - softmax attention of one head over one sequence -*- C++ -*-===//
//
// The shared core of attention, mla and sparse_attention. For one query head
// and one sequence of L rows:
//
//   S = Σ_parts Q_p K_pᵀ  (GEMM),  z = scale · S  on the allowed keys
//   P = softmax(z) per row, an optional sink logit joining the denominator
//   O = P V               (GEMM)
//
// with allowed(t, s) = s <= t, within the sliding window (t - s < window,
// transformers' sliding_window_overlay: the last `window` keys including the
// token itself) and, for sparse attention, selected by the row's indices.
// Scores split into parts because MLA's key is [k_nope (per head) | k_pe
// (shared)], stored apart. The backward recomputes P and forms
//   dP = dO Vᵀ,  dS = scale · P ∘ (dP - rowsum(P ∘ dP)),
//   dQ_p = dS K_p,  dK_p += dSᵀ Q_p,  dV += Pᵀ dO,  dsink = -Σ_t p_sink,t rowsum_t.
// Heads run one after another (GEMMs on OpenBLAS's threads, the row softmax
// on the pool), so accumulation into shared key/value gradients has a fixed
// order. A row with no allowed key and no sink outputs zero.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CPU_ATTENTION_DENSEATTENTION_H_
#define RUNTIME_KERNELS_CPU_ATTENTION_DENSEATTENTION_H_

#include <cstdint>
#include <vector>

#include "runtime/kernels/Kernel.h"

namespace moec::runtime::cpu::attention {

/// Row-major strided views; pointers are at the sequence's first row.
struct QkPart {
  const float *q = nullptr, *k = nullptr;
  int64_t ldq = 0, ldk = 0, dim = 0;
  float *dq = nullptr, *dk = nullptr; // gradients, written / accumulated; null = not wanted
  int64_t lddq = 0, lddk = 0;
};

struct HeadView {
  QkPart parts[2];
  int numParts = 1;
  const float *v = nullptr;
  int64_t ldv = 0, dv = 0;
  float *dV = nullptr; // accumulated; null = not wanted
  int64_t lddV = 0;
  const float *sink = nullptr; // this head's sink logit, or null
};

struct Mask {
  int64_t window = 0;                // 0 = no sliding window
  const uint8_t *selected = nullptr; // [L, L] allowed keys (sparse attention), or null
};

class DenseAttention {
public:
  DenseAttention(const KernelContext &ctx, int64_t length, double scale, Mask mask);

  /// out[t, 0:dv] (stride ldo) = attention of this head; with `lse`, lse[t * ldLse] = the log
  /// of row t's softmax denominator (+inf on a row with nothing to attend to).
  void forward(const HeadView &head, float *out, int64_t ldo, float *lse = nullptr, int64_t ldLse = 0);
  /// Writes dq, accumulates dk and dV for this head given dO; returns the
  /// sink logit's gradient (0 without a sink).
  double backward(const HeadView &head, const float *dOut, int64_t lddo);

private:
  /// S then P (in `probs`) for this head; pSink[t] = the sink's probability.
  void probabilities(const HeadView &head);
  bool allowed(int64_t t, int64_t s) const {
    return s <= t && (mask.window <= 0 || t - s < mask.window) &&
           (!mask.selected || mask.selected[t * length + s]);
  }

  const KernelContext &ctx;
  int64_t length;
  float scale;
  Mask mask;
  std::vector<float> probs, grads;    // [L, L]
  std::vector<double> pSink, rowDots, rowLse; // [L]
};

} // namespace moec::runtime::cpu::attention

#endif // RUNTIME_KERNELS_CPU_ATTENTION_DENSEATTENTION_H_
