//===- Attention.cpp - causal grouped-query attention, forward and backward ===//
//
// attention: query [T, H*d], key [T, KV*d], value [T, KV*dv], optional sinks
// [H] -> [T, H*dv]. Query head h reads key/value head h / (H/KV) (transformers'
// repeat_kv). Sinks follow gpt-oss: one learned logit per head that joins the
// softmax denominator and contributes no value. A second output, when the
// plan has one, gets each (query, head)'s logsumexp [T, H]. The backward
// recomputes the probabilities (the saved result and logsumexp, when passed,
// are not needed by this reference); its gradients are those of query, key,
// value and sinks.
//
//===----------------------------------------------------------------------===//

#include <string>

#include "runtime/kernels/cpu/attention/DenseAttention.h"
#include "runtime/kernels/cpu/attention/Kernels.h"
#include "runtime/kernels/cpu/attention/Launch.h"

namespace moec::runtime::cpu::attention {
namespace {

enum Operand { Query, Key, Value, Sinks };

struct AttentionLaunch {
  int64_t tokens = 0, heads = 0, kvHeads = 0, headDim = 0, valueDim = 0, window = 0;
  double scale = 0;
  Sequences seqs;
  bool sinks = false;
  const float *q = nullptr, *k = nullptr, *v = nullptr, *sink = nullptr;
};

/// Checks the forward operands (the first `operands` inputs) and attributes.
AttentionLaunch readAttention(const KernelContext &ctx, size_t operands) {
  AttentionLaunch l;
  l.heads = positiveAttr(ctx, "num_heads");
  l.kvHeads = positiveAttr(ctx, "num_kv_heads");
  l.headDim = positiveAttr(ctx, "head_dim");
  if (l.heads % l.kvHeads != 0)
    ctx.fail("num_heads (" + std::to_string(l.heads) + ") must be a multiple of num_kv_heads (" +
             std::to_string(l.kvHeads) + ")");
  l.scale = ctx.attrFloat("scale");
  if (ctx.has("sliding_window"))
    l.window = positiveAttr(ctx, "sliding_window");
  l.q = floatTensor(ctx, ctx.in(Query), "query", {-1, l.heads * l.headDim});
  l.tokens = ctx.in(Query).dim(0);
  l.k = floatTensor(ctx, ctx.in(Key), "key", {l.tokens, l.kvHeads * l.headDim});
  l.v = floatTensor(ctx, ctx.in(Value), "value", {l.tokens, -1});
  if (ctx.in(Value).dim(1) % l.kvHeads != 0)
    ctx.fail("value features (" + std::to_string(ctx.in(Value).dim(1)) +
             ") must be a multiple of num_kv_heads (" + std::to_string(l.kvHeads) + ")");
  l.valueDim = ctx.in(Value).dim(1) / l.kvHeads;
  l.sinks = operands == 4;
  if (l.sinks)
    l.sink = floatTensor(ctx, ctx.in(Sinks), "sinks", {l.heads});
  l.seqs = sequencesOf(ctx, l.tokens);
  return l;
}

/// Head h of sequence b: pointers at the sequence's first row.
HeadView headView(const AttentionLaunch &l, int64_t b, int64_t h) {
  int64_t g = h / (l.heads / l.kvHeads), row = b * l.seqs.length;
  HeadView view;
  QkPart &part = view.parts[0];
  part.ldq = l.heads * l.headDim;
  part.ldk = l.kvHeads * l.headDim;
  part.q = l.q + row * part.ldq + h * l.headDim;
  part.k = l.k + row * part.ldk + g * l.headDim;
  part.dim = l.headDim;
  view.ldv = l.kvHeads * l.valueDim;
  view.v = l.v + row * view.ldv + g * l.valueDim;
  view.dv = l.valueDim;
  view.sink = l.sinks ? l.sink + h : nullptr;
  return view;
}

void attentionForward(KernelContext &ctx) {
  if (ctx.inputs.size() != 3 && ctx.inputs.size() != 4)
    ctx.fail("expected 3 or 4 inputs (query, key, value[, sinks]), got " +
             std::to_string(ctx.inputs.size()));
  AttentionLaunch l = readAttention(ctx, ctx.inputs.size());
  if (ctx.outputs.size() != 1 && ctx.outputs.size() != 2)
    ctx.fail("expected 1 or 2 outputs (result[, logsumexp]), got " + std::to_string(ctx.outputs.size()));
  int64_t ldo = l.heads * l.valueDim;
  float *out = floatTensor(ctx, ctx.out(0), "result", {l.tokens, ldo});
  float *lse = ctx.outputs.size() == 2 ? floatTensor(ctx, ctx.out(1), "logsumexp", {l.tokens, l.heads}) : nullptr;
  DenseAttention core(ctx, l.seqs.length, l.scale, Mask{l.window, nullptr});
  for (int64_t b = 0; b < l.seqs.count; ++b)
    for (int64_t h = 0; h < l.heads; ++h) {
      const int64_t row = b * l.seqs.length;
      core.forward(headView(l, b, h), out + row * ldo + h * l.valueDim, ldo,
                   lse ? lse + row * l.heads + h : nullptr, l.heads);
    }
}

void attentionBackward(KernelContext &ctx) {
  size_t operands = backwardOperands(ctx, 3, 4);
  AttentionLaunch l = readAttention(ctx, operands);
  int64_t ldo = l.heads * l.valueDim;
  const float *gradOut = checkBackward(ctx, operands, {Query, Key, Value, Sinks}, l.tokens, ldo);
  if (!gradOut)
    return;
  float *dq = gradFor(ctx, Query), *dk = gradFor(ctx, Key), *dv = gradFor(ctx, Value);
  float *dSinks = l.sinks ? gradFor(ctx, Sinks) : nullptr;
  DenseAttention core(ctx, l.seqs.length, l.scale, Mask{l.window, nullptr});
  std::vector<double> sinkGrads(static_cast<size_t>(l.heads), 0.0);
  for (int64_t b = 0; b < l.seqs.count; ++b)
    for (int64_t h = 0; h < l.heads; ++h) {
      HeadView view = headView(l, b, h);
      QkPart &part = view.parts[0];
      int64_t row = b * l.seqs.length, g = h / (l.heads / l.kvHeads);
      if (dq) {
        part.dq = dq + row * part.ldq + h * l.headDim;
        part.lddq = part.ldq;
      }
      if (dk) {
        part.dk = dk + row * part.ldk + g * l.headDim;
        part.lddk = part.ldk;
      }
      if (dv) {
        view.dV = dv + row * view.ldv + g * l.valueDim;
        view.lddV = view.ldv;
      }
      sinkGrads[h] += core.backward(view, gradOut + row * ldo + h * l.valueDim, ldo);
    }
  if (dSinks)
    for (int64_t h = 0; h < l.heads; ++h)
      dSinks[h] = static_cast<float>(sinkGrads[h]);
}

} // namespace

void registerGqaKernels(KernelRegistry &registry) {
  registry.add("attention", attentionForward);
  registry.add("attention.backward", attentionBackward);
}

} // namespace moec::runtime::cpu::attention
