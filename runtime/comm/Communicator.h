//===- Communicator.h - collectives among the ranks of one group -*- C++ -*-===//
//
// What the executor and the trainer call for a plan's Collective steps and the
// trainer's few scalars. One Communicator per plan group (an axis of the mesh)
// per rank. Buffers are memory of the rank's Device (host memory for the CPU,
// device memory for CUDA); calls are issued in the same order on every member,
// as NCCL requires. Reductions are sums.
//
// Two implementations: CpuCommunicator (ranks are threads of one process, for
// CI and the CPU reference) and NcclCommunicator (one process per GPU).
// Errors (a peer that never arrives, an NCCL failure) come back as a Status
// naming the collective; they never hang for ever.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_COMM_COMMUNICATOR_H_
#define RUNTIME_COMM_COMMUNICATOR_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "runtime/plan/plan.pb.h"

namespace moec::runtime::comm {

class Communicator {
public:
  virtual ~Communicator() = default;
  /// This rank's index in the group, and the group's size.
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// "cpu threads", "nccl 2.x".
  virtual std::string name() const = 0;
  /// The device stream the collectives from now on are enqueued on (a plan step's stream);
  /// communicators that run on the host ignore it.
  virtual void setStream(void *deviceStream) {}

  /// out = Σ over ranks of in; `count` elements; in == out is allowed.
  virtual absl::Status allReduce(const void *in, void *out, size_t count, plan::DType dtype) = 0;
  /// out = the ranks' `count` elements each, concatenated in rank order.
  virtual absl::Status allGather(const void *in, void *out, size_t count, plan::DType dtype) = 0;
  /// out = slice `rank` (of `count` elements) of Σ over ranks of in (size() x count).
  virtual absl::Status reduceScatter(const void *in, void *out, size_t count, plan::DType dtype) = 0;
  /// in and out hold size() blocks; block j of `in` goes to rank j, block i of `out` came
  /// from rank i. Block k holds sendCounts[k] (recvCounts[k]) elements; blocks are contiguous
  /// in rank order. Counts must agree pairwise (what i sends to j is what j receives from i).
  /// One exchange() of a segment per rank.
  absl::Status allToAll(const void *in, const std::vector<size_t> &sendCounts, void *out,
                        const std::vector<size_t> &recvCounts, plan::DType dtype);
  /// A run of `count` elements at element `offset` of a buffer, to or from rank `peer`.
  struct Segment {
    int peer;
    size_t offset, count;
  };
  /// Grouped point-to-point: each of `sends` goes from `in` to its peer, each of `recvs`
  /// lands in `out`. Between two ranks a and b, the i-th send from a to b pairs with b's
  /// i-th receive from a, of the same count (a rank's own segments pair the same way and
  /// are copies). `in` and `out` must not overlap. The expert exchange sends one segment
  /// per (peer, expert) so rows land grouped by expert with no extra permutation.
  virtual absl::Status exchange(const void *in, const std::vector<Segment> &sends, void *out,
                                const std::vector<Segment> &recvs, plan::DType dtype) = 0;
  /// `count` elements of root's `data` into every rank's `data`.
  virtual absl::Status broadcast(void *data, size_t count, plan::DType dtype, int root) = 0;
  /// Waits until every rank of the group arrives here.
  virtual absl::Status barrier() = 0;
};

/// Bytes per element of `dtype` (0 for an unknown one).
size_t elementBytes(plan::DType dtype);

} // namespace moec::runtime::comm

#endif // RUNTIME_COMM_COMMUNICATOR_H_
