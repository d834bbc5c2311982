//===- Program.cpp - flatten the training step, assign arena offsets -----===//

#include "compiler/plan/Program.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "compiler/analysis/ExpertPlacement.h"
#include "compiler/analysis/ModelSummary.h"
#include "compiler/plan/Flops.h"
#include "dialects/moe/MeshShape.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "runtime/kernels/checks/core/LmHeadLoss.h"

using namespace mlir;

namespace moec::compiler {

namespace {

plan::DType dtypeOf(Type element) {
  if (element.isF32())
    return plan::F32;
  if (element.isBF16())
    return plan::BF16;
  if (element.isF16())
    return plan::F16;
  if (element.isInteger(32))
    return plan::I32;
  if (element.isInteger(64))
    return plan::I64;
  return plan::DTYPE_UNSPECIFIED;
}

std::string withLayer(StringRef name, int layer) {
  std::string out = name.str();
  if (size_t at = out.find("{layer}"); at != std::string::npos)
    out.replace(at, strlen("{layer}"), std::to_string(layer));
  return out;
}

/// The kernel a forward-or-backward op runs.
std::string kernelName(Operation *op) {
  if (auto backward = dyn_cast<moe::BackwardOp>(op))
    return backward.getKernelName();
  return op->getName().stripDialect().str();
}

/// The scratch the fused LM head and loss (or its backward) takes on the device: a chunk of
/// logits instead of the [tokens, vocab] logits buffer and its gradient (LmHeadLoss.h).
int64_t scratchOf(Operation *op, const ProgramStep &step, const Program &program) {
  auto backward = dyn_cast<moe::BackwardOp>(op);
  DictionaryAttr attrs = backward ? backward.getForwardAttrs() : op->getAttrDictionary();
  bool fused = backward ? backward.getForward() == moe::LMHeadCrossEntropyOp::getOperationName()
                        : isa<moe::LMHeadCrossEntropyOp>(op);
  if (!fused || step.inputs.size() < 2)
    return 0;
  const ProgramBuffer &input = program.buffers[step.inputs[0]], &weight = program.buffers[step.inputs[1]];
  auto chunk = attrs.getAs<IntegerAttr>("chunk_tokens");
  bool weightGradBf16 = false;
  if (backward)
    for (auto [k, index] : llvm::enumerate(backward.getGradOfInputs()))
      weightGradBf16 |= index == 1 && program.buffers[step.outputs[k]].dtype != plan::F32;
  return runtime::lm_head_loss::scratchBytes(
      input.shape.at(0), weight.shape.at(0), weight.shape.at(1),
      chunk ? chunk.getInt() : runtime::lm_head_loss::kDefaultChunkTokens, plan::dtypeSize(input.dtype),
      static_cast<bool>(backward), weightGradBf16);
}

//===----------------------------------------------------------------------===//
// Streams: events between them, and live ranges that wait for every stream
//===----------------------------------------------------------------------===//

/// For each stream, the index of the last step of every stream known to be complete before
/// the stream's next step runs (-1: none). Streams run their steps in order, so knowing step
/// i of stream t complete means every earlier step of t is.
using Clock = std::vector<int>;

void mergeClock(Clock &into, const Clock &from) {
  for (size_t t = 0; t < into.size(); ++t)
    into[t] = std::max(into[t], from[t]);
}

/// Inserts the events that order every pair of steps on different streams where one writes a
/// buffer the other reads or writes: a record right after the earlier step (so a wait never
/// waits for later work on that stream) and a wait before the later one, unless what the
/// later step's stream already waited for covers it.
void insertEvents(Program &program) {
  const int streams = program.numStreams;
  std::vector<ProgramStep> &steps = program.steps;
  std::vector<Clock> clock(streams, Clock(streams, -1));
  std::vector<Clock> after(steps.size());         // the step's stream's clock right after it
  std::vector<int> eventAfter(steps.size(), -1);  // the event recorded right after a step
  std::vector<std::vector<int>> waitsBefore(steps.size());
  struct Access {
    int lastWrite = -1;
    std::vector<int> reads; // since the last write
  };
  std::vector<Access> access(program.buffers.size());
  int events = 0;
  for (size_t j = 0; j < steps.size(); ++j) {
    const int s = steps[j].stream;
    std::vector<int> earlier;
    for (int id : steps[j].inputs)
      if (access[id].lastWrite >= 0)
        earlier.push_back(access[id].lastWrite);
    for (int id : steps[j].outputs) {
      if (access[id].lastWrite >= 0)
        earlier.push_back(access[id].lastWrite);
      llvm::append_range(earlier, access[id].reads);
    }
    for (int i : earlier) {
      const int t = steps[i].stream;
      if (t == s || clock[s][t] >= i)
        continue;
      if (eventAfter[i] < 0)
        eventAfter[i] = events++;
      waitsBefore[j].push_back(eventAfter[i]);
      mergeClock(clock[s], after[i]);
    }
    clock[s][s] = static_cast<int>(j);
    after[j] = clock[s];
    for (int id : steps[j].inputs)
      access[id].reads.push_back(static_cast<int>(j));
    for (int id : steps[j].outputs) {
      access[id].lastWrite = static_cast<int>(j);
      access[id].reads.clear();
    }
  }
  std::vector<ProgramStep> ordered;
  ordered.reserve(steps.size() + 2 * static_cast<size_t>(events));
  auto eventStep = [&](const ProgramStep &near, ProgramStep::Event kind, int id) {
    ProgramStep e;
    e.stream = near.stream;
    e.event = kind;
    e.eventId = id;
    e.phase = near.phase;
    e.layer = near.layer;
    e.origin = near.origin;
    return e;
  };
  for (size_t j = 0; j < steps.size(); ++j) {
    for (int id : waitsBefore[j])
      ordered.push_back(eventStep(steps[j], ProgramStep::Event::Wait, id));
    ordered.push_back(std::move(steps[j]));
    if (eventAfter[j] >= 0)
      ordered.push_back(eventStep(ordered.back(), ProgramStep::Event::Record, eventAfter[j]));
  }
  steps = std::move(ordered);
  program.numEvents = events;
}

/// Each step's stream's clock just before the step runs, from the plan's record and wait
/// steps.
std::vector<Clock> clocksBeforeSteps(const Program &program) {
  const int streams = program.numStreams;
  std::vector<Clock> clock(streams, Clock(streams, -1)), before(program.steps.size());
  std::vector<Clock> recorded(static_cast<size_t>(program.numEvents), Clock(streams, -1));
  for (size_t j = 0; j < program.steps.size(); ++j) {
    const ProgramStep &step = program.steps[j];
    const int s = step.stream;
    if (step.event == ProgramStep::Event::Wait)
      mergeClock(clock[s], recorded[step.eventId]);
    before[j] = clock[s];
    clock[s][s] = static_cast<int>(j);
    if (step.event == ProgramStep::Event::Record)
      recorded[step.eventId] = clock[s];
  }
  return before;
}

/// A buffer's memory may go to another only once every stream has waited for the buffer's
/// last use there: its live range ends just before, on each stream, the first later step that
/// its last use on every other stream is known complete before (the program's end if none).
void extendLiveRangesOverStreams(Program &program) {
  const int streams = program.numStreams;
  const int numSteps = static_cast<int>(program.steps.size());
  std::vector<Clock> before = clocksBeforeSteps(program);
  std::vector<Clock> lastUse(program.buffers.size(), Clock(streams, -1));
  for (int j = 0; j < numSteps; ++j)
    for (const std::vector<int> *ids : {&program.steps[j].inputs, &program.steps[j].outputs})
      for (int id : *ids)
        lastUse[id][program.steps[j].stream] = j;
  std::vector<std::vector<int>> onStream(streams);
  for (int j = 0; j < numSteps; ++j)
    onStream[program.steps[j].stream].push_back(j);
  // The last step each layer instance's workspace was planned to the end of.
  std::map<int, int> instanceEnd;
  for (const ProgramBuffer &buffer : program.buffers)
    if (buffer.role == plan::WORKSPACE)
      instanceEnd[buffer.instance] = std::max(instanceEnd[buffer.instance], buffer.last);
  for (auto [id, buffer] : llvm::enumerate(program.buffers)) {
    if (buffer.role != plan::ACTIVATION && buffer.role != plan::WORKSPACE)
      continue;
    const Clock &uses = lastUse[id];
    int end = buffer.last;
    for (int s = 0; s < streams; ++s) {
      const std::vector<int> &mine = onStream[s];
      auto first = std::upper_bound(mine.begin(), mine.end(), buffer.last), j = first;
      auto covered = [&](int step) {
        for (int t = 0; t < streams; ++t)
          if (t != s && uses[t] >= 0 && before[step][t] < uses[t])
            return false;
        return true;
      };
      while (j != mine.end() && !covered(*j))
        ++j;
      if (j == first)
        continue; // no step of this stream after the last use, or the first one is covered
      end = std::max(end, j == mine.end() ? numSteps - 1 : *j - 1);
    }
    buffer.last = end;
    // A layer's workspace shares its offsets with the template's other instances, which
    // assumes it is free once the layer's steps are: past them, the buffer is an activation.
    if (buffer.role == plan::WORKSPACE && end > instanceEnd[buffer.instance]) {
      buffer.role = plan::ACTIVATION;
      buffer.instance = -1;
    }
  }
}

class Flattener {
public:
  Flattener(Program &program, moe::ModelOp model) : program(program), model(model) {}

  LogicalResult run() {
    pipelined = pipelineStages(model) > 1;
    if (auto mesh = model->getAttrOfType<StringAttr>("mesh")) {
      moe::MeshShape shape;
      std::string error;
      if (!moe::MeshShape::parse(mesh.str(), shape, error))
        return model.emitError("mesh '") << mesh.getValue() << "': " << error;
      tpRanks = shape.tp;
    }
    std::string name = pipelined ? "train_step_stage" + std::to_string(program.stage) : "train_step";
    auto step = dyn_cast_or_null<func::FuncOp>(SymbolTable::lookupSymbolIn(model, name));
    if (!step)
      return model.emitError("no func.func @") << name << "; run --moe-build-training-step first";
    Block &body = step.getBody().front();
    if (body.getNumArguments() != 3 && body.getNumArguments() != 4)
      return step.emitOpError("must take (ids, positions, labels) and, sharded, loss_weight");
    llvm::DenseMap<Value, int> values;
    const char *names[] = {"input_ids", "positions", "labels"};
    for (auto [arg, name] : llvm::zip(body.getArguments().take_front(3), names))
      values[arg] = newBuffer(name, plan::INPUT, arg.getType(), {program.tokens() * program.microBatches});
    // A sharded step's loss seed: this rank's share of the global loss, set per step (per
    // micro-batch on a pipeline).
    if (body.getNumArguments() == 4) {
      auto type = cast<RankedTensorType>(body.getArgument(3).getType());
      values[body.getArgument(3)] = newBuffer("loss_weight", plan::INPUT, type,
                                              std::vector<int64_t>(type.getShape().begin(), type.getShape().end()));
    }
    Context top{/*layer=*/-1, /*instance=*/-1, /*backward=*/false, model};
    if (failed(walk(body, values, top)))
      return failure();
    // The loss (one per micro-batch on the last pipeline stage; none on the others).
    auto ret = cast<func::ReturnOp>(body.getTerminator());
    for (auto [i, operand] : llvm::enumerate(ret.getOperands())) {
      ProgramBuffer &loss = program.buffers[values.lookup(operand)];
      loss.name = ret.getNumOperands() == 1 ? "loss" : "loss." + std::to_string(i);
      loss.role = plan::INPUT;
    }
    if (auto streams = model->getAttrOfType<IntegerAttr>(moe::kStreamsAttr))
      program.numStreams = static_cast<int>(streams.getInt());
    for (const ProgramStep &added : program.steps)
      if (added.stream < 0 || added.stream >= program.numStreams)
        return model.emitError("a step of ") << added.origin << " is on stream " << added.stream
                                             << ", but the model has " << program.numStreams
                                             << " (its `streams` attribute)";
    if (program.numStreams > 1)
      insertEvents(program);
    computeLiveRanges();
    if (program.numStreams > 1)
      extendLiveRangesOverStreams(program);
    return success();
  }

private:
  struct Context {
    int layer, instance;
    bool backward;
    Operation *symbols; // the template or the model
  };

  int newBuffer(std::string name, plan::Role role, Type type, std::vector<int64_t> shape) {
    ProgramBuffer buffer;
    buffer.name = std::move(name);
    buffer.role = role;
    auto tensor = cast<RankedTensorType>(type);
    buffer.dtype = dtypeOf(tensor.getElementType());
    buffer.shape = std::move(shape);
    buffer.bytes = plan::dtypeSize(buffer.dtype);
    for (int64_t dim : buffer.shape)
      buffer.bytes *= dim;
    program.buffers.push_back(std::move(buffer));
    return static_cast<int>(program.buffers.size()) - 1;
  }

  /// The buffer of a parameter at a layer, with its gradient and AdamW moments when trainable.
  int paramBuffer(moe::ParamOp param, int layer) {
    std::string tensor = withLayer(param.getTensorName(), layer);
    auto [it, inserted] = params.try_emplace(tensor, -1);
    if (!inserted)
      return it->second;
    // One rank's part (the model's mesh; the verifier checked it divides).
    ArrayRef<int64_t> shape = param.getLocalType().getShape();
    std::vector<int64_t> dims(shape.begin(), shape.end());
    bool trainable = param.getTrainable();
    int id = newBuffer(tensor, trainable ? plan::LORA_PARAM : plan::WEIGHT, param.getLocalType(), dims);
    program.buffers[id].tensor = tensor;
    program.buffers[id].layer = layer;
    for (auto [d, axis] : llvm::enumerate(param.getShardingOrReplicated().getDims())) {
      program.buffers[id].expertSplit |= axis.getValue() == "ep";
      if (axis.getValue() == "tp")
        program.buffers[id].tpDim = static_cast<int>(d);
    }
    program.buffers[id].tpPartialGrad = param->hasAttr(moe::kTpPartialGradAttr);
    program.buffers[id].tpFirstRank = param->hasAttr(moe::kTpFirstRankAttr);
    if (auto pieces = param->getAttrOfType<DenseI64ArrayAttr>(moe::kTpPiecesAttr))
      program.buffers[id].tpPieces.assign(pieces.asArrayRef().begin(), pieces.asArrayRef().end());
    if (trainable) {
      int grad = newBuffer(tensor + ".grad", plan::GRADIENT, param.getLocalType(), dims);
      program.buffers[grad].expertSplit = program.buffers[id].expertSplit;
      program.buffers[grad].tpDim = program.buffers[id].tpDim;
      program.buffers[grad].tpPartialGrad = program.buffers[id].tpPartialGrad;
      // AdamW moments stay in f32 whatever the parameter's dtype.
      auto f32 = RankedTensorType::get(shape, Float32Type::get(model.getContext()));
      int m = newBuffer(tensor + ".adam_m", plan::OPTIMIZER_STATE, f32, dims);
      int v = newBuffer(tensor + ".adam_v", plan::OPTIMIZER_STATE, f32, dims);
      ProgramBuffer &buffer = program.buffers[id];
      buffer.grad = grad;
      buffer.adamM = m;
      buffer.adamV = v;
    }
    it->second = id;
    return id;
  }

  /// An expert route's room: every token of every rank (any of them may send it all its
  /// tokens) and k copies of each, or with capacity_factor F, F times what uniform routing
  /// sends this rank (ranks x T x the chance that a token has an expert here; T x k expert
  /// copies), at most that.
  struct Room {
    int64_t tokens = 0, copies = 0;
  };
  /// A placement of layer `layer` that replicates experts holds more than E / ranks on a rank.
  Room routeRoom(moe::EpRouteOp route, int64_t tokens, int layer) const {
    int64_t ranks = route.getRanks();
    int64_t k = cast<RankedTensorType>(route.getIndices().getType()).getDimSize(1);
    Room room{tokens * ranks, tokens * ranks * k};
    if (FloatAttr attr = route.getCapacityFactorAttr()) {
      double factor = attr.getValueAsDouble();
      int64_t placed = static_cast<int64_t>(placementOf(model, layer).size()) / ranks;
      double share = analysis::tokenShareOfRank(route.getNumExperts(), k, ranks, placed);
      room.tokens = std::min<int64_t>(room.tokens, std::max<int64_t>(1, std::ceil(factor * ranks * tokens * share)));
      room.copies = std::min<int64_t>(room.tokens * k, std::max<int64_t>(1, std::ceil(factor * tokens * k)));
    }
    return room;
  }

  /// The concrete shape of result `index` of `op`: only the leading (token) dimension is dynamic.
  FailureOr<std::vector<int64_t>> shapeOf(Operation *op, unsigned index, const llvm::DenseMap<Value, int> &values,
                                          int layer) {
    auto type = cast<RankedTensorType>(op->getResult(index).getType());
    std::vector<int64_t> shape(type.getShape().begin(), type.getShape().end());
    if (type.hasStaticShape())
      return shape;
    for (unsigned d = 1; d < shape.size(); ++d)
      if (ShapedType::isDynamic(shape[d]))
        return op->emitOpError("result ") << index << " has a dynamic dimension " << d
                                          << "; only the token dimension may be dynamic";
    auto rowsOf = [&](Value v) { return program.buffers[values.lookup(v)].shape.at(0); };
    // The received indices of the route whose layout `layout` is.
    auto routeOf = [&](Value layout) -> const ProgramBuffer & {
      return program.buffers[routeOfLayout.lookup(values.lookup(layout))];
    };
    int64_t rows = program.tokens();
    if (auto dispatch = dyn_cast<moe::DispatchOp>(op)) {
      const ProgramBuffer &indices = program.buffers[values.lookup(dispatch.getIndices())];
      // One row per (token, expert) pair; of received tokens, the route's room for copies.
      rows = indices.roomCopies > 0 ? indices.roomCopies : indices.shape.at(0) * indices.shape.at(1);
    } else if (auto route = dyn_cast<moe::EpRouteOp>(op)) {
      rows = routeRoom(route, rowsOf(route.getIndices()), layer).tokens;
    } else if (auto send = dyn_cast<moe::EpSendOp>(op)) {
      rows = routeOf(send.getLayout()).shape.at(0); // the route's room, in its received order
    } else if (auto back = dyn_cast<moe::EpReturnOp>(op)) {
      rows = routeOf(back.getLayout()).tokensPerRank; // one row per token of this rank
    } else if (auto slice = dyn_cast<moe::MicrobatchOp>(op)) {
      rows = rowsOf(slice.getInput()) / slice.getCount();
    } else if (isa<moe::StageExchangeOp>(op)) {
      // One micro-batch's hidden state or its gradient (sequence parallel: a tp rank's rows).
      rows = program.tokens() / (model->hasAttr("sequence_parallel") ? tpRanks : 1);
    } else if (auto blocks = dyn_cast<moe::TokenBlocksOp>(op)) {
      int64_t n = rowsOf(blocks.getInput()), count = blocks.getNumResults();
      rows = (index + 1) * n / count - index * n / count;
    } else if (auto concat = dyn_cast<moe::ConcatTokensOp>(op)) {
      rows = 0;
      for (Value block : concat.getBlocks())
        rows += rowsOf(block);
    } else if (isa<moe::TpGatherOp>(op) || (isa<moe::TpEnterOp>(op) && cast<moe::TpEnterOp>(op).getRows())) {
      rows = rowsOf(op->getOperand(0)) * tpRanks; // every tp rank's rows
    } else if (isa<moe::TpSliceOp>(op) || (isa<moe::TpExitOp>(op) && cast<moe::TpExitOp>(op).getRows())) {
      int64_t whole = rowsOf(op->getOperand(0));
      if (whole % tpRanks)
        return op->emitOpError("takes a tp rank's rows of ")
               << whole << " token rows, which do not split over tp = " << tpRanks
               << " (sequence parallel needs seq_len x micro_batch to divide by tp)";
      rows = whole / tpRanks;
    } else if (Value from = rowsOperand(op, index)) {
      rows = rowsOf(from);
    }
    shape[0] = rows;
    return shape;
  }

  /// The operand whose rows decide result `index`'s rows, for ops whose rows are those of
  /// an operand (a multiple of them for moe.dispatch); null otherwise.
  static Value rowsOperand(Operation *op, unsigned index) {
    if (auto dispatch = dyn_cast<moe::DispatchOp>(op))
      return dispatch.getIndices();
    if (auto combine = dyn_cast<moe::CombineOp>(op))
      return combine.getIndices();
    if (isa<moe::EpRouteOp, moe::EpSendOp, moe::EpReturnOp, moe::MicrobatchOp, moe::StageExchangeOp,
            moe::TokenBlocksOp, moe::ConcatTokensOp, moe::TpGatherOp, moe::TpSliceOp>(op))
      return {};
    if (auto backward = dyn_cast<moe::BackwardOp>(op))
      return backward.getInputs()[backward.getGradOfInputs()[index]];
    for (Value operand : op->getOperands()) {
      auto operandType = dyn_cast<RankedTensorType>(operand.getType());
      if (operandType && operandType.getRank() > 0 && operandType.isDynamicDim(0))
        return operand;
    }
    return {};
  }

  /// Expert parallel: which route's received rows result `index` of `op` (buffer `id`) follows.
  void followReceivedRows(Operation *op, unsigned index, int id, const llvm::DenseMap<Value, int> &values) {
    ProgramBuffer &buffer = program.buffers[id];
    int anchor = -1;
    bool copies = false;
    if (auto route = dyn_cast<moe::EpRouteOp>(op)) {
      if (index == 0)
        anchor = id;
      else
        routeOfLayout[id] = values.lookup(route.getLocalIndices()); // result 0 is placed first
    } else if (auto send = dyn_cast<moe::EpSendOp>(op)) {
      anchor = routeOfLayout.lookup(values.lookup(send.getLayout()));
    } else if (auto type = cast<RankedTensorType>(op->getResult(index).getType());
               type.getRank() == 0 || !type.isDynamicDim(0)) {
      return; // not token rows
    } else if (Value from = rowsOperand(op, index)) {
      const ProgramBuffer &source = program.buffers[values.lookup(from)];
      anchor = source.receivedRowsOf;
      // A dispatch of received tokens makes their expert copies (as many as the route received).
      copies = isa<moe::DispatchOp>(op) ? index == 0 : source.receivedCopies;
    }
    if (anchor < 0)
      return;
    buffer.receivedRowsOf = anchor;
    buffer.receivedCopies = copies;
  }

  LogicalResult walk(Block &block, llvm::DenseMap<Value, int> &values, Context context) {
    for (Operation &op : block) {
      if (isa<moe::ParamOp, func::ReturnOp, moe::YieldOp>(op))
        continue;
      if (auto weight = dyn_cast<moe::WeightOp>(op)) {
        auto param = SymbolTable::lookupSymbolIn(context.symbols, weight.getParamAttr());
        values[weight] = paramBuffer(cast<moe::ParamOp>(param), context.layer);
        continue;
      }
      if (auto apply = dyn_cast<moe::ApplyLayerOp>(op)) {
        if (failed(walkLayer(apply, values, context)))
          return failure();
        continue;
      }
      if (auto grad = dyn_cast<moe::ParamGradOp>(op)) {
        auto param = cast<moe::ParamOp>(SymbolTable::lookupSymbolIn(context.symbols, grad.getParamAttr()));
        int target = program.buffers[paramBuffer(param, context.layer)].grad;
        addStep(&op, "accumulate_grad", {values.lookup(grad.getGrad())}, {target}, context);
        const ProgramBuffer &buffer = program.buffers[target];
        std::vector<int> &bucket =
            gradsOfLayer[{context.layer, bucketOf(buffer.expertSplit, buffer.tpPartialGrad)}];
        if (llvm::find(bucket, target) == bucket.end())
          bucket.push_back(target);
        continue;
      }
      if (auto reduce = dyn_cast<moe::AllReduceGradsOp>(op)) {
        // In place over the gradients that layer accumulated; a layer without any
        // (frozen throughout) needs no collective.
        std::vector<int> bucket =
            gradsOfLayer[{reduce.getLayer(), bucketOf(static_cast<bool>(reduce.getExperts()),
                                                      static_cast<bool>(reduce.getTpPartial()))}];
        if (bucket.empty())
          continue;
        addStep(&op, "", bucket, bucket, context);
        ProgramStep &added = program.steps.back();
        added.collective = "all_reduce";
        added.axis = reduce.getAxis().str();
        added.layer = static_cast<int>(reduce.getLayer());
        continue;
      }
      // The loss seed starts the backward; a sharded step has none (its seed is the
      // loss_weight argument), so its first moe.backward does. A pipeline stage interleaves
      // forward and backward work, so the pass marked the backward ops.
      if (isa<moe::FillOp, moe::BackwardOp>(op))
        context.backward = true;
      if (pipelined && context.layer < 0)
        context.backward = op.hasAttr(moe::kPipelineBackwardAttr);
      // Tensor parallel: entering a split region is the identity (the same buffer); leaving it
      // sums the ranks' partial results. Sequence parallel: entering gathers the ranks' rows,
      // leaving keeps this rank's rows of the sum; a gather of rows is an all-gather, a slice
      // the microbatch kernel at this rank's index (EmitPlan sets it per rank). A sharded norm's
      // statistic (moe.tp_sum) is an all-reduce both ways.
      if (auto enter = dyn_cast<moe::TpEnterOp>(op); enter && !enter.getRows()) {
        values[enter.getResult()] = values.lookup(enter.getInput());
        continue;
      }
      if (isa<moe::TpEnterOp, moe::TpExitOp, moe::TpGatherOp, moe::TpSliceOp, moe::TpSumOp>(op)) {
        int in = values.lookup(op.getOperand(0));
        FailureOr<std::vector<int64_t>> shape = shapeOf(&op, 0, values, context.layer);
        if (failed(shape))
          return failure();
        std::string kernel = op.getName().stripDialect().str();
        std::string name = (context.layer >= 0 ? "layer" + std::to_string(context.layer) + "." : "") + kernel +
                           "." + std::to_string(program.steps.size());
        Value result = op.getResult(0);
        int out = newBuffer(name, context.instance >= 0 ? plan::WORKSPACE : plan::ACTIVATION, result.getType(), *shape);
        program.buffers[out].instance = context.instance;
        values[result] = out;
        auto axis = op.getAttrOfType<StringAttr>("axis");
        if (isa<moe::TpSliceOp>(op)) {
          addStep(&op, "microbatch", {in}, {out}, context);
          Builder b(op.getContext());
          program.steps.back().attrs = b.getDictionaryAttr(
              {b.getNamedAttr("index", b.getI64IntegerAttr(0)), b.getNamedAttr("count", b.getI64IntegerAttr(tpRanks)),
               b.getNamedAttr("axis", axis)});
          continue;
        }
        addStep(&op, "", {in}, {out}, context);
        auto exit = dyn_cast<moe::TpExitOp>(op);
        program.steps.back().collective = isa<moe::TpSumOp>(op) ? "all_reduce"
                                          : !exit                ? "all_gather"
                                          : exit.getRows()       ? "reduce_scatter"
                                                                 : "all_reduce";
        program.steps.back().axis = axis.str();
        continue;
      }
      if (auto exchange = dyn_cast<moe::StageExchangeOp>(op)) {
        context.backward = exchange.getBackward();
        std::vector<int> inputs, outputs;
        if (Value sent = exchange.getSend())
          inputs.push_back(values.lookup(sent));
        if (Value received = exchange.getReceived()) {
          FailureOr<std::vector<int64_t>> shape = shapeOf(&op, 0, values, context.layer);
          if (failed(shape))
            return failure();
          outputs.push_back(newBuffer("stage" + std::to_string(exchange.getPeer()) + "." +
                                          std::to_string(program.steps.size()),
                                      plan::ACTIVATION, received.getType(), *shape));
          values[received] = outputs.back();
        }
        addStep(&op, "", inputs, outputs, context);
        program.steps.back().collective = "send_recv";
        program.steps.back().axis = "pp";
        program.steps.back().peerStage = static_cast<int>(exchange.getPeer());
        continue;
      }
      if (!isa<moe::DifferentiableOpInterface, moe::FillOp, moe::BackwardOp, moe::MicrobatchOp, moe::EpRouteOp>(op))
        return op.emitOpError("has no kernel; the plan can only run moe compute ops");
      std::vector<int> inputs, outputs;
      for (auto [index, operand] : llvm::enumerate(op.getOperands())) {
        auto it = values.find(operand);
        if (it == values.end()) // a producer this flattener does not place
          return op.emitOpError("operand ") << index << " has no buffer in the plan";
        inputs.push_back(it->second);
      }
      for (unsigned i = 0; i < op.getNumResults(); ++i) {
        FailureOr<std::vector<int64_t>> shape = shapeOf(&op, i, values, context.layer);
        if (failed(shape))
          return failure();
        std::string name = (context.layer >= 0 ? "layer" + std::to_string(context.layer) + "." : "") +
                           kernelName(&op) + "." + std::to_string(program.steps.size());
        if (op.getNumResults() > 1)
          name += "#" + std::to_string(i);
        if (!context.backward && context.layer < 0)
          name = forwardName(&op, name);
        int id = newBuffer(name, context.instance >= 0 ? plan::WORKSPACE : plan::ACTIVATION,
                           op.getResult(i).getType(), *shape);
        program.buffers[id].instance = context.instance;
        values[op.getResult(i)] = id;
        outputs.push_back(id);
        if (auto route = dyn_cast<moe::EpRouteOp>(op); route && i == 0) {
          int64_t tokens = program.buffers[inputs.at(0)].shape.at(0);
          program.buffers[id].roomCopies = routeRoom(route, tokens, context.layer).copies;
          program.buffers[id].tokensPerRank = tokens;
          int64_t k = cast<RankedTensorType>(route.getIndices().getType()).getDimSize(1);
          program.buffers[id].otherRanksPerToken =
              route.getAllTokens() ? double(route.getRanks() - 1)
                                   : analysis::otherRanksPerToken(route.getNumExperts(), k, route.getRanks(),
                                                                  placementOf(model, context.layer).vec());
        }
        followReceivedRows(&op, i, id, values);
      }
      if (std::optional<ExpertExchange> exchange = expertExchange(&op, inputs)) {
        addStep(&op, "", exchange->inputs, outputs, context);
        program.steps.back().collective = exchange->collective;
        program.steps.back().axis = exchange->axis;
        continue;
      }
      addStep(&op, kernelName(&op), inputs, outputs, context);
    }
    return success();
  }

  /// The expert exchange's ops are collectives; `inputs` are the op's operand buffers in IR
  /// order, which is plan.proto's layout.
  struct ExpertExchange {
    std::string collective, axis;
    std::vector<int> inputs;
  };
  static std::optional<ExpertExchange> expertExchange(Operation *op, const std::vector<int> &in) {
    if (auto route = dyn_cast<moe::EpRouteOp>(op))
      return ExpertExchange{"expert_route", route.getAxis().str(), in};
    if (auto send = dyn_cast<moe::EpSendOp>(op))
      return ExpertExchange{"expert_send", send.getAxis().str(), in};
    if (auto back = dyn_cast<moe::EpReturnOp>(op))
      return ExpertExchange{"expert_return", back.getAxis().str(), in};
    return std::nullopt;
  }

  LogicalResult walkLayer(moe::ApplyLayerOp apply, llvm::DenseMap<Value, int> &values,
                          Context context) {
    auto layer = dyn_cast_or_null<moe::LayerOp>(SymbolTable::lookupSymbolIn(model, apply.getCalleeAttr()));
    if (!layer)
      return apply.emitOpError("calls '") << apply.getCallee() << "', not a moe.layer";
    Block &body = layer.getBody().front();
    llvm::DenseMap<Value, int> inner;
    for (auto [arg, operand] : llvm::zip(body.getArguments(), apply.getOperands()))
      inner[arg] = values.lookup(operand);
    Context nested{static_cast<int>(apply.getIndexAttr().getInt()),
                   static_cast<int>(program.instanceTemplate.size()), context.backward, layer};
    program.instanceTemplate.push_back(layer.getSymName().str());
    if (failed(walk(body, inner, nested)))
      return failure();
    // Values the layer returns outlive it: they become activations.
    for (auto [result, yielded] : llvm::zip(apply.getResults(), body.getTerminator()->getOperands())) {
      int id = inner.lookup(yielded);
      ProgramBuffer &buffer = program.buffers[id];
      if (buffer.role == plan::WORKSPACE) {
        buffer.role = plan::ACTIVATION;
        buffer.instance = -1;
      }
      values[result] = id;
    }
    // The forward output of each layer, by name: tools compare it with reference hidden states.
    if (!context.backward && !pipelined) // (a pipeline runs each layer once per micro-batch)
      program.buffers[values.lookup(apply.getResult(0))].name =
          "layer_output." + std::to_string(nested.layer);
    return success();
  }

  /// Names of the model-level forward values, for tools that read them (moe-align). Fused
  /// with the loss (--moe-fuse), the LM head has no logits buffer to name: moe-align
  /// compiles its logits run with --no-fuse.
  static std::string forwardName(Operation *op, const std::string &otherwise) {
    if (isa<moe::EmbeddingOp>(op))
      return "embeddings";
    if (isa<moe::RMSNormOp, moe::LayerNormOp>(op))
      return "final_norm";
    if (auto linear = dyn_cast<moe::LinearOp>(op))
      if (llvm::any_of(linear->getUsers(), [](Operation *user) { return isa<moe::CrossEntropyOp>(user); }))
        return "logits";
    return otherwise;
  }

  void addStep(Operation *op, std::string kernel, std::vector<int> inputs, std::vector<int> outputs,
               const Context &context) {
    ProgramStep step;
    step.kernel = std::move(kernel);
    step.inputs = std::move(inputs);
    step.outputs = std::move(outputs);
    step.attrs = op->getAttrDictionary();
    if (auto name = dyn_cast<NameLoc>(op->getLoc())) // --moe-propagate-sharding names why it inserted it
      step.because = name.getName().str();
    step.layer = context.layer;
    step.phase = !context.backward            ? plan::FORWARD
                 : op->hasAttr("recomputed") ? plan::RECOMPUTE
                                              : plan::BACKWARD;
    std::string origin;
    llvm::raw_string_ostream os(origin);
    os << op->getName();
    if (context.layer >= 0)
      os << " in @" << cast<moe::LayerOp>(context.symbols).getSymName() << "[" << context.layer << "]";
    step.origin = origin;
    if (auto stream = op->getAttrOfType<IntegerAttr>(moe::kStreamAttr))
      step.stream = static_cast<int>(stream.getInt());
    step.flops = estimateFlops(op, step, program);
    step.scratchBytes = scratchOf(op, step, program);
    program.steps.push_back(std::move(step));
  }

  void computeLiveRanges() {
    int last = static_cast<int>(program.steps.size()) - 1;
    for (auto [index, step] : llvm::enumerate(program.steps))
      for (const std::vector<int> *ids : {&step.inputs, &step.outputs})
        for (int id : *ids) {
          ProgramBuffer &buffer = program.buffers[id];
          int at = static_cast<int>(index);
          buffer.first = buffer.first < 0 ? at : std::min(buffer.first, at);
          buffer.last = std::max(buffer.last, at);
        }
    for (ProgramBuffer &buffer : program.buffers)
      if (buffer.role != plan::ACTIVATION && buffer.role != plan::WORKSPACE) {
        buffer.first = 0; // whole-step residents
        buffer.last = last;
      } else if (buffer.first < 0) {
        buffer.first = buffer.last = 0;
      }
  }

  Program &program;
  moe::ModelOp model;
  bool pipelined = false;
  int64_t tpRanks = 1; // the model's mesh: sequence parallel moves rows over tp
  std::map<std::string, int> params;
  /// The gradient buffers each layer index accumulates (-1: model level), in first-use
  /// order, by kind: those of replicated parameters, of parameters split over ep, and of
  /// replicated ones whose gradient each tp rank has a part of.
  enum BucketKind { kReplicated, kExperts, kTpPartial, kExpertsTpPartial };
  static BucketKind bucketOf(bool experts, bool tpPartial) {
    return experts ? (tpPartial ? kExpertsTpPartial : kExperts) : tpPartial ? kTpPartial : kReplicated;
  }
  std::map<std::pair<int64_t, BucketKind>, std::vector<int>> gradsOfLayer;
  /// Each expert route's layout buffer -> its received-indices buffer.
  llvm::DenseMap<int, int> routeOfLayout;
};

/// Lowest offset where `size` bytes fit beside `placed` (sorted by offset).
int64_t lowestFit(std::vector<std::pair<int64_t, int64_t>> &placed, int64_t size) {
  std::sort(placed.begin(), placed.end());
  int64_t offset = 0;
  for (auto [begin, end] : placed) {
    if (begin - offset >= size)
      break;
    offset = std::max(offset, end);
  }
  return offset;
}

constexpr int64_t kAlignment = 256; // what CUDA allocations give, so kernels may assume it

int64_t aligned(int64_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

/// Largest first, lowest offset that overlaps no placed buffer live at the same time.
void placeByLiveness(Program &program, const std::vector<int> &ids) {
  std::vector<int> order(ids);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return program.buffers[a].bytes > program.buffers[b].bytes;
  });
  std::vector<int> placedIds;
  for (int id : order) {
    ProgramBuffer &buffer = program.buffers[id];
    std::vector<std::pair<int64_t, int64_t>> conflicts;
    for (int other : placedIds) {
      const ProgramBuffer &o = program.buffers[other];
      if (o.first <= buffer.last && buffer.first <= o.last)
        conflicts.emplace_back(o.offset, o.offset + aligned(o.bytes));
    }
    buffer.offset = lowestFit(conflicts, aligned(buffer.bytes));
    placedIds.push_back(id);
  }
}

} // namespace

ArrayRef<int64_t> placementOf(moe::ModelOp model, int layer) {
  auto placement = model->getAttrOfType<DictionaryAttr>("expert_placement");
  auto table = placement && layer >= 0 ? placement.getAs<DenseI64ArrayAttr>(std::to_string(layer)) : nullptr;
  return table ? table.asArrayRef() : ArrayRef<int64_t>{};
}

int pipelineStages(moe::ModelOp model) {
  auto pipeline = model->getAttrOfType<DictionaryAttr>("pipeline");
  auto stages = pipeline ? pipeline.getAs<IntegerAttr>("stages") : IntegerAttr();
  return stages ? static_cast<int>(stages.getInt()) : 1;
}

int64_t pipelineMicroBatches(moe::ModelOp model) {
  auto pipeline = model->getAttrOfType<DictionaryAttr>("pipeline");
  auto count = pipeline ? pipeline.getAs<IntegerAttr>("micro_batches") : IntegerAttr();
  return count ? count.getInt() : 1;
}

FailureOr<std::vector<Program>> buildStagePrograms(moe::ModelOp model, int64_t seqLen, int64_t microBatch) {
  std::vector<Program> programs;
  for (int s = 0; s < pipelineStages(model); ++s) {
    FailureOr<Program> program = buildProgram(model, seqLen, microBatch, s);
    if (failed(program))
      return failure();
    assignOffsets(*program);
    programs.push_back(std::move(*program));
  }
  return programs;
}

FailureOr<Program> buildProgram(moe::ModelOp model, int64_t seqLen, int64_t microBatch, int stage) {
  Program program;
  program.seqLen = seqLen;
  program.microBatch = microBatch;
  program.stage = stage;
  program.microBatches = pipelineMicroBatches(model);
  if (seqLen <= 0 || microBatch <= 0)
    return model.emitError("sequence length and micro-batch must be positive, got ")
           << seqLen << " and " << microBatch;
  if (failed(Flattener(program, model).run()))
    return failure();
  return program;
}

void assignOffsets(Program &program) {
  std::map<plan::Role, int64_t> packed;
  std::vector<int> activations;
  // Workspace: the first instance of each template is placed; the others copy its offsets.
  std::map<std::string, int> firstInstance;
  std::map<int, std::vector<int>> workspaceOf;
  for (auto [id, buffer] : llvm::enumerate(program.buffers)) {
    if (buffer.role == plan::ACTIVATION) {
      activations.push_back(static_cast<int>(id));
    } else if (buffer.role == plan::WORKSPACE) {
      workspaceOf[buffer.instance].push_back(static_cast<int>(id));
    } else {
      buffer.offset = packed[buffer.role];
      packed[buffer.role] += aligned(buffer.bytes);
    }
  }
  placeByLiveness(program, activations);
  for (auto &[instance, ids] : workspaceOf) {
    const std::string &name = program.instanceTemplate[instance];
    auto [it, first] = firstInstance.try_emplace(name, instance);
    if (first) {
      placeByLiveness(program, ids);
      continue;
    }
    // Instances of one template create the same buffers in the same order.
    const std::vector<int> &model = workspaceOf[it->second];
    bool same = model.size() == ids.size();
    for (size_t k = 0; same && k < ids.size(); ++k)
      same = program.buffers[model[k]].bytes == program.buffers[ids[k]].bytes;
    if (!same) {
      placeByLiveness(program, ids);
      continue;
    }
    for (size_t k = 0; k < ids.size(); ++k)
      program.buffers[ids[k]].offset = program.buffers[model[k]].offset;
  }
}

std::map<plan::Role, int64_t> Program::arenaBytes() const {
  std::map<plan::Role, int64_t> bytes;
  for (const ProgramBuffer &buffer : buffers)
    bytes[buffer.role] = std::max(bytes[buffer.role], buffer.offset + aligned(buffer.bytes));
  return bytes;
}

int64_t Program::scratchBytes() const {
  int64_t most = 0;
  for (const ProgramStep &step : steps)
    most = std::max(most, step.scratchBytes);
  return most;
}

int64_t Program::peakBytes() const {
  int64_t total = scratchBytes();
  for (auto [role, bytes] : arenaBytes())
    total += bytes;
  return total;
}

} // namespace moec::compiler
