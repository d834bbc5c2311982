//===- SafetensorsWriterTest.cpp - round trips, golden rewrites, atomicity ===//

#include "runtime/weights/SafetensorsWriter.h"

#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "runtime/weights/Safetensors.h"
#include "runtime/weights/TestSupport.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace moec::runtime::weights {
namespace {

using testing::freshTempDir;
using testing::goldenDir;
using ::testing::HasSubstr;
using testing::readFileBytes;
using testing::writeFileBytes;

std::vector<std::string> filesIn(const std::string &dir) {
  std::vector<std::string> names;
  for (const auto &entry : std::filesystem::directory_iterator(dir))
    names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(SafetensorsWriterTest, RoundTripWithMetadata) {
  std::vector<float> f32 = {1.0f, -2.0f, 0.5f, 3.25f, 0.0f, -0.0f};
  std::vector<uint16_t> bf16 = {f32ToBf16(1.0f), f32ToBf16(-3.0f), f32ToBf16(0.1f)};
  std::vector<uint16_t> f16 = {f32ToF16(1.0f), f32ToF16(65504.0f), f32ToF16(0x1p-24f),
                               f32ToF16(-0.5f), 0x7c00};
  std::vector<int64_t> i64 = {-1, 1ll << 40};

  SafetensorsWriter writer;
  ASSERT_TRUE(writer.setMetadata("format", "pt").ok());
  ASSERT_TRUE(writer.setMetadata("note", "quote \" and newline \n and é").ok());
  ASSERT_TRUE(writer.add("w.f16", DType::F16, {5}, f16.data(), 10).ok());
  ASSERT_TRUE(writer.add("w.f32", DType::F32, {2, 3}, f32.data(), 24).ok());
  ASSERT_TRUE(writer.add("w.bf16", DType::BF16, {3, 1}, bf16.data(), 6).ok());
  ASSERT_TRUE(writer.add("ids", DType::I64, {2}, i64.data(), 16).ok());
  ASSERT_TRUE(writer.add("empty", DType::F32, {0, 4}, nullptr, 0).ok());
  ASSERT_TRUE(writer.add("odd \"name\"\t", DType::U8, {}, "\x2a", 1).ok());

  std::string path = freshTempDir() + "/round.safetensors";
  ASSERT_TRUE(writer.write(path).ok());
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status();

  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  EXPECT_EQ((*file)->metadata().at("note"), "quote \" and newline \n and é");
  auto check = [&](const std::string &name, DType dtype, std::vector<int64_t> shape,
                   const void *bytes, size_t size) {
    const TensorInfo *info = (*file)->find(name);
    ASSERT_NE(info, nullptr) << name;
    EXPECT_EQ(info->dtype, dtype) << name;
    EXPECT_EQ(info->shape, shape) << name;
    absl::Span<const uint8_t> data = (*file)->data(*info);
    ASSERT_EQ(data.size(), size) << name;
    if (size) {
      EXPECT_EQ(std::memcmp(data.data(), bytes, size), 0) << name;
    }
    // Largest elements first keeps every tensor naturally aligned.
    EXPECT_EQ(info->begin % dtypeSize(dtype), 0u) << name;
  };
  check("w.f16", DType::F16, {5}, f16.data(), 10);
  check("w.f32", DType::F32, {2, 3}, f32.data(), 24);
  check("w.bf16", DType::BF16, {3, 1}, bf16.data(), 6);
  check("ids", DType::I64, {2}, i64.data(), 16);
  check("empty", DType::F32, {0, 4}, nullptr, 0);
  check("odd \"name\"\t", DType::U8, {}, "\x2a", 1);

  std::string header = writer.header();
  EXPECT_EQ(header.size() % 8, 0u);
  EXPECT_EQ(header.rfind("{\"__metadata__\":{\"format\":\"pt\",\"note\":", 0), 0u) << header;
  // Order: I64, then F32 by name, then the two-byte dtypes by name, then U8.
  std::vector<size_t> at;
  for (const char *name :
       {"\"ids\"", "\"empty\"", "\"w.f32\"", "\"w.bf16\"", "\"w.f16\"", "\"odd \\\"name\\\"\\t\""})
    at.push_back(header.find(name));
  EXPECT_TRUE(std::is_sorted(at.begin(), at.end())) << header;
  EXPECT_EQ(readFileBytes(path).substr(8, header.size()), header);
  EXPECT_EQ(filesIn(std::filesystem::path(path).parent_path()),
            (std::vector<std::string>{"round.safetensors"}));
}

TEST(SafetensorsWriterTest, NoMetadataNoTensors) {
  SafetensorsWriter writer;
  EXPECT_EQ(writer.header(), "{}      ");
  std::string path = freshTempDir() + "/empty.safetensors";
  ASSERT_TRUE(writer.write(path).ok());
  EXPECT_EQ(readFileBytes(path), std::string("\x08\0\0\0\0\0\0\0{}      ", 16));
  EXPECT_TRUE(SafetensorsFile::open(path).ok());
}

/// Reading a golden file and writing its tensors back must reproduce it byte
/// for byte: same names, dtypes, shapes, data, metadata and header layout.
TEST(SafetensorsWriterTest, RewritesGoldenFilesByteIdentically) {
  std::string out = freshTempDir();
  for (const char *family : {"deepseek_v3", "deepseek_v32", "kimi_linear", "mixtral", "nemotron_h",
                             "qwen3_moe", "qwen3_next"}) {
    for (const char *file : {"adapter/adapter_model.safetensors", "model.safetensors"}) {
      std::string source = goldenDir() + "/" + family + "/" + file;
      absl::StatusOr<std::unique_ptr<SafetensorsFile>> input = SafetensorsFile::open(source);
      ASSERT_TRUE(input.ok()) << input.status();
      SafetensorsWriter writer;
      for (const auto &[key, value] : (*input)->metadata())
        ASSERT_TRUE(writer.setMetadata(key, value).ok());
      // Added in reverse to show that the writer, not the caller, fixes the order.
      for (auto it = (*input)->tensors().rbegin(); it != (*input)->tensors().rend(); ++it) {
        absl::Span<const uint8_t> data = (*input)->data(*it);
        ASSERT_TRUE(writer.add(it->name, it->dtype, it->shape, data.data(), data.size()).ok());
      }
      std::string copy = out + "/" + family + ".safetensors";
      ASSERT_TRUE(writer.write(copy).ok());
      EXPECT_TRUE(readFileBytes(copy) == readFileBytes(source)) << source << " differs";
    }
  }
}

TEST(SafetensorsWriterTest, AddRejectsBadTensors) {
  SafetensorsWriter writer;
  float data[4] = {};
  ASSERT_TRUE(writer.add("w", DType::F32, {4}, data, 16).ok());
  auto error = [&](std::string name, DType dtype, std::vector<int64_t> shape, size_t bytes) {
    absl::Status status = writer.add(name, dtype, shape, data, bytes);
    EXPECT_FALSE(status.ok()) << name;
    return std::string(status.message());
  };
  EXPECT_THAT(error("w", DType::F32, {4}, 16), HasSubstr("tensor 'w': added twice"));
  EXPECT_THAT(error("x", DType::F32, {3}, 16),
              HasSubstr("tensor 'x': shape [3] of F32 needs 12 bytes, got 16"));
  EXPECT_THAT(error("y", DType::F32, {-1}, 0), HasSubstr("tensor 'y': negative extent"));
  EXPECT_THAT(error("__metadata__", DType::F32, {4}, 16), HasSubstr("reserved"));
  EXPECT_THAT(error("", DType::F32, {4}, 16), HasSubstr("reserved or empty"));
  EXPECT_THAT(error("bad\xff", DType::F32, {4}, 16), HasSubstr("not valid UTF-8"));
  EXPECT_THAT(error("z", DType::F32, {1ll << 62, 8}, 16), HasSubstr("too many elements"));
  EXPECT_FALSE(writer.setMetadata("k", "\xc3").ok());
}

TEST(SafetensorsWriterTest, ReplacesAnExistingFile) {
  std::string path = freshTempDir() + "/model.safetensors";
  writeFileBytes(path, "old contents");
  float value = 2.0f;
  SafetensorsWriter writer;
  ASSERT_TRUE(writer.add("v", DType::F32, {1}, &value, 4).ok());
  ASSERT_TRUE(writer.write(path).ok());
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_NE((*file)->find("v"), nullptr);
}

TEST(SafetensorsWriterTest, FailedRenameLeavesNoTemporaryFile) {
  std::string dir = freshTempDir();
  std::string target = dir + "/occupied";
  std::filesystem::create_directories(target + "/child"); // rename cannot replace it
  SafetensorsWriter writer;
  absl::Status status = writer.write(target);
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr("cannot rename to " + target));
  EXPECT_EQ(filesIn(dir), (std::vector<std::string>{"occupied"}));
  EXPECT_TRUE(std::filesystem::is_directory(target + "/child"));
}

TEST(SafetensorsWriterTest, MissingDirectoryIsAnError) {
  SafetensorsWriter writer;
  absl::Status status = writer.write(freshTempDir() + "/no/such/dir/x.safetensors");
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr("cannot create"));
}

/// A write that fails halfway (here: the file size limit) keeps the old file
/// and removes the temporary one.
TEST(SafetensorsWriterTest, FailedWriteKeepsTheOldFile) {
  std::string dir = freshTempDir();
  std::string path = dir + "/adapter_model.safetensors";
  writeFileBytes(path, "previous adapter");

  std::vector<float> big(1 << 16, 1.0f);
  SafetensorsWriter writer;
  ASSERT_TRUE(
      writer.add("big", DType::F32, {int64_t(big.size())}, big.data(), big.size() * 4).ok());

  struct rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  struct rlimit small = saved;
  small.rlim_cur = 4096;
  sighandler_t previous = signal(SIGXFSZ, SIG_IGN); // get EFBIG instead of a signal
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  absl::Status status = writer.write(path);
  setrlimit(RLIMIT_FSIZE, &saved);
  signal(SIGXFSZ, previous);

  ASSERT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr("cannot write"));
  EXPECT_EQ(readFileBytes(path), "previous adapter");
  EXPECT_EQ(filesIn(dir), (std::vector<std::string>{"adapter_model.safetensors"}));
}

} // namespace
} // namespace moec::runtime::weights
