//===- Router.cpp - top-k expert selection and its backward ---------------===//
//
// Follows transformers 5.17 (the golden reference), in f32 like it:
//  - softmax (Qwen3-MoE, Qwen3-Next, Mixtral, OLMoE; Qwen3MoeTopKRouter):
//    p = softmax(l) over all experts, top-k of p, w = v / Σv iff norm_topk_prob.
//  - sigmoid (DeepSeek-V3/V3.2, Kimi, Nemotron-H; DeepseekV3TopkRouter):
//    s = σ(l), choice = s + correction_bias; groups score as the sum of their
//    two best choice values, the topk_group best groups are kept and the other
//    groups' experts masked with -inf; top-k of choice; w = s (unbiased),
//    w / (Σw + 1e-20) iff norm_topk_prob. transformers up to PR #45441 (April
//    2026) filled masked groups with 0.0, which lets a dropped group's expert
//    beat a kept one with a negative biased score; 5.17 fills -inf, as the
//    official DeepSeek Gate does, and so do we.
//  - topk_softmax (gpt-oss; GptOssTopKRouter): top-k of l, softmax over the k.
// Then w *= scaling. l = W x (+ logit_bias). The k experts are ordered by their
// selection value, best first (torch.topk's sorted order); exact ties go to
// the lower expert (or group) index. torch.topk leaves the order among exact
// ties unspecified and transformers asks for sorted=False in the sigmoid
// router; the slot order changes nothing downstream (combine sums the slots).
//
// Backward: the routing is fixed by the forward's indices (never re-selected);
// the gradient flows through the selected experts' weights into l, then into
// x, W and logit_bias. correction_bias only steers the selection: no gradient.
//
//===----------------------------------------------------------------------===//

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "runtime/kernels/cpu/Gemm.h"
#include "runtime/kernels/cpu/routing/Routing.h"

namespace moec::runtime::cpu::routing {

namespace {

enum Operand { Input, Weight, LogitBias, CorrectionBias, NumOperands };
enum class Scoring { Softmax, Sigmoid, TopkSoftmax };

struct Router {
  int64_t tokens = 0, features = 0, experts = 0, topK = 0, groups = 1, keepGroups = 1;
  Scoring scoring = Scoring::Softmax;
  bool normalize = false;
  double scaling = 1.0;
  const float *x = nullptr, *w = nullptr, *logitBias = nullptr, *correction = nullptr;
};

OperandGroups routerOperands(const KernelContext &ctx) {
  return operandGroups(ctx, {false, false, true, true});
}

Router parseRouter(const KernelContext &ctx, const OperandGroups &ops) {
  Router r;
  const TensorRef &x = *ops.get(ctx, Input), &w = *ops.get(ctx, Weight);
  expectF32(ctx, x, "input");
  expectF32(ctx, w, "weight");
  ctx.expectShape(x, "input", {-1, -1});
  r.tokens = x.dim(0);
  r.features = x.dim(1);
  ctx.expectShape(w, "weight", {-1, r.features});
  r.experts = w.dim(0);
  r.x = x.f32();
  r.w = w.f32();
  auto bias = [&](Operand group, const char *what) -> const float * {
    const TensorRef *b = ops.get(ctx, group);
    if (!b)
      return nullptr;
    expectF32(ctx, *b, what);
    if (b->numel() != r.experts)
      ctx.fail(std::string(what) + " has " + std::to_string(b->numel()) + " elements, expected " +
               std::to_string(r.experts) + " (one per expert)");
    return b->f32();
  };
  r.logitBias = bias(LogitBias, "logit_bias");
  r.correction = bias(CorrectionBias, "correction_bias");

  std::string scoring = ctx.attrString("scoring");
  if (scoring == "softmax")
    r.scoring = Scoring::Softmax;
  else if (scoring == "sigmoid")
    r.scoring = Scoring::Sigmoid;
  else if (scoring == "topk_softmax")
    r.scoring = Scoring::TopkSoftmax;
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
  if (r.scoring != Scoring::Sigmoid && (r.groups != 1 || r.correction))
    ctx.fail("group-limited selection and correction_bias need sigmoid scoring");
  return r;
}

/// l [T, E] = x Wᵀ (+ logit_bias), f32 like transformers' F.linear in f32.
std::vector<float> routerLogits(const KernelContext &ctx, const Router &r) {
  std::vector<float> l(r.tokens * r.experts);
  gemm(false, true, r.tokens, r.experts, r.features, 1.0f, r.x, r.features, r.w, r.features, 0.0f,
       l.data(), r.experts);
  if (r.logitBias)
    ctx.parallelFor(r.tokens, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t)
        for (int64_t e = 0; e < r.experts; ++e)
          l[t * r.experts + e] += r.logitBias[e];
    });
  return l;
}

/// One token's scores (what the weights are made of: p, σ(l) or l) and the
/// values the experts are selected by (p, σ(l) + correction bias, or l).
void scoreToken(const Router &r, const float *l, float *score, float *choice) {
  switch (r.scoring) {
  case Scoring::Softmax: {
    float top = *std::max_element(l, l + r.experts);
    double sum = 0;
    for (int64_t e = 0; e < r.experts; ++e)
      sum += std::exp(static_cast<double>(l[e]) - top);
    for (int64_t e = 0; e < r.experts; ++e)
      score[e] = choice[e] = static_cast<float>(std::exp(static_cast<double>(l[e]) - top) / sum);
    break;
  }
  case Scoring::Sigmoid:
    for (int64_t e = 0; e < r.experts; ++e) {
      score[e] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(l[e]))));
      choice[e] = r.correction ? score[e] + r.correction[e] : score[e];
    }
    break;
  case Scoring::TopkSoftmax:
    std::copy(l, l + r.experts, score);
    std::copy(l, l + r.experts, choice);
    break;
  }
}

/// The k best experts by `choice` (best first, ties to the lower index),
/// within the topk_group best groups when the experts are grouped.
void selectExperts(const Router &r, const float *choice, int32_t *chosen,
                   std::vector<int32_t> &candidates) {
  candidates.clear();
  if (r.groups == 1) {
    for (int64_t e = 0; e < r.experts; ++e)
      candidates.push_back(static_cast<int32_t>(e));
  } else {
    int64_t perGroup = r.experts / r.groups;
    std::vector<float> groupScore(r.groups);
    std::vector<int32_t> order(r.groups);
    for (int64_t g = 0; g < r.groups; ++g) {
      const float *c = choice + g * perGroup;
      float best = std::max(c[0], c[1]), second = std::min(c[0], c[1]);
      for (int64_t i = 2; i < perGroup; ++i) {
        if (c[i] > best) {
          second = best;
          best = c[i];
        } else if (c[i] > second) {
          second = c[i];
        }
      }
      groupScore[g] = best + second;
      order[g] = static_cast<int32_t>(g);
    }
    std::partial_sort(
        order.begin(), order.begin() + r.keepGroups, order.end(), [&](int32_t a, int32_t b) {
          return groupScore[a] > groupScore[b] || (groupScore[a] == groupScore[b] && a < b);
        });
    // Experts of dropped groups are out of the running (the -inf fill).
    for (int64_t i = 0; i < r.keepGroups; ++i)
      for (int64_t e = order[i] * perGroup; e < (order[i] + 1) * perGroup; ++e)
        candidates.push_back(static_cast<int32_t>(e));
  }
  std::partial_sort(candidates.begin(), candidates.begin() + r.topK, candidates.end(),
                    [&](int32_t a, int32_t b) {
                      return choice[a] > choice[b] || (choice[a] == choice[b] && a < b);
                    });
  std::copy(candidates.begin(), candidates.begin() + r.topK, chosen);
}

/// The k routed values before normalisation: the chosen experts' scores, or
/// for topk_softmax the softmax over the chosen logits.
void routedValues(const Router &r, const float *score, const int32_t *chosen, double *v) {
  for (int64_t j = 0; j < r.topK; ++j)
    v[j] = score[chosen[j]];
  if (r.scoring != Scoring::TopkSoftmax)
    return;
  double top = *std::max_element(v, v + r.topK), sum = 0;
  for (int64_t j = 0; j < r.topK; ++j)
    sum += v[j] = std::exp(v[j] - top);
  for (int64_t j = 0; j < r.topK; ++j)
    v[j] /= sum;
}

/// Σv as the renormalisation divides by it: transformers adds 1e-20 in the
/// sigmoid routers (DeepseekV3TopkRouter), not in the softmax ones.
double normaliser(const Router &r, const double *v) {
  double sum = 0;
  for (int64_t j = 0; j < r.topK; ++j)
    sum += v[j];
  return r.scoring == Scoring::Sigmoid ? sum + 1e-20 : sum;
}

void expectResult(const KernelContext &ctx, const Router &r, const TensorRef &t, const char *what,
                  plan::DType dtype, const char *dtypeName) {
  if (t.dtype != dtype)
    ctx.fail(std::string(what) + " must be " + dtypeName);
  ctx.expectShape(t, what, {r.tokens, r.topK});
}

} // namespace

void routerForward(KernelContext &ctx) {
  OperandGroups ops = routerOperands(ctx);
  Router r = parseRouter(ctx, ops);
  if (ctx.outputs.size() != 2)
    ctx.fail("expected 2 outputs (weights, indices), got " + std::to_string(ctx.outputs.size()));
  expectResult(ctx, r, ctx.out(0), "weights", plan::F32, "f32");
  expectResult(ctx, r, ctx.out(1), "indices", plan::I32, "i32");
  float *weights = ctx.out(0).f32();
  int32_t *indices = ctx.out(1).i32();
  std::vector<float> l = routerLogits(ctx, r);
  ctx.parallelFor(r.tokens, [&](int64_t begin, int64_t end) {
    std::vector<float> score(r.experts), choice(r.experts);
    std::vector<int32_t> candidates;
    std::vector<double> v(r.topK);
    for (int64_t t = begin; t < end; ++t) {
      int32_t *chosen = indices + t * r.topK;
      scoreToken(r, l.data() + t * r.experts, score.data(), choice.data());
      selectExperts(r, choice.data(), chosen, candidates);
      routedValues(r, score.data(), chosen, v.data());
      double divide = r.normalize ? normaliser(r, v.data()) : 1.0;
      for (int64_t j = 0; j < r.topK; ++j)
        weights[t * r.topK + j] = static_cast<float>(v[j] / divide * r.scaling);
    }
  });
}

void routerBackward(KernelContext &ctx) {
  OperandGroups ops = routerOperands(ctx);
  Router r = parseRouter(ctx, ops);
  std::vector<int64_t> segments = ctx.attrInts("backward_segments");
  if (segments.size() != 3 || segments[1] != 2)
    ctx.fail("router.backward needs the forward results (weights, indices): backward_segments "
             "must be [operands, 2, output grads]");
  const TensorRef &indices = ctx.in(ops.present + 1);
  if (indices.dtype != plan::I32 && indices.dtype != plan::I64)
    ctx.fail("indices must be i32 or i64");
  ctx.expectShape(indices, "indices", {r.tokens, r.topK});
  for (int64_t i = 0; i < indices.numel(); ++i)
    if (indices.index(i) < 0 || indices.index(i) >= r.experts)
      ctx.fail("expert index " + std::to_string(indices.index(i)) + " is outside [0, " +
               std::to_string(r.experts) + ")");
  std::vector<float *> grads = gradOutputs(
      ctx, ops.present,
      {{ops.input[CorrectionBias], "correction_bias is a frozen buffer that only steers the "
                                   "selection"}});
  const TensorRef *dWeights = resultGrad(ctx, 0);
  if (!dWeights)
    return; // the indices carry no gradient: all zero
  expectResult(ctx, r, *dWeights, "gradient of weights", plan::F32, "f32");
  const float *dw = dWeights->f32();

  std::vector<float> l = routerLogits(ctx, r);
  std::vector<float> dl(r.tokens * r.experts, 0.0f);
  ctx.parallelFor(r.tokens, [&](int64_t begin, int64_t end) {
    std::vector<float> score(r.experts), choice(r.experts);
    std::vector<int32_t> chosen(r.topK);
    std::vector<double> v(r.topK), dv(r.topK), dScore(r.experts);
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t j = 0; j < r.topK; ++j)
        chosen[j] = static_cast<int32_t>(indices.index(t * r.topK + j));
      scoreToken(r, l.data() + t * r.experts, score.data(), choice.data());
      routedValues(r, score.data(), chosen.data(), v.data());
      // w = scaling * v / S (S = normaliser) or scaling * v.
      const float *g = dw + t * r.topK;
      if (r.normalize) {
        double sum = normaliser(r, v.data()), dot = 0;
        for (int64_t j = 0; j < r.topK; ++j)
          dot += g[j] * v[j];
        for (int64_t j = 0; j < r.topK; ++j)
          dv[j] = r.scaling / sum * (g[j] - dot / sum);
      } else {
        for (int64_t j = 0; j < r.topK; ++j)
          dv[j] = r.scaling * g[j];
      }
      float *dlt = dl.data() + t * r.experts;
      switch (r.scoring) {
      case Scoring::Softmax: { // dl = p ⊙ (dp - Σ p dp)
        std::fill(dScore.begin(), dScore.end(), 0.0);
        for (int64_t j = 0; j < r.topK; ++j)
          dScore[chosen[j]] += dv[j];
        double dot = 0;
        for (int64_t e = 0; e < r.experts; ++e)
          dot += score[e] * dScore[e];
        for (int64_t e = 0; e < r.experts; ++e)
          dlt[e] = static_cast<float>(score[e] * (dScore[e] - dot));
        break;
      }
      case Scoring::Sigmoid: // ds/dl = s (1 - s)
        for (int64_t j = 0; j < r.topK; ++j) {
          double s = score[chosen[j]];
          dlt[chosen[j]] += static_cast<float>(dv[j] * s * (1.0 - s));
        }
        break;
      case Scoring::TopkSoftmax: { // softmax over the k chosen logits
        double dot = 0;
        for (int64_t j = 0; j < r.topK; ++j)
          dot += v[j] * dv[j];
        for (int64_t j = 0; j < r.topK; ++j)
          dlt[chosen[j]] += static_cast<float>(v[j] * (dv[j] - dot));
        break;
      }
      }
    }
  });

  if (float *dx = grads[ops.input[Input]])
    gemm(false, false, r.tokens, r.features, r.experts, 1.0f, dl.data(), r.experts, r.w, r.features,
         0.0f, dx, r.features);
  if (float *dW = grads[ops.input[Weight]])
    gemm(true, false, r.experts, r.features, r.tokens, 1.0f, dl.data(), r.experts, r.x, r.features,
         0.0f, dW, r.features);
  if (ops.has(LogitBias))
    if (float *db = grads[ops.input[LogitBias]])
      ctx.parallelFor(r.experts, [&](int64_t begin, int64_t end) {
        for (int64_t e = begin; e < end; ++e) {
          double sum = 0;
          for (int64_t t = 0; t < r.tokens; ++t)
            sum += dl[t * r.experts + e];
          db[e] = static_cast<float>(sum);
        }
      });
}

} // namespace moec::runtime::cpu::routing
