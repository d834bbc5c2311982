//===- RandomModel.h - random checkpoints for a plan ------------*- C++ -*-===//
//
// writeRandomModel makes a Hugging Face style model directory
// (model.safetensors + config.json) holding every checkpoint tensor a plan
// binds to a WEIGHT buffer, filled the way transformers' _init_weights would
// fill a fresh model (norm weights 1, biases 0, N(0, initializer_range) for
// the rest, and the special state-space parameters), so that demos, tests and
// benchmarks run without downloading a model. Tensors are F32, whatever the
// buffers' dtype (the loader converts on binding).
//
// Values are a pure function of (seed, tensor name, shape): each tensor has
// its own SplitMix64 stream (see README.md), so the file is byte-identical
// for a seed, whatever the plan's sharding or the order of its bindings.
// Tensors are generated and written one at a time (memory: the largest
// tensor), and the file is written atomically (temporary file, fsync, rename).
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_INIT_RANDOMMODEL_H_
#define RUNTIME_INIT_RANDOMMODEL_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/plan/plan.pb.h"

namespace moec::runtime::init {

/// What the values depend on in config.json.
struct InitConfig {
  /// "model_type" (the plan's model_type when the config has none).
  std::string modelType;
  /// "initializer_range" (default 0.02), the std of the normal draws.
  double initializerRange = 0.02;
  /// "pad_token_id": that row of `embed_tokens.weight` is zero, as nn.Embedding's padding_idx.
  std::optional<int64_t> padTokenId;
};

/// How a tensor is filled, chosen by its name (see README.md for the rules).
enum class InitKind {
  Normal,  // N(0, initializer_range)
  Zeros,   // biases, e_score_correction_bias, sinks, zero-centred norms
  Ones,    // norm weights, D
  ALog,    // log(U[1, 16))
  DtBias,  // softplus^-1(dt), dt log-uniform in [1e-3, 1e-1]
};

InitKind initKindFor(std::string_view tensorName, std::string_view modelType);

/// Reads the fields above from config.json; `planModelType` fills in a missing model_type.
absl::StatusOr<InitConfig> readInitConfig(const std::string &configJsonPath,
                                          const std::string &planModelType);

/// Every checkpoint tensor the plan's WEIGHT bindings read, across all ranks,
/// with its full shape: `{expert}` names expanded to one tensor per expert
/// (first_expert + shape[0] of every binding, the largest), sliced bindings
/// widened to the largest start + size each dimension reaches.
absl::StatusOr<std::map<std::string, std::vector<int64_t>>>
checkpointTensors(const plan::Plan &plan);

/// Fills `out` (product(shape) floats) with tensor `name`'s values for `seed`.
void fillTensor(std::string_view name, absl::Span<const int64_t> shape, const InitConfig &config,
                uint64_t seed, float *out);

/// Writes outDir/model.safetensors (F32, metadata {"format": "pt"}) and a byte
/// copy of config.json to outDir/config.json; creates outDir if needed.
absl::Status writeRandomModel(const plan::Plan &plan, const std::string &configJsonPath,
                              uint64_t seed, const std::string &outDir);

} // namespace moec::runtime::init

#endif // RUNTIME_INIT_RANDOMMODEL_H_
