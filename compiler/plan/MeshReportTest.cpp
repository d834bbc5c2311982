//===- MeshReportTest.cpp - per-GPU memory and communication of a mesh ----===//
//
// The tiny Qwen3-MoE (models/tiny-qwen3-moe/config.json) compiled for 2 x 64
// tokens with LoRA on q_proj and o_proj, estimated on small meshes. Expected
// numbers come from the config's sizes and the stated split rules, computed
// here by hand; only the activation arena (what the training-step builder
// saves) is taken from the single-rank program.
//
//===----------------------------------------------------------------------===//

#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>

#include "compiler/frontend/ImportModel.h"
#include "compiler/pipelines/Pipelines.h"
#include "compiler/plan/MeshReport.h"
#include "compiler/plan/Program.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
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

std::unique_ptr<Compiled> compile(bool expertLora, const char *recompute = "none") {
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
  if (expertLora)
    targets.insert(targets.end(), {"gate_proj", "up_proj", "down_proj"});
  options.loraTargets = targets;
  options.expertLora = expertLora;
  options.loraRank = kRank;
  options.seqLen = kSeqLen;
  options.microBatch = kMicroBatch;
  options.recompute = recompute;
  mlir::PassManager pm(compiled->context.get());
  pipelines::buildLoRATrainingPipeline(pm, options);
  if (failed(pm.run(*compiled->module))) {
    ADD_FAILURE() << "the pipeline failed";
    return nullptr;
  }
  compiled->model = *compiled->module->getOps<moe::ModelOp>().begin();
  mlir::FailureOr<Program> program = buildProgram(compiled->model, kSeqLen, kMicroBatch);
  if (failed(program)) {
    ADD_FAILURE() << "buildProgram failed";
    return nullptr;
  }
  compiled->program = std::move(*program);
  assignOffsets(compiled->program);
  return compiled;
}

class MeshReportTest : public ::testing::Test {
protected:
  static void SetUpTestSuite() { tiny = compile(/*expertLora=*/false).release(); }
  static void TearDownTestSuite() {
    delete tiny;
    tiny = nullptr;
  }
  void SetUp() override { ASSERT_NE(tiny, nullptr); }

  static MeshEstimate estimate(moe::MeshShape mesh, MeshOptions options = {}) {
    return estimateMesh(tiny->program, mesh, options);
  }
  static int64_t arena(plan::Role role) { return tiny->program.arenaBytes()[role]; }

  static Compiled *tiny;
};
Compiled *MeshReportTest::tiny = nullptr;

const CommEstimate *find(const StageEstimate &stage, const std::string &collective,
                         const std::string &phase) {
  for (const CommEstimate &c : stage.comm)
    if (c.collective == collective && c.phase == phase)
      return &c;
  return nullptr;
}

// Bytes of one routed-expert tensor ([experts, 48, 96] or [experts, 96, 48]).
constexpr int64_t kExpertTensor = kExperts * kExpertWidth * kHidden * kF32;
// Each layer's q_proj and o_proj adapters: A [r, 96] and B [96, r].
constexpr int64_t kLoraPerLayer = 2 * (kRank * kHidden + kHidden * kRank) * kF32;

TEST_F(MeshReportTest, OneRankIsTheSingleRankArenas) {
  MeshEstimate e = estimate(moe::MeshShape{});
  ASSERT_EQ(e.stages.size(), 1u);
  const MemoryByRole &mem = e.stages[0].memory;
  EXPECT_EQ(mem.weight, arena(plan::WEIGHT));
  EXPECT_EQ(mem.loraParam, arena(plan::LORA_PARAM));
  EXPECT_EQ(mem.gradient, arena(plan::GRADIENT));
  EXPECT_EQ(mem.optimizerState, arena(plan::OPTIMIZER_STATE));
  EXPECT_EQ(mem.activation, arena(plan::ACTIVATION));
  EXPECT_EQ(mem.workspace, arena(plan::WORKSPACE));
  EXPECT_EQ(mem.input, arena(plan::INPUT));
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
  MeshEstimate one = estimate(moe::MeshShape{});
  MeshEstimate e = estimate(moe::MeshShape{1, 1, 1, /*ep=*/2});
  const MemoryByRole &mem = e.stages[0].memory;
  // 3 expert tensors per layer, each split in two along the experts.
  EXPECT_EQ(mem.expertWeight, kLayers * 3 * (kExpertTensor / 2));
  EXPECT_EQ(mem.weight, one.stages[0].memory.weight - kLayers * 3 * (kExpertTensor / 2));
  EXPECT_EQ(mem.loraParam, kLayers * kLoraPerLayer); // q/o adapters are not experts' adapters
  EXPECT_EQ(mem.activation, arena(plan::ACTIVATION));

  // Per MoE layer one dispatch and one combine each way: each token's row of the model width
  // once to the other GPU when one of its 2 experts (of 8) is there: all but C(4,2)/C(8,2) =
  // 6/28 of the tokens.
  double tokenRows = double(kTokens) * kHidden * kF32;
  for (const char *phase : {"fwd", "bwd"}) {
    const CommEstimate *a2a = find(e.stages[0], "all-to-all", phase);
    ASSERT_NE(a2a, nullptr) << phase;
    EXPECT_EQ(a2a->axis, "ep");
    EXPECT_EQ(a2a->groupSize, 2);
    EXPECT_EQ(a2a->count, 2 * kLayers);
    EXPECT_EQ(a2a->bytes, std::llround(2 * kLayers * tokenRows * 22.0 / 28.0));
    EXPECT_FALSE(a2a->crossesNodes);
    EXPECT_DOUBLE_EQ(a2a->seconds, a2a->bytes / 900e9);
  }
  EXPECT_EQ(find(e.stages[0], "all-to-all", "recompute"), nullptr);

  // ep=4: to each of 3 other GPUs, all tokens but those with both experts among its 6 others
  // (C(6,2)/C(8,2) = 15/28).
  MeshEstimate four = estimate(moe::MeshShape{1, 1, 1, 4});
  const CommEstimate *a2a = find(four.stages[0], "all-to-all", "fwd");
  ASSERT_NE(a2a, nullptr);
  EXPECT_EQ(a2a->bytes, std::llround(2 * kLayers * tokenRows * 13.0 / 28.0 * 3));
  EXPECT_EQ(four.stages[0].memory.expertWeight, kLayers * 3 * (kExpertTensor / 4));

  // The ep ranks run their own tokens: the q/o LoRA gradients are summed over them.
  const CommEstimate *grads = find(e.stages[0], "all-reduce", "step");
  ASSERT_NE(grads, nullptr);
  EXPECT_EQ(grads->axis, "ep");
  EXPECT_EQ(grads->bytes, kLayers * kLoraPerLayer); // 2(n-1)/n = 1 for n = 2
}

TEST_F(MeshReportTest, TensorParallelSplitsLinearsByTheirRole) {
  MeshEstimate e = estimate(moe::MeshShape{1, /*tp=*/2, 1, 1});
  const MemoryByRole &mem = e.stages[0].memory;
  int64_t q = kHeads * kHeadDim * kHidden * kF32, kv = kKvHeads * kHeadDim * kHidden * kF32;
  int64_t perLayer = padded(kHidden * kF32)                   // input_layernorm, replicated
                     + q / 2 + kv / 2 + kv / 2                // q/k/v column-parallel
                     + 2 * padded(kHeadDim * kF32)            // q_norm, k_norm, replicated
                     + kHidden * kHeads * kHeadDim * kF32 / 2 // o_proj row-parallel
                     + padded(kHidden * kF32)                 // post_attention_layernorm
                     + kExperts * kHidden * kF32              // router, replicated
                     + 3 * padded(kExpertTensor / 2);         // experts: their features split (no ep)
  int64_t modelLevel = 2 * kVocab * kHidden * kF32 / 2        // embedding, LM head: vocab-parallel
                       + padded(kHidden * kF32);              // final norm
  EXPECT_EQ(mem.weight, kLayers * perLayer + modelLevel);
  // q_proj column-parallel: B [96/2, r] split, A whole; o_proj row-parallel: A [r, 96/2], B whole.
  int64_t lora =
      kLayers * (kRank * kHidden + kHidden / 2 * kRank + kRank * kHidden / 2 + kHidden * kRank) * kF32;
  EXPECT_EQ(mem.loraParam, lora);
  EXPECT_EQ(mem.gradient, lora);
  EXPECT_EQ(mem.optimizerState, 2 * lora);
  // Sequence parallel: every activation, the workspace and the scratch halve.
  EXPECT_EQ(mem.activation, arena(plan::ACTIVATION) / 2);
  EXPECT_EQ(mem.workspace, arena(plan::WORKSPACE) / 2);
  EXPECT_EQ(mem.scratch, (tiny->program.scratchBytes() + 1) / 2);

  // Per layer the attention block only (the MoE block is routed experts only): all-gather +
  // reduce-scatter forward and backward; the embedding's reduce-scatter, the LM head's
  // all-gather (fwd) and reduce-scatter (bwd). Each sends half of [tokens, hidden].
  int64_t wire = kTokens * kHidden * kF32 / 2;
  const StageEstimate &st = e.stages[0];
  struct Expect {
    const char *collective, *phase;
    int64_t count;
  } expects[] = {{"all-gather", "fwd", kLayers + 1},
                 {"reduce-scatter", "fwd", kLayers + 1},
                 {"all-gather", "bwd", kLayers},
                 {"reduce-scatter", "bwd", kLayers + 1}};
  for (const Expect &x : expects) {
    const CommEstimate *c = find(st, x.collective, x.phase);
    ASSERT_NE(c, nullptr) << x.collective << " " << x.phase;
    EXPECT_EQ(c->count, x.count) << x.collective << " " << x.phase;
    EXPECT_EQ(c->bytes, x.count * wire) << x.collective << " " << x.phase;
    EXPECT_EQ(c->axis, "tp");
    EXPECT_FALSE(c->crossesNodes);
  }
  EXPECT_EQ(st.comm.size(), 4u);

  // --tp-replicate experts keeps them whole; the rest splits as before. Without pp, the
  // micro-batches option has no effect (as on the plan).
  MeshOptions whole;
  whole.expertsWholeOverTp = true;
  whole.microBatches = 4;
  MeshEstimate replicated = estimate(moe::MeshShape{1, /*tp=*/2, 1, 1}, whole);
  EXPECT_EQ(replicated.stages[0].memory.weight - mem.weight, kLayers * 3 * (kExpertTensor - padded(kExpertTensor / 2)));
  EXPECT_EQ(replicated.microBatches, 1);
}

TEST_F(MeshReportTest, PipelineStagesSplitLayersAndHoldMicroBatchesInFlight) {
  MeshEstimate e = estimate(moe::MeshShape{1, 1, /*pp=*/2, 1});
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
            arena(plan::ACTIVATION));
  EXPECT_EQ(first.memory.activation, 2 * first.memory.savedActivation + first.memory.transientActivation);

  // Four micro-batches: the first stage sends activations forward, the last sends gradients back.
  const CommEstimate *forward = find(first, "send/recv", "fwd");
  ASSERT_NE(forward, nullptr);
  EXPECT_EQ(forward->bytes, 4 * hidden);
  EXPECT_EQ(find(first, "send/recv", "bwd"), nullptr);
  const CommEstimate *backward = find(last, "send/recv", "bwd");
  ASSERT_NE(backward, nullptr);
  EXPECT_EQ(backward->bytes, 4 * hidden);
  EXPECT_EQ(find(last, "send/recv", "fwd"), nullptr);
}

TEST_F(MeshReportTest, LinksFollowTheRankOrder) {
  // 32 ranks, ep fastest: ep (stride 1) and dp (stride 4) stay in node 0, tp (stride 8) and
  // pp (stride 16) cross nodes.
  MeshEstimate e = estimate(moe::MeshShape{/*dp=*/2, /*tp=*/2, /*pp=*/2, /*ep=*/4});
  for (const StageEstimate &st : e.stages)
    for (const CommEstimate &c : st.comm) {
      bool crosses = c.axis == "tp" || c.axis == "pp";
      EXPECT_EQ(c.crossesNodes, crosses) << c.collective << " " << c.axis;
      EXPECT_DOUBLE_EQ(c.seconds, c.bytes / (crosses ? 50e9 : 900e9)) << c.collective << " " << c.axis;
    }
  const CommEstimate *grads = find(e.stages[0], "all-reduce", "step");
  ASSERT_NE(grads, nullptr);
  EXPECT_EQ(grads->axis, "dp+ep");
  EXPECT_EQ(grads->groupSize, 8);
  // Stage 0 holds layer 0's q/o adapters, A whole and B halved (q) or the reverse (o).
  int64_t lora = (kRank * kHidden + kHidden / 2 * kRank + kRank * kHidden / 2 + kHidden * kRank) * kF32;
  EXPECT_EQ(grads->bytes, 2 * 7 * lora / 8);

  // ep=16 spans two nodes: 7 of the 15 peers share the node, 8 are across.
  MeshEstimate wide = estimate(moe::MeshShape{1, 1, 1, 16});
  const CommEstimate *a2a = find(wide.stages[0], "all-to-all", "fwd");
  ASSERT_NE(a2a, nullptr);
  EXPECT_TRUE(a2a->crossesNodes);
  EXPECT_DOUBLE_EQ(a2a->seconds, std::max(a2a->bytes * (7.0 / 15) / 900e9, a2a->bytes * (8.0 / 15) / 50e9));
}

TEST_F(MeshReportTest, ExpertAdaptersSplitOverEpAndReduceOverDp) {
  std::unique_ptr<Compiled> withExperts = compile(/*expertLora=*/true);
  ASSERT_NE(withExperts, nullptr);
  MeshEstimate e = estimateMesh(withExperts->program, moe::MeshShape{/*dp=*/2, 1, 1, /*ep=*/2});
  // Per layer and projection: A [experts, r, in], B [experts, out, r]; gate/up 96 -> 48, down 48 -> 96.
  int64_t expertLora = kLayers * 3 * kExperts * (kRank * kHidden + kExpertWidth * kRank) * kF32;
  const StageEstimate &st = e.stages[0];
  EXPECT_EQ(st.memory.loraParam, kLayers * kLoraPerLayer + expertLora / 2);
  EXPECT_EQ(st.memory.gradient, kLayers * kLoraPerLayer + expertLora / 2);
  int64_t dense = 0, experts = 0;
  for (const CommEstimate &c : st.comm) {
    if (c.what == "LoRA gradients")
      dense = c.bytes;
    if (c.what == "expert LoRA gradients") {
      experts = c.bytes;
      EXPECT_EQ(c.axis, "dp");
      EXPECT_EQ(c.groupSize, 2);
    }
  }
  EXPECT_EQ(dense, 2 * 3 * kLayers * kLoraPerLayer / 4); // dp x ep = 4 ranks
  EXPECT_EQ(experts, expertLora / 2);                    // 2(n-1)/n = 1 for n = 2
}

TEST_F(MeshReportTest, RecomputeRepeatsTheForwardCollectives) {
  std::unique_ptr<Compiled> recomputed = compile(/*expertLora=*/false, "per-layer");
  ASSERT_NE(recomputed, nullptr);
  MeshEstimate e = estimateMesh(recomputed->program, moe::MeshShape{1, /*tp=*/2, 1, /*ep=*/2});
  EXPECT_TRUE(e.recomputes);
  const StageEstimate &st = e.stages[0];
  // The recomputed forward re-sends each layer's dispatched rows (this GPU's tokens / tp);
  // the combine's output is not needed again.
  const CommEstimate *a2a = find(st, "all-to-all", "recompute");
  ASSERT_NE(a2a, nullptr);
  EXPECT_EQ(a2a->what, "dispatch");
  EXPECT_EQ(a2a->count, kLayers);
  EXPECT_EQ(a2a->bytes, std::llround(kLayers * double(kTokens / 2) * kHidden * kF32 * 22.0 / 28.0));
  // And the attention block's all-gather and reduce-scatter.
  for (const char *collective : {"all-gather", "reduce-scatter"}) {
    const CommEstimate *c = find(st, collective, "recompute");
    ASSERT_NE(c, nullptr) << collective;
    EXPECT_EQ(c->count, kLayers);
    EXPECT_EQ(c->bytes, kLayers * kTokens * kHidden * kF32 / 2);
  }
  EXPECT_LT(st.memory.activation, estimate(moe::MeshShape{1, 2, 1, 2}).stages[0].memory.activation);
}

TEST_F(MeshReportTest, SaysWhetherItFits) {
  int64_t total = tiny->program.peakBytes();
  MeshOptions roomy;
  roomy.gpuBytes = total + 1000;
  MeshEstimate fits = estimate(moe::MeshShape{}, roomy);
  EXPECT_TRUE(fits.fits);
  EXPECT_EQ(fits.marginBytes, 1000);
  MeshOptions tight;
  tight.gpuBytes = total - 1000;
  MeshEstimate over = estimate(moe::MeshShape{}, tight);
  EXPECT_FALSE(over.fits);
  EXPECT_EQ(over.marginBytes, -1000);

  std::string text;
  llvm::raw_string_ostream os(text);
  printMeshReport(tiny->model, tiny->program, moe::MeshShape{2, 2, 2, 2}, /*gpuBytes=*/1'000'000, os);
  EXPECT_NE(text.find("fits in 0 GB: no"), std::string::npos) << text;
  EXPECT_NE(text.find("to fit, try"), std::string::npos) << text;
  EXPECT_NE(text.find("all-to-all"), std::string::npos) << text;
  EXPECT_NE(text.find("assumptions:"), std::string::npos) << text;
}

} // namespace
} // namespace moec::compiler
