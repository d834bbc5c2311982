//===- PlanValidator.cpp - reject a bad plan with a message ---------------===//

#include "runtime/plan/PlanValidator.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <queue>
#include <set>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/str_replace.h"
#include "runtime/plan/PlanFormat.h"

namespace moec::plan {
namespace {

// Keeps the first `limit` messages but counts them all, so a plan with 100k
// bad buffers gives a readable error and a true count.
class Problems {
public:
  explicit Problems(size_t limit) : limit(limit) {}

  template <typename... Args> void add(const Args &...args) {
    if (messages.size() < limit)
      messages.push_back(absl::StrCat(args...));
    ++count;
  }

  size_t total() const { return count; }

  std::vector<std::string> take() {
    if (count > messages.size())
      messages.push_back(absl::StrCat("... and ", count - messages.size(), " more problem(s)"));
    return std::move(messages);
  }

private:
  size_t limit;
  size_t count = 0;
  std::vector<std::string> messages;
};

std::string quoted(absl::string_view text) { return absl::StrCat("\"", absl::CHexEscape(text), "\""); }

std::string roleString(int role) {
  return Role_IsValid(role) ? roleName(static_cast<Role>(role)) : absl::StrCat("unknown (", role, ")");
}

std::string dtypeString(int dtype) {
  return DType_IsValid(dtype) ? dtypeName(static_cast<DType>(dtype))
                              : absl::StrCat("unknown (", dtype, ")");
}

bool isValidRole(int role) { return Role_IsValid(role) && role != ROLE_UNSPECIFIED; }
bool isValidDType(int dtype) { return DType_IsValid(dtype) && dtype != DTYPE_UNSPECIFIED; }

// Roles whose buffers hold state across the whole training step, so their
// live range must be every step (plan.proto, Buffer).
bool spansAllSteps(int role) {
  return role == WEIGHT || role == LORA_PARAM || role == OPTIMIZER_STATE || role == GRADIENT;
}

std::string bufferWhere(int rank, int index, const Buffer &buffer) {
  return absl::StrCat("rank ", rank, ", buffer ", index, " ", quoted(buffer.name()));
}

// "buffer 12 "layer3.q"" for a reference from elsewhere.
std::string bufferRef(uint32_t id, const Buffer &buffer) {
  return absl::StrCat("buffer ", id, " ", quoted(buffer.name()));
}

std::string stepWhere(int rank, int index, const Step &step) {
  std::string what;
  switch (step.kind_case()) {
  case Step::kLaunch:
    what = step.launch().kernel().empty() ? "launch" : step.launch().kernel();
    break;
  case Step::kCollective:
    what = collectiveKindName(step.collective().kind());
    break;
  case Step::kRecord:
    what = "record";
    break;
  case Step::kWait:
    what = "wait";
    break;
  case Step::KIND_NOT_SET:
    what = "no kind";
    break;
  }
  std::string where = absl::StrCat("rank ", rank, ", step ", index, " (", what);
  if (!step.origin().empty())
    absl::StrAppend(&where, ", origin ", quoted(step.origin()));
  return where + ")";
}

// A communicator as every member must spell it.
using GroupKey = std::pair<std::string, std::vector<int32_t>>;

std::string groupString(const GroupKey &key) {
  return absl::StrCat(key.first, " [", absl::StrJoin(key.second, ","), "]");
}

// What the cross-rank checks need from one rank.
struct RankSummary {
  std::vector<bool> groupOk;
  // Per group: (collective kind, step index) in step order.
  std::vector<std::vector<std::pair<int, int>>> collectives;
};

void checkHeader(const Plan &plan, Problems &problems) {
  if (plan.version() != kPlanVersion)
    problems.add("version is ", plan.version(), ", expected ", kPlanVersion,
                 " (the plan version this runtime reads; recompile the plan with a matching moec)");
  if (plan.ranks_size() == 0)
    problems.add("ranks is empty, expected at least one rank");
  if (plan.seq_len() <= 0)
    problems.add("seq_len is ", plan.seq_len(), ", expected > 0");
  if (plan.micro_batch() <= 0)
    problems.add("micro_batch is ", plan.micro_batch(), ", expected > 0");
  const std::string &recompute = plan.recompute();
  if (recompute != "none" && recompute != "regather" && recompute != "per-layer" && recompute != "mixed")
    problems.add("recompute is ", quoted(recompute),
                 ", expected \"none\", \"regather\", \"per-layer\" or \"mixed\"");

  const Mesh &mesh = plan.mesh();
  const std::pair<const char *, int32_t> axes[] = {
      {"dp", mesh.dp()}, {"tp", mesh.tp()}, {"pp", mesh.pp()}, {"ep", mesh.ep()}};
  int64_t product = 1;
  bool meshOk = true;
  for (const auto &[axis, size] : axes) {
    if (size < 0) {
      problems.add("mesh.", axis, " is ", size, ", expected >= 0 (0 means 1)");
      meshOk = false;
    } else if (size > 0 && __builtin_mul_overflow(product, int64_t{size}, &product)) {
      problems.add("mesh dp x tp x pp x ep overflows");
      meshOk = false;
      break;
    }
  }
  if (mesh.rank_order_size()) {
    std::vector<std::string> order(mesh.rank_order().begin(), mesh.rank_order().end()), sorted = order;
    std::sort(sorted.begin(), sorted.end());
    if (sorted != std::vector<std::string>{"dp", "ep", "pp", "tp"})
      problems.add("mesh.rank_order is ", absl::StrJoin(order, ","),
                   ", expected each of dp, tp, pp, ep once (the fastest first; empty: tp,ep,dp,pp)");
  }
  if (meshOk && product != plan.ranks_size()) {
    auto axis = [](int32_t size) { return size == 0 ? 1 : size; };
    problems.add("mesh dp x tp x pp x ep is ", axis(mesh.dp()), "x", axis(mesh.tp()), "x",
                 axis(mesh.pp()), "x", axis(mesh.ep()), " = ", product,
                 ", expected the number of ranks (", plan.ranks_size(), ")");
  }
}

void checkOptimizer(const Optimizer &opt, Problems &problems) {
  // Written as !(good) so that NaN fails too.
  if (opt.kind() != "adamw")
    problems.add("optimizer.kind is ", quoted(opt.kind()), ", expected \"adamw\"");
  if (!(std::isfinite(opt.lr()) && opt.lr() > 0))
    problems.add("optimizer.lr is ", opt.lr(), ", expected > 0");
  if (!(opt.beta1() >= 0 && opt.beta1() < 1))
    problems.add("optimizer.beta1 is ", opt.beta1(), ", expected in [0, 1)");
  if (!(opt.beta2() >= 0 && opt.beta2() < 1))
    problems.add("optimizer.beta2 is ", opt.beta2(), ", expected in [0, 1)");
  if (!(std::isfinite(opt.eps()) && opt.eps() > 0))
    problems.add("optimizer.eps is ", opt.eps(), ", expected > 0");
  if (!(std::isfinite(opt.weight_decay()) && opt.weight_decay() >= 0))
    problems.add("optimizer.weight_decay is ", opt.weight_decay(), ", expected >= 0");
  if (opt.total_steps() <= 0)
    problems.add("optimizer.total_steps is ", opt.total_steps(), ", expected > 0");
  if (opt.warmup_steps() < 0 || opt.warmup_steps() > opt.total_steps())
    problems.add("optimizer.warmup_steps is ", opt.warmup_steps(),
                 ", expected in [0, total_steps] = [0, ", opt.total_steps(), "]");
  if (opt.schedule() != "cosine" && opt.schedule() != "constant")
    problems.add("optimizer.schedule is ", quoted(opt.schedule()), ", expected \"cosine\" or \"constant\"");
  if (!(opt.min_lr_ratio() >= 0 && opt.min_lr_ratio() <= 1))
    problems.add("optimizer.min_lr_ratio is ", opt.min_lr_ratio(), ", expected in [0, 1]");
  if (!(std::isfinite(opt.max_grad_norm()) && opt.max_grad_norm() >= 0))
    problems.add("optimizer.max_grad_norm is ", opt.max_grad_norm(), ", expected >= 0 (0 = no clipping)");
}

void checkLora(const Plan &plan, Problems &problems) {
  const LoraLayout &lora = plan.lora();
  if (lora.r() <= 0)
    problems.add("lora.r is ", lora.r(), ", expected > 0");
  if (!(std::isfinite(lora.alpha()) && lora.alpha() > 0))
    problems.add("lora.alpha is ", lora.alpha(), ", expected > 0");
  if (!(lora.dropout() >= 0 && lora.dropout() < 1))
    problems.add("lora.dropout is ", lora.dropout(), ", expected in [0, 1)");
  if (lora.target_modules_size() == 0)
    problems.add("lora.target_modules is empty, expected the adapted module names");
  for (int i = 0; i < lora.target_modules_size(); ++i)
    if (lora.target_modules(i).empty())
      problems.add("lora.target_modules[", i, "] is empty");
  if (lora.tensors_size() == 0)
    problems.add("lora.tensors is empty, expected one entry per trainable tensor");

  std::set<std::pair<std::string, int32_t>> seen;
  for (int i = 0; i < lora.tensors_size(); ++i) {
    const LoraTensor &tensor = lora.tensors(i);
    std::string where = absl::StrCat("lora.tensors[", i, "] ", quoted(tensor.peft_name()));
    if (tensor.peft_name().empty())
      problems.add(where, ": peft_name is empty");
    if (!seen.insert({tensor.peft_name(), tensor.rank()}).second)
      problems.add(where, ": listed twice for rank ", tensor.rank());
    if (tensor.rank() < 0 || tensor.rank() >= plan.ranks_size()) {
      problems.add(where, ": rank is ", tensor.rank(), ", expected in [0, ", plan.ranks_size(), ")");
      continue;
    }
    const Rank &rank = plan.ranks(tensor.rank());
    const Buffer *param = nullptr;
    const std::tuple<const char *, uint32_t, Role> slots[] = {
        {"param", tensor.param(), LORA_PARAM},
        {"grad", tensor.grad(), GRADIENT},
        {"adam_m", tensor.adam_m(), OPTIMIZER_STATE},
        {"adam_v", tensor.adam_v(), OPTIMIZER_STATE}};
    for (const auto &[field, id, role] : slots) {
      bool isParam = role == LORA_PARAM;
      if (id >= static_cast<uint32_t>(rank.buffers_size())) {
        problems.add(where, ": ", field, " is ", id, ": missing buffer (rank ", tensor.rank(), " has ",
                     rank.buffers_size(), " buffers)");
        continue;
      }
      const Buffer &buffer = rank.buffers(id);
      if (buffer.role() != role)
        problems.add(where, ": ", field, " is ", bufferRef(id, buffer), " of role ", roleString(buffer.role()),
                     ", expected ", roleName(role));
      if (isParam) {
        param = &buffer;
      } else if (param && !std::equal(buffer.shape().begin(), buffer.shape().end(), param->shape().begin(),
                             param->shape().end())) {
        problems.add(where, ": ", field, " ", bufferRef(id, buffer), " has shape ",
                     shapeToString(buffer.shape()), ", expected the param's shape ",
                     shapeToString(param->shape()));
      }
    }
    // A part of a tensor split over tp: a window of the param's size in every dimension.
    if (param && tensor.has_slice()) {
      const Slice &slice = tensor.slice();
      bool fits = slice.dims_size() == param->shape_size();
      for (int d = 0; fits && d < slice.dims_size(); ++d)
        fits = slice.dims(d).start() >= 0 && slice.dims(d).size() == param->shape(d);
      if (!fits)
        problems.add(where, ": slice has ", slice.dims_size(), " dims, expected the window of the param ",
                     shapeToString(param->shape()), " (start >= 0, its size in every dimension)");
    }
  }
}

// Checks one rank; fills `summary` for the cross-rank checks.
class RankChecker {
public:
  RankChecker(const Plan &plan, int index, Problems &problems, RankSummary &summary)
      : plan(plan), rank(plan.ranks(index)), index(index), problems(problems), summary(summary) {}

  void run() {
    if (rank.rank() != index)
      problems.add("ranks[", index, "]: rank is ", rank.rank(), ", expected its index ", index);
    if (rank.num_streams() == 0)
      problems.add(where(), "num_streams is 0, expected >= 1");
    if (rank.steps_size() == 0 && rank.buffers_size() > 0)
      problems.add(where(), "steps is empty but there are ", rank.buffers_size(),
                   " buffers; live ranges need at least one step");
    checkArenas();
    checkGroups();
    checkBuffers();
    checkOverlaps();
    checkBindings();
    size_t before = problems.total();
    checkSteps();
    checkPlacedBindings();
    if (rank.num_streams() > 1 && problems.total() == before)
      checkStreamOrder();
  }

private:
  std::string where() const { return absl::StrCat("rank ", index, ": "); }
  int numSteps() const { return rank.steps_size(); }

  void checkArenas() {
    for (int i = 0; i < rank.arenas_size(); ++i) {
      const Arena &arena = rank.arenas(i);
      if (!isValidRole(arena.role())) {
        problems.add("rank ", index, ", arenas[", i, "]: role is ", roleString(arena.role()), ", expected a role");
        continue;
      }
      if (arena.size_bytes() < 0)
        problems.add("rank ", index, ", arenas[", i, "] (", roleName(arena.role()), "): size_bytes is ",
                     arena.size_bytes(), ", expected >= 0");
      auto [it, inserted] = arenaOf.insert({arena.role(), i});
      if (!inserted)
        problems.add("rank ", index, ", arenas[", i, "]: same role as arenas[", it->second, "] (",
                     roleName(arena.role()), "), expected one arena per role");
    }
  }

  void checkGroups() {
    summary.groupOk.assign(rank.groups_size(), false);
    summary.collectives.assign(rank.groups_size(), {});
    std::map<GroupKey, int> seen;
    for (int g = 0; g < rank.groups_size(); ++g) {
      const Group &group = rank.groups(g);
      std::string at = absl::StrCat("rank ", index, ", groups[", g, "] (", group.axis(), "): ");
      bool ok = true;
      std::set<std::string> axes;
      bool axesOk = !group.axis().empty();
      for (absl::string_view axis : absl::StrSplit(group.axis(), '+'))
        axesOk &= (axis == "dp" || axis == "tp" || axis == "ep" || axis == "pp") &&
                  axes.insert(std::string(axis)).second;
      if (!axesOk) {
        problems.add(at, "axis is ", quoted(group.axis()),
                     ", expected mesh axes (\"dp\", \"tp\", \"ep\", \"pp\") joined by '+', each once");
        ok = false;
      }
      if (group.ranks_size() == 0) {
        problems.add(at, "ranks is empty");
        ok = false;
      }
      std::set<int32_t> members;
      for (int i = 0; i < group.ranks_size(); ++i) {
        int32_t member = group.ranks(i);
        if (member < 0 || member >= plan.ranks_size()) {
          problems.add(at, "ranks[", i, "] is ", member, ", expected in [0, ", plan.ranks_size(), ")");
          ok = false;
        } else if (!members.insert(member).second) {
          problems.add(at, "ranks[", i, "] is ", member, ", listed twice");
          ok = false;
        }
      }
      if (ok && !members.count(index)) {
        problems.add(at, "ranks [", absl::StrJoin(group.ranks(), ","), "] do not include this rank ", index);
        ok = false;
      }
      if (!ok)
        continue;
      GroupKey key{group.axis(), {group.ranks().begin(), group.ranks().end()}};
      auto [it, inserted] = seen.insert({key, g});
      if (!inserted) {
        problems.add(at, "same communicator as groups[", it->second, "] (", groupString(key), ")");
        continue;
      }
      summary.groupOk[g] = true;
    }
  }

  void checkBuffers() {
    bufferOk.assign(rank.buffers_size(), false);
    written.assign(rank.buffers_size(), false);
    std::set<int> rolesWithoutArena;
    for (int i = 0; i < rank.buffers_size(); ++i) {
      const Buffer &buffer = rank.buffers(i);
      std::string at = bufferWhere(index, i, buffer) + ": ";
      bool ok = true;
      if (buffer.id() != static_cast<uint32_t>(i)) {
        problems.add(at, "id is ", buffer.id(), ", expected its index ", i);
        ok = false;
      }
      bool roleOk = isValidRole(buffer.role());
      if (!roleOk) {
        problems.add(at, "role is ", roleString(buffer.role()), ", expected a role");
        ok = false;
      }
      bool dtypeOk = isValidDType(buffer.dtype());
      if (!dtypeOk) {
        problems.add(at, "dtype is ", dtypeString(buffer.dtype()), ", expected f32, bf16, f16, i32 or i64");
        ok = false;
      }

      // An empty shape is a scalar (the loss): one element.
      int64_t elements = 1;
      bool shapeOk = true;
      for (int d = 0; d < buffer.shape_size(); ++d) {
        int64_t dim = buffer.shape(d);
        if (dim <= 0) {
          problems.add(at, "shape[", d, "] is ", dim, ", expected > 0");
          shapeOk = false;
        } else if (shapeOk && __builtin_mul_overflow(elements, dim, &elements)) {
          problems.add(at, "shape ", shapeToString(buffer.shape()), " overflows 64-bit byte counts");
          shapeOk = false;
        }
      }
      int64_t expectedBytes = 0;
      if (shapeOk && dtypeOk &&
          __builtin_mul_overflow(elements, dtypeSize(static_cast<DType>(buffer.dtype())), &expectedBytes)) {
        problems.add(at, "shape ", shapeToString(buffer.shape()), " overflows 64-bit byte counts");
        shapeOk = false;
      }
      if (!shapeOk || !dtypeOk) {
        ok = false;
      } else if (buffer.size_bytes() != expectedBytes) {
        problems.add(at, "size_bytes is ", buffer.size_bytes(), ", expected ", expectedBytes, " (shape ",
                     shapeToString(buffer.shape()), " x ", dtypeSize(static_cast<DType>(buffer.dtype())),
                     " bytes of ", dtypeName(static_cast<DType>(buffer.dtype())), ")");
        ok = false;
      }

      if (buffer.offset() < 0) {
        problems.add(at, "offset is ", buffer.offset(), ", expected >= 0");
        ok = false;
      } else if (roleOk) {
        auto arena = arenaOf.find(buffer.role());
        if (arena == arenaOf.end()) {
          if (rolesWithoutArena.insert(buffer.role()).second)
            problems.add(at, "role is ", roleName(buffer.role()), " but the rank has no ",
                         roleName(buffer.role()), " arena");
          ok = false;
        } else if (ok) {
          int64_t arenaSize = rank.arenas(arena->second).size_bytes();
          // offset + size_bytes > arenaSize, written so that it cannot overflow.
          if (buffer.size_bytes() > arenaSize || buffer.offset() > arenaSize - buffer.size_bytes()) {
            problems.add(at, "offset + size_bytes is ", buffer.offset(), " + ", buffer.size_bytes(),
                         ", expected <= the ", roleName(buffer.role()), " arena's size_bytes (", arenaSize,
                         ")");
            ok = false;
          }
        }
      }

      if (numSteps() > 0) {
        int32_t first = buffer.first_step(), last = buffer.last_step();
        if (first < 0 || first > last || last >= numSteps()) {
          problems.add(at, "live range first_step..last_step is ", first, "..", last,
                       ", expected 0 <= first_step <= last_step < ", numSteps(), " (steps)");
          ok = false;
        } else if (roleOk && spansAllSteps(buffer.role()) && (first != 0 || last != numSteps() - 1)) {
          problems.add(at, "live range first_step..last_step is ", first, "..", last, ", expected 0..",
                       numSteps() - 1, " (", roleName(buffer.role()), " buffers span every step)");
          ok = false;
        }
      } else {
        ok = false;
      }
      if (uint32_t of = buffer.received_rows_of(); of != 0) {
        // The rows follow a route's received rows: a whole multiple of them, and a token buffer.
        const Buffer *anchor = of - 1 < static_cast<uint32_t>(rank.buffers_size()) ? &rank.buffers(of - 1) : nullptr;
        if (!anchor || anchor->shape_size() != 2 || buffer.shape_size() < 1 ||
            (!buffer.received_copies() && buffer.shape(0) % std::max<int64_t>(anchor->shape(0), 1) != 0) ||
            (buffer.role() != ACTIVATION && buffer.role() != WORKSPACE)) {
          problems.add(at, "received_rows_of is ", of, ", expected 1 + the id of a [rows, k] buffer whose rows divide "
                       "this activation's or workspace's first dimension (any, for received_copies)");
          ok = false;
        }
      }
      if (buffer.received_copies() && buffer.received_rows_of() == 0) {
        problems.add(at, "received_copies is set without received_rows_of (the route whose copies these are)");
        ok = false;
      }
      bufferOk[i] = ok;
    }
  }

  // Two buffers of one arena whose bytes overlap must not be live at the same
  // step. A sweep over steps keeps the byte ranges of the live buffers in an
  // ordered map; they are pairwise disjoint, so a new range can only overlap
  // its two neighbours: O(n log n). A buffer that conflicts is reported and
  // left out, which keeps the invariant and reports each bad buffer once.
  void checkOverlaps() {
    std::map<int, std::vector<int>> byRole;
    for (int i = 0; i < rank.buffers_size(); ++i)
      if (bufferOk[i])
        byRole[rank.buffers(i).role()].push_back(i);

    // The runtime writes INPUT buffers before step 0 and reads the loss after
    // the last step, so they hold their bytes throughout.
    auto firstOf = [&](int i) {
      const Buffer &b = rank.buffers(i);
      return b.role() == INPUT ? 0 : b.first_step();
    };
    auto lastOf = [&](int i) {
      const Buffer &b = rank.buffers(i);
      return b.role() == INPUT ? numSteps() - 1 : b.last_step();
    };

    for (auto &[role, ids] : byRole) {
      std::sort(ids.begin(), ids.end(), [&](int a, int b) {
        return std::make_pair(firstOf(a), a) < std::make_pair(firstOf(b), b);
      });
      std::map<int64_t, int> live; // begin offset -> buffer index
      using Expiry = std::pair<int32_t, int64_t>; // (last step, begin offset)
      std::priority_queue<Expiry, std::vector<Expiry>, std::greater<Expiry>> expiries;
      for (int i : ids) {
        while (!expiries.empty() && expiries.top().first < firstOf(i)) {
          live.erase(expiries.top().second);
          expiries.pop();
        }
        const Buffer &buffer = rank.buffers(i);
        int64_t begin = buffer.offset(), end = begin + buffer.size_bytes();
        auto next = live.lower_bound(begin);
        int clash = -1;
        if (next != live.end() && next->first < end) {
          clash = next->second;
        } else if (next != live.begin()) {
          const Buffer &prev = rank.buffers(std::prev(next)->second);
          if (prev.offset() + prev.size_bytes() > begin)
            clash = std::prev(next)->second;
        }
        if (clash >= 0) {
          const Buffer &other = rank.buffers(clash);
          problems.add(bufferWhere(index, i, buffer), ": bytes [", begin, ", ", end, ") live ", firstOf(i),
                       "..", lastOf(i), " overlap ", bufferRef(clash, other), " at bytes [", other.offset(),
                       ", ", other.offset() + other.size_bytes(), ") live ", firstOf(clash), "..",
                       lastOf(clash), " in the ", roleName(static_cast<Role>(role)),
                       " arena; buffers sharing bytes must have disjoint live ranges");
          continue;
        }
        live.emplace(begin, i);
        expiries.push({lastOf(i), begin});
      }
    }
  }

  void checkBindings() {
    std::vector<int> boundBy(rank.buffers_size(), -1);
    for (int j = 0; j < rank.weights_size(); ++j) {
      const WeightBinding &binding = rank.weights(j);
      std::string at = absl::StrCat("rank ", index, ", weights[", j, "] ", quoted(binding.tensor()), ": ");
      const std::string &tensor = binding.tensor();
      bool hasExpert = absl::StrContains(tensor, "{expert}");
      if (tensor.empty())
        problems.add(at, "tensor is empty, expected a checkpoint tensor name");
      std::string rest = absl::StrReplaceAll(tensor, {{"{expert}", ""}});
      if (absl::StrContains(rest, "{layer}"))
        problems.add(at, "tensor contains unresolved {layer}, expected the layer index in place");
      else if (rest.find_first_of("{}") != std::string::npos)
        problems.add(at, "tensor contains an unresolved placeholder, expected only {expert}");
      if (binding.first_expert() < 0)
        problems.add(at, "first_expert is ", binding.first_expert(), ", expected >= 0");
      for (int64_t e : binding.experts())
        if (e < 0) {
          problems.add(at, "experts holds ", e, ", expected expert numbers >= 0");
          break;
        }

      uint32_t id = binding.buffer();
      if (id >= static_cast<uint32_t>(rank.buffers_size())) {
        problems.add(at, "buffer is ", id, ": missing buffer (rank has ", rank.buffers_size(), " buffers)");
        continue;
      }
      const Buffer &buffer = rank.buffers(id);
      if (buffer.role() != WEIGHT && buffer.role() != LORA_PARAM)
        problems.add(at, bufferRef(id, buffer), " has role ", roleString(buffer.role()),
                     ", expected weight or lora_param");
      if (boundBy[id] >= 0)
        problems.add(at, bufferRef(id, buffer), " is already bound by weights[", boundBy[id], "]");
      else
        boundBy[id] = j;
      if (hasExpert && buffer.shape_size() == 0) {
        problems.add(at, "tensor has {expert} but ", bufferRef(id, buffer),
                     " is a scalar; experts stack along its leading dimension");
        continue;
      }

      bool placed = binding.experts_size() > 0;
      if (placed && (buffer.shape_size() == 0 || buffer.shape(0) != binding.experts_size()))
        problems.add(at, "experts lists ", binding.experts_size(), " experts for ", bufferRef(id, buffer),
                     " of shape ", shapeToString(buffer.shape()), ", expected one per row of its leading dimension");

      if (binding.zeros() && (hasExpert || placed || binding.slice().dims_size() > 0 || binding.pieces_size() > 0))
        problems.add(at, "zeros binds no tensor: it takes no slice, pieces, {expert} or experts");
      // Pieces: windows of the whole tensor that fill the buffer along its leading dimension.
      if (binding.pieces_size() > 0) {
        if (hasExpert || placed || binding.slice().dims_size() > 0 || buffer.shape_size() == 0 ||
            binding.whole_shape_size() != buffer.shape_size()) {
          problems.add(at, "pieces need a buffer of rank >= 1 with whole_shape of its rank, and no slice, "
                           "{expert} or experts");
          continue;
        }
        int64_t rows = 0;
        for (int p = 0; p < binding.pieces_size(); ++p) {
          const Slice &piece = binding.pieces(p);
          if (piece.dims_size() != buffer.shape_size()) {
            problems.add(at, "pieces[", p, "] has ", piece.dims_size(), " dims, expected ", buffer.shape_size());
            continue;
          }
          for (int d = 0; d < piece.dims_size(); ++d) {
            const Slice::Range &range = piece.dims(d);
            if (range.start() < 0 || range.size() <= 0 || range.start() + range.size() > binding.whole_shape(d) ||
                (d > 0 && range.size() != buffer.shape(d)))
              problems.add(at, "pieces[", p, "].dims[", d, "] is ", range.start(), "+", range.size(),
                           ", outside the tensor's ", binding.whole_shape(d), " or not the buffer's ", buffer.shape(d));
          }
          rows += piece.dims(0).size();
        }
        if (rows != buffer.shape(0))
          problems.add(at, "pieces hold ", rows, " rows, ", bufferRef(id, buffer), " has ", buffer.shape(0));
        continue;
      }
      // With {expert} (or a placement's experts) the slice addresses one expert's tensor: the
      // buffer's shape without its leading (expert) dimension.
      const Slice &slice = binding.slice();
      if (slice.dims_size() == 0)
        continue;
      int skip = hasExpert || placed ? 1 : 0;
      int expectedDims = buffer.shape_size() - skip;
      if (slice.dims_size() != expectedDims) {
        problems.add(at, "slice has ", slice.dims_size(), " dims, expected ", expectedDims, " (",
                     bufferRef(id, buffer), " has shape ", shapeToString(buffer.shape()),
                     hasExpert ? ", less the expert dimension)" : ")");
        continue;
      }
      for (int d = 0; d < slice.dims_size(); ++d) {
        const Slice::Range &range = slice.dims(d);
        if (range.start() < 0)
          problems.add(at, "slice.dims[", d, "].start is ", range.start(), ", expected >= 0");
        if (range.size() != buffer.shape(d + skip))
          problems.add(at, "slice.dims[", d, "].size is ", range.size(), ", expected ", buffer.shape(d + skip),
                       " (dimension ", d + skip, " of ", bufferRef(id, buffer), ")");
      }
    }
    for (int i = 0; i < rank.buffers_size(); ++i)
      if (rank.buffers(i).role() == WEIGHT && boundBy[i] < 0)
        problems.add(bufferWhere(index, i, rank.buffers(i)),
                     ": weight buffer has no weight binding, expected one (weights come from the checkpoint)");
  }

  /// With an expert placement, what the executor reads for a layer's experts must be what its
  /// route sends there: each expert weight bound for layer L (a binding with `experts`, its tensor
  /// naming "layers.L.") holds the experts that layer's route places on this rank, in that
  /// order; none twice, each below the route's num_experts.
  void checkPlacedBindings() {
    std::map<int, std::vector<int64_t>> placed; // layer -> the experts its route puts here
    std::map<int, int64_t> numExperts;
    for (const Step &step : rank.steps()) {
      if (!step.has_collective() || step.collective().kind() != Collective::EXPERT_ROUTE)
        continue;
      const Collective &c = step.collective();
      if (c.placement_size() == 0 || c.group() >= static_cast<uint32_t>(rank.groups_size()))
        continue; // no placement, or a bad group (reported with the step)
      const Group &group = rank.groups(static_cast<int>(c.group()));
      auto me = std::find(group.ranks().begin(), group.ranks().end(), rank.rank());
      if (me == group.ranks().end() || c.placement_size() % group.ranks_size() != 0)
        continue; // reported with the groups and the step
      int per = c.placement_size() / group.ranks_size(), first = static_cast<int>(me - group.ranks().begin()) * per;
      placed[step.layer()] = std::vector<int64_t>(c.placement().begin() + first, c.placement().begin() + first + per);
      numExperts[step.layer()] = c.num_experts();
    }
    for (int j = 0; j < rank.weights_size(); ++j) {
      const WeightBinding &binding = rank.weights(j);
      if (binding.experts_size() == 0)
        continue;
      std::string at = absl::StrCat("rank ", index, ", weights[", j, "] ", quoted(binding.tensor()), ": ");
      std::vector<int64_t> experts(binding.experts().begin(), binding.experts().end());
      std::vector<int64_t> sorted = experts;
      std::sort(sorted.begin(), sorted.end());
      if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
        problems.add(at, "experts lists an expert twice, expected each of a rank's experts once");
      size_t layerAt = binding.tensor().find("layers.");
      if (layerAt == std::string::npos)
        continue;
      int layer = std::atoi(binding.tensor().c_str() + layerAt + strlen("layers."));
      auto route = placed.find(layer);
      if (route == placed.end())
        continue;
      if (sorted.back() >= numExperts[layer])
        problems.add(at, "experts holds ", sorted.back(), ", expected experts below the route's num_experts (",
                     numExperts[layer], ")");
      else if (experts != route->second)
        problems.add(at, "experts are [", absl::StrJoin(experts, ","), "], expected [",
                     absl::StrJoin(route->second, ","), "]: what layer ", layer,
                     "'s expert route places on this rank, in its order");
    }
  }

  // Checks a buffer that step `s` reads or writes. Returns it when it can be
  // used for further checks (exists and passed its own checks).
  const Buffer *checkUse(int s, const std::string &at, const char *field, int position, uint32_t id,
                         bool writes) {
    std::string ref = absl::StrCat(field, "[", position, "]");
    if (id >= static_cast<uint32_t>(rank.buffers_size())) {
      problems.add(at, ref, " is ", id, ": missing buffer (rank has ", rank.buffers_size(), " buffers)");
      return nullptr;
    }
    const Buffer &buffer = rank.buffers(id);
    if (writes && buffer.role() == WEIGHT)
      problems.add(at, ref, " writes ", bufferRef(id, buffer), " of role weight; base weights are frozen");
    if (!bufferOk[id])
      return nullptr;
    if (s < buffer.first_step() || s > buffer.last_step()) {
      problems.add(at, ref, " is ", bufferRef(id, buffer), " whose live range ", buffer.first_step(), "..",
                   buffer.last_step(), " does not include step ", s);
      return nullptr;
    }
    return &buffer;
  }

  void checkSteps() {
    // A set, not a vector of num_events flags: a corrupt count must not allocate gigabytes.
    std::unordered_set<uint32_t> recorded;
    for (int s = 0; s < rank.steps_size(); ++s) {
      const Step &step = rank.steps(s);
      std::string at = stepWhere(index, s, step) + ": ";
      if (step.stream() >= rank.num_streams())
        problems.add(at, "stream is ", step.stream(), ", expected < num_streams (", rank.num_streams(), ")");
      if (!Phase_IsValid(step.phase()) || step.phase() == PHASE_UNSPECIFIED)
        problems.add(at, "phase is ",
                     Phase_IsValid(step.phase()) ? phaseName(step.phase())
                                                 : absl::StrCat("unknown (", step.phase(), ")"),
                     ", expected fwd, bwd or recompute");
      if (step.layer() < -1)
        problems.add(at, "layer is ", step.layer(), ", expected >= -1 (-1 = outside layers)");

      switch (step.kind_case()) {
      case Step::kLaunch:
        checkLaunch(s, at, step.launch());
        break;
      case Step::kCollective:
        checkCollective(s, at, step.collective());
        break;
      case Step::kRecord:
        if (step.record().id() >= rank.num_events())
          problems.add(at, "record.id is ", step.record().id(), ", expected < num_events (", rank.num_events(),
                       ")");
        else
          recorded.insert(step.record().id());
        break;
      case Step::kWait:
        // Waiting on an event no step has recorded yet waits for nothing: a race.
        if (step.wait().id() >= rank.num_events())
          problems.add(at, "wait.id is ", step.wait().id(), ", expected < num_events (", rank.num_events(), ")");
        else if (!recorded.count(step.wait().id()))
          problems.add(at, "wait.id is ", step.wait().id(), ", expected an event recorded by an earlier step");
        break;
      case Step::KIND_NOT_SET:
        problems.add(at, "kind is not set, expected launch, collective, record or wait");
        break;
      }
    }
  }

  /// The buffers a step reads and writes (a collective in place reads and writes its buffers).
  void accessesOf(const Step &step, std::vector<uint32_t> &reads, std::vector<uint32_t> &writes) const {
    reads.clear();
    writes.clear();
    if (step.has_launch()) {
      reads.assign(step.launch().inputs().begin(), step.launch().inputs().end());
      writes.assign(step.launch().outputs().begin(), step.launch().outputs().end());
    } else if (step.has_collective()) {
      reads.assign(step.collective().inputs().begin(), step.collective().inputs().end());
      writes.assign(step.collective().outputs().begin(), step.collective().outputs().end());
    }
  }

  // With several streams, list order orders only steps of one stream; steps of two are ordered
  // by an event recorded after the earlier and waited for before the later. Vector clocks say
  // which: clock[s][t] is the last step of stream t known complete before stream s's next step.
  // (1) Two steps on different streams where one writes what the other reads or writes must be
  // ordered. (2) An activation or workspace buffer's live range (which the overlap check above
  // relies on) must last until every stream has waited for its last use on every other stream:
  // a step of one stream could otherwise run on its bytes while another still uses them.
  void checkStreamOrder() {
    const int streams = static_cast<int>(rank.num_streams()), n = numSteps();
    using Clock = std::vector<int>;
    auto merge = [](Clock &into, const Clock &from) {
      for (size_t t = 0; t < into.size(); ++t)
        into[t] = std::max(into[t], from[t]);
    };
    std::vector<Clock> clock(streams, Clock(streams, -1)), before(n);
    std::unordered_map<uint32_t, Clock> recorded;
    for (int j = 0; j < n; ++j) {
      const Step &step = rank.steps(j);
      int s = static_cast<int>(step.stream());
      if (step.has_wait())
        merge(clock[s], recorded.at(step.wait().id()));
      before[j] = clock[s];
      clock[s][s] = j;
      if (step.has_record())
        recorded[step.record().id()] = clock[s];
    }
    auto ordered = [&](int i, int j) { // step i before step j (i < j)
      int t = static_cast<int>(rank.steps(i).stream());
      return t == static_cast<int>(rank.steps(j).stream()) || before[j][t] >= i;
    };
    struct Access {
      int lastWrite = -1;
      std::vector<int> reads; // since the last write
    };
    std::vector<Access> access(rank.buffers_size());
    std::vector<Clock> lastUse(rank.buffers_size(), Clock(streams, -1));
    std::vector<uint32_t> reads, writes;
    auto race = [&](int i, int j, uint32_t id, const char *what) {
      problems.add(stepWhere(index, j, rank.steps(j)), ": on stream ", rank.steps(j).stream(), " ", what, " ",
                   bufferRef(id, rank.buffers(id)), ", which step ", i, " on stream ", rank.steps(i).stream(),
                   " uses, with no event ordering the two");
    };
    for (int j = 0; j < n; ++j) {
      accessesOf(rank.steps(j), reads, writes);
      for (uint32_t id : reads)
        if (int w = access[id].lastWrite; w >= 0 && !ordered(w, j))
          race(w, j, id, "reads");
      for (uint32_t id : writes) {
        bool read = std::find(reads.begin(), reads.end(), id) != reads.end(); // in place: reported once
        if (int w = access[id].lastWrite; w >= 0 && !read && !ordered(w, j))
          race(w, j, id, "writes");
        for (int r : access[id].reads)
          if (r != j && !ordered(r, j))
            race(r, j, id, "writes");
      }
      int s = static_cast<int>(rank.steps(j).stream());
      for (uint32_t id : reads) {
        access[id].reads.push_back(j);
        lastUse[id][s] = j;
      }
      for (uint32_t id : writes) {
        access[id].lastWrite = j;
        access[id].reads.clear();
        lastUse[id][s] = j;
      }
    }
    std::vector<std::vector<int>> onStream(streams);
    for (int j = 0; j < n; ++j)
      onStream[rank.steps(j).stream()].push_back(j);
    for (int id = 0; id < rank.buffers_size(); ++id) {
      const Buffer &buffer = rank.buffers(id);
      if (buffer.role() != ACTIVATION && buffer.role() != WORKSPACE)
        continue;
      const Clock &uses = lastUse[id];
      int last = *std::max_element(uses.begin(), uses.end());
      if (last < 0)
        continue;
      for (int s = 0; s < streams; ++s) {
        // The first step of stream s after the buffer's last use that waited for all its uses.
        auto j = std::upper_bound(onStream[s].begin(), onStream[s].end(), last);
        auto waited = [&](int step) {
          for (int t = 0; t < streams; ++t)
            if (t != s && uses[t] >= 0 && before[step][t] < uses[t])
              return false;
          return true;
        };
        int unsafeUntil = -1; // the last step of s that may run while the buffer is in use
        for (; j != onStream[s].end() && !waited(*j); ++j)
          unsafeUntil = *j;
        if (unsafeUntil > buffer.last_step())
          problems.add(bufferWhere(index, id, buffer), ": live range ends at step ", buffer.last_step(),
                       ", but step ", unsafeUntil, " on stream ", s,
                       " may run before its last use on another stream completes; its memory must stay "
                       "reserved until then");
      }
    }
  }

  void checkLaunch(int s, const std::string &at, const Launch &launch) {
    if (launch.kernel().empty())
      problems.add(at, "launch.kernel is empty, expected a kernel name");
    if (launch.flops() < 0)
      problems.add(at, "launch.flops is ", launch.flops(), ", expected >= 0");
    for (int i = 0; i < launch.inputs_size(); ++i) {
      const Buffer *buffer = checkUse(s, at, "launch.inputs", i, launch.inputs(i), /*writes=*/false);
      // Activations and workspace hold garbage until a step writes them.
      bool produced = buffer && buffer->role() != ACTIVATION && buffer->role() != WORKSPACE;
      if (buffer && !produced && !written[launch.inputs(i)])
        problems.add(at, "launch.inputs[", i, "] reads ", bufferRef(launch.inputs(i), *buffer),
                     " before any step writes it");
    }
    for (int i = 0; i < launch.outputs_size(); ++i)
      if (checkUse(s, at, "launch.outputs", i, launch.outputs(i), /*writes=*/true))
        written[launch.outputs(i)] = true;
    for (const auto &[key, attr] : launch.attrs()) {
      if (key.empty())
        problems.add(at, "launch.attrs has an empty key");
      if (attr.value_case() == Attr::VALUE_NOT_SET)
        problems.add(at, "launch.attrs[", quoted(key), "] has no value");
    }
  }

  // The expert exchange's operand layouts (plan.proto, Collective).
  void checkExpertExchange(const std::string &at, const Collective &collective,
                           const std::vector<const Buffer *> &in, const std::vector<const Buffer *> &out,
                           int64_t n) {
    bool route = collective.kind() == Collective::EXPERT_ROUTE;
    bool send = collective.kind() == Collective::EXPERT_SEND;
    size_t wantIn = route ? 1 : 2, wantOut = route ? 2 : 1;
    if (in.size() != wantIn || out.size() != wantOut) {
      problems.add(at, collectiveKindName(collective.kind()), " has ", in.size(), " inputs and ", out.size(),
                   " outputs, expected ",
                   route ? "(indices) -> (local_indices, layout)" : "(rows, layout) -> (result)");
      return;
    }
    for (const Buffer *b : in)
      if (!b)
        return;
    for (const Buffer *b : out)
      if (!b)
        return;
    auto dims = [](const Buffer *b) { return std::vector<int64_t>(b->shape().begin(), b->shape().end()); };
    auto say = [&](const std::string &what) {
      problems.add(at, collectiveKindName(collective.kind()), ": ", what);
    };
    if (route && (collective.num_experts() < n || collective.num_experts() % n != 0))
      say(absl::StrCat("num_experts is ", collective.num_experts(), ", expected a positive multiple of the group size (",
                       n, ")"));
    if (collective.placement_size() > 0) {
      // Every rank's experts in turn, as many each; every expert at least once (more than E / n
      // per rank replicates experts), none twice on one rank.
      int64_t experts = std::max<int64_t>(collective.num_experts(), 0), size = collective.placement_size();
      bool valid = route && !collective.all_tokens() && size >= experts && size % n == 0;
      std::vector<int> seen(static_cast<size_t>(experts), 0);
      for (int64_t at = 0; valid && at < size; ++at) {
        int64_t e = collective.placement(static_cast<int>(at));
        valid = e >= 0 && e < experts;
        for (int64_t before = at - at % (size / n); valid && before < at; ++before)
          valid = collective.placement(static_cast<int>(before)) != e;
        if (valid)
          ++seen[static_cast<size_t>(e)];
      }
      if (!valid || std::count(seen.begin(), seen.end(), 0) > 0)
        say(absl::StrCat("placement has ", size, " entries, expected each of the ", n,
                         " ranks' experts in turn (as many each, none twice on a rank) covering the ", experts,
                         " experts, on a route that does not send every token to every rank"));
    }
    const Buffer *layout = route ? out[1] : in[1];
    if (layout->dtype() != I64 || dims(layout) != std::vector<int64_t>{2, 2 * n})
      say(absl::StrCat("layout is ", dtypeName(layout->dtype()), " [", absl::StrJoin(dims(layout), ","),
                       "], expected i64 [2, ", 2 * n, "] (group size ", n, ")"));
    // Rows: [T, W] on the token's rank, [n T, W] where they are received.
    const Buffer *narrow = route || send ? in[0] : out[0], *wide = route || send ? out[0] : in[0];
    std::vector<int64_t> w = dims(wide), r = dims(narrow);
    // A return may round f32 rows' sums to a narrower dtype; otherwise the rows keep theirs.
    bool rounds = collective.kind() == Collective::EXPERT_RETURN && wide->dtype() == F32 &&
                  (narrow->dtype() == BF16 || narrow->dtype() == F16);
    if (narrow->dtype() != wide->dtype() && !rounds)
      say(absl::StrCat("rows are ", dtypeName(wide->dtype()), " and ", dtypeName(narrow->dtype()),
                       ", expected the same dtype", collective.kind() == Collective::EXPERT_RETURN
                                                        ? " (or f32 rows summed into a narrower result)"
                                                        : ""));
    if (route && narrow->dtype() != I32 && narrow->dtype() != I64)
      say(absl::StrCat("indices are ", dtypeName(narrow->dtype()), ", expected i32 or i64"));
    if (w.size() != 2 || r.size() != 2 || w[1] != r[1]) {
      say(absl::StrCat("rows are [", absl::StrJoin(r, ","), "] and [", absl::StrJoin(w, ","),
                       "], expected [T, W] and [R, W] (R: the route's room for received tokens)"));
      return;
    }
    // The received side is room for every token of the group's ranks (n T rows), or with a
    // route's capacity_factor fewer; the sends and returns of a route have its room.
    uint32_t layoutId = route ? collective.outputs(1) : collective.inputs(1);
    if (route) {
      bool bounded = collective.capacity_factor() != 0;
      if (bounded ? w[0] < 1 || w[0] > n * r[0] : w[0] != n * r[0])
        say(absl::StrCat("local_indices has ", w[0], " rows for ", r[0], " tokens, expected ",
                         bounded ? "1 to " : "", n, " T = ", n * r[0], bounded ? " (capacity_factor room)" : "",
                         " (group size ", n, ")"));
      routeRoom[layoutId] = w[0];
    } else if (auto known = routeRoom.find(layoutId); known != routeRoom.end() && w[0] != known->second) {
      say(absl::StrCat("rows are [", absl::StrJoin(r, ","), "] and [", absl::StrJoin(w, ","), "], expected [T, W] and [",
                       known->second, ", W] (the room of the route that wrote the layout)"));
    }
  }
  std::map<uint32_t, int64_t> routeRoom; // a route's layout buffer -> its received rows

  // inputs[i] pairs with outputs[i]; their sizes follow from the kind and
  // the group size, which is what the runtime passes to NCCL as counts.
  void checkCollective(int s, const std::string &at, const Collective &collective) {
    bool kindOk = Collective::Kind_IsValid(collective.kind()) && collective.kind() != Collective::KIND_UNSPECIFIED;
    if (!kindOk)
      problems.add(at, "collective.kind is ",
                   Collective::Kind_IsValid(collective.kind())
                       ? collectiveKindName(collective.kind())
                       : absl::StrCat("unknown (", collective.kind(), ")"),
                   ", expected all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, "
                   "send_recv, expert_route, expert_send or expert_return");
    int64_t groupSize = 0;
    if (collective.group() >= static_cast<uint32_t>(rank.groups_size())) {
      problems.add(at, "collective.group is ", collective.group(), ", expected < the number of groups (",
                   rank.groups_size(), ")");
    } else {
      if (summary.groupOk[collective.group()]) {
        groupSize = rank.groups(collective.group()).ranks_size();
        summary.collectives[collective.group()].push_back({collective.kind(), s});
      }
    }
    bool exchange = collective.kind() == Collective::EXPERT_ROUTE || collective.kind() == Collective::EXPERT_SEND ||
                    collective.kind() == Collective::EXPERT_RETURN;
    bool pointToPoint = collective.kind() == Collective::SEND_RECV;
    if (pointToPoint) {
      if (collective.inputs_size() > 1 || collective.outputs_size() > 1 ||
          collective.inputs_size() + collective.outputs_size() == 0)
        problems.add(at, "send_recv has ", collective.inputs_size(), " inputs and ", collective.outputs_size(),
                     " outputs, expected at most one of each and at least one");
      if (groupSize != 0 && groupSize != 2)
        problems.add(at, "send_recv runs over a group of ", groupSize,
                     " ranks, expected 2 (neighbouring pipeline stages)");
    } else if (collective.inputs_size() == 0) {
      problems.add(at, "collective.inputs is empty");
    }
    if (!exchange && !pointToPoint && collective.inputs_size() != collective.outputs_size())
      problems.add(at, "collective has ", collective.inputs_size(), " inputs and ", collective.outputs_size(),
                   " outputs, expected as many outputs as inputs (inputs[i] -> outputs[i])");
    if (collective.all_tokens() && collective.kind() != Collective::EXPERT_ROUTE)
      problems.add(at, "all_tokens is set on a ", collectiveKindName(collective.kind()),
                   "; only an expert_route decides that every token goes to every rank");
    if (double factor = collective.capacity_factor(); factor != 0) {
      if (collective.kind() != Collective::EXPERT_ROUTE || collective.all_tokens())
        problems.add(at, "capacity_factor is set on ",
                     collective.all_tokens() ? std::string("an all_tokens expert_route (its room is fixed)")
                                             : std::string("a ") + collectiveKindName(collective.kind()),
                     "; only a routed expert_route bounds its room");
      else if (!(factor >= 1.0))
        problems.add(at, "capacity_factor is ", factor, ", expected 0 (room for every token) or at least 1");
    }
    std::vector<const Buffer *> inputs, outputs;
    for (int i = 0; i < collective.inputs_size(); ++i)
      inputs.push_back(checkUse(s, at, "collective.inputs", i, collective.inputs(i), /*writes=*/false));
    for (int i = 0; i < collective.outputs_size(); ++i) {
      outputs.push_back(checkUse(s, at, "collective.outputs", i, collective.outputs(i), /*writes=*/true));
      if (outputs.back())
        written[collective.outputs(i)] = true;
    }
    if (!kindOk || groupSize == 0 || pointToPoint)
      return;
    if (exchange) {
      checkExpertExchange(at, collective, inputs, outputs, groupSize);
      return;
    }
    for (size_t i = 0; i < std::min(inputs.size(), outputs.size()); ++i) {
      const Buffer *in = inputs[i], *out = outputs[i];
      if (!in || !out)
        continue;
      // An all-reduce may round an f32 sum once into a narrower output (a tp sum of f32 partials).
      bool rounds = (collective.kind() == Collective::ALL_REDUCE || collective.kind() == Collective::REDUCE_SCATTER) &&
                    in->dtype() == F32 &&
                    (out->dtype() == BF16 || out->dtype() == F16);
      if (in->dtype() != out->dtype() && !rounds) {
        problems.add(at, "collective.outputs[", i, "] is ", dtypeName(out->dtype()), ", expected the dtype of inputs[",
                     i, "] (", dtypeName(in->dtype()), ")",
                     collective.kind() == Collective::ALL_REDUCE || collective.kind() == Collective::REDUCE_SCATTER
                         ? " or, for an f32 input, a narrower float"
                         : "");
        continue;
      }
      int64_t expected = in->size_bytes() / dtypeSize(static_cast<DType>(in->dtype())) *
                         dtypeSize(static_cast<DType>(out->dtype()));
      const char *rule = "the size of inputs[i]";
      if (collective.kind() == Collective::ALL_GATHER) {
        if (__builtin_mul_overflow(in->size_bytes(), groupSize, &expected))
          expected = -1;
        rule = "inputs[i] x group size";
      } else if (collective.kind() == Collective::REDUCE_SCATTER) {
        expected = expected % groupSize == 0 ? expected / groupSize : -1;
        rule = "inputs[i] / group size";
      }
      if (out->size_bytes() != expected)
        problems.add(at, collectiveKindName(collective.kind()), " outputs[", i, "] ", bufferRef(collective.outputs(i), *out),
                     " is ", out->size_bytes(), " bytes, expected ", rule, " (inputs[", i, "] ",
                     bufferRef(collective.inputs(i), *in), " is ", in->size_bytes(), " bytes, group size ",
                     groupSize, ")");
    }
  }

  const Plan &plan;
  const Rank &rank;
  int index;
  Problems &problems;
  RankSummary &summary;
  std::map<int, int> arenaOf; // role -> arena index
  std::vector<bool> bufferOk;
  std::vector<bool> written; // by a launch so far, in step order
};

// The i-th send_recv of two ranks on their group: what one sends, the other receives (the
// same bytes and dtype), both ways.
void checkPointToPoint(const Plan &plan, const std::string &name, int a,
                       const std::vector<std::pair<int, int>> &atA, int b,
                       const std::vector<std::pair<int, int>> &atB, Problems &problems) {
  for (size_t i = 0; i < atA.size(); ++i) {
    if (atA[i].first != Collective::SEND_RECV)
      continue;
    const Collective &x = plan.ranks(a).steps(atA[i].second).collective();
    const Collective &y = plan.ranks(b).steps(atB[i].second).collective();
    auto describe = [&](int rank, const Collective &c, bool sent) -> std::string {
      const auto &ids = sent ? c.inputs() : c.outputs();
      if (ids.empty() || ids[0] >= static_cast<uint32_t>(plan.ranks(rank).buffers_size()))
        return "nothing";
      const Buffer &buffer = plan.ranks(rank).buffers(static_cast<int>(ids[0]));
      return absl::StrCat(buffer.size_bytes(), " bytes of ", dtypeName(static_cast<DType>(buffer.dtype())));
    };
    for (auto [from, fromC, to, toC] : {std::tuple{a, &x, b, &y}, std::tuple{b, &y, a, &x}}) {
      std::string sent = describe(from, *fromC, true), received = describe(to, *toC, false);
      if (sent != received)
        problems.add("group ", name, ": send_recv #", i, ": rank ", from, " (step ",
                     from == a ? atA[i].second : atB[i].second, ") sends ", sent, " but rank ", to, " (step ",
                     to == a ? atA[i].second : atB[i].second, ") receives ", received,
                     ", expected what one sends to be what the other receives");
    }
  }
}

// Every member of a communicator must declare it identically and issue the
// same collectives on it in the same order; otherwise NCCL hangs.
void checkGroupsAcrossRanks(const Plan &plan, const std::vector<RankSummary> &summaries, Problems &problems) {
  std::map<GroupKey, std::vector<std::pair<int, int>>> declared; // key -> (rank, group index)
  for (int r = 0; r < plan.ranks_size(); ++r)
    for (int g = 0; g < plan.ranks(r).groups_size(); ++g)
      if (summaries[r].groupOk[g]) {
        const Group &group = plan.ranks(r).groups(g);
        declared[{group.axis(), {group.ranks().begin(), group.ranks().end()}}].push_back({r, g});
      }

  for (const auto &[key, declarers] : declared) {
    std::string name = groupString(key);
    std::set<int> who;
    for (const auto &decl : declarers)
      who.insert(decl.first);
    for (int32_t member : key.second)
      if (!who.count(member))
        problems.add("group ", name, " (declared by rank ", declarers.front().first, " as groups[",
                     declarers.front().second, "]): member rank ", member,
                     " does not declare it, expected every member to declare the same axis and ranks");

    const auto &[refRank, refGroup] = declarers.front();
    const auto &reference = summaries[refRank].collectives[refGroup];
    for (size_t d = 1; d < declarers.size(); ++d) {
      const auto &[r, g] = declarers[d];
      const auto &sequence = summaries[r].collectives[g];
      size_t n = std::min(reference.size(), sequence.size());
      size_t i = 0;
      while (i < n && reference[i].first == sequence[i].first)
        ++i;
      if (i < n) {
        problems.add("group ", name, ": collective #", i, " on it is ",
                     collectiveKindName(static_cast<Collective::Kind>(sequence[i].first)), " at rank ", r, " step ",
                     sequence[i].second, " but ",
                     collectiveKindName(static_cast<Collective::Kind>(reference[i].first)), " at rank ", refRank,
                     " step ", reference[i].second,
                     ", expected every member to issue the same collectives in the same order");
      } else if (reference.size() != sequence.size()) {
        problems.add("group ", name, ": rank ", r, " issues ", sequence.size(), " collectives on it but rank ",
                     refRank, " issues ", reference.size(),
                     ", expected every member to issue the same collectives in the same order");
      } else {
        checkPointToPoint(plan, name, refRank, reference, r, sequence, problems);
      }
    }
  }
}

Problems validate(const Plan &plan, size_t limit) {
  Problems problems(limit);
  checkHeader(plan, problems);

  // A plan that trains needs both; a forward-only plan may leave both out,
  // but whatever it carries is checked.
  bool trains = plan.has_optimizer() || plan.has_lora();
  for (const Rank &rank : plan.ranks())
    for (const Buffer &buffer : rank.buffers())
      trains = trains || buffer.role() == LORA_PARAM;
  if (trains) {
    checkOptimizer(plan.optimizer(), problems);
    checkLora(plan, problems);
  }

  std::vector<RankSummary> summaries(plan.ranks_size());
  for (int r = 0; r < plan.ranks_size(); ++r)
    RankChecker(plan, r, problems, summaries[r]).run();
  checkGroupsAcrossRanks(plan, summaries, problems);
  return problems;
}

} // namespace

std::vector<std::string> findPlanProblems(const Plan &plan, size_t limit) { return validate(plan, limit).take(); }

absl::Status validatePlan(const Plan &plan) {
  Problems problems = validate(plan, 100);
  if (problems.total() == 0)
    return absl::OkStatus();
  size_t total = problems.total();
  return absl::InvalidArgumentError(
      absl::StrCat("invalid plan: ", total, " problem(s)\n", absl::StrJoin(problems.take(), "\n")));
}

} // namespace moec::plan
