//===- ScheduleOverlap.h - communication on its own stream ------*- C++ -*-===//

#ifndef PASSES_SCHEDULE_OVERLAP_SCHEDULEOVERLAP_H_
#define PASSES_SCHEDULE_OVERLAP_SCHEDULEOVERLAP_H_

#include "dialects/moe/MoeOps.h"
#include "mlir/Pass/Pass.h"

namespace moec::passes {

#define GEN_PASS_DECL_SCHEDULEOVERLAPPASS
#define GEN_PASS_REGISTRATION
#include "passes/schedule_overlap/ScheduleOverlap.h.inc"

} // namespace moec::passes

#endif // PASSES_SCHEDULE_OVERLAP_SCHEDULEOVERLAP_H_
