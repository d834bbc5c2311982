//===- SequenceParallel.cpp - the residual stream in rows over tp ---------===//
//
// After the tp split every token-row value (leading dimension: the tokens) is, on each tp rank:
//   whole   every row, the same on every rank (computed by every rank);
//   shard   this rank's rows (rank r of n: rows [r T / n, (r + 1) T / n));
//   region  every row, different per rank (a split region's parts and partial sums).
// The rules, per op:
//   tp_enter(shard)                 -> region  (rows: all-gather; backward reduce-scatter)
//   tp_exit(region)                 -> shard   (rows: reduce-scatter; backward all-gather)
//   tokenwise op (Moe_Tokenwise), with a region operand -> region (shard operands gathered:
//                                      integers only; a float enters through tp_enter, whose
//                                      backward sums its gradient over tp)
//   tokenwise op, with a shard operand                  -> shard  (whole operands sliced)
//   any other op (it mixes tokens)  -> region with a region operand, else whole; its shard
//                                      operands gathered (moe.tp_gather)
//   layer arguments: the hidden states (the first) are a shard, the rest whole; what a layer
//   yields is a shard; @forward returns whole logits (gathered).
// A trainable parameter read by a tokenwise op on shards gets a partial gradient on each rank
// (moe.tp_partial_grad: summed over tp); one read by whole work gets the whole gradient. A
// dispatch of a rank's rows is marked moe.tp_rows: its expert loads are that rank's own.
//
//===----------------------------------------------------------------------===//

#include "passes/propagate_sharding/SequenceParallel.h"

#include "llvm/ADT/SetVector.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"

namespace moec::passes {

namespace {

using namespace mlir;

enum class Rows { None, Whole, Shard, Region };

bool tokenRows(Value v) {
  auto type = dyn_cast<RankedTensorType>(v.getType());
  return type && type.getRank() >= 1 && type.isDynamicDim(0);
}

class SequenceParallel {
public:
  explicit SequenceParallel(moe::ModelOp model)
      : model(model), b(model.getContext()), tp(b.getStringAttr("tp")) {}

  LogicalResult run() {
    auto forward = dyn_cast_or_null<func::FuncOp>(SymbolTable::lookupSymbolIn(model, "forward"));
    if (!forward)
      return model.emitError("--moe-propagate-sharding: sequence parallel needs a func.func @forward");
    if (failed(runBlock(forward.getBody().front())))
      return failure();
    for (moe::ParamOp param : onShards) {
      if (readWhole.contains(param))
        return param.emitOpError("is trainable and read both on a tp rank's rows and on every row; sequence "
                                 "parallel cannot sum its gradient over tp for one and not the other");
      param->setAttr(moe::kTpPartialGradAttr, b.getUnitAttr());
    }
    model->setAttr("sequence_parallel", b.getUnitAttr());
    return success();
  }

private:
  Rows rowsOf(Value v) {
    if (!tokenRows(v))
      return Rows::None;
    auto it = rows.find(v);
    return it == rows.end() ? Rows::Whole : it->second; // a function argument: every rank's
  }

  /// Where a value `v` derived from starts: right after its definition.
  void insertAfter(Value v) {
    if (Operation *def = v.getDefiningOp())
      b.setInsertionPointAfter(def);
    else
      b.setInsertionPointToStart(cast<BlockArgument>(v).getOwner());
  }

  /// `v` moved to rows `to` by one `Op` per value (moe.tp_gather: a shard made whole;
  /// moe.tp_slice: a whole value cut to this rank's rows), right after its definition.
  template <typename Op>
  Value moved(Value v, llvm::DenseMap<Value, Value> &cache, Rows to) {
    auto [it, inserted] = cache.try_emplace(v, Value());
    if (inserted) {
      OpBuilder::InsertionGuard guard(b);
      insertAfter(v);
      it->second = b.create<Op>(v.getLoc(), v, tp).getResult();
      rows[it->second] = to;
    }
    return it->second;
  }

  /// Makes operand `use` a shard or whole (`want`).
  LogicalResult coerce(OpOperand &use, Rows want) {
    Rows have = rowsOf(use.get());
    if (have == want || have == Rows::None)
      return success();
    if (have == Rows::Region)
      return use.getOwner()->emitOpError("reads operand ")
             << use.getOperandNumber() << " from inside a tensor-parallel region without its moe.tp_exit";
    use.set(want == Rows::Shard ? moved<moe::TpSliceOp>(use.get(), slices, Rows::Shard)
                                : moved<moe::TpGatherOp>(use.get(), gathers, Rows::Whole));
    return success();
  }

  /// The trainable parameters `op` reads, as shard work or as whole work.
  void noteParams(Operation *op, Rows result) {
    for (Value operand : op->getOperands())
      if (auto weight = operand.getDefiningOp<moe::WeightOp>()) {
        auto param = SymbolTable::lookupNearestSymbolFrom<moe::ParamOp>(weight, weight.getParamAttr());
        if (param && param.getTrainable())
          (result == Rows::Shard ? onShards : readWhole).insert(param);
      }
  }

  LogicalResult runLayer(moe::ApplyLayerOp apply) {
    auto layer = SymbolTable::lookupNearestSymbolFrom<moe::LayerOp>(apply, apply.getCalleeAttr());
    if (!layer)
      return apply.emitOpError("applies an unknown layer template");
    Block &body = layer.getBody().front();
    if (body.getNumArguments() == 0 || !tokenRows(body.getArgument(0)))
      return layer.emitOpError("needs the hidden states as its first argument for sequence parallel");
    if (layersDone.insert(layer)) {
      rows[body.getArgument(0)] = Rows::Shard;
      if (failed(runBlock(body)))
        return failure();
    }
    for (OpOperand &use : apply->getOpOperands())
      if (failed(coerce(use, use.getOperandNumber() == 0 ? Rows::Shard : Rows::Whole)))
        return failure();
    for (Value result : apply->getResults())
      if (tokenRows(result))
        rows[result] = Rows::Shard;
    return success();
  }

  LogicalResult runBlock(Block &block) {
    for (Operation &op : llvm::make_early_inc_range(block)) {
      if (isa<moe::WeightOp, moe::ParamOp, moe::TpGatherOp, moe::TpSliceOp>(op))
        continue;
      if (isa<moe::YieldOp, func::ReturnOp>(op)) {
        for (OpOperand &use : op.getOpOperands())
          if (failed(coerce(use, isa<moe::YieldOp>(op) ? Rows::Shard : Rows::Whole)))
            return failure();
        continue;
      }
      if (auto apply = dyn_cast<moe::ApplyLayerOp>(op)) {
        if (failed(runLayer(apply)))
          return failure();
        continue;
      }
      if (auto enter = dyn_cast<moe::TpEnterOp>(op)) {
        if (rowsOf(enter.getInput()) == Rows::Shard)
          enter.setRows(true);
        rows[enter.getResult()] = Rows::Region;
        continue;
      }
      if (auto exit = dyn_cast<moe::TpExitOp>(op)) {
        if (rowsOf(exit.getInput()) != Rows::Region)
          return exit.emitOpError("sums a value that no tensor-parallel region computed");
        exit.setRows(true);
        rows[exit.getResult()] = Rows::Shard;
        continue;
      }
      bool anyRegion = false, anyShard = false;
      for (Value operand : op.getOperands()) {
        anyRegion |= rowsOf(operand) == Rows::Region;
        anyShard |= rowsOf(operand) == Rows::Shard;
      }
      Rows result = anyRegion ? Rows::Region : Rows::Whole;
      if (op.hasTrait<moe::Tokenwise>() && !anyRegion && anyShard)
        result = Rows::Shard;
      for (OpOperand &use : op.getOpOperands()) {
        if (result == Rows::Region && rowsOf(use.get()) == Rows::Region)
          continue; // a region's own values
        // A region's float inputs come through moe.tp_enter (their gradient is a sum over tp);
        // a gather would drop the other ranks' parts of the gradient.
        if (result == Rows::Region && rowsOf(use.get()) == Rows::Shard && moe::isFloatTensor(use.get().getType()))
          return op.emitOpError("reads operand ")
                 << use.getOperandNumber() << ", a tp rank's rows, inside a tensor-parallel region without moe.tp_enter";
        if (failed(coerce(use, result == Rows::Shard ? Rows::Shard : Rows::Whole)))
          return failure();
      }
      if (result != Rows::Region)
        noteParams(&op, result);
      // Each tp rank routes its own rows: the runtime counts every rank's expert loads.
      if (isa<moe::DispatchOp>(op) && result == Rows::Shard)
        op.setAttr(moe::kTpRowsAttr, b.getUnitAttr());
      for (Value value : op.getResults())
        if (tokenRows(value))
          rows[value] = result;
    }
    return success();
  }

  moe::ModelOp model;
  OpBuilder b;
  StringAttr tp;
  llvm::DenseMap<Value, Rows> rows;
  llvm::DenseMap<Value, Value> gathers, slices;
  llvm::SetVector<Operation *> layersDone;
  llvm::SetVector<moe::ParamOp> onShards, readWhole;
};

} // namespace

LogicalResult applySequenceParallel(moe::ModelOp model) { return SequenceParallel(model).run(); }

} // namespace moec::passes
