//===- CudaDeviceStreamsTest.cpp - the plan's streams and events on a GPU -===//
//
// A plan with a second stream (--moe-schedule-overlap) orders its streams by
// events only: these check that a wait holds its stream until the matching
// record, and that joining orders every stream after the others. Each check
// keeps stream 0 busy with large copies before the other stream reads what they
// write, so a missing wait would read the buffer half written.
//
//===----------------------------------------------------------------------===//

#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "runtime/backends/cuda/CudaDevice.h"

namespace moec::runtime::cuda {
namespace {

constexpr size_t kCount = size_t(64) << 20; // 256 MB of int32: ~0.1 ms a copy on an H200

struct Buffers {
  Device &dev;
  void *source = nullptr, *middle = nullptr, *result = nullptr;
  std::vector<int32_t> expected;

  explicit Buffers(Device &dev) : dev(dev), expected(kCount) {
    std::iota(expected.begin(), expected.end(), 1);
    source = *dev.allocate(kCount * 4);
    middle = *dev.allocate(kCount * 4);
    result = *dev.allocate(kCount * 4);
    EXPECT_TRUE(dev.upload(source, expected.data(), kCount * 4).ok());
  }
  ~Buffers() {
    dev.release(source);
    dev.release(middle);
    dev.release(result);
  }
  /// Stream 0 writes `middle` from `source` four times over (the last copy is what counts).
  void busyWrite() {
    ASSERT_TRUE(dev.useStream(0).ok());
    ASSERT_TRUE(dev.zero(middle, kCount * 4).ok());
    for (int i = 0; i < 4; ++i)
      ASSERT_TRUE(dev.copy(middle, source, kCount * 4).ok());
  }
  void expectResult(const char *what) {
    ASSERT_TRUE(dev.synchronize().ok());
    std::vector<int32_t> got(kCount);
    ASSERT_TRUE(dev.useStream(0).ok());
    ASSERT_TRUE(dev.download(got.data(), result, kCount * 4).ok());
    size_t wrong = 0;
    for (size_t i = 0; i < kCount; ++i)
      wrong += got[i] != expected[i];
    EXPECT_EQ(wrong, 0u) << what;
  }
};

std::unique_ptr<Device> deviceOrSkip() {
  absl::StatusOr<std::unique_ptr<Device>> dev = makeCudaDevice(0);
  return dev.ok() ? std::move(*dev) : nullptr;
}

TEST(CudaDeviceStreams, AWaitHoldsItsStreamUntilTheRecord) {
  std::unique_ptr<Device> dev = deviceOrSkip();
  if (!dev)
    GTEST_SKIP() << "no GPU";
  Buffers b(*dev);
  for (int round = 0; round < 3; ++round) {
    b.busyWrite();
    ASSERT_TRUE(dev->recordEvent(round).ok());
    ASSERT_TRUE(dev->useStream(1).ok());
    ASSERT_TRUE(dev->waitEvent(round).ok());
    ASSERT_TRUE(dev->copy(b.result, b.middle, kCount * 4).ok());
    b.expectResult("stream 1 copied what stream 0 wrote before the record");
  }
}

TEST(CudaDeviceStreams, JoiningOrdersEveryStreamAfterTheOthers) {
  std::unique_ptr<Device> dev = deviceOrSkip();
  if (!dev)
    GTEST_SKIP() << "no GPU";
  Buffers b(*dev);
  // Stream 1 writes, the join, then stream 0 reads.
  ASSERT_TRUE(dev->useStream(1).ok());
  ASSERT_TRUE(dev->zero(b.middle, kCount * 4).ok());
  for (int i = 0; i < 4; ++i)
    ASSERT_TRUE(dev->copy(b.middle, b.source, kCount * 4).ok());
  ASSERT_TRUE(dev->joinStreams().ok());
  ASSERT_TRUE(dev->useStream(0).ok());
  ASSERT_TRUE(dev->copy(b.result, b.middle, kCount * 4).ok());
  b.expectResult("stream 0 after the join copied what stream 1 wrote before it");
  // And the other way.
  b.busyWrite();
  ASSERT_TRUE(dev->joinStreams().ok());
  ASSERT_TRUE(dev->useStream(1).ok());
  ASSERT_TRUE(dev->copy(b.result, b.middle, kCount * 4).ok());
  b.expectResult("stream 1 after the join copied what stream 0 wrote before it");
}

TEST(CudaDeviceStreams, RefusesAWaitForAnEventNeverRecordedAndStreamsOutOfRange) {
  std::unique_ptr<Device> dev = deviceOrSkip();
  if (!dev)
    GTEST_SKIP() << "no GPU";
  absl::Status early = dev->waitEvent(5);
  EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(early.message().find("event 5 is waited for before it is recorded"), absl::string_view::npos);
  EXPECT_EQ(dev->useStream(16).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dev->useStream(-1).code(), absl::StatusCode::kInvalidArgument);
}

} // namespace
} // namespace moec::runtime::cuda
