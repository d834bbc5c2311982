//===- PlanFormat.cpp - plan version and enum names -----------------------===//

#include "runtime/plan/PlanFormat.h"

#include <algorithm>

#include "absl/strings/str_join.h"
#include "dialects/moe/MeshShape.h"

namespace moec::plan {

int64_t dtypeSize(DType dtype) {
  switch (dtype) {
  case F32:
  case I32:
    return 4;
  case BF16:
  case F16:
    return 2;
  case I64:
    return 8;
  default:
    return 0;
  }
}

int meshCoordinate(const Mesh &mesh, int rank, std::string_view axis) {
  // The compiler's MeshShape numbers the ranks; the plan gives it the sizes and the order.
  moe::MeshShape shape{std::max(1, mesh.dp()), std::max(1, mesh.tp()), std::max(1, mesh.pp()),
                       std::max(1, mesh.ep())};
  if (mesh.rank_order_size())
    shape.order = absl::StrJoin(mesh.rank_order(), ",");
  return static_cast<int>(shape.coordinate(rank, std::string(axis)));
}

const char *roleName(Role role) {
  switch (role) {
  case ROLE_UNSPECIFIED:
    return "unspecified";
  case WEIGHT:
    return "weight";
  case LORA_PARAM:
    return "lora_param";
  case OPTIMIZER_STATE:
    return "optimizer_state";
  case ACTIVATION:
    return "activation";
  case GRADIENT:
    return "gradient";
  case WORKSPACE:
    return "workspace";
  case INPUT:
    return "input";
  default:
    return "unknown";
  }
}

const char *dtypeName(DType dtype) {
  switch (dtype) {
  case DTYPE_UNSPECIFIED:
    return "unspecified";
  case F32:
    return "f32";
  case BF16:
    return "bf16";
  case F16:
    return "f16";
  case I32:
    return "i32";
  case I64:
    return "i64";
  default:
    return "unknown";
  }
}

const char *phaseName(Phase phase) {
  switch (phase) {
  case PHASE_UNSPECIFIED:
    return "unspecified";
  case FORWARD:
    return "fwd";
  case BACKWARD:
    return "bwd";
  case RECOMPUTE:
    return "recompute";
  default:
    return "unknown";
  }
}

const char *collectiveKindName(Collective::Kind kind) {
  switch (kind) {
  case Collective::KIND_UNSPECIFIED:
    return "unspecified";
  case Collective::ALL_REDUCE:
    return "all_reduce";
  case Collective::ALL_GATHER:
    return "all_gather";
  case Collective::REDUCE_SCATTER:
    return "reduce_scatter";
  case Collective::ALL_TO_ALL:
    return "all_to_all";
  case Collective::BROADCAST:
    return "broadcast";
  case Collective::SEND_RECV:
    return "send_recv";
  case Collective::EXPERT_ROUTE:
    return "expert_route";
  case Collective::EXPERT_SEND:
    return "expert_send";
  case Collective::EXPERT_RETURN:
    return "expert_return";
  default:
    return "unknown";
  }
}

std::string shapeToString(const google::protobuf::RepeatedField<int64_t> &shape) {
  return "[" + absl::StrJoin(shape, ",") + "]";
}

} // namespace moec::plan
