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
  for (const plan::LoraTensor &t : executor.planProto().lora().tensors())
    tensors.push_back({t.peft_name(), t.param(), t.grad(), t.adam_m(), t.adam_v()});
}

float *Trainer::data(uint32_t buffer) const { return executor.buffer(buffer).f32(); }

int64_t Trainer::numel(uint32_t buffer) const { return executor.buffer(buffer).numel(); }

void Trainer::initAdapter(uint64_t seed) {
  for (const Tensor &t : tensors) {
    TensorRef param = executor.buffer(t.param);
    float *p = param.f32();
    bool isA = t.name.find(".lora_A.") != std::string::npos;
    if (!isA) {
      std::fill_n(p, param.numel(), 0.0f);
      continue;
    }
    // One stream per tensor name, so adding a target leaves the others unchanged.
    std::mt19937_64 rng(seed ^ std::hash<std::string>{}(t.name));
    float bound = 1.0f / std::sqrt(static_cast<float>(param.dim(-1)));
    std::uniform_real_distribution<float> uniform(-bound, bound);
    for (int64_t i = 0; i < param.numel(); ++i)
      p[i] = uniform(rng);
  }
}

absl::Status Trainer::setAdapter(const std::map<std::string, std::vector<float>> &values) {
  for (const Tensor &t : tensors) {
    auto it = values.find(t.name);
    if (it == values.end())
      return absl::NotFoundError(absl::StrCat("the adapter has no tensor '", t.name, "'"));
    if (static_cast<int64_t>(it->second.size()) != numel(t.param))
      return absl::InvalidArgumentError(absl::StrCat("adapter tensor '", t.name, "' has ", it->second.size(),
                                                     " values, the plan expects ", numel(t.param)));
    std::memcpy(data(t.param), it->second.data(), it->second.size() * sizeof(float));
  }
  return absl::OkStatus();
}

std::map<std::string, std::vector<float>> Trainer::adapter() const {
  std::map<std::string, std::vector<float>> out;
  for (const Tensor &t : tensors)
    out[t.name].assign(data(t.param), data(t.param) + numel(t.param));
  return out;
}

std::map<std::string, std::vector<float>> Trainer::gradients() const {
  std::map<std::string, std::vector<float>> out;
  for (const Tensor &t : tensors)
    out[t.name].assign(data(t.grad), data(t.grad) + numel(t.grad));
  return out;
}

absl::StatusOr<float> Trainer::forwardBackward(const Batch &batch) {
  if (absl::Status status = executor.setInputs(batch.ids, batch.positions, batch.labels); !status.ok())
    return status;
  executor.zeroGradients();
  // Tokens per expert from each forward dispatch (its second output).
  lastLoad.clear();
  const plan::Rank &rank = executor.rankPlan();
  absl::Status status = executor.run([&](int s) {
    const plan::Step &step = rank.steps(s);
    if (step.phase() != plan::FORWARD || !step.has_launch() || step.launch().kernel() != "dispatch" ||
        step.launch().outputs_size() < 2)
      return;
    TensorRef counts = executor.buffer(step.launch().outputs(1));
    std::vector<int64_t> &load = lastLoad[step.layer()];
    load.resize(static_cast<size_t>(counts.numel()));
    for (int64_t e = 0; e < counts.numel(); ++e)
      load[e] = counts.index(e);
  });
  if (!status.ok())
    return status;
  lastLoss = executor.loss();
  return lastLoss;
}

StepStats Trainer::optimizerStep() {
  const plan::Optimizer &optimizer = executor.planProto().optimizer();
  std::vector<std::pair<const float *, int64_t>> grads;
  for (const Tensor &t : tensors)
    grads.emplace_back(data(t.grad), numel(t.grad));
  StepStats stats;
  stats.gradNorm = globalNorm(grads);
  double factor = clipFactor(stats.gradNorm, optimizer.max_grad_norm());
  stats.lr = learningRate(optimizer, steps);
  for (const Tensor &t : tensors) {
    float *g = data(t.grad);
    if (factor != 1.0)
      for (int64_t i = 0; i < numel(t.grad); ++i)
        g[i] = static_cast<float>(g[i] * factor);
    adamwUpdate(optimizer, stats.lr, steps, data(t.param), g, data(t.m), data(t.v), numel(t.param));
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
    TensorRef param = executor.buffer(t.param);
    size_t bytes = static_cast<size_t>(param.numel()) * sizeof(float);
    std::pair<std::string, uint32_t> parts[] = {{t.name, t.param}, {t.name + ".adam_m", t.m}, {t.name + ".adam_v", t.v}};
    for (auto &[name, buffer] : parts)
      if (absl::Status s = writer.add(name, weights::DType::F32, param.shape, data(buffer), bytes); !s.ok())
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
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a MoEC training checkpoint (no moec_checkpoint/step metadata)"));
  for (const Tensor &t : tensors) {
    std::pair<std::string, uint32_t> parts[] = {{t.name, t.param}, {t.name + ".adam_m", t.m}, {t.name + ".adam_v", t.v}};
    for (auto &[name, buffer] : parts) {
      const weights::TensorInfo *info = (*file)->find(name);
      size_t bytes = static_cast<size_t>(numel(buffer)) * sizeof(float);
      if (!info || info->dtype != weights::DType::F32 || info->numBytes() != bytes)
        return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", name,
                                                       "' is missing or does not match the plan (f32, ", numel(buffer),
                                                       " values); was the checkpoint written for another plan?"));
      std::memcpy(data(buffer), (*file)->data(*info).data(), bytes);
    }
  }
  steps = std::stoll(step->second);
  extra = metadata;
  return absl::OkStatus();
}

} // namespace moec::runtime
