//===- RoutingChecks.cpp - routing launch checks (CPU and CUDA) -----------===//

#include "runtime/kernels/checks/routing/RoutingChecks.h"

#include <algorithm>
#include <numeric>
#include <string>

namespace moec::runtime::checks::routing {

OperandGroups operandGroups(const KernelContext &ctx, const std::vector<bool> &optional) {
  std::vector<int64_t> segments = ctx.attrInts("operand_segments");
  if (segments.size() != optional.size())
    ctx.fail("operand_segments has " + std::to_string(segments.size()) + " entries, expected " +
             std::to_string(optional.size()));
  OperandGroups groups;
  for (size_t g = 0; g < segments.size(); ++g) {
    if (segments[g] != 0 && segments[g] != 1)
      ctx.fail("operand_segments entry " + std::to_string(g) + " is " +
               std::to_string(segments[g]) + ", expected 0 or 1");
    if (segments[g] == 0 && !optional[g])
      ctx.fail("operand_segments marks required operand " + std::to_string(g) + " absent");
    groups.input.push_back(segments[g] ? groups.present++ : -1);
  }
  if (static_cast<int64_t>(ctx.inputs.size()) < groups.present)
    ctx.fail("operand_segments lists " + std::to_string(groups.present) + " operands, got " +
             std::to_string(ctx.inputs.size()) + " inputs");
  return groups;
}

const TensorRef *resultGrad(const KernelContext &ctx, int64_t result) {
  std::vector<int64_t> segments = ctx.attrInts("backward_segments");
  if (segments.size() != 3)
    ctx.fail("backward_segments must have 3 entries (operands, results, output grads)");
  std::vector<int64_t> of = ctx.attrInts("grad_of_outputs");
  if (static_cast<int64_t>(of.size()) != segments[2])
    ctx.fail("grad_of_outputs lists " + std::to_string(of.size()) +
             " results but backward_segments passes " + std::to_string(segments[2]) + " grads");
  auto it = std::find(of.begin(), of.end(), result);
  if (it == of.end())
    return nullptr;
  return &ctx.in(static_cast<size_t>(segments[0] + segments[1] + (it - of.begin())));
}

std::vector<const TensorRef *>
gradOutputs(const KernelContext &ctx, int64_t numOperands,
            const std::vector<std::pair<int64_t, const char *>> &noGrad, ExpectFloat expectFloat) {
  std::vector<int64_t> of = ctx.gradOfInputs();
  if (of.size() != ctx.outputs.size())
    ctx.fail("grad_of_inputs lists " + std::to_string(of.size()) + " operands but there are " +
             std::to_string(ctx.outputs.size()) + " outputs");
  std::vector<const TensorRef *> grads(numOperands, nullptr);
  for (size_t i = 0; i < of.size(); ++i) {
    if (of[i] < 0 || of[i] >= numOperands)
      ctx.fail("grad_of_inputs names operand " + std::to_string(of[i]) + ", but there are " +
               std::to_string(numOperands));
    for (const auto &[operand, why] : noGrad)
      if (of[i] == operand)
        ctx.fail("no gradient for operand " + std::to_string(operand) + ": " + why);
    const TensorRef &out = ctx.outputs[i];
    expectFloat(ctx, out, "gradient output");
    if (out.numel() != ctx.in(of[i]).numel())
      ctx.fail("gradient output " + std::to_string(i) + " has " + std::to_string(out.numel()) +
               " elements, operand " + std::to_string(of[i]) + " has " +
               std::to_string(ctx.in(of[i]).numel()));
    grads[of[i]] = &out;
  }
  return grads;
}

void expectIndices(const KernelContext &ctx, const TensorRef &t) {
  if (t.dtype != plan::I32 && t.dtype != plan::I64)
    ctx.fail("indices must be i32 or i64");
}

namespace {

void checkPreActivations(const KernelContext &ctx, const TensorRef &pre, const TensorRef &tokens, int64_t inter,
                         bool savable) {
  if (!savable)
    ctx.fail("pre_activations need a separate gate, no up bias and no LoRA on gate or up");
  if (pre.dtype != plan::F32)
    ctx.fail("pre_activations must be f32");
  ctx.expectShape(pre, "pre_activations", {tokens.dim(0), 2 * inter});
}

/// How many forward results a backward launch passes (backward_segments[1]; 0 without it).
int64_t passedResults(const KernelContext &ctx) {
  if (!ctx.has("backward_segments"))
    return 0;
  std::vector<int64_t> segments = ctx.attrInts("backward_segments");
  if (segments.size() != 3)
    ctx.fail("backward_segments must have 3 entries (operands, results, output grads)");
  return segments[1];
}

} // namespace

const TensorRef *forwardPreActivations(const KernelContext &ctx, const TensorRef &tokens, int64_t inter,
                                       bool savable) {
  if (ctx.outputs.size() < 2)
    return nullptr;
  checkPreActivations(ctx, ctx.outputs[1], tokens, inter, savable);
  return &ctx.outputs[1];
}

const TensorRef *savedPreActivations(const KernelContext &ctx, const TensorRef &tokens, int64_t inter,
                                     bool savable) {
  int64_t results = passedResults(ctx);
  if (results == 0)
    return nullptr;
  if (results != 1)
    ctx.fail("an expert MLP's backward takes one saved result (its pre_activations), got " +
             std::to_string(results));
  const TensorRef &pre = ctx.in(static_cast<size_t>(ctx.attrInts("backward_segments")[0]));
  checkPreActivations(ctx, pre, tokens, inter, savable);
  return &pre;
}

ExpertCombineLaunch expertCombineLaunch(const KernelContext &ctx) {
  std::vector<int64_t> segments = ctx.attrInts("operand_segments"), of = ctx.gradOfInputs();
  ExpertCombineLaunch l;
  l.expertOperands = std::accumulate(segments.begin(), segments.end(), int64_t{0});
  const int64_t saved = passedResults(ctx);
  if (saved > 1)
    ctx.fail("expert_mlp_combine.backward takes at most one saved result (the pre_activations), got " +
             std::to_string(saved));
  if (static_cast<int64_t>(ctx.inputs.size()) != l.expertOperands + 3 + saved)
    ctx.fail("expected the expert MLP's " + std::to_string(l.expertOperands) + " operands, indices, weights, " +
             (saved ? "the saved pre-activations " : "") + "and the result's gradient; got " +
             std::to_string(ctx.inputs.size()) + " inputs");
  if (of.size() != ctx.outputs.size())
    ctx.fail("grad_of_inputs lists " + std::to_string(of.size()) + " operands but there are " +
             std::to_string(ctx.outputs.size()) + " outputs");
  l.indices = &ctx.in(l.expertOperands);
  l.weights = &ctx.in(l.expertOperands + 1);
  if (saved)
    l.preActivations = &ctx.in(l.expertOperands + 2); // checked by the kernels, which know the sizes
  l.dResult = &ctx.in(l.expertOperands + 2 + saved);
  expectIndices(ctx, *l.indices);
  ctx.expectShape(*l.indices, "indices", {-1, -1});
  ctx.expectShape(*l.weights, "weights", l.indices->shape);
  if (l.weights->dtype != plan::F32)
    ctx.fail("weights must be f32");
  l.wantWeights = !of.empty() && of.back() == l.expertOperands + 1;
  l.expertGrads.assign(of.begin(), of.end() - (l.wantWeights ? 1 : 0));
  for (int64_t operand : l.expertGrads)
    if (operand < 0 || operand >= l.expertOperands)
      ctx.fail("grad_of_inputs names input " + std::to_string(operand) +
               ", neither an expert MLP operand nor the weights");
  return l;
}

namespace {

using Attrs = google::protobuf::Map<std::string, plan::Attr>;

void setInts(Attrs &attrs, const std::string &name, const std::vector<int64_t> &values) {
  attrs[name].mutable_ints()->mutable_values()->Assign(values.begin(), values.end());
}

/// `kernel` on tensors of `ctx`'s (or its own) with `attrs`, on ctx's stream and threads.
void subLaunch(const KernelContext &ctx, Kernel kernel, const char *name, std::vector<TensorRef> inputs,
               std::vector<TensorRef> outputs, const Attrs &attrs) {
  KernelContext sub;
  sub.kernel = ctx.kernel + " (" + name + ")";
  sub.inputs = std::move(inputs);
  sub.outputs = std::move(outputs);
  sub.attrs = &attrs;
  sub.seqLen = ctx.seqLen;
  sub.microBatch = ctx.microBatch;
  sub.pool = ctx.pool;
  sub.stream = ctx.stream;
  kernel(sub);
}

} // namespace

void composeExpertCombineBackward(const KernelContext &ctx, const ExpertCombineLaunch &l, TensorRef e,
                                  TensorRef de, Kernel forward, Kernel combineBackward, Kernel expertBackward) {
  std::vector<TensorRef> expertInputs(ctx.inputs.begin(), ctx.inputs.begin() + l.expertOperands);
  subLaunch(ctx, forward, "expert_mlp", expertInputs, {e}, *ctx.attrs);
  Attrs combineAttrs;
  setInts(combineAttrs, "grad_of_inputs", l.wantWeights ? std::vector<int64_t>{0, 2} : std::vector<int64_t>{0});
  setInts(combineAttrs, "grad_of_outputs", {0});
  setInts(combineAttrs, "backward_segments", {3, 0, 1});
  std::vector<TensorRef> combineOut = {de};
  if (l.wantWeights)
    combineOut.push_back(ctx.outputs.back());
  subLaunch(ctx, combineBackward, "combine.backward", {e, *l.indices, *l.weights, *l.dResult}, combineOut,
            combineAttrs);
  Attrs expertAttrs = *ctx.attrs;
  setInts(expertAttrs, "grad_of_inputs", l.expertGrads);
  setInts(expertAttrs, "backward_segments", {l.expertOperands, l.preActivations ? 1 : 0, 1});
  if (l.preActivations)
    expertInputs.push_back(*l.preActivations);
  expertInputs.push_back(de);
  subLaunch(ctx, expertBackward, "expert_mlp.backward", expertInputs,
            std::vector<TensorRef>(ctx.outputs.begin(), ctx.outputs.begin() + l.expertGrads.size()), expertAttrs);
}

} // namespace moec::runtime::checks::routing
