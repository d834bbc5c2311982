//===- ExpertMlpCombine.cpp - an expert MLP's and its combine's backward --===//
//
// expert_mlp_combine.backward: the backward of y = combine(expert_mlp(x_rows,
// ...), indices, weights) in one launch (--fused-expert-backward gives a
// layer's expert MLP and combine this one backward, so that the expert
// outputs are not saved for the combine's weight gradient). Inputs: the
// expert MLP's operands (operand_segments: its groups), the combine's indices
// and weights, then d y. Outputs: the gradients grad_of_inputs lists, the
// weights' last (index: the expert operands' count + 1).
//
// The CPU twin is the definition, composed of the three kernels it replaces:
// the expert outputs again (expert_mlp), the combine's backward (d expert
// outputs and d weights = d y . expert output), the expert MLP's backward.
//
//===----------------------------------------------------------------------===//

#include <numeric>
#include <string>
#include <vector>

#include "runtime/kernels/cpu/routing/Routing.h"

namespace moec::runtime::cpu::routing {

namespace {

using Attrs = google::protobuf::Map<std::string, plan::Attr>;

void setInts(Attrs &attrs, const std::string &name, const std::vector<int64_t> &values) {
  plan::Attr &attr = attrs[name];
  attr.mutable_ints()->mutable_values()->Assign(values.begin(), values.end());
}

/// A launch of another kernel on part of `ctx`'s tensors, with `attrs`.
KernelContext subLaunch(const KernelContext &ctx, const char *kernel, std::vector<TensorRef> inputs,
                        std::vector<TensorRef> outputs, const Attrs &attrs) {
  KernelContext sub;
  sub.kernel = ctx.kernel + " (" + kernel + ")";
  sub.inputs = std::move(inputs);
  sub.outputs = std::move(outputs);
  sub.attrs = &attrs;
  sub.seqLen = ctx.seqLen;
  sub.microBatch = ctx.microBatch;
  sub.pool = ctx.pool;
  return sub;
}

} // namespace

void expertMlpCombineBackward(KernelContext &ctx) {
  std::vector<int64_t> segments = ctx.attrInts("operand_segments"), of = ctx.gradOfInputs();
  const int64_t experts = std::accumulate(segments.begin(), segments.end(), int64_t{0});
  if (static_cast<int64_t>(ctx.inputs.size()) != experts + 3)
    ctx.fail("expected the expert MLP's " + std::to_string(experts) +
             " operands, indices, weights and the result's gradient; got " + std::to_string(ctx.inputs.size()) +
             " inputs");
  if (of.size() != ctx.outputs.size())
    ctx.fail("grad_of_inputs lists " + std::to_string(of.size()) + " operands but there are " +
             std::to_string(ctx.outputs.size()) + " outputs");
  const TensorRef &x = ctx.in(0), &indices = ctx.in(experts), &weights = ctx.in(experts + 1),
                  &dy = ctx.in(experts + 2);
  expectF32(ctx, x, "expert rows");
  std::vector<TensorRef> expertOperands(ctx.inputs.begin(), ctx.inputs.begin() + experts);
  const bool wantWeights = !of.empty() && of.back() == experts + 1;
  std::vector<int64_t> expertGrads(of.begin(), of.end() - (wantWeights ? 1 : 0));
  for (int64_t operand : expertGrads)
    if (operand < 0 || operand >= experts)
      ctx.fail("grad_of_inputs names input " + std::to_string(operand) +
               ", neither an expert MLP operand nor the weights");

  // The expert outputs, as the forward made them.
  std::vector<float> outputs(static_cast<size_t>(x.numel())), dOutputs(outputs.size());
  TensorRef e{plan::F32, x.shape, outputs.data()}, de{plan::F32, x.shape, dOutputs.data()};
  KernelContext forward = subLaunch(ctx, "expert_mlp", expertOperands, {e}, *ctx.attrs);
  expertMlpForward(forward);

  // The combine's backward: d expert outputs (w d y per row) and d weights (d y . expert output).
  Attrs combineAttrs;
  setInts(combineAttrs, "grad_of_inputs", wantWeights ? std::vector<int64_t>{0, 2} : std::vector<int64_t>{0});
  setInts(combineAttrs, "grad_of_outputs", {0});
  setInts(combineAttrs, "backward_segments", {3, 0, 1});
  std::vector<TensorRef> combineOut = {de};
  if (wantWeights)
    combineOut.push_back(ctx.outputs.back());
  KernelContext combine = subLaunch(ctx, "combine.backward", {e, indices, weights, dy}, combineOut, combineAttrs);
  combineBackward(combine);

  // The expert MLP's backward from d expert outputs.
  Attrs expertAttrs = *ctx.attrs;
  setInts(expertAttrs, "grad_of_inputs", expertGrads);
  setInts(expertAttrs, "backward_segments", {experts, 0, 1});
  std::vector<TensorRef> expertInputs = expertOperands;
  expertInputs.push_back(de);
  KernelContext backward =
      subLaunch(ctx, "expert_mlp.backward", expertInputs,
                std::vector<TensorRef>(ctx.outputs.begin(), ctx.outputs.begin() + expertGrads.size()), expertAttrs);
  expertMlpBackward(backward);
}

} // namespace moec::runtime::cpu::routing
