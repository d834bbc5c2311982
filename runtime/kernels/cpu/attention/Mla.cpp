//===- Mla.cpp - multi-head latent attention, dense and sparse (DSA) ------===//
//
// mla: query [T, H*(nope+rope)], key_rope [T, rope], key_value
// [T, H*(nope+v)], positions [T] -> [T, H*v], as transformers'
// DeepseekV3Attention: per head q = [q_nope | q_pe], k = [k_nope | k_pe] with
// k_nope, v = the head's slice of key_value and k_pe = key_rope shared by
// every head; q_pe and k_pe rotate with `rope` (absent: NoPE, Kimi-Linear).
// `scale` comes complete from the importer (YaRN's mscale² included).
//
// sparse_attention adds indices [T, K]: row t lists the positions (0-based
// within t's sequence) it may attend to, -1 for none. As transformers'
// DeepseekV32Attention, which scatters the indices into a mask and keeps
// the causal mask, a key counts once however often it is listed, and
// listed keys after t stay masked. A row with nothing left outputs zero.
//
// Backward: gradients of query, key_rope, key_value (the rotations are
// transposed back; k_pe's gradient sums over heads).
//
//===----------------------------------------------------------------------===//

#include <optional>
#include <string>
#include <vector>

#include "runtime/kernels/cpu/attention/DenseAttention.h"
#include "runtime/kernels/cpu/attention/Kernels.h"
#include "runtime/kernels/cpu/attention/Launch.h"
#include "runtime/kernels/cpu/attention/Rope.h"

namespace moec::runtime::cpu::attention {
namespace {

enum Operand { Query, KeyRope, KeyValue, Positions, Indices };

struct MlaLaunch {
  int64_t tokens = 0, heads = 0, nope = 0, rope = 0, vDim = 0;
  int64_t qk = 0, kvWidth = 0; // nope + rope, nope + v
  double scale = 0;
  Sequences seqs;
  std::optional<RopeSpec> spec;
  const float *q = nullptr, *kr = nullptr, *kv = nullptr;
  const TensorRef *indices = nullptr; // sparse_attention only
};

MlaLaunch readMla(const KernelContext &ctx, bool sparse) {
  MlaLaunch l;
  l.heads = positiveAttr(ctx, "num_heads");
  l.nope = nonNegativeAttr(ctx, "qk_nope_head_dim");
  l.rope = nonNegativeAttr(ctx, "qk_rope_head_dim");
  l.vDim = positiveAttr(ctx, "v_head_dim");
  l.qk = l.nope + l.rope;
  l.kvWidth = l.nope + l.vDim;
  if (l.qk == 0)
    ctx.fail("qk_nope_head_dim + qk_rope_head_dim must be positive");
  l.scale = ctx.attrFloat("scale");
  l.q = floatTensor(ctx, ctx.in(Query), "query", {-1, l.heads * l.qk});
  l.tokens = ctx.in(Query).dim(0);
  l.kr = floatTensor(ctx, ctx.in(KeyRope), "key_rope", {l.tokens, l.rope});
  l.kv = floatTensor(ctx, ctx.in(KeyValue), "key_value", {l.tokens, l.heads * l.kvWidth});
  expectIndices(ctx, ctx.in(Positions), "positions", {l.tokens});
  l.spec = readRope(ctx, "rope", /*required=*/false, l.rope);
  if (l.spec && l.spec->dim != l.rope)
    ctx.fail("rope.dim (" + std::to_string(l.spec->dim) + ") must equal qk_rope_head_dim (" +
             std::to_string(l.rope) + ")");
  l.seqs = sequencesOf(ctx, l.tokens);
  if (sparse) {
    l.indices = &ctx.in(Indices);
    expectIndices(ctx, *l.indices, "indices", {l.tokens, -1});
    int64_t n = l.indices->numel();
    for (int64_t i = 0; i < n; ++i) {
      int64_t s = l.indices->index(i);
      if (s < -1 || s >= l.seqs.length)
        ctx.fail("indices[" + std::to_string(i / l.indices->dim(1)) + "] holds " +
                 std::to_string(s) + ", outside [-1, seq_len = " + std::to_string(l.seqs.length) +
                 ")");
    }
  }
  return l;
}

/// The keys each row of sequence b may attend to, from its indices ([L, L]).
std::vector<uint8_t> selectedKeys(const MlaLaunch &l, int64_t b) {
  int64_t n = l.seqs.length, k = l.indices->dim(1);
  std::vector<uint8_t> selected(static_cast<size_t>(n * n), 0);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j) {
      int64_t s = l.indices->index((b * n + t) * k + j);
      if (s >= 0)
        selected[t * n + s] = 1;
    }
  return selected;
}

/// q_pe and k_pe: rotated copies when the layer has RoPE, else the inputs.
struct RopeParts {
  std::optional<RopeTable> table;
  std::vector<float> qBuffer, kBuffer;
  const float *q = nullptr, *k = nullptr; // head h of row t: q + t*ldq + h*headStride
  int64_t ldq = 0, headStride = 0;
};

RopeParts ropeParts(const KernelContext &ctx, const MlaLaunch &l) {
  RopeParts r;
  if (!l.spec) {
    r.q = l.q + l.nope;
    r.ldq = l.heads * l.qk;
    r.headStride = l.qk;
    r.k = l.kr;
    return r;
  }
  r.table.emplace(*l.spec, ctx.in(Positions));
  r.qBuffer.resize(static_cast<size_t>(l.tokens * l.heads * l.rope));
  r.kBuffer.resize(static_cast<size_t>(l.tokens * l.rope));
  r.ldq = l.heads * l.rope;
  r.headStride = l.rope;
  ctx.parallelFor(l.tokens, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t h = 0; h < l.heads; ++h)
        r.table->rotate(t, l.q + t * l.heads * l.qk + h * l.qk + l.nope,
                        r.qBuffer.data() + t * r.ldq + h * l.rope);
      r.table->rotate(t, l.kr + t * l.rope, r.kBuffer.data() + t * l.rope);
    }
  });
  r.q = r.qBuffer.data();
  r.k = r.kBuffer.data();
  return r;
}

HeadView headView(const MlaLaunch &l, const RopeParts &r, int64_t b, int64_t h) {
  int64_t row = b * l.seqs.length, ldkv = l.heads * l.kvWidth;
  HeadView view;
  view.numParts = 2;
  QkPart &nope = view.parts[0], &pe = view.parts[1];
  nope.ldq = l.heads * l.qk;
  nope.q = l.q + row * nope.ldq + h * l.qk;
  nope.ldk = ldkv;
  nope.k = l.kv + row * ldkv + h * l.kvWidth;
  nope.dim = l.nope;
  pe.ldq = r.ldq;
  pe.q = r.q + row * r.ldq + h * r.headStride;
  pe.ldk = l.rope;
  pe.k = r.k + row * l.rope;
  pe.dim = l.rope;
  view.v = l.kv + row * ldkv + h * l.kvWidth + l.nope;
  view.ldv = ldkv;
  view.dv = l.vDim;
  return view;
}

void checkInputCount(const KernelContext &ctx, bool sparse) {
  size_t want = sparse ? 5 : 4;
  if (ctx.inputs.size() != want)
    ctx.fail("expected " + std::to_string(want) + " inputs (query, key_rope, key_value, positions" +
             (sparse ? ", indices" : "") + "), got " + std::to_string(ctx.inputs.size()));
}

void mlaForward(KernelContext &ctx, bool sparse) {
  checkInputCount(ctx, sparse);
  MlaLaunch l = readMla(ctx, sparse);
  if (ctx.outputs.size() != 1 && ctx.outputs.size() != 2)
    ctx.fail("expected 1 or 2 outputs (result[, logsumexp]), got " + std::to_string(ctx.outputs.size()));
  int64_t ldo = l.heads * l.vDim;
  float *out = floatTensor(ctx, ctx.out(0), "result", {l.tokens, ldo});
  float *lse = ctx.outputs.size() == 2 ? floatTensor(ctx, ctx.out(1), "logsumexp", {l.tokens, l.heads}) : nullptr;
  RopeParts r = ropeParts(ctx, l);
  for (int64_t b = 0; b < l.seqs.count; ++b) {
    std::vector<uint8_t> selected = sparse ? selectedKeys(l, b) : std::vector<uint8_t>();
    DenseAttention core(ctx, l.seqs.length, l.scale, Mask{0, sparse ? selected.data() : nullptr});
    const int64_t row = b * l.seqs.length;
    for (int64_t h = 0; h < l.heads; ++h)
      core.forward(headView(l, r, b, h), out + row * ldo + h * l.vDim, ldo, lse ? lse + row * l.heads + h : nullptr,
                   l.heads);
  }
}

void mlaBackward(KernelContext &ctx, bool sparse) {
  size_t operands = backwardOperands(ctx, sparse ? 5 : 4, sparse ? 5 : 4);
  MlaLaunch l = readMla(ctx, sparse);
  int64_t ldo = l.heads * l.vDim, ldkv = l.heads * l.kvWidth, ldq = l.heads * l.qk;
  const float *gradOut = checkBackward(ctx, operands, {Query, KeyRope, KeyValue}, l.tokens, ldo);
  if (!gradOut)
    return;
  float *dq = gradFor(ctx, Query), *dkr = gradFor(ctx, KeyRope), *dkv = gradFor(ctx, KeyValue);
  RopeParts r = ropeParts(ctx, l);
  // With RoPE, q_pe / k_pe gradients gather in rotated space, then rotate back.
  std::vector<float> dqPe, dkPe;
  if (l.spec && dq)
    dqPe.assign(static_cast<size_t>(l.tokens * l.heads * l.rope), 0.0f);
  if (l.spec && dkr)
    dkPe.assign(static_cast<size_t>(l.tokens * l.rope), 0.0f);
  for (int64_t b = 0; b < l.seqs.count; ++b) {
    std::vector<uint8_t> selected = sparse ? selectedKeys(l, b) : std::vector<uint8_t>();
    DenseAttention core(ctx, l.seqs.length, l.scale, Mask{0, sparse ? selected.data() : nullptr});
    int64_t row = b * l.seqs.length;
    for (int64_t h = 0; h < l.heads; ++h) {
      HeadView view = headView(l, r, b, h);
      QkPart &nope = view.parts[0], &pe = view.parts[1];
      if (dq) {
        nope.dq = dq + row * ldq + h * l.qk;
        nope.lddq = ldq;
        pe.dq = l.spec ? dqPe.data() + row * r.ldq + h * l.rope : nope.dq + l.nope;
        pe.lddq = l.spec ? r.ldq : ldq;
      }
      if (dkr) {
        pe.dk = (l.spec ? dkPe.data() : dkr) + row * l.rope;
        pe.lddk = l.rope;
      }
      if (dkv) {
        nope.dk = dkv + row * ldkv + h * l.kvWidth;
        nope.lddk = ldkv;
        view.dV = nope.dk + l.nope;
        view.lddV = ldkv;
      }
      core.backward(view, gradOut + row * ldo + h * l.vDim, ldo);
    }
  }
  if (!r.table)
    return;
  ctx.parallelFor(l.tokens, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      if (dq)
        for (int64_t h = 0; h < l.heads; ++h)
          r.table->rotateBack(t, dqPe.data() + t * r.ldq + h * l.rope,
                              dq + t * ldq + h * l.qk + l.nope);
      if (dkr)
        r.table->rotateBack(t, dkPe.data() + t * l.rope, dkr + t * l.rope);
    }
  });
}

} // namespace

void registerMlaKernels(KernelRegistry &registry) {
  registry.add("mla", [](KernelContext &ctx) { mlaForward(ctx, false); });
  registry.add("mla.backward", [](KernelContext &ctx) { mlaBackward(ctx, false); });
  registry.add("sparse_attention", [](KernelContext &ctx) { mlaForward(ctx, true); });
  registry.add("sparse_attention.backward", [](KernelContext &ctx) { mlaBackward(ctx, true); });
}

} // namespace moec::runtime::cpu::attention
