//===- ModelSpec.cpp - read a model's features from config.json ----------===//

#include "compiler/frontend/ModelSpec.h"

#include <functional>

#include "compiler/frontend/ConfigReader.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSwitch.h"
#include "llvm/Support/FormatVariadic.h"

using namespace llvm;

namespace moec::frontend {

const char *toString(TokenMixer mixer) {
  switch (mixer) {
  case TokenMixer::None:
    return "none";
  case TokenMixer::GQA:
    return "gqa";
  case TokenMixer::MLA:
    return "mla";
  case TokenMixer::DSA:
    return "dsa";
  case TokenMixer::GatedDeltaNet:
    return "gated_delta_net";
  case TokenMixer::KDA:
    return "kda";
  case TokenMixer::Mamba2:
    return "mamba2";
  }
  return "?";
}

const char *toString(ChannelMixer mixer) {
  switch (mixer) {
  case ChannelMixer::None:
    return "none";
  case ChannelMixer::Dense:
    return "dense";
  case ChannelMixer::MoE:
    return "moe";
  }
  return "?";
}

namespace {

//===----------------------------------------------------------------------===//
// What a config does not say: the config class's defaults for absent keys,
// and facts of the modelling code (checkpoint names, norms) with no key.
//===----------------------------------------------------------------------===//

struct Convention {
  StringRef modelType;
  StringRef defaults; // JSON: values the HF config class uses when a key is absent
  std::function<void(ModelSpec &)> apply;
};

void blockSparseMoeNames(ModelSpec &spec) {
  spec.names.moe = "block_sparse_moe.";
  spec.names.expertGate = "w1";
  spec.names.expertUp = "w3";
  spec.names.expertDown = "w2";
}

const std::vector<Convention> &conventions() {
  static const std::vector<Convention> table = {
      {"qwen3_moe", R"({"norm_topk_prob": false, "decoder_sparse_step": 1})",
       [](ModelSpec &s) { s.attention.qkNorm = AttentionSpec::QkNorm::PerHead; }},
      {"qwen3_next", R"({"norm_topk_prob": true, "decoder_sparse_step": 1, "partial_rotary_factor": 0.25})",
       [](ModelSpec &s) {
         s.attention.qkNorm = AttentionSpec::QkNorm::PerHead;
         s.attention.outputGate = true;
         s.unitOffsetNorm = true;
         s.names.linearAttention = "linear_attn.";
         s.names.shared = "shared_expert.";
         s.moe.sharedGate = true;
       }},
      {"mixtral", R"({"norm_topk_prob": true, "use_sliding_window": true})", blockSparseMoeNames},
      {"olmoe", R"({"norm_topk_prob": false})",
       [](ModelSpec &s) { s.attention.qkNorm = AttentionSpec::QkNorm::FullWidth; }},
      {"deepseek_v3", R"({"scoring_func": "sigmoid", "topk_method": "noaux_tc", "rope_interleave": true})",
       nullptr}, // the default (Llama-style) names
      {"deepseek_v32", R"({"scoring_func": "sigmoid", "topk_method": "noaux_tc", "rope_interleave": true})",
       nullptr}, // the default (Llama-style) names
      {"kimi_k2", R"({"scoring_func": "sigmoid", "topk_method": "noaux_tc", "rope_interleave": true})",
       nullptr}, // the default (Llama-style) names
      {"kimi_linear",
       R"({"scoring_func": "sigmoid", "topk_method": "noaux_tc", "mla_use_nope": true, "rope_interleave": true})",
       [](ModelSpec &s) {
         blockSparseMoeNames(s);
         s.names.mlp = "block_sparse_moe.";
         s.names.moduleRenames = {{".self_attn.f_a_proj", ".self_attn.forget_gate.f_a_proj"},
                                  {".self_attn.f_b_proj", ".self_attn.forget_gate.f_b_proj"}};
       }},
      {"nemotron_h",
       R"({"scoring_func": "sigmoid", "topk_method": "noaux_tc", "mlp_hidden_act": "relu2", "time_step_min": 0.001})",
       [](ModelSpec &s) {
         s.names.embed = "backbone.embeddings.weight";
         s.names.finalNorm = "backbone.norm_f.weight";
         s.names.layer = "backbone.layers.{layer}.";
         s.names.moduleRenames = {{"backbone.", "model."}};
         s.names.singleMixerBlocks = true;
         s.names.attention = s.names.linearAttention = s.names.mlp = s.names.moe = "mixer.";
         s.attention.rope = false; // Mamba layers carry position; attention is NoPE
       }},
      {"gpt_oss", R"({"scoring_func": "topk_softmax", "attention_bias": true})",
       [](ModelSpec &s) {
         s.names.router = "router.";
         s.names.experts = "experts.";
         s.attention.sinks = true;
         s.moe.routerBias = true;
         s.moe.fusedGateUp = true;
       }},
  };
  return table;
}

const Convention *findConvention(StringRef modelType) {
  for (const Convention &c : conventions())
    if (c.modelType == modelType)
      return &c;
  return nullptr;
}

// Keys that carry no information for training the math (ids, caches, dropout
// that is zero for fine-tuning, bookkeeping).
constexpr StringRef kIgnoredKeys[] = {
    "architectures", "auto_map", "bos_token_id", "eos_token_id", "pad_token_id",
    "initializer_range", "transformers_version", "use_cache", "torch_dtype", "dtype",
    "attention_dropout", "hidden_dropout", "output_router_logits", "router_aux_loss_coef",
    "aux_loss_alpha", "seq_aux", "router_jitter_noise", "pretraining_tp", "ep_size",
    "max_window_layers", "quantization_config", "num_logits_to_keep", "use_mamba_kernels",
    "mamba_ssm_cache_dtype", "rescale_prenorm_residual", "residual_in_fp32",
    "time_step_min", "time_step_max", "time_step_floor", "time_step_limit",
    "mtp_layers_block_type", "mtp_hybrid_override_pattern", "moe_shared_expert_overlap",
    "initial_context_length", "model_max_length", "tie_word_embeddings", "provenance",
    "qk_head_dim", "mamba_hidden_act", "use_grouped_topk", "moe_layer_freq", "topk_method"};

/// The per-layer token mixer named by a `layer_types` entry.
TokenMixer attentionMixer(ConfigReader &config) {
  if (config.has({"index_topk"}))
    return TokenMixer::DSA;
  if (config.has({"kv_lora_rank"}))
    return TokenMixer::MLA;
  return TokenMixer::GQA;
}

TokenMixer linearMixer(ConfigReader &config) {
  if (config.has({"linear_num_value_heads", "linear_value_head_dim"}))
    return TokenMixer::GatedDeltaNet;
  if (config.has({"linear_attn_config", "linear_num_heads", "linear_head_dim"}))
    return TokenMixer::KDA;
  if (config.has({"mamba_num_heads"}))
    return TokenMixer::Mamba2;
  return TokenMixer::None;
}

/// Fills spec.layers from whichever layer description the config has.
void readLayerPattern(ConfigReader &config, ModelSpec &spec) {
  int64_t n = spec.numLayers;
  spec.layers.assign(n, LayerSpec{});

  // Hybrid blocks with one mixer each (Nemotron-H): a list or a pattern string.
  std::optional<std::vector<std::string>> blocks = config.optStringList({"layers_block_type"});
  if (!blocks) {
    if (std::optional<std::string> pattern = config.optString({"hybrid_override_pattern"})) {
      blocks.emplace();
      for (char c : *pattern) {
        StringRef name = StringSwitch<StringRef>(StringRef(&c, 1))
                             .Case("M", "mamba")
                             .Case("*", "attention")
                             .Case("E", "moe")
                             .Case("-", "mlp")
                             .Default("");
        if (name.empty()) {
          config.fail("hybrid_override_pattern",
                      formatv("unknown block '{0}' (expected M, *, E or -)", c).str());
          return;
        }
        blocks->push_back(name.str());
      }
    }
  }
  if (blocks) {
    StringRef key = config.has({"layers_block_type"}) ? "layers_block_type" : "hybrid_override_pattern";
    if (static_cast<int64_t>(blocks->size()) != n) {
      config.fail(key, formatv("has {0} blocks but num_hidden_layers is {1}", blocks->size(), n).str());
      return;
    }
    for (int64_t i = 0; i < n; ++i) {
      StringRef b = (*blocks)[i];
      LayerSpec &layer = spec.layers[i];
      if (b == "mamba" || b == "linear_attention")
        layer.tokenMixer = TokenMixer::Mamba2;
      else if (b == "attention" || b == "full_attention")
        layer.tokenMixer = attentionMixer(config);
      else if (b == "moe")
        layer.channelMixer = ChannelMixer::MoE;
      else if (b == "mlp")
        layer.channelMixer = ChannelMixer::Dense;
      else {
        config.fail(key, formatv("unknown block type '{0}' at layer {1} (expected mamba, "
                                 "attention, moe or mlp)",
                                 b, i)
                             .str());
        return;
      }
    }
    return;
  }

  // Token mixers.
  if (std::optional<std::vector<std::string>> types = config.optStringList({"layer_types"})) {
    if (static_cast<int64_t>(types->size()) != n) {
      config.fail("layer_types",
                  formatv("has {0} entries but num_hidden_layers is {1}", types->size(), n).str());
      return;
    }
    for (int64_t i = 0; i < n; ++i) {
      StringRef t = (*types)[i];
      LayerSpec &layer = spec.layers[i];
      if (t == "full_attention" || t == "attention")
        layer.tokenMixer = attentionMixer(config);
      else if (t == "sliding_attention") {
        layer.tokenMixer = TokenMixer::GQA;
        layer.slidingWindow = true;
      } else if (t == "deepseek_sparse_attention")
        layer.tokenMixer = TokenMixer::DSA;
      else if (t == "linear_attention") {
        layer.tokenMixer = linearMixer(config);
        if (layer.tokenMixer == TokenMixer::None) {
          config.fail("layer_types", formatv("layer {0} is linear_attention but no linear-attention "
                                             "keys (linear_num_value_heads, linear_attn_config, "
                                             "mamba_num_heads) say which kind",
                                             i)
                                         .str());
          return;
        }
      } else {
        config.fail("layer_types",
                    formatv("unknown layer type '{0}' at layer {1} (expected full_attention, "
                            "sliding_attention, linear_attention or deepseek_sparse_attention)",
                            t, i)
                        .str());
        return;
      }
    }
  } else if (std::optional<ConfigReader> linear = config.optObject({"linear_attn_config"})) {
    // Kimi-Linear's hub config: 1-based layer numbers.
    std::vector<int64_t> kda = linear->optIntList({"kda_layers"}).value_or(std::vector<int64_t>{});
    std::vector<int64_t> full =
        linear->optIntList({"full_attn_layers"}).value_or(std::vector<int64_t>{});
    for (int64_t i = 0; i < n; ++i)
      spec.layers[i].tokenMixer = TokenMixer::None;
    for (auto [list, mixer, key] :
         {std::make_tuple(&kda, TokenMixer::KDA, "linear_attn_config.kda_layers"),
          std::make_tuple(&full, attentionMixer(config), "linear_attn_config.full_attn_layers")}) {
      for (int64_t number : *list) {
        if (number < 1 || number > n) {
          config.fail(key, formatv("layer number {0} is outside 1..{1} (1-based)", number, n).str());
          return;
        }
        if (spec.layers[number - 1].tokenMixer != TokenMixer::None) {
          config.fail(key, formatv("layer number {0} is listed twice", number).str());
          return;
        }
        spec.layers[number - 1].tokenMixer = mixer;
      }
    }
    for (int64_t i = 0; i < n; ++i)
      if (spec.layers[i].tokenMixer == TokenMixer::None) {
        config.fail("linear_attn_config",
                    formatv("layer number {0} is in neither kda_layers nor full_attn_layers", i + 1).str());
        return;
      }
  } else if (std::optional<int64_t> interval = config.optInt({"full_attention_interval"})) {
    if (*interval <= 0) {
      config.fail("full_attention_interval", formatv("must be positive, got {0}", *interval).str());
      return;
    }
    for (int64_t i = 0; i < n; ++i)
      spec.layers[i].tokenMixer =
          (i + 1) % *interval == 0 ? attentionMixer(config) : linearMixer(config);
  } else {
    for (LayerSpec &layer : spec.layers)
      layer.tokenMixer = attentionMixer(config);
  }

  // Channel mixers.
  bool hasExperts = spec.moe.numExperts > 0;
  if (std::optional<std::vector<std::string>> types = config.optStringList({"mlp_layer_types"})) {
    config.markRead({"first_k_dense_replace"}); // superseded by the explicit list
    if (static_cast<int64_t>(types->size()) != n) {
      config.fail("mlp_layer_types",
                  formatv("has {0} entries but num_hidden_layers is {1}", types->size(), n).str());
      return;
    }
    for (int64_t i = 0; i < n; ++i) {
      StringRef t = (*types)[i];
      if (t == "dense")
        spec.layers[i].channelMixer = ChannelMixer::Dense;
      else if (t == "sparse" || t == "moe")
        spec.layers[i].channelMixer = ChannelMixer::MoE;
      else {
        config.fail("mlp_layer_types",
                    formatv("unknown MLP type '{0}' at layer {1} (expected dense or sparse)", t, i).str());
        return;
      }
    }
  } else if (std::optional<int64_t> firstDense = config.optInt({"first_k_dense_replace"})) {
    int64_t freq = config.optInt({"moe_layer_freq"}).value_or(1);
    for (int64_t i = 0; i < n; ++i)
      spec.layers[i].channelMixer = hasExperts && i >= *firstDense && freq > 0 && i % freq == 0
                                        ? ChannelMixer::MoE
                                        : ChannelMixer::Dense;
  } else {
    int64_t step = config.optInt({"decoder_sparse_step"}).value_or(1);
    std::vector<int64_t> denseOnly =
        config.optIntList({"mlp_only_layers"}).value_or(std::vector<int64_t>{});
    for (int64_t i = 0; i < n; ++i) {
      bool dense = !hasExperts || llvm::is_contained(denseOnly, i) || step <= 0 || (i + 1) % step != 0;
      spec.layers[i].channelMixer = dense ? ChannelMixer::Dense : ChannelMixer::MoE;
    }
  }
  for (int64_t i = 0; i < n; ++i)
    if (spec.layers[i].channelMixer == ChannelMixer::MoE && !hasExperts) {
      config.fail("num_experts", formatv("layer {0} is a MoE layer but the config names no experts "
                                         "(num_experts, num_local_experts or n_routed_experts)",
                                         i)
                                     .str());
      return;
    }
}

void readRope(ConfigReader &config, ModelSpec &spec) {
  RopeSpec &rope = spec.rope;
  // transformers v5 nests theta and scaling in rope_parameters; hub configs use
  // rope_theta and rope_scaling at the top level.
  std::optional<ConfigReader> params = config.optObject({"rope_parameters"});
  std::optional<ConfigReader> scaling = config.optObject({"rope_scaling"});
  ConfigReader *nested = params ? &*params : (scaling ? &*scaling : nullptr);
  if (std::optional<double> theta = config.optDouble({"rope_theta"}))
    rope.theta = *theta;
  else if (params && params->has({"rope_theta"}))
    rope.theta = *params->optDouble({"rope_theta"});
  rope.partialFactor = config.optDouble({"partial_rotary_factor"})
                           .value_or(params ? params->optDouble({"partial_rotary_factor"}).value_or(1.0) : 1.0);
  rope.interleaved = config.optBool({"rope_interleave"}).value_or(false);
  if (nested) {
    std::string type = nested->optString({"rope_type", "type"}).value_or("default");
    if (type == "yarn") {
      YarnSpec yarn;
      yarn.factor = nested->requireDouble({"factor"});
      yarn.originalMaxPosition = nested->optInt({"original_max_position_embeddings"})
                                     .value_or(config.optInt({"initial_context_length"}).value_or(0));
      yarn.betaFast = nested->optDouble({"beta_fast"}).value_or(32);
      yarn.betaSlow = nested->optDouble({"beta_slow"}).value_or(1);
      yarn.mscale = nested->optDouble({"mscale"}).value_or(1);
      yarn.mscaleAllDim = nested->optDouble({"mscale_all_dim"}).value_or(0);
      nested->markRead({"truncate"});
      rope.yarn = yarn;
    } else if (type != "default") {
      config.fail(params ? "rope_parameters.rope_type" : "rope_scaling.type",
                  "unsupported RoPE scaling '" + type + "' (supported: default, yarn)");
    }
    for (const std::string &key : nested->unreadKeys())
      spec.unusedKeys.push_back(key);
  }
}

/// Hub spellings of the activation; SwiGLU for silu, relu² for relu2.
bool readGated(ConfigReader &config, ArrayRef<StringRef> keys, bool &gated) {
  std::string act = config.optString(keys).value_or("silu");
  if (act == "silu" || act == "swish") {
    gated = true;
    return true;
  }
  if (act == "relu2") {
    gated = false;
    return true;
  }
  config.fail(config.keyOf(keys), "unsupported activation '" + act + "' (supported: silu, relu2)");
  return false;
}

void readMoE(ConfigReader &config, ModelSpec &spec) {
  MoESpec &moe = spec.moe;
  moe.numExperts = config.optInt({"num_experts", "num_local_experts", "n_routed_experts"}).value_or(0);
  if (moe.numExperts <= 0)
    return;
  moe.topK = config.requireInt({"num_experts_per_tok", "num_experts_per_token", "experts_per_token"});
  moe.intermediate = config.optInt({"moe_intermediate_size"}).value_or(spec.intermediateSize);
  std::string scoring = config.optString({"scoring_func", "moe_router_activation_func"}).value_or("softmax");
  if (scoring == "softmax")
    moe.scoring = MoESpec::Scoring::Softmax;
  else if (scoring == "sigmoid")
    moe.scoring = MoESpec::Scoring::Sigmoid;
  else if (scoring == "topk_softmax")
    moe.scoring = MoESpec::Scoring::TopkSoftmax;
  else
    config.fail(config.keyOf({"scoring_func", "moe_router_activation_func"}),
                "unsupported router scoring '" + scoring + "' (supported: softmax, sigmoid, topk_softmax)");
  moe.correctionBias = config.optString({"topk_method"}).value_or("") == "noaux_tc";
  moe.normTopkProb = config.optBool({"norm_topk_prob", "moe_renormalize"}).value_or(false);
  moe.nGroup = config.optInt({"n_group", "num_expert_group"}).value_or(1);
  moe.topkGroup = config.optInt({"topk_group"}).value_or(1);
  moe.scaling = config.optDouble({"routed_scaling_factor"}).value_or(1.0);
  if (std::optional<int64_t> width = config.optInt({"shared_expert_intermediate_size", "moe_shared_expert_intermediate_size"}))
    moe.sharedIntermediate = *width;
  else
    moe.sharedIntermediate = moe.intermediate * config.optInt({"n_shared_experts", "num_shared_experts"}).value_or(0);
  config.markRead({"n_shared_experts", "num_shared_experts"});
  moe.latentSize = config.optInt({"moe_latent_size"}).value_or(0);
  moe.swigluLimit = config.optDouble({"swiglu_limit"});
  readGated(config, {"mlp_hidden_act", "hidden_act"}, moe.gated);
  if (moe.fusedGateUp && !moe.swigluLimit)
    moe.swigluLimit = 7.0;

  if (moe.topK <= 0 || moe.topK > moe.numExperts)
    config.fail("num_experts_per_tok", formatv("must be between 1 and the number of experts ({0}), got {1}",
                                               moe.numExperts, moe.topK).str());
  else if (moe.nGroup <= 0 || moe.numExperts % moe.nGroup != 0)
    config.fail("n_group", formatv("must divide the number of experts ({0}), got {1}", moe.numExperts,
                                   moe.nGroup).str());
  else if (moe.topkGroup <= 0 || moe.topkGroup > moe.nGroup)
    config.fail("topk_group", formatv("must be between 1 and n_group ({0}), got {1}", moe.nGroup,
                                      moe.topkGroup).str());
  else if (moe.topK > moe.topkGroup * (moe.numExperts / moe.nGroup))
    config.fail("num_experts_per_tok", formatv("top-k {0} exceeds the {1} experts in the topk_group best groups",
                                               moe.topK, moe.topkGroup * (moe.numExperts / moe.nGroup)).str());
  else if (moe.intermediate <= 0)
    config.fail("moe_intermediate_size", formatv("must be positive, got {0}", moe.intermediate).str());
}

void readAttention(ConfigReader &config, ModelSpec &spec) {
  AttentionSpec &attn = spec.attention;
  attn.numHeads = config.requireInt({"num_attention_heads"});
  attn.numKvHeads = config.optInt({"num_key_value_heads"}).value_or(attn.numHeads);
  if (attn.numHeads <= 0) {
    config.fail("num_attention_heads", formatv("must be positive, got {0}", attn.numHeads).str());
    return;
  }
  attn.headDim = config.optInt({"head_dim"}).value_or(spec.hiddenSize / attn.numHeads);
  attn.bias = config.optBool({"attention_bias"}).value_or(false);
  if (attn.numKvHeads <= 0 || attn.numHeads % attn.numKvHeads != 0)
    config.fail("num_key_value_heads", formatv("must divide num_attention_heads ({0}), got {1}",
                                               attn.numHeads, attn.numKvHeads).str());
  if (config.optBool({"use_sliding_window"}).value_or(false))
    attn.slidingWindow = config.optInt({"sliding_window"});
  else if (config.has({"layer_types"}))
    attn.slidingWindow = config.optInt({"sliding_window"});
  config.markRead({"sliding_window", "use_sliding_window"});
}

void readMLA(ConfigReader &config, ModelSpec &spec) {
  MLASpec &mla = spec.mla;
  mla.numHeads = spec.attention.numHeads;
  mla.qLoraRank = config.optInt({"q_lora_rank"});
  mla.kvLoraRank = config.requireInt({"kv_lora_rank"});
  mla.qkNopeHeadDim = config.requireInt({"qk_nope_head_dim"});
  mla.qkRopeHeadDim = config.requireInt({"qk_rope_head_dim"});
  mla.vHeadDim = config.requireInt({"v_head_dim"});
  mla.nope = config.optBool({"mla_use_nope"}).value_or(false);
  if (config.has({"index_topk"})) {
    mla.indexHeads = config.requireInt({"index_n_heads"});
    mla.indexHeadDim = config.requireInt({"index_head_dim"});
    mla.indexTopk = config.requireInt({"index_topk"});
    if (mla.indexHeadDim < mla.qkRopeHeadDim)
      config.fail("index_head_dim", formatv("must be at least qk_rope_head_dim ({0}), got {1}",
                                            mla.qkRopeHeadDim, mla.indexHeadDim).str());
    if (!mla.qLoraRank)
      config.fail("q_lora_rank", "DeepSeek Sparse Attention's indexer reads the query latent, so "
                                 "q_lora_rank must be set");
  }
}

} // namespace

Expected<ModelSpec> readModelSpec(ConfigReader &config) {
  ModelSpec spec;
  spec.modelType = config.optString({"model_type"}).value_or("");
  if (auto archs = config.optStringList({"architectures"}); archs && !archs->empty())
    spec.architecture = archs->front();
  const Convention *convention = findConvention(spec.modelType);
  if (convention) {
    Expected<json::Value> defaults = json::parse(convention->defaults);
    if (!defaults)
      return defaults.takeError();
    config.setDefaults(std::move(*defaults->getAsObject()));
  } else {
    // An unknown model_type imports when its features are the common ones.
    std::vector<std::string> missing;
    for (StringRef key : {"hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"})
      if (!config.has({key}))
        missing.push_back(key.str());
    if (!missing.empty())
      return createStringError(
          inconvertibleErrorCode(),
          "%s: key 'model_type': '%s' is not a known model type and its features are not "
          "recognisable (missing %s); known model types: qwen3_moe, qwen3_next, mixtral, "
          "olmoe, deepseek_v3, deepseek_v32, kimi_k2, kimi_linear, nemotron_h, gpt_oss",
          config.path().c_str(), spec.modelType.c_str(), join(missing, ", ").c_str());
  }
  if (std::optional<ConfigReader> text = config.optObject({"text_config"}))
    return createStringError(inconvertibleErrorCode(),
                             "%s: key 'text_config': multimodal configs are not supported; import "
                             "the text model's config on its own",
                             config.path().c_str());

  spec.hiddenSize = config.requireInt({"hidden_size"});
  spec.vocabSize = config.requireInt({"vocab_size"});
  // Hybrid-block configs may give the depth only as their block list.
  if (config.has({"num_hidden_layers"}))
    spec.numLayers = config.requireInt({"num_hidden_layers"});
  else if (auto blocks = config.optStringList({"layers_block_type"}))
    spec.numLayers = static_cast<int64_t>(blocks->size());
  else if (auto pattern = config.optString({"hybrid_override_pattern"}))
    spec.numLayers = static_cast<int64_t>(pattern->size());
  else
    spec.numLayers = config.requireInt({"num_hidden_layers"});
  spec.intermediateSize = config.optInt({"intermediate_size"}).value_or(0);
  spec.maxPositions = config.optInt({"max_position_embeddings", "model_max_length"}).value_or(0);
  spec.normEps = config.optDouble({"rms_norm_eps", "layer_norm_epsilon"}).value_or(1e-6);
  spec.tiedEmbeddings = config.optBool({"tie_word_embeddings"}).value_or(false);
  spec.mtpLayers = config.optInt({"num_nextn_predict_layers"}).value_or(0);
  spec.dtype = config.optString({"torch_dtype", "dtype"}).value_or("bfloat16");
  if (config.failed())
    return config.takeError();
  for (auto [key, value] : {std::make_pair("hidden_size", spec.hiddenSize),
                            std::make_pair("vocab_size", spec.vocabSize),
                            std::make_pair("num_hidden_layers", spec.numLayers)})
    if (value <= 0)
      config.fail(key, formatv("must be positive, got {0}", value).str());
  if (spec.dtype != "bfloat16" && spec.dtype != "float32" && spec.dtype != "float16")
    config.fail("torch_dtype", "unsupported dtype '" + spec.dtype + "' (supported: bfloat16, float16, float32)");
  if (config.failed())
    return config.takeError();
  if (convention && convention->apply)
    convention->apply(spec);

  readGated(config, {"mlp_hidden_act", "hidden_act"}, spec.denseGated);
  config.markRead({"hidden_act"});
  readMoE(config, spec);
  readAttention(config, spec);
  if (config.failed())
    return config.takeError();
  readLayerPattern(config, spec);
  if (config.failed())
    return config.takeError();

  bool any[7] = {};
  for (const LayerSpec &layer : spec.layers) {
    any[static_cast<int>(layer.tokenMixer)] = true;
    if (layer.slidingWindow && !spec.attention.slidingWindow)
      config.fail("sliding_window", "layer_types lists sliding_attention layers but sliding_window is not set");
  }
  if (any[static_cast<int>(TokenMixer::GQA)] || any[static_cast<int>(TokenMixer::MLA)] ||
      any[static_cast<int>(TokenMixer::DSA)])
    readRope(config, spec);
  if (any[static_cast<int>(TokenMixer::MLA)] || any[static_cast<int>(TokenMixer::DSA)])
    readMLA(config, spec);
  if (any[static_cast<int>(TokenMixer::GatedDeltaNet)]) {
    GatedDeltaNetSpec &gdn = spec.gdn;
    gdn.numKeyHeads = config.requireInt({"linear_num_key_heads"});
    gdn.numValueHeads = config.requireInt({"linear_num_value_heads"});
    gdn.keyHeadDim = config.requireInt({"linear_key_head_dim"});
    gdn.valueHeadDim = config.requireInt({"linear_value_head_dim"});
    gdn.convKernel = config.optInt({"linear_conv_kernel_dim"}).value_or(4);
    if (gdn.numKeyHeads <= 0 || gdn.numValueHeads % gdn.numKeyHeads != 0)
      config.fail("linear_num_value_heads", formatv("must be a multiple of linear_num_key_heads ({0}), got {1}",
                                                    gdn.numKeyHeads, gdn.numValueHeads).str());
  }
  if (any[static_cast<int>(TokenMixer::KDA)]) {
    KDASpec &kda = spec.kda;
    if (std::optional<ConfigReader> linear = config.optObject({"linear_attn_config"})) {
      kda.numHeads = linear->requireInt({"num_heads"});
      kda.headDim = linear->requireInt({"head_dim"});
      kda.convKernel = linear->optInt({"short_conv_kernel_size"}).value_or(4);
      if (linear->failed())
        return linear->takeError();
    } else {
      kda.numHeads = config.requireInt({"linear_num_heads"});
      kda.headDim = config.requireInt({"linear_head_dim"});
      kda.convKernel = config.optInt({"linear_conv_kernel_dim"}).value_or(4);
    }
  }
  if (any[static_cast<int>(TokenMixer::Mamba2)]) {
    Mamba2Spec &m = spec.mamba;
    m.numHeads = config.requireInt({"mamba_num_heads"});
    m.headDim = config.requireInt({"mamba_head_dim"});
    m.stateSize = config.requireInt({"ssm_state_size"});
    m.numGroups = config.optInt({"n_groups"}).value_or(1);
    m.convKernel = config.optInt({"conv_kernel"}).value_or(4);
    m.chunkSize = config.optInt({"chunk_size"}).value_or(256);
    m.convBias = config.optBool({"use_conv_bias"}).value_or(true);
    m.projBias = config.optBool({"mamba_proj_bias", "use_bias"}).value_or(false);
    m.timeStepMin = config.optDouble({"time_step_min"}).value_or(0.0);
    config.markRead({"expand", "use_bias"});
    if (m.numGroups <= 0 || m.numHeads % m.numGroups != 0)
      config.fail("n_groups", formatv("must divide mamba_num_heads ({0}), got {1}", m.numHeads, m.numGroups).str());
  }
  if (config.has({"clip_qkv"}))
    config.fail("clip_qkv", "clipping q/k/v activations is not supported");
  if (config.optBool({"mlp_bias"}).value_or(false))
    config.fail("mlp_bias", "MLP biases are not supported");
  config.markRead({"rope_parameters", "rope_scaling", "rope_theta", "partial_rotary_factor",
                   "rope_interleave", "linear_attn_config", "full_attention_interval",
                   "num_nextn_predict_layers", "mla_use_nope", "attn_output_gate"});
  config.markRead(kIgnoredKeys);
  if (config.failed())
    return config.takeError();
  for (const std::string &key : config.unreadKeys())
    spec.unusedKeys.push_back(key);
  return spec;
}

} // namespace moec::frontend
