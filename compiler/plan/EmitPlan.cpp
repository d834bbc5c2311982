//===- EmitPlan.cpp - serialise a placed Program as a plan ----------------===//

#include "compiler/plan/EmitPlan.h"

#include "dialects/moe/MeshShape.h"
#include "llvm/ADT/StringExtras.h"

using namespace mlir;

namespace moec::compiler {

namespace {

/// How many operands each operand group has (present optional operands).
constexpr llvm::StringLiteral kSegments = "operandSegmentSizes";

void setFloat(google::protobuf::Map<std::string, plan::Attr> &attrs, const std::string &key,
              const APFloat &value) {
  attrs[key].set_f(value.convertToDouble());
}

/// Kernel attributes as the runtime reads them: numbers, strings, flags,
/// integer lists; structured ones (RoPE, YaRN) flattened to dotted keys.
void addAttr(google::protobuf::Map<std::string, plan::Attr> &attrs, StringRef key, Attribute attr) {
  std::string name = key.str();
  if (isa<UnitAttr>(attr))
    attrs[name].set_b(true);
  else if (auto b = dyn_cast<BoolAttr>(attr))
    attrs[name].set_b(b.getValue());
  else if (auto i = dyn_cast<IntegerAttr>(attr))
    attrs[name].set_i(i.getInt());
  else if (auto f = dyn_cast<FloatAttr>(attr))
    setFloat(attrs, name, f.getValue());
  else if (auto s = dyn_cast<StringAttr>(attr))
    attrs[name].set_s(s.str());
  else if (auto ints = dyn_cast<DenseI64ArrayAttr>(attr))
    for (int64_t v : ints.asArrayRef())
      attrs[name].mutable_ints()->add_values(v);
  else if (auto ints = dyn_cast<DenseI32ArrayAttr>(attr))
    for (int32_t v : ints.asArrayRef())
      attrs[name].mutable_ints()->add_values(v);
  else if (auto dict = dyn_cast<DictionaryAttr>(attr))
    for (NamedAttribute inner : dict) // a backward's forward attributes: the same keys
      addAttr(attrs, inner.getName() == kSegments ? "operand_segments" : inner.getName().strref(),
              inner.getValue());
  else if (auto activation = dyn_cast<moe::ActivationAttr>(attr))
    attrs[name].set_s(moe::stringifyActivation(activation.getValue()).str());
  else if (auto scoring = dyn_cast<moe::RouterScoringAttr>(attr))
    attrs[name].set_s(moe::stringifyRouterScoring(scoring.getValue()).str());
  else if (auto rope = dyn_cast<moe::RopeAttr>(attr)) {
    setFloat(attrs, name + ".theta", rope.getTheta());
    attrs[name + ".dim"].set_i(rope.getDim());
    attrs[name + ".style"].set_s(moe::stringifyRopeStyle(rope.getStyle()).str());
    if (moe::YarnAttr yarn = rope.getYarn()) {
      setFloat(attrs, name + ".yarn.factor", yarn.getFactor());
      attrs[name + ".yarn.original_max_position"].set_i(yarn.getOriginalMaxPosition());
      setFloat(attrs, name + ".yarn.beta_fast", yarn.getBetaFast());
      setFloat(attrs, name + ".yarn.beta_slow", yarn.getBetaSlow());
      setFloat(attrs, name + ".yarn.mscale", yarn.getMscale());
      setFloat(attrs, name + ".yarn.mscale_all_dim", yarn.getMscaleAllDim());
    }
  } else {
    std::string text;
    llvm::raw_string_ostream os(text);
    attr.print(os);
    attrs[name].set_s(text);
  }
}

/// A rank's window of a tensor split along `dim` (its part `coordinate`; the buffer holds one
/// part), from dimension `from` on (1 leaves out the expert dimension of "{expert}" tensors).
plan::Slice windowOf(const ProgramBuffer &buffer, int dim, int64_t coordinate, int from = 0) {
  plan::Slice slice;
  for (int d = from; d < static_cast<int>(buffer.shape.size()); ++d) {
    plan::Slice::Range *range = slice.add_dims();
    range->set_start(d == dim ? coordinate * buffer.shape[d] : 0);
    range->set_size(buffer.shape[d]);
  }
  return slice;
}

/// plan.proto's kind for a program step's collective; KIND_UNSPECIFIED for one it has none for.
plan::Collective::Kind collectiveKind(const std::string &name) {
  return name == "all_reduce"      ? plan::Collective::ALL_REDUCE
         : name == "all_gather"    ? plan::Collective::ALL_GATHER
         : name == "reduce_scatter" ? plan::Collective::REDUCE_SCATTER
         : name == "expert_route"  ? plan::Collective::EXPERT_ROUTE
         : name == "expert_send"   ? plan::Collective::EXPERT_SEND
         : name == "expert_return" ? plan::Collective::EXPERT_RETURN
         : name == "send_recv"     ? plan::Collective::SEND_RECV
                                   : plan::Collective::KIND_UNSPECIFIED;
}

/// One stage's program as a rank of the plan (rank 0's coordinates; emitPlan sets each
/// rank's own), and the axes of its groups in first-use order (a pipeline exchange's key
/// names its pair of stages: "pp@0-1").
plan::Rank rankOf(moe::ModelOp model, const Program &program, std::vector<std::string> &groupKeys) {
  plan::Rank rank;
  rank.set_num_streams(static_cast<uint32_t>(program.numStreams));
  rank.set_num_events(static_cast<uint32_t>(program.numEvents));
  for (auto [role, bytes] : program.arenaBytes()) {
    plan::Arena *arena = rank.add_arenas();
    arena->set_role(role);
    arena->set_size_bytes(bytes);
  }
  for (auto [id, buffer] : llvm::enumerate(program.buffers)) {
    plan::Buffer *b = rank.add_buffers();
    b->set_id(static_cast<uint32_t>(id));
    b->set_name(buffer.name);
    b->set_role(buffer.role);
    b->set_dtype(buffer.dtype);
    for (int64_t dim : buffer.shape)
      b->add_shape(dim);
    b->set_offset(buffer.offset);
    b->set_size_bytes(buffer.bytes);
    b->set_first_step(buffer.first);
    b->set_last_step(buffer.last);
    if (buffer.receivedRowsOf >= 0) {
      b->set_received_rows_of(static_cast<uint32_t>(buffer.receivedRowsOf) + 1);
      b->set_received_copies(buffer.receivedCopies);
    }
    // A checkpoint weight trained in full starts from the checkpoint, as a frozen one does.
    if (buffer.role == plan::WEIGHT || (buffer.role == plan::LORA_PARAM && !moe::isAdapterTensorName(buffer.tensor))) {
      plan::WeightBinding *binding = rank.add_weights();
      binding->set_buffer(static_cast<uint32_t>(id));
      binding->set_tensor(buffer.tensor);
    }
  }
  for (const ProgramStep &step : program.steps) {
    plan::Step *s = rank.add_steps();
    s->set_stream(static_cast<uint32_t>(step.stream));
    s->set_phase(step.phase);
    s->set_layer(step.layer);
    s->set_origin(step.origin);
    if (step.event != ProgramStep::Event::None) {
      plan::Event *event = step.event == ProgramStep::Event::Record ? s->mutable_record() : s->mutable_wait();
      event->set_id(static_cast<uint32_t>(step.eventId));
      continue;
    }
    if (!step.collective.empty()) {
      plan::Collective::Kind kind = collectiveKind(step.collective);
      plan::Collective *collective = s->mutable_collective();
      collective->set_kind(kind);
      if (auto experts = step.attrs ? step.attrs.getAs<mlir::IntegerAttr>("num_experts") : nullptr;
          experts && kind == plan::Collective::EXPERT_ROUTE)
        collective->set_num_experts(experts.getInt());
      if (kind == plan::Collective::EXPERT_ROUTE && step.attrs && step.attrs.get("all_tokens"))
        collective->set_all_tokens(true);
      if (auto factor = step.attrs ? step.attrs.getAs<mlir::FloatAttr>("capacity_factor") : nullptr;
          factor && kind == plan::Collective::EXPERT_ROUTE)
        collective->set_capacity_factor(factor.getValueAsDouble());
      if (kind == plan::Collective::EXPERT_ROUTE)
        for (int64_t e : placementOf(model, step.layer))
          collective->add_placement(e);
      std::string key = step.axis;
      if (step.peerStage >= 0)
        key += "@" + std::to_string(std::min(program.stage, step.peerStage)) + "-" +
               std::to_string(std::max(program.stage, step.peerStage));
      auto at = llvm::find(groupKeys, key);
      collective->set_group(static_cast<uint32_t>(at - groupKeys.begin()));
      if (at == groupKeys.end())
        groupKeys.push_back(key);
      for (int id : step.inputs)
        collective->add_inputs(static_cast<uint32_t>(id));
      for (int id : step.outputs)
        collective->add_outputs(static_cast<uint32_t>(id));
      continue;
    }
    plan::Launch *launch = s->mutable_launch();
    launch->set_kernel(step.kernel);
    for (int id : step.inputs)
      launch->add_inputs(static_cast<uint32_t>(id));
    for (int id : step.outputs)
      launch->add_outputs(static_cast<uint32_t>(id));
    bool backward = StringRef(step.kernel).ends_with(".backward");
    for (NamedAttribute attr : step.attrs) {
      if (attr.getName() == "recomputed" || attr.getName() == moe::kPipelineBackwardAttr ||
          attr.getName() == moe::kStreamAttr || attr.getName() == moe::kTpReplicatedAttr)
        continue;
      // A backward's own groups are (inputs, outputs, output grads); its forward's are
      // under forward_attrs.
      StringRef key = attr.getName().strref();
      if (key == kSegments)
        key = backward ? "backward_segments" : "operand_segments";
      addAttr(*launch->mutable_attrs(), key, attr.getValue());
    }
    launch->set_flops(step.flops);
  }
  return rank;
}

} // namespace

FailureOr<plan::Plan> emitPlan(moe::ModelOp model, const std::vector<Program> &programs) {
  if (programs.empty())
    return model.emitError("no program to emit");
  const Program &program = programs.front();
  plan::Plan out;
  out.set_version(plan::kPlanVersion);
  out.set_model(model.getSymName().str());
  if (auto type = model->getAttrOfType<StringAttr>("model_type"))
    out.set_model_type(type.str());
  out.set_seq_len(program.seqLen);
  out.set_micro_batch(program.microBatch);
  if (program.microBatches > 1)
    out.set_micro_batches(program.microBatches);
  auto recompute = model->getAttrOfType<StringAttr>("recompute");
  out.set_recompute(recompute ? recompute.str() : "none");
  moe::MeshShape shape;
  if (auto text = model->getAttrOfType<StringAttr>("mesh")) {
    std::string error;
    if (!moe::MeshShape::parse(text.str(), shape, error))
      return model.emitError("mesh '") << text.str() << "': " << error;
  }
  if (static_cast<int64_t>(programs.size()) != shape.pp)
    return model.emitError("the mesh has pp = ") << shape.pp << " but the model has " << programs.size()
                                                 << " pipeline stages";
  plan::Mesh *mesh = out.mutable_mesh();
  mesh->set_dp(shape.dp);
  mesh->set_tp(shape.tp);
  mesh->set_pp(shape.pp);
  mesh->set_ep(shape.ep);
  mesh->set_sequence_parallel(model->hasAttr("sequence_parallel"));
  if (shape.order != moe::MeshShape::kDefaultOrder)
    for (StringRef axis : llvm::split(shape.order, ','))
      mesh->add_rank_order(axis.str());

  for (const Program &each : programs)
    for (const ProgramBuffer &buffer : each.buffers)
      if (buffer.offset < 0)
        return model.emitError("buffer '") << buffer.name << "' has no arena offset";
  for (const Program &each : programs)
    for (const ProgramStep &step : each.steps)
      if (!step.collective.empty() && collectiveKind(step.collective) == plan::Collective::KIND_UNSPECIFIED)
        return model.emitError("no plan form for the collective '") << step.collective << "'";
  std::vector<std::vector<std::string>> groupKeys(programs.size());
  std::vector<plan::Rank> stageRanks;
  for (auto [s, each] : llvm::enumerate(programs))
    stageRanks.push_back(rankOf(model, each, groupKeys[s]));

  // Ranks of one pipeline stage run the same program (dp, tp, ep); what differs: the windows
  // of tensors split over tp or ep they bind, and their groups: the ranks that agree with
  // them on every axis outside the group's (a pipeline exchange: the two ranks of its stages
  // that agree on every other axis).
  for (int64_t r = 0; r < shape.size(); ++r) {
    int64_t stage = shape.coordinate(r, "pp");
    const Program &mine = programs[stage];
    plan::Rank *each = out.add_ranks();
    *each = stageRanks[stage];
    each->set_rank(static_cast<int32_t>(r));
    // A tp rank's rows (moe.tp_slice, the microbatch kernel along an axis) or columns
    // (moe.tp_slice_features, moe.tp_place_features): its coordinate.
    for (plan::Step &step : *each->mutable_steps())
      if (step.has_launch() && step.launch().attrs().contains("axis") &&
          llvm::is_contained({"microbatch", "tp_slice_features", "tp_place_features"}, step.launch().kernel())) {
        auto &attrs = *step.mutable_launch()->mutable_attrs();
        attrs["index"].set_i(shape.coordinate(r, attrs["axis"].s()));
      }
    for (plan::WeightBinding &binding : *each->mutable_weights()) {
      const ProgramBuffer &buffer = mine.buffers[binding.buffer()];
      if (buffer.tpFirstRank && shape.coordinate(r, "tp") != 0)
        binding.set_zeros(true);
      if (buffer.tpDim >= 0) {
        // One checkpoint tensor per expert ("{expert}" names): the window within each.
        int first = StringRef(buffer.tensor).contains("{expert}") ? 1 : 0;
        for (int d = first; d < static_cast<int>(buffer.shape.size()); ++d)
          binding.add_whole_shape(d == buffer.tpDim ? buffer.shape[d] * shape.tp : buffer.shape[d]);
        if (!buffer.tpPieces.empty()) { // this rank's share of each part, in order
          int64_t base = 0, coordinate = shape.coordinate(r, "tp");
          for (int64_t part : buffer.tpPieces) {
            plan::Slice *piece = binding.add_pieces();
            for (int d = 0; d < static_cast<int>(buffer.shape.size()); ++d) {
              plan::Slice::Range *range = piece->add_dims();
              range->set_start(d == buffer.tpDim ? base + coordinate * (part / shape.tp) : 0);
              range->set_size(d == buffer.tpDim ? part / shape.tp : buffer.shape[d]);
            }
            base += part;
          }
          continue;
        }
        *binding.mutable_slice() = windowOf(buffer, buffer.tpDim, shape.coordinate(r, "tp"), first);
        continue;
      }
      if (!buffer.expertSplit)
        continue;
      if (ArrayRef<int64_t> placed = placementOf(model, buffer.layer); !placed.empty()) {
        // This rank's experts, as the placement puts them (every row of a stacked tensor).
        int64_t first = shape.coordinate(r, "ep") * buffer.shape.at(0);
        for (int64_t e : placed.slice(first, buffer.shape.at(0)))
          binding.add_experts(e);
        continue;
      }
      if (StringRef(buffer.tensor).contains("{expert}")) {
        binding.set_first_expert(shape.coordinate(r, "ep") * buffer.shape.at(0));
        continue;
      }
      // One checkpoint tensor stacking every expert: this rank's rows of it.
      *binding.mutable_slice() = windowOf(buffer, 0, shape.coordinate(r, "ep"));
    }
    for (const std::string &key : groupKeys[stage]) {
      auto [axes, pair] = StringRef(key).split('@');
      plan::Group *group = each->add_groups();
      group->set_axis(axes.str());
      SmallVector<StringRef> inside;
      axes.split(inside, '+');
      int64_t low = -1, high = -1;
      if (!pair.empty()) {
        auto [a, b] = pair.split('-');
        (void)a.getAsInteger(10, low);
        (void)b.getAsInteger(10, high);
      }
      for (int64_t q = 0; q < shape.size(); ++q) {
        bool same = true;
        for (const char *axis : {"dp", "tp", "pp", "ep"})
          if (!llvm::is_contained(inside, axis))
            same &= shape.coordinate(q, axis) == shape.coordinate(r, axis);
        int64_t qStage = shape.coordinate(q, "pp");
        if (!pair.empty())
          same &= qStage == low || qStage == high;
        if (same)
          group->add_ranks(static_cast<int32_t>(q));
      }
    }
  }

  auto optimizers = model.getBody().getOps<moe::OptimizerOp>();
  if (optimizers.empty())
    return model.emitError("no moe.optimizer; run --moe-build-training-step first");
  moe::OptimizerOp o = *optimizers.begin();
  plan::Optimizer *optimizer = out.mutable_optimizer();
  optimizer->set_kind(o.getKind().str());
  optimizer->set_lr(o.getLr().convertToDouble());
  optimizer->set_beta1(o.getBeta1().convertToDouble());
  optimizer->set_beta2(o.getBeta2().convertToDouble());
  optimizer->set_eps(o.getEps().convertToDouble());
  optimizer->set_weight_decay(o.getWeightDecay().convertToDouble());
  optimizer->set_warmup_steps(o.getWarmupSteps());
  optimizer->set_total_steps(o.getTotalSteps());
  optimizer->set_schedule(o.getSchedule().str());
  optimizer->set_min_lr_ratio(o.getMinLrRatio().convertToDouble());
  optimizer->set_max_grad_norm(o.getMaxGradNorm().convertToDouble());

  plan::LoraLayout *lora = out.mutable_lora();
  if (auto config = model->getAttrOfType<DictionaryAttr>("lora")) {
    if (auto r = config.getAs<IntegerAttr>("r"))
      lora->set_r(r.getInt());
    if (auto alpha = config.getAs<FloatAttr>("alpha"))
      lora->set_alpha(alpha.getValueAsDouble());
    if (auto dropout = config.getAs<FloatAttr>("dropout"))
      lora->set_dropout(dropout.getValueAsDouble());
    if (auto targets = config.getAs<ArrayAttr>("targets"))
      for (auto target : targets.getAsValueRange<StringAttr>())
        lora->add_target_modules(target.str());
    lora->set_expert_lora(static_cast<bool>(config.get("expert_lora")));
    lora->set_use_rslora(static_cast<bool>(config.get("rslora")));
  }
  // Each trainable tensor is held by every rank of its stage (its part of it by every rank of
  // its stage and tp coordinate, when split over tp); the layout names the first of them.
  // (An expert adapter split over ep: its part by the ranks of its ep coordinate.)
  auto firstRank = [&](int64_t stage, const char *axis, int64_t coordinate) {
    for (int64_t r = 0; r < shape.size(); ++r)
      if (shape.coordinate(r, "pp") == stage && shape.coordinate(r, axis) == coordinate)
        return r;
    return int64_t{0};
  };
  for (auto [stage, each] : llvm::enumerate(programs)) {
    for (auto [id, buffer] : llvm::enumerate(each.buffers)) {
      if (buffer.role != plan::LORA_PARAM)
        continue;
      const char *axis = buffer.tpDim >= 0 ? "tp" : buffer.expertSplit ? "ep" : "";
      int64_t parts = buffer.tpDim >= 0 ? shape.tp : buffer.expertSplit ? shape.ep : 1;
      for (int64_t part = 0; part < parts; ++part) {
        plan::LoraTensor *tensor = lora->add_tensors();
        tensor->set_peft_name(moe::isAdapterTensorName(buffer.tensor) ? buffer.tensor
                                                                      : moe::kPeftNamePrefix.str() + buffer.tensor);
        tensor->set_rank(static_cast<int32_t>(firstRank(static_cast<int64_t>(stage), *axis ? axis : "tp", part)));
        tensor->set_param(static_cast<uint32_t>(id));
        tensor->set_grad(buffer.grad);
        tensor->set_adam_m(buffer.adamM);
        tensor->set_adam_v(buffer.adamV);
        if (!*axis)
          continue;
        // Experts split over ep along their leading dimension.
        *tensor->mutable_slice() = windowOf(buffer, buffer.tpDim >= 0 ? buffer.tpDim : 0, part);
        tensor->set_split_axis(axis);
      }
    }
  }
  return out;
}

} // namespace moec::compiler
