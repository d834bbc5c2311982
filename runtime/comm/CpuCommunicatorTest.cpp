//===- CpuCommunicatorTest.cpp - the thread-rank collectives -------------===//

#include "runtime/comm/CpuCommunicator.h"

#include <functional>
#include <thread>

#include "gtest/gtest.h"

namespace moec::runtime::comm {
namespace {

/// Runs `body(comm)` on `n` thread ranks of one group.
void onRanks(int n, const std::function<void(Communicator &)> &body, double timeout = 30) {
  auto group = makeCpuGroup(n, timeout);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      std::unique_ptr<Communicator> comm = makeCpuCommunicator(group, r);
      body(*comm);
    });
  for (std::thread &t : threads)
    t.join();
}

TEST(CpuCommunicator, AllReduceSumsInPlace) {
  onRanks(3, [](Communicator &comm) {
    // rank r holds {r+1, 10(r+1)}: sums 6 and 60.
    std::vector<float> x = {float(comm.rank() + 1), 10.0f * (comm.rank() + 1)};
    ASSERT_TRUE(comm.allReduce(x.data(), x.data(), 2, plan::F32).ok());
    EXPECT_EQ(x, (std::vector<float>{6, 60}));
    std::vector<int64_t> n = {int64_t(comm.rank()) * 5};
    ASSERT_TRUE(comm.allReduce(n.data(), n.data(), 1, plan::I64).ok());
    EXPECT_EQ(n[0], 15);
  });
}

TEST(CpuCommunicator, GatherScatterBroadcast) {
  onRanks(2, [](Communicator &comm) {
    int r = comm.rank();
    std::vector<float> mine = {float(r), float(r) + 0.5f}, all(4);
    ASSERT_TRUE(comm.allGather(mine.data(), all.data(), 2, plan::F32).ok());
    EXPECT_EQ(all, (std::vector<float>{0, 0.5f, 1, 1.5f}));
    // in = {1,2,3,4} * (r+1); sums {3,6,9,12}; rank r keeps slice r.
    std::vector<float> in = {1, 2, 3, 4}, out(2);
    for (float &v : in)
      v *= r + 1;
    ASSERT_TRUE(comm.reduceScatter(in.data(), out.data(), 2, plan::F32).ok());
    EXPECT_EQ(out, r == 0 ? (std::vector<float>{3, 6}) : (std::vector<float>{9, 12}));
    std::vector<int32_t> b = {r == 1 ? 7 : 0, r == 1 ? 8 : 0};
    ASSERT_TRUE(comm.broadcast(b.data(), 2, plan::I32, /*root=*/1).ok());
    EXPECT_EQ(b, (std::vector<int32_t>{7, 8}));
  });
}

TEST(CpuCommunicator, AllToAllWithRaggedCounts) {
  // Rank i sends (i + j) % 3 elements valued 100 i + j to rank j (zero counts included).
  onRanks(3, [](Communicator &comm) {
    int i = comm.rank();
    std::vector<size_t> send(3), recv(3);
    std::vector<float> in, want;
    for (int j = 0; j < 3; ++j) {
      send[j] = (i + j) % 3;
      recv[j] = (j + i) % 3;
      in.insert(in.end(), send[j], float(100 * i + j));
      want.insert(want.end(), recv[j], float(100 * j + i));
    }
    std::vector<float> out(want.size(), -1);
    ASSERT_TRUE(comm.allToAll(in.data(), send, out.data(), recv, plan::F32).ok());
    EXPECT_EQ(out, want);
  });
}

TEST(CpuCommunicator, MismatchedCountsAreAnError) {
  onRanks(2, [](Communicator &comm) {
    std::vector<size_t> send = {1, 1}, recv = {1, comm.rank() == 0 ? 2u : 1u};
    std::vector<float> in(2, 1), out(3);
    absl::Status s = comm.allToAll(in.data(), send, out.data(), recv, plan::F32);
    if (comm.rank() == 0) {
      EXPECT_FALSE(s.ok());
      EXPECT_NE(s.message().find("rank 0 receives 2 elements from rank 1, which sends 1"), std::string::npos)
          << s.message();
    }
  });
}

TEST(CpuCommunicator, MissingRankTimesOutWithAMessage) {
  onRanks(
      2,
      [](Communicator &comm) {
        if (comm.rank() == 1)
          return; // never arrives
        float x = 1;
        absl::Status s = comm.allReduce(&x, &x, 1, plan::F32);
        EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
        EXPECT_NE(s.message().find("allReduce timed out after 0.2 s: 1 of 2 ranks never arrived"),
                  std::string::npos)
            << s.message();
      },
      /*timeout=*/0.2);
}

} // namespace
} // namespace moec::runtime::comm

namespace moec::runtime::comm {
namespace {

TEST(CpuCommunicator, AnAbortedGroupFailsItsWaitsAtOnce) {
  auto group = makeCpuGroup(2, /*timeoutSeconds=*/60);
  std::unique_ptr<Communicator> comm = makeCpuCommunicator(group, 0);
  std::thread stopper([&] { abortCpuGroup(*group, "rank 1 stopped: bad batch"); });
  float x = 1;
  absl::Status s = comm->allReduce(&x, &x, 1, plan::F32); // rank 1 never comes
  stopper.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s.message(), "rank 1 stopped: bad batch");
  EXPECT_EQ(comm->barrier().message(), "rank 1 stopped: bad batch"); // and every later one
}

} // namespace
} // namespace moec::runtime::comm
