//===- SystemLibsTest.cpp - Debian's protobuf and Abseil link and work ----===//

#include "absl/strings/str_cat.h"
#include "third_party/system/toolchain_probe.pb.h"
#include "gtest/gtest.h"

namespace {

TEST(SystemLibs, ProtobufRoundTrips) {
  moec::probe::Probe probe;
  probe.set_version(3);
  probe.add_shape(4096);
  probe.add_shape(2048);
  probe.set_name("q_proj");
  std::string bytes;
  ASSERT_TRUE(probe.SerializeToString(&bytes));
  moec::probe::Probe parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  EXPECT_EQ(parsed.version(), 3u);
  ASSERT_EQ(parsed.shape_size(), 2);
  EXPECT_EQ(parsed.shape(1), 2048);
  EXPECT_EQ(parsed.name(), "q_proj");
}

TEST(SystemLibs, AbseilFormats) { EXPECT_EQ(absl::StrCat("layer", 7, ".", 1.5), "layer7.1.5"); }

} // namespace
