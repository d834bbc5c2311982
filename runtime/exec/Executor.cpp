//===- Executor.cpp - runs one rank of a plan on a backend ----------------===//

#include "runtime/exec/Executor.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/plan/PlanFormat.h"
#include "runtime/plan/PlanValidator.h"

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
  if (!step.origin().empty())
    absl::StrAppend(&name, " [", step.origin(), "]");
  return name;
}

} // namespace

absl::StatusOr<std::unique_ptr<Executor>> Executor::create(const plan::Plan &plan, int rank,
                                                           const KernelRegistry &kernels,
                                                           ThreadPool *pool) {
  if (absl::Status valid = plan::validatePlan(plan); !valid.ok())
    return valid;
  if (rank < 0 || rank >= plan.ranks_size())
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is not in the plan (", plan.ranks_size(), " ranks)"));
  std::unique_ptr<Executor> executor(new Executor());
  executor->plan = &plan;
  executor->rankProto = &plan.ranks(rank);
  executor->pool = pool;
  const plan::Rank &r = plan.ranks(rank);

  std::vector<std::string> missing;
  for (const plan::Step &step : r.steps()) {
    if (!step.has_launch()) {
      if (step.has_collective())
        return absl::UnimplementedError("collectives need the NCCL backend; this executor runs one rank");
      executor->stepKernels.push_back(nullptr);
      continue;
    }
    const KernelFn *fn = kernels.find(step.launch().kernel());
    if (!fn && std::find(missing.begin(), missing.end(), step.launch().kernel()) == missing.end())
      missing.push_back(step.launch().kernel());
    executor->stepKernels.push_back(fn);
  }
  if (!missing.empty())
    return absl::UnimplementedError(
        absl::StrCat("the backend has no kernel for: ", absl::StrJoin(missing, ", ")));

  for (const plan::Arena &arena : r.arenas())
    executor->arenas[arena.role()].assign(static_cast<size_t>(arena.size_bytes()), 0);
  for (const plan::Buffer &buffer : r.buffers())
    executor->byName.emplace(buffer.name(), buffer.id());
  return executor;
}

TensorRef Executor::buffer(uint32_t id) const {
  const plan::Buffer &b = rankProto->buffers(static_cast<int>(id));
  TensorRef ref;
  ref.dtype = b.dtype();
  ref.shape.assign(b.shape().begin(), b.shape().end());
  // Arenas are never resized after create(), so the pointer stays valid.
  auto &arena = const_cast<std::vector<uint8_t> &>(arenas.at(b.role()));
  ref.data = arena.data() + b.offset();
  return ref;
}

std::optional<uint32_t> Executor::findBuffer(const std::string &name) const {
  auto it = byName.find(name);
  if (it == byName.end())
    return std::nullopt;
  return it->second;
}

absl::Status Executor::bindWeights(weights::Checkpoint &checkpoint) {
  for (const plan::WeightBinding &binding : rankProto->weights()) {
    const plan::Buffer &b = rankProto->buffers(static_cast<int>(binding.buffer()));
    std::optional<weights::DType> dtype = weightsDType(b.dtype());
    if (!dtype)
      return absl::InvalidArgumentError(absl::StrCat("buffer '", b.name(), "' has an unsupported dtype"));
    TensorRef dst = buffer(binding.buffer());
    weights::Slice slice;
    for (const plan::Slice::Range &range : binding.slice().dims()) {
      slice.start.push_back(range.start());
      slice.size.push_back(range.size());
    }
    absl::Status status;
    std::vector<int64_t> shape(b.shape().begin(), b.shape().end());
    if (binding.tensor().find("{expert}") != std::string::npos) {
      std::vector<int64_t> expertShape(shape.begin() + 1, shape.end());
      status = checkpoint.readExperts(binding.tensor(), binding.first_expert(), shape[0], slice,
                                      expertShape, *dtype, dst.data, b.size_bytes());
    } else if (!slice.start.empty()) {
      status = checkpoint.readSlice(binding.tensor(), slice, *dtype, dst.data, b.size_bytes());
    } else {
      status = checkpoint.readInto(binding.tensor(), shape, *dtype, dst.data, b.size_bytes());
    }
    if (!status.ok())
      return absl::Status(status.code(), absl::StrCat("binding weight '", binding.tensor(), "' from ",
                                                      checkpoint.path(), ": ", status.message()));
  }
  return absl::OkStatus();
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
    std::memcpy(dst.data, values->data(), values->size() * sizeof(int64_t));
  }
  return absl::OkStatus();
}

void Executor::zeroGradients() {
  auto it = arenas.find(plan::GRADIENT);
  if (it != arenas.end())
    std::fill(it->second.begin(), it->second.end(), 0);
}

absl::Status Executor::run(const std::function<void(int)> &afterStep) {
  for (int s = 0; s < rankProto->steps_size(); ++s) {
    const plan::Step &step = rankProto->steps(s);
    if (step.has_launch()) {
      const plan::Launch &launch = step.launch();
      KernelContext ctx;
      ctx.kernel = launch.kernel();
      ctx.attrs = &launch.attrs();
      ctx.seqLen = plan->seq_len();
      ctx.microBatch = plan->micro_batch();
      ctx.pool = pool;
      for (uint32_t id : launch.inputs())
        ctx.inputs.push_back(buffer(id));
      // Outputs reuse memory: kernels write into zeroes, except accumulate_grad, which adds.
      bool accumulates = launch.kernel() == "accumulate_grad";
      for (uint32_t id : launch.outputs()) {
        ctx.outputs.push_back(buffer(id));
        if (!accumulates)
          std::memset(ctx.outputs.back().data, 0,
                      static_cast<size_t>(rankProto->buffers(static_cast<int>(id)).size_bytes()));
      }
      try {
        (*stepKernels[s])(ctx);
      } catch (const KernelError &error) {
        return absl::InternalError(absl::StrCat(stepName(s, step), ": ", error.what()));
      }
    }
    if (afterStep)
      afterStep(s);
  }
  return absl::OkStatus();
}

float Executor::loss() const {
  std::optional<uint32_t> id = findBuffer("loss");
  return id ? *buffer(*id).f32() : 0.0f;
}

} // namespace moec::runtime
