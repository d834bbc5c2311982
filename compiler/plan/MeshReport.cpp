//===- MeshReport.cpp - what one training step costs per GPU of a mesh ----===//

#include "compiler/plan/MeshReport.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "compiler/analysis/ModelSummary.h"
#include "compiler/plan/CollectiveBytes.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"

namespace moec::compiler {

namespace {

constexpr int64_t kAlignment = 256; // each buffer's padding in its arena, as Program.cpp places them
/// Homes of model-level values: before the layers (embedding) and after them (final norm, LM head).
constexpr int kPre = -1, kPost = -2;
constexpr double kPeakFlopsPerSecond = 989e12; // H200 dense bf16, only to put the times in scale

int64_t aligned(int64_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }
int64_t ceilDiv(int64_t a, int64_t b) { return b <= 1 ? a : (a + b - 1) / b; }

struct ParamFacts {
  int id = -1;                    // a WEIGHT or LORA_PARAM buffer
  int layer = -1;                 // the layer whose steps use it; -1 for model-level parameters
  bool pre = false, post = false; // model-level: used before / after the layers
  bool expert = false;            // routed experts' (a {expert} tensor or an expert_mlp weight)
};

/// One collective step of the slice's program.
struct CollectiveFacts {
  std::string collective, axis;
  int phase = 0;        // 0 forward, 1 backward, 2 recompute
  int home = kPre;      // its layer, or kPre / kPost
  bool perStep = false; // a gradient sum: once per step, whatever the micro-batches
  int64_t bytes = 0;    // sent by this rank each time it runs
};

/// What the estimate reads from the slice's program; independent of pp.
struct Facts {
  const Program *program = nullptr;
  int numLayers = 0;
  int64_t hidden = 0, hiddenBytes = 0, numExperts = 0;
  bool recomputes = false, sequenceParallel = false;
  bool unboundedRoutes = false; // a routed exchange with room for every token of every rank
  bool boundedRoutes = false;   // a routed exchange with a capacity_factor
  std::vector<ParamFacts> params;
  std::vector<int64_t> layerFlops, layerOutBytes; // per layer; its [tokens (/ tp), hidden] output
  std::vector<CollectiveFacts> collectives;
  int64_t preFlops = 0, postFlops = 0;
  std::map<int, int64_t> savedByHome; // layer, kPre or kPost -> saved activation bytes
  int64_t savedTotal = 0, transient = 0, workspace = 0, scratch = 0, input = 0;
};

Facts analyze(const Program &program, const moe::MeshShape &mesh) {
  Facts f;
  f.program = &program;
  const std::vector<ProgramStep> &steps = program.steps;
  const std::vector<ProgramBuffer> &buffers = program.buffers;
  int numSteps = static_cast<int>(steps.size());
  int firstLayerStep = numSteps, lastForward = -1;
  std::vector<int> producer(buffers.size(), -1);
  for (int i = 0; i < numSteps; ++i) {
    const ProgramStep &step = steps[i];
    if (step.layer >= 0) {
      firstLayerStep = std::min(firstLayerStep, i);
      f.numLayers = std::max(f.numLayers, step.layer + 1);
    }
    if (step.phase == plan::FORWARD)
      lastForward = i;
    // A recomputed kernel; sequence parallel alone gathers the regions' inputs again (a
    // collective in the recompute phase), which is not --recompute.
    f.recomputes |= step.phase == plan::RECOMPUTE && step.collective.empty();
    for (int out : step.outputs)
      if (producer[out] < 0)
        producer[out] = i;
    if (step.kernel == "embedding" && !step.outputs.empty() && f.hidden == 0) {
      const ProgramBuffer &embeddings = buffers[step.outputs[0]];
      f.hidden = embeddings.shape.empty() ? 0 : embeddings.shape.back();
      f.hiddenBytes = embeddings.bytes;
    }
    if (step.collective == "expert_route" && step.attrs) {
      if (auto experts = step.attrs.getAs<mlir::IntegerAttr>("num_experts"))
        f.numExperts = std::max<int64_t>(f.numExperts, experts.getInt());
      f.unboundedRoutes |= !step.attrs.get("all_tokens") && !step.attrs.get("capacity_factor");
      f.boundedRoutes |= static_cast<bool>(step.attrs.get("capacity_factor"));
    }
    if (step.collective == "all_gather" || step.collective == "reduce_scatter")
      f.sequenceParallel = true;
  }
  f.layerFlops.assign(f.numLayers, 0);
  f.layerOutBytes.assign(f.numLayers, f.hiddenBytes);
  for (const ProgramBuffer &buffer : buffers) {
    llvm::StringRef name(buffer.name);
    int layer;
    if (name.consume_front("layer_output.") && !name.getAsInteger(10, layer) && layer >= 0 &&
        layer < f.numLayers)
      f.layerOutBytes[layer] = buffer.bytes;
  }

  std::vector<int64_t> sent = collectiveSentBytes(program, mesh);
  std::vector<int> paramIndex(buffers.size(), -1);
  for (int i = 0; i < numSteps; ++i) {
    const ProgramStep &step = steps[i];
    llvm::StringRef kernel(step.kernel);
    kernel.consume_back(".backward");
    int home = step.layer >= 0 ? step.layer : i < firstLayerStep ? kPre : kPost;
    if (step.layer >= 0)
      f.layerFlops[step.layer] += step.flops;
    else
      (i < firstLayerStep ? f.preFlops : f.postFlops) += step.flops;
    if (step.phase == plan::FORWARD && kernel == "dispatch" && step.outputs.size() > 1 && f.numExperts == 0 &&
        !buffers[step.outputs[1]].shape.empty())
      f.numExperts = buffers[step.outputs[1]].shape[0]; // one rank: the dispatch counts every expert
    if (!step.collective.empty()) {
      CollectiveFacts c;
      c.collective = step.collective;
      c.axis = step.axis;
      c.phase = step.phase == plan::FORWARD ? 0 : step.phase == plan::BACKWARD ? 1 : 2;
      c.home = home;
      c.perStep = llvm::StringRef(step.origin).contains("all_reduce_grads");
      c.bytes = sent[i];
      if (c.collective != "send_recv") // the slice has no pipeline: its stages' exchanges are simulated
        f.collectives.push_back(c);
    }
    for (auto [operand, id] : llvm::enumerate(step.inputs)) {
      plan::Role role = buffers[id].role;
      if (role != plan::WEIGHT && role != plan::LORA_PARAM)
        continue;
      if (paramIndex[id] < 0) {
        paramIndex[id] = static_cast<int>(f.params.size());
        ParamFacts param;
        param.id = id;
        param.expert = llvm::StringRef(buffers[id].tensor).contains("{expert}") ||
                       (kernel == "expert_mlp" && operand >= 2);
        f.params.push_back(param);
      }
      ParamFacts &param = f.params[paramIndex[id]];
      if (step.layer >= 0) {
        if (param.layer < 0)
          param.layer = step.layer;
      } else if (i < firstLayerStep) {
        param.pre = true;
      } else {
        param.post = true;
      }
    }
  }
  // Parameters no step reads still take memory: on the first stage.
  for (auto [id, buffer] : llvm::enumerate(buffers))
    if ((buffer.role == plan::WEIGHT || buffer.role == plan::LORA_PARAM) && paramIndex[id] < 0) {
      ParamFacts param;
      param.id = static_cast<int>(id);
      param.pre = true;
      f.params.push_back(param);
    }

  // Saved activations: forward values still live when the backward starts. Each belongs to
  // the layer whose step reads it last (the one that frees it).
  for (auto [id, buffer] : llvm::enumerate(buffers)) {
    if (buffer.role == plan::INPUT)
      f.input += aligned(buffer.bytes);
    if (buffer.role != plan::ACTIVATION)
      continue;
    int p = producer[id];
    if (p < 0 || steps[p].phase != plan::FORWARD || buffer.last <= lastForward)
      continue;
    int home = buffer.last >= 0 && buffer.last < numSteps ? steps[buffer.last].layer : -1;
    if (home < 0)
      home = p < firstLayerStep ? kPre : kPost;
    f.savedByHome[home] += aligned(buffer.bytes);
    f.savedTotal += aligned(buffer.bytes);
  }
  std::map<plan::Role, int64_t> arenas = program.arenaBytes();
  // The rest of the activation arena: gradients between layers, recomputed values, reuse gaps.
  f.transient = std::max<int64_t>(0, arenas[plan::ACTIVATION] - f.savedTotal);
  f.workspace = arenas[plan::WORKSPACE];
  f.scratch = program.scratchBytes();
  return f;
}

struct Group {
  int64_t size = 1, onNode = 1;
  bool crossesNodes = false;
};

int64_t floorDiv(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

/// Groups whose members are a base rank plus `offsets`, for bases of the given residues modulo
/// the node size (which nodes the members land on depends only on that): whether any of them
/// crosses nodes, and the fewest members one member shares its node with (itself included).
Group spread(const std::vector<int64_t> &offsets, const std::set<int64_t> &residues, int64_t gpusPerNode) {
  Group group;
  group.size = static_cast<int64_t>(offsets.size());
  group.onNode = group.size;
  int64_t low = *std::min_element(offsets.begin(), offsets.end());
  int64_t high = *std::max_element(offsets.begin(), offsets.end());
  std::vector<int64_t> perNode;
  for (int64_t residue : residues) {
    int64_t first = floorDiv(residue + low, gpusPerNode);
    perNode.assign(static_cast<size_t>(floorDiv(residue + high, gpusPerNode) - first + 1), 0);
    for (int64_t o : offsets)
      ++perNode[static_cast<size_t>(floorDiv(residue + o, gpusPerNode) - first)];
    group.crossesNodes |= std::count_if(perNode.begin(), perNode.end(), [](int64_t n) { return n > 0; }) > 1;
    for (int64_t o : offsets)
      group.onNode = std::min(group.onNode, perNode[static_cast<size_t>(floorDiv(residue + o, gpusPerNode) - first)]);
  }
  return group;
}

/// The residues modulo the node size of the ranks whose coordinates are 0 on `skip`'s axes and
/// `stage` on pp (every stage: -1; pp among `skip`: 0).
std::set<int64_t> baseResidues(const moe::MeshShape &mesh, const std::vector<std::string> &skip, int64_t stage,
                               int64_t gpusPerNode) {
  bool ppSkipped = std::find(skip.begin(), skip.end(), "pp") != skip.end();
  std::set<int64_t> residues = {(ppSkipped || stage < 0 ? 0 : stage * mesh.stride("pp")) % gpusPerNode};
  for (const char *axis : {"dp", "tp", "pp", "ep"}) {
    if (std::find(skip.begin(), skip.end(), axis) != skip.end() || (axis == std::string("pp") && stage >= 0))
      continue;
    std::set<int64_t> next; // k x stride modulo the node size repeats within gpusPerNode steps
    int64_t stride = mesh.stride(axis);
    for (int64_t k = 0; k < std::min(mesh.axisSize(axis), gpusPerNode); ++k)
      for (int64_t r : residues)
        next.insert((r + k * stride) % gpusPerNode);
    residues = std::move(next);
  }
  return residues;
}

/// The groups over `axes` ("dp+ep") of the ranks of pipeline stage `stage` (-1: of every stage).
Group groupOf(const moe::MeshShape &mesh, llvm::StringRef axes, int64_t gpusPerNode, int64_t stage = -1) {
  llvm::SmallVector<llvm::StringRef> parts;
  axes.split(parts, '+');
  std::vector<std::string> inGroup;
  std::vector<int64_t> offsets = {0};
  for (llvm::StringRef axis : parts) {
    inGroup.push_back(axis.str());
    std::vector<int64_t> next;
    int64_t stride = mesh.stride(axis.str());
    for (int64_t k = 0; k < mesh.axisSize(axis.str()); ++k)
      for (int64_t o : offsets)
        next.push_back(o + k * stride);
    offsets = std::move(next);
  }
  return spread(offsets, baseResidues(mesh, inGroup, stage, gpusPerNode), gpusPerNode);
}

/// A rank of stage `from` and its neighbour in stage `to`, for every rank of `from`.
Group pairOf(const moe::MeshShape &mesh, int64_t from, int64_t to, int64_t gpusPerNode) {
  return spread({0, (to - from) * mesh.stride("pp")}, baseResidues(mesh, {}, from, gpusPerNode), gpusPerNode);
}

/// What a collective of the slice is for, as the report's "what" column says it.
const char *purpose(const CollectiveFacts &c) {
  if (c.collective == "expert_route")
    return "tokens' experts";
  if (c.collective == "expert_send")
    return "tokens to experts";
  if (c.collective == "expert_return")
    return "partial sums back";
  if (c.perStep)
    return "LoRA gradients";
  if (c.collective == "all_reduce")
    return "tp partial sums";
  return "sequence parallel";
}

class Estimator {
public:
  Estimator(const Facts &facts, const moe::MeshShape &mesh, const MeshOptions &options)
      : f(facts), mesh(mesh), options(options) {}

  MeshEstimate run() {
    MeshEstimate e;
    e.mesh = mesh;
    e.options = options;
    int64_t pp = std::max<int64_t>(1, mesh.pp);
    e.microBatches = pp == 1 ? 1 : options.microBatches > 0 ? options.microBatches : 2 * pp;
    e.tokensPerMicroBatch = f.program->tokens();
    e.globalTokensPerStep = e.tokensPerMicroBatch * mesh.dp * mesh.ep * e.microBatches;
    e.numLayers = f.numLayers;
    e.hiddenSize = f.hidden;
    e.recomputes = f.recomputes;
    for (int64_t s = 0; s < pp; ++s)
      e.stages.push_back(stage(static_cast<int>(s), pp, e.microBatches));
    for (const StageEstimate &st : e.stages) {
      if (st.memory.total() > e.stages[e.worstMemoryStage].memory.total())
        e.worstMemoryStage = st.stage;
      if (st.commSeconds > e.stages[e.slowestCommStage].commSeconds)
        e.slowestCommStage = st.stage;
    }
    e.marginBytes = options.gpuBytes - e.stages[e.worstMemoryStage].memory.total();
    e.fits = e.marginBytes >= 0;
    e.assumptions = assumptions(e);
    return e;
  }

private:
  StageEstimate stage(int s, int64_t pp, int64_t m) {
    const std::vector<ProgramBuffer> &buffers = f.program->buffers;
    StageEstimate st;
    st.stage = s;
    st.firstLayer = static_cast<int>(s * f.numLayers / pp);
    st.endLayer = static_cast<int>((s + 1) * f.numLayers / pp);
    st.embedding = s == 0;
    st.lmHead = s == pp - 1;
    st.inFlight = std::min<int64_t>(pp - s, m);
    auto inStage = [&](int home) {
      return home >= 0 ? home >= st.firstLayer && home < st.endLayer : home == kPre ? st.embedding : st.lmHead;
    };

    // Every buffer at its size in the slice's program (one rank's part of each tensor).
    MemoryByRole &mem = st.memory;
    for (const ParamFacts &param : f.params) {
      bool here = param.layer >= 0 ? inStage(param.layer) : (param.pre && st.embedding) || (param.post && st.lmHead);
      if (!here)
        continue;
      const ProgramBuffer &buffer = buffers[param.id];
      if (buffer.role == plan::WEIGHT) {
        mem.weight += aligned(buffer.bytes);
        if (param.expert)
          mem.expertWeight += aligned(buffer.bytes);
        continue;
      }
      mem.loraParam += aligned(buffer.bytes);
      if (buffer.grad >= 0)
        mem.gradient += aligned(buffers[buffer.grad].bytes);
      for (int moment : {buffer.adamM, buffer.adamV})
        if (moment >= 0)
          mem.optimizerState += aligned(buffers[moment].bytes);
    }
    for (auto [home, bytes] : f.savedByHome)
      if (inStage(home))
        mem.savedActivation += bytes;
    mem.transientActivation = f.transient;
    mem.activation = mem.savedActivation * st.inFlight + mem.transientActivation;
    mem.workspace = f.workspace;
    mem.scratch = f.scratch;
    mem.input = f.input;

    int64_t flops = (st.embedding ? f.preFlops : 0) + (st.lmHead ? f.postFlops : 0);
    for (int l = st.firstLayer; l < st.endLayer; ++l)
      flops += f.layerFlops[l];
    st.flopsPerGpu = flops * m;

    communication(st, m, inStage);
    for (const CommEstimate &c : st.comm)
      st.commSeconds += c.seconds;
    return st;
  }

  double ringSeconds(int64_t bytes, const Group &group) const {
    return bytes / (group.crossesNodes ? options.interNodeBytesPerSecond : options.intraNodeBytesPerSecond);
  }

  /// The on-node share of an exchange goes over NVLink while the rest crosses the network.
  double allToAllSeconds(int64_t bytes, const Group &group) const {
    double onNode = group.size > 1 ? double(group.onNode - 1) / double(group.size - 1) : 1.0;
    return std::max(bytes * onNode / options.intraNodeBytesPerSecond,
                    bytes * (1 - onNode) / options.interNodeBytesPerSecond);
  }

  void add(StageEstimate &st, const std::string &collective, const std::string &what, const char *phase,
           const std::string &axis, const Group &group, int64_t count, int64_t bytes, bool exchange) {
    if (count <= 0)
      return;
    CommEstimate c;
    c.collective = collective;
    c.what = what;
    c.phase = phase;
    c.axis = axis;
    c.groupSize = group.size;
    c.count = count;
    c.bytes = bytes;
    c.crossesNodes = group.crossesNodes;
    c.seconds = exchange ? allToAllSeconds(bytes, group) : ringSeconds(bytes, group);
    st.comm.push_back(c);
  }

  /// The slice's own collectives in the stage's layers (each micro-batch runs them; a
  /// gradient sum runs once per step), then the pipeline's transfers.
  template <typename InStage>
  void communication(StageEstimate &st, int64_t m, InStage inStage) {
    const char *phases[] = {"fwd", "bwd", "recompute"};
    struct Row {
      int64_t count = 0, bytes = 0;
    };
    std::map<std::tuple<std::string, std::string, std::string, std::string>, Row> rows;
    for (const CollectiveFacts &c : f.collectives) {
      if (!inStage(c.home))
        continue;
      int64_t times = c.perStep ? 1 : m;
      Row &row = rows[{c.collective, purpose(c), c.perStep ? "step" : phases[c.phase], c.axis}];
      row.count += times;
      row.bytes += c.bytes * times;
    }
    for (auto &[key, row] : rows) {
      auto &[collective, what, phase, axis] = key;
      add(st, collective, what, phase.c_str(), axis, groupOf(mesh, axis, options.gpusPerNode, st.stage),
          row.count, row.bytes, llvm::StringRef(collective).starts_with("expert_"));
    }
    if (mesh.pp > 1) {
      auto boundary = [&](int layer) {
        return layer >= 0 && layer < f.numLayers ? f.layerOutBytes[layer] : f.hiddenBytes;
      };
      if (!st.lmHead)
        add(st, "send_recv", "activations", "fwd", "pp", pairOf(mesh, st.stage, st.stage + 1, options.gpusPerNode),
            m, boundary(st.endLayer - 1) * m, false);
      if (!st.embedding)
        add(st, "send_recv", "gradients", "bwd", "pp", pairOf(mesh, st.stage, st.stage - 1, options.gpusPerNode),
            m, boundary(st.firstLayer - 1) * m, false);
    }
  }

  std::vector<std::string> assumptions(const MeshEstimate &e) const {
    std::vector<std::string> lines;
    int64_t gpn = options.gpusPerNode;
    std::string axes;
    for (llvm::StringRef axis : llvm::split(mesh.order, ',')) {
      if (mesh.axisSize(axis.str()) <= 1)
        continue;
      Group group = groupOf(mesh, axis, gpn);
      if (!axes.empty())
        axes += "; ";
      axes += llvm::formatv("{0} (stride {1}) {2}", axis, mesh.stride(axis.str()),
                            group.crossesNodes ? "spans nodes" : "within a node")
                  .str();
    }
    lines.push_back(llvm::formatv("ranks: numbered {0} (the fastest first{1}), {2} GPUs per node: {3}",
                                  mesh.order,
                                  mesh.order == moe::MeshShape::kDefaultOrder ? ", moec's default" : ": --rank-order",
                                  gpn, axes.empty() ? std::string("one rank") : axes)
                        .str());
    moe::MeshShape slice = mesh;
    slice.pp = 1;
    lines.push_back(llvm::formatv("planned: the passes place the model on the mesh without pp ({0}), as they "
                                  "would for the plan: rank 0's program gives every buffer (one rank's part "
                                  "of each tensor, the expert exchange's room), every collective and its "
                                  "bytes; only the pipeline stages are simulated",
                                  slice.str())
                        .str());
    lines.push_back(llvm::formatv("links: {0:F0} GB/s within a node (NVLink), {1:F0} GB/s per GPU across "
                                  "nodes; a ring collective whose group spans nodes runs at the "
                                  "cross-node speed; the expert exchange sends its on-node share over NVLink "
                                  "while the rest crosses nodes; bytes are what each GPU sends (ring "
                                  "all-reduce 2(n-1)/n of the tensor, all-gather (n-1) x its input, "
                                  "reduce-scatter (n-1)/n of its input; the expert exchange the rows uniform "
                                  "routing sends each other rank); times add: no overlap with each other or "
                                  "with compute",
                                  options.intraNodeBytesPerSecond / 1e9,
                                  options.interNodeBytesPerSecond / 1e9)
                        .str());
    lines.push_back(llvm::formatv("data: each of the dp x ep = {0} replicas of a (tp, pp) position runs its "
                                  "own micro-batch of {1} tokens; collectives run once per micro-batch, "
                                  "the LoRA gradients' sums once per step",
                                  mesh.dp * mesh.ep, e.tokensPerMicroBatch)
                        .str());
    lines.push_back(llvm::formatv("pipeline: stage s holds layers [s*L/pp, (s+1)*L/pp) of L = {0} (their "
                                  "parameters and collectives), the first also the embedding, the last the "
                                  "final norm and LM head; 1F1B with {1} micro-batch(es) per step{2}: stage s "
                                  "keeps the saved activations of min(pp-s, micro-batches) of them; each "
                                  "micro-batch sends its boundary activation forward and its gradient "
                                  "backward, counted on the sender",
                                  f.numLayers, e.microBatches,
                                  options.microBatches > 0 || mesh.pp <= 1 ? "" : " (2 x pp, as --pipeline-micro-batches 0)")
                        .str());
    lines.push_back("activations: a saved activation (a forward value the backward reads) belongs to "
                    "the layer whose step reads it last; the rest of the planned activation arena "
                    "(gradients between layers, recomputed values), the workspace and kernel scratch "
                    "are the planned sizes on every stage; the expert exchange holds its planned room "
                    "(--ep-capacity-factor), FLOPs count what balanced routing fills");
    lines.push_back("not counted: CUDA context, NCCL and exchange staging buffers, allocator "
                    "fragmentation (keep a margin); compute is H200 dense bf16 peak, for scale only");
    return lines;
  }

  const Facts &f;
  moe::MeshShape mesh;
  MeshOptions options;
};

std::string gb(int64_t bytes) { return llvm::formatv("{0:F2}", bytes / 1e9).str(); }

/// A factor as the flag takes it: 2, 1.5.
std::string factor(double value) {
  std::string text;
  llvm::raw_string_ostream(text) << llvm::format("%g", value);
  return text;
}

std::string layerRange(const StageEstimate &st) {
  if (st.endLayer <= st.firstLayer)
    return "none";
  return llvm::formatv("{0}-{1}", st.firstLayer, st.endLayer - 1).str();
}

void printMemory(const MeshEstimate &e, llvm::raw_ostream &os) {
  // Every stage as a column when they fit on a line; else the worst one and a line of totals.
  std::vector<const StageEstimate *> columns;
  if (e.stages.size() <= 8)
    for (const StageEstimate &st : e.stages)
      columns.push_back(&st);
  else
    columns.push_back(&e.stages[e.worstMemoryStage]);
  os << "memory per GPU (GB = 1e9 bytes):\n";
  os << llvm::format("  %-18s", "role");
  for (const StageEstimate *st : columns)
    os << llvm::format(" %10s", ("stage " + std::to_string(st->stage)).c_str());
  os << "\n";
  auto row = [&](const char *name, auto field) {
    os << llvm::format("  %-18s", name);
    for (const StageEstimate *st : columns)
      os << llvm::format(" %10s", field(*st).c_str());
    os << "\n";
  };
  using S = const StageEstimate &;
  row("layers", [](S st) { return layerRange(st); });
  row("in flight", [](S st) { return std::to_string(st.inFlight); });
  row("weight", [](S st) { return gb(st.memory.weight); });
  row("  routed experts", [](S st) { return gb(st.memory.expertWeight); });
  row("lora_param", [](S st) { return gb(st.memory.loraParam); });
  row("gradient", [](S st) { return gb(st.memory.gradient); });
  row("optimizer_state", [](S st) { return gb(st.memory.optimizerState); });
  row("activation", [](S st) { return gb(st.memory.activation); });
  row("  saved x in flight", [](S st) { return gb(st.memory.savedActivation * st.inFlight); });
  row("  transient", [](S st) { return gb(st.memory.transientActivation); });
  row("workspace", [](S st) { return gb(st.memory.workspace); });
  row("scratch", [](S st) { return gb(st.memory.scratch); });
  row("input", [](S st) { return gb(st.memory.input); });
  row("total", [](S st) { return gb(st.memory.total()); });
  if (columns.size() < e.stages.size()) {
    os << "  totals by stage:";
    for (const StageEstimate &st : e.stages)
      os << " " << st.stage << ":" << gb(st.memory.total());
    os << "\n";
  }
  const StageEstimate &worst = e.stages[e.worstMemoryStage];
  os << llvm::formatv("fits in {0:F0} GB: {1} (by {2} GB; worst stage {3}: {4} GB)\n",
                      e.options.gpuBytes / 1e9, e.fits ? "yes" : "no", gb(std::abs(e.marginBytes)),
                      worst.stage, gb(worst.memory.total()));
}

moe::MeshShape withOrder(moe::MeshShape mesh, const std::string &order) {
  mesh.order = order;
  return mesh;
}

/// The rank order whose slowest stage communicates least, and that time; the mesh's own
/// unless another is faster by more than 1%. Of orders within 0.1% of the least, the one
/// that swaps the fewest pairs of the mesh's own. The order only decides which groups share
/// a node (what a collective costs), not what is sent.
std::pair<std::string, double> cheapestRankOrder(const Facts &facts, const MeshEstimate &e) {
  std::vector<std::string> own;
  for (llvm::StringRef axis : llvm::split(e.mesh.order, ','))
    own.push_back(axis.str());
  auto swapsFromOwn = [&](const std::vector<std::string> &order) {
    int swaps = 0;
    for (size_t i = 0; i < order.size(); ++i)
      for (size_t j = i + 1; j < order.size(); ++j)
        swaps += std::find(own.begin(), own.end(), order[i]) > std::find(own.begin(), own.end(), order[j]);
    return swaps;
  };
  std::vector<std::pair<std::vector<std::string>, double>> all;
  std::vector<std::string> axes = {"dp", "ep", "pp", "tp"};
  double least = 0;
  do {
    MeshEstimate estimate =
        Estimator(facts, withOrder(e.mesh, llvm::join(axes, ",")), e.options).run();
    double seconds = estimate.stages[estimate.slowestCommStage].commSeconds;
    least = all.empty() ? seconds : std::min(least, seconds);
    all.push_back({axes, seconds});
  } while (std::next_permutation(axes.begin(), axes.end()));
  double ownSeconds = e.stages[e.slowestCommStage].commSeconds;
  if (least >= ownSeconds * 0.99)
    return {e.mesh.order, ownSeconds};
  const std::pair<std::vector<std::string>, double> *best = nullptr;
  for (const auto &candidate : all)
    if (candidate.second <= least * 1.001 && (!best || swapsFromOwn(candidate.first) < swapsFromOwn(best->first)))
      best = &candidate;
  return {llvm::join(best->first, ","), best->second};
}

/// The shortest --rank-order that means `order` (the axes left out follow in the default order).
std::string shortestRankOrder(const std::string &order) {
  std::string prefix, full, error;
  for (llvm::StringRef axis : llvm::split(order, ',')) {
    prefix += (prefix.empty() ? "" : ",") + axis.str();
    if (moe::MeshShape::parseOrder(prefix, full, error) && full == order)
      return prefix;
  }
  return order;
}

void printCommunication(const Facts &facts, const MeshEstimate &e, llvm::raw_ostream &os) {
  const StageEstimate &st = e.stages[e.slowestCommStage];
  os << "communication per step per GPU";
  if (e.stages.size() > 1)
    os << " (stage " << st.stage << ", the slowest)";
  os << llvm::formatv(": {0} micro-batch(es) of {1} tokens\n", e.microBatches, e.tokensPerMicroBatch);
  if (st.comm.empty()) {
    os << "  none\n";
    return;
  }
  os << llvm::format("  %-15s %-21s %-9s %-8s %6s %7s %14s %-8s %10s\n", "collective", "what", "phase",
                     "axis", "group", "count", "GB per step", "link", "ms");
  int64_t bytes = 0;
  for (const CommEstimate &c : st.comm) {
    os << llvm::format("  %-15s %-21s %-9s %-8s %6lld %7lld %14s %-8s %10.2f\n", c.collective.c_str(),
                       c.what.c_str(), c.phase.c_str(), c.axis.c_str(), (long long)c.groupSize,
                       (long long)c.count, llvm::formatv("{0:F3}", c.bytes / 1e9).str().c_str(),
                       c.crossesNodes ? "network" : "NVLink", c.seconds * 1e3);
    bytes += c.bytes;
  }
  os << llvm::format("  %-15s %-21s %-9s %-8s %6s %7s %14s %-8s %10.2f\n", "total", "", "", "", "", "",
                     llvm::formatv("{0:F3}", bytes / 1e9).str().c_str(), "", st.commSeconds * 1e3);
  // Which ranks share a node decides what runs over NVLink: say where another order is faster.
  if (auto [order, seconds] = cheapestRankOrder(facts, e); order != e.mesh.order) {
    std::string inNode;
    moe::MeshShape better = withOrder(e.mesh, order);
    for (llvm::StringRef axis : llvm::split(order, ','))
      if (e.mesh.axisSize(axis.str()) > 1 && !groupOf(better, axis, e.options.gpusPerNode).crossesNodes)
        inNode += (inNode.empty() ? "" : ", ") + axis.str();
    os << llvm::formatv("  rank order: --rank-order {0} ({1} within a node) would take {2:F1} ms (this order "
                        "{3}: {4:F1} ms)\n",
                        shortestRankOrder(order), inNode.empty() ? std::string("no group") : inNode,
                        seconds * 1e3, e.mesh.order, st.commSeconds * 1e3);
  }
  if (e.stages.size() > 1) {
    os << "  ms by stage:";
    for (const StageEstimate &s : e.stages)
      os << llvm::formatv(" {0}:{1:F1}", s.stage, s.commSeconds * 1e3);
    os << "\n";
  }
  os << llvm::formatv("compute per GPU per step (stage {0}): {1:F1} TFLOP, {2:F1} ms at {3:F0} TFLOP/s\n",
                      st.stage, st.flopsPerGpu / 1e12, st.flopsPerGpu / kPeakFlopsPerSecond * 1e3,
                      kPeakFlopsPerSecond / 1e12);
}

void printSuggestions(const Facts &facts, const MeshEstimate &e, const SlicePlanner &plan, llvm::raw_ostream &os) {
  os << "to fit, try (same micro-batch):\n";
  SliceChoice now{e.mesh, e.options.epCapacityFactor, facts.sequenceParallel};
  auto flagsOf = [](const SliceChoice &c) {
    std::string flags = "--mesh " + c.mesh.str();
    if (c.epCapacityFactor != 0)
      flags += " --ep-capacity-factor " + factor(c.epCapacityFactor);
    if (c.sequenceParallel)
      flags += " --sequence-parallel";
    else if (c.mesh.tp > 1 && c.mesh.ep > 1)
      flags += " --sequence-parallel=false"; // moec's default there is on
    if (c.recomputeLayers)
      flags += " --recompute per-layer";
    if (c.mesh.order != moe::MeshShape::kDefaultOrder)
      flags += " --rank-order " + c.mesh.order;
    return flags;
  };
  // Prints the choice if its worst stage is below `beat` (the mesh's own by default) and
  // returns that worst stage's bytes (the mesh's own when it cannot be planned).
  int64_t current = e.stages[e.worstMemoryStage].memory.total();
  auto tryChoice = [&](const SliceChoice &choice, const char *why, int64_t beat = -1) -> int64_t {
    beat = beat < 0 ? current : beat;
    // pp only splits layers: the same slice. Anything else plans a new one.
    moe::MeshShape a = choice.mesh, b = now.mesh;
    a.pp = b.pp = 1;
    mlir::FailureOr<Program> other;
    const Program *slice = facts.program;
    if (a.str() != b.str() || choice.epCapacityFactor != now.epCapacityFactor ||
        choice.sequenceParallel != now.sequenceParallel || choice.recomputeLayers != now.recomputeLayers) {
      if (!plan)
        return current;
      other = plan(choice);
      if (mlir::failed(other)) {
        os << "  " << flagsOf(choice) << ": does not plan (see the diagnostics above)\n";
        return current;
      }
      slice = &*other;
    }
    MeshOptions options = e.options;
    options.epCapacityFactor = choice.epCapacityFactor;
    MeshEstimate estimate = Estimator(analyze(*slice, choice.mesh), choice.mesh, options).run();
    const StageEstimate &worst = estimate.stages[estimate.worstMemoryStage];
    if (worst.memory.total() >= beat)
      return worst.memory.total(); // no help (a capacity factor at ep = 2: its bound is the worst case)
    // What it costs too: a choice that fits may send or compute much more (recompute). A step's
    // tokens differ where the mesh does (more replicas, more pipeline micro-batches): say them.
    const StageEstimate &slowest = estimate.stages[estimate.slowestCommStage];
    os << llvm::formatv("  {0} ({1} GPUs; {2}): worst stage {3} GB, {4}; per GPU per step {5:F1} s of "
                        "communication, {6:F0} TFLOP; {7} tokens a step over the mesh\n",
                        flagsOf(choice), analysis::withCommas(choice.mesh.size()), why, gb(worst.memory.total()),
                        estimate.fits ? "fits" : "over by " + gb(-estimate.marginBytes) + " GB",
                        slowest.commSeconds, slowest.flopsPerGpu / 1e12,
                        analysis::withCommas(estimate.globalTokensPerStep));
    return worst.memory.total();
  };
  int64_t rows = current;
  if (now.mesh.tp > 1 && !now.sequenceParallel) {
    SliceChoice c = now;
    c.sequenceParallel = true;
    rows = tryChoice(c, "each tp rank holds and routes its rows of the tokens");
  }
  bool bound = facts.unboundedRoutes && now.epCapacityFactor == 0;
  int64_t bounded = current;
  if (bound) {
    SliceChoice c = now;
    c.epCapacityFactor = 2;
    bounded = tryChoice(c, "room for twice the expert rows balanced routing sends, not every token of every rank");
  }
  if (bound && now.mesh.tp > 1 && !now.sequenceParallel) {
    SliceChoice c = now;
    c.epCapacityFactor = 2;
    c.sequenceParallel = true;
    tryChoice(c, "both", std::min(rows, bounded));
  }
  if (facts.numExperts > 0 && now.mesh.ep * 2 <= facts.numExperts) {
    SliceChoice c = now;
    c.mesh.ep *= 2;
    tryChoice(c, "halves the routed experts");
  }
  if (now.mesh.pp * 2 <= facts.numLayers) {
    SliceChoice c = now;
    c.mesh.pp *= 2;
    tryChoice(c, "halves each stage's layers");
  }
  if (now.mesh.tp * 2 <= e.options.gpusPerNode) {
    SliceChoice c = now;
    c.mesh.tp *= 2;
    tryChoice(c, "splits heads and features further");
  }
  // Recompute keeps only the layers' inputs and routing: worth a try where activations weigh,
  // on its own and with the rows and room choices above where they helped.
  const MemoryByRole &worst = e.stages[e.worstMemoryStage].memory;
  if (!facts.recomputes && worst.activation * 5 > worst.total()) {
    SliceChoice c = now;
    c.recomputeLayers = true;
    int64_t alone = tryChoice(c, "keeps only the layers' inputs and routing");
    c.sequenceParallel = rows < current || now.sequenceParallel;
    c.epCapacityFactor = bounded < current ? 2 : now.epCapacityFactor;
    if (c.sequenceParallel != now.sequenceParallel || c.epCapacityFactor != now.epCapacityFactor)
      tryChoice(c, "with the above", std::min({alone, rows, bounded}));
  }
}

} // namespace

MeshEstimate estimateMesh(const Program &slice, const moe::MeshShape &mesh, const MeshOptions &options) {
  Facts facts = analyze(slice, mesh);
  return Estimator(facts, mesh, options).run();
}

void printMeshReport(moe::ModelOp model, const Program &slice, const moe::MeshShape &mesh,
                     const MeshOptions &options, const SlicePlanner &plan, llvm::raw_ostream &os) {
  Facts facts = analyze(slice, mesh);
  MeshEstimate e = Estimator(facts, mesh, options).run();
  os << "mesh " << mesh.str() << ": " << analysis::withCommas(mesh.size()) << " GPUs ("
     << analysis::withCommas(ceilDiv(mesh.size(), options.gpusPerNode)) << " nodes of " << options.gpusPerNode
     << "), model " << model.getSymName() << "\n";
  os << llvm::formatv("tokens: {0} per micro-batch per replica (seq-len {1} x micro-batch {2}), {3} "
                      "micro-batch(es) per step, {4} per step over the mesh\n",
                      e.tokensPerMicroBatch, slice.seqLen, slice.microBatch, e.microBatches,
                      analysis::withCommas(e.globalTokensPerStep));
  os << "recompute: " << (e.recomputes ? "yes" : "none") << "; sequence parallel: "
     << (facts.sequenceParallel ? "yes (the backward gathers the regions' inputs again)" : "no");
  if (mesh.ep > 1) {
    std::string room = facts.unboundedRoutes ? "every token of every rank"
                       : facts.boundedRoutes ? factor(options.epCapacityFactor) + " x what uniform routing sends a rank"
                                             : "every token (each is sent to every rank)";
    os << "; expert exchange room: " << room;
  }
  os << "\n\n";
  printMemory(e, os);
  if (!e.fits)
    printSuggestions(facts, e, plan, os);
  os << "\n";
  printCommunication(facts, e, os);
  os << "\nassumptions:\n";
  for (const std::string &line : e.assumptions)
    os << "  - " << line << "\n";
}

} // namespace moec::compiler
