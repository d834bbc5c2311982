//===- Passes.h - every MoEC pass ------------------------------*- C++ -*-===//
//
// One folder per pass (passes/<name>/), each with its .td entry, .cpp and lit
// tests; this header registers them all for moe-opt and moec.
//
//===----------------------------------------------------------------------===//

#ifndef PASSES_PASSES_H_
#define PASSES_PASSES_H_

#include "passes/build_training_step/BuildTrainingStep.h"
#include "passes/fuse/Fuse.h"
#include "passes/fuse_lora/FuseLoRA.h"
#include "passes/inject_lora/InjectLoRA.h"
#include "passes/plan_memory/PlanMemory.h"
#include "passes/propagate_sharding/PropagateSharding.h"
#include "passes/schedule_overlap/ScheduleOverlap.h"
#include "passes/schedule_pipeline/SchedulePipeline.h"
#include "passes/sync_gradients/SyncGradients.h"

namespace moec::passes {

/// Registers every MoEC pass with the global pass registry.
inline void registerAllPasses() {
  registerInjectLoRAPass();
  registerPropagateShardingPass();
  registerBuildTrainingStepPass();
  registerSyncGradientsPass();
  registerFusePass();
  registerFuseLoRAPass();
  registerSchedulePipelinePass();
  registerScheduleOverlapPass();
  registerPlanMemoryPass();
}

} // namespace moec::passes

#endif // PASSES_PASSES_H_
