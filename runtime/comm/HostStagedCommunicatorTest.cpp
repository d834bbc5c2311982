//===- HostStagedCommunicatorTest.cpp - host collectives on device buffers -===//

#include "runtime/comm/HostStagedCommunicator.h"

#include <cstring>
#include <functional>
#include <thread>

#include "runtime/comm/CpuCommunicator.h"
#include "gtest/gtest.h"

namespace moec::runtime::comm {
namespace {

/// A rank's "device memory": the communicator gets addresses in `shadow` (zeros), and only the
/// transfers reach `real`, so a collective that read or wrote the buffers directly would see
/// zeros and leave `real` alone.
struct FakeDevice {
  explicit FakeDevice(size_t bytes) : real(bytes, 0), shadow(bytes, 0) {}
  std::vector<char> real, shadow;
  size_t copies = 0;

  template <typename T> T *at(size_t element) { return reinterpret_cast<T *>(shadow.data()) + element; }
  template <typename T> T value(size_t element) const {
    T out;
    std::memcpy(&out, real.data() + element * sizeof(T), sizeof(T));
    return out;
  }
  template <typename T> void set(const std::vector<T> &values) { std::memcpy(real.data(), values.data(), values.size() * sizeof(T)); }
  char *translate(const void *p) { return real.data() + (static_cast<const char *>(p) - shadow.data()); }
  HostTransfers transfers() {
    return {[this](void *host, const void *device, size_t bytes) {
              ++copies;
              std::memcpy(host, translate(device), bytes);
              return absl::OkStatus();
            },
            [this](void *device, const void *host, size_t bytes) {
              ++copies;
              std::memcpy(translate(device), host, bytes);
              return absl::OkStatus();
            }};
  }
};

void onStagedRanks(int n, const std::function<void(Communicator &, FakeDevice &)> &body) {
  auto group = makeCpuGroup(n, 30);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      FakeDevice device(256);
      std::unique_ptr<Communicator> comm = makeHostStagedCommunicator(makeCpuCommunicator(group, r), device.transfers());
      body(*comm, device);
    });
  for (std::thread &t : threads)
    t.join();
}

TEST(HostStagedCommunicator, ReductionsGathersAndBroadcastReachDeviceMemory) {
  onStagedRanks(2, [](Communicator &comm, FakeDevice &device) {
    int r = comm.rank();
    EXPECT_EQ(comm.name(), "cpu threads, staged through host memory");
    device.set<float>({float(r + 1), 10.0f * (r + 1)});
    ASSERT_TRUE(comm.allReduce(device.at<float>(0), device.at<float>(0), 2, plan::F32).ok());
    EXPECT_EQ(device.value<float>(0), 3);
    EXPECT_EQ(device.value<float>(1), 30);

    device.set<float>({float(r), float(r) + 0.5f});
    ASSERT_TRUE(comm.allGather(device.at<float>(0), device.at<float>(2), 2, plan::F32).ok());
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(device.value<float>(2 + i), (std::vector<float>{0, 0.5f, 1, 1.5f})[i]);

    device.set<float>({1.0f * (r + 1), 2.0f * (r + 1), 3.0f * (r + 1), 4.0f * (r + 1)});
    ASSERT_TRUE(comm.reduceScatter(device.at<float>(0), device.at<float>(8), 2, plan::F32).ok());
    EXPECT_EQ(device.value<float>(8), r == 0 ? 3 : 9);
    EXPECT_EQ(device.value<float>(9), r == 0 ? 6 : 12);

    device.set<int32_t>({r == 1 ? 7 : 0});
    ASSERT_TRUE(comm.broadcast(device.at<int32_t>(0), 1, plan::I32, /*root=*/1).ok());
    EXPECT_EQ(device.value<int32_t>(0), 7);
    EXPECT_GT(device.copies, 0u);
  });
}

TEST(HostStagedCommunicator, ExchangeWritesOnlyTheReceivedSegments) {
  onStagedRanks(2, [](Communicator &comm, FakeDevice &device) {
    int r = comm.rank();
    // in: elements 0..3 = 10 r + i; out at elements 16..23, prefilled with -1. Each rank sends
    // element 1 to itself and elements 2..3 to the other; it receives into out[1] and out[4..5],
    // so out[0], out[2..3] and out[6..7] keep their -1.
    std::vector<float> memory(24, -1);
    for (int i = 0; i < 4; ++i)
      memory[i] = float(10 * r + i);
    device.set(memory);
    std::vector<Communicator::Segment> sends = {{r, 1, 1}, {1 - r, 2, 2}};
    std::vector<Communicator::Segment> recvs = {{r, 1, 1}, {1 - r, 4, 2}};
    ASSERT_TRUE(comm.exchange(device.at<float>(0), sends, device.at<float>(16), recvs, plan::F32).ok());
    std::vector<float> want = {-1, float(10 * r + 1), -1, -1, float(10 * (1 - r) + 2), float(10 * (1 - r) + 3), -1, -1};
    for (int i = 0; i < 8; ++i)
      EXPECT_EQ(device.value<float>(16 + i), want[i]) << "rank " << r << " out[" << i << "]";
  });
}

} // namespace
} // namespace moec::runtime::comm
