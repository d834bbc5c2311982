//===- BuildTrainingStep.cpp - loss, backward and optimizer ---------------===//

#include "passes/build_training_step/BuildTrainingStep.h"

#include "passes/build_training_step/Differentiate.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"

namespace moec::passes {

#define GEN_PASS_DEF_BUILDTRAININGSTEPPASS
#include "passes/build_training_step/BuildTrainingStep.h.inc"

namespace {

using namespace mlir;

constexpr StringLiteral kTrainStep = "train_step";

class BuildTrainingStepPass : public impl::BuildTrainingStepPassBase<BuildTrainingStepPass> {
public:
  using BuildTrainingStepPassBase::BuildTrainingStepPassBase;

  void runOnOperation() override {
    moe::ModelOp model = getOperation();
    if (failed(run(model)))
      signalPassFailure();
  }

private:
  LogicalResult run(moe::ModelOp model) {
    Recompute policy;
    if (recompute == "none")
      policy = Recompute::None;
    else if (recompute == "regather")
      policy = Recompute::Regather;
    else if (recompute == "per-layer")
      policy = Recompute::PerLayer;
    else
      return model.emitError("moe-build-training-step: recompute must be none, regather or "
                             "per-layer, got '")
             << recompute << "'";
    if (expertBackward != "auto" && expertBackward != "fused" && expertBackward != "separate")
      return model.emitError("moe-build-training-step: expert-backward must be auto, fused or separate, got '")
             << expertBackward << "'";
    // Read by every layer template built from here on (the memory planner's too).
    model->setAttr(kExpertBackward, StringAttr::get(model.getContext(), expertBackward));
    auto forward = dyn_cast_or_null<func::FuncOp>(SymbolTable::lookupSymbolIn(model, "forward"));
    if (!forward)
      return model.emitError("moe-build-training-step: the model has no func.func @forward");
    if (SymbolTable::lookupSymbolIn(model, kTrainStep))
      return model.emitError("moe-build-training-step: the model already has @train_step");
    bool anyTrainable = false;
    model.walk([&](moe::ParamOp param) { anyTrainable |= param.getTrainable(); });
    if (!anyTrainable)
      return model.emitError("moe-build-training-step: no parameter is trainable; run "
                             "--moe-inject-lora first (or mark parameters trainable)");

    OpBuilder b(model.getContext());
    Location loc = forward.getLoc();
    FunctionType forwardType = forward.getFunctionType();
    if (forwardType.getNumInputs() != 2 || forwardType.getNumResults() != 1)
      return forward.emitOpError("@forward must be (ids, positions) -> logits");
    Type labelsType = forwardType.getInput(0);
    auto lossType = RankedTensorType::get({}, b.getF32Type());
    b.setInsertionPointAfter(forward);
    auto step = b.create<func::FuncOp>(
        loc, kTrainStep,
        b.getFunctionType({forwardType.getInput(0), forwardType.getInput(1), labelsType}, lossType));
    Block *entry = step.addEntryBlock();

    // Forward: @forward's ops, with each layer running its training template.
    IRMapping mapping;
    for (unsigned i = 0; i < 2; ++i)
      mapping.map(forward.getArgument(i), entry->getArgument(i));
    b.setInsertionPointToStart(entry);
    SmallVector<Operation *> ops;
    Value logits;
    // Sequence parallel: @forward gathers each tp rank's rows of the logits to return them; the
    // loss takes this rank's rows instead, against its rows of the labels, shifted first (a
    // rank's last position is scored against the next rank's first label).
    auto gatheredLogits = forward.getBody().front().getTerminator()->getOperand(0).getDefiningOp<moe::TpGatherOp>();
    for (Operation &op : forward.getBody().front()) {
      if (auto ret = dyn_cast<func::ReturnOp>(op)) {
        logits = mapping.lookup(gatheredLogits ? gatheredLogits.getInput() : ret.getOperand(0));
        break;
      }
      if (&op == gatheredLogits.getOperation())
        continue;
      auto apply = dyn_cast<moe::ApplyLayerOp>(op);
      if (!apply) {
        ops.push_back(b.clone(op, mapping));
        continue;
      }
      auto layer = SymbolTable::lookupSymbolIn(model, apply.getCalleeAttr());
      FailureOr<LayerTraining> training =
          getOrBuildLayerTraining(cast<moe::LayerOp>(layer), policy);
      if (failed(training))
        return failure();
      SmallVector<Value> operands;
      for (Value operand : apply.getOperands())
        operands.push_back(mapping.lookup(operand));
      auto call = b.create<moe::ApplyLayerOp>(apply.getLoc(), training->forward.getResultTypes(),
                                              training->forward.getSymNameAttr().getValue(),
                                              apply.getIndex(), operands);
      mapping.map(apply.getResult(0), call.getResult(0));
      ops.push_back(call);
    }
    Value labels = entry->getArgument(2);
    UnitAttr shift = b.getUnitAttr();
    if (gatheredLogits) {
      labels = b.create<moe::ShiftLabelsOp>(loc, labelsType, labels, b.getI64IntegerAttr(-100));
      labels = b.create<moe::TpSliceOp>(loc, labels, gatheredLogits.getAxisAttr());
      shift = nullptr;
    }
    auto loss = b.create<moe::CrossEntropyOp>(loc, lossType, logits, labels, b.getI64IntegerAttr(-100), shift);
    ops.push_back(loss);

    // Backward, seeded with d loss / d loss = 1.
    llvm::DenseMap<Value, Value> grads;
    grads[loss] = b.create<moe::FillOp>(loc, lossType, b.getF64FloatAttr(1.0));
    if (failed(differentiate(ops, /*sources=*/{}, b, grads)))
      return failure();
    b.create<func::ReturnOp>(loc, ValueRange{loss});

    for (auto old : llvm::make_early_inc_range(model.getBody().getOps<moe::OptimizerOp>()))
      old->erase();
    b.setInsertionPointToEnd(&model.getBody().front());
    b.create<moe::OptimizerOp>(loc, b.getStringAttr("adamw"), b.getF64FloatAttr(lr), b.getF64FloatAttr(beta1),
                               b.getF64FloatAttr(beta2), b.getF64FloatAttr(eps),
                               b.getF64FloatAttr(weightDecay), b.getI64IntegerAttr(warmupSteps),
                               b.getI64IntegerAttr(totalSteps), b.getStringAttr(schedule),
                               b.getF64FloatAttr(minLrRatio), b.getF64FloatAttr(maxGradNorm));
    model->setAttr("recompute", b.getStringAttr(toString(policy)));
    return success();
  }
};

} // namespace
} // namespace moec::passes
