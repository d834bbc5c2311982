//===- RandomModel.cpp - random checkpoints for a plan -------------------===//

#include "runtime/init/RandomModel.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "runtime/weights/Json.h"
#include "runtime/weights/SafetensorsWriter.h"

namespace moec::runtime::init {
namespace {

using weights::JsonValue;

absl::Status systemError(const std::string &path, const std::string &what, int error) {
  std::string message = absl::StrCat(path, ": ", what, ": ", std::strerror(error));
  return error == ENOENT ? absl::NotFoundError(message) : absl::UnavailableError(message);
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

/// A file written to `path.tmp.<pid>` and renamed over `path` once complete.
class AtomicFile {
public:
  explicit AtomicFile(std::string path)
      : path(std::move(path)), temporary(absl::StrCat(this->path, ".tmp.", getpid())) {}
  ~AtomicFile() {
    if (fd >= 0)
      ::close(fd);
    if (!committed)
      ::unlink(temporary.c_str());
  }

  absl::Status open() {
    fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    return fd < 0 ? systemError(temporary, "cannot create", errno) : absl::OkStatus();
  }

  absl::Status write(const void *data, size_t bytes) {
    auto *at = static_cast<const char *>(data);
    while (bytes > 0) {
      ssize_t written = ::write(fd, at, bytes);
      if (written < 0 && errno == EINTR)
        continue;
      if (written < 0)
        return systemError(temporary, "cannot write", errno);
      at += written;
      bytes -= size_t(written);
    }
    return absl::OkStatus();
  }

  absl::Status commit() {
    if (::fsync(fd) != 0)
      return systemError(temporary, "cannot fsync", errno);
    int closed = ::close(fd);
    fd = -1;
    if (closed != 0)
      return systemError(temporary, "cannot close", errno);
    if (::rename(temporary.c_str(), path.c_str()) != 0)
      return systemError(temporary, absl::StrCat("cannot rename to ", path), errno);
    committed = true;
    return absl::OkStatus();
  }

private:
  std::string path;
  std::string temporary;
  int fd = -1;
  bool committed = false;
};

// --- random numbers ------------------------------------------------------------

uint64_t splitMix64(uint64_t &state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t fnv1a64(std::string_view text) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (char c : text) {
    hash ^= uint8_t(c);
    hash *= 0x100000001b3ull;
  }
  return hash;
}

/// The stream of one tensor: SplitMix64 from splitmix(seed) ^ fnv1a64(name).
class TensorRng {
public:
  TensorRng(uint64_t seed, std::string_view name) {
    uint64_t mixed = seed;
    state = splitMix64(mixed) ^ fnv1a64(name);
  }
  /// Uniform in [0, 1), 53 bits.
  double uniform() { return double(splitMix64(state) >> 11) * 0x1p-53; }
  /// Standard normal, Box-Muller; the pair's second value is kept for the next call.
  double normal() {
    if (hasSpare) {
      hasSpare = false;
      return spare;
    }
    double u1 = double((splitMix64(state) >> 11) + 1) * 0x1p-53; // (0, 1]
    double u2 = uniform();
    double radius = std::sqrt(-2.0 * std::log(u1));
    double angle = 6.283185307179586 * u2; // 2 pi
    spare = radius * std::sin(angle);
    hasSpare = true;
    return radius * std::cos(angle);
  }

private:
  uint64_t state = 0;
  double spare = 0;
  bool hasSpare = false;
};

std::string lower(std::string_view text) {
  std::string out(text);
  for (char &c : out)
    c = char(std::tolower(uint8_t(c)));
  return out;
}

std::string shapeText(const std::vector<int64_t> &shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    absl::StrAppend(&out, i ? ", " : "", shape[i]);
  return out + "]";
}

/// A number or integer member of `object`, if present.
absl::StatusOr<std::optional<double>> numberField(const JsonValue &object, const char *key,
                                                  const std::string &path) {
  const JsonValue *value = object.find(key);
  if (!value || value->kind == JsonValue::Kind::Null)
    return std::optional<double>();
  if (value->kind == JsonValue::Kind::Integer)
    return std::optional<double>(double(value->integer));
  if (value->kind == JsonValue::Kind::Number)
    return std::optional<double>(value->number);
  return absl::InvalidArgumentError(absl::StrCat(path, ": \"", key, "\" is ",
                                                 std::string(weights::jsonKindName(value->kind)),
                                                 ", expected a number"));
}

} // namespace

InitKind initKindFor(std::string_view tensorName, std::string_view modelType) {
  size_t lastDot = tensorName.rfind('.');
  std::string_view parameter =
      lastDot == std::string_view::npos ? tensorName : tensorName.substr(lastDot + 1);
  std::string_view module;
  if (lastDot != std::string_view::npos) {
    std::string_view path = tensorName.substr(0, lastDot);
    size_t moduleDot = path.rfind('.');
    module = moduleDot == std::string_view::npos ? path : path.substr(moduleDot + 1);
  }
  if (parameter == "A_log")
    return InitKind::ALog;
  if (parameter == "dt_bias")
    return InitKind::DtBias;
  if (parameter == "D")
    return InitKind::Ones;
  if (parameter == "bias" || parameter == "sinks" ||
      (parameter.size() > 5 && parameter.substr(parameter.size() - 5) == "_bias"))
    return InitKind::Zeros; // includes e_score_correction_bias
  if (parameter == "weight" && lower(module).find("norm") != std::string::npos) {
    // Qwen3-Next's RMSNorms compute x̂ * (1 + w) and start at w = 0; its gated
    // norm inside the linear attention computes x̂ * w and starts at 1.
    if (modelType == "qwen3_next") {
      constexpr std::string_view kGated = "linear_attn.norm.weight";
      bool gated = tensorName.size() >= kGated.size() &&
                   tensorName.substr(tensorName.size() - kGated.size()) == kGated;
      return gated ? InitKind::Ones : InitKind::Zeros;
    }
    return InitKind::Ones;
  }
  return InitKind::Normal;
}

absl::StatusOr<InitConfig> readInitConfig(const std::string &configJsonPath,
                                          const std::string &planModelType) {
  absl::StatusOr<std::string> text = readWholeFile(configJsonPath);
  if (!text.ok())
    return text.status();
  absl::StatusOr<JsonValue> config = weights::parseJson(*text);
  if (!config.ok())
    return absl::InvalidArgumentError(
        absl::StrCat(configJsonPath, ": malformed JSON, ", config.status().message()));
  if (config->kind != JsonValue::Kind::Object)
    return absl::InvalidArgumentError(absl::StrCat(configJsonPath, ": expected a JSON object"));
  InitConfig out;
  out.modelType = planModelType;
  if (const JsonValue *type = config->find("model_type"); type) {
    if (type->kind != JsonValue::Kind::String)
      return absl::InvalidArgumentError(
          absl::StrCat(configJsonPath, ": \"model_type\" is not a string"));
    out.modelType = type->string;
  }
  // Multimodal re-saves keep the language model's fields under text_config.
  const JsonValue *textConfig = config->find("text_config");
  absl::StatusOr<std::optional<double>> range =
      numberField(*config, "initializer_range", configJsonPath);
  if (!range.ok())
    return range.status();
  if (!range->has_value() && textConfig && textConfig->kind == JsonValue::Kind::Object) {
    range = numberField(*textConfig, "initializer_range", configJsonPath);
    if (!range.ok())
      return range.status();
  }
  if (range->has_value()) {
    if (!std::isfinite(**range) || **range < 0)
      return absl::InvalidArgumentError(absl::StrCat(
          configJsonPath, ": \"initializer_range\" is ", **range, ", expected a number >= 0"));
    out.initializerRange = **range;
  }
  if (const JsonValue *pad = config->find("pad_token_id");
      pad && pad->kind == JsonValue::Kind::Integer && pad->integer >= 0)
    out.padTokenId = pad->integer;
  return out;
}

absl::StatusOr<std::map<std::string, std::vector<int64_t>>>
checkpointTensors(const plan::Plan &plan) {
  if (plan.ranks_size() == 0)
    return absl::InvalidArgumentError("plan: no ranks");
  struct Seen {
    std::vector<int64_t> shape; // of one tensor (one expert's, for {expert})
    int64_t experts = 0;        // 0: not an expert stack
    std::string firstPlace;
  };
  std::map<std::string, Seen> seen;
  for (const plan::Rank &rank : plan.ranks()) {
    for (int i = 0; i < rank.weights_size(); ++i) {
      const plan::WeightBinding &binding = rank.weights(i);
      std::string place = absl::StrCat("rank ", rank.rank(), ", weights[", i, "] \"",
                                       binding.tensor(), "\"");
      auto error = [&](const std::string &what) {
        return absl::InvalidArgumentError(absl::StrCat("plan: ", place, ": ", what));
      };
      if (binding.buffer() >= uint32_t(rank.buffers_size()))
        return error(absl::StrCat("buffer ", binding.buffer(), " does not exist"));
      // Every binding is a checkpoint tensor: a frozen weight, or one trained in full.
      const plan::Buffer &buffer = rank.buffers(int(binding.buffer()));
      const std::string &name = binding.tensor();
      if (name.empty())
        return error("empty tensor name");
      size_t expert = name.find("{expert}");
      bool stacked = expert != std::string::npos;
      std::string rest = stacked ? name.substr(0, expert) + name.substr(expert + 8) : name;
      if (rest.find('{') != std::string::npos)
        return error("a placeholder other than one {expert} is left in the name");
      std::vector<int64_t> shape(buffer.shape().begin(), buffer.shape().end());
      for (int64_t extent : shape)
        if (extent <= 0)
          return error(absl::StrCat("buffer shape ", shapeText(shape), " has an extent <= 0"));
      int64_t experts = 0;
      if (stacked) {
        if (shape.empty())
          return error("an {expert} binding needs a buffer of shape [experts, ...]");
        if (binding.first_expert() < 0)
          return error("first_expert < 0");
        experts = binding.first_expert() + shape[0];
        shape.erase(shape.begin());
      }
      const plan::Slice &slice = binding.slice();
      if (binding.pieces_size() > 0) { // windows of the whole tensor (the validator checked them)
        shape.assign(binding.whole_shape().begin(), binding.whole_shape().end());
      } else if (slice.dims_size() != 0) {
        if (size_t(slice.dims_size()) != shape.size())
          return error(absl::StrCat("slice has ", slice.dims_size(), " ranges for a tensor of ",
                                    shape.size(), " dimensions"));
        for (size_t d = 0; d < shape.size(); ++d) {
          const plan::Slice::Range &range = slice.dims(int(d));
          if (range.start() < 0 || range.size() != shape[d])
            return error(absl::StrCat("slice range ", d, " (", range.start(), "+", range.size(),
                                      ") does not match the buffer's extent ", shape[d]));
          shape[d] = range.start() + range.size();
        }
      }
      auto [it, inserted] = seen.try_emplace(name, Seen{shape, experts, place});
      if (inserted)
        continue;
      Seen &known = it->second;
      if (known.shape.size() != shape.size())
        return error(absl::StrCat("binds a tensor of ", shape.size(),
                                  " dimensions, but ", known.firstPlace, " binds one of ",
                                  known.shape.size()));
      for (size_t d = 0; d < shape.size(); ++d)
        known.shape[d] = std::max(known.shape[d], shape[d]);
      known.experts = std::max(known.experts, experts);
    }
  }
  std::map<std::string, std::vector<int64_t>> out;
  for (const auto &[name, info] : seen) {
    if (info.experts == 0) {
      out.emplace(name, info.shape);
      continue;
    }
    size_t at = name.find("{expert}");
    for (int64_t e = 0; e < info.experts; ++e) {
      std::string one = name.substr(0, at) + std::to_string(e) + name.substr(at + 8);
      auto [it, inserted] = out.emplace(one, info.shape);
      if (!inserted && it->second != info.shape)
        return absl::InvalidArgumentError(absl::StrCat(
            "plan: tensor \"", one, "\" is bound as ", shapeText(it->second), " and, through ",
            info.firstPlace, ", as ", shapeText(info.shape)));
    }
  }
  if (out.empty())
    return absl::InvalidArgumentError("plan: no WEIGHT buffer is bound to a checkpoint tensor");
  return out;
}

void fillTensor(std::string_view name, absl::Span<const int64_t> shape, const InitConfig &config,
                uint64_t seed, float *out) {
  size_t count = 1;
  for (int64_t extent : shape)
    count *= size_t(extent);
  TensorRng rng(seed, name);
  switch (initKindFor(name, config.modelType)) {
  case InitKind::Zeros:
    std::fill(out, out + count, 0.0f);
    return;
  case InitKind::Ones:
    std::fill(out, out + count, 1.0f);
    return;
  case InitKind::ALog:
    for (size_t i = 0; i < count; ++i)
      out[i] = float(std::log(1.0 + 15.0 * rng.uniform()));
    return;
  case InitKind::DtBias: {
    const double low = std::log(1e-3), high = std::log(1e-1);
    for (size_t i = 0; i < count; ++i) {
      double dt = std::exp(low + (high - low) * rng.uniform());
      out[i] = float(dt + std::log(-std::expm1(-dt))); // softplus(x) = dt
    }
    return;
  }
  case InitKind::Normal:
    for (size_t i = 0; i < count; ++i)
      out[i] = float(config.initializerRange * rng.normal());
    break;
  }
  // nn.Embedding(padding_idx=pad_token_id) starts that row at zero.
  constexpr std::string_view kEmbedding = "embed_tokens.weight";
  if (config.padTokenId && shape.size() == 2 && *config.padTokenId < shape[0] &&
      name.size() >= kEmbedding.size() &&
      name.substr(name.size() - kEmbedding.size()) == kEmbedding)
    std::fill(out + *config.padTokenId * shape[1], out + (*config.padTokenId + 1) * shape[1], 0.0f);
}

absl::Status writeRandomModel(const plan::Plan &plan, const std::string &configJsonPath,
                              uint64_t seed, const std::string &outDir) {
  absl::StatusOr<std::map<std::string, std::vector<int64_t>>> tensors = checkpointTensors(plan);
  if (!tensors.ok())
    return tensors.status();
  absl::StatusOr<std::string> configBytes = readWholeFile(configJsonPath);
  if (!configBytes.ok())
    return configBytes.status();
  absl::StatusOr<InitConfig> config = readInitConfig(configJsonPath, plan.model_type());
  if (!config.ok())
    return config.status();

  // The header comes from SafetensorsWriter, so the layout is exactly the
  // one it writes: all tensors are F32, so they are in name order, which is
  // the order of `tensors`. It never reads the data pointer: only header()
  // is used, and the data is streamed below one tensor at a time.
  static const float kNotRead = 0;
  weights::SafetensorsWriter layout;
  if (absl::Status status = layout.setMetadata("format", "pt"); !status.ok())
    return status;
  size_t largest = 0;
  for (const auto &[name, shape] : *tensors) {
    size_t count = 1;
    for (int64_t extent : shape)
      count *= size_t(extent);
    largest = std::max(largest, count);
    if (absl::Status status =
            layout.add(name, weights::DType::F32, shape, &kNotRead, count * sizeof(float));
        !status.ok())
      return absl::InvalidArgumentError(absl::StrCat("plan: ", status.message()));
  }
  std::string header = layout.header();

  std::error_code ec;
  std::filesystem::create_directories(outDir, ec);
  if (ec)
    return absl::UnavailableError(
        absl::StrCat(outDir, ": cannot create the directory: ", ec.message()));
  AtomicFile model(outDir + "/model.safetensors");
  if (absl::Status status = model.open(); !status.ok())
    return status;
  uint64_t length = header.size();
  uint8_t lengthBytes[8];
  for (int i = 0; i < 8; ++i)
    lengthBytes[i] = uint8_t(length >> (8 * i));
  if (absl::Status status = model.write(lengthBytes, 8); !status.ok())
    return status;
  if (absl::Status status = model.write(header.data(), header.size()); !status.ok())
    return status;
  std::vector<float> values(largest);
  for (const auto &[name, shape] : *tensors) {
    size_t count = 1;
    for (int64_t extent : shape)
      count *= size_t(extent);
    fillTensor(name, shape, *config, seed, values.data());
    // Little-endian hosts only (x86-64, aarch64), like the rest of the runtime.
    if (absl::Status status = model.write(values.data(), count * sizeof(float)); !status.ok())
      return status;
  }
  if (absl::Status status = model.commit(); !status.ok())
    return status;

  AtomicFile copy(outDir + "/config.json");
  if (absl::Status status = copy.open(); !status.ok())
    return status;
  if (absl::Status status = copy.write(configBytes->data(), configBytes->size()); !status.ok())
    return status;
  return copy.commit();
}

} // namespace moec::runtime::init
