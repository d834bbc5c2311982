//===- JsonTest.cpp - the strict JSON reader -----------------------------===//

#include "runtime/weights/Json.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace moec::runtime::weights {
namespace {

using ::testing::HasSubstr;

std::string errorOf(std::string_view text) {
  absl::StatusOr<JsonValue> value = parseJson(text);
  EXPECT_FALSE(value.ok()) << "accepted: " << text;
  return value.ok() ? "" : std::string(value.status().message());
}

TEST(JsonTest, ParsesEveryKind) {
  absl::StatusOr<JsonValue> value =
      parseJson(R"( {"a": [1, -2, 3.5, 1e2], "b": {"c": null, "d": true, "e": false}, "s": "x"} )");
  ASSERT_TRUE(value.ok()) << value.status();
  ASSERT_EQ(value->kind, JsonValue::Kind::Object);
  ASSERT_EQ(value->object.size(), 3u);
  EXPECT_EQ(value->object[0].first, "a"); // file order is kept
  const JsonValue *a = value->find("a");
  ASSERT_TRUE(a && a->kind == JsonValue::Kind::Array && a->array.size() == 4);
  EXPECT_EQ(a->array[0].kind, JsonValue::Kind::Integer);
  EXPECT_EQ(a->array[1].integer, -2);
  EXPECT_EQ(a->array[2].kind, JsonValue::Kind::Number);
  EXPECT_EQ(a->array[2].number, 3.5);
  EXPECT_EQ(a->array[3].kind, JsonValue::Kind::Number);
  EXPECT_EQ(a->array[3].number, 100.0);
  const JsonValue *b = value->find("b");
  EXPECT_EQ(b->find("c")->kind, JsonValue::Kind::Null);
  EXPECT_TRUE(b->find("d")->boolean);
  EXPECT_FALSE(b->find("e")->boolean);
  EXPECT_EQ(value->find("s")->string, "x");
  EXPECT_EQ(value->find("missing"), nullptr);
}

TEST(JsonTest, StringEscapes) {
  absl::StatusOr<JsonValue> value =
      parseJson(R"("q\" b\\ s\/ \b\f\n\r\t \u00e9 \u20ac \ud83d\ude00 raw é")");
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(value->string, "q\" b\\ s/ \b\f\n\r\t \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 raw é");
}

TEST(JsonTest, Integers) {
  EXPECT_EQ(parseJson("9223372036854775807")->integer, INT64_MAX);
  EXPECT_EQ(parseJson("-9223372036854775808")->integer, INT64_MIN);
  // Beyond int64 the value is kept as a (non-integer) number rather than rejected.
  absl::StatusOr<JsonValue> huge = parseJson("18446744073709551616");
  ASSERT_TRUE(huge.ok());
  EXPECT_EQ(huge->kind, JsonValue::Kind::Number);
  EXPECT_THAT(errorOf("1e999"), HasSubstr("out of range"));
}

TEST(JsonTest, RejectsWhatJsonForbids) {
  EXPECT_THAT(errorOf(""), HasSubstr("unexpected end"));
  EXPECT_THAT(errorOf("[1, 2,]"), HasSubstr("at byte 6"));
  EXPECT_THAT(errorOf("{\"a\": 1,}"), HasSubstr("expected a string key"));
  EXPECT_THAT(errorOf("{a: 1}"), HasSubstr("expected a string key"));
  EXPECT_THAT(errorOf("// c\n{}"), HasSubstr("unexpected character"));
  EXPECT_THAT(errorOf("01"), HasSubstr("leading zeros"));
  EXPECT_THAT(errorOf("NaN"), HasSubstr("unexpected character"));
  EXPECT_THAT(errorOf("1."), HasSubstr("after '.'"));
  EXPECT_THAT(errorOf("-"), HasSubstr("expected a digit"));
  EXPECT_THAT(errorOf("tru"), HasSubstr("invalid literal"));
  EXPECT_THAT(errorOf("\"abc"), HasSubstr("unterminated string"));
  EXPECT_THAT(errorOf("\"a\nb\""), HasSubstr("control character"));
  EXPECT_THAT(errorOf("\"\\x\""), HasSubstr("invalid escape"));
  EXPECT_THAT(errorOf("\"\\u12zz\""), HasSubstr("hex digit"));
  EXPECT_THAT(errorOf("\"\\u12"), HasSubstr("truncated"));
  EXPECT_THAT(errorOf("\"\\ud800\""), HasSubstr("high surrogate"));
  EXPECT_THAT(errorOf("\"\\udc00\""), HasSubstr("low surrogate"));
  EXPECT_THAT(errorOf("\"\xff\""), HasSubstr("invalid UTF-8"));
  EXPECT_THAT(errorOf("\"\xc0\xaf\""), HasSubstr("invalid UTF-8"));     // overlong '/'
  EXPECT_THAT(errorOf("\"\xed\xa0\x80\""), HasSubstr("invalid UTF-8")); // encoded surrogate
  EXPECT_THAT(errorOf("{} {}"), HasSubstr("after the JSON value"));
  EXPECT_THAT(errorOf("{\"a\" 1}"), HasSubstr("expected ':'"));
  EXPECT_THAT(errorOf("[1 2]"), HasSubstr("expected ',' or ']'"));
}

TEST(JsonTest, DuplicateKeyIsReportedWhereItIs) {
  EXPECT_THAT(errorOf(R"({"a": 1, "b": 2, "a": 3})"), HasSubstr("at byte 17: duplicate key \"a\""));
  EXPECT_THAT(errorOf(R"({"x": {"k": 1, "k": 1}})"), HasSubstr("duplicate key \"k\""));
}

TEST(JsonTest, DeepNestingIsAnErrorNotACrash) {
  EXPECT_THAT(errorOf(std::string(100000, '[')), HasSubstr("nesting deeper"));
  std::string object;
  for (int i = 0; i < 100000; ++i)
    object += "{\"a\":";
  EXPECT_THAT(errorOf(object), HasSubstr("nesting deeper"));
  EXPECT_TRUE(parseJson(std::string(60, '[') + std::string(60, ']')).ok());
}

TEST(JsonTest, Utf8Validation) {
  EXPECT_TRUE(isValidUtf8("plain"));
  EXPECT_TRUE(isValidUtf8("\xc3\xa9\xf0\x9f\x98\x80"));
  EXPECT_FALSE(isValidUtf8("\xc3"));
  EXPECT_FALSE(isValidUtf8("\xf4\x90\x80\x80")); // above U+10FFFF
}

TEST(JsonTest, WritesStringsThatParseBack) {
  std::string text = std::string("q\" b\\ \n\t\x01 é") + '\0';
  std::string literal;
  appendJsonString(literal, text);
  EXPECT_EQ(literal, "\"q\\\" b\\\\ \\n\\t\\u0001 é\\u0000\"");
  absl::StatusOr<JsonValue> back = parseJson(literal);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->string, text);
}

} // namespace
} // namespace moec::runtime::weights
