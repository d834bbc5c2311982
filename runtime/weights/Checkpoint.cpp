//===- Checkpoint.cpp - tensors of a (sharded) safetensors checkpoint ----===//

#include "runtime/weights/Checkpoint.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "runtime/weights/Json.h"
#include "runtime/weights/Text.h"

namespace moec::runtime::weights {
namespace {

constexpr std::string_view kSingleFile = "model.safetensors";
constexpr std::string_view kIndexFile = "model.safetensors.index.json";
constexpr std::string_view kExpertPlaceholder = "{expert}";

bool isDirectory(const std::string &path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

bool isRegularFile(const std::string &path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

bool endsWith(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

std::string directoryOf(const std::string &path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash == 0 ? 1 : slash);
}

/// The same status with `context` appended to its message.
absl::Status withContext(const absl::Status &status, std::string_view context) {
  return absl::Status(status.code(), concat(status.message(), context));
}

absl::StatusOr<std::string> readIndexFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return absl::NotFoundError(concat(path, ": cannot open: ", std::strerror(errno)));
  in.seekg(0, std::ios::end);
  std::streamoff size = in.tellg();
  // An index maps names to file names; anything this large is not one.
  if (size < 0 || uint64_t(size) > kMaxHeaderBytes)
    return absl::InvalidArgumentError(
        concat(path, ": not a readable index of at most ", kMaxHeaderBytes, " bytes"));
  std::string text(size_t(size), '\0');
  in.seekg(0);
  if (!in.read(text.data(), size))
    return absl::UnavailableError(concat(path, ": read failed"));
  return text;
}

/// Shard names come from a downloaded file: keep them inside the checkpoint directory.
bool isSafeShardName(std::string_view name) {
  if (name.empty() || name.front() == '/')
    return false;
  for (size_t begin = 0; begin <= name.size();) {
    size_t end = std::min(name.find('/', begin), name.size());
    if (name.substr(begin, end - begin) == "..")
      return false;
    begin = end + 1;
  }
  return true;
}

std::string expertName(std::string_view pattern, int64_t expert) {
  std::string name(pattern);
  std::string number = std::to_string(expert);
  for (size_t at = 0; (at = name.find(kExpertPlaceholder, at)) != std::string::npos;
       at += number.size())
    name.replace(at, kExpertPlaceholder.size(), number);
  return name;
}

/// Copies the window [start, start + size) of a row-major tensor of `shape`,
/// converting each element. Trailing dimensions taken whole merge into one
/// contiguous run, so whole tensors and leading-dimension slices are a single
/// convert call.
void copyWindow(const uint8_t *src, DType from, absl::Span<const int64_t> shape,
                absl::Span<const int64_t> start, absl::Span<const int64_t> size, uint8_t *dst,
                DType to) {
  size_t rank = shape.size();
  if (rank == 0) {
    convertElements(src, from, dst, to, 1).IgnoreError(); // canConvert was checked
    return;
  }
  std::vector<int64_t> stride(rank, 1);
  for (size_t d = rank - 1; d > 0; --d)
    stride[d - 1] = stride[d] * shape[d];
  size_t inner = rank - 1;
  while (inner > 0 && start[inner] == 0 && size[inner] == shape[inner])
    --inner;
  int64_t run = size[inner] * stride[inner];
  size_t fromSize = dtypeSize(from), toSize = dtypeSize(to);

  std::vector<int64_t> index(inner, 0); // odometer over the dimensions before `inner`
  while (true) {
    int64_t offset = start[inner] * stride[inner];
    for (size_t d = 0; d < inner; ++d)
      offset += (start[d] + index[d]) * stride[d];
    convertElements(src + offset * fromSize, from, dst, to, size_t(run)).IgnoreError();
    dst += run * toSize;
    // Advance the odometer; when every digit wraps, the window is done.
    size_t d = inner;
    while (d > 0 && ++index[d - 1] == size[d - 1])
      index[--d] = 0;
    if (d == 0)
      return;
  }
}

} // namespace

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::open(const std::string &path,
                                                             ShardLoading loading) {
  std::string target = path;
  if (isDirectory(path)) {
    std::string single = concat(path, "/", kSingleFile);
    std::string index = concat(path, "/", kIndexFile);
    if (isRegularFile(single))
      target = single;
    else if (isRegularFile(index))
      target = index;
    else
      return absl::NotFoundError(
          concat(path, ": holds neither ", kSingleFile, " nor ", kIndexFile));
  }

  std::unique_ptr<Checkpoint> checkpoint;
  if (endsWith(target, ".json")) {
    absl::StatusOr<std::unique_ptr<Checkpoint>> indexed = openIndex(target);
    if (!indexed.ok())
      return indexed.status();
    checkpoint = std::move(*indexed);
  } else {
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::open(target);
    if (!file.ok())
      return file.status();
    checkpoint.reset(new Checkpoint);
    checkpoint->rootPath = target;
    for (const TensorInfo &info : (*file)->tensors())
      checkpoint->shardOf.emplace(info.name, 0);
    checkpoint->shards.push_back({target, std::move(*file)});
  }

  if (loading == ShardLoading::Eager)
    for (size_t i = 0; i < checkpoint->shards.size(); ++i)
      if (absl::StatusOr<const SafetensorsFile *> file = checkpoint->shard(i); !file.ok())
        return file.status();
  return checkpoint;
}

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::openIndex(const std::string &indexPath) {
  absl::StatusOr<std::string> text = readIndexFile(indexPath);
  if (!text.ok())
    return text.status();
  auto invalid = [&](auto... parts) {
    return absl::InvalidArgumentError(concat(indexPath, ": ", parts...));
  };
  absl::StatusOr<JsonValue> index = parseJson(*text);
  if (!index.ok())
    return invalid("not valid JSON: ", index.status().message());
  if (index->kind != JsonValue::Kind::Object)
    return invalid("must be a JSON object, found ", jsonKindName(index->kind));
  // "metadata" (total_size, ...) is informational; only its type is checked.
  if (const JsonValue *metadata = index->find("metadata");
      metadata && metadata->kind != JsonValue::Kind::Object)
    return invalid("\"metadata\" must be an object, found ", jsonKindName(metadata->kind));
  const JsonValue *weightMap = index->find("weight_map");
  if (!weightMap)
    return invalid("missing \"weight_map\"");
  if (weightMap->kind != JsonValue::Kind::Object)
    return invalid("\"weight_map\" must be an object, found ", jsonKindName(weightMap->kind));

  std::unique_ptr<Checkpoint> checkpoint(new Checkpoint);
  checkpoint->rootPath = indexPath;
  checkpoint->sharded = true;
  std::string directory = directoryOf(indexPath);
  std::map<std::string, size_t> shardIndex;
  for (const auto &[tensor, shardName] : weightMap->object) {
    if (shardName.kind != JsonValue::Kind::String)
      return invalid("weight_map entry for tensor '", tensor, "' must be a file name, found ",
                     jsonKindName(shardName.kind));
    if (!isSafeShardName(shardName.string))
      return invalid("weight_map entry for tensor '", tensor, "': shard \"", shardName.string,
                     "\" is not a relative path inside the checkpoint directory");
    auto [it, added] = shardIndex.emplace(shardName.string, checkpoint->shards.size());
    if (added)
      checkpoint->shards.push_back({concat(directory, "/", shardName.string), nullptr});
    checkpoint->shardOf.emplace(tensor, it->second);
  }
  return checkpoint;
}

absl::StatusOr<const SafetensorsFile *> Checkpoint::shard(size_t index) {
  std::lock_guard<std::mutex> lock(openMutex);
  Shard &shard = shards[index];
  if (shard.file)
    return shard.file.get();
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::open(shard.path);
  if (!file.ok())
    return withContext(file.status(), concat(" (a shard listed in ", rootPath, ")"));
  for (const auto &[tensor, owner] : shardOf)
    if (owner == index && !(*file)->find(tensor))
      return absl::NotFoundError(concat(rootPath, ": tensor '", tensor, "' is mapped to ",
                                        shard.path, ", which has no such tensor"));
  shard.file = std::move(*file);
  return shard.file.get();
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(shardOf.size());
  for (const auto &entry : shardOf)
    out.push_back(entry.first);
  return out;
}

bool Checkpoint::contains(std::string_view name) const {
  return shardOf.find(name) != shardOf.end();
}

absl::StatusOr<TensorRef> Checkpoint::lookup(std::string_view name) {
  auto it = shardOf.find(name);
  if (it == shardOf.end())
    return absl::NotFoundError(concat(rootPath, ": no tensor '", name, "'"));
  absl::StatusOr<const SafetensorsFile *> file = shard(it->second);
  if (!file.ok())
    return file.status();
  // The shard was verified to hold every tensor mapped to it.
  return TensorRef{(*file)->find(name), *file};
}

absl::Status Checkpoint::copyOut(const TensorRef &tensor, const Slice &slice, DType want, void *dst,
                                 size_t dstBytes) {
  const TensorInfo &info = *tensor.info;
  auto invalid = [&](auto... parts) {
    return absl::InvalidArgumentError(
        concat(tensor.file->path(), ": tensor '", info.name, "': ", parts...));
  };
  if (!canConvert(info.dtype, want))
    return invalid("stored as ", dtypeName(info.dtype), ", cannot be read as ", dtypeName(want));

  size_t rank = info.shape.size();
  std::vector<int64_t> start(rank, 0), size = info.shape;
  if (!slice.start.empty() || !slice.size.empty()) {
    if (slice.start.size() != rank || slice.size.size() != rank)
      return invalid("the slice has ", slice.start.size(), " starts and ", slice.size.size(),
                     " sizes for a tensor of shape ", shapeString(info.shape));
    for (size_t d = 0; d < rank; ++d) {
      int64_t first = slice.start[d], count = slice.size[d], extent = info.shape[d];
      if (first < 0 || count < 0 || first > extent || count > extent - first)
        return invalid("slice [", first, ", ", first, " + ", count, ") of dimension ", d,
                       " is outside the shape ", shapeString(info.shape));
    }
    start = slice.start;
    size = slice.size;
  }
  uint64_t elements = 1;
  for (int64_t extent : size)
    elements *= uint64_t(extent); // within a validated tensor, so no overflow
  uint64_t needed = elements * dtypeSize(want);
  if (needed != dstBytes)
    return invalid("the destination has ", dstBytes, " bytes, but ", shapeString(size), " as ",
                   dtypeName(want), " needs ", needed);
  if (elements == 0)
    return absl::OkStatus();
  copyWindow(tensor.file->data(info).data(), info.dtype, info.shape, start, size,
             static_cast<uint8_t *>(dst), want);
  return absl::OkStatus();
}

absl::Status Checkpoint::read(std::string_view name, DType want, void *dst, size_t dstBytes) {
  absl::StatusOr<TensorRef> tensor = lookup(name);
  if (!tensor.ok())
    return tensor.status();
  return copyOut(*tensor, Slice{}, want, dst, dstBytes);
}

absl::Status Checkpoint::readInto(std::string_view name, absl::Span<const int64_t> expectedShape,
                                  DType want, void *dst, size_t dstBytes) {
  absl::StatusOr<TensorRef> tensor = lookup(name);
  if (!tensor.ok())
    return tensor.status();
  const std::vector<int64_t> &shape = tensor->info->shape;
  if (absl::Span<const int64_t>(shape) != expectedShape)
    return absl::InvalidArgumentError(concat(tensor->file->path(), ": tensor '", name,
                                             "' has shape ", shapeString(shape), ", expected ",
                                             shapeString(expectedShape)));
  return copyOut(*tensor, Slice{}, want, dst, dstBytes);
}

absl::Status Checkpoint::readSlice(std::string_view name, const Slice &slice, DType want, void *dst,
                                   size_t dstBytes) {
  absl::StatusOr<TensorRef> tensor = lookup(name);
  if (!tensor.ok())
    return tensor.status();
  return copyOut(*tensor, slice, want, dst, dstBytes);
}

absl::Status Checkpoint::readExperts(std::string_view pattern, absl::Span<const int64_t> experts,
                                     const Slice &slice, absl::Span<const int64_t> expertShape, DType want,
                                     void *dst, size_t dstBytes) {
  auto invalid = [&](auto... parts) {
    return absl::InvalidArgumentError(concat(rootPath, ": experts '", pattern, "': ", parts...));
  };
  if (pattern.find(kExpertPlaceholder) == std::string_view::npos)
    return invalid("the name has no ", kExpertPlaceholder);
  int64_t numExperts = static_cast<int64_t>(experts.size());
  for (int64_t expert : experts)
    if (expert < 0)
      return invalid("bad expert number ", expert);
  uint64_t perExpert = dtypeSize(want);
  bool overflow = false;
  for (int64_t extent : expertShape)
    overflow |= extent < 0 || __builtin_mul_overflow(perExpert, uint64_t(extent), &perExpert);
  uint64_t needed;
  overflow |= __builtin_mul_overflow(perExpert, uint64_t(numExperts), &needed);
  if (overflow || needed != dstBytes)
    return invalid("the destination has ", dstBytes, " bytes, but ", numExperts, " x ",
                   shapeString(expertShape), " as ", dtypeName(want), " needs ",
                   overflow ? std::string("too many") : std::to_string(needed));

  bool sliced = !slice.start.empty() || !slice.size.empty();
  std::vector<int64_t> firstShape;
  auto *out = static_cast<uint8_t *>(dst);
  for (int64_t i = 0; i < numExperts; ++i) {
    int64_t expert = experts[static_cast<size_t>(i)];
    std::string name = expertName(pattern, expert);
    absl::StatusOr<TensorRef> tensor = lookup(name);
    if (!tensor.ok())
      return withContext(tensor.status(), concat(" (expert ", expert, ")"));
    const std::vector<int64_t> &shape = tensor->info->shape;
    auto mismatch = [&](std::string_view what, absl::Span<const int64_t> actual,
                        absl::Span<const int64_t> expected) {
      return absl::InvalidArgumentError(
          concat(tensor->file->path(), ": tensor '", name, "' (expert ", expert, ") has ", what,
                 " ", shapeString(actual), ", expected ", shapeString(expected)));
    };
    if (i == 0)
      firstShape = shape;
    else if (shape != firstShape)
      return mismatch("shape", shape, firstShape);
    if (!sliced && absl::Span<const int64_t>(shape) != expertShape)
      return mismatch("shape", shape, expertShape);
    if (sliced && absl::Span<const int64_t>(slice.size) != expertShape)
      return mismatch("slice size", slice.size, expertShape);
    if (absl::Status status = copyOut(*tensor, slice, want, out + i * perExpert, perExpert);
        !status.ok())
      return status;
  }
  return absl::OkStatus();
}

absl::Status Checkpoint::readAsF32(std::string_view name, std::vector<float> &out) {
  absl::StatusOr<TensorRef> tensor = lookup(name);
  if (!tensor.ok())
    return tensor.status();
  out.resize(size_t(tensor->info->numElements()));
  return copyOut(*tensor, Slice{}, DType::F32, out.data(), out.size() * sizeof(float));
}

} // namespace moec::runtime::weights
