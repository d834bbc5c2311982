//===- Mla.cu - multi-head latent attention on the GPU, dense and sparse --===//
//
// mla: query [T, H*(nope+rope)], key_rope [T, rope], key_value
// [T, H*(nope+v)], positions [T] -> [T, H*v]; sparse_attention adds indices
// [T, K]. As cpu/attention/Mla.cpp: per head q = [q_nope | q_pe], k =
// [k_nope | k_pe] with k_pe = key_rope shared by every head; q_pe and k_pe
// rotate with `rope` (absent: NoPE). The rotated copies go to scratch (one
// block per token), then the core runs with query/key parts A = nope,
// B = rope (Dense.cu, Sparse.cu). The scratch is f32, except where dense
// attention's tensor-core path takes the launch (bf16 storage, head dims
// flashHeadDims covers: DeepSeek's 128 + 64, value 128): bf16, which it reads.
//
// Backward: q_pe's gradient gathers in rotated space (f32 scratch) and
// rotates back; k_pe's gradient is written per head (scratch [T, H, rope]),
// summed over heads in order and rotated back, one block per token.
//
// Unlike the CPU, index values are not range-checked on the host (they live
// on the device): entries outside [0, t] select nothing.
//
//===----------------------------------------------------------------------===//

#include <optional>
#include <string>

#include "runtime/kernels/cuda/attention/Kernels.cuh"

namespace moec::runtime::cuda::attention {
namespace {

enum Operand { Query, KeyRope, KeyValue, Positions, Indices };

constexpr int kRopeThreads = 128;
constexpr int64_t kMaxPe = 2 * kMaxRopeHalf;

/// q_pe of every head and k_pe of token t, rotated into scratch.
__global__ void __launch_bounds__(kRopeThreads)
    rotatePartsKernel(FloatIn query, FloatIn keyRope, IndexIn positions, FloatOut qPe, FloatOut kPe,
                      int heads, int64_t qk, int64_t nope, RopeConsts r) {
  __shared__ float cs[kMaxRopeHalf], sn[kMaxRopeHalf];
  const int64_t t = blockIdx.x;
  const float position = static_cast<float>(ldIndex(positions, t));
  for (int i = threadIdx.x; i < r.half; i += blockDim.x)
    ropeCosSin(r, i, position, cs[i], sn[i]);
  __syncthreads();
  const int rope = 2 * r.half;
  for (int idx = threadIdx.x; idx < (heads + 1) * rope; idx += blockDim.x) {
    int h = idx / rope, e = idx - h * rope, i = e < r.half ? e : e - r.half;
    FloatIn src = h < heads ? query : keyRope;
    int64_t base = h < heads ? t * heads * qk + h * qk + nope : t * rope;
    float a = ld(src, base + (r.interleaved ? 2 * i : i));
    float b = ld(src, base + (r.interleaved ? 2 * i + 1 : i + r.half));
    float value = e < r.half ? __fsub_rn(__fmul_rn(a, cs[i]), __fmul_rn(b, sn[i]))
                             : __fadd_rn(__fmul_rn(b, cs[i]), __fmul_rn(a, sn[i]));
    if (h < heads)
      st(qPe, (t * heads + h) * rope + e, value);
    else
      st(kPe, t * rope + e, value);
  }
}

/// dq's q_pe features from dqPe (rotated back), and dkr = Σ_h dkPeHeads
/// (rotated back when `rotate`); either source may be null.
__global__ void __launch_bounds__(kRopeThreads)
    gatherPartsKernel(const float *dqPe, const float *dkPeHeads, IndexIn positions, FloatOut dq,
                      FloatOut dkr, int heads, int64_t qk, int64_t nope, int rope, RopeConsts r,
                      int rotate) {
  __shared__ float cs[kMaxRopeHalf], sn[kMaxRopeHalf], kSum[kMaxPe];
  const int64_t t = blockIdx.x;
  if (rotate) {
    const float position = static_cast<float>(ldIndex(positions, t));
    for (int i = threadIdx.x; i < r.half; i += blockDim.x)
      ropeCosSin(r, i, position, cs[i], sn[i]);
  }
  if (dkPeHeads)
    for (int e = threadIdx.x; e < rope; e += blockDim.x) {
      float sum = 0.0f;
      for (int h = 0; h < heads; ++h) // head order, as the CPU's accumulating GEMMs
        sum += dkPeHeads[(t * heads + h) * rope + e];
      kSum[e] = sum;
    }
  __syncthreads();
  if (dqPe)
    for (int idx = threadIdx.x; idx < heads * rope; idx += blockDim.x) {
      int h = idx / rope, e = idx - h * rope;
      float value = ropeRotateBack(dqPe + (t * heads + h) * rope, e, r.half, r.interleaved, cs, sn);
      st(dq, t * heads * qk + h * qk + nope + e, value);
    }
  if (dkPeHeads)
    for (int e = threadIdx.x; e < rope; e += blockDim.x)
      st(dkr, t * rope + e,
         rotate ? ropeRotateBack(kSum, e, r.half, r.interleaved, cs, sn) : kSum[e]);
}

struct MlaLaunch {
  int64_t tokens = 0, heads = 0, nope = 0, rope = 0, vDim = 0;
  int64_t qk = 0, kvWidth = 0;
  double scale = 0;
  Sequences seqs;
  std::optional<RopeSpec> spec;
  FloatIn q, kr, kv;
  IndexIn positions, indices;
  int64_t topk = 0;
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
  l.q = floatIn(ctx, ctx.in(Query), "query", {-1, l.heads * l.qk});
  l.tokens = ctx.in(Query).dim(0);
  l.kr = floatIn(ctx, ctx.in(KeyRope), "key_rope", {l.tokens, l.rope});
  l.kv = floatIn(ctx, ctx.in(KeyValue), "key_value", {l.tokens, l.heads * l.kvWidth});
  l.positions = indexIn(ctx, ctx.in(Positions), "positions", {l.tokens});
  l.spec = readRope(ctx, "rope", /*required=*/false, l.rope);
  if (l.spec && l.spec->dim != l.rope)
    ctx.fail("rope.dim (" + std::to_string(l.spec->dim) + ") must equal qk_rope_head_dim (" +
             std::to_string(l.rope) + ")");
  if (l.rope > kMaxPe)
    ctx.fail("qk_rope_head_dim (" + std::to_string(l.rope) +
             ") exceeds the CUDA kernels' limit of " + std::to_string(kMaxPe));
  l.seqs = sequencesOf(ctx, l.tokens);
  if (sparse) {
    l.indices = indexIn(ctx, ctx.in(Indices), "indices", {l.tokens, -1});
    l.topk = ctx.in(Indices).dim(1);
  }
  return l;
}

void checkInputCount(const KernelContext &ctx, bool sparse) {
  size_t want = sparse ? 5 : 4;
  if (ctx.inputs.size() != want)
    ctx.fail("expected " + std::to_string(want) + " inputs (query, key_rope, key_value, positions" +
             (sparse ? ", indices" : "") + "), got " + std::to_string(ctx.inputs.size()));
}

/// The core's parameters, with q_pe / k_pe rotated into scratch when the layer has RoPE.
AttnParams paramsOf(const KernelContext &ctx, const MlaLaunch &l, Scratch &scratch, RopeConsts &consts,
                    bool sparse) {
  AttnParams P;
  P.L = l.seqs.length;
  P.B = l.seqs.count;
  P.H = static_cast<int>(l.heads);
  P.KV = P.H;
  P.group = 1;
  P.dA = static_cast<int>(l.nope);
  P.dB = static_cast<int>(l.rope);
  P.dv = static_cast<int>(l.vDim);
  const int64_t ldq = l.heads * l.qk, ldkv = l.heads * l.kvWidth;
  P.qA = Mat{l.q, ldq, l.qk};
  P.kA = Mat{l.kv, ldkv, l.kvWidth};
  P.v = Mat{offsetBy(l.kv, l.nope), ldkv, l.kvWidth};
  P.scale = static_cast<float>(l.scale);
  if (!l.spec || l.rope == 0) {
    P.qB = Mat{offsetBy(l.q, l.nope), ldq, l.qk};
    P.kB = Mat{l.kr, l.rope, 0};
    return P;
  }
  consts = ropeConsts(ctx, *l.spec);
  // bf16 where dense attention's tensor-core path may take the launch (it reads bf16 only),
  // else f32: the general kernels keep the rotation's f32 values.
  const int bf16 = !sparse && l.q.bf16 && l.kv.bf16 && flashHeadDims(P.dA, P.dB, P.dv) ? 1 : 0;
  const size_t size = bf16 ? 2 : 4;
  FloatOut qPe{scratch.bytes(static_cast<size_t>(l.tokens * l.heads * l.rope) * size), bf16};
  FloatOut kPe{scratch.bytes(static_cast<size_t>(l.tokens * l.rope) * size), bf16};
  rotatePartsKernel<<<static_cast<unsigned>(l.tokens), kRopeThreads, 0, streamOf(ctx)>>>(
      l.q, l.kr, l.positions, qPe, kPe, P.H, l.qk, l.nope, consts);
  checkLaunch(ctx, "mla (rope)");
  P.qB = Mat{FloatIn{qPe.p, bf16}, l.heads * l.rope, l.rope};
  P.kB = Mat{FloatIn{kPe.p, bf16}, l.rope, 0};
  return P;
}

void mlaForward(KernelContext &ctx, bool sparse) {
  checkInputCount(ctx, sparse);
  MlaLaunch l = readMla(ctx, sparse);
  if (ctx.outputs.size() != 1 && ctx.outputs.size() != 2)
    ctx.fail("expected 1 or 2 outputs (result[, logsumexp]), got " + std::to_string(ctx.outputs.size()));
  int64_t ldo = l.heads * l.vDim;
  FloatOut out = floatOut(ctx, ctx.out(0), "result", {l.tokens, ldo});
  Scratch scratch(ctx);
  RopeConsts consts{};
  AttnParams P = paramsOf(ctx, l, scratch, consts, sparse);
  P.out = OutMat{out, ldo, l.vDim};
  if (ctx.outputs.size() == 2)
    P.lseOut = static_cast<float *>(f32Statistics(ctx, ctx.out(1), l.tokens, l.heads).p);
  if (!sparse) {
    denseForward(ctx, P);
    return;
  }
  SparseSel S = prepareSparse(ctx, scratch, l.indices, l.tokens, l.topk, l.seqs.length,
                              /*transpose=*/false);
  sparseForward(ctx, P, S);
}

void mlaBackward(KernelContext &ctx, bool sparse) {
  size_t operands = backwardOperands(ctx, sparse ? 5 : 4, sparse ? 5 : 4);
  MlaLaunch l = readMla(ctx, sparse);
  int64_t ldo = l.heads * l.vDim, ldkv = l.heads * l.kvWidth, ldq = l.heads * l.qk;
  FloatIn gradOut = checkBackward(ctx, operands, {Query, KeyRope, KeyValue}, l.tokens, ldo);
  if (!gradOut.p)
    return;
  FloatOut dq = gradFor(ctx, Query), dkr = gradFor(ctx, KeyRope), dkv = gradFor(ctx, KeyValue);
  if (!dq.p && !dkr.p && !dkv.p)
    return;
  Scratch scratch(ctx);
  RopeConsts consts{};
  AttnParams P = paramsOf(ctx, l, scratch, consts, sparse);
  const bool rotated = l.spec && l.rope > 0;
  P.dO = Mat{gradOut, ldo, l.vDim};
  // The forward's result and logsumexp, when the plan saved them (backward_segments[1] = 2).
  if (ctx.has("backward_segments") && ctx.attrInts("backward_segments").at(1) == 2) {
    P.savedO = Mat{floatIn(ctx, ctx.in(operands), "saved result", {l.tokens, ldo}), ldo, l.vDim};
    P.savedLse = static_cast<const float *>(f32Statistics(ctx, ctx.in(operands + 1), l.tokens, l.heads).p);
  }
  float *dqPe = nullptr, *dkPeHeads = nullptr;
  if (dq.p) {
    P.dqA = OutMat{dq, ldq, l.qk};
    if (rotated) {
      dqPe = scratch.floats(l.tokens * l.heads * l.rope);
      P.dqB = OutMat{f32Out(dqPe), l.heads * l.rope, l.rope};
    } else
      P.dqB = OutMat{offsetBy(dq, l.nope), ldq, l.qk};
  }
  if (dkv.p) {
    P.dkA = OutMat{dkv, ldkv, l.kvWidth};
    P.dV = OutMat{offsetBy(dkv, l.nope), ldkv, l.kvWidth};
  }
  if (dkr.p && l.rope > 0) {
    dkPeHeads = scratch.floats(l.tokens * l.heads * l.rope);
    P.dkB = OutMat{f32Out(dkPeHeads), l.heads * l.rope, l.rope};
  }
  if (sparse) {
    SparseSel S = prepareSparse(ctx, scratch, l.indices, l.tokens, l.topk, l.seqs.length,
                                /*transpose=*/P.dkA.t.p || P.dkB.t.p || P.dV.t.p);
    sparseBackward(ctx, P, S, scratch);
  } else {
    denseBackward(ctx, P, scratch, FloatOut{});
  }
  if (dqPe || dkPeHeads) {
    gatherPartsKernel<<<static_cast<unsigned>(l.tokens), kRopeThreads, 0, streamOf(ctx)>>>(
        dqPe, dkPeHeads, l.positions, dq, dkr, P.H, l.qk, l.nope, static_cast<int>(l.rope),
        consts, rotated ? 1 : 0);
    checkLaunch(ctx, "mla backward (rope)");
  }
}

} // namespace

void registerMlaKernels(KernelRegistry &registry) {
  registry.add("mla", [](KernelContext &ctx) { mlaForward(ctx, false); });
  registry.add("mla.backward", [](KernelContext &ctx) { mlaBackward(ctx, false); });
  registry.add("sparse_attention", [](KernelContext &ctx) { mlaForward(ctx, true); });
  registry.add("sparse_attention.backward", [](KernelContext &ctx) { mlaBackward(ctx, true); });
}

} // namespace moec::runtime::cuda::attention
