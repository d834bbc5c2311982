//===- exchange_bench.cpp - the expert exchange against a plain all-to-all -===//
//
//   exchange_bench [--nproc N] [--tokens T] [--top-k K] [--hidden D] [--experts E]
//
// On N GPUs (one process each, started here like moe-run --nproc), for one MoE
// layer's tokens (T tokens of D bf16 per rank, each with top-k distinct experts
// of E drawn uniformly), times: a plain NCCL all-to-all of the (token, expert)
// copies (what an exchange per expert moves), a plain NCCL all-to-all of the
// tokens once per rank holding one of their experts (the message sizes the
// executor uses), and the executor's send (the gather kernel, then one message
// per pair of ranks) and return (messages, then the kernel that adds a token's
// rows from its ranks). Prints the median time and the bus bandwidth (bytes
// that leave the GPU / time).
//
//===----------------------------------------------------------------------===//

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
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

  // A uniform router (the same draws on every rank, seeded by rank): each token's top-k
  // distinct experts; a token goes once to every rank holding one of them.
  int64_t local = experts / n;
  auto route = [&](int rank) {
    std::mt19937_64 rng(7 + rank);
    std::vector<std::vector<int64_t>> to(n); // tokens per destination
    std::vector<int64_t> copies(n, 0);       // (token, expert) copies per destination
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<int64_t> picked;
      while (static_cast<int64_t>(picked.size()) < std::min(topK, experts)) {
        int64_t e = static_cast<int64_t>(rng() % experts);
        if (std::find(picked.begin(), picked.end(), e) == picked.end())
          picked.push_back(e);
      }
      std::vector<bool> hit(n, false);
      for (int64_t e : picked) {
        ++copies[e / local];
        hit[e / local] = true;
      }
      for (int r = 0; r < n; ++r)
        if (hit[r])
          to[r].push_back(t);
    }
    return std::make_pair(to, copies);
  };
  auto [mine, myCopies] = route(me);
  std::vector<size_t> tokenSend(n), tokenRecv(n), copySend(n), copyRecv(n);
  for (int r = 0; r < n; ++r) {
    tokenSend[r] = mine[r].size();
    copySend[r] = static_cast<size_t>(myCopies[r]);
    auto [theirs, theirCopies] = route(r);
    tokenRecv[r] = theirs[me].size();
    copyRecv[r] = static_cast<size_t>(theirCopies[me]);
  }
  size_t width = static_cast<size_t>(hidden), rowBytes = width * 2;
  auto elements = [&](std::vector<size_t> rows) {
    for (size_t &r : rows)
      r *= width;
    return rows;
  };
  using Segment = comm::Communicator::Segment;
  auto segments = [&](const std::vector<size_t> &rows) {
    std::vector<Segment> out;
    size_t at = 0;
    for (int r = 0; r < n; ++r) {
      out.push_back({r, at * width, rows[r] * width});
      at += rows[r];
    }
    return out;
  };
  auto sum = [](const std::vector<size_t> &v) { return std::accumulate(v.begin(), v.end(), size_t{0}); };
  std::vector<int64_t> gather; // the sent tokens by destination, as the executor's route lists them
  std::vector<int64_t> rowOf(static_cast<size_t>(tokens) * n, -1);
  for (int r = 0; r < n; ++r)
    for (int64_t t : mine[r]) {
      rowOf[t * n + r] = static_cast<int64_t>(gather.size());
      gather.push_back(t);
    }
  size_t most = std::max({sum(copySend), sum(copyRecv), sum(tokenSend), sum(tokenRecv)});
  void *in = bench::randomBf16(static_cast<size_t>(std::max(tokens * topK, tokens * n)) * width, 11 + me, 1.0f);
  void *staging = nullptr, *out = nullptr;
  bench::check(cudaMalloc(&staging, most * rowBytes + 16), "cudaMalloc");
  bench::check(cudaMalloc(&out, most * rowBytes + 16), "cudaMalloc");
  cuda::BlockCopier copier(stream);
  auto run = [&](const std::function<absl::Status()> &fn) {
    return bench::medianMs(stream, 3, 20, [&] {
      if (absl::Status s = fn(); !s.ok()) {
        std::fprintf(stderr, "exchange_bench: %s\n", std::string(s.message()).c_str());
        std::exit(1);
      }
    });
  };
  auto status = [](const std::string &e) { return e.empty() ? absl::OkStatus() : absl::InternalError(e); };
  double perCopy = run([&] { return comm.allToAll(in, elements(copySend), staging, elements(copyRecv), moec::plan::BF16); });
  double plain = run([&] { return comm.allToAll(in, elements(tokenSend), out, elements(tokenRecv), moec::plan::BF16); });
  double send = run([&] {
    if (absl::Status s = status(copier.gatherRows(staging, in, gather, rowBytes)); !s.ok())
      return s;
    return comm.exchange(staging, segments(tokenSend), out, segments(tokenRecv), moec::plan::BF16);
  });
  double back = run([&] {
    if (absl::Status s = comm.exchange(in, segments(tokenRecv), staging, segments(tokenSend), moec::plan::BF16); !s.ok())
      return s;
    return status(copier.sumRows(out, staging, rowOf, static_cast<size_t>(n), width, true, true));
  });
  if (me == 0) {
    // Bus bandwidth as nccl-tests reports it: the bytes that leave the GPU over the time.
    auto away = [&](const std::vector<size_t> &rows) { return double(sum(rows) - rows[me]) * rowBytes; };
    auto bus = [&](double bytes, double ms) { return bytes / (ms * 1e-3) / 1e9; };
    std::printf("exchange_bench: %d GPUs, %lld tokens x top-%lld of %lld experts, %lld bf16 per row; rank 0 sends "
                "%.1f MB as (token, expert) copies, %.1f MB as tokens once per rank\n",
                n, static_cast<long long>(tokens), static_cast<long long>(topK), static_cast<long long>(experts),
                static_cast<long long>(hidden), away(copySend) / 1e6, away(tokenSend) / 1e6);
    std::printf("  plain NCCL all-to-all of the (token, expert) copies      %8.3f ms  bus %6.1f GB/s\n", perCopy,
                bus(away(copySend), perCopy));
    std::printf("  plain NCCL all-to-all of the tokens, once per rank       %8.3f ms  bus %6.1f GB/s\n", plain,
                bus(away(tokenSend), plain));
    std::printf("  the executor's send (gather kernel + messages)           %8.3f ms  bus %6.1f GB/s\n", send,
                bus(away(tokenSend), send));
    std::printf("  the executor's return (messages + sum kernel)            %8.3f ms  bus %6.1f GB/s\n", back,
                bus(away(tokenRecv), back));
  }
  cudaFree(in);
  cudaFree(staging);
  cudaFree(out);
  return 0;
}
