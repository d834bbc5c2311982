//===- TestPlan.h - a small valid plan for the plan tests -------*- C++ -*-===//

#ifndef RUNTIME_PLAN_TESTPLAN_H_
#define RUNTIME_PLAN_TESTPLAN_H_

#include <initializer_list>
#include <string>

#include "runtime/plan/plan.pb.h"

namespace moec::plan::testing {

/// A two-rank (tp=2) plan that passes validatePlan and uses every part of
/// the format: all seven roles, an {expert} binding and a sliced binding,
/// launches with each attribute kind, an all-reduce over a group, a
/// record/wait pair across two streams, two workspace buffers sharing bytes
/// at disjoint live ranges, the optimizer and the LoRA layout. Buffer and
/// step numbers are listed in TestPlan.cpp; tests break one field each.
Plan makeValidPlan();

/// Appends a buffer (id = its index) of `shape` at `offset` of its role's arena, live over
/// steps [first, last]; returns its id.
uint32_t addTestBuffer(Rank &rank, const std::string &name, Role role, DType dtype,
                       std::initializer_list<int64_t> shape, int64_t offset, int32_t first, int32_t last);

} // namespace moec::plan::testing

#endif // RUNTIME_PLAN_TESTPLAN_H_
