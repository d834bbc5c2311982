//===- Trainer.cpp - LoRA training on an Executor -------------------------===//

#include "runtime/train/Trainer.h"

#include <algorithm>
#include <numeric>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "runtime/plan/PlanFormat.h"
#include "runtime/train/Optimizer.h"
#include "runtime/weights/Safetensors.h"
#include "runtime/weights/SafetensorsWriter.h"

namespace moec::runtime {

namespace {

bool isForwardDispatch(const plan::Step &step) {
  return step.phase() == plan::FORWARD && step.has_launch() && step.launch().kernel() == "dispatch" &&
         step.launch().outputs_size() >= 2;
}

} // namespace

Trainer::Trainer(Executor &executor) : executor(executor) {
  const plan::Plan &plan = executor.planProto();
  const plan::Rank &rank = executor.rankPlan();
  // Ranks are numbered in the mesh's rank order (tp fastest, then ep, dp, pp by default). A
  // pipeline stage's ranks hold its layers' tensors, a tp rank its part of the split ones; the
  // layout lists each tensor (or part) under the first rank that holds it.
  int ep = std::max(1, plan.mesh().ep());
  int tp = std::max(1, plan.mesh().tp()), pp = std::max(1, plan.mesh().pp());
  int world = std::max(1, plan.ranks_size());
  auto stageOf = [&](int r) { return plan::meshCoordinate(plan.mesh(), r, "pp"); };
  auto tpOf = [&](int r) { return plan::meshCoordinate(plan.mesh(), r, "tp"); };
  auto epOf = [&](int r) { return plan::meshCoordinate(plan.mesh(), r, "ep"); };
  // One rank of each stage (the lowest), whose program stands for its stage's.
  std::vector<int> stageRanks(static_cast<size_t>(pp), -1);
  for (int r = world - 1; r >= 0; --r)
    stageRanks[static_cast<size_t>(stageOf(r))] = r;
  rankIndex = rank.rank();
  int stage = stageOf(rankIndex);
  gathering = pp > 1 || tp > 1;
  for (const plan::LoraTensor &t : plan.lora().tensors())
    gathering |= t.split_axis() == "ep"; // expert adapters split over ep
  tpIndex = tpOf(rankIndex);
  tpSize = tp;
  countsLoads = tpIndex == 0;
  // Sequence parallel: each tp rank scores the loss on its rows, so each counts its tokens.
  sequenceParallel = plan.mesh().sequence_parallel() && tp > 1;
  countsTokens = stage == pp - 1 && (countsLoads || sequenceParallel);
  microBatches = std::max<int64_t>(1, plan.micro_batches());
  std::set<uint32_t> bound;
  for (const plan::WeightBinding &binding : rank.weights())
    bound.insert(binding.buffer());
  for (const plan::LoraTensor &t : plan.lora().tensors()) {
    const plan::Buffer &param = plan.ranks(t.rank()).buffers(static_cast<int>(t.param()));
    Tensor each{t.peft_name(), t.param(), t.grad(), t.adam_m(), t.adam_v(),
                std::vector<int64_t>(param.shape().begin(), param.shape().end()),
                static_cast<size_t>(param.size_bytes() / plan::dtypeSize(param.dtype())), t.rank(), {}};
    std::vector<int64_t> whole = each.shape;
    for (int d = 0; d < t.slice().dims_size(); ++d) {
      each.start.push_back(t.slice().dims(d).start());
      whole[d] = std::max(whole[d], t.slice().dims(d).start() + t.slice().dims(d).size());
    }
    auto [known, added] = wholeShapes.try_emplace(t.peft_name(), whole);
    if (added)
      names.push_back(t.peft_name());
    for (size_t d = 0; d < whole.size(); ++d)
      known->second[d] = std::max(known->second[d], whole[d]);
    allTensors.push_back(each);
    // A whole tensor: every rank of its stage holds it; a part: the ranks of its coordinate on
    // the axis it is split along.
    bool part = !each.start.empty();
    bool sameCoordinate = t.split_axis() == "ep" ? epOf(t.rank()) == epOf(rankIndex) : tpOf(t.rank()) == tpOf(rankIndex);
    if (stageOf(t.rank()) == stage && (!part || sameCoordinate)) {
      each.fromCheckpoint = bound.count(t.param()) > 0;
      tensors.push_back(each);
    }
  }
  // Device scratch: the sums of squares, and a copy of each forward dispatch's counts, read
  // once after the step: one slot per (MoE layer of any stage, micro-batch), of every expert.
  // With ep > 1 a rank's dispatch counts the tokens its experts received (from every rank of
  // its ep group), its part of the slot.
  std::map<int, size_t> dispatches;
  for (int r : stageRanks) {
    std::map<int, size_t> here;
    for (const plan::Step &step : plan.ranks(r).steps())
      if (isForwardDispatch(step)) {
        ++here[step.layer()];
        const plan::Buffer &counts = plan.ranks(r).buffers(static_cast<int>(step.launch().outputs(1)));
        loadSlots.try_emplace(step.layer(), 0, static_cast<size_t>(ep * counts.size_bytes() / sizeof(int64_t)));
      }
    for (auto [layer, count] : here)
      dispatches[layer] = std::max(dispatches[layer], count);
  }
  for (auto &[layer, slot] : loadSlots) {
    slot.first = countsTotal;
    countsTotal += slot.second * dispatches[layer];
  }
  loadDispatches = dispatches;
  // Each MoE layer's placement, from the routes of every stage (the loads above cover them all).
  for (int r : stageRanks)
    for (const plan::Step &step : plan.ranks(r).steps())
      if (step.has_collective() && step.collective().kind() == plan::Collective::EXPERT_ROUTE &&
          step.phase() == plan::FORWARD && !placedExperts.count(step.layer())) {
        const plan::Collective &route = step.collective();
        std::vector<int64_t> &experts = placedExperts[step.layer()];
        experts.assign(route.placement().begin(), route.placement().end());
        if (experts.empty()) { // consecutive ranges
          experts.resize(static_cast<size_t>(route.num_experts()));
          std::iota(experts.begin(), experts.end(), 0);
        }
        expertCount[step.layer()] = route.num_experts();
      }
  std::map<int, size_t> seen; // forward dispatches of a layer so far: its micro-batch
  for (int s = 0; s < rank.steps_size(); ++s) {
    const plan::Step &step = rank.steps(s);
    if (isForwardDispatch(step)) {
      uint32_t buffer = step.launch().outputs(1);
      size_t n = static_cast<size_t>(executor.buffer(buffer).numel());
      const std::pair<size_t, size_t> &slot = loadSlots.at(step.layer());
      bool ownRows = step.launch().attrs().contains("moe.tp_rows");
      countsAtStep[s] = {step.layer(), buffer, slot.first + seen[step.layer()]++ * slot.second + epOf(rankIndex) * n, n,
                         ownRows};
    }
  }
  size_t counts = countsTotal;
  // The loss step's label rule, for each rank's count of scored tokens.
  bool shiftedBefore = false; // a shift_labels step shifts them for the loss (sequence parallel)
  for (const plan::Step &step : rank.steps())
    if (step.has_launch() && step.phase() == plan::FORWARD &&
        (step.launch().kernel() == "cross_entropy" || step.launch().kernel() == "lm_head_cross_entropy")) {
      const auto &attrs = step.launch().attrs();
      shiftLabels = attrs.count("shift_labels") && attrs.at("shift_labels").b();
      if (attrs.count("ignore_index"))
        ignoreIndex = attrs.at("ignore_index").i();
    } else if (step.has_launch() && step.launch().kernel() == "shift_labels") {
      shiftedBefore = true;
    }
  shiftLabels |= shiftedBefore;
  if (absl::StatusOr<void *> memory = executor.device().allocate(8); memory.ok())
    worldScratch = *memory;
  if (absl::StatusOr<void *> memory = executor.device().allocate(std::max<size_t>(tensors.size(), 1) * 4);
      memory.ok())
    sums = *memory;
  if (absl::StatusOr<void *> memory = executor.device().allocate(std::max<size_t>(counts, 1) * sizeof(int64_t));
      memory.ok())
    countsCopy = *memory;
}

Trainer::~Trainer() {
  (void)executor.device().synchronize();
  if (sums)
    executor.device().release(sums);
  if (countsCopy)
    executor.device().release(countsCopy);
  if (worldScratch)
    executor.device().release(worldScratch);
}

std::vector<float> Trainer::partOf(const Tensor &t, const std::vector<float> &whole) const {
  if (t.start.empty())
    return whole;
  const std::vector<int64_t> &full = wholeShapes.at(t.name);
  std::vector<float> part(t.size);
  std::vector<int64_t> at(t.shape.size(), 0); // index in the part, row-major
  for (size_t i = 0; i < t.size; ++i) {
    int64_t offset = 0;
    for (size_t d = 0; d < at.size(); ++d)
      offset = offset * full[d] + t.start[d] + at[d];
    part[i] = whole[static_cast<size_t>(offset)];
    for (size_t d = at.size(); d-- > 0 && ++at[d] == t.shape[d];)
      at[d] = 0;
  }
  return part;
}

void Trainer::placePart(const Tensor &t, const std::vector<float> &part, std::vector<float> &whole) const {
  if (t.start.empty()) {
    std::copy(part.begin(), part.end(), whole.begin());
    return;
  }
  const std::vector<int64_t> &full = wholeShapes.at(t.name);
  std::vector<int64_t> at(t.shape.size(), 0);
  for (size_t i = 0; i < t.size; ++i) {
    int64_t offset = 0;
    for (size_t d = 0; d < at.size(); ++d)
      offset = offset * full[d] + t.start[d] + at[d];
    whole[static_cast<size_t>(offset)] = part[i];
    for (size_t d = at.size(); d-- > 0 && ++at[d] == t.shape[d];)
      at[d] = 0;
  }
}

int64_t Trainer::scoredTokens(const std::vector<int64_t> &labels) const {
  int64_t seq = executor.planProto().seq_len(), n = 0;
  size_t first = 0, end = labels.size();
  if (sequenceParallel) { // this tp rank's rows
    first = labels.size() * static_cast<size_t>(tpIndex) / static_cast<size_t>(tpSize);
    end = labels.size() * static_cast<size_t>(tpIndex + 1) / static_cast<size_t>(tpSize);
  }
  for (size_t t = first; t < end; ++t) {
    if (shiftLabels && (static_cast<int64_t>(t) + 1) % seq == 0)
      continue;
    n += labels[shiftLabels ? t + 1 : t] != ignoreIndex;
  }
  return n;
}

absl::StatusOr<double> Trainer::sumOverRanks(double value, plan::DType dtype) {
  if (!worldScratch)
    return absl::ResourceExhaustedError("no device memory for a value summed over ranks");
  int64_t i = static_cast<int64_t>(value);
  float f = static_cast<float>(value);
  const void *host = dtype == plan::I64 ? static_cast<const void *>(&i) : &f;
  size_t bytes = dtype == plan::I64 ? sizeof i : sizeof f;
  if (absl::Status s = executor.device().upload(worldScratch, host, bytes); !s.ok())
    return s;
  if (absl::Status s = world->allReduce(worldScratch, worldScratch, 1, dtype); !s.ok())
    return s;
  if (absl::Status s = executor.device().download(const_cast<void *>(host), worldScratch, bytes); !s.ok())
    return s;
  return dtype == plan::I64 ? static_cast<double>(i) : f;
}

absl::Status Trainer::initAdapter(uint64_t seed) {
  for (Tensor &t : tensors) {
    std::vector<float> zeros(t.size, 0.0f);
    if (t.fromCheckpoint) {
      for (uint32_t id : {t.m, t.v})
        if (absl::Status s = executor.writeFloats(id, zeros); !s.ok())
          return s;
      continue;
    }
    // The whole tensor's values (a tp rank takes its part), as one rank would make them.
    const std::vector<int64_t> &whole = wholeShapes.at(t.name);
    size_t count = 1;
    for (int64_t dim : whole)
      count *= static_cast<size_t>(dim);
    std::vector<float> values(count, 0.0f);
    if (t.name.find(".lora_A.") != std::string::npos) {
      // One stream per tensor name, so adding a target leaves the others unchanged.
      std::mt19937_64 rng(seed ^ std::hash<std::string>{}(t.name));
      float bound = 1.0f / std::sqrt(static_cast<float>(whole.back()));
      std::uniform_real_distribution<float> uniform(-bound, bound);
      for (float &value : values)
        value = uniform(rng);
    }
    values = partOf(t, values);
    for (auto [id, data] : {std::pair{t.param, &values}, {t.m, &zeros}, {t.v, &zeros}})
      if (absl::Status s = executor.writeFloats(id, *data); !s.ok())
        return s;
  }
  return absl::OkStatus();
}

absl::Status Trainer::setAdapter(const std::map<std::string, std::vector<float>> &values) {
  for (Tensor &t : tensors) {
    auto it = values.find(t.name);
    if (it == values.end() && t.fromCheckpoint)
      continue; // keeps the checkpoint's value
    if (it == values.end())
      return absl::NotFoundError(absl::StrCat("the adapter has no tensor '", t.name, "'"));
    size_t whole = 1;
    for (int64_t dim : wholeShapes.at(t.name))
      whole *= static_cast<size_t>(dim);
    if (it->second.size() != whole)
      return absl::InvalidArgumentError(absl::StrCat("adapter tensor '", t.name, "' has ", it->second.size(),
                                                     " values, the plan expects ", whole));
  }
  for (Tensor &t : tensors)
    if (auto it = values.find(t.name); it != values.end())
      if (absl::Status s = executor.writeFloats(t.param, partOf(t, it->second)); !s.ok())
        return s;
  return absl::OkStatus();
}

absl::Status Trainer::agree(absl::Status local, const std::string &what) {
  absl::StatusOr<double> failed = sumOverRanks(local.ok() ? 0.0 : 1.0, plan::I64);
  if (!failed.ok())
    return absl::Status(failed.status().code(), absl::StrCat(what, ": ", failed.status().message()));
  if (!local.ok())
    return absl::Status(local.code(), absl::StrCat(what, ": ", local.message()));
  if (*failed > 0)
    return absl::AbortedError(absl::StrCat(what, ": ", *failed, " other rank(s) failed (their messages say why)"));
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, std::vector<float>>> Trainer::collect(uint32_t Tensor::*buffer) {
  std::map<std::string, std::vector<float>> out;
  absl::Status local;
  for (const Tensor &t : tensors) {
    absl::StatusOr<std::vector<float>> values = executor.readFloats(t.*buffer);
    if (!values.ok()) {
      local = values.status();
      break;
    }
    out[t.name] = std::move(*values);
  }
  if (!gathering) {
    if (!local.ok())
      return local;
    return out;
  }
  // Every tensor whole, summed over ranks: only the rank the layout names for a tensor (or a
  // part) adds it (x + 0 + ... is exact), so every rank ends with all of them.
  if (!world)
    return absl::FailedPreconditionError("the adapter is spread over the plan's ranks; run every rank");
  std::map<std::string, std::vector<float>> whole;
  size_t total = 0;
  for (const std::string &name : names) {
    size_t count = 1;
    for (int64_t dim : wholeShapes.at(name))
      count *= static_cast<size_t>(dim);
    whole[name].assign(count, 0.0f);
    total += count;
  }
  if (local.ok())
    for (const Tensor &t : tensors)
      if (t.holder == rankIndex)
        placePart(t, out.at(t.name), whole.at(t.name));
  std::vector<float> packed;
  packed.reserve(total);
  for (const std::string &name : names)
    packed.insert(packed.end(), whole[name].begin(), whole[name].end());
  absl::StatusOr<void *> device = executor.device().allocate(std::max<size_t>(total, 1) * sizeof(float));
  if (local.ok() && !device.ok())
    local = device.status();
  // A rank that cannot take part says so to the others first: none waits for it in the sum.
  if (absl::Status agreed = agree(local, "gathering the adapter from the ranks"); !agreed.ok()) {
    if (device.ok())
      executor.device().release(*device);
    return agreed;
  }
  absl::Status status = executor.device().upload(*device, packed.data(), total * sizeof(float));
  if (status.ok())
    status = world->allReduce(*device, *device, total, plan::F32);
  if (status.ok())
    status = executor.device().download(packed.data(), *device, total * sizeof(float));
  executor.device().release(*device);
  if (!status.ok())
    return absl::Status(status.code(), absl::StrCat("gathering the adapter from the pipeline stages: ",
                                                    status.message()));
  size_t at = 0;
  for (const std::string &name : names) {
    size_t count = whole[name].size();
    out[name].assign(packed.begin() + static_cast<std::ptrdiff_t>(at),
                     packed.begin() + static_cast<std::ptrdiff_t>(at + count));
    at += count;
  }
  return out;
}

absl::StatusOr<std::map<std::string, std::vector<float>>> Trainer::adapter() { return collect(&Tensor::param); }

absl::StatusOr<std::map<std::string, std::vector<float>>> Trainer::gradients() { return collect(&Tensor::grad); }

std::map<std::string, std::vector<int64_t>> Trainer::shapes() const {
  return wholeShapes;
}

absl::StatusOr<float> Trainer::forwardBackward(const Batch &batch) {
  if (absl::Status status = executor.setInputs(batch.ids, batch.positions, batch.labels); !status.ok())
    return status;
  if (absl::Status status = executor.zeroGradients(); !status.ok())
    return status;
  // A sharded step: this rank's share of the global mean loss seeds its backward (each
  // micro-batch's share on a pipeline), so the plan's sums over ranks give the global batch's
  // gradients. Only the ranks that compute the loss (a pipeline's last stage) count tokens.
  std::vector<double> weights(static_cast<size_t>(microBatches), 1.0);
  if (executor.hasLossWeight()) {
    int ranks = executor.planProto().ranks_size();
    if (!world || world->size() != ranks)
      return absl::FailedPreconditionError(absl::StrCat(
          "the plan is sharded over ", ranks, " ranks: each rank's loss weight needs the others' token "
          "counts; run every rank (moe-run --nproc ", ranks, ")"));
    std::vector<int64_t> scored;
    int64_t mine = 0;
    size_t rows = batch.labels.size() / static_cast<size_t>(microBatches);
    for (int64_t m = 0; m < microBatches; ++m) {
      scored.push_back(scoredTokens({batch.labels.begin() + m * rows, batch.labels.begin() + (m + 1) * rows}));
      mine += scored.back();
    }
    absl::StatusOr<double> all = sumOverRanks(countsTokens ? static_cast<double>(mine) : 0.0, plan::I64);
    if (!all.ok())
      return absl::Status(all.status().code(), absl::StrCat("summing scored tokens over ranks: ",
                                                             all.status().message()));
    std::vector<float> seeds;
    for (int64_t m = 0; m < microBatches; ++m) {
      weights[m] = *all > 0 ? scored[m] / *all : 0.0;
      seeds.push_back(static_cast<float>(weights[m]));
    }
    if (absl::Status status = executor.setLossWeights(seeds); !status.ok())
      return status;
  }
  auto *copies = static_cast<int64_t *>(countsCopy);
  // Every slot is zero but the ones this rank's dispatches write (other stages' layers).
  if (copies && countsTotal)
    if (absl::Status s = executor.device().zero(copies, countsTotal * sizeof(int64_t)); !s.ok())
      return s;
  absl::Status status = executor.run([&](int s) {
    auto slot = countsAtStep.find(s);
    if (slot != countsAtStep.end() && copies)
      (void)executor.device().copy(copies + slot->second.offset, executor.buffer(slot->second.buffer).data,
                                   slot->second.count * sizeof(int64_t));
  });
  if (!status.ok())
    return status;
  // Tokens per expert from each forward dispatch, read once.
  lastLoad.clear();
  lastRankLoad.clear();
  if (copies && countsTotal > 0) { // the same on every rank: the sum below is a collective
    // tp ranks share their tokens: one of them counts them (but each counts its own rows).
    if (!countsLoads)
      for (const auto &[step, slot] : countsAtStep)
        if (!slot.ownRows)
          if (absl::Status s = executor.device().zero(copies + slot.offset, slot.count * sizeof(int64_t)); !s.ok())
            return s;
    std::vector<int64_t> all(countsTotal);
    // On several ranks, the load of the global batch: every rank's tokens per expert, summed.
    if (world && executor.planProto().ranks_size() > 1)
      if (absl::Status s = world->allReduce(copies, copies, all.size(), plan::I64); !s.ok())
        return absl::Status(s.code(), absl::StrCat("summing expert loads over ranks: ", s.message()));
    if (absl::Status s = executor.device().download(all.data(), copies, all.size() * sizeof(int64_t)); !s.ok())
      return s;
    for (const auto &[layer, slot] : loadSlots) {
      std::vector<int64_t> &load = lastLoad[layer];
      load.assign(slot.second, 0);
      for (size_t m = 0; m < loadDispatches[layer]; ++m)
        for (size_t e = 0; e < slot.second; ++e)
          load[e] += all[slot.first + m * slot.second + e];
      // Split over ep, each rank counted its own experts, in its place: back to expert order
      // (a replicated expert's copies summed), and each rank's share.
      auto placed = placedExperts.find(layer);
      if (placed == placedExperts.end() || placed->second.size() != load.size())
        continue;
      std::vector<int64_t> byPosition = std::move(load);
      int ep = std::max(1, executor.planProto().mesh().ep());
      size_t perRank = byPosition.size() / static_cast<size_t>(ep);
      load.assign(static_cast<size_t>(expertCount[layer]), 0);
      std::vector<int64_t> &ranks = lastRankLoad[layer];
      ranks.assign(static_cast<size_t>(ep), 0);
      for (size_t p = 0; p < byPosition.size(); ++p) {
        load[static_cast<size_t>(placed->second[p])] += byPosition[p];
        ranks[p / perRank] += byPosition[p];
      }
    }
  }
  absl::StatusOr<std::vector<float>> losses = executor.losses();
  if (!losses.ok())
    return losses.status();
  double weighted = 0;
  for (size_t m = 0; m < losses->size(); ++m)
    weighted += weights[m] * (*losses)[m];
  lastLoss = static_cast<float>(weighted);
  if (executor.hasLossWeight()) {
    absl::StatusOr<double> global = sumOverRanks(countsTokens ? weighted : 0.0, plan::F32);
    if (!global.ok())
      return absl::Status(global.status().code(), absl::StrCat("summing the loss over ranks: ",
                                                                global.status().message()));
    lastLoss = static_cast<float>(*global);
  }
  return lastLoss;
}

absl::StatusOr<StepStats> Trainer::optimizerStep() {
  const plan::Optimizer &optimizer = executor.planProto().optimizer();
  StepStats stats;
  if (!tensors.empty()) {
    if (!sums)
      return absl::ResourceExhaustedError("no device memory for the gradient norm");
    std::vector<TensorRef> grads;
    for (const Tensor &t : tensors)
      grads.push_back(executor.buffer(t.grad));
    TensorRef out;
    out.dtype = plan::F32;
    out.shape = {static_cast<int64_t>(tensors.size())};
    out.data = sums;
    google::protobuf::Map<std::string, plan::Attr> none;
    if (absl::Status s = executor.launchOn("sum_squares", grads, {out}, none); !s.ok())
      return s;
    std::vector<float> perTensor(tensors.size());
    if (absl::Status s = executor.device().download(perTensor.data(), sums, perTensor.size() * sizeof(float));
        !s.ok())
      return s;
    double sum = 0;
    for (float value : perTensor)
      sum += value;
    stats.gradNorm = std::sqrt(sum);
  }
  // Tensors spread over ranks (pipeline stages, tp parts): each counted once, by its holder.
  if (gathering) {
    std::vector<float> perTensor(tensors.size());
    if (!tensors.empty())
      if (absl::Status s = executor.device().download(perTensor.data(), sums, perTensor.size() * sizeof(float));
          !s.ok())
        return s;
    double held = 0;
    for (size_t i = 0; i < tensors.size(); ++i)
      if (tensors[i].holder == rankIndex)
        held += perTensor[i];
    absl::StatusOr<double> all = sumOverRanks(held, plan::F32);
    if (!all.ok())
      return absl::Status(all.status().code(), absl::StrCat("summing the gradient norm over ranks: ",
                                                             all.status().message()));
    stats.gradNorm = std::sqrt(*all);
  }
  stats.lr = learningRate(optimizer, steps);
  google::protobuf::Map<std::string, plan::Attr> attrs;
  attrs["lr"].set_f(stats.lr);
  attrs["step"].set_i(steps);
  attrs["beta1"].set_f(optimizer.beta1());
  attrs["beta2"].set_f(optimizer.beta2());
  attrs["eps"].set_f(optimizer.eps());
  attrs["weight_decay"].set_f(optimizer.weight_decay());
  attrs["grad_scale"].set_f(clipFactor(stats.gradNorm, optimizer.max_grad_norm()));
  for (const Tensor &t : tensors)
    if (absl::Status s = executor.launch("adamw", {t.grad}, {t.param, t.m, t.v}, attrs); !s.ok())
      return s;
  stats.step = ++steps;
  stats.loss = lastLoss;
  stats.expertLoad = lastLoad;
  stats.epRankLoad = lastRankLoad;
  return stats;
}

absl::StatusOr<StepStats> Trainer::trainStep(const Batch &batch) {
  absl::StatusOr<float> loss = forwardBackward(batch);
  if (!loss.ok())
    return loss.status();
  if (!std::isfinite(*loss))
    return absl::InternalError(absl::StrCat("the loss is ", *loss, " at step ", steps + 1,
                                            "; nothing was updated"));
  return optimizerStep();
}

absl::Status Trainer::saveCheckpoint(const std::string &path,
                                     const std::map<std::string, std::string> &extra) {
  bool writes = !world || world->rank() == 0;
  if (!writes && !gathering)
    return absl::OkStatus(); // every rank holds the same tensors; rank 0 writes them
  absl::StatusOr<std::map<std::string, std::vector<float>>> params = collect(&Tensor::param);
  if (!params.ok())
    return params.status();
  absl::StatusOr<std::map<std::string, std::vector<float>>> moments[] = {collect(&Tensor::m), collect(&Tensor::v)};
  for (const auto &moment : moments)
    if (!moment.ok())
      return moment.status();
  if (!writes)
    return absl::OkStatus();
  weights::SafetensorsWriter writer;
  for (const std::string &tensor : names) {
    std::pair<std::string, const std::vector<float> *> parts[] = {{tensor, &params->at(tensor)},
                                                                  {tensor + ".adam_m", &moments[0]->at(tensor)},
                                                                  {tensor + ".adam_v", &moments[1]->at(tensor)}};
    for (auto &[name, values] : parts)
      if (absl::Status s = writer.add(name, weights::DType::F32, wholeShapes.at(tensor), values->data(),
                                      values->size() * sizeof(float));
          !s.ok())
        return s;
  }
  if (absl::Status s = writer.setMetadata("moec_checkpoint", "1"); !s.ok())
    return s;
  if (absl::Status s = writer.setMetadata("step", std::to_string(steps)); !s.ok())
    return s;
  for (const auto &[key, value] : extra)
    if (absl::Status s = writer.setMetadata(key, value); !s.ok())
      return s;
  return writer.write(path);
}

absl::Status Trainer::loadCheckpoint(const std::string &path, std::map<std::string, std::string> &extra) {
  absl::StatusOr<std::unique_ptr<weights::SafetensorsFile>> file = weights::SafetensorsFile::open(path);
  if (!file.ok())
    return file.status();
  const std::map<std::string, std::string> &metadata = (*file)->metadata();
  auto marker = metadata.find("moec_checkpoint");
  auto step = metadata.find("step");
  if (marker == metadata.end() || step == metadata.end())
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a MoEC training checkpoint (no moec_checkpoint/step metadata)"));
  char *end = nullptr;
  long long stepCount = std::strtoll(step->second.c_str(), &end, 10);
  if (step->second.empty() || *end != '\0' || stepCount < 0)
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": step metadata '", step->second, "' is not a non-negative integer"));
  if ((*file)->tensors().size() != 3 * names.size())
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": holds ", (*file)->tensors().size(), " tensors, the plan's adapter needs ", 3 * names.size(),
        " (parameters and two moments each); was the checkpoint written for another plan?"));
  // Check every tensor before changing anything: a failed resume leaves the trainer as it was.
  for (int pass = 0; pass < 2; ++pass)
    for (Tensor &t : tensors) {
      std::pair<std::string, uint32_t> parts[] = {{t.name, t.param}, {t.name + ".adam_m", t.m},
                                                  {t.name + ".adam_v", t.v}};
      // The file holds whole tensors; a tp rank takes its part.
      size_t count = 1;
      for (int64_t dim : wholeShapes.at(t.name))
        count *= static_cast<size_t>(dim);
      for (auto &[name, id] : parts) {
        const weights::TensorInfo *info = (*file)->find(name);
        size_t bytes = count * sizeof(float);
        if (!info || info->dtype != weights::DType::F32 || info->numBytes() != bytes)
          return absl::InvalidArgumentError(absl::StrCat(
              path, ": tensor '", name, "' is missing or does not match the plan (f32, ", count,
              " values); was the checkpoint written for another plan?"));
        if (pass == 1) {
          std::vector<float> values(count);
          std::memcpy(values.data(), (*file)->data(*info).data(), bytes);
          if (absl::Status s = executor.writeFloats(id, partOf(t, values)); !s.ok())
            return s;
        }
      }
    }
  steps = stepCount;
  extra = metadata;
  return absl::OkStatus();
}

} // namespace moec::runtime
