//===- TcpStoreTest.cpp - the store on 127.0.0.1, ranks as threads --------===//

#include "runtime/comm/TcpStore.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace moec::runtime::comm {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::unique_ptr<TcpStore> serve() {
  absl::StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::open("127.0.0.1", 0, /*serve=*/true, 10);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? std::move(*store) : nullptr;
}

std::unique_ptr<TcpStore> join(int port) {
  absl::StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::open("127.0.0.1", port, /*serve=*/false, 10);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? std::move(*store) : nullptr;
}

/// A port nobody listens on: bound, then closed (no listen, so connects are refused).
int unusedPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ::bind(fd, reinterpret_cast<sockaddr *>(&address), length);
  ::getsockname(fd, reinterpret_cast<sockaddr *>(&address), &length);
  ::close(fd);
  return ntohs(address.sin_port);
}

TEST(TcpStoreTest, SetThenGetOnRankZero) {
  std::unique_ptr<TcpStore> store = serve();
  ASSERT_TRUE(store);
  EXPECT_GT(store->port(), 0);
  ASSERT_TRUE(store->set("a", "1").ok());
  absl::StatusOr<std::string> value = store->get("a", 1);
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "1");
  // A later set replaces; empty values and binary bytes survive.
  ASSERT_TRUE(store->set("a", "").ok());
  EXPECT_EQ(store->get("a", 1).value_or("?"), "");
  std::string bytes(128, '\0');
  for (size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = static_cast<char>(i * 37);
  ASSERT_TRUE(store->set("nccl/ep/0", bytes).ok());
  EXPECT_EQ(store->get("nccl/ep/0", 1).value_or(""), bytes);
}

TEST(TcpStoreTest, RanksAsThreads) {
  // Rank 0 serves; ranks 1..7 connect; every rank reads the value of each rank, which
  // other threads set a little later, so get() must wait for them.
  std::unique_ptr<TcpStore> root = serve();
  ASSERT_TRUE(root);
  constexpr int kRanks = 8;
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks; ++rank)
    threads.emplace_back([&, rank] {
      std::unique_ptr<TcpStore> own = rank == 0 ? nullptr : join(root->port());
      TcpStore &store = rank == 0 ? *root : *own;
      for (int peer = 0; peer < kRanks; ++peer) {
        absl::StatusOr<std::string> value = store.get("rank/" + std::to_string(peer), 10);
        if (!value.ok() || *value != std::string(1000 + peer, 'a' + peer))
          errors[rank] += "rank/" + std::to_string(peer) + ": " + value.status().ToString() + "; ";
      }
    });
  // Setters in their own threads, in reverse order and a little late.
  std::vector<std::thread> setters;
  for (int rank = kRanks - 1; rank >= 0; --rank) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    setters.emplace_back([&, rank] {
      std::unique_ptr<TcpStore> own = join(root->port());
      if (!own || !own->set("rank/" + std::to_string(rank), std::string(1000 + rank, 'a' + rank)).ok())
        errors[rank] += "set failed; ";
    });
  }
  for (std::thread &t : setters)
    t.join();
  for (std::thread &t : threads)
    t.join();
  for (int rank = 0; rank < kRanks; ++rank)
    EXPECT_EQ(errors[rank], "") << "rank " << rank;
}

TEST(TcpStoreTest, LargeValue) {
  // Bigger than any socket buffer: partial sends and receives on both sides.
  std::unique_ptr<TcpStore> root = serve();
  ASSERT_TRUE(root);
  std::unique_ptr<TcpStore> other = join(root->port());
  ASSERT_TRUE(other);
  std::string big(8 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i)
    big[i] = static_cast<char>(i * 2654435761u >> 13);
  ASSERT_TRUE(other->set("big", big).ok());
  absl::StatusOr<std::string> value = root->get("big", 5);
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_TRUE(*value == big);
}

TEST(TcpStoreTest, GetTimesOut) {
  std::unique_ptr<TcpStore> root = serve();
  ASSERT_TRUE(root);
  auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::string> value = root->get("nccl/ep/0", 0.3);
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(value.ok());
  EXPECT_EQ(value.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(value.status().message()),
              AllOf(HasSubstr("timed out after 0.3 s"), HasSubstr("\"nccl/ep/0\""),
                    HasSubstr("127.0.0.1:" + std::to_string(root->port()))));
  EXPECT_GE(waited, 0.3);
  EXPECT_LT(waited, 2.0);
  // The connection is still good after a timeout.
  ASSERT_TRUE(root->set("nccl/ep/0", "x").ok());
  EXPECT_EQ(root->get("nccl/ep/0", 1).value_or(""), "x");
}

TEST(TcpStoreTest, ConnectFailsWithTheAddress) {
  int port = unusedPort();
  auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::open("127.0.0.1", port, false, 0.5);
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(store.ok());
  EXPECT_THAT(std::string(store.status().message()),
              AllOf(HasSubstr("could not connect to the store at 127.0.0.1:" + std::to_string(port)),
                    HasSubstr("within 0.5 s"), HasSubstr("refused")));
  EXPECT_LT(waited, 3.0);
}

TEST(TcpStoreTest, ConnectWaitsForALateServer) {
  // Another rank may start before rank 0: its connect retries until rank 0 listens.
  int port = unusedPort();
  std::unique_ptr<TcpStore> late;
  std::thread server([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    absl::StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::open("127.0.0.1", port, true, 10);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->set("hello", "world").ok());
    late = std::move(*store);
  });
  absl::StatusOr<std::unique_ptr<TcpStore>> client = TcpStore::open("127.0.0.1", port, false, 10);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->get("hello", 10).value_or(""), "world");
  server.join();
  client->reset(); // clients go before the server
}

TEST(TcpStoreTest, ServerGoneIsAnError) {
  std::unique_ptr<TcpStore> root = serve();
  ASSERT_TRUE(root);
  std::unique_ptr<TcpStore> other = join(root->port());
  ASSERT_TRUE(other);
  root.reset(); // the destructor stops its threads even with a client still connected
  absl::StatusOr<std::string> value = other->get("k", 1);
  ASSERT_FALSE(value.ok());
  EXPECT_THAT(std::string(value.status().message()), HasSubstr("\"k\""));
  EXPECT_FALSE(other->set("k", "v").ok());
}

TEST(TcpStoreTest, BusyPortIsAnError) {
  std::unique_ptr<TcpStore> root = serve();
  ASSERT_TRUE(root);
  absl::StatusOr<std::unique_ptr<TcpStore>> second = TcpStore::open("127.0.0.1", root->port(), true, 1);
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(std::string(second.status().message()), HasSubstr(std::to_string(root->port())));
}

TEST(TcpStoreTest, StrayBytesDoNotHurtTheServer) {
  // Something that is not a rank connects and sends garbage: the server drops it.
  std::unique_ptr<TcpStore> root = serve();
  ASSERT_TRUE(root);
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(root->port()));
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr *>(&address), sizeof(address)), 0);
  const char junk[] = "GET / HTTP/1.0\r\n\r\n";
  ASSERT_GT(::send(fd, junk, sizeof(junk), MSG_NOSIGNAL), 0);
  char byte;
  EXPECT_EQ(::recv(fd, &byte, 1, 0), 0); // closed by the server
  ::close(fd);
  ASSERT_TRUE(root->set("still", "fine").ok());
  EXPECT_EQ(root->get("still", 1).value_or(""), "fine");
}

} // namespace
} // namespace moec::runtime::comm
