//===- RoutingChecks.cpp - routing launch checks (CPU and CUDA) -----------===//

#include "runtime/kernels/checks/routing/RoutingChecks.h"

#include <algorithm>
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

} // namespace moec::runtime::checks::routing
