//===- Flops.cpp - FLOPs of one step --------------------------------------===//

#include "compiler/plan/Flops.h"

#include <algorithm>

using namespace mlir;

namespace moec::compiler {

namespace {

int64_t intAttr(DictionaryAttr attrs, StringRef name, int64_t otherwise = 0) {
  auto attr = attrs ? attrs.getAs<IntegerAttr>(name) : IntegerAttr();
  return attr ? attr.getInt() : otherwise;
}

/// FLOPs of forward kernel `kernel` on inputs of these shapes.
int64_t forwardFlops(StringRef kernel, const std::vector<const std::vector<int64_t> *> &in,
                     DictionaryAttr attrs, const Program &program) {
  auto dim = [&](size_t operand, size_t d) -> int64_t {
    return operand < in.size() && d < in[operand]->size() ? (*in[operand])[d] : 0;
  };
  int64_t rows = dim(0, 0), seq = program.seqLen;
  int64_t sequences = std::max<int64_t>(1, rows / std::max<int64_t>(1, seq));
  int64_t causalKeys = (seq + 1) / 2;
  if (kernel == "linear" || kernel == "lm_head_cross_entropy") // the fused one: the head's product
    return 2 * rows * dim(0, 1) * dim(1, 0);
  if (kernel == "lora")
    return 2 * rows * dim(1, 0) * (dim(1, 1) + dim(2, 0));
  if (kernel == "lora_linear") // the projection, then the update
    return 2 * rows * dim(1, 0) * dim(1, 1) + 2 * rows * dim(2, 0) * (dim(2, 1) + dim(3, 0));
  if (kernel == "router")
    return 2 * rows * dim(0, 1) * dim(1, 0);
  if (kernel == "expert_mlp" || kernel == "expert_mlp_combine") { // (the combine's operands are 2-D)
    int64_t perRow = 0;
    for (const std::vector<int64_t> *shape : in)
      if (shape->size() == 3)
        perRow += (*shape)[1] * (*shape)[2]; // one expert's matrix
    return 2 * rows * perRow;
  }
  if (kernel == "attention") {
    int64_t keys = causalKeys;
    if (int64_t window = intAttr(attrs, "sliding_window"))
      keys = std::min(keys, window);
    return 4 * sequences * seq * keys * intAttr(attrs, "num_heads") * intAttr(attrs, "head_dim");
  }
  if (kernel == "mla" || kernel == "sparse_attention") {
    int64_t keys = kernel == "mla" ? causalKeys : dim(4, 1); // sparse: the selected keys
    int64_t perPair = 2 * (intAttr(attrs, "qk_nope_head_dim") + intAttr(attrs, "qk_rope_head_dim") +
                           intAttr(attrs, "v_head_dim"));
    return sequences * seq * keys * intAttr(attrs, "num_heads") * perPair;
  }
  if (kernel == "dsa_indexer")
    return 2 * sequences * seq * causalKeys * intAttr(attrs, "num_heads") * intAttr(attrs, "head_dim");
  // Chunked linear attention: a state update and a read per token and head.
  if (kernel == "gated_delta_net")
    return 6 * rows * intAttr(attrs, "num_value_heads") * intAttr(attrs, "key_head_dim") *
           intAttr(attrs, "value_head_dim");
  if (kernel == "kda")
    return 6 * rows * intAttr(attrs, "num_heads") * intAttr(attrs, "head_dim") *
           intAttr(attrs, "head_dim");
  if (kernel == "mamba2")
    return 6 * rows * intAttr(attrs, "num_heads") * intAttr(attrs, "head_dim") *
           intAttr(attrs, "state_size");
  return 0;
}

bool hasScores(StringRef kernel) {
  return kernel == "attention" || kernel == "mla" || kernel == "sparse_attention" ||
         kernel == "gated_delta_net" || kernel == "kda" || kernel == "mamba2";
}

} // namespace

int64_t estimateFlops(Operation *op, const ProgramStep &step, const Program &program) {
  std::vector<const std::vector<int64_t> *> shapes;
  for (int id : step.inputs)
    shapes.push_back(&program.buffers[id].shape);
  // Rows that follow an expert route's received rows are room for more than the expected
  // ones: count what balanced routing fills.
  std::vector<int64_t> expected;
  if (!step.inputs.empty())
    if (int anchor = program.buffers[step.inputs[0]].receivedRowsOf; anchor >= 0) {
      const ProgramBuffer &route = program.buffers[anchor];
      bool copies = program.buffers[step.inputs[0]].receivedCopies;
      expected = *shapes[0];
      int64_t filled = copies ? route.tokensPerRank * route.shape.at(1) : route.tokensPerRank;
      expected[0] = expected[0] * filled / std::max<int64_t>(1, copies ? route.roomCopies : route.shape.at(0));
      shapes[0] = &expected;
    }
  auto backward = dyn_cast<moe::BackwardOp>(op);
  if (!backward) {
    int64_t flops = forwardFlops(op->getName().stripDialect(), shapes, op->getAttrDictionary(), program);
    // A fused LM head that forms its input's gradient runs the d input product in the forward.
    if (auto head = dyn_cast<moe::LMHeadCrossEntropyOp>(op); head && head.getInputGrad())
      return 2 * flops;
    return flops;
  }
  StringRef kernel = StringRef(backward.getForward()).drop_front(strlen("moe."));
  shapes.resize(backward.getInputs().size());
  int64_t forward = forwardFlops(kernel, shapes, backward.getForwardAttrs(), program);
  if (hasScores(kernel))
    return forward * 5 / 2;
  // The fused LM head and loss recomputes its logits, chunk by chunk, before the gradients;
  // given the input's gradient from the forward (a third result), only the weight's needs them.
  if (kernel == "lm_head_cross_entropy") {
    if (backward.getOutputs().size() == 3)
      return llvm::is_contained(backward.getGradOfInputs(), 1) ? 2 * forward : 0;
    return forward * (1 + static_cast<int64_t>(backward.getGradOfInputs().size()));
  }
  // A projection with its adapter: the projection's products for the input's and the weight's
  // gradients, the adapter's as lora.backward's (two products' worth for any of its gradients).
  if (kernel == "lora_linear") {
    int64_t rows = shapes[0]->empty() ? 0 : (*shapes[0])[0];
    int64_t projection = 2 * rows * (*shapes[1])[0] * (*shapes[1])[1], adapter = forward - projection;
    auto wants = [&](int64_t operand) {
      return static_cast<int64_t>(llvm::is_contained(backward.getGradOfInputs(), operand));
    };
    return projection * (wants(0) + wants(1)) + adapter * std::min<int64_t>(2, wants(0) + wants(2) + wants(3));
  }
  // An expert MLP's backward with its combine's: the router weights' gradient costs a dot per row.
  int64_t grads = static_cast<int64_t>(backward.getGradOfInputs().size());
  if (kernel == "expert_mlp_combine" &&
      llvm::is_contained(backward.getGradOfInputs(), static_cast<int64_t>(backward.getInputs().size()) - 1))
    --grads;
  return forward * std::min<int64_t>(2, grads);
}

} // namespace moec::compiler
