//===- FuseLoRA.cpp - each adapted projection and its update as one op ----===//

#include "passes/fuse_lora/FuseLoRA.h"

#include "llvm/ADT/DenseSet.h"
#include "llvm/Support/Debug.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"

#define DEBUG_TYPE "moe-fuse-lora"

namespace moec::passes {

#define GEN_PASS_DEF_FUSELORAPASS
#include "passes/fuse_lora/FuseLoRA.h.inc"

namespace {

using namespace mlir;

struct Adapted {
  moe::AddOp sum;
  moe::LinearOp linear;
  moe::LoRAOp lora;
};

/// The projection and update that `sum` adds, when they fuse.
std::optional<Adapted> match(moe::AddOp sum) {
  auto bail = [&](StringRef why) -> std::optional<Adapted> {
    LLVM_DEBUG(llvm::dbgs() << "not fused (" << why << "): " << sum << "\n");
    return std::nullopt;
  };
  auto linear = sum.getLhs().getDefiningOp<moe::LinearOp>();
  auto lora = sum.getRhs().getDefiningOp<moe::LoRAOp>();
  if (!linear || !lora) {
    linear = sum.getRhs().getDefiningOp<moe::LinearOp>();
    lora = sum.getLhs().getDefiningOp<moe::LoRAOp>();
  }
  if (!linear || !lora)
    return std::nullopt; // not an adapted projection (a residual, another sum)
  if (linear.getBias())
    return bail("the projection has a bias");
  if (linear.getInput() != lora.getInput())
    return bail("the update reads another input");
  if (!linear.getResult().hasOneUse() || !lora.getResult().hasOneUse())
    return bail("the projection or the update is read by more than the sum");
  if (cast<RankedTensorType>(linear.getInput().getType()).getRank() != 2)
    return bail("the input is not [tokens, features]");
  return Adapted{sum, linear, lora};
}

void fuse(Adapted &m) {
  OpBuilder b(m.sum);
  // The projection's output rounds where the unfused linear rounded it.
  Type base = cast<RankedTensorType>(m.linear.getType()).getElementType();
  auto fused = moe::LoRALinearOp::create(b, m.sum.getLoc(), m.sum.getType(), m.linear.getInput(),
                                         m.linear.getWeight(), m.lora.getLoraA(), m.lora.getLoraB(),
                                         m.lora.getScaleAttr(), m.lora.getDropoutAttr(), TypeAttr::get(base));
  // What other passes marked the three with (a recomputed copy, ...) holds for the fused op.
  for (Operation *op : {m.sum.getOperation(), m.linear.getOperation(), m.lora.getOperation()})
    for (NamedAttribute attr : op->getDiscardableAttrs())
      if (!fused->hasAttr(attr.getName()))
        fused->setAttr(attr.getName(), attr.getValue());
  m.sum.replaceAllUsesWith(fused.getResult());
  m.sum.erase();
  m.lora.erase();
  m.linear.erase();
  LLVM_DEBUG(llvm::dbgs() << "fused: " << fused << "\n");
}

class FuseLoRAPass : public impl::FuseLoRAPassBase<FuseLoRAPass> {
public:
  using FuseLoRAPassBase::FuseLoRAPassBase;

  void runOnOperation() override {
    moe::ModelOp model = getOperation();
    // The templates the training layers were built from stay as they are: memory planning
    // rebuilds layers from them (recompute under a cap) by differentiating the unfused ops, and
    // fuses what it rebuilds itself.
    llvm::DenseSet<StringRef> templates;
    model.walk([&](moe::LayerOp layer) {
      if (auto name = layer->getAttrOfType<FlatSymbolRefAttr>("layer_template"))
        templates.insert(name.getValue());
    });
    for (auto layer : model.getBody().getOps<moe::LayerOp>())
      if (!templates.contains(layer.getSymName()))
        fuseAdaptedProjections(layer);
    for (auto function : model.getBody().getOps<func::FuncOp>())
      fuseAdaptedProjections(function);
  }
};

} // namespace

int fuseAdaptedProjections(mlir::Operation *root) {
  llvm::SmallVector<Adapted> matches;
  root->walk([&](moe::AddOp sum) {
    if (std::optional<Adapted> m = match(sum))
      matches.push_back(*m);
  });
  for (Adapted &m : matches)
    fuse(m);
  return static_cast<int>(matches.size());
}

} // namespace moec::passes
