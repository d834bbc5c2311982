//===- Differentiate.cpp - reverse mode over straight-line moe IR ---------===//

#include "passes/build_training_step/Differentiate.h"

#include "llvm/ADT/ScopeExit.h"
#include "llvm/ADT/SmallPtrSet.h"
#include "llvm/ADT/TypeSwitch.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

using namespace mlir;

namespace moec::passes {

namespace {

/// Adds `grad` to the gradient of `value`: a value used twice (a residual) receives the sum.
void accumulate(OpBuilder &builder, Location loc, llvm::DenseMap<Value, Value> &grads, Value value, Value grad) {
  Value &sum = grads[value];
  sum = sum ? builder.create<moe::AddOp>(loc, sum, grad).getResult() : grad;
}

/// Gated SiLU experts with a separate gate and nothing else (no bias, no LoRA): the form whose
/// gate and up products the CUDA kernels run as one (and whose pre-activations can be saved).
bool isPlainGatedSilu(moe::ExpertMLPOp experts) {
  return experts.getGate() && experts->getNumOperands() == 5 && experts.getActivation() == moe::Activation::silu &&
         !experts.getFusedGateUp() && !experts.getInOutLayout();
}

/// Whether the policy gives this expert MLP's combine the fused backward (fuseExpertBackward).
bool fusesWithCombine(moe::ExpertMLPOp experts, ExpertBackward policy) {
  if (policy == ExpertBackward::Separate || !experts.getResult().hasOneUse() ||
      !isa<moe::CombineOp>(*experts.getResult().getUsers().begin()))
    return false;
  auto tokens = cast<RankedTensorType>(experts.getTokens().getType());
  return policy == ExpertBackward::Fused || (tokens.getElementType().isBF16() && isPlainGatedSilu(experts));
}

/// The backward of a moe.combine of a moe.expert_mlp's outputs (read by nothing else) as one
/// moe.backward "moe.expert_mlp_combine": inputs the expert MLP's operands, then the combine's
/// indices and weights; gradients of the expert MLP's operands that need one and of the weights.
/// The weights' gradient, dy . (expert output), comes from the experts' own backward, so the
/// expert outputs are not a value the backward reads (not saved). False where the pattern does
/// not hold (the default rules then apply).
bool fuseExpertBackward(moe::CombineOp combine, Value resultGrad, const llvm::DenseSet<Value> &active,
                        OpBuilder &builder, llvm::DenseMap<Value, Value> &grads, ExpertBackward policy) {
  auto experts = combine.getExpertOutput().getDefiningOp<moe::ExpertMLPOp>();
  // Auto: the CUDA kernel's one-pass form only.
  if (!resultGrad || !experts || !fusesWithCombine(experts, policy) || !active.contains(experts.getResult()))
    return false;
  auto expertRule = cast<moe::DifferentiableOpInterface>(experts.getOperation());
  SmallVector<int64_t> inputs;
  SmallVector<Type> types;
  SmallVector<Value> operands(experts->getOperands());
  for (auto [index, operand] : llvm::enumerate(operands))
    if (expertRule.isDifferentiableOperand(index) && active.contains(operand)) {
      inputs.push_back(index);
      types.push_back(operand.getType());
    }
  if (inputs.empty())
    return false;
  operands.push_back(combine.getIndices());
  operands.push_back(combine.getWeights());
  if (cast<moe::DifferentiableOpInterface>(combine.getOperation()).isDifferentiableOperand(2) &&
      active.contains(combine.getWeights())) {
    inputs.push_back(static_cast<int64_t>(operands.size()) - 1);
    types.push_back(combine.getWeights().getType());
  }
  SmallVector<NamedAttribute> attrs(experts->getAttrs()); // operandSegmentSizes: the experts' groups
  // Saved pre-activations (saveExpertPreActivations) spare the backward the gate and up products.
  SmallVector<Value> saved;
  if (Value pre = experts.getPreActivations())
    saved.push_back(pre);
  auto backward = builder.create<moe::BackwardOp>(
      combine.getLoc(), types, builder.getStringAttr("moe.expert_mlp_combine"), builder.getDictionaryAttr(attrs),
      builder.getDenseI64ArrayAttr(inputs), builder.getDenseI64ArrayAttr({0}), operands, saved,
      ValueRange{resultGrad});
  for (auto [result, index] : llvm::zip(backward.getResults(), inputs))
    accumulate(builder, combine.getLoc(), grads, operands[index], result);
  return true;
}

} // namespace

LogicalResult differentiate(ArrayRef<Operation *> ops, const llvm::DenseSet<Value> &sources,
                            OpBuilder &builder, llvm::DenseMap<Value, Value> &grads,
                            ExpertBackward experts) {
  // Activity: which values depend on something that has a gradient.
  llvm::DenseSet<Value> active(sources.begin(), sources.end());
  for (Operation *op : ops) {
    auto rule = dyn_cast<moe::DifferentiableOpInterface>(op);
    if (!rule)
      continue;
    bool isActive = rule.isGradientSource();
    for (unsigned i = 0; i < op->getNumOperands() && !isActive; ++i)
      isActive = rule.isDifferentiableOperand(i) && active.contains(op->getOperand(i));
    if (isActive)
      for (Value result : op->getResults())
        if (moe::isFloatTensor(result.getType()))
          active.insert(result);
  }

  for (Operation *op : llvm::reverse(ops)) {
    SmallVector<Value> resultGrads;
    bool any = false;
    for (Value result : op->getResults()) {
      resultGrads.push_back(active.contains(result) ? grads.lookup(result) : Value());
      any |= static_cast<bool>(resultGrads.back());
    }
    if (!any)
      continue;
    if (auto combine = dyn_cast<moe::CombineOp>(op);
        combine && experts != ExpertBackward::Separate &&
        fuseExpertBackward(combine, resultGrads[0], active, builder, grads, experts))
      continue; // the expert MLP's result gets no gradient: the sweep skips it
    auto rule = dyn_cast<moe::DifferentiableOpInterface>(op);
    if (!rule)
      return op->emitOpError("has no differentiation rule (DifferentiableOpInterface), but a "
                             "gradient reaches it");
    SmallVector<bool> wanted;
    for (unsigned i = 0; i < op->getNumOperands(); ++i)
      wanted.push_back(rule.isDifferentiableOperand(i) && active.contains(op->getOperand(i)));
    SmallVector<Value> operandGrads;
    if (failed(rule.buildBackward(builder, resultGrads, wanted, operandGrads)))
      return failure();
    for (auto [operand, grad] : llvm::zip(op->getOperands(), operandGrads))
      if (grad)
        accumulate(builder, op->getLoc(), grads, operand, grad);
  }
  return success();
}

StringRef toString(Recompute policy) {
  switch (policy) {
  case Recompute::None:
    return "none";
  case Recompute::Regather:
    return "regather";
  case Recompute::PerLayer:
    return "per-layer";
  }
  llvm_unreachable("a recompute policy");
}

namespace {

/// Results that decide which experts or keys a token uses. Saved even under
/// recomputation: re-deciding them could pick different experts in the backward.
bool isRouting(Operation *op) { return isa<moe::RouterOp, moe::DSAIndexerOp>(op); }

/// What the regather policy runs again in the backward instead of saving: the dispatch's gather
/// (top-k rows per token from the saved tokens and routing) and the norms and RoPE (per-row
/// work on inputs the backward mostly keeps anyway: the layer input, a projection that its
/// norm's backward reads). Each re-run is a cheap pass over one activation.
bool rerunUnderRegather(Operation *op) {
  return isa<moe::DispatchOp, moe::RMSNormOp, moe::ShardedRMSNormOp, moe::RopeOp>(op);
}

/// Sequence parallel's gathers of a tp rank's rows: under any policy the backward gathers them
/// again (an all-gather) from the saved rows rather than keep every row of every layer.
bool regatheredRows(Operation *op) {
  auto enter = dyn_cast<moe::TpEnterOp>(op);
  return (enter && enter.getRows()) || isa<moe::TpGatherOp>(op);
}

/// Whether a forward op's results are read by an op of the backward.
bool readByBackward(Operation *op, const llvm::SmallPtrSetImpl<Operation *> &isForward) {
  return llvm::any_of(op->getUsers(), [&](Operation *user) { return !isForward.contains(user); });
}

moe::LayerOp cloneTemplate(moe::LayerOp layer, StringRef name, IRMapping &mapping) {
  auto copy = cast<moe::LayerOp>(layer->clone(mapping));
  copy.setSymName(name);
  return copy;
}

/// `op` again with its logsumexp result ([T, heads], f32) added.
template <typename OpTy> void addLogsumexp(OpTy op) {
  OpBuilder b(op);
  auto query = cast<RankedTensorType>(op.getQuery().getType());
  auto lse = RankedTensorType::get({query.getDimSize(0), op.getNumHeads()}, b.getF32Type());
  auto saving = b.create<OpTy>(op.getLoc(), TypeRange{op.getResult().getType(), lse}, op->getOperands(),
                               op->getAttrs());
  op.getResult().replaceAllUsesWith(saving.getResult());
  op->erase();
}

/// Gives each attention (grouped-query or latent, dense or sparse) of `layer` its logsumexp
/// result: its backward then reads the softmax statistics instead of running the key loop of
/// the forward again.
void saveAttentionStatistics(moe::LayerOp layer) {
  SmallVector<Operation *> attentions;
  layer.walk([&](Operation *op) {
    if (isa<moe::AttentionOp, moe::MLAOp, moe::SparseAttentionOp>(op) && op->getNumResults() == 1)
      attentions.push_back(op);
  });
  for (Operation *op : attentions)
    llvm::TypeSwitch<Operation *>(op)
        .Case([](moe::AttentionOp a) { addLogsumexp(a); })
        .Case([](moe::MLAOp a) { addLogsumexp(a); })
        .Case([](moe::SparseAttentionOp a) { addLogsumexp(a); });
}

/// The policy of the model's expert backward (its `expert_backward` attribute).
ExpertBackward expertPolicy(Operation *model) {
  auto policy = model->getAttrOfType<StringAttr>(kExpertBackward);
  return !policy                       ? ExpertBackward::Separate
         : policy.getValue() == "fused" ? ExpertBackward::Fused
         : policy.getValue() == "auto"  ? ExpertBackward::Auto
                                        : ExpertBackward::Separate;
}

/// `experts` again with (pre_activations) or without (Type()) its pre-activations result.
void rebuildExperts(moe::ExpertMLPOp experts, Type preActivations) {
  OpBuilder b(experts);
  SmallVector<Type, 2> types = {experts.getResult().getType()};
  if (preActivations)
    types.push_back(preActivations);
  auto copy = b.create<moe::ExpertMLPOp>(experts.getLoc(), types, experts->getOperands(), experts->getAttrs());
  experts.getResult().replaceAllUsesWith(copy.getResult());
  experts->erase();
}

/// Gives each plain gated SiLU expert MLP of `layer` whose backward is fused with its combine's
/// its pre_activations result, [rows, 2 I] f32: that backward then reads the gate's and up's
/// products instead of running them again (the largest product of an MoE layer's backward, at
/// the cost of two [rows, I] f32 activations saved). f32, the accumulators themselves: the
/// backward computes exactly what it would from the products again (bf16 copies moved two bf16
/// alignments past their tolerance on the CPU). Only for layers that save (recompute=none):
/// a layer that recomputes would run the whole expert MLP again to get them.
void saveExpertPreActivations(moe::LayerOp layer, ExpertBackward policy) {
  SmallVector<moe::ExpertMLPOp> experts;
  layer.walk([&](moe::ExpertMLPOp op) {
    if (!op.getPreActivations() && isPlainGatedSilu(op) && fusesWithCombine(op, policy))
      experts.push_back(op);
  });
  for (moe::ExpertMLPOp op : experts) {
    auto tokens = cast<RankedTensorType>(op.getTokens().getType());
    int64_t inter = cast<RankedTensorType>(op.getGate().getType()).getDimSize(1);
    rebuildExperts(op, RankedTensorType::get({tokens.getDimSize(0), 2 * inter}, Float32Type::get(op.getContext())));
  }
}

/// `op` again without its logsumexp result.
template <typename OpTy> void dropLogsumexp(OpTy op) {
  OpBuilder b(op);
  auto plain = b.create<OpTy>(op.getLoc(), TypeRange{op.getResult().getType()}, op->getOperands(), op->getAttrs());
  op.getResult().replaceAllUsesWith(plain.getResult());
  op->erase();
}

/// Drops the logsumexp and pre-activation results nothing reads (a forward that recomputes its
/// attention in the backward does not save them).
void dropUnreadStatistics(moe::LayerOp layer) {
  SmallVector<Operation *> unread;
  layer.walk([&](Operation *op) {
    if (isa<moe::AttentionOp, moe::MLAOp, moe::SparseAttentionOp, moe::ExpertMLPOp>(op) &&
        op->getNumResults() == 2 && op->getResult(1).use_empty())
      unread.push_back(op);
  });
  for (Operation *op : unread)
    llvm::TypeSwitch<Operation *>(op)
        .Case([](moe::AttentionOp a) { dropLogsumexp(a); })
        .Case([](moe::MLAOp a) { dropLogsumexp(a); })
        .Case([](moe::SparseAttentionOp a) { dropLogsumexp(a); })
        .Case([](moe::ExpertMLPOp e) { rebuildExperts(e, Type()); });
}

} // namespace

FailureOr<LayerTraining> getOrBuildLayerTraining(moe::LayerOp layer, Recompute policy) {
  if (policy == Recompute::Regather) {
    bool any = false;
    layer.walk([&](moe::DispatchOp dispatch) {
      any |= llvm::any_of(dispatch->getUsers(), [](Operation *user) { return isa<moe::ExpertMLPOp>(user); });
    });
    if (!any) // nothing to gather again: the saving pair
      return getOrBuildLayerTraining(layer, Recompute::None);
  }
  std::string suffix = policy == Recompute::None       ? ""
                       : policy == Recompute::Regather ? "_regather"
                                                       : "_recompute";
  std::string forwardName = (layer.getSymName() + "_fwd" + suffix).str();
  std::string backwardName = (layer.getSymName() + "_bwd" + suffix).str();
  Operation *model = layer->getParentOp();
  auto existingForward = dyn_cast_or_null<moe::LayerOp>(SymbolTable::lookupSymbolIn(model, forwardName));
  auto existingBackward = dyn_cast_or_null<moe::LayerOp>(SymbolTable::lookupSymbolIn(model, backwardName));
  if (existingForward && existingBackward)
    return LayerTraining{existingForward, existingBackward};
  if (existingForward || existingBackward)
    return layer.emitOpError("has only one of its training templates '")
           << forwardName << "' and '" << backwardName << "'";
  if (layer.getNumResults() != 1)
    return layer.emitOpError("a layer template to train must return one value, it returns ")
           << layer.getNumResults();

  // Both templates are copies of `source`: the layer with what its training saves for the
  // backward added (attention statistics, expert pre-activations).
  IRMapping toSource;
  moe::LayerOp source = cloneTemplate(layer, layer.getSymName(), toSource);
  saveAttentionStatistics(source);
  ExpertBackward experts = expertPolicy(model);
  if (policy == Recompute::None)
    saveExpertPreActivations(source, experts);
  auto dropSource = llvm::make_scope_exit([&] { source->destroy(); });

  // The backward starts as a full copy of the forward: differentiate it, then
  // turn the forward values it reads into arguments (saved) or keep them
  // (recomputed), and drop the rest.
  IRMapping toBackward;
  moe::LayerOp backward = cloneTemplate(source, backwardName, toBackward);
  OpBuilder builder(layer);
  builder.setInsertionPointAfter(layer);
  builder.insert(backward);
  Block &body = backward.getBody().front();
  auto yield = cast<moe::YieldOp>(body.getTerminator());
  Location loc = layer.getLoc();

  SmallVector<Operation *> forwardOps;
  llvm::SmallPtrSet<Operation *, 32> isForward;
  for (Operation &op : body.without_terminator())
    if (!isa<moe::ParamOp>(op)) {
      forwardOps.push_back(&op);
      isForward.insert(&op);
    }
  llvm::DenseSet<Value> sources;
  SmallVector<BlockArgument> floatInputs;
  for (BlockArgument arg : body.getArguments())
    if (moe::isFloatTensor(arg.getType())) {
      sources.insert(arg);
      floatInputs.push_back(arg);
    }
  Value output = yield.getOperand(0);
  BlockArgument outputGrad = body.addArgument(output.getType(), loc);
  llvm::DenseMap<Value, Value> grads;
  grads[output] = outputGrad;
  builder.setInsertionPoint(yield);
  if (failed(differentiate(forwardOps, sources, builder, grads, experts)))
    return failure();
  SmallVector<Value> inputGrads;
  for (BlockArgument arg : floatInputs) {
    Value grad = grads.lookup(arg);
    if (!grad)
      return layer.emitOpError("output does not depend on input ") << arg.getArgNumber();
    inputGrads.push_back(grad);
  }
  yield->setOperands(inputGrads);

  // Saved values, in forward order. Parameter reads are never saved: the
  // backward reads the parameter again.
  llvm::DenseMap<Value, Value> toForwardValue;
  for (auto [original, copy] : toBackward.getValueMap())
    toForwardValue[copy] = original;
  // Regather: the dispatches, norms and RoPE whose results the backward reads (itself or
  // through another of them) stay in it (recomputed); what they read is saved in their place.
  llvm::SmallPtrSet<Operation *, 8> regathered;
  for (Operation *op : llvm::reverse(forwardOps))
    if (((policy == Recompute::Regather && rerunUnderRegather(op)) || regatheredRows(op)) &&
        (readByBackward(op, isForward) ||
         llvm::any_of(op->getUsers(), [&](Operation *user) { return regathered.contains(user); })))
      regathered.insert(op);
  SmallVector<Value> saved;
  for (Operation *op : forwardOps) {
    if (isa<moe::WeightOp>(op))
      continue;
    for (Value result : op->getResults()) {
      bool usedByBackward = llvm::any_of(result.getUsers(), [&](Operation *user) {
        return !isForward.contains(user) || regathered.contains(user);
      });
      bool keep = policy == Recompute::PerLayer ? isRouting(op) && !result.use_empty()
                                                : usedByBackward && !regathered.contains(op);
      if (keep)
        saved.push_back(result);
    }
  }
  SmallVector<Value> savedInForward;
  for (Value value : saved) {
    BlockArgument arg = body.insertArgument(outputGrad.getArgNumber(), value.getType(), loc);
    value.replaceAllUsesWith(arg);
    savedInForward.push_back(toForwardValue.lookup(value));
  }

  // Drop forward ops nothing reads any more; mark the ones that stay.
  for (Operation *op : llvm::reverse(forwardOps)) {
    if (op->use_empty() && isMemoryEffectFree(op))
      op->erase();
    else if (!isa<moe::WeightOp>(op))
      op->setAttr("recomputed", builder.getUnitAttr());
  }
  for (auto param : llvm::make_early_inc_range(body.getOps<moe::ParamOp>()))
    if (SymbolTable::symbolKnownUseEmpty(param, backward))
      param->erase();
  backward.setFunctionTypeAttr(TypeAttr::get(
      builder.getFunctionType(body.getArgumentTypes(), TypeRange(ValueRange(inputGrads)))));

  // The forward returns its output and the saved values.
  IRMapping toForward;
  moe::LayerOp forward = cloneTemplate(source, forwardName, toForward);
  builder.setInsertionPointAfter(layer);
  builder.insert(forward);
  auto forwardYield = cast<moe::YieldOp>(forward.getBody().front().getTerminator());
  for (Value value : savedInForward)
    forwardYield->insertOperands(forwardYield->getNumOperands(), toForward.lookup(value));
  dropUnreadStatistics(forward);
  forward.setFunctionTypeAttr(TypeAttr::get(builder.getFunctionType(
      layer.getArgumentTypes(), forwardYield->getOperandTypes())));
  forward->setAttr(moe::kBackwardTemplateAttr, FlatSymbolRefAttr::get(backward.getSymNameAttr()));
  forward->setAttr("layer_template", FlatSymbolRefAttr::get(layer.getSymNameAttr()));
  forward->setAttr("recompute", builder.getStringAttr(toString(policy)));
  backward->setAttr("recompute", builder.getStringAttr(toString(policy)));
  return LayerTraining{forward, backward};
}

} // namespace moec::passes
