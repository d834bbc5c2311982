//===- InjectLoRA.cpp - add LoRA adapters to targeted projections ---------===//

#include "passes/inject_lora/InjectLoRA.h"

#include <set>

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/Debug.h"
#include "mlir/IR/Builders.h"

#define DEBUG_TYPE "moe-inject-lora"

namespace moec::passes {

#define GEN_PASS_DEF_INJECTLORAPASS
#include "passes/inject_lora/InjectLoRA.h.inc"

namespace {

using namespace mlir;
using moe::ParamOp;

constexpr llvm::StringLiteral kAllLinear = "all-linear";

/// The checkpoint module path of a projection ("model.layers.{layer}.self_attn.q_proj"),
/// or "" when its weight is not a plain `.weight` parameter of this template.
std::string modulePath(moe::LinearOp linear, moe::LayerOp layer) {
  auto weight = linear.getWeight().getDefiningOp<moe::WeightOp>();
  if (!weight)
    return "";
  auto param = dyn_cast_or_null<ParamOp>(SymbolTable::lookupSymbolIn(layer, weight.getParamAttr()));
  if (!param || !param.getTensorName().ends_with(".weight"))
    return "";
  return param.getTensorName().drop_back(strlen(".weight")).str();
}

StringRef moduleName(StringRef path) { return path.rsplit('.').second.empty() ? path : path.rsplit('.').second; }

class InjectLoRAPass : public impl::InjectLoRAPassBase<InjectLoRAPass> {
public:
  using InjectLoRAPassBase::InjectLoRAPassBase;

  void runOnOperation() override {
    moe::ModelOp model = getOperation();
    if (targets.empty()) {
      model.emitError("moe-inject-lora needs targets (module names such as q_proj, or all-linear)");
      return signalPassFailure();
    }
    if (rank <= 0) {
      model.emitError("moe-inject-lora: rank must be positive, got ") << rank;
      return signalPassFailure();
    }
    bool allLinear = llvm::is_contained(targets, kAllLinear);
    std::set<std::string> wanted(targets.begin(), targets.end()), matched, available;
    wanted.erase(kAllLinear.str());

    for (auto layer : model.getBody().getOps<moe::LayerOp>()) {
      SmallVector<std::pair<moe::LinearOp, std::string>> chosen;
      layer.walk([&](moe::LinearOp linear) {
        std::string path = modulePath(linear, layer);
        if (path.empty())
          return;
        std::string name = moduleName(path).str();
        available.insert(name);
        if (allLinear || wanted.count(name)) {
          matched.insert(name);
          chosen.emplace_back(linear, path);
        }
      });
      for (auto &[linear, path] : chosen)
        adapt(layer, linear, path);
    }

    // What PEFT export needs: adapter_config.json lists the modules it adapted.
    Builder b(model.getContext());
    SmallVector<Attribute> names;
    for (const std::string &name : matched)
      names.push_back(b.getStringAttr(name));
    model->setAttr("lora", b.getDictionaryAttr({
                               b.getNamedAttr("r", b.getI64IntegerAttr(rank)),
                               b.getNamedAttr("alpha", b.getF64FloatAttr(alpha)),
                               b.getNamedAttr("dropout", b.getF64FloatAttr(dropout)),
                               b.getNamedAttr("targets", b.getArrayAttr(names)),
                           }));

    std::vector<std::string> unmatched;
    for (const std::string &target : wanted)
      if (!matched.count(target))
        unmatched.push_back(target);
    if (!unmatched.empty() || matched.empty()) {
      model.emitError() << "moe-inject-lora: target(s) "
                        << llvm::join(unmatched.empty() ? targets : unmatched, ", ")
                        << " match no projection; the model's projections are: "
                        << llvm::join(available, ", ");
      return signalPassFailure();
    }
  }

private:
  /// Adds A, B and `y + scale * (x A^T) B^T` after one projection.
  void adapt(moe::LayerOp layer, moe::LinearOp linear, StringRef path) {
    OpBuilder b(linear.getContext());
    Location loc = linear.getLoc();
    auto inType = cast<RankedTensorType>(linear.getInput().getType());
    auto outType = cast<RankedTensorType>(linear.getResult().getType());
    int64_t in = inType.getDimSize(inType.getRank() - 1), out = outType.getDimSize(1);
    Type element = inType.getElementType();
    auto weight = linear.getWeight().getDefiningOp<moe::WeightOp>();
    std::string symbol = weight.getParam().str();

    // A module called twice (a shared weight) has one adapter, as in PEFT.
    Operation *anchor = SymbolTable::lookupSymbolIn(layer, weight.getParamAttr());
    auto addParam = [&](StringRef suffix, ArrayRef<int64_t> shape) {
      auto type = RankedTensorType::get(shape, element);
      std::string name = symbol + "_lora_" + suffix.str();
      if (SymbolTable::lookupSymbolIn(layer, name))
        return std::make_pair(name, type);
      b.setInsertionPointAfter(anchor);
      // PEFT names: base_model.model.<module path>.lora_A.weight
      anchor = b.create<ParamOp>(loc, name, ("base_model.model." + path + ".lora_" + suffix + ".weight").str(),
                        type, /*trainable=*/true, /*sharding=*/nullptr);
      return std::make_pair(name, type);
    };
    auto [aName, aType] = addParam("A", {rank, in});
    auto [bName, bType] = addParam("B", {out, rank});

    b.setInsertionPointAfter(linear);
    Value a = b.create<moe::WeightOp>(loc, aType, aName);
    Value bw = b.create<moe::WeightOp>(loc, bType, bName);
    Value delta = b.create<moe::LoRAOp>(loc, outType, linear.getInput(), a, bw,
                                        b.getF64FloatAttr(alpha / static_cast<double>(rank)),
                                        b.getF64FloatAttr(dropout));
    auto sum = b.create<moe::AddOp>(loc, linear.getResult(), delta);
    linear.getResult().replaceAllUsesExcept(sum, sum);
    LLVM_DEBUG(llvm::dbgs() << "adapted " << path << " (" << in << " -> " << out << ")\n");
  }
};

} // namespace
} // namespace moec::passes
