//===- LaunchEnv.cpp - this process's rank, from the launcher -------------===//

#include "runtime/comm/LaunchEnv.h"

#include <cerrno>
#include <climits>

#include "absl/strings/str_cat.h"

namespace moec::runtime::comm {

namespace {

constexpr int kDefaultPort = 29500;

struct Launcher {
  const char *source, *rankVar, *sizeVar, *localRankVar;
  bool localRankOptional;   // torchrun by hand often leaves LOCAL_RANK out
  bool addrDefaultsToLocal; // Slurm spans nodes: 127.0.0.1 would be a silent guess
  // Slurm sets SLURM_NTASKS in a batch script or an salloc shell too, where the process is
  // not one of srun's tasks: there only SLURM_PROCID says it is.
  bool sizeAloneMarks;
};

const Launcher kLaunchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", true, true, true},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", false, false, false},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", false, true,
     true},
};

class Reader {
public:
  explicit Reader(const std::function<const char *(const char *)> &getenv) : getenv(getenv) {}

  /// An empty variable counts as unset.
  const char *get(const char *name) const {
    const char *value = getenv(name);
    return value && *value ? value : nullptr;
  }

  /// `name` as an integer in [lo, hi]; `expected` says what it should hold.
  absl::StatusOr<int> integer(const char *name, long lo, long hi, const std::string &expected) const {
    const char *text = get(name);
    errno = 0;
    char *end = nullptr;
    long value = std::strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || value < lo || value > hi)
      return absl::InvalidArgumentError(absl::StrCat(name, "=\"", text, "\": expected ", expected));
    return static_cast<int>(value);
  }

private:
  const std::function<const char *(const char *)> &getenv;
};

absl::StatusOr<LaunchEnv> read(const Reader &env, const Launcher &l) {
  if (!env.get(l.sizeVar))
    return absl::InvalidArgumentError(absl::StrCat(l.rankVar, " is set (a ", l.source, " launch) but ",
                                                   l.sizeVar, " is not: set it to the number of processes"));
  if (!env.get(l.rankVar))
    return absl::InvalidArgumentError(absl::StrCat(l.sizeVar, " is set (a ", l.source, " launch) but ",
                                                   l.rankVar,
                                                   " is not: set it to this process's index, from 0"));
  LaunchEnv out;
  out.source = l.source;
  absl::StatusOr<int> size = env.integer(l.sizeVar, 1, INT_MAX, "the number of processes, an integer >= 1");
  if (!size.ok())
    return size.status();
  out.worldSize = *size;
  std::string range =
      absl::StrCat("an integer in [0, ", out.worldSize, ") (", l.sizeVar, "=", out.worldSize, ")");
  absl::StatusOr<int> rank = env.integer(l.rankVar, 0, out.worldSize - 1, "this process's index, " + range);
  if (!rank.ok())
    return rank.status();
  out.rank = *rank;

  if (env.get(l.localRankVar)) {
    absl::StatusOr<int> local =
        env.integer(l.localRankVar, 0, out.worldSize - 1, "this process's index on its node, " + range);
    if (!local.ok())
      return local.status();
    out.localRank = *local;
  } else if (l.localRankOptional) {
    out.localRank = out.rank; // one node
  } else {
    return absl::InvalidArgumentError(absl::StrCat(l.localRankVar, " is not set (a ", l.source,
                                                   " launch): expected this process's index on its node"));
  }

  if (const char *addr = env.get("MASTER_ADDR"))
    out.masterAddr = addr;
  else if (const char *slurmAddr = l.addrDefaultsToLocal ? nullptr : env.get("SLURM_LAUNCH_NODE_IPADDR"))
    out.masterAddr = slurmAddr;
  else if (!l.addrDefaultsToLocal)
    return absl::InvalidArgumentError(
        absl::StrCat("neither MASTER_ADDR nor SLURM_LAUNCH_NODE_IPADDR is set (a ", l.source,
                     " launch): set MASTER_ADDR to rank 0's host"));
  else
    out.masterAddr = "127.0.0.1";

  out.masterPort = kDefaultPort;
  if (env.get("MASTER_PORT")) {
    absl::StatusOr<int> port = env.integer("MASTER_PORT", 1, 65535, "a TCP port, an integer in [1, 65535]");
    if (!port.ok())
      return port.status();
    out.masterPort = *port;
  }
  return out;
}

} // namespace

absl::StatusOr<LaunchEnv> readLaunchEnv(const std::function<const char *(const char *)> &getenv) {
  Reader env(getenv);
  for (const Launcher &l : kLaunchers)
    if (env.get(l.rankVar) || (l.sizeAloneMarks && env.get(l.sizeVar)))
      return read(env, l);
  return LaunchEnv{};
}

} // namespace moec::runtime::comm
