//===- AdapterTest.cpp - PEFT adapter export and import ------------------===//

#include "runtime/peft/Adapter.h"

#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "runtime/weights/Json.h"
#include "runtime/weights/Safetensors.h"
#include "runtime/weights/SafetensorsWriter.h"
#include "runtime/weights/TestSupport.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace moec::runtime::peft {
namespace {

namespace wt = weights::testing;
using ::testing::HasSubstr;
using weights::DType;
using weights::JsonValue;

const char *const kFamilies[] = {"deepseek_v3", "deepseek_v32", "kimi_linear", "mixtral",
                                 "nemotron_h",  "qwen3_moe",    "qwen3_next"};

constexpr char kQ[] = "base_model.model.model.layers.0.self_attn.q_proj";

AdapterSpec smallSpec() {
  AdapterSpec spec;
  spec.r = 2;
  spec.loraAlpha = 4;
  spec.targetModules = {"q_proj", "up_proj"};
  spec.taskType = "CAUSAL_LM";
  return spec;
}

std::vector<float> iota(size_t count, float start = 0.5f) {
  std::vector<float> out(count);
  for (size_t i = 0; i < count; ++i)
    out[i] = start + float(i) * 0.25f;
  return out;
}

/// A valid q_proj pair for smallSpec(): A [2, 3], B [4, 2].
std::vector<NamedTensor> smallTensors() {
  return {{std::string(kQ) + ".lora_A.weight", {2, 3}, iota(6)},
          {std::string(kQ) + ".lora_B.weight", {4, 2}, iota(8, -1.0f)}};
}

std::string statusText(const absl::Status &status) { return std::string(status.message()); }

TEST(AdapterTest, GoldenAdaptersRoundTripByteForByte) {
  std::string golden = wt::goldenDir();
  ASSERT_FALSE(golden.empty());
  for (const char *family : kFamilies) {
    SCOPED_TRACE(family);
    std::string source = golden + "/" + family + "/adapter";
    absl::StatusOr<Adapter> adapter = importAdapter(source);
    ASSERT_TRUE(adapter.ok()) << adapter.status();

    // The spec matches the file as our strict JSON reader sees it.
    absl::StatusOr<JsonValue> config =
        weights::parseJson(wt::readFileBytes(source + "/" + kAdapterConfigFile));
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(adapter->spec.r, 4);
    EXPECT_EQ(adapter->spec.loraAlpha, 8.0);
    EXPECT_EQ(adapter->spec.loraDropout, 0.0);
    EXPECT_FALSE(adapter->spec.useRslora);
    EXPECT_TRUE(adapter->spec.taskType.empty());
    EXPECT_TRUE(adapter->spec.baseModelNameOrPath.empty());
    EXPECT_EQ(adapter->spec.parentLibrary, config->find("auto_mapping")->find("parent_library")->string);
    const JsonValue *targets = config->find("target_modules");
    ASSERT_EQ(adapter->spec.targetModules.size(), targets->array.size());
    for (size_t i = 0; i < targets->array.size(); ++i)
      EXPECT_EQ(adapter->spec.targetModules[i], targets->array[i].string);

    std::string out = wt::freshTempDir() + "/" + family;
    std::vector<NamedTensor> tensors;
    for (const auto &[name, tensor] : adapter->tensors)
      tensors.push_back({name, tensor.shape, tensor.data});
    absl::Status exported = exportAdapter(out, adapter->spec, tensors);
    ASSERT_TRUE(exported.ok()) << exported;

    // Same tensors: names, dtypes, shapes, bytes.
    auto original = weights::SafetensorsFile::open(source + "/" + kAdapterWeightsFile);
    auto rewritten = weights::SafetensorsFile::open(out + "/" + kAdapterWeightsFile);
    ASSERT_TRUE(original.ok() && rewritten.ok());
    ASSERT_EQ((*original)->names(), (*rewritten)->names());
    for (const weights::TensorInfo &info : (*original)->tensors()) {
      const weights::TensorInfo *other = (*rewritten)->find(info.name);
      ASSERT_NE(other, nullptr) << info.name;
      EXPECT_EQ(other->dtype, info.dtype) << info.name;
      EXPECT_EQ(other->shape, info.shape) << info.name;
      auto a = (*original)->data(info), b = (*rewritten)->data(*other);
      ASSERT_EQ(a.size(), b.size()) << info.name;
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size()), 0) << info.name;
    }
    EXPECT_EQ((*rewritten)->metadata(), (*original)->metadata());
    // In fact both files come out as PEFT wrote them.
    EXPECT_EQ(wt::readFileBytes(out + "/" + kAdapterWeightsFile),
              wt::readFileBytes(source + "/" + kAdapterWeightsFile));
    // The config too, but for one spelling: PEFT writes an unused target_parameters
    // as [] for most families and as null for some (kimi_linear, nemotron_h);
    // exportAdapter always writes [].
    std::string goldenConfig = wt::readFileBytes(source + "/" + kAdapterConfigFile);
    const std::string nullSpelling = "\"target_parameters\": null,";
    if (size_t at = goldenConfig.find(nullSpelling); at != std::string::npos)
      goldenConfig.replace(at, nullSpelling.size(), "\"target_parameters\": [],");
    EXPECT_EQ(wt::readFileBytes(out + "/" + kAdapterConfigFile), goldenConfig);

    absl::StatusOr<Adapter> again = importAdapter(out);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->spec, adapter->spec);
    EXPECT_EQ(again->tensors.size(), adapter->tensors.size());
  }
}

TEST(AdapterTest, WrittenConfigIsValidJsonWithPeftsKeys) {
  AdapterSpec spec = smallSpec();
  spec.loraAlpha = 16.5;
  spec.loraDropout = 0.05;
  spec.useRslora = true;
  spec.baseModelNameOrPath = "org/mod\xc3\xa9l \"q\"\n\xf0\x9f\x98\x80"; // é, a quote, 😀
  absl::StatusOr<std::string> text = adapterConfigJson(spec);
  ASSERT_TRUE(text.ok()) << text.status();
  absl::StatusOr<JsonValue> parsed = weights::parseJson(*text);
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << *text;

  // The golden key set, exactly.
  absl::StatusOr<JsonValue> golden = weights::parseJson(
      wt::readFileBytes(wt::goldenDir() + "/qwen3_moe/adapter/" + kAdapterConfigFile));
  ASSERT_TRUE(golden.ok());
  std::vector<std::string> keys, goldenKeys;
  for (const auto &member : parsed->object)
    keys.push_back(member.first);
  for (const auto &member : golden->object)
    goldenKeys.push_back(member.first);
  EXPECT_EQ(keys, goldenKeys) << "sorted, as json.dumps(sort_keys=True) writes them";

  EXPECT_EQ(parsed->find("peft_type")->string, "LORA");
  EXPECT_EQ(parsed->find("bias")->string, "none");
  EXPECT_EQ(parsed->find("task_type")->string, "CAUSAL_LM");
  EXPECT_EQ(parsed->find("auto_mapping")->kind, JsonValue::Kind::Null)
      << "PEFT writes auto_mapping only without a task type";
  EXPECT_EQ(parsed->find("modules_to_save")->kind, JsonValue::Kind::Null);
  EXPECT_TRUE(parsed->find("inference_mode")->boolean);
  EXPECT_TRUE(parsed->find("use_rslora")->boolean);
  EXPECT_FALSE(parsed->find("use_dora")->boolean);
  EXPECT_EQ(parsed->find("base_model_name_or_path")->string, spec.baseModelNameOrPath);
  // Python's style: floats in repr, ASCII escapes, two-space indent.
  EXPECT_THAT(*text, HasSubstr("\n  \"lora_alpha\": 16.5,\n"));
  EXPECT_THAT(*text, HasSubstr("\n  \"lora_dropout\": 0.05,\n"));
  EXPECT_THAT(*text, HasSubstr("\"org/mod\\u00e9l \\\"q\\\"\\n\\ud83d\\ude00\""));
  EXPECT_THAT(*text, HasSubstr("\"target_modules\": [\n    \"q_proj\",\n    \"up_proj\"\n  ],"));

  absl::StatusOr<AdapterSpec> back = parseAdapterConfig(*text, "x");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, spec);
}

TEST(AdapterTest, PythonFloatRepr) {
  EXPECT_EQ(pythonFloatRepr(0.0), "0.0");
  EXPECT_EQ(pythonFloatRepr(-0.0), "-0.0");
  EXPECT_EQ(pythonFloatRepr(0.1), "0.1");
  EXPECT_EQ(pythonFloatRepr(0.05), "0.05");
  EXPECT_EQ(pythonFloatRepr(1.5), "1.5");
  EXPECT_EQ(pythonFloatRepr(-2.0), "-2.0");
  EXPECT_EQ(pythonFloatRepr(0.0001), "0.0001");
  EXPECT_EQ(pythonFloatRepr(1e-5), "1e-05");
  EXPECT_EQ(pythonFloatRepr(1.25e-7), "1.25e-07");
  EXPECT_EQ(pythonFloatRepr(100000.0), "100000.0");
  EXPECT_EQ(pythonFloatRepr(1e15), "1000000000000000.0");
  EXPECT_EQ(pythonFloatRepr(1e16), "1e+16");
  EXPECT_EQ(pythonFloatRepr(123456789012345678.0), "1.2345678901234568e+17");
  EXPECT_EQ(pythonFloatRepr(1e100), "1e+100");
  EXPECT_EQ(pythonFloatRepr(1.0 / 3.0), "0.3333333333333333");
}

TEST(AdapterTest, ExpertStacksRoundTrip) {
  const std::string pattern = "base_model.model.model.layers.1.mlp.experts.{expert}.up_proj";
  std::vector<NamedTensor> tensors = smallTensors();
  tensors.push_back({pattern + ".lora_A.weight", {3, 2, 5}, iota(30)});
  tensors.push_back({pattern + ".lora_B.weight", {3, 6, 2}, iota(36, -3.0f)});
  std::string dir = wt::freshTempDir() + "/adapter";
  absl::Status exported = exportAdapter(dir, smallSpec(), tensors);
  ASSERT_TRUE(exported.ok()) << exported;

  auto file = weights::SafetensorsFile::open(dir + "/" + kAdapterWeightsFile);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  std::vector<std::string> names = (*file)->names();
  EXPECT_EQ(names.size(), 2u + 6u);
  const weights::TensorInfo *expert1 =
      (*file)->find("base_model.model.model.layers.1.mlp.experts.1.up_proj.lora_A.weight");
  ASSERT_NE(expert1, nullptr);
  EXPECT_EQ(expert1->shape, (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(expert1->dtype, DType::F32);
  float first;
  std::memcpy(&first, (*file)->data(*expert1).data(), sizeof first);
  EXPECT_EQ(first, tensors[2].data[10]);
  EXPECT_EQ((*file)->find(pattern + ".lora_A.weight"), nullptr) << "no {expert} in the file";

  ImportOptions options;
  options.expectedShapes = {{std::string(kQ) + ".lora_A.weight", {2, 3}},
                            {std::string(kQ) + ".lora_B.weight", {4, 2}},
                            {pattern + ".lora_A.weight", {3, 2, 5}},
                            {pattern + ".lora_B.weight", {3, 6, 2}}};
  absl::StatusOr<Adapter> adapter = importAdapter(dir, options);
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  EXPECT_EQ(adapter->spec, smallSpec());
  for (size_t i = 2; i < 4; ++i) {
    absl::StatusOr<AdapterTensor> stacked = adapter->readStacked(tensors[i].name, 3);
    ASSERT_TRUE(stacked.ok()) << stacked.status();
    EXPECT_EQ(stacked->shape, tensors[i].shape);
    EXPECT_EQ(stacked->data, tensors[i].data);
  }
  EXPECT_THAT(statusText(adapter->readStacked(pattern + ".lora_A.weight", 4).status()),
              HasSubstr("experts.3.up_proj.lora_A.weight' (expert 3 of 4)"));
  EXPECT_FALSE(adapter->readStacked(std::string(kQ) + ".lora_A.weight", 1).ok());
}

TEST(AdapterTest, ConvertsHalfPrecisionTensors) {
  std::string dir = wt::freshTempDir();
  ASSERT_TRUE(exportAdapter(dir, smallSpec(), smallTensors()).ok());
  // Rewrite the weights in BF16 and F16: values exact in both.
  std::vector<uint16_t> a(6), b(8);
  std::vector<float> aValues = iota(6), bValues = iota(8, -1.0f);
  for (size_t i = 0; i < 6; ++i)
    a[i] = weights::f32ToBf16(aValues[i]);
  for (size_t i = 0; i < 8; ++i)
    b[i] = weights::f32ToF16(bValues[i]);
  weights::SafetensorsWriter writer;
  ASSERT_TRUE(writer.add(std::string(kQ) + ".lora_A.weight", DType::BF16, {2, 3}, a.data(), 12).ok());
  ASSERT_TRUE(writer.add(std::string(kQ) + ".lora_B.weight", DType::F16, {4, 2}, b.data(), 16).ok());
  ASSERT_TRUE(writer.write(dir + "/" + kAdapterWeightsFile).ok());
  absl::StatusOr<Adapter> adapter = importAdapter(dir);
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  const AdapterTensor &loraA = adapter->tensors.at(std::string(kQ) + ".lora_A.weight");
  EXPECT_EQ(loraA.fileDType, DType::BF16);
  EXPECT_EQ(loraA.data, aValues);
  EXPECT_EQ(adapter->tensors.at(std::string(kQ) + ".lora_B.weight").data, bValues);
}

TEST(AdapterTest, MissingFiles) {
  std::string dir = wt::freshTempDir();
  absl::StatusOr<Adapter> adapter = importAdapter(dir + "/nowhere");
  ASSERT_FALSE(adapter.ok());
  EXPECT_EQ(adapter.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(statusText(adapter.status()), HasSubstr("nowhere/adapter_config.json"));

  ASSERT_TRUE(exportAdapter(dir, smallSpec(), smallTensors()).ok());
  std::filesystem::remove(dir + "/" + kAdapterWeightsFile);
  adapter = importAdapter(dir);
  ASSERT_FALSE(adapter.ok());
  EXPECT_EQ(adapter.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(statusText(adapter.status()), HasSubstr("adapter_model.safetensors"));
}

TEST(AdapterTest, ExpectedShapesMismatch) {
  std::string dir = wt::freshTempDir();
  ASSERT_TRUE(exportAdapter(dir, smallSpec(), smallTensors()).ok());
  ImportOptions options;
  options.expectedShapes = {{std::string(kQ) + ".lora_A.weight", {2, 3}},
                            {std::string(kQ) + ".lora_B.weight", {5, 2}}};
  EXPECT_THAT(statusText(importAdapter(dir, options).status()),
              HasSubstr("shape mismatch: tensor '" + std::string(kQ) +
                        ".lora_B.weight' has shape [4, 2], expected [5, 2]"));
  options.expectedShapes = {{std::string(kQ) + ".lora_A.weight", {2, 3}}};
  EXPECT_THAT(statusText(importAdapter(dir, options).status()), HasSubstr("unexpected tensor"));
  options.expectedShapes[std::string(kQ) + ".lora_B.weight"] = {4, 2};
  options.expectedShapes["base_model.model.x.lora_A.weight"] = {2, 3};
  EXPECT_THAT(statusText(importAdapter(dir, options).status()),
              HasSubstr("missing tensor 'base_model.model.x.lora_A.weight'"));
}

TEST(AdapterTest, WrongDtype) {
  std::string dir = wt::freshTempDir();
  ASSERT_TRUE(exportAdapter(dir, smallSpec(), smallTensors()).ok());
  std::vector<int32_t> ints(6, 1);
  std::vector<float> b = iota(8);
  weights::SafetensorsWriter writer;
  ASSERT_TRUE(writer.add(std::string(kQ) + ".lora_A.weight", DType::I32, {2, 3}, ints.data(), 24).ok());
  ASSERT_TRUE(writer.add(std::string(kQ) + ".lora_B.weight", DType::F32, {4, 2}, b.data(), 32).ok());
  ASSERT_TRUE(writer.write(dir + "/" + kAdapterWeightsFile).ok());
  absl::StatusOr<Adapter> adapter = importAdapter(dir);
  ASSERT_FALSE(adapter.ok());
  EXPECT_THAT(statusText(adapter.status()),
              HasSubstr(".lora_A.weight' has dtype I32; expected F32, BF16 or F16"));
}

TEST(AdapterTest, RankMismatchInTheFile) {
  std::string dir = wt::freshTempDir();
  ASSERT_TRUE(exportAdapter(dir, smallSpec(), smallTensors()).ok());
  AdapterSpec spec = smallSpec();
  spec.r = 3;
  wt::writeFileBytes(dir + "/" + kAdapterConfigFile, *adapterConfigJson(spec));
  EXPECT_THAT(statusText(importAdapter(dir).status()),
              HasSubstr("has shape [2, 3]; expected [r, in_features] with r = 3"));
}

/// The error of importing the golden qwen3_moe config with `from` replaced by `to`.
std::string configError(const std::string &from, const std::string &to) {
  std::string text =
      wt::readFileBytes(wt::goldenDir() + "/qwen3_moe/adapter/" + kAdapterConfigFile);
  size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at == std::string::npos)
    return "";
  text.replace(at, from.size(), to);
  absl::StatusOr<AdapterSpec> spec = parseAdapterConfig(text, "cfg.json");
  EXPECT_FALSE(spec.ok()) << "accepted with " << to;
  return spec.ok() ? "" : statusText(spec.status());
}

TEST(AdapterTest, RefusesWhatItCannotApply) {
  EXPECT_THAT(configError("\"use_dora\": false", "\"use_dora\": true"),
              HasSubstr("cfg.json: use_dora is true; DoRA adapters are not supported"));
  EXPECT_THAT(configError("\"rank_pattern\": {}", "\"rank_pattern\": {\"q_proj\": 8}"),
              HasSubstr("rank_pattern is not empty"));
  EXPECT_THAT(configError("\"alpha_pattern\": {}", "\"alpha_pattern\": {\"q_proj\": 8}"),
              HasSubstr("alpha_pattern is not empty"));
  EXPECT_THAT(configError("\"peft_type\": \"LORA\"", "\"peft_type\": \"IA3\""),
              HasSubstr("peft_type is \"IA3\"; only LORA adapters are supported"));
  EXPECT_THAT(configError("\"bias\": \"none\"", "\"bias\": \"all\""), HasSubstr("bias is not"));
  EXPECT_THAT(configError("\"modules_to_save\": null", "\"modules_to_save\": \"lm_head\""),
              HasSubstr("\"modules_to_save\" is a string, expected a list of module names or null"));
  EXPECT_THAT(configError("\"fan_in_fan_out\": false", "\"fan_in_fan_out\": true"),
              HasSubstr("fan_in_fan_out"));
}

constexpr char kGate[] = "base_model.model.model.layers.0.mlp.gate";

TEST(AdapterTest, ModulesTrainedInFullRoundTrip) {
  // A router trained in full next to a LoRA adapter: PEFT's modules_to_save.
  std::vector<NamedTensor> tensors = smallTensors();
  tensors.push_back({std::string(kGate) + ".weight", {4, 3}, iota(12, -2.0f)});
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const NamedTensor &tensor : tensors)
    shapes[tensor.name] = tensor.shape;
  absl::StatusOr<std::vector<std::string>> modules = modulesToSaveOf(shapes);
  ASSERT_TRUE(modules.ok()) << modules.status();
  EXPECT_EQ(*modules, std::vector<std::string>{"model.layers.0.mlp.gate"});
  AdapterSpec spec = smallSpec();
  spec.modulesToSave = *modules;
  std::string dir = wt::freshTempDir();
  ASSERT_TRUE(exportAdapter(dir, spec, tensors).ok());
  EXPECT_THAT(wt::readFileBytes(dir + "/" + kAdapterConfigFile),
              HasSubstr("\"modules_to_save\": [\n    \"model.layers.0.mlp.gate\"\n  ],"));
  absl::StatusOr<Adapter> adapter = importAdapter(dir, {shapes});
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  EXPECT_EQ(adapter->spec, spec);
  EXPECT_EQ(adapter->tensors.at(std::string(kGate) + ".weight").data, tensors[2].data);

  // A module trained in full is optional on import: absent (an adapter of LoRA tensors alone),
  // or present at its shape.
  std::map<std::string, std::vector<int64_t>> lora = shapes, full;
  full[std::string(kGate) + ".weight"] = lora.at(std::string(kGate) + ".weight");
  lora.erase(std::string(kGate) + ".weight");
  ImportOptions optional{lora, full};
  EXPECT_TRUE(importAdapter(dir, optional).ok());
  std::string loraOnly = dir + "/lora_only";
  ASSERT_TRUE(exportAdapter(loraOnly, smallSpec(), smallTensors()).ok());
  EXPECT_TRUE(importAdapter(loraOnly, optional).ok());
  optional.optionalShapes.begin()->second = {3, 4};
  EXPECT_THAT(statusText(importAdapter(dir, optional).status()),
              HasSubstr("shape mismatch: tensor 'base_model.model.model.layers.0.mlp.gate.weight' has shape [4, 3]"));

  // PEFT matches a module to save by the end of its path: "gate" names the same module.
  AdapterSpec bySuffix = spec;
  bySuffix.modulesToSave = {"gate"};
  wt::writeFileBytes(dir + "/" + kAdapterConfigFile, *adapterConfigJson(bySuffix));
  EXPECT_TRUE(importAdapter(dir).ok());
  bySuffix.modulesToSave = {"up_proj"};
  wt::writeFileBytes(dir + "/" + kAdapterConfigFile, *adapterConfigJson(bySuffix));
  EXPECT_THAT(statusText(importAdapter(dir).status()),
              HasSubstr("tensor 'base_model.model.model.layers.0.mlp.gate.weight' is not a LoRA tensor and its "
                        "module 'model.layers.0.mlp.gate' is not in modules_to_save"));
}

TEST(AdapterTest, ModulesTrainedInFullRefusals) {
  // A parameter that is no module's weight or bias (gpt-oss's attention sinks).
  EXPECT_THAT(statusText(modulesToSaveOf({{"base_model.model.model.layers.0.self_attn.sinks", {4}}}).status()),
              HasSubstr("is neither a LoRA tensor (a name ending in .lora_A.weight"));
  // Experts trained in full: transformers fuses them, PEFT would drop them without a word.
  EXPECT_THAT(statusText(modulesToSaveOf({{"base_model.model.model.layers.0.mlp.experts.{expert}.up_proj.weight",
                                           {2, 4, 3}}})
                             .status()),
              HasSubstr("is a per-expert checkpoint weight trained in full"));
  EXPECT_THAT(statusText(modulesToSaveOf({{"model.layers.0.mlp.gate.weight", {4, 3}}}).status()),
              HasSubstr("PEFT names start with \"base_model.model.\""));
  std::map<std::string, std::vector<int64_t>> shapes = {{std::string(kQ) + ".lora_A.weight", {2, 3}},
                                                        {std::string(kQ) + ".lora_B.weight", {4, 2}},
                                                        {std::string(kGate) + ".weight", {4, 3}}};
  AdapterSpec spec = smallSpec();
  EXPECT_THAT(statusText(checkAdapterTensors(spec, shapes)),
              HasSubstr("its module 'model.layers.0.mlp.gate' is not in modules_to_save"));
  // PEFT loads a module to save whole: one of its tensors left frozen is refused.
  spec.modulesToSave = {"model.layers.0.mlp.gate"};
  EXPECT_TRUE(checkAdapterTensors(spec, shapes, {std::string(kQ) + ".weight"}).ok());
  EXPECT_THAT(statusText(checkAdapterTensors(spec, shapes, {std::string(kGate) + ".bias"})),
              HasSubstr("module 'model.layers.0.mlp.gate' is trained in full but its 'bias' is frozen"));
  spec.modulesToSave = {"model.layers.0.mlp.gate", "model.layers.1.mlp.gate"};
  EXPECT_THAT(statusText(checkAdapterTensors(spec, shapes)),
              HasSubstr("modules_to_save names 'model.layers.1.mlp.gate', but no tensor of it"));
  // A module trained in full cannot also carry a LoRA adapter, nor hold one.
  shapes = {{std::string(kQ) + ".lora_A.weight", {2, 3}},
            {std::string(kQ) + ".lora_B.weight", {4, 2}},
            {std::string(kQ) + ".weight", {4, 3}}};
  spec.modulesToSave = {"model.layers.0.self_attn.q_proj"};
  EXPECT_THAT(statusText(checkAdapterTensors(spec, shapes)), HasSubstr("PEFT cannot save both"));
  shapes.erase(std::string(kQ) + ".weight");
  shapes["base_model.model.model.layers.0.self_attn.weight"] = {4};
  spec.modulesToSave = {"model.layers.0.self_attn"};
  EXPECT_THAT(statusText(checkAdapterTensors(spec, shapes)), HasSubstr("PEFT cannot save both"));
  // Nothing is written for a refused export.
  std::string dir = wt::freshTempDir() + "/out";
  std::vector<NamedTensor> tensors = smallTensors();
  tensors.push_back({std::string(kGate) + ".weight", {4, 3}, iota(12)});
  EXPECT_THAT(statusText(exportAdapter(dir, smallSpec(), tensors)), HasSubstr("is not in modules_to_save"));
  EXPECT_FALSE(std::filesystem::exists(dir));
}

TEST(AdapterTest, MissingOrMistypedFields) {
  EXPECT_THAT(configError("\"r\": 4,", ""), HasSubstr("cfg.json: missing \"r\""));
  EXPECT_THAT(configError("\"lora_alpha\": 8,", ""), HasSubstr("missing \"lora_alpha\""));
  EXPECT_THAT(configError("\"peft_type\": \"LORA\",", ""), HasSubstr("missing \"peft_type\""));
  EXPECT_THAT(configError("\"r\": 4", "\"r\": \"4\""),
              HasSubstr("\"r\" is a string, expected a positive integer"));
  EXPECT_THAT(configError("\"r\": 4", "\"r\": 0"), HasSubstr("\"r\" is 0"));
  EXPECT_THAT(configError("\"lora_dropout\": 0.0", "\"lora_dropout\": 1.5"),
              HasSubstr("lora_dropout"));
  std::string text = wt::readFileBytes(wt::goldenDir() + "/qwen3_moe/adapter/" + kAdapterConfigFile);
  size_t begin = text.find("\"target_modules\": [");
  size_t end = text.find(']', begin);
  text.replace(begin, end + 1 - begin, "\"target_modules\": \"all-linear\"");
  EXPECT_THAT(statusText(parseAdapterConfig(text, "cfg.json").status()),
              HasSubstr("only a list of module names is supported"));
  EXPECT_THAT(statusText(parseAdapterConfig("{\"r\": 4,}", "cfg.json").status()),
              HasSubstr("cfg.json: malformed JSON"));
}

TEST(AdapterTest, ExportRejectsBadInput) {
  std::string dir = wt::freshTempDir() + "/out";
  std::vector<NamedTensor> tensors = smallTensors();
  tensors[1].data.pop_back();
  EXPECT_THAT(statusText(exportAdapter(dir, smallSpec(), tensors)), HasSubstr("needs 8 values, got 7"));
  tensors = smallTensors();
  tensors[0].name = "model.layers.0.self_attn.q_proj.lora_A.weight";
  EXPECT_THAT(statusText(exportAdapter(dir, smallSpec(), tensors)),
              HasSubstr("PEFT names start with \"base_model.model.\""));
  tensors = smallTensors();
  tensors[0].shape = {3, 2};
  EXPECT_THAT(statusText(exportAdapter(dir, smallSpec(), tensors)),
              HasSubstr("expected [r, in_features] with r = 2"));
  tensors = smallTensors();
  tensors.push_back({"base_model.model.experts.{expert}.lora_A.weight", {6}, iota(6)});
  EXPECT_THAT(statusText(exportAdapter(dir, smallSpec(), tensors)),
              HasSubstr("a stack of experts needs shape [E, ...]"));
  AdapterSpec spec = smallSpec();
  spec.r = 0;
  EXPECT_THAT(statusText(exportAdapter(dir, spec, smallTensors())), HasSubstr("r must be positive"));
  spec = smallSpec();
  spec.taskType = "CAUSAL";
  EXPECT_THAT(statusText(exportAdapter(dir, spec, smallTensors())), HasSubstr("not a PEFT TaskType"));
  EXPECT_FALSE(std::filesystem::exists(dir)) << "nothing is written for a rejected export";
}

} // namespace
} // namespace moec::runtime::peft
