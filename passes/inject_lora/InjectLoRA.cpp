//===- InjectLoRA.cpp - add LoRA adapters to targeted projections ---------===//

#include "passes/inject_lora/InjectLoRA.h"

#include <array>
#include <cmath>
#include <set>

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/Debug.h"
#include "mlir/IR/Builders.h"
#include "passes/inject_lora/AdapterConfig.h"

#define DEBUG_TYPE "moe-inject-lora"

namespace moec::passes {

#define GEN_PASS_DEF_INJECTLORAPASS
#include "passes/inject_lora/InjectLoRA.h.inc"

namespace {

using namespace mlir;
using moe::ParamOp;

constexpr llvm::StringLiteral kAllLinear = "all-linear";

/// The checkpoint module path of a weight ("model.layers.{layer}.self_attn.q_proj"),
/// or "" when it is not a plain `.weight` parameter of this template.
std::string modulePath(Value weightValue, moe::LayerOp layer) {
  auto weight = weightValue ? weightValue.getDefiningOp<moe::WeightOp>() : moe::WeightOp();
  if (!weight)
    return "";
  auto param = dyn_cast_or_null<ParamOp>(SymbolTable::lookupSymbolIn(layer, weight.getParamAttr()));
  if (!param || !param.getTensorName().ends_with(".weight"))
    return "";
  return param.getTensorName().drop_back(strlen(".weight")).str();
}

/// PEFT names adapters by transformers' module path, which differs from the checkpoint
/// key where transformers renames keys on load; the importer records those renames.
std::string transformersModulePath(StringRef path, Operation *layer) {
  std::string out = path.str();
  if (auto renames = layer->getParentOp()->getAttrOfType<DictionaryAttr>("peft_module_renames"))
    for (NamedAttribute rename : renames)
      if (size_t at = out.find(rename.getName().str()); at != std::string::npos)
        out.replace(at, rename.getName().size(), cast<StringAttr>(rename.getValue()).str());
  return out;
}

StringRef moduleName(StringRef path) {
  return path.rsplit('.').second.empty() ? path : path.rsplit('.').second;
}

/// What is trained (the options, or an adapter_config.json that replaces them) is an
/// AdapterConfig; its updates are scaled by alpha / r, or alpha / sqrt(r) for rsLoRA.
double scaleOf(const AdapterConfig &s) {
  return s.alpha / (s.rslora ? std::sqrt(double(s.rank)) : double(s.rank));
}

/// `module`, or `TYPE:module` for the layer templates of that type only.
struct Target {
  std::string spelling, type, module;
};

/// One layer template: the types a target may name, what it offers, and what is chosen.
struct Template {
  moe::LayerOp layer;
  std::string name;
  SmallVector<std::string, 3> types; // its name, then its token and channel mixer
  std::set<std::string> linearNames, expertNames;
  SmallVector<std::pair<moe::LinearOp, std::string>> linears; // with module paths
  // Module paths of the gate, up and down projections to adapt ("" = none).
  SmallVector<std::pair<moe::ExpertMLPOp, std::array<std::string, 3>>> experts;
};

/// "@gqa_moe (gqa, moe): k_proj, q_proj [experts: down_proj, up_proj]; @kda_dense ...", for errors.
std::string describe(ArrayRef<Template> templates) {
  std::vector<std::string> parts;
  for (const Template &t : templates) {
    ArrayRef<std::string> mixers = ArrayRef(t.types).drop_front();
    std::string part = "@" + t.name + (mixers.empty() ? "" : " (" + llvm::join(mixers, ", ") + ")") + ": " +
                       llvm::join(t.linearNames, ", ");
    if (!t.expertNames.empty())
      part += " [experts: " + llvm::join(t.expertNames, ", ") + "]";
    parts.push_back(part);
  }
  return llvm::join(parts, "; ");
}

class InjectLoRAPass : public impl::InjectLoRAPassBase<InjectLoRAPass> {
public:
  using InjectLoRAPassBase::InjectLoRAPassBase;

  void runOnOperation() override {
    moe::ModelOp model = getOperation();
    FailureOr<AdapterConfig> settings = resolveSettings(model);
    if (failed(settings))
      return signalPassFailure();
    FailureOr<std::vector<Target>> parsed = parseTargets(model, settings->targets);
    if (failed(parsed))
      return signalPassFailure();
    std::vector<Template> templates;
    std::set<std::string> used, adapted;
    for (auto layer : model.getBody().getOps<moe::LayerOp>())
      if (failed(choose(layer, *parsed, templates.emplace_back(), used, adapted)))
        return signalPassFailure();
    if (failed(checkTargets(model, *parsed, used, templates)))
      return signalPassFailure();

    for (Template &t : templates) {
      for (auto &[linear, path] : t.linears)
        adapt(t.layer, linear, path, *settings);
      for (auto &[op, paths] : t.experts)
        adaptExperts(t.layer, op, paths, *settings);
    }

    // What PEFT export needs: adapter_config.json lists the modules it adapted.
    Builder b(model.getContext());
    SmallVector<Attribute> names;
    for (const std::string &name : adapted)
      names.push_back(b.getStringAttr(name));
    SmallVector<NamedAttribute> lora = {b.getNamedAttr("r", b.getI64IntegerAttr(settings->rank)),
                                        b.getNamedAttr("alpha", b.getF64FloatAttr(settings->alpha)),
                                        b.getNamedAttr("dropout", b.getF64FloatAttr(settings->dropout)),
                                        b.getNamedAttr("targets", b.getArrayAttr(names))};
    if (expertLora)
      lora.push_back(b.getNamedAttr("expert_lora", b.getUnitAttr()));
    if (settings->rslora)
      lora.push_back(b.getNamedAttr("rslora", b.getUnitAttr()));
    model->setAttr("lora", b.getDictionaryAttr(lora));
  }

private:
  FailureOr<AdapterConfig> resolveSettings(moe::ModelOp model) {
    AdapterConfig settings{rank, alpha, dropout, {targets.begin(), targets.end()}, rslora};
    if (!adapterConfig.empty()) {
      llvm::Expected<AdapterConfig> config = readAdapterConfig(adapterConfig);
      if (!config)
        return model.emitError("moe-inject-lora: ") << llvm::toString(config.takeError());
      settings = std::move(*config);
    }
    if (settings.targets.empty())
      return model.emitError("moe-inject-lora needs targets (module names such as q_proj, or all-linear)");
    if (settings.rank <= 0)
      return model.emitError("moe-inject-lora: rank must be positive, got ") << settings.rank;
    // moe.expert_mlp has no dropout: expert adapters would silently train without it.
    if (expertLora && settings.dropout != 0)
      return model.emitError("moe-inject-lora: expert-lora does not support dropout yet, got ")
             << settings.dropout << "; use dropout 0";
    return settings;
  }

  static FailureOr<std::vector<Target>> parseTargets(moe::ModelOp model, ArrayRef<std::string> spellings) {
    std::vector<Target> parsed;
    for (StringRef spelling : spellings) {
      auto [type, module] =
          spelling.contains(':') ? spelling.split(':') : std::make_pair(StringRef(), spelling);
      if (module.empty() || (spelling.contains(':') && type.empty()))
        return model.emitError() << "moe-inject-lora: target '" << spelling
                                 << "' is neither a module name nor TYPE:module";
      parsed.push_back({spelling.str(), type.str(), module.str()});
    }
    return parsed;
  }

  /// Records what `layer` offers and which of its projections the targets pick; marks the
  /// targets that pick something as used.
  LogicalResult choose(moe::LayerOp layer, ArrayRef<Target> parsed, Template &t, std::set<std::string> &used,
                       std::set<std::string> &adapted) {
    t.layer = layer;
    t.name = layer.getSymName().str();
    t.types.push_back(t.name);
    for (StringRef mixer : {"token_mixer", "channel_mixer"})
      if (auto type = layer->getAttrOfType<StringAttr>(mixer); type && type.getValue() != "none")
        t.types.push_back(type.str());
    // Routed experts are adapted only under expert-lora.
    auto wants = [&](StringRef name, bool expert) {
      bool any = false;
      for (const Target &target : parsed)
        if ((!expert || expertLora) && (target.type.empty() || llvm::is_contained(t.types, target.type)) &&
            (target.module == name || target.module == kAllLinear)) {
          used.insert(target.spelling);
          adapted.insert(name.str());
          any = true;
        }
      return any;
    };
    // A weight a model.mlir trains in full gets no adapter: PEFT saves a module either way, not
    // both. all-linear leaves it out; a target naming it is an error.
    bool trainedInFull = false;
    layer.walk([&](moe::LinearOp linear) {
      std::string path = modulePath(linear.getWeight(), layer);
      if (path.empty()) {
        LLVM_DEBUG(llvm::dbgs() << "no checkpoint name, not adaptable: " << linear << "\n");
        return WalkResult::advance();
      }
      t.linearNames.insert(moduleName(path).str());
      auto weight = linear.getWeight().getDefiningOp<moe::WeightOp>();
      auto param = weight ? SymbolTable::lookupNearestSymbolFrom<moe::ParamOp>(weight, weight.getParamAttr())
                          : moe::ParamOp();
      if (param && param.getTrainable()) {
        bool named = llvm::any_of(parsed, [&](const Target &target) {
          return target.module == moduleName(path) &&
                 (target.type.empty() || llvm::is_contained(t.types, target.type));
        });
        if (named) {
          linear.emitError() << "moe-inject-lora: @" << param.getSymName()
                             << " is trained in full (trainable in the model), so '" << moduleName(path)
                             << "' cannot also get an adapter: PEFT saves a module either way, not both";
          trainedInFull = true;
          return WalkResult::interrupt();
        }
        return WalkResult::advance();
      }
      if (wants(moduleName(path), /*expert=*/false))
        t.linears.emplace_back(linear, path);
      return WalkResult::advance();
    });
    if (trainedInFull)
      return failure();
    WalkResult walk = layer.walk([&](moe::ExpertMLPOp op) {
      // gpt-oss keeps gate and up interleaved in one [in, out] tensor per layer.
      if (op.getFusedGateUp() || op.getInOutLayout()) {
        if (!expertLora)
          return WalkResult::advance();
        op.emitError("moe-inject-lora: expert LoRA on fused expert tensors (fused_gate_up / in_out_layout, "
                     "as gpt-oss stores them) is not supported; leave expert-lora off");
        return WalkResult::interrupt();
      }
      if (op.getPreActivations() && expertLora) { // the training step's form: LoRA comes first
        op.emitError("moe-inject-lora: this expert MLP saves its pre_activations (a training template); "
                     "inject LoRA before --moe-build-training-step");
        return WalkResult::interrupt();
      }
      std::array<std::string, 3> chosen;
      Value weights[] = {op.getGate(), op.getUp(), op.getDown()};
      for (auto [weight, path] : llvm::zip(weights, chosen)) {
        std::string found = modulePath(weight, layer);
        if (found.empty())
          continue;
        t.expertNames.insert(moduleName(found).str());
        if (wants(moduleName(found), /*expert=*/true))
          path = found;
      }
      if (llvm::any_of(chosen, [](const std::string &p) { return !p.empty(); }))
        t.experts.emplace_back(op, chosen);
      return WalkResult::advance();
    });
    return failure(walk.wasInterrupted());
  }

  /// Every target must adapt something, and expert-lora must reach a routed expert.
  LogicalResult checkTargets(moe::ModelOp model, ArrayRef<Target> parsed, const std::set<std::string> &used,
                             ArrayRef<Template> templates) {
    std::set<std::string> available, experts;
    for (const Template &t : templates) {
      available.insert(t.linearNames.begin(), t.linearNames.end());
      experts.insert(t.expertNames.begin(), t.expertNames.end());
    }
    std::vector<std::string> unmatched, hints;
    for (const Target &target : parsed) {
      if (used.count(target.spelling))
        continue;
      std::string hint =
          !expertLora && experts.count(target.module)
              ? "; " + target.module + " is a routed-expert projection: set expert-lora to adapt it"
              : "";
      if (target.type.empty()) {
        unmatched.push_back(target.spelling);
        hints.push_back(hint);
        continue;
      }
      bool known = llvm::any_of(templates,
                                [&](const Template &t) { return llvm::is_contained(t.types, target.type); });
      return model.emitError() << "moe-inject-lora: target " << target.spelling
                               << (known ? " matches no projection in layers of type " + target.type
                                         : ": no layer template is of type " + target.type)
                               << hint << "; the layer templates, their types and projections: "
                               << describe(templates);
    }
    if (!unmatched.empty()) {
      if (expertLora)
        available.insert(experts.begin(), experts.end());
      return model.emitError() << "moe-inject-lora: target(s) " << llvm::join(unmatched, ", ")
                               << " match no projection; the model's projections are: "
                               << llvm::join(available, ", ") << llvm::join(hints, "");
    }
    if (expertLora && llvm::none_of(templates, [](const Template &t) { return !t.experts.empty(); })) {
      if (experts.empty())
        return model.emitError("moe-inject-lora: expert-lora is set but the model has no routed experts");
      return model.emitError() << "moe-inject-lora: expert-lora is set but no target names a routed-expert "
                                  "projection; the expert projections are: "
                               << llvm::join(experts, ", ");
    }
    return success();
  }

  /// A trainable adapter parameter named `<base>_lora_<suffix>` (PEFT's tensor name), placed
  /// after `anchor`; a module used twice (a shared weight) has one adapter, as in PEFT.
  std::pair<std::string, RankedTensorType> addParam(moe::LayerOp layer, moe::WeightOp base, StringRef path,
                                                    StringRef suffix, ArrayRef<int64_t> shape, Type element,
                                                    Operation *&anchor) {
    auto type = RankedTensorType::get(shape, element);
    std::string name = base.getParam().str() + "_lora_" + suffix.str();
    if (SymbolTable::lookupSymbolIn(layer, name))
      return {name, type};
    OpBuilder b(anchor->getContext());
    b.setInsertionPointAfter(anchor);
    anchor = ParamOp::create(b, anchor->getLoc(), name,
                             moe::kPeftNamePrefix.str() + transformersModulePath(path, layer) + ".lora_" +
                                 suffix.str() + ".weight",
                             type,
                             /*trainable=*/true, /*sharding=*/nullptr);
    return {name, type};
  }

  /// Adds A, B and `y + scale * (x A^T) B^T` after one projection.
  void adapt(moe::LayerOp layer, moe::LinearOp linear, StringRef path, const AdapterConfig &s) {
    OpBuilder b(linear.getContext());
    Location loc = linear.getLoc();
    auto inType = cast<RankedTensorType>(linear.getInput().getType());
    auto outType = cast<RankedTensorType>(linear.getResult().getType());
    int64_t in = inType.getDimSize(inType.getRank() - 1), out = outType.getDimSize(1);
    auto weight = linear.getWeight().getDefiningOp<moe::WeightOp>();
    Operation *anchor = SymbolTable::lookupSymbolIn(layer, weight.getParamAttr());
    // f32 adapters whatever the model's dtype, as PEFT's autocast_adapter_dtype keeps them:
    // AdamW on bf16 weights would lose small updates.
    Type element = Float32Type::get(linear.getContext());
    auto [aName, aType] = addParam(layer, weight, path, "A", {s.rank, in}, element, anchor);
    auto [bName, bType] = addParam(layer, weight, path, "B", {out, s.rank}, element, anchor);

    b.setInsertionPointAfter(linear);
    Value a = moe::WeightOp::create(b, loc, aType, aName);
    Value bw = moe::WeightOp::create(b, loc, bType, bName);
    // The update stays f32 until the add rounds the sum once, as PEFT computes it.
    auto deltaType = RankedTensorType::get(outType.getShape(), element);
    Value delta = moe::LoRAOp::create(b, loc, deltaType, linear.getInput(), a, bw,
                                      b.getF64FloatAttr(scaleOf(s)), b.getF64FloatAttr(s.dropout));
    auto sum = moe::AddOp::create(b, loc, linear.getResult(), delta);
    linear.getResult().replaceAllUsesExcept(sum, sum);
    LLVM_DEBUG(llvm::dbgs() << "adapted " << path << " (" << in << " -> " << out << ")\n");
  }

  /// Gives each chosen expert projection (gate, up, down; weights [E, out, in]) one adapter per
  /// expert, A [E, r, in] and B [E, out, r], by rebuilding the op with the adapter operands.
  void adaptExperts(moe::LayerOp layer, moe::ExpertMLPOp op, ArrayRef<std::string> paths,
                    const AdapterConfig &s) {
    OpBuilder b(op);
    Location loc = op.getLoc();
    Value weights[] = {op.getGate(), op.getUp(), op.getDown()};
    std::array<Value, 6> lora; // gate A, gate B, up A, up B, down A, down B
    for (auto [i, path] : llvm::enumerate(paths)) {
      if (path.empty())
        continue;
      auto baseType = cast<RankedTensorType>(weights[i].getType());
      int64_t e = baseType.getDimSize(0), out = baseType.getDimSize(1), in = baseType.getDimSize(2);
      auto weight = weights[i].getDefiningOp<moe::WeightOp>();
      Operation *anchor = SymbolTable::lookupSymbolIn(layer, weight.getParamAttr());
      Type element = Float32Type::get(baseType.getContext()); // f32 adapters, as above
      auto [aName, aType] = addParam(layer, weight, path, "A", {e, s.rank, in}, element, anchor);
      auto [bName, bType] = addParam(layer, weight, path, "B", {e, out, s.rank}, element, anchor);
      lora[2 * i] = moe::WeightOp::create(b, loc, aType, aName);
      lora[2 * i + 1] = moe::WeightOp::create(b, loc, bType, bName);
      LLVM_DEBUG(llvm::dbgs() << "adapted experts " << path << " (" << e << " x " << in << " -> " << out
                              << ")\n");
    }
    auto rebuilt = moe::ExpertMLPOp::create(
        b, loc, op.getResult().getType(), Type(), op.getTokens(), op.getCounts(), op.getUp(), op.getDown(), op.getGate(),
        op.getUpBias(), op.getDownBias(), lora[0], lora[1], lora[2], lora[3], lora[4], lora[5],
        op.getActivationAttr(), op.getFusedGateUpAttr(), op.getInOutLayoutAttr(), op.getLimitAttr(),
        b.getF64FloatAttr(scaleOf(s)));
    rebuilt->setDiscardableAttrs(op->getDiscardableAttrDictionary());
    op.getResult().replaceAllUsesWith(rebuilt.getResult());
    op.erase();
  }
};

} // namespace
} // namespace moec::passes
