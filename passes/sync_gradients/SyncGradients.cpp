//===- SyncGradients.cpp - gradients summed over ranks --------------------===//

#include "passes/sync_gradients/SyncGradients.h"

#include "dialects/moe/MeshShape.h"
#include "mlir/IR/Builders.h"

#define DEBUG_TYPE "moe-sync-gradients"

namespace moec::passes {

#define GEN_PASS_DEF_SYNCGRADIENTSPASS
#include "passes/sync_gradients/SyncGradients.h.inc"

namespace {

using namespace mlir;

/// Which kinds of parameter gradients running `layer` accumulates: replicated ones (whole
/// on every tp rank, or partial: read inside a split attention or on a tp rank's rows), and
/// ones split over ep (whole on every tp rank, or partial: sequence parallel's expert
/// exchange of each tp rank's rows).
struct Accumulates {
  bool replicated = false, experts = false, tpPartial = false, expertsTpPartial = false;
};

bool splitOverEp(moe::ParamOp param) {
  return llvm::any_of(param.getShardingOrReplicated().getDims(),
                      [](StringAttr axis) { return axis.getValue() == "ep"; });
}

void accumulate(moe::ParamGradOp grad, Accumulates &out) {
  auto param = SymbolTable::lookupNearestSymbolFrom<moe::ParamOp>(grad, grad.getParamAttr());
  bool partial = param && param->hasAttr(moe::kTpPartialGradAttr);
  if (param && splitOverEp(param))
    (partial ? out.expertsTpPartial : out.experts) = true;
  else if (partial)
    out.tpPartial = true;
  else
    out.replicated = true;
}

Accumulates accumulatedBy(moe::LayerOp layer) {
  Accumulates out;
  layer.getBody().walk([&](moe::ParamGradOp grad) { accumulate(grad, out); });
  return out;
}

struct SyncGradientsPass : impl::SyncGradientsPassBase<SyncGradientsPass> {
  using SyncGradientsPassBase::SyncGradientsPassBase;

  void runOnOperation() override {
    moe::ModelOp model = getOperation();
    moe::MeshShape mesh;
    auto text = model->getAttrOfType<StringAttr>("mesh");
    std::string error;
    if (!text)
      return; // not placed on a mesh: one rank
    if (!moe::MeshShape::parse(text.str(), mesh, error)) {
      model.emitError("--moe-sync-gradients: mesh '") << text.str() << "': " << error;
      return signalPassFailure();
    }
    if (mesh.single())
      return;
    auto step = dyn_cast_or_null<func::FuncOp>(SymbolTable::lookupSymbolIn(model, "train_step"));
    if (!step) {
      model.emitError("--moe-sync-gradients: no func.func @train_step; run --moe-build-training-step first");
      return signalPassFailure();
    }
    Block &body = step.getBody().front();
    if (body.getNumArguments() != 3) {
      step.emitOpError("must take (ids, positions, labels) before --moe-sync-gradients; it takes ")
          << body.getNumArguments() << " arguments (did the pass run already?)";
      return signalPassFailure();
    }
    // The backward's seed: the one scalar fill. Each rank's share of the global loss
    // weighs it (n_r / N), set by the runtime, so the seed becomes an argument.
    SmallVector<moe::FillOp> seeds;
    for (auto fill : body.getOps<moe::FillOp>())
      if (cast<RankedTensorType>(fill.getType()).getRank() == 0)
        seeds.push_back(fill);
    if (seeds.size() != 1) {
      step.emitOpError("needs exactly one scalar moe.fill (the loss seed) to weigh per rank; found ")
          << seeds.size();
      return signalPassFailure();
    }
    moe::FillOp seed = seeds.front();
    if (failed(step.insertArgument(3, seed.getType(), /*argAttrs=*/{}, seed.getLoc())))
      return signalPassFailure();
    seed.replaceAllUsesWith(body.getArgument(3));
    seed.erase();

    // One bucket per layer (and kind of parameter), right after that layer's backward.
    OpBuilder b(model.getContext());
    bool replicatedOverRanks = mesh.dp * mesh.ep > 1, expertsOverRanks = mesh.dp > 1;
    bool partialOverRanks = mesh.dp * mesh.ep * mesh.tp > 1;
    auto reduce = [&](Location loc, IntegerAttr layer, Accumulates what) {
      if (what.replicated && replicatedOverRanks)
        b.create<moe::AllReduceGradsOp>(loc, b.getStringAttr("dp+ep"), layer, UnitAttr(), UnitAttr());
      if (what.experts && expertsOverRanks)
        b.create<moe::AllReduceGradsOp>(loc, b.getStringAttr("dp"), layer, b.getUnitAttr(), UnitAttr());
      if (what.tpPartial && partialOverRanks)
        b.create<moe::AllReduceGradsOp>(loc, b.getStringAttr("dp+ep+tp"), layer, UnitAttr(), b.getUnitAttr());
      if (what.expertsTpPartial)
        b.create<moe::AllReduceGradsOp>(loc, b.getStringAttr("dp+tp"), layer, b.getUnitAttr(), b.getUnitAttr());
    };
    Accumulates modelLevel;
    for (Operation &op : llvm::make_early_inc_range(body)) {
      if (auto grad = dyn_cast<moe::ParamGradOp>(op))
        accumulate(grad, modelLevel); // never split; partial when read on a tp rank's rows
      auto apply = dyn_cast<moe::ApplyLayerOp>(op);
      if (!apply)
        continue;
      auto layer = dyn_cast_or_null<moe::LayerOp>(SymbolTable::lookupSymbolIn(model, apply.getCalleeAttr()));
      if (!layer)
        continue;
      b.setInsertionPointAfter(apply);
      reduce(apply.getLoc(), apply.getIndexAttr(), accumulatedBy(layer));
    }
    b.setInsertionPoint(body.getTerminator());
    reduce(step.getLoc(), b.getI64IntegerAttr(-1), modelLevel);
  }
};

} // namespace
} // namespace moec::passes
