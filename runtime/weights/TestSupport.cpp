//===- TestSupport.cpp - files for the weights tests ---------------------===//

#include "runtime/weights/TestSupport.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "gtest/gtest.h"

namespace moec::runtime::weights::testing {

std::string goldenDir() {
  const char *srcdir = std::getenv("TEST_SRCDIR");
  if (!srcdir) {
    ADD_FAILURE() << "TEST_SRCDIR is not set; run this test with `bazel test`";
    return "";
  }
  // Bazel 4 puts external repositories both at the runfiles root and under the workspace.
  for (std::string root :
       {std::string(srcdir) + "/golden", std::string(srcdir) + "/moec/external/golden"})
    if (std::filesystem::is_directory(root))
      return root;
  ADD_FAILURE() << "the golden references (@golden//:files) are not in the runfiles under "
                << srcdir;
  return "";
}

std::string freshTempDir() {
  const char *tmp = std::getenv("TEST_TMPDIR");
  const ::testing::TestInfo *test = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = std::string(test->test_suite_name()) + "." + test->name();
  for (char &c : name)
    if (c == '/')
      c = '_';
  std::filesystem::path dir = std::filesystem::path(tmp ? tmp : "/tmp") / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

std::string readFileBytes(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot read " << path;
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void writeFileBytes(const std::string &path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  EXPECT_TRUE(out) << "cannot write " << path;
}

std::string safetensorsBytes(uint64_t declaredLength, std::string_view header,
                             std::string_view data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[i] = char((declaredLength >> (8 * i)) & 0xff);
  out.append(header);
  out.append(data);
  return out;
}

std::string safetensorsBytes(std::string_view header, std::string_view data) {
  return safetensorsBytes(header.size(), header, data);
}

} // namespace moec::runtime::weights::testing
