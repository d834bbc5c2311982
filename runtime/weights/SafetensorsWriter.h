//===- SafetensorsWriter.h - atomic safetensors output ---------*- C++ -*-===//
//
// Writes the layout the reference implementation writes, so that readers
// (PEFT, vLLM, safetensors itself) accept it and a file read by
// SafetensorsFile and written back comes out byte-identical: a compact JSON
// header with "__metadata__" first (when there is any), tensors ordered by
// element size, largest first, then by name (so every tensor stays naturally
// aligned in the data section), data offsets in that order, and the header
// padded with spaces to a multiple of 8 bytes.
//
// write() never leaves a partial file at `path`: it writes `path.tmp.<pid>`,
// fsyncs it and renames it over `path`; on any error the temporary file is
// removed and whatever was at `path` before is untouched.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_WEIGHTS_SAFETENSORSWRITER_H_
#define RUNTIME_WEIGHTS_SAFETENSORSWRITER_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "runtime/weights/DType.h"

namespace moec::runtime::weights {

class SafetensorsWriter {
public:
  /// Adds a "__metadata__" entry; key and value must be valid UTF-8.
  absl::Status setMetadata(std::string key, std::string value);

  /// Adds a tensor whose `bytes` bytes at `data` are read during write(), so
  /// they must stay valid until then. Fails on an empty, duplicate, reserved
  /// ("__metadata__") or non-UTF-8 name, a negative extent, or a byte count
  /// that is not product(shape) * dtypeSize(dtype).
  absl::Status add(std::string name, DType dtype, std::vector<int64_t> shape, const void *data,
                   size_t bytes);

  /// The JSON header, padded, without the 8-byte length in front of it.
  std::string header() const;

  /// Atomically replaces `path` with the file.
  absl::Status write(const std::string &path) const;

private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    const void *data;
    size_t bytes;
  };

  /// The tensors in file order.
  std::vector<const Entry *> ordered() const;

  std::vector<Entry> entries;
  std::set<std::string> names;
  std::map<std::string, std::string> metadata;
};

} // namespace moec::runtime::weights

#endif // RUNTIME_WEIGHTS_SAFETENSORSWRITER_H_
