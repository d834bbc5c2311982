//===- PlanFormat.h - plan version and enum names ---------------*- C++ -*-===//
//
// The constants and names that the loader, the validator, the text dump and
// the compiler's emitter share, so that every message spells a role or a
// dtype the same way.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_PLAN_PLANFORMAT_H_
#define RUNTIME_PLAN_PLANFORMAT_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "runtime/plan/plan.pb.h"

namespace moec::plan {

/// The one version this runtime reads; see the versioning rule in plan.proto.
constexpr uint32_t kPlanVersion = 2;

/// Bytes per element; 0 for DTYPE_UNSPECIFIED and values outside the enum.
int64_t dtypeSize(DType dtype);

// Lower-case names as the text dump and the validator print them
// ("activation", "bf16", "fwd", "all_reduce"). UNSPECIFIED prints as
// "unspecified" and a value outside the enum (a newer or corrupt plan) as
// "unknown", so none of these ever return null.
const char *roleName(Role role);
const char *dtypeName(DType dtype);
const char *phaseName(Phase phase);
const char *collectiveKindName(Collective::Kind kind);

/// Rank `rank`'s coordinate along `axis` ("dp", "tp", "pp", "ep") of `mesh`, numbered in its
/// rank_order (when empty, MeshShape's default, which moec leaves unwritten); 0 for an axis of
/// size 1 or another name.
int meshCoordinate(const Mesh &mesh, int rank, std::string_view axis);

/// "[4096,2048]"; "[]" for a scalar.
std::string shapeToString(const google::protobuf::RepeatedField<int64_t> &shape);

} // namespace moec::plan

#endif // RUNTIME_PLAN_PLANFORMAT_H_
