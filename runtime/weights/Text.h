//===- Text.h - message building for the weights library -------*- C++ -*-===//
//
// Debian's Abseil is built with its own absl::string_view, so absl::StrCat
// does not take std::string_view; error messages are assembled with concat()
// instead, which takes strings of either kind, characters and integers.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_WEIGHTS_TEXT_H_
#define RUNTIME_WEIGHTS_TEXT_H_

#include <string>
#include <string_view>
#include <type_traits>

#include "absl/strings/string_view.h"

namespace moec::runtime::weights {

inline void appendPart(std::string &out, std::string_view text) { out.append(text); }
inline void appendPart(std::string &out, const std::string &text) { out.append(text); }
inline void appendPart(std::string &out, const char *text) { out.append(text); }
inline void appendPart(std::string &out, absl::string_view text) {
  out.append(text.data(), text.size());
}
inline void appendPart(std::string &out, char c) { out += c; }
template <typename Int, typename = std::enable_if_t<std::is_integral_v<Int>>>
void appendPart(std::string &out, Int value) {
  out += std::to_string(value);
}

template <typename... Parts> std::string concat(const Parts &...parts) {
  std::string out;
  (appendPart(out, parts), ...);
  return out;
}

} // namespace moec::runtime::weights

#endif // RUNTIME_WEIGHTS_TEXT_H_
