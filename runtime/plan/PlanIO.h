//===- PlanIO.h - read and write plan files ---------------------*- C++ -*-===//
//
// A plan file is the binary protobuf serialization of moec.plan.Plan and
// nothing else (no header): `protoc --decode=moec.plan.Plan plan.proto`
// reads it.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_PLAN_PLANIO_H_
#define RUNTIME_PLAN_PLANIO_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/plan/plan.pb.h"

namespace moec::plan {

/// Reads, parses and validates the plan at `path`. Every error message
/// starts with the path: NotFound (or the errno's code) when it cannot be
/// read, InvalidArgument when it is not a plan or fails validatePlan.
absl::StatusOr<Plan> loadPlan(const std::string &path);

/// Writes `plan` to `path` atomically: a temporary `path.tmp.<pid>` in the
/// same directory is written, fsynced and renamed over `path`, so readers
/// see the old file or the new one, never half of one. On failure the
/// temporary is removed and an existing `path` is left untouched. Does not
/// validate; the compiler calls validatePlan before saving.
absl::Status savePlan(const Plan &plan, const std::string &path);

} // namespace moec::plan

#endif // RUNTIME_PLAN_PLANIO_H_
