//===- Adapter.cpp - PEFT LoRA adapters: export and import ---------------===//

#include "runtime/peft/Adapter.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/weights/Json.h"
#include "runtime/weights/Safetensors.h"
#include "runtime/weights/SafetensorsWriter.h"

namespace moec::runtime::peft {
namespace {

using weights::DType;
using weights::JsonValue;

constexpr const char *kNamePrefix = kPeftNamePrefix;

/// PEFT's TaskType values.
const std::set<std::string> &taskTypes() {
  static const std::set<std::string> types = {"SEQ_CLS",   "SEQ_2_SEQ_LM", "CAUSAL_LM",
                                              "TOKEN_CLS", "QUESTION_ANS", "FEATURE_EXTRACTION"};
  return types;
}

std::string shapeText(const std::vector<int64_t> &shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    absl::StrAppend(&out, i ? ", " : "", shape[i]);
  return out + "]";
}

absl::Status systemError(const std::string &path, const std::string &what, int error) {
  std::string message = absl::StrCat(path, ": ", what, ": ", std::strerror(error));
  return error == ENOENT ? absl::NotFoundError(message) : absl::UnavailableError(message);
}

/// Replaces `path` with `bytes`: `path.tmp.<pid>`, fsync, rename.
absl::Status writeFileAtomically(const std::string &path, const std::string &bytes) {
  std::string temporary = absl::StrCat(path, ".tmp.", getpid());
  int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return systemError(temporary, "cannot create", errno);
  auto abandon = [&](const std::string &what) {
    int error = errno;
    if (fd >= 0)
      ::close(fd);
    ::unlink(temporary.c_str());
    return systemError(temporary, what, error);
  };
  const char *at = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    ssize_t written = ::write(fd, at, left);
    if (written < 0 && errno == EINTR)
      continue;
    if (written < 0)
      return abandon("cannot write");
    at += written;
    left -= size_t(written);
  }
  if (::fsync(fd) != 0)
    return abandon("cannot fsync");
  int closed = ::close(fd);
  fd = -1;
  if (closed != 0)
    return abandon("cannot close");
  if (::rename(temporary.c_str(), path.c_str()) != 0)
    return abandon(absl::StrCat("cannot rename to ", path));
  return absl::OkStatus();
}

absl::StatusOr<std::string> readWholeFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return systemError(path, "cannot open", errno);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad())
    return systemError(path, "cannot read", errno);
  return bytes;
}

// --- Python's json.dumps(indent=2, sort_keys=True) ---------------------------

/// Decodes one UTF-8 sequence at `text[pos]` (the text is valid UTF-8).
uint32_t decodeUtf8(std::string_view text, size_t &pos) {
  uint8_t lead = uint8_t(text[pos++]);
  if (lead < 0x80)
    return lead;
  int extra = lead >= 0xf0 ? 3 : lead >= 0xe0 ? 2 : 1;
  uint32_t code = lead & (0x3f >> extra);
  for (int i = 0; i < extra; ++i)
    code = code << 6 | (uint8_t(text[pos++]) & 0x3f);
  return code;
}

/// A JSON string as Python's json module writes it with ensure_ascii=True.
void appendPythonString(std::string &out, std::string_view text) {
  static const char hex[] = "0123456789abcdef";
  auto escape16 = [&](uint32_t unit) {
    out += "\\u";
    for (int shift = 12; shift >= 0; shift -= 4)
      out += hex[(unit >> shift) & 0xf];
  };
  out += '"';
  for (size_t pos = 0; pos < text.size();) {
    uint32_t code = decodeUtf8(text, pos);
    switch (code) {
    case '"':
      out += "\\\"";
      continue;
    case '\\':
      out += "\\\\";
      continue;
    case '\n':
      out += "\\n";
      continue;
    case '\r':
      out += "\\r";
      continue;
    case '\t':
      out += "\\t";
      continue;
    case '\b':
      out += "\\b";
      continue;
    case '\f':
      out += "\\f";
      continue;
    default:
      break;
    }
    if (code >= 0x20 && code <= 0x7e) {
      out += char(code);
    } else if (code > 0xffff) {
      code -= 0x10000;
      escape16(0xd800 | (code >> 10));
      escape16(0xdc00 | (code & 0x3ff));
    } else {
      escape16(code);
    }
  }
  out += '"';
}

void dumpPython(std::string &out, const JsonValue &value, int level) {
  const std::string inner(size_t(2 * (level + 1)), ' ');
  const std::string outer(size_t(2 * level), ' ');
  switch (value.kind) {
  case JsonValue::Kind::Null:
    out += "null";
    return;
  case JsonValue::Kind::Bool:
    out += value.boolean ? "true" : "false";
    return;
  case JsonValue::Kind::Integer:
    absl::StrAppend(&out, value.integer);
    return;
  case JsonValue::Kind::Number:
    out += pythonFloatRepr(value.number);
    return;
  case JsonValue::Kind::String:
    appendPythonString(out, value.string);
    return;
  case JsonValue::Kind::Array:
    if (value.array.empty()) {
      out += "[]";
      return;
    }
    out += "[\n";
    for (size_t i = 0; i < value.array.size(); ++i) {
      out += i ? ",\n" : "";
      out += inner;
      dumpPython(out, value.array[i], level + 1);
    }
    out += "\n" + outer + "]";
    return;
  case JsonValue::Kind::Object: {
    if (value.object.empty()) {
      out += "{}";
      return;
    }
    std::vector<const std::pair<std::string, JsonValue> *> members;
    for (const auto &member : value.object)
      members.push_back(&member);
    std::sort(members.begin(), members.end(),
              [](const auto *a, const auto *b) { return a->first < b->first; });
    out += "{\n";
    for (size_t i = 0; i < members.size(); ++i) {
      out += i ? ",\n" : "";
      out += inner;
      appendPythonString(out, members[i]->first);
      out += ": ";
      dumpPython(out, members[i]->second, level + 1);
    }
    out += "\n" + outer + "}";
    return;
  }
  }
}

JsonValue jsonNull() { return JsonValue(); }
JsonValue jsonBool(bool value) {
  JsonValue out;
  out.kind = JsonValue::Kind::Bool;
  out.boolean = value;
  return out;
}
JsonValue jsonInt(int64_t value) {
  JsonValue out;
  out.kind = JsonValue::Kind::Integer;
  out.integer = value;
  return out;
}
JsonValue jsonFloat(double value) {
  JsonValue out;
  out.kind = JsonValue::Kind::Number;
  out.number = value;
  return out;
}
JsonValue jsonString(std::string value) {
  JsonValue out;
  out.kind = JsonValue::Kind::String;
  out.string = std::move(value);
  return out;
}
JsonValue jsonStringOrNull(const std::string &value) {
  return value.empty() ? jsonNull() : jsonString(value);
}
JsonValue jsonArray() {
  JsonValue out;
  out.kind = JsonValue::Kind::Array;
  return out;
}
JsonValue jsonObject() {
  JsonValue out;
  out.kind = JsonValue::Kind::Object;
  return out;
}

// --- tensor names ------------------------------------------------------------

enum class LoraPart { A, B, Other };

bool endsWith(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

LoraPart loraPart(std::string_view name) {
  if (endsWith(name, ".lora_A.weight") || endsWith(name, ".lora_embedding_A"))
    return LoraPart::A;
  if (endsWith(name, ".lora_B.weight") || endsWith(name, ".lora_embedding_B"))
    return LoraPart::B;
  return LoraPart::Other;
}

/// lora_A is [r, in, ...] and lora_B is [out, r, ...] (PEFT's layouts for
/// linear, embedding and convolution layers alike).
absl::Status checkLoraShape(const std::string &name, const std::vector<int64_t> &shape, int64_t r) {
  LoraPart part = loraPart(name);
  if (part == LoraPart::Other)
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", name,
        "' is not a LoRA tensor (expected a name ending in .lora_A.weight, .lora_B.weight, "
        ".lora_embedding_A or .lora_embedding_B)"));
  size_t dim = part == LoraPart::A ? 0 : 1;
  if (shape.size() < 2 || shape[dim] != r)
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "' has shape ", shapeText(shape), "; expected ",
                     part == LoraPart::A ? "[r, in_features]" : "[out_features, r]",
                     " with r = ", r));
  return absl::OkStatus();
}

constexpr const char *kLoraSuffixes[] = {".lora_A.weight", ".lora_B.weight", ".lora_embedding_A",
                                         ".lora_embedding_B"};

/// base_model.model.<module>.lora_A.weight (a LoRA tensor; the prefix checked) -> <module>.
std::string loraModule(std::string_view name) {
  name.remove_prefix(std::strlen(kNamePrefix));
  for (const char *suffix : kLoraSuffixes)
    if (endsWith(name, suffix))
      return std::string(name.substr(0, name.size() - std::strlen(suffix)));
  return std::string(name);
}

/// base_model.model.<module>.weight (or .bias) -> <module>: a module trained in full, which
/// PEFT saves whole (modules_to_save).
absl::StatusOr<std::string> savedModule(const std::string &name) {
  if (name.rfind(kNamePrefix, 0) != 0)
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "': PEFT names start with \"", kNamePrefix, "\""));
  std::string_view path = std::string_view(name).substr(std::strlen(kNamePrefix));
  size_t dot = path.rfind('.');
  std::string_view leaf = dot == std::string_view::npos ? path : path.substr(dot + 1);
  if (dot == std::string_view::npos || dot == 0 || (leaf != "weight" && leaf != "bias"))
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", name,
        "' is neither a LoRA tensor (a name ending in .lora_A.weight, .lora_B.weight, .lora_embedding_A "
        "or .lora_embedding_B) nor a module's weight or bias (the modules trained in full this exporter "
        "writes as PEFT's modules_to_save)"));
  return std::string(path.substr(0, dot));
}

std::string expertName(const std::string &pattern, int64_t expert) {
  std::string out = pattern;
  size_t at = out.find(kExpertPlaceholder);
  out.replace(at, std::strlen(kExpertPlaceholder), std::to_string(expert));
  return out;
}

/// Whether `name` holds exactly one `{expert}`; an error if more than one.
absl::StatusOr<bool> hasExpertPlaceholder(const std::string &name) {
  size_t first = name.find(kExpertPlaceholder);
  if (first == std::string::npos)
    return false;
  if (name.find(kExpertPlaceholder, first + 1) != std::string::npos)
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "' has more than one {expert}"));
  return true;
}

int64_t numElements(const std::vector<int64_t> &shape) {
  int64_t count = 1;
  for (int64_t extent : shape)
    count *= extent;
  return count;
}

absl::Status checkSpec(const AdapterSpec &spec) {
  auto error = [](const std::string &what) {
    return absl::InvalidArgumentError(absl::StrCat("adapter spec: ", what));
  };
  if (spec.r <= 0)
    return error(absl::StrCat("r must be positive, got ", spec.r));
  if (!std::isfinite(spec.loraAlpha) || spec.loraAlpha <= 0)
    return error(absl::StrCat("lora_alpha must be positive and finite, got ", spec.loraAlpha));
  if (!std::isfinite(spec.loraDropout) || spec.loraDropout < 0 || spec.loraDropout >= 1)
    return error(absl::StrCat("lora_dropout must be in [0, 1), got ", spec.loraDropout));
  if (spec.targetModules.empty())
    return error("target_modules is empty");
  std::set<std::string> seen;
  for (const std::string &module : spec.targetModules)
    if (module.empty() || !seen.insert(module).second)
      return error(absl::StrCat("target_modules has an empty or repeated entry \"", module, "\""));
  if (!spec.taskType.empty() && !taskTypes().count(spec.taskType))
    return error(absl::StrCat("task_type \"", spec.taskType,
                              "\" is not a PEFT TaskType (CAUSAL_LM, SEQ_CLS, ...)"));
  if (spec.baseModelClass.empty() != spec.parentLibrary.empty())
    return error("base_model_class and parent_library (auto_mapping) go together");
  for (const std::string *text : {&spec.baseModelNameOrPath, &spec.taskType,
                                  &spec.baseModelClass, &spec.parentLibrary})
    if (!weights::isValidUtf8(*text))
      return error("a string field is not valid UTF-8");
  for (const std::string &module : spec.targetModules)
    if (!weights::isValidUtf8(module))
      return error("a target module is not valid UTF-8");
  std::set<std::string> saved;
  for (const std::string &module : spec.modulesToSave)
    if (module.empty() || !weights::isValidUtf8(module) || !saved.insert(module).second)
      return error(absl::StrCat("modules_to_save has an empty, repeated or non-UTF-8 entry \"", module, "\""));
  return absl::OkStatus();
}

/// Each tensor, a `{expert}` stack [E, ...] as its E per-expert tensors.
absl::StatusOr<std::vector<std::pair<std::string, std::vector<int64_t>>>>
expandExperts(const std::map<std::string, std::vector<int64_t>> &tensors) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto &[name, shape] : tensors) {
    absl::StatusOr<bool> stacked = hasExpertPlaceholder(name);
    if (!stacked.ok())
      return stacked.status();
    if (!*stacked) {
      out.emplace_back(name, shape);
      continue;
    }
    if (shape.size() < 2)
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", name, "': a stack of experts needs shape [E, ...], got ", shapeText(shape)));
    std::vector<int64_t> expertShape(shape.begin() + 1, shape.end());
    for (int64_t expert = 0; expert < shape[0]; ++expert)
      out.emplace_back(expertName(name, expert), expertShape);
  }
  return out;
}

/// A tensor of a PEFT adapter in a file: a LoRA tensor of rank r, or the weight or bias of a
/// module whose path ends with an entry of modules_to_save (PEFT matches by suffix).
absl::Status checkImportedName(const std::string &name, const std::vector<int64_t> &shape, const AdapterSpec &spec) {
  if (loraPart(name) != LoraPart::Other || spec.modulesToSave.empty())
    return checkLoraShape(name, shape, spec.r);
  absl::StatusOr<std::string> module = savedModule(name);
  if (!module.ok())
    return module.status();
  for (const std::string &entry : spec.modulesToSave)
    if (endsWith(*module, entry))
      return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' is not a LoRA tensor and its module '", *module,
                                                 "' is not in modules_to_save"));
}

} // namespace

std::string pythonFloatRepr(double value) {
  if (std::isnan(value))
    return "NaN";
  if (std::isinf(value))
    return value > 0 ? "Infinity" : "-Infinity";
  // The shortest digits that round-trip, in scientific form: "-1.2345e-05".
  char buffer[64];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, value,
                                 std::chars_format::scientific);
  std::string_view text(buffer, size_t(end - buffer));
  std::string out;
  if (!text.empty() && text[0] == '-') {
    out += '-';
    text.remove_prefix(1);
  }
  size_t e = text.find('e');
  std::string digits;
  for (char c : text.substr(0, e))
    if (c != '.')
      digits += c;
  int exponent = 0;
  std::string_view exponentText = text.substr(e + 1);
  if (!exponentText.empty() && exponentText[0] == '+')
    exponentText.remove_prefix(1);
  std::from_chars(exponentText.data(), exponentText.data() + exponentText.size(), exponent);

  // repr() uses fixed notation for 1e-4 <= |x| < 1e16, always with a '.'.
  if (exponent >= -4 && exponent < 16) {
    if (exponent >= 0) {
      std::string whole = digits.substr(0, std::min(digits.size(), size_t(exponent + 1)));
      whole.append(size_t(exponent + 1) - whole.size(), '0');
      std::string fraction =
          digits.size() > size_t(exponent + 1) ? digits.substr(size_t(exponent + 1)) : "0";
      return out + whole + "." + fraction;
    }
    return out + "0." + std::string(size_t(-exponent - 1), '0') + digits;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1)
    out += "." + digits.substr(1);
  out += exponent < 0 ? "e-" : "e+";
  int magnitude = std::abs(exponent);
  if (magnitude < 10)
    out += '0';
  absl::StrAppend(&out, magnitude);
  return out;
}

bool AdapterSpec::operator==(const AdapterSpec &other) const {
  return r == other.r && loraAlpha == other.loraAlpha && loraDropout == other.loraDropout &&
         targetModules == other.targetModules && useRslora == other.useRslora &&
         baseModelNameOrPath == other.baseModelNameOrPath && taskType == other.taskType &&
         baseModelClass == other.baseModelClass && parentLibrary == other.parentLibrary &&
         modulesToSave == other.modulesToSave;
}

absl::StatusOr<std::string> adapterConfigJson(const AdapterSpec &spec) {
  if (absl::Status status = checkSpec(spec); !status.ok())
    return status;
  JsonValue config = jsonObject();
  auto set = [&](const char *key, JsonValue value) {
    config.object.emplace_back(key, std::move(value));
  };
  // Every key PEFT 0.21's LoraConfig writes, at the value a plain LoRA has.
  set("alora_invocation_tokens", jsonNull());
  set("alpha_pattern", jsonObject());
  set("arrow_config", jsonNull());
  if (spec.taskType.empty() && !spec.baseModelClass.empty()) {
    JsonValue mapping = jsonObject();
    mapping.object.emplace_back("base_model_class", jsonString(spec.baseModelClass));
    mapping.object.emplace_back("parent_library", jsonString(spec.parentLibrary));
    set("auto_mapping", std::move(mapping));
  } else {
    set("auto_mapping", jsonNull());
  }
  set("base_model_name_or_path", jsonStringOrNull(spec.baseModelNameOrPath));
  set("bias", jsonString("none"));
  set("corda_config", jsonNull());
  set("ensure_weight_tying", jsonBool(false));
  set("eva_config", jsonNull());
  set("exclude_modules", jsonNull());
  set("fan_in_fan_out", jsonBool(false));
  set("inference_mode", jsonBool(true));
  set("init_lora_weights", jsonBool(true));
  set("kasa_config", jsonNull());
  set("layer_replication", jsonNull());
  set("layers_pattern", jsonNull());
  set("layers_to_transform", jsonNull());
  set("loftq_config", jsonObject());
  // PEFT declares lora_alpha an int; a whole alpha is written as one.
  if (spec.loraAlpha == std::floor(spec.loraAlpha) && std::fabs(spec.loraAlpha) < 9.0e15)
    set("lora_alpha", jsonInt(int64_t(spec.loraAlpha)));
  else
    set("lora_alpha", jsonFloat(spec.loraAlpha));
  set("lora_bias", jsonBool(false));
  set("lora_dropout", jsonFloat(spec.loraDropout));
  set("lora_ga_config", jsonNull());
  set("megatron_config", jsonNull());
  set("megatron_core", jsonString("megatron.core"));
  if (spec.modulesToSave.empty()) {
    set("modules_to_save", jsonNull());
  } else {
    JsonValue modules = jsonArray();
    for (const std::string &module : spec.modulesToSave)
      modules.array.push_back(jsonString(module));
    set("modules_to_save", std::move(modules));
  }
  set("monteclora_config", jsonNull());
  set("peft_type", jsonString("LORA"));
  set("peft_version", jsonString(kPeftFormatVersion));
  set("qalora_group_size", jsonInt(16));
  set("r", jsonInt(spec.r));
  set("rank_pattern", jsonObject());
  set("revision", jsonNull());
  JsonValue targets = jsonArray();
  for (const std::string &module : spec.targetModules)
    targets.array.push_back(jsonString(module));
  set("target_modules", std::move(targets));
  set("target_parameters", jsonArray());
  set("task_type", jsonStringOrNull(spec.taskType));
  set("trainable_token_indices", jsonNull());
  set("use_bdlora", jsonNull());
  set("use_dora", jsonBool(false));
  set("use_qalora", jsonBool(false));
  set("use_rslora", jsonBool(spec.useRslora));
  set("velora_config", jsonNull());
  std::string out;
  dumpPython(out, config, 0);
  return out;
}

absl::StatusOr<AdapterSpec> parseAdapterConfig(std::string_view text, const std::string &path) {
  auto error = [&](const std::string &what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
  };
  absl::StatusOr<JsonValue> parsed = weights::parseJson(text);
  if (!parsed.ok())
    return error(absl::StrCat("malformed JSON, ", parsed.status().message()));
  const JsonValue &config = *parsed;
  if (config.kind != JsonValue::Kind::Object)
    return error("expected a JSON object");
  auto kind = [](const JsonValue &value) { return std::string(weights::jsonKindName(value.kind)); };
  auto isNull = [](const JsonValue *value) {
    return !value || value->kind == JsonValue::Kind::Null;
  };
  auto isEmpty = [&](const JsonValue *value) {
    return isNull(value) || (value->kind == JsonValue::Kind::Object && value->object.empty()) ||
           (value->kind == JsonValue::Kind::Array && value->array.empty());
  };
  auto isTrue = [](const JsonValue *value) {
    return value && value->kind == JsonValue::Kind::Bool && value->boolean;
  };
  auto number = [](const JsonValue &value, double &out) {
    if (value.kind == JsonValue::Kind::Integer)
      out = double(value.integer);
    else if (value.kind == JsonValue::Kind::Number)
      out = value.number;
    else
      return false;
    return true;
  };
  auto optionalString = [&](const char *key, std::string &out) -> absl::Status {
    const JsonValue *value = config.find(key);
    if (isNull(value))
      return absl::OkStatus();
    if (value->kind != JsonValue::Kind::String)
      return error(absl::StrCat("\"", key, "\" is ", kind(*value), ", expected a string or null"));
    out = value->string;
    return absl::OkStatus();
  };
  auto optionalBool = [&](const char *key, bool &out) -> absl::Status {
    const JsonValue *value = config.find(key);
    if (isNull(value))
      return absl::OkStatus();
    if (value->kind != JsonValue::Kind::Bool)
      return error(absl::StrCat("\"", key, "\" is ", kind(*value), ", expected true or false"));
    out = value->boolean;
    return absl::OkStatus();
  };

  AdapterSpec spec;
  const JsonValue *peftType = config.find("peft_type");
  if (!peftType)
    return error("missing \"peft_type\" (expected \"LORA\")");
  if (peftType->kind != JsonValue::Kind::String || peftType->string != "LORA")
    return error(absl::StrCat("peft_type is ",
                              peftType->kind == JsonValue::Kind::String
                                  ? absl::StrCat("\"", peftType->string, "\"")
                                  : kind(*peftType),
                              "; only LORA adapters are supported"));

  const JsonValue *r = config.find("r");
  if (!r)
    return error("missing \"r\" (the LoRA rank)");
  if (r->kind != JsonValue::Kind::Integer || r->integer <= 0)
    return error(absl::StrCat("\"r\" is ", r->kind == JsonValue::Kind::Integer
                                               ? std::to_string(r->integer)
                                               : kind(*r),
                              ", expected a positive integer"));
  spec.r = r->integer;

  const JsonValue *alpha = config.find("lora_alpha");
  if (!alpha)
    return error("missing \"lora_alpha\"");
  if (!number(*alpha, spec.loraAlpha) || !(spec.loraAlpha > 0))
    return error(absl::StrCat("\"lora_alpha\" is ", kind(*alpha), ", expected a positive number"));

  if (const JsonValue *dropout = config.find("lora_dropout"); !isNull(dropout))
    if (!number(*dropout, spec.loraDropout) || spec.loraDropout < 0 || spec.loraDropout >= 1)
      return error(absl::StrCat("\"lora_dropout\" is ", kind(*dropout),
                                ", expected a number in [0, 1)"));

  const JsonValue *targets = config.find("target_modules");
  if (isNull(targets))
    return error("missing \"target_modules\" (expected a list of module names)");
  if (targets->kind == JsonValue::Kind::String)
    return error(absl::StrCat("\"target_modules\" is the string \"", targets->string,
                              "\" (a regular expression or \"all-linear\"); only a list of "
                              "module names is supported"));
  if (targets->kind != JsonValue::Kind::Array || targets->array.empty())
    return error(absl::StrCat("\"target_modules\" is ", kind(*targets),
                              ", expected a non-empty list of module names"));
  for (const JsonValue &module : targets->array) {
    if (module.kind != JsonValue::Kind::String)
      return error(absl::StrCat("\"target_modules\" holds ", kind(module),
                                ", expected module names"));
    spec.targetModules.push_back(module.string);
  }

  for (absl::Status status :
       {optionalBool("use_rslora", spec.useRslora),
        optionalString("base_model_name_or_path", spec.baseModelNameOrPath),
        optionalString("task_type", spec.taskType)})
    if (!status.ok())
      return status;
  if (!spec.taskType.empty() && !taskTypes().count(spec.taskType))
    return error(absl::StrCat("task_type \"", spec.taskType, "\" is not a PEFT TaskType"));

  if (const JsonValue *mapping = config.find("auto_mapping"); !isNull(mapping)) {
    const JsonValue *cls = mapping->find("base_model_class");
    const JsonValue *library = mapping->find("parent_library");
    if (mapping->kind != JsonValue::Kind::Object || !cls || !library ||
        cls->kind != JsonValue::Kind::String || library->kind != JsonValue::Kind::String)
      return error("\"auto_mapping\" must be null or {\"base_model_class\": string, "
                   "\"parent_library\": string}");
    spec.baseModelClass = cls->string;
    spec.parentLibrary = library->string;
  }

  // What this runtime cannot apply: refuse rather than load a different model.
  if (isTrue(config.find("use_dora")))
    return error("use_dora is true; DoRA adapters are not supported");
  if (!isEmpty(config.find("rank_pattern")))
    return error("rank_pattern is not empty; per-module ranks are not supported");
  if (!isEmpty(config.find("alpha_pattern")))
    return error("alpha_pattern is not empty; per-module alphas are not supported");
  if (const JsonValue *bias = config.find("bias");
      !isNull(bias) && !(bias->kind == JsonValue::Kind::String && bias->string == "none"))
    return error("bias is not \"none\"; trained biases are not supported");
  if (isTrue(config.find("fan_in_fan_out")))
    return error("fan_in_fan_out is true; only [out, in] weights (nn.Linear) are supported");
  if (const JsonValue *modules = config.find("modules_to_save"); !isNull(modules)) {
    if (modules->kind != JsonValue::Kind::Array)
      return error(absl::StrCat("\"modules_to_save\" is ", kind(*modules), ", expected a list of module names or null"));
    for (const JsonValue &module : modules->array) {
      if (module.kind != JsonValue::Kind::String || module.string.empty())
        return error("\"modules_to_save\" holds something other than a module name");
      spec.modulesToSave.push_back(module.string);
    }
  }
  if (!isEmpty(config.find("target_parameters")))
    return error("target_parameters is not empty; LoRA on raw parameters is not supported");
  if (!isEmpty(config.find("trainable_token_indices")))
    return error("trainable_token_indices is set; trainable tokens are not supported");
  if (!isEmpty(config.find("layer_replication")))
    return error("layer_replication is set; it is not supported");
  if (!isEmpty(config.find("alora_invocation_tokens")))
    return error("alora_invocation_tokens is set; activated LoRA is not supported");
  if (isTrue(config.find("use_qalora")))
    return error("use_qalora is true; QA-LoRA is not supported");
  if (isTrue(config.find("lora_bias")))
    return error("lora_bias is true; LoRA biases are not supported");
  return spec;
}

bool isLoraTensorName(std::string_view name) { return loraPart(name) != LoraPart::Other; }

absl::StatusOr<std::vector<std::string>>
modulesToSaveOf(const std::map<std::string, std::vector<int64_t>> &tensors) {
  std::set<std::string> modules;
  for (const auto &[name, shape] : tensors) {
    if (loraPart(name) != LoraPart::Other)
      continue;
    if (name.find(kExpertPlaceholder) != std::string::npos)
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", name,
          "' is a per-expert checkpoint weight trained in full: transformers holds a layer's experts as "
          "one fused parameter, so PEFT has no per-expert module to save (it would drop these silently); "
          "train the experts with expert LoRA instead"));
    absl::StatusOr<std::string> module = savedModule(name);
    if (!module.ok())
      return module.status();
    modules.insert(*module);
  }
  return std::vector<std::string>(modules.begin(), modules.end());
}

absl::Status checkAdapterTensors(const AdapterSpec &spec, const std::map<std::string, std::vector<int64_t>> &tensors,
                                 const std::vector<std::string> &frozen) {
  if (absl::Status status = checkSpec(spec); !status.ok())
    return status;
  if (tensors.empty())
    return absl::InvalidArgumentError("no tensors to export");
  absl::StatusOr<std::vector<std::pair<std::string, std::vector<int64_t>>>> each = expandExperts(tensors);
  if (!each.ok())
    return each.status();
  std::set<std::string> saved(spec.modulesToSave.begin(), spec.modulesToSave.end()), held, adapted;
  for (const auto &[name, shape] : *each) {
    if (name.rfind(kNamePrefix, 0) != 0)
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", name, "': PEFT names start with \"", kNamePrefix, "\""));
    if (loraPart(name) != LoraPart::Other) {
      if (absl::Status status = checkLoraShape(name, shape, spec.r); !status.ok())
        return status;
      adapted.insert(loraModule(name));
      continue;
    }
    absl::StatusOr<std::string> module = savedModule(name);
    if (!module.ok())
      return module.status();
    if (!saved.count(*module))
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' is trained in full, but its module '",
                                                     *module, "' is not in modules_to_save"));
    held.insert(*module);
  }
  // PEFT wraps a module to save whole: it cannot also hold a LoRA adapter, nor sit inside one.
  auto within = [](const std::string &inner, const std::string &outer) {
    return inner == outer || (inner.size() > outer.size() && inner.compare(0, outer.size(), outer) == 0 &&
                              inner[outer.size()] == '.');
  };
  // PEFT also loads a module to save whole: a tensor of it left frozen would be missing.
  for (const std::string &name : frozen) {
    if (name.rfind(kNamePrefix, 0) != 0)
      continue;
    std::string path = name.substr(std::strlen(kNamePrefix));
    size_t dot = path.rfind('.');
    if (dot != std::string::npos && saved.count(path.substr(0, dot)))
      return absl::InvalidArgumentError(absl::StrCat("module '", path.substr(0, dot), "' is trained in full but its '",
                                                     path.substr(dot + 1), "' is frozen; PEFT saves and loads a module "
                                                     "to save whole: mark ", path, " trainable too, or neither"));
  }
  for (const std::string &module : spec.modulesToSave) {
    if (!held.count(module))
      return absl::InvalidArgumentError(absl::StrCat("modules_to_save names '", module, "', but no tensor of it"));
    for (const std::string &lora : adapted)
      if (within(lora, module) || within(module, lora))
        return absl::InvalidArgumentError(absl::StrCat("module '", module, "' is trained in full and '", lora,
                                                       "' has a LoRA adapter; PEFT cannot save both"));
  }
  return absl::OkStatus();
}

absl::Status exportAdapter(const std::string &dir, const AdapterSpec &spec,
                           const std::vector<NamedTensor> &tensors) {
  auto error = [&](const absl::Status &status) {
    return absl::Status(status.code(), absl::StrCat(dir, ": ", status.message()));
  };
  absl::StatusOr<std::string> config = adapterConfigJson(spec);
  if (!config.ok())
    return error(config.status());
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const NamedTensor &tensor : tensors)
    if (!shapes.emplace(tensor.name, tensor.shape).second)
      return error(absl::InvalidArgumentError(absl::StrCat("tensor '", tensor.name, "' is given twice")));
  if (absl::Status status = checkAdapterTensors(spec, shapes); !status.ok())
    return error(status);

  weights::SafetensorsWriter writer;
  if (absl::Status status = writer.setMetadata("format", "pt"); !status.ok())
    return error(status);
  for (const NamedTensor &tensor : tensors) {
    auto tensorError = [&](const std::string &what) {
      return error(absl::InvalidArgumentError(absl::StrCat("tensor '", tensor.name, "': ", what)));
    };
    for (int64_t extent : tensor.shape)
      if (extent <= 0)
        return tensorError(absl::StrCat("shape ", shapeText(tensor.shape), " has an empty or negative extent"));
    if (numElements(tensor.shape) != int64_t(tensor.data.size()))
      return tensorError(absl::StrCat("shape ", shapeText(tensor.shape), " needs ",
                                      numElements(tensor.shape), " values, got ",
                                      tensor.data.size()));
    if (tensor.name.find(kExpertPlaceholder) == std::string::npos) {
      if (absl::Status status = writer.add(tensor.name, DType::F32, tensor.shape, tensor.data.data(),
                                           tensor.data.size() * sizeof(float));
          !status.ok())
        return error(status);
      continue;
    }
    std::vector<int64_t> expertShape(tensor.shape.begin() + 1, tensor.shape.end());
    size_t expertValues = size_t(numElements(expertShape));
    for (int64_t expert = 0; expert < tensor.shape[0]; ++expert) {
      std::string name = expertName(tensor.name, expert);
      if (absl::Status status =
              writer.add(name, DType::F32, expertShape, tensor.data.data() + expert * expertValues,
                         expertValues * sizeof(float));
          !status.ok())
        return error(status);
    }
  }

  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return absl::UnavailableError(absl::StrCat(dir, ": cannot create the directory: ", ec.message()));
  // Weights first: a config names a complete adapter only once its weights are in place.
  if (absl::Status status = writer.write(dir + "/" + kAdapterWeightsFile); !status.ok())
    return status;
  return writeFileAtomically(dir + "/" + kAdapterConfigFile, *config);
}

absl::StatusOr<Adapter> importAdapter(const std::string &dir, const ImportOptions &options) {
  const std::string configPath = dir + "/" + kAdapterConfigFile;
  const std::string weightsPath = dir + "/" + kAdapterWeightsFile;
  absl::StatusOr<std::string> text = readWholeFile(configPath);
  if (!text.ok())
    return text.status();
  Adapter adapter;
  absl::StatusOr<AdapterSpec> spec = parseAdapterConfig(*text, configPath);
  if (!spec.ok())
    return spec.status();
  adapter.spec = std::move(*spec);

  if (!std::filesystem::exists(weightsPath))
    return absl::NotFoundError(absl::StrCat(weightsPath, ": no such file (the adapter's weights)"));
  absl::StatusOr<std::unique_ptr<weights::SafetensorsFile>> file =
      weights::SafetensorsFile::open(weightsPath);
  if (!file.ok())
    return file.status();
  auto error = [&](const std::string &what) {
    return absl::InvalidArgumentError(absl::StrCat(weightsPath, ": ", what));
  };
  if ((*file)->tensors().empty())
    return error("no tensors");
  for (const weights::TensorInfo &info : (*file)->tensors()) {
    if (info.dtype != DType::F32 && info.dtype != DType::BF16 && info.dtype != DType::F16)
      return error(absl::StrCat("tensor '", info.name, "' has dtype ",
                                std::string(weights::dtypeName(info.dtype)),
                                "; expected F32, BF16 or F16"));
    if (absl::Status status = checkImportedName(info.name, info.shape, adapter.spec); !status.ok())
      return error(std::string(status.message()));
    AdapterTensor tensor;
    tensor.shape = info.shape;
    tensor.fileDType = info.dtype;
    tensor.data.resize(size_t(info.numElements()));
    absl::Span<const uint8_t> bytes = (*file)->data(info);
    if (absl::Status status = weights::convertElements(bytes.data(), info.dtype, tensor.data.data(),
                                                       DType::F32, tensor.data.size());
        !status.ok())
      return error(std::string(status.message()));
    adapter.tensors.emplace(info.name, std::move(tensor));
  }

  if (options.expectedShapes.empty())
    return adapter;
  std::set<std::string> expected;
  for (const auto &[name, shape] : options.optionalShapes) {
    auto found = adapter.tensors.find(name);
    if (found == adapter.tensors.end())
      continue;
    if (found->second.shape != shape)
      return error(absl::StrCat("shape mismatch: tensor '", name, "' has shape ", shapeText(found->second.shape),
                                ", expected ", shapeText(shape)));
    expected.insert(name);
  }
  for (const auto &[name, shape] : options.expectedShapes) {
    absl::StatusOr<bool> stacked = hasExpertPlaceholder(name);
    if (!stacked.ok())
      return stacked.status();
    std::vector<std::pair<std::string, std::vector<int64_t>>> wanted;
    if (*stacked) {
      if (shape.empty())
        return absl::InvalidArgumentError(
            absl::StrCat("expected tensor '", name, "' has {expert} but no [E, ...] shape"));
      std::vector<int64_t> expertShape(shape.begin() + 1, shape.end());
      for (int64_t expert = 0; expert < shape[0]; ++expert)
        wanted.emplace_back(expertName(name, expert), expertShape);
    } else {
      wanted.emplace_back(name, shape);
    }
    for (const auto &[one, oneShape] : wanted) {
      auto found = adapter.tensors.find(one);
      if (found == adapter.tensors.end())
        return error(absl::StrCat("missing tensor '", one, "' (expected shape ",
                                  shapeText(oneShape), ")"));
      if (found->second.shape != oneShape)
        return error(absl::StrCat("shape mismatch: tensor '", one, "' has shape ",
                                  shapeText(found->second.shape), ", expected ",
                                  shapeText(oneShape)));
      expected.insert(one);
    }
  }
  for (const auto &[name, tensor] : adapter.tensors)
    if (!expected.count(name))
      return error(absl::StrCat("unexpected tensor '", name, "' of shape ", shapeText(tensor.shape),
                                " (the plan trains no such tensor)"));
  return adapter;
}

absl::StatusOr<AdapterTensor> Adapter::readStacked(const std::string &pattern,
                                                   int64_t numExperts) const {
  absl::StatusOr<bool> stacked = hasExpertPlaceholder(pattern);
  if (!stacked.ok())
    return stacked.status();
  if (!*stacked || numExperts <= 0)
    return absl::InvalidArgumentError(absl::StrCat(
        "readStacked('", pattern, "', ", numExperts,
        "): expected a name with {expert} and a positive number of experts"));
  AdapterTensor out;
  for (int64_t expert = 0; expert < numExperts; ++expert) {
    std::string name = expertName(pattern, expert);
    auto found = tensors.find(name);
    if (found == tensors.end())
      return absl::NotFoundError(absl::StrCat("adapter has no tensor '", name, "' (expert ", expert,
                                              " of ", numExperts, ")"));
    if (expert == 0) {
      out.shape.push_back(numExperts);
      out.shape.insert(out.shape.end(), found->second.shape.begin(), found->second.shape.end());
      out.fileDType = found->second.fileDType;
      out.data.reserve(found->second.data.size() * size_t(numExperts));
    } else if (!std::equal(out.shape.begin() + 1, out.shape.end(), found->second.shape.begin(),
                           found->second.shape.end())) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", name, "' has shape ", shapeText(found->second.shape),
                       ", unlike expert 0's ",
                       shapeText(std::vector<int64_t>(out.shape.begin() + 1, out.shape.end()))));
    }
    out.data.insert(out.data.end(), found->second.data.begin(), found->second.data.end());
  }
  return out;
}

} // namespace moec::runtime::peft
