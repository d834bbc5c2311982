//===- moe_mesh_check.cpp - a multi-rank run equals the single-rank run ---===//
//
//   moe-mesh-check DIR --mesh dp=2,ep=2,pp=2 [--dtype float32|bfloat16] [--backend cpu|cuda [--ranks-on-one-gpu]]
//                  [--cpu-threads N]
//                  [--plan SINGLE --mesh-plan MESH [--f32-plan SINGLE_F32]] [--tolerance R] [--recompute POLICY]
//
// DIR is a golden family (config.json, model.safetensors, adapter/,
// golden.safetensors). The batch is the golden sequences, repeated until it
// splits over the mesh's dp x ep data shards. Compiles the config twice with
// the adapter's settings: for one rank on the whole batch, and for the mesh
// with the batch split over its shards (--micro-batch batch / (dp ep); with
// pp, 2 pp micro-batches of one sequence each per step, in 1F1B order), or
// takes both plans (--plan, --mesh-plan: where moec cannot run). Runs
// the single rank, then every rank of the mesh as a thread of this process
// (the CPU communicator; with --backend cuda, rank r on GPU r with NCCL, the
// single rank on GPU 0; with --ranks-on-one-gpu every rank on GPU 0, the CPU
// communicator's collectives staged through host memory: every kernel of the
// mesh plan on the GPU, one GPU enough), each on its own sequences, from the golden adapter:
// three AdamW steps (lr 1e-3, constant, no clipping). Prints one line per
// tensor comparing the mesh with the single rank: the loss before each step,
// every LoRA gradient of the first step, every parameter after the three
// steps; exits 1 if any differs by more than relative 1e-4 (2e-2 in bf16; --tolerance; in bf16
// a tensor beyond it passes if the mesh is at most that much farther from one f32 rank's run
// (compiled here, or --f32-plan) than the bf16 rank is: the bf16 noise of that tensor), --perturb-mesh-grads F scales the mesh's
// gradients before the comparison (the test that the check still fails a wrong run); a note
// names each MoE layer whose step-1 expert loads differ from one rank's (routing flipped),
// or if the ranks' parameters differ from each other at all. --fused-expert-backward compiles
// both plans with moec's flag of that name. --recompute compiles
// the mesh plan with that policy (moec --recompute; the single rank saves
// everything), so what the backward keeps is checked under the mesh too.
// --expert-placement, --token-blocks, --overlap, --sequence-parallel, --tp-replicate and
// --rank-order compile the mesh plan with moec's flags of those names (which experts each ep rank
// holds, ...).
//
//===----------------------------------------------------------------------===//

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "dialects/moe/MeshShape.h"
#include "runtime/backends/cuda/CudaDevice.h"
#include "runtime/exec/Executor.h"
#include "runtime/plan/PlanFormat.h"
#include "runtime/plan/PlanIO.h"
#include "runtime/tools/Args.h"
#include "runtime/tools/Moec.h"
#include "runtime/tools/Ranks.h"
#include "runtime/train/Trainer.h"
#include "runtime/weights/Checkpoint.h"
#include "runtime/weights/Safetensors.h"
#include "tests/golden/Comparison.h"

using namespace moec;
using namespace moec::runtime;

namespace {

int fail(const std::string &message) {
  std::fprintf(stderr, "moe-mesh-check: error: %s\n", message.c_str());
  return 2;
}

using Tensors = std::map<std::string, std::vector<float>>;

/// What one rank saw: the loss before each step, the first step's gradients, the
/// parameters after the last step.
struct Run {
  std::vector<float> losses;
  Tensors grads, after;
  std::map<int, std::vector<int64_t>> firstLoads; // tokens per expert of step 1, per MoE layer
  absl::Status status;
};

/// Three steps of `plan`'s rank `rank` on rows [first, first + rows) of the batch.
/// Where the ranks run: the CPU (threads), GPU r for rank r (NCCL through a store here), or
/// every rank on GPU 0 (oneGpu: the CPU collectives through host memory).
struct Placement {
  bool cuda = false, oneGpu = false;
  int threads = 1, port = 0;
  CpuRanks *cpu = nullptr;
};

Run train(const plan::Plan &plan, int rank, const std::string &dir, const Tensors &adapter,
          const std::vector<int64_t> &ids, const std::vector<int64_t> &labels, int64_t seq, int64_t first,
          int64_t rows, const Placement &where) {
  Run run;
  auto fail = [&](const absl::Status &s) {
    run.status = absl::Status(s.code(), "rank " + std::to_string(rank) + ": " + std::string(s.message()));
    return run;
  };
  std::unique_ptr<Device> device;
  if (where.cuda) {
    auto gpu = cuda::makeCudaDevice(where.oneGpu ? 0 : rank);
    if (!gpu.ok())
      return fail(gpu.status());
    device = std::move(*gpu);
  } else {
    device = makeCpuDevice(where.threads);
  }
  RankLinks links;
  if (plan.ranks_size() > 1 && where.oneGpu) {
    links = where.cpu->links(rank, device.get());
  } else if (plan.ranks_size() > 1 && where.cuda) {
    comm::LaunchEnv env;
    env.rank = rank;
    env.worldSize = plan.ranks_size();
    env.localRank = rank;
    env.masterPort = where.port;
    env.source = "moe-mesh-check";
    auto connected = connectNccl(plan, env, device->stream(), /*timeoutSeconds=*/120, /*storeServed=*/true);
    if (!connected.ok())
      return fail(connected.status());
    links = std::move(*connected);
  } else if (plan.ranks_size() > 1) {
    links = where.cpu->links(rank);
  }
  auto checkpoint = weights::Checkpoint::open(dir);
  if (!checkpoint.ok())
    return fail(checkpoint.status());
  auto executor = Executor::create(plan, rank, *device);
  if (!executor.ok())
    return fail(executor.status());
  if (absl::Status s = (*executor)->bindWeights(**checkpoint); !s.ok())
    return fail(s);
  if (absl::Status s = (*executor)->setCommunicators(links.groups); !s.ok())
    return fail(s);
  Trainer trainer(**executor);
  trainer.setWorld(links.everyone);
  if (absl::Status s = trainer.setAdapter(adapter); !s.ok())
    return fail(s);
  Batch batch;
  batch.ids.assign(ids.begin() + first * seq, ids.begin() + (first + rows) * seq);
  batch.labels.assign(labels.begin() + first * seq, labels.begin() + (first + rows) * seq);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t t = 0; t < seq; ++t)
      batch.positions.push_back(t);
  for (int step = 0; step < 3; ++step) {
    absl::StatusOr<float> loss = trainer.forwardBackward(batch);
    if (!loss.ok())
      return fail(loss.status());
    run.losses.push_back(*loss);
    if (step == 0) {
      auto grads = trainer.gradients();
      if (!grads.ok())
        return fail(grads.status());
      run.grads = std::move(*grads);
    }
    auto stepped = trainer.optimizerStep();
    if (!stepped.ok())
      return fail(stepped.status());
    if (step == 0)
      run.firstLoads = stepped->expertLoad;
  }
  auto after = trainer.adapter();
  if (!after.ok())
    return fail(after.status());
  run.after = std::move(*after);
  return run;
}

} // namespace

int main(int argc, char **argv) {
  Args args(argc, argv, 1);
  std::string meshText = args.get("mesh"), dtype = args.get("dtype", "float32"), backend = args.get("backend", "cpu");
  std::string singlePath = args.get("plan"), meshPath = args.get("mesh-plan"), exactPath = args.get("f32-plan");
  std::string epExchange = args.get("ep-exchange", "auto"), recompute = args.get("recompute"),
              placement = args.get("expert-placement"), tokenBlocks = args.get("token-blocks"),
              tpReplicate = args.get("tp-replicate"), capacity = args.get("ep-capacity-factor"),
              rankOrder = args.get("rank-order");
  if (singlePath.empty() != meshPath.empty())
    return fail("--plan and --mesh-plan go together (the single-rank and the mesh plan)");
  int64_t threads = 1;
  bool fusedExperts = false, overlap = false, sequenceParallel = false, oneGpu = false;
  std::string error;
  if (!args.integer("cpu-threads", 1, threads, error) || !args.flag("fused-expert-backward", fusedExperts, error) ||
      !args.flag("overlap", overlap, error) || !args.flag("sequence-parallel", sequenceParallel, error) ||
      !args.flag("ranks-on-one-gpu", oneGpu, error))
    return fail(error);
  double tolerance = dtype == "bfloat16" ? 2e-2 : 1e-4, perturb = 1.0;
  if (std::string given = args.get("perturb-mesh-grads"); !given.empty()) {
    char *end = nullptr;
    perturb = std::strtod(given.c_str(), &end);
    if (*end != '\0' || !(perturb > 0))
      return fail("--perturb-mesh-grads must be a positive number, got '" + given + "'");
  }
  if (std::string given = args.get("tolerance"); !given.empty()) {
    char *end = nullptr;
    tolerance = std::strtod(given.c_str(), &end);
    if (given.empty() || *end != '\0' || !(tolerance > 0))
      return fail("--tolerance must be a positive number, got '" + given + "'");
  }
  if (auto unknown = args.unknown(); !unknown.empty())
    return fail("unknown flag(s): " + unknown.front());
  if ((!recompute.empty() || fusedExperts || !placement.empty() || !tokenBlocks.empty() || overlap ||
       sequenceParallel || !tpReplicate.empty() || !capacity.empty() || !rankOrder.empty()) &&
      !singlePath.empty())
    return fail("--recompute, --fused-expert-backward, --expert-placement, --token-blocks, --overlap, "
                "--sequence-parallel, --tp-replicate, --ep-capacity-factor and --rank-order are for the plans moe-mesh-check "
                "compiles, not with --plan");
  if (args.positional.size() != 1 || meshText.empty())
    return fail("usage: moe-mesh-check DIR --mesh dp=N,ep=M [--dtype float32|bfloat16] [--backend cpu|cuda [--ranks-on-one-gpu]] "
                "[--cpu-threads N] [--ep-exchange auto|routed|all] [--recompute POLICY] [--fused-expert-backward] "
                "[--expert-placement FILE] [--token-blocks N] [--overlap] [--sequence-parallel] [--tp-replicate KINDS] "
                "[--ep-capacity-factor F] [--rank-order AXES] "
                "[--plan SINGLE --mesh-plan MESH [--f32-plan SINGLE_F32]]");
  std::string dir = args.positional[0];
  moe::MeshShape mesh;
  if (!moe::MeshShape::parse(meshText, mesh, error))
    return fail("--mesh '" + meshText + "': " + error);
  if (dtype != "float32" && dtype != "bfloat16")
    return fail("--dtype must be float32 or bfloat16, got '" + dtype + "'");
  if (backend != "cpu" && backend != "cuda")
    return fail("--backend must be cpu or cuda, got '" + backend + "'");
  if (oneGpu && backend != "cuda")
    return fail("--ranks-on-one-gpu puts the ranks on GPU 0: it needs --backend cuda");
  if (backend == "cuda" && !oneGpu && cuda::cudaDeviceCount() < mesh.size())
    return fail("--backend cuda runs rank r on GPU r: " + std::to_string(mesh.size()) + " ranks, " +
                std::to_string(cuda::cudaDeviceCount()) + " GPUs (--ranks-on-one-gpu runs them all on GPU 0)");
  if (backend == "cuda" && cuda::cudaDeviceCount() < 1)
    return fail("--backend cuda: no GPU is visible");

  auto golden = weights::SafetensorsFile::open(dir + "/golden.safetensors");
  if (!golden.ok())
    return fail(std::string(golden.status().message()));
  const weights::TensorInfo *idsInfo = (*golden)->find("input_ids");
  const weights::TensorInfo *labelsInfo = (*golden)->find("labels");
  if (!idsInfo || !labelsInfo || idsInfo->shape.size() != 2 || labelsInfo->shape != idsInfo->shape)
    return fail(dir + "/golden.safetensors: input_ids and labels [batch, seq] are missing");
  int64_t goldenBatch = idsInfo->shape[0], seq = idsInfo->shape[1];
  std::vector<int64_t> goldenIds(static_cast<size_t>(goldenBatch * seq)), goldenLabels(goldenIds.size());
  std::memcpy(goldenIds.data(), (*golden)->data(*idsInfo).data(), goldenIds.size() * sizeof(int64_t));
  std::memcpy(goldenLabels.data(), (*golden)->data(*labelsInfo).data(), goldenLabels.size() * sizeof(int64_t));
  // Data shards: every dp and ep rank trains on its own sequences; the stages of a pipeline
  // share theirs, 2 pp micro-batches of one sequence each.
  int64_t shards = mesh.dp * mesh.ep, microBatches = mesh.pp > 1 ? 2 * mesh.pp : 1;
  int64_t batch = goldenBatch % (shards * microBatches) == 0 ? goldenBatch : shards * microBatches;
  std::vector<int64_t> ids, labels;
  for (int64_t b = 0; b < batch; ++b) {
    int64_t from = (b % goldenBatch) * seq;
    ids.insert(ids.end(), goldenIds.begin() + from, goldenIds.begin() + from + seq);
    labels.insert(labels.end(), goldenLabels.begin() + from, goldenLabels.begin() + from + seq);
  }

  Tensors adapter;
  auto adapterFile = weights::SafetensorsFile::open(dir + "/adapter/adapter_model.safetensors");
  if (!adapterFile.ok())
    return fail(std::string(adapterFile.status().message()));
  for (const weights::TensorInfo &info : (*adapterFile)->tensors()) {
    std::vector<float> &values = adapter[info.name];
    values.resize(static_cast<size_t>(info.numElements()));
    (void)weights::convertElements((*adapterFile)->data(info).data(), info.dtype, values.data(),
                                   weights::DType::F32, values.size());
  }

  // The two plans, given or compiled in a directory of our own (tests run in parallel
  // share /tmp).
  std::string tempDir = (std::filesystem::temp_directory_path() / "moe-mesh-check-XXXXXX").string();
  if (!mkdtemp(tempDir.data()))
    return fail("cannot create a temporary directory for the plans");
  auto compile = [&](const std::string &name, int64_t microBatch, const std::string &meshFlag,
                     int64_t pipelineMicroBatches, const std::string &storage)
      -> absl::StatusOr<plan::Plan> {
    if (!singlePath.empty()) {
      absl::StatusOr<plan::Plan> given = plan::loadPlan(meshFlag.empty() ? singlePath : meshPath);
      if (given.ok() && given->micro_batch() != microBatch)
        return absl::InvalidArgumentError(absl::StrCat(meshFlag.empty() ? singlePath : meshPath, " has micro-batch ",
                                                       given->micro_batch(), "; this check needs ", microBatch));
      return given;
    }
    std::vector<std::string> moecArgs = {dir + "/config.json", "--adapter", dir + "/adapter", "--seq-len",
                                         std::to_string(seq), "--micro-batch", std::to_string(microBatch),
                                         "--lr", "1e-3", "--warmup-steps", "0", "--schedule", "constant",
                                         "--max-grad-norm", "0", "--weight-decay", "0", "--dtype", storage,
                                         "-o", tempDir + "/" + name};
    if (!meshFlag.empty())
      moecArgs.insert(moecArgs.end(), {"--mesh", meshFlag, "--pipeline-micro-batches",
                                       std::to_string(pipelineMicroBatches), "--ep-exchange", epExchange});
    if (!meshFlag.empty() && !recompute.empty())
      moecArgs.insert(moecArgs.end(), {"--recompute", recompute});
    if (!meshFlag.empty() && !placement.empty())
      moecArgs.insert(moecArgs.end(), {"--expert-placement", placement});
    if (!meshFlag.empty() && !tokenBlocks.empty())
      moecArgs.insert(moecArgs.end(), {"--token-blocks", tokenBlocks});
    if (!meshFlag.empty() && overlap)
      moecArgs.push_back("--overlap");
    if (!meshFlag.empty() && sequenceParallel)
      moecArgs.push_back("--sequence-parallel");
    if (!meshFlag.empty() && !tpReplicate.empty())
      moecArgs.insert(moecArgs.end(), {"--tp-replicate", tpReplicate});
    if (!meshFlag.empty() && !capacity.empty())
      moecArgs.insert(moecArgs.end(), {"--ep-capacity-factor", capacity});
    if (!meshFlag.empty() && !rankOrder.empty())
      moecArgs.insert(moecArgs.end(), {"--rank-order", rankOrder});
    if (fusedExperts) // both plans: the expert MLP and its combine differentiated as one
      moecArgs.push_back("--fused-expert-backward");
    if (absl::Status s = runMoecCompile(moecArgs); !s.ok())
      return s;
    return plan::loadPlan(tempDir + "/" + name);
  };
  absl::StatusOr<plan::Plan> single = compile("single.moeplan", batch, "", 1, dtype);
  absl::StatusOr<plan::Plan> sharded =
      compile("mesh.moeplan", batch / shards / microBatches, mesh.str(), microBatches, dtype);
  // bf16: one rank in f32 too, the exact run both bf16 runs approximate (not with given plans).
  std::optional<absl::StatusOr<plan::Plan>> exact;
  if (dtype == "bfloat16" && !exactPath.empty()) {
    exact = plan::loadPlan(exactPath);
    if (exact->ok() && (*exact)->micro_batch() != batch)
      exact = absl::InvalidArgumentError(absl::StrCat(exactPath, " has micro-batch ", (*exact)->micro_batch(),
                                                      "; this check needs ", batch));
  }
  else if (dtype == "bfloat16" && singlePath.empty())
    exact = compile("exact.moeplan", batch, "", 1, "float32");
  std::filesystem::remove_all(tempDir);
  if (exact && !exact->ok())
    return fail(std::string(exact->status().message()));
  if (!single.ok())
    return fail(std::string(single.status().message()));
  if (!sharded.ok())
    return fail(std::string(sharded.status().message()));
  if (sharded->mesh().dp() != mesh.dp || sharded->mesh().ep() != mesh.ep || sharded->mesh().pp() != mesh.pp ||
      sharded->ranks_size() != mesh.size())
    return fail("the mesh plan is for dp=" + std::to_string(sharded->mesh().dp()) + ",ep=" +
                std::to_string(sharded->mesh().ep()) + ",pp=" + std::to_string(sharded->mesh().pp()) + ", not " +
                mesh.str());
  int world = sharded->ranks_size();
  Placement where;
  where.cuda = backend == "cuda";
  where.oneGpu = oneGpu;
  where.threads = static_cast<int>(threads);
  std::printf("%s: mesh %s (%d ranks as threads, %s) against one rank, %lld sequences, %s storage\n",
              dir.c_str(), mesh.str().c_str(), world,
              oneGpu ? "all on GPU 0, collectives through host memory" : where.cuda ? "a GPU each, NCCL" : "CPU",
              static_cast<long long>(batch), dtype.c_str());

  Run reference = train(*single, 0, dir, adapter, ids, labels, seq, 0, batch, where);
  if (!reference.status.ok())
    return fail("the single-rank run: " + std::string(reference.status.message()));
  Run exactRun;
  if (exact) {
    exactRun = train(**exact, 0, dir, adapter, ids, labels, seq, 0, batch, where);
    if (!exactRun.status.ok())
      return fail("the single-rank f32 run: " + std::string(exactRun.status.message()));
  }
  std::vector<Run> ranks(static_cast<size_t>(world));
  {
    CpuRanks cpu(*sharded, /*timeoutSeconds=*/120);
    where.cpu = &cpu;
    // NCCL's store, served here on a port the system picks; the ranks connect to it.
    std::unique_ptr<comm::TcpStore> store;
    if (where.cuda && !where.oneGpu) {
      auto opened = comm::TcpStore::open("127.0.0.1", 0, /*serve=*/true, 30);
      if (!opened.ok())
        return fail(std::string(opened.status().message()));
      store = std::move(*opened);
      where.port = store->port();
    }
    std::vector<std::thread> threadsOfRanks;
    for (int r = 0; r < world; ++r)
      threadsOfRanks.emplace_back([&, r] {
        int64_t rows = batch / shards;
        // The plan numbers the ranks (its mesh's rank_order).
        int64_t first = (plan::meshCoordinate(sharded->mesh(), r, "dp") * mesh.ep +
                         plan::meshCoordinate(sharded->mesh(), r, "ep")) *
                        rows;
        ranks[r] = train(*sharded, r, dir, adapter, ids, labels, seq, first, rows, where);
      });
    for (std::thread &t : threadsOfRanks)
      t.join();
  }
  for (const Run &run : ranks)
    if (!run.status.ok())
      return fail("the mesh run: " + std::string(run.status.message()));

  if (perturb != 1.0) // the check must catch a wrong run (tests/golden/mesh_catches_test.sh)
    for (auto &[name, values] : ranks[0].grads)
      for (float &v : values)
        v = static_cast<float>(v * perturb);
  Comparison compare;
  int widened = 0; // tensors judged against the f32 run
  // In bf16 the mesh rounds where one rank does not (split heads, partial sums in f32): a
  // tensor beyond the tolerance of the bf16 rank passes if the mesh is at most the tolerance
  // farther from the f32 run than the bf16 rank is (its own bf16 noise).
  auto check = [&](const std::string &name, const std::vector<float> &mesh, const std::vector<float> &one,
                   const std::vector<float> &f32) {
    if (f32.empty() || mesh.size() != one.size() || one.size() != f32.size() ||
        Comparison::relative(mesh, one) <= tolerance)
      return compare.check(name, mesh, one, tolerance, 0);
    double noise = Comparison::relative(one, f32);
    char why[96];
    std::snprintf(why, sizeof why, " (against f32; one bf16 rank is %.2e from it)", noise);
    ++widened;
    compare.check(name + why, mesh, f32, noise + tolerance, 0);
  };
  auto exactOf = [&](const Tensors &tensors, const std::string &name) {
    auto found = tensors.find(name);
    return found == tensors.end() ? std::vector<float>() : found->second;
  };
  check("losses (3 steps)", ranks[0].losses, reference.losses, exactRun.losses);
  for (const auto &[name, values] : reference.grads)
    check("grad." + name, ranks[0].grads[name], values, exactOf(exactRun.grads, name));
  for (const auto &[name, values] : reference.after)
    check("after3." + name, ranks[0].after[name], values, exactOf(exactRun.after, name));
  // Replicated parameters: every rank must hold the very same bits.
  for (int r = 1; r < world; ++r)
    if (ranks[r].after != ranks[0].after || ranks[r].losses != ranks[0].losses) {
      std::printf("rank %d's parameters or losses differ from rank 0's  FAIL\n", r);
      ++compare.failures;
    }
  // Where the runs differ, whether a token chose other experts tells rounding from routing.
  for (const auto &[layer, load] : reference.firstLoads) {
    auto mine = ranks[0].firstLoads.find(layer);
    if (mine == ranks[0].firstLoads.end() || mine->second == load)
      continue;
    int64_t moved = 0;
    for (size_t e = 0; e < load.size() && e < mine->second.size(); ++e)
      moved += std::abs(mine->second[e] - load[e]);
    std::printf("note: layer %d's step-1 expert loads differ from one rank's (%lld expert choices moved): "
                "routing decisions flipped\n",
                layer, static_cast<long long>(moved / 2));
  }
  std::printf("%s: %d of %d tensors of the %s run within %.0e of one rank%s\n", dir.c_str(),
              compare.lines - compare.failures, compare.lines, mesh.str().c_str(), tolerance,
              widened ? (" (" + std::to_string(widened) + " of them against the f32 run: within that of one bf16 rank's distance)").c_str()
                      : "");
  return compare.failures ? 1 : 0;
}
