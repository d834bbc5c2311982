//===- Adapter.h - PEFT LoRA adapters: export and import --------*- C++ -*-===//
//
// A PEFT adapter is a directory with `adapter_config.json` and
// `adapter_model.safetensors`, as Hugging Face PEFT's save_pretrained writes
// them and PEFT, transformers and vLLM load them.
//
// exportAdapter writes the config with the key set and value style of PEFT
// 0.21 (json.dumps(indent=2, sort_keys=True), ASCII only, integers as
// integers, floats in Python's repr), and the tensors as F32 with metadata
// {"format": "pt"}; both files are written atomically (temporary file, fsync,
// rename), weights first, config last. A tensor name containing `{expert}`
// holds a stack [E, ...] and is written as E tensors, `{expert}` replaced by
// 0 .. E-1, of shape [...] (PEFT's per-expert names).
//
// importAdapter reads both back, refusing what this runtime cannot apply
// (see README.md): a clear error beats a silently different model.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_PEFT_ADAPTER_H_
#define RUNTIME_PEFT_ADAPTER_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/weights/DType.h"

namespace moec::runtime::peft {

constexpr char kAdapterConfigFile[] = "adapter_config.json";
constexpr char kAdapterWeightsFile[] = "adapter_model.safetensors";
constexpr char kExpertPlaceholder[] = "{expert}";
/// Every PEFT tensor name starts with it.
constexpr char kPeftNamePrefix[] = "base_model.model.";
/// The PEFT version whose adapter_config.json layout exportAdapter writes.
constexpr char kPeftFormatVersion[] = "0.21.0";

/// The adapter_config.json fields that carry meaning for a LoRA adapter.
struct AdapterSpec {
  int64_t r = 0;
  double loraAlpha = 0;
  double loraDropout = 0;
  /// In the file's order (PEFT keeps a set; its order is arbitrary).
  std::vector<std::string> targetModules;
  bool useRslora = false;
  /// Empty = null.
  std::string baseModelNameOrPath;
  /// Empty = null; otherwise a PEFT TaskType such as "CAUSAL_LM".
  std::string taskType;
  /// PEFT's "auto_mapping" {"base_model_class", "parent_library"}, which it
  /// writes when task_type is null; empty = null.
  std::string baseModelClass;
  std::string parentLibrary;
  /// PEFT's "modules_to_save" (empty = null): modules trained in full, whose tensors the
  /// adapter holds as base_model.model.<module>.weight / .bias. Export writes full module
  /// paths; import matches a tensor's module by suffix, as PEFT does.
  std::vector<std::string> modulesToSave;

  bool operator==(const AdapterSpec &other) const;
  bool operator!=(const AdapterSpec &other) const { return !(*this == other); }
};

/// A named f32 tensor, row-major.
struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};

struct AdapterTensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
  /// The dtype in the file (F32, BF16 or F16); `data` is always f32.
  weights::DType fileDType = weights::DType::F32;
};

struct Adapter {
  AdapterSpec spec;
  /// PEFT name (base_model.model.<module>.lora_A.weight) -> tensor.
  std::map<std::string, AdapterTensor> tensors;

  /// Stacks the per-expert tensors `pattern` ({expert} = 0 .. numExperts-1),
  /// which must all exist and share one shape, into [numExperts, ...].
  absl::StatusOr<AdapterTensor> readStacked(const std::string &pattern, int64_t numExperts) const;
};

struct ImportOptions {
  /// When not empty: the tensors the adapter must hold, exactly, and their
  /// shapes. A name with `{expert}` and shape [E, ...] expects E per-expert
  /// tensors of shape [...].
  std::map<std::string, std::vector<int64_t>> expectedShapes;
  /// Tensors the adapter may hold (then at these shapes) or leave out: a module trained in
  /// full, which an adapter of LoRA tensors alone leaves at the base model's value.
  std::map<std::string, std::vector<int64_t>> optionalShapes;
};

/// Whether `name` is a LoRA tensor's (.lora_A.weight, .lora_B.weight, .lora_embedding_A/B).
bool isLoraTensorName(std::string_view name);

/// The modules to save for `tensors` (PEFT name -> shape; a `{expert}` name of shape [E, ...]
/// stands for E tensors): the module of each tensor that is not a LoRA tensor, sorted. An
/// error names a tensor PEFT cannot save (not base_model.model.<module>.weight or .bias).
absl::StatusOr<std::vector<std::string>> modulesToSaveOf(const std::map<std::string, std::vector<int64_t>> &tensors);

/// What exportAdapter checks before it writes anything, from the names and shapes alone:
/// the spec; every name starts with "base_model.model."; a LoRA tensor's shape (lora_A has
/// r rows, lora_B r columns); any other tensor is the weight or bias of a module in
/// spec.modulesToSave, which holds no LoRA adapter and has a tensor. `frozen`: the base
/// model's other tensors (PEFT names); none may belong to a module to save, which PEFT
/// loads whole.
absl::Status checkAdapterTensors(const AdapterSpec &spec, const std::map<std::string, std::vector<int64_t>> &tensors,
                                 const std::vector<std::string> &frozen = {});

/// Writes `dir`/adapter_config.json and `dir`/adapter_model.safetensors,
/// creating `dir` if needed, after checkAdapterTensors.
absl::Status exportAdapter(const std::string &dir, const AdapterSpec &spec,
                           const std::vector<NamedTensor> &tensors);

/// Reads the adapter in `dir`; tensors in BF16 or F16 are widened to f32.
absl::StatusOr<Adapter> importAdapter(const std::string &dir, const ImportOptions &options = {});

/// The text of adapter_config.json for `spec` (as PEFT 0.21 writes it).
absl::StatusOr<std::string> adapterConfigJson(const AdapterSpec &spec);
/// Parses adapter_config.json text; `path` prefixes the errors.
absl::StatusOr<AdapterSpec> parseAdapterConfig(std::string_view text, const std::string &path);

/// Python's repr() of a finite double ("0.0", "0.05", "1e-05", "1e+16"),
/// which json.dumps writes.
std::string pythonFloatRepr(double value);

} // namespace moec::runtime::peft

#endif // RUNTIME_PEFT_ADAPTER_H_
