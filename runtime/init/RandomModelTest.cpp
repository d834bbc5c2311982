//===- RandomModelTest.cpp - random checkpoints for a plan ---------------===//

#include "runtime/init/RandomModel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "runtime/plan/PlanFormat.h"
#include "runtime/weights/Checkpoint.h"
#include "runtime/weights/Safetensors.h"
#include "runtime/weights/TestSupport.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace moec::runtime::init {
namespace {

namespace wt = weights::testing;
using ::testing::HasSubstr;

/// Adds a buffer (and, with a tensor name, its binding) to `rank`.
uint32_t addBuffer(plan::Rank &rank, plan::Role role, std::vector<int64_t> shape,
                   const std::string &tensor = "", int64_t firstExpert = 0) {
  plan::Buffer *buffer = rank.add_buffers();
  buffer->set_id(uint32_t(rank.buffers_size() - 1));
  buffer->set_name(tensor.empty() ? "scratch" : tensor);
  buffer->set_role(role);
  buffer->set_dtype(plan::BF16);
  int64_t count = 1;
  for (int64_t extent : shape) {
    buffer->add_shape(extent);
    count *= extent;
  }
  buffer->set_size_bytes(count * 2);
  if (!tensor.empty()) {
    plan::WeightBinding *binding = rank.add_weights();
    binding->set_buffer(buffer->id());
    binding->set_tensor(tensor);
    binding->set_first_expert(firstExpert);
  }
  return buffer->id();
}

constexpr char kExperts[] = "model.layers.0.mlp.experts.{expert}.up_proj.weight";

/// One rank with a little of everything the rules care about.
plan::Plan smallPlan() {
  plan::Plan plan;
  plan.set_version(plan::kPlanVersion);
  plan.set_model_type("qwen3_moe");
  plan::Rank &rank = *plan.add_ranks();
  addBuffer(rank, plan::WEIGHT, {32, 16}, "model.embed_tokens.weight");
  addBuffer(rank, plan::WEIGHT, {16}, "model.layers.0.input_layernorm.weight");
  addBuffer(rank, plan::WEIGHT, {8}, "model.layers.0.self_attn.q_norm.weight");
  addBuffer(rank, plan::WEIGHT, {64, 16}, "model.layers.0.self_attn.q_proj.weight");
  addBuffer(rank, plan::WEIGHT, {64}, "model.layers.0.self_attn.q_proj.bias");
  addBuffer(rank, plan::WEIGHT, {4}, "model.layers.0.self_attn.sinks");
  addBuffer(rank, plan::WEIGHT, {200}, "model.layers.0.linear_attn.A_log");
  addBuffer(rank, plan::WEIGHT, {200}, "model.layers.0.linear_attn.dt_bias");
  addBuffer(rank, plan::WEIGHT, {8}, "model.layers.0.linear_attn.norm.weight");
  addBuffer(rank, plan::WEIGHT, {4}, "model.layers.0.mixer.D");
  addBuffer(rank, plan::WEIGHT, {4}, "model.layers.0.mlp.gate.e_score_correction_bias");
  addBuffer(rank, plan::WEIGHT, {3, 8, 16}, kExperts);
  addBuffer(rank, plan::WEIGHT, {16}, "model.norm.weight");
  // A checkpoint weight trained in full is part of the base model; an activation is not.
  addBuffer(rank, plan::LORA_PARAM, {4, 16}, "model.layers.0.mlp.gate.weight");
  addBuffer(rank, plan::ACTIVATION, {2, 16});
  return plan;
}

std::string writeConfig(const std::string &dir, const std::string &text) {
  std::string path = dir + "/source_config.json";
  wt::writeFileBytes(path, text);
  return path;
}

const char kConfig[] =
    "{\n  \"model_type\": \"qwen3_moe\",\n  \"initializer_range\": 0.05,\n"
    "  \"pad_token_id\": 1,\n  \"hidden_size\": 16\n}\n";

std::vector<float> readF32(weights::Checkpoint &checkpoint, const std::string &name) {
  std::vector<float> values;
  absl::Status status = checkpoint.readAsF32(name, values);
  EXPECT_TRUE(status.ok()) << status;
  return values;
}

TEST(RandomModelTest, WritesEveryBoundWeightWithItsRule) {
  std::string dir = wt::freshTempDir();
  std::string out = dir + "/model";
  absl::Status status = writeRandomModel(smallPlan(), writeConfig(dir, kConfig), 7, out);
  ASSERT_TRUE(status.ok()) << status;

  auto file = weights::SafetensorsFile::open(out + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  std::vector<std::string> expected = {
      "model.embed_tokens.weight",
      "model.layers.0.input_layernorm.weight",
      "model.layers.0.linear_attn.A_log",
      "model.layers.0.linear_attn.dt_bias",
      "model.layers.0.linear_attn.norm.weight",
      "model.layers.0.mixer.D",
      "model.layers.0.mlp.experts.0.up_proj.weight",
      "model.layers.0.mlp.experts.1.up_proj.weight",
      "model.layers.0.mlp.experts.2.up_proj.weight",
      "model.layers.0.mlp.gate.e_score_correction_bias",
      "model.layers.0.mlp.gate.weight",
      "model.layers.0.self_attn.q_norm.weight",
      "model.layers.0.self_attn.q_proj.bias",
      "model.layers.0.self_attn.q_proj.weight",
      "model.layers.0.self_attn.sinks",
      "model.norm.weight",
  };
  EXPECT_EQ((*file)->names(), expected);
  for (const weights::TensorInfo &info : (*file)->tensors())
    EXPECT_EQ(info.dtype, weights::DType::F32) << info.name;
  EXPECT_EQ((*file)->find("model.layers.0.mlp.experts.1.up_proj.weight")->shape,
            (std::vector<int64_t>{8, 16}));
  EXPECT_EQ((*file)->find("model.layers.0.self_attn.q_proj.weight")->shape,
            (std::vector<int64_t>{64, 16}));
  EXPECT_EQ((*file)->find("model.layers.0.linear_attn.A_log")->shape, (std::vector<int64_t>{200}));

  auto checkpoint = weights::Checkpoint::open(out);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  auto all = [&](const std::string &name, float value) {
    for (float v : readF32(**checkpoint, name))
      ASSERT_EQ(v, value) << name;
  };
  all("model.layers.0.input_layernorm.weight", 1.0f);
  all("model.layers.0.self_attn.q_norm.weight", 1.0f);
  all("model.layers.0.linear_attn.norm.weight", 1.0f);
  all("model.norm.weight", 1.0f);
  all("model.layers.0.mixer.D", 1.0f);
  all("model.layers.0.self_attn.q_proj.bias", 0.0f);
  all("model.layers.0.self_attn.sinks", 0.0f);
  all("model.layers.0.mlp.gate.e_score_correction_bias", 0.0f);

  for (float v : readF32(**checkpoint, "model.layers.0.linear_attn.A_log")) {
    EXPECT_GE(v, 0.0f);
    EXPECT_LT(v, std::log(16.0f));
  }
  for (float v : readF32(**checkpoint, "model.layers.0.linear_attn.dt_bias")) {
    double dt = std::log1p(std::exp(double(v))); // softplus
    EXPECT_GE(dt, 1e-3 * 0.999);
    EXPECT_LE(dt, 1e-1 * 1.001);
  }

  // N(0, 0.05): 1024 + 384 draws, moments within a few standard errors.
  std::vector<float> normal = readF32(**checkpoint, "model.layers.0.self_attn.q_proj.weight");
  for (int e = 0; e < 3; ++e)
    for (float v : readF32(**checkpoint, "model.layers.0.mlp.experts." + std::to_string(e) +
                                             ".up_proj.weight"))
      normal.push_back(v);
  double sum = 0, squares = 0;
  for (float v : normal) {
    sum += v;
    squares += double(v) * v;
  }
  double mean = sum / double(normal.size());
  double deviation = std::sqrt(squares / double(normal.size()) - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.005);
  EXPECT_NEAR(deviation, 0.05, 0.005);
  // Experts differ from each other.
  EXPECT_NE(readF32(**checkpoint, "model.layers.0.mlp.experts.0.up_proj.weight"),
            readF32(**checkpoint, "model.layers.0.mlp.experts.1.up_proj.weight"));

  // The padding row of the embedding is zero, the others are not.
  std::vector<float> embedding = readF32(**checkpoint, "model.embed_tokens.weight");
  for (int h = 0; h < 16; ++h) {
    EXPECT_EQ(embedding[16 + h], 0.0f);
    EXPECT_NE(embedding[h], 0.0f);
  }

  // Every value is fillTensor's, so tools can recompute any tensor.
  absl::StatusOr<InitConfig> config = readInitConfig(dir + "/source_config.json", "");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->initializerRange, 0.05);
  std::vector<float> again(64 * 16);
  fillTensor("model.layers.0.self_attn.q_proj.weight", {64, 16}, *config, 7, again.data());
  EXPECT_EQ(again, readF32(**checkpoint, "model.layers.0.self_attn.q_proj.weight"));

  // config.json is a byte copy.
  EXPECT_EQ(wt::readFileBytes(out + "/config.json"), kConfig);
  for (const auto &entry : std::filesystem::directory_iterator(out))
    EXPECT_EQ(entry.path().filename().string().find(".tmp."), std::string::npos)
        << "no temporary file is left behind";
}

TEST(RandomModelTest, Qwen3NextNormsAreZeroCentred) {
  std::string dir = wt::freshTempDir();
  plan::Plan plan = smallPlan();
  plan.set_model_type("qwen3_next");
  std::string config = writeConfig(dir, "{\"model_type\": \"qwen3_next\"}");
  ASSERT_TRUE(writeRandomModel(plan, config, 7, dir + "/model").ok());
  auto checkpoint = weights::Checkpoint::open(dir + "/model");
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  for (const char *name : {"model.layers.0.input_layernorm.weight",
                           "model.layers.0.self_attn.q_norm.weight", "model.norm.weight"})
    for (float v : readF32(**checkpoint, name))
      ASSERT_EQ(v, 0.0f) << name;
  for (float v : readF32(**checkpoint, "model.layers.0.linear_attn.norm.weight"))
    ASSERT_EQ(v, 1.0f);

  // No initializer_range: the default 0.02.
  std::vector<float> weights = readF32(**checkpoint, "model.layers.0.self_attn.q_proj.weight");
  double squares = 0;
  for (float v : weights)
    squares += double(v) * v;
  EXPECT_NEAR(std::sqrt(squares / double(weights.size())), 0.02, 0.003);
}

TEST(RandomModelTest, RulesByName) {
  EXPECT_EQ(initKindFor("model.layers.3.post_attention_layernorm.weight", "mixtral"), InitKind::Ones);
  EXPECT_EQ(initKindFor("model.layers.3.self_attn.kv_a_layernorm.weight", "deepseek_v3"),
            InitKind::Ones);
  EXPECT_EQ(initKindFor("backbone.norm_f.weight", "nemotron_h"), InitKind::Ones);
  EXPECT_EQ(initKindFor("model.layers.0.self_attn.indexer.k_norm.bias", "deepseek_v32"),
            InitKind::Zeros);
  EXPECT_EQ(initKindFor("model.layers.0.self_attn.k_norm.weight", "qwen3_next"), InitKind::Zeros);
  EXPECT_EQ(initKindFor("model.layers.0.linear_attn.norm.weight", "qwen3_next"), InitKind::Ones);
  EXPECT_EQ(initKindFor("backbone.layers.0.mixer.A_log", "nemotron_h"), InitKind::ALog);
  EXPECT_EQ(initKindFor("backbone.layers.0.mixer.dt_bias", "nemotron_h"), InitKind::DtBias);
  EXPECT_EQ(initKindFor("backbone.layers.0.mixer.D", "nemotron_h"), InitKind::Ones);
  EXPECT_EQ(initKindFor("backbone.layers.0.mixer.conv1d.bias", "nemotron_h"), InitKind::Zeros);
  EXPECT_EQ(initKindFor("model.layers.1.mlp.gate.e_score_correction_bias", "deepseek_v3"),
            InitKind::Zeros);
  EXPECT_EQ(initKindFor("model.layers.1.self_attn.sinks", "gpt_oss"), InitKind::Zeros);
  EXPECT_EQ(initKindFor("model.layers.1.mlp.gate.weight", "deepseek_v3"), InitKind::Normal);
  EXPECT_EQ(initKindFor("lm_head.weight", "mixtral"), InitKind::Normal);
  EXPECT_EQ(initKindFor("model.layers.0.self_attn.dt_proj.weight", "kimi_linear"), InitKind::Normal);
}

TEST(RandomModelTest, DeterministicForASeed) {
  std::string dir = wt::freshTempDir();
  std::string config = writeConfig(dir, kConfig);
  ASSERT_TRUE(writeRandomModel(smallPlan(), config, 11, dir + "/a").ok());
  ASSERT_TRUE(writeRandomModel(smallPlan(), config, 11, dir + "/b").ok());
  ASSERT_TRUE(writeRandomModel(smallPlan(), config, 12, dir + "/c").ok());
  std::string a = wt::readFileBytes(dir + "/a/model.safetensors");
  EXPECT_EQ(a, wt::readFileBytes(dir + "/b/model.safetensors"));
  std::string c = wt::readFileBytes(dir + "/c/model.safetensors");
  EXPECT_EQ(a.size(), c.size());
  EXPECT_NE(a, c);

  // The values depend on the tensor, not on the plan's binding order.
  plan::Plan reversed = smallPlan();
  plan::Rank &rank = *reversed.mutable_ranks(0);
  std::reverse(rank.mutable_weights()->begin(), rank.mutable_weights()->end());
  ASSERT_TRUE(writeRandomModel(reversed, config, 11, dir + "/d").ok());
  EXPECT_EQ(a, wt::readFileBytes(dir + "/d/model.safetensors"));
}

TEST(RandomModelTest, ShardedPlansGetWholeTensors) {
  // tp=2 splits q_proj's rows; ep=2 gives each rank two of four experts.
  plan::Plan plan;
  plan.set_model_type("mixtral");
  for (int r = 0; r < 2; ++r) {
    plan::Rank &rank = *plan.add_ranks();
    rank.set_rank(r);
    addBuffer(rank, plan::WEIGHT, {8, 16}, "model.layers.0.self_attn.q_proj.weight");
    plan::Slice::Range *rows = rank.mutable_weights(0)->mutable_slice()->add_dims();
    rows->set_start(8 * r);
    rows->set_size(8);
    plan::Slice::Range *columns = rank.mutable_weights(0)->mutable_slice()->add_dims();
    columns->set_start(0);
    columns->set_size(16);
    addBuffer(rank, plan::WEIGHT, {2, 4, 16}, "model.layers.0.block_sparse_moe.experts.{expert}.w1.weight",
              2 * r);
  }
  auto tensors = checkpointTensors(plan);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  ASSERT_EQ(tensors->size(), 5u);
  EXPECT_EQ(tensors->at("model.layers.0.self_attn.q_proj.weight"), (std::vector<int64_t>{16, 16}));
  EXPECT_EQ(tensors->at("model.layers.0.block_sparse_moe.experts.3.w1.weight"),
            (std::vector<int64_t>{4, 16}));
}

TEST(RandomModelTest, Errors) {
  std::string dir = wt::freshTempDir();
  std::string config = writeConfig(dir, kConfig);

  absl::Status status = writeRandomModel(smallPlan(), dir + "/absent.json", 1, dir + "/m");
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(status.message()), HasSubstr("absent.json"));

  status = writeRandomModel(smallPlan(), writeConfig(dir, "{\"initializer_range\": \"x\"}"), 1,
                            dir + "/m");
  EXPECT_THAT(std::string(status.message()), HasSubstr("\"initializer_range\" is a string"));
  config = writeConfig(dir, kConfig);

  plan::Plan plan = smallPlan();
  plan.mutable_ranks(0)->mutable_weights(1)->set_buffer(999);
  EXPECT_THAT(std::string(writeRandomModel(plan, config, 1, dir + "/m").message()),
              HasSubstr("rank 0, weights[1] \"model.layers.0.input_layernorm.weight\": buffer 999 "
                        "does not exist"));

  plan = smallPlan();
  plan.mutable_ranks(0)->mutable_weights(1)->set_tensor("model.layers.{layer}.norm.weight");
  EXPECT_THAT(std::string(writeRandomModel(plan, config, 1, dir + "/m").message()),
              HasSubstr("a placeholder other than one {expert}"));

  plan = smallPlan();
  plan.mutable_ranks(0)->mutable_weights(2)->set_tensor("model.layers.0.self_attn.q_proj.weight");
  EXPECT_THAT(std::string(writeRandomModel(plan, config, 1, dir + "/m").message()),
              HasSubstr("binds a tensor of 2 dimensions, but rank 0, weights[2]"));

  EXPECT_THAT(std::string(writeRandomModel(plan::Plan(), config, 1, dir + "/m").message()),
              HasSubstr("no ranks"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/m/model.safetensors"));
}

} // namespace
} // namespace moec::runtime::init
