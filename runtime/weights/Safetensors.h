//===- Safetensors.h - a validated, memory-mapped safetensors file -*- C++ -*-===//
//
// A `.safetensors` file is an 8-byte little-endian header length N, N bytes of
// UTF-8 JSON naming each tensor's dtype, shape and [begin, end) byte range in
// the data section that follows, and an optional "__metadata__" map of strings.
// open() maps the file read-only and checks every safety rule of the format
// before handing out a single byte, so that a corrupt or hostile file is an
// error naming the file and the offending tensor or field, never a crash or an
// out-of-bounds read. Tensor bytes are views into the mapping (no copies).
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_WEIGHTS_SAFETENSORS_H_
#define RUNTIME_WEIGHTS_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/weights/DType.h"

namespace moec::runtime::weights {

/// The format's limit on N; larger headers are refused before being read.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  /// Byte range in the data section (which starts right after the header).
  uint64_t begin = 0;
  uint64_t end = 0;

  int64_t numElements() const;
  uint64_t numBytes() const { return end - begin; }
};

/// "[2, 3]" for error messages.
std::string shapeString(absl::Span<const int64_t> shape);

class SafetensorsFile {
public:
  /// Maps and validates `path`; any broken rule is an InvalidArgument error
  /// that starts with the path and names the tensor or field.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> open(const std::string &path);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile &) = delete;
  SafetensorsFile &operator=(const SafetensorsFile &) = delete;

  const std::string &path() const { return filePath; }
  /// The tensor called `name`, or null.
  const TensorInfo *find(std::string_view name) const;
  /// Every tensor, sorted by name.
  const std::vector<TensorInfo> &tensors() const { return tensorInfos; }
  std::vector<std::string> names() const;
  /// The "__metadata__" map; empty when the header has none.
  const std::map<std::string, std::string> &metadata() const { return metadataMap; }
  /// The tensor's bytes inside the mapping, valid while this object lives.
  /// `info` must come from this file.
  absl::Span<const uint8_t> data(const TensorInfo &info) const;
  /// Bytes in the data section; the tensors cover it exactly.
  uint64_t dataSize() const { return dataBytes; }

private:
  SafetensorsFile() = default;
  /// Validates the mapped header and fills the tensor table and metadata.
  absl::Status parseHeader();

  std::string filePath;
  const uint8_t *mapping = nullptr;
  size_t mappingBytes = 0;
  const uint8_t *dataStart = nullptr;
  uint64_t dataBytes = 0;
  std::vector<TensorInfo> tensorInfos;
  std::map<std::string, std::string> metadataMap;
};

} // namespace moec::runtime::weights

#endif // RUNTIME_WEIGHTS_SAFETENSORS_H_
