//===- LaunchChecks.cpp - linear-attention launch checks, CPU and CUDA ----===//

#include "runtime/kernels/checks/linear_attention/LaunchChecks.h"

namespace moec::runtime::checks::linattn {
namespace {

std::string shapeText(const std::vector<int64_t> &shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    out += (i ? "," : "") + std::to_string(shape[i]);
  return out + "]";
}

} // namespace

Tokens tokensOf(const KernelContext &ctx, int64_t rows) {
  if (ctx.seqLen <= 0 || ctx.microBatch <= 0)
    ctx.fail("needs positive seq_len and micro_batch, got " + std::to_string(ctx.seqLen) + " and " +
             std::to_string(ctx.microBatch));
  if (ctx.seqLen * ctx.microBatch != rows)
    ctx.fail(std::to_string(rows) + " token rows are not micro_batch " +
             std::to_string(ctx.microBatch) + " x seq_len " + std::to_string(ctx.seqLen));
  return {rows, ctx.seqLen, ctx.microBatch};
}

void expectNumel(const KernelContext &ctx, const TensorRef &t, const char *what, int64_t n,
                 const char *meaning) {
  if (t.numel() != n)
    ctx.fail(std::string(what) + " has shape " + shapeText(t.shape) + ", expected " +
             std::to_string(n) + " elements (" + meaning + ")");
}

int64_t positiveAttr(const KernelContext &ctx, const char *name) {
  int64_t value = ctx.attrInt(name);
  if (value <= 0)
    ctx.fail(std::string("attribute '") + name + "' must be positive, got " +
             std::to_string(value));
  return value;
}

int64_t convWidth(const KernelContext &ctx, const TensorRef &w, const char *what,
                  int64_t channels) {
  ctx.expectShape(w, what, {channels, 1, -1});
  if (w.dim(2) <= 0)
    ctx.fail(std::string(what) + " has an empty kernel");
  return w.dim(2);
}

const TensorRef *checkBackwardLayout(const KernelContext &ctx, size_t numOperands,
                                     const std::vector<int64_t> &resultShape, ExpectFloat expectFloat) {
  std::vector<int64_t> ofOutputs;
  if (ctx.has("grad_of_outputs"))
    ofOutputs = ctx.attrInts("grad_of_outputs");
  else if (ctx.inputs.size() > numOperands)
    ofOutputs = {0};
  size_t results = ctx.inputs.size() < numOperands + ofOutputs.size()
                       ? 0
                       : ctx.inputs.size() - numOperands - ofOutputs.size();
  if (ctx.has("backward_segments")) {
    std::vector<int64_t> segments = ctx.attrInts("backward_segments");
    if (segments.size() != 3 || segments[0] != static_cast<int64_t>(numOperands) ||
        segments[2] != static_cast<int64_t>(ofOutputs.size()))
      ctx.fail("backward_segments " + shapeText(segments) + " do not match " +
               std::to_string(numOperands) + " operands and " + std::to_string(ofOutputs.size()) +
               " gradients of outputs");
    results = static_cast<size_t>(segments[1]);
  }
  if (ctx.inputs.size() != numOperands + results + ofOutputs.size())
    ctx.fail("expected " + std::to_string(numOperands + results + ofOutputs.size()) +
             " inputs (operands, results, output gradients), got " +
             std::to_string(ctx.inputs.size()));
  const TensorRef *grad = nullptr;
  for (size_t i = 0; i < ofOutputs.size(); ++i) {
    if (ofOutputs[i] != 0)
      ctx.fail("grad_of_outputs names result " + std::to_string(ofOutputs[i]) +
               ", the op has one result");
    const TensorRef &g = ctx.inputs[numOperands + results + i];
    ctx.expectShape(g, "the result's gradient", resultShape);
    expectFloat(ctx, g, "the result's gradient");
    grad = &g;
  }
  std::vector<int64_t> ofInputs = ctx.gradOfInputs();
  if (ofInputs.size() != ctx.outputs.size())
    ctx.fail("grad_of_inputs lists " + std::to_string(ofInputs.size()) +
             " operands but there are " + std::to_string(ctx.outputs.size()) + " outputs");
  for (size_t i = 0; i < ofInputs.size(); ++i) {
    if (ofInputs[i] < 0 || ofInputs[i] >= static_cast<int64_t>(numOperands))
      ctx.fail("grad_of_inputs names operand " + std::to_string(ofInputs[i]) + ", the op has " +
               std::to_string(numOperands));
    const TensorRef &operand = ctx.inputs[ofInputs[i]];
    if (ctx.outputs[i].shape != operand.shape)
      ctx.fail("gradient output " + std::to_string(i) + " has shape " +
               shapeText(ctx.outputs[i].shape) + ", its operand " + shapeText(operand.shape));
    expectFloat(ctx, ctx.outputs[i], "a gradient output");
  }
  return grad;
}

} // namespace moec::runtime::checks::linattn
