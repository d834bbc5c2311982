//===- ModelSummary.cpp - parameter counts per layer type -----------------===//

#include "compiler/analysis/ModelSummary.h"

#include <algorithm>

#include "llvm/ADT/DenseMap.h"
#include "llvm/Support/Format.h"

using namespace mlir;

namespace moec::analysis {
namespace {

int64_t intAttr(Operation *op, StringRef name) {
  if (auto attr = op->getAttrOfType<IntegerAttr>(name))
    return attr.getInt();
  return 0;
}

std::string stringAttr(Operation *op, StringRef name) {
  if (auto attr = op->getAttrOfType<StringAttr>(name))
    return attr.str();
  return "";
}

/// Parameters of a template that only k of E experts use per token, times (E - k) / E.
int64_t inactiveExpertParams(moe::LayerOp layer) {
  int64_t inactive = 0;
  layer.walk([&](moe::ExpertMLPOp experts) {
    auto dispatch = experts.getTokens().getDefiningOp<moe::DispatchOp>();
    if (!dispatch)
      return;
    int64_t k = cast<RankedTensorType>(dispatch.getIndices().getType()).getDimSize(1);
    int64_t e = experts.getNumExperts();
    for (Value operand : experts->getOperands()) {
      auto weight = operand.getDefiningOp<moe::WeightOp>();
      if (!weight)
        continue;
      auto param = SymbolTable::lookupSymbolIn(layer, weight.getParamAttr());
      if (auto p = dyn_cast_or_null<moe::ParamOp>(param))
        inactive += p.getNumElements() / e * (e - k);
    }
  });
  return inactive;
}

} // namespace

std::string humanCount(int64_t n) {
  std::string out;
  llvm::raw_string_ostream os(out);
  if (n >= 1'000'000'000'000)
    os << llvm::format("%.2fT", n / 1e12);
  else if (n >= 1'000'000'000)
    os << llvm::format("%.2fB", n / 1e9);
  else if (n >= 1'000'000)
    os << llvm::format("%.2fM", n / 1e6);
  else if (n >= 1'000)
    os << llvm::format("%.2fK", n / 1e3);
  else
    os << n;
  return out;
}

double tokenShareOfRank(int64_t experts, int64_t topK, int64_t ranks, int64_t expertsOnRank) {
  if (ranks <= 1 || experts <= 0)
    return 1.0;
  double none = 1.0; // no expert of the token on that rank: all k picked among the others
  int64_t elsewhere = experts - std::min(experts, expertsOnRank > 0 ? expertsOnRank : experts / ranks);
  for (int64_t i = 0; i < topK; ++i)
    none *= elsewhere > i ? double(elsewhere - i) / double(experts - i) : 0.0;
  return 1.0 - none;
}

std::string withCommas(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0)
      out += ',';
    out += digits[i];
  }
  return out;
}

ModelSummary summarizeModel(moe::ModelOp model) {
  ModelSummary s;
  s.name = model.getSymName().str();
  s.modelType = stringAttr(model, "model_type");
  s.numLayers = intAttr(model, "num_layers");
  s.hiddenSize = intAttr(model, "hidden_size");
  s.vocabSize = intAttr(model, "vocab_size");
  s.skippedMtpLayers = intAttr(model, "skipped_mtp_layers");

  llvm::DenseMap<StringRef, int64_t> uses;
  model.walk([&](moe::ApplyLayerOp apply) { ++uses[apply.getCallee()]; });

  for (Operation &op : model.getBody().front()) {
    if (auto param = dyn_cast<moe::ParamOp>(op)) {
      s.modelLevelParams += param.getNumElements();
    } else if (auto layer = dyn_cast<moe::LayerOp>(op)) {
      LayerTypeSummary t;
      t.name = layer.getSymName().str();
      t.tokenMixer = stringAttr(layer, "token_mixer");
      t.channelMixer = stringAttr(layer, "channel_mixer");
      t.count = uses.lookup(layer.getSymName());
      for (auto param : layer.getBody().getOps<moe::ParamOp>())
        t.paramsPerLayer += param.getNumElements();
      t.activePerLayer = t.paramsPerLayer - inactiveExpertParams(layer);
      s.layerTypes.push_back(t);
    }
  }
  s.totalParams = s.activeParams = s.modelLevelParams;
  for (const LayerTypeSummary &t : s.layerTypes) {
    s.totalParams += t.count * t.paramsPerLayer;
    s.activeParams += t.count * t.activePerLayer;
  }
  return s;
}

void printSummary(const ModelSummary &s, llvm::raw_ostream &os) {
  os << "model: " << s.name << " (model_type " << s.modelType << "), " << s.numLayers
     << " layers, hidden " << s.hiddenSize << ", vocab " << s.vocabSize << "\n";
  if (s.skippedMtpLayers)
    os << "note: " << s.skippedMtpLayers
       << " multi-token-prediction layer(s) in the checkpoint are not part of the model\n";
  os << llvm::format("%-22s %6s  %-16s %-14s %18s %18s\n", "layer type", "count", "token mixer",
                     "channel mixer", "params/layer", "active/layer");
  for (const LayerTypeSummary &t : s.layerTypes)
    os << llvm::format("%-22s %6lld  %-16s %-14s %18s %18s\n", t.name.c_str(),
                       static_cast<long long>(t.count), t.tokenMixer.c_str(), t.channelMixer.c_str(),
                       withCommas(t.paramsPerLayer).c_str(), withCommas(t.activePerLayer).c_str());
  os << llvm::format("%-22s %6s  %-16s %-14s %18s\n", "embedding/norm/head", "", "", "",
                     withCommas(s.modelLevelParams).c_str());
  os << "total parameters: " << withCommas(s.totalParams) << " (" << humanCount(s.totalParams) << ")\n";
  os << "active per token: " << withCommas(s.activeParams) << " (" << humanCount(s.activeParams)
     << ")\n";
  os << "bytes in bf16: " << withCommas(2 * s.totalParams) << " ("
     << llvm::format("%.2f", 2.0 * s.totalParams / 1e9) << " GB)\n";
}

} // namespace moec::analysis
