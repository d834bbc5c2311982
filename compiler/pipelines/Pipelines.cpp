//===- Pipelines.cpp - named pass pipelines -------------------------------===//

#include "compiler/pipelines/Pipelines.h"

#include "passes/Passes.h"
#include "mlir/Pass/PassRegistry.h"

namespace moec::pipelines {

void buildLoRATrainingPipeline(mlir::OpPassManager &pm, const LoRATrainingOptions &options) {
  mlir::OpPassManager &model = pm.nest<moe::ModelOp>();
  if (!options.loraTargets.empty() || !options.adapterConfig.empty()) {
    passes::InjectLoRAPassOptions lora;
    lora.rank = options.loraRank;
    lora.alpha = options.loraAlpha;
    lora.dropout = options.loraDropout;
    lora.targets.assign(options.loraTargets.begin(), options.loraTargets.end());
    lora.expertLora = options.expertLora;
    lora.rslora = options.rslora;
    lora.adapterConfig = options.adapterConfig;
    model.addPass(passes::createInjectLoRAPass(lora));
  }
  passes::BuildTrainingStepPassOptions step;
  step.recompute = options.recompute;
  step.expertBackward = options.expertBackward;
  step.lr = options.lr;
  step.warmupSteps = options.warmupSteps;
  step.totalSteps = options.totalSteps;
  step.schedule = options.schedule;
  step.weightDecay = options.weightDecay;
  step.maxGradNorm = options.maxGradNorm;
  // On a mesh: the forward's collectives before the step differentiates through them, the
  // gradient sums after. Tensor-parallel options without a mesh reach the pass, which refuses
  // them (one rank has no tp).
  if (!options.mesh.empty() || options.sequenceParallel || !options.tpReplicate.empty()) {
    passes::PropagateShardingPassOptions sharding;
    sharding.mesh = options.mesh;
    sharding.epExchange = options.epExchange;
    sharding.tokenBlocks = options.tokenBlocks;
    sharding.epCapacityFactor = options.epCapacityFactor;
    sharding.sequenceParallel = options.sequenceParallel;
    sharding.tpReplicate.assign(options.tpReplicate.begin(), options.tpReplicate.end());
    model.addPass(passes::createPropagateShardingPass(sharding));
  }
  model.addPass(passes::createBuildTrainingStepPass(step));
  if (!options.mesh.empty())
    model.addPass(passes::createSyncGradientsPass());
  // After the step: the loss it builds is what the LM head fuses with (inject-lora never
  // adapts the head, so the pattern is the same with or without adapters).
  // After the step too: the fused projections' backward stays the unfused ops' (the same sums
  // in the same order, as the alignment tests hold them to PEFT's).
  if (options.fuseLora)
    model.addPass(passes::createFuseLoRAPass());
  if (options.fuse) {
    passes::FusePassOptions fuse;
    fuse.chunkTokens = options.fuseChunkTokens;
    model.addPass(passes::createFusePass(fuse));
  }
  // Last before memory planning: the stages' programs are what each rank holds.
  if (!options.mesh.empty()) {
    passes::SchedulePipelinePassOptions pipeline;
    pipeline.microBatches = options.pipelineMicroBatches;
    model.addPass(passes::createSchedulePipelinePass(pipeline));
  }
  // Streams last: the order of every function and template is final.
  if (!options.mesh.empty() && options.overlap)
    model.addPass(passes::createScheduleOverlapPass());
  passes::PlanMemoryPassOptions memory;
  memory.seqLen = options.seqLen;
  memory.microBatch = options.microBatch;
  memory.memoryCap = options.memoryCap;
  model.addPass(passes::createPlanMemoryPass(memory));
}

void registerPipelines() {
  mlir::PassPipelineRegistration<LoRATrainingOptions>(
      "moe-lora-training",
      "LoRA injection, training step, fusion and memory planning: what `moec compile` runs",
      buildLoRATrainingPipeline);
}

} // namespace moec::pipelines
