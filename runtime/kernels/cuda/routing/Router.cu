//===- Router.cu - top-k expert selection and its backward on the GPU -----===//
//
// The twin of cpu/routing/Router.cpp (read its header for the semantics):
// l = x Wᵀ (+ logit_bias) by cuBLAS in f32, then one thread block per token
// scores its E experts (softmax / sigmoid + correction bias / raw logits),
// drops the groups outside the topk_group best (a group scores as the sum of
// its two best biased scores), and picks the k best by k block-wide arg-max
// passes (ties to the lower index, best first; ungrouped selection of up to
// 32 of 512 experts takes a warp per token instead). Thread 0 then weighs the k
// experts in double exactly as the CPU does (softmax over the k for
// topk_softmax, renormalisation with +1e-20 for sigmoid, scaling).
//
// Backward (routing fixed by the forward's indices): one block per token
// recomputes the scores and writes dl [T, E] (f32 scratch); dx = dl W and
// dW = dlᵀ x by cuBLAS; d logit_bias = column sums of dl (one thread per
// expert, double, deterministic). The indices are not range-checked on the
// host (they live on the device); an out-of-range index is clamped.
//
//===----------------------------------------------------------------------===//

#include <cmath>
#include <string>
#include <vector>

#include "runtime/kernels/cuda/CudaGemm.h"
#include "runtime/kernels/cuda/routing/RoutingCommon.cuh"
#include "runtime/kernels/cuda/routing/RoutingKernels.h"

namespace moec::runtime::cuda::routing {

namespace {

enum Operand { Input, Weight, LogitBias, CorrectionBias, NumOperands };
enum Scoring : int { Softmax = 0, Sigmoid = 1, TopkSoftmax = 2 };

/// What the device needs of the launch.
struct Params {
  int64_t tokens = 0, features = 0, experts = 0, topK = 0, groups = 1, keepGroups = 1;
  int scoring = Softmax;
  bool normalize = false;
  double scaling = 1.0;
  FloatIn logitBias, correction;
};

struct Router {
  Params p;
  const TensorRef *x = nullptr, *w = nullptr;
};

OperandGroups routerOperands(const KernelContext &ctx) {
  return operandGroups(ctx, {false, false, true, true});
}

Router parseRouter(const KernelContext &ctx, const OperandGroups &ops) {
  Router router;
  Params &r = router.p;
  const TensorRef &x = *ops.get(ctx, Input), &w = *ops.get(ctx, Weight);
  expectFloat(ctx, x, "input");
  expectFloat(ctx, w, "weight");
  ctx.expectShape(x, "input", {-1, -1});
  r.tokens = x.dim(0);
  r.features = x.dim(1);
  ctx.expectShape(w, "weight", {-1, r.features});
  r.experts = w.dim(0);
  router.x = &x;
  router.w = &w;
  auto bias = [&](Operand group, const char *what) -> FloatIn {
    const TensorRef *b = ops.get(ctx, group);
    if (!b)
      return {};
    expectFloat(ctx, *b, what);
    if (b->numel() != r.experts)
      ctx.fail(std::string(what) + " has " + std::to_string(b->numel()) + " elements, expected " +
               std::to_string(r.experts) + " (one per expert)");
    return floatIn(*b);
  };
  r.logitBias = bias(LogitBias, "logit_bias");
  r.correction = bias(CorrectionBias, "correction_bias");

  std::string scoring = ctx.attrString("scoring");
  if (scoring == "softmax")
    r.scoring = Softmax;
  else if (scoring == "sigmoid")
    r.scoring = Sigmoid;
  else if (scoring == "topk_softmax")
    r.scoring = TopkSoftmax;
  else
    ctx.fail("unknown scoring '" + scoring + "' (softmax, sigmoid or topk_softmax)");
  r.topK = ctx.attrInt("top_k");
  r.groups = ctx.attrInt("n_group", 1);
  r.keepGroups = ctx.attrInt("topk_group", 1);
  r.normalize = ctx.attrBool("norm_topk_prob");
  r.scaling = ctx.attrFloat("scaling", 1.0);
  if (r.topK < 1 || r.topK > r.experts)
    ctx.fail("top_k (" + std::to_string(r.topK) + ") must be in [1, " + std::to_string(r.experts) +
             "] (the number of experts)");
  if (r.groups < 1 || r.experts % r.groups != 0)
    ctx.fail("n_group (" + std::to_string(r.groups) + ") must divide the " +
             std::to_string(r.experts) + " experts");
  if (r.keepGroups < 1 || r.keepGroups > r.groups)
    ctx.fail("topk_group (" + std::to_string(r.keepGroups) +
             ") must be in [1, n_group = " + std::to_string(r.groups) + "]");
  int64_t perGroup = r.experts / r.groups;
  if (r.groups > 1 && perGroup < 2)
    ctx.fail("group-limited routing scores a group by its two best experts: needs at least 2 "
             "experts per group, got " +
             std::to_string(perGroup));
  if (r.topK > r.keepGroups * perGroup)
    ctx.fail("top_k (" + std::to_string(r.topK) + ") exceeds the " +
             std::to_string(r.keepGroups * perGroup) + " experts of the topk_group best groups");
  if (r.scoring != Sigmoid && (r.groups != 1 || r.correction))
    ctx.fail("group-limited selection and correction_bias need sigmoid scoring");
  return router;
}

void expectResult(const KernelContext &ctx, const Params &r, const TensorRef &t, const char *what,
                  plan::DType dtype, const char *dtypeName) {
  if (t.dtype != dtype)
    ctx.fail(std::string(what) + " must be " + dtypeName);
  ctx.expectShape(t, what, {r.tokens, r.topK});
}

/// l [T, E] (f32) = x Wᵀ; the logit bias is added by the per-token kernels.
/// `holder` keeps W converted to x's storage type when they differ.
DeviceBuffer routerLogits(const KernelContext &ctx, const Router &router, DeviceBuffer &holder,
                          const void **wData) {
  const Params &r = router.p;
  DeviceBuffer l(ctx, plan::F32, r.tokens * r.experts);
  *wData = asDtype(ctx, *router.w, router.x->dtype, holder);
  gemm(ctx, false, true, r.tokens, r.experts, r.features, 1.0f, router.x->data, r.features, *wData,
       r.features, router.x->dtype, 0.0f, l.get(), r.experts, plan::F32);
  return l;
}

/// Dynamic shared memory above 48 KiB needs an opt-in per kernel.
template <typename Kernel> void allowSharedMemory(const KernelContext &ctx, Kernel kernel, size_t bytes) {
  if (bytes <= 48 * 1024)
    return;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(bytes)) != cudaSuccess)
    ctx.fail("router: " + std::to_string(bytes) +
             " bytes of shared memory per token are more than the GPU allows (too many experts)");
}

//===--------------------------------------------------------------------===//
// Device side
//===--------------------------------------------------------------------===//

/// Loads the token's logits (+ logit bias) into lg and its scores into
/// `score`; `choice` (if given) gets the selection values. Ends synchronised.
__device__ void scoreToken(const Params &r, const float *lrow, float *lg, float *score,
                           float *choice, float *fScratch, double *dScratch) {
  int64_t E = r.experts;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x)
    lg[e] = r.logitBias ? lrow[e] + r.logitBias[e] : lrow[e];
  __syncthreads();
  switch (r.scoring) {
  case Softmax: {
    float top = -INFINITY;
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x)
      top = fmaxf(top, lg[e]);
    top = blockReduce(top, MaxOp{}, fScratch);
    double sum = 0;
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x)
      sum += exp(static_cast<double>(lg[e]) - top);
    sum = blockReduce(sum, SumOp{}, dScratch);
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
      float p = static_cast<float>(exp(static_cast<double>(lg[e]) - top) / sum);
      score[e] = p;
      if (choice)
        choice[e] = p;
    }
    break;
  }
  case Sigmoid:
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
      float s = static_cast<float>(1.0 / (1.0 + exp(-static_cast<double>(lg[e]))));
      score[e] = s;
      if (choice)
        choice[e] = r.correction ? __fadd_rn(s, r.correction[e]) : s;
    }
    break;
  default: // TopkSoftmax
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
      score[e] = lg[e];
      if (choice)
        choice[e] = lg[e];
    }
    break;
  }
  __syncthreads();
}

/// v[j] = the score of the j-th chosen expert -> the k routed values before normalisation
/// (softmax over them for topk_softmax), as the CPU computes them.
__device__ void routedSoftmax(const Params &r, double *v) {
  if (r.scoring != TopkSoftmax)
    return;
  double top = v[0], sum = 0;
  for (int64_t j = 1; j < r.topK; ++j)
    top = v[j] > top ? v[j] : top;
  for (int64_t j = 0; j < r.topK; ++j)
    sum += v[j] = exp(v[j] - top);
  for (int64_t j = 0; j < r.topK; ++j)
    v[j] /= sum;
}

__device__ double normaliser(const Params &r, const double *v) {
  double sum = 0;
  for (int64_t j = 0; j < r.topK; ++j)
    sum += v[j];
  return r.scoring == Sigmoid ? sum + 1e-20 : sum;
}

/// Thread 0 of a token: its weights and indices from v[j] = the score of chosen expert j.
__device__ void storeRouted(const Params &r, double *v, const int *chosen, int64_t t, float *weights,
                            int32_t *indices) {
  routedSoftmax(r, v);
  double divide = r.normalize ? normaliser(r, v) : 1.0;
  for (int64_t j = 0; j < r.topK; ++j) {
    weights[t * r.topK + j] = static_cast<float>(v[j] / divide * r.scaling);
    indices[t * r.topK + j] = chosen[j];
  }
}

size_t forwardSharedBytes(const Params &r) {
  return 8 * r.topK + 4 * (3 * r.experts + r.groups) + 4 * r.topK + r.experts + r.groups;
}

/// One block per token: weights [T, k] (f32), indices [T, k] (i32).
__global__ void routerForwardKernel(Params r, const float *logits, float *weights,
                                    int32_t *indices) {
  extern __shared__ double smem[];
  __shared__ float fScratch[32];
  __shared__ double dScratch[32];
  __shared__ Candidate cScratch[32];
  int64_t E = r.experts, K = r.topK, G = r.groups, t = blockIdx.x;
  double *v = smem;
  float *lg = reinterpret_cast<float *>(v + K);
  float *score = lg + E, *choice = score + E, *groupScore = choice + E;
  int *chosen = reinterpret_cast<int *>(groupScore + G);
  unsigned char *valid = reinterpret_cast<unsigned char *>(chosen + K);
  unsigned char *kept = valid + E;

  scoreToken(r, logits + t * E, lg, score, choice, fScratch, dScratch);

  if (G > 1) {
    int64_t perGroup = E / G;
    for (int64_t g = threadIdx.x; g < G; g += blockDim.x) {
      const float *c = choice + g * perGroup;
      float best = c[0] > c[1] ? c[0] : c[1], second = c[0] > c[1] ? c[1] : c[0];
      for (int64_t i = 2; i < perGroup; ++i) {
        if (c[i] > best) {
          second = best;
          best = c[i];
        } else if (c[i] > second) {
          second = c[i];
        }
      }
      groupScore[g] = __fadd_rn(best, second);
      kept[g] = 0;
    }
    __syncthreads();
    if (threadIdx.x == 0) // the topk_group best groups, ties to the lower index
      for (int64_t i = 0; i < r.keepGroups; ++i) {
        int64_t best = -1;
        for (int64_t g = 0; g < G; ++g)
          if (!kept[g] && (best < 0 || groupScore[g] > groupScore[best]))
            best = g;
        if (best >= 0)
          kept[best] = 1;
      }
    __syncthreads();
    // Experts of dropped groups are out of the running (the -inf fill).
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x)
      valid[e] = kept[e / perGroup];
  } else {
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x)
      valid[e] = 1;
  }
  __syncthreads();

  for (int64_t j = 0; j < K; ++j) {
    Candidate mine{0.0f, -1};
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x)
      if (valid[e]) {
        Candidate c{choice[e], static_cast<int>(e)};
        if (better(c, mine))
          mine = c;
      }
    Candidate best = blockBest(mine, cScratch);
    if (threadIdx.x == 0) {
      chosen[j] = best.index < 0 ? 0 : best.index;
      if (best.index >= 0)
        valid[best.index] = 0;
    }
    __syncthreads();
  }

  if (threadIdx.x == 0) {
    for (int64_t j = 0; j < K; ++j)
      v[j] = score[chosen[j]];
    storeRouted(r, v, chosen, t, weights, indices);
  }
}

constexpr int kWarpRouterExperts = 512, kWarpRouterTopK = 32, kRouterWarps = 8;

/// routerForwardKernel for ungrouped selection of at most 32 of at most 512 experts: a warp
/// per token, lane l holding experts l, l + 32, ... in registers, the k best by k warp arg-max
/// passes (no block barriers: the block kernel's 8 block-wide passes a token took 0.45 ms a
/// layer at 16384 tokens of 128 experts). Same scores, choices and weights; only the double
/// sums of the softmax add in another order.
__global__ void __launch_bounds__(32 * kRouterWarps)
    routerForwardWarpKernel(Params r, const float *logits, float *weights, int32_t *indices) {
  __shared__ double values[kRouterWarps][kWarpRouterTopK];
  __shared__ int picked[kRouterWarps][kWarpRouterTopK];
  constexpr int kSlots = kWarpRouterExperts / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, E = static_cast<int>(r.experts);
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouterWarps + warp;
  if (t >= r.tokens) // the whole warp
    return;
  const float *lrow = logits + t * E;
  float score[kSlots], choice[kSlots];
  float top = -INFINITY;
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {
    int e = lane + 32 * i;
    score[i] = e < E ? (r.logitBias ? lrow[e] + r.logitBias[e] : lrow[e]) : 0.0f;
    if (e < E)
      top = fmaxf(top, score[i]);
  }
  if (r.scoring == Softmax) {
    for (int offset = 16; offset > 0; offset >>= 1)
      top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, offset));
    double sum = 0;
#pragma unroll
    for (int i = 0; i < kSlots; ++i)
      if (lane + 32 * i < E)
        sum += exp(static_cast<double>(score[i]) - top);
    for (int offset = 16; offset > 0; offset >>= 1)
      sum += __shfl_xor_sync(0xffffffffu, sum, offset);
#pragma unroll
    for (int i = 0; i < kSlots; ++i)
      choice[i] = score[i] = static_cast<float>(exp(static_cast<double>(score[i]) - top) / sum);
  } else if (r.scoring == Sigmoid) {
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      int e = lane + 32 * i;
      score[i] = static_cast<float>(1.0 / (1.0 + exp(-static_cast<double>(score[i]))));
      choice[i] = r.correction && e < E ? __fadd_rn(score[i], r.correction[e]) : score[i];
    }
  } else {
#pragma unroll
    for (int i = 0; i < kSlots; ++i)
      choice[i] = score[i];
  }
  unsigned taken = 0; // bit i: expert lane + 32 i chosen
  for (int64_t j = 0; j < r.topK; ++j) {
    Candidate mine{0.0f, -1};
    float mineScore = 0.0f;
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      Candidate c{choice[i], lane + 32 * i};
      if (c.index < E && !((taken >> i) & 1) && better(c, mine)) {
        mine = c;
        mineScore = score[i];
      }
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
      Candidate o{__shfl_down_sync(0xffffffffu, mine.value, offset),
                  __shfl_down_sync(0xffffffffu, mine.index, offset)};
      float oScore = __shfl_down_sync(0xffffffffu, mineScore, offset);
      if (better(o, mine)) {
        mine = o;
        mineScore = oScore;
      }
    }
    int best = __shfl_sync(0xffffffffu, mine.index, 0); // lane 0's is the warp's
    if (best >= 0 && best % 32 == lane)
      taken |= 1u << (best / 32);
    if (lane == 0) {
      picked[warp][j] = best < 0 ? 0 : best;
      values[warp][j] = mineScore;
    }
  }
  __syncwarp();
  if (lane == 0)
    storeRouted(r, values[warp], picked[warp], t, weights, indices);
}

size_t backwardSharedBytes(const Params &r) {
  return 16 * r.topK + 8 * r.experts + 12 * r.experts + 4 * r.topK;
}

/// One block per token: dl [T, E] (f32) from the weights' gradient, the
/// routing fixed by `indices`.
__global__ void routerBackwardKernel(Params r, const float *logits, IndexIn indices,
                                     FloatIn dWeights, float *dl) {
  extern __shared__ double smem[];
  __shared__ float fScratch[32];
  __shared__ double dScratch[32];
  int64_t E = r.experts, K = r.topK, t = blockIdx.x;
  double *v = smem, *dv = v + K, *dScore = dv + K;
  float *lg = reinterpret_cast<float *>(dScore + E);
  float *score = lg + E, *dls = score + E;
  int *chosen = reinterpret_cast<int *>(dls + E);

  for (int64_t j = threadIdx.x; j < K; j += blockDim.x) {
    int64_t e = indices[t * K + j];
    chosen[j] = static_cast<int>(e < 0 ? 0 : (e >= E ? E - 1 : e));
  }
  scoreToken(r, logits + t * E, lg, score, nullptr, fScratch, dScratch); // ends synchronised

  if (threadIdx.x == 0) {
    for (int64_t j = 0; j < K; ++j)
      v[j] = score[chosen[j]];
    routedSoftmax(r, v);
    // w = scaling * v / S (S = normaliser) or scaling * v.
    if (r.normalize) {
      double sum = normaliser(r, v), dot = 0;
      for (int64_t j = 0; j < K; ++j)
        dot += dWeights[t * K + j] * v[j];
      for (int64_t j = 0; j < K; ++j)
        dv[j] = r.scaling / sum * (dWeights[t * K + j] - dot / sum);
    } else {
      for (int64_t j = 0; j < K; ++j)
        dv[j] = r.scaling * dWeights[t * K + j];
    }
  }
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    dScore[e] = 0.0;
    dls[e] = 0.0f;
  }
  __syncthreads();

  float *dlt = dl + t * E;
  if (r.scoring == Softmax) { // dl = p ⊙ (dp - Σ p dp)
    if (threadIdx.x == 0)
      for (int64_t j = 0; j < K; ++j)
        dScore[chosen[j]] += dv[j];
    __syncthreads();
    double dot = 0;
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x)
      dot += score[e] * dScore[e];
    dot = blockReduce(dot, SumOp{}, dScratch);
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x)
      dlt[e] = static_cast<float>(score[e] * (dScore[e] - dot));
    return;
  }
  if (threadIdx.x == 0) {
    if (r.scoring == Sigmoid) { // ds/dl = s (1 - s)
      for (int64_t j = 0; j < K; ++j) {
        double s = score[chosen[j]];
        dls[chosen[j]] += static_cast<float>(dv[j] * s * (1.0 - s));
      }
    } else { // topk_softmax: softmax over the k chosen logits
      double dot = 0;
      for (int64_t j = 0; j < K; ++j)
        dot += v[j] * dv[j];
      for (int64_t j = 0; j < K; ++j)
        dls[chosen[j]] += static_cast<float>(v[j] * (dv[j] - dot));
    }
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x)
    dlt[e] = dls[e];
}

/// db[e] = Σ_t dl[t, e] (one thread per expert, in token order, double).
__global__ void columnSumKernel(const float *dl, int64_t tokens, int64_t experts, FloatOut db) {
  int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (e >= experts)
    return;
  double sum = 0;
  for (int64_t t = 0; t < tokens; ++t)
    sum += dl[t * experts + e];
  db.store(e, static_cast<float>(sum));
}

} // namespace

void routerForward(KernelContext &ctx) {
  OperandGroups ops = routerOperands(ctx);
  Router router = parseRouter(ctx, ops);
  const Params &r = router.p;
  if (ctx.outputs.size() != 2)
    ctx.fail("expected 2 outputs (weights, indices), got " + std::to_string(ctx.outputs.size()));
  expectResult(ctx, r, ctx.out(0), "weights", plan::F32, "f32");
  expectResult(ctx, r, ctx.out(1), "indices", plan::I32, "i32");
  if (r.tokens == 0)
    return;
  DeviceBuffer wHolder;
  const void *wData = nullptr;
  DeviceBuffer l = routerLogits(ctx, router, wHolder, &wData);
  if (r.groups == 1 && r.experts <= kWarpRouterExperts && r.topK <= kWarpRouterTopK) {
    routerForwardWarpKernel<<<static_cast<unsigned>((r.tokens + kRouterWarps - 1) / kRouterWarps),
                              32 * kRouterWarps, 0, streamOf(ctx)>>>(r, l.as<float>(), ctx.out(0).f32(),
                                                                     ctx.out(1).i32());
    checkLaunch(ctx, "router");
    return;
  }
  size_t shared = forwardSharedBytes(r);
  allowSharedMemory(ctx, routerForwardKernel, shared);
  routerForwardKernel<<<static_cast<unsigned>(r.tokens), kThreads, shared, streamOf(ctx)>>>(
      r, l.as<float>(), ctx.out(0).f32(), ctx.out(1).i32());
  checkLaunch(ctx, "router");
}

void routerBackward(KernelContext &ctx) {
  OperandGroups ops = routerOperands(ctx);
  Router router = parseRouter(ctx, ops);
  const Params &r = router.p;
  std::vector<int64_t> segments = ctx.attrInts("backward_segments");
  if (segments.size() != 3 || segments[1] != 2)
    ctx.fail("router.backward needs the forward results (weights, indices): backward_segments "
             "must be [operands, 2, output grads]");
  const TensorRef &indices = ctx.in(ops.present + 1);
  if (indices.dtype != plan::I32 && indices.dtype != plan::I64)
    ctx.fail("indices must be i32 or i64");
  ctx.expectShape(indices, "indices", {r.tokens, r.topK});
  std::vector<const TensorRef *> grads = gradOutputs(
      ctx, ops.present,
      {{ops.input[CorrectionBias], "correction_bias is a frozen buffer that only steers the "
                                   "selection"}});
  const TensorRef *dWeights = resultGrad(ctx, 0);
  if (!dWeights)
    return; // the indices carry no gradient: all zero
  ctx.expectShape(*dWeights, "gradient of weights", {r.tokens, r.topK});
  expectFloat(ctx, *dWeights, "gradient of weights");
  if (r.tokens == 0)
    return;

  plan::DType type = router.x->dtype;
  DeviceBuffer wHolder;
  const void *wData = nullptr;
  DeviceBuffer l = routerLogits(ctx, router, wHolder, &wData);
  DeviceBuffer dl(ctx, plan::F32, r.tokens * r.experts);
  size_t shared = backwardSharedBytes(r);
  allowSharedMemory(ctx, routerBackwardKernel, shared);
  routerBackwardKernel<<<static_cast<unsigned>(r.tokens), kThreads, shared, streamOf(ctx)>>>(
      r, l.as<float>(), indexIn(indices), floatIn(*dWeights), dl.as<float>());
  checkLaunch(ctx, "router.backward");

  const TensorRef *dx = grads[ops.input[Input]], *dW = grads[ops.input[Weight]];
  if (dx || dW) {
    DeviceBuffer dlHolder; // dl in the storage type of x and W (cuBLAS operands share one)
    const void *dlData = dl.get();
    if (type != plan::F32) {
      dlHolder = DeviceBuffer(ctx, type, r.tokens * r.experts);
      convertFloats(ctx, dl.get(), plan::F32, dlHolder.get(), type, r.tokens * r.experts);
      dlData = dlHolder.get();
    }
    if (dx) { // dx [T, D] = dl W
      GemmTarget target(ctx, dx, type);
      gemm(ctx, false, false, r.tokens, r.features, r.experts, 1.0f, dlData, r.experts, wData,
           r.features, type, 0.0f, target.data(), r.features, target.dtype());
      target.finish(ctx);
    }
    if (dW) { // dW [E, D] = dlᵀ x
      GemmTarget target(ctx, dW, type);
      gemm(ctx, true, false, r.experts, r.features, r.tokens, 1.0f, dlData, r.experts,
           router.x->data, r.features, type, 0.0f, target.data(), r.features, target.dtype());
      target.finish(ctx);
    }
  }
  if (ops.has(LogitBias))
    if (const TensorRef *db = grads[ops.input[LogitBias]]) {
      columnSumKernel<<<blocksFor(r.experts, kThreads), kThreads, 0, streamOf(ctx)>>>(
          dl.as<float>(), r.tokens, r.experts, floatOut(*db));
      checkLaunch(ctx, "router.backward: logit_bias gradient");
    }
}

} // namespace moec::runtime::cuda::routing
