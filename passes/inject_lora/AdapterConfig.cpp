//===- AdapterConfig.cpp - read a PEFT adapter_config.json ----------------===//

#include "passes/inject_lora/AdapterConfig.h"

#include <optional>

#include "llvm/ADT/SmallString.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

namespace moec::passes {

using namespace llvm;

namespace {

/// A value as the file spells it, cut short for messages.
std::string show(const json::Value &value) {
  std::string text;
  raw_string_ostream(text) << value;
  return text.size() > 80 ? text.substr(0, 77) + "..." : text;
}

/// "", [] and {}: PEFT's spellings of "not used", besides null.
bool isEmpty(const json::Value &value) {
  if (const json::Array *array = value.getAsArray())
    return array->empty();
  if (const json::Object *object = value.getAsObject())
    return object->empty();
  if (std::optional<StringRef> text = value.getAsString())
    return text->empty();
  return false;
}

/// Typed reads of the config's fields; every error names the file and the key.
class Fields {
public:
  Fields(StringRef file, const json::Object &object) : file(file), object(object) {}

  Error error(StringRef key, const Twine &message) const {
    return createStringError(inconvertibleErrorCode(),
                             formatv("{0}: key '{1}': {2}", file, key, message.str()).str());
  }
  Error wrongType(StringRef key, StringRef expected, const json::Value &found) const {
    return error(key, "expected " + expected + ", got " + show(found));
  }
  Error unsupported(StringRef key, const json::Value &found, StringRef feature, StringRef instead) const {
    return error(key, show(found) + " asks for " + feature + ", which is not supported; " + instead);
  }

  /// The value of `key`, or null when it is absent or JSON null.
  const json::Value *get(StringRef key) const {
    const json::Value *value = object.get(key);
    return value && value->kind() != json::Value::Null ? value : nullptr;
  }
  Expected<const json::Value &> require(StringRef key, StringRef meaning) const {
    if (const json::Value *value = get(key))
      return *value;
    return error(key, "missing or null (" + meaning + ")");
  }
  Expected<bool> flag(StringRef key) const {
    const json::Value *value = get(key);
    if (!value)
      return false;
    if (std::optional<bool> on = value->getAsBoolean())
      return *on;
    return wrongType(key, "true or false", *value);
  }

private:
  StringRef file;
  const json::Object &object;
};

/// PEFT features that change what is trained, with the setting each must keep here.
enum class Allows { False, Empty, Null };
struct Refusal {
  const char *key;
  Allows allows;
  const char *feature, *instead;
};
constexpr Refusal kRefusals[] = {
    {"use_dora", Allows::False, "DoRA (weight-decomposed LoRA)", "only plain LoRA (false) is"},
    {"fan_in_fan_out", Allows::False, "[in, out] (Conv1D) base weights",
     "the projections are [out, in] (false)"},
    {"lora_bias", Allows::False, "a trainable bias on lora_B", "only false is"},
    {"rank_pattern", Allows::Empty, "per-module ranks", "one r for every target ({})"},
    {"alpha_pattern", Allows::Empty, "per-module alphas", "one lora_alpha for every target ({})"},
    {"layers_to_transform", Allows::Null, "adapting a subset of the layers",
     "every layer is adapted (null); qualify targets by layer type instead (e.g. kda:o_proj)"},
    {"modules_to_save", Allows::Empty, "fully trained copies of modules",
     "only LoRA adapters are trained (null)"},
    {"exclude_modules", Allows::Empty, "excluding modules",
     "list only the modules to adapt in target_modules (null)"},
    {"target_parameters", Allows::Empty, "adapters on raw parameters",
     "use the expert-lora option to adapt routed experts' projections ([])"},
};

Expected<AdapterConfig> readFields(const Fields &fields) {
  AdapterConfig config;
  if (const json::Value *type = fields.get("peft_type")) {
    std::optional<StringRef> name = type->getAsString();
    if (!name)
      return fields.wrongType("peft_type", "a string", *type);
    if (*name != "LORA")
      return fields.unsupported("peft_type", *type, "another adapter method", "only \"LORA\" is");
  }
  for (const Refusal &refusal : kRefusals) {
    const json::Value *value = fields.get(refusal.key);
    if (!value)
      continue;
    bool refused = true; // Allows::Null: any value is refused
    if (refusal.allows == Allows::Empty)
      refused = !isEmpty(*value);
    if (refusal.allows == Allows::False) {
      Expected<bool> on = fields.flag(refusal.key);
      if (!on)
        return on.takeError();
      refused = *on;
    }
    if (refused)
      return fields.unsupported(refusal.key, *value, refusal.feature, refusal.instead);
  }
  if (const json::Value *bias = fields.get("bias")) {
    std::optional<StringRef> kind = bias->getAsString();
    if (!kind)
      return fields.wrongType("bias", "a string", *bias);
    if (*kind != "none")
      return fields.unsupported("bias", *bias, "training the base model's biases", "only \"none\" is");
  }

  Expected<const json::Value &> rank = fields.require("r", "the adapter rank");
  if (!rank)
    return rank.takeError();
  std::optional<int64_t> r = rank->getAsInteger();
  if (!r || *r <= 0)
    return fields.wrongType("r", "a positive integer", *rank);
  config.rank = *r;

  Expected<const json::Value &> alpha = fields.require("lora_alpha", "the scale numerator");
  if (!alpha)
    return alpha.takeError();
  std::optional<double> a = alpha->getAsNumber();
  if (!a)
    return fields.wrongType("lora_alpha", "a number", *alpha);
  config.alpha = *a;

  if (const json::Value *dropout = fields.get("lora_dropout")) {
    std::optional<double> p = dropout->getAsNumber();
    if (!p || *p < 0 || *p >= 1)
      return fields.wrongType("lora_dropout", "a number in [0, 1)", *dropout);
    config.dropout = *p;
  }

  Expected<bool> rslora = fields.flag("use_rslora");
  if (!rslora)
    return rslora.takeError();
  config.rslora = *rslora;

  // A null target_modules makes PEFT pick per-model defaults, which are not known here.
  Expected<const json::Value &> targets =
      fields.require("target_modules", "the modules to adapt: a list of names or \"all-linear\"");
  if (!targets)
    return targets.takeError();
  if (std::optional<StringRef> single = targets->getAsString()) {
    if (*single != "all-linear")
      return fields.unsupported("target_modules", *targets, "a regular expression",
                                "list the module names instead, or use \"all-linear\"");
    config.targets.push_back(single->str());
    return config;
  }
  const json::Array *list = targets->getAsArray();
  if (!list || list->empty())
    return fields.wrongType("target_modules", "a non-empty list of module names or \"all-linear\"", *targets);
  for (const json::Value &target : *list) {
    std::optional<StringRef> name = target.getAsString();
    if (!name || name->empty())
      return fields.wrongType("target_modules", "module names (strings)", target);
    config.targets.push_back(name->str());
  }
  return config;
}

} // namespace

Expected<AdapterConfig> readAdapterConfig(StringRef path) {
  SmallString<256> file(path);
  if (sys::fs::is_directory(file))
    sys::path::append(file, "adapter_config.json");
  ErrorOr<std::unique_ptr<MemoryBuffer>> buffer = MemoryBuffer::getFile(file);
  if (!buffer)
    return createStringError(buffer.getError(),
                             formatv("{0}: cannot read: {1}", file, buffer.getError().message()).str());
  Expected<json::Value> root = json::parse((*buffer)->getBuffer());
  if (!root)
    return createStringError(inconvertibleErrorCode(),
                             formatv("{0}: malformed JSON: {1}", file, toString(root.takeError())).str());
  const json::Object *object = root->getAsObject();
  if (!object)
    return createStringError(inconvertibleErrorCode(),
                             formatv("{0}: expected a JSON object, got {1}", file, show(*root)).str());
  return readFields(Fields(file, *object));
}

} // namespace moec::passes
