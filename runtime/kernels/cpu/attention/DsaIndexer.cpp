//===- DsaIndexer.cpp - DeepSeek Sparse Attention's lightning indexer -----===//
//
// dsa_indexer: query [T, H*D], key [T, D], head_weights [T, H], positions
// [T] -> indices [T, topk] (i32 or i64), as transformers' DeepseekV32Indexer:
//
//   q, k   the LEADING rope.dim features of each query head and of the key
//          rotate (the MLA rotates its trailing ones)
//   I[t,s] = Σ_h (w[t,h]·H^-½) · ReLU((q[t,h]·k[s])·D^-½)     for s <= t
//
// then the topk largest per query. The official code's Hadamard rotation
// and FP8 quantisation are skipped, as transformers does (the rotation is
// orthogonal, so the scores only lose quantisation noise).
//
// Selection repeats torch.topk on CPU (ATen TopKImpl.h): the row holds all
// L keys of the sequence, future ones at -inf, and std::nth_element (or
// std::partial_sort when topk·64 <= L) orders (score, key) pairs by score
// alone. Ties are common — a key whose ReLU terms all vanish scores exactly
// 0 — so running the same algorithm on the same pairs is what makes the
// selection equal transformers'. Selected future keys (when topk exceeds
// t+1) come out as -1, which sparse_attention ignores as transformers'
// causal mask does. Integer output: no backward.
//
//===----------------------------------------------------------------------===//

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "runtime/kernels/cpu/attention/Kernels.h"
#include "runtime/kernels/cpu/attention/Launch.h"
#include "runtime/kernels/cpu/attention/Rope.h"

namespace moec::runtime::cpu::attention {
namespace {

using Candidate = std::pair<float, int64_t>; // (score, key position)

/// torch's ordering for largest=True: NaN first, then by value.
bool ranksHigher(const Candidate &x, const Candidate &y) {
  return (std::isnan(x.first) && !std::isnan(y.first)) || x.first > y.first;
}

/// The first k entries of `row` become the top k, in torch.topk's order.
void selectTopK(std::vector<Candidate> &row, int64_t k) {
  if (k * 64 <= static_cast<int64_t>(row.size())) {
    std::partial_sort(row.begin(), row.begin() + k, row.end(), ranksHigher);
    return;
  }
  std::nth_element(row.begin(), row.begin() + k - 1, row.end(), ranksHigher);
  std::sort(row.begin(), row.begin() + k - 1, ranksHigher);
}

void dsaIndexer(KernelContext &ctx) {
  if (ctx.inputs.size() != 4)
    ctx.fail("expected 4 inputs (query, key, head_weights, positions), got " +
             std::to_string(ctx.inputs.size()));
  int64_t heads = positiveAttr(ctx, "num_heads"), dim = positiveAttr(ctx, "head_dim"),
          topk = positiveAttr(ctx, "topk");
  const float *query = floatTensor(ctx, ctx.in(0), "query", {-1, heads * dim});
  int64_t tokens = ctx.in(0).dim(0);
  const float *key = floatTensor(ctx, ctx.in(1), "key", {tokens, dim});
  const float *weights = floatTensor(ctx, ctx.in(2), "head_weights", {tokens, heads});
  expectIndices(ctx, ctx.in(3), "positions", {tokens});
  RopeSpec spec = *readRope(ctx, "rope", /*required=*/true, dim);
  Sequences seqs = sequencesOf(ctx, tokens);
  if (ctx.outputs.size() != 1)
    ctx.fail("expected 1 output, got " + std::to_string(ctx.outputs.size()));
  const TensorRef &out = ctx.out(0);
  expectIndices(ctx, out, "indices", {tokens, topk});

  // Rotated copies: the leading spec.dim features of each head and of the key.
  RopeTable table(spec, ctx.in(3));
  std::vector<float> q(query, query + tokens * heads * dim), k(key, key + tokens * dim);
  ctx.parallelFor(tokens, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t h = 0; h < heads; ++h)
        table.rotate(t, query + (t * heads + h) * dim, q.data() + (t * heads + h) * dim);
      table.rotate(t, key + t * dim, k.data() + t * dim);
    }
  });

  const float dotScale = static_cast<float>(std::pow(static_cast<double>(dim), -0.5));
  const float headScale = static_cast<float>(std::pow(static_cast<double>(heads), -0.5));
  const int64_t n = seqs.length, keep = std::min(topk, n);
  const bool wide = out.dtype == plan::I64;
  ctx.parallelFor(tokens, [&](int64_t begin, int64_t end) {
    std::vector<Candidate> row(static_cast<size_t>(n));
    for (int64_t t = begin; t < end; ++t) {
      int64_t first = t - t % n, last = t - first; // the sequence's row 0, t's position in it
      const float *qt = q.data() + t * heads * dim;
      for (int64_t s = 0; s < n; ++s) {
        float score = -std::numeric_limits<float>::infinity();
        if (s <= last) {
          const float *ks = k.data() + (first + s) * dim;
          score = 0.0f;
          for (int64_t h = 0; h < heads; ++h) {
            double dot = 0;
            for (int64_t d = 0; d < dim; ++d)
              dot += static_cast<double>(qt[h * dim + d]) * ks[d];
            float logit = std::max(static_cast<float>(dot) * dotScale, 0.0f);
            score += weights[t * heads + h] * headScale * logit;
          }
        }
        row[s] = {score, s};
      }
      selectTopK(row, keep);
      for (int64_t j = 0; j < topk; ++j) {
        int64_t s = j < keep && row[j].second <= last ? row[j].second : -1;
        if (wide)
          static_cast<int64_t *>(out.data)[t * topk + j] = s;
        else
          static_cast<int32_t *>(out.data)[t * topk + j] = static_cast<int32_t>(s);
      }
    }
  });
}

} // namespace

void registerIndexerKernels(KernelRegistry &registry) { registry.add("dsa_indexer", dsaIndexer); }

} // namespace moec::runtime::cpu::attention
