//===- PropagateSharding.cpp - the mesh and expert parallelism ------------===//

#include "passes/propagate_sharding/PropagateSharding.h"

#include "compiler/analysis/ModelSummary.h"
#include "dialects/moe/MeshShape.h"
#include "passes/propagate_sharding/SequenceParallel.h"
#include "passes/propagate_sharding/TensorParallel.h"
#include "llvm/ADT/SmallBitVector.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FormatVariadic.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"

#define DEBUG_TYPE "moe-propagate-sharding"

namespace moec::passes {

#define GEN_PASS_DEF_PROPAGATESHARDINGPASS
#include "passes/propagate_sharding/PropagateSharding.h.inc"

namespace {

using namespace mlir;

struct PropagateShardingPass : impl::PropagateShardingPassBase<PropagateShardingPass> {
  using PropagateShardingPassBase::PropagateShardingPassBase;

  void runOnOperation() override {
    moe::ModelOp model = getOperation();
    moe::MeshShape shape;
    std::string error;
    if (!moe::MeshShape::parse(mesh, shape, error)) {
      model.emitError("--moe-propagate-sharding: mesh '") << mesh << "': " << error;
      return signalPassFailure();
    }
    // pp needs no sharding here: --moe-schedule-pipeline splits the step into stages.
    if (SymbolTable::lookupSymbolIn(model, "train_step")) {
      model.emitError("--moe-propagate-sharding: runs before --moe-build-training-step (the step "
                      "differentiates through the collectives); the model already has @train_step");
      return signalPassFailure();
    }
    if (model->hasAttr("mesh")) {
      model.emitError("--moe-propagate-sharding: the model is placed already (mesh = ")
          << model->getAttr("mesh") << ")";
      return signalPassFailure();
    }
    OpBuilder b(model.getContext());
    model->setAttr("mesh", b.getStringAttr(shape.spec()));
    if (epExchange != "auto" && epExchange != "routed" && epExchange != "all") {
      model.emitError("--moe-propagate-sharding: ep-exchange must be auto, routed or all, got '")
          << epExchange << "'";
      return signalPassFailure();
    }
    if (epCapacityFactor != 0 && (shape.ep < 2 || !(epCapacityFactor >= 1.0))) {
      model.emitError("--moe-propagate-sharding: ep-capacity-factor bounds the expert exchange's room: it needs "
                      "ep > 1 and a factor of at least 1 (0: room for every token), got ")
          << epCapacityFactor << " on mesh " << shape.str();
      return signalPassFailure();
    }
    if (epCapacityFactor != 0 && epExchange == "all") {
      model.emitError("--moe-propagate-sharding: ep-capacity-factor bounds the routed exchange; ep-exchange all "
                      "sends every token to every rank (fixed room)");
      return signalPassFailure();
    }
    if (tokenBlocks < 1 || (tokenBlocks > 1 && shape.ep < 2)) {
      model.emitError("--moe-propagate-sharding: token-blocks must be 1, or more with ep > 1 (it splits the "
                      "expert exchange), got ")
          << static_cast<int64_t>(tokenBlocks) << " on mesh " << shape.str();
      return signalPassFailure();
    }
    if (shape.ep > 1 && failed(splitExperts(model, shape.ep)))
      return signalPassFailure();
    if (sequenceParallel && shape.tp < 2) {
      model.emitError("--moe-propagate-sharding: sequence-parallel needs tp > 1 (it splits the tokens over tp); mesh ")
          << shape.str();
      return signalPassFailure();
    }
    if (!tpReplicate.empty() && shape.tp < 2) {
      model.emitError("--moe-propagate-sharding: tp-replicate keeps tensor-parallel regions whole; it needs tp > 1, "
                      "mesh ")
          << shape.str();
      return signalPassFailure();
    }
    if (failed(annotateReplicated(model, SmallVector<std::string>(tpReplicate.begin(), tpReplicate.end()))))
      return signalPassFailure();
    if (shape.tp > 1 && failed(splitHeads(model, shape.tp)))
      return signalPassFailure();
    if (sequenceParallel && failed(applySequenceParallel(model)))
      return signalPassFailure();
  }

  /// Tensor parallel: every attention (grouped-query or latent) whose projections can be traced
  /// splits its heads, every dense MLP and every expert MLP not split over ep its intermediate
  /// features; the rest stays
  /// replicated (each tp rank computes it), with a warning naming what and why.
  LogicalResult splitHeads(moe::ModelOp model, int64_t ranks) {
    FailureOr<HeadSplitReport> report = splitAttentionHeads(model, ranks);
    if (failed(report))
      return failure();
    if (report->split.empty()) {
      InFlightDiagnostic error = model.emitError("--moe-propagate-sharding: tp = ")
                                 << ranks
                                 << " splits attention heads (moe.attention, moe.mla, moe.sparse_attention, moe.kda, moe.gated_delta_net, moe.mamba2), dense MLPs "
                                    "and expert MLPs, and ";
      if (report->kept.empty())
        error << "this model has none to split (experts split over ep stay whole"
              << (report->replicated.empty() ? "" : "; the rest is annotated moe.tp_replicated") << ")";
      for (const auto &[what, why] : report->kept)
        error << "@" << what << " cannot: " << why << "; ";
      return error;
    }
    for (const auto &[what, why] : report->kept)
      model.emitWarning("--moe-propagate-sharding: tp = ")
          << ranks << " keeps @" << what << " whole on every tp rank: " << why;
    for (const std::string &what : report->replicated)
      model.emitRemark("--moe-propagate-sharding: tp = ")
          << ranks << " keeps @" << what << " whole on every tp rank, as annotated (moe.tp_replicated)";
    return success();
  }

  /// Splits every expert MLP's parameters over ep and sends each token to its experts' ranks.
  LogicalResult splitExperts(moe::ModelOp model, int64_t ranks) {
    bool warnedFixedRoom = false;
    SmallVector<moe::ExpertMLPOp> mlps;
    model.walk([&](moe::ExpertMLPOp op) { mlps.push_back(op); });
    if (mlps.empty()) {
      model.emitError("--moe-propagate-sharding: ep = ") << ranks << " but the model has no routed experts";
      return failure();
    }
    OpBuilder b(model.getContext());
    StringAttr axis = b.getStringAttr("ep");
    IntegerAttr ranksAttr = b.getI64IntegerAttr(ranks);
    auto placement = model->getAttrOfType<DictionaryAttr>("expert_placement");
    if (model->hasAttr("expert_placement") && !placement)
      return model.emitError("--moe-propagate-sharding: expert_placement must be a dictionary from layer index to "
                             "the experts of each ep rank in turn (array<i64>)");
    llvm::StringSet<> placedLayers; // the placement's keys that name an MoE layer
    for (moe::ExpertMLPOp mlp : mlps) {
      int64_t experts = mlp.getNumExperts();
      if (experts % ranks != 0)
        return mlp.emitOpError("has ") << experts << " experts, which do not split over ep = " << ranks;
      auto layer = mlp->getParentOfType<moe::LayerOp>();
      FailureOr<int64_t> placedRows = checkPlacement(placement, mlp, layer, experts, ranks, placedLayers);
      if (failed(placedRows))
        return failure();
      bool placed = *placedRows > 0;
      int64_t perRank = placed ? *placedRows : experts / ranks; // experts on each rank
      // Every parameter operand after tokens and counts stacks the experts in dim 0 (expert
      // adapters too: each rank trains its experts' adapters).
      for (Value operand : mlp->getOperands().drop_front(2)) {
        auto weight = operand.getDefiningOp<moe::WeightOp>();
        if (!weight)
          return mlp.emitOpError("reads an expert tensor that is not a moe.weight; cannot split it over ep");
        auto param = SymbolTable::lookupNearestSymbolFrom<moe::ParamOp>(weight, weight.getParamAttr());
        SmallVector<StringAttr> dims(param.getTensorType().getRank(), b.getStringAttr(""));
        dims[0] = axis;
        param.setShardingAttr(moe::ShardingAttr::get(b.getContext(), dims));
        if (perRank != experts / ranks) // replicated experts: more than a rank's share each
          param->setAttr(moe::kEpRowsAttr, b.getI64IntegerAttr(perRank));
        weight.getResult().setType(param.getLocalType());
      }
      auto dispatch = mlp.getTokens().getDefiningOp<moe::DispatchOp>();
      if (!dispatch || dispatch.getCounts() != mlp.getCounts())
        return mlp.emitOpError("does not read a moe.dispatch's tokens and counts; cannot route it over ep");
      moe::CombineOp combine;
      for (Operation *user : mlp->getUsers())
        if (auto c = dyn_cast<moe::CombineOp>(user); c && c.getExpertOutput() == mlp.getResult() &&
                                                    c.getIndices() == dispatch.getIndices())
          combine = c;
      if (!combine || !mlp->hasOneUse())
        return mlp.emitOpError("is not read by exactly one moe.combine with its dispatch's indices; cannot "
                               "route it over ep");
      // The route, the sends and the return surround the unchanged local computation. Their
      // location says which sharding they come from (--emit=report lists it).
      Location because = NameLoc::get(
          b.getStringAttr(llvm::formatv("the {0} experts of @{1} split over ep = {2} ({3} per rank{4})", experts,
                                        layer ? layer.getSymName() : "model", ranks, perRank,
                                        !placed                     ? ""
                                        : perRank * ranks > experts ? ", as expert_placement places and replicates them"
                                                                    : ", as expert_placement places them")
                              .str()),
          dispatch.getLoc());
      b.setInsertionPoint(dispatch);
      auto indices = cast<RankedTensorType>(dispatch.getIndices().getType());
      auto localIndices = RankedTensorType::get({ShapedType::kDynamic, indices.getDimSize(1)},
                                                indices.getElementType());
      auto layoutType = RankedTensorType::get({2, 2 * ranks}, b.getI64Type());
      // A placement needs the routed exchange: the route renumbers experts on the host.
      if (placed && epExchange == "all")
        return mlp.emitOpError("has an expert placement, which needs ep-exchange routed or auto (every token to "
                               "every rank renumbers the experts as consecutive ranges)");
      bool allTokens = epExchange == "all" || (epExchange == "auto" && !placed &&
                                               analysis::allTokensPays(experts, indices.getDimSize(1), ranks));
      if (allTokens && epCapacityFactor != 0 && !warnedFixedRoom) {
        mlp.emitWarning("--moe-propagate-sharding: ep-capacity-factor does not bound @")
            << (layer ? layer.getSymName() : "model")
            << "'s expert exchange: ep-exchange auto sends every token to every rank there (nearly every token "
               "has an expert on each rank), a fixed room; ep-exchange routed bounds it";
        warnedFixedRoom = true;
      }
      FloatAttr capacity = !allTokens && epCapacityFactor != 0 ? b.getF64FloatAttr(epCapacityFactor) : FloatAttr();
      auto route = b.create<moe::EpRouteOp>(because, TypeRange{localIndices, layoutType},
                                            dispatch.getIndices(), axis, ranksAttr,
                                            b.getI64IntegerAttr(experts), allTokens ? b.getUnitAttr() : UnitAttr(),
                                            capacity);
      auto rows = [&](Value v) {
        auto type = cast<RankedTensorType>(v.getType());
        return RankedTensorType::get({ShapedType::kDynamic, type.getDimSize(1)}, type.getElementType());
      };
      auto sendX = b.create<moe::EpSendOp>(because, rows(dispatch.getInput()), dispatch.getInput(),
                                           route.getLayout(), axis, ranksAttr);
      dispatch.getInputMutable().assign(sendX.getResult());
      dispatch.getIndicesMutable().assign(route.getLocalIndices());
      dispatch.setNumExperts(perRank);
      dispatch.getCounts().setType(RankedTensorType::get(
          {perRank}, cast<RankedTensorType>(dispatch.getCounts().getType()).getElementType()));
      b.setInsertionPoint(combine);
      auto sendW = b.create<moe::EpSendOp>(because, rows(combine.getWeights()), combine.getWeights(),
                                           route.getLayout(), axis, ranksAttr);
      combine.getIndicesMutable().assign(route.getLocalIndices());
      combine.getWeightsMutable().assign(sendW.getResult());
      // On narrower data each rank's partial sum stays f32, and the return rounds the ranks'
      // sum once: the rounding one GPU's combine makes.
      auto sumType = cast<RankedTensorType>(combine.getType());
      if (!sumType.getElementType().isF32())
        combine.getResult().setType(RankedTensorType::get(sumType.getShape(), b.getF32Type()));
      b.setInsertionPointAfter(combine);
      auto back = b.create<moe::EpReturnOp>(because, sumType, combine.getResult(), route.getLayout(), axis,
                                            ranksAttr);
      combine.getResult().replaceAllUsesExcept(back.getResult(), back);
      if (tokenBlocks > 1 &&
          failed(splitTokenBlocks(b, {route, sendX, dispatch, mlp, sendW, combine, back}, tokenBlocks)))
        return failure();
    }
    if (placement)
      for (NamedAttribute entry : placement)
        if (!placedLayers.contains(entry.getName().getValue()))
          return model.emitError("--moe-propagate-sharding: expert_placement names layer '")
                 << entry.getName().getValue() << "', which is not a layer with routed experts";
    return success();
  }

  /// One MoE block's expert exchange and local computation, in IR order.
  struct ExpertExchange {
    moe::EpRouteOp route;
    moe::EpSendOp sendX;
    moe::DispatchOp dispatch;
    moe::ExpertMLPOp mlp;
    moe::EpSendOp sendW;
    moe::CombineOp combine;
    moe::EpReturnOp back;
  };

  /// Replaces `exchange` by `blocks` copies, each on one block of the tokens (moe.token_blocks of
  /// the hidden state, the expert indices and the router weights), and joins the returned rows
  /// (moe.concat_tokens). Written in the order the overlap schedule issues them: block b + 1's
  /// route and sends come before block b's return, so the communication of one block can run
  /// while the experts compute the other.
  LogicalResult splitTokenBlocks(OpBuilder &b, ExpertExchange exchange, int64_t blocks) {
    Value x = exchange.sendX.getInput(), indices = exchange.route.getIndices(),
          weights = exchange.sendW.getInput();
    // The router weights feed the combine; they must exist before the first block's sends.
    if (Operation *producer = weights.getDefiningOp();
        producer && (producer->getBlock() != exchange.route->getBlock() ||
                     !producer->isBeforeInBlock(exchange.route)))
      return exchange.combine.emitOpError("reads router weights computed after its dispatch; token-blocks needs "
                                          "them before the expert exchange starts");
    b.setInsertionPointAfter(exchange.back);
    Location loc = exchange.dispatch.getLoc();
    auto split = [&](Value whole) {
      auto type = cast<RankedTensorType>(whole.getType());
      SmallVector<int64_t> shape(type.getShape());
      shape[0] = ShapedType::kDynamic;
      SmallVector<Type> types(blocks, RankedTensorType::get(shape, type.getElementType()));
      return b.create<moe::TokenBlocksOp>(loc, types, whole).getBlocks();
    };
    ValueRange xs = split(x), indexBlocks = split(indices), weightBlocks = split(weights);
    SmallVector<IRMapping> maps(blocks);
    SmallVector<Operation *> returns;
    for (int64_t k = 0; k < blocks; ++k) {
      maps[k].map(x, xs[k]);
      maps[k].map(indices, indexBlocks[k]);
      maps[k].map(weights, weightBlocks[k]);
      for (Operation *op : {exchange.route.getOperation(), exchange.sendX.getOperation(), exchange.sendW.getOperation()})
        b.clone(*op, maps[k]);
      if (k > 0) // the previous block's return, behind this block's sends on the exchange
        returns.push_back(b.clone(*exchange.back, maps[k - 1]));
      for (Operation *op : {exchange.dispatch.getOperation(), exchange.mlp.getOperation(), exchange.combine.getOperation()})
        b.clone(*op, maps[k]);
    }
    returns.push_back(b.clone(*exchange.back, maps[blocks - 1]));
    SmallVector<Value> rows;
    for (Operation *back : returns)
      rows.push_back(back->getResult(0));
    auto joined = b.create<moe::ConcatTokensOp>(loc, exchange.back.getType(), rows);
    exchange.back.getResult().replaceAllUsesWith(joined.getResult());
    for (Operation *op : {exchange.back.getOperation(), exchange.combine.getOperation(), exchange.sendW.getOperation(),
                          exchange.mlp.getOperation(), exchange.dispatch.getOperation(), exchange.sendX.getOperation(),
                          exchange.route.getOperation()})
      op->erase();
    return success();
  }

  /// The expert placement of `mlp`'s layers, if any: each layer the template instantiates has
  /// one (an array<i64> of every ep rank's experts in turn, as many per rank; every expert at
  /// least once, none twice on a rank: more than E / ep per rank replicates experts) or none
  /// does, all with as many experts per rank (the layers share one program). Experts with
  /// adapters keep consecutive ranges (PEFT writes each rank's window of the stacked
  /// adapters). Returns the experts per rank, 0 without a placement.
  FailureOr<int64_t> checkPlacement(DictionaryAttr placement, moe::ExpertMLPOp mlp, moe::LayerOp layer,
                                    int64_t experts, int64_t ranks, llvm::StringSet<> &placedLayers) {
    if (!placement)
      return int64_t{0};
    // The layer indices that apply this template.
    SmallVector<int64_t> indices;
    if (layer)
      layer->getParentOfType<moe::ModelOp>().walk([&](moe::ApplyLayerOp apply) {
        if (apply.getCallee() == layer.getSymName())
          indices.push_back(apply.getIndexAttr().getInt());
      });
    int found = 0;
    int64_t rows = 0;
    for (int64_t index : indices) {
      std::string key = std::to_string(index);
      Attribute entry = placement.get(key);
      if (!entry)
        continue;
      ++found;
      placedLayers.insert(key);
      auto table = dyn_cast<DenseI64ArrayAttr>(entry);
      if (!table || table.size() < experts || table.size() % ranks != 0)
        return mlp.emitOpError("expert_placement of layer ")
               << index << " must list the experts of each of the " << ranks
               << " ep ranks, as many each and every one of its " << experts << " experts at least once (array<i64>), got "
               << entry;
      int64_t perRank = table.size() / ranks;
      if (rows && rows != perRank)
        return mlp.emitOpError("expert_placement gives the layers of @")
               << layer.getSymName() << " " << rows << " and " << perRank
               << " experts per rank; they share one program: give them as many";
      rows = perRank;
      llvm::SmallBitVector seen(experts);
      for (int64_t r = 0; r < ranks; ++r) {
        llvm::SmallBitVector onRank(experts);
        for (int64_t e : table.asArrayRef().slice(r * perRank, perRank)) {
          if (e < 0 || e >= experts || onRank.test(e))
            return mlp.emitOpError("expert_placement of layer ")
                   << index << " must list experts 0.." << experts - 1 << ", none twice on one rank, got " << entry;
          onRank.set(e);
          seen.set(e);
        }
      }
      if (!seen.all())
        return mlp.emitOpError("expert_placement of layer ")
               << index << " leaves expert " << seen.find_first_unset() << " on no rank, got " << entry;
    }
    if (found == 0)
      return int64_t{0};
    if (found != static_cast<int>(indices.size()))
      return mlp.emitOpError("expert_placement places ")
             << found << " of the " << indices.size() << " layers of @" << layer.getSymName()
             << ", which share one program: place all of them or none";
    for (Value operand : mlp->getOperands().drop_front(2))
      if (auto weight = operand.getDefiningOp<moe::WeightOp>())
        if (auto param = SymbolTable::lookupNearestSymbolFrom<moe::ParamOp>(weight, weight.getParamAttr());
            param && param.getTrainable())
          return mlp.emitOpError("trains its experts (@")
                 << param.getSymName()
                 << (moe::isAdapterTensorName(param.getTensorName()) ? ", an expert adapter" : ", trained in full")
                 << "): an expert placement is not supported with trainable experts yet (the trainer gathers "
                    "each rank's consecutive window of the stacked tensors)";
    return rows;
  }
};

} // namespace
} // namespace moec::passes
