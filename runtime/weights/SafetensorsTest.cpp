//===- SafetensorsTest.cpp - reading golden files; every safety rule -----===//
//
// The golden checkpoints must open with the facts their configs imply; each
// hand-made corrupt file must be refused with a message that names the file
// and the tensor or field at fault; and no damaged file may crash the reader.
//
//===----------------------------------------------------------------------===//

#include "runtime/weights/Safetensors.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "runtime/weights/Json.h"
#include "runtime/weights/TestSupport.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace moec::runtime::weights {
namespace {

using ::testing::AllOf;
using testing::freshTempDir;
using testing::goldenDir;
using ::testing::HasSubstr;
using testing::readFileBytes;
using testing::safetensorsBytes;
using ::testing::StartsWith;
using testing::writeFileBytes;

struct GoldenFamily {
  std::string name;
  size_t modelTensors;
  size_t adapterTensors;
};

// Counted from the files' headers when the golden set was made.
const std::vector<GoldenFamily> kFamilies = {
    {"deepseek_v3", 91, 30}, {"deepseek_v32", 149, 40}, {"kimi_linear", 151, 62},
    {"mixtral", 65, 16},     {"nemotron_h", 43, 20},    {"qwen3_moe", 69, 16},
    {"qwen3_next", 154, 26},
};

JsonValue readJsonFile(const std::string &path) {
  absl::StatusOr<JsonValue> value = parseJson(readFileBytes(path));
  EXPECT_TRUE(value.ok()) << path << ": " << value.status();
  return value.ok() ? *value : JsonValue();
}

uint64_t headerLengthOf(const std::string &path) {
  std::string bytes = readFileBytes(path);
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i)
    length = (length << 8) | uint8_t(bytes[i]);
  return length;
}

/// Checks what holds for every file the golden set was saved with.
void checkWholeFile(const SafetensorsFile &file, size_t expectedTensors) {
  EXPECT_EQ(file.tensors().size(), expectedTensors) << file.path();
  EXPECT_EQ(file.names().size(), expectedTensors);
  uint64_t total = 0;
  for (const TensorInfo &info : file.tensors()) {
    EXPECT_EQ(info.dtype, DType::F32) << info.name;
    EXPECT_EQ(file.find(info.name), &info);
    EXPECT_EQ(file.data(info).size(), uint64_t(info.numElements()) * 4);
    total += info.numBytes();
  }
  uint64_t fileBytes = std::filesystem::file_size(file.path());
  EXPECT_EQ(total, file.dataSize());
  EXPECT_EQ(file.dataSize(), fileBytes - 8 - headerLengthOf(file.path()));
  EXPECT_EQ(file.metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
}

class GoldenTest : public ::testing::TestWithParam<GoldenFamily> {};

TEST_P(GoldenTest, ModelAndAdapterOpen) {
  std::string dir = goldenDir() + "/" + GetParam().name;
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> model =
      SafetensorsFile::open(dir + "/model.safetensors");
  ASSERT_TRUE(model.ok()) << model.status();
  checkWholeFile(**model, GetParam().modelTensors);

  JsonValue config = readJsonFile(dir + "/config.json");
  int64_t hidden = config.find("hidden_size")->integer;
  const TensorInfo *embedding = (*model)->find("model.embed_tokens.weight");
  if (!embedding) // nemotron_h names it after its backbone
    embedding = (*model)->find("backbone.embeddings.weight");
  ASSERT_NE(embedding, nullptr);
  EXPECT_EQ(embedding->shape, (std::vector<int64_t>{config.find("vocab_size")->integer, hidden}));
  EXPECT_EQ((*model)->find("no.such.tensor"), nullptr);

  absl::StatusOr<std::unique_ptr<SafetensorsFile>> adapter =
      SafetensorsFile::open(dir + "/adapter/adapter_model.safetensors");
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  checkWholeFile(**adapter, GetParam().adapterTensors);
  int64_t rank = readJsonFile(dir + "/adapter/adapter_config.json").find("r")->integer;
  for (const TensorInfo &info : (*adapter)->tensors()) {
    ASSERT_EQ(info.shape.size(), 2u) << info.name;
    bool isA = info.name.find(".lora_A.weight") != std::string::npos;
    bool isB = info.name.find(".lora_B.weight") != std::string::npos;
    EXPECT_TRUE(isA != isB) << info.name;
    EXPECT_EQ(isA ? info.shape[0] : info.shape[1], rank) << info.name;
    EXPECT_EQ(info.name.rfind("base_model.model.", 0), 0u) << info.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, GoldenTest, ::testing::ValuesIn(kFamilies),
                         [](const auto &info) { return info.param.name; });

TEST(GoldenTest, Qwen3MoeValues) {
  std::string dir = goldenDir() + "/qwen3_moe";
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> model =
      SafetensorsFile::open(dir + "/model.safetensors");
  ASSERT_TRUE(model.ok()) << model.status();
  JsonValue config = readJsonFile(dir + "/config.json");
  int64_t hidden = config.find("hidden_size")->integer;
  int64_t experts = config.find("num_local_experts")->integer;
  int64_t moeWidth = config.find("moe_intermediate_size")->integer;
  for (int64_t layer = 0; layer < config.find("num_hidden_layers")->integer; ++layer) {
    std::string prefix = "model.layers." + std::to_string(layer) + ".mlp.";
    const TensorInfo *router = (*model)->find(prefix + "gate.weight");
    ASSERT_NE(router, nullptr);
    EXPECT_EQ(router->shape, (std::vector<int64_t>{experts, hidden}));
    for (int64_t e = 0; e < experts; ++e) {
      const TensorInfo *down =
          (*model)->find(prefix + "experts." + std::to_string(e) + ".down_proj.weight");
      ASSERT_NE(down, nullptr);
      EXPECT_EQ(down->shape, (std::vector<int64_t>{hidden, moeWidth}));
    }
  }
  // RMSNorm weights start at one; the router was re-drawn from N(0, 0.5).
  const TensorInfo *norm = (*model)->find("model.norm.weight");
  ASSERT_NE(norm, nullptr);
  const float *ones = reinterpret_cast<const float *>((*model)->data(*norm).data());
  for (int64_t i = 0; i < norm->numElements(); ++i)
    EXPECT_EQ(ones[i], 1.0f);
  const TensorInfo *router = (*model)->find("model.layers.0.mlp.gate.weight");
  const float *weights = reinterpret_cast<const float *>((*model)->data(*router).data());
  double sumSquares = 0;
  for (int64_t i = 0; i < router->numElements(); ++i)
    sumSquares += double(weights[i]) * weights[i];
  EXPECT_NEAR(std::sqrt(sumSquares / double(router->numElements())), 0.5, 0.1);

  // The golden outputs hold I64 inputs and no metadata.
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> golden =
      SafetensorsFile::open(dir + "/golden.safetensors");
  ASSERT_TRUE(golden.ok()) << golden.status();
  EXPECT_TRUE((*golden)->metadata().empty());
  const TensorInfo *ids = (*golden)->find("input_ids");
  ASSERT_NE(ids, nullptr);
  EXPECT_EQ(ids->dtype, DType::I64);
  absl::Span<const uint8_t> idBytes = (*golden)->data(*ids);
  int64_t vocab = config.find("vocab_size")->integer;
  for (size_t i = 0; i < idBytes.size(); i += 8) {
    int64_t id;
    std::memcpy(&id, idBytes.data() + i, 8);
    EXPECT_TRUE(id >= 0 && id < vocab) << id;
  }
}

// --- Safety rules: one hand-made file each. ---

class CorruptFileTest : public ::testing::Test {
protected:
  /// Writes `bytes` to a file and returns the error from opening it.
  std::string openError(std::string_view bytes) {
    std::string path = freshTempDir() + "/corrupt.safetensors";
    writeFileBytes(path, bytes);
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::open(path);
    EXPECT_FALSE(file.ok()) << "accepted a corrupt file";
    if (file.ok())
      return "";
    EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument) << file.status();
    std::string message(file.status().message());
    EXPECT_THAT(message, StartsWith(path + ": "));
    return message;
  }
};

const std::string k16Bytes(16, '\x01');

TEST_F(CorruptFileTest, FileShorterThanTheLengthField) {
  EXPECT_THAT(openError("abc"), HasSubstr("fewer than the 8-byte header length"));
}

TEST_F(CorruptFileTest, HeaderLengthOverTheLimit) {
  EXPECT_THAT(openError(safetensorsBytes(100'000'001, "{}", "")),
              HasSubstr("header length 100000001 exceeds the limit of 100000000 bytes"));
  EXPECT_THAT(openError(safetensorsBytes(~uint64_t(0), "{}", "")), HasSubstr("exceeds the limit"));
}

TEST_F(CorruptFileTest, HeaderLongerThanTheFile) {
  EXPECT_THAT(openError(safetensorsBytes(1000, "{}", "")),
              HasSubstr("header length 1000 does not fit in the file (10 bytes)"));
}

TEST_F(CorruptFileTest, TruncatedHeader) {
  std::string header = R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  EXPECT_THAT(openError(safetensorsBytes(header.substr(0, 30), "")),
              AllOf(HasSubstr("header is not valid JSON"), HasSubstr("at byte 30")));
}

TEST_F(CorruptFileTest, HeaderNotAnObject) {
  EXPECT_THAT(openError(safetensorsBytes("[1, 2]  ", "")),
              HasSubstr("header must be a JSON object, found an array"));
  EXPECT_THAT(openError(safetensorsBytes("", "")), HasSubstr("header is not valid JSON"));
}

TEST_F(CorruptFileTest, HeaderNotUtf8) {
  EXPECT_THAT(openError(safetensorsBytes("{\"w\xff\":{}}", "")), HasSubstr("invalid UTF-8"));
}

TEST_F(CorruptFileTest, DuplicateTensorName) {
  std::string header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})";
  EXPECT_THAT(openError(safetensorsBytes(header, k16Bytes)), HasSubstr("duplicate key \"w\""));
}

TEST_F(CorruptFileTest, EntryNotAnObject) {
  EXPECT_THAT(openError(safetensorsBytes(R"({"w":[1]})", "")),
              HasSubstr("tensor 'w': entry must be an object, found an array"));
}

TEST_F(CorruptFileTest, MissingFields) {
  EXPECT_THAT(openError(safetensorsBytes(R"({"w":{"shape":[4],"data_offsets":[0,16]}})", k16Bytes)),
              HasSubstr("tensor 'w': missing field \"dtype\""));
  EXPECT_THAT(
      openError(safetensorsBytes(R"({"w":{"dtype":"F32","data_offsets":[0,16]}})", k16Bytes)),
      HasSubstr("tensor 'w': missing field \"shape\""));
  EXPECT_THAT(openError(safetensorsBytes(R"({"w":{"dtype":"F32","shape":[4]}})", k16Bytes)),
              HasSubstr("tensor 'w': missing field \"data_offsets\""));
}

TEST_F(CorruptFileTest, UnknownField) {
  std::string header = R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16],"x":1}})";
  EXPECT_THAT(openError(safetensorsBytes(header, k16Bytes)),
              HasSubstr("tensor 'w': unknown field \"x\""));
}

TEST_F(CorruptFileTest, FieldsOfTheWrongType) {
  EXPECT_THAT(openError(safetensorsBytes(R"({"w":{"dtype":4,"shape":[4],"data_offsets":[0,16]}})",
                                         k16Bytes)),
              HasSubstr("tensor 'w': dtype must be a string, found an integer"));
  EXPECT_THAT(openError(safetensorsBytes(
                  R"({"w":{"dtype":"F32","shape":"4","data_offsets":[0,16]}})", k16Bytes)),
              HasSubstr("tensor 'w': shape must be an array, found a string"));
  EXPECT_THAT(openError(safetensorsBytes(
                  R"({"w":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", k16Bytes)),
              HasSubstr("tensor 'w': shape must hold non-negative integers, found an integer -4"));
  EXPECT_THAT(openError(safetensorsBytes(
                  R"({"w":{"dtype":"F32","shape":[4.0],"data_offsets":[0,16]}})", k16Bytes)),
              HasSubstr("tensor 'w': shape must hold non-negative integers"));
  EXPECT_THAT(openError(safetensorsBytes(
                  R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16,16]}})", k16Bytes)),
              HasSubstr("tensor 'w': data_offsets must be an array of two integers"));
  EXPECT_THAT(openError(safetensorsBytes(
                  R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[null,16]}})", k16Bytes)),
              HasSubstr("tensor 'w': data_offsets must hold non-negative integers, found null"));
}

TEST_F(CorruptFileTest, UnknownDtype) {
  std::string header = R"({"w":{"dtype":"F99","shape":[4],"data_offsets":[0,16]}})";
  EXPECT_THAT(openError(safetensorsBytes(header, k16Bytes)),
              HasSubstr("tensor 'w': unknown or unsupported dtype \"F99\""));
}

TEST_F(CorruptFileTest, BeginAfterEnd) {
  std::string header = R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[16,0]}})";
  EXPECT_THAT(openError(safetensorsBytes(header, k16Bytes)),
              HasSubstr("tensor 'w': data_offsets [16, 0] has begin after end"));
}

TEST_F(CorruptFileTest, OffsetsOutsideTheFile) {
  std::string header = R"({"w":{"dtype":"F32","shape":[16],"data_offsets":[0,64]}})";
  EXPECT_THAT(
      openError(safetensorsBytes(header, k16Bytes)),
      HasSubstr("tensor 'w': data_offsets [0, 64] extend past the data section (16 bytes)"));
}

TEST_F(CorruptFileTest, ShapeDisagreesWithSize) {
  std::string header = R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})";
  EXPECT_THAT(
      openError(safetensorsBytes(header, k16Bytes)),
      HasSubstr("tensor 'w': shape [3] of F32 needs 12 bytes but data_offsets [0, 16] span 16"));
  std::string bf16 = R"({"w":{"dtype":"BF16","shape":[4],"data_offsets":[0,16]}})";
  EXPECT_THAT(openError(safetensorsBytes(bf16, k16Bytes)), HasSubstr("needs 8 bytes"));
}

TEST_F(CorruptFileTest, ElementCountOverflows) {
  std::string header =
      R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]}})";
  EXPECT_THAT(openError(safetensorsBytes(header, k16Bytes)),
              HasSubstr("tensor 'w': shape [4294967296, 4294967296] has too many elements"));
}

TEST_F(CorruptFileTest, OverlappingTensors) {
  std::string header = R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                       R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})";
  EXPECT_THAT(openError(safetensorsBytes(header, std::string(24, '\0'))),
              HasSubstr("tensors 'a' (bytes 0..16) and 'b' (bytes 8..24) overlap"));
}

TEST_F(CorruptFileTest, HoleBetweenTensors) {
  std::string header = R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                       R"("b":{"dtype":"F32","shape":[4],"data_offsets":[24,40]}})";
  EXPECT_THAT(openError(safetensorsBytes(header, std::string(40, '\0'))),
              HasSubstr("bytes 16..24 of the data section belong to no tensor (a hole before "
                        "tensor 'b')"));
}

TEST_F(CorruptFileTest, BytesAfterTheLastTensor) {
  std::string header = R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  EXPECT_THAT(openError(safetensorsBytes(header, std::string(20, '\0'))),
              HasSubstr("bytes 16..20 at the end of the data section belong to no tensor"));
}

TEST_F(CorruptFileTest, MetadataMustBeStrings) {
  EXPECT_THAT(openError(safetensorsBytes(R"({"__metadata__":{"step":3}})", "")),
              HasSubstr("__metadata__ entry \"step\" must be a string, found an integer"));
  EXPECT_THAT(openError(safetensorsBytes(R"({"__metadata__":"pt"})", "")),
              HasSubstr("__metadata__ must be an object of strings, found a string"));
}

TEST(SafetensorsFileTest, MissingFileIsNotFound) {
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
      SafetensorsFile::open(freshTempDir() + "/absent.safetensors");
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(file.status().message()), HasSubstr("absent.safetensors: cannot open"));
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> directory =
      SafetensorsFile::open(freshTempDir());
  ASSERT_FALSE(directory.ok());
  EXPECT_THAT(std::string(directory.status().message()), HasSubstr("not a regular file"));
}

TEST(SafetensorsFileTest, EdgeCasesThatAreValid) {
  std::string dir = freshTempDir();
  // No tensors at all; a scalar; a zero-sized tensor sharing an offset; padding spaces.
  writeFileBytes(dir + "/empty.safetensors", safetensorsBytes("{}      ", ""));
  std::string header = R"({"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},)"
                       R"("z":{"dtype":"BF16","shape":[0,3],"data_offsets":[4,4]},)"
                       R"("i":{"dtype":"I64","shape":[1],"data_offsets":[4,12]}}   )";
  std::string data = std::string("\x00\x00\x80\x3f", 4) + std::string("\x07\0\0\0\0\0\0\0", 8);
  writeFileBytes(dir + "/edge.safetensors", safetensorsBytes(header, data));

  absl::StatusOr<std::unique_ptr<SafetensorsFile>> empty =
      SafetensorsFile::open(dir + "/empty.safetensors");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE((*empty)->tensors().empty());
  EXPECT_EQ((*empty)->dataSize(), 0u);

  absl::StatusOr<std::unique_ptr<SafetensorsFile>> edge =
      SafetensorsFile::open(dir + "/edge.safetensors");
  ASSERT_TRUE(edge.ok()) << edge.status();
  EXPECT_EQ((*edge)->names(), (std::vector<std::string>{"i", "s", "z"}));
  const TensorInfo *scalar = (*edge)->find("s");
  EXPECT_EQ(scalar->numElements(), 1);
  float one;
  std::memcpy(&one, (*edge)->data(*scalar).data(), 4);
  EXPECT_EQ(one, 1.0f);
  EXPECT_EQ((*edge)->find("z")->numElements(), 0);
  EXPECT_EQ((*edge)->data(*(*edge)->find("z")).size(), 0u);
  EXPECT_EQ((*edge)->data(*(*edge)->find("i"))[0], 7);
}

/// Every truncation and many single-byte corruptions of a valid file must be
/// either accepted or refused, never crash or read out of bounds.
TEST(SafetensorsFileTest, DamagedFilesNeverCrash) {
  std::string dir = freshTempDir();
  std::string header =
      R"({"__metadata__":{"k":"v"},"a":{"dtype":"F16","shape":[2,2],)"
      R"("data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})";
  std::string good = safetensorsBytes(header, std::string(16, '\x11'));
  std::string path = dir + "/damaged.safetensors";
  writeFileBytes(path, good);
  ASSERT_TRUE(SafetensorsFile::open(path).ok());
  for (size_t length = 0; length < good.size(); ++length) {
    writeFileBytes(path, good.substr(0, length));
    EXPECT_FALSE(SafetensorsFile::open(path).ok()) << "truncated to " << length;
  }
  for (size_t at = 0; at < 8 + header.size(); ++at) {
    for (char replacement : {'\0', '"', '{', ']', '9', '-', '\xff', ' '}) {
      std::string bad = good;
      bad[at] = replacement;
      writeFileBytes(path, bad);
      absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::open(path);
      if (!file.ok())
        continue;
      for (const TensorInfo &info : (*file)->tensors())
        EXPECT_LE(info.end, (*file)->dataSize());
    }
  }
}

} // namespace
} // namespace moec::runtime::weights
