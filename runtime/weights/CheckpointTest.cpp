//===- CheckpointTest.cpp - sharded indexes, conversion, slices, experts --===//

#include "runtime/weights/Checkpoint.h"

#include <cstring>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "runtime/weights/SafetensorsWriter.h"
#include "runtime/weights/TestSupport.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace moec::runtime::weights {
namespace {

using ::testing::AllOf;
using testing::freshTempDir;
using testing::goldenDir;
using ::testing::HasSubstr;
using testing::writeFileBytes;

std::string messageOf(const absl::Status &status) {
  EXPECT_FALSE(status.ok());
  return std::string(status.message());
}

/// Splits the qwen3_moe golden model into two shards plus an index in `dir`.
void writeShardedQwen(const std::string &dir, const std::string &extraIndexEntries = "") {
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> model =
      SafetensorsFile::open(goldenDir() + "/qwen3_moe/model.safetensors");
  ASSERT_TRUE(model.ok()) << model.status();
  SafetensorsWriter shards[2];
  std::string weightMap;
  for (size_t i = 0; i < (*model)->tensors().size(); ++i) {
    const TensorInfo &info = (*model)->tensors()[i];
    size_t shard = info.name.find("layers.1.") != std::string::npos ? 1 : 0;
    absl::Span<const uint8_t> data = (*model)->data(info);
    ASSERT_TRUE(
        shards[shard].add(info.name, info.dtype, info.shape, data.data(), data.size()).ok());
    weightMap += std::string(i ? ",\n" : "") + "\"" + info.name + "\": \"model-0000" +
                 std::to_string(shard + 1) + "-of-00002.safetensors\"";
  }
  ASSERT_TRUE(shards[0].write(dir + "/model-00001-of-00002.safetensors").ok());
  ASSERT_TRUE(shards[1].write(dir + "/model-00002-of-00002.safetensors").ok());
  writeFileBytes(dir + "/model.safetensors.index.json",
                 "{\"metadata\": {\"total_size\": 628224},\n\"weight_map\": {\n" +
                     extraIndexEntries + weightMap + "}}\n");
}

TEST(CheckpointTest, SingleFileFromDirectory) {
  absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint =
      Checkpoint::open(goldenDir() + "/qwen3_moe");
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_FALSE((*checkpoint)->isSharded());
  EXPECT_THAT((*checkpoint)->path(), HasSubstr("qwen3_moe/model.safetensors"));
  EXPECT_EQ((*checkpoint)->names().size(), 69u);
  EXPECT_TRUE((*checkpoint)->contains("lm_head.weight"));

  std::vector<float> embedding;
  ASSERT_TRUE((*checkpoint)->readAsF32("model.embed_tokens.weight", embedding).ok());
  EXPECT_EQ(embedding.size(), 256u * 64u);
  absl::StatusOr<TensorRef> ref = (*checkpoint)->lookup("model.embed_tokens.weight");
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ(std::memcmp(embedding.data(), ref->file->data(*ref->info).data(), 256 * 64 * 4), 0);
}

TEST(CheckpointTest, ShardedMatchesSingleFile) {
  std::string dir = freshTempDir();
  writeShardedQwen(dir);
  absl::StatusOr<std::unique_ptr<Checkpoint>> single =
      Checkpoint::open(goldenDir() + "/qwen3_moe/model.safetensors");
  ASSERT_TRUE(single.ok()) << single.status();
  for (ShardLoading loading : {ShardLoading::Lazy, ShardLoading::Eager}) {
    absl::StatusOr<std::unique_ptr<Checkpoint>> sharded = Checkpoint::open(dir, loading);
    ASSERT_TRUE(sharded.ok()) << sharded.status();
    EXPECT_TRUE((*sharded)->isSharded());
    EXPECT_EQ((*sharded)->path(), dir + "/model.safetensors.index.json");
    ASSERT_EQ((*sharded)->names(), (*single)->names());
    for (const std::string &name : (*single)->names()) {
      std::vector<float> expected, actual;
      ASSERT_TRUE((*single)->readAsF32(name, expected).ok());
      ASSERT_TRUE((*sharded)->readAsF32(name, actual).ok()) << name;
      EXPECT_EQ(actual, expected) << name;
    }
    absl::StatusOr<TensorRef> ref = (*sharded)->lookup("model.layers.1.mlp.gate.weight");
    ASSERT_TRUE(ref.ok());
    EXPECT_THAT(ref->file->path(), HasSubstr("model-00002-of-00002.safetensors"));
  }
}

TEST(CheckpointTest, MissingShard) {
  std::string dir = freshTempDir();
  writeShardedQwen(dir);
  std::filesystem::remove(dir + "/model-00002-of-00002.safetensors");

  absl::StatusOr<std::unique_ptr<Checkpoint>> eager = Checkpoint::open(dir, ShardLoading::Eager);
  ASSERT_FALSE(eager.ok());
  EXPECT_EQ(eager.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(messageOf(eager.status()),
              AllOf(HasSubstr("model-00002-of-00002.safetensors: cannot open"),
                    HasSubstr("a shard listed in " + dir + "/model.safetensors.index.json")));

  // Lazily, the first shard still serves its tensors; the second fails when needed.
  absl::StatusOr<std::unique_ptr<Checkpoint>> lazy = Checkpoint::open(dir);
  ASSERT_TRUE(lazy.ok()) << lazy.status();
  std::vector<float> values;
  EXPECT_TRUE((*lazy)->readAsF32("model.layers.0.mlp.gate.weight", values).ok());
  EXPECT_THAT(messageOf((*lazy)->readAsF32("model.layers.1.mlp.gate.weight", values)),
              HasSubstr("model-00002-of-00002.safetensors: cannot open"));
}

TEST(CheckpointTest, TensorMissingFromItsShard) {
  std::string dir = freshTempDir();
  writeShardedQwen(dir, "\"model.extra.weight\": \"model-00002-of-00002.safetensors\",\n");
  absl::StatusOr<std::unique_ptr<Checkpoint>> eager = Checkpoint::open(dir, ShardLoading::Eager);
  ASSERT_FALSE(eager.ok());
  EXPECT_THAT(messageOf(eager.status()),
              HasSubstr("model.safetensors.index.json: tensor 'model.extra.weight' is mapped to " +
                        dir + "/model-00002-of-00002.safetensors, which has no such tensor"));
  absl::StatusOr<std::unique_ptr<Checkpoint>> lazy = Checkpoint::open(dir);
  ASSERT_TRUE(lazy.ok());
  std::vector<float> values;
  EXPECT_THAT(messageOf((*lazy)->readAsF32("model.layers.1.mlp.gate.weight", values)),
              HasSubstr("tensor 'model.extra.weight' is mapped to"));
}

TEST(CheckpointTest, BadIndexes) {
  std::string dir = freshTempDir();
  auto indexError = [&](const std::string &text) {
    writeFileBytes(dir + "/model.safetensors.index.json", text);
    absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::open(dir);
    EXPECT_FALSE(checkpoint.ok()) << text;
    return checkpoint.ok() ? "" : std::string(checkpoint.status().message());
  };
  EXPECT_THAT(indexError("{\"metadata\": {}}"), HasSubstr("index.json: missing \"weight_map\""));
  EXPECT_THAT(indexError("[]"), HasSubstr("must be a JSON object"));
  EXPECT_THAT(indexError("{\"weight_map\": {\"a\": 1}}"),
              HasSubstr("weight_map entry for tensor 'a' must be a file name"));
  EXPECT_THAT(indexError("{\"weight_map\": {\"a\": \"../x.safetensors\"}}"),
              HasSubstr("shard \"../x.safetensors\" is not a relative path"));
  EXPECT_THAT(indexError("{\"weight_map\": {\"a\": \"/etc/x.safetensors\"}}"),
              HasSubstr("is not a relative path"));
  EXPECT_THAT(indexError("{\"weight_map\": {}, \"metadata\": []}"),
              HasSubstr("\"metadata\" must be an object"));
  EXPECT_THAT(indexError("{\"weight_map\": {\"a\": \"x\", \"a\": \"y\"}}"),
              HasSubstr("duplicate key \"a\""));

  std::string empty = freshTempDir() + "/nothing";
  std::filesystem::create_directories(empty);
  absl::StatusOr<std::unique_ptr<Checkpoint>> none = Checkpoint::open(empty);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(messageOf(none.status()),
              HasSubstr("holds neither model.safetensors nor model.safetensors.index.json"));
}

/// A small checkpoint with known values for conversions, slices and experts.
class SyntheticTest : public ::testing::Test {
protected:
  void SetUp() override {
    path = freshTempDir() + "/synthetic.safetensors";
    cube.resize(4 * 5 * 6);
    std::iota(cube.begin(), cube.end(), 0.0f);
    for (float value : {1.0f, -2.5f, 0.1f, 1e-6f})
      bf16.push_back(f32ToBf16(value));
    for (float value : {1.0f, 65504.0f, 0x1p-24f, -0.25f})
      f16.push_back(f32ToF16(value));
    for (int e = 0; e < 4; ++e)
      for (int i = 0; i < 6; ++i)
        experts.push_back(100.0f * e + i);
    SafetensorsWriter writer;
    ASSERT_TRUE(writer.add("cube", DType::F32, {4, 5, 6}, cube.data(), cube.size() * 4).ok());
    ASSERT_TRUE(writer.add("b", DType::BF16, {2, 2}, bf16.data(), 8).ok());
    ASSERT_TRUE(writer.add("h", DType::F16, {4}, f16.data(), 8).ok());
    ASSERT_TRUE(writer.add("ids", DType::I64, {1}, &id, 8).ok());
    for (int e = 0; e < 4; ++e)
      ASSERT_TRUE(writer
                      .add("layers.0.experts." + std::to_string(e) + ".w", DType::F32, {2, 3},
                           experts.data() + 6 * e, 24)
                      .ok());
    ASSERT_TRUE(writer.add("layers.1.experts.0.w", DType::F32, {2, 3}, experts.data(), 24).ok());
    ASSERT_TRUE(writer.add("layers.1.experts.1.w", DType::F32, {3, 2}, experts.data(), 24).ok());
    ASSERT_TRUE(writer.write(path).ok());
    absl::StatusOr<std::unique_ptr<Checkpoint>> opened = Checkpoint::open(path);
    ASSERT_TRUE(opened.ok()) << opened.status();
    checkpoint = std::move(*opened);
  }

  float cubeAt(int64_t i, int64_t j, int64_t k) const { return cube[(i * 5 + j) * 6 + k]; }

  std::string path;
  std::vector<float> cube, experts;
  std::vector<uint16_t> bf16, f16;
  int64_t id = 42;
  std::unique_ptr<Checkpoint> checkpoint;
};

TEST_F(SyntheticTest, Conversions) {
  std::vector<float> asF32(4);
  ASSERT_TRUE(checkpoint->read("b", DType::F32, asF32.data(), 16).ok());
  for (size_t i = 0; i < 4; ++i)
    EXPECT_EQ(asF32[i], bf16ToF32(bf16[i]));
  ASSERT_TRUE(checkpoint->read("h", DType::F32, asF32.data(), 16).ok());
  EXPECT_EQ(asF32, (std::vector<float>{1.0f, 65504.0f, 0x1p-24f, -0.25f}));

  std::vector<uint16_t> narrow(4);
  ASSERT_TRUE(checkpoint->read("h", DType::BF16, narrow.data(), 8).ok());
  for (size_t i = 0; i < 4; ++i)
    EXPECT_EQ(narrow[i], f32ToBf16(f16ToF32(f16[i])));
  ASSERT_TRUE(checkpoint->read("b", DType::BF16, narrow.data(), 8).ok());
  EXPECT_EQ(narrow, bf16);

  std::vector<uint16_t> cubeBf16(cube.size());
  ASSERT_TRUE(checkpoint->read("cube", DType::BF16, cubeBf16.data(), cube.size() * 2).ok());
  for (size_t i = 0; i < cube.size(); ++i)
    EXPECT_EQ(cubeBf16[i], f32ToBf16(cube[i]));

  int64_t readId = 0;
  ASSERT_TRUE(checkpoint->read("ids", DType::I64, &readId, 8).ok());
  EXPECT_EQ(readId, 42);
  EXPECT_THAT(messageOf(checkpoint->read("ids", DType::F32, asF32.data(), 4)),
              HasSubstr(path + ": tensor 'ids': stored as I64, cannot be read as F32"));
}

TEST_F(SyntheticTest, ErrorsNameTensorAndFile) {
  std::vector<float> out(120);
  absl::Status missing = checkpoint->read("nope", DType::F32, out.data(), 4);
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(messageOf(missing), HasSubstr(path + ": no tensor 'nope'"));
  EXPECT_THAT(messageOf(checkpoint->readInto("cube", {4, 6, 5}, DType::F32, out.data(), 480)),
              HasSubstr(path + ": tensor 'cube' has shape [4, 5, 6], expected [4, 6, 5]"));
  EXPECT_TRUE(checkpoint->readInto("cube", {4, 5, 6}, DType::F32, out.data(), 480).ok());
  EXPECT_THAT(messageOf(checkpoint->read("cube", DType::F32, out.data(), 479)),
              HasSubstr("tensor 'cube': the destination has 479 bytes, but [4, 5, 6] as F32 "
                        "needs 480"));
}

TEST_F(SyntheticTest, Slices) {
  auto expectWindow = [&](Slice slice, DType want) {
    size_t count = size_t(slice.size[0] * slice.size[1] * slice.size[2]);
    std::vector<uint8_t> out(count * dtypeSize(want));
    ASSERT_TRUE(checkpoint->readSlice("cube", slice, want, out.data(), out.size()).ok());
    size_t n = 0;
    for (int64_t i = 0; i < slice.size[0]; ++i)
      for (int64_t j = 0; j < slice.size[1]; ++j)
        for (int64_t k = 0; k < slice.size[2]; ++k, ++n) {
          float expected = cubeAt(slice.start[0] + i, slice.start[1] + j, slice.start[2] + k);
          float actual;
          if (want == DType::F32) {
            std::memcpy(&actual, out.data() + 4 * n, 4);
          } else {
            uint16_t bits;
            std::memcpy(&bits, out.data() + 2 * n, 2);
            actual = bf16ToF32(bits);
            expected = bf16ToF32(f32ToBf16(expected));
          }
          ASSERT_EQ(actual, expected) << i << "," << j << "," << k;
        }
    EXPECT_EQ(n, count);
  };
  expectWindow({{1, 0, 0}, {2, 5, 6}}, DType::F32); // leading rows: one contiguous run
  expectWindow({{1, 2, 0}, {2, 3, 6}}, DType::F32); // whole last dimension
  expectWindow({{1, 2, 3}, {3, 2, 2}}, DType::F32); // strided in every dimension
  expectWindow({{0, 0, 5}, {4, 5, 1}}, DType::F32); // a single column
  expectWindow({{1, 2, 3}, {3, 2, 2}}, DType::BF16);
  expectWindow({{0, 0, 0}, {4, 5, 6}}, DType::BF16);

  float none;
  EXPECT_TRUE(checkpoint->readSlice("cube", {{2, 0, 0}, {0, 5, 6}}, DType::F32, &none, 0).ok());
  EXPECT_THAT(
      messageOf(checkpoint->readSlice("cube", {{3, 0, 0}, {2, 5, 6}}, DType::F32, &none, 4)),
      HasSubstr("tensor 'cube': slice [3, 3 + 2) of dimension 0 is outside the shape "
                "[4, 5, 6]"));
  EXPECT_THAT(messageOf(checkpoint->readSlice("cube", {{0, 0}, {1, 1}}, DType::F32, &none, 4)),
              HasSubstr("the slice has 2 starts and 2 sizes for a tensor of shape [4, 5, 6]"));
  EXPECT_THAT(
      messageOf(checkpoint->readSlice("cube", {{0, -1, 0}, {1, 1, 1}}, DType::F32, &none, 4)),
      HasSubstr("of dimension 1 is outside"));
}

TEST_F(SyntheticTest, StackedExperts) {
  std::vector<float> out(3 * 6);
  ASSERT_TRUE(checkpoint
                  ->readExperts("layers.0.experts.{expert}.w", std::vector<int64_t>{1, 2, 3}, Slice{}, {2, 3}, DType::F32,
                                out.data(), out.size() * 4)
                  .ok());
  EXPECT_EQ(out, std::vector<float>(experts.begin() + 6, experts.end()));

  // Column 1..3 of every expert, as BF16 (a tensor-parallel shard of each expert).
  std::vector<uint16_t> sliced(2 * 2 * 2);
  ASSERT_TRUE(checkpoint
                  ->readExperts("layers.0.experts.{expert}.w", std::vector<int64_t>{2, 3}, {{0, 1}, {2, 2}}, {2, 2},
                                DType::BF16, sliced.data(), sliced.size() * 2)
                  .ok());
  std::vector<uint16_t> expected;
  for (int e = 2; e < 4; ++e)
    for (int row = 0; row < 2; ++row)
      for (int col = 1; col < 3; ++col)
        expected.push_back(f32ToBf16(100.0f * e + row * 3 + col));
  EXPECT_EQ(sliced, expected);

  // An expert placement's order: any experts, in the order given.
  std::vector<float> placed(2 * 6);
  ASSERT_TRUE(checkpoint
                  ->readExperts("layers.0.experts.{expert}.w", std::vector<int64_t>{3, 0}, Slice{}, {2, 3},
                                DType::F32, placed.data(), placed.size() * 4)
                  .ok());
  std::vector<float> want(experts.begin() + 18, experts.begin() + 24);
  want.insert(want.end(), experts.begin(), experts.begin() + 6);
  EXPECT_EQ(placed, want);

  EXPECT_THAT(messageOf(checkpoint->readExperts("layers.0.experts.{expert}.w", std::vector<int64_t>{3, 4}, Slice{},
                                                {2, 3}, DType::F32, out.data(), 48)),
              AllOf(HasSubstr("no tensor 'layers.0.experts.4.w'"), HasSubstr("(expert 4)")));
  EXPECT_THAT(messageOf(checkpoint->readExperts("layers.1.experts.{expert}.w", std::vector<int64_t>{0, 1}, Slice{},
                                                {2, 3}, DType::F32, out.data(), 48)),
              HasSubstr(path + ": tensor 'layers.1.experts.1.w' (expert 1) has shape [3, 2], "
                               "expected [2, 3]"));
  EXPECT_THAT(messageOf(checkpoint->readExperts("layers.0.experts.{expert}.w", std::vector<int64_t>{0}, Slice{},
                                                {3, 2}, DType::F32, out.data(), 24)),
              HasSubstr("(expert 0) has shape [2, 3], expected [3, 2]"));
  EXPECT_THAT(messageOf(checkpoint->readExperts("layers.0.experts.0.w", std::vector<int64_t>{0}, Slice{}, {2, 3},
                                                DType::F32, out.data(), 24)),
              HasSubstr("the name has no {expert}"));
  EXPECT_THAT(messageOf(checkpoint->readExperts("layers.0.experts.{expert}.w", std::vector<int64_t>{0, 1}, Slice{},
                                                {2, 3}, DType::F32, out.data(), 24)),
              HasSubstr("the destination has 24 bytes, but 2 x [2, 3] as F32 needs 48"));
}

TEST(CheckpointOpenTest, MissingPath) {
  absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint =
      Checkpoint::open(freshTempDir() + "/absent.safetensors");
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_EQ(checkpoint.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(messageOf(checkpoint.status()), HasSubstr("absent.safetensors: cannot open"));
}

} // namespace
} // namespace moec::runtime::weights
