//===- NcclCommunicatorTest.cpp - two processes, two GPUs, every collective ===//
//
// The test process forks one child per GPU, as a launcher would start ranks;
// the parent never touches CUDA (a forked CUDA context is unusable), even to
// count the GPUs, which a child does too. Each child makes its GPU current,
// opens the TCP store on 127.0.0.1 (rank 0 serves, on a port the parent
// found free) and checks every collective against values computed on the
// host: exact, since the data are small multiples of 1/2 whose sums every
// dtype holds. Outputs are poisoned (all bits set: NaN, -1) and guarded by a
// poisoned tail that must survive. A child reports mismatches on stderr and
// exits non-zero; the parent kills children that outlive a limit.
//
//===----------------------------------------------------------------------===//

#include "runtime/comm/NcclCommunicator.h"

#include <cuda_runtime.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/comm/TcpStore.h"
#include "gtest/gtest.h"

namespace moec::runtime::comm {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kRanks = 2;
constexpr size_t kGuard = 16; // poisoned elements after every output

//===----------------------------------------------------------------------===//
// Processes (the parent's side).
//===----------------------------------------------------------------------===//

/// The number of visible GPUs, counted in a child so that this process has no CUDA
/// context when it forks the ranks; `why` says why there are none.
int countGpus(std::string *why) {
  int fds[2];
  if (::pipe(fds) != 0) {
    *why = "pipe failed";
    return 0;
  }
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    std::string answer = e == cudaSuccess ? std::to_string(count) : std::string("0 ") + cudaGetErrorName(e);
    (void)!::write(fds[1], answer.data(), answer.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string answer;
  char buffer[256];
  ssize_t n;
  while ((n = ::read(fds[0], buffer, sizeof(buffer))) > 0 || (n < 0 && errno == EINTR))
    if (n > 0)
      answer.append(buffer, n);
  ::close(fds[0]);
  ::waitpid(pid, nullptr, 0);
  int count = std::atoi(answer.c_str());
  *why = count == 0 && answer.size() > 2 ? answer.substr(2) : "";
  return count;
}

/// Skips the calling test unless there are 2 GPUs.
#define REQUIRE_TWO_GPUS()                                                                                   \
  do {                                                                                                       \
    std::string why;                                                                                         \
    int gpus = countGpus(&why);                                                                              \
    if (gpus < kRanks)                                                                                       \
      GTEST_SKIP() << "needs " << kRanks << " GPUs, found " << gpus                                          \
                   << (why.empty() ? "" : " (" + why + ")");                                                 \
  } while (0)

/// A free TCP port on 127.0.0.1 for the store (bound, read, closed; the store sets SO_REUSEADDR).
int freePort() {
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

/// Runs `body(rank, port)` in one child per rank; the exit codes, -1 for a child killed
/// after `limitSeconds` or one that died of a signal.
std::vector<int> runRanks(const std::function<int(int, int)> &body, double limitSeconds) {
  int port = freePort();
  std::fflush(nullptr); // nothing buffered twice
  std::vector<pid_t> pids(kRanks, -1);
  for (int rank = 0; rank < kRanks; ++rank) {
    pids[rank] = ::fork();
    if (pids[rank] == 0) {
      int code = body(rank, port);
      std::fflush(nullptr);
      ::_exit(code); // no gtest teardown, no atexit handlers of the parent
    }
  }
  std::vector<int> codes(kRanks, -1);
  std::vector<bool> done(kRanks, false);
  int left = kRanks;
  for (int rank = 0; rank < kRanks; ++rank)
    if (pids[rank] < 0) {
      std::fprintf(stderr, "fork for rank %d failed: %s\n", rank, std::strerror(errno));
      done[rank] = true;
      --left;
    }
  Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limitSeconds));
  while (left > 0) {
    for (int rank = 0; rank < kRanks; ++rank) {
      int status = 0;
      if (done[rank] || ::waitpid(pids[rank], &status, WNOHANG) != pids[rank])
        continue;
      done[rank] = true;
      --left;
      codes[rank] = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    if (left > 0 && Clock::now() >= deadline) {
      for (int rank = 0; rank < kRanks; ++rank)
        if (!done[rank]) {
          std::fprintf(stderr, "rank %d still running after %.0f s: killed\n", rank, limitSeconds);
          ::kill(pids[rank], SIGKILL);
          ::waitpid(pids[rank], nullptr, 0);
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return codes;
}

//===----------------------------------------------------------------------===//
// Data (the children's side).
//===----------------------------------------------------------------------===//

/// Element i of rank's data; `salt` tells buffers apart. Integers never repeat (offset
/// errors show); floats are multiples of 1/2 in [-31.5, 31.5], exact in every float dtype,
/// and so are sums of two.
double value(plan::DType dtype, int rank, size_t i, int salt) {
  if (dtype == plan::I32 || dtype == plan::I64)
    return rank * 1000003.0 + salt * 100003.0 + static_cast<double>(i);
  return (static_cast<double>((i * 131 + rank * 71 + salt * 17) % 127) - 63) * 0.5;
}

uint16_t halfBits(float f) { // exact for the normal values above
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) == 0)
    return static_cast<uint16_t>(bits >> 16);
  uint32_t exponent = ((bits >> 23) & 0xff) - 127 + 15;
  return static_cast<uint16_t>((bits >> 16 & 0x8000) | exponent << 10 | (bits >> 13 & 0x3ff));
}

float fromHalf(uint16_t h) {
  if (h == 0xffff)
    return NAN;
  uint32_t sign = (h & 0x8000u) << 16, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  uint32_t bits = exponent == 0 && mantissa == 0 ? sign : sign | (exponent - 15 + 127) << 23 | mantissa << 13;
  if (exponent == 0x1f)
    return NAN;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

void put(plan::DType dtype, double v, unsigned char *p) {
  float f = static_cast<float>(v);
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  switch (dtype) {
  case plan::F32:
    std::memcpy(p, &f, 4);
    break;
  case plan::BF16: {
    uint16_t top = static_cast<uint16_t>(bits >> 16); // exact values: no rounding needed
    std::memcpy(p, &top, 2);
    break;
  }
  case plan::F16: {
    uint16_t h = halfBits(f);
    std::memcpy(p, &h, 2);
    break;
  }
  case plan::I32: {
    int32_t i = static_cast<int32_t>(v);
    std::memcpy(p, &i, 4);
    break;
  }
  default: {
    int64_t i = static_cast<int64_t>(v);
    std::memcpy(p, &i, 8);
  }
  }
}

double get(plan::DType dtype, const unsigned char *p) {
  switch (dtype) {
  case plan::F32: {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  case plan::BF16: {
    uint16_t top;
    std::memcpy(&top, p, 2);
    uint32_t bits = static_cast<uint32_t>(top) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  case plan::F16: {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return fromHalf(h);
  }
  case plan::I32: {
    int32_t i;
    std::memcpy(&i, p, 4);
    return i;
  }
  default: {
    int64_t i;
    std::memcpy(&i, p, 8);
    return static_cast<double>(i);
  }
  }
}

/// One rank's side of a test: its GPU, stream, store, and a tally of failures.
class Rank {
public:
  explicit Rank(int rank) : rank(rank) {}
  ~Rank() {
    for (void *p : allocations)
      cudaFree(p);
  }

  const int rank;
  cudaStream_t stream = nullptr;
  std::unique_ptr<TcpStore> store;
  int failures = 0;

  void fail(const std::string &message) {
    std::fprintf(stderr, "[rank %d] %s\n", rank, message.c_str());
    ++failures;
  }
  bool ok(const absl::Status &status, const std::string &what) {
    if (!status.ok())
      fail(what + ": " + status.ToString());
    return status.ok();
  }
  bool cuda(cudaError_t e, const std::string &what) {
    if (e != cudaSuccess)
      fail(what + ": " + cudaGetErrorString(e));
    return e == cudaSuccess;
  }

  /// Its GPU, a stream and the store; false (after saying why) when something failed.
  bool open(int port) {
    if (!cuda(cudaSetDevice(rank), "cudaSetDevice") ||
        !cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate"))
      return false;
    absl::StatusOr<std::unique_ptr<TcpStore>> opened = TcpStore::open("127.0.0.1", port, rank == 0, 60);
    if (!ok(opened.status(), "TcpStore::open"))
      return false;
    store = std::move(*opened);
    return true;
  }

  /// Device memory holding `n` elements of `fill(i)` (poison without a `fill`), then
  /// kGuard poisoned ones.
  void *upload(plan::DType dtype, size_t n, const std::function<double(size_t)> &fill) {
    size_t bytes = elementBytes(dtype);
    std::vector<unsigned char> host((n + kGuard) * bytes, 0xff);
    for (size_t i = 0; fill && i < n; ++i)
      put(dtype, fill(i), host.data() + i * bytes);
    void *device = nullptr;
    if (!cuda(cudaMalloc(&device, host.size()), "cudaMalloc"))
      return nullptr;
    allocations.push_back(device);
    cuda(cudaMemcpyAsync(device, host.data(), host.size(), cudaMemcpyHostToDevice, stream), "upload");
    cuda(cudaStreamSynchronize(stream), "upload");
    return device;
  }
  void *poisoned(plan::DType dtype, size_t n) { return upload(dtype, n, nullptr); }

  /// Compares `n` elements of `device` with `expected(i)` and checks the guard after them.
  void expect(const std::string &what, plan::DType dtype, const void *device, size_t n,
              const std::function<double(size_t)> &expected) {
    size_t bytes = elementBytes(dtype);
    std::vector<unsigned char> host((n + kGuard) * bytes);
    if (!cuda(cudaMemcpyAsync(host.data(), device, host.size(), cudaMemcpyDeviceToHost, stream), what) ||
        !cuda(cudaStreamSynchronize(stream), what))
      return;
    size_t wrong = 0;
    std::string first;
    for (size_t i = 0; i < n; ++i) {
      double got = get(dtype, host.data() + i * bytes), want = expected(i);
      if (!(got == want) && wrong++ < 4)
        first += " [" + std::to_string(i) + "] " + std::to_string(got) + " != " + std::to_string(want) + ";";
    }
    if (wrong)
      fail(what + ": " + std::to_string(wrong) + " of " + std::to_string(n) + " elements wrong:" + first);
    for (size_t i = n * bytes; i < host.size(); ++i)
      if (host[i] != 0xff) {
        fail(what + ": wrote past its " + std::to_string(n) + " elements");
        break;
      }
  }

private:
  std::vector<void *> allocations;
};

std::string nameOf(plan::DType dtype) { return plan::DType_Name(dtype); }

//===----------------------------------------------------------------------===//
// The collectives, on every rank.
//===----------------------------------------------------------------------===//

void checkAllReduce(Rank &r, NcclCommunicator &comm) {
  struct Case {
    plan::DType dtype;
    size_t n;
  };
  for (Case c :
       {Case{plan::F32, 1}, Case{plan::F32, 1000003}, Case{plan::BF16, 1}, Case{plan::BF16, 65537},
        Case{plan::BF16, 1000003}, Case{plan::F16, 4099}, Case{plan::I32, 4099}, Case{plan::I64, 777}}) {
    std::string what = "allReduce " + nameOf(c.dtype) + " x" + std::to_string(c.n);
    void *in = r.upload(c.dtype, c.n, [&](size_t i) { return value(c.dtype, r.rank, i, 1); });
    void *out = r.poisoned(c.dtype, c.n);
    if (!in || !out)
      return;
    if (!r.ok(comm.allReduce(in, out, c.n, c.dtype), what) || !r.ok(comm.wait(what), what))
      continue;
    r.expect(what, c.dtype, out, c.n,
             [&](size_t i) { return value(c.dtype, 0, i, 1) + value(c.dtype, 1, i, 1); });
    // The input is untouched.
    r.expect(what + " (input)", c.dtype, in, c.n, [&](size_t i) { return value(c.dtype, r.rank, i, 1); });
  }
  // In place.
  void *data = r.upload(plan::F32, 777, [&](size_t i) { return value(plan::F32, r.rank, i, 2); });
  if (data && r.ok(comm.allReduce(data, data, 777, plan::F32), "in-place allReduce") &&
      r.ok(comm.wait("in-place allReduce"), "in-place allReduce"))
    r.expect("in-place allReduce", plan::F32, data, 777,
             [&](size_t i) { return value(plan::F32, 0, i, 2) + value(plan::F32, 1, i, 2); });
  // Nothing to do is no error.
  r.ok(comm.allReduce(nullptr, nullptr, 0, plan::F32), "allReduce of 0 elements");
}

void checkAllGather(Rank &r, NcclCommunicator &comm) {
  struct Case {
    plan::DType dtype;
    size_t n;
  };
  for (Case c : {Case{plan::F32, 1}, Case{plan::F32, 12345}, Case{plan::BF16, 100003}, Case{plan::F16, 3},
                 Case{plan::I32, 5000}, Case{plan::I64, 4097}}) {
    std::string what = "allGather " + nameOf(c.dtype) + " x" + std::to_string(c.n);
    void *in = r.upload(c.dtype, c.n, [&](size_t i) { return value(c.dtype, r.rank, i, 3); });
    void *out = r.poisoned(c.dtype, kRanks * c.n);
    if (!in || !out)
      return;
    if (r.ok(comm.allGather(in, out, c.n, c.dtype), what) && r.ok(comm.wait(what), what))
      r.expect(what, c.dtype, out, kRanks * c.n,
               [&](size_t i) { return value(c.dtype, i / c.n, i % c.n, 3); });
  }
}

void checkReduceScatter(Rank &r, NcclCommunicator &comm) {
  struct Case {
    plan::DType dtype;
    size_t n;
  };
  for (Case c : {Case{plan::F32, 1}, Case{plan::F32, 50001}, Case{plan::BF16, 50001}, Case{plan::I64, 999}}) {
    std::string what = "reduceScatter " + nameOf(c.dtype) + " x" + std::to_string(c.n);
    void *in = r.upload(c.dtype, kRanks * c.n, [&](size_t i) { return value(c.dtype, r.rank, i, 4); });
    void *out = r.poisoned(c.dtype, c.n);
    if (!in || !out)
      return;
    size_t base = r.rank * c.n;
    if (r.ok(comm.reduceScatter(in, out, c.n, c.dtype), what) && r.ok(comm.wait(what), what))
      r.expect(what, c.dtype, out, c.n,
               [&](size_t i) { return value(c.dtype, 0, base + i, 4) + value(c.dtype, 1, base + i, 4); });
  }
}

void checkAllToAll(Rank &r, NcclCommunicator &comm) {
  // counts[src][dst]: ragged, zeros, a rank that sends nothing, nothing at all.
  using Matrix = std::vector<std::vector<size_t>>;
  struct Case {
    plan::DType dtype;
    Matrix counts;
  };
  for (const Case &c : {Case{plan::I32, {{3, 1000}, {7, 0}}}, Case{plan::I64, {{0, 65537}, {131071, 5}}},
                        Case{plan::BF16, {{1, 1}, {1, 1}}}, Case{plan::F32, {{0, 0}, {0, 0}}},
                        Case{plan::F32, {{0, 0}, {4097, 12}}}, Case{plan::F16, {{17, 0}, {0, 33}}},
                        Case{plan::I32, {{0, 300001}, {0, 0}}}}) {
    std::string what = "allToAll " + nameOf(c.dtype) + " {{" + std::to_string(c.counts[0][0]) + "," +
                       std::to_string(c.counts[0][1]) + "},{" + std::to_string(c.counts[1][0]) + "," +
                       std::to_string(c.counts[1][1]) + "}}";
    std::vector<size_t> sendCounts(kRanks), recvCounts(kRanks), sendOffsets(kRanks + 1),
        recvOffsets(kRanks + 1);
    for (int p = 0; p < kRanks; ++p) {
      sendCounts[p] = c.counts[r.rank][p];
      recvCounts[p] = c.counts[p][r.rank];
      sendOffsets[p + 1] = sendOffsets[p] + sendCounts[p];
      recvOffsets[p + 1] = recvOffsets[p] + recvCounts[p];
    }
    // Element k of the block from `src` to `dst` is value(src, k, salt 10 + dst).
    auto sent = [&](size_t i) {
      int dst = i < sendOffsets[1] ? 0 : 1;
      return value(c.dtype, r.rank, i - sendOffsets[dst], 10 + dst);
    };
    void *in = r.upload(c.dtype, sendOffsets[kRanks], sent);
    void *out = r.poisoned(c.dtype, recvOffsets[kRanks]);
    if (!in || !out)
      return;
    if (r.ok(comm.allToAll(in, sendCounts, out, recvCounts, c.dtype), what) && r.ok(comm.wait(what), what))
      r.expect(what, c.dtype, out, recvOffsets[kRanks], [&](size_t i) {
        int src = i < recvOffsets[1] ? 0 : 1;
        return value(c.dtype, src, i - recvOffsets[src], 10 + r.rank);
      });
  }
}

void checkBroadcast(Rank &r, NcclCommunicator &comm) {
  struct Case {
    plan::DType dtype;
    size_t n;
    int root;
  };
  for (Case c : {Case{plan::F32, 100003, 0}, Case{plan::F32, 100003, 1}, Case{plan::BF16, 7, 1},
                 Case{plan::I64, 1, 0}}) {
    std::string what =
        "broadcast " + nameOf(c.dtype) + " x" + std::to_string(c.n) + " from " + std::to_string(c.root);
    void *data = r.rank == c.root
                     ? r.upload(c.dtype, c.n, [&](size_t i) { return value(c.dtype, c.root, i, 5); })
                     : r.poisoned(c.dtype, c.n);
    if (!data)
      return;
    if (r.ok(comm.broadcast(data, c.n, c.dtype, c.root), what) && r.ok(comm.wait(what), what))
      r.expect(what, c.dtype, data, c.n, [&](size_t i) { return value(c.dtype, c.root, i, 5); });
  }
}

/// Argument errors come back at once, name the collective, and leave the communicator usable.
void checkArgumentErrors(Rank &r, NcclCommunicator &comm) {
  auto expectError = [&](const absl::Status &status, const std::string &needle) {
    if (status.ok() || std::string(status.message()).find(needle) == std::string::npos)
      r.fail("expected an error containing \"" + needle + "\", got " + status.ToString());
  };
  expectError(comm.allReduce(nullptr, nullptr, 4, plan::DTYPE_UNSPECIFIED),
              "allReduce of 4 DTYPE_UNSPECIFIED");
  expectError(comm.broadcast(nullptr, 4, plan::F32, 2), "root 2");
  expectError(comm.allToAll(nullptr, {1}, nullptr, {1, 2}, plan::F32), "1 send and 2 receive counts");
  std::vector<size_t> send = {0, 0}, recv = {0, 0};
  send[r.rank] = 1;
  expectError(comm.allToAll(nullptr, send, nullptr, recv, plan::F32), "sends itself 1");
  r.ok(comm.barrier(), "barrier after argument errors");
}

int collectivesRank(int rankIndex, int port) {
  Rank r(rankIndex);
  if (!r.open(port))
    return 1;
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> made =
      NcclCommunicator::create(*r.store, "nccl/test/0", r.rank, kRanks, r.stream, 60);
  if (!r.ok(made.status(), "create"))
    return 1;
  NcclCommunicator &comm = **made;
  if (comm.rank() != r.rank || comm.size() != kRanks || comm.name().rfind("nccl 2.", 0) != 0)
    r.fail("rank/size/name: " + std::to_string(comm.rank()) + " " + std::to_string(comm.size()) + " " +
           comm.name());
  r.ok(comm.barrier(), "first barrier");
  checkAllReduce(r, comm);
  checkAllGather(r, comm);
  checkReduceScatter(r, comm);
  checkAllToAll(r, comm);
  checkBroadcast(r, comm);
  checkArgumentErrors(r, comm);

  // A second group on the same store (its own key), used between calls of the first.
  absl::StatusOr<std::unique_ptr<Communicator>> second =
      makeNcclCommunicator(*r.store, "nccl/test/1", r.rank, kRanks, r.stream, 60);
  if (r.ok(second.status(), "second communicator")) {
    void *a = r.upload(plan::F32, 1000, [&](size_t i) { return value(plan::F32, r.rank, i, 6); });
    void *b = r.upload(plan::I32, 1000, [&](size_t i) { return value(plan::I32, r.rank, i, 7); });
    if (a && b && r.ok((*second)->allReduce(a, a, 1000, plan::F32), "second allReduce") &&
        r.ok(comm.allReduce(b, b, 1000, plan::I32), "first allReduce") &&
        r.ok((*second)->barrier(), "second") && r.ok(comm.wait("both groups"), "both groups")) {
      r.expect("second group", plan::F32, a, 1000,
               [&](size_t i) { return value(plan::F32, 0, i, 6) + value(plan::F32, 1, i, 6); });
      r.expect("first group", plan::I32, b, 1000,
               [&](size_t i) { return value(plan::I32, 0, i, 7) + value(plan::I32, 1, i, 7); });
    }
    second->reset();
  }
  for (int i = 0; i < 3; ++i)
    r.ok(comm.barrier(), "barrier");
  made->reset();
  // Rank 0 serves the store: it leaves last.
  r.ok(r.store->set("finished/" + std::to_string(r.rank), "1"), "set finished");
  if (r.rank == 0)
    for (int p = 1; p < kRanks; ++p)
      r.ok(r.store->get("finished/" + std::to_string(p), 60).status(), "wait for rank " + std::to_string(p));
  return r.failures == 0 ? 0 : 1;
}

// Long enough for a cold NCCL initialisation, which the same timeout bounds.
constexpr double kTimeout = 8;

/// Rank 1 skips an all-reduce; rank 0's wait() must fail with the timeout, not hang.
int timeoutRank(int rankIndex, int port) {
  Rank r(rankIndex);
  if (!r.open(port))
    return 1;
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> made =
      NcclCommunicator::create(*r.store, "nccl/timeout", r.rank, kRanks, r.stream, kTimeout);
  if (!r.ok(made.status(), "create"))
    return 1;
  NcclCommunicator &comm = **made;
  if (!r.ok(comm.barrier(), "barrier before the timeout"))
    return 1;
  if (r.rank == 1) {
    // Stay alive (a dead peer is another error) until rank 0 has seen its timeout.
    r.ok(r.store->get("timeout/done", 120).status(), "waiting for rank 0");
    return r.failures == 0 ? 0 : 1;
  }
  void *data = r.upload(plan::F32, 1024, [](size_t i) { return 1.0; });
  if (!data)
    return 1;
  // The enqueue itself may already wait for the peer (NCCL connects lazily, per algorithm),
  // so the timeout may come from either call.
  Clock::time_point start = Clock::now();
  absl::Status status = comm.allReduce(data, data, 1024, plan::F32);
  if (status.ok())
    status = comm.wait("the skipped allReduce");
  double waited = std::chrono::duration<double>(Clock::now() - start).count();
  std::string message(status.message());
  if (status.code() != absl::StatusCode::kDeadlineExceeded ||
      message.find("timed out after 8 s in ") == std::string::npos)
    r.fail("expected the timeout error, got " + status.ToString());
  if (waited < kTimeout - 0.1 || waited > kTimeout + 5)
    r.fail("the timeout came after " + std::to_string(waited) + " s, not " + std::to_string(kTimeout));
  // Later calls fail at once with the first error.
  absl::Status later = comm.allReduce(data, data, 1024, plan::F32);
  if (later.ok() || std::string(later.message()).find("failed earlier") == std::string::npos)
    r.fail("a call after the abort: " + later.ToString());
  std::fprintf(stderr, "[rank 0] as expected after %.1f s: %s\n", waited, message.c_str());
  // The abort should stop NCCL's waiting kernel so that the stream drains; reported, not
  // required (the process is expected to end after such an error).
  Clock::time_point abortedAt = Clock::now();
  cudaError_t drained;
  while ((drained = cudaStreamQuery(r.stream)) == cudaErrorNotReady &&
         Clock::now() - abortedAt < std::chrono::seconds(10))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::fprintf(stderr, "[rank 0] the stream after the abort: %s\n",
               drained == cudaSuccess ? "drained" : cudaGetErrorName(drained));
  r.ok(r.store->set("timeout/done", "1"), "set done");
  // Rank 0 serves the store: it leaves after rank 1 has read "done", and without the
  // destructors (cudaFree would wait for a kernel that did not quit).
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  std::fflush(nullptr);
  ::_exit(r.failures == 0 ? 0 : 1);
}

TEST(NcclCommunicatorTest, EveryCollectiveOnTwoGpus) {
  REQUIRE_TWO_GPUS();
  std::vector<int> codes = runRanks(collectivesRank, 300);
  for (int rank = 0; rank < kRanks; ++rank)
    EXPECT_EQ(codes[rank], 0) << "rank " << rank << " (its messages are above)";
}

TEST(NcclCommunicatorTest, MissingPeerTimesOut) {
  REQUIRE_TWO_GPUS();
  std::vector<int> codes = runRanks(timeoutRank, 120);
  for (int rank = 0; rank < kRanks; ++rank)
    EXPECT_EQ(codes[rank], 0) << "rank " << rank << " (its messages are above)";
}

} // namespace
} // namespace moec::runtime::comm
