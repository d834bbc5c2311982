//===- ConfigReader.cpp - typed, spelling-aware reads of config.json -----===//

#include "compiler/frontend/ConfigReader.h"

#include <cmath>

#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"

using namespace llvm;

namespace moec::frontend {
namespace {

StringRef kindOf(const json::Value &v) {
  switch (v.kind()) {
  case json::Value::Null:
    return "null";
  case json::Value::Boolean:
    return "a boolean";
  case json::Value::Number:
    return "a number";
  case json::Value::String:
    return "a string";
  case json::Value::Array:
    return "a list";
  case json::Value::Object:
    return "an object";
  }
  return "a value";
}

/// An integer, accepting floats with no fractional part (some re-saves write 4.0).
std::optional<int64_t> asInteger(const json::Value &v) {
  if (auto i = v.getAsInteger())
    return *i;
  if (auto d = v.getAsNumber())
    if (std::isfinite(*d) && *d == std::floor(*d) && std::fabs(*d) < 9.0e15)
      return static_cast<int64_t>(*d);
  return std::nullopt;
}

} // namespace

Expected<ConfigReader> ConfigReader::open(StringRef path) {
  auto buffer = MemoryBuffer::getFile(path);
  if (!buffer)
    return createStringError(buffer.getError(), "%s: cannot read: %s", path.str().c_str(),
                             buffer.getError().message().c_str());
  return parse(path, (*buffer)->getBuffer());
}

Expected<ConfigReader> ConfigReader::parse(StringRef path, StringRef text) {
  Expected<json::Value> value = json::parse(text);
  if (!value)
    return createStringError(inconvertibleErrorCode(), "%s: malformed JSON: %s",
                             path.str().c_str(), toString(value.takeError()).c_str());
  json::Object *object = value->getAsObject();
  if (!object)
    return createStringError(inconvertibleErrorCode(),
                             "%s: expected a JSON object at the top level, got %s",
                             path.str().c_str(), kindOf(*value).str().c_str());
  return ConfigReader(path.str(), "", std::move(*object),
                      std::make_shared<std::optional<std::string>>());
}

const json::Value *ConfigReader::find(ArrayRef<StringRef> keys, std::string *found) {
  // Every spelling present counts as read: the first one wins, the others agree or are
  // superseded (gpt-oss writes both num_experts_per_tok and experts_per_token).
  const json::Value *first = nullptr;
  for (StringRef key : keys) {
    if (const json::Value *v = object.get(key)) {
      read.insert(key.str());
      if (!first) {
        first = v;
        *found = keyPrefix + key.str();
      }
    }
  }
  if (first)
    return first;
  for (StringRef key : keys) {
    if (const json::Value *v = defaults.get(key)) {
      *found = keyPrefix + key.str();
      return v;
    }
  }
  *found = keyPrefix + keys.front().str();
  return nullptr;
}

bool ConfigReader::has(ArrayRef<StringRef> keys) {
  std::string key;
  const json::Value *v = find(keys, &key);
  return v && v->kind() != json::Value::Null;
}

bool ConfigReader::isNull(ArrayRef<StringRef> keys) {
  std::string key;
  const json::Value *v = find(keys, &key);
  return v && v->kind() == json::Value::Null;
}

std::string ConfigReader::keyOf(ArrayRef<StringRef> keys) {
  std::string key;
  find(keys, &key);
  return key;
}

void ConfigReader::fail(StringRef key, const Twine &message) {
  if (!*firstError)
    *firstError = formatv("{0}: key '{1}': {2}", filePath, key, message.str()).str();
}

void ConfigReader::typeError(const std::string &key, StringRef expected, const json::Value &got) {
  fail(key, "expected " + expected + ", got " + kindOf(got));
}

Error ConfigReader::takeError() {
  if (!*firstError)
    return Error::success();
  std::string message = std::move(**firstError);
  firstError->reset();
  return createStringError(inconvertibleErrorCode(), "%s", message.c_str());
}

template <typename T, typename Convert>
std::optional<T> ConfigReader::readScalar(ArrayRef<StringRef> keys, StringRef expected,
                                          Convert convert) {
  std::string key;
  const json::Value *v = find(keys, &key);
  if (!v || v->kind() == json::Value::Null)
    return std::nullopt;
  if (std::optional<T> out = convert(*v))
    return out;
  typeError(key, expected, *v);
  return std::nullopt;
}

template <typename T, typename Convert>
std::optional<std::vector<T>> ConfigReader::readList(ArrayRef<StringRef> keys, StringRef expected,
                                                     Convert convertItem) {
  std::string key;
  const json::Value *v = find(keys, &key);
  if (!v || v->kind() == json::Value::Null)
    return std::nullopt;
  const json::Array *array = v->getAsArray();
  if (!array) {
    typeError(key, expected, *v);
    return std::nullopt;
  }
  std::vector<T> out;
  for (const json::Value &item : *array) {
    std::optional<T> converted = convertItem(item);
    if (!converted) {
      fail(key, "expected " + expected + ", but an element is " + kindOf(item));
      return std::nullopt;
    }
    out.push_back(std::move(*converted));
  }
  return out;
}

std::optional<int64_t> ConfigReader::optInt(ArrayRef<StringRef> keys) {
  return readScalar<int64_t>(keys, "an integer", asInteger);
}

std::optional<double> ConfigReader::optDouble(ArrayRef<StringRef> keys) {
  return readScalar<double>(keys, "a number", [](const json::Value &v) { return v.getAsNumber(); });
}

std::optional<bool> ConfigReader::optBool(ArrayRef<StringRef> keys) {
  return readScalar<bool>(keys, "true or false", [](const json::Value &v) { return v.getAsBoolean(); });
}

static std::optional<std::string> asString(const json::Value &v) {
  if (auto s = v.getAsString())
    return s->str();
  return std::nullopt;
}

std::optional<std::string> ConfigReader::optString(ArrayRef<StringRef> keys) {
  return readScalar<std::string>(keys, "a string", asString);
}

std::optional<std::vector<int64_t>> ConfigReader::optIntList(ArrayRef<StringRef> keys) {
  return readList<int64_t>(keys, "a list of integers", asInteger);
}

std::optional<std::vector<std::string>> ConfigReader::optStringList(ArrayRef<StringRef> keys) {
  return readList<std::string>(keys, "a list of strings", asString);
}

std::optional<ConfigReader> ConfigReader::optObject(ArrayRef<StringRef> keys) {
  std::string key;
  const json::Value *v = find(keys, &key);
  if (!v || v->kind() == json::Value::Null)
    return std::nullopt;
  const json::Object *nested = v->getAsObject();
  if (!nested) {
    typeError(key, "an object", *v);
    return std::nullopt;
  }
  return ConfigReader(filePath, key + ".", *nested, firstError);
}

int64_t ConfigReader::requireInt(ArrayRef<StringRef> keys) {
  if (std::optional<int64_t> v = optInt(keys))
    return *v;
  if (!has(keys))
    fail(keyPrefix + keys.front().str(), "missing required key (an integer)");
  return 0;
}

double ConfigReader::requireDouble(ArrayRef<StringRef> keys) {
  if (std::optional<double> v = optDouble(keys))
    return *v;
  if (!has(keys))
    fail(keyPrefix + keys.front().str(), "missing required key (a number)");
  return 0;
}

std::string ConfigReader::requireString(ArrayRef<StringRef> keys) {
  if (std::optional<std::string> v = optString(keys))
    return *v;
  if (!has(keys))
    fail(keyPrefix + keys.front().str(), "missing required key (a string)");
  return "";
}

void ConfigReader::markRead(ArrayRef<StringRef> keys) {
  for (StringRef key : keys)
    read.insert(key.str());
}

std::vector<std::string> ConfigReader::unreadKeys() const {
  std::vector<std::string> out;
  for (const auto &entry : object)
    if (!read.count(entry.first.str()))
      out.push_back(keyPrefix + entry.first.str());
  std::sort(out.begin(), out.end());
  return out;
}

} // namespace moec::frontend
