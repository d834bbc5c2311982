//===- ModelSummary.h - parameter counts per layer type ---------*- C++ -*-===//
//
// Counts parameters from the IR (not from the config), so the numbers match
// what the compiler will bind, and a test can compare them with checkpoints.
//
//===----------------------------------------------------------------------===//

#ifndef COMPILER_ANALYSIS_MODELSUMMARY_H_
#define COMPILER_ANALYSIS_MODELSUMMARY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "dialects/moe/MoeOps.h"
#include "llvm/Support/raw_ostream.h"

namespace moec::analysis {

struct LayerTypeSummary {
  std::string name, tokenMixer, channelMixer;
  int64_t count = 0;
  int64_t paramsPerLayer = 0;
  int64_t activePerLayer = 0; // routed experts count top_k / num_experts
};

struct ModelSummary {
  std::string name, modelType;
  int64_t numLayers = 0, hiddenSize = 0, vocabSize = 0;
  std::vector<LayerTypeSummary> layerTypes;
  int64_t modelLevelParams = 0; // embedding, final norm, LM head
  int64_t totalParams = 0, activeParams = 0;
  int64_t skippedMtpLayers = 0;
};

ModelSummary summarizeModel(moe::ModelOp model);
void printSummary(const ModelSummary &summary, llvm::raw_ostream &os);

/// Expert parallel with `ranks` ranks of `experts / ranks` consecutive experts: the expected
/// share of a rank's tokens that go to one given rank (at least one of the token's `topK`
/// distinct experts is there), with uniform routing: 1 - C(E - m, k) / C(E, k), m = E/n.
/// `expertsOnRank` > 0 gives m (a placement that replicates experts holds more on a rank: an
/// upper bound, as a replicated expert's copies split over its replicas).
double tokenShareOfRank(int64_t experts, int64_t topK, int64_t ranks, int64_t expertsOnRank = 0);

/// Expert parallel's exchange on `--ep-exchange=auto`: every token to every rank (fixed
/// message sizes: no rank waits for its tokens' experts on the host) when a token has an expert
/// on a given rank with at least this probability anyway, so the tokens sent for nothing cost
/// at most 1/9 more bytes (Qwen3-30B-A3B's top-8 of 128 over 2 ranks: 0.997; over 8: 0.67).
constexpr double kAllTokensShare = 0.9;
inline bool allTokensPays(int64_t experts, int64_t topK, int64_t ranks) {
  return tokenShareOfRank(experts, topK, ranks) >= kAllTokensShare;
}

/// "30,532,122,624".
std::string withCommas(int64_t n);
/// "30.53B", "26.74M", "512".
std::string humanCount(int64_t n);

} // namespace moec::analysis

#endif // COMPILER_ANALYSIS_MODELSUMMARY_H_
