//===- RoutingTestUtil.cpp - naive references for the routing tests -------===//

#include "runtime/kernels/cpu/routing/RoutingTestUtil.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "runtime/kernels/cpu/CpuKernels.h"

namespace moec::runtime::cpu::routing::testing {

using moec::runtime::testing::floatTensor;
using moec::runtime::testing::indexTensor;
using moec::runtime::testing::randomTensor;

const KernelRegistry &registry() {
  static const KernelRegistry kernels = [] {
    KernelRegistry r;
    registerRoutingKernels(r);
    return r;
  }();
  return kernels;
}

Values randomValues(int64_t n, uint64_t seed, double scale) {
  return valuesOf(randomTensor({n}, seed, static_cast<float>(scale)));
}

OwnedTensor tensorOf(std::vector<int64_t> shape, const Values &values) {
  return floatTensor(std::move(shape), std::vector<float>(values.begin(), values.end()));
}

Values valuesOf(const OwnedTensor &t) {
  std::vector<float> f = t.floats();
  return Values(f.begin(), f.end());
}

double relativeError(const std::vector<float> &a, const Values &b) {
  if (a.size() != b.size())
    return 1e30;
  double worst = 0, scale = 1;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return worst / scale;
}

Routing naiveRoute(const RouterCase &c, const std::vector<int64_t> *fixed) {
  Routing out;
  int64_t perGroup = c.experts / c.groups;
  for (int64_t t = 0; t < c.tokens; ++t) {
    Values l(c.experts), score(c.experts), choice(c.experts);
    for (int64_t e = 0; e < c.experts; ++e) {
      l[e] = c.logitBias.empty() ? 0.0 : c.logitBias[e];
      for (int64_t d = 0; d < c.features; ++d)
        l[e] += c.x[t * c.features + d] * c.w[e * c.features + d];
    }
    if (c.scoring == "softmax") {
      double top = *std::max_element(l.begin(), l.end()), sum = 0;
      for (int64_t e = 0; e < c.experts; ++e)
        sum += std::exp(l[e] - top);
      for (int64_t e = 0; e < c.experts; ++e)
        score[e] = std::exp(l[e] - top) / sum;
    } else if (c.scoring == "sigmoid") {
      for (int64_t e = 0; e < c.experts; ++e)
        score[e] = 1 / (1 + std::exp(-l[e]));
    } else {
      score = l;
    }
    for (int64_t e = 0; e < c.experts; ++e)
      choice[e] = score[e] + (c.correction.empty() ? 0.0 : c.correction[e]);
    // Gaps are measured where the inputs move them: logits for the softmaxes.
    const Values &gapIn = c.scoring == "sigmoid" ? choice : l;
    auto better = [&](int64_t a, int64_t b) {
      return choice[a] > choice[b] || (choice[a] == choice[b] && a < b);
    };

    std::vector<int64_t> candidates;
    if (c.groups > 1) {
      Values groupScore(c.groups), groupGapIn(c.groups);
      for (int64_t g = 0; g < c.groups; ++g) {
        Values members(choice.begin() + g * perGroup, choice.begin() + (g + 1) * perGroup);
        Values gaps(gapIn.begin() + g * perGroup, gapIn.begin() + (g + 1) * perGroup);
        std::sort(members.rbegin(), members.rend());
        std::sort(gaps.rbegin(), gaps.rend());
        groupScore[g] = members[0] + members[1];
        groupGapIn[g] = gaps[0] + gaps[1];
      }
      std::vector<int64_t> order(c.groups);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t a, int64_t b) { return groupScore[a] > groupScore[b]; });
      if (c.keepGroups < c.groups)
        out.margin = std::min(out.margin, groupGapIn[order[c.keepGroups - 1]] -
                                              groupGapIn[order[c.keepGroups]]);
      for (int64_t g = 0; g < c.groups; ++g)
        if (std::find(order.begin(), order.begin() + c.keepGroups, g) !=
            order.begin() + c.keepGroups)
          for (int64_t e = g * perGroup; e < (g + 1) * perGroup; ++e)
            candidates.push_back(e);
    } else {
      for (int64_t e = 0; e < c.experts; ++e)
        candidates.push_back(e);
    }
    std::sort(candidates.begin(), candidates.end(), better);
    for (int64_t j = 0; j + 1 < static_cast<int64_t>(candidates.size()) && j < c.topK; ++j)
      out.margin = std::min(out.margin, gapIn[candidates[j]] - gapIn[candidates[j + 1]]);

    std::vector<int64_t> chosen(candidates.begin(), candidates.begin() + c.topK);
    if (fixed)
      chosen.assign(fixed->begin() + t * c.topK, fixed->begin() + (t + 1) * c.topK);
    Values v(c.topK);
    for (int64_t j = 0; j < c.topK; ++j)
      v[j] = score[chosen[j]];
    if (c.scoring == "topk_softmax") {
      double top = *std::max_element(v.begin(), v.end()), sum = 0;
      for (double &x : v)
        sum += x = std::exp(x - top);
      for (double &x : v)
        x /= sum;
    }
    double sum = std::accumulate(v.begin(), v.end(), 0.0);
    if (c.scoring == "sigmoid")
      sum += 1e-20;
    for (int64_t j = 0; j < c.topK; ++j) {
      out.indices.push_back(chosen[j]);
      out.weights.push_back((c.normalize ? v[j] / sum : v[j]) * c.scaling);
    }
  }
  return out;
}

KernelCall routerCall(const RouterCase &c) {
  KernelCall call(registry(), "router");
  call.input(tensorOf({c.tokens, c.features}, c.x)).input(tensorOf({c.experts, c.features}, c.w));
  if (!c.logitBias.empty())
    call.input(tensorOf({c.experts}, c.logitBias));
  if (!c.correction.empty())
    call.input(tensorOf({c.experts}, c.correction));
  call.attr("operand_segments",
            std::vector<int64_t>{1, 1, c.logitBias.empty() ? 0 : 1, c.correction.empty() ? 0 : 1})
      .attr("top_k", c.topK)
      .attr("scoring", c.scoring)
      .attr("n_group", c.groups)
      .attr("topk_group", c.keepGroups)
      .attr("scaling", c.scaling);
  if (c.normalize)
    call.attr("norm_topk_prob", true);
  call.output(plan::F32, {c.tokens, c.topK}).output(plan::I32, {c.tokens, c.topK});
  return call;
}

int64_t ExpertCase::rows() const {
  return std::accumulate(counts.begin(), counts.end(), int64_t(0)) + padding;
}

namespace {

/// Projection `w` of expert e applied to `in` (length `inSize`), `out` outputs.
Values naiveProject(const ExpertCase &c, const Values &w, int64_t e, const double *in,
                    int64_t inSize, int64_t outSize) {
  Values y(outSize, 0.0);
  for (int64_t o = 0; o < outSize; ++o)
    for (int64_t i = 0; i < inSize; ++i)
      y[o] += in[i] * (c.inOutLayout ? w[(e * inSize + i) * outSize + o]
                                     : w[(e * outSize + o) * inSize + i]);
  return y;
}

void naiveLora(const ExpertCase &c, const Values &a, const Values &b, int64_t e, const double *in,
               int64_t inSize, Values &y) {
  if (a.empty())
    return;
  int64_t outSize = static_cast<int64_t>(y.size());
  Values z(c.rank, 0.0);
  for (int64_t r = 0; r < c.rank; ++r)
    for (int64_t i = 0; i < inSize; ++i)
      z[r] += a[(e * c.rank + r) * inSize + i] * in[i];
  for (int64_t o = 0; o < outSize; ++o)
    for (int64_t r = 0; r < c.rank; ++r)
      y[o] += c.loraScale * b[(e * outSize + o) * c.rank + r] * z[r];
}

double sigmoid(double v) { return 1 / (1 + std::exp(-v)); }

} // namespace

Values naiveExpertRow(const ExpertCase &c, int64_t e, const double *row) {
  int64_t d = c.features, n = c.inter;
  Values p = naiveProject(c, c.up, e, row, d, c.upOut());
  if (!c.upBias.empty())
    for (int64_t o = 0; o < c.upOut(); ++o)
      p[o] += c.upBias[e * c.upOut() + o];
  naiveLora(c, c.upA, c.upB, e, row, d, p);
  Values gate, up = p;
  if (c.fusedGateUp) { // interleaved: gate = 0::2, up = 1::2
    gate.resize(n);
    up.resize(n);
    for (int64_t i = 0; i < n; ++i) {
      gate[i] = p[2 * i];
      up[i] = p[2 * i + 1];
    }
  } else if (!c.gate.empty()) {
    gate = naiveProject(c, c.gate, e, row, d, n);
    naiveLora(c, c.gateA, c.gateB, e, row, d, gate);
  }
  Values h(n);
  for (int64_t i = 0; i < n; ++i) {
    auto f = [&](double v) {
      return c.activation == "silu" ? v * sigmoid(v) : std::pow(std::max(v, 0.0), 2);
    };
    if (c.activation == "clamped_swiglu") {
      double g = std::min(gate[i], c.limit), u = std::clamp(up[i], -c.limit, c.limit);
      h[i] = (u + 1) * g * sigmoid(1.702 * g);
    } else {
      h[i] = gate.empty() ? f(up[i]) : f(gate[i]) * up[i];
    }
  }
  Values y = naiveProject(c, c.down, e, h.data(), n, d);
  if (!c.downBias.empty())
    for (int64_t o = 0; o < d; ++o)
      y[o] += c.downBias[e * d + o];
  naiveLora(c, c.downA, c.downB, e, h.data(), n, y);
  return y;
}

Values naiveExperts(const ExpertCase &c) {
  Values out;
  int64_t row = 0;
  for (int64_t e = 0; e < c.experts; ++e)
    for (int64_t i = 0; i < c.counts[e]; ++i, ++row) {
      Values y = naiveExpertRow(c, e, c.x.data() + row * c.features);
      out.insert(out.end(), y.begin(), y.end());
    }
  out.resize(out.size() + c.padding * c.features, 0.0);
  return out;
}

KernelCall expertCall(const ExpertCase &c, std::vector<int64_t> *operands) {
  KernelCall call(registry(), "expert_mlp");
  int64_t d = c.features, n = c.inter, e = c.experts, r = c.rank;
  auto layout = [&](int64_t out, int64_t in) {
    return c.inOutLayout ? std::vector<int64_t>{e, in, out} : std::vector<int64_t>{e, out, in};
  };
  struct Group {
    const Values *values;
    std::vector<int64_t> shape;
  };
  std::vector<Group> groups = {
      {&c.x, {c.rows(), d}},   {nullptr, {e}},          {&c.up, layout(c.upOut(), d)},
      {&c.down, layout(d, n)}, {&c.gate, layout(n, d)}, {&c.upBias, {e, c.upOut()}},
      {&c.downBias, {e, d}},   {&c.gateA, {e, r, d}},   {&c.gateB, {e, n, r}},
      {&c.upA, {e, r, d}},     {&c.upB, {e, n, r}},     {&c.downA, {e, r, n}},
      {&c.downB, {e, d, r}}};
  std::vector<int64_t> segments;
  int64_t next = 0;
  if (operands)
    operands->clear();
  for (const Group &g : groups) {
    bool present = !g.values || !g.values->empty();
    segments.push_back(present ? 1 : 0);
    if (operands)
      operands->push_back(present ? next : -1);
    if (!present)
      continue;
    ++next;
    call.input(g.values ? tensorOf(g.shape, *g.values) : indexTensor(plan::I64, g.shape, c.counts));
  }
  call.attr("operand_segments", segments).attr("activation", c.activation);
  if (c.fusedGateUp)
    call.attr("fused_gate_up", true);
  if (c.inOutLayout)
    call.attr("in_out_layout", true);
  if (c.activation == "clamped_swiglu")
    call.attr("limit", c.limit);
  if (!c.gateA.empty() || !c.upA.empty() || !c.downA.empty())
    call.attr("lora_scale", c.loraScale);
  call.output(plan::F32, {c.rows(), d});
  return call;
}

std::vector<std::vector<float>> runBackward(KernelCall &forward, const std::vector<int64_t> &wrt,
                                            const std::vector<int64_t> &outputsWithGrad,
                                            const std::vector<OwnedTensor> &outputGrads,
                                            bool withResults, const std::vector<OwnedTensor> &saved) {
  KernelCall backward(registry(), forward.kernelName() + ".backward");
  backward.attributes() = forward.attributes();
  backward.attr("grad_of_inputs", wrt).attr("grad_of_outputs", outputsWithGrad);
  for (OwnedTensor &t : forward.inputsRef())
    backward.input(t);
  int64_t results = static_cast<int64_t>(saved.size());
  for (const OwnedTensor &t : saved)
    backward.input(t);
  if (withResults && saved.empty())
    for (;; ++results) {
      try {
        backward.input(forward.result(results));
      } catch (const std::out_of_range &) {
        break;
      }
    }
  for (const OwnedTensor &g : outputGrads)
    backward.input(g);
  backward.attr("backward_segments",
                std::vector<int64_t>{static_cast<int64_t>(forward.inputsRef().size()), results,
                                     static_cast<int64_t>(outputGrads.size())});
  for (int64_t i : wrt)
    backward.output(plan::F32, forward.inputsRef().at(i).shape);
  backward.run();
  std::vector<std::vector<float>> grads;
  for (size_t i = 0; i < wrt.size(); ++i)
    grads.push_back(backward.result(i).floats());
  return grads;
}

Values numericGradient(Values &p, const std::function<double()> &f, double h) {
  Values grad(p.size());
  for (size_t i = 0; i < p.size(); ++i) {
    double keep = p[i];
    p[i] = keep + h;
    double plus = f();
    p[i] = keep - h;
    double minus = f();
    p[i] = keep;
    grad[i] = (plus - minus) / (2 * h);
  }
  return grad;
}

} // namespace moec::runtime::cpu::routing::testing
