//===- Dataset.h - tokenized training data ----------------------*- C++ -*-===//
//
// A dataset is one token stream, the documents of the file concatenated in
// order, with a label per token (-100 = not scored). Two file formats:
//
// - JSON Lines: one object per line, {"input_ids": [ints], "labels": [ints]}.
//   "labels" is optional (default: the input ids); other keys are ignored;
//   blank lines are skipped. Errors read "<path>:<line>: <what>".
// - A MoEC token file (see README.md): a 16-byte header, "MOETOKS1", a
//   little-endian uint32 token width (2 or 4 bytes) and a uint32 reserved
//   field (0), then little-endian unsigned token ids. Labels are the tokens.
//   The file is memory-mapped, not copied. Errors read
//   "<path>: byte <offset>: <what>".
//
// Every token id must lie in [0, vocabSize); a label must too, or be -100.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_DATA_DATASET_H_
#define RUNTIME_DATA_DATASET_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace moec::runtime::data {

/// The label of a token the loss ignores (PyTorch's cross-entropy ignore_index).
constexpr int64_t kIgnoreIndex = -100;

/// The token file's magic, its header size and its token widths.
constexpr char kTokenFileMagic[9] = "MOETOKS1";
constexpr size_t kTokenFileHeaderBytes = 16;

class Dataset {
public:
  /// Reads a JSON Lines file.
  static absl::StatusOr<std::unique_ptr<Dataset>> readJsonLines(const std::string &path,
                                                                int64_t vocabSize);
  /// Maps a token file. With `eosId`, a document ends after each EOS token (the
  /// EOS belongs to the document it ends; a tail without one is the last
  /// document); without it the file is one document.
  static absl::StatusOr<std::unique_ptr<Dataset>>
  readTokenFile(const std::string &path, int64_t vocabSize,
                std::optional<int64_t> eosId = std::nullopt);
  /// A token file when the file starts with the magic, JSON Lines otherwise.
  static absl::StatusOr<std::unique_ptr<Dataset>>
  open(const std::string &path, int64_t vocabSize, std::optional<int64_t> eosId = std::nullopt);

  ~Dataset();
  Dataset(const Dataset &) = delete;
  Dataset &operator=(const Dataset &) = delete;

  const std::string &path() const { return filePath; }
  int64_t vocabSize() const { return vocab; }
  /// Tokens in the concatenated stream (> 0: an empty dataset is an error).
  int64_t numTokens() const { return tokenCount; }
  int64_t numDocuments() const { return int64_t(documentStarts.size()); }
  /// Where document `i` starts in the stream.
  int64_t documentStart(int64_t i) const { return documentStarts[size_t(i)]; }

  /// Copies tokens [start, start + count) of the stream and their labels.
  /// Requires 0 <= start and start + count <= numTokens().
  void copy(int64_t start, int64_t count, int64_t *inputIds, int64_t *labels) const;

private:
  Dataset() = default;

  std::string filePath;
  int64_t vocab = 0;
  int64_t tokenCount = 0;
  std::vector<int64_t> documentStarts;
  // JSON Lines: the stream in memory; `labelStream` is empty when every label
  // is its token.
  std::vector<int64_t> tokenStream;
  std::vector<int64_t> labelStream;
  // Token file: the mapping, and where the tokens start in it.
  const uint8_t *mapping = nullptr;
  size_t mappingBytes = 0;
  const uint8_t *tokenBytes = nullptr;
  uint32_t tokenWidth = 0;
};

/// Writes a token file atomically (`path.tmp.<pid>`, fsync, rename). `width`
/// is 2 or 4, and every token must fit it.
absl::Status writeTokenFile(const std::string &path, absl::Span<const int64_t> tokens,
                            uint32_t width);

} // namespace moec::runtime::data

#endif // RUNTIME_DATA_DATASET_H_
