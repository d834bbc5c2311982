//===- moe_align.cpp - MoEC against the Hugging Face golden references ----===//
//
//   moe-align DIR [--backend cpu|cuda] [--dtype float32|bfloat16] [--golden FILE]
//             [--plan PLAN [--base-plan UNFUSED_PLAN] | --recompute POLICY]
//             [--bf16-spread FILE] [--cpu-threads N] [--dump FILE]
//
// DIR holds config.json, model.safetensors, adapter/ and golden.safetensors
// (../shared/golden/README.md). Compiles the config with the adapter's
// settings for the golden batch (by running moec, or takes --plan: the
// runtime never links MLIR), runs the plan on the chosen backend, and
// prints one line per golden tensor: name, max abs error, relative error
// ||ours - ref|| / ||ref||, PASS/FAIL; exits 1 if any fails. Tolerances
// (DESIGN.md): relative 1e-4 for hidden states and logits, absolute 1e-5 for
// losses, relative 1e-3 for gradients and parameters after AdamW; in
// bfloat16 storage, relative 2e-2 for every tensor.
//
// bfloat16 runs compare with --golden, the reference recomputed on the golden
// weights rounded to bf16 (tests/golden/bf16/<family>.safetensors, made by
// make_reference.py): rounding the weights alone moves some LoRA gradients of
// the tiny golden models 2-10% from the float32 reference, whatever the
// kernels do. On the CPU, bf16 storage is emulated (runtime/exec/Executor.h).
// --bf16-spread takes transformers' own bf16 run of the recipe on the same
// weights (tests/golden/bf16/<family>.transformers_bf16.safetensors): where
// that run is itself further than 2e-2 from the reference, a tensor's
// tolerance is twice its distance (tests/golden/Comparison.h). In bf16 an
// element whose reference gradient is below 2e-2 of its tensor's RMS has a
// sign bf16 cannot decide: after AdamW it is held to 6 lr, like the float32
// check's elements below 1e-4 of the RMS.
//
// Three runs: the base model (every lora_B zeroed, which makes the adapted
// model equal the base one) for hidden states, logits and loss; the adapter
// for its loss and gradients; three AdamW steps (lr 1e-3, no decay, no
// clipping, constant schedule). The base run uses a plan compiled with
// --no-fuse: fused with the loss (moec's default, --moe-fuse), the LM head
// never writes the [tokens, vocab] logits, so there would be none to compare.
// The adapter runs use the default, fused plan: its loss and gradients are
// what training computes. With --plan, every run uses that plan (a fused one
// has no logits line) unless --base-plan gives the base run its own (unfused).
// --recompute compiles with that policy (moec --recompute: none, regather,
// per-layer): what the backward saves or recomputes must not change a number;
// --fused-expert-backward compiles with moec's flag of that name (one
// backward for each expert MLP and its combine).
//
//===----------------------------------------------------------------------===//

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <unistd.h>

#include "runtime/backends/cuda/CudaDevice.h"
#include "runtime/exec/Executor.h"
#include "runtime/train/Trainer.h"
#include "runtime/weights/Checkpoint.h"
#include "runtime/weights/Safetensors.h"
#include "runtime/weights/SafetensorsWriter.h"
#include "runtime/plan/PlanIO.h"
#include "runtime/tools/Args.h"
#include "runtime/tools/Moec.h"
#include "tests/golden/Comparison.h"

using namespace moec;
using namespace moec::runtime;

namespace {

int fail(const std::string &message) {
  std::cerr << "moe-align: error: " << message << "\n";
  return 2;
}

/// The golden tensors, as f32 or int64.
struct Golden {
  std::unique_ptr<weights::SafetensorsFile> file;
  std::vector<float> floats(const std::string &name) const {
    std::vector<float> out;
    if (const weights::TensorInfo *info = file->find(name)) {
      out.resize(static_cast<size_t>(info->numElements()));
      (void)weights::convertElements(file->data(*info).data(), info->dtype, out.data(),
                                     weights::DType::F32, out.size());
    }
    return out;
  }
  std::vector<int64_t> ints(const std::string &name) const {
    std::vector<int64_t> out;
    if (const weights::TensorInfo *info = file->find(name)) {
      out.resize(static_cast<size_t>(info->numElements()));
      std::memcpy(out.data(), file->data(*info).data(), out.size() * sizeof(int64_t));
    }
    return out;
  }
};

std::string withoutDefault(std::string name) {
  size_t at = name.find(".default.");
  if (at != std::string::npos)
    name.erase(at, strlen(".default"));
  return name;
}

/// In bf16, a gradient element below this share of its tensor's RMS has a sign bf16 cannot decide.
constexpr double kBf16NoiseLevel = 2e-2;

/// Which elements of a gradient are below `level` of its RMS: after AdamW, their parameters may
/// move either way (AdamW moves by about lr * sign(gradient)).
std::vector<bool> noiseLevelElements(const std::vector<float> &grad, double level) {
  double rms = 0;
  for (float g : grad)
    rms += static_cast<double>(g) * g;
  rms = std::sqrt(rms / std::max<size_t>(grad.size(), 1));
  std::vector<bool> noise(grad.size());
  for (size_t i = 0; i < grad.size(); ++i)
    noise[i] = std::abs(grad[i]) < level * rms;
  return noise;
}

/// Transformers' bf16 run's relative distance from the reference, per floating tensor the
/// reference has (Comparison::spread).
absl::StatusOr<std::map<std::string, double>> spreadFrom(const std::string &path, const Golden &golden) {
  auto file = weights::SafetensorsFile::open(path);
  if (!file.ok())
    return file.status();
  Golden run{std::move(*file)};
  std::map<std::string, double> spread;
  for (const weights::TensorInfo &info : golden.file->tensors()) {
    if (info.dtype == weights::DType::I64)
      continue; // input_ids, labels
    const weights::TensorInfo *theirs = run.file->find(info.name);
    if (!theirs || theirs->numElements() != info.numElements())
      return absl::InvalidArgumentError(path + ": tensor '" + info.name + "' " +
                                        (theirs ? "has another size than the reference's" : "is missing") +
                                        " (expected transformers' bf16 run of the same recipe: "
                                        "make_reference.py --compute bf16)");
    std::vector<float> values = run.floats(info.name), ref = golden.floats(info.name);
    // After AdamW, elements whose gradient is bf16 noise are held to 6 lr, not to the relative
    // error (main below): they do not count in the noise floor either.
    if (info.name.rfind("lora.after3.", 0) == 0) {
      std::vector<bool> noise = noiseLevelElements(
          golden.floats("lora.grad." + info.name.substr(strlen("lora.after3."))), kBf16NoiseLevel);
      for (size_t i = 0; i < noise.size() && i < ref.size(); ++i)
        if (noise[i])
          values[i] = ref[i];
    }
    spread[info.name] = Comparison::relative(values, ref);
  }
  return spread;
}

} // namespace

int main(int argc, char **argv) {
  Args args(argc, argv, 1);
  std::string planPath = args.get("plan"), basePlanPath = args.get("base-plan"),
              backend = args.get("backend", "cpu"),
              dtype = args.get("dtype", "float32"), dumpPath = args.get("dump"),
              goldenPath = args.get("golden"), recompute = args.get("recompute"),
              spreadPath = args.get("bf16-spread");
  int64_t cpuThreads = 0;
  bool fusedExperts = false;
  std::string error;
  if (!args.integer("cpu-threads", 0, cpuThreads, error) || !args.flag("fused-expert-backward", fusedExperts, error))
    return fail(error);
  if (auto unknown = args.unknown(); !unknown.empty())
    return fail("unknown flag(s): " + unknown.front());
  if (!basePlanPath.empty() && planPath.empty())
    return fail("--base-plan goes with --plan (without --plan, moe-align compiles both)");
  if ((!recompute.empty() || fusedExperts) && !planPath.empty())
    return fail("--recompute and --fused-expert-backward are for the plans moe-align compiles, not with --plan");
  if (args.positional.size() != 1)
    return fail("usage: moe-align DIR [--backend cpu|cuda] [--dtype float32|bfloat16] [--golden FILE] "
                "[--plan PLAN [--base-plan UNFUSED_PLAN] | --recompute POLICY --fused-expert-backward] "
                "[--bf16-spread FILE] [--cpu-threads N] [--dump FILE]");
  std::string dir = args.positional[0];
  if (dtype != "float32" && dtype != "bfloat16")
    return fail("--dtype must be float32 or bfloat16, got '" + dtype + "'");
  bool bf16 = dtype == "bfloat16";
  if (!spreadPath.empty() && !bf16)
    return fail("--bf16-spread is for --dtype bfloat16 runs");

  if (goldenPath.empty()) {
    goldenPath = dir + "/golden.safetensors";
    if (bf16)
      std::printf("note: comparing bf16 storage with the float32 reference; the bf16-weight reference "
                  "(--golden tests/golden/bf16/<family>.safetensors) separates weight rounding from the "
                  "kernels\n");
  }
  Golden golden;
  auto goldenFile = weights::SafetensorsFile::open(goldenPath);
  if (!goldenFile.ok())
    return fail(std::string(goldenFile.status().message()));
  golden.file = std::move(*goldenFile);
  const weights::TensorInfo *idsInfo = golden.file->find("input_ids");
  if (!idsInfo || idsInfo->shape.size() != 2)
    return fail(goldenPath + ": input_ids [batch, seq] is missing");
  int64_t batch = idsInfo->shape[0], seq = idsInfo->shape[1];
  std::map<std::string, double> spread;
  if (!spreadPath.empty()) {
    absl::StatusOr<std::map<std::string, double>> read = spreadFrom(spreadPath, golden);
    if (!read.ok())
      return fail(std::string(read.status().message()));
    spread = std::move(*read);
  }

  // Compile (unless given a plan): the adapter's targets, the golden batch, the golden optimizer;
  // once with the LM head fused with the loss (training) and once without (the logits).
  // A directory of our own: tests run in parallel may share /tmp and, sandboxed, their pids.
  std::string tempDir;
  if (planPath.empty()) {
    tempDir = (std::filesystem::temp_directory_path() / "moe-align-XXXXXX").string();
    if (!mkdtemp(tempDir.data()))
      return fail("cannot create a temporary directory for the plans: " + std::string(std::strerror(errno)));
  }
  auto compile = [&](bool fuse) -> absl::StatusOr<plan::Plan> {
    if (!planPath.empty())
      return plan::loadPlan(fuse ? planPath : basePlanPath);
    std::string planFile = tempDir + (fuse ? "/fused.moeplan" : "/unfused.moeplan");
    std::vector<std::string> moecArgs = {dir + "/config.json", "--adapter", dir + "/adapter", "--seq-len",
                                         std::to_string(seq), "--micro-batch", std::to_string(batch), "--lr",
                                         "1e-3", "--warmup-steps", "0", "--schedule", "constant",
                                         "--max-grad-norm", "0", "--weight-decay", "0", "--dtype", dtype,
                                         "-o", planFile};
    if (!fuse)
      moecArgs.push_back("--no-fuse");
    if (!recompute.empty())
      moecArgs.insert(moecArgs.end(), {"--recompute", recompute});
    if (fusedExperts)
      moecArgs.push_back("--fused-expert-backward");
    if (absl::Status compiled = runMoecCompile(moecArgs); !compiled.ok())
      return compiled;
    return plan::loadPlan(planFile);
  };
  std::vector<absl::StatusOr<plan::Plan>> plans;
  plans.push_back(compile(/*fuse=*/true));
  if (planPath.empty() || !basePlanPath.empty())
    plans.push_back(compile(/*fuse=*/false));
  if (planPath.empty())
    std::filesystem::remove_all(tempDir);
  for (absl::StatusOr<plan::Plan> &plan : plans) {
    if (!plan.ok())
      return fail(std::string(plan.status().message()));
    if (plan->seq_len() != seq || plan->micro_batch() != batch)
      return fail((planPath.empty() ? std::string("the compiled plan") : planPath) + " is for " +
                  std::to_string(plan->micro_batch()) + " x " + std::to_string(plan->seq_len()) +
                  " tokens; the golden batch is " + std::to_string(batch) + " x " + std::to_string(seq));
  }

  std::unique_ptr<Device> device;
  if (backend == "cuda") {
    absl::StatusOr<std::unique_ptr<Device>> gpu = cuda::makeCudaDevice(0);
    if (!gpu.ok())
      return fail(std::string(gpu.status().message()));
    device = std::move(*gpu);
  } else if (backend == "cpu") {
    device = makeCpuDevice(static_cast<int>(cpuThreads));
  } else {
    return fail("--backend must be cpu or cuda, got '" + backend + "'");
  }
  std::printf("%s on %s, %s storage\n", dir.c_str(), device->name().c_str(), dtype.c_str());
  auto checkpoint = weights::Checkpoint::open(dir);
  if (!checkpoint.ok())
    return fail(std::string(checkpoint.status().message()));
  // One executor per plan: [0] trains (fused), [1] (when compiled here) reads the logits.
  std::vector<std::unique_ptr<Executor>> executors;
  std::vector<std::unique_ptr<Trainer>> trainers;
  for (absl::StatusOr<plan::Plan> &plan : plans) {
    auto executor = Executor::create(*plan, 0, *device);
    if (!executor.ok())
      return fail(std::string(executor.status().message()));
    if (absl::Status bound = (*executor)->bindWeights(**checkpoint); !bound.ok())
      return fail(std::string(bound.message()));
    executors.push_back(std::move(*executor));
    trainers.push_back(std::make_unique<Trainer>(*executors.back()));
  }
  std::unique_ptr<Executor> &baseExecutor = executors.back();
  Trainer &baseTrainer = *trainers.back(), &trainer = *trainers.front();
  const plan::Plan *plan = &*plans.front();

  auto adapterFile = weights::SafetensorsFile::open(dir + "/adapter/adapter_model.safetensors");
  if (!adapterFile.ok())
    return fail(std::string(adapterFile.status().message()));
  std::map<std::string, std::vector<float>> adapter, baseAdapter;
  for (const weights::TensorInfo &info : (*adapterFile)->tensors()) {
    std::vector<float> &values = adapter[info.name];
    values.resize(static_cast<size_t>(info.numElements()));
    (void)weights::convertElements((*adapterFile)->data(info).data(), info.dtype, values.data(),
                                   weights::DType::F32, values.size());
    baseAdapter[info.name] = info.name.find(".lora_B.") != std::string::npos
                                 ? std::vector<float>(values.size(), 0.0f)
                                 : values;
  }

  Batch inputs;
  inputs.ids = golden.ints("input_ids");
  inputs.labels = golden.ints("labels");
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < seq; ++t)
      inputs.positions.push_back(t);

  // 1. The base model: hidden states (0 = embeddings, i = layer i-1's output, the last is
  //    after the final norm, as transformers' output_hidden_states), logits, loss.
  int64_t layers = 0;
  while (golden.file->find("hidden_states." + std::to_string(layers + 1)))
    ++layers;
  std::map<std::string, std::string> goldenOf = {{"embeddings", "hidden_states.0"},
                                                 {"final_norm", "hidden_states." + std::to_string(layers)},
                                                 {"logits", "logits"}};
  for (int64_t i = 1; i < layers; ++i)
    goldenOf["layer_output." + std::to_string(i - 1)] = "hidden_states." + std::to_string(i);
  std::map<uint32_t, std::string> watched;
  for (const auto &[ours, ref] : goldenOf)
    if (auto id = baseExecutor->findBuffer(ours))
      watched[*id] = ref;
  std::map<std::string, std::vector<float>> captured;
  if (absl::Status s = baseTrainer.setAdapter(baseAdapter); !s.ok())
    return fail(std::string(s.message()));
  if (absl::Status s = baseExecutor->setInputs(inputs.ids, inputs.positions, inputs.labels); !s.ok())
    return fail(std::string(s.message()));
  if (absl::Status s = baseExecutor->zeroGradients(); !s.ok())
    return fail(std::string(s.message()));
  const plan::Rank &rank = baseExecutor->rankPlan();
  absl::Status ran = baseExecutor->run([&](int s) {
    if (!rank.steps(s).has_launch())
      return;
    for (uint32_t id : rank.steps(s).launch().outputs())
      if (auto it = watched.find(id); it != watched.end())
        if (absl::StatusOr<std::vector<float>> values = baseExecutor->readFloats(id); values.ok())
          captured[it->second] = std::move(*values);
  });
  if (!ran.ok())
    return fail(std::string(ran.message()));
  absl::StatusOr<float> baseLoss = baseExecutor->loss();
  if (!baseLoss.ok())
    return fail(std::string(baseLoss.status().message()));
  Comparison compare;
  compare.bf16 = bf16;
  compare.spread = std::move(spread);
  for (int64_t i = 0; i <= layers; ++i) {
    std::string name = "hidden_states." + std::to_string(i);
    compare.check(name, captured[name], golden.floats(name), 1e-4, 0);
  }
  if (baseExecutor->findBuffer("logits"))
    compare.check("logits", captured["logits"], golden.floats("logits"), 1e-4, 0);
  else // only a --plan compiled without --no-fuse gets here
    std::printf("%-90s  not in the plan (the LM head is fused with the loss): compile it with --no-fuse\n",
                "logits");
  compare.check("loss", {*baseLoss}, golden.floats("loss"), 0, 1e-5);

  // 2. With the adapter: loss and the gradient of every LoRA parameter.
  if (absl::Status s = trainer.setAdapter(adapter); !s.ok())
    return fail(std::string(s.message()));
  std::vector<float> losses;
  for (int step = 0; step < 3; ++step) {
    absl::StatusOr<float> loss = trainer.forwardBackward(inputs);
    if (!loss.ok())
      return fail(std::string(loss.status().message()));
    losses.push_back(*loss);
    if (step == 0) {
      compare.check("lora.loss", {*loss}, golden.floats("lora.loss"), 0, 1e-5);
      absl::StatusOr<std::map<std::string, std::vector<float>>> grads = trainer.gradients();
      if (!grads.ok())
        return fail(std::string(grads.status().message()));
      for (const weights::TensorInfo &info : golden.file->tensors())
        if (info.name.rfind("lora.grad.", 0) == 0)
          compare.check(info.name, (*grads)[withoutDefault(info.name.substr(strlen("lora.grad.")))],
                        golden.floats(info.name), 1e-3, 0);
    }
    if (absl::StatusOr<StepStats> stepped = trainer.optimizerStep(); !stepped.ok())
      return fail(std::string(stepped.status().message()));
  }
  // 3. Three AdamW steps: the loss before each, the parameters after them.
  compare.check("lora.adamw_losses", losses, golden.floats("lora.adamw_losses"), 0, 1e-5);
  // AdamW moves a parameter by about lr * sign(gradient) whenever |gradient| >> eps, so an
  // element whose reference gradient is at the rounding noise of its tensor (below 1e-4 of
  // the tensor's RMS gradient, 2e-2 in bf16: the gradients' tolerance) can legitimately move
  // either way: those elements are held to 2 lr per step instead, and the line says how many
  // there were.
  absl::StatusOr<std::map<std::string, std::vector<float>>> adapted = trainer.adapter();
  if (!adapted.ok())
    return fail(std::string(adapted.status().message()));
  std::map<std::string, std::vector<float>> &after = *adapted;
  for (const weights::TensorInfo &info : golden.file->tensors()) {
    if (info.name.rfind("lora.after3.", 0) != 0)
      continue;
    std::string suffix = info.name.substr(strlen("lora.after3."));
    std::vector<float> ours = after[withoutDefault(suffix)], ref = golden.floats(info.name);
    std::vector<bool> noise =
        noiseLevelElements(golden.floats("lora.grad." + suffix), bf16 ? kBf16NoiseLevel : 1e-4);
    int noisy = 0;
    bool noisyOk = true;
    for (size_t i = 0; i < noise.size() && i < ours.size() && i < ref.size(); ++i)
      if (noise[i]) {
        ++noisy;
        noisyOk &= std::abs(ours[i] - ref[i]) <= 2 * 3 * plan->optimizer().lr();
        ours[i] = ref[i]; // judged above, not in the relative error
      }
    std::string name = info.name;
    if (noisy)
      name += " (" + std::to_string(noisy) + (noisyOk ? " noise-level gradient(s) within 6 lr)"
                                                      : " noise-level gradient(s) NOT within 6 lr)");
    compare.check(name, ours, ref, 1e-3, 0);
    if (!noisyOk)
      ++compare.failures;
  }

  if (!dumpPath.empty()) {
    weights::SafetensorsWriter writer;
    for (const auto &[name, values] : compare.ours)
      (void)writer.add(name, weights::DType::F32, {static_cast<int64_t>(values.size())}, values.data(),
                       values.size() * sizeof(float));
    if (absl::Status s = writer.write(dumpPath); !s.ok())
      return fail(std::string(s.message()));
  }
  std::printf("%s: %d of %d golden tensors within tolerance\n", dir.c_str(), compare.lines - compare.failures,
              compare.lines);
  return compare.failures ? 1 : 0;
}
