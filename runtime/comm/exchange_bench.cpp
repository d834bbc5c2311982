//===- exchange_bench.cpp - the expert exchange against a plain all-to-all -===//
//
//   exchange_bench [--nproc N] [--tokens T] [--top-k K] [--hidden D] [--experts E]
//
// On N GPUs (one process each, started here like moe-run --nproc), for the
// rows one MoE layer's dispatch moves (T tokens x top-k rows of D bf16 per
// rank, spread over E experts the way a uniform router spreads them), times:
// a plain NCCL all-to-all of the same per-peer sizes (one message per pair of
// ranks), the same bytes sent as one message per (rank, expert) segment, and
// the exchange as the executor runs it (one message per pair of ranks, then
// the copy kernel that regroups rows by expert). Prints the median time and
// the bus bandwidth, bytes x (N-1)/N / time, as nccl-tests reports it.
//
//===----------------------------------------------------------------------===//

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "runtime/backends/cuda/CopyBlocks.h"
#include "runtime/comm/LaunchEnv.h"
#include "runtime/comm/NcclCommunicator.h"
#include "runtime/kernels/testing/CudaBench.h"
#include "runtime/tools/Args.h"
#include "runtime/tools/Ranks.h"

using namespace moec::runtime;

int main(int argc, char **argv) {
  Args args(argc, argv, 1);
  int64_t nproc = 1, tokens = 4096, topK = 8, hidden = 2048, experts = 128;
  std::string error;
  if (!args.integer("nproc", 1, nproc, error) || !args.integer("tokens", 4096, tokens, error) ||
      !args.integer("top-k", 8, topK, error) || !args.integer("hidden", 2048, hidden, error) ||
      !args.integer("experts", 128, experts, error)) {
    std::fprintf(stderr, "exchange_bench: %s\n", error.c_str());
    return 2;
  }
  auto env = comm::readLaunchEnv();
  if (!env.ok()) {
    std::fprintf(stderr, "exchange_bench: %s\n", std::string(env.status().message()).c_str());
    return 2;
  }
  if (env->worldSize == 1) { // the launcher: one process per GPU
    if (nproc < 2) {
      std::fprintf(stderr, "exchange_bench: --nproc N (N >= 2 GPUs)\n");
      return 2;
    }
    std::vector<std::string> again;
    for (int i = 0; i < argc; ++i)
      if (std::string(argv[i]) == "--nproc")
        ++i;
      else
        again.push_back(argv[i]);
    return runLocalProcesses(static_cast<int>(nproc), again);
  }
  int n = env->worldSize, me = env->rank;
  bench::check(cudaSetDevice(env->localRank), "cudaSetDevice");
  cudaStream_t stream;
  bench::check(cudaStreamCreate(&stream), "cudaStreamCreate");
  // --nproc serves the store from the launching process (MOEC_STORE_SERVED).
  bool serve = me == 0 && std::getenv("MOEC_STORE_SERVED") == nullptr;
  auto store = comm::TcpStore::open(env->masterAddr, env->masterPort, serve, 120);
  if (!store.ok()) {
    std::fprintf(stderr, "exchange_bench: %s\n", std::string(store.status().message()).c_str());
    return 1;
  }
  auto made = comm::makeNcclCommunicator(**store, "bench", me, n, stream, 120);
  if (!made.ok()) {
    std::fprintf(stderr, "exchange_bench: %s\n", std::string(made.status().message()).c_str());
    return 1;
  }
  comm::Communicator &comm = **made;

  // Rows per expert from a uniform router (the same draw on every rank), in dispatch order.
  int64_t rows = tokens * topK, local = experts / n;
  std::mt19937_64 rng(7 + me);
  std::vector<int64_t> perExpert(experts, 0);
  for (int64_t r = 0; r < rows; ++r)
    ++perExpert[rng() % experts];
  // What this rank receives per (source, local expert): every rank draws the same way.
  std::vector<int64_t> perSource(n * local, 0);
  for (int src = 0; src < n; ++src) {
    std::mt19937_64 theirs(7 + src);
    std::vector<int64_t> counts(experts, 0);
    for (int64_t r = 0; r < rows; ++r)
      ++counts[theirs() % experts];
    for (int64_t e = 0; e < local; ++e)
      perSource[src * local + e] = counts[me * local + e];
  }
  size_t width = static_cast<size_t>(hidden), rowBytes = width * 2;
  using Segment = comm::Communicator::Segment;
  std::vector<Segment> perPeerSend, perPeerRecv, perExpertSend, perExpertRecv;
  std::vector<size_t> sendCounts(n, 0), recvCounts(n, 0);
  size_t at = 0;
  for (int j = 0; j < n; ++j) {
    size_t first = at;
    for (int64_t e = 0; e < local; ++e) {
      size_t count = static_cast<size_t>(perExpert[j * local + e]);
      perExpertSend.push_back({j, at * width, count * width});
      at += count;
    }
    perPeerSend.push_back({j, first * width, (at - first) * width});
    sendCounts[j] = (at - first) * width;
  }
  size_t received = 0;
  std::vector<cuda::CopyBlock> regroup;
  std::vector<size_t> firstOf(n * local);
  size_t total = 0;
  for (int64_t e = 0; e < local; ++e)
    for (int src = 0; src < n; ++src) {
      firstOf[src * local + e] = total;
      total += static_cast<size_t>(perSource[src * local + e]);
    }
  for (int src = 0; src < n; ++src) {
    size_t first = received;
    for (int64_t e = 0; e < local; ++e) {
      size_t count = static_cast<size_t>(perSource[src * local + e]);
      perExpertRecv.push_back({src, firstOf[src * local + e] * width, count * width});
      regroup.push_back({firstOf[src * local + e] * rowBytes, received * rowBytes, count * rowBytes});
      received += count;
    }
    perPeerRecv.push_back({src, first * width, (received - first) * width});
    recvCounts[src] = (received - first) * width;
  }
  void *in = bench::randomBf16(static_cast<size_t>(rows) * width, 11 + me, 1.0f);
  void *staging = nullptr, *out = nullptr;
  bench::check(cudaMalloc(&staging, received * rowBytes + 16), "cudaMalloc");
  bench::check(cudaMalloc(&out, received * rowBytes + 16), "cudaMalloc");
  cuda::BlockCopier copier(stream);
  auto run = [&](const std::function<absl::Status()> &fn) {
    return bench::medianMs(stream, 3, 20, [&] {
      if (absl::Status s = fn(); !s.ok()) {
        std::fprintf(stderr, "exchange_bench: %s\n", std::string(s.message()).c_str());
        std::exit(1);
      }
    });
  };
  double plain = run([&] { return comm.allToAll(in, sendCounts, staging, recvCounts, moec::plan::BF16); });
  double segments = run([&] { return comm.exchange(in, perExpertSend, out, perExpertRecv, moec::plan::BF16); });
  double ours = run([&] {
    absl::Status s = comm.exchange(in, perPeerSend, staging, perPeerRecv, moec::plan::BF16);
    if (!s.ok())
      return s;
    std::string e = copier.copy(out, staging, regroup);
    return e.empty() ? absl::OkStatus() : absl::InternalError(e);
  });
  if (me == 0) {
    double bytes = static_cast<double>(rows) * rowBytes; // what one rank sends, itself included
    auto bus = [&](double ms) { return bytes * (n - 1) / n / (ms * 1e-3) / 1e9; };
    std::printf("exchange_bench: %d GPUs, %lld tokens x top-%lld x %lld bf16 per rank (%.1f MB), %lld experts\n", n,
                static_cast<long long>(tokens), static_cast<long long>(topK), static_cast<long long>(hidden),
                bytes / 1e6, static_cast<long long>(experts));
    std::printf("  plain NCCL all-to-all (a message per pair of ranks)   %8.3f ms  bus %6.1f GB/s\n", plain, bus(plain));
    std::printf("  a message per (rank, expert) segment                  %8.3f ms  bus %6.1f GB/s\n", segments,
                bus(segments));
    std::printf("  the executor's exchange (messages + regrouping kernel) %7.3f ms  bus %6.1f GB/s\n", ours, bus(ours));
  }
  cudaFree(in);
  cudaFree(staging);
  cudaFree(out);
  return 0;
}
