//===- PlanValidator.h - reject a bad plan with a message -------*- C++ -*-===//
//
// The runtime trusts a plan only after it passes here: every index it will
// follow is in range, every buffer fits its arena and never shares bytes with
// a buffer live at the same time, every communicator is declared alike by all
// its members and used in the same order, and the optimizer and LoRA layout
// are usable. What is checked, rule by rule, is listed in docs/plan.md
// ("Validation").
//
// Messages name the place first (`rank 0, buffer 12 "layer3.q": `), then the
// field as plan.proto spells it, what was found and what was expected, so a
// compiler author can find the emitter bug without a debugger.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_PLAN_PLANVALIDATOR_H_
#define RUNTIME_PLAN_PLANVALIDATOR_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "runtime/plan/plan.pb.h"

namespace moec::plan {

/// The check the runtime runs on load. OK for a valid plan; otherwise
/// InvalidArgument whose message is "invalid plan: N problem(s)" and then
/// the first 100 problems, one per line (see findPlanProblems).
absl::Status validatePlan(const Plan &plan);

/// The same check as a list, for tools and tests: every problem in plan
/// order (header, optimizer, LoRA layout, rank by rank, then across ranks).
/// Holds the first `limit` problems and, when there were more, one last line
/// "... and N more problem(s)". Empty means valid. Never crashes on any input.
std::vector<std::string> findPlanProblems(const Plan &plan, size_t limit = 100);

} // namespace moec::plan

#endif // RUNTIME_PLAN_PLANVALIDATOR_H_
