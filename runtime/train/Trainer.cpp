//===- Trainer.cpp - LoRA training on an Executor -------------------------===//

#include "runtime/train/Trainer.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <random>

#include "absl/strings/str_cat.h"
#include "runtime/train/Optimizer.h"
#include "runtime/weights/Safetensors.h"
#include "runtime/weights/SafetensorsWriter.h"

namespace moec::runtime {

Trainer::Trainer(Executor &executor) : executor(executor) {
  for (const plan::LoraTensor &t : executor.planProto().lora().tensors()) {
    TensorRef param = executor.buffer(t.param());
    size_t n = static_cast<size_t>(param.numel());
    tensors.push_back({t.peft_name(), t.param(), t.grad(), param.shape, std::vector<float>(n),
                       std::vector<float>(n), std::vector<float>(n)});
  }
}

absl::Status Trainer::initAdapter(uint64_t seed) {
  for (Tensor &t : tensors) {
    bool isA = t.name.find(".lora_A.") != std::string::npos;
    if (!isA) {
      std::fill(t.master.begin(), t.master.end(), 0.0f);
    } else {
      // One stream per tensor name, so adding a target leaves the others unchanged.
      std::mt19937_64 rng(seed ^ std::hash<std::string>{}(t.name));
      float bound = 1.0f / std::sqrt(static_cast<float>(t.shape.back()));
      std::uniform_real_distribution<float> uniform(-bound, bound);
      for (float &value : t.master)
        value = uniform(rng);
    }
    if (absl::Status s = upload(t); !s.ok())
      return s;
  }
  return absl::OkStatus();
}

absl::Status Trainer::setAdapter(const std::map<std::string, std::vector<float>> &values) {
  for (Tensor &t : tensors) {
    auto it = values.find(t.name);
    if (it == values.end())
      return absl::NotFoundError(absl::StrCat("the adapter has no tensor '", t.name, "'"));
    if (it->second.size() != t.master.size())
      return absl::InvalidArgumentError(absl::StrCat("adapter tensor '", t.name, "' has ", it->second.size(),
                                                     " values, the plan expects ", t.master.size()));
    t.master = it->second;
    if (absl::Status s = upload(t); !s.ok())
      return s;
  }
  return absl::OkStatus();
}

std::map<std::string, std::vector<float>> Trainer::adapter() const {
  std::map<std::string, std::vector<float>> out;
  for (const Tensor &t : tensors)
    out[t.name] = t.master;
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
  // Tokens per expert from each forward dispatch (its second output).
  lastLoad.clear();
  const plan::Rank &rank = executor.rankPlan();
  absl::Status status = executor.run([&](int s) {
    const plan::Step &step = rank.steps(s);
    if (step.phase() != plan::FORWARD || !step.has_launch() || step.launch().kernel() != "dispatch" ||
        step.launch().outputs_size() < 2)
      return;
    // Read now: later steps reuse the memory.
    TensorRef ref = executor.buffer(step.launch().outputs(1));
    std::vector<int64_t> values(static_cast<size_t>(ref.numel()));
    if (executor.device().download(values.data(), ref.data, values.size() * sizeof(int64_t)).ok())
      lastLoad[step.layer()] = std::move(values);
  });
  if (!status.ok())
    return status;
  absl::StatusOr<float> loss = executor.loss();
  if (!loss.ok())
    return loss.status();
  lastLoss = *loss;
  return lastLoss;
}

absl::StatusOr<StepStats> Trainer::optimizerStep() {
  const plan::Optimizer &optimizer = executor.planProto().optimizer();
  absl::StatusOr<std::map<std::string, std::vector<float>>> grads = gradients();
  if (!grads.ok())
    return grads.status();
  std::vector<std::pair<const float *, int64_t>> views;
  for (const Tensor &t : tensors)
    views.emplace_back((*grads)[t.name].data(), static_cast<int64_t>(t.master.size()));
  StepStats stats;
  stats.gradNorm = globalNorm(views);
  double factor = clipFactor(stats.gradNorm, optimizer.max_grad_norm());
  stats.lr = learningRate(optimizer, steps);
  for (Tensor &t : tensors) {
    std::vector<float> &g = (*grads)[t.name];
    if (factor != 1.0)
      for (float &value : g)
        value = static_cast<float>(value * factor);
    adamwUpdate(optimizer, stats.lr, steps, t.master.data(), g.data(), t.m.data(), t.v.data(),
                static_cast<int64_t>(g.size()));
    if (absl::Status s = upload(t); !s.ok())
      return s;
  }
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
                                     const std::map<std::string, std::string> &extra) const {
  weights::SafetensorsWriter writer;
  for (const Tensor &t : tensors) {
    size_t bytes = t.master.size() * sizeof(float);
    std::pair<std::string, const std::vector<float> *> parts[] = {
        {t.name, &t.master}, {t.name + ".adam_m", &t.m}, {t.name + ".adam_v", &t.v}};
    for (auto &[name, values] : parts)
      if (absl::Status s = writer.add(name, weights::DType::F32, t.shape, values->data(), bytes); !s.ok())
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
  if ((*file)->tensors().size() != 3 * tensors.size())
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": holds ", (*file)->tensors().size(), " tensors, the plan's adapter needs ", 3 * tensors.size(),
        " (parameters and two moments each); was the checkpoint written for another plan?"));
  // Check every tensor before changing anything: a failed resume leaves the trainer as it was.
  for (int pass = 0; pass < 2; ++pass)
    for (Tensor &t : tensors) {
      std::pair<std::string, std::vector<float> *> parts[] = {
          {t.name, &t.master}, {t.name + ".adam_m", &t.m}, {t.name + ".adam_v", &t.v}};
      for (auto &[name, values] : parts) {
        const weights::TensorInfo *info = (*file)->find(name);
        size_t bytes = values->size() * sizeof(float);
        if (!info || info->dtype != weights::DType::F32 || info->numBytes() != bytes)
          return absl::InvalidArgumentError(absl::StrCat(
              path, ": tensor '", name, "' is missing or does not match the plan (f32, ", values->size(),
              " values); was the checkpoint written for another plan?"));
        if (pass == 1)
          std::memcpy(values->data(), (*file)->data(*info).data(), bytes);
      }
      if (pass == 1)
        if (absl::Status s = upload(t); !s.ok())
          return s;
    }
  steps = stepCount;
  extra = metadata;
  return absl::OkStatus();
}

} // namespace moec::runtime
