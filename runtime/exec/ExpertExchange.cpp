//===- ExpertExchange.cpp - the executor's expert exchange -----------------===//
//
// EXPERT_ROUTE, EXPERT_SEND and EXPERT_RETURN (plan.proto): expert
// parallelism moves each token once to every rank holding one of its experts.
// The route reads the tokens' experts to the host (NCCL needs message sizes
// there), decides the destinations (the experts' ranks: consecutive ranges or
// the plan's expert placement), swaps the counts with the other ranks
// (another wait) and sends each token's experts as local numbers. A send
// gathers the tokens' rows per destination with one kernel
// (Device::gatherRows) and exchanges one message per pair of ranks; a
// return exchanges the other way and adds each token's rows from its ranks
// with one kernel (Device::sumRows). A route with all_tokens sends every
// token to every rank: an all-gather of the experts (renumbered on the device)
// and of the rows, fixed sizes, no wait for the device.
//
//===----------------------------------------------------------------------===//

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
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
  if (collective.all_tokens())
    return allTokensRoute(collective, comm);
  auto start = std::chrono::steady_clock::now();
  TensorRef indices = buffer(collective.inputs(0)), localIndices = buffer(collective.outputs(0));
  TensorRef layout = buffer(collective.outputs(1));
  int n = comm.size();
  int64_t tokens = indices.dim(0), k = indices.dim(1), experts = collective.num_experts();
  size_t element = comm::elementBytes(indices.dtype);
  std::vector<int64_t> chosen(static_cast<size_t>(tokens * k));
  {
    std::vector<char> raw(chosen.size() * element);
    if (absl::Status s = dev->download(raw.data(), indices.data, raw.size()); !s.ok())
      return s;
    if (indices.dtype == plan::I64)
      std::memcpy(chosen.data(), raw.data(), raw.size());
    else
      std::copy_n(reinterpret_cast<const int32_t *>(raw.data()), chosen.size(), chosen.data());
  }
  // Which ranks each token goes to (a flag per rank), then each rank's tokens in token order,
  // with their experts as that rank's numbers. Plain loops over flat arrays: this runs on the
  // host between two waits for the device, once per MoE layer.
  ExpertRoute route;
  const int64_t *e = chosen.data();
  // Each expert's ranks and its number on each: consecutive ranges, or the plan's placement
  // (which may hold an expert on several ranks: a replicated expert).
  int64_t perRank = collective.placement_size() ? collective.placement_size() / n : experts / n;
  std::vector<std::vector<std::pair<int32_t, int64_t>>> replicas(static_cast<size_t>(experts));
  for (int64_t at = 0; at < perRank * n; ++at) {
    int64_t expert = collective.placement_size() ? collective.placement(static_cast<int>(at)) : at;
    replicas[expert].push_back({static_cast<int32_t>(at / perRank), at % perRank});
  }
  // Each copy's rank and expert number there: a replica on this rank if there is one (no
  // message), else the token's turn among them (tokens spread evenly over the replicas).
  std::vector<int32_t> copyRank(chosen.size());
  std::vector<int64_t> copySlot(chosen.size());
  std::vector<uint8_t> goes(static_cast<size_t>(tokens * n), 0);
  for (int64_t c = 0; c < tokens * k; ++c) {
    if (e[c] < 0 || e[c] >= experts)
      return absl::InvalidArgumentError(
          absl::StrCat("token ", c / k, " chose expert ", e[c], ", outside [0, ", experts, ")"));
    const std::vector<std::pair<int32_t, int64_t>> &on = replicas[e[c]];
    const std::pair<int32_t, int64_t> *pick = &on[static_cast<size_t>((c / k) % static_cast<int64_t>(on.size()))];
    for (const auto &replica : on)
      if (replica.first == comm.rank())
        pick = &replica;
    copyRank[c] = pick->first;
    copySlot[c] = pick->second;
    goes[(c / k) * n + pick->first] = 1;
  }
  route.sent.assign(static_cast<size_t>(n), 0);
  for (int64_t t = 0; t < tokens; ++t)
    for (int r = 0; r < n; ++r)
      route.sent[r] += goes[t * n + r];
  size_t sending = total(route.sent);
  route.tokensSent.resize(sending);
  route.rowOf.assign(static_cast<size_t>(tokens * n), -1);
  std::vector<int64_t> local(sending * static_cast<size_t>(k));
  std::vector<int64_t> counts(2 * static_cast<size_t>(n), 0); // (tokens, expert copies) per rank
  int64_t p = 0;
  for (int r = 0; r < n; ++r) {
    int64_t copies = 0;
    for (int64_t t = 0; t < tokens; ++t) {
      if (!goes[t * n + r])
        continue;
      route.rowOf[t * n + r] = p;
      route.tokensSent[p] = t;
      for (int64_t j = 0; j < k; ++j) {
        bool here = copyRank[t * k + j] == r;
        local[p * k + j] = here ? copySlot[t * k + j] : -1;
        copies += here;
      }
      ++p;
    }
    counts[2 * r] = static_cast<int64_t>(route.sent[r]);
    counts[2 * r + 1] = copies;
  }
  std::vector<int32_t> localI32;
  if (indices.dtype != plan::I64)
    localI32.assign(local.begin(), local.end());
  // The counts: row 0 of the layout is what this rank sends to each rank, row 1 what it
  // receives from each. Every rank gathers every rank's row 0, so that all of them see a
  // rank whose room is too small and fail together, before anything is sent.
  if (absl::Status s = dev->uploadStaged(layout.data, counts.data(), counts.size() * sizeof(int64_t)); !s.ok())
    return s;
  size_t row = 2 * static_cast<size_t>(n);
  if (absl::Status s = reserveStaging(row * n * sizeof(int64_t)); !s.ok())
    return s;
  if (absl::Status s = comm.allGather(layout.data, staging, row, plan::I64); !s.ok())
    return s;
  std::vector<int64_t> all(row * n); // [sender][2 x receiver]: tokens, copies
  if (absl::Status s = dev->download(all.data(), staging, all.size() * sizeof(int64_t)); !s.ok())
    return s;
  int me = comm.rank();
  for (int r = 0; r < n; ++r) {
    counts[2 * r] = all[r * row + 2 * me];
    counts[2 * r + 1] = all[r * row + 2 * me + 1];
  }
  if (absl::Status s = roomFor(collective, all, n, localIndices.dim(0)); !s.ok())
    return s;
  if (absl::Status s = dev->uploadStaged(static_cast<int64_t *>(layout.data) + row, counts.data(),
                                         counts.size() * sizeof(int64_t));
      !s.ok())
    return s;
  Received got;
  for (int r = 0; r < n; ++r) {
    route.received.push_back(static_cast<size_t>(counts[2 * r]));
    got.tokens += counts[2 * r];
    got.copies += counts[2 * r + 1];
  }
  size_t bytes = route.tokensSent.size() * static_cast<size_t>(k) * element;
  if (absl::Status s = reserveStaging(std::max<size_t>(bytes, 1)); !s.ok())
    return s;
  const void *host = indices.dtype == plan::I64 ? static_cast<const void *>(local.data())
                                                : static_cast<const void *>(localI32.data());
  if (bytes)
    if (absl::Status s = dev->uploadStaged(staging, host, bytes); !s.ok())
      return s;
  if (absl::Status s = comm.exchange(staging, segments(route.sent, static_cast<size_t>(k)), localIndices.data,
                                     segments(route.received, static_cast<size_t>(k)), indices.dtype);
      !s.ok())
    return s;
  return keepRoute(collective, got, std::move(route), start);
}

absl::Status Executor::roomFor(const plan::Collective &collective, const std::vector<int64_t> &counts, int n,
                               int64_t roomTokens) {
  uint32_t received = collective.outputs(0);
  auto known = copiesRoom.find(received);
  if (known == copiesRoom.end()) {
    // The buffers of the received tokens' expert copies (the dispatch's rows and what follows
    // them) hold the route's room for copies.
    int64_t room = INT64_MAX;
    for (const plan::Buffer &buffer : rankProto->buffers())
      if (buffer.received_copies() && buffer.received_rows_of() == received + 1 && buffer.shape_size() > 0)
        room = std::min<int64_t>(room, buffer.shape(0));
    known = copiesRoom.emplace(received, room).first;
  }
  // The rank that needs the most room, over what it has (above 1: it does not fit).
  size_t row = 2 * static_cast<size_t>(n);
  int worst = -1;
  int64_t worstTokens = 0, worstCopies = 0;
  double over = 1.0;
  for (int j = 0; j < n; ++j) {
    int64_t tokens = 0, copies = 0;
    for (int r = 0; r < n; ++r) {
      tokens += counts[r * row + 2 * j];
      copies += counts[r * row + 2 * j + 1];
    }
    double need = std::max(double(tokens) / double(std::max<int64_t>(roomTokens, 1)),
                           double(copies) / double(std::max<int64_t>(known->second, 1)));
    if (need > over) {
      over = need;
      worst = j;
      worstTokens = tokens;
      worstCopies = copies;
    }
  }
  if (worst < 0)
    return absl::OkStatus();
  const std::string &name = rankProto->buffers(static_cast<int>(received)).name();
  double factor = collective.capacity_factor();
  // About the factor that would have held this step: rooms round up, so in quarters, above it.
  double enough = std::floor(factor * over * 4.0) / 4.0 + 0.25;
  std::string bound =
      factor != 0 ? absl::StrCat("capacity_factor ", factor,
                                 ": that many times what uniform routing sends a rank); the routing is more uneven: "
                                 "this step needs about --ep-capacity-factor ",
                                 enough, " (or 0: room for every token)")
                  : std::string("room for every token of every rank); this is a bug in the plan");
  return absl::ResourceExhaustedError(absl::StrCat(
      "expert route '", name, "': ep rank ", worst, " of ", n, " would receive ", worstTokens, " tokens and ",
      worstCopies, " expert copies, and the plan has room for ", roomTokens, " and ",
      known->second == INT64_MAX ? std::string("any number") : std::to_string(known->second), " (", bound));
}

absl::Status Executor::keepRoute(const plan::Collective &collective, Received got, ExpertRoute route,
                                 std::chrono::steady_clock::time_point start) {
  receivedRows[collective.outputs(0)] = got;
  routes[collective.outputs(1)] = std::move(route);
  if (timeCollectives) {
    if (absl::Status s = dev->synchronize(); !s.ok())
      return s;
    exchangeTime[2] += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return absl::OkStatus();
}

absl::Status Executor::allTokensRoute(const plan::Collective &collective, comm::Communicator &comm) {
  auto start = std::chrono::steady_clock::now();
  TensorRef indices = buffer(collective.inputs(0)), localIndices = buffer(collective.outputs(0));
  TensorRef layout = buffer(collective.outputs(1));
  int n = comm.size();
  int64_t tokens = indices.dim(0), k = indices.dim(1), perRank = collective.num_experts() / n;
  if (tokens * n > localIndices.dim(0))
    return absl::InternalError(absl::StrCat("the route receives ", tokens * n, " tokens; room is ",
                                            localIndices.dim(0), " rows"));
  // Every rank's tokens' experts, renumbered for this rank on the device: nothing waits.
  if (absl::Status s = comm.allGather(indices.data, localIndices.data, static_cast<size_t>(tokens * k), indices.dtype);
      !s.ok())
    return s;
  if (absl::Status s = dev->localExperts(localIndices.data, static_cast<size_t>(tokens * n * k), indices.dtype,
                                         comm.rank() * perRank, perRank);
      !s.ok())
    return s;
  ExpertRoute route;
  route.allTokens = true;
  route.sent.assign(static_cast<size_t>(n), static_cast<size_t>(tokens));
  route.received = route.sent;
  route.rowOf.resize(static_cast<size_t>(tokens * n));
  for (int64_t t = 0; t < tokens; ++t)
    for (int r = 0; r < n; ++r)
      route.rowOf[t * n + r] = r * tokens + t;
  // The layout: tokens to and from each rank; the expert copies are not counted (-1).
  std::vector<int64_t> counts(4 * static_cast<size_t>(n), -1);
  for (size_t i = 0; i < counts.size(); i += 2)
    counts[i] = tokens;
  if (absl::Status s = dev->uploadStaged(layout.data, counts.data(), counts.size() * sizeof(int64_t)); !s.ok())
    return s;
  // Launches see every received row and the dispatch's whole room for copies: the counts of
  // copies stay on the device, where the expert MLP reads them.
  return keepRoute(collective, Received{tokens * n, localIndices.dim(0) * k}, std::move(route), start);
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
  size_t sent = total(route.sent); // rows this rank sends (and gets back)
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
  if (send && route.allTokens) // every rank receives every token, in rank then token order
    return part(0, [&] {
      return comm.allGather(rows.data, result.data, static_cast<size_t>(rows.dim(0)) * width, rows.dtype);
    });
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
    return dev->sumRows(result.data, staging, route.rowOf, static_cast<size_t>(comm.size()), width, rows.dtype,
                        result.dtype);
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
