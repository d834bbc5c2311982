//===- ConfigReader.h - typed, spelling-aware reads of config.json -*- C++ -*-===//
//
// Hugging Face configs spell one fact several ways (`num_experts`,
// `num_local_experts`, `n_routed_experts`) and leave others to the config
// class's defaults. ConfigReader answers "the first spelling present", falls
// back to per-model_type defaults, records which keys were read (so unknown
// keys can be reported), and remembers the first error with the file and key.
//
//===----------------------------------------------------------------------===//

#ifndef COMPILER_FRONTEND_CONFIGREADER_H_
#define COMPILER_FRONTEND_CONFIGREADER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/JSON.h"

namespace moec::frontend {

class ConfigReader {
public:
  /// Reads and parses `path`; malformed JSON is an error naming line and column.
  static llvm::Expected<ConfigReader> open(llvm::StringRef path);
  /// Parses `text` as if it were the file `path` (tests, embedded configs).
  static llvm::Expected<ConfigReader> parse(llvm::StringRef path, llvm::StringRef text);

  /// Values the config class supplies when a key is absent (HF defaults).
  void setDefaults(llvm::json::Object defaults) { this->defaults = std::move(defaults); }

  const std::string &path() const { return filePath; }

  /// Whether any spelling is present with a non-null value.
  bool has(llvm::ArrayRef<llvm::StringRef> keys);
  /// Whether the first present spelling is explicitly `null`.
  bool isNull(llvm::ArrayRef<llvm::StringRef> keys);
  /// The key a read of `keys` reports: the first spelling in the file, else in
  /// the defaults, else the first listed (with the nested prefix).
  std::string keyOf(llvm::ArrayRef<llvm::StringRef> keys);

  // Required reads record "missing required key" and return a zero value.
  int64_t requireInt(llvm::ArrayRef<llvm::StringRef> keys);
  double requireDouble(llvm::ArrayRef<llvm::StringRef> keys);
  std::string requireString(llvm::ArrayRef<llvm::StringRef> keys);

  std::optional<int64_t> optInt(llvm::ArrayRef<llvm::StringRef> keys);
  std::optional<double> optDouble(llvm::ArrayRef<llvm::StringRef> keys);
  std::optional<bool> optBool(llvm::ArrayRef<llvm::StringRef> keys);
  std::optional<std::string> optString(llvm::ArrayRef<llvm::StringRef> keys);
  std::optional<std::vector<int64_t>> optIntList(llvm::ArrayRef<llvm::StringRef> keys);
  std::optional<std::vector<std::string>> optStringList(llvm::ArrayRef<llvm::StringRef> keys);
  /// A nested object (`rope_parameters`, `linear_attn_config`) as its own reader.
  std::optional<ConfigReader> optObject(llvm::ArrayRef<llvm::StringRef> keys);

  /// Records an error about `key` unless one is already recorded.
  void fail(llvm::StringRef key, const llvm::Twine &message);
  bool failed() const { return firstError->has_value(); }
  /// The first recorded error as "FILE: key 'K': MESSAGE", or success.
  llvm::Error takeError();

  /// Marks keys as understood without reading them (ids, dropout, cache flags).
  void markRead(llvm::ArrayRef<llvm::StringRef> keys);
  /// Keys present in the file that nothing read or marked, sorted.
  std::vector<std::string> unreadKeys() const;

private:
  ConfigReader(std::string path, std::string prefix, llvm::json::Object object,
               std::shared_ptr<std::optional<std::string>> errorSlot)
      : filePath(std::move(path)), keyPrefix(std::move(prefix)), object(std::move(object)),
        firstError(std::move(errorSlot)) {}

  /// The first spelling present in the file, else in the defaults; marks it read.
  const llvm::json::Value *find(llvm::ArrayRef<llvm::StringRef> keys, std::string *found);
  /// The first present spelling converted by `convert`; an unconvertible value is a type error.
  template <typename T, typename Convert>
  std::optional<T> readScalar(llvm::ArrayRef<llvm::StringRef> keys, llvm::StringRef expected,
                              Convert convert);
  template <typename T, typename Convert>
  std::optional<std::vector<T>> readList(llvm::ArrayRef<llvm::StringRef> keys,
                                         llvm::StringRef expected, Convert convertItem);
  void typeError(const std::string &key, llvm::StringRef expected, const llvm::json::Value &got);

  std::string filePath;
  std::string keyPrefix; // "rope_parameters." for nested readers
  llvm::json::Object object;
  llvm::json::Object defaults;
  std::set<std::string> read;
  // Shared with nested readers, so an error anywhere in the file is one error.
  std::shared_ptr<std::optional<std::string>> firstError;
};

} // namespace moec::frontend

#endif // COMPILER_FRONTEND_CONFIGREADER_H_
