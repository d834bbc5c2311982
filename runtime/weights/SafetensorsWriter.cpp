//===- SafetensorsWriter.cpp - atomic safetensors output -----------------===//

#include "runtime/weights/SafetensorsWriter.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "runtime/weights/Json.h"
#include "runtime/weights/Safetensors.h"
#include "runtime/weights/Text.h"

namespace moec::runtime::weights {
namespace {

absl::Status systemError(const std::string &path, std::string_view what, int error) {
  return absl::UnavailableError(concat(path, ": ", what, ": ", std::strerror(error)));
}

/// Writes all of `bytes`, resuming after short writes and signals.
bool writeAll(int fd, const void *data, size_t bytes) {
  auto *at = static_cast<const uint8_t *>(data);
  while (bytes > 0) {
    ssize_t written = ::write(fd, at, bytes);
    if (written < 0) {
      if (errno == EINTR)
        continue;
      return false;
    }
    at += written;
    bytes -= size_t(written);
  }
  return true;
}

std::string directoryOf(const std::string &path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos)
    return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

} // namespace

absl::Status SafetensorsWriter::setMetadata(std::string key, std::string value) {
  if (!isValidUtf8(key) || !isValidUtf8(value))
    return absl::InvalidArgumentError(
        concat("metadata entry \"", key, "\": key and value must be valid UTF-8"));
  metadata[std::move(key)] = std::move(value);
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::add(std::string name, DType dtype, std::vector<int64_t> shape,
                                    const void *data, size_t bytes) {
  auto error = [&](auto... parts) {
    return absl::InvalidArgumentError(concat("tensor '", name, "': ", parts...));
  };
  if (name.empty() || name == "__metadata__")
    return error("this name is reserved or empty");
  if (!isValidUtf8(name))
    return error("the name is not valid UTF-8");
  if (names.count(name))
    return error("added twice");
  uint64_t needed = dtypeSize(dtype);
  for (int64_t extent : shape) {
    if (extent < 0)
      return error("negative extent in shape ", shapeString(shape));
    if (__builtin_mul_overflow(needed, uint64_t(extent), &needed))
      return error("shape ", shapeString(shape), " has too many elements");
  }
  if (needed != bytes)
    return error("shape ", shapeString(shape), " of ", dtypeName(dtype), " needs ", needed,
                 " bytes, got ", bytes);
  if (!data && bytes)
    return error("no data");
  names.insert(name);
  entries.push_back({std::move(name), dtype, std::move(shape), data, bytes});
  return absl::OkStatus();
}

std::vector<const SafetensorsWriter::Entry *> SafetensorsWriter::ordered() const {
  std::vector<const Entry *> out;
  out.reserve(entries.size());
  for (const Entry &entry : entries)
    out.push_back(&entry);
  std::sort(out.begin(), out.end(), [](const Entry *a, const Entry *b) {
    size_t sizeA = dtypeSize(a->dtype), sizeB = dtypeSize(b->dtype);
    return sizeA != sizeB ? sizeA > sizeB : a->name < b->name;
  });
  return out;
}

std::string SafetensorsWriter::header() const {
  std::string out = "{";
  if (!metadata.empty()) {
    out += "\"__metadata__\":{";
    bool first = true;
    for (const auto &[key, value] : metadata) {
      if (!first)
        out += ',';
      first = false;
      appendJsonString(out, key);
      out += ':';
      appendJsonString(out, value);
    }
    out += '}';
  }
  uint64_t offset = 0;
  for (const Entry *entry : ordered()) {
    if (out.size() > 1)
      out += ',';
    appendJsonString(out, entry->name);
    out += concat(":{\"dtype\":\"", dtypeName(entry->dtype), "\",\"shape\":[");
    for (size_t i = 0; i < entry->shape.size(); ++i)
      out += concat(i ? "," : "", entry->shape[i]);
    out += concat("],\"data_offsets\":[", offset, ",", offset + entry->bytes, "]}");
    offset += entry->bytes;
  }
  out += '}';
  // The data section then starts 8-byte aligned, as the reference implementation does.
  out.append((8 - out.size() % 8) % 8, ' ');
  return out;
}

absl::Status SafetensorsWriter::write(const std::string &path) const {
  std::string text = header();
  if (text.size() > kMaxHeaderBytes)
    return absl::InvalidArgumentError(concat(path, ": the header would have ", text.size(),
                                             " bytes, over the limit of ", kMaxHeaderBytes));
  std::string temporary = concat(path, ".tmp.", getpid());
  int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return systemError(temporary, "cannot create", errno);

  auto abandon = [&](std::string_view what) {
    absl::Status status = systemError(temporary, what, errno);
    if (fd >= 0)
      ::close(fd);
    ::unlink(temporary.c_str());
    return status;
  };
  uint64_t length = text.size();
  if (!writeAll(fd, &length, sizeof length) || !writeAll(fd, text.data(), text.size()))
    return abandon("cannot write");
  for (const Entry *entry : ordered())
    if (!writeAll(fd, entry->data, entry->bytes))
      return abandon("cannot write");
  // Data must be on disk before the rename makes it visible under the final name.
  if (fsync(fd) != 0)
    return abandon("cannot fsync");
  int closed = ::close(fd);
  fd = -1;
  if (closed != 0)
    return abandon("cannot close");
  if (::rename(temporary.c_str(), path.c_str()) != 0)
    return abandon(concat("cannot rename to ", path));

  // Persist the rename itself; the file is complete either way, so this is best effort.
  int directory = ::open(directoryOf(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (directory >= 0) {
    fsync(directory);
    ::close(directory);
  }
  return absl::OkStatus();
}

} // namespace moec::runtime::weights
