//===- moe-run.cpp - the MoEC runtime driver -------------------------------===//
//
//   moe-run train --plan P (--model DIR | --random-weights SEED) --data FILE [--out DIR] [--steps N] [--adapter DIR]
//                 [--checkpoint-every N] [--resume] [--seed S] [--in-order] [--threads N] [--log-every N]
//                 [--backend cpu|cuda|auto] [--nproc N [--ranks-on-one-gpu]]
//   moe-run forward --plan P --model DIR --data FILE [--adapter DIR] [--batches N]
//   moe-run bench --plan P (--model DIR | --random-weights SEED) [--steps N] [--warmup N] [--nproc N]
//   moe-run init CONFIG.json [--seed S] -o DIR [--plan P]
//
// Runs plans that `moec compile` wrote, on the CPU or a GPU. Never links MLIR:
// `init` without --plan asks moec (next to this binary, or $MOEC) for one.
//
// A plan for several ranks (moec --mesh) runs one rank per GPU process: under
// torchrun, Slurm or Open MPI (their variables say which rank this is), or
// with `--nproc N`, which starts the N local processes itself. On the CPU,
// `--nproc N` runs the ranks as threads of this process; with --backend cuda
// --ranks-on-one-gpu too, every thread rank on GPU 0 with the CPU collectives
// staged through host memory (a multi-GPU plan checked on one GPU: its
// kernels and results, not its speed). Rank 0 prints and
// writes the checkpoint, metrics and adapter; every rank reads its own share of
// each global batch (micro_batch sequences of the plan per data shard).
//
//===----------------------------------------------------------------------===//

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/data/DataLoader.h"
#include "runtime/backends/cuda/CudaDevice.h"
#include "runtime/exec/Executor.h"
#include "runtime/init/RandomModel.h"
#include "runtime/peft/Adapter.h"
#include "runtime/plan/PlanFormat.h"
#include "runtime/plan/PlanIO.h"
#include "runtime/tools/Args.h"
#include "runtime/tools/Moec.h"
#include "runtime/tools/Ranks.h"
#include "runtime/train/Trainer.h"
#include "runtime/weights/Checkpoint.h"

namespace fs = std::filesystem;
using namespace moec::runtime;

namespace {

std::atomic<bool> interrupted{false};

int fail(const std::string &message) {
  std::cerr << ("moe-run: error: " + message + "\n"); // one write: thread ranks may fail at once
  return 1;
}

std::string formatDuration(double seconds) {
  int s = static_cast<int>(seconds + 0.5);
  if (s >= 3600)
    return absl::StrCat(s / 3600, "h", (s % 3600) / 60, "m");
  if (s >= 60)
    return absl::StrCat(s / 60, "m", s % 60, "s");
  return absl::StrCat(s, "s");
}

/// The vocabulary size: the rows of the embedding table the plan reads.
int64_t vocabularySize(const moec::plan::Plan &plan) {
  const moec::plan::Rank &rank = plan.ranks(0);
  for (const moec::plan::Step &step : rank.steps())
    if (step.has_launch() && step.launch().kernel() == "embedding" && step.launch().inputs_size() == 2)
      return rank.buffers(static_cast<int>(step.launch().inputs(1))).shape(0);
  return 0;
}

/// The backend a run executes on; `auto` takes the GPU when there is one and says which it took.
/// Which rank of the plan this call runs, and how it reaches the others.
struct RankSetup {
  int rank = 0, world = 1;
  int gpu = 0;                             // the CUDA ordinal: LOCAL_RANK for process ranks
  CpuRanks *threads = nullptr;             // thread ranks of this process
  bool oneGpu = false;                     // thread ranks sharing GPU 0 (--ranks-on-one-gpu)
  std::optional<comm::LaunchEnv> process;  // a process rank (NCCL)
  bool lead() const { return rank == 0; }
};

/// How long a rank waits for the others (NCCL and CPU collectives, the store).
constexpr double kRankTimeoutSeconds = 600;

absl::StatusOr<std::unique_ptr<Device>> openDevice(const std::string &backend, int threads, int gpu) {
  if (backend == "cpu")
    return makeCpuDevice(threads);
  if (backend == "cuda")
    return cuda::makeCudaDevice(gpu);
  if (backend == "auto") {
    absl::StatusOr<std::unique_ptr<Device>> device = cuda::makeCudaDevice(gpu);
    if (device.ok()) {
      std::cerr << "moe-run: --backend auto: " << (*device)->name() << "\n";
      return device;
    }
    std::unique_ptr<Device> cpu = makeCpuDevice(threads);
    std::string why(device.status().message());
    why = why.substr(0, why.find("; use --backend cpu")); // the advice is what auto just did
    std::cerr << "moe-run: --backend auto: " << cpu->name() << " (" << why << ")\n";
    return cpu;
  }
  return absl::InvalidArgumentError("--backend must be cpu, cuda or auto, got '" + backend + "'");
}

/// Everything a run needs: the plan, the device, the executor with weights bound.
struct Session {
  moec::plan::Plan plan;
  std::string planPath;
  std::unique_ptr<Device> device;
  std::unique_ptr<Executor> executor;
  std::unique_ptr<Trainer> trainer;
  RankLinks links; // after the executor: its collectives hold these communicators
  int rank = 0;
};

/// Random weights made on the device itself (fill_random per weight buffer), as
/// transformers would initialise them; no files for real-size models.
absl::Status randomWeights(Session &session, uint64_t seed, double initializerRange) {
  const moec::plan::Rank &rank = session.plan.ranks(session.rank);
  for (const moec::plan::WeightBinding &binding : rank.weights()) {
    std::string name = binding.tensor();
    if (binding.zeros()) { // another tp rank adds this bias
      const moec::plan::Buffer &buffer = rank.buffers(static_cast<int>(binding.buffer()));
      if (absl::Status s = session.executor->device().zero(session.executor->buffer(binding.buffer()).data,
                                                           static_cast<size_t>(buffer.size_bytes()));
          !s.ok())
        return s;
      continue;
    }
    google::protobuf::Map<std::string, moec::plan::Attr> attrs;
    const char *kinds[] = {"normal", "zeros", "ones", "a_log", "dt_bias"};
    attrs["kind"].set_s(kinds[static_cast<int>(init::initKindFor(name, session.plan.model_type()))]);
    attrs["std"].set_f(initializerRange);
    uint64_t hash = 1469598103934665603ull; // FNV-1a of the name: one stream per tensor
    for (unsigned char c : name)
      hash = (hash ^ c) * 1099511628211ull;
    attrs["stream"].set_i(static_cast<int64_t>(seed ^ hash));
    // An expert-parallel rank's part of a tensor: its elements where the whole tensor has them.
    const moec::plan::Buffer &buffer = rank.buffers(static_cast<int>(binding.buffer()));
    int64_t perRow = 1;
    for (int d = 1; d < buffer.shape_size(); ++d)
      perRow *= buffer.shape(d);
    if (binding.pieces_size() > 0) { // windows of the tensor's rows, each filled as the whole tensor has it
      int row = 0;
      for (const moec::plan::Slice &piece : binding.pieces()) {
        attrs["first_index"].set_i(piece.dims(0).start() * perRow);
        const int rows = static_cast<int>(piece.dims(0).size());
        if (absl::Status s = session.executor->launchOnRows("fill_random", binding.buffer(), row, rows, attrs); !s.ok())
          return absl::Status(s.code(), absl::StrCat("random weights for '", name, "': ", s.message()));
        row += rows;
      }
      continue;
    }
    int64_t firstRow = binding.first_expert();
    if (binding.slice().dims_size() > 0 && binding.experts_size() == 0 && name.find("{expert}") == std::string::npos)
      firstRow = binding.slice().dims(0).start();
    // A tensor-parallel rank's window of a tensor: split along one dimension d, it is a window
    // of columns of the tensor seen as [dims before d, dims from d] (per expert for "{expert}"
    // names and placed experts, whose slices leave out the expert dimension).
    const moec::plan::Slice &slice = binding.slice();
    int skip = name.find("{expert}") != std::string::npos || binding.experts_size() > 0 ? 1 : 0;
    int64_t expertElements = 0; // with a window: one expert's elements in the whole tensor
    if (binding.whole_shape_size() == slice.dims_size() && slice.dims_size() + skip == buffer.shape_size()) {
      int split = -1;
      for (int d = 0; d < slice.dims_size(); ++d)
        if (slice.dims(d).size() != binding.whole_shape(d))
          split = split < 0 ? d : -2;
      if (split == -2)
        return absl::UnimplementedError(absl::StrCat("random weights for '", name, "': split along two dimensions"));
      if (split >= 0) {
        int64_t columns = 1, whole = 1, inner = 1;
        for (int d = split; d < slice.dims_size(); ++d) {
          columns *= slice.dims(d).size();
          whole *= binding.whole_shape(d);
          if (d > split)
            inner *= binding.whole_shape(d);
        }
        attrs["columns"].set_i(columns);
        attrs["whole_columns"].set_i(whole);
        attrs["first_column"].set_i(slice.dims(split).start() * inner);
        // Experts: each expert's whole tensor comes before the next one's.
        expertElements = skip ? whole : 0;
        for (int d = 0; skip && d < split; ++d)
          expertElements *= binding.whole_shape(d);
      }
    }
    // Where row `row` of the buffer (an expert) starts in the whole tensor.
    int64_t rowElements = expertElements > 0 || attrs.count("whole_columns") ? expertElements : perRow;
    auto fail = [&](const absl::Status &s) {
      return absl::Status(s.code(), absl::StrCat("random weights for '", name, "': ", s.message()));
    };
    if (binding.experts_size() == 0) {
      attrs["first_index"].set_i(firstRow * rowElements);
      if (absl::Status s = session.executor->launch("fill_random", {}, {binding.buffer()}, attrs); !s.ok())
        return fail(s);
      continue;
    }
    // An expert placement: each row is the expert the placement puts there.
    for (int row = 0; row < binding.experts_size(); ++row) {
      attrs["first_index"].set_i(binding.experts(row) * rowElements);
      if (absl::Status s = session.executor->launchOnRows("fill_random", binding.buffer(), row, 1, attrs); !s.ok())
        return fail(s);
    }
  }
  return session.device->synchronize();
}

/// What to do when a plan's ranks and a run's differ.
std::string rankCountMismatch(const std::string &planPath, const moec::plan::Plan &plan, int world) {
  int ranks = plan.ranks_size();
  return absl::StrCat(planPath, " is for ", ranks, " ranks (mesh ", plan.mesh().dp(), "x", plan.mesh().tp(), "x",
                      plan.mesh().pp(), "x", plan.mesh().ep(), "), this run has ", world, ": ",
                      ranks > 1 ? absl::StrCat("start it with --nproc ", ranks,
                                               " (or a launcher: torchrun, srun, mpirun)")
                                : std::string("run it without --nproc"));
}

absl::Status openSession(Args &args, Session &session, const RankSetup &setup) {
  std::string planPath = args.get("plan"), modelDir = args.get("model"), random = args.get("random-weights");
  if (planPath.empty() || (modelDir.empty() == random.empty()))
    return absl::InvalidArgumentError("--plan PLAN and either --model DIR or --random-weights SEED are required");
  absl::StatusOr<moec::plan::Plan> plan = moec::plan::loadPlan(planPath);
  if (!plan.ok())
    return plan.status();
  session.plan = std::move(*plan);
  session.planPath = planPath;
  if (session.plan.ranks_size() != setup.world)
    return absl::InvalidArgumentError(rankCountMismatch(planPath, session.plan, setup.world));
  session.rank = setup.rank;
  int64_t threads = 0;
  std::string error;
  // Thread ranks share the cores.
  int64_t defaultThreads = setup.threads ? std::max<int64_t>(1, std::thread::hardware_concurrency() / setup.world) : 0;
  if (!args.integer("threads", defaultThreads, threads, error))
    return absl::InvalidArgumentError(error);
  absl::StatusOr<std::unique_ptr<Device>> device =
      openDevice(args.get("backend", "cpu"), static_cast<int>(threads), setup.gpu);
  if (!device.ok())
    return device.status();
  session.device = std::move(*device);
  absl::StatusOr<std::unique_ptr<Executor>> executor = Executor::create(session.plan, setup.rank, *session.device);
  if (!executor.ok())
    return absl::Status(executor.status().code(), absl::StrCat(planPath, ": ", executor.status().message()));
  session.executor = std::move(*executor);
  if (setup.world > 1) {
    if (setup.threads) {
      // Ranks sharing one GPU: the CPU collectives, through host memory.
      session.links = setup.threads->links(setup.rank, setup.oneGpu ? session.device.get() : nullptr);
    } else {
      absl::StatusOr<RankLinks> links =
          connectNccl(session.plan, *setup.process, session.device->stream(), kRankTimeoutSeconds,
                      /*storeServed=*/std::getenv("MOEC_STORE_SERVED") != nullptr);
      if (!links.ok())
        return links.status();
      session.links = std::move(*links);
    }
    if (absl::Status s = session.executor->setCommunicators(session.links.groups); !s.ok())
      return s;
  }
  if (!random.empty()) {
    int64_t seed = 0;
    double range = 0.02;
    if (!args.integer("random-weights", 0, seed, error))
      return absl::InvalidArgumentError(error);
    std::string rangeText = args.get("initializer-range", "0.02");
    char *end = nullptr;
    range = std::strtod(rangeText.c_str(), &end);
    if (*end != '\0' || !(range > 0))
      return absl::InvalidArgumentError("--initializer-range expects a positive number, got '" + rangeText + "'");
    if (absl::Status s = randomWeights(session, static_cast<uint64_t>(seed), range); !s.ok())
      return s;
  } else {
    absl::StatusOr<std::unique_ptr<weights::Checkpoint>> checkpoint = weights::Checkpoint::open(modelDir);
    if (!checkpoint.ok())
      return checkpoint.status();
    if (absl::Status bound = session.executor->bindWeights(**checkpoint); !bound.ok())
      return bound;
  }
  session.trainer = std::make_unique<Trainer>(*session.executor);
  session.trainer->setWorld(session.links.everyone);
  return absl::OkStatus();
}

/// Ends a process rank that makes no progress for `seconds` (a peer that died or hangs: NCCL
/// would wait in its kernel for ever) with a message naming the step being issued; the
/// launcher (--nproc, torchrun) then stops the others. MOEC_RANK_TIMEOUT overrides the time.
class Watchdog {
public:
  Watchdog(const Executor &executor, int rank, double seconds)
      : executor(executor), rank(rank), seconds(seconds), thread([this] { watch(); }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      done = true;
    }
    wake.notify_all();
    thread.join();
  }
  void beat(int64_t step) {
    std::lock_guard<std::mutex> lock(mutex);
    last = std::chrono::steady_clock::now();
    trainingStep = step;
  }

private:
  void watch() {
    std::unique_lock<std::mutex> lock(mutex);
    while (!wake.wait_for(lock, std::chrono::seconds(1), [this] { return done; })) {
      double idle = std::chrono::duration<double>(std::chrono::steady_clock::now() - last).count();
      if (idle < seconds)
        continue;
      std::fprintf(stderr,
                   "moe-run: rank %d: no progress for %.0f s in training step %lld, issuing %s (a rank that "
                   "stopped, or a collective that never completes); stopping\n",
                   rank, idle, static_cast<long long>(trainingStep + 1), executor.issuingStep().c_str());
      std::fflush(stderr);
      _exit(124);
    }
  }

  const Executor &executor;
  int rank;
  double seconds;
  std::mutex mutex;
  std::condition_variable wake;
  bool done = false;
  std::chrono::steady_clock::time_point last = std::chrono::steady_clock::now();
  int64_t trainingStep = 0;
  std::thread thread;
};

/// The watchdog of a process rank (thread ranks time out in the CPU communicator).
std::unique_ptr<Watchdog> watchdogFor(const Session &session, const RankSetup &setup) {
  if (!setup.process)
    return nullptr;
  double seconds = kRankTimeoutSeconds;
  if (const char *text = std::getenv("MOEC_RANK_TIMEOUT"); text && std::atof(text) > 0)
    seconds = std::atof(text);
  return std::make_unique<Watchdog>(*session.executor, setup.rank, seconds);
}

/// Whether any rank wants to stop (an interrupt reaches ranks at different steps; they
/// must all stop at the same one, or the others wait in a collective).
absl::StatusOr<bool> anyRankStops(Session &session, bool mine) {
  if (session.plan.ranks_size() == 1)
    return mine;
  absl::StatusOr<double> stops = session.trainer->sumOverRanks(mine ? 1 : 0, moec::plan::I64);
  if (!stops.ok())
    return stops.status();
  return *stops > 0;
}

/// The data shards: dp and ep ranks each see their own sequences.
int64_t dataShards(const moec::plan::Plan &plan) {
  return std::max(1, plan.mesh().dp()) * std::max(1, plan.mesh().ep());
}

/// The data shard `rank` trains on: its (dp, ep) coordinates, ep fastest (tp ranks and
/// pipeline stages share theirs).
int64_t dataShardOf(const moec::plan::Plan &plan, int rank) {
  return moec::plan::meshCoordinate(plan.mesh(), rank, "dp") * std::max(1, plan.mesh().ep()) +
         moec::plan::meshCoordinate(plan.mesh(), rank, "ep");
}

/// This rank's rows of a global batch (`shards` shards of `rows` sequences each).
Batch shardOf(const data::Batch &global, int64_t shard, int64_t rows, int64_t seq) {
  auto slice = [&](const std::vector<int64_t> &v) {
    return std::vector<int64_t>(v.begin() + shard * rows * seq, v.begin() + (shard + 1) * rows * seq);
  };
  return {slice(global.inputIds), slice(global.positions), slice(global.labels)};
}

/// The adapter in `dir`, checked against the plan's LoRA tensors.
absl::Status loadAdapter(const std::string &dir, Session &session) {
  // The LoRA tensors must be there; a module trained in full may be left out (an adapter of
  // LoRA tensors alone): it keeps the checkpoint's value.
  std::map<std::string, std::vector<int64_t>> expected, optional;
  for (const auto &[name, shape] : session.trainer->shapes())
    (peft::isLoraTensorName(name) || name.find(peft::kExpertPlaceholder) != std::string::npos ? expected : optional)[name] =
        shape;
  peft::ImportOptions options;
  options.expectedShapes = expected;
  options.optionalShapes = optional;
  absl::StatusOr<peft::Adapter> adapter = peft::importAdapter(dir, options);
  if (!adapter.ok())
    return adapter.status();
  // The scale alpha/r (or alpha/sqrt(r)) is compiled into the plan: it must be the adapter's.
  const moec::plan::LoraLayout &lora = session.plan.lora();
  if (adapter->spec.r != lora.r() || adapter->spec.loraAlpha != lora.alpha() ||
      adapter->spec.useRslora != lora.use_rslora())
    return absl::InvalidArgumentError(absl::StrCat(
        dir, "/adapter_config.json: r ", adapter->spec.r, ", lora_alpha ", adapter->spec.loraAlpha,
        ", use_rslora ", adapter->spec.useRslora ? "true" : "false", " differ from the plan's r ", lora.r(),
        ", alpha ", lora.alpha(), ", rslora ", lora.use_rslora() ? "true" : "false",
        "; compile the plan with `moec compile ... --adapter ", dir, "`"));
  std::map<std::string, std::vector<float>> values;
  for (const auto &[name, shape] : expected) {
    if (name.find("{expert}") == std::string::npos) {
      values[name] = adapter->tensors.at(name).data;
      continue;
    }
    absl::StatusOr<peft::AdapterTensor> stacked = adapter->readStacked(name, shape[0]);
    if (!stacked.ok())
      return stacked.status();
    values[name] = stacked->data;
  }
  for (const auto &[name, shape] : optional)
    if (auto found = adapter->tensors.find(name); found != adapter->tensors.end())
      values[name] = found->second.data;
  return session.trainer->setAdapter(values);
}

/// The PEFT adapter the plan's trained tensors make (checkpoint weights trained in full are
/// modules to save), checked before a step runs: a run must not train for hours, then fail
/// to write its result.
absl::StatusOr<peft::AdapterSpec> adapterSpecOf(const Session &session) {
  const moec::plan::LoraLayout &lora = session.plan.lora();
  peft::AdapterSpec spec;
  spec.r = lora.r();
  spec.loraAlpha = lora.alpha();
  spec.loraDropout = lora.dropout();
  spec.targetModules.assign(lora.target_modules().begin(), lora.target_modules().end());
  spec.useRslora = lora.use_rslora();
  spec.taskType = "CAUSAL_LM";
  std::map<std::string, std::vector<int64_t>> shapes = session.trainer->shapes();
  absl::StatusOr<std::vector<std::string>> modules = peft::modulesToSaveOf(shapes);
  if (modules.ok())
    spec.modulesToSave = std::move(*modules);
  // The checkpoint tensors the plan binds but does not train.
  std::vector<std::string> frozen;
  for (const moec::plan::Rank &rank : session.plan.ranks())
    for (const moec::plan::WeightBinding &binding : rank.weights())
      if (std::string name = peft::kPeftNamePrefix + binding.tensor(); !shapes.count(name))
        frozen.push_back(std::move(name));
  absl::Status checked = modules.ok() ? peft::checkAdapterTensors(spec, shapes, frozen) : modules.status();
  if (!checked.ok())
    return absl::InvalidArgumentError(absl::StrCat(session.planPath, ": its trained tensors make no PEFT adapter: ",
                                                   checked.message()));
  return spec;
}

/// On a pipeline every rank takes part (the stages' tensors are gathered); rank 0 writes.
absl::Status exportAdapter(const std::string &dir, Session &session, bool write) {
  absl::StatusOr<peft::AdapterSpec> spec = adapterSpecOf(session);
  if (!spec.ok())
    return spec.status();
  std::vector<peft::NamedTensor> tensors;
  if (!write && !session.trainer->gathers())
    return absl::OkStatus();
  absl::StatusOr<std::map<std::string, std::vector<float>>> values = session.trainer->adapter();
  if (!values.ok())
    return values.status();
  if (!write)
    return absl::OkStatus();
  for (const auto &[name, shape] : session.trainer->shapes())
    tensors.push_back({name, shape, (*values)[name]});
  return peft::exportAdapter(dir, *spec, tensors);
}

int64_t monotonicMs() { // async-signal-safe
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<int64_t>(now.tv_sec) * 1000 + now.tv_nsec / 1000000;
}

std::atomic<int64_t> firstSignalMs{0};

/// The first Ctrl-C (or SIGTERM) asks for a checkpoint and a clean stop; another one more than a
/// second later stops at once. Copies within that second are the same request delivered twice:
/// `timeout` and shells forward the signal to the child and to its process group.
void onSignal(int signal) {
  int64_t now = monotonicMs(), first = firstSignalMs.load();
  if (first == 0) {
    firstSignalMs = now;
    interrupted = true;
  } else if (now - first > 1000) {
    std::signal(signal, SIG_DFL);
    std::raise(signal); // delivered when the handler returns
  }
}

int runTrain(Args &args, const RankSetup &setup) {
  if (!args.positional.empty())
    return fail("unexpected argument '" + args.positional.front() + "' (flags start with --)");
  Session session;
  if (absl::Status s = openSession(args, session, setup); !s.ok())
    return fail(std::string(s.message()));
  bool lead = setup.lead();
  std::string dataPath = args.get("data"), out = args.get("out", "moe-run-out");
  if (dataPath.empty())
    return fail("--data FILE is required (JSON Lines or a MOETOKS1 token file)");
  int64_t steps = 0, checkpointEvery = 0, logEvery = 0, seed = 0;
  std::string error;
  if (!args.integer("steps", session.plan.optimizer().total_steps(), steps, error) ||
      !args.integer("checkpoint-every", 100, checkpointEvery, error) ||
      !args.integer("log-every", 10, logEvery, error) || !args.integer("seed", 0, seed, error))
    return fail(error);
  bool resume = false, inOrder = false;
  if (!args.flag("resume", resume, error) || !args.flag("in-order", inOrder, error))
    return fail(error);
  std::string adapterDir = args.get("adapter");
  if (auto unknown = args.unknown(); !unknown.empty())
    return fail("unknown flag(s): " + absl::StrJoin(unknown, ", "));
  if (absl::StatusOr<peft::AdapterSpec> spec = adapterSpecOf(session); !spec.ok())
    return fail(std::string(spec.status().message()));

  absl::StatusOr<std::unique_ptr<data::Dataset>> dataset =
      data::Dataset::open(dataPath, vocabularySize(session.plan));
  if (!dataset.ok())
    return fail(std::string(dataset.status().message()));
  // Every rank reads the same global batches and trains on its shard of each.
  int64_t shards = dataShards(session.plan), shard = dataShardOf(session.plan, setup.rank);
  data::LoaderOptions loaderOptions;
  // A pipeline stage's step takes several micro-batches at once.
  int64_t rows = session.plan.micro_batch() * std::max<int64_t>(1, session.plan.micro_batches());
  loaderOptions.microBatch = rows * shards;
  loaderOptions.seqLen = session.plan.seq_len();
  loaderOptions.shuffle = !inOrder; // --in-order: the data's windows in file order (comparisons)
  loaderOptions.seed = static_cast<uint64_t>(seed);
  absl::StatusOr<std::unique_ptr<data::DataLoader>> loader =
      data::DataLoader::create(std::shared_ptr<const data::Dataset>(std::move(*dataset)), loaderOptions);
  if (!loader.ok())
    return fail(std::string(loader.status().message()));

  std::error_code ec;
  if (lead)
    fs::create_directories(out, ec);
  if (ec)
    return fail("cannot create " + out + ": " + ec.message());
  std::string checkpointPath = out + "/checkpoint.safetensors";
  if (resume && fs::exists(checkpointPath)) {
    std::map<std::string, std::string> extra;
    if (absl::Status s = session.trainer->loadCheckpoint(checkpointPath, extra); !s.ok())
      return fail(std::string(s.message()));
    absl::StatusOr<data::LoaderState> state = data::LoaderState::parse(extra["data_state"]);
    if (!state.ok())
      return fail(checkpointPath + ": " + std::string(state.status().message()));
    if (absl::Status s = (*loader)->restore(*state); !s.ok())
      return fail(checkpointPath + ": " + std::string(s.message()));
    if (lead)
      std::cerr << "moe-run: resumed from " << checkpointPath << " at step " << session.trainer->step() << "\n";
  } else if (!adapterDir.empty()) {
    if (absl::Status s = loadAdapter(adapterDir, session); !s.ok())
      return fail(std::string(s.message()));
  } else if (absl::Status s = session.trainer->initAdapter(static_cast<uint64_t>(seed)); !s.ok()) {
    return fail(std::string(s.message()));
  }
  // Rank 0 writes: every trained tensor is the same on every rank (replicated adapters).
  // Every rank must start from the same step (a checkpoint one rank cannot see would leave
  // the others waiting for it at the end).
  if (session.plan.ranks_size() > 1) {
    absl::StatusOr<double> steps = session.trainer->sumOverRanks(static_cast<double>(session.trainer->step()),
                                                                 moec::plan::I64);
    if (!steps.ok())
      return fail(std::string(steps.status().message()));
    if (*steps != static_cast<double>(session.trainer->step()) * session.plan.ranks_size())
      return fail("the ranks start at different steps (rank " + std::to_string(setup.rank) + " at " +
                  std::to_string(session.trainer->step()) + "): is " + checkpointPath +
                  " visible to every rank?");
  }
  auto save = [&]() -> absl::Status { // rank 0 writes (a pipeline's ranks all take part)
    return session.trainer->saveCheckpoint(checkpointPath, {{"data_state", (*loader)->state().toString()}});
  };

  // Metrics end where the run resumes: lines of steps after the checkpoint are dropped.
  std::string metricsPath = lead ? out + "/metrics.jsonl" : "/dev/null";
  if (lead) {
    std::vector<std::string> kept;
    std::ifstream previous(metricsPath);
    for (std::string line; resume && std::getline(previous, line);) {
      long long step = 0;
      if (std::sscanf(line.c_str(), "{\"step\":%lld", &step) == 1 && step <= session.trainer->step())
        kept.push_back(line);
    }
    std::ofstream rewrite(metricsPath, std::ios::trunc);
    for (const std::string &line : kept)
      rewrite << line << "\n";
  }
  std::ofstream metrics(metricsPath, std::ios::app);
  std::signal(SIGINT, onSignal);
  std::signal(SIGTERM, onSignal);
  int64_t tokensPerStep = session.plan.seq_len() * rows * shards;
  auto start = std::chrono::steady_clock::now();
  int64_t first = session.trainer->step();
  std::unique_ptr<Watchdog> watchdog = watchdogFor(session, setup);
  while (session.trainer->step() < steps) {
    if (watchdog)
      watchdog->beat(session.trainer->step());
    absl::StatusOr<bool> stop = anyRankStops(session, interrupted);
    if (!stop.ok())
      return fail(std::string(stop.status().message()));
    if (*stop) {
      interrupted = true;
      break;
    }
    data::Batch batch = (*loader)->next();
    absl::StatusOr<StepStats> stats = session.trainer->trainStep(
        shardOf(batch, shard, rows, session.plan.seq_len()));
    if (!stats.ok()) // the last checkpoint stays the one to resume from
      return fail("training step " + std::to_string(session.trainer->step() + 1) + ": " +
                  std::string(stats.status().message()));
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    int64_t done = stats->step - first;
    double tokensPerSecond = done * tokensPerStep / std::max(elapsed, 1e-9);
    // Expert load per MoE layer and its imbalance (max / mean).
    std::string load;
    for (const auto &[layer, counts] : stats->expertLoad) {
      int64_t total = 0, most = 0;
      for (int64_t c : counts) {
        total += c;
        most = std::max(most, c);
      }
      double imbalance = total ? most * static_cast<double>(counts.size()) / total : 0;
      absl::StrAppend(&load, load.empty() ? "" : ",", "\"", layer, "\":{\"tokens\":[", absl::StrJoin(counts, ","),
                      "],\"imbalance\":", imbalance);
      // Experts split over ep: the rows each expert-parallel rank receives, and their
      // imbalance (what decides the slowest rank; input for placing experts).
      if (auto ranks = stats->epRankLoad.find(layer); ranks != stats->epRankLoad.end()) {
        const std::vector<int64_t> &perRank = ranks->second;
        int64_t busiest = *std::max_element(perRank.begin(), perRank.end());
        absl::StrAppend(&load, ",\"ep_ranks\":[", absl::StrJoin(perRank, ","), "],\"ep_imbalance\":",
                        total ? busiest * static_cast<double>(perRank.size()) / total : 0);
      }
      absl::StrAppend(&load, "}");
    }
    metrics << "{\"step\":" << stats->step << ",\"loss\":" << stats->loss << ",\"lr\":" << stats->lr
            << ",\"grad_norm\":" << stats->gradNorm << ",\"tokens_per_s\":" << tokensPerSecond
            << ",\"expert_load\":{" << load << "}}" << std::endl; // flushed: tail -f, crashes
    if (lead &&
        (stats->step == first + 1 || stats->step % std::max<int64_t>(logEvery, 1) == 0 || stats->step == steps)) {
      double eta = (steps - stats->step) * elapsed / std::max<int64_t>(done, 1);
      std::fprintf(stderr, "step %lld/%lld  loss %.4f  lr %.2e  grad_norm %.3f  %.0f tok/s  eta %s\n",
                   static_cast<long long>(stats->step), static_cast<long long>(steps), stats->loss, stats->lr,
                   stats->gradNorm, tokensPerSecond, formatDuration(eta).c_str());
    }
    if (checkpointEvery > 0 && stats->step % checkpointEvery == 0)
      if (absl::Status s = save(); !s.ok())
        return fail(std::string(s.message()));
  }
  metrics.flush();
  if (absl::Status s = save(); !s.ok())
    return fail(std::string(s.message()));
  if (interrupted) {
    if (lead)
      std::cerr << "moe-run: interrupted at step " << session.trainer->step() << "; checkpoint in "
                << checkpointPath << " (continue with --resume)\n";
    return 130;
  }
  if (absl::Status s = exportAdapter(out + "/adapter", session, lead); !s.ok())
    return fail(std::string(s.message()) + " (the trained parameters are in " + checkpointPath + ")");
  if (!lead)
    return 0;
  std::cerr << "moe-run: trained " << session.trainer->step() << " steps\n"
            << "  adapter (PEFT):  " << out << "/adapter\n"
            << "  checkpoint:      " << checkpointPath << "\n"
            << "  metrics:         " << out << "/metrics.jsonl\n";
  return 0;
}

int runForward(Args &args) {
  if (!args.positional.empty())
    return fail("unexpected argument '" + args.positional.front() + "' (flags start with --)");
  if (args.has("nproc"))
    return fail("forward runs one rank: compile its plan without --mesh");
  Session session;
  if (absl::Status s = openSession(args, session, RankSetup{}); !s.ok())
    return fail(std::string(s.message()));
  std::string dataPath = args.get("data"), adapterDir = args.get("adapter");
  int64_t batches = 0;
  std::string error;
  if (!args.integer("batches", 1, batches, error))
    return fail(error);
  if (auto unknown = args.unknown(); !unknown.empty())
    return fail("unknown flag(s): " + absl::StrJoin(unknown, ", "));
  if (dataPath.empty())
    return fail("--data FILE is required");
  if (!adapterDir.empty()) {
    if (absl::Status s = loadAdapter(adapterDir, session); !s.ok())
      return fail(std::string(s.message()));
  } else if (absl::Status s = session.trainer->initAdapter(0); !s.ok()) { // B = 0: the base model
    return fail(std::string(s.message()));
  }
  absl::StatusOr<std::unique_ptr<data::Dataset>> dataset =
      data::Dataset::open(dataPath, vocabularySize(session.plan));
  if (!dataset.ok())
    return fail(std::string(dataset.status().message()));
  data::LoaderOptions options;
  options.microBatch = session.plan.micro_batch();
  options.seqLen = session.plan.seq_len();
  absl::StatusOr<std::unique_ptr<data::DataLoader>> loader =
      data::DataLoader::create(std::shared_ptr<const data::Dataset>(std::move(*dataset)), options);
  if (!loader.ok())
    return fail(std::string(loader.status().message()));
  double sum = 0;
  for (int64_t i = 0; i < batches; ++i) {
    data::Batch batch = (*loader)->next();
    absl::StatusOr<float> loss = session.trainer->forwardBackward({batch.inputIds, batch.positions, batch.labels});
    if (!loss.ok())
      return fail(std::string(loss.status().message()));
    sum += *loss;
  }
  std::printf("mean loss over %lld batch(es): %.6f\n", static_cast<long long>(batches), sum / batches);
  return 0;
}

/// Training steps on random tokens: the median step time, tokens/s and the plan's FLOPs per
/// second (the compiler's count of each launch), after warm-up steps.
int runBench(Args &args, const RankSetup &setup) {
  if (!args.positional.empty())
    return fail("unexpected argument '" + args.positional.front() + "' (flags start with --)");
  Session session;
  if (absl::Status s = openSession(args, session, setup); !s.ok())
    return fail(std::string(s.message()));
  int64_t steps = 0, warmup = 0, seed = 0;
  std::string error;
  if (!args.integer("steps", 5, steps, error) || !args.integer("warmup", 2, warmup, error) ||
      !args.integer("seed", 0, seed, error))
    return fail(error);
  if (auto unknown = args.unknown(); !unknown.empty())
    return fail("unknown flag(s): " + absl::StrJoin(unknown, ", "));
  if (steps <= 0)
    return fail("--steps must be positive");
  if (absl::Status s = session.trainer->initAdapter(static_cast<uint64_t>(seed)); !s.ok())
    return fail(std::string(s.message()));
  int64_t vocab = vocabularySize(session.plan),
          tokens = session.plan.seq_len() * session.plan.micro_batch() *
                   std::max<int64_t>(1, session.plan.micro_batches()); // a pipeline: all its micro-batches
  // Each data shard its own tokens (tp ranks and pipeline stages share theirs).
  int64_t shards = dataShards(session.plan);
  std::mt19937_64 rng(static_cast<uint64_t>(seed) + static_cast<uint64_t>(dataShardOf(session.plan, setup.rank)));
  Batch batch;
  for (int64_t t = 0; t < tokens; ++t) {
    batch.ids.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(std::max<int64_t>(vocab, 1))));
    batch.positions.push_back(t % session.plan.seq_len());
  }
  batch.labels = batch.ids;
  int64_t flops = 0;
  for (const moec::plan::Step &step : session.plan.ranks(setup.rank).steps())
    if (step.has_launch())
      flops += step.launch().flops();
  std::vector<double> times;
  std::unique_ptr<Watchdog> watchdog = watchdogFor(session, setup);
  // Says where it runs before the first step: a real-size plan on the CPU (the default backend)
  // takes minutes a step.
  if (setup.lead())
    std::cerr << "moe-run bench: " << warmup << " warm-up and " << steps << " timed steps on "
              << session.device->name() << "\n";
  for (int64_t i = 0; i < warmup + steps; ++i) {
    if (watchdog)
      watchdog->beat(i);
    auto start = std::chrono::steady_clock::now();
    absl::StatusOr<StepStats> stats = session.trainer->trainStep(batch);
    if (!stats.ok())
      return fail(std::string(stats.status().message()));
    if (i >= warmup)
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  double median = times[times.size() / 2];
  // Exposed communication: one more step that waits for the device around each collective
  // (the plan runs them on the compute stream, so their time adds to the step's).
  std::string comm;
  if (setup.world > 1) {
    session.executor->setTimeCollectives(true);
    auto start = std::chrono::steady_clock::now();
    if (absl::StatusOr<StepStats> stats = session.trainer->trainStep(batch); !stats.ok())
      return fail(std::string(stats.status().message()));
    double step = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    double inCollectives = session.executor->collectiveSeconds();
    std::string exchange = session.executor->exchangeBreakdown();
    session.executor->setTimeCollectives(false);
    char text[128];
    std::snprintf(text, sizeof text, ", communication %.1f ms of a %.1f ms timed step (%.1f%%",
                  inCollectives * 1e3, step * 1e3, 100 * inCollectives / step);
    comm = text;
    if (session.plan.mesh().ep() > 1)
      comm += "; expert exchange: " + exchange;
    comm += ")";
  }
  if (!setup.lead())
    return 0;
  char memory[64] = "";
  if (std::optional<uint64_t> used = session.device->memoryInUse())
    std::snprintf(memory, sizeof memory, ", device memory %.1f GiB", *used / double(1ull << 30));
  std::string ranks = setup.world > 1 ? absl::StrCat(" (rank 0 of ", setup.world, ")") : "";
  const char *perRank = setup.world > 1 ? " per rank" : "";
  // Per GPU: the mesh's tokens per step (one set per data shard) over its GPUs; with tp or pp
  // several GPUs share a shard's tokens.
  double perGpu = static_cast<double>(tokens) * shards / std::max(setup.world, 1) / median;
  std::printf("%s on %s%s: %lld tokens per step%s, median step %.1f ms over %lld steps (after %lld "
              "warm-up), %.0f tokens/s%s, %.3g TFLOP/s of the plan's %.3g TFLOP per step%s%s\n",
              session.plan.model().c_str(), session.device->name().c_str(), ranks.c_str(),
              static_cast<long long>(tokens), perRank, median * 1e3, static_cast<long long>(steps),
              static_cast<long long>(warmup), perGpu, setup.world > 1 ? " per GPU" : "", flops / median / 1e12,
              flops / 1e12, memory, comm.c_str());
  return 0;
}

int runInit(Args &args) {
  if (args.positional.size() != 1)
    return fail("usage: moe-run init CONFIG.json [--seed S] -o DIR [--plan PLAN]");
  std::string config = args.positional[0], out = args.get("o"), planPath = args.get("plan");
  int64_t seed = 0;
  std::string error;
  if (!args.integer("seed", 0, seed, error))
    return fail(error);
  if (out.empty())
    return fail("-o DIR is required");
  if (auto unknown = args.unknown(); !unknown.empty())
    return fail("unknown flag(s): " + absl::StrJoin(unknown, ", "));
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec)
    return fail("cannot create " + out + ": " + ec.message());
  if (planPath.empty()) {
    // The plan lists every checkpoint tensor with its shape; moec knows how to make one.
    planPath = out + "/.init.moeplan";
    if (absl::Status s = runMoecCompile({config, "--seq-len", "8", "-o", planPath}); !s.ok())
      return fail(std::string(s.message()));
  }
  absl::StatusOr<moec::plan::Plan> plan = moec::plan::loadPlan(planPath);
  if (!plan.ok())
    return fail(std::string(plan.status().message()));
  if (plan->ranks_size() > 1) // a rank's plan binds only its part of the experts
    return fail(planPath + " is for " + std::to_string(plan->ranks_size()) +
                " ranks; init writes the whole model: give it a plan compiled without --mesh");
  // The file holds every weight in f32: say so before a real-size model fills the disk.
  int64_t elements = 0;
  for (const moec::plan::WeightBinding &binding : plan->ranks(0).weights()) {
    const moec::plan::Buffer &buffer = plan->ranks(0).buffers(static_cast<int>(binding.buffer()));
    elements += buffer.size_bytes() / std::max<int64_t>(1, moec::plan::dtypeSize(buffer.dtype()));
  }
  if (elements * 4 > (int64_t(4) << 30))
    std::cerr << "moe-run: writing " << elements * 4 / (1 << 30) << " GiB of random weights to " << out
              << " (for real-size models, `moe-run train --random-weights SEED` makes them on the device)\n";
  if (absl::Status s = init::writeRandomModel(*plan, config, static_cast<uint64_t>(seed), out); !s.ok())
    return fail(std::string(s.message()));
  if (planPath == out + "/.init.moeplan")
    fs::remove(planPath, ec);
  std::cerr << "moe-run: wrote a random model (seed " << seed << ") to " << out << "\n";
  return 0;
}

} // namespace

/// Runs `command` (train or bench) on every rank this process owns: one, a launcher's
/// (torchrun, Slurm, Open MPI), or `--nproc N` local ones (processes on GPUs, threads on
/// the CPU).
int runRanks(int (*command)(Args &, const RankSetup &), int argc, char **argv) {
  Args args(argc, argv, 2);
  int64_t nproc = 1;
  std::string error;
  if (!args.integer("nproc", 1, nproc, error) || nproc < 1)
    return fail(error.empty() ? "--nproc must be at least 1" : error);
  absl::StatusOr<comm::LaunchEnv> env = comm::readLaunchEnv();
  if (!env.ok())
    return fail(std::string(env.status().message()));
  if (env->worldSize > 1) { // a process rank: its GPU is LOCAL_RANK
    if (args.has("nproc"))
      return fail("--nproc starts local ranks; this process is already rank " + std::to_string(env->rank) +
                  " of " + std::to_string(env->worldSize) + " (" + env->source + ")");
    if (args.get("backend", "cpu") == "cpu")
      return fail("rank " + std::to_string(env->rank) + " of " + std::to_string(env->worldSize) +
                  ": launched ranks run on GPUs (--backend cuda); CPU ranks are threads: --nproc N");
    RankSetup setup;
    setup.rank = env->rank;
    setup.world = env->worldSize;
    setup.gpu = env->localRank;
    setup.process = *env;
    return command(args, setup);
  }
  bool oneGpu = false;
  if (!args.flag("ranks-on-one-gpu", oneGpu, error))
    return fail(error);
  if (nproc == 1 && !oneGpu)
    return command(args, RankSetup{});
  std::string backend = args.get("backend", "cpu");
  int gpus = backend == "cpu" ? 0 : cuda::cudaDeviceCount();
  if (oneGpu && (backend != "cuda" || gpus < 1 || nproc < 2))
    return fail("--ranks-on-one-gpu runs --nproc N >= 2 thread ranks on GPU 0: it needs --backend cuda and a GPU");
  if (backend == "cuda" && gpus < nproc && !oneGpu)
    return fail("--nproc " + std::to_string(nproc) + " needs as many GPUs; " + std::to_string(gpus) +
                " visible (--ranks-on-one-gpu runs them all on GPU 0, for checks)");
  if (gpus >= nproc && !oneGpu) { // one process per GPU; they find each other through a store here
    std::vector<std::string> argvOfRanks;
    for (int i = 0; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "--nproc") {
        ++i;
        continue;
      }
      if (a.rfind("--nproc=", 0) == 0)
        continue;
      argvOfRanks.push_back(a == "auto" && i > 0 && std::string(argv[i - 1]) == "--backend" ? "cuda" : a);
    }
    return runLocalProcesses(static_cast<int>(nproc), argvOfRanks);
  }
  if (backend == "auto")
    std::cerr << "moe-run: --backend auto: " << gpus << " GPU(s) for " << nproc
              << " ranks; running them as CPU threads\n";
  absl::StatusOr<moec::plan::Plan> plan = moec::plan::loadPlan(args.get("plan"));
  if (!plan.ok())
    return fail(std::string(plan.status().message()));
  if (plan->ranks_size() != nproc)
    return fail(rankCountMismatch(args.get("plan"), *plan, static_cast<int>(nproc)));
  CpuRanks hub(*plan, kRankTimeoutSeconds);
  std::vector<int> codes(static_cast<size_t>(nproc), 0);
  std::vector<std::thread> ranks;
  for (int r = 0; r < nproc; ++r)
    ranks.emplace_back([&, r] {
      Args mine(argc, argv, 2);
      mine.has("nproc");
      mine.has("ranks-on-one-gpu");
      if (backend == "auto")
        mine.set("backend", "cpu");
      RankSetup setup;
      setup.rank = r;
      setup.world = static_cast<int>(nproc);
      setup.threads = &hub;
      setup.oneGpu = oneGpu;
      codes[r] = command(mine, setup);
      // A rank that stops early (an error, an interrupt) must not leave the others waiting
      // for it in a collective until the timeout.
      if (codes[r] != 0 && codes[r] != 130) // an interrupt: every rank agreed on the step
        hub.abort("rank " + std::to_string(r) + " stopped (status " + std::to_string(codes[r]) + ")");
    });
  for (std::thread &t : ranks)
    t.join();
  for (int code : codes)
    if (code != 0)
      return code;
  return 0;
}

int main(int argc, char **argv) {
  std::string command = argc > 1 ? argv[1] : "";
  Args args(argc, argv, 2);
  if (command == "train")
    return runRanks(runTrain, argc, argv);
  if (command == "forward")
    return runForward(args);
  if (command == "bench")
    return runRanks(runBench, argc, argv);
  if (command == "init")
    return runInit(args);
  std::cerr << "usage: moe-run <command> [options]\n"
               "  train    --plan P (--model DIR | --random-weights SEED [--initializer-range R])\n"
               "           --data FILE [--out DIR] [--steps N] [--adapter DIR]\n"
               "           [--checkpoint-every N] [--resume] [--seed S] [--in-order] [--threads N] [--log-every N]\n"
               "           [--backend cpu|cuda|auto] [--nproc N [--ranks-on-one-gpu]]\n"
               "  forward  --plan P --model DIR --data FILE [--adapter DIR] [--batches N]\n"
               "  bench    --plan P (--model DIR | --random-weights SEED) [--steps N] [--warmup N]\n"
               "           [--backend cpu|cuda|auto] [--threads N] [--nproc N]\n"
               "  init     CONFIG.json [--seed S] -o DIR [--plan P]\n";
  if (command.empty() || command == "--help" || command == "-h")
    return command.empty() ? 1 : 0;
  return fail("unknown command '" + command + "'");
}
