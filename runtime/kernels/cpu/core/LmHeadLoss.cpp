//===- LmHeadLoss.cpp - the LM head fused with the loss, chunked ----------===//
//
// lm_head_cross_entropy computes cross_entropy(linear(input, weight), labels)
// `chunk_tokens` rows at a time: one chunk of logits [chunk, V] lives in
// scratch, never the [T, V] logits or their gradient. The arithmetic is the
// unfused kernels' (Dense.cpp's product, Tokens.cpp's loss in double), so
// both paths give the same loss and gradients up to the order of sums.
//
// With logits_type bf16 (a bf16 model, whose storage the CPU emulates in f32
// buffers) the chunk's logits and their gradient are rounded to bf16 where
// the unfused kernels' output buffers would be: the same function as the
// CUDA kernel's bf16 scratch and as Hugging Face's bf16 logits.
//
// The forward writes the loss and each counted row's logsumexp (0 elsewhere);
// the backward recomputes each chunk's logits, turns them in place into
// d logits = dloss / counted * (softmax - onehot) with the saved logsumexp,
// then d input = d logits W per chunk and d weight += d logitsᵀ input. With
// the input_grad result (a frozen head) the forward forms d input for
// dloss = 1 from the logits it has, and the backward scales it by dloss.
//
//===----------------------------------------------------------------------===//

#include <algorithm>
#include <cmath>
#include <cstring>

#include "runtime/kernels/cpu/Gemm.h"
#include "runtime/kernels/cpu/core/CoreCommon.h"

namespace moec::runtime::cpu::core {

namespace {

/// input [T, H], weight [V, H], labels [T]; the chunked rows of logits.
struct LmHeadLossArgs {
  checks::core::LmHeadLossShape s;
  const float *x, *w;
  LossTargets targets;

  explicit LmHeadLossArgs(const KernelContext &ctx) : s(checks::core::checkLmHeadLoss(ctx)) {
    x = floats(ctx, ctx.in(0), "input");
    w = floats(ctx, ctx.in(1), "weight");
    targets = lossTargets(ctx, ctx.in(2), s.rows, s.vocab);
  }

  bool bf16() const { return s.logitsType == plan::BF16; }

  /// logits[r - begin] = x[r] Wᵀ for rows [begin, begin + n), into `out` [n, V] (not yet
  /// rounded: see round()).
  void logits(int64_t begin, int64_t n, float *out) const {
    gemm(false, true, n, s.vocab, s.hidden, 1.0f, x + begin * s.hidden, s.hidden, w, s.hidden, 0.0f,
         out, s.vocab);
  }

  /// One row of logits or of their gradient rounded as logits_type stores it.
  void round(float *row) const {
    if (bf16())
      for (int64_t v = 0; v < s.vocab; ++v)
        row[v] = roundToBf16(row[v]);
  }
};

/// A row of logits (as logits_type holds them) turned in place into d logits =
/// scale (softmax - onehot(target)), rounded as the unfused loss backward's output holds them.
void toLogitGrads(const LmHeadLossArgs &a, float *row, int64_t target, double lse, double scale) {
  for (int64_t v = 0; v < a.s.vocab; ++v)
    row[v] = static_cast<float>(scale * (std::exp(row[v] - lse) - (v == target ? 1.0 : 0.0)));
  a.round(row);
}

/// log Σ_v exp(row[v]), in double as cross_entropy computes it.
double logSumExp(const float *row, int64_t vocab) {
  double top = *std::max_element(row, row + vocab), sum = 0;
  for (int64_t v = 0; v < vocab; ++v)
    sum += std::exp(row[v] - top);
  return top + std::log(sum);
}

// With no counted position the loss and its gradient are 0, as cross_entropy's. With a third
// output (input_grad) each chunk's logits also become d logits for a loss gradient of 1, and
// then that chunk's rows of the input gradient.
void lmHeadCrossEntropy(KernelContext &ctx) {
  LmHeadLossArgs a(ctx);
  const int64_t rows = a.s.rows, vocab = a.s.vocab;
  if (ctx.outputs.size() != 2 && ctx.outputs.size() != 3)
    ctx.fail("expected 2 or 3 outputs (loss, logsumexp[, input_grad]), got " + std::to_string(ctx.outputs.size()));
  ctx.expectShape(ctx.out(0), "loss", {});
  ctx.expectShape(ctx.out(1), "logsumexp", {rows});
  float *loss = floats(ctx, ctx.out(0), "loss");
  float *lse = floats(ctx, ctx.out(1), "logsumexp");
  float *dx = nullptr;
  if (ctx.outputs.size() == 3) {
    ctx.expectShape(ctx.out(2), "input_grad", {rows, a.s.hidden});
    dx = floats(ctx, ctx.out(2), "input_grad");
  }
  const double scale = a.targets.counted ? 1.0 / static_cast<double>(a.targets.counted) : 0.0;
  std::vector<double> rowLoss(static_cast<size_t>(rows), 0.0);
  std::vector<float> chunk(static_cast<size_t>(a.s.chunk * vocab));
  for (int64_t begin = 0; begin < rows; begin += a.s.chunk) {
    int64_t n = std::min(a.s.chunk, rows - begin);
    a.logits(begin, n, chunk.data());
    ctx.parallelFor(n, [&](int64_t first, int64_t end) {
      for (int64_t r = first; r < end; ++r) {
        int64_t t = begin + r, target = a.targets.targets[t];
        float *row = chunk.data() + r * vocab;
        lse[t] = 0.0f;
        if (target < 0 || vocab == 0) {
          std::fill(row, row + vocab, 0.0f);
          continue;
        }
        a.round(row);
        double l = logSumExp(row, vocab);
        lse[t] = static_cast<float>(l);
        rowLoss[t] = l - row[target];
        if (dx)
          toLogitGrads(a, row, target, lse[t], scale);
      }
    });
    if (dx) // d input = d logits W
      gemm(false, false, n, a.s.hidden, vocab, 1.0f, chunk.data(), vocab, a.w, a.s.hidden, 0.0f,
           dx + begin * a.s.hidden, a.s.hidden);
  }
  double sum = 0;
  for (double l : rowLoss)
    sum += l;
  *loss = a.targets.counted ? static_cast<float>(sum / a.targets.counted) : 0.0f;
}

void lmHeadCrossEntropyBackward(KernelContext &ctx) {
  BackwardLaunch launch(ctx, 2, {0, 1});
  LmHeadLossArgs a(ctx);
  const int64_t rows = a.s.rows, vocab = a.s.vocab, hidden = a.s.hidden;
  const float *lse = checks::core::lmHeadLossLogsumexp(ctx, launch, rows).f32();
  const float dloss = *floats(ctx, launch.resultGrad0({}), "the result gradient");
  const TensorRef *dxRef = launch.operandGrad(0), *dwRef = launch.operandGrad(1);
  float *dx = dxRef ? floats(ctx, *dxRef, "the input gradient") : nullptr;
  float *dw = dwRef ? floats(ctx, *dwRef, "the weight gradient") : nullptr;
  if (dw && rows == 0)
    std::fill(dw, dw + vocab * hidden, 0.0f);
  if (!dx && !dw)
    return;
  if (const TensorRef *saved = checks::core::lmHeadLossInputGrad(ctx, launch); saved && dx) {
    // The forward formed d input for a loss gradient of 1: scale it; only d weight needs logits.
    const float *g = saved->f32();
    for (int64_t i = 0; i < rows * hidden; ++i)
      dx[i] = dloss * g[i];
    dx = nullptr;
    if (!dw)
      return;
  }
  double scale = a.targets.counted ? dloss / static_cast<double>(a.targets.counted) : 0.0;
  std::vector<float> chunk(static_cast<size_t>(a.s.chunk * vocab));
  for (int64_t begin = 0; begin < rows; begin += a.s.chunk) {
    int64_t n = std::min(a.s.chunk, rows - begin);
    float *d = chunk.data();
    a.logits(begin, n, d);
    ctx.parallelFor(n, [&](int64_t first, int64_t end) {
      for (int64_t r = first; r < end; ++r) {
        int64_t t = begin + r, target = a.targets.targets[t];
        float *row = d + r * vocab;
        if (target < 0) {
          std::fill(row, row + vocab, 0.0f);
          continue;
        }
        a.round(row); // the logits the forward saw
        toLogitGrads(a, row, target, lse[t], scale);
      }
    });
    if (dx) // d input = d logits W
      gemm(false, false, n, hidden, vocab, 1.0f, d, vocab, a.w, hidden, 0.0f, dx + begin * hidden,
           hidden);
    if (dw) // d weight += d logitsᵀ input
      gemm(true, false, vocab, hidden, n, 1.0f, d, vocab, a.x + begin * hidden, hidden,
           begin == 0 ? 0.0f : 1.0f, dw, hidden);
  }
}

} // namespace

void registerLmHeadLossKernels(KernelRegistry &registry) {
  registry.add("lm_head_cross_entropy", lmHeadCrossEntropy);
  registry.add("lm_head_cross_entropy.backward", lmHeadCrossEntropyBackward);
}

} // namespace moec::runtime::cpu::core
