//===- Json.h - a small strict JSON reader for weight headers --*- C++ -*-===//
//
// The runtime links neither LLVM nor an Abseil JSON library, and safetensors
// headers come from untrusted files, so this reader is deliberately strict:
// RFC 8259 only (no comments, no trailing commas, no NaN), UTF-8 validated,
// duplicate object keys rejected, nesting depth bounded, and every error says
// at which byte it happened. Objects keep their keys in file order.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_WEIGHTS_JSON_H_
#define RUNTIME_WEIGHTS_JSON_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace moec::runtime::weights {

struct JsonValue {
  enum class Kind { Null, Bool, Integer, Number, String, Array, Object };

  Kind kind = Kind::Null;
  bool boolean = false;
  /// Integer: a number written without fraction or exponent that fits int64.
  int64_t integer = 0;
  /// Number: any other number.
  double number = 0;
  std::string string;
  std::vector<JsonValue> array;
  std::vector<std::pair<std::string, JsonValue>> object;

  /// The member `key` of an object, or null when absent or not an object.
  const JsonValue *find(std::string_view key) const;
};

/// "an object", "a string", ... for error messages.
std::string_view jsonKindName(JsonValue::Kind kind);

/// Parses one JSON value; whitespace may surround it, nothing else may follow.
/// Errors read "at byte N: <what>".
absl::StatusOr<JsonValue> parseJson(std::string_view text);

/// Whether `text` is well-formed UTF-8 (no overlong forms, no surrogates).
bool isValidUtf8(std::string_view text);

/// Appends `text` as a JSON string literal, escaping only what JSON requires.
void appendJsonString(std::string &out, std::string_view text);

} // namespace moec::runtime::weights

#endif // RUNTIME_WEIGHTS_JSON_H_
