//===- Attention.cu - causal grouped-query attention on the GPU -----------===//
//
// attention: query [T, H*d], key [T, KV*d], value [T, KV*dv], optional sinks
// [H] -> [T, H*dv] (and the logsumexp [T, H] when the op has that result),
// as cpu/attention/Attention.cpp (the checks and messages too); the core is
// Dense.cu. The backward's gradients are those of query, key, value and
// sinks; given the saved result and logsumexp it takes its statistics from
// them instead of running the forward's key loop again.
//
//===----------------------------------------------------------------------===//

#include <string>

#include "runtime/kernels/cuda/attention/Kernels.cuh"

namespace moec::runtime::cuda::attention {
namespace {

enum Operand { Query, Key, Value, Sinks };

struct AttentionLaunch {
  int64_t tokens = 0, heads = 0, kvHeads = 0, headDim = 0, valueDim = 0, window = 0;
  double scale = 0;
  Sequences seqs;
  bool sinks = false;
  FloatIn q, k, v, sink;
};

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
  l.q = floatIn(ctx, ctx.in(Query), "query", {-1, l.heads * l.headDim});
  l.tokens = ctx.in(Query).dim(0);
  l.k = floatIn(ctx, ctx.in(Key), "key", {l.tokens, l.kvHeads * l.headDim});
  l.v = floatIn(ctx, ctx.in(Value), "value", {l.tokens, -1});
  if (ctx.in(Value).dim(1) % l.kvHeads != 0)
    ctx.fail("value features (" + std::to_string(ctx.in(Value).dim(1)) +
             ") must be a multiple of num_kv_heads (" + std::to_string(l.kvHeads) + ")");
  l.valueDim = ctx.in(Value).dim(1) / l.kvHeads;
  l.sinks = operands == 4;
  if (l.sinks)
    l.sink = floatIn(ctx, ctx.in(Sinks), "sinks", {l.heads});
  l.seqs = sequencesOf(ctx, l.tokens);
  return l;
}

AttnParams paramsOf(const AttentionLaunch &l) {
  AttnParams P;
  P.L = l.seqs.length;
  P.B = l.seqs.count;
  P.H = static_cast<int>(l.heads);
  P.KV = static_cast<int>(l.kvHeads);
  P.group = static_cast<int>(l.heads / l.kvHeads);
  P.dA = static_cast<int>(l.headDim);
  P.dB = 0;
  P.dv = static_cast<int>(l.valueDim);
  P.qA = Mat{l.q, l.heads * l.headDim, l.headDim};
  P.kA = Mat{l.k, l.kvHeads * l.headDim, l.headDim};
  P.v = Mat{l.v, l.kvHeads * l.valueDim, l.valueDim};
  P.scale = static_cast<float>(l.scale);
  P.window = l.window;
  if (l.sinks)
    P.sinks = l.sink;
  return P;
}

void attentionForward(KernelContext &ctx) {
  if (ctx.inputs.size() != 3 && ctx.inputs.size() != 4)
    ctx.fail("expected 3 or 4 inputs (query, key, value[, sinks]), got " +
             std::to_string(ctx.inputs.size()));
  AttentionLaunch l = readAttention(ctx, ctx.inputs.size());
  if (ctx.outputs.size() != 1 && ctx.outputs.size() != 2)
    ctx.fail("expected 1 or 2 outputs (result[, logsumexp]), got " + std::to_string(ctx.outputs.size()));
  int64_t ldo = l.heads * l.valueDim;
  FloatOut out = floatOut(ctx, ctx.out(0), "result", {l.tokens, ldo});
  AttnParams P = paramsOf(l);
  P.out = OutMat{out, ldo, l.valueDim};
  if (ctx.outputs.size() == 2)
    P.lseOut = static_cast<float *>(f32Statistics(ctx, ctx.out(1), l.tokens, l.heads).p);
  denseForward(ctx, P);
}

void attentionBackward(KernelContext &ctx) {
  size_t operands = backwardOperands(ctx, 3, 4);
  AttentionLaunch l = readAttention(ctx, operands);
  int64_t ldo = l.heads * l.valueDim;
  FloatIn gradOut = checkBackward(ctx, operands, {Query, Key, Value, Sinks}, l.tokens, ldo);
  if (!gradOut.p)
    return zeroOutputs(ctx); // no gradient flows
  FloatOut dq = gradFor(ctx, Query), dk = gradFor(ctx, Key), dv = gradFor(ctx, Value);
  FloatOut dSinks = l.sinks ? gradFor(ctx, Sinks) : FloatOut{};
  AttnParams P = paramsOf(l);
  P.dO = Mat{gradOut, ldo, l.valueDim};
  // The forward's result and logsumexp, when the plan saved them (backward_segments[1] = 2).
  if (ctx.has("backward_segments") && ctx.attrInts("backward_segments").at(1) == 2) {
    P.savedO = Mat{floatIn(ctx, ctx.in(operands), "saved result", {l.tokens, ldo}), ldo, l.valueDim};
    P.savedLse = static_cast<const float *>(f32Statistics(ctx, ctx.in(operands + 1), l.tokens, l.heads).p);
  }
  if (dq.p)
    P.dqA = OutMat{dq, l.heads * l.headDim, l.headDim};
  if (dk.p)
    P.dkA = OutMat{dk, l.kvHeads * l.headDim, l.headDim};
  if (dv.p)
    P.dV = OutMat{dv, l.kvHeads * l.valueDim, l.valueDim};
  Scratch scratch(ctx);
  denseBackward(ctx, P, scratch, dSinks);
}

} // namespace

void registerGqaKernels(KernelRegistry &registry) {
  registry.add("attention", attentionForward);
  // Every gradient element is written (the poisoned-output tests check it).
  registry.add("attention.backward", attentionBackward, OutputInit::Any);
}

} // namespace moec::runtime::cuda::attention
