//===- ConfigReaderTest.cpp - typed, spelling-aware reads of config.json ---===//

#include "compiler/frontend/ConfigReader.h"

#include <functional>
#include <string>
#include <vector>

#include "llvm/Support/Error.h"
#include "gtest/gtest.h"

using namespace llvm;

namespace moec::frontend {
namespace {

constexpr const char *kPath = "cfg.json";

/// Parses `text` as the file cfg.json; fails the test on malformed JSON.
ConfigReader parse(StringRef text) {
  Expected<ConfigReader> reader = ConfigReader::parse(kPath, text);
  if (!reader) {
    ADD_FAILURE() << "unexpected parse error: " << toString(reader.takeError());
    return cantFail(ConfigReader::parse(kPath, "{}"));
  }
  return std::move(*reader);
}

/// The reader's first recorded error as text, "" when none.
std::string errorOf(ConfigReader &reader) {
  Error error = reader.takeError();
  return error ? toString(std::move(error)) : "";
}

/// The JSON object `text` (defaults for setDefaults).
json::Object parseObject(StringRef text) {
  json::Value value = cantFail(json::parse(text));
  return std::move(*value.getAsObject());
}

//===----------------------------------------------------------------------===//
// Spellings and defaults
//===----------------------------------------------------------------------===//

// Tests that of several spellings present, the first one listed wins.
TEST(ConfigReaderTest, FirstSpellingWins) {
  ConfigReader config = parse(R"({"num_local_experts": 8, "n_routed_experts": 16})");
  EXPECT_EQ(config.optInt({"num_experts", "num_local_experts", "n_routed_experts"}), 8);
  EXPECT_EQ(config.optInt({"n_routed_experts", "num_local_experts"}), 16);
  EXPECT_EQ(config.optInt({"num_experts"}), std::nullopt);
  EXPECT_FALSE(config.failed());
}

// Tests that every spelling present counts as read, not only the one that wins.
TEST(ConfigReaderTest, EverySpellingPresentIsRead) {
  ConfigReader config =
      parse(R"({"num_experts_per_tok": 4, "experts_per_token": 4, "hidden_size": 64})");
  EXPECT_EQ(config.optInt({"num_experts_per_tok", "experts_per_token"}), 4);
  EXPECT_EQ(config.unreadKeys(), std::vector<std::string>{"hidden_size"});
}

// Tests that a default is used when no spelling is present, and only then.
TEST(ConfigReaderTest, DefaultsOnlyWhenAbsent) {
  ConfigReader absent = parse(R"({"hidden_size": 64})");
  absent.setDefaults(parseObject(R"({"norm_topk_prob": true, "decoder_sparse_step": 2})"));
  EXPECT_EQ(absent.optBool({"norm_topk_prob"}), true);
  EXPECT_EQ(absent.optInt({"decoder_sparse_step"}), 2);
  EXPECT_TRUE(absent.has({"norm_topk_prob"}));

  ConfigReader present = parse(R"({"norm_topk_prob": false, "decoder_sparse_step": 1})");
  present.setDefaults(parseObject(R"({"norm_topk_prob": true, "decoder_sparse_step": 2})"));
  EXPECT_EQ(present.optBool({"norm_topk_prob"}), false);
  EXPECT_EQ(present.optInt({"decoder_sparse_step"}), 1);
}

// Tests that a value under a later spelling beats the default of an earlier one.
TEST(ConfigReaderTest, AnySpellingInTheFileBeatsDefaults) {
  ConfigReader config = parse(R"({"moe_router_activation_func": "softmax"})");
  config.setDefaults(parseObject(R"({"scoring_func": "sigmoid"})"));
  EXPECT_EQ(config.optString({"scoring_func", "moe_router_activation_func"}), "softmax");
}

// Tests that defaults are not keys of the file: they are never reported unread.
TEST(ConfigReaderTest, DefaultsAreNotFileKeys) {
  ConfigReader config = parse(R"({"hidden_size": 64})");
  config.setDefaults(parseObject(R"({"norm_topk_prob": true})"));
  EXPECT_EQ(config.unreadKeys(), std::vector<std::string>{"hidden_size"});
}

// Tests that keyOf names the spelling a read would use: the file's first, then the
// defaults', then the first listed; nested keys with their prefix.
TEST(ConfigReaderTest, KeyOfNamesTheSpellingRead) {
  ConfigReader config = parse(R"({"hidden_act": "gelu", "rope_scaling": {"type": "dynamic"}})");
  config.setDefaults(parseObject(R"({"mlp_hidden_act": "relu2", "scoring_func": "sigmoid"})"));
  EXPECT_EQ(config.keyOf({"mlp_hidden_act", "hidden_act"}), "hidden_act");
  EXPECT_EQ(config.keyOf({"moe_router_activation_func", "scoring_func"}), "scoring_func");
  EXPECT_EQ(config.keyOf({"num_experts", "n_routed_experts"}), "num_experts");
  std::optional<ConfigReader> rope = config.optObject({"rope_scaling"});
  ASSERT_TRUE(rope.has_value());
  EXPECT_EQ(rope->keyOf({"rope_type", "type"}), "rope_scaling.type");
}

//===----------------------------------------------------------------------===//
// null
//===----------------------------------------------------------------------===//

// Tests that an explicit null reads as absent and a required null is missing.
TEST(ConfigReaderTest, NullCountsAsAbsent) {
  ConfigReader config = parse(R"({"q_lora_rank": null, "sliding_window": null})");
  EXPECT_FALSE(config.has({"q_lora_rank"}));
  EXPECT_TRUE(config.isNull({"q_lora_rank"}));
  EXPECT_FALSE(config.isNull({"kv_lora_rank"}));
  EXPECT_EQ(config.optInt({"q_lora_rank"}), std::nullopt);
  EXPECT_EQ(config.optString({"sliding_window"}), std::nullopt);
  EXPECT_FALSE(config.failed()) << "a null is not a type error";
  EXPECT_EQ(config.requireInt({"q_lora_rank"}), 0);
  EXPECT_EQ(errorOf(config), "cfg.json: key 'q_lora_rank': missing required key (an integer)");
}

// Tests that an explicit null overrides the config class's default, as in
// Hugging Face (`"q_lora_rank": null` means no query LoRA, not the default rank).
TEST(ConfigReaderTest, NullOverridesDefault) {
  ConfigReader config = parse(R"({"q_lora_rank": null})");
  config.setDefaults(parseObject(R"({"q_lora_rank": 1536})"));
  EXPECT_EQ(config.optInt({"q_lora_rank"}), std::nullopt);
  EXPECT_TRUE(config.isNull({"q_lora_rank"}));
  EXPECT_TRUE(config.unreadKeys().empty());
}

//===----------------------------------------------------------------------===//
// Types
//===----------------------------------------------------------------------===//

// Tests that an integer written as a float with no fraction (4.0) is accepted.
TEST(ConfigReaderTest, IntegralFloatIsAnInteger) {
  ConfigReader config = parse(R"({"num_experts_per_tok": 4.0, "intermediate_size": 768})");
  EXPECT_EQ(config.optInt({"num_experts_per_tok"}), 4);
  EXPECT_EQ(config.requireInt({"intermediate_size"}), 768);
  EXPECT_FALSE(config.failed());
}

// Tests that a fractional number is not an integer.
TEST(ConfigReaderTest, FractionalNumberIsNotAnInteger) {
  ConfigReader config = parse(R"({"num_experts_per_tok": 4.5})");
  EXPECT_EQ(config.optInt({"num_experts_per_tok"}), std::nullopt);
  EXPECT_EQ(errorOf(config),
            "cfg.json: key 'num_experts_per_tok': expected an integer, got a number");
}

// Tests that an integer reads as a number.
TEST(ConfigReaderTest, IntegerIsANumber) {
  ConfigReader config = parse(R"({"rope_theta": 1000000})");
  EXPECT_EQ(config.optDouble({"rope_theta"}), 1000000.0);
}

// Tests that a type error names the file and the key.
TEST(ConfigReaderTest, TypeErrorNamesFileAndKey) {
  ConfigReader config = parse(R"({"hidden_size": "64"})");
  EXPECT_EQ(config.requireInt({"hidden_size"}), 0);
  EXPECT_TRUE(config.failed());
  EXPECT_EQ(errorOf(config), "cfg.json: key 'hidden_size': expected an integer, got a string");
}

// Tests the wording of each kind of type error.
TEST(ConfigReaderTest, TypeErrorWording) {
  struct Case {
    const char *text;
    std::function<void(ConfigReader &)> read;
    const char *error;
  };
  std::vector<Case> cases = {
      {R"({"k": true})", [](ConfigReader &c) { c.optDouble({"k"}); },
       "cfg.json: key 'k': expected a number, got a boolean"},
      {R"({"k": 1})", [](ConfigReader &c) { c.optBool({"k"}); },
       "cfg.json: key 'k': expected true or false, got a number"},
      {R"({"k": [1]})", [](ConfigReader &c) { c.optString({"k"}); },
       "cfg.json: key 'k': expected a string, got a list"},
      {R"({"k": {}})", [](ConfigReader &c) { c.optIntList({"k"}); },
       "cfg.json: key 'k': expected a list of integers, got an object"},
      {R"({"k": [1, "2"]})", [](ConfigReader &c) { c.optIntList({"k"}); },
       "cfg.json: key 'k': expected a list of integers, but an element is a string"},
      {R"({"k": ["a", 2]})", [](ConfigReader &c) { c.optStringList({"k"}); },
       "cfg.json: key 'k': expected a list of strings, but an element is a number"},
      {R"({"k": "x"})", [](ConfigReader &c) { c.optObject({"k"}); },
       "cfg.json: key 'k': expected an object, got a string"},
  };
  for (const Case &c : cases) {
    ConfigReader config = parse(c.text);
    c.read(config);
    EXPECT_EQ(errorOf(config), c.error) << "for " << c.text;
  }
}

// Tests that a type error names the spelling actually found in the file.
TEST(ConfigReaderTest, TypeErrorNamesSpellingFound) {
  ConfigReader config = parse(R"({"num_local_experts": "8"})");
  EXPECT_EQ(config.optInt({"num_experts", "num_local_experts"}), std::nullopt);
  EXPECT_EQ(errorOf(config),
            "cfg.json: key 'num_local_experts': expected an integer, got a string");
}

// Tests that lists read element by element, with integral floats accepted.
TEST(ConfigReaderTest, Lists) {
  ConfigReader config = parse(R"({"mlp_only_layers": [0, 2.0, 5], "layer_types": ["a", "b"]})");
  EXPECT_EQ(config.optIntList({"mlp_only_layers"}), (std::vector<int64_t>{0, 2, 5}));
  EXPECT_EQ(config.optStringList({"layer_types"}), (std::vector<std::string>{"a", "b"}));
  EXPECT_FALSE(config.failed());
}

//===----------------------------------------------------------------------===//
// Errors
//===----------------------------------------------------------------------===//

// Tests that a missing required key is reported under its first spelling.
TEST(ConfigReaderTest, MissingRequiredKey) {
  ConfigReader config = parse(R"({"vocab_size": 256})");
  EXPECT_EQ(config.requireInt({"num_experts_per_tok", "experts_per_token"}), 0);
  EXPECT_EQ(errorOf(config),
            "cfg.json: key 'num_experts_per_tok': missing required key (an integer)");
  EXPECT_EQ(config.requireString({"model_type"}), "");
  EXPECT_EQ(errorOf(config), "cfg.json: key 'model_type': missing required key (a string)");
  EXPECT_EQ(config.requireDouble({"rms_norm_eps"}), 0.0);
  EXPECT_EQ(errorOf(config), "cfg.json: key 'rms_norm_eps': missing required key (a number)");
}

// Tests that only the first error is kept, and that taking it clears it.
TEST(ConfigReaderTest, FirstErrorWins) {
  ConfigReader config = parse(R"({"a": "x", "b": "y"})");
  config.optInt({"a"});
  config.optInt({"b"});
  config.fail("c", "something else");
  EXPECT_EQ(errorOf(config), "cfg.json: key 'a': expected an integer, got a string");
  EXPECT_FALSE(config.failed());
  EXPECT_EQ(errorOf(config), "");
  config.fail("c", "something else");
  EXPECT_EQ(errorOf(config), "cfg.json: key 'c': something else");
}

// Tests that malformed JSON is an error naming the file and the position.
TEST(ConfigReaderTest, MalformedJson) {
  Expected<ConfigReader> reader = ConfigReader::parse(kPath, "{\n  \"a\": 1,\n  \"b\": }\n");
  ASSERT_FALSE(static_cast<bool>(reader));
  std::string message = toString(reader.takeError());
  EXPECT_EQ(message.rfind("cfg.json: malformed JSON: ", 0), 0u) << message;
  EXPECT_NE(message.find("[3:"), std::string::npos) << "no line number in: " << message;
}

// Tests that a top level other than an object is rejected by kind.
TEST(ConfigReaderTest, TopLevelMustBeAnObject) {
  Expected<ConfigReader> reader = ConfigReader::parse(kPath, "[1, 2]");
  ASSERT_FALSE(static_cast<bool>(reader));
  EXPECT_EQ(toString(reader.takeError()),
            "cfg.json: expected a JSON object at the top level, got a list");
}

// Tests that a file that cannot be read is an error naming it.
TEST(ConfigReaderTest, UnreadableFile) {
  Expected<ConfigReader> reader = ConfigReader::open("/nonexistent/moec/config.json");
  ASSERT_FALSE(static_cast<bool>(reader));
  std::string message = toString(reader.takeError());
  EXPECT_EQ(message.rfind("/nonexistent/moec/config.json: cannot read: ", 0), 0u) << message;
}

//===----------------------------------------------------------------------===//
// Nested objects
//===----------------------------------------------------------------------===//

// Tests that keys of a nested object are reported with the object's name as prefix.
TEST(ConfigReaderTest, NestedKeysArePrefixed) {
  ConfigReader config =
      parse(R"({"rope_parameters": {"rope_theta": "big", "rope_type": "yarn", "factor": 4}})");
  std::optional<ConfigReader> rope = config.optObject({"rope_parameters"});
  ASSERT_TRUE(rope.has_value());
  EXPECT_EQ(rope->optString({"rope_type"}), "yarn");
  EXPECT_EQ(rope->optDouble({"rope_theta"}), std::nullopt);
  EXPECT_EQ(rope->unreadKeys(), std::vector<std::string>{"rope_parameters.factor"});
  // The nested reader shares the file's error: the parent sees it.
  EXPECT_TRUE(config.failed());
  EXPECT_EQ(errorOf(config),
            "cfg.json: key 'rope_parameters.rope_theta': expected a number, got a string");
}

// Tests that a missing key in a nested object is reported with the prefix.
TEST(ConfigReaderTest, NestedMissingKeyIsPrefixed) {
  ConfigReader config = parse(R"({"linear_attn_config": {"head_dim": 128}})");
  std::optional<ConfigReader> linear = config.optObject({"linear_attn_config"});
  ASSERT_TRUE(linear.has_value());
  EXPECT_EQ(linear->requireInt({"head_dim"}), 128);
  EXPECT_EQ(linear->requireInt({"num_heads"}), 0);
  EXPECT_EQ(errorOf(*linear),
            "cfg.json: key 'linear_attn_config.num_heads': missing required key (an integer)");
}

// Tests that the prefix accumulates through two levels of nesting.
TEST(ConfigReaderTest, DoublyNestedKeysArePrefixed) {
  ConfigReader config = parse(R"({"a": {"b": {"c": "x"}}})");
  std::optional<ConfigReader> a = config.optObject({"a"});
  ASSERT_TRUE(a.has_value());
  std::optional<ConfigReader> b = a->optObject({"b"});
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->optInt({"c"}), std::nullopt);
  EXPECT_EQ(errorOf(config), "cfg.json: key 'a.b.c': expected an integer, got a string");
}

// Tests that a null nested object reads as absent.
TEST(ConfigReaderTest, NullNestedObjectIsAbsent) {
  ConfigReader config = parse(R"({"rope_scaling": null})");
  EXPECT_FALSE(config.optObject({"rope_scaling"}).has_value());
  EXPECT_FALSE(config.failed());
}

//===----------------------------------------------------------------------===//
// Unread keys
//===----------------------------------------------------------------------===//

// Tests that unread keys are those neither read nor marked, sorted.
TEST(ConfigReaderTest, UnreadKeys) {
  ConfigReader config =
      parse(R"({"zeta": 1, "hidden_size": 64, "alpha": 2, "use_cache": true, "vocab_size": 256})");
  EXPECT_EQ(config.unreadKeys(),
            (std::vector<std::string>{"alpha", "hidden_size", "use_cache", "vocab_size", "zeta"}));
  config.requireInt({"hidden_size"});
  config.has({"vocab_size"});
  config.markRead({"use_cache", "not_in_file"});
  config.optInt({"absent_key"});
  EXPECT_EQ(config.unreadKeys(), (std::vector<std::string>{"alpha", "zeta"}));
}

// Tests that a key read with the wrong type still counts as read.
TEST(ConfigReaderTest, KeyWithTypeErrorIsRead) {
  ConfigReader config = parse(R"({"hidden_size": "64"})");
  config.optInt({"hidden_size"});
  EXPECT_TRUE(config.unreadKeys().empty());
}

} // namespace
} // namespace moec::frontend
