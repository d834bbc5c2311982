//===- LaunchEnv.h - this process's rank, from the launcher ------*- C++ -*-===//
//
// One process per GPU: which rank this process is, how many there are, and
// where rank 0's store listens, read from the variables the usual launchers
// set. Checked in this order (the first launcher whose rank variable is set
// wins, so torchrun under srun reads as torchrun):
//
//   torchrun  RANK, WORLD_SIZE, LOCAL_RANK (default RANK), MASTER_ADDR, MASTER_PORT
//   Slurm     SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID; the address is MASTER_ADDR,
//             else SLURM_LAUNCH_NODE_IPADDR
//   Open MPI  OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK
//
// MASTER_ADDR defaults to 127.0.0.1 (not for Slurm, which spans nodes) and
// MASTER_PORT to 29500. None of them set: a single rank.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_COMM_LAUNCHENV_H_
#define RUNTIME_COMM_LAUNCHENV_H_

#include <cstdlib>
#include <functional>
#include <string>

#include "absl/status/statusor.h"

namespace moec::runtime::comm {

struct LaunchEnv {
  int rank = 0, worldSize = 1, localRank = 0;
  std::string masterAddr = "127.0.0.1";
  int masterPort = 29500;
  /// "torchrun", "slurm", "openmpi" or "none".
  std::string source = "none";
};

/// The launch as the variables describe it; an error names the variable at fault and what
/// it should hold. `getenv` is replaceable for tests.
absl::StatusOr<LaunchEnv> readLaunchEnv(const std::function<const char *(const char *)> &getenv = ::getenv);

} // namespace moec::runtime::comm

#endif // RUNTIME_COMM_LAUNCHENV_H_
