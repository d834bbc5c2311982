//===- PlanText.cpp - a plan as text for humans and lit tests -------------===//

#include "runtime/plan/PlanText.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/plan/PlanFormat.h"

namespace moec::plan {
namespace {

std::string quoted(absl::string_view text) { return absl::StrCat("\"", absl::CHexEscape(text), "\""); }

// The name, or unknown(N) for a value outside the enum so that a corrupt
// plan still shows what it holds.
std::string enumText(const char *name, int value) {
  return absl::string_view(name) == "unknown" ? absl::StrCat("unknown(", value, ")") : name;
}
std::string roleText(int role) { return enumText(roleName(static_cast<Role>(role)), role); }
std::string dtypeText(int dtype) { return enumText(dtypeName(static_cast<DType>(dtype)), dtype); }
std::string phaseText(int phase) { return enumText(phaseName(static_cast<Phase>(phase)), phase); }
std::string kindText(int kind) {
  return enumText(collectiveKindName(static_cast<Collective::Kind>(kind)), kind);
}

// The shortest %g form that reads back as the same double, so dumps are
// stable and 1e-08 does not print as 1.0000000000000000209e-08.
std::string formatDouble(double value) {
  char buffer[32];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buffer, sizeof(buffer), "%.*g", precision, value);
    if (std::strtod(buffer, nullptr) == value)
      break;
  }
  return buffer;
}

std::string humanBytes(int64_t bytes) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while ((value >= 1024 || value <= -1024) && unit < 5) {
    value /= 1024;
    ++unit;
  }
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), unit == 0 ? "%.0f %s" : "%.1f %s", value, units[unit]);
  return buffer;
}

std::string bufferList(const google::protobuf::RepeatedField<uint32_t> &ids) {
  return absl::StrJoin(ids, ", ", [](std::string *out, uint32_t id) { absl::StrAppend(out, "%", id); });
}

std::string attrText(const Attr &attr) {
  switch (attr.value_case()) {
  case Attr::kI:
    return absl::StrCat(attr.i());
  case Attr::kF:
    return formatDouble(attr.f());
  case Attr::kS:
    return quoted(attr.s());
  case Attr::kB:
    return attr.b() ? "true" : "false";
  case Attr::kInts:
    return absl::StrCat("[", absl::StrJoin(attr.ints().values(), ","), "]");
  case Attr::VALUE_NOT_SET:
    break;
  }
  return "<none>";
}

std::string launchText(const Launch &launch) {
  std::string text = launch.kernel();
  if (!launch.variant().empty())
    absl::StrAppend(&text, ":", launch.variant());
  if (!launch.inputs().empty())
    absl::StrAppend(&text, " ", bufferList(launch.inputs()));
  absl::StrAppend(&text, " -> ", bufferList(launch.outputs()), " {flops=", launch.flops());
  // Protobuf map iteration order is unspecified; sort for a stable dump.
  std::vector<std::pair<std::string, const Attr *>> attrs;
  for (const auto &[key, attr] : launch.attrs())
    attrs.push_back({key, &attr});
  std::sort(attrs.begin(), attrs.end());
  for (const auto &[key, attr] : attrs)
    absl::StrAppend(&text, ", ", key, "=", attrText(*attr));
  return text + "}";
}

std::string stepText(int index, const Step &step) {
  std::string text = absl::StrCat("#", index, " ", phaseText(step.phase()));
  if (step.layer() >= 0)
    absl::StrAppend(&text, " L", step.layer());
  absl::StrAppend(&text, " s", step.stream(), " ");
  switch (step.kind_case()) {
  case Step::kLaunch:
    absl::StrAppend(&text, launchText(step.launch()));
    break;
  case Step::kCollective: {
    const Collective &collective = step.collective();
    absl::StrAppend(&text, kindText(collective.kind()), " g", collective.group(), " ",
                    bufferList(collective.inputs()), " -> ", bufferList(collective.outputs()));
    if (collective.all_tokens())
      absl::StrAppend(&text, " all_tokens");
    if (collective.capacity_factor() != 0)
      absl::StrAppend(&text, " capacity_factor=", collective.capacity_factor());
    if (collective.placement_size() > 0)
      absl::StrAppend(&text, " placement=", absl::StrJoin(collective.placement(), ","));
    break;
  }
  case Step::kRecord:
    absl::StrAppend(&text, "record e", step.record().id());
    break;
  case Step::kWait:
    absl::StrAppend(&text, "wait e", step.wait().id());
    break;
  case Step::KIND_NOT_SET:
    absl::StrAppend(&text, "<no kind>");
    break;
  }
  if (!step.origin().empty())
    absl::StrAppend(&text, "  // ", quoted(step.origin()));
  return text;
}

std::string bindingText(const WeightBinding &binding) {
  std::string text = absl::StrCat("bind %", binding.buffer(), " ", quoted(binding.tensor()));
  if (binding.slice().dims_size() > 0)
    absl::StrAppend(&text, " slice [",
                    absl::StrJoin(binding.slice().dims(), ",",
                                  [](std::string *out, const Slice::Range &range) {
                                    absl::StrAppend(out, range.start(), "+", range.size());
                                  }),
                    "]");
  for (const Slice &piece : binding.pieces())
    absl::StrAppend(&text, " piece [",
                    absl::StrJoin(piece.dims(), ",",
                                  [](std::string *out, const Slice::Range &range) {
                                    absl::StrAppend(out, range.start(), "+", range.size());
                                  }),
                    "]");
  if (binding.zeros())
    absl::StrAppend(&text, " zeros");
  if (binding.experts_size() > 0)
    absl::StrAppend(&text, " experts=", absl::StrJoin(binding.experts(), ","));
  else if (binding.first_expert() != 0 || absl::StrContains(binding.tensor(), "{expert}"))
    absl::StrAppend(&text, " first_expert=", binding.first_expert());
  return text;
}

void appendRank(std::string &out, const Rank &rank) {
  absl::StrAppend(&out, "rank ", rank.rank(), " streams=", rank.num_streams(), " events=", rank.num_events(),
                  " groups=", rank.groups_size(), " buffers=", rank.buffers_size(),
                  " weights=", rank.weights_size(), " steps=", rank.steps_size(), "\n");
  for (const Arena &arena : rank.arenas())
    absl::StrAppend(&out, "  arena ", roleText(arena.role()), " ", arena.size_bytes(), " (",
                    humanBytes(arena.size_bytes()), ")\n");
  for (int g = 0; g < rank.groups_size(); ++g)
    absl::StrAppend(&out, "  group ", g, " ", rank.groups(g).axis(), " [",
                    absl::StrJoin(rank.groups(g).ranks(), ","), "]\n");
  for (const Buffer &buffer : rank.buffers())
    absl::StrAppend(&out, "  %", buffer.id(), " ", roleText(buffer.role()), " ", dtypeText(buffer.dtype()), " ",
                    shapeToString(buffer.shape()), " @", buffer.offset(), "+", buffer.size_bytes(), " live ",
                    buffer.first_step(), "..", buffer.last_step(), " ", quoted(buffer.name()),
                    buffer.received_rows_of()
                        ? absl::StrCat(buffer.received_copies() ? " copies_of %" : " rows_of %",
                                       buffer.received_rows_of() - 1)
                        : "",
                    "\n");
  for (const WeightBinding &binding : rank.weights())
    absl::StrAppend(&out, "  ", bindingText(binding), "\n");
  for (int s = 0; s < rank.steps_size(); ++s)
    absl::StrAppend(&out, "  ", stepText(s, rank.steps(s)), "\n");
}

} // namespace

std::string planToText(const Plan &plan) {
  std::string out;
  absl::StrAppend(&out, "plan v", plan.version(), " model=", plan.model(), " model_type=", plan.model_type(),
                  " seq=", plan.seq_len(), "x", plan.micro_batch(), "\n");
  const Mesh &mesh = plan.mesh();
  auto axis = [](int32_t size) { return size == 0 ? 1 : size; };
  absl::StrAppend(&out, "mesh dp=", axis(mesh.dp()), " tp=", axis(mesh.tp()), " pp=", axis(mesh.pp()),
                  " ep=", axis(mesh.ep()), " world=", plan.ranks_size(), " recompute=", plan.recompute());
  if (mesh.rank_order_size())
    absl::StrAppend(&out, " rank_order=", absl::StrJoin(mesh.rank_order(), ","));
  absl::StrAppend(&out, "\n");

  if (plan.has_optimizer()) {
    const Optimizer &opt = plan.optimizer();
    absl::StrAppend(&out, "optimizer ", opt.kind(), " lr=", formatDouble(opt.lr()),
                    " betas=", formatDouble(opt.beta1()), ",", formatDouble(opt.beta2()),
                    " eps=", formatDouble(opt.eps()), " weight_decay=", formatDouble(opt.weight_decay()),
                    " warmup=", opt.warmup_steps(), "/", opt.total_steps(), " schedule=", opt.schedule(),
                    " min_lr_ratio=", formatDouble(opt.min_lr_ratio()),
                    " max_grad_norm=", formatDouble(opt.max_grad_norm()), "\n");
  } else {
    out += "optimizer none\n";
  }
  if (plan.has_lora()) {
    const LoraLayout &lora = plan.lora();
    absl::StrAppend(&out, "lora r=", lora.r(), " alpha=", formatDouble(lora.alpha()),
                    " dropout=", formatDouble(lora.dropout()), " expert_lora=", lora.expert_lora() ? "true" : "false",
                    lora.use_rslora() ? " rslora=true" : "", " targets=", absl::StrJoin(lora.target_modules(), ","), "\n");
  } else {
    out += "lora none\n";
  }

  for (const Rank &rank : plan.ranks())
    appendRank(out, rank);
  for (const LoraTensor &tensor : plan.lora().tensors())
    absl::StrAppend(&out, "lora_tensor ", quoted(tensor.peft_name()), " rank=", tensor.rank(), " param=%",
                    tensor.param(), " grad=%", tensor.grad(), " adam_m=%", tensor.adam_m(), " adam_v=%",
                    tensor.adam_v(), "\n");
  return out;
}

} // namespace moec::plan
