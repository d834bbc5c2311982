//===- DatasetTest.cpp - JSON Lines and token files ----------------------===//

#include "runtime/data/Dataset.h"

#include <string>
#include <vector>

#include "runtime/weights/TestSupport.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace moec::runtime::data {
namespace {

namespace wt = weights::testing;
using ::testing::HasSubstr;

std::string writeText(const std::string &name, const std::string &text) {
  std::string path = wt::freshTempDir() + "/" + name;
  wt::writeFileBytes(path, text);
  return path;
}

std::vector<int64_t> allTokens(const Dataset &dataset) {
  std::vector<int64_t> ids(size_t(dataset.numTokens())), labels(ids.size());
  dataset.copy(0, dataset.numTokens(), ids.data(), labels.data());
  return ids;
}

std::vector<int64_t> allLabels(const Dataset &dataset) {
  std::vector<int64_t> ids(size_t(dataset.numTokens())), labels(ids.size());
  dataset.copy(0, dataset.numTokens(), ids.data(), labels.data());
  return labels;
}

/// The message of a failed read of `text` as JSON Lines with a vocabulary of 100.
std::string jsonlError(const std::string &text) {
  std::string path = writeText("data.jsonl", text);
  auto dataset = Dataset::readJsonLines(path, 100);
  EXPECT_FALSE(dataset.ok()) << "accepted: " << text;
  if (dataset.ok())
    return "";
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kInvalidArgument);
  std::string message(dataset.status().message());
  EXPECT_THAT(message, HasSubstr(path)) << "the error should name the file";
  return message;
}

TEST(JsonLinesTest, ConcatenatesRecordsAndDefaultsLabels) {
  std::string path = writeText("data.jsonl",
                               "{\"input_ids\": [1, 2, 3]}\n"
                               "\n"
                               "{\"input_ids\": [4, 5], \"labels\": [-100, 5], \"text\": \"x\"}\r\n"
                               "   \n"
                               "{\"input_ids\": [6], \"labels\": null}");
  auto dataset = Dataset::readJsonLines(path, 10);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ((*dataset)->numTokens(), 6);
  EXPECT_EQ((*dataset)->numDocuments(), 3);
  EXPECT_EQ((*dataset)->documentStart(0), 0);
  EXPECT_EQ((*dataset)->documentStart(1), 3);
  EXPECT_EQ((*dataset)->documentStart(2), 5);
  EXPECT_EQ(allTokens(**dataset), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  // Records without labels score every token; the second record masks its first.
  EXPECT_EQ(allLabels(**dataset), (std::vector<int64_t>{1, 2, 3, -100, 5, 6}));
}

TEST(JsonLinesTest, LabelsDefaultToInputIdsWhenNoRecordHasThem) {
  std::string path = writeText("data.jsonl", "{\"input_ids\": [7, 8]}\n{\"input_ids\": [9]}\n");
  auto dataset = Dataset::readJsonLines(path, 10);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ(allLabels(**dataset), (std::vector<int64_t>{7, 8, 9}));
  std::vector<int64_t> ids(2), labels(2);
  (*dataset)->copy(1, 2, ids.data(), labels.data());
  EXPECT_EQ(ids, (std::vector<int64_t>{8, 9}));
  EXPECT_EQ(labels, (std::vector<int64_t>{8, 9}));
}

TEST(JsonLinesTest, MalformedJsonNamesTheLine) {
  std::string message = jsonlError("{\"input_ids\": [1]}\n{\"input_ids\": [1,]}\n");
  EXPECT_THAT(message, HasSubstr("data.jsonl:2: malformed JSON"));
  EXPECT_THAT(message, HasSubstr("at byte"));
}

TEST(JsonLinesTest, RecordMustBeAnObject) {
  EXPECT_THAT(jsonlError("[1, 2, 3]\n"), HasSubstr(":1: expected an object"));
}

TEST(JsonLinesTest, MissingInputIds) {
  std::string message = jsonlError("{\"input_ids\": [1]}\n{\"labels\": [1]}\n");
  EXPECT_THAT(message, HasSubstr(":2: missing \"input_ids\""));
}

TEST(JsonLinesTest, InputIdsMustBeAnArray) {
  EXPECT_THAT(jsonlError("{\"input_ids\": 5}\n"),
              HasSubstr(":1: \"input_ids\" is an integer, expected an array"));
}

TEST(JsonLinesTest, NonIntegerTokens) {
  EXPECT_THAT(jsonlError("{\"input_ids\": [1, 2.5]}\n"),
              HasSubstr(":1: input_ids[1] is 2.5, expected an integer token id"));
  EXPECT_THAT(jsonlError("\n\n{\"input_ids\": [\"a\"]}\n"),
              HasSubstr(":3: input_ids[0] is the string \"a\", expected an integer"));
  EXPECT_THAT(jsonlError("{\"input_ids\": [1], \"labels\": [true]}\n"),
              HasSubstr(":1: labels[0] is a boolean, expected an integer"));
}

TEST(JsonLinesTest, TokenIdsOutsideTheVocabulary) {
  EXPECT_THAT(jsonlError("{\"input_ids\": [1, -1]}\n"),
              HasSubstr(":1: input_ids[1] = -1 is outside the vocabulary [0, 100)"));
  EXPECT_THAT(jsonlError("{\"input_ids\": [100]}\n"),
              HasSubstr(":1: input_ids[0] = 100 is outside the vocabulary [0, 100)"));
  EXPECT_THAT(jsonlError("{\"input_ids\": [1, 2], \"labels\": [-100, 100]}\n"),
              HasSubstr(":1: labels[1] = 100 is outside the vocabulary [0, 100) and is not -100"));
  EXPECT_THAT(jsonlError("{\"input_ids\": [1, 2], \"labels\": [-1, 2]}\n"),
              HasSubstr("labels[0] = -1"));
}

TEST(JsonLinesTest, LabelsLengthMismatch) {
  EXPECT_THAT(jsonlError("{\"input_ids\": [1, 2, 3], \"labels\": [1, 2]}\n"),
              HasSubstr(":1: \"labels\" has 2 entries but \"input_ids\" has 3"));
}

TEST(JsonLinesTest, EmptyDataset) {
  EXPECT_THAT(jsonlError(""), HasSubstr("empty dataset"));
  EXPECT_THAT(jsonlError("\n{\"input_ids\": []}\n"), HasSubstr("empty dataset"));
}

TEST(JsonLinesTest, MissingFile) {
  auto dataset = Dataset::readJsonLines(wt::freshTempDir() + "/absent.jsonl", 10);
  ASSERT_FALSE(dataset.ok());
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(dataset.status().message()), HasSubstr("absent.jsonl"));
}

std::string tokenFileBytes(uint32_t width, uint32_t reserved, const std::string &payload) {
  std::string bytes("MOETOKS1", 8);
  for (uint32_t value : {width, reserved})
    for (int i = 0; i < 4; ++i)
      bytes += char((value >> (8 * i)) & 0xff);
  return bytes + payload;
}

std::string tokenFileError(const std::string &bytes, int64_t vocab = 1000) {
  std::string path = writeText("tokens.bin", bytes);
  auto dataset = Dataset::readTokenFile(path, vocab);
  EXPECT_FALSE(dataset.ok());
  if (dataset.ok())
    return "";
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kInvalidArgument);
  std::string message(dataset.status().message());
  EXPECT_THAT(message, HasSubstr(path));
  return message;
}

TEST(TokenFileTest, RoundTripsBothWidths) {
  std::vector<int64_t> tokens = {0, 1, 65535, 300, 2};
  for (uint32_t width : {2u, 4u}) {
    std::string path = wt::freshTempDir() + "/tokens.bin";
    ASSERT_TRUE(writeTokenFile(path, tokens, width).ok());
    std::string bytes = wt::readFileBytes(path);
    ASSERT_EQ(bytes.size(), kTokenFileHeaderBytes + tokens.size() * width);
    EXPECT_EQ(bytes.substr(0, 8), "MOETOKS1");
    EXPECT_EQ(uint8_t(bytes[8]), width);
    // Little-endian: 300 = 0x012c.
    EXPECT_EQ(uint8_t(bytes[16 + 3 * width]), 0x2c);
    EXPECT_EQ(uint8_t(bytes[16 + 3 * width + 1]), 0x01);

    auto dataset = Dataset::readTokenFile(path, 70000);
    ASSERT_TRUE(dataset.ok()) << dataset.status();
    EXPECT_EQ((*dataset)->numTokens(), 5);
    EXPECT_EQ((*dataset)->numDocuments(), 1);
    EXPECT_EQ(allTokens(**dataset), tokens);
    EXPECT_EQ(allLabels(**dataset), tokens);
  }
  std::vector<int64_t> big = {int64_t(1) << 31, 5};
  std::string path = wt::freshTempDir() + "/big.bin";
  EXPECT_FALSE(writeTokenFile(path, big, 2).ok());
  ASSERT_TRUE(writeTokenFile(path, big, 4).ok());
  auto dataset = Dataset::readTokenFile(path, int64_t(1) << 32);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ(allTokens(**dataset), big);
}

TEST(TokenFileTest, EosSplitsDocuments) {
  std::string path = wt::freshTempDir() + "/tokens.bin";
  ASSERT_TRUE(writeTokenFile(path, {5, 6, 0, 7, 0, 8, 9}, 2).ok());
  auto dataset = Dataset::readTokenFile(path, 10, 0);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  ASSERT_EQ((*dataset)->numDocuments(), 3);
  EXPECT_EQ((*dataset)->documentStart(1), 3);
  EXPECT_EQ((*dataset)->documentStart(2), 5);
  // A trailing EOS ends the last document without opening another.
  ASSERT_TRUE(writeTokenFile(path, {5, 0, 6, 0}, 2).ok());
  dataset = Dataset::readTokenFile(path, 10, 0);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ((*dataset)->numDocuments(), 2);
  EXPECT_FALSE(Dataset::readTokenFile(path, 10, 10).ok()) << "EOS outside the vocabulary";
}

TEST(TokenFileTest, TruncatedHeader) {
  EXPECT_THAT(tokenFileError("MOETOKS1\x02"),
              HasSubstr("byte 9: truncated token file: the header needs 16 bytes, the file has 9"));
  EXPECT_THAT(tokenFileError(""), HasSubstr("truncated token file"));
}

TEST(TokenFileTest, BadHeader) {
  std::string wrongMagic = tokenFileBytes(2, 0, std::string("\x01\x00", 2));
  wrongMagic[7] = '2';
  EXPECT_THAT(tokenFileError(wrongMagic),
              HasSubstr("byte 0: bad header: expected the magic \"MOETOKS1\""));
  EXPECT_THAT(tokenFileError(tokenFileBytes(3, 0, std::string("\x01\x00\x00", 3))),
              HasSubstr("byte 8: bad header: token width 3, expected 2 or 4"));
  EXPECT_THAT(tokenFileError(tokenFileBytes(2, 7, std::string("\x01\x00", 2))),
              HasSubstr("byte 12: bad header: reserved field is 7, expected 0"));
}

TEST(TokenFileTest, TruncatedTokens) {
  // Two whole 4-byte tokens and three bytes of a third.
  std::string payload("\x01\x00\x00\x00\x02\x00\x00\x00\x03\x00\x00", 11);
  EXPECT_THAT(tokenFileError(tokenFileBytes(4, 0, payload)),
              HasSubstr("byte 24: truncated token file: 3 trailing bytes do not make a whole "
                        "4-byte token"));
}

TEST(TokenFileTest, TokenOutsideTheVocabulary) {
  std::string payload("\x01\x00\x02\x00\xe8\x03", 6); // 1, 2, 1000
  EXPECT_THAT(tokenFileError(tokenFileBytes(2, 0, payload), 1000),
              HasSubstr("byte 20: token 2 = 1000 is outside the vocabulary [0, 1000)"));
}

TEST(TokenFileTest, EmptyDataset) {
  EXPECT_THAT(tokenFileError(tokenFileBytes(2, 0, "")), HasSubstr("empty dataset"));
}

TEST(DatasetOpenTest, SniffsTheFormat) {
  std::string dir = wt::freshTempDir();
  ASSERT_TRUE(writeTokenFile(dir + "/a.data", {3, 4}, 2).ok());
  wt::writeFileBytes(dir + "/b.data", "{\"input_ids\": [3, 4, 5]}\n");
  auto binary = Dataset::open(dir + "/a.data", 10);
  ASSERT_TRUE(binary.ok()) << binary.status();
  EXPECT_EQ((*binary)->numTokens(), 2);
  auto jsonl = Dataset::open(dir + "/b.data", 10);
  ASSERT_TRUE(jsonl.ok()) << jsonl.status();
  EXPECT_EQ((*jsonl)->numTokens(), 3);
  EXPECT_EQ(Dataset::open(dir + "/c.data", 10).status().code(), absl::StatusCode::kNotFound);
}

} // namespace
} // namespace moec::runtime::data
