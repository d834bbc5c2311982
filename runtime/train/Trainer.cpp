//===- Trainer.cpp - LoRA training on an Executor -------------------------===//

#include "runtime/train/Trainer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <list>
#include <random>

#include "absl/strings/str_cat.h"
#include "runtime/train/Optimizer.h"
#include "runtime/weights/Safetensors.h"
#include "runtime/weights/SafetensorsWriter.h"

namespace moec::runtime {

Trainer::Trainer(Executor &executor) : executor(executor) {
  for (const plan::LoraTensor &t : executor.planProto().lora().tensors()) {
    TensorRef param = executor.buffer(t.param());
    tensors.push_back({t.peft_name(), t.param(), t.grad(), t.adam_m(), t.adam_v(), param.shape,
                       static_cast<size_t>(param.numel())});
  }
  // Device scratch: the sums of squares, and a copy of each forward dispatch's counts, read
  // once after the step.
  size_t counts = 0;
  const plan::Rank &rank = executor.rankPlan();
  for (int s = 0; s < rank.steps_size(); ++s) {
    const plan::Step &step = rank.steps(s);
    if (step.phase() == plan::FORWARD && step.has_launch() && step.launch().kernel() == "dispatch" &&
        step.launch().outputs_size() >= 2) {
      uint32_t buffer = step.launch().outputs(1);
      size_t n = static_cast<size_t>(executor.buffer(buffer).numel());
      countsAtStep[s] = {step.layer(), buffer, counts, n};
      counts += n;
    }
  }
  // The loss step's label rule, for each rank's count of scored tokens.
  for (const plan::Step &step : rank.steps())
    if (step.has_launch() && step.phase() == plan::FORWARD &&
        (step.launch().kernel() == "cross_entropy" || step.launch().kernel() == "lm_head_cross_entropy")) {
      const auto &attrs = step.launch().attrs();
      shiftLabels = attrs.count("shift_labels") && attrs.at("shift_labels").b();
      if (attrs.count("ignore_index"))
        ignoreIndex = attrs.at("ignore_index").i();
    }
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

int64_t Trainer::scoredTokens(const std::vector<int64_t> &labels) const {
  int64_t seq = executor.planProto().seq_len(), n = 0;
  for (size_t t = 0; t < labels.size(); ++t) {
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
    std::vector<float> values(t.size, 0.0f);
    if (t.name.find(".lora_A.") != std::string::npos) {
      // One stream per tensor name, so adding a target leaves the others unchanged.
      std::mt19937_64 rng(seed ^ std::hash<std::string>{}(t.name));
      float bound = 1.0f / std::sqrt(static_cast<float>(t.shape.back()));
      std::uniform_real_distribution<float> uniform(-bound, bound);
      for (float &value : values)
        value = uniform(rng);
    }
    std::vector<float> zeros(t.size, 0.0f);
    for (auto [id, data] : {std::pair{t.param, &values}, {t.m, &zeros}, {t.v, &zeros}})
      if (absl::Status s = executor.writeFloats(id, *data); !s.ok())
        return s;
  }
  return absl::OkStatus();
}

absl::Status Trainer::setAdapter(const std::map<std::string, std::vector<float>> &values) {
  for (Tensor &t : tensors) {
    auto it = values.find(t.name);
    if (it == values.end())
      return absl::NotFoundError(absl::StrCat("the adapter has no tensor '", t.name, "'"));
    if (it->second.size() != t.size)
      return absl::InvalidArgumentError(absl::StrCat("adapter tensor '", t.name, "' has ", it->second.size(),
                                                     " values, the plan expects ", t.size));
  }
  for (Tensor &t : tensors)
    if (absl::Status s = executor.writeFloats(t.param, values.at(t.name)); !s.ok())
      return s;
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, std::vector<float>>> Trainer::adapter() {
  std::map<std::string, std::vector<float>> out;
  for (const Tensor &t : tensors) {
    absl::StatusOr<std::vector<float>> values = executor.readFloats(t.param);
    if (!values.ok())
      return values.status();
    out[t.name] = std::move(*values);
  }
  return out;
}

std::map<std::string, std::vector<int64_t>> Trainer::shapes() const {
  std::map<std::string, std::vector<int64_t>> out;
  for (const Tensor &t : tensors)
    out[t.name] = t.shape;
  return out;
}

absl::StatusOr<std::map<std::string, std::vector<float>>> Trainer::gradients() {
  std::map<std::string, std::vector<float>> out;
  for (const Tensor &t : tensors) {
    absl::StatusOr<std::vector<float>> grad = executor.readFloats(t.grad);
    if (!grad.ok())
      return grad.status();
    out[t.name] = std::move(*grad);
  }
  return out;
}

absl::StatusOr<float> Trainer::forwardBackward(const Batch &batch) {
  if (absl::Status status = executor.setInputs(batch.ids, batch.positions, batch.labels); !status.ok())
    return status;
  if (absl::Status status = executor.zeroGradients(); !status.ok())
    return status;
  // A sharded step: this rank's share of the global mean loss seeds its backward, so the
  // plan's sums over ranks give the global batch's gradients.
  double weight = 1;
  if (executor.hasLossWeight()) {
    int ranks = executor.planProto().ranks_size();
    if (!world || world->size() != ranks)
      return absl::FailedPreconditionError(absl::StrCat(
          "the plan is sharded over ", ranks, " ranks: each rank's loss weight needs the others' token "
          "counts; run every rank (moe-run --nproc ", ranks, ")"));
    int64_t mine = scoredTokens(batch.labels);
    absl::StatusOr<double> all = sumOverRanks(static_cast<double>(mine), plan::I64);
    if (!all.ok())
      return absl::Status(all.status().code(), absl::StrCat("summing scored tokens over ranks: ",
                                                             all.status().message()));
    weight = *all > 0 ? mine / *all : 0.0;
    if (absl::Status status = executor.setLossWeight(static_cast<float>(weight)); !status.ok())
      return status;
  }
  auto *copies = static_cast<int64_t *>(countsCopy);
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
  if (copies && !countsAtStep.empty()) {
    const CountsSlot &last = countsAtStep.rbegin()->second;
    std::vector<int64_t> all(last.offset + last.count);
    // On several ranks, the load of the global batch: every rank's tokens per expert, summed.
    if (world && executor.planProto().ranks_size() > 1)
      if (absl::Status s = world->allReduce(copies, copies, all.size(), plan::I64); !s.ok())
        return absl::Status(s.code(), absl::StrCat("summing expert loads over ranks: ", s.message()));
    if (absl::Status s = executor.device().download(all.data(), copies, all.size() * sizeof(int64_t)); !s.ok())
      return s;
    for (const auto &[step, slot] : countsAtStep)
      lastLoad[slot.layer].assign(all.begin() + slot.offset, all.begin() + slot.offset + slot.count);
  }
  absl::StatusOr<float> loss = executor.loss();
  if (!loss.ok())
    return loss.status();
  lastLoss = *loss;
  if (executor.hasLossWeight()) {
    absl::StatusOr<double> global = sumOverRanks(weight * *loss, plan::F32);
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
  weights::SafetensorsWriter writer;
  std::list<std::vector<float>> held; // the writer keeps pointers until write()
  for (const Tensor &t : tensors) {
    std::pair<std::string, uint32_t> parts[] = {{t.name, t.param}, {t.name + ".adam_m", t.m},
                                                {t.name + ".adam_v", t.v}};
    for (auto &[name, id] : parts) {
      absl::StatusOr<std::vector<float>> values = executor.readFloats(id);
      if (!values.ok())
        return values.status();
      const std::vector<float> &kept = held.emplace_back(std::move(*values));
      if (absl::Status s = writer.add(name, weights::DType::F32, t.shape, kept.data(),
                                      kept.size() * sizeof(float));
          !s.ok())
        return s;
    }
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
  if ((*file)->tensors().size() != 3 * tensors.size())
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": holds ", (*file)->tensors().size(), " tensors, the plan's adapter needs ", 3 * tensors.size(),
        " (parameters and two moments each); was the checkpoint written for another plan?"));
  // Check every tensor before changing anything: a failed resume leaves the trainer as it was.
  for (int pass = 0; pass < 2; ++pass)
    for (Tensor &t : tensors) {
      std::pair<std::string, uint32_t> parts[] = {{t.name, t.param}, {t.name + ".adam_m", t.m},
                                                  {t.name + ".adam_v", t.v}};
      for (auto &[name, id] : parts) {
        const weights::TensorInfo *info = (*file)->find(name);
        size_t bytes = t.size * sizeof(float);
        if (!info || info->dtype != weights::DType::F32 || info->numBytes() != bytes)
          return absl::InvalidArgumentError(absl::StrCat(
              path, ": tensor '", name, "' is missing or does not match the plan (f32, ", t.size,
              " values); was the checkpoint written for another plan?"));
        if (pass == 1) {
          std::vector<float> values(t.size);
          std::memcpy(values.data(), (*file)->data(*info).data(), bytes);
          if (absl::Status s = executor.writeFloats(id, values); !s.ok())
            return s;
        }
      }
    }
  steps = stepCount;
  extra = metadata;
  return absl::OkStatus();
}

} // namespace moec::runtime
