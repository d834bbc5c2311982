//===- SchedulePipeline.cpp - pipeline stages in 1F1B order ---------------===//

#include "passes/schedule_pipeline/SchedulePipeline.h"

#include <map>
#include <tuple>

#include "dialects/moe/MeshShape.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"

#define DEBUG_TYPE "moe-schedule-pipeline"

namespace moec::passes {

#define GEN_PASS_DEF_SCHEDULEPIPELINEPASS
#include "passes/schedule_pipeline/SchedulePipeline.h.inc"

namespace {

using namespace mlir;

/// Where an op of @train_step runs: its stage, and whether it is backward work.
struct Placement {
  int stage = 0;
  bool backward = false;
  bool everyStage = false; // the model-level gradient sums: wherever such gradients are
};

/// Weights and constants: every stage that reads one makes its own.
bool isCopyable(Operation *op) { return op->getNumOperands() == 0 && op->getNumResults() > 0; }

/// What crosses between stage s - 1 and s: the hidden state forward, its gradient back.
struct Boundary {
  Value forward, backward;
};

/// One transfer between neighbours: across boundary `boundary` (between stages
/// boundary - 1 and boundary), forward (the hidden state) or backward (its gradient), of
/// micro-batch `micro`.
struct Transfer {
  int boundary = 0;
  bool backward = false;
  int64_t micro = 0;
  bool operator<(const Transfer &o) const {
    return std::tie(boundary, backward, micro) < std::tie(o.boundary, o.backward, o.micro);
  }
  bool operator==(const Transfer &o) const { return !(*this < o) && !(o < *this); }
  bool operator!=(const Transfer &o) const { return !(*this == o); }
};

/// A stage's work in order: a micro-batch's forward or backward, or a transfer with a
/// neighbour (`peer`).
struct Item {
  enum Kind { Compute, Send, Recv } kind;
  bool backward = false;
  int64_t micro = 0;
  int peer = -1;
  Transfer transfer;
};

class Scheduler {
public:
  Scheduler(moe::ModelOp model, func::FuncOp step, int pp, int64_t microBatches)
      : model(model), step(step), pp(pp), m(microBatches), boundaries(pp + 1) {}

  LogicalResult run() {
    if (failed(place()) || failed(findBoundaries()))
      return failure();
    if (failed(pairTransfers()))
      return failure();
    OpBuilder b(step);
    for (int s = 0; s < pp; ++s)
      if (failed(buildStage(b, s)))
        return failure();
    step.erase();
    return success();
  }

private:
  /// Layers go to stages in contiguous runs; other ops go with the layer before them
  /// (the embedding with stage 0, the head with the last, their backwards likewise).
  LogicalResult place() {
    std::vector<int64_t> layers;
    Block &body = step.getBody().front();
    for (auto apply : body.getOps<moe::ApplyLayerOp>())
      layers.push_back(apply.getIndex());
    llvm::sort(layers);
    layers.erase(std::unique(layers.begin(), layers.end()), layers.end());
    if (static_cast<int64_t>(layers.size()) < pp)
      return model.emitError("--moe-schedule-pipeline: pp = ")
             << pp << " needs at least " << pp << " layers, the model has " << layers.size();
    for (auto [position, index] : llvm::enumerate(layers))
      stageOfLayer[index] = static_cast<int>(position * pp / layers.size());
    int current = 0;
    bool backward = false;
    for (Operation &op : body.without_terminator()) {
      backward |= isa<moe::BackwardOp, moe::ParamGradOp>(op);
      Placement where;
      if (auto apply = dyn_cast<moe::ApplyLayerOp>(op))
        current = stageOfLayer.at(apply.getIndex());
      where.stage = current;
      if (auto reduce = dyn_cast<moe::AllReduceGradsOp>(op)) {
        backward = true;
        if (reduce.getLayer() >= 0)
          where.stage = stageOfLayer.at(reduce.getLayer());
        else
          where.everyStage = true;
      }
      where.backward = backward;
      placed[&op] = where;
      if (isCopyable(&op))
        continue; // cloned into every stage that reads it
      if (where.everyStage)
        everyStage.push_back(&op);
      else
        (backward ? backwardOps : forwardOps)[where.stage].push_back(&op);
    }
    return success();
  }

  /// Every value used on another stage than its own must be the hidden state between
  /// neighbours (forward) or its gradient (backward); anything else is reported.
  LogicalResult findBoundaries() {
    for (Operation &each : step.getBody().front().without_terminator()) {
      Operation *op = &each;
      const Placement &where = placed.at(op);
      if (where.everyStage)
        continue;
      for (Value operand : op->getOperands()) {
        Operation *def = operand.getDefiningOp();
        if (!def || isCopyable(def))
          continue;
        const Placement &from = placed.at(def);
        if (from.stage == where.stage)
          continue;
        Value *slot = nullptr;
        if (!from.backward && from.stage == where.stage - 1)
          slot = &boundaries[where.stage].forward;
        else if (from.backward && from.stage == where.stage + 1)
          slot = &boundaries[from.stage].backward;
        if (!slot || (*slot && *slot != operand))
          return op->emitOpError("on pipeline stage ")
                 << where.stage << " reads a value of stage " << from.stage
                 << " that is not the hidden state passed between neighbouring stages ("
                 << def->getName() << "); --moe-schedule-pipeline cannot place it";
        *slot = operand;
      }
    }
    // A weight is copied into every stage that reads it; a trainable one on two stages would
    // have two gradients that nothing sums (and two copies the export would add up).
    std::map<Operation *, int> trainableOn;
    for (Operation &each : step.getBody().front().without_terminator()) {
      const Placement &where = placed.at(&each);
      if (where.everyStage)
        continue;
      for (Value operand : each.getOperands()) {
        auto weight = operand.getDefiningOp<moe::WeightOp>();
        auto param = weight ? SymbolTable::lookupNearestSymbolFrom<moe::ParamOp>(weight, weight.getParamAttr())
                            : moe::ParamOp();
        if (!param || !param.getTrainable())
          continue;
        auto [it, added] = trainableOn.try_emplace(param, where.stage);
        if (!added && it->second != where.stage)
          return each.emitOpError("reads the trainable parameter '")
                 << param.getSymName() << "' on pipeline stage " << where.stage << " and stage " << it->second
                 << "; --moe-schedule-pipeline cannot split it (its gradient would be summed nowhere)";
      }
    }
    for (int s = 1; s < pp; ++s)
      if (!boundaries[s].forward)
        return step.emitOpError("stage ") << s << " reads nothing from stage " << s - 1
                                          << "; the layers do not form one chain";
    return success();
  }

  /// Stage s's 1F1B order: pp - 1 - s forwards to fill the pipeline, then a forward and a
  /// backward in turn, then the remaining backwards; each receives what it needs just
  /// before and sends what it made just after.
  std::vector<Item> itemsFor(int s) const {
    int64_t warmup = std::min<int64_t>(pp - 1 - s, m);
    std::vector<std::pair<bool, int64_t>> order; // (backward, micro-batch)
    for (int64_t i = 0; i < warmup; ++i)
      order.push_back({false, i});
    for (int64_t i = 0; i + warmup < m; ++i) {
      order.push_back({false, i + warmup});
      order.push_back({true, i});
    }
    for (int64_t i = m - warmup; i < m; ++i)
      order.push_back({true, i});
    std::vector<Item> items;
    auto transfer = [&](Item::Kind kind, int peer, int boundary, bool backward, int64_t micro) {
      items.push_back({kind, backward, micro, peer, Transfer{boundary, backward, micro}});
    };
    for (auto [backward, i] : order) {
      if (!backward) {
        if (s > 0)
          transfer(Item::Recv, s - 1, s, false, i);
        items.push_back({Item::Compute, false, i, -1, {}});
        if (s < pp - 1)
          transfer(Item::Send, s + 1, s + 1, false, i);
        continue;
      }
      if (s < pp - 1 && boundaries[s + 1].backward)
        transfer(Item::Recv, s + 1, s + 1, true, i);
      items.push_back({Item::Compute, true, i, -1, {}});
      if (s > 0 && boundaries[s].backward)
        transfer(Item::Send, s - 1, s, true, i);
    }
    return items;
  }

  /// Both sides of a boundary must issue its transfers in the same order (each is a
  /// rendezvous). Where the two orders swap neighbouring transfers (a stage sends the next
  /// activation while its neighbour sends a gradient back), the two go as one exchange.
  LogicalResult pairTransfers() {
    for (int s = 0; s < pp; ++s)
      itemsOf[s] = itemsFor(s);
    for (int boundary = 1; boundary < pp; ++boundary) {
      auto transfersOf = [&](int s, int peer) {
        std::vector<Transfer> out;
        for (const Item &item : itemsOf[s])
          if (item.kind != Item::Compute && item.peer == peer)
            out.push_back(item.transfer);
        return out;
      };
      std::vector<Transfer> before = transfersOf(boundary - 1, boundary), after = transfersOf(boundary, boundary - 1);
      size_t i = 0;
      while (i < before.size() && i < after.size()) {
        if (before[i] == after[i]) {
          ++i;
        } else if (i + 1 < before.size() && i + 1 < after.size() && before[i] == after[i + 1] &&
                   before[i + 1] == after[i]) {
          partners[before[i]] = before[i + 1];
          partners[before[i + 1]] = before[i];
          i += 2;
        } else {
          break;
        }
      }
      if (i != before.size() || i != after.size())
        return step.emitOpError("--moe-schedule-pipeline: stages ")
               << boundary - 1 << " and " << boundary << " would exchange in different orders (" << m
               << " micro-batches over " << pp << " stages)";
    }
    return success();
  }

  Value boundaryValue(const Transfer &t) const {
    return t.backward ? boundaries[t.boundary].backward : boundaries[t.boundary].forward;
  }

  /// One stage's function: its micro-batches in 1F1B order with the exchanges between.
  LogicalResult buildStage(OpBuilder &b, int s) {
    Block &body = step.getBody().front();
    SmallVector<Type> inputs(body.getArgumentTypes());
    auto weightType = cast<RankedTensorType>(inputs[3]);
    inputs[3] = RankedTensorType::get({m}, weightType.getElementType());
    SmallVector<Type> results;
    bool last = s == pp - 1;
    if (last)
      for (int64_t i = 0; i < m; ++i)
        llvm::append_range(results, step.getFunctionType().getResults());
    b.setInsertionPoint(step);
    auto stage = b.create<func::FuncOp>(step.getLoc(), ("train_step_stage" + std::to_string(s)),
                                        b.getFunctionType(inputs, results));
    stage->setAttr("pipeline_stage", b.getI64IntegerAttr(s));
    Block *entry = stage.addEntryBlock();
    b.setInsertionPointToEnd(entry);

    std::vector<IRMapping> maps(m);
    std::vector<std::map<unsigned, Value>> slices(m);
    // A value of @train_step as micro-batch i sees it on this stage.
    auto valueFor = [&](int64_t i, Value v) -> Value {
      if (auto arg = dyn_cast<BlockArgument>(v)) {
        auto [it, inserted] = slices[i].try_emplace(arg.getArgNumber());
        if (inserted)
          it->second = b.create<moe::MicrobatchOp>(v.getLoc(), v.getType(), entry->getArgument(arg.getArgNumber()),
                                                    b.getI64IntegerAttr(i), b.getI64IntegerAttr(m));
        return it->second;
      }
      if (Value mapped = maps[i].lookupOrNull(v))
        return mapped;
      Operation *def = v.getDefiningOp(); // a weight or constant: its own copy here
      Operation *copy = b.clone(*def);
      maps[i].map(def->getResults(), copy->getResults());
      return maps[i].lookup(v);
    };
    auto clone = [&](int64_t i, Operation *op, bool backward) {
      for (Value operand : op->getOperands())
        maps[i].map(operand, valueFor(i, operand));
      Operation *copy = b.clone(*op, maps[i]);
      if (backward)
        copy->setAttr(moe::kPipelineBackwardAttr, b.getUnitAttr());
    };

    // Gradient sums run once, after the last backward, and after its gradient went to the
    // previous stage (which waits for it).
    std::vector<Operation *> sums;
    auto sumGradients = [&] {
      for (Operation *op : sums)
        clone(m - 1, op, true);
      sums.clear();
    };
    // The stage's work in order; a transfer paired with the next one (pairTransfers) is one
    // exchange op with it.
    std::vector<Item> &items = itemsOf[s];
    for (size_t k = 0; k < items.size(); ++k) {
      const Item &item = items[k];
      if (item.kind == Item::Compute) {
        sumGradients();
        for (Operation *op : item.backward ? backwardOps[s] : forwardOps[s]) {
          if (!isa<moe::AllReduceGradsOp>(op))
            clone(item.micro, op, item.backward);
          else if (item.micro == m - 1)
            sums.push_back(op);
        }
        continue;
      }
      const Item *send = item.kind == Item::Send ? &item : nullptr, *recv = send ? nullptr : &item;
      if (auto partner = partners.find(item.transfer); partner != partners.end()) {
        if (k + 1 >= items.size() || items[k + 1].transfer != partner->second || items[k + 1].peer != item.peer)
          return step.emitOpError("--moe-schedule-pipeline: stage ")
                 << s << " cannot pair its exchanges with stage " << item.peer << " in the 1F1B order of " << m
                 << " micro-batches";
        (send ? recv : send) = &items[++k];
      }
      Value sent = send ? maps[send->micro].lookup(boundaryValue(send->transfer)) : Value();
      Value like = recv ? boundaryValue(recv->transfer) : Value();
      bool backward = (send && send->transfer.backward) || (recv && recv->transfer.backward);
      auto exchange = b.create<moe::StageExchangeOp>(step.getLoc(), like ? like.getType() : Type(), sent,
                                                     b.getI64IntegerAttr(item.peer),
                                                     backward ? b.getUnitAttr() : UnitAttr());
      if (recv)
        maps[recv->micro].map(like, exchange.getReceived());
    }
    sumGradients();
    for (Operation *op : everyStage)
      clone(m - 1, op, true);
    SmallVector<Value> losses;
    if (last)
      for (int64_t i = 0; i < m; ++i)
        for (Value v : body.getTerminator()->getOperands())
          losses.push_back(valueFor(i, v));
    b.create<func::ReturnOp>(step.getLoc(), losses);
    return success();
  }

  moe::ModelOp model;
  func::FuncOp step;
  int pp;
  int64_t m;
  std::map<int64_t, int> stageOfLayer;
  llvm::DenseMap<Operation *, Placement> placed;
  std::map<int, std::vector<Operation *>> forwardOps, backwardOps;
  std::vector<Operation *> everyStage;
  std::vector<Boundary> boundaries; // [s]: between s - 1 and s
  std::map<int, std::vector<Item>> itemsOf;
  std::map<Transfer, Transfer> partners; // transfers that go as one exchange
};

struct SchedulePipelinePass : impl::SchedulePipelinePassBase<SchedulePipelinePass> {
  using SchedulePipelinePassBase::SchedulePipelinePassBase;

  void runOnOperation() override {
    moe::ModelOp model = getOperation();
    auto text = model->getAttrOfType<StringAttr>("mesh");
    if (!text)
      return;
    moe::MeshShape mesh;
    std::string error;
    if (!moe::MeshShape::parse(text.str(), mesh, error)) {
      model.emitError("--moe-schedule-pipeline: mesh '") << text.str() << "': " << error;
      return signalPassFailure();
    }
    if (mesh.pp == 1)
      return;
    int64_t count = microBatches ? microBatches : 2 * mesh.pp;
    if (count < 1) {
      model.emitError("--moe-schedule-pipeline: micro-batches must be >= 1, got ") << count;
      return signalPassFailure();
    }
    auto step = dyn_cast_or_null<func::FuncOp>(SymbolTable::lookupSymbolIn(model, "train_step"));
    if (!step || step.getBody().front().getNumArguments() != 4) {
      model.emitError("--moe-schedule-pipeline: needs @train_step with its loss_weight argument; run "
                      "--moe-build-training-step and --moe-sync-gradients first");
      return signalPassFailure();
    }
    if (failed(Scheduler(model, step, static_cast<int>(mesh.pp), count).run()))
      return signalPassFailure();
    Builder b(model.getContext());
    model->setAttr("pipeline", b.getDictionaryAttr({b.getNamedAttr("stages", b.getI64IntegerAttr(mesh.pp)),
                                                    b.getNamedAttr("micro_batches", b.getI64IntegerAttr(count))}));
  }
};

} // namespace
} // namespace moec::passes
