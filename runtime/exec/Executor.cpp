//===- Executor.cpp - runs one rank of a plan on a device -----------------===//

#include "runtime/exec/Executor.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/plan/PlanFormat.h"
#include "runtime/plan/PlanValidator.h"
#include "runtime/weights/DType.h"

namespace moec::runtime {

namespace {

std::optional<weights::DType> weightsDType(plan::DType dtype) {
  switch (dtype) {
  case plan::F32:
    return weights::DType::F32;
  case plan::BF16:
    return weights::DType::BF16;
  case plan::F16:
    return weights::DType::F16;
  case plan::I32:
    return weights::DType::I32;
  case plan::I64:
    return weights::DType::I64;
  default:
    return std::nullopt;
  }
}

std::string stepName(int index, const plan::Step &step) {
  std::string name = absl::StrCat("step ", index);
  if (step.has_launch())
    absl::StrAppend(&name, " (", step.launch().kernel(), ")");
  if (step.has_collective())
    absl::StrAppend(&name, " (", plan::collectiveKindName(step.collective().kind()), ")");
  if (!step.origin().empty())
    absl::StrAppend(&name, " [", step.origin(), "]");
  return name;
}

} // namespace

/// Wall time per kernel and collective (MOEC_PROFILE=1) over every run but the first (the
/// warm-up: first calls pay for library set-up and memory pools), printed to stderr when the
/// executor goes away. Kernels outside the layer templates (embedding, LM head, loss) are
/// listed apart.
class StepProfile {
public:
  void startRun() { ++runs; }
  void add(const plan::Step &step, double seconds) {
    if (runs < 2)
      return;
    std::string key = step.has_launch() ? step.launch().kernel()
                                        : std::string(plan::collectiveKindName(step.collective().kind())) +
                                              " (collective)";
    if (step.origin().find(" in @") == std::string::npos)
      key += " (outside layers)";
    Entry &e = byKernel[key];
    e.seconds += seconds;
    ++e.calls;
  }
  ~StepProfile() {
    std::vector<std::pair<std::string, Entry>> rows(byKernel.begin(), byKernel.end());
    std::sort(rows.begin(), rows.end(), [](auto &a, auto &b) { return a.second.seconds > b.second.seconds; });
    double total = 0;
    for (auto &row : rows)
      total += row.second.seconds;
    int measured = std::max(runs - 1, 1);
    std::fprintf(stderr, "MOEC_PROFILE: %.2f ms in kernels and collectives per run over %d run(s) after the first "
                 "(synchronised after each step)\n", total * 1e3 / measured, runs - 1);
    for (auto &[kernel, e] : rows)
      std::fprintf(stderr, "  %-40s %9.3f ms per run %5.1f%% %6ld calls per run\n", kernel.c_str(),
                   e.seconds * 1e3 / measured, total > 0 ? 100 * e.seconds / total : 0.0, e.calls / measured);
  }

private:
  struct Entry {
    double seconds = 0;
    long calls = 0;
  };
  std::map<std::string, Entry> byKernel;
  int runs = 0;
};

absl::StatusOr<std::unique_ptr<Executor>> Executor::create(const plan::Plan &plan, int rank, Device &device) {
  if (absl::Status valid = plan::validatePlan(plan); !valid.ok())
    return valid;
  if (rank < 0 || rank >= plan.ranks_size())
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is not in the plan (", plan.ranks_size(), " ranks)"));
  std::unique_ptr<Executor> executor(new Executor());
  executor->plan = &plan;
  executor->rankProto = &plan.ranks(rank);
  executor->dev = &device;
  const char *sync = std::getenv("MOEC_SYNC_STEPS");
  executor->syncEachStep = sync && std::string(sync) == "1";
  if (const char *profile = std::getenv("MOEC_PROFILE"); profile && std::string(profile) == "1")
    executor->profile = std::make_unique<StepProfile>();
  if (device.emulatesBf16())
    executor->emulateBf16(rank);
  const plan::Rank &r = *executor->rankProto;

  std::vector<std::string> missing;
  for (const plan::Step &step : r.steps()) {
    if (!step.has_launch()) {
      executor->stepKernels.push_back(nullptr);
      continue;
    }
    const KernelFn *fn = device.kernels().find(step.launch().kernel());
    if (!fn && std::find(missing.begin(), missing.end(), step.launch().kernel()) == missing.end())
      missing.push_back(step.launch().kernel());
    executor->stepKernels.push_back(fn);
  }
  if (!missing.empty())
    return absl::UnimplementedError(absl::StrCat("the ", device.name(), " backend has no kernel for: ",
                                                 absl::StrJoin(missing, ", ")));

  for (const plan::Arena &arena : r.arenas()) {
    absl::StatusOr<void *> memory = device.allocate(static_cast<size_t>(arena.size_bytes()));
    if (!memory.ok())
      return absl::Status(memory.status().code(),
                          absl::StrCat("allocating the ", plan::roleName(arena.role()), " arena (",
                                       arena.size_bytes(), " bytes) on ", device.name(), ": ",
                                       memory.status().message()));
    executor->arenas[arena.role()] = *memory;
  }
  for (const plan::Buffer &buffer : r.buffers())
    executor->byName.emplace(buffer.name(), buffer.id());
  return executor;
}

void Executor::emulateBf16(int rank) {
  bool any = false;
  for (const plan::Buffer &b : rankProto->buffers())
    any |= b.dtype() == plan::BF16;
  if (!any)
    return;
  emulatedPlan = std::make_unique<plan::Plan>(*plan);
  plan::Rank &r = *emulatedPlan->mutable_ranks(rank);
  // Doubling every offset and arena keeps the plan's layout (and its reuse of memory)
  // while each bf16 element gets the 4 bytes of an f32.
  for (plan::Arena &arena : *r.mutable_arenas())
    arena.set_size_bytes(2 * arena.size_bytes());
  roundsToBf16.assign(r.buffers_size(), false);
  for (plan::Buffer &b : *r.mutable_buffers()) {
    b.set_offset(2 * b.offset());
    if (b.dtype() == plan::BF16) {
      b.set_dtype(plan::F32);
      b.set_size_bytes(2 * b.size_bytes());
      roundsToBf16[b.id()] = true;
    }
  }
  plan = emulatedPlan.get();
  rankProto = &r;
}

absl::Status Executor::roundEmulated(const std::vector<uint32_t> &ids) {
  if (roundsToBf16.empty())
    return absl::OkStatus();
  for (uint32_t id : ids)
    if (roundsToBf16[id]) {
      TensorRef t = buffer(id);
      if (absl::Status s = dev->roundToBf16(static_cast<float *>(t.data), static_cast<size_t>(t.numel()));
          !s.ok())
        return s;
    }
  return absl::OkStatus();
}

Executor::~Executor() {
  if (!dev)
    return;
  (void)dev->synchronize();
  for (auto &[role, memory] : arenas)
    dev->release(memory);
  if (staging)
    dev->release(staging);
}

TensorRef Executor::buffer(uint32_t id) const {
  const plan::Buffer &b = rankProto->buffers(static_cast<int>(id));
  TensorRef ref;
  ref.dtype = b.dtype();
  ref.shape.assign(b.shape().begin(), b.shape().end());
  ref.data = static_cast<uint8_t *>(arenas.at(b.role())) + b.offset();
  return ref;
}

absl::StatusOr<std::vector<float>> Executor::readFloats(uint32_t id) {
  const plan::Buffer &b = rankProto->buffers(static_cast<int>(id));
  std::optional<weights::DType> dtype = weightsDType(b.dtype());
  if (!dtype)
    return absl::InvalidArgumentError(absl::StrCat("buffer '", b.name(), "' has no float dtype"));
  std::vector<uint8_t> bytes(static_cast<size_t>(b.size_bytes()));
  if (absl::Status s = dev->download(bytes.data(), buffer(id).data, bytes.size()); !s.ok())
    return s;
  std::vector<float> values(static_cast<size_t>(buffer(id).numel()));
  if (absl::Status s = weights::convertElements(bytes.data(), *dtype, values.data(), weights::DType::F32,
                                                values.size());
      !s.ok())
    return s;
  return values;
}

absl::Status Executor::writeFloats(uint32_t id, const std::vector<float> &values) {
  const plan::Buffer &b = rankProto->buffers(static_cast<int>(id));
  std::optional<weights::DType> dtype = weightsDType(b.dtype());
  if (!dtype || values.size() != static_cast<size_t>(buffer(id).numel()))
    return absl::InvalidArgumentError(absl::StrCat("cannot write ", values.size(), " floats into buffer '",
                                                   b.name(), "'"));
  std::vector<uint8_t> bytes(static_cast<size_t>(b.size_bytes()));
  if (absl::Status s = weights::convertElements(values.data(), weights::DType::F32, bytes.data(), *dtype,
                                                values.size());
      !s.ok())
    return s;
  if (absl::Status s = dev->upload(buffer(id).data, bytes.data(), bytes.size()); !s.ok())
    return s;
  return roundEmulated({id});
}

std::optional<uint32_t> Executor::findBuffer(const std::string &name) const {
  auto it = byName.find(name);
  if (it == byName.end())
    return std::nullopt;
  return it->second;
}

namespace {

/// A tensor stacking every expert, bound with an expert placement: one row (one expert) at a
/// time, each with the binding's slice of the dimensions after the first.
absl::Status readPlacedRows(weights::Checkpoint &checkpoint, const plan::WeightBinding &binding,
                            const std::vector<int64_t> &shape, const weights::Slice &slice, weights::DType dtype,
                            std::vector<uint8_t> &staging) {
  if (binding.experts_size() != shape[0])
    return absl::InvalidArgumentError(absl::StrCat("the placement lists ", binding.experts_size(),
                                                   " experts for a buffer of ", shape[0], " rows"));
  absl::StatusOr<weights::TensorRef> whole = checkpoint.lookup(binding.tensor());
  if (!whole.ok())
    return whole.status();
  const std::vector<int64_t> &dims = whole->info->shape;
  if (dims.size() != shape.size())
    return absl::InvalidArgumentError(absl::StrCat("the tensor has ", dims.size(), " dimensions, the buffer ",
                                                   shape.size()));
  size_t rowBytes = staging.size() / static_cast<size_t>(shape[0]);
  for (int64_t i = 0; i < shape[0]; ++i) {
    weights::Slice row;
    row.start.push_back(binding.experts(static_cast<int>(i)));
    row.size.push_back(1);
    for (size_t d = 1; d < dims.size(); ++d) {
      bool sliced = d - 1 < slice.start.size();
      row.start.push_back(sliced ? slice.start[d - 1] : 0);
      row.size.push_back(sliced ? slice.size[d - 1] : dims[d]);
    }
    if (absl::Status s = checkpoint.readSlice(binding.tensor(), row, dtype, staging.data() + i * rowBytes, rowBytes);
        !s.ok())
      return s;
  }
  return absl::OkStatus();
}

} // namespace

absl::Status Executor::bindWeights(weights::Checkpoint &checkpoint) {
  std::vector<uint8_t> staging;
  for (const plan::WeightBinding &binding : rankProto->weights()) {
    const plan::Buffer &b = rankProto->buffers(static_cast<int>(binding.buffer()));
    if (binding.zeros()) { // another tp rank adds this bias
      if (absl::Status s = dev->zero(buffer(binding.buffer()).data, static_cast<size_t>(b.size_bytes())); !s.ok())
        return s;
      continue;
    }
    std::optional<weights::DType> dtype = weightsDType(b.dtype());
    if (!dtype)
      return absl::InvalidArgumentError(absl::StrCat("buffer '", b.name(), "' has an unsupported dtype"));
    staging.resize(static_cast<size_t>(b.size_bytes()));
    weights::Slice slice;
    for (const plan::Slice::Range &range : binding.slice().dims()) {
      slice.start.push_back(range.start());
      slice.size.push_back(range.size());
    }
    absl::Status status;
    std::vector<int64_t> shape(b.shape().begin(), b.shape().end());
    if (binding.tensor().find("{expert}") != std::string::npos) {
      std::vector<int64_t> expertShape(shape.begin() + 1, shape.end());
      std::vector<int64_t> experts(binding.experts().begin(), binding.experts().end());
      if (experts.empty())
        for (int64_t i = 0; i < shape[0]; ++i)
          experts.push_back(binding.first_expert() + i);
      status = checkpoint.readExperts(binding.tensor(), experts, slice, expertShape, *dtype, staging.data(),
                                      staging.size());
    } else if (binding.experts_size() > 0) {
      status = readPlacedRows(checkpoint, binding, shape, slice, *dtype, staging);
    } else if (binding.pieces_size() > 0) { // windows concatenated along the leading dimension
      size_t at = 0;
      for (const plan::Slice &piece : binding.pieces()) {
        weights::Slice window;
        size_t bytes = weights::dtypeSize(*dtype);
        for (const plan::Slice::Range &range : piece.dims()) {
          window.start.push_back(range.start());
          window.size.push_back(range.size());
          bytes *= static_cast<size_t>(range.size());
        }
        if (at + bytes > staging.size()) {
          status = absl::InvalidArgumentError("the pieces hold more than the buffer");
          break;
        }
        status = checkpoint.readSlice(binding.tensor(), window, *dtype, staging.data() + at, bytes);
        if (!status.ok())
          break;
        at += bytes;
      }
      if (status.ok() && at != staging.size())
        status = absl::InvalidArgumentError("the pieces hold less than the buffer");
    } else if (!slice.start.empty()) {
      status = checkpoint.readSlice(binding.tensor(), slice, *dtype, staging.data(), staging.size());
    } else {
      status = checkpoint.readInto(binding.tensor(), shape, *dtype, staging.data(), staging.size());
    }
    if (status.ok())
      status = dev->upload(buffer(binding.buffer()).data, staging.data(), staging.size());
    if (status.ok())
      status = roundEmulated({binding.buffer()});
    if (!status.ok())
      return absl::Status(status.code(), absl::StrCat("binding weight '", binding.tensor(), "' from ",
                                                      checkpoint.path(), ": ", status.message()));
  }
  return dev->synchronize();
}

absl::Status Executor::setInputs(const std::vector<int64_t> &ids, const std::vector<int64_t> &positions,
                                 const std::vector<int64_t> &labels) {
  std::pair<const char *, const std::vector<int64_t> *> inputs[] = {
      {"input_ids", &ids}, {"positions", &positions}, {"labels", &labels}};
  for (auto [name, values] : inputs) {
    std::optional<uint32_t> id = findBuffer(name);
    if (!id)
      return absl::InvalidArgumentError(absl::StrCat("the plan has no input buffer '", name, "'"));
    TensorRef dst = buffer(*id);
    if (dst.dtype != plan::I64 || dst.numel() != static_cast<int64_t>(values->size()))
      return absl::InvalidArgumentError(absl::StrCat("input '", name, "' takes ", dst.numel(),
                                                     " int64 tokens, got ", values->size()));
    if (absl::Status s = dev->upload(dst.data, values->data(), values->size() * sizeof(int64_t)); !s.ok())
      return s;
  }
  return absl::OkStatus();
}

absl::Status Executor::zeroGradients() {
  for (const plan::Arena &arena : rankProto->arenas())
    if (arena.role() == plan::GRADIENT)
      return dev->zero(arenas.at(plan::GRADIENT), static_cast<size_t>(arena.size_bytes()));
  return absl::OkStatus();
}

absl::Status Executor::invoke(const KernelFn &fn, const std::string &kernel,
                              const google::protobuf::Map<std::string, plan::Attr> &attrs,
                              const std::vector<uint32_t> &inputs, const std::vector<uint32_t> &outputs,
                              bool zeroOutputs) {
  // Buffers whose rows follow an expert route's received rows (plan.proto
  // Buffer.received_rows_of): a launch sees only the rows received in this run, in proportion.
  // The rest is room for tokens no rank sent; nothing reads it.
  auto view = [&](uint32_t id) {
    TensorRef ref = buffer(id);
    const plan::Buffer &planned = rankProto->buffers(static_cast<int>(id));
    uint32_t of = planned.received_rows_of();
    if (of == 0 || ref.shape.empty())
      return ref;
    auto it = receivedRows.find(of - 1);
    if (it != receivedRows.end())
      ref.shape[0] = planned.received_copies()
                         ? it->second.copies
                         : it->second.tokens * (ref.shape[0] / rankProto->buffers(static_cast<int>(of - 1)).shape(0));
    return ref;
  };
  std::vector<TensorRef> in, out;
  for (uint32_t id : inputs)
    in.push_back(view(id));
  for (uint32_t id : outputs) {
    out.push_back(view(id));
    if (zeroOutputs)
      if (absl::Status z = dev->zero(out.back().data, static_cast<size_t>(out.back().numel()) *
                                                          comm::elementBytes(out.back().dtype));
          !z.ok())
        return z;
  }
  if (absl::Status s = invokeOn(fn, kernel, attrs, std::move(in), std::move(out)); !s.ok())
    return s;
  return roundEmulated(outputs);
}

absl::Status Executor::invokeOn(const KernelFn &fn, const std::string &kernel,
                                const google::protobuf::Map<std::string, plan::Attr> &attrs,
                                std::vector<TensorRef> inputs, std::vector<TensorRef> outputs) {
  KernelContext ctx;
  ctx.kernel = kernel;
  ctx.attrs = &attrs;
  ctx.seqLen = plan->seq_len();
  ctx.microBatch = plan->micro_batch();
  ctx.pool = dev->pool();
  ctx.stream = dev->stream();
  ctx.inputs = std::move(inputs);
  ctx.outputs = std::move(outputs);
  try {
    fn(ctx);
  } catch (const KernelError &error) {
    return absl::InternalError(error.what());
  }
  return absl::OkStatus();
}

absl::Status Executor::run(const std::function<void(int)> &afterStep) {
  if (profile)
    profile->startRun();
  receivedRows.clear(); // this run's routes are new
  routes.clear();
  // A plan's second stream (--moe-schedule-overlap) starts after what the host issued before
  // the run, and the run ends with every stream joined: the host's next work sees all of it.
  const bool streams = rankProto->num_streams() > 1;
  if (streams)
    if (absl::Status joined = dev->joinStreams(); !joined.ok())
      return joined;
  for (int s = 0; s < rankProto->steps_size(); ++s) {
    const plan::Step &step = rankProto->steps(s);
    issuing = s;
    if (streams)
      if (absl::Status chosen = dev->useStream(static_cast<int>(step.stream())); !chosen.ok())
        return absl::Status(chosen.code(), absl::StrCat(stepName(s, step), ": ", chosen.message()));
    if (step.has_record() || step.has_wait()) {
      absl::Status ordered =
          step.has_record() ? dev->recordEvent(static_cast<int>(step.record().id()))
                            : dev->waitEvent(static_cast<int>(step.wait().id()));
      if (!ordered.ok())
        return absl::Status(ordered.code(), absl::StrCat(stepName(s, step), ": ", ordered.message()));
    } else if (step.has_launch()) {
      const plan::Launch &launch = step.launch();
      auto start = std::chrono::steady_clock::now();
      // Outputs reuse memory: kernels write into zeroes, except accumulate_grad, which adds.
      absl::Status status = invoke(*stepKernels[s], launch.kernel(), launch.attrs(),
                                   {launch.inputs().begin(), launch.inputs().end()},
                                   {launch.outputs().begin(), launch.outputs().end()},
                                   /*zeroOutputs=*/launch.kernel() != "accumulate_grad" &&
                                       dev->kernels().needsZeroedOutputs(launch.kernel()));
      if (!status.ok())
        return absl::Status(status.code(), absl::StrCat(stepName(s, step), ": ", status.message()));
      if (syncEachStep || profile)
        if (absl::Status synced = dev->synchronize(); !synced.ok())
          return absl::InternalError(absl::StrCat(stepName(s, step), " on ", dev->name(), ": ", synced.message()));
      if (profile)
        profile->add(step, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    } else if (step.has_collective()) {
      if (timeCollectives)
        if (absl::Status synced = dev->synchronize(); !synced.ok())
          return absl::InternalError(absl::StrCat(stepName(s, step), " on ", dev->name(), ": ", synced.message()));
      auto start = std::chrono::steady_clock::now();
      absl::Status status = collective(step.collective());
      // Profiled, a collective's time is its own too (the next kernel would otherwise absorb it).
      if (status.ok() && (timeCollectives || profile))
        status = dev->synchronize();
      if (!status.ok())
        return absl::Status(status.code(), absl::StrCat(stepName(s, step), ": ", status.message()));
      if (timeCollectives)
        collectiveTime += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (profile)
        profile->add(step, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    if (afterStep)
      afterStep(s);
  }
  if (streams) {
    if (absl::Status joined = dev->joinStreams(); !joined.ok())
      return joined;
    if (absl::Status chosen = dev->useStream(0); !chosen.ok())
      return chosen;
    for (comm::Communicator *comm : communicators)
      if (comm)
        comm->setStream(dev->stream());
  }
  issuing = -1; // the final synchronisation waits for all of them
  if (absl::Status synced = dev->synchronize(); !synced.ok())
    return absl::InternalError(absl::StrCat("a kernel failed on ", dev->name(), ": ", synced.message(),
                                            " (set MOEC_SYNC_STEPS=1 to find the step)"));
  return absl::OkStatus();
}

std::string Executor::issuingStep() const {
  int s = issuing;
  return s < 0 ? std::string("outside the plan's steps") : stepName(s, rankProto->steps(s));
}

absl::Status Executor::setCommunicators(std::vector<comm::Communicator *> byGroup) {
  if (byGroup.size() != static_cast<size_t>(rankProto->groups_size()))
    return absl::InvalidArgumentError(absl::StrCat("rank ", rankProto->rank(), " has ", rankProto->groups_size(),
                                                   " groups, got ", byGroup.size(), " communicators"));
  for (size_t g = 0; g < byGroup.size(); ++g) {
    const plan::Group &group = rankProto->groups(static_cast<int>(g));
    if (!byGroup[g] || byGroup[g]->size() != group.ranks_size())
      return absl::InvalidArgumentError(absl::StrCat(
          "group ", g, " (", group.axis(), ") has ", group.ranks_size(), " ranks; its communicator ",
          byGroup[g] ? absl::StrCat("has ", byGroup[g]->size()) : std::string("is missing")));
  }
  communicators = std::move(byGroup);
  return absl::OkStatus();
}

absl::Status Executor::collective(const plan::Collective &collective) {
  if (collective.group() >= communicators.size()) {
    const plan::Group &group = rankProto->groups(static_cast<int>(collective.group()));
    return absl::FailedPreconditionError(absl::StrCat(
        "a collective over ", group.axis(), " ranks [", absl::StrJoin(group.ranks(), ","),
        "] needs a communicator per group: run every rank (moe-run --nproc ", plan->ranks_size(), ")"));
  }
  comm::Communicator &comm = *communicators[collective.group()];
  comm.setStream(dev->stream()); // the step's stream
  if (collective.kind() == plan::Collective::EXPERT_ROUTE || collective.kind() == plan::Collective::EXPERT_SEND ||
      collective.kind() == plan::Collective::EXPERT_RETURN) {
    absl::Status s = expertExchange(collective, comm);
    if (!s.ok())
      return absl::Status(s.code(), absl::StrCat(plan::collectiveKindName(collective.kind()), " over ",
                                                 rankProto->groups(collective.group()).axis(), " (", comm.name(),
                                                 "): ", s.message()));
    return roundEmulated({collective.outputs().begin(), collective.outputs().end()});
  }
  if (collective.kind() == plan::Collective::SEND_RECV) {
    // Pipeline neighbours: one grouped exchange with the group's other rank.
    int peer = 1 - comm.rank();
    std::vector<comm::Communicator::Segment> sends, recvs;
    TensorRef in, out;
    if (collective.inputs_size() > 0) {
      in = buffer(collective.inputs(0));
      sends.push_back({peer, 0, static_cast<size_t>(in.numel())});
    }
    if (collective.outputs_size() > 0) {
      out = buffer(collective.outputs(0));
      recvs.push_back({peer, 0, static_cast<size_t>(out.numel())});
    }
    if (!sends.empty() && !recvs.empty() && in.dtype != out.dtype)
      return absl::InvalidArgumentError(absl::StrCat("pipeline exchange: sends ", plan::dtypeName(in.dtype),
                                                     " but receives ", plan::dtypeName(out.dtype),
                                                     "; one exchange moves one dtype"));
    plan::DType dtype = sends.empty() ? out.dtype : in.dtype;
    if (absl::Status s = comm.exchange(in.data, sends, out.data, recvs, dtype); !s.ok())
      return absl::Status(s.code(), absl::StrCat("pipeline exchange with rank ",
                                                 rankProto->groups(collective.group()).ranks(peer), " (",
                                                 comm.name(), "): ", s.message()));
    return roundEmulated({collective.outputs().begin(), collective.outputs().end()});
  }
  if (collective.kind() == plan::Collective::ALL_GATHER || collective.kind() == plan::Collective::REDUCE_SCATTER)
    return gatherOrScatter(collective, comm);
  if (collective.kind() != plan::Collective::ALL_REDUCE)
    return absl::UnimplementedError(absl::StrCat("collective ", plan::Collective::Kind_Name(collective.kind()),
                                                 " is not run (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, the expert "
                                                 "exchange and SEND_RECV are)"));
  // In-place sums of buffers that lie next to each other in memory (a layer's gradients, laid
  // out in order) are one call: a collective call costs more than its bytes at these sizes.
  std::vector<int> order(static_cast<size_t>(collective.inputs_size()));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return std::less<const void *>()(buffer(collective.inputs(a)).data, buffer(collective.inputs(b)).data);
  });
  for (size_t i = 0; i < order.size(); ++i) {
    int first = order[i];
    TensorRef in = buffer(collective.inputs(first)), out = buffer(collective.outputs(first));
    // An f32 sum rounded into a narrower output: summed in f32 (in the staging buffer), then
    // rounded once.
    bool rounds = in.dtype != out.dtype;
    size_t count = static_cast<size_t>(in.numel()), element = comm::elementBytes(in.dtype), merged = 0;
    while (!rounds && in.data == out.data && i + 1 < order.size()) {
      TensorRef next = buffer(collective.inputs(order[i + 1]));
      if (next.data != buffer(collective.outputs(order[i + 1])).data || next.dtype != in.dtype ||
          next.data != static_cast<char *>(in.data) + count * element)
        break;
      count += static_cast<size_t>(next.numel());
      ++i;
      ++merged;
    }
    if (rounds)
      if (absl::Status s = reserveStaging(count * element); !s.ok())
        return s;
    absl::Status s = comm.allReduce(in.data, rounds ? staging : out.data, count, in.dtype);
    if (s.ok() && rounds)
      s = dev->convert(out.data, out.dtype, staging, in.dtype, count);
    if (!s.ok())
      return absl::Status(s.code(), absl::StrCat("all-reduce of '", rankProto->buffers(collective.inputs(first)).name(),
                                                 merged ? absl::StrCat("' and ", merged, " more buffers") : "'",
                                                 " over ", rankProto->groups(collective.group()).axis(), " (",
                                                 comm.name(), "): ", s.message()));
  }
  return roundEmulated({collective.outputs().begin(), collective.outputs().end()});
}

absl::Status Executor::gatherOrScatter(const plan::Collective &collective, comm::Communicator &comm) {
  // Sequence parallel: the ranks' rows gathered, or their sum's rows scattered (an f32 sum
  // rounded once into a narrower output, as the all-reduce rounds it).
  bool gather = collective.kind() == plan::Collective::ALL_GATHER;
  for (int i = 0; i < collective.inputs_size(); ++i) {
    TensorRef in = buffer(collective.inputs(i)), out = buffer(collective.outputs(i));
    bool rounds = in.dtype != out.dtype;
    size_t count = static_cast<size_t>(gather ? in.numel() : out.numel());
    if (rounds)
      if (absl::Status s = reserveStaging(count * comm::elementBytes(in.dtype)); !s.ok())
        return s;
    absl::Status s = gather ? comm.allGather(in.data, out.data, count, in.dtype)
                            : comm.reduceScatter(in.data, rounds ? staging : out.data, count, in.dtype);
    if (s.ok() && rounds)
      s = dev->convert(out.data, out.dtype, staging, in.dtype, count);
    if (!s.ok())
      return absl::Status(s.code(), absl::StrCat(gather ? "all-gather" : "reduce-scatter", " of '",
                                                 rankProto->buffers(collective.inputs(i)).name(), "' over ",
                                                 rankProto->groups(collective.group()).axis(), " (", comm.name(),
                                                 "): ", s.message()));
  }
  return roundEmulated({collective.outputs().begin(), collective.outputs().end()});
}

absl::Status Executor::setLossWeights(const std::vector<float> &weights) {
  std::optional<uint32_t> id = findBuffer("loss_weight");
  if (!id)
    return absl::NotFoundError("the plan has no 'loss_weight' input (it is not sharded)");
  if (buffer(*id).numel() != static_cast<int64_t>(weights.size()))
    return absl::InvalidArgumentError(absl::StrCat("the plan's loss_weight takes ", buffer(*id).numel(),
                                                   " values (one per micro-batch), got ", weights.size()));
  return writeFloats(*id, weights);
}

absl::Status Executor::launch(const std::string &kernel, const std::vector<uint32_t> &inputs,
                              const std::vector<uint32_t> &outputs,
                              const google::protobuf::Map<std::string, plan::Attr> &attrs) {
  const KernelFn *fn = dev->kernels().find(kernel);
  if (!fn)
    return absl::UnimplementedError(absl::StrCat("the ", dev->name(), " backend has no kernel '", kernel, "'"));
  return invoke(*fn, kernel, attrs, inputs, outputs, /*zeroOutputs=*/false);
}

absl::Status Executor::launchOn(const std::string &kernel, std::vector<TensorRef> inputs,
                                std::vector<TensorRef> outputs,
                                const google::protobuf::Map<std::string, plan::Attr> &attrs) {
  const KernelFn *fn = dev->kernels().find(kernel);
  if (!fn)
    return absl::UnimplementedError(absl::StrCat("the ", dev->name(), " backend has no kernel '", kernel, "'"));
  return invokeOn(*fn, kernel, attrs, std::move(inputs), std::move(outputs));
}

absl::Status Executor::launchOnRows(const std::string &kernel, uint32_t output, int64_t firstRow, int64_t rows,
                                    const google::protobuf::Map<std::string, plan::Attr> &attrs) {
  TensorRef part = buffer(output);
  if (part.shape.empty() || firstRow < 0 || rows < 0 || firstRow + rows > part.shape[0])
    return absl::InvalidArgumentError(absl::StrCat("rows [", firstRow, ", ", firstRow + rows, ") of buffer '",
                                                   rankProto->buffers(static_cast<int>(output)).name(),
                                                   "' are outside its leading dimension"));
  size_t rowBytes = static_cast<size_t>(part.numel() / std::max<int64_t>(part.shape[0], 1)) *
                    comm::elementBytes(part.dtype);
  part.data = static_cast<char *>(part.data) + static_cast<size_t>(firstRow) * rowBytes;
  part.shape[0] = rows;
  if (absl::Status s = launchOn(kernel, {}, {part}, attrs); !s.ok())
    return s;
  return roundEmulated({output});
}

absl::StatusOr<float> Executor::loss() {
  std::optional<uint32_t> id = findBuffer("loss");
  if (!id)
    return absl::NotFoundError("the plan has no 'loss' buffer");
  absl::StatusOr<std::vector<float>> values = readFloats(*id);
  if (!values.ok())
    return values.status();
  return values->at(0);
}

absl::StatusOr<std::vector<float>> Executor::losses() {
  if (findBuffer("loss")) {
    absl::StatusOr<float> one = loss();
    if (!one.ok())
      return one.status();
    return std::vector<float>{*one};
  }
  std::vector<float> out;
  for (int i = 0;; ++i) {
    std::optional<uint32_t> id = findBuffer("loss." + std::to_string(i));
    if (!id)
      break;
    absl::StatusOr<std::vector<float>> values = readFloats(*id);
    if (!values.ok())
      return values.status();
    out.push_back(values->at(0));
  }
  return out;
}

} // namespace moec::runtime
