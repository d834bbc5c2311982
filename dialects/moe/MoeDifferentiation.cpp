//===- MoeDifferentiation.cpp - differentiation rules and training ops ----===//
//
// The default rule (one moe.backward per op), the ops that override it, and
// the verifiers of the ops the training step introduces.
//
//===----------------------------------------------------------------------===//

#include "dialects/moe/MoeOps.h"

#include "llvm/ADT/STLExtras.h"

using namespace mlir;

namespace moec::moe {

bool isFloatTensor(Type type) {
  auto tensor = dyn_cast<RankedTensorType>(type);
  return tensor && isa<FloatType>(tensor.getElementType());
}

LogicalResult buildGenericBackward(Operation *op, OpBuilder &builder, ValueRange resultGrads,
                                   ArrayRef<bool> wanted, SmallVectorImpl<Value> &operandGrads) {
  operandGrads.assign(op->getNumOperands(), Value());
  SmallVector<int64_t> inputs, outputs;
  SmallVector<Value> grads;
  SmallVector<Type> types;
  for (auto [index, want] : llvm::enumerate(wanted))
    if (want) {
      inputs.push_back(index);
      types.push_back(op->getOperand(index).getType());
    }
  for (auto [index, grad] : llvm::enumerate(resultGrads))
    if (grad) {
      outputs.push_back(index);
      grads.push_back(grad);
    }
  if (inputs.empty() || outputs.empty())
    return success();
  // All of them, operandSegmentSizes included: the kernel needs to know which
  // optional operands are present.
  SmallVector<NamedAttribute> attrs(op->getAttrs());
  auto backward = builder.create<BackwardOp>(
      op->getLoc(), types, builder.getStringAttr(op->getName().getStringRef()),
      builder.getDictionaryAttr(attrs), builder.getDenseI64ArrayAttr(inputs),
      builder.getDenseI64ArrayAttr(outputs), op->getOperands(),
      cast<DifferentiableOpInterface>(op).backwardUsesResults() ? ValueRange(op->getResults())
                                                                : ValueRange(),
      grads);
  for (auto [result, index] : llvm::zip(backward.getResults(), inputs))
    operandGrads[index] = result;
  return success();
}

//===----------------------------------------------------------------------===//
// Ops that override the default rule
//===----------------------------------------------------------------------===//

LogicalResult AddOp::buildBackward(OpBuilder &builder, ValueRange resultGrads,
                                   ArrayRef<bool> wanted, SmallVectorImpl<Value> &operandGrads) {
  // d(a + b) passes the same gradient to both sides; no kernel.
  operandGrads.assign(2, Value());
  for (unsigned i = 0; i < 2; ++i)
    if (wanted[i])
      operandGrads[i] = resultGrads[0];
  return success();
}

LogicalResult TpEnterOp::buildBackward(OpBuilder &builder, ValueRange resultGrads, ArrayRef<bool> wanted,
                                       SmallVectorImpl<Value> &operandGrads) {
  // Each rank's part of the region contributes to the input's gradient: their sum (with rows:
  // each rank keeps its rows of it).
  operandGrads.assign(1, Value());
  if (wanted[0] && resultGrads[0])
    operandGrads[0] =
        builder.create<TpExitOp>(getLoc(), resultGrads[0].getType(), resultGrads[0], getAxisAttr(), getRowsAttr());
  return success();
}

LogicalResult TpExitOp::buildBackward(OpBuilder &builder, ValueRange resultGrads, ArrayRef<bool> wanted,
                                      SmallVectorImpl<Value> &operandGrads) {
  // d(sum of parts) / d(part) is the identity; no kernel, no communication. With rows, each
  // rank has its rows' gradient and every part needs all of them: gathered.
  operandGrads.assign(1, Value());
  if (!wanted[0] || !resultGrads[0])
    return success();
  operandGrads[0] = resultGrads[0];
  if (getRows())
    operandGrads[0] = builder.create<TpGatherOp>(getLoc(), resultGrads[0], getAxisAttr());
  return success();
}

LogicalResult TpSumOp::buildBackward(OpBuilder &builder, ValueRange resultGrads, ArrayRef<bool> wanted,
                                     SmallVectorImpl<Value> &operandGrads) {
  // Every rank's readers of the sum contribute to its gradient, and every rank's part enters
  // the sum alike: the part's gradient is the sum of the readers' over the axis.
  operandGrads.assign(1, Value());
  if (wanted[0] && resultGrads[0])
    operandGrads[0] = builder.create<TpSumOp>(getLoc(), resultGrads[0], getAxisAttr());
  return success();
}

/// The backward of a slice or a placement of feature columns: the other one, on the gradient.
template <typename Adjoint, typename Op>
static LogicalResult featuresBackward(Op op, OpBuilder &builder, ValueRange resultGrads, ArrayRef<bool> wanted,
                                      SmallVectorImpl<Value> &operandGrads) {
  operandGrads.assign(1, Value());
  if (!wanted[0] || !resultGrads[0])
    return success();
  auto type = cast<RankedTensorType>(op.getInput().getType())
                  .clone(cast<RankedTensorType>(resultGrads[0].getType()).getElementType());
  operandGrads[0] = builder.create<Adjoint>(op.getLoc(), type, resultGrads[0], op.getAxisAttr(), op.getPiecesAttr(),
                                            op.getRanksAttr());
  return success();
}

LogicalResult TpSliceFeaturesOp::buildBackward(OpBuilder &builder, ValueRange resultGrads, ArrayRef<bool> wanted,
                                               SmallVectorImpl<Value> &operandGrads) {
  // This rank's columns' gradient, in place in the whole input's (zeros elsewhere).
  return featuresBackward<TpPlaceFeaturesOp>(*this, builder, resultGrads, wanted, operandGrads);
}

LogicalResult TpPlaceFeaturesOp::buildBackward(OpBuilder &builder, ValueRange resultGrads, ArrayRef<bool> wanted,
                                               SmallVectorImpl<Value> &operandGrads) {
  return featuresBackward<TpSliceFeaturesOp>(*this, builder, resultGrads, wanted, operandGrads);
}

/// The backward of a gather or a slice of token rows: the other one, on the gradient.
template <typename Adjoint>
static LogicalResult rowsBackward(Operation *op, OpBuilder &builder, ValueRange resultGrads, ArrayRef<bool> wanted,
                                  SmallVectorImpl<Value> &operandGrads) {
  operandGrads.assign(1, Value());
  if (wanted[0] && resultGrads[0])
    operandGrads[0] = builder.create<Adjoint>(op->getLoc(), resultGrads[0], op->getAttrOfType<StringAttr>("axis"));
  return success();
}

LogicalResult TpGatherOp::buildBackward(OpBuilder &builder, ValueRange resultGrads, ArrayRef<bool> wanted,
                                        SmallVectorImpl<Value> &operandGrads) {
  // Every rank computed the same from the gathered rows: its rows' gradient is its slice.
  return rowsBackward<TpSliceOp>(*this, builder, resultGrads, wanted, operandGrads);
}

LogicalResult TpSliceOp::buildBackward(OpBuilder &builder, ValueRange resultGrads, ArrayRef<bool> wanted,
                                       SmallVectorImpl<Value> &operandGrads) {
  // Every rank computed the whole input; each has its rows' gradient: gathered.
  return rowsBackward<TpGatherOp>(*this, builder, resultGrads, wanted, operandGrads);
}

LogicalResult EpSendOp::buildBackward(OpBuilder &builder, ValueRange resultGrads, ArrayRef<bool> wanted,
                                      SmallVectorImpl<Value> &operandGrads) {
  // Every rank a token went to contributes to its gradient: their rows come back, summed.
  operandGrads.assign(2, Value());
  if (wanted[0] && resultGrads[0])
    operandGrads[0] = builder.create<EpReturnOp>(getLoc(), getInput().getType(), resultGrads[0], getLayout(),
                                                 getAxisAttr(), getRanksAttr());
  return success();
}

LogicalResult EpReturnOp::buildBackward(OpBuilder &builder, ValueRange resultGrads, ArrayRef<bool> wanted,
                                        SmallVectorImpl<Value> &operandGrads) {
  // A token's sum depends on each rank's row alike: its gradient goes out to each of them (in
  // the gradient's element type: an f32 sum added to a bf16 residual gets a bf16 gradient).
  operandGrads.assign(2, Value());
  if (wanted[0] && resultGrads[0]) {
    auto rows = RankedTensorType::get(cast<RankedTensorType>(getInput().getType()).getShape(),
                                      cast<RankedTensorType>(resultGrads[0].getType()).getElementType());
    operandGrads[0] =
        builder.create<EpSendOp>(getLoc(), rows, resultGrads[0], getLayout(), getAxisAttr(), getRanksAttr());
  }
  return success();
}

LogicalResult TokenBlocksOp::buildBackward(OpBuilder &builder, ValueRange resultGrads, ArrayRef<bool> wanted,
                                          SmallVectorImpl<Value> &operandGrads) {
  // The blocks' gradients, joined. The blocks of one tensor are used alike (each by its own
  // copy of the same computation), so either all of them get a gradient or none does.
  operandGrads.assign(1, Value());
  size_t arriving = llvm::count_if(resultGrads, [](Value g) { return static_cast<bool>(g); });
  if (!wanted[0] || arriving == 0)
    return success();
  if (arriving != resultGrads.size())
    return emitOpError("gets a gradient for ") << arriving << " of its " << resultGrads.size()
                                               << " blocks; the backward needs all of them";
  operandGrads[0] = builder.create<ConcatTokensOp>(getLoc(), getInput().getType(), resultGrads);
  return success();
}

LogicalResult ConcatTokensOp::buildBackward(OpBuilder &builder, ValueRange resultGrads, ArrayRef<bool> wanted,
                                            SmallVectorImpl<Value> &operandGrads) {
  operandGrads.assign(getBlocks().size(), Value());
  if (!resultGrads[0] || llvm::none_of(wanted, [](bool w) { return w; }))
    return success();
  auto split = builder.create<TokenBlocksOp>(getLoc(), getBlocks().getTypes(), resultGrads[0]);
  for (auto [k, grad] : llvm::enumerate(split.getBlocks()))
    if (wanted[k])
      operandGrads[k] = grad;
  return success();
}

static ParamOp lookupParam(WeightOp weight) {
  return SymbolTable::lookupNearestSymbolFrom<ParamOp>(weight, weight.getParamAttr());
}

bool RouterOp::backwardUsesResults() { return true; }

// With its statistics saved, the backward reads them and the result (D = dO . O) instead of
// running the forward's key loop again.
bool AttentionOp::backwardUsesResults() { return static_cast<bool>(getLogsumexp()); }
bool MLAOp::backwardUsesResults() { return static_cast<bool>(getLogsumexp()); }
bool SparseAttentionOp::backwardUsesResults() { return static_cast<bool>(getLogsumexp()); }

// The saved per-row logsumexp spares the backward a reduction over every row of logits.
bool LMHeadCrossEntropyOp::backwardUsesResults() { return true; }

bool WeightOp::isGradientSource() {
  ParamOp param = lookupParam(*this);
  return param && param.getTrainable();
}

LogicalResult WeightOp::buildBackward(OpBuilder &builder, ValueRange resultGrads,
                                      ArrayRef<bool>, SmallVectorImpl<Value> &) {
  // Frozen parameters never get here: their reads are not gradient sources.
  if (resultGrads[0] && isGradientSource())
    builder.create<ParamGradOp>(getLoc(), getParamAttr(), resultGrads[0]);
  return success();
}

bool ApplyLayerOp::isGradientSource() {
  auto layer = SymbolTable::lookupNearestSymbolFrom<LayerOp>(*this, getCalleeAttr());
  if (!layer)
    return false;
  return llvm::any_of(layer.getBody().getOps<ParamOp>(),
                      [](ParamOp param) { return param.getTrainable(); });
}

LogicalResult ApplyLayerOp::buildBackward(OpBuilder &builder, ValueRange resultGrads,
                                          ArrayRef<bool> wanted,
                                          SmallVectorImpl<Value> &operandGrads) {
  // The training forward template returns (output, saved values...); its
  // backward template takes (inputs..., saved values..., d output) and
  // returns the gradient of each differentiable input.
  operandGrads.assign(getNumOperands(), Value());
  if (!resultGrads[0])
    return success();
  auto layer = SymbolTable::lookupNearestSymbolFrom<LayerOp>(*this, getCalleeAttr());
  auto backwardName = layer ? layer->getAttrOfType<FlatSymbolRefAttr>(kBackwardTemplateAttr)
                            : FlatSymbolRefAttr();
  auto backward = backwardName
                      ? SymbolTable::lookupNearestSymbolFrom<LayerOp>(*this, backwardName)
                      : LayerOp();
  if (!backward)
    return emitOpError("layer '") << getCallee()
                                  << "' has no backward template; run it through "
                                     "--moe-build-training-step";
  SmallVector<Value> operands(getOperands());
  llvm::append_range(operands, getResults().drop_front());
  operands.push_back(resultGrads[0]);
  auto call = builder.create<ApplyLayerOp>(getLoc(), backward.getResultTypes(), backwardName,
                                           getIndexAttr(), operands);
  unsigned next = 0;
  for (unsigned i = 0; i < getNumOperands(); ++i)
    if (isFloatTensor(getOperand(i).getType())) {
      if (next < call.getNumResults() && wanted[i])
        operandGrads[i] = call.getResult(next);
      ++next;
    }
  return success();
}

//===----------------------------------------------------------------------===//
// Training ops
//===----------------------------------------------------------------------===//

std::string BackwardOp::getKernelName() {
  return getForward().str().substr(getForward().starts_with("moe.") ? 4 : 0) + ".backward";
}

LogicalResult BackwardOp::verify() {
  ArrayRef<int64_t> ofInputs = getGradOfInputs(), ofOutputs = getGradOfOutputs();
  if (ofInputs.size() != getNumResults())
    return emitOpError("has ") << getNumResults() << " results but grad_of_inputs lists "
                               << ofInputs.size() << " inputs";
  if (ofOutputs.size() != getOutputGrads().size())
    return emitOpError("has ") << getOutputGrads().size()
                               << " output gradients but grad_of_outputs lists " << ofOutputs.size();
  int64_t previous = -1;
  for (auto [result, index] : llvm::zip(getResults(), ofInputs)) {
    if (index <= previous || index >= static_cast<int64_t>(getInputs().size()))
      return emitOpError("grad_of_inputs must be increasing input indices below ")
             << getInputs().size();
    if (result.getType() != getInputs()[index].getType())
      return emitOpError("gradient of input ") << index << " has type " << result.getType()
                                               << " but the input is "
                                               << getInputs()[index].getType();
    previous = index;
  }
  return success();
}

LogicalResult ParamGradOp::verifySymbolUses(SymbolTableCollection &symbols) {
  Operation *table = SymbolTable::getNearestSymbolTable((*this)->getParentOp());
  auto param = symbols.lookupSymbolIn<ParamOp>(table, getParamAttr());
  if (!param)
    return emitOpError("'") << getParam() << "' does not name a moe.param in the enclosing "
                            << table->getName();
  if (!param.getTrainable())
    return emitOpError("parameter '") << getParam()
                                      << "' is frozen; only trainable parameters have gradients";
  // A parameter split over the mesh has a gradient of this rank's part.
  if (param.getLocalType() != getGrad().getType())
    return emitOpError("gradient type ") << getGrad().getType() << " differs from parameter '"
                                         << getParam() << "' of type " << param.getLocalType();
  return success();
}

LogicalResult OptimizerOp::verify() {
  if (getKind() != "adamw")
    return emitOpError("kind must be \"adamw\", got \"") << getKind() << "\"";
  if (getSchedule() != "cosine" && getSchedule() != "constant")
    return emitOpError("schedule must be \"cosine\" or \"constant\", got \"") << getSchedule() << "\"";
  auto inRange = [](const APFloat &v, double lo, double hi) {
    double d = v.convertToDouble();
    return d >= lo && d < hi;
  };
  if (!(getLr().convertToDouble() > 0))
    return emitOpError("lr must be positive");
  if (!inRange(getBeta1(), 0, 1) || !inRange(getBeta2(), 0, 1))
    return emitOpError("beta1 and beta2 must be in [0, 1)");
  if (!(getEps().convertToDouble() > 0))
    return emitOpError("eps must be positive");
  if (getWeightDecay().convertToDouble() < 0 || getMaxGradNorm().convertToDouble() < 0)
    return emitOpError("weight_decay and max_grad_norm must not be negative");
  if (!inRange(getMinLrRatio(), 0, 1.0000001))
    return emitOpError("min_lr_ratio must be in [0, 1]");
  if (static_cast<int64_t>(getWarmupSteps()) < 0 ||
      static_cast<int64_t>(getTotalSteps()) <= 0 ||
      static_cast<int64_t>(getWarmupSteps()) > static_cast<int64_t>(getTotalSteps()))
    return emitOpError("need 0 <= warmup_steps <= total_steps and total_steps > 0, got ")
           << static_cast<int64_t>(getWarmupSteps()) << " and "
           << static_cast<int64_t>(getTotalSteps());
  return success();
}

} // namespace moec::moe

#include "dialects/moe/MoeInterfaces.cpp.inc"
