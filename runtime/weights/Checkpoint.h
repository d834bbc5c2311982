//===- Checkpoint.h - tensors of a (sharded) safetensors checkpoint -*- C++ -*-===//
//
// A checkpoint is one `.safetensors` file or a Hugging Face sharded index
// (`model.safetensors.index.json`: {"metadata": {...}, "weight_map":
// {tensor: shard file}}) whose shards sit beside it. Reads copy a tensor, a
// slice of it, or a stack of per-expert tensors into caller memory, converting
// between F32, BF16 and F16 on the way; every error names the tensor and the
// file it came from (or should have come from).
//
// Shards are opened on first use (or all at once with ShardLoading::Eager);
// opening a shard verifies that it holds every tensor the index maps to it.
// All methods may be called from several threads.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_WEIGHTS_CHECKPOINT_H_
#define RUNTIME_WEIGHTS_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/weights/DType.h"
#include "runtime/weights/Safetensors.h"

namespace moec::runtime::weights {

enum class ShardLoading {
  /// Open (and verify) a shard when one of its tensors is first read.
  Lazy,
  /// Open and verify every shard in Checkpoint::open.
  Eager,
};

/// A window of a tensor: `start[d]` and `size[d]` per dimension. Empty vectors
/// mean the whole tensor.
struct Slice {
  std::vector<int64_t> start;
  std::vector<int64_t> size;
};

/// A tensor of the checkpoint and the file that holds it.
struct TensorRef {
  const TensorInfo *info;
  const SafetensorsFile *file;
};

class Checkpoint {
public:
  /// `path` is a directory holding `model.safetensors` (preferred, as
  /// transformers does) or `model.safetensors.index.json`, an index `.json`
  /// file, or a single `.safetensors` file.
  static absl::StatusOr<std::unique_ptr<Checkpoint>>
  open(const std::string &path, ShardLoading loading = ShardLoading::Lazy);

  /// The single file or the index file.
  const std::string &path() const { return rootPath; }
  bool isSharded() const { return sharded; }
  /// Every tensor name, sorted.
  std::vector<std::string> names() const;
  bool contains(std::string_view name) const;

  /// The tensor's header entry and file (opening its shard if needed).
  absl::StatusOr<TensorRef> lookup(std::string_view name);

  /// Copies the whole tensor into `dst` as `want`; `dstBytes` must be its exact size.
  absl::Status read(std::string_view name, DType want, void *dst, size_t dstBytes);
  /// As read(), after checking that the tensor's shape is `expectedShape`.
  absl::Status readInto(std::string_view name, absl::Span<const int64_t> expectedShape, DType want,
                        void *dst, size_t dstBytes);
  /// Copies `slice` of the tensor (row-major, size[0] x size[1] x ...) into `dst`.
  absl::Status readSlice(std::string_view name, const Slice &slice, DType want, void *dst,
                         size_t dstBytes);
  /// Reads `experts` of `pattern` (a name containing "{expert}"), in that order,
  /// into consecutive slots of `dst`. Every expert tensor must have the same
  /// shape; `slice` (possibly empty) is taken from each, and what each expert
  /// contributes must have shape `expertShape`.
  absl::Status readExperts(std::string_view pattern, absl::Span<const int64_t> experts, const Slice &slice,
                           absl::Span<const int64_t> expertShape, DType want, void *dst, size_t dstBytes);
  /// The whole tensor as F32.
  absl::Status readAsF32(std::string_view name, std::vector<float> &out);

private:
  struct Shard {
    std::string path;
    std::unique_ptr<SafetensorsFile> file;
  };

  Checkpoint() = default;
  static absl::StatusOr<std::unique_ptr<Checkpoint>> openIndex(const std::string &indexPath);
  /// The open shard `index` of `shards`, opening and verifying it first if needed.
  absl::StatusOr<const SafetensorsFile *> shard(size_t index);
  absl::Status copyOut(const TensorRef &tensor, const Slice &slice, DType want, void *dst,
                       size_t dstBytes);

  std::string rootPath;
  bool sharded = false;
  std::vector<Shard> shards;
  /// Tensor name -> index in `shards`.
  std::map<std::string, size_t, std::less<>> shardOf;
  std::mutex openMutex;
};

} // namespace moec::runtime::weights

#endif // RUNTIME_WEIGHTS_CHECKPOINT_H_
