//===- ExpertExchange.cpp - the executor's expert exchange -----------------===//
//
// EXPERT_ROUTE, EXPERT_SEND and EXPERT_RETURN (plan.proto): expert
// parallelism moves each token once to every rank holding one of its experts.
// The route reads the tokens' experts to the host (NCCL needs message sizes
// there), decides the destinations, swaps the counts with the other ranks
// (another wait) and sends each token's experts as local numbers. A send
// gathers the tokens' rows per destination with one kernel
// (Device::gatherRows) and exchanges one message per pair of ranks; a
// return exchanges the other way and adds each token's rows from its ranks
// with one kernel (Device::sumRows).
//
//===----------------------------------------------------------------------===//

#include <chrono>
#include <cstdio>
#include <functional>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "runtime/exec/Executor.h"

namespace moec::runtime {

namespace {

using Segment = comm::Communicator::Segment;

/// One segment per rank, `width` elements per row, rows counted per rank in rank order.
std::vector<Segment> segments(const std::vector<size_t> &rows, size_t width) {
  std::vector<Segment> out;
  size_t at = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    out.push_back({static_cast<int>(r), at * width, rows[r] * width});
    at += rows[r];
  }
  return out;
}

size_t total(const std::vector<size_t> &counts) { return std::accumulate(counts.begin(), counts.end(), size_t{0}); }

} // namespace

absl::Status Executor::expertRoute(const plan::Collective &collective, comm::Communicator &comm) {
  auto start = std::chrono::steady_clock::now();
  TensorRef indices = buffer(collective.inputs(0)), local = buffer(collective.outputs(0));
  TensorRef layout = buffer(collective.outputs(1));
  int n = comm.size();
  int64_t tokens = indices.dim(0), k = indices.dim(1), experts = collective.num_experts();
  int64_t perRank = experts / n;
  size_t element = comm::elementBytes(indices.dtype);
  std::vector<int64_t> chosen(static_cast<size_t>(tokens * k));
  {
    std::vector<char> raw(chosen.size() * element);
    if (absl::Status s = dev->download(raw.data(), indices.data, raw.size()); !s.ok())
      return s;
    for (size_t i = 0; i < chosen.size(); ++i)
      chosen[i] = indices.dtype == plan::I64 ? reinterpret_cast<const int64_t *>(raw.data())[i]
                                             : reinterpret_cast<const int32_t *>(raw.data())[i];
  }
  ExpertRoute route;
  route.sent.assign(static_cast<size_t>(n), 0);
  route.rowOf.assign(static_cast<size_t>(tokens * n), -1);
  std::vector<std::vector<int64_t>> to(static_cast<size_t>(n));
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t j = 0; j < k; ++j) {
      int64_t e = chosen[t * k + j];
      if (e < 0 || e >= experts)
        return absl::InvalidArgumentError(
            absl::StrCat("token ", t, " chose expert ", e, ", outside [0, ", experts, ")"));
      std::vector<int64_t> &list = to[static_cast<size_t>(e / perRank)];
      if (list.empty() || list.back() != t)
        list.push_back(t);
    }
  std::vector<int32_t> localI32;
  std::vector<int64_t> localI64;
  std::vector<int64_t> counts(2 * static_cast<size_t>(n), 0); // (tokens, expert copies) per rank
  for (int r = 0; r < n; ++r)
    for (int64_t t : to[r]) {
      route.rowOf[t * n + r] = static_cast<int64_t>(route.tokensSent.size());
      route.tokensSent.push_back(t);
      for (int64_t j = 0; j < k; ++j) {
        int64_t e = chosen[t * k + j], mine = e / perRank == r ? e - r * perRank : -1;
        counts[2 * r + 1] += mine >= 0;
        if (indices.dtype == plan::I64)
          localI64.push_back(mine);
        else
          localI32.push_back(static_cast<int32_t>(mine));
      }
    }
  for (int r = 0; r < n; ++r) {
    route.sent[r] = to[r].size();
    counts[2 * r] = static_cast<int64_t>(to[r].size());
  }
  // The counts: row 0 of the layout is what this rank sends to each rank, row 1 (after the
  // swap) what it receives from each.
  if (absl::Status s = dev->uploadStaged(layout.data, counts.data(), counts.size() * sizeof(int64_t)); !s.ok())
    return s;
  std::vector<size_t> pair(static_cast<size_t>(n), 2);
  auto *rows = static_cast<int64_t *>(layout.data);
  if (absl::Status s = comm.allToAll(rows, pair, rows + 2 * n, pair, plan::I64); !s.ok())
    return s;
  if (absl::Status s = dev->download(counts.data(), rows + 2 * n, counts.size() * sizeof(int64_t)); !s.ok())
    return s;
  Received got;
  for (int r = 0; r < n; ++r) {
    route.received.push_back(static_cast<size_t>(counts[2 * r]));
    got.tokens += counts[2 * r];
    got.copies += counts[2 * r + 1];
  }
  size_t received = total(route.received);
  if (route.tokensSent.size() > static_cast<size_t>(tokens) * n || received > static_cast<size_t>(local.dim(0)))
    return absl::InternalError(absl::StrCat("the route sends ", route.tokensSent.size(), " tokens and receives ",
                                            received, "; room is ", local.dim(0), " rows"));
  size_t bytes = route.tokensSent.size() * static_cast<size_t>(k) * element;
  if (absl::Status s = reserveStaging(std::max<size_t>(bytes, 1)); !s.ok())
    return s;
  const void *host = indices.dtype == plan::I64 ? static_cast<const void *>(localI64.data())
                                                : static_cast<const void *>(localI32.data());
  if (bytes)
    if (absl::Status s = dev->uploadStaged(staging, host, bytes); !s.ok())
      return s;
  if (absl::Status s = comm.exchange(staging, segments(route.sent, static_cast<size_t>(k)), local.data,
                                     segments(route.received, static_cast<size_t>(k)), indices.dtype);
      !s.ok())
    return s;
  receivedRows[collective.outputs(0)] = got;
  routes[collective.outputs(1)] = std::move(route);
  if (timeCollectives) {
    if (absl::Status s = dev->synchronize(); !s.ok())
      return s;
    exchangeTime[2] += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return absl::OkStatus();
}

absl::Status Executor::expertExchange(const plan::Collective &collective, comm::Communicator &comm) {
  if (collective.kind() == plan::Collective::EXPERT_ROUTE)
    return expertRoute(collective, comm);
  bool send = collective.kind() == plan::Collective::EXPERT_SEND;
  auto found = routes.find(collective.inputs(1));
  if (found == routes.end())
    return absl::FailedPreconditionError(
        absl::StrCat("no expert route wrote layout '", rankProto->buffers(collective.inputs(1)).name(),
                     "' in this run (the plan must route before it sends or returns)"));
  const ExpertRoute &route = found->second;
  TensorRef rows = buffer(collective.inputs(0)), result = buffer(collective.outputs(0));
  size_t width = static_cast<size_t>(rows.dim(1)), rowBytes = width * comm::elementBytes(rows.dtype);
  size_t sent = route.tokensSent.size();
  if (absl::Status s = reserveStaging(std::max<size_t>(sent * rowBytes, 1)); !s.ok())
    return s;
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
  std::vector<Segment> tokenSide = segments(route.sent, width), expertSide = segments(route.received, width);
  if (send) {
    // Rows past the received ones are not written: launches see the received rows only.
    if (absl::Status s = part(1, [&] { return dev->gatherRows(staging, rows.data, route.tokensSent, rowBytes); });
        !s.ok())
      return s;
    return part(0, [&] { return comm.exchange(staging, tokenSide, result.data, expertSide, rows.dtype); });
  }
  if (absl::Status s = part(0, [&] { return comm.exchange(rows.data, expertSide, staging, tokenSide, rows.dtype); });
      !s.ok())
    return s;
  return part(1, [&] {
    return dev->sumRows(result.data, staging, route.rowOf, static_cast<size_t>(comm.size()), width, rows.dtype);
  });
}

std::string Executor::exchangeBreakdown() const {
  char text[200];
  std::snprintf(text, sizeof text, "routing %.1f ms, messages %.1f ms, gathering and summing rows %.1f ms",
                exchangeTime[2] * 1e3, exchangeTime[0] * 1e3, exchangeTime[1] * 1e3);
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
