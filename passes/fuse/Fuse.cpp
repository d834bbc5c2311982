//===- Fuse.cpp - fused ops for op patterns (the LM head with the loss) ---===//

#include "passes/fuse/Fuse.h"

#include <optional>

#include "llvm/Support/Debug.h"
#include "mlir/IR/Builders.h"

#define DEBUG_TYPE "moe-fuse"

namespace moec::passes {

#define GEN_PASS_DEF_FUSEPASS
#include "passes/fuse/Fuse.h.inc"

namespace {

using namespace mlir;

/// An LM head and its loss, with the backward the training step built for them (both
/// null before --moe-build-training-step, or when nothing needs the head's gradients).
struct HeadAndLoss {
  moe::LinearOp head;
  moe::CrossEntropyOp loss;
  moe::BackwardOp lossBackward, headBackward;
};

/// `backward` is the default rule's moe.backward of `forward`: same name, same operands.
bool isBackwardOf(moe::BackwardOp backward, Operation *forward) {
  return backward.getForward() == forward->getName().getStringRef() &&
         llvm::equal(backward.getInputs(), forward->getOperands()) && backward.getOutputs().empty();
}

std::optional<HeadAndLoss> match(moe::CrossEntropyOp loss) {
  auto bail = [&](StringRef why) -> std::optional<HeadAndLoss> {
    LLVM_DEBUG(llvm::dbgs() << "not fused (" << why << "): " << loss << "\n");
    return std::nullopt;
  };
  auto head = loss.getLogits().getDefiningOp<moe::LinearOp>();
  if (!head)
    return bail("the logits do not come from a moe.linear");
  if (head.getBias())
    return bail("the head has a bias");
  if (cast<RankedTensorType>(head.getInput().getType()).getRank() != 2)
    return bail("the head's input is not [tokens, hidden]");
  HeadAndLoss m{head, loss, {}, {}};
  for (Operation *user : head.getResult().getUsers()) {
    if (user == loss)
      continue;
    auto backward = dyn_cast<moe::BackwardOp>(user);
    if (!backward || m.lossBackward || !isBackwardOf(backward, loss))
      return bail("the logits have another user");
    m.lossBackward = backward;
  }
  if (!m.lossBackward)
    return m;
  // d logits = the loss backward's one result, read only by the head's backward.
  moe::BackwardOp lossBackward = m.lossBackward;
  auto onlyFirst = [](ArrayRef<int64_t> indices) { return indices.size() == 1 && indices[0] == 0; };
  if (!onlyFirst(lossBackward.getGradOfInputs()) || !onlyFirst(lossBackward.getGradOfOutputs()) ||
      !lossBackward.getResult(0).hasOneUse())
    return bail("the logits' gradient is read by more than the head's backward");
  auto headBackward = dyn_cast<moe::BackwardOp>(*lossBackward.getResult(0).getUsers().begin());
  if (!headBackward || !isBackwardOf(headBackward, head) ||
      !llvm::equal(headBackward.getOutputGrads(), lossBackward.getResults()))
    return bail("the logits' gradient does not go to the head's backward");
  m.headBackward = headBackward;
  return m;
}

class FusePass : public impl::FusePassBase<FusePass> {
public:
  using FusePassBase::FusePassBase;

  void runOnOperation() override {
    moe::ModelOp model = getOperation();
    if (chunkTokens <= 0) {
      model.emitError("moe-fuse: chunk-tokens must be positive, got ") << static_cast<int64_t>(chunkTokens);
      return signalPassFailure();
    }
    SmallVector<HeadAndLoss> matches;
    model.walk([&](moe::CrossEntropyOp loss) {
      if (std::optional<HeadAndLoss> m = match(loss))
        matches.push_back(*m);
    });
    for (HeadAndLoss &m : matches)
      if (failed(fuse(m)))
        return signalPassFailure();
  }

private:
  LogicalResult fuse(HeadAndLoss &m) {
    moe::CrossEntropyOp loss = m.loss;
    OpBuilder b(loss);
    Location loc = loss.getLoc();
    auto input = cast<RankedTensorType>(m.head.getInput().getType());
    auto lseType = RankedTensorType::get({input.getDimSize(0)}, b.getF32Type());
    SmallVector<NamedAttribute> attrs = {
        b.getNamedAttr("ignore_index", b.getI64IntegerAttr(loss.getIgnoreIndex())),
        b.getNamedAttr("chunk_tokens", b.getI64IntegerAttr(static_cast<int64_t>(chunkTokens))),
        // Where the unfused head rounds its logits (bf16 on a bf16 model).
        b.getNamedAttr("logits_type",
                       TypeAttr::get(cast<RankedTensorType>(m.head.getType()).getElementType()))};
    if (loss.getShiftLabels())
      attrs.push_back(b.getNamedAttr("shift_labels", b.getUnitAttr()));
    // A frozen head (only the input's gradient wanted): the forward forms that gradient while
    // each chunk's logits are at hand, and the backward computes no logits again.
    SmallVector<Type> results = {loss.getType(), lseType};
    if (m.headBackward && llvm::equal(m.headBackward.getGradOfInputs(), ArrayRef<int64_t>{0}))
      results.push_back(input);
    auto fused = b.create<moe::LMHeadCrossEntropyOp>(
        loc, results, ValueRange{m.head.getInput(), m.head.getWeight(), loss.getLabels()}, attrs);
    loss.replaceAllUsesWith(fused.getLoss());

    if (m.headBackward) {
      // The fused op's own rule gives the gradients the head's backward gave.
      b.setInsertionPoint(m.headBackward);
      ArrayRef<int64_t> wantedInputs = m.headBackward.getGradOfInputs();
      SmallVector<bool> wanted(fused->getNumOperands(), false);
      for (int64_t index : wantedInputs)
        wanted[index] = true;
      SmallVector<Value> resultGrads(fused->getNumResults(), Value());
      resultGrads[0] = m.lossBackward.getOutputGrads()[0];
      SmallVector<Value> operandGrads;
      if (failed(cast<moe::DifferentiableOpInterface>(fused.getOperation())
                     .buildBackward(b, resultGrads, wanted, operandGrads)))
        return failure();
      for (auto [result, index] : llvm::zip(m.headBackward.getResults(), wantedInputs)) {
        if (!operandGrads[index])
          return m.headBackward.emitOpError("moe-fuse: the fused rule gives no gradient of operand ")
                 << index;
        result.replaceAllUsesWith(operandGrads[index]);
      }
      m.headBackward.erase();
      m.lossBackward.erase();
    }
    loss.erase();
    m.head.erase();
    LLVM_DEBUG(llvm::dbgs() << "fused: " << fused << "\n");
    return success();
  }
};

} // namespace
} // namespace moec::passes
