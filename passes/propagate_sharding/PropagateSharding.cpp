//===- PropagateSharding.cpp - the mesh and its collectives ---------------===//

#include "passes/propagate_sharding/PropagateSharding.h"

#include "dialects/moe/MeshShape.h"
#include "mlir/IR/Builders.h"

namespace moec::passes {

#define GEN_PASS_DEF_PROPAGATESHARDINGPASS
#include "passes/propagate_sharding/PropagateSharding.h.inc"

namespace {

using namespace mlir;

/// Whether running `layer` accumulates any parameter gradient.
bool accumulatesGradients(moe::LayerOp layer) {
  return layer.getBody()
      .walk([](moe::ParamGradOp) { return WalkResult::interrupt(); })
      .wasInterrupted();
}

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
    for (const char *axis : {"tp", "pp", "ep"})
      if (shape.axisSize(axis) > 1) {
        model.emitError("--moe-propagate-sharding: mesh '")
            << mesh << "': " << axis << " > 1 is not supported yet (only dp)";
        return signalPassFailure();
      }
    OpBuilder b(model.getContext());
    model->setAttr("mesh", b.getStringAttr(shape.str()));
    if (shape.single())
      return;

    auto step = dyn_cast_or_null<func::FuncOp>(SymbolTable::lookupSymbolIn(model, "train_step"));
    if (!step) {
      model.emitError("--moe-propagate-sharding: no func.func @train_step; run "
                      "--moe-build-training-step first");
      return signalPassFailure();
    }
    Block &body = step.getBody().front();
    if (body.getNumArguments() != 3) {
      step.emitOpError("must take (ids, positions, labels) before sharding; it takes ")
          << body.getNumArguments() << " arguments (is the model sharded already?)";
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

    // One gradient bucket per layer, right after that layer's backward.
    StringAttr axis = b.getStringAttr("dp");
    bool modelLevel = false;
    for (Operation &op : llvm::make_early_inc_range(body)) {
      if (isa<moe::ParamGradOp>(op))
        modelLevel = true;
      auto apply = dyn_cast<moe::ApplyLayerOp>(op);
      if (!apply)
        continue;
      auto layer = dyn_cast_or_null<moe::LayerOp>(SymbolTable::lookupSymbolIn(model, apply.getCalleeAttr()));
      if (!layer || !accumulatesGradients(layer))
        continue;
      b.setInsertionPointAfter(apply);
      b.create<moe::AllReduceGradsOp>(apply.getLoc(), axis, apply.getIndexAttr());
    }
    if (modelLevel) {
      b.setInsertionPoint(body.getTerminator());
      b.create<moe::AllReduceGradsOp>(step.getLoc(), axis, b.getI64IntegerAttr(-1));
    }
  }
};

} // namespace
} // namespace moec::passes
