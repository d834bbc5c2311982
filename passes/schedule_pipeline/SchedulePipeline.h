//===- SchedulePipeline.h - pipeline stages in 1F1B order -------*- C++ -*-===//

#ifndef PASSES_SCHEDULE_PIPELINE_SCHEDULEPIPELINE_H_
#define PASSES_SCHEDULE_PIPELINE_SCHEDULEPIPELINE_H_

#include "dialects/moe/MoeOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Pass/Pass.h"

namespace moec::passes {

#define GEN_PASS_DECL_SCHEDULEPIPELINEPASS
#define GEN_PASS_REGISTRATION
#include "passes/schedule_pipeline/SchedulePipeline.h.inc"

} // namespace moec::passes

#endif // PASSES_SCHEDULE_PIPELINE_SCHEDULEPIPELINE_H_
