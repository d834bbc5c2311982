//===- TestPlan.h - a small valid plan for the plan tests -------*- C++ -*-===//

#ifndef RUNTIME_PLAN_TESTPLAN_H_
#define RUNTIME_PLAN_TESTPLAN_H_

#include "runtime/plan/plan.pb.h"

namespace moec::plan::testing {

/// A two-rank (tp=2) plan that passes validatePlan and uses every part of
/// the format: all seven roles, an {expert} binding and a sliced binding,
/// launches with each attribute kind, an all-reduce over a group, a
/// record/wait pair across two streams, two workspace buffers sharing bytes
/// at disjoint live ranges, the optimizer and the LoRA layout. Buffer and
/// step numbers are listed in TestPlan.cpp; tests break one field each.
Plan makeValidPlan();

} // namespace moec::plan::testing

#endif // RUNTIME_PLAN_TESTPLAN_H_
