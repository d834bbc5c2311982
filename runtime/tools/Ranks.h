//===- Ranks.h - this process's ranks: how they start and connect -*- C++ -*-===//
//
// A plan for several ranks runs one rank per GPU process (NCCL, rendezvous
// through a TCP store on rank 0: torchrun/Slurm/Open MPI variables, or
// `moe-run --nproc N`, which starts the N local processes itself) or, on the
// CPU, one rank per thread of one process (the CPU communicator: CI and the
// reference). Either way a rank gets one communicator per group of its plan
// (the executor's collectives) and one over every rank (the trainer's sums).
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_TOOLS_RANKS_H_
#define RUNTIME_TOOLS_RANKS_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/comm/Communicator.h"
#include "runtime/comm/CpuCommunicator.h"
#include "runtime/comm/HostStagedCommunicator.h"
#include "runtime/comm/LaunchEnv.h"
#include "runtime/comm/TcpStore.h"
#include "runtime/exec/Device.h"
#include "runtime/plan/plan.pb.h"

namespace moec::runtime {

/// One rank's communicators.
struct RankLinks {
  std::vector<comm::Communicator *> groups; // by the rank's plan group index
  comm::Communicator *everyone = nullptr;   // null for one rank
  std::vector<std::unique_ptr<comm::Communicator>> owned;
  std::unique_ptr<comm::TcpStore> store; // NCCL's rendezvous (kept for the communicators' life)
};

/// Thread ranks of one process: the thread groups every rank's communicators join.
class CpuRanks {
public:
  CpuRanks(const plan::Plan &plan, double timeoutSeconds);
  /// Rank `rank`'s links (call once per rank, from any thread). With `stagedThrough`, the
  /// rank's buffers are that device's memory: each collective goes through host memory (thread
  /// ranks that share one GPU).
  RankLinks links(int rank, Device *stagedThrough = nullptr);
  /// Fails every rank's collectives at once with `why` (a rank that returned early).
  void abort(const std::string &why);

private:
  const plan::Plan &plan;
  std::map<std::vector<int32_t>, std::shared_ptr<comm::CpuGroup>> groups;
  std::shared_ptr<comm::CpuGroup> all;
};

/// This process's rank of `plan` with NCCL on `cudaStream`, through the store at
/// env.masterAddr:masterPort, which rank 0 serves unless someone already does (`--nproc`
/// serves it from the launching process: MOEC_STORE_SERVED=1). Fails with a message when the
/// launch and the plan disagree.
absl::StatusOr<RankLinks> connectNccl(const plan::Plan &plan, const comm::LaunchEnv &env, void *cudaStream,
                                      double timeoutSeconds, bool storeServed = false);

/// `moe-run ... --nproc N` on GPUs: re-runs this command (argv without --nproc) as N
/// processes with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set, waits for
/// them, and stops the others when one fails. Returns the exit code for the whole run.
int runLocalProcesses(int n, const std::vector<std::string> &argv);

} // namespace moec::runtime

#endif // RUNTIME_TOOLS_RANKS_H_
