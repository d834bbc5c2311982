//===- Mamba2Checks.cpp - moe.mamba2's launch checks, CPU and CUDA --------===//

#include "runtime/kernels/checks/mamba/Mamba2Checks.h"

#include <utility>

namespace moec::runtime::checks::mamba2 {
namespace {

const char *const kOperandNames[] = {"zxbcdt", "conv_weight", "conv_bias",  "dt_bias",
                                     "a_log",  "d_skip",      "norm_weight"};

const char *storageName(const Rules &rules) { return rules.bf16 ? "f32 or bf16" : "f32"; }

bool isFloat(const TensorRef &t, const Rules &rules) {
  return t.dtype == plan::F32 || (rules.bf16 && t.dtype == plan::BF16);
}

} // namespace

void expectFloat(const KernelContext &ctx, const TensorRef &t, const std::string &what, const Rules &rules) {
  if (!isFloat(t, rules))
    ctx.fail(what + " must be " + storageName(rules));
}

Mamba2Shape readShape(const KernelContext &ctx, size_t numOperands, std::vector<int64_t> &present,
                      const Rules &rules) {
  if (numOperands != NumOperands && numOperands != NumOperands - 1)
    ctx.fail("expected 6 or 7 forward operands (zxbcdt, conv_weight, [conv_bias], dt_bias, a_log, "
             "d_skip, norm_weight), got " +
             std::to_string(numOperands));
  if (rules.countInputs && ctx.inputs.size() < numOperands)
    ctx.fail("expected at least " + std::to_string(numOperands) + " inputs, got " +
             std::to_string(ctx.inputs.size()));
  Mamba2Shape s;
  s.convBias = numOperands == NumOperands;
  present.assign(NumOperands, -1);
  for (int op = 0, index = 0; op < NumOperands; ++op)
    if (op != ConvBias || s.convBias)
      present[op] = index++;

  s.heads = ctx.attrInt("num_heads");
  s.headDim = ctx.attrInt("head_dim");
  s.state = ctx.attrInt("state_size");
  s.groups = ctx.attrInt("num_groups");
  s.chunk = ctx.attrInt("chunk_size");
  s.eps = ctx.attrFloat("eps");
  s.dtMin = ctx.attrFloat("time_step_min", 0.0);
  for (auto [name, v] : {std::pair<const char *, int64_t>{"num_heads", s.heads},
                         {"head_dim", s.headDim},
                         {"state_size", s.state},
                         {"num_groups", s.groups},
                         {"chunk_size", s.chunk}})
    if (v <= 0)
      ctx.fail(std::string(name) + " must be positive, got " + std::to_string(v));
  if (s.heads % s.groups)
    ctx.fail("num_heads (" + std::to_string(s.heads) + ") must be a multiple of num_groups (" +
             std::to_string(s.groups) + ")");
  if (!(s.eps >= 0))
    ctx.fail("eps must be non-negative");
  s.inner = s.heads * s.headDim;
  s.channels = s.inner + 2 * s.groups * s.state;
  s.width = s.inner + s.channels + s.heads;
  s.headsPerGroup = s.heads / s.groups;
  s.normGroup = s.inner / s.groups;

  for (int op = 0; op < NumOperands; ++op)
    if (present[op] >= 0)
      expectFloat(ctx, ctx.in(present[op]), kOperandNames[op], rules);

  const TensorRef &zxbcdt = ctx.in(present[Zxbcdt]);
  ctx.expectShape(zxbcdt, "zxbcdt (2*H*p + 2*G*N + H columns)", {-1, s.width});
  const TensorRef &weight = ctx.in(present[ConvWeight]);
  ctx.expectShape(weight, "conv_weight (depthwise, H*p + 2*G*N channels)", {s.channels, 1, -1});
  s.kernel = weight.dim(2);
  if (s.kernel <= 0)
    ctx.fail("conv_weight has an empty kernel");
  auto expectCount = [&](int op, int64_t n, const char *meaning) {
    if (present[op] >= 0 && ctx.in(present[op]).numel() != n)
      ctx.fail(std::string(kOperandNames[op]) + " must have " + std::to_string(n) + " elements (" +
               meaning + "), got " + std::to_string(ctx.in(present[op]).numel()));
  };
  expectCount(ConvBias, s.channels, "conv channels");
  expectCount(DtBias, s.heads, "one per head");
  expectCount(ALog, s.heads, "one per head");
  expectCount(DSkip, s.heads, "one per head");
  expectCount(NormWeight, s.inner, "num_heads * head_dim");

  s.tokens = zxbcdt.dim(0);
  s.seqLen = ctx.seqLen;
  s.batch = ctx.microBatch;
  if (s.seqLen <= 0 || s.batch <= 0 || s.seqLen * s.batch != s.tokens)
    ctx.fail("zxbcdt has " + std::to_string(s.tokens) + " rows, expected micro_batch (" +
             std::to_string(s.batch) + ") * seq_len (" + std::to_string(s.seqLen) + ")");
  return s;
}

Mamba2Shape readBackwardShape(const KernelContext &ctx, std::vector<int64_t> &present, const Rules &rules) {
  size_t numOperands = ctx.has("backward_segments")
                           ? static_cast<size_t>(ctx.attrInts("backward_segments").at(0))
                           : ctx.inputs.size() - 1;
  Mamba2Shape s = readShape(ctx, numOperands, present, rules);
  if (ctx.inputs.size() != numOperands + 1)
    ctx.fail("expected the forward operands and the result's gradient (" +
             std::to_string(numOperands + 1) + " inputs), got " +
             std::to_string(ctx.inputs.size()));
  const TensorRef &gradOut = ctx.in(numOperands);
  ctx.expectShape(gradOut, "result gradient", {s.tokens, s.inner});
  expectFloat(ctx, gradOut, "result gradient", rules);
  std::vector<int64_t> wanted = ctx.gradOfInputs();
  if (wanted.size() != ctx.outputs.size())
    ctx.fail("grad_of_inputs names " + std::to_string(wanted.size()) + " operands but there are " +
             std::to_string(ctx.outputs.size()) + " outputs");
  for (size_t i = 0; i < wanted.size(); ++i) {
    if (wanted[i] < 0 || wanted[i] >= static_cast<int64_t>(numOperands))
      ctx.fail("grad_of_inputs names operand " + std::to_string(wanted[i]) + " of " +
               std::to_string(numOperands));
    const TensorRef &operand = ctx.in(wanted[i]), &grad = ctx.out(i);
    if (!isFloat(grad, rules) || grad.numel() != operand.numel())
      ctx.fail("gradient output " + std::to_string(i) + " must be " + storageName(rules) + " with " +
               std::to_string(operand.numel()) + " elements");
  }
  return s;
}

} // namespace moec::runtime::checks::mamba2
