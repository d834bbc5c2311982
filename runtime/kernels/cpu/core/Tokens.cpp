//===- Tokens.cpp - embedding, cross_entropy, shift_labels -----------===//
//
// The kernels that read token ids and labels. Ids are validated before any parallel
// section; both reductions (the table gradient, the mean loss) add in a
// fixed order, so results do not depend on the thread count.
//
//===----------------------------------------------------------------------===//

#include <algorithm>
#include <cmath>

#include "runtime/kernels/cpu/core/CoreCommon.h"

namespace moec::runtime::cpu::core {

namespace {

/// embedding: ids [T] (i32 or i64), table [V, D].
struct EmbeddingArgs {
  const TensorRef &ids;
  const float *table;
  int64_t tokens, vocab, dim;

  EmbeddingArgs(const KernelContext &ctx) : ids(ctx.in(0)) {
    expectIndices(ctx, ids, "ids");
    ctx.expectShape(ids, "ids", {-1});
    ctx.expectShape(ctx.in(1), "table", {-1, -1});
    table = floats(ctx, ctx.in(1), "table");
    tokens = ids.dim(0);
    vocab = ctx.in(1).dim(0);
    dim = ctx.in(1).dim(1);
    for (int64_t t = 0; t < tokens; ++t)
      if (ids.index(t) < 0 || ids.index(t) >= vocab)
        ctx.fail("id " + std::to_string(ids.index(t)) + " of token " + std::to_string(t) +
                 " is outside the table's " + std::to_string(vocab) + " rows");
  }
};

void embedding(KernelContext &ctx) {
  EmbeddingArgs a(ctx);
  const TensorRef &result = ctx.out(0);
  ctx.expectShape(result, "result", {a.tokens, a.dim});
  float *y = floats(ctx, result, "result");
  ctx.parallelFor(a.tokens, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float *row = a.table + a.ids.index(t) * a.dim;
      std::copy(row, row + a.dim, y + t * a.dim);
    }
  });
}

/// d table[v] = Σ dy[t] over the tokens t with id v, in token order: the
/// tokens are bucketed by id first, so each table row has one writer.
void embeddingBackward(KernelContext &ctx) {
  BackwardLaunch launch(ctx, 1, {1});
  EmbeddingArgs a(ctx);
  const float *dy = floats(ctx, launch.resultGrad0({a.tokens, a.dim}), "the result gradient");
  const TensorRef *dtRef = launch.operandGrad(1);
  if (!dtRef)
    return;
  float *dtable = floats(ctx, *dtRef, "the table gradient");
  std::vector<int64_t> start(static_cast<size_t>(a.vocab + 1), 0), order(a.tokens);
  for (int64_t t = 0; t < a.tokens; ++t)
    ++start[a.ids.index(t) + 1];
  for (int64_t v = 0; v < a.vocab; ++v)
    start[v + 1] += start[v];
  std::vector<int64_t> next(start.begin(), start.end() - 1);
  for (int64_t t = 0; t < a.tokens; ++t)
    order[next[a.ids.index(t)]++] = t;
  ctx.parallelFor(a.vocab, [&](int64_t begin, int64_t end) {
    for (int64_t v = begin; v < end; ++v) {
      float *row = dtable + v * a.dim;
      std::fill(row, row + a.dim, 0.0f);
      for (int64_t k = start[v]; k < start[v + 1]; ++k) {
        const float *g = dy + order[k] * a.dim;
        for (int64_t j = 0; j < a.dim; ++j)
          row[j] += g[j];
      }
    }
  });
}

/// cross_entropy: logits [T, V], labels [T]. targets[t] is the class row t
/// is scored against, or -1 when it does not count.
struct CrossEntropyArgs {
  const float *logits;
  int64_t rows, vocab, counted = 0;
  std::vector<int64_t> targets;

  CrossEntropyArgs(const KernelContext &ctx) {
    const TensorRef &labels = ctx.in(1);
    ctx.expectShape(ctx.in(0), "logits", {-1, -1});
    logits = floats(ctx, ctx.in(0), "logits");
    rows = ctx.in(0).dim(0);
    vocab = ctx.in(0).dim(1);
    expectIndices(ctx, labels, "labels");
    ctx.expectShape(labels, "labels", {rows});
    if (ctx.attrBool("shift_labels") && (ctx.seqLen <= 0 || rows % ctx.seqLen != 0))
      ctx.fail("shift_labels needs whole sequences: " + std::to_string(rows) +
               " rows are not a multiple of seq_len " + std::to_string(ctx.seqLen));
    LossTargets found = lossTargets(ctx, labels, rows, vocab);
    targets = std::move(found.targets);
    counted = found.counted;
  }

  /// log Σ_v exp(logits[t, v]).
  double logSumExp(int64_t t) const {
    const float *row = logits + t * vocab;
    double top = *std::max_element(row, row + vocab), sum = 0;
    for (int64_t v = 0; v < vocab; ++v)
      sum += std::exp(row[v] - top);
    return top + std::log(sum);
  }
};

// With no counted position the loss and its gradient are 0; transformers
// gives nan there (a mean over nothing), which would poison the step.
void crossEntropy(KernelContext &ctx) {
  CrossEntropyArgs a(ctx);
  const TensorRef &result = ctx.out(0);
  ctx.expectShape(result, "loss", {});
  float *loss = floats(ctx, result, "loss");
  std::vector<double> rowLoss(static_cast<size_t>(a.rows), 0.0);
  ctx.parallelFor(a.rows, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      if (a.targets[t] >= 0)
        rowLoss[t] = a.logSumExp(t) - a.logits[t * a.vocab + a.targets[t]];
  });
  double sum = 0;
  for (double l : rowLoss)
    sum += l;
  *loss = a.counted ? static_cast<float>(sum / a.counted) : 0.0f;
}

/// d logits[t] = dloss / counted * (softmax(logits[t]) - onehot(target)).
void crossEntropyBackward(KernelContext &ctx) {
  BackwardLaunch launch(ctx, 1, {0});
  CrossEntropyArgs a(ctx);
  const float *dloss = floats(ctx, launch.resultGrad0({}), "the result gradient");
  const TensorRef *dlRef = launch.operandGrad(0);
  if (!dlRef)
    return;
  float *dlogits = floats(ctx, *dlRef, "the logits gradient");
  double scale = a.counted ? *dloss / static_cast<double>(a.counted) : 0.0;
  ctx.parallelFor(a.rows, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float *d = dlogits + t * a.vocab;
      if (a.targets[t] < 0) {
        std::fill(d, d + a.vocab, 0.0f);
        continue;
      }
      const float *row = a.logits + t * a.vocab;
      double lse = a.logSumExp(t);
      for (int64_t v = 0; v < a.vocab; ++v)
        d[v] =
            static_cast<float>(scale * (std::exp(row[v] - lse) - (v == a.targets[t] ? 1.0 : 0.0)));
    }
  });
}

/// Each position's next label within its sequence; the last position of a sequence is ignored.
void shiftLabels(KernelContext &ctx) {
  checks::core::ShiftLabelsShape s = checks::core::checkShiftLabels(ctx);
  const TensorRef &labels = ctx.in(0), &result = ctx.out(0);
  for (int64_t t = 0; t < s.rows; ++t) {
    int64_t next = (t + 1) % s.seqLen == 0 ? s.ignore : labels.index(t + 1);
    if (s.i64)
      static_cast<int64_t *>(result.data)[t] = next;
    else
      static_cast<int32_t *>(result.data)[t] = static_cast<int32_t>(next);
  }
}

} // namespace

void registerTokenKernels(KernelRegistry &registry) {
  registry.add("embedding", embedding);
  registry.add("embedding.backward", embeddingBackward);
  registry.add("cross_entropy", crossEntropy);
  registry.add("cross_entropy.backward", crossEntropyBackward);
  registry.add("shift_labels", shiftLabels);
}

} // namespace moec::runtime::cpu::core
