//===- CoreChecks.cpp - launch checks of the core kernels -----------------===//

#include "runtime/kernels/checks/core/CoreChecks.h"

#include <algorithm>

#include "runtime/kernels/checks/core/LmHeadLoss.h"
#include "runtime/plan/PlanFormat.h"

namespace moec::runtime::checks::core {

std::string shapeText(const std::vector<int64_t> &shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    out += (i ? "," : "") + std::to_string(shape[i]);
  return out + "]";
}

void expectIndices(const KernelContext &ctx, const TensorRef &t, const std::string &what) {
  if (t.dtype != plan::I32 && t.dtype != plan::I64)
    ctx.fail(what + " must be i32 or i64, got " + plan::dtypeName(t.dtype));
}

void expectSameShape(const KernelContext &ctx, const TensorRef &a, const std::string &aName,
                     const TensorRef &b, const std::string &bName) {
  if (a.shape != b.shape)
    ctx.fail(aName + " has shape " + shapeText(a.shape) + ", expected the shape of " + bName + " " +
             shapeText(b.shape));
}

int64_t rowsOf(const KernelContext &ctx, const TensorRef &t, const std::string &what,
               int64_t features) {
  if (t.rank() < 1)
    ctx.fail(what + " must have rank >= 1, got a scalar");
  if (features >= 0 && t.dim(-1) != features)
    ctx.fail(what + " has shape " + shapeText(t.shape) + ", expected " + std::to_string(features) +
             " features in its last dimension");
  return t.dim(-1) == 0 ? 0 : t.numel() / t.dim(-1);
}

void expectRowsShape(const KernelContext &ctx, const TensorRef &t, const std::string &what,
                     const TensorRef &x, int64_t last) {
  std::vector<int64_t> want = x.shape;
  want.back() = last;
  if (t.shape != want)
    ctx.fail(what + " has shape " + shapeText(t.shape) + ", expected " + shapeText(want));
}

LmHeadLossShape checkLmHeadLoss(const KernelContext &ctx) {
  if (ctx.inputs.size() < 3)
    ctx.fail("expected the operands input, weight and labels, got " + std::to_string(ctx.inputs.size()) +
             " inputs");
  const TensorRef &input = ctx.in(0), &weight = ctx.in(1), &labels = ctx.in(2);
  ctx.expectShape(input, "input", {-1, -1});
  LmHeadLossShape s;
  s.rows = input.dim(0);
  s.hidden = input.dim(1);
  ctx.expectShape(weight, "weight", {-1, s.hidden});
  s.vocab = weight.dim(0);
  expectIndices(ctx, labels, "labels");
  ctx.expectShape(labels, "labels", {s.rows});
  int64_t chunkTokens = ctx.attrInt("chunk_tokens", lm_head_loss::kDefaultChunkTokens);
  if (chunkTokens <= 0)
    ctx.fail("chunk_tokens must be positive, got " + std::to_string(chunkTokens));
  s.chunk = lm_head_loss::chunkRows(s.rows, chunkTokens);
  if (ctx.attrBool("shift_labels") && (ctx.seqLen <= 0 || s.rows % ctx.seqLen != 0))
    ctx.fail("shift_labels needs whole sequences: " + std::to_string(s.rows) +
             " rows are not a multiple of seq_len " + std::to_string(ctx.seqLen));
  s.logitsType = roundingTypeAttr(ctx, "logits_type");
  return s;
}

ShiftLabelsShape checkShiftLabels(const KernelContext &ctx) {
  const TensorRef &labels = ctx.in(0), &result = ctx.out(0);
  expectIndices(ctx, labels, "labels");
  ctx.expectShape(labels, "labels", {-1});
  ctx.expectShape(result, "result", {labels.dim(0)});
  if (result.dtype != labels.dtype)
    ctx.fail("the result must have the labels' index type");
  ShiftLabelsShape s{labels.dim(0), ctx.seqLen, ctx.attrInt("ignore_index", -100), labels.dtype == plan::I64};
  if (s.seqLen <= 0 || s.rows % s.seqLen != 0)
    ctx.fail("shift_labels needs whole sequences: " + std::to_string(s.rows) + " labels are not a multiple of seq_len " +
             std::to_string(s.seqLen));
  return s;
}

RowSumOfSquaresShape checkRowSumOfSquares(const KernelContext &ctx, const TensorRef &input, const TensorRef &ss,
                                          const std::string &ssName) {
  ctx.expectShape(input, "input", {-1, -1});
  ctx.expectShape(ss, ssName.c_str(), {input.dim(0), 1});
  if (ss.dtype != plan::F32)
    ctx.fail(ssName + " must be f32 (a sum over a whole row)");
  return {input.dim(0), input.dim(1)};
}

ShardedRmsNormShape checkShardedRmsNorm(const KernelContext &ctx) {
  RowSumOfSquaresShape rows = checkRowSumOfSquares(ctx, ctx.in(0), ctx.in(2), "sum_of_squares");
  ctx.expectShape(ctx.in(1), "weight", {rows.features});
  ShardedRmsNormShape s{rows.rows, rows.features, ctx.attrInt("features"), static_cast<float>(ctx.attrFloat("eps")),
                        ctx.attrBool("unit_offset")};
  if (s.wholeFeatures < s.features)
    ctx.fail("features (" + std::to_string(s.wholeFeatures) + ", the whole rows') is less than the input's " +
             std::to_string(s.features));
  return s;
}

plan::DType roundingTypeAttr(const KernelContext &ctx, const std::string &name) {
  if (!ctx.has(name))
    return plan::DTYPE_UNSPECIFIED;
  std::string type = ctx.attrString(name);
  if (type != "f32" && type != "bf16")
    ctx.fail(name + " must be f32 or bf16, got " + type);
  return type == "bf16" ? plan::BF16 : plan::F32;
}

plan::DType checkLoraLinear(const KernelContext &ctx, int64_t weightOut, int64_t loraOut) {
  if (loraOut != weightOut)
    ctx.fail("lora_b has " + std::to_string(loraOut) + " output features, the weight " + std::to_string(weightOut));
  return roundingTypeAttr(ctx, "base_type");
}

BackwardLaunch::BackwardLaunch(const KernelContext &ctx, size_t numResults,
                               const std::vector<int64_t> &differentiable, GradCheck checkGrad)
    : ctx(ctx), checkGrad(checkGrad), gradOfOutputs(ctx.attrInts("grad_of_outputs")),
      gradOfInputs(ctx.gradOfInputs()) {
  for (int64_t result : gradOfOutputs)
    if (result < 0 || result >= static_cast<int64_t>(numResults))
      ctx.fail("grad_of_outputs names result " + std::to_string(result) + ", but the op has " +
               std::to_string(numResults) + (numResults == 1 ? " result" : " results"));
  if (ctx.has("backward_segments")) {
    std::vector<int64_t> segments = ctx.attrInts("backward_segments");
    if (segments.size() != 3 || segments[0] < 0 || segments[1] < 0 ||
        segments[2] != static_cast<int64_t>(gradOfOutputs.size()) ||
        segments[0] + segments[1] + segments[2] != static_cast<int64_t>(ctx.inputs.size()))
      ctx.fail("backward_segments " + shapeText(segments) + " do not match " +
               std::to_string(ctx.inputs.size()) + " inputs and " +
               std::to_string(gradOfOutputs.size()) + " entries of grad_of_outputs");
    operands = static_cast<size_t>(segments[0]);
    results = static_cast<size_t>(segments[1]);
  } else {
    if (ctx.inputs.size() < gradOfOutputs.size())
      ctx.fail("fewer inputs than entries of grad_of_outputs");
    operands = ctx.inputs.size() - gradOfOutputs.size();
  }
  if (ctx.outputs.size() != gradOfInputs.size())
    ctx.fail("expected " + std::to_string(gradOfInputs.size()) +
             " outputs (one per entry of grad_of_inputs), got " +
             std::to_string(ctx.outputs.size()));
  for (size_t k = 0; k < gradOfInputs.size(); ++k) {
    int64_t operand = gradOfInputs[k];
    if (operand < 0 || operand >= static_cast<int64_t>(operands))
      ctx.fail("grad_of_inputs names operand " + std::to_string(operand) + ", but there are " +
               std::to_string(operands) + " operands");
    if (std::find(differentiable.begin(), differentiable.end(), operand) == differentiable.end())
      ctx.fail("operand " + std::to_string(operand) + " has no gradient");
    expectSameShape(ctx, ctx.outputs[k], "the gradient of operand " + std::to_string(operand),
                    ctx.inputs[operand], "operand " + std::to_string(operand));
    if (checkGrad)
      checkGrad(ctx, ctx.outputs[k], "the gradient of operand " + std::to_string(operand));
  }
}

const TensorRef *BackwardLaunch::resultGrad(int64_t result) const {
  for (size_t k = 0; k < gradOfOutputs.size(); ++k)
    if (gradOfOutputs[k] == result)
      return &ctx.inputs[operands + results + k];
  return nullptr;
}

const TensorRef &BackwardLaunch::resultGrad0(const std::vector<int64_t> &shape) const {
  const TensorRef *grad = resultGrad(0);
  if (!grad)
    ctx.fail("grad_of_outputs must name result 0");
  if (grad->shape != shape)
    ctx.fail("the result gradient has shape " + shapeText(grad->shape) + ", expected " +
             shapeText(shape));
  if (checkGrad)
    checkGrad(ctx, *grad, "the result gradient");
  return *grad;
}

const TensorRef *BackwardLaunch::operandGrad(int64_t operand) const {
  for (size_t k = 0; k < gradOfInputs.size(); ++k)
    if (gradOfInputs[k] == operand)
      return &ctx.outputs[k];
  return nullptr;
}

const TensorRef &lmHeadLossLogsumexp(const KernelContext &ctx, const BackwardLaunch &launch, int64_t rows) {
  if (launch.numResults() != 2 && launch.numResults() != 3)
    ctx.fail("the backward needs the forward's results (loss, logsumexp[, input_grad]): "
             "backward_segments must list 2 or 3 results");
  if (launch.resultGrad(1) || launch.resultGrad(2))
    ctx.fail("only the loss result takes a gradient");
  const TensorRef &lse = ctx.in(launch.numOperands() + 1);
  ctx.expectShape(lse, "logsumexp", {rows});
  if (lse.dtype != plan::F32)
    ctx.fail(std::string("logsumexp must be f32, got ") + plan::dtypeName(lse.dtype));
  return lse;
}

const TensorRef *lmHeadLossInputGrad(const KernelContext &ctx, const BackwardLaunch &launch) {
  if (launch.numResults() != 3)
    return nullptr;
  const TensorRef &grad = ctx.in(launch.numOperands() + 2), &input = ctx.in(0);
  expectSameShape(ctx, grad, "input_grad", input, "input");
  if (grad.dtype != input.dtype)
    ctx.fail(std::string("input_grad must have the input's type ") + plan::dtypeName(input.dtype) + ", got " +
             plan::dtypeName(grad.dtype));
  return &grad;
}

AdamWConstants adamwLaunch(const KernelContext &ctx) {
  const TensorRef &grad = ctx.in(0), &param = ctx.out(0), &m = ctx.out(1), &v = ctx.out(2);
  expectSameShape(ctx, grad, "grad", param, "param");
  expectSameShape(ctx, m, "adam_m", param, "param");
  expectSameShape(ctx, v, "adam_v", param, "param");
  return adamwConstants(ctx.attrFloat("lr"), ctx.attrInt("step"), ctx.attrFloat("beta1"), ctx.attrFloat("beta2"),
                        ctx.attrFloat("eps"), ctx.attrFloat("weight_decay"), ctx.attrFloat("grad_scale"));
}

std::pair<size_t, size_t> microbatchBytes(const KernelContext &ctx) {
  const TensorRef &in = ctx.in(0), &out = ctx.out(0);
  int64_t index = ctx.attrInt("index"), count = ctx.attrInt("count");
  if (in.dtype != out.dtype || count < 1 || index < 0 || index >= count || in.numel() != out.numel() * count)
    ctx.fail("microbatch: the result must be block " + std::to_string(index) + " of " + std::to_string(count) +
             " equal blocks of the input (" + std::to_string(in.numel()) + " elements, result " +
             std::to_string(out.numel()) + ")");
  size_t bytes = static_cast<size_t>(out.numel()) * plan::dtypeSize(out.dtype);
  return {static_cast<size_t>(index) * bytes, bytes};
}

std::vector<BlockCopy> tokenBlockCopies(const KernelContext &ctx) {
  bool split = ctx.kernel == "token_blocks";
  const std::vector<TensorRef> &blocks = split ? ctx.outputs : ctx.inputs;
  if ((split ? ctx.inputs : ctx.outputs).size() != 1 || blocks.size() < 2)
    ctx.fail(std::string("expected ") + (split ? "one input and at least 2 blocks out" : "at least 2 blocks in and one output") +
             ", got " + std::to_string(ctx.inputs.size()) + " inputs and " + std::to_string(ctx.outputs.size()) + " outputs");
  const TensorRef &whole = split ? ctx.in(0) : ctx.out(0);
  if (whole.rank() < 1)
    ctx.fail("the whole tensor must have token rows (rank >= 1), got " + shapeText(whole.shape));
  int64_t rows = whole.dim(0); // a row is the product of the other dimensions
  size_t rowBytes = static_cast<size_t>(plan::dtypeSize(whole.dtype));
  for (int64_t d = 1; d < whole.rank(); ++d)
    rowBytes *= static_cast<size_t>(whole.dim(d));
  int64_t count = static_cast<int64_t>(blocks.size());
  char *base = static_cast<char *>(whole.data);
  std::vector<BlockCopy> copies;
  for (int64_t b = 0; b < count; ++b) {
    const TensorRef &block = blocks[b];
    int64_t first = b * rows / count, last = (b + 1) * rows / count;
    std::vector<int64_t> want = whole.shape;
    want[0] = last - first;
    if (block.dtype != whole.dtype || block.shape != want)
      ctx.fail("block " + std::to_string(b) + " of " + std::to_string(count) + " must be rows [" +
               std::to_string(first) + ", " + std::to_string(last) + ") of " + shapeText(whole.shape) +
               " in the same dtype, got " + shapeText(block.shape));
    char *rowsInWhole = base + static_cast<size_t>(first) * rowBytes;
    size_t bytes = static_cast<size_t>(last - first) * rowBytes;
    copies.push_back(split ? BlockCopy{block.data, rowsInWhole, bytes} : BlockCopy{rowsInWhole, block.data, bytes});
  }
  return copies;
}

FeatureCopies sliceFeatureCopies(const KernelContext &ctx) {
  bool place = ctx.kernel == "tp_place_features";
  const TensorRef &whole = place ? ctx.out(0) : ctx.in(0);
  const TensorRef &part = place ? ctx.in(0) : ctx.out(0);
  int64_t ranks = ctx.attrInt("ranks"), index = ctx.attrInt("index");
  std::vector<int64_t> pieces = ctx.attrInts("pieces");
  ctx.expectShape(whole, place ? "result" : "input", {-1, -1});
  int64_t total = 0;
  for (int64_t p : pieces) {
    if (ranks < 1 || p <= 0 || p % ranks)
      ctx.fail("a piece of " + std::to_string(p) + " columns does not split over " + std::to_string(ranks) + " ranks");
    total += p;
  }
  if (whole.dim(1) != total)
    ctx.fail("the pieces hold " + std::to_string(total) + " columns, the whole tensor " + std::to_string(whole.dim(1)));
  if (index < 0 || index >= ranks)
    ctx.fail("index " + std::to_string(index) + " is not one of " + std::to_string(ranks) + " ranks");
  ctx.expectShape(part, place ? "input" : "result", {whole.dim(0), total / ranks});
  if (part.dtype != whole.dtype)
    ctx.fail("the whole and the rank's columns must have one dtype");
  size_t element = static_cast<size_t>(plan::dtypeSize(whole.dtype));
  size_t wholePitch = static_cast<size_t>(total) * element, partPitch = wholePitch / static_cast<size_t>(ranks);
  FeatureCopies out;
  if (place) {
    out.zero = whole.data;
    out.zeroBytes = static_cast<size_t>(whole.dim(0)) * wholePitch;
  }
  int64_t wholeColumn = 0, partColumn = 0;
  for (int64_t p : pieces) {
    char *w = static_cast<char *>(whole.data) + static_cast<size_t>(wholeColumn + index * (p / ranks)) * element;
    char *mine = static_cast<char *>(part.data) + static_cast<size_t>(partColumn) * element;
    size_t width = static_cast<size_t>(p / ranks) * element, height = static_cast<size_t>(whole.dim(0));
    out.copies.push_back(place ? StridedCopy{w, wholePitch, mine, partPitch, width, height}
                              : StridedCopy{mine, partPitch, w, wholePitch, width, height});
    wholeColumn += p;
    partColumn += p / ranks;
  }
  return out;
}

} // namespace moec::runtime::checks::core
