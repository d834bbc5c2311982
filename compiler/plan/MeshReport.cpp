//===- MeshReport.cpp - what one training step costs per GPU of a mesh ----===//

#include "compiler/plan/MeshReport.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "compiler/analysis/ModelSummary.h"
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

enum class Axis { None, Tp, Ep };

/// How a parameter is split: dimension `dim` over `axis` (Axis::None: replicated).
struct Split {
  Axis axis = Axis::None;
  int dim = -1;
};

struct ParamFacts {
  int id = -1;                    // a WEIGHT or LORA_PARAM buffer
  int layer = -1;                 // the layer whose steps use it; -1 for model-level parameters
  bool pre = false, post = false; // model-level: used before / after the layers
  Split split;
};

struct LayerFacts {
  // All-to-all payload (the [tokens x top_k, width] expert-side rows) and count, by phase
  // (0 forward, 1 backward, 2 recompute) and direction (0 dispatch-side, 1 combine-side).
  int64_t a2aBytes[3] = {0, 0, 0}, a2aCount[3][2] = {{0, 0}, {0, 0}, {0, 0}};
  int64_t topK = 1; // expert copies per token (the dispatch's rows over its tokens)
  bool hasRouter = false, linearAfterRouter = false, recompute = false;
  bool expertAdapters = false; // its expert MLP trains adapters: tp keeps the experts whole
  int64_t outBytes = 0; // its [tokens, hidden] output
  int64_t flops = 0;
  /// Blocks with tensor-parallel weights: the token mixer, and the channel mixer unless it
  /// is routed experts only (no linear after the router: no shared expert, no latent projection).
  int tpBlocks() const { return hasRouter && !linearAfterRouter ? 1 : 2; }
};

/// What the estimate reads from the program; independent of the mesh.
struct Facts {
  const Program *program = nullptr;
  int numLayers = 0;
  int64_t hidden = 0, hiddenBytes = 0, numExperts = 0;
  bool recomputes = false, hasEmbedding = false, hasLmHead = false;
  bool sharded = false; // the program already has collectives
  std::vector<ParamFacts> params;
  std::vector<LayerFacts> layers;
  int64_t preFlops = 0, postFlops = 0;
  std::map<int, int64_t> savedByHome; // layer, kPre or kPost -> saved activation bytes
  int64_t savedTotal = 0, transient = 0, workspace = 0, scratch = 0, input = 0;
};

/// Bytes of `buffer` when dimension `dim` is split `ways` ways (the largest slice).
int64_t splitBytes(const ProgramBuffer &buffer, const Split &split, int64_t ways) {
  if (split.axis == Axis::None || ways <= 1 || split.dim < 0 ||
      split.dim >= static_cast<int>(buffer.shape.size()))
    return buffer.bytes;
  int64_t bytes = plan::dtypeSize(buffer.dtype);
  for (auto [d, size] : llvm::enumerate(buffer.shape))
    bytes *= static_cast<int>(d) == split.dim ? ceilDiv(size, ways) : size;
  return bytes;
}

Facts analyze(const Program &program) {
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
    f.recomputes |= step.phase == plan::RECOMPUTE;
    f.sharded |= !step.collective.empty();
    for (int out : step.outputs)
      if (producer[out] < 0)
        producer[out] = i;
    if (step.kernel == "embedding" && !step.outputs.empty() && f.hidden == 0) {
      const ProgramBuffer &embeddings = buffers[step.outputs[0]];
      f.hidden = embeddings.shape.empty() ? 0 : embeddings.shape.back();
      f.hiddenBytes = embeddings.bytes;
    }
  }
  f.layers.resize(f.numLayers);
  for (const ProgramBuffer &buffer : buffers) {
    llvm::StringRef name(buffer.name);
    int layer;
    if (name.consume_front("layer_output.") && !name.getAsInteger(10, layer) && layer >= 0 &&
        layer < f.numLayers)
      f.layers[layer].outBytes = buffer.bytes;
  }
  for (LayerFacts &layer : f.layers)
    if (layer.outBytes == 0)
      layer.outBytes = f.hiddenBytes;

  // Megatron's split of a linear [out, in]: row-parallel (split `in`) when it writes the model
  // width from anything but a norm (o_proj, down_proj), otherwise column-parallel (split `out`).
  auto readsNorm = [&](int x) {
    int p = producer[x];
    return p >= 0 && (steps[p].kernel == "rms_norm" || steps[p].kernel == "layer_norm");
  };
  auto rowParallel = [&](int64_t out, int x) { return f.hidden > 0 && out == f.hidden && !readsNorm(x); };
  auto classify = [&](const ProgramStep &step, llvm::StringRef kernel, size_t operand) -> Split {
    const ProgramBuffer &buffer = buffers[step.inputs[operand]];
    if (llvm::StringRef(buffer.tensor).contains("{expert}") || (kernel == "expert_mlp" && operand >= 2))
      return {Axis::Ep, 0};
    if ((kernel == "embedding" || kernel == "lm_head_cross_entropy") && operand == 1)
      return {Axis::Tp, 0}; // vocab-parallel
    if (kernel == "linear" && operand == 1 && buffer.shape.size() == 2)
      return {Axis::Tp, rowParallel(buffer.shape[0], step.inputs[0]) ? 1 : 0};
    if (kernel == "lora_linear" && operand == 1 && buffer.shape.size() == 2) // the projection's weight
      return {Axis::Tp, rowParallel(buffer.shape[0], step.inputs[0]) ? 1 : 0};
    // lora's A and B are operands 1 and 2, lora_linear's 2 and 3.
    size_t firstFactor = kernel == "lora" ? 1 : kernel == "lora_linear" ? 2 : 0;
    if (firstFactor && (operand == firstFactor || operand == firstFactor + 1) &&
        step.inputs.size() >= firstFactor + 2) {
      // A [r, in], B [out, r]: the one on the base's split dimension splits, the other is whole.
      const ProgramBuffer &b = buffers[step.inputs[firstFactor + 1]];
      bool row = b.shape.size() == 2 && rowParallel(b.shape[0], step.inputs[0]);
      if (operand == firstFactor)
        return row ? Split{Axis::Tp, 1} : Split{};
      return row ? Split{} : Split{Axis::Tp, 0};
    }
    return {}; // norms, routers, biases, convolutions, per-head constants: replicated
  };

  std::vector<int> paramIndex(buffers.size(), -1);
  for (int i = 0; i < numSteps; ++i) {
    const ProgramStep &step = steps[i];
    llvm::StringRef kernel(step.kernel);
    bool backward = kernel.consume_back(".backward");
    if (step.layer >= 0) {
      LayerFacts &layer = f.layers[step.layer];
      layer.flops += step.flops;
      layer.recompute |= step.phase == plan::RECOMPUTE;
      if (step.phase == plan::FORWARD && kernel == "router")
        layer.hasRouter = true;
      if (step.phase == plan::FORWARD && kernel == "expert_mlp")
        for (int id : step.inputs)
          layer.expertAdapters |= buffers[id].role == plan::LORA_PARAM && moe::isAdapterTensorName(buffers[id].tensor);
      else if (step.phase == plan::FORWARD && kernel == "linear" && layer.hasRouter)
        layer.linearAfterRouter = true;
      // The expert-side rows each all-to-all moves: what dispatch sends to the experts, what
      // combine brings back, and the gradients of both going the other way.
      int payload = -1;
      if (kernel == "dispatch" && !step.outputs.empty())
        payload = backward ? step.inputs.back() : step.outputs[0];
      else if (kernel == "combine" && !step.inputs.empty() && !step.outputs.empty())
        payload = backward ? step.outputs[0] : step.inputs[0];
      if (payload >= 0) {
        int phase = step.phase == plan::FORWARD ? 0 : step.phase == plan::BACKWARD ? 1 : 2;
        layer.a2aBytes[phase] += buffers[payload].bytes;
        ++layer.a2aCount[phase][kernel == "combine" ? 1 : 0];
      }
      if (kernel == "dispatch" && !backward && step.outputs.size() > 1 &&
          !buffers[step.outputs[1]].shape.empty()) {
        f.numExperts = std::max(f.numExperts, buffers[step.outputs[1]].shape[0]);
        layer.topK = std::max<int64_t>(1, buffers[step.outputs[0]].shape.at(0) /
                                              std::max<int64_t>(1, buffers[step.inputs[0]].shape.at(0)));
      }
    } else if (i < firstLayerStep) {
      f.preFlops += step.flops;
    } else {
      f.postFlops += step.flops;
    }
    if (kernel == "embedding")
      f.hasEmbedding = true;
    if (step.layer < 0 && i > firstLayerStep && (kernel == "lm_head_cross_entropy" || kernel == "linear"))
      f.hasLmHead = true;
    for (auto [operand, id] : llvm::enumerate(step.inputs)) {
      plan::Role role = buffers[id].role;
      if (role != plan::WEIGHT && role != plan::LORA_PARAM)
        continue;
      bool first = paramIndex[id] < 0;
      if (first) {
        paramIndex[id] = static_cast<int>(f.params.size());
        f.params.push_back({id});
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
      if (first)
        param.split = classify(step, kernel, operand);
    }
  }
  // Parameters no step reads still take memory: on the first stage, whole.
  for (auto [id, buffer] : llvm::enumerate(buffers))
    if ((buffer.role == plan::WEIGHT || buffer.role == plan::LORA_PARAM) && paramIndex[id] < 0) {
      paramIndex[id] = static_cast<int>(f.params.size());
      f.params.push_back({static_cast<int>(id), -1, /*pre=*/true, false, {}});
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

/// Rank order: ep fastest, then dp, tp, pp (MeshShape).
int64_t strideOf(const moe::MeshShape &mesh, llvm::StringRef axis) {
  int64_t stride = 1;
  for (const char *a : {"ep", "dp", "tp", "pp"}) {
    if (axis == a)
      return stride;
    stride *= mesh.axisSize(a);
  }
  return stride;
}

/// Rank 0's group over `axes`, and how many of its members share rank 0's node.
struct Group {
  int64_t size = 1, onNode = 1;
  bool crossesNodes = false;
};

Group groupOf(const moe::MeshShape &mesh, std::initializer_list<const char *> axes, int64_t gpusPerNode) {
  std::vector<int64_t> ranks = {0};
  for (const char *axis : axes) {
    std::vector<int64_t> next;
    for (int64_t k = 0; k < mesh.axisSize(axis); ++k)
      for (int64_t r : ranks)
        next.push_back(r + k * strideOf(mesh, axis));
    ranks = std::move(next);
  }
  Group group;
  group.size = static_cast<int64_t>(ranks.size());
  group.onNode = std::count_if(ranks.begin(), ranks.end(), [&](int64_t r) { return r / gpusPerNode == 0; });
  group.crossesNodes = group.onNode < group.size;
  return group;
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
    e.shardedProgram = f.sharded;
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
    auto inStage = [&](int layer) { return layer >= st.firstLayer && layer < st.endLayer; };

    MemoryByRole &mem = st.memory;
    int64_t denseGrad = 0, expertGrad = 0; // gradient bytes to reduce (unpadded)
    for (const ParamFacts &param : f.params) {
      bool here =
          param.layer >= 0 ? inStage(param.layer) : (param.pre && st.embedding) || (param.post && st.lmHead);
      if (!here)
        continue;
      // Routed experts split over ep; without ep, --moe-propagate-sharding splits their
      // intermediate features over tp instead, unless they train adapters.
      bool expertsSplitOverTp =
          !options.expertsWholeOverTp && param.layer >= 0 && !f.layers[param.layer].expertAdapters;
      int64_t expertWays = mesh.ep > 1 ? mesh.ep : expertsSplitOverTp ? mesh.tp : 1;
      int64_t ways = param.split.axis == Axis::Tp ? mesh.tp : param.split.axis == Axis::Ep ? expertWays : 1;
      auto bytesOf = [&](int id) { return aligned(splitBytes(buffers[id], param.split, ways)); };
      const ProgramBuffer &buffer = buffers[param.id];
      if (buffer.role == plan::WEIGHT) {
        mem.weight += bytesOf(param.id);
        if (param.split.axis == Axis::Ep)
          mem.expertWeight += bytesOf(param.id);
        continue;
      }
      mem.loraParam += bytesOf(param.id);
      if (buffer.grad >= 0) {
        mem.gradient += bytesOf(buffer.grad);
        (param.split.axis == Axis::Ep ? expertGrad : denseGrad) +=
            splitBytes(buffers[buffer.grad], param.split, ways);
      }
      for (int moment : {buffer.adamM, buffer.adamV})
        if (moment >= 0)
          mem.optimizerState += bytesOf(moment);
    }
    int64_t saved = 0;
    for (auto [home, bytes] : f.savedByHome)
      if (home >= 0 ? inStage(home) : home == kPre ? st.embedding : st.lmHead)
        saved += bytes;
    mem.savedActivation = ceilDiv(saved, mesh.tp);
    mem.transientActivation = ceilDiv(f.transient, mesh.tp);
    mem.activation = mem.savedActivation * st.inFlight + mem.transientActivation;
    mem.workspace = ceilDiv(f.workspace, mesh.tp);
    mem.scratch = ceilDiv(f.scratch, mesh.tp);
    mem.input = f.input;

    int64_t flops = (st.embedding ? f.preFlops : 0) + (st.lmHead ? f.postFlops : 0);
    for (int l = st.firstLayer; l < st.endLayer; ++l)
      flops += f.layers[l].flops;
    st.flopsPerGpu = ceilDiv(flops, mesh.tp) * m;

    communication(st, m, denseGrad, expertGrad);
    for (const CommEstimate &c : st.comm)
      st.commSeconds += c.seconds;
    return st;
  }

  double ringSeconds(int64_t bytes, const Group &group) const {
    return bytes / (group.crossesNodes ? options.interNodeBytesPerSecond : options.intraNodeBytesPerSecond);
  }

  /// The on-node share of an all-to-all goes over NVLink while the rest crosses the network.
  double allToAllSeconds(int64_t bytes, const Group &group) const {
    double onNode = group.size > 1 ? double(group.onNode - 1) / double(group.size - 1) : 1.0;
    return std::max(bytes * onNode / options.intraNodeBytesPerSecond,
                    bytes * (1 - onNode) / options.interNodeBytesPerSecond);
  }

  void add(StageEstimate &st, const char *collective, const char *what, const char *phase,
           const std::string &axis, const Group &group, int64_t count, int64_t bytes, bool allToAll) {
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
    c.seconds = allToAll ? allToAllSeconds(bytes, group) : ringSeconds(bytes, group);
    st.comm.push_back(c);
  }

  void communication(StageEstimate &st, int64_t m, int64_t denseGrad, int64_t expertGrad) {
    int64_t gpn = options.gpusPerNode;
    const char *phases[] = {"fwd", "bwd", "recompute"};
    if (mesh.ep > 1) {
      Group ep = groupOf(mesh, {"ep"}, gpn);
      for (int ph = 0; ph < 3; ++ph) {
        int64_t dispatches = 0, combines = 0;
        double bytes = 0;
        for (int l = st.firstLayer; l < st.endLayer; ++l) {
          dispatches += f.layers[l].a2aCount[ph][0];
          combines += f.layers[l].a2aCount[ph][1];
          // Each token's row goes once to each other rank that holds one of its experts (or to
          // every rank, where --ep-exchange=auto would send them all).
          const LayerFacts &layer = f.layers[l];
          double share = analysis::allTokensPays(f.numExperts, layer.topK, mesh.ep)
                             ? 1.0
                             : analysis::tokenShareOfRank(f.numExperts, layer.topK, mesh.ep);
          bytes += double(layer.a2aBytes[ph]) / mesh.tp / double(layer.topK) * share * (mesh.ep - 1);
        }
        const char *what = !combines ? "dispatch" : !dispatches ? "combine" : "dispatch+combine";
        add(st, "all-to-all", what, phases[ph], "ep", ep, (dispatches + combines) * m,
            std::llround(bytes * m),
            /*allToAll=*/true);
      }
    }
    if (mesh.tp > 1) {
      Group tp = groupOf(mesh, {"tp"}, gpn);
      auto wire = [&](int64_t bytes) { return double(bytes) * (mesh.tp - 1) / mesh.tp; };
      // [phase][0 all-gather, 1 reduce-scatter]
      int64_t count[3][2] = {};
      double bytes[3][2] = {};
      for (int l = st.firstLayer; l < st.endLayer; ++l) {
        const LayerFacts &layer = f.layers[l];
        for (int ph = 0; ph < 3; ++ph) {
          if (ph == 2 && !layer.recompute)
            continue;
          for (int kind = 0; kind < 2; ++kind) {
            count[ph][kind] += layer.tpBlocks();
            bytes[ph][kind] += layer.tpBlocks() * wire(layer.outBytes);
          }
        }
      }
      if (st.embedding && f.hasEmbedding) { // vocab-parallel partial sums to sequence shards
        count[0][1] += 1;
        bytes[0][1] += wire(f.hiddenBytes);
      }
      if (st.lmHead && f.hasLmHead) { // the whole sequence into the vocab-parallel LM head
        count[0][0] += 1;
        bytes[0][0] += wire(f.hiddenBytes);
        count[1][1] += 1;
        bytes[1][1] += wire(f.hiddenBytes);
      }
      for (int ph = 0; ph < 3; ++ph) {
        add(st, "all-gather", "sequence-parallel", phases[ph], "tp", tp, count[ph][0] * m,
            std::llround(bytes[ph][0] * m), false);
        add(st, "reduce-scatter", "sequence-parallel", phases[ph], "tp", tp, count[ph][1] * m,
            std::llround(bytes[ph][1] * m), false);
      }
    }
    if (mesh.dp * mesh.ep > 1 && denseGrad > 0) {
      Group replicas = groupOf(mesh, {"ep", "dp"}, gpn);
      int64_t n = replicas.size;
      std::string axis = mesh.dp > 1 && mesh.ep > 1 ? "dp+ep" : mesh.dp > 1 ? "dp" : "ep";
      add(st, "all-reduce", "LoRA gradients", "step", axis, replicas, 1,
          std::llround(2.0 * (n - 1) / n * denseGrad), false);
    }
    if (mesh.dp > 1 && expertGrad > 0) {
      Group dp = groupOf(mesh, {"dp"}, gpn);
      add(st, "all-reduce", "expert LoRA gradients", "step", "dp", dp, 1,
          std::llround(2.0 * (mesh.dp - 1) / mesh.dp * expertGrad), false);
    }
    if (mesh.pp > 1) {
      Group pair = groupOf(mesh, {"pp"}, gpn);
      pair.size = 2; // one neighbour
      pair.crossesNodes = strideOf(mesh, "pp") >= gpn;
      auto boundary = [&](int layer) {
        return layer >= 0 && layer < f.numLayers ? f.layers[layer].outBytes : f.hiddenBytes;
      };
      if (!st.lmHead)
        add(st, "send/recv", "activations", "fwd", "pp", pair, m,
            ceilDiv(boundary(st.endLayer - 1), mesh.tp) * m, false);
      if (!st.embedding)
        add(st, "send/recv", "gradients", "bwd", "pp", pair, m,
            ceilDiv(boundary(st.firstLayer - 1), mesh.tp) * m, false);
    }
  }

  std::vector<std::string> assumptions(const MeshEstimate &e) const {
    std::vector<std::string> lines;
    int64_t gpn = options.gpusPerNode;
    std::string axes;
    for (const char *axis : {"ep", "dp", "tp", "pp"}) {
      if (mesh.axisSize(axis) <= 1)
        continue;
      Group group = groupOf(mesh, {axis}, gpn);
      if (!axes.empty())
        axes += "; ";
      axes += llvm::formatv("{0} (stride {1}) {2}", axis, strideOf(mesh, axis),
                            group.crossesNodes ? "spans nodes" : "within a node")
                  .str();
    }
    lines.push_back(llvm::formatv("ranks: ep fastest, then dp, tp, pp, {0} GPUs per node: {1}", gpn,
                                  axes.empty() ? std::string("one rank") : axes)
                        .str());
    lines.push_back(llvm::formatv("links: {0:F0} GB/s within a node (NVLink), {1:F0} GB/s per GPU across "
                                  "nodes; a ring collective whose group spans nodes runs at the "
                                  "cross-node speed; an all-to-all sends its on-node share over NVLink "
                                  "while the rest crosses nodes; bytes are what each GPU sends (ring "
                                  "all-reduce 2(n-1)/n, all-gather and reduce-scatter (n-1)/n of the "
                                  "tensor); times add: no overlap with each other or with compute",
                                  options.intraNodeBytesPerSecond / 1e9,
                                  options.interNodeBytesPerSecond / 1e9)
                        .str());
    lines.push_back(
        llvm::formatv("data: each of the dp x ep = {0} replicas of a (tp, pp) position runs its "
                      "own micro-batch of {1} tokens (the single-rank program's); non-expert "
                      "parameters are replicated over dp x ep, routed experts split over ep and "
                      "replicated over dp; LoRA gradients all-reduce once per step over the ranks "
                      "that hold the same slice (dp x ep; dp for expert adapters)",
                      mesh.dp * mesh.ep, e.tokensPerMicroBatch)
            .str());
    lines.push_back("weights: routed experts (a {expert} tensor or an expert_mlp weight) split dim 0 "
                    "over ep; without ep, their intermediate features over tp (unless they train "
                    "adapters or --tp-replicate experts keeps them: then whole; other --tp-replicate "
                    "kinds and moe.tp_replicated annotations are not simulated); a linear [out, in] is row-parallel over tp (split in) when it "
                    "writes the model width from anything but a norm (o_proj, down_proj, fc2 latent), "
                    "otherwise column-parallel (split out: q/k/v, gate/up, latent and low-rank "
                    "projections); embedding and LM head vocab-parallel; norms, routers, biases, "
                    "convolutions and per-head constants replicated; LoRA: a column-parallel base splits "
                    "B, a row-parallel base splits A, the other whole; gradients and AdamW moments (f32) "
                    "follow their parameter; no ZeRO");
    lines.push_back(llvm::formatv("pipeline: stage s holds layers [s*L/pp, (s+1)*L/pp) of L = {0}, the "
                                  "first also the embedding, the last the final norm and LM head; 1F1B "
                                  "with {1} micro-batch(es) per step{2}: stage s keeps the saved "
                                  "activations of min(pp-s, micro-batches) of them",
                                  f.numLayers, e.microBatches,
                                  options.microBatches > 0 || mesh.pp <= 1 ? "" : " (2 x pp, as --pipeline-micro-batches 0)")
                        .str());
    lines.push_back("activations: a saved activation (a forward value the backward reads) belongs to "
                    "the layer whose step reads it last; saved and transient (the rest of the "
                    "single-rank activation arena: gradients between layers, recomputed values) split "
                    "over tp (sequence parallel); workspace and kernel scratch: the single-rank sizes "
                    "/ tp; inputs whole; balanced routing (each GPU receives as many rows as it sends)");
    lines.push_back("tensor parallel: Megatron-style with sequence parallel: per block (the token "
                    "mixer; the channel mixer unless it is routed experts only) an all-gather before "
                    "and a reduce-scatter after in the forward, the reverse in the backward, again in "
                    "a recompute; a reduce-scatter after the vocab-parallel embedding, an all-gather "
                    "(fwd) and reduce-scatter (bwd) around the LM head; the vocab-parallel loss's "
                    "per-token reductions (12 bytes per token) are left out. moec emits this layout "
                    "with --sequence-parallel, except at the ends: every tp rank holds the embedding "
                    "and the LM head whole (a slice of the embedded rows; the head and loss on a "
                    "rank's rows), no collective. Without it, tp plans keep the activations between "
                    "blocks whole on every tp rank and sum with one all-reduce per block "
                    "(docs/multi_gpu.md), and this undercounts that activation memory");
    lines.push_back("expert parallel: each dispatch and combine (forward, recomputed) and each of "
                    "their backwards is one all-to-all of this GPU's [tokens/tp, width] rows, each "
                    "token's row once to every other GPU that holds one of its top_k experts (uniform "
                    "routing)");
    lines.push_back("pipeline transfers: each micro-batch sends its boundary activation [tokens/tp, "
                    "hidden] forward and its gradient backward, counted on the sender");
    lines.push_back("not counted: CUDA context, NCCL and all-to-all staging buffers, allocator "
                    "fragmentation (keep a margin); compute is H200 dense bf16 peak, for scale only");
    return lines;
  }

  const Facts &f;
  moe::MeshShape mesh;
  MeshOptions options;
};

std::string gb(int64_t bytes) { return llvm::formatv("{0:F2}", bytes / 1e9).str(); }

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

void printCommunication(const MeshEstimate &e, llvm::raw_ostream &os) {
  const StageEstimate &st = e.stages[e.slowestCommStage];
  os << "communication per step per GPU";
  if (e.stages.size() > 1)
    os << " (stage " << st.stage << ", the slowest)";
  os << llvm::formatv(": {0} micro-batch(es) of {1} tokens\n", e.microBatches, e.tokensPerMicroBatch);
  if (st.comm.empty()) {
    os << "  none\n";
    return;
  }
  os << llvm::format("  %-15s %-21s %-9s %-6s %6s %7s %14s %-8s %10s\n", "collective", "what", "phase",
                     "axis", "group", "count", "GB per step", "link", "ms");
  int64_t bytes = 0;
  for (const CommEstimate &c : st.comm) {
    os << llvm::format("  %-15s %-21s %-9s %-6s %6lld %7lld %14s %-8s %10.2f\n", c.collective.c_str(),
                       c.what.c_str(), c.phase.c_str(), c.axis.c_str(), (long long)c.groupSize,
                       (long long)c.count, llvm::formatv("{0:F3}", c.bytes / 1e9).str().c_str(),
                       c.crossesNodes ? "network" : "NVLink", c.seconds * 1e3);
    bytes += c.bytes;
  }
  os << llvm::format("  %-15s %-21s %-9s %-6s %6s %7s %14s %-8s %10.2f\n", "total", "", "", "", "", "",
                     llvm::formatv("{0:F3}", bytes / 1e9).str().c_str(), "", st.commSeconds * 1e3);
  // The ep-fastest order puts tp's ranks far apart: say what that costs.
  double tpSeconds = 0, tpBytes = 0;
  for (const CommEstimate &c : st.comm)
    if (c.axis == "tp" && c.crossesNodes) {
      tpSeconds += c.seconds;
      tpBytes += c.bytes;
    }
  if (tpSeconds > 0)
    os << llvm::formatv("  note: tp groups span nodes in this rank order (stride {0}); within a node their "
                        "{1:F1} ms would be {2:F1} ms\n",
                        strideOf(e.mesh, "tp"), tpSeconds * 1e3,
                        tpBytes / e.options.intraNodeBytesPerSecond * 1e3);
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

void printSuggestions(const Facts &facts, const MeshEstimate &e, llvm::raw_ostream &os) {
  os << "to fit, try (same micro-batch; more GPUs):\n";
  auto tryMesh = [&](moe::MeshShape mesh, const char *why) {
    MeshEstimate other = Estimator(facts, mesh, e.options).run();
    const StageEstimate &worst = other.stages[other.worstMemoryStage];
    os << llvm::formatv("  --mesh {0} ({1} GPUs; {2}): worst stage {3} GB, {4}\n", mesh.str(), mesh.size(),
                        why, gb(worst.memory.total()),
                        other.fits ? "fits" : "over by " + gb(-other.marginBytes) + " GB");
  };
  moe::MeshShape mesh = e.mesh;
  if (facts.numExperts > 0 && mesh.ep * 2 <= facts.numExperts) {
    moe::MeshShape more = mesh;
    more.ep *= 2;
    tryMesh(more, "halves the routed experts");
  }
  if (mesh.pp * 2 <= facts.numLayers) {
    moe::MeshShape more = mesh;
    more.pp *= 2;
    tryMesh(more, "halves each stage's layers");
  }
  if (mesh.tp * 2 <= e.options.gpusPerNode) {
    moe::MeshShape more = mesh;
    more.tp *= 2;
    tryMesh(more, "halves dense weights and activations");
  }
  const MemoryByRole &worst = e.stages[e.worstMemoryStage].memory;
  if (!facts.recomputes && worst.activation * 5 > worst.total())
    os << llvm::formatv("  --recompute per-layer: activations are {0} GB of the worst stage; recompute "
                        "keeps only layer inputs and routing\n",
                        gb(worst.activation));
}

} // namespace

MeshEstimate estimateMesh(const Program &program, const moe::MeshShape &mesh, const MeshOptions &options) {
  Facts facts = analyze(program);
  return Estimator(facts, mesh, options).run();
}

void printMeshReport(moe::ModelOp model, const Program &program, const moe::MeshShape &mesh, int64_t gpuBytes,
                     llvm::raw_ostream &os) {
  MeshOptions options;
  options.gpuBytes = gpuBytes;
  printMeshReport(model, program, mesh, options, os);
}

void printMeshReport(moe::ModelOp model, const Program &program, const moe::MeshShape &mesh,
                     const MeshOptions &options, llvm::raw_ostream &os) {
  Facts facts = analyze(program);
  MeshEstimate e = Estimator(facts, mesh, options).run();
  os << "mesh " << mesh.str() << ": " << analysis::withCommas(mesh.size()) << " GPUs ("
     << analysis::withCommas(ceilDiv(mesh.size(), options.gpusPerNode)) << " nodes of " << options.gpusPerNode
     << "), model " << model.getSymName() << "\n";
  os << llvm::formatv("tokens: {0} per micro-batch per replica (seq-len {1} x micro-batch {2}), {3} "
                      "micro-batch(es) per step, {4} per step over the mesh\n",
                      e.tokensPerMicroBatch, program.seqLen, program.microBatch, e.microBatches,
                      analysis::withCommas(e.globalTokensPerStep));
  os << "recompute: " << (e.recomputes ? "yes" : "none") << "\n";
  if (e.shardedProgram)
    os << "warning: the program already has collectives (compiled for a mesh); the estimate "
          "expects the single-rank program and splits it again\n";
  os << "\n";
  printMemory(e, os);
  if (!e.fits)
    printSuggestions(facts, e, os);
  os << "\n";
  printCommunication(e, os);
  os << "\nassumptions:\n";
  for (const std::string &line : e.assumptions)
    os << "  - " << line << "\n";
}

} // namespace moec::compiler
