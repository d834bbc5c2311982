//===- DenseAttention.cpp - softmax attention of one head over one sequence ===//

#include "runtime/kernels/cpu/attention/DenseAttention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "runtime/kernels/cpu/Gemm.h"

namespace moec::runtime::cpu::attention {

DenseAttention::DenseAttention(const KernelContext &ctx, int64_t length, double scale, Mask mask)
    : ctx(ctx), length(length), scale(static_cast<float>(scale)), mask(mask),
      probs(static_cast<size_t>(length * length)), pSink(static_cast<size_t>(length)),
      rowDots(static_cast<size_t>(length)), rowLse(static_cast<size_t>(length)) {}

void DenseAttention::probabilities(const HeadView &head) {
  const int64_t n = length;
  float *scores = probs.data();
  bool first = true;
  for (int p = 0; p < head.numParts; ++p) {
    const QkPart &part = head.parts[p];
    if (part.dim == 0)
      continue;
    gemm(false, true, n, n, part.dim, 1.0f, part.q, part.ldq, part.k, part.ldk, first ? 0.0f : 1.0f,
         scores, n);
    first = false;
  }
  if (first)
    std::fill(probs.begin(), probs.end(), 0.0f);
  const double inf = std::numeric_limits<double>::infinity();
  const double sink = head.sink ? static_cast<double>(*head.sink) : -inf;
  ctx.parallelFor(n, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float *row = scores + t * n;
      // Logits as transformers forms them: the f32 product times the f32 scale.
      double top = sink;
      for (int64_t s = 0; s <= t; ++s)
        if (allowed(t, s)) {
          row[s] *= scale;
          top = std::max(top, static_cast<double>(row[s]));
        }
      double sum = head.sink ? std::exp(sink - top) : 0.0;
      if (top == -inf) { // nothing to attend to
        std::fill(row, row + n, 0.0f);
        pSink[t] = 0;
        rowLse[t] = inf;
        continue;
      }
      for (int64_t s = 0; s <= t; ++s)
        if (allowed(t, s))
          sum += std::exp(row[s] - top);
      for (int64_t s = 0; s < n; ++s)
        row[s] = s <= t && allowed(t, s) ? static_cast<float>(std::exp(row[s] - top) / sum) : 0.0f;
      pSink[t] = head.sink ? std::exp(sink - top) / sum : 0.0;
      rowLse[t] = top + std::log(sum);
    }
  });
}

void DenseAttention::forward(const HeadView &head, float *out, int64_t ldo, float *lse, int64_t ldLse) {
  probabilities(head);
  if (lse)
    for (int64_t t = 0; t < length; ++t)
      lse[t * ldLse] = static_cast<float>(rowLse[t]);
  gemm(false, false, length, head.dv, length, 1.0f, probs.data(), length, head.v, head.ldv, 0.0f,
       out, ldo);
}

double DenseAttention::backward(const HeadView &head, const float *dOut, int64_t lddo) {
  const int64_t n = length;
  probabilities(head);
  grads.resize(probs.size());
  float *g = grads.data();
  const float *p = probs.data();
  gemm(false, true, n, n, head.dv, 1.0f, dOut, lddo, head.v, head.ldv, 0.0f, g, n); // dP
  ctx.parallelFor(n, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float *pRow = p + t * n;
      float *gRow = g + t * n;
      double dot = 0;
      for (int64_t s = 0; s <= t; ++s)
        dot += static_cast<double>(pRow[s]) * gRow[s];
      for (int64_t s = 0; s < n; ++s)
        gRow[s] = s <= t ? static_cast<float>(scale * pRow[s] * (gRow[s] - dot)) : 0.0f;
      rowDots[t] = dot;
    }
  });
  double sinkGrad = 0;
  if (head.sink)
    for (int64_t t = 0; t < n; ++t)
      sinkGrad -= pSink[t] * rowDots[t];
  for (int i = 0; i < head.numParts; ++i) {
    const QkPart &part = head.parts[i];
    if (part.dim == 0)
      continue;
    if (part.dq)
      gemm(false, false, n, part.dim, n, 1.0f, g, n, part.k, part.ldk, 0.0f, part.dq, part.lddq);
    if (part.dk)
      gemm(true, false, n, part.dim, n, 1.0f, g, n, part.q, part.ldq, 1.0f, part.dk, part.lddk);
  }
  if (head.dV)
    gemm(true, false, n, head.dv, n, 1.0f, p, n, dOut, lddo, 1.0f, head.dV, head.lddV);
  return sinkGrad;
}

} // namespace moec::runtime::cpu::attention
