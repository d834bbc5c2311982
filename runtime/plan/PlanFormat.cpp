//===- PlanFormat.cpp - plan version and enum names -----------------------===//

#include "runtime/plan/PlanFormat.h"

#include "absl/strings/str_join.h"

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
  auto sizeOf = [&](std::string_view a) {
    int32_t size = a == "dp" ? mesh.dp() : a == "tp" ? mesh.tp() : a == "pp" ? mesh.pp() : a == "ep" ? mesh.ep() : 1;
    return size > 0 ? size : 1;
  };
  static const char *const kDefault[] = {"tp", "ep", "dp", "pp"};
  int stride = 1;
  for (int i = 0; i < 4; ++i) {
    std::string_view a = mesh.rank_order_size() == 4 ? std::string_view(mesh.rank_order(i)) : kDefault[i];
    if (a == axis)
      return (rank / stride) % sizeOf(a);
    stride *= sizeOf(a);
  }
  return 0;
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
