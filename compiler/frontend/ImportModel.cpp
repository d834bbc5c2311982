//===- ImportModel.cpp - build moe IR from a model's features -------------===//

#include "compiler/frontend/ImportModel.h"

#include <cmath>
#include <map>

#include "compiler/frontend/ConfigReader.h"
#include "dialects/moe/MoeOps.h"
#include "llvm/Support/FormatVariadic.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Verifier.h"

using namespace mlir;
using namespace moec::moe;

namespace moec::frontend {
namespace {

/// Builds one layer template: parameters go to the top of the body, compute
/// ops after them, in the order the layer runs.
class TemplateBuilder {
public:
  TemplateBuilder(const ModelSpec &spec, OpBuilder &builder, LayerOp layer, Type elementType)
      : spec(spec), b(builder), loc(layer.getLoc()), elementType(elementType), layer(layer) {
    body = &layer.getBody().front();
    b.setInsertionPointToEnd(body);
  }

  Value build(const LayerSpec &layerSpec, Value hidden, Value positions) {
    const NameScheme &names = spec.names;
    int64_t d = spec.hiddenSize;
    if (names.singleMixerBlocks) {
      Value normed = rmsNorm(hidden, "norm.weight", d);
      Value out = layerSpec.tokenMixer != TokenMixer::None
                      ? tokenMixer(layerSpec, normed, positions)
                      : channelMixer(layerSpec, normed);
      return add(hidden, out);
    }
    Value normed = rmsNorm(hidden, "input_layernorm.weight", d);
    hidden = add(hidden, tokenMixer(layerSpec, normed, positions));
    normed = rmsNorm(hidden, "post_attention_layernorm.weight", d);
    return add(hidden, channelMixer(layerSpec, normed));
  }

private:
  RankedTensorType act(int64_t features) {
    return RankedTensorType::get({ShapedType::kDynamic, features}, elementType);
  }
  int64_t features(Value v) { return cast<RankedTensorType>(v.getType()).getDimSize(1); }

  /// A parameter named `<layer prefix><suffix>`, read at the current point.
  Value param(StringRef suffix, ArrayRef<int64_t> shape) {
    std::string symbol = suffix.str();
    // Only a trailing ".weight" goes: "indexer.weights_proj.weight" keeps "weights_proj".
    if (StringRef(symbol).ends_with(".weight"))
      symbol.resize(symbol.size() - StringRef(".weight").size());
    for (size_t at; (at = symbol.find("{expert}.")) != std::string::npos;)
      symbol.erase(at, StringRef("{expert}.").size());
    std::replace(symbol.begin(), symbol.end(), '.', '_');
    auto type = RankedTensorType::get(shape, elementType);
    {
      OpBuilder::InsertionGuard guard(b);
      if (lastParam)
        b.setInsertionPointAfter(lastParam);
      else
        b.setInsertionPointToStart(body);
      lastParam = b.create<ParamOp>(loc, symbol, spec.names.layer + suffix.str(), type,
                                    /*trainable=*/false, /*sharding=*/nullptr);
    }
    return b.create<WeightOp>(loc, type, symbol);
  }

  Value linear(Value x, StringRef module, int64_t out, bool bias = false) {
    Value w = param((module + ".weight").str(), {out, features(x)});
    Value bv = bias ? param((module + ".bias").str(), {out}) : Value();
    return b.create<LinearOp>(loc, act(out), x, w, bv);
  }

  Value rmsNorm(Value x, StringRef name, int64_t size, bool unitOffset) {
    Value w = param(name, {size});
    auto op = b.create<RMSNormOp>(loc, x.getType(), x, w, b.getF64FloatAttr(spec.normEps));
    if (unitOffset)
      op.setUnitOffset(true);
    return op;
  }
  Value rmsNorm(Value x, StringRef name, int64_t size) {
    return rmsNorm(x, name, size, spec.unitOffsetNorm);
  }

  Value add(Value a, Value c) { return b.create<AddOp>(loc, a, c); }
  IntegerAttr i64(int64_t v) { return b.getI64IntegerAttr(v); }
  FloatAttr f64(double v) { return b.getF64FloatAttr(v); }

  RopeAttr rope(int64_t dim, RopeStyle style) {
    MLIRContext *ctx = b.getContext();
    YarnAttr yarn;
    if (const std::optional<YarnSpec> &y = spec.rope.yarn)
      yarn = YarnAttr::get(ctx, APFloat(y->factor), y->originalMaxPosition, APFloat(y->betaFast),
                           APFloat(y->betaSlow), APFloat(y->mscale), APFloat(y->mscaleAllDim));
    return RopeAttr::get(ctx, APFloat(spec.rope.theta), dim, style, yarn);
  }

  Value tokenMixer(const LayerSpec &layerSpec, Value x, Value pos) {
    switch (layerSpec.tokenMixer) {
    case TokenMixer::GQA:
      return gqa(layerSpec, x, pos);
    case TokenMixer::MLA:
    case TokenMixer::DSA:
      return mla(layerSpec.tokenMixer == TokenMixer::DSA, x, pos);
    case TokenMixer::GatedDeltaNet:
      return gatedDeltaNet(x);
    case TokenMixer::KDA:
      return kda(x);
    case TokenMixer::Mamba2:
      return mamba2(x);
    case TokenMixer::None:
      break;
    }
    return x;
  }

  Value gqa(const LayerSpec &layerSpec, Value x, Value pos) {
    const AttentionSpec &a = spec.attention;
    std::string m = spec.names.attention;
    int64_t h = a.numHeads, kv = a.numKvHeads, hd = a.headDim;
    Value q = linear(x, m + "q_proj", h * hd * (a.outputGate ? 2 : 1), a.bias);
    Value gate;
    if (a.outputGate) {
      auto split = b.create<SplitOp>(loc, TypeRange{act(h * hd), act(h * hd)}, q,
                                     b.getDenseI64ArrayAttr({hd, hd}), b.getI64IntegerAttr(h));
      q = split.getResult(0);
      gate = split.getResult(1);
    }
    Value k = linear(x, m + "k_proj", kv * hd, a.bias);
    Value v = linear(x, m + "v_proj", kv * hd, a.bias);
    if (a.qkNorm == AttentionSpec::QkNorm::PerHead) {
      q = rmsNorm(q, m + "q_norm.weight", hd);
      k = rmsNorm(k, m + "k_norm.weight", hd);
    } else if (a.qkNorm == AttentionSpec::QkNorm::FullWidth) {
      q = rmsNorm(q, m + "q_norm.weight", h * hd);
      k = rmsNorm(k, m + "k_norm.weight", kv * hd);
    }
    if (a.rope) {
      int64_t dim = static_cast<int64_t>(std::llround(hd * spec.rope.partialFactor));
      RopeAttr r = rope(dim, spec.rope.interleaved ? RopeStyle::interleaved : RopeStyle::half);
      q = b.create<RopeOp>(loc, q.getType(), q, pos, b.getI64IntegerAttr(hd), r);
      k = b.create<RopeOp>(loc, k.getType(), k, pos, b.getI64IntegerAttr(hd), r);
    }
    Value sinks = a.sinks ? param(m + "sinks", {h}) : Value();
    IntegerAttr window = layerSpec.slidingWindow && a.slidingWindow
                             ? b.getI64IntegerAttr(*a.slidingWindow)
                             : IntegerAttr();
    Value o = b.create<AttentionOp>(loc, act(h * hd), /*logsumexp=*/Type(), q, k, v, sinks, i64(h), i64(kv),
                                    i64(hd), f64(1.0 / std::sqrt(static_cast<double>(hd))), window)
                  .getResult();
    if (gate)
      o = b.create<SigmoidGateOp>(loc, o.getType(), o, gate);
    return linear(o, m + "o_proj", spec.hiddenSize, a.bias);
  }

  Value mla(bool sparse, Value x, Value pos) {
    const MLASpec &s = spec.mla;
    std::string m = spec.names.attention;
    int64_t h = s.numHeads, qkDim = s.qkNopeHeadDim + s.qkRopeHeadDim;
    Value q, qLatent;
    if (s.qLoraRank) {
      qLatent = rmsNorm(linear(x, m + "q_a_proj", *s.qLoraRank), m + "q_a_layernorm.weight",
                        *s.qLoraRank);
      q = linear(qLatent, m + "q_b_proj", h * qkDim);
    } else {
      q = linear(x, m + "q_proj", h * qkDim);
    }
    Value kva = linear(x, m + "kv_a_proj_with_mqa", s.kvLoraRank + s.qkRopeHeadDim);
    auto split = b.create<SplitOp>(loc, TypeRange{act(s.kvLoraRank), act(s.qkRopeHeadDim)}, kva,
                                   b.getDenseI64ArrayAttr({s.kvLoraRank, s.qkRopeHeadDim}),
                                   b.getI64IntegerAttr(1));
    Value latent = rmsNorm(split.getResult(0), m + "kv_a_layernorm.weight", s.kvLoraRank);
    Value kv = linear(latent, m + "kv_b_proj", h * (s.qkNopeHeadDim + s.vHeadDim));
    // transformers scales by mscale(factor, mscale_all_dim)^2 whenever YaRN sets
    // mscale_all_dim; DeepSeek's own code only beyond the original context.
    // We follow transformers, the golden reference.
    double scale = 1.0 / std::sqrt(static_cast<double>(qkDim));
    if (spec.rope.yarn && spec.rope.yarn->mscaleAllDim != 0) {
      double mscale = 0.1 * spec.rope.yarn->mscaleAllDim * std::log(spec.rope.yarn->factor) + 1.0;
      scale *= mscale * mscale;
    }
    RopeAttr r = s.nope ? RopeAttr()
                        : rope(s.qkRopeHeadDim,
                               spec.rope.interleaved ? RopeStyle::interleaved : RopeStyle::half);
    Value o;
    if (sparse) {
      std::string ix = m + "indexer.";
      Value iq = linear(qLatent, ix + "wq_b", s.indexHeads * s.indexHeadDim);
      Value ik = linear(x, ix + "wk", s.indexHeadDim);
      Value nw = param(ix + "k_norm.weight", {s.indexHeadDim});
      Value nb = param(ix + "k_norm.bias", {s.indexHeadDim});
      ik = b.create<LayerNormOp>(loc, ik.getType(), ik, nw, nb, b.getF64FloatAttr(1e-6));
      Value iw = linear(x, ix + "weights_proj", s.indexHeads);
      auto indicesType = RankedTensorType::get({ShapedType::kDynamic, s.indexTopk}, b.getI32Type());
      // The indexer rotates with the non-interleaved layout (see model_math.md §3).
      Value indices = b.create<DSAIndexerOp>(loc, indicesType, iq, ik, iw, pos, s.indexHeads,
                                             s.indexHeadDim, s.indexTopk,
                                             rope(s.qkRopeHeadDim, RopeStyle::half));
      o = b.create<SparseAttentionOp>(loc, act(h * s.vHeadDim), /*logsumexp=*/Type(), q, split.getResult(1), kv,
                                      pos, indices, i64(h), i64(s.qkNopeHeadDim), i64(s.qkRopeHeadDim),
                                      i64(s.vHeadDim), f64(scale), r)
              .getResult();
    } else {
      o = b.create<MLAOp>(loc, act(h * s.vHeadDim), /*logsumexp=*/Type(), q, split.getResult(1), kv, pos,
                          i64(h), i64(s.qkNopeHeadDim), i64(s.qkRopeHeadDim), i64(s.vHeadDim), f64(scale), r)
              .getResult();
    }
    return linear(o, m + "o_proj", spec.hiddenSize);
  }

  Value gatedDeltaNet(Value x) {
    const GatedDeltaNetSpec &g = spec.gdn;
    std::string m = spec.names.linearAttention;
    int64_t keyDim = g.numKeyHeads * g.keyHeadDim, valueDim = g.numValueHeads * g.valueHeadDim;
    Value qkvz = linear(x, m + "in_proj_qkvz", 2 * keyDim + 2 * valueDim);
    Value ba = linear(x, m + "in_proj_ba", 2 * g.numValueHeads);
    Value conv = param(m + "conv1d.weight", {2 * keyDim + valueDim, 1, g.convKernel});
    Value aLog = param(m + "A_log", {g.numValueHeads});
    Value dtBias = param(m + "dt_bias", {g.numValueHeads});
    Value norm = param(m + "norm.weight", {g.valueHeadDim});
    Value o = b.create<GatedDeltaNetOp>(loc, act(valueDim), qkvz, ba, conv, aLog, dtBias, norm,
                                        i64(g.numKeyHeads), i64(g.numValueHeads), i64(g.keyHeadDim),
                                        i64(g.valueHeadDim), f64(spec.normEps));
    return linear(o, m + "out_proj", spec.hiddenSize);
  }

  Value kda(Value x) {
    const KDASpec &k = spec.kda;
    std::string m = spec.names.linearAttention;
    int64_t width = k.numHeads * k.headDim;
    Value q = linear(x, m + "q_proj", width);
    Value key = linear(x, m + "k_proj", width);
    Value v = linear(x, m + "v_proj", width);
    Value qc = param(m + "q_conv1d.weight", {width, 1, k.convKernel});
    Value kc = param(m + "k_conv1d.weight", {width, 1, k.convKernel});
    Value vc = param(m + "v_conv1d.weight", {width, 1, k.convKernel});
    Value decay = linear(linear(x, m + "f_a_proj", k.headDim), m + "f_b_proj", width);
    Value beta = linear(x, m + "b_proj", k.numHeads);
    Value gate = linear(linear(x, m + "g_a_proj", k.headDim), m + "g_b_proj", width);
    Value aLog = param(m + "A_log", {1, 1, k.numHeads, 1});
    Value dtBias = param(m + "dt_bias", {width});
    Value norm = param(m + "o_norm.weight", {k.headDim});
    Value o = b.create<KDAOp>(loc, act(width), q, key, v, qc, kc, vc, decay, beta, gate, aLog,
                              dtBias, norm, i64(k.numHeads), i64(k.headDim), f64(spec.normEps));
    return linear(o, m + "o_proj", spec.hiddenSize);
  }

  Value mamba2(Value x) {
    const Mamba2Spec &s = spec.mamba;
    std::string m = spec.names.linearAttention;
    int64_t inner = s.numHeads * s.headDim, convChannels = inner + 2 * s.numGroups * s.stateSize;
    Value zxbcdt = linear(x, m + "in_proj", inner + convChannels + s.numHeads, s.projBias);
    Value conv = param(m + "conv1d.weight", {convChannels, 1, s.convKernel});
    Value convBias = s.convBias ? param(m + "conv1d.bias", {convChannels}) : Value();
    Value dtBias = param(m + "dt_bias", {s.numHeads});
    Value aLog = param(m + "A_log", {s.numHeads});
    Value dSkip = param(m + "D", {s.numHeads});
    Value norm = param(m + "norm.weight", {inner});
    Value o = b.create<Mamba2Op>(loc, act(inner), zxbcdt, conv, convBias, dtBias, aLog, dSkip, norm,
                                 i64(s.numHeads), i64(s.headDim), i64(s.stateSize), i64(s.numGroups),
                                 i64(s.chunkSize), f64(spec.normEps), f64(s.timeStepMin));
    return linear(o, m + "out_proj", spec.hiddenSize, s.projBias);
  }

  Value channelMixer(const LayerSpec &layerSpec, Value x) {
    switch (layerSpec.channelMixer) {
    case ChannelMixer::Dense:
      return mlp(x, spec.names.mlp, spec.intermediateSize, spec.denseGated);
    case ChannelMixer::MoE:
      return moe(x);
    case ChannelMixer::None:
      break;
    }
    return x;
  }

  Value mlp(Value x, StringRef m, int64_t width, bool gated) {
    Value up = linear(x, (m + "up_proj").str(), width);
    Value h;
    if (gated) {
      Value gate = linear(x, (m + "gate_proj").str(), width);
      h = b.create<GluOp>(loc, gate, up, Activation::silu);
    } else {
      h = b.create<ActivationOp>(loc, up, Activation::relu2);
    }
    return linear(h, (m + "down_proj").str(), spec.hiddenSize);
  }

  Value moe(Value x) {
    const MoESpec &s = spec.moe;
    const NameScheme &n = spec.names;
    std::string m = n.moe;
    int64_t e = s.numExperts, inter = s.intermediate;
    Value router = param(m + n.router + "weight", {e, spec.hiddenSize});
    Value logitBias = s.routerBias ? param(m + n.router + "bias", {e}) : Value();
    Value correction = s.correctionBias ? param(m + n.router + "e_score_correction_bias", {e}) : Value();
    RouterScoring scoring = s.scoring == MoESpec::Scoring::Softmax   ? RouterScoring::softmax
                            : s.scoring == MoESpec::Scoring::Sigmoid ? RouterScoring::sigmoid
                                                                     : RouterScoring::topk_softmax;
    auto route = b.create<RouterOp>(
        loc, RankedTensorType::get({ShapedType::kDynamic, s.topK}, b.getF32Type()),
        RankedTensorType::get({ShapedType::kDynamic, s.topK}, b.getI32Type()), x, router,
        logitBias, correction, i64(s.topK), RouterScoringAttr::get(b.getContext(), scoring),
        i64(s.nGroup), i64(s.topkGroup), s.normTopkProb ? b.getUnitAttr() : UnitAttr(), f64(s.scaling));
    Value expertInput = s.latentSize ? linear(x, m + "fc1_latent_proj", s.latentSize) : x;
    int64_t width = features(expertInput);
    auto dispatch = b.create<DispatchOp>(
        loc, act(width), RankedTensorType::get({e}, b.getI64Type()), expertInput,
        route.getIndices(), e);
    std::string ex = m + n.experts;
    Value up, down, gate, upBias, downBias;
    if (s.fusedGateUp) {
      up = param(ex + "gate_up_proj", {e, width, 2 * inter});
      upBias = param(ex + "gate_up_proj_bias", {e, 2 * inter});
      down = param(ex + "down_proj", {e, inter, width});
      downBias = param(ex + "down_proj_bias", {e, width});
    } else {
      if (s.gated)
        gate = param(ex + n.expertGate + ".weight", {e, inter, width});
      up = param(ex + n.expertUp + ".weight", {e, inter, width});
      down = param(ex + n.expertDown + ".weight", {e, width, inter});
    }
    Activation activation = s.fusedGateUp ? Activation::clamped_swiglu
                            : s.gated     ? Activation::silu
                                          : Activation::relu2;
    auto experts = b.create<ExpertMLPOp>(
        loc, act(width), /*pre_activations, added by --moe-build-training-step:*/ Type(), dispatch.getTokens(), dispatch.getCounts(), up, down, gate, upBias,
        downBias, /*expert LoRA, added by --moe-inject-lora:*/ Value(), Value(), Value(), Value(),
        Value(), Value(), activation, s.fusedGateUp, s.fusedGateUp,
        s.fusedGateUp && s.swigluLimit ? b.getF64FloatAttr(*s.swigluLimit) : FloatAttr(),
        FloatAttr());
    Value out = b.create<CombineOp>(loc, act(width), experts.getResult(), route.getIndices(), route.getWeights());
    if (s.latentSize)
      out = linear(out, m + "fc2_latent_proj", spec.hiddenSize);
    if (s.sharedIntermediate) {
      Value shared = mlp(x, m + n.shared, s.sharedIntermediate, s.gated);
      if (s.sharedGate)
        shared = b.create<SigmoidGateOp>(loc, shared.getType(), shared,
                                         linear(x, m + "shared_expert_gate", 1));
      out = add(out, shared);
    }
    return out;
  }

  const ModelSpec &spec;
  OpBuilder &b;
  Location loc;
  Type elementType;
  LayerOp layer;
  Block *body = nullptr;
  Operation *lastParam = nullptr;
};

std::string templateName(const LayerSpec &layer) {
  std::string name;
  if (layer.tokenMixer != TokenMixer::None)
    name = toString(layer.tokenMixer);
  if (layer.slidingWindow)
    name += "_sliding";
  if (layer.channelMixer != ChannelMixer::None)
    name += (name.empty() ? "" : "_") + std::string(toString(layer.channelMixer));
  return name;
}

Type elementTypeOf(StringRef dtype, MLIRContext &ctx) {
  if (dtype == "float32")
    return Float32Type::get(&ctx);
  if (dtype == "float16")
    return Float16Type::get(&ctx);
  return BFloat16Type::get(&ctx);
}

} // namespace

llvm::Expected<OwningOpRef<ModuleOp>> importModel(const ModelSpec &spec, MLIRContext &context) {
  context.loadDialect<MoeDialect, func::FuncDialect>();
  Location loc = FileLineColLoc::get(&context, spec.modelType.empty() ? "config" : spec.modelType, 0, 0);
  OpBuilder b(&context);
  OwningOpRef<ModuleOp> module = ModuleOp::create(loc);
  b.setInsertionPointToEnd(module->getBody());
  Type elt = elementTypeOf(spec.dtype, context);
  int64_t d = spec.hiddenSize, v = spec.vocabSize;

  auto model = b.create<ModelOp>(loc, spec.architecture.empty() ? "model" : spec.architecture);
  model.getBody().emplaceBlock();
  model->setAttr("model_type", b.getStringAttr(spec.modelType));
  model->setAttr("hidden_size", b.getI64IntegerAttr(d));
  model->setAttr("vocab_size", b.getI64IntegerAttr(v));
  model->setAttr("num_layers", b.getI64IntegerAttr(spec.numLayers));
  if (spec.maxPositions)
    model->setAttr("max_position_embeddings", b.getI64IntegerAttr(spec.maxPositions));
  if (spec.mtpLayers)
    model->setAttr("skipped_mtp_layers", b.getI64IntegerAttr(spec.mtpLayers));
  if (!spec.names.moduleRenames.empty()) {
    SmallVector<NamedAttribute> renames;
    for (const auto &[from, to] : spec.names.moduleRenames)
      renames.push_back(b.getNamedAttr(from, b.getStringAttr(to)));
    model->setAttr("peft_module_renames", b.getDictionaryAttr(renames));
  }
  b.setInsertionPointToStart(&model.getBody().front());

  auto tensor = [&](ArrayRef<int64_t> shape) { return RankedTensorType::get(shape, elt); };
  b.create<ParamOp>(loc, "embed_tokens", spec.names.embed, tensor({v, d}), false, nullptr);
  b.create<ParamOp>(loc, "final_norm", spec.names.finalNorm, tensor({d}), false, nullptr);
  if (!spec.tiedEmbeddings)
    b.create<ParamOp>(loc, "lm_head", spec.names.lmHead, tensor({v, d}), false, nullptr);

  // One template per distinct layer structure, in order of first use.
  auto hiddenType = RankedTensorType::get({ShapedType::kDynamic, d}, elt);
  auto positionsType = RankedTensorType::get({ShapedType::kDynamic}, b.getI64Type());
  std::map<std::string, LayerOp> templates;
  std::map<std::string, std::vector<int64_t>> layersOf;
  std::vector<std::string> layerTemplate;
  for (const LayerSpec &layer : spec.layers) {
    std::string name = templateName(layer);
    layerTemplate.push_back(name);
    layersOf[name].push_back(static_cast<int64_t>(layerTemplate.size()) - 1);
    if (templates.count(name))
      continue;
    auto op = b.create<LayerOp>(loc, name,
                                b.getFunctionType({hiddenType, positionsType}, {hiddenType}),
                                ArrayAttr(), ArrayAttr());
    op->setAttr("token_mixer", b.getStringAttr(toString(layer.tokenMixer)));
    op->setAttr("channel_mixer", b.getStringAttr(toString(layer.channelMixer)));
    Block *block = b.createBlock(&op.getBody(), {}, {hiddenType, positionsType}, {loc, loc});
    TemplateBuilder builder(spec, b, op, elt);
    Value out = builder.build(layer, block->getArgument(0), block->getArgument(1));
    b.create<YieldOp>(loc, out);
    b.setInsertionPointAfter(op);
    templates[name] = op;
  }
  for (auto &[name, op] : templates)
    op->setAttr("layers", b.getDenseI64ArrayAttr(layersOf[name]));

  auto logitsType = RankedTensorType::get({ShapedType::kDynamic, v}, elt);
  auto idsType = RankedTensorType::get({ShapedType::kDynamic}, b.getI64Type());
  auto forward = b.create<func::FuncOp>(loc, "forward",
                                        b.getFunctionType({idsType, positionsType}, {logitsType}));
  Block *entry = forward.addEntryBlock();
  b.setInsertionPointToStart(entry);
  Value table = b.create<WeightOp>(loc, tensor({v, d}), "embed_tokens");
  Value hidden = b.create<EmbeddingOp>(loc, hiddenType, entry->getArgument(0), table);
  for (auto [index, name] : llvm::enumerate(layerTemplate))
    hidden = b.create<ApplyLayerOp>(loc, TypeRange{hiddenType}, name, index,
                                    ValueRange{hidden, entry->getArgument(1)})
                 .getResult(0);
  Value normWeight = b.create<WeightOp>(loc, tensor({d}), "final_norm");
  auto norm = b.create<RMSNormOp>(loc, hiddenType, hidden, normWeight, b.getF64FloatAttr(spec.normEps));
  if (spec.unitOffsetNorm)
    norm.setUnitOffset(true);
  Value head = b.create<WeightOp>(loc, tensor({v, d}), spec.tiedEmbeddings ? "embed_tokens" : "lm_head");
  Value logits = b.create<LinearOp>(loc, logitsType, norm, head, Value());
  b.create<func::ReturnOp>(loc, logits);

  std::string diagnostics;
  {
    ScopedDiagnosticHandler handler(&context, [&](Diagnostic &diag) {
      diagnostics += diag.str() + "\n";
      return success();
    });
    if (failed(verify(*module)))
      return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                     "imported IR is inconsistent: %s", diagnostics.c_str());
  }
  return module;
}

llvm::Expected<OwningOpRef<ModuleOp>> importConfigFile(llvm::StringRef configPath,
                                                       MLIRContext &context,
                                                       std::vector<std::string> *unusedKeys,
                                                       llvm::StringRef dtype) {
  llvm::Expected<ConfigReader> config = ConfigReader::open(configPath);
  if (!config)
    return config.takeError();
  llvm::Expected<ModelSpec> spec = readModelSpec(*config);
  if (!spec)
    return spec.takeError();
  if (unusedKeys)
    *unusedKeys = spec->unusedKeys;
  if (!dtype.empty()) {
    if (dtype != "float32" && dtype != "bfloat16" && dtype != "float16")
      return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                     "dtype must be float32, bfloat16 or float16, got '%s'",
                                     dtype.str().c_str());
    spec->dtype = dtype.str();
  }
  return importModel(*spec, context);
}

} // namespace moec::frontend
