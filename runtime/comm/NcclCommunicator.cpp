//===- NcclCommunicator.cpp - collectives of one GPU group over NCCL ------===//

#include "runtime/comm/NcclCommunicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"

namespace moec::runtime::comm {

namespace {

using Clock = std::chrono::steady_clock;

std::string dtypeName(plan::DType dtype) {
  const std::string &name = plan::DType_Name(dtype);
  return name.empty() ? absl::StrCat("dtype ", static_cast<int>(dtype)) : name;
}

/// "allReduce of 1000 BF16 elements", the head of every message about a collective.
std::string describe(const char *collective, size_t count, plan::DType dtype) {
  return absl::StrCat(collective, " of ", count, " ", dtypeName(dtype), " elements");
}

absl::StatusOr<ncclDataType_t> ncclType(plan::DType dtype, const std::string &what) {
  switch (dtype) {
  case plan::F32:
    return ncclFloat32;
  case plan::BF16:
    return ncclBfloat16;
  case plan::F16:
    return ncclFloat16;
  case plan::I32:
    return ncclInt32;
  case plan::I64:
    return ncclInt64;
  default:
    return absl::InvalidArgumentError(
        absl::StrCat("nccl ", what, ": ", dtypeName(dtype), " is not supported (F32, BF16, F16, I32, I64)"));
  }
}

std::string ncclText(ncclResult_t result, ncclComm_t comm) {
  std::string text = absl::StrCat(ncclGetErrorString(result), " (ncclResult ", static_cast<int>(result), ")");
  const char *last = ncclGetLastError(comm);
  if (last && *last)
    absl::StrAppend(&text, ": ", last);
  return text;
}

cudaStream_t asStream(void *stream) { return static_cast<cudaStream_t>(stream); }

} // namespace

NcclCommunicator::NcclCommunicator(int rank, int size, void *stream, double timeoutSeconds, std::string key)
    : groupRank(rank), groupSize(size), stream(stream), timeoutSeconds(timeoutSeconds), key(std::move(key)) {}

absl::StatusOr<std::unique_ptr<NcclCommunicator>>
NcclCommunicator::create(TcpStore &store, const std::string &key, int rankInGroup, int groupSize,
                         void *cudaStream, double timeoutSeconds) {
  if (groupSize < 1 || rankInGroup < 0 || rankInGroup >= groupSize || !(timeoutSeconds > 0) || key.empty())
    return absl::InvalidArgumentError(absl::StrCat("nccl communicator \"", key, "\": rank ", rankInGroup,
                                                   " of a group of ", groupSize, ", timeout ", timeoutSeconds,
                                                   " s: expected 0 <= rank < size, a timeout > 0 and a key"));
  std::unique_ptr<NcclCommunicator> comm(
      new NcclCommunicator(rankInGroup, groupSize, cudaStream, timeoutSeconds, key));
  if (absl::Status s = comm->init(store); !s.ok())
    return s;
  return comm;
}

absl::Status NcclCommunicator::init(TcpStore &store) {
  // NVLink multicast (NVLS) stays off: the GPU machines we run on must not use it, and the
  // plain rings and trees suffice. An explicit setting in the environment is kept.
  ::setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);

  std::string what =
      absl::StrCat("initialisation of group \"", key, "\" (rank ", groupRank, " of ", groupSize, ")");
  if (cudaError_t e = cudaMalloc(&scratch, sizeof(int32_t)); e != cudaSuccess)
    return absl::InternalError(absl::StrCat("nccl ", what, ": cudaMalloc: ", cudaGetErrorString(e)));
  if (cudaError_t e = cudaMemset(scratch, 0, sizeof(int32_t)); e != cudaSuccess)
    return absl::InternalError(absl::StrCat("nccl ", what, ": cudaMemset: ", cudaGetErrorString(e)));

  ncclUniqueId id;
  if (groupRank == 0) {
    if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess)
      return absl::InternalError(absl::StrCat("nccl ", what, ": ncclGetUniqueId: ", ncclText(r, nullptr)));
    if (absl::Status s = store.set(key, std::string(id.internal, sizeof(id.internal))); !s.ok())
      return absl::Status(s.code(), absl::StrCat("nccl ", what, ": ", s.message()));
  } else {
    absl::StatusOr<std::string> bytes = store.get(key, timeoutSeconds);
    if (!bytes.ok())
      return absl::Status(bytes.status().code(), absl::StrCat("nccl ", what, ": ", bytes.status().message()));
    if (bytes->size() != sizeof(id.internal))
      return absl::InternalError(absl::StrCat("nccl ", what, ": the store holds ", bytes->size(),
                                              " bytes under \"", key, "\", not an ncclUniqueId of ",
                                              sizeof(id.internal)));
    std::memcpy(id.internal, bytes->data(), sizeof(id.internal));
  }

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  // Non-blocking: every call returns and poll() bounds the waits, so a peer that never comes
  // ends in a message naming the collective. MOEC_NCCL_BLOCKING=1 leaves the waits to NCCL
  // (and hangs to the rank watchdog, MOEC_RANK_TIMEOUT): each call returns sooner, which the
  // expert exchange's many small calls notice (bench/RESULTS.md).
  const char *blocking = std::getenv("MOEC_NCCL_BLOCKING");
  config.blocking = blocking && std::string(blocking) == "1" ? 1 : 0;
  config.commName = key.c_str();
  ncclComm_t handle = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&handle, groupSize, id, groupRank, &config);
  comm = handle;
  return settle(r, what);
}

NcclCommunicator::~NcclCommunicator() {
  if (comm) {
    // Finalize flushes what is still queued; a peer that is gone must not hang us here.
    ncclResult_t r = ncclCommFinalize(comm);
    if (r == ncclInProgress)
      (void)poll("ncclCommFinalize", false); // aborts on an error or the timeout
    else if (r != ncclSuccess)
      (void)fail(absl::InternalError("ncclCommFinalize"));
    if (comm)
      ncclCommDestroy(comm);
    comm = nullptr;
  }
  if (scratch)
    cudaFree(scratch);
}

std::string NcclCommunicator::name() const {
  int version = 0;
  ncclGetVersion(&version);
  // Since 2.9: major * 10000 + minor * 100 + patch.
  return absl::StrCat("nccl ", version / 10000, ".", version / 100 % 100, ".", version % 100);
}

absl::Status NcclCommunicator::fail(absl::Status error) {
  if (comm) {
    ncclCommAbort(comm); // also stops NCCL kernels still waiting for a peer
    comm = nullptr;
  }
  if (broken.ok())
    broken = error;
  return error;
}

absl::Status NcclCommunicator::healthy(const std::string &what) {
  if (!broken.ok() || !comm)
    return absl::Status(broken.ok() ? absl::StatusCode::kFailedPrecondition : broken.code(),
                        absl::StrCat("nccl ", what, ": the communicator failed earlier: ", broken.message()));
  ncclResult_t async = ncclSuccess;
  ncclResult_t r = ncclCommGetAsyncError(comm, &async);
  if (r != ncclSuccess)
    return fail(
        absl::InternalError(absl::StrCat("nccl ", what, ": ncclCommGetAsyncError: ", ncclText(r, comm))));
  if (async == ncclInProgress)
    return poll(what, false);
  if (async != ncclSuccess)
    return fail(absl::InternalError(
        absl::StrCat("nccl ", what, ": an earlier operation failed: ", ncclText(async, comm))));
  return absl::OkStatus();
}

absl::Status NcclCommunicator::settle(int result, const std::string &what) {
  ncclResult_t r = static_cast<ncclResult_t>(result);
  if (r == ncclSuccess)
    return absl::OkStatus();
  if (r == ncclInProgress)
    return poll(what, false);
  return fail(absl::InternalError(absl::StrCat("nccl ", what, ": ", ncclText(r, comm))));
}

absl::Status NcclCommunicator::poll(const std::string &what, bool waitForStream) {
  Clock::time_point start = Clock::now();
  Clock::time_point deadline =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeoutSeconds));
  for (int spins = 0;; ++spins) {
    ncclResult_t async = ncclSuccess;
    if (ncclResult_t r = ncclCommGetAsyncError(comm, &async); r != ncclSuccess)
      return fail(
          absl::InternalError(absl::StrCat("nccl ", what, ": ncclCommGetAsyncError: ", ncclText(r, comm))));
    if (async != ncclSuccess && async != ncclInProgress)
      return fail(absl::InternalError(absl::StrCat("nccl ", what, ": ", ncclText(async, comm))));
    if (async == ncclSuccess) {
      if (!waitForStream)
        return absl::OkStatus();
      cudaError_t e = cudaStreamQuery(asStream(stream));
      if (e == cudaSuccess)
        return absl::OkStatus();
      if (e != cudaErrorNotReady)
        return fail(absl::InternalError(absl::StrCat("nccl ", what, ": the GPU failed: ", cudaGetErrorName(e),
                                                     " (", cudaGetErrorString(e), ")")));
    }
    if (Clock::now() >= deadline)
      return fail(absl::DeadlineExceededError(absl::StrCat(
          "nccl: timed out after ", timeoutSeconds, " s in ", what, " (rank ", groupRank, " of ", groupSize,
          " in group \"", key, "\"; a peer did not take part?); the communicator is aborted")));
    // Spin briefly for short collectives, then sleep so a long wait costs no core.
    if (spins < 1000)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

absl::Status NcclCommunicator::wait(const std::string &what) {
  if (absl::Status s = healthy(what); !s.ok())
    return s;
  return poll(what, true);
}

absl::Status NcclCommunicator::barrier() {
  if (absl::Status s = healthy("barrier"); !s.ok())
    return s;
  if (absl::Status s =
          settle(ncclAllReduce(scratch, scratch, 1, ncclInt32, ncclSum, comm, asStream(stream)), "barrier");
      !s.ok())
    return s;
  return poll("barrier", true);
}

absl::Status NcclCommunicator::allReduce(const void *in, void *out, size_t count, plan::DType dtype) {
  std::string what = describe("allReduce", count, dtype);
  absl::StatusOr<ncclDataType_t> type = ncclType(dtype, what);
  if (!type.ok())
    return type.status();
  if (absl::Status s = healthy(what); !s.ok() || count == 0)
    return s;
  return settle(ncclAllReduce(in, out, count, *type, ncclSum, comm, asStream(stream)), what);
}

absl::Status NcclCommunicator::allGather(const void *in, void *out, size_t count, plan::DType dtype) {
  std::string what = describe("allGather", count, dtype);
  absl::StatusOr<ncclDataType_t> type = ncclType(dtype, what);
  if (!type.ok())
    return type.status();
  if (absl::Status s = healthy(what); !s.ok() || count == 0)
    return s;
  return settle(ncclAllGather(in, out, count, *type, comm, asStream(stream)), what);
}

absl::Status NcclCommunicator::reduceScatter(const void *in, void *out, size_t count, plan::DType dtype) {
  std::string what = describe("reduceScatter", count, dtype);
  absl::StatusOr<ncclDataType_t> type = ncclType(dtype, what);
  if (!type.ok())
    return type.status();
  if (absl::Status s = healthy(what); !s.ok() || count == 0)
    return s;
  return settle(ncclReduceScatter(in, out, count, *type, ncclSum, comm, asStream(stream)), what);
}

absl::Status NcclCommunicator::broadcast(void *data, size_t count, plan::DType dtype, int root) {
  std::string what = describe("broadcast", count, dtype);
  absl::StatusOr<ncclDataType_t> type = ncclType(dtype, what);
  if (!type.ok())
    return type.status();
  if (root < 0 || root >= groupSize)
    return absl::InvalidArgumentError(
        absl::StrCat("nccl ", what, ": root ", root, " is not a rank of the group of ", groupSize));
  if (absl::Status s = healthy(what); !s.ok() || count == 0)
    return s;
  return settle(ncclBroadcast(data, data, count, *type, root, comm, asStream(stream)), what);
}

absl::Status NcclCommunicator::exchange(const void *in, const std::vector<Segment> &sends, void *out,
                                        const std::vector<Segment> &recvs, plan::DType dtype) {
  size_t total = 0;
  for (const Segment &s : sends)
    total += s.count;
  std::string what = describe("exchange", total, dtype) + " sent";
  absl::StatusOr<ncclDataType_t> type = ncclType(dtype, what);
  if (!type.ok())
    return type.status();
  for (const std::vector<Segment> *list : {&sends, &recvs})
    for (const Segment &s : *list)
      if (s.peer < 0 || s.peer >= groupSize)
        return absl::InvalidArgumentError(absl::StrCat("nccl ", what, ": peer ", s.peer, " of a group of ",
                                                       groupSize));
  if (absl::Status s = healthy(what); !s.ok())
    return s;
  size_t bytes = elementBytes(dtype);
  const char *src = static_cast<const char *>(in);
  char *dst = static_cast<char *>(out);
  // Our own segments pair in order and are local copies, ordered on the stream.
  std::vector<const Segment *> ownSends, ownRecvs;
  for (const Segment &s : sends)
    if (s.peer == groupRank)
      ownSends.push_back(&s);
  for (const Segment &r : recvs)
    if (r.peer == groupRank)
      ownRecvs.push_back(&r);
  if (ownSends.size() != ownRecvs.size())
    return absl::InvalidArgumentError(absl::StrCat("nccl ", what, ": rank ", groupRank, " sends itself ",
                                                   ownSends.size(), " segments but receives ", ownRecvs.size()));
  for (size_t k = 0; k < ownSends.size(); ++k) {
    if (ownSends[k]->count != ownRecvs[k]->count)
      return absl::InvalidArgumentError(absl::StrCat("nccl ", what, ": rank ", groupRank, " sends itself ",
                                                     ownSends[k]->count, " elements but receives ",
                                                     ownRecvs[k]->count, " (segment ", k, ")"));
    if (ownSends[k]->count > 0)
      if (cudaError_t e = cudaMemcpyAsync(dst + ownRecvs[k]->offset * bytes, src + ownSends[k]->offset * bytes,
                                          ownSends[k]->count * bytes, cudaMemcpyDeviceToDevice, asStream(stream));
          e != cudaSuccess)
        return fail(absl::InternalError(absl::StrCat("nccl ", what, ": cudaMemcpyAsync: ", cudaGetErrorString(e))));
  }
  bool anyPeer = false;
  for (const std::vector<Segment> *list : {&sends, &recvs})
    for (const Segment &s : *list)
      anyPeer |= s.peer != groupRank && s.count > 0;
  if (!anyPeer)
    return absl::OkStatus();
  // One group; NCCL matches the sends and receives between two ranks in the order issued.
  if (ncclResult_t r = ncclGroupStart(); r != ncclSuccess)
    return settle(r, what);
  ncclResult_t failed = ncclSuccess;
  auto keep = [&](ncclResult_t r) {
    if (failed == ncclSuccess && r != ncclSuccess && r != ncclInProgress)
      failed = r;
  };
  for (const Segment &s : sends)
    if (s.peer != groupRank && s.count > 0 && failed == ncclSuccess)
      keep(ncclSend(src + s.offset * bytes, s.count, *type, s.peer, comm, asStream(stream)));
  for (const Segment &r : recvs)
    if (r.peer != groupRank && r.count > 0 && failed == ncclSuccess)
      keep(ncclRecv(dst + r.offset * bytes, r.count, *type, r.peer, comm, asStream(stream)));
  ncclResult_t end = ncclGroupEnd();
  return settle(failed != ncclSuccess ? failed : end, what);
}

absl::StatusOr<std::unique_ptr<Communicator>> makeNcclCommunicator(TcpStore &store, const std::string &key,
                                                                   int rankInGroup, int groupSize,
                                                                   void *cudaStream, double timeoutSeconds) {
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> comm =
      NcclCommunicator::create(store, key, rankInGroup, groupSize, cudaStream, timeoutSeconds);
  if (!comm.ok())
    return comm.status();
  return std::unique_ptr<Communicator>(std::move(*comm));
}

} // namespace moec::runtime::comm
