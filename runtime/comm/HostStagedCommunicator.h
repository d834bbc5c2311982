//===- HostStagedCommunicator.h - host collectives on device buffers -*- C++ -*-===//
//
// Runs a host communicator's collectives (the CPU reference's, ranks as threads) on buffers
// in device memory: each collective copies its input to the host after the work issued before
// it, runs the host collective, and copies the result back before the work issued after it.
// Thread ranks that share one GPU can then run a multi-rank plan end to end: every CUDA kernel
// of the sharded plan on the GPU, only the transport on the host (moe-mesh-check
// --ranks-on-one-gpu). Slow (every collective synchronises its stream), for correctness only.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_COMM_HOSTSTAGEDCOMMUNICATOR_H_
#define RUNTIME_COMM_HOSTSTAGEDCOMMUNICATOR_H_

#include <functional>
#include <memory>

#include "runtime/comm/Communicator.h"

namespace moec::runtime::comm {

/// Copies between device and host memory, ordered with the device work issued so far on the
/// stream the rank issues from (a Device's download and upload).
struct HostTransfers {
  std::function<absl::Status(void *host, const void *device, size_t bytes)> toHost;
  std::function<absl::Status(void *device, const void *host, size_t bytes)> toDevice;
};

/// `host`'s collectives (which read and write host memory) on device buffers.
std::unique_ptr<Communicator> makeHostStagedCommunicator(std::unique_ptr<Communicator> host,
                                                         HostTransfers transfers);

} // namespace moec::runtime::comm

#endif // RUNTIME_COMM_HOSTSTAGEDCOMMUNICATOR_H_
