//===- CpuCommunicator.h - ranks as threads of one process ------*- C++ -*-===//
//
// The CPU reference of the collectives: every rank of a group is a thread of
// the same process, the group shares one rendezvous. Each collective is two
// barriers: all ranks publish their buffers, each computes its own result
// (sums in rank order, so every rank gets bit-identical values), then all
// wait before anyone may reuse its input. A rank that does not arrive within
// the timeout fails the collective on every rank that did, with a message.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_COMM_CPUCOMMUNICATOR_H_
#define RUNTIME_COMM_CPUCOMMUNICATOR_H_

#include <memory>
#include <string>

#include "runtime/comm/Communicator.h"

namespace moec::runtime::comm {

/// The shared state of one group of thread ranks.
class CpuGroup;

/// A group of `size` thread ranks; each thread then takes its communicator with
/// makeCpuCommunicator(group, rank). `timeoutSeconds` bounds every wait.
std::shared_ptr<CpuGroup> makeCpuGroup(int size, double timeoutSeconds = 300);
std::unique_ptr<Communicator> makeCpuCommunicator(std::shared_ptr<CpuGroup> group, int rank);
/// Fails every wait of the group, now and later, with `why` (a rank that stopped: the others
/// would otherwise wait for it until the timeout).
void abortCpuGroup(CpuGroup &group, const std::string &why);

} // namespace moec::runtime::comm

#endif // RUNTIME_COMM_CPUCOMMUNICATOR_H_
