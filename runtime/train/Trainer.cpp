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
  // Device scratch: the sums of squares, and a copy of each forward dispatch's counts
  // (their buffer is reused later in the step), read once after the step.
  for (const plan::Step &step : executor.rankPlan().steps())
    if (step.phase() == plan::FORWARD && step.has_launch() && step.launch().kernel() == "dispatch" &&
        step.launch().outputs_size() >= 2) {
      countsLayout.emplace_back(step.layer(), countsBytes);
      TensorRef counts = executor.buffer(step.launch().outputs(1));
      countsBytes += static_cast<size_t>(counts.numel()) * sizeof(int64_t);
    }
  if (absl::StatusOr<void *> memory = executor.device().allocate(std::max<size_t>(tensors.size(), 1) * 4);
      memory.ok())
    sums = *memory;
  if (absl::StatusOr<void *> memory = executor.device().allocate(std::max<size_t>(countsBytes, 8)); memory.ok())
    countsCopy = *memory;
}

Trainer::~Trainer() {
  (void)executor.device().synchronize();
  if (sums)
    executor.device().release(sums);
  if (countsCopy)
    executor.device().release(countsCopy);
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

void Trainer::copyExpertCounts(int s) {
  const plan::Step &step = executor.rankPlan().steps(s);
  if (step.phase() != plan::FORWARD || !step.has_launch() || step.launch().kernel() != "dispatch" ||
      step.launch().outputs_size() < 2 || !countsCopy)
    return;
  for (auto [layer, offset] : countsLayout)
    if (layer == step.layer()) {
      TensorRef counts = executor.buffer(step.launch().outputs(1));
      (void)executor.device().copy(static_cast<uint8_t *>(countsCopy) + offset, counts.data,
                                   static_cast<size_t>(counts.numel()) * sizeof(int64_t));
      return;
    }
}

absl::StatusOr<float> Trainer::forwardBackward(const Batch &batch) {
  if (absl::Status status = executor.setInputs(batch.ids, batch.positions, batch.labels); !status.ok())
    return status;
  if (absl::Status status = executor.zeroGradients(); !status.ok())
    return status;
  if (absl::Status status = executor.run([&](int s) { copyExpertCounts(s); }); !status.ok())
    return status;
  // Tokens per expert from each forward dispatch (its second output), read once.
  lastLoad.clear();
  if (countsCopy && !countsLayout.empty()) {
    std::vector<int64_t> all(countsBytes / sizeof(int64_t));
    if (absl::Status s = executor.device().download(all.data(), countsCopy, countsBytes); !s.ok())
      return s;
    for (size_t i = 0; i < countsLayout.size(); ++i) {
      size_t begin = countsLayout[i].second / sizeof(int64_t);
      size_t end = i + 1 < countsLayout.size() ? countsLayout[i + 1].second / sizeof(int64_t) : all.size();
      lastLoad[countsLayout[i].first].assign(all.begin() + begin, all.begin() + end);
    }
  }
  absl::StatusOr<float> loss = executor.loss();
  if (!loss.ok())
    return loss.status();
  lastLoss = *loss;
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
