//===- MeshReportTest.cpp - per-GPU memory and communication of a mesh ----===//
//
// The tiny Qwen3-MoE (models/tiny-qwen3-moe/config.json) compiled for 2 x 64
// tokens with LoRA on q_proj and o_proj, its slice (the mesh without pp)
// planned by the passes, estimated on small meshes. Expected numbers come from
// the config's sizes and the passes' stated split rules, computed here by hand;
// only the activation arena (what the training-step builder saves) is taken
// from the planned programs.
//
//===----------------------------------------------------------------------===//

#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>

#include "compiler/frontend/ImportModel.h"
#include "compiler/pipelines/Pipelines.h"
#include "compiler/plan/MeshReport.h"
#include "compiler/plan/Program.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/FormatVariadic.h"
#include "gtest/gtest.h"

namespace moec::compiler {
namespace {

// models/tiny-qwen3-moe/config.json, float32.
constexpr int64_t kHidden = 96, kLayers = 2, kHeads = 4, kKvHeads = 2, kHeadDim = 24, kExperts = 8, kTopK = 2,
                  kExpertWidth = 48, kVocab = 256, kF32 = 4;
constexpr int64_t kSeqLen = 64, kMicroBatch = 2, kTokens = kSeqLen * kMicroBatch;
constexpr int64_t kRank = 8; // LoRA r

int64_t padded(int64_t bytes) { return (bytes + 255) / 256 * 256; }

struct Compiled {
  std::unique_ptr<mlir::MLIRContext> context = std::make_unique<mlir::MLIRContext>();
  mlir::OwningOpRef<mlir::ModuleOp> module;
  moe::ModelOp model;
  Program program;
};

struct Choice {
  moe::MeshShape mesh;             // its pp is dropped: the slice
  bool expertLora = false;
  const char *recompute = "none";
  bool sequenceParallel = false;
  double epCapacityFactor = 0;
  bool mayFail = false; // a suggestion the passes refuse (heads that do not split)
};

std::unique_ptr<Compiled> compile(const Choice &choice) {
  const char *srcdir = std::getenv("TEST_SRCDIR");
  if (!srcdir) {
    ADD_FAILURE() << "TEST_SRCDIR is not set; run this test with `bazel test`";
    return nullptr;
  }
  auto compiled = std::make_unique<Compiled>();
  auto module = frontend::importConfigFile(std::string(srcdir) + "/moec/models/tiny-qwen3-moe/config.json",
                                           *compiled->context, nullptr);
  if (!module) {
    ADD_FAILURE() << llvm::toString(module.takeError());
    return nullptr;
  }
  compiled->module = std::move(*module);
  pipelines::LoRATrainingOptions options;
  std::vector<std::string> targets = {"q_proj", "o_proj"};
  if (choice.expertLora)
    targets.insert(targets.end(), {"gate_proj", "up_proj", "down_proj"});
  options.loraTargets = targets;
  options.expertLora = choice.expertLora;
  options.loraRank = kRank;
  options.seqLen = kSeqLen;
  options.microBatch = kMicroBatch;
  options.recompute = choice.recompute;
  moe::MeshShape slice = choice.mesh;
  slice.pp = 1;
  if (!slice.single())
    options.mesh = slice.str();
  options.sequenceParallel = choice.sequenceParallel;
  options.epCapacityFactor = choice.epCapacityFactor;
  mlir::PassManager pm(compiled->context.get());
  pipelines::buildLoRATrainingPipeline(pm, options);
  if (failed(pm.run(*compiled->module))) {
    if (!choice.mayFail)
      ADD_FAILURE() << "the pipeline failed on mesh " << slice.str();
    return nullptr;
  }
  compiled->model = *compiled->module->getOps<moe::ModelOp>().begin();
  mlir::FailureOr<std::vector<Program>> programs = buildStagePrograms(compiled->model, kSeqLen, kMicroBatch);
  if (failed(programs)) {
    ADD_FAILURE() << "buildStagePrograms failed";
    return nullptr;
  }
  compiled->program = std::move(programs->front());
  return compiled;
}

int64_t arena(const Compiled &c, plan::Role role) { return c.program.arenaBytes()[role]; }

/// The estimate of `choice`'s mesh from its planned slice.
MeshEstimate estimate(const Choice &choice, MeshOptions options = {}) {
  std::unique_ptr<Compiled> slice = compile(choice);
  if (!slice)
    return {};
  options.epCapacityFactor = choice.epCapacityFactor;
  return estimateMesh(slice->program, choice.mesh, options);
}

class MeshReportTest : public ::testing::Test {
protected:
  static void SetUpTestSuite() { tiny = compile(Choice{}).release(); }
  static void TearDownTestSuite() {
    delete tiny;
    tiny = nullptr;
  }
  void SetUp() override { ASSERT_NE(tiny, nullptr); }

  static Compiled *tiny; // one rank
};
Compiled *MeshReportTest::tiny = nullptr;

const CommEstimate *find(const StageEstimate &stage, const std::string &collective, const std::string &phase,
                         const std::string &axis = "") {
  for (const CommEstimate &c : stage.comm)
    if (c.collective == collective && c.phase == phase && (axis.empty() || c.axis == axis))
      return &c;
  return nullptr;
}

// Bytes of one routed-expert tensor ([experts, 48, 96] or [experts, 96, 48]).
constexpr int64_t kExpertTensor = kExperts * kExpertWidth * kHidden * kF32;
// Each layer's q_proj and o_proj adapters: A [r, 96] and B [96, r].
constexpr int64_t kLoraPerLayer = 2 * (kRank * kHidden + kHidden * kRank) * kF32;
// One token row of the model width, f32.
constexpr int64_t kRow = kHidden * kF32;

TEST_F(MeshReportTest, OneRankIsTheSingleRankArenas) {
  MeshEstimate e = estimateMesh(tiny->program, moe::MeshShape{});
  ASSERT_EQ(e.stages.size(), 1u);
  const MemoryByRole &mem = e.stages[0].memory;
  EXPECT_EQ(mem.weight, arena(*tiny, plan::WEIGHT));
  EXPECT_EQ(mem.loraParam, arena(*tiny, plan::LORA_PARAM));
  EXPECT_EQ(mem.gradient, arena(*tiny, plan::GRADIENT));
  EXPECT_EQ(mem.optimizerState, arena(*tiny, plan::OPTIMIZER_STATE));
  EXPECT_EQ(mem.activation, arena(*tiny, plan::ACTIVATION));
  EXPECT_EQ(mem.workspace, arena(*tiny, plan::WORKSPACE));
  EXPECT_EQ(mem.input, arena(*tiny, plan::INPUT));
  EXPECT_EQ(mem.scratch, tiny->program.scratchBytes());
  EXPECT_EQ(mem.total(), tiny->program.peakBytes());
  EXPECT_EQ(mem.expertWeight, kLayers * 3 * kExpertTensor);
  EXPECT_EQ(mem.loraParam, kLayers * kLoraPerLayer);
  EXPECT_TRUE(e.stages[0].comm.empty());
  EXPECT_EQ(e.numLayers, kLayers);
  EXPECT_EQ(e.hiddenSize, kHidden);
  EXPECT_EQ(e.globalTokensPerStep, kTokens);
}

TEST_F(MeshReportTest, ExpertParallelHalvesTheExpertsAndSendsTokensOncePerRank) {
  std::unique_ptr<Compiled> slice = compile(Choice{moe::MeshShape{1, 1, 1, /*ep=*/2}});
  ASSERT_NE(slice, nullptr);
  MeshEstimate e = estimateMesh(slice->program, moe::MeshShape{1, 1, 1, 2});
  const MemoryByRole &mem = e.stages[0].memory;
  // 3 expert tensors per layer, each split in two along the experts.
  EXPECT_EQ(mem.expertWeight, kLayers * 3 * (kExpertTensor / 2));
  EXPECT_EQ(mem.weight, arena(*tiny, plan::WEIGHT) - kLayers * 3 * (kExpertTensor / 2));
  EXPECT_EQ(mem.loraParam, kLayers * kLoraPerLayer); // q/o adapters are not experts' adapters
  // The plan's activations, with room for every token of both ranks on the expert side.
  EXPECT_EQ(mem.activation, arena(*slice, plan::ACTIVATION));
  EXPECT_GT(mem.activation, arena(*tiny, plan::ACTIVATION));

  // Per MoE layer, forward: the route sends each token's experts (i32 [T, 2]), two sends its
  // hidden state and its router weights (f32 [T, 2]), the return its partial sum; each to the
  // other GPU when one of its 2 experts (of 8) is there: all but C(4,2)/C(8,2) = 6/28 of the
  // tokens. The backward sends what the forward returned and returns what it sent.
  double share = 22.0 / 28.0;
  struct Expect {
    const char *collective, *phase;
    int64_t count;
    double bytesPerLayer;
  } expects[] = {
      {"expert_route", "fwd", 1, kTokens * kTopK * 4 * share},
      {"expert_send", "fwd", 2, kTokens * (kRow + kTopK * kF32) * share},
      {"expert_return", "fwd", 1, kTokens * kRow * share},
      {"expert_send", "bwd", 1, kTokens * kRow * share},
      {"expert_return", "bwd", 2, kTokens * (kRow + kTopK * kF32) * share},
  };
  for (const Expect &x : expects) {
    const CommEstimate *c = find(e.stages[0], x.collective, x.phase);
    ASSERT_NE(c, nullptr) << x.collective << " " << x.phase;
    EXPECT_EQ(c->axis, "ep");
    EXPECT_EQ(c->groupSize, 2);
    EXPECT_EQ(c->count, x.count * kLayers) << x.collective << " " << x.phase;
    EXPECT_NEAR(c->bytes, kLayers * x.bytesPerLayer, 2 * x.count * kLayers) << x.collective << " " << x.phase;
    EXPECT_FALSE(c->crossesNodes);
    EXPECT_DOUBLE_EQ(c->seconds, c->bytes / 900e9);
  }
  EXPECT_EQ(find(e.stages[0], "expert_send", "recompute"), nullptr);

  // The ep ranks run their own tokens: the q/o LoRA gradients are summed over them, once a step.
  const CommEstimate *grads = find(e.stages[0], "all_reduce", "step");
  ASSERT_NE(grads, nullptr);
  EXPECT_EQ(grads->what, "LoRA gradients");
  EXPECT_EQ(grads->axis, "dp+ep");
  EXPECT_EQ(grads->bytes, kLayers * kLoraPerLayer); // 2(n-1)/n = 1 for n = 2
  EXPECT_EQ(e.stages[0].comm.size(), 6u);

  // ep=4: to each of 3 other GPUs, all tokens but those with both experts among its 6 others
  // (C(6,2)/C(8,2) = 15/28).
  MeshEstimate four = estimate(Choice{moe::MeshShape{1, 1, 1, 4}});
  ASSERT_EQ(four.stages.size(), 1u);
  const CommEstimate *send = find(four.stages[0], "expert_return", "fwd");
  ASSERT_NE(send, nullptr);
  EXPECT_NEAR(send->bytes, kLayers * kTokens * kRow * 13.0 / 28.0 * 3, 2 * kLayers);
  EXPECT_EQ(four.stages[0].memory.expertWeight, kLayers * 3 * (kExpertTensor / 4));
}

TEST_F(MeshReportTest, ABoundedExchangeHoldsLessRoom) {
  // ep=4 with room for 1.5 x the balanced load: 90 received tokens of 128, 96 expert copies
  // of 256 (tests/e2e/train_expert_capacity.mlir derives them).
  MeshEstimate whole = estimate(Choice{moe::MeshShape{1, 1, 1, 4}});
  Choice bounded{moe::MeshShape{1, 1, 1, 4}};
  bounded.epCapacityFactor = 1.5;
  std::unique_ptr<Compiled> slice = compile(bounded);
  ASSERT_NE(slice, nullptr);
  ASSERT_EQ(whole.stages.size(), 1u);
  MeshEstimate e = estimateMesh(slice->program, bounded.mesh);
  EXPECT_EQ(e.stages[0].memory.activation, arena(*slice, plan::ACTIVATION));
  EXPECT_LT(e.stages[0].memory.activation, whole.stages[0].memory.activation);
  EXPECT_EQ(e.stages[0].memory.weight, whole.stages[0].memory.weight);
  // The messages are what uniform routing sends, whatever the room.
  EXPECT_EQ(find(e.stages[0], "expert_send", "fwd")->bytes, find(whole.stages[0], "expert_send", "fwd")->bytes);
}

TEST_F(MeshReportTest, TensorParallelSplitsWhatThePassSplits) {
  Choice choice{moe::MeshShape{1, /*tp=*/2, 1, 1}};
  std::unique_ptr<Compiled> slice = compile(choice);
  ASSERT_NE(slice, nullptr);
  MeshEstimate e = estimateMesh(slice->program, choice.mesh);
  const MemoryByRole &mem = e.stages[0].memory;
  int64_t q = kHeads * kHeadDim * kHidden * kF32, kv = kKvHeads * kHeadDim * kHidden * kF32;
  int64_t perLayer = padded(kHidden * kF32)                   // input_layernorm, replicated
                     + q / 2 + kv / 2 + kv / 2                // q/k/v: their heads split
                     + 2 * padded(kHeadDim * kF32)            // q_norm, k_norm: per head, replicated
                     + kHidden * kHeads * kHeadDim * kF32 / 2 // o_proj: its input features split
                     + padded(kHidden * kF32)                 // post_attention_layernorm
                     + kExperts * kHidden * kF32              // router, replicated
                     + 3 * padded(kExpertTensor / 2);         // experts: their features split (no ep)
  int64_t modelLevel = 2 * kVocab * kHidden * kF32            // embedding, LM head: whole on every rank
                       + padded(kHidden * kF32);              // final norm
  EXPECT_EQ(mem.weight, kLayers * perLayer + modelLevel);
  // q_proj: B [96/2, r] split, A whole; o_proj: A [r, 96/2] split, B whole.
  int64_t lora =
      kLayers * (kRank * kHidden + kHidden / 2 * kRank + kRank * kHidden / 2 + kHidden * kRank) * kF32;
  EXPECT_EQ(mem.loraParam, lora);
  EXPECT_EQ(mem.gradient, lora);
  EXPECT_EQ(mem.optimizerState, 2 * lora);
  // Without sequence parallel the activations between the regions are whole on every rank.
  EXPECT_EQ(mem.activation, arena(*slice, plan::ACTIVATION));
  EXPECT_GT(mem.activation, arena(*tiny, plan::ACTIVATION) / 2);

  // Per layer the attention's and the experts' partial sums [tokens, hidden] are summed over tp
  // (a ring of two sends the tensor once); in the backward, each region's input gradient. The
  // replicated adapters (q's A, o's B) have partial gradients, summed once a step with the
  // replicas (dp+ep+tp).
  const StageEstimate &st = e.stages[0];
  for (const char *phase : {"fwd", "bwd"}) {
    const CommEstimate *c = find(st, "all_reduce", phase);
    ASSERT_NE(c, nullptr) << phase;
    EXPECT_EQ(c->what, "tp partial sums");
    EXPECT_EQ(c->axis, "tp");
    EXPECT_EQ(c->count, 2 * kLayers) << phase;
    EXPECT_EQ(c->bytes, 2 * kLayers * kTokens * kRow) << phase;
  }
  const CommEstimate *grads = find(st, "all_reduce", "step");
  ASSERT_NE(grads, nullptr);
  EXPECT_EQ(grads->axis, "dp+ep+tp");
  EXPECT_EQ(grads->count, kLayers);
  EXPECT_EQ(grads->bytes, kLayers * 2 * kRank * kHidden * kF32);
  EXPECT_EQ(st.comm.size(), 3u);

  // Sequence parallel: each region gathers its input's rows (each rank sends its half) and
  // leaves through a reduce-scatter (half of [tokens, hidden] each); the backward the reverse,
  // and the regions' inputs are gathered again for it (recompute) instead of saved.
  Choice sp = choice;
  sp.sequenceParallel = true;
  std::unique_ptr<Compiled> rows = compile(sp);
  ASSERT_NE(rows, nullptr);
  MeshEstimate r = estimateMesh(rows->program, sp.mesh);
  struct Expect {
    const char *collective, *phase;
  } expects[] = {{"all_gather", "fwd"}, {"reduce_scatter", "fwd"}, {"all_gather", "recompute"},
                 {"all_gather", "bwd"}, {"reduce_scatter", "bwd"}};
  for (const Expect &x : expects) {
    const CommEstimate *c = find(r.stages[0], x.collective, x.phase);
    ASSERT_NE(c, nullptr) << x.collective << " " << x.phase;
    EXPECT_EQ(c->what, "sequence parallel");
    EXPECT_EQ(c->count, 2 * kLayers) << x.collective << " " << x.phase;
    EXPECT_EQ(c->bytes, 2 * kLayers * kTokens / 2 * kRow) << x.collective << " " << x.phase;
  }
  EXPECT_EQ(r.stages[0].memory.activation, arena(*rows, plan::ACTIVATION));
  EXPECT_LT(r.stages[0].memory.activation, mem.activation);
  EXPECT_FALSE(r.recomputes); // the gathers again, no layer
  EXPECT_EQ(r.stages[0].memory.weight, mem.weight);
}

TEST_F(MeshReportTest, PipelineStagesSplitLayersAndHoldMicroBatchesInFlight) {
  MeshEstimate e = estimateMesh(tiny->program, moe::MeshShape{1, 1, /*pp=*/2, 1});
  ASSERT_EQ(e.stages.size(), 2u);
  EXPECT_EQ(e.microBatches, 4); // 2 x pp, as the plan runs them by default
  const StageEstimate &first = e.stages[0], &last = e.stages[1];
  EXPECT_EQ(first.firstLayer, 0);
  EXPECT_EQ(first.endLayer, 1);
  EXPECT_EQ(last.firstLayer, 1);
  EXPECT_EQ(last.endLayer, 2);
  EXPECT_EQ(first.inFlight, 2);
  EXPECT_EQ(last.inFlight, 1);

  int64_t layer = padded(kHidden * kF32) * 2 + 2 * padded(kHeadDim * kF32) +
                  (2 * kHeads * kHeadDim + 2 * kKvHeads * kHeadDim) * kHidden * kF32 +
                  kExperts * kHidden * kF32 + 3 * kExpertTensor;
  int64_t table = kVocab * kHidden * kF32;
  EXPECT_EQ(first.memory.weight, layer + table);                         // + embedding
  EXPECT_EQ(last.memory.weight, layer + table + padded(kHidden * kF32)); // + LM head, final norm
  EXPECT_EQ(first.memory.loraParam, kLoraPerLayer);
  EXPECT_EQ(last.memory.loraParam, kLoraPerLayer);

  // Both layers save the same values. The first stage also keeps the embeddings; the last
  // keeps both layer outputs (layer 1's backward reads layer 0's; the final norm's backward
  // reads layer 1's), the final norm's output, the LM head's per-token logsumexp (f32) and the
  // input gradient the frozen head forms in its forward.
  int64_t hidden = kTokens * kHidden * kF32;
  EXPECT_EQ(last.memory.savedActivation - first.memory.savedActivation,
            4 * hidden + padded(kTokens * kF32) - hidden);
  EXPECT_EQ(first.memory.transientActivation, last.memory.transientActivation);
  EXPECT_EQ(first.memory.savedActivation + last.memory.savedActivation + first.memory.transientActivation,
            arena(*tiny, plan::ACTIVATION));
  EXPECT_EQ(first.memory.activation, 2 * first.memory.savedActivation + first.memory.transientActivation);

  // Four micro-batches: the first stage sends activations forward, the last sends gradients back.
  const CommEstimate *forward = find(first, "send_recv", "fwd");
  ASSERT_NE(forward, nullptr);
  EXPECT_EQ(forward->bytes, 4 * hidden);
  EXPECT_EQ(find(first, "send_recv", "bwd"), nullptr);
  const CommEstimate *backward = find(last, "send_recv", "bwd");
  ASSERT_NE(backward, nullptr);
  EXPECT_EQ(backward->bytes, 4 * hidden);
  EXPECT_EQ(find(last, "send_recv", "fwd"), nullptr);
}

TEST_F(MeshReportTest, LinksFollowTheRankOrderAndStagesTheirLayersCollectives) {
  // Every collective whose group `crosses` says crosses nodes does, at the network's speed.
  auto expectLinks = [](const MeshEstimate &e, const std::function<bool(llvm::StringRef axis)> &crosses) {
    ASSERT_EQ(e.stages.size(), 2u);
    for (const StageEstimate &st : e.stages)
      for (const CommEstimate &c : st.comm) {
        EXPECT_EQ(c.crossesNodes, crosses(c.axis)) << c.collective << " " << c.axis;
        if (!llvm::StringRef(c.collective).starts_with("expert_")) {
          EXPECT_DOUBLE_EQ(c.seconds, c.bytes / (crosses(c.axis) ? 50e9 : 900e9)) << c.collective << " " << c.axis;
        }
      }
  };
  // 32 ranks in moec's default order, tp fastest: tp (stride 1) and ep (stride 2) stay in
  // node 0, dp (stride 8) and pp (stride 16) cross nodes, as does every group with dp.
  moe::MeshShape mesh{/*dp=*/2, /*tp=*/2, /*pp=*/2, /*ep=*/4};
  expectLinks(estimate(Choice{mesh}), [](llvm::StringRef axis) { return axis.contains("dp") || axis == "pp"; });
  // Numbered ep, dp, tp, pp (--rank-order ep,dp): ep (stride 1) and dp (stride 4) stay in
  // node 0, tp (stride 8) and pp (stride 16) cross nodes, as does every group with tp.
  mesh.order = "ep,dp,tp,pp";
  MeshEstimate e = estimate(Choice{mesh});
  expectLinks(e, [](llvm::StringRef axis) { return axis.contains("tp") || axis == "pp"; });
  // Stage 0 holds layer 0's q/o adapters: q's B and o's A split over tp, summed over the 8
  // replicas of their slice (dp x ep); q's A and o's B whole, their partial gradients summed
  // over all 16 ranks of dp x ep x tp. Once a step, whatever the micro-batches.
  const CommEstimate *split = find(e.stages[0], "all_reduce", "step", "dp+ep");
  const CommEstimate *whole = find(e.stages[0], "all_reduce", "step", "dp+ep+tp");
  ASSERT_NE(split, nullptr);
  ASSERT_NE(whole, nullptr);
  EXPECT_EQ(split->groupSize, 8);
  EXPECT_EQ(whole->groupSize, 16);
  EXPECT_EQ(split->count, 1);
  EXPECT_EQ(split->bytes, 2 * 7 * (kHidden / 2 * kRank + kRank * kHidden / 2) * kF32 / 8);
  EXPECT_EQ(whole->bytes, 2 * 15 * (kRank * kHidden + kHidden * kRank) * kF32 / 16);
  // Each stage runs its layer's tp sum for each of the 4 micro-batches: the attention's (the
  // experts, split over ep, are whole on every tp rank and need none).
  const CommEstimate *sums = find(e.stages[1], "all_reduce", "fwd", "tp");
  ASSERT_NE(sums, nullptr);
  EXPECT_EQ(sums->count, 4);

  // The same ranks numbered tp, pp, ep, dp (--rank-order tp,pp): tp (stride 1) and the pipeline
  // pair (stride 2) stay in node 0, ep (stride 4: ranks 0, 4, 8, 12) and dp (stride 16) cross.
  moe::MeshShape reordered = mesh;
  reordered.order = "tp,pp,ep,dp";
  MeshEstimate r = estimate(Choice{reordered});
  expectLinks(r, [](llvm::StringRef axis) { return axis.contains("ep") || axis.contains("dp"); });
  ASSERT_EQ(r.stages.size(), e.stages.size());
  // The order moves no bytes: only which link carries them.
  for (size_t s = 0; s < e.stages.size(); ++s) {
    ASSERT_EQ(r.stages[s].comm.size(), e.stages[s].comm.size());
    for (size_t i = 0; i < e.stages[s].comm.size(); ++i)
      EXPECT_EQ(r.stages[s].comm[i].bytes, e.stages[s].comm[i].bytes);
  }

  // Which groups cross is decided per stage: dp=3,tp=2,pp=2 numbered tp, dp, pp puts stage 0
  // on ranks 0-5 (node 0) and stage 1 on ranks 6-11 (nodes 0 and 1). Stage 0's dp groups {0,2,4}
  // and {1,3,5} stay in node 0, stage 1's {6,8,10} and {7,9,11} cross; the pipeline pairs r and
  // r + 6 cross for r = 2..5 (8 and up are on node 1).
  moe::MeshShape straddling{/*dp=*/3, /*tp=*/2, /*pp=*/2, /*ep=*/1};
  straddling.order = "tp,dp,pp,ep";
  MeshEstimate st = estimate(Choice{straddling});
  ASSERT_EQ(st.stages.size(), 2u);
  const CommEstimate *dp0 = find(st.stages[0], "all_reduce", "step", "dp+ep"); // ep = 1: the dp groups
  const CommEstimate *dp1 = find(st.stages[1], "all_reduce", "step", "dp+ep");
  ASSERT_NE(dp0, nullptr);
  ASSERT_NE(dp1, nullptr);
  EXPECT_FALSE(dp0->crossesNodes);
  EXPECT_TRUE(dp1->crossesNodes);
  const CommEstimate *forward = find(st.stages[0], "send_recv", "fwd");
  const CommEstimate *backward = find(st.stages[1], "send_recv", "bwd");
  ASSERT_NE(forward, nullptr);
  ASSERT_NE(backward, nullptr);
  EXPECT_TRUE(forward->crossesNodes);
  EXPECT_TRUE(backward->crossesNodes);

  // ep=8 on nodes of 4 GPUs spans two nodes: 3 of the 7 peers share the node, 4 are across.
  MeshOptions small;
  small.gpusPerNode = 4;
  MeshEstimate wide = estimate(Choice{moe::MeshShape{1, 1, 1, 8}}, small);
  ASSERT_EQ(wide.stages.size(), 1u);
  const CommEstimate *send = find(wide.stages[0], "expert_send", "fwd");
  ASSERT_NE(send, nullptr);
  EXPECT_TRUE(send->crossesNodes);
  EXPECT_DOUBLE_EQ(send->seconds, std::max(send->bytes * (3.0 / 7) / 900e9, send->bytes * (4.0 / 7) / 50e9));
}

TEST_F(MeshReportTest, ExpertAdaptersSplitOverEpAndReduceOverDp) {
  Choice choice{moe::MeshShape{/*dp=*/2, 1, 1, /*ep=*/2}};
  choice.expertLora = true;
  MeshEstimate e = estimate(choice);
  ASSERT_EQ(e.stages.size(), 1u);
  // Per layer and projection: A [experts, r, in], B [experts, out, r]; gate/up 96 -> 48, down 48 -> 96.
  int64_t expertLora = kLayers * 3 * kExperts * (kRank * kHidden + kExpertWidth * kRank) * kF32;
  const StageEstimate &st = e.stages[0];
  EXPECT_EQ(st.memory.loraParam, kLayers * kLoraPerLayer + expertLora / 2);
  EXPECT_EQ(st.memory.gradient, kLayers * kLoraPerLayer + expertLora / 2);
  const CommEstimate *dense = find(st, "all_reduce", "step", "dp+ep");
  const CommEstimate *experts = find(st, "all_reduce", "step", "dp");
  ASSERT_NE(dense, nullptr);
  ASSERT_NE(experts, nullptr);
  EXPECT_EQ(dense->bytes, 2 * 3 * kLayers * kLoraPerLayer / 4); // dp x ep = 4 ranks
  EXPECT_EQ(experts->groupSize, 2);
  EXPECT_EQ(experts->bytes, expertLora / 2); // 2(n-1)/n = 1 for n = 2
}

TEST_F(MeshReportTest, RecomputeRepeatsTheForwardCollectives) {
  Choice choice{moe::MeshShape{1, /*tp=*/2, 1, /*ep=*/2}};
  choice.recompute = "per-layer";
  std::unique_ptr<Compiled> slice = compile(choice);
  ASSERT_NE(slice, nullptr);
  MeshEstimate e = estimateMesh(slice->program, choice.mesh);
  EXPECT_TRUE(e.recomputes);
  const StageEstimate &st = e.stages[0];
  // The recomputed forward routes and sends each layer's tokens again (every tp rank its
  // whole tokens: without sequence parallel they are replicated over tp), as the forward does.
  for (const char *collective : {"expert_route", "expert_send"}) {
    const CommEstimate *again = find(st, collective, "recompute"), *first = find(st, collective, "fwd");
    ASSERT_NE(again, nullptr) << collective;
    ASSERT_NE(first, nullptr) << collective;
    EXPECT_EQ(again->count, first->count) << collective;
    EXPECT_EQ(again->bytes, first->bytes) << collective;
  }
  std::unique_ptr<Compiled> saved = compile(Choice{choice.mesh});
  ASSERT_NE(saved, nullptr);
  EXPECT_LT(st.memory.activation, estimateMesh(saved->program, choice.mesh).stages[0].memory.activation);
}

TEST_F(MeshReportTest, SaysWhetherItFitsAndWhatWould) {
  int64_t total = tiny->program.peakBytes();
  MeshOptions roomy;
  roomy.gpuBytes = total + 1000;
  MeshEstimate fits = estimateMesh(tiny->program, moe::MeshShape{}, roomy);
  EXPECT_TRUE(fits.fits);
  EXPECT_EQ(fits.marginBytes, 1000);
  MeshOptions tight;
  tight.gpuBytes = total - 1000;
  MeshEstimate over = estimateMesh(tiny->program, moe::MeshShape{}, tight);
  EXPECT_FALSE(over.fits);
  EXPECT_EQ(over.marginBytes, -1000);

  // Too small a GPU: the suggestions plan the other slices they try.
  moe::MeshShape mesh{2, 2, 2, 2};
  std::unique_ptr<Compiled> slice = compile(Choice{mesh});
  ASSERT_NE(slice, nullptr);
  std::vector<std::unique_ptr<Compiled>> planned;
  SlicePlanner plan = [&](const SliceChoice &choice) -> mlir::FailureOr<Program> {
    Choice c{choice.mesh};
    c.mayFail = true;
    c.sequenceParallel = choice.sequenceParallel;
    c.epCapacityFactor = choice.epCapacityFactor;
    c.recompute = choice.recomputeLayers ? "per-layer" : "none";
    planned.push_back(compile(c));
    if (!planned.back())
      return mlir::failure();
    return planned.back()->program;
  };
  MeshOptions small;
  small.gpuBytes = 1'000'000;
  std::string text;
  llvm::raw_string_ostream os(text);
  printMeshReport(tiny->model, slice->program, mesh, small, plan, os);
  EXPECT_NE(text.find("fits in 0 GB: no"), std::string::npos) << text;
  EXPECT_NE(text.find("to fit, try"), std::string::npos) << text;
  EXPECT_NE(text.find("--mesh dp=2,tp=2,pp=2,ep=2 --sequence-parallel (16 GPUs"), std::string::npos) << text;
  // Only choices that shrink the worst stage: at ep = 2 twice the balanced load is every token
  // (no smaller room), and ep = 4 doubles the exchange's room more than it halves the experts.
  EXPECT_EQ(text.find("--ep-capacity-factor 2"), std::string::npos) << text;
  EXPECT_EQ(text.find("ep=4"), std::string::npos) << text;
  // tp = 4 does not split the 4 heads and 2 key/value heads: said, not estimated.
  EXPECT_NE(text.find("--mesh dp=2,tp=4,pp=2,ep=2 --sequence-parallel=false: does not plan"), std::string::npos) << text;
  // Activations are most of the tiny model's stage: recompute is planned and estimated.
  Choice recompute{mesh};
  recompute.recompute = "per-layer";
  std::unique_ptr<Compiled> recomputed = compile(recompute);
  ASSERT_NE(recomputed, nullptr);
  MeshEstimate r = estimateMesh(recomputed->program, mesh, small);
  std::string line = llvm::formatv("--mesh dp=2,tp=2,pp=2,ep=2 --sequence-parallel=false --recompute per-layer (16 GPUs; keeps only the "
                                   "layers' inputs and routing): worst stage {0:F2} GB",
                                   r.stages[r.worstMemoryStage].memory.total() / 1e9)
                         .str();
  EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
  EXPECT_NE(text.find("--mesh dp=2,tp=2,pp=2,ep=2 --sequence-parallel --recompute per-layer (16 GPUs; with the above)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("expert_send"), std::string::npos) << text;
  EXPECT_NE(text.find("assumptions:"), std::string::npos) << text;
}

} // namespace
} // namespace moec::compiler
