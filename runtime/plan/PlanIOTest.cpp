//===- PlanIOTest.cpp - plan files: round trip and load errors ------------===//

#include "runtime/plan/PlanIO.h"

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/plan/PlanFormat.h"
#include "google/protobuf/util/message_differencer.h"
#include "runtime/plan/TestPlan.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace moec::plan {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// A fresh path under Bazel's per-test temporary directory.
std::string tempPath(const std::string &name) {
  const char *dir = std::getenv("TEST_TMPDIR");
  std::string path = std::string(dir ? dir : "/tmp") + "/" + name;
  ::unlink(path.c_str());
  return path;
}

bool exists(const std::string &path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0;
}

void writeFile(const std::string &path, const std::string &bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string tempOf(const std::string &path) { return path + ".tmp." + std::to_string(::getpid()); }

TEST(PlanIO, SaveThenLoadRoundTrips) {
  Plan plan = testing::makeValidPlan();
  std::string path = tempPath("roundtrip.moeplan");
  ASSERT_TRUE(savePlan(plan, path).ok());
  EXPECT_FALSE(exists(tempOf(path)));

  absl::StatusOr<Plan> loaded = loadPlan(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  std::string differences;
  google::protobuf::util::MessageDifferencer differencer;
  differencer.ReportDifferencesToString(&differences);
  EXPECT_TRUE(differencer.Compare(plan, *loaded)) << differences;
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(plan, *loaded));
}

TEST(PlanIO, SaveIntoAPipeWritesThroughItAndKeepsIt) {
  // -o /dev/null or a FIFO: written in place, not replaced by a renamed regular file.
  std::string path = tempPath("plan.fifo");
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  std::string received;
  std::thread reader([&] {
    std::ifstream in(path, std::ios::binary);
    received.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  });
  Plan plan = testing::makeValidPlan();
  absl::Status saved = savePlan(plan, path);
  reader.join();
  ASSERT_TRUE(saved.ok()) << saved;
  struct stat info;
  ASSERT_EQ(::stat(path.c_str(), &info), 0);
  EXPECT_TRUE(S_ISFIFO(info.st_mode));
  EXPECT_EQ(received, plan.SerializeAsString());
  EXPECT_FALSE(exists(tempOf(path)));
}

TEST(PlanIO, SaveReplacesAnExistingFile) {
  std::string path = tempPath("replace.moeplan");
  writeFile(path, "old contents");
  Plan plan = testing::makeValidPlan();
  plan.set_model("Replaced");
  ASSERT_TRUE(savePlan(plan, path).ok());
  absl::StatusOr<Plan> loaded = loadPlan(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->model(), "Replaced");
}

TEST(PlanIO, FailedSaveRemovesTheTemporaryAndKeepsTheTarget) {
  // Renaming a file over a directory fails after the temporary is written.
  std::string path = tempPath("target_is_a_directory");
  ::rmdir(path.c_str());
  ASSERT_EQ(::mkdir(path.c_str(), 0755), 0);
  absl::Status status = savePlan(testing::makeValidPlan(), path);
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr(path));
  EXPECT_FALSE(exists(tempOf(path)));
  struct stat info;
  ASSERT_EQ(::stat(path.c_str(), &info), 0);
  EXPECT_TRUE(S_ISDIR(info.st_mode));
}

TEST(PlanIO, SaveIntoAMissingDirectoryNamesThePath) {
  std::string path = tempPath("no_such_dir") + "/plan.moeplan";
  absl::Status status = savePlan(testing::makeValidPlan(), path);
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr(path));
  EXPECT_FALSE(exists(path));
}

TEST(PlanIO, LoadingAMissingFileNamesThePath) {
  std::string path = tempPath("missing.moeplan");
  absl::StatusOr<Plan> loaded = loadPlan(path);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(loaded.status().message()), StartsWith(path + ": cannot open"));
}

TEST(PlanIO, LoadingGarbageNamesThePath) {
  std::string path = tempPath("garbage.moeplan");
  writeFile(path, std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff garbage", 19));
  absl::StatusOr<Plan> loaded = loadPlan(path);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(loaded.status().message()), StartsWith(path + ": not a plan"));
}

TEST(PlanIO, LoadingATextFileNamesThePath) {
  std::string path = tempPath("config.json");
  writeFile(path, "{\"model_type\": \"qwen3_moe\"}\n");
  absl::StatusOr<Plan> loaded = loadPlan(path);
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(std::string(loaded.status().message()), StartsWith(path + ": not a plan"));
}

TEST(PlanIO, LoadingAnEmptyFileNamesThePath) {
  std::string path = tempPath("empty.moeplan");
  writeFile(path, "");
  absl::StatusOr<Plan> loaded = loadPlan(path);
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(std::string(loaded.status().message()), StartsWith(path + ": empty file"));
}

TEST(PlanIO, LoadingADirectoryNamesThePath) {
  std::string path = tempPath("a_directory");
  ::rmdir(path.c_str());
  ASSERT_EQ(::mkdir(path.c_str(), 0755), 0);
  absl::StatusOr<Plan> loaded = loadPlan(path);
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(std::string(loaded.status().message()), StartsWith(path + ": is a directory"));
}

TEST(PlanIO, LoadingAnInvalidPlanPrefixesThePath) {
  Plan plan = testing::makeValidPlan();
  plan.set_version(kPlanVersion + 1);
  std::string path = tempPath("future.moeplan");
  ASSERT_TRUE(savePlan(plan, path).ok());
  absl::StatusOr<Plan> loaded = loadPlan(path);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  std::string message(loaded.status().message());
  EXPECT_THAT(message, StartsWith(path + ": invalid plan: 1 problem(s)"));
  EXPECT_THAT(message, HasSubstr("version is 3, expected 2"));
}

} // namespace
} // namespace moec::plan
