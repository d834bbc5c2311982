//===- NcclCommunicator.h - collectives of one GPU group over NCCL -*- C++ -*-===//
//
// One process per GPU; the caller has made its GPU current (cudaSetDevice)
// before creating the communicator. Rank 0 of the group makes the NCCL unique
// id and puts it in the TCP store under `key` ("nccl/ep/0": one key per
// group); the others read it from there.
//
// The communicator is non-blocking (NCCL's config.blocking = 0), so nothing
// waits for ever: every collective is enqueued on the given stream and
// returns without synchronising (stream-ordered, like a kernel); barrier()
// and wait() then poll the stream and NCCL's asynchronous error until done,
// and after `timeoutSeconds` abort the communicator and say
// "timed out after N s in <what>". After an abort or an NCCL error every
// call fails with the first error. Not thread-safe: one thread per
// communicator, as the executor runs.
//
// NVLink multicast (NVLS) stays off: NCCL_NVLS_ENABLE=0 unless the
// environment already sets it.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_COMM_NCCLCOMMUNICATOR_H_
#define RUNTIME_COMM_NCCLCOMMUNICATOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/comm/Communicator.h"
#include "runtime/comm/TcpStore.h"

struct ncclComm; // nccl.h's ncclComm_t is a pointer to it

namespace moec::runtime::comm {

class NcclCommunicator : public Communicator {
public:
  /// See makeNcclCommunicator.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> create(TcpStore &store, const std::string &key,
                                                                  int rankInGroup, int groupSize,
                                                                  void *cudaStream, double timeoutSeconds);
  ~NcclCommunicator() override;

  int rank() const override { return groupRank; }
  int size() const override { return groupSize; }
  std::string name() const override;
  void setStream(void *deviceStream) override { stream = deviceStream; }

  absl::Status allReduce(const void *in, void *out, size_t count, plan::DType dtype) override;
  absl::Status allGather(const void *in, void *out, size_t count, plan::DType dtype) override;
  absl::Status reduceScatter(const void *in, void *out, size_t count, plan::DType dtype) override;
  absl::Status exchange(const void *in, const std::vector<Segment> &sends, void *out,
                        const std::vector<Segment> &recvs, plan::DType dtype) override;
  absl::Status broadcast(void *data, size_t count, plan::DType dtype, int root) override;
  /// A one-element all-reduce, then wait("barrier").
  absl::Status barrier() override;

  /// Waits until the stream has run everything enqueued so far (collectives and kernels
  /// alike, so the timeout must cover a step's compute) or NCCL reports an error; after
  /// the timeout, aborts the communicator. `what` names the wait in the error ("step 12").
  absl::Status wait(const std::string &what);

private:
  NcclCommunicator(int rank, int size, void *stream, double timeoutSeconds, std::string key);
  absl::Status init(TcpStore &store);
  /// Fails when the communicator was aborted or NCCL holds an asynchronous error.
  absl::Status healthy(const std::string &what);
  /// What an NCCL call returned: ncclInProgress is polled until it settles.
  absl::Status settle(int result, const std::string &what);
  /// Polls NCCL's asynchronous state (and the stream, with `stream`) until done.
  absl::Status poll(const std::string &what, bool stream);
  /// Aborts the communicator and remembers `error` for every later call.
  absl::Status fail(absl::Status error);

  int groupRank, groupSize;
  void *stream;
  double timeoutSeconds;
  std::string key;
  ncclComm *comm = nullptr;
  void *scratch = nullptr; // barrier()'s element, device memory
  absl::Status broken;     // the first fatal error
};

/// One rank's NCCL communicator of a group of `groupSize` ranks, its collectives
/// enqueued on `cudaStream` (a cudaStream_t; nullptr: the legacy default stream).
/// `timeoutSeconds` bounds the wait for rank 0's id in the store, the NCCL
/// initialisation, barrier() and wait().
absl::StatusOr<std::unique_ptr<Communicator>> makeNcclCommunicator(TcpStore &store, const std::string &key,
                                                                   int rankInGroup, int groupSize,
                                                                   void *cudaStream, double timeoutSeconds);

} // namespace moec::runtime::comm

#endif // RUNTIME_COMM_NCCLCOMMUNICATOR_H_
