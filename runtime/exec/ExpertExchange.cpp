//===- ExpertExchange.cpp - the executor's expert all-to-all ---------------===//
//
// EXPERT_DISPATCH and EXPERT_COMBINE (plan.proto): expert parallelism's
// exchange of rows. The counts go to the host once per layer (NCCL needs
// message sizes there); each pair of ranks exchanges one message into a
// staging buffer grouped by source rank, and one copy kernel
// (Device::copyBlocks) regroups the rows by local expert (or back).
//
//===----------------------------------------------------------------------===//

#include <chrono>
#include <cstdio>
#include <functional>

#include "absl/strings/str_cat.h"
#include "runtime/exec/Executor.h"

namespace moec::runtime {

absl::Status Executor::expertExchange(const plan::Collective &collective, comm::Communicator &comm) {
  bool dispatch = collective.kind() == plan::Collective::EXPERT_DISPATCH;
  bool exchangeCounts = dispatch && collective.inputs_size() == 2;
  TensorRef rows = buffer(collective.inputs(0)), result = buffer(collective.outputs(0));
  TensorRef counts = buffer(collective.inputs(dispatch ? 1 : 2));
  TensorRef sources = buffer(exchangeCounts ? collective.outputs(2) : collective.inputs(dispatch ? 2 : 1));
  int n = comm.size();
  int64_t experts = counts.numel(), local = experts / n, width = rows.dim(1);
  // The counts decide the sizes NCCL needs on the host: the dispatch that exchanges them
  // synchronises once; the combine and both backwards of that layer reuse what it read
  // (the counts and layout buffers are not written again before their last use).
  uint32_t countsId = collective.inputs(dispatch ? 1 : 2);
  uint32_t sourcesId = exchangeCounts ? collective.outputs(2) : collective.inputs(dispatch ? 2 : 1);
  auto known = exchangeCounts ? exchangeLayouts.end() : exchangeLayouts.find({countsId, sourcesId});
  std::vector<int64_t> perExpert(static_cast<size_t>(experts)), perSource(static_cast<size_t>(n * local));
  if (known != exchangeLayouts.end()) {
    perExpert = known->second.first;
    perSource = known->second.second;
  } else {
    if (exchangeCounts) {
      // Rank j learns how many rows of each of its experts every rank sends it (fixed sizes:
      // no host counts needed), before the one wait for the device below.
      std::vector<size_t> blocks(static_cast<size_t>(n), static_cast<size_t>(local));
      if (absl::Status s = comm.allToAll(counts.data, blocks, sources.data, blocks, plan::I64); !s.ok())
        return s;
    }
    if (absl::Status s = dev->download(perExpert.data(), counts.data, perExpert.size() * sizeof(int64_t)); !s.ok())
      return s;
    if (absl::Status s = dev->download(perSource.data(), sources.data, perSource.size() * sizeof(int64_t)); !s.ok())
      return s;
    exchangeLayouts[{countsId, sourcesId}] = {perExpert, perSource};
  }
  if (exchangeCounts) {
    std::vector<int64_t> localCounts(static_cast<size_t>(local), 0);
    for (int src = 0; src < n; ++src)
      for (int64_t e = 0; e < local; ++e)
        localCounts[e] += perSource[src * local + e];
    TensorRef out = buffer(collective.outputs(1));
    if (absl::Status s = dev->uploadStaged(out.data, localCounts.data(), localCounts.size() * sizeof(int64_t));
        !s.ok())
      return s;
  }
  // Rank side: rows grouped by global expert, so the rows for rank j (experts
  // [j local, (j+1) local)) are one run. They travel as one message per pair of ranks into
  // staging, grouped by source; one copy kernel regroups them by local expert, then source
  // (and the combine does the reverse).
  size_t element = comm::elementBytes(rows.dtype), rowBytes = static_cast<size_t>(width) * element;
  using Segment = comm::Communicator::Segment;
  std::vector<Segment> rankSide, stagingSide;
  size_t sent = 0;
  for (int j = 0; j < n; ++j) {
    size_t count = 0;
    for (int64_t e = 0; e < local; ++e)
      count += static_cast<size_t>(perExpert[j * local + e]);
    rankSide.push_back({j, sent * width, count * width});
    sent += count;
  }
  std::vector<size_t> firstOf(static_cast<size_t>(n * local));
  size_t received = 0;
  for (int64_t e = 0; e < local; ++e)
    for (int src = 0; src < n; ++src) {
      firstOf[src * local + e] = received;
      received += static_cast<size_t>(perSource[src * local + e]);
    }
  std::vector<Device::Block> regroup; // staging (by source) -> expert side (by expert)
  size_t staged = 0;
  for (int src = 0; src < n; ++src) {
    size_t from = staged;
    for (int64_t e = 0; e < local; ++e) {
      size_t count = static_cast<size_t>(perSource[src * local + e]);
      regroup.push_back({firstOf[src * local + e] * rowBytes, staged * rowBytes, count * rowBytes});
      staged += count;
    }
    stagingSide.push_back({src, from * width, (staged - from) * width});
  }
  size_t rankRows = static_cast<size_t>((dispatch ? rows : result).dim(0));
  size_t expertRows = static_cast<size_t>((dispatch ? result : rows).dim(0));
  if (sent > rankRows || received > expertRows)
    return absl::InternalError(absl::StrCat(sent, " rows of this rank and ", received,
                                            " rows of its experts do not fit ", rankRows, " and ", expertRows,
                                            " rows"));
  if (absl::Status s = reserveStaging(received * rowBytes); !s.ok())
    return s;
  if (dispatch) // the launches that read them see these rows only
    receivedRows[collective.outputs(0)] = static_cast<int64_t>(received);
  // With collectives timed: each part's time on its own (a synchronisation after each).
  auto part = [&](int which, const std::function<absl::Status()> &work) -> absl::Status {
    auto start = std::chrono::steady_clock::now();
    absl::Status s = work();
    if (s.ok() && timeCollectives)
      s = dev->synchronize();
    if (timeCollectives)
      exchangeTime[which] += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return s;
  };
  if (dispatch) {
    // Rows past the received ones are not written: no launch sees them (invoke()).
    if (absl::Status s = part(0, [&] { return comm.exchange(rows.data, rankSide, staging, stagingSide, rows.dtype); });
        !s.ok())
      return s;
    return part(1, [&] { return dev->copyBlocks(result.data, staging, regroup); });
  }
  for (Device::Block &b : regroup)
    std::swap(b.to, b.from);
  if (absl::Status s = part(1, [&] { return dev->copyBlocks(staging, rows.data, regroup); }); !s.ok())
    return s;
  return part(0, [&] { return comm.exchange(staging, stagingSide, result.data, rankSide, rows.dtype); });
}

std::string Executor::exchangeBreakdown() const {
  char text[160];
  std::snprintf(text, sizeof text, "messages %.1f ms, regrouping %.1f ms", exchangeTime[0] * 1e3,
                exchangeTime[1] * 1e3);
  return text;
}

absl::Status Executor::reserveStaging(size_t bytes) {
  if (bytes <= stagingBytes)
    return absl::OkStatus();
  if (staging) {
    if (absl::Status s = dev->synchronize(); !s.ok()) // nothing may still use the old one
      return s;
    dev->release(staging);
    staging = nullptr;
    stagingBytes = 0;
  }
  absl::StatusOr<void *> memory = dev->allocate(bytes);
  if (!memory.ok())
    return absl::Status(memory.status().code(), absl::StrCat("the expert exchange's staging buffer (", bytes,
                                                             " bytes): ", memory.status().message()));
  staging = *memory;
  stagingBytes = bytes;
  return absl::OkStatus();
}

} // namespace moec::runtime
