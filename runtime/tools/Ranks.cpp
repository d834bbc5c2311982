//===- Ranks.cpp - this process's ranks: how they start and connect -------===//

#include "runtime/tools/Ranks.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <iostream>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/comm/NcclCommunicator.h"

namespace moec::runtime {

namespace {

std::vector<int32_t> membersOf(const plan::Group &group) { return {group.ranks().begin(), group.ranks().end()}; }

int indexIn(const std::vector<int32_t> &members, int rank) {
  return static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
}

} // namespace

CpuRanks::CpuRanks(const plan::Plan &plan, double timeoutSeconds) : plan(plan) {
  for (const plan::Rank &rank : plan.ranks())
    for (const plan::Group &group : rank.groups()) {
      std::vector<int32_t> members = membersOf(group);
      if (!groups.count(members))
        groups[members] = comm::makeCpuGroup(static_cast<int>(members.size()), timeoutSeconds);
    }
  all = comm::makeCpuGroup(plan.ranks_size(), timeoutSeconds);
}

RankLinks CpuRanks::links(int rank, Device *stagedThrough) {
  RankLinks links;
  comm::HostTransfers staging{
      [stagedThrough](void *host, const void *from, size_t bytes) { return stagedThrough->download(host, from, bytes); },
      [stagedThrough](void *to, const void *host, size_t bytes) { return stagedThrough->upload(to, host, bytes); }};
  auto own = [&](std::unique_ptr<comm::Communicator> host) {
    links.owned.push_back(stagedThrough ? comm::makeHostStagedCommunicator(std::move(host), staging) : std::move(host));
    return links.owned.back().get();
  };
  for (const plan::Group &group : plan.ranks(rank).groups()) {
    std::vector<int32_t> members = membersOf(group);
    links.groups.push_back(own(comm::makeCpuCommunicator(groups.at(members), indexIn(members, rank))));
  }
  if (plan.ranks_size() > 1)
    links.everyone = own(comm::makeCpuCommunicator(all, rank));
  return links;
}

void CpuRanks::abort(const std::string &why) {
  for (auto &[members, group] : groups)
    comm::abortCpuGroup(*group, why);
  comm::abortCpuGroup(*all, why);
}

absl::StatusOr<RankLinks> connectNccl(const plan::Plan &plan, const comm::LaunchEnv &env, void *cudaStream,
                                      double timeoutSeconds, bool storeServed) {
  if (env.worldSize != plan.ranks_size())
    return absl::InvalidArgumentError(absl::StrCat("the plan is for ", plan.ranks_size(), " ranks but ",
                                                   env.source, " started ", env.worldSize,
                                                   " (moe-run --nproc ", plan.ranks_size(), " starts them here)"));
  RankLinks links;
  absl::StatusOr<std::unique_ptr<comm::TcpStore>> store =
      comm::TcpStore::open(env.masterAddr, env.masterPort, /*serve=*/env.rank == 0 && !storeServed, timeoutSeconds);
  if (!store.ok())
    return store.status();
  links.store = std::move(*store);
  // Every rank creates its groups in the plan's order (the same axes at the same index on
  // every rank), then the world: NCCL's initialisations pair up without deadlock.
  for (const plan::Group &group : plan.ranks(env.rank).groups()) {
    std::vector<int32_t> members = membersOf(group);
    std::string key = absl::StrCat("nccl/", group.axis(), "/", absl::StrJoin(members, "-"));
    auto comm = comm::makeNcclCommunicator(*links.store, key, indexIn(members, env.rank),
                                           static_cast<int>(members.size()), cudaStream, timeoutSeconds);
    if (!comm.ok())
      return absl::Status(comm.status().code(), absl::StrCat("rank ", env.rank, ", group ", group.axis(), " [",
                                                             absl::StrJoin(members, ","), "]: ",
                                                             comm.status().message()));
    links.owned.push_back(std::move(*comm));
    links.groups.push_back(links.owned.back().get());
  }
  auto everyone = comm::makeNcclCommunicator(*links.store, "nccl/world", env.rank, env.worldSize, cudaStream,
                                             timeoutSeconds);
  if (!everyone.ok())
    return absl::Status(everyone.status().code(),
                        absl::StrCat("rank ", env.rank, ", every rank: ", everyone.status().message()));
  links.owned.push_back(std::move(*everyone));
  links.everyone = links.owned.back().get();
  return links;
}

namespace {

/// The ranks of runLocalProcesses, for its signal handler: a SIGTERM (or Ctrl-C) sent to the
/// launcher reaches every rank, and the launcher still waits for them (their checkpoint).
constexpr int kMaxLocalRanks = 1024;
std::atomic<pid_t> localRanks[kMaxLocalRanks];
std::atomic<int> localRankCount{0};

void forwardToRanks(int signal) {
  for (int k = 0; k < localRankCount.load(); ++k)
    if (pid_t pid = localRanks[k].load(); pid > 0)
      kill(pid, signal); // a second Ctrl-C copy within a second is one request to moe-run
}

} // namespace

int runLocalProcesses(int n, const std::vector<std::string> &argv) {
  if (n > kMaxLocalRanks) {
    std::cerr << "moe-run: --nproc " << n << " is more than " << kMaxLocalRanks << " local ranks\n";
    return 2;
  }
  // The store lives here, on a port the system picks (no race for a free one); the ranks
  // only connect to it (MOEC_STORE_SERVED).
  absl::StatusOr<std::unique_ptr<comm::TcpStore>> store =
      comm::TcpStore::open("127.0.0.1", 0, /*serve=*/true, /*connectTimeoutSeconds=*/30);
  if (!store.ok()) {
    std::cerr << "moe-run: cannot start the ranks' store: " << store.status().message() << "\n";
    return 1;
  }
  int port = (*store)->port();
  std::vector<pid_t> children;
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid < 0) {
      std::cerr << "moe-run: cannot start rank " << r << ": " << std::strerror(errno) << "\n";
      for (pid_t child : children)
        kill(child, SIGTERM);
      return 1;
    }
    if (pid == 0) {
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      setenv("MOEC_STORE_SERVED", "1", 1);
      std::vector<char *> args;
      for (const std::string &a : argv)
        args.push_back(const_cast<char *>(a.c_str()));
      args.push_back(nullptr);
      execv("/proc/self/exe", args.data());
      std::cerr << "moe-run: rank " << r << ": cannot run /proc/self/exe: " << std::strerror(errno) << "\n";
      _exit(127);
    }
    children.push_back(pid);
    localRanks[r].store(pid);
    localRankCount.store(r + 1);
  }
  struct sigaction forward {};
  forward.sa_handler = forwardToRanks;
  sigemptyset(&forward.sa_mask);
  sigaction(SIGINT, &forward, nullptr);
  sigaction(SIGTERM, &forward, nullptr);
  // The first failure stops the others (they would wait on it in a collective until the
  // timeout): SIGTERM, then after 10 s SIGKILL (a stopped or hung rank ignores the first).
  // Its exit status is the run's.
  int result = 0, left = n;
  std::vector<bool> running(children.size(), true);
  auto deadline = std::chrono::steady_clock::time_point::max();
  while (left > 0) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno != EINTR)
      break;
    if (pid <= 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        for (size_t k = 0; k < children.size(); ++k)
          if (running[k]) {
            kill(children[k], SIGKILL);
            kill(children[k], SIGCONT);
          }
        deadline = std::chrono::steady_clock::time_point::max();
      }
      usleep(20000);
      continue;
    }
    --left;
    int rank = static_cast<int>(std::find(children.begin(), children.end(), pid) - children.begin());
    if (rank < static_cast<int>(running.size()))
      running[rank] = false;
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code != 0 && result == 0) {
      result = code;
      if (code != 130) // an interrupt reaches every rank by itself
        std::cerr << "moe-run: rank " << rank << " exited with status " << code << "; stopping the others\n";
      for (size_t k = 0; k < children.size(); ++k)
        if (running[k])
          kill(children[k], SIGTERM);
      deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    }
  }
  return result;
}

} // namespace moec::runtime
