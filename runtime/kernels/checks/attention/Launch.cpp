//===- Launch.cpp - launch checks of the CPU and CUDA attention kernels ---===//

#include "runtime/kernels/checks/attention/Launch.h"

#include <algorithm>

#include "runtime/plan/PlanFormat.h"

namespace moec::runtime::checks::attention {

bool expectIndices(const KernelContext &ctx, const TensorRef &t, const char *what,
                   std::vector<int64_t> dims) {
  ctx.expectShape(t, what, std::move(dims));
  if (t.dtype != plan::I32 && t.dtype != plan::I64)
    ctx.fail(std::string(what) + " must be i32 or i64, got " + plan::dtypeName(t.dtype));
  return t.dtype == plan::I64;
}

int64_t positiveAttr(const KernelContext &ctx, const std::string &name) {
  int64_t value = ctx.attrInt(name);
  if (value <= 0)
    ctx.fail("attribute '" + name + "' must be positive, got " + std::to_string(value));
  return value;
}

int64_t nonNegativeAttr(const KernelContext &ctx, const std::string &name) {
  int64_t value = ctx.attrInt(name);
  if (value < 0)
    ctx.fail("attribute '" + name + "' must not be negative, got " + std::to_string(value));
  return value;
}

Sequences sequencesOf(const KernelContext &ctx, int64_t tokens) {
  if (ctx.seqLen <= 0 || ctx.microBatch <= 0 || ctx.seqLen * ctx.microBatch != tokens)
    ctx.fail("the step's sequences (micro_batch " + std::to_string(ctx.microBatch) + " x seq_len " +
             std::to_string(ctx.seqLen) + ") do not cover the " + std::to_string(tokens) +
             " token rows");
  return {ctx.microBatch, ctx.seqLen};
}

size_t backwardOperands(const KernelContext &ctx, size_t minOperands, size_t maxOperands) {
  size_t operands = ctx.inputs.empty() ? 0 : ctx.inputs.size() - 1;
  if (ctx.has("backward_segments")) {
    std::vector<int64_t> segments = ctx.attrInts("backward_segments");
    if (segments.size() != 3 || segments[0] < 0 || segments[1] < 0 || segments[2] < 0 ||
        segments[2] > 1 ||
        static_cast<size_t>(segments[0] + segments[1] + segments[2]) != ctx.inputs.size())
      ctx.fail("backward_segments must be [operands, results, grads] (at most one grad) adding "
               "up to the " +
               std::to_string(ctx.inputs.size()) + " inputs");
    operands = static_cast<size_t>(segments[0]);
  }
  if (operands < minOperands || operands > maxOperands)
    ctx.fail("expected " + std::to_string(minOperands) +
             (maxOperands > minOperands ? " or " + std::to_string(maxOperands) : std::string()) +
             " forward operands, got " + std::to_string(operands));
  return operands;
}

std::vector<int64_t> checkGradOutputs(const KernelContext &ctx, size_t numOperands,
                                      const std::vector<int64_t> &differentiable, bool bf16) {
  std::vector<int64_t> wanted = ctx.gradOfInputs();
  if (wanted.size() != ctx.outputs.size())
    ctx.fail("grad_of_inputs names " + std::to_string(wanted.size()) + " operands but there are " +
             std::to_string(ctx.outputs.size()) + " outputs");
  for (size_t i = 0; i < wanted.size(); ++i) {
    int64_t operand = wanted[i];
    if (std::find(differentiable.begin(), differentiable.end(), operand) == differentiable.end() ||
        static_cast<size_t>(operand) >= numOperands)
      ctx.fail("grad_of_inputs names operand " + std::to_string(operand) +
               ", which has no gradient (an index operand or out of range)");
    if (std::count(wanted.begin(), wanted.end(), operand) > 1)
      ctx.fail("grad_of_inputs names operand " + std::to_string(operand) + " twice");
    const TensorRef &grad = ctx.out(i), &of = ctx.in(static_cast<size_t>(operand));
    bool dtypeOk = grad.dtype == plan::F32 || (bf16 && grad.dtype == plan::BF16);
    if (!dtypeOk || grad.shape != of.shape)
      ctx.fail("gradient output " + std::to_string(i) + " must be " +
               (bf16 ? "f32 or bf16" : "f32") + " shaped like operand " + std::to_string(operand));
  }
  return wanted;
}

bool hasResultGradient(const KernelContext &ctx, size_t numOperands) {
  return ctx.has("backward_segments") ? ctx.attrInts("backward_segments")[2] == 1
                                      : ctx.inputs.size() > numOperands;
}

} // namespace moec::runtime::checks::attention
