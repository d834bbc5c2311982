//===- PlanMemory.cpp - liveness, arena offsets, recompute under a cap ----===//

#include "passes/plan_memory/PlanMemory.h"

#include "compiler/plan/Program.h"
#include "passes/build_training_step/Differentiate.h"
#include "passes/fuse_lora/FuseLoRA.h"
#include "llvm/Support/FormatVariadic.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"

namespace moec::passes {

#define GEN_PASS_DEF_PLANMEMORYPASS
#include "passes/plan_memory/PlanMemory.h.inc"

using namespace mlir;

std::optional<int64_t> parseBytes(StringRef text) {
  text = text.trim();
  static const std::pair<StringRef, double> units[] = {
      {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
      {"KB", 1e3},     {"MB", 1e6},        {"GB", 1e9},           {"TB", 1e12},
      {"B", 1.0}};
  double scale = 1.0;
  for (auto [unit, factor] : units)
    if (text.ends_with(unit)) {
      text = text.drop_back(unit.size()).trim();
      scale = factor;
      break;
    }
  double value;
  if (text.empty() || text.getAsDouble(value) || !(value > 0))
    return std::nullopt;
  return static_cast<int64_t>(value * scale);
}

namespace {

std::string formatBytes(int64_t bytes) {
  return llvm::formatv("{0:F2} GiB", static_cast<double>(bytes) / (1ull << 30)).str();
}

/// Training-forward calls of @train_step whose layers save more than `policy` would, in layer
/// order: with Regather the layers that save everything, with PerLayer those and the
/// regathering ones.
SmallVector<moe::ApplyLayerOp> savingLayers(func::FuncOp step, Recompute policy) {
  SmallVector<moe::ApplyLayerOp> calls;
  for (auto apply : step.getBody().getOps<moe::ApplyLayerOp>()) {
    auto layer = SymbolTable::lookupNearestSymbolFrom<moe::LayerOp>(apply, apply.getCalleeAttr());
    auto current = layer ? layer->getAttrOfType<StringAttr>("recompute") : StringAttr();
    if (!current || !layer->hasAttr(moe::kBackwardTemplateAttr))
      continue;
    if (current.getValue() == "none" ||
        (policy == Recompute::PerLayer && current.getValue() == "regather"))
      calls.push_back(apply);
  }
  return calls;
}

/// Replaces the forward/backward pair of the first `count` layers that save more than
/// `policy` with the pair of `policy`, and records which layers recompute or regather.
LogicalResult switchFirstLayers(moe::ModelOp model, size_t count, Recompute policy) {
  auto step = cast<func::FuncOp>(SymbolTable::lookupSymbolIn(model, "train_step"));
  SmallVector<moe::ApplyLayerOp> calls = savingLayers(step, policy);
  for (moe::ApplyLayerOp forward : ArrayRef(calls).take_front(count)) {
    auto training = cast<moe::LayerOp>(SymbolTable::lookupSymbolIn(model, forward.getCalleeAttr()));
    auto original = dyn_cast_or_null<moe::LayerOp>(SymbolTable::lookupSymbolIn(
        model, training->getAttrOfType<FlatSymbolRefAttr>("layer_template")));
    auto backwardName = training->getAttrOfType<FlatSymbolRefAttr>(moe::kBackwardTemplateAttr);
    moe::ApplyLayerOp backward;
    for (auto apply : step.getBody().getOps<moe::ApplyLayerOp>())
      if (apply.getCalleeAttr() == backwardName && apply.getIndex() == forward.getIndex())
        backward = apply;
    if (!original || !backward)
      return forward.emitOpError("is not a training layer call built by --moe-build-training-step");
    FailureOr<LayerTraining> pair = getOrBuildLayerTraining(original, policy);
    if (failed(pair))
      return failure();
    if (pair->forward == training) // a layer without experts: regathering changes nothing
      continue;
    // Built from the unfused template: fused as the layer it replaces was (--moe-fuse-lora).
    bool fused = false;
    training.walk([&](moe::LoRALinearOp) { fused = true; });
    if (fused) {
      fuseAdaptedProjections(pair->forward);
      fuseAdaptedProjections(pair->backward);
    }
    OpBuilder b(forward);
    auto newForward = b.create<moe::ApplyLayerOp>(
        forward.getLoc(), pair->forward.getResultTypes(), pair->forward.getSymName(),
        forward.getIndex(), forward.getOperands());
    forward.getResult(0).replaceAllUsesWith(newForward.getResult(0));
    b.setInsertionPoint(backward);
    SmallVector<Value> operands(forward.getOperands());
    llvm::append_range(operands, newForward.getResults().drop_front());
    operands.push_back(backward.getOperands().back());
    auto newBackward = b.create<moe::ApplyLayerOp>(
        backward.getLoc(), pair->backward.getResultTypes(), pair->backward.getSymName(),
        backward.getIndex(), operands);
    backward.replaceAllUsesWith(newBackward);
    backward.erase();
    forward.erase();
  }
  // Training templates no layer uses any more.
  for (auto layer : llvm::make_early_inc_range(model.getBody().getOps<moe::LayerOp>()))
    if (layer->hasAttr("recompute") && SymbolTable::symbolKnownUseEmpty(layer, model))
      layer->erase();
  // Which layers do what now.
  SmallVector<int64_t> byPolicy[3]; // none, regather, per-layer
  for (auto apply : step.getBody().getOps<moe::ApplyLayerOp>()) {
    auto layer = SymbolTable::lookupNearestSymbolFrom<moe::LayerOp>(apply, apply.getCalleeAttr());
    auto current = layer ? layer->getAttrOfType<StringAttr>("recompute") : StringAttr();
    if (!current || !layer->hasAttr(moe::kBackwardTemplateAttr))
      continue;
    int which = current.getValue() == "none" ? 0 : current.getValue() == "regather" ? 1 : 2;
    byPolicy[which].push_back(static_cast<int64_t>(apply.getIndex()));
  }
  Builder b(model.getContext());
  bool mixed = (!byPolicy[0].empty()) + (!byPolicy[1].empty()) + (!byPolicy[2].empty()) > 1;
  model->setAttr("recompute", b.getStringAttr(mixed                  ? "mixed"
                                              : !byPolicy[2].empty() ? "per-layer"
                                              : !byPolicy[1].empty() ? "regather"
                                                                     : "none"));
  if (!byPolicy[1].empty())
    model->setAttr("regather_layers", b.getDenseI64ArrayAttr(byPolicy[1]));
  else
    model->removeAttr("regather_layers");
  if (!byPolicy[2].empty())
    model->setAttr("recompute_layers", b.getDenseI64ArrayAttr(byPolicy[2]));
  else
    model->removeAttr("recompute_layers");
  return success();
}

class PlanMemoryPass : public impl::PlanMemoryPassBase<PlanMemoryPass> {
public:
  using PlanMemoryPassBase::PlanMemoryPassBase;

  void runOnOperation() override {
    if (failed(run(getOperation())))
      signalPassFailure();
  }

private:
  FailureOr<int64_t> peakWithRecompute(moe::ModelOp model, size_t count) {
    // A trial on a copy: the model changes only once the count is chosen.
    OwningOpRef<moe::ModelOp> copy(cast<moe::ModelOp>(model->clone()));
    if (failed(switchFirstLayers(*copy, count, Recompute::PerLayer)))
      return failure();
    FailureOr<compiler::Program> program = compiler::buildProgram(*copy, seqLen, microBatch);
    if (failed(program))
      return failure();
    compiler::assignOffsets(*program);
    return program->peakBytes();
  }

  LogicalResult run(moe::ModelOp model) {
    std::optional<int64_t> cap;
    if (!memoryCap.empty() && !(cap = parseBytes(memoryCap)))
      return model.emitError("moe-plan-memory: memory-cap '")
             << memoryCap << "' is not a size (expected bytes or a number with KB/MB/GB/TB or "
                             "KiB/MiB/GiB/TiB, e.g. 80GiB)";
    // A pipeline: each stage's rank holds its own program; the plan records the largest.
    FailureOr<std::vector<compiler::Program>> stages = compiler::buildStagePrograms(model, seqLen, microBatch);
    if (failed(stages))
      return failure();
    FailureOr<compiler::Program> program = std::move(*llvm::max_element(
        *stages, [](const compiler::Program &a, const compiler::Program &b) { return a.peakBytes() < b.peakBytes(); }));
    if (cap && program->peakBytes() > *cap && stages->size() > 1)
      return model.emitError("moe-plan-memory: the largest pipeline stage needs ")
             << formatBytes(program->peakBytes()) << ", above the cap of " << formatBytes(*cap)
             << "; recomputing layers to fit is not supported with pp > 1 yet (use more stages, "
                "--recompute per-layer, or a shorter --seq-len)";

    if (cap && program->peakBytes() > *cap) {
      // First what costs a gather per MoE layer in the backward: its experts' token copies.
      auto step = cast<func::FuncOp>(SymbolTable::lookupSymbolIn(model, "train_step"));
      if (failed(switchFirstLayers(model, savingLayers(step, Recompute::Regather).size(),
                                   Recompute::Regather)))
        return failure();
      program = compiler::buildProgram(model, seqLen, microBatch);
      if (failed(program))
        return failure();
      compiler::assignOffsets(*program);
    }
    if (cap && program->peakBytes() > *cap) {
      auto step = cast<func::FuncOp>(SymbolTable::lookupSymbolIn(model, "train_step"));
      size_t layers = savingLayers(step, Recompute::PerLayer).size();
      FailureOr<int64_t> least = layers ? peakWithRecompute(model, layers) : program->peakBytes();
      if (failed(least))
        return failure();
      if (*least > *cap)
        return model.emitError("moe-plan-memory: the step needs ")
               << formatBytes(*least) << " with every layer recomputed, above the cap of "
               << formatBytes(*cap) << ": " << formatBytes(*least - *cap)
               << " missing (shorten --seq-len or --micro-batch, or shard over more GPUs)";
      // The fewest leading layers that fit: peaks fall as more layers recompute.
      size_t lo = 1, hi = layers;
      while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        FailureOr<int64_t> peak = peakWithRecompute(model, mid);
        if (failed(peak))
          return failure();
        (*peak <= *cap ? hi : lo) = *peak <= *cap ? mid : mid + 1;
      }
      if (failed(switchFirstLayers(model, lo, Recompute::PerLayer)))
        return failure();
      program = compiler::buildProgram(model, seqLen, microBatch);
      if (failed(program))
        return failure();
      compiler::assignOffsets(*program);
    }

    Builder b(model.getContext());
    SmallVector<NamedAttribute> entries = {
        b.getNamedAttr("seq_len", b.getI64IntegerAttr(seqLen)),
        b.getNamedAttr("micro_batch", b.getI64IntegerAttr(microBatch)),
        b.getNamedAttr("peak", b.getI64IntegerAttr(program->peakBytes())),
    };
    if (stages->size() > 1)
      entries.push_back(b.getNamedAttr("stage", b.getI64IntegerAttr(program->stage)));
    for (auto [role, bytes] : program->arenaBytes())
      entries.push_back(b.getNamedAttr(plan::roleName(role), b.getI64IntegerAttr(bytes)));
    if (int64_t scratch = program->scratchBytes()) // kernels' own memory (the fused loss's chunk)
      entries.push_back(b.getNamedAttr("scratch", b.getI64IntegerAttr(scratch)));
    if (cap)
      entries.push_back(b.getNamedAttr("cap", b.getI64IntegerAttr(*cap)));
    model->setAttr("memory_plan", b.getDictionaryAttr(entries));
    return success();
  }
};

} // namespace
} // namespace moec::passes
