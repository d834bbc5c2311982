//===- Dataset.cpp - tokenized training data -----------------------------===//

#include "runtime/data/Dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "runtime/weights/Json.h"

namespace moec::runtime::data {
namespace {

using weights::JsonValue;

absl::Status systemError(const std::string &path, const std::string &what, int error) {
  std::string message = absl::StrCat(path, ": ", what, ": ", std::strerror(error));
  return error == ENOENT ? absl::NotFoundError(message) : absl::UnavailableError(message);
}

absl::StatusOr<std::string> readWholeFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return systemError(path, "cannot open", errno);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad())
    return systemError(path, "cannot read", errno);
  return bytes;
}

std::string valueText(const JsonValue &value) {
  switch (value.kind) {
  case JsonValue::Kind::Integer:
    return absl::StrCat(value.integer);
  case JsonValue::Kind::Number:
    return absl::StrCat(value.number);
  case JsonValue::Kind::String:
    return absl::StrCat("the string \"", value.string, "\"");
  default:
    return std::string(weights::jsonKindName(value.kind));
  }
}

uint32_t readU32(const uint8_t *at) {
  return uint32_t(at[0]) | uint32_t(at[1]) << 8 | uint32_t(at[2]) << 16 | uint32_t(at[3]) << 24;
}

int64_t tokenAt(const uint8_t *tokens, uint32_t width, int64_t index) {
  const uint8_t *at = tokens + size_t(index) * width;
  if (width == 2)
    return int64_t(uint32_t(at[0]) | uint32_t(at[1]) << 8);
  return int64_t(readU32(at));
}

} // namespace

Dataset::~Dataset() {
  if (mapping)
    ::munmap(const_cast<uint8_t *>(mapping), mappingBytes);
}

absl::StatusOr<std::unique_ptr<Dataset>> Dataset::readJsonLines(const std::string &path,
                                                                int64_t vocabSize) {
  if (vocabSize <= 0)
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": the vocabulary size must be positive, got ", vocabSize));
  absl::StatusOr<std::string> text = readWholeFile(path);
  if (!text.ok())
    return text.status();

  std::unique_ptr<Dataset> dataset(new Dataset());
  dataset->filePath = path;
  dataset->vocab = vocabSize;
  bool anyLabels = false;
  std::string_view rest(*text);
  int64_t lineNumber = 0;
  while (!rest.empty()) {
    ++lineNumber;
    size_t newline = rest.find('\n');
    std::string_view line = rest.substr(0, newline);
    rest = newline == std::string_view::npos ? std::string_view() : rest.substr(newline + 1);
    if (!line.empty() && line.back() == '\r')
      line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos)
      continue;

    auto error = [&](const std::string &what) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", lineNumber, ": ", what));
    };
    absl::StatusOr<JsonValue> record = weights::parseJson(line);
    if (!record.ok())
      return error(absl::StrCat("malformed JSON, ", record.status().message(),
                                " (expected one object per line)"));
    if (record->kind != JsonValue::Kind::Object)
      return error(absl::StrCat("expected an object {\"input_ids\": [...]}, found ",
                                std::string(weights::jsonKindName(record->kind))));
    const JsonValue *ids = record->find("input_ids");
    if (!ids)
      return error("missing \"input_ids\" (expected {\"input_ids\": [ints], \"labels\": [ints]})");
    if (ids->kind != JsonValue::Kind::Array)
      return error(absl::StrCat("\"input_ids\" is ", std::string(weights::jsonKindName(ids->kind)),
                                ", expected an array of integer token ids"));
    const JsonValue *labels = record->find("labels");
    if (labels && labels->kind == JsonValue::Kind::Null)
      labels = nullptr;
    if (labels && labels->kind != JsonValue::Kind::Array)
      return error(absl::StrCat("\"labels\" is ",
                                std::string(weights::jsonKindName(labels->kind)),
                                ", expected an array of integers"));
    if (labels && labels->array.size() != ids->array.size())
      return error(absl::StrCat("\"labels\" has ", labels->array.size(), " entries but \"input_ids\" has ",
                                ids->array.size(), "; expected one label per token"));

    dataset->documentStarts.push_back(int64_t(dataset->tokenStream.size()));
    for (size_t i = 0; i < ids->array.size(); ++i) {
      const JsonValue &id = ids->array[i];
      if (id.kind != JsonValue::Kind::Integer)
        return error(absl::StrCat("input_ids[", i, "] is ", valueText(id),
                                  ", expected an integer token id"));
      if (id.integer < 0 || id.integer >= vocabSize)
        return error(absl::StrCat("input_ids[", i, "] = ", id.integer,
                                  " is outside the vocabulary [0, ", vocabSize, ")"));
      dataset->tokenStream.push_back(id.integer);
    }
    if (labels) {
      // Labels arrive after some records already defaulted to their tokens.
      if (!anyLabels) {
        dataset->labelStream = dataset->tokenStream;
        dataset->labelStream.resize(dataset->tokenStream.size() - ids->array.size());
        anyLabels = true;
      }
      for (size_t i = 0; i < labels->array.size(); ++i) {
        const JsonValue &label = labels->array[i];
        if (label.kind != JsonValue::Kind::Integer)
          return error(absl::StrCat("labels[", i, "] is ", valueText(label),
                                    ", expected an integer (a token id or -100)"));
        if (label.integer != kIgnoreIndex && (label.integer < 0 || label.integer >= vocabSize))
          return error(absl::StrCat("labels[", i, "] = ", label.integer,
                                    " is outside the vocabulary [0, ", vocabSize,
                                    ") and is not -100"));
        dataset->labelStream.push_back(label.integer);
      }
    } else if (anyLabels) {
      dataset->labelStream.insert(dataset->labelStream.end(),
                                  dataset->tokenStream.end() - int64_t(ids->array.size()),
                                  dataset->tokenStream.end());
    }
  }
  dataset->tokenCount = int64_t(dataset->tokenStream.size());
  if (dataset->tokenCount == 0)
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": empty dataset: ", lineNumber,
        " lines and no tokens (expected records {\"input_ids\": [ints]} with at least one token)"));
  return dataset;
}

absl::StatusOr<std::unique_ptr<Dataset>>
Dataset::readTokenFile(const std::string &path, int64_t vocabSize, std::optional<int64_t> eosId) {
  if (vocabSize <= 0)
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": the vocabulary size must be positive, got ", vocabSize));
  if (eosId && (*eosId < 0 || *eosId >= vocabSize))
    return absl::InvalidArgumentError(absl::StrCat(path, ": the EOS id ", *eosId,
                                                   " is outside the vocabulary [0, ", vocabSize,
                                                   ")"));
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return systemError(path, "cannot open", errno);
  struct stat info;
  if (::fstat(fd, &info) != 0) {
    int error = errno;
    ::close(fd);
    return systemError(path, "cannot stat", error);
  }
  std::unique_ptr<Dataset> dataset(new Dataset());
  dataset->filePath = path;
  dataset->vocab = vocabSize;
  size_t size = size_t(info.st_size);
  if (size > 0) {
    void *mapped = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapped == MAP_FAILED) {
      int error = errno;
      ::close(fd);
      return systemError(path, "cannot map", error);
    }
    dataset->mapping = static_cast<const uint8_t *>(mapped);
    dataset->mappingBytes = size;
  }
  ::close(fd);

  auto error = [&](uint64_t offset, const std::string &what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": byte ", offset, ": ", what));
  };
  const uint8_t *bytes = dataset->mapping;
  if (size < kTokenFileHeaderBytes)
    return error(size, absl::StrCat("truncated token file: the header needs ",
                                    kTokenFileHeaderBytes, " bytes, the file has ", size));
  if (std::memcmp(bytes, kTokenFileMagic, 8) != 0)
    return error(0, "bad header: expected the magic \"MOETOKS1\"");
  uint32_t width = readU32(bytes + 8);
  if (width != 2 && width != 4)
    return error(8, absl::StrCat("bad header: token width ", width, ", expected 2 or 4"));
  uint32_t reserved = readU32(bytes + 12);
  if (reserved != 0)
    return error(12, absl::StrCat("bad header: reserved field is ", reserved, ", expected 0"));
  size_t payload = size - kTokenFileHeaderBytes;
  if (payload % width != 0)
    return error(size - payload % width,
                 absl::StrCat("truncated token file: ", payload % width,
                              " trailing bytes do not make a whole ", width, "-byte token"));
  dataset->tokenWidth = width;
  dataset->tokenBytes = bytes + kTokenFileHeaderBytes;
  dataset->tokenCount = int64_t(payload / width);
  if (dataset->tokenCount == 0)
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": empty dataset: the token file has a header and no tokens"));

  dataset->documentStarts.push_back(0);
  for (int64_t i = 0; i < dataset->tokenCount; ++i) {
    int64_t token = tokenAt(dataset->tokenBytes, width, i);
    if (token >= vocabSize)
      return error(kTokenFileHeaderBytes + uint64_t(i) * width,
                   absl::StrCat("token ", i, " = ", token, " is outside the vocabulary [0, ",
                                vocabSize, ")"));
    if (eosId && token == *eosId && i + 1 < dataset->tokenCount)
      dataset->documentStarts.push_back(i + 1);
  }
  return dataset;
}

absl::StatusOr<std::unique_ptr<Dataset>> Dataset::open(const std::string &path, int64_t vocabSize,
                                                       std::optional<int64_t> eosId) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return systemError(path, "cannot open", errno);
  char magic[8] = {};
  in.read(magic, sizeof magic);
  if (in.gcount() == sizeof magic && std::memcmp(magic, kTokenFileMagic, 8) == 0)
    return readTokenFile(path, vocabSize, eosId);
  return readJsonLines(path, vocabSize);
}

void Dataset::copy(int64_t start, int64_t count, int64_t *inputIds, int64_t *labels) const {
  if (tokenBytes) {
    for (int64_t i = 0; i < count; ++i)
      inputIds[i] = labels[i] = tokenAt(tokenBytes, tokenWidth, start + i);
    return;
  }
  std::memcpy(inputIds, tokenStream.data() + start, size_t(count) * sizeof(int64_t));
  const std::vector<int64_t> &source = labelStream.empty() ? tokenStream : labelStream;
  std::memcpy(labels, source.data() + start, size_t(count) * sizeof(int64_t));
}

absl::Status writeTokenFile(const std::string &path, absl::Span<const int64_t> tokens,
                            uint32_t width) {
  if (width != 2 && width != 4)
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": token width ", width, ", expected 2 or 4"));
  const int64_t limit = width == 2 ? int64_t(1) << 16 : int64_t(1) << 32;
  std::string bytes(kTokenFileMagic, 8);
  auto appendU32 = [&](uint32_t value) {
    for (int i = 0; i < 4; ++i)
      bytes += char((value >> (8 * i)) & 0xff);
  };
  appendU32(width);
  appendU32(0);
  bytes.reserve(kTokenFileHeaderBytes + tokens.size() * width);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= limit)
      return absl::InvalidArgumentError(absl::StrCat(path, ": token ", i, " = ", tokens[i],
                                                     " does not fit ", width, " bytes"));
    for (uint32_t b = 0; b < width; ++b)
      bytes += char((uint64_t(tokens[i]) >> (8 * b)) & 0xff);
  }

  std::string temporary = absl::StrCat(path, ".tmp.", getpid());
  int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return systemError(temporary, "cannot create", errno);
  const char *at = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    ssize_t written = ::write(fd, at, left);
    if (written < 0 && errno == EINTR)
      continue;
    if (written < 0) {
      int error = errno;
      ::close(fd);
      ::unlink(temporary.c_str());
      return systemError(temporary, "cannot write", error);
    }
    at += written;
    left -= size_t(written);
  }
  if (::fsync(fd) != 0) {
    int error = errno;
    ::close(fd);
    ::unlink(temporary.c_str());
    return systemError(temporary, "cannot fsync", error);
  }
  if (::close(fd) != 0) {
    int error = errno;
    ::unlink(temporary.c_str());
    return systemError(temporary, "cannot close", error);
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    int error = errno;
    ::unlink(temporary.c_str());
    return systemError(temporary, absl::StrCat("cannot rename to ", path), error);
  }
  return absl::OkStatus();
}

} // namespace moec::runtime::data
