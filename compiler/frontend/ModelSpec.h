//===- ModelSpec.h - a model as features, read from config.json -*- C++ -*-===//
//
// The importer's intermediate form: each layer is (token mixer) x (channel
// mixer) with the numbers its ops need, plus the checkpoint naming scheme.
// Nothing here names a model family; `model_type` only selects the config
// class defaults and the tensor naming that the checkpoint uses.
//
//===----------------------------------------------------------------------===//

#ifndef COMPILER_FRONTEND_MODELSPEC_H_
#define COMPILER_FRONTEND_MODELSPEC_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "llvm/Support/Error.h"

namespace moec::frontend {

class ConfigReader;

enum class TokenMixer { None, GQA, MLA, DSA, GatedDeltaNet, KDA, Mamba2 };
enum class ChannelMixer { None, Dense, MoE };

const char *toString(TokenMixer mixer);
const char *toString(ChannelMixer mixer);

struct YarnSpec {
  double factor = 1, betaFast = 32, betaSlow = 1, mscale = 1, mscaleAllDim = 0;
  int64_t originalMaxPosition = 0;
};

struct RopeSpec {
  double theta = 10000;
  double partialFactor = 1; // fraction of the head dimension that rotates
  bool interleaved = false;
  std::optional<YarnSpec> yarn;
};

struct AttentionSpec {
  int64_t numHeads = 0, numKvHeads = 0, headDim = 0;
  enum class QkNorm { None, PerHead, FullWidth } qkNorm = QkNorm::None;
  bool outputGate = false; // q_proj doubles: query and a sigmoid gate per head
  bool bias = false;       // q/k/v/o projections have biases
  bool sinks = false;      // one learned softmax sink per head
  bool rope = true;
  std::optional<int64_t> slidingWindow;
};

struct MLASpec {
  int64_t numHeads = 0;
  std::optional<int64_t> qLoraRank; // absent: q_proj directly from x
  int64_t kvLoraRank = 0, qkNopeHeadDim = 0, qkRopeHeadDim = 0, vHeadDim = 0;
  bool nope = false; // Kimi-Linear: the rope features exist but never rotate
  // DeepSeek Sparse Attention indexer (MLA + DSA).
  int64_t indexHeads = 0, indexHeadDim = 0, indexTopk = 0;
};

struct GatedDeltaNetSpec {
  int64_t numKeyHeads = 0, numValueHeads = 0, keyHeadDim = 0, valueHeadDim = 0, convKernel = 4;
};

struct KDASpec {
  int64_t numHeads = 0, headDim = 0, convKernel = 4;
};

struct Mamba2Spec {
  int64_t numHeads = 0, headDim = 0, stateSize = 0, numGroups = 1, convKernel = 4, chunkSize = 256;
  bool convBias = true, projBias = false;
  double timeStepMin = 0.0; // transformers' torch_forward clamps dt from below at this
};

struct MoESpec {
  int64_t numExperts = 0, topK = 0, intermediate = 0;
  enum class Scoring { Softmax, Sigmoid, TopkSoftmax } scoring = Scoring::Softmax;
  bool correctionBias = false, routerBias = false, normTopkProb = false;
  int64_t nGroup = 1, topkGroup = 1;
  double scaling = 1.0;
  int64_t sharedIntermediate = 0; // 0: no shared expert
  bool sharedGate = false;        // sigmoid gate on the shared expert
  int64_t latentSize = 0;         // 0: experts at model width
  bool gated = true;              // SwiGLU experts; false: relu² (up, down only)
  bool fusedGateUp = false;       // gpt-oss: one interleaved [E, in, 2I] tensor with biases
  std::optional<double> swigluLimit;
};

struct LayerSpec {
  TokenMixer tokenMixer = TokenMixer::None;
  ChannelMixer channelMixer = ChannelMixer::None;
  bool slidingWindow = false; // GQA layers listed as sliding_attention
};

/// How checkpoint tensors are named (fact of the checkpoint, not of the math).
struct NameScheme {
  std::string embed = "model.embed_tokens.weight";
  std::string finalNorm = "model.norm.weight";
  std::string lmHead = "lm_head.weight";
  std::string layer = "model.layers.{layer}.";
  // Nemotron-H blocks hold one mixer and one norm; others a pre- and a post-norm.
  bool singleMixerBlocks = false;
  std::string attention = "self_attn.";
  std::string linearAttention = "self_attn."; // Qwen3-Next: "linear_attn."
  std::string mlp = "mlp.";
  std::string moe = "mlp.";
  std::string router = "gate.";
  std::string experts = "experts.{expert}.";
  std::string expertGate = "gate_proj", expertUp = "up_proj", expertDown = "down_proj";
  std::string shared = "shared_experts.";
  // Where transformers' module path differs from the checkpoint key (it
  // renames keys on load): PEFT names adapters by module path.
  std::vector<std::pair<std::string, std::string>> moduleRenames;
};

struct ModelSpec {
  std::string modelType, architecture;
  int64_t hiddenSize = 0, vocabSize = 0, numLayers = 0, intermediateSize = 0;
  int64_t maxPositions = 0;
  double normEps = 1e-6;
  bool unitOffsetNorm = false; // (1 + w) RMSNorm
  bool tiedEmbeddings = false;
  bool denseGated = true; // dense MLP is SwiGLU (else relu², up/down only)
  std::string dtype = "bfloat16";
  int64_t mtpLayers = 0; // multi-token-prediction layers in the checkpoint, not modelled

  RopeSpec rope;
  AttentionSpec attention;
  MLASpec mla;
  GatedDeltaNetSpec gdn;
  KDASpec kda;
  Mamba2Spec mamba;
  MoESpec moe;
  std::vector<LayerSpec> layers;
  NameScheme names;

  /// Keys present in the config that the importer did not use.
  std::vector<std::string> unusedKeys;
};

/// Reads the features of `config` (which must already be open).
llvm::Expected<ModelSpec> readModelSpec(ConfigReader &config);

} // namespace moec::frontend

#endif // COMPILER_FRONTEND_MODELSPEC_H_
