//===- Safetensors.cpp - a validated, memory-mapped safetensors file -----===//

#include "runtime/weights/Safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <tuple>

#include "runtime/weights/Json.h"
#include "runtime/weights/Text.h"

namespace moec::runtime::weights {
namespace {

template <typename... Parts> absl::Status invalid(const std::string &path, const Parts &...parts) {
  return absl::InvalidArgumentError(concat(path, ": ", parts...));
}

absl::Status systemError(const std::string &path, std::string_view what, int error) {
  std::string message = concat(path, ": ", what, ": ", std::strerror(error));
  return error == ENOENT ? absl::NotFoundError(message) : absl::UnavailableError(message);
}

/// Reads one element of the `field` array, which must be a non-negative integer.
absl::Status readNonNegative(const std::string &path, std::string_view tensor,
                             std::string_view field, const JsonValue &value, int64_t &out) {
  if (value.kind != JsonValue::Kind::Integer || value.integer < 0)
    return invalid(path, "tensor '", tensor, "': ", field,
                   " must hold non-negative integers, found ", jsonKindName(value.kind),
                   value.kind == JsonValue::Kind::Integer ? concat(" ", value.integer) : "");
  out = value.integer;
  return absl::OkStatus();
}

absl::Status parseMetadata(const std::string &path, const JsonValue &value,
                           std::map<std::string, std::string> &out) {
  if (value.kind != JsonValue::Kind::Object)
    return invalid(path, "__metadata__ must be an object of strings, found ",
                   jsonKindName(value.kind));
  for (const auto &[key, entry] : value.object) {
    if (entry.kind != JsonValue::Kind::String)
      return invalid(path, "__metadata__ entry \"", key, "\" must be a string, found ",
                     jsonKindName(entry.kind));
    out[key] = entry.string;
  }
  return absl::OkStatus();
}

/// Checks one tensor entry's fields and types, and that its byte range is
/// inside the data section and exactly as large as its dtype and shape need.
absl::Status parseTensor(const std::string &path, const std::string &name, const JsonValue &value,
                         uint64_t dataBytes, TensorInfo &info) {
  info.name = name;
  if (value.kind != JsonValue::Kind::Object)
    return invalid(path, "tensor '", name, "': entry must be an object, found ",
                   jsonKindName(value.kind));
  for (const auto &member : value.object)
    if (member.first != "dtype" && member.first != "shape" && member.first != "data_offsets")
      return invalid(path, "tensor '", name, "': unknown field \"", member.first, "\"");

  const JsonValue *dtype = value.find("dtype");
  if (!dtype)
    return invalid(path, "tensor '", name, "': missing field \"dtype\"");
  if (dtype->kind != JsonValue::Kind::String)
    return invalid(path, "tensor '", name, "': dtype must be a string, found ",
                   jsonKindName(dtype->kind));
  std::optional<DType> parsed = parseDType(dtype->string);
  if (!parsed)
    return invalid(path, "tensor '", name, "': unknown or unsupported dtype \"", dtype->string,
                   "\"");
  info.dtype = *parsed;

  const JsonValue *shape = value.find("shape");
  if (!shape)
    return invalid(path, "tensor '", name, "': missing field \"shape\"");
  if (shape->kind != JsonValue::Kind::Array)
    return invalid(path, "tensor '", name, "': shape must be an array, found ",
                   jsonKindName(shape->kind));
  uint64_t elements = 1;
  bool tooMany = false;
  for (const JsonValue &dim : shape->array) {
    int64_t extent;
    if (absl::Status status = readNonNegative(path, name, "shape", dim, extent); !status.ok())
      return status;
    info.shape.push_back(extent);
    tooMany |= __builtin_mul_overflow(elements, uint64_t(extent), &elements);
  }

  const JsonValue *offsets = value.find("data_offsets");
  if (!offsets)
    return invalid(path, "tensor '", name, "': missing field \"data_offsets\"");
  if (offsets->kind != JsonValue::Kind::Array || offsets->array.size() != 2)
    return invalid(path, "tensor '", name,
                   "': data_offsets must be an array of two integers [begin, end]");
  int64_t begin, end;
  if (absl::Status status = readNonNegative(path, name, "data_offsets", offsets->array[0], begin);
      !status.ok())
    return status;
  if (absl::Status status = readNonNegative(path, name, "data_offsets", offsets->array[1], end);
      !status.ok())
    return status;
  info.begin = uint64_t(begin);
  info.end = uint64_t(end);
  std::string range = concat("data_offsets [", begin, ", ", end, "]");
  if (info.begin > info.end)
    return invalid(path, "tensor '", name, "': ", range, " has begin after end");
  if (info.end > dataBytes)
    return invalid(path, "tensor '", name, "': ", range, " extend past the data section (",
                   dataBytes, " bytes)");

  uint64_t needed;
  if (tooMany || __builtin_mul_overflow(elements, uint64_t(dtypeSize(info.dtype)), &needed))
    return invalid(path, "tensor '", name, "': shape ", shapeString(info.shape),
                   " has too many elements");
  if (needed != info.numBytes())
    return invalid(path, "tensor '", name, "': shape ", shapeString(info.shape), " of ",
                   dtypeName(info.dtype), " needs ", needed, " bytes but ", range, " span ",
                   info.numBytes());
  return absl::OkStatus();
}

/// The tensors must tile the data section: sorted by offset, each one starts
/// where the previous ended and the last ends at the end of the file, so no
/// byte is shared (an overlap could alias two parameters) or unaccounted for.
absl::Status checkCoverage(const std::string &path, const std::vector<TensorInfo> &tensors,
                           uint64_t dataBytes) {
  std::vector<const TensorInfo *> byOffset;
  byOffset.reserve(tensors.size());
  for (const TensorInfo &info : tensors)
    byOffset.push_back(&info);
  std::sort(byOffset.begin(), byOffset.end(), [](const TensorInfo *a, const TensorInfo *b) {
    return std::tie(a->begin, a->end, a->name) < std::tie(b->begin, b->end, b->name);
  });
  uint64_t cursor = 0;
  const TensorInfo *previous = nullptr;
  for (const TensorInfo *info : byOffset) {
    if (info->begin < cursor)
      return invalid(path, "tensors '", previous->name, "' (bytes ", previous->begin, "..",
                     previous->end, ") and '", info->name, "' (bytes ", info->begin, "..",
                     info->end, ") overlap");
    if (info->begin > cursor)
      return invalid(path, "bytes ", cursor, "..", info->begin,
                     " of the data section belong to no tensor (a hole before tensor '", info->name,
                     "')");
    cursor = info->end;
    previous = info;
  }
  if (cursor != dataBytes)
    return invalid(path, "bytes ", cursor, "..", dataBytes,
                   " at the end of the data section belong to no tensor");
  return absl::OkStatus();
}

} // namespace

int64_t TensorInfo::numElements() const {
  int64_t elements = 1;
  for (int64_t extent : shape)
    elements *= extent;
  return elements;
}

std::string shapeString(absl::Span<const int64_t> shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    out += concat(i ? ", " : "", shape[i]);
  return out + "]";
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string &path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return systemError(path, "cannot open", errno);
  struct stat info;
  if (fstat(fd, &info) != 0) {
    int error = errno;
    ::close(fd);
    return systemError(path, "cannot stat", error);
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    return invalid(path, "not a regular file");
  }
  uint64_t fileBytes = uint64_t(info.st_size);
  if (fileBytes < 8) {
    ::close(fd);
    return invalid(path, "the file has ", fileBytes, " bytes, fewer than the 8-byte header length");
  }
  void *mapping = mmap(nullptr, fileBytes, PROT_READ, MAP_PRIVATE, fd, 0);
  int mapError = errno;
  ::close(fd); // the mapping keeps the file alive
  if (mapping == MAP_FAILED)
    return systemError(path, "cannot mmap", mapError);

  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile);
  file->filePath = path;
  file->mapping = static_cast<const uint8_t *>(mapping);
  file->mappingBytes = fileBytes;
  if (absl::Status status = file->parseHeader(); !status.ok())
    return status;
  return file;
}

absl::Status SafetensorsFile::parseHeader() {
  uint64_t headerBytes;
  std::memcpy(&headerBytes, mapping,
              sizeof headerBytes); // little-endian host, checked in DType.cpp
  if (headerBytes > kMaxHeaderBytes)
    return invalid(filePath, "header length ", headerBytes, " exceeds the limit of ",
                   kMaxHeaderBytes, " bytes");
  if (headerBytes > mappingBytes - 8)
    return invalid(filePath, "header length ", headerBytes, " does not fit in the file (",
                   mappingBytes, " bytes)");
  dataStart = mapping + 8 + headerBytes;
  dataBytes = mappingBytes - 8 - headerBytes;

  std::string_view text(reinterpret_cast<const char *>(mapping + 8), headerBytes);
  absl::StatusOr<JsonValue> header = parseJson(text);
  if (!header.ok())
    return invalid(filePath, "header is not valid JSON: ", header.status().message());
  if (header->kind != JsonValue::Kind::Object)
    return invalid(filePath, "header must be a JSON object, found ", jsonKindName(header->kind));

  for (const auto &[key, value] : header->object) {
    if (key == "__metadata__") {
      if (absl::Status status = parseMetadata(filePath, value, metadataMap); !status.ok())
        return status;
      continue;
    }
    TensorInfo info;
    if (absl::Status status = parseTensor(filePath, key, value, dataBytes, info); !status.ok())
      return status;
    tensorInfos.push_back(std::move(info));
  }
  if (absl::Status status = checkCoverage(filePath, tensorInfos, dataBytes); !status.ok())
    return status;
  std::sort(tensorInfos.begin(), tensorInfos.end(),
            [](const TensorInfo &a, const TensorInfo &b) { return a.name < b.name; });
  return absl::OkStatus();
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping)
    munmap(const_cast<uint8_t *>(mapping), mappingBytes);
}

const TensorInfo *SafetensorsFile::find(std::string_view name) const {
  auto it = std::lower_bound(
      tensorInfos.begin(), tensorInfos.end(), name,
      [](const TensorInfo &info, std::string_view key) { return info.name < key; });
  return it != tensorInfos.end() && it->name == name ? &*it : nullptr;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensorInfos.size());
  for (const TensorInfo &info : tensorInfos)
    out.push_back(info.name);
  return out;
}

absl::Span<const uint8_t> SafetensorsFile::data(const TensorInfo &info) const {
  return absl::Span<const uint8_t>(dataStart + info.begin, info.numBytes());
}

} // namespace moec::runtime::weights
