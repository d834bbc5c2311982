//===- TensorParallel.cpp - attention heads, MLPs and experts over tp ----===//
//
// The sharding rules, per op, of a split attention (value states: replicated, split along
// the feature dimension by heads, or a partial sum over the tp ranks):
//   linear(x replicated, W [out, in] split on out)  -> split   (its bias split likewise)
//   lora(x replicated, A, B split on out)           -> split   (A's gradient: partial)
//   rms_norm per head, rope, add of splits          -> split
//   rms_norm of whole rows (every head: OLMoE)      -> split   (moe.sharded_rms_norm: each
//                                                     rank's sum of squares, moe.tp_sum of them)
//   split into groups per head (query and gate)     -> split   (groups / tp)
//   attention(q, k, v split; sinks split)           -> split   (heads / tp each)
//   sigmoid_gate(x split, g split)                  -> split   (an output gate)
//   linear(x split, W split on in, bias b)          -> partial (b held by tp rank 0 alone)
//   lora(x split, A split on in, B)                 -> partial (B's gradient: partial)
//   add of partials                                 -> partial
// A replicated value enters through moe.tp_enter (its gradient is summed over tp) and a
// partial one leaves through moe.tp_exit (the sum over tp) where a replicated value is read.
//
// Latent attention (moe.mla, moe.sparse_attention) splits its heads the same way: query and
// key_value projections split on out; the rotated key part, shared by every head, enters as a
// replicated value (its gradient summed over tp); positions and DSA's selections are integers
// every rank has (the indexer stays whole).
//
// Kimi Delta Attention (moe.kda) splits its heads too: query, key, value, the decay and gate
// (second projections of low-rank pairs whose first projection stays replicated) and the beta
// logits split on out, with the per-channel convolutions, dt_bias and A_log; its per-head
// norm weight is shared (its gradient partial).
//
// Gated DeltaNet (moe.gated_delta_net) splits its key heads (and their value heads): its fused
// projections qkvz and ba hold one group per key head (q, k, v, z; b, a), so a rank's heads are
// one block of rows of in_proj_qkvz and in_proj_ba (split on out); its convolution runs over
// concat(q, k, v) of every head, three parts each split over tp (moe.tp_pieces); A_log and
// dt_bias split with the value heads; the norm weight is shared.
//
// Mamba-2 (moe.mamba2) splits its heads and groups (a head reads its group's B and C): in_proj
// (frozen) in five pieces, its outputs z, x, B, C and dt each split (its adapter whole on every
// rank, each rank's columns of each piece of the adapter's output kept: moe.tp_slice_features);
// the convolution (and its bias) over x, B and C in three; dt_bias, A_log, D by head; the
// grouped norm's weight by group.
//
// Dense MLPs (dense layers, shared experts) split their intermediate features as attention
// splits heads: gate and up projections split on out, moe.glu / moe.activation of splits is
// split, the down projection (and its adapter) split on in gives partial sums.
//
// Routed experts (not split over ep) split their intermediate features the same way:
//   expert_mlp(tokens replicated, up/gate [E, I, D] split on I, down [E, D, I] split on I)
//     -> partial (each rank's share of every expert's output)
//   dispatch(x replicated), combine(partial, weights replicated) -> partial (both linear), so
//     x enters before the dispatch and the sum is taken after the combine.
// gpt-oss's experts ([E, in, out], gate and up interleaved in pairs, biases) split the same
// features: a window of whole (gate, up) pairs and its bias, down's rows; down's bias is held
// by tp rank 0 alone, as an attention's output bias is.
//
//===----------------------------------------------------------------------===//

#include "passes/propagate_sharding/TensorParallel.h"

#include "llvm/ADT/SetVector.h"
#include "llvm/Support/FormatVariadic.h"
#include "mlir/IR/Builders.h"

namespace moec::passes {

namespace {

using namespace mlir;

RankedTensorType tensorType(Value v) { return cast<RankedTensorType>(v.getType()); }

/// What splitting one attention (its heads) or one MLP (its intermediate features) changes;
/// collected before anything changes.
struct HeadSplit {
  moe::AttentionOp attention; // or null: one of the three below
  Operation *mla = nullptr;   // moe.mla or moe.sparse_attention (heads split, key_rope shared)
  moe::KDAOp kda;             // Kimi Delta Attention (heads split with their parameters)
  moe::GatedDeltaNetOp gdn;   // Gated DeltaNet (key heads split, with their value heads)
  moe::Mamba2Op mamba;        // Mamba-2 (heads and groups split)
  Operation *mlp = nullptr;   // an MLP's activation (moe.glu, moe.activation)
  llvm::SetVector<Operation *> region;   // computing q, k, v from replicated values (retyped)
  llvm::SetVector<Operation *> gates;    // after the attention, still split (retyped)
  llvm::SetVector<Value> inputs;         // the replicated values the region's projections read
  struct Split {
    moe::WeightOp weight;
    int dim;
    llvm::SmallVector<int64_t> pieces; // parts of `dim` that split separately (moe.tp_pieces)
  };
  llvm::SmallVector<Split> splits; // weight reads split along a dim
  llvm::SetVector<moe::WeightOp> partialGrads; // replicated weights read by split/partial work
  llvm::SetVector<moe::WeightOp> firstRankBiases; // biases of partial sums: tp rank 0 adds them
  llvm::SetVector<Value> partials;       // partial sums after the attention
  llvm::SetVector<Value> exits;          // partial sums read where the sum is needed
  llvm::SetVector<Operation *> rowNorms; // rms_norms over every head: sharded (their sum over tp)
  struct PieceAdapter {
    moe::LoRAOp lora; // whole on every rank: its output's columns of each piece are sliced
    SmallVector<int64_t> pieces;
  };
  SmallVector<PieceAdapter> pieceAdapters;
};

class Analysis {
public:
  Analysis(moe::AttentionOp attention, int64_t ranks) : ranks(ranks), inputsName("q/k/v") {
    plan.attention = attention;
  }
  /// An MLP: `activation` (moe.glu or moe.activation) of projections of a replicated value;
  /// multi-head latent attention (moe.mla, moe.sparse_attention); or KDA.
  Analysis(Operation *op, int64_t ranks) : ranks(ranks) {
    if (isa<moe::MLAOp, moe::SparseAttentionOp>(op)) {
      plan.mla = op;
      inputsName = "query/key_value";
    } else if (auto kda = dyn_cast<moe::KDAOp>(op)) {
      plan.kda = kda;
      inputsName = "KDA projection";
    } else if (auto gdn = dyn_cast<moe::GatedDeltaNetOp>(op)) {
      plan.gdn = gdn;
      inputsName = "Gated DeltaNet projection";
    } else if (auto mamba = dyn_cast<moe::Mamba2Op>(op)) {
      plan.mamba = mamba;
      inputsName = "Mamba-2 projection";
    } else {
      plan.mlp = op;
      inputsName = "gate/up";
    }
  }

  /// Empty when the attention (or MLP) splits; otherwise why not.
  std::string run() {
    Operation *center = plan.mlp   ? plan.mlp
                        : plan.mla ? plan.mla
                        : plan.gdn ? plan.gdn.getOperation()
                        : plan.mamba ? plan.mamba.getOperation()
                                   : plan.kda.getOperation();
    if (moe::Mamba2Op mamba = plan.mamba) {
      const int64_t h = mamba.getNumHeads(), g = mamba.getNumGroups(), p = mamba.getHeadDim();
      const int64_t n = mamba.getStateSize();
      if (h % ranks || g % ranks)
        return "its " + std::to_string(h) + " heads and " + std::to_string(g) + " groups do not split over tp = " +
               std::to_string(ranks);
      // zxbcdt stacks z, x, B, C and dt: in_proj splits in five pieces. Its adapter, if any,
      // stays whole on every rank (a small product); each rank keeps its columns of the
      // adapter's output (moe.tp_slice_features), so A's and B's gradients are partial.
      const SmallVector<int64_t> pieces = {h * p, h * p, g * n, g * n, h};
      Value zxbcdt = mamba.getZxbcdt();
      auto in = zxbcdt.getDefiningOp<moe::LinearOp>();
      moe::AddOp adapted; // in_proj + its adapter's columns
      if (auto add = zxbcdt.getDefiningOp<moe::AddOp>()) {
        auto base = add.getLhs().getDefiningOp<moe::LinearOp>();
        auto lora = add.getRhs().getDefiningOp<moe::LoRAOp>();
        if (base && lora && base.getInput() == lora.getInput() && base->hasOneUse() && lora->hasOneUse()) {
          if (!addPartialGrad(lora.getLoraA()) || !addPartialGrad(lora.getLoraB()))
            return why;
          in = base;
          adapted = add;
          plan.pieceAdapters.push_back({lora, pieces});
        }
      }
      if (!in || in.getBias())
        return "its in_proj is not one projection without bias (with or without an adapter)";
      if (!addWeight(in.getWeight(), 0, pieces))
        return why;
      plan.inputs.insert(in.getInput());
      plan.region.insert(in);
      if (adapted)
        plan.region.insert(adapted);
      const SmallVector<int64_t> xbc = {h * p, g * n, g * n};
      if (!addWeight(mamba.getConvWeight(), 0, xbc) ||
          (mamba.getConvBias() && !addWeight(mamba.getConvBias(), 0, xbc)) || !addWeight(mamba.getNormWeight(), 0))
        return why;
      for (Value perHead : {mamba.getDtBias(), mamba.getALog(), mamba.getDSkip()}) {
        ArrayRef<int64_t> shape = tensorType(perHead).getShape();
        auto headDim = llvm::find(shape, h);
        if (headDim == shape.end())
          return "a per-head parameter has no dimension of its " + std::to_string(h) + " heads";
        if (!addWeight(perHead, static_cast<int>(headDim - shape.begin())))
          return why;
      }
    } else if (moe::GatedDeltaNetOp gdn = plan.gdn) {
      const int64_t hk = gdn.getNumKeyHeads(), hv = gdn.getNumValueHeads();
      const int64_t dk = gdn.getKeyHeadDim(), dv = gdn.getValueHeadDim();
      if (hk % ranks)
        return "its " + std::to_string(hk) + " key heads do not split over tp = " + std::to_string(ranks);
      for (Value operand : {gdn.getQkvz(), gdn.getBa()}) // one group per key head: a rank's are one block
        if (!intoRegion(operand))
          return why;
      if (!addWeight(gdn.getConvWeight(), 0, {hk * dk, hk * dk, hv * dv}) || !addWeight(gdn.getDtBias(), 0))
        return why;
      ArrayRef<int64_t> aLog = tensorType(gdn.getALog()).getShape();
      auto headDim = llvm::find(aLog, hv);
      if (headDim == aLog.end())
        return "its A_log has no dimension of its " + std::to_string(hv) + " value heads";
      if (!addWeight(gdn.getALog(), static_cast<int>(headDim - aLog.begin())) || !addPartialGrad(gdn.getNormWeight()))
        return why;
    } else if (moe::KDAOp kda = plan.kda) {
      // Every [tokens, heads x ...] operand comes from projections split on out (the low-rank
      // decay and gate: their second projection); the per-channel parameters split with their
      // heads; the norm is shared by every head.
      if (kda.getNumHeads() % ranks)
        return "its " + std::to_string(kda.getNumHeads()) + " heads do not split over tp = " + std::to_string(ranks);
      for (Value operand : {kda.getQuery(), kda.getKey(), kda.getValue(), kda.getDecay(), kda.getBetaLogits(),
                            kda.getGate()})
        if (!intoRegion(operand))
          return why;
      for (Value conv : {kda.getQueryConv(), kda.getKeyConv(), kda.getValueConv(), kda.getDtBias()})
        if (!addWeight(conv, 0))
          return why;
      // A_log holds one value per head in whichever dimension is not 1 ([1, 1, H, 1] in checkpoints).
      ArrayRef<int64_t> aLog = tensorType(kda.getALog()).getShape();
      auto headDim = llvm::find(aLog, kda.getNumHeads());
      if (headDim == aLog.end())
        return "its A_log has no dimension of its " + std::to_string(kda.getNumHeads()) + " heads";
      if (!addWeight(kda.getALog(), static_cast<int>(headDim - aLog.begin())) ||
          !addPartialGrad(kda.getNormWeight()))
        return why;
    } else if (plan.mla) {
      // The query and key_value projections split by heads; the rotated key part is shared by
      // every head (replicated: it enters the region), positions and selections are integers.
      int64_t heads = plan.mla->getAttrOfType<IntegerAttr>("num_heads").getInt();
      if (heads % ranks)
        return "its " + std::to_string(heads) + " heads do not split over tp = " + std::to_string(ranks);
      for (unsigned operand : {0u, 2u}) // query, key_value
        if (!intoRegion(plan.mla->getOperand(operand)))
          return why;
    } else if (moe::AttentionOp attention = plan.attention) {
      center = attention;
      if (attention.getNumHeads() % ranks || attention.getNumKvHeads() % ranks)
        return "its " + std::to_string(attention.getNumHeads()) + " heads and " +
               std::to_string(attention.getNumKvHeads()) + " key/value heads do not split over tp = " +
               std::to_string(ranks);
      // Sinks: one logit per head, split with the heads.
      if (Value sinks = attention.getSinks(); sinks && !addWeight(sinks, 0))
        return why;
      for (Value operand : {attention.getQuery(), attention.getKey(), attention.getValue()})
        if (!intoRegion(operand))
          return why;
    } else {
      if (tensorType(center->getResult(0)).getDimSize(1) % ranks)
        return "its intermediate size does not split over tp = " + std::to_string(ranks);
      for (Value operand : center->getOperands())
        if (!intoRegion(operand))
          return why;
    }
    // Out: output gates keep the heads split; the output projection and its adapter make
    // partial sums; sums of them stay partial.
    llvm::SetVector<Value> split;
    split.insert(center->getResult(0));
    for (size_t i = 0; i < split.size(); ++i)
      for (Operation *user : split[i].getUsers())
        if (auto gate = dyn_cast<moe::SigmoidGateOp>(user)) {
          Operation *from = gate.getGate().getDefiningOp();
          if (!split.contains(gate.getInput()) || !from || !plan.region.contains(from))
            return "an output gate does not gate the attention with its own heads' values";
          plan.gates.insert(gate);
          split.insert(gate.getResult());
        }
    for (Operation *op : plan.region)
      for (Operation *user : op->getUsers())
        if (!plan.region.contains(user) && !plan.gates.contains(user) && user != center)
          return "its " + inputsName + " path (" + op->getName().getStringRef().str() + ") is also read by " +
                 user->getName().getStringRef().str();
    for (Value value : split)
      for (Operation *user : value.getUsers()) {
        if (plan.gates.contains(user))
          continue;
      if (auto linear = dyn_cast<moe::LinearOp>(user)) {
        if (!addWeight(linear.getWeight(), 1) || (linear.getBias() && !addFirstRankBias(linear.getBias())))
          return why;
        plan.partials.insert(linear.getResult());
      } else if (auto lora = dyn_cast<moe::LoRAOp>(user)) {
        if (!addWeight(lora.getLoraA(), 1) || !addPartialGrad(lora.getLoraB()))
          return why;
        plan.partials.insert(lora.getResult());
      } else {
        return "its output goes to " + user->getName().getStringRef().str() + ", not an output projection";
      }
      }
    for (bool grew = true; grew;) {
      grew = false;
      for (Value partial : llvm::SmallVector<Value>(plan.partials.begin(), plan.partials.end()))
        for (Operation *user : partial.getUsers())
          if (auto add = dyn_cast<moe::AddOp>(user))
            if (plan.partials.contains(add.getLhs()) && plan.partials.contains(add.getRhs()))
              grew |= plan.partials.insert(add.getResult());
    }
    for (Value partial : plan.partials)
      for (Operation *user : partial.getUsers())
        if (!(isa<moe::AddOp>(user) && plan.partials.contains(user->getResult(0))))
          plan.exits.insert(partial);
    return "";
  }

  HeadSplit plan;

private:
  bool fail(std::string reason) {
    why = std::move(reason);
    return false;
  }

  /// `pieces`: the parts of `dim` (leading) that split separately, their extents in order.
  bool addWeight(Value read, int dim, llvm::SmallVector<int64_t> pieces = {}) {
    auto weight = read.getDefiningOp<moe::WeightOp>();
    if (!weight)
      return fail("a projection reads a weight that is not a moe.weight");
    auto param = SymbolTable::lookupNearestSymbolFrom<moe::ParamOp>(weight, weight.getParamAttr());
    if (!param || (param.getShardingAttr() && !param.getShardingAttr().isReplicated()))
      return fail("a projection's weight is split already");
    if (param.getTensorType().getDimSize(dim) % ranks)
      return fail("a projection's weight does not split over tp");
    if (!pieces.empty()) {
      int64_t total = 0;
      for (int64_t part : pieces) {
        if (part % ranks)
          return fail("a part of a stacked weight does not split over tp");
        total += part;
      }
      // A trainable one would need its PEFT export and gradients in pieces too.
      if (dim != 0 || total != param.getTensorType().getDimSize(0) || param.getTrainable())
        return fail("a stacked weight's parts do not match its leading dimension, or it is trainable");
    }
    plan.splits.push_back({weight, dim, std::move(pieces)});
    return true;
  }

  /// The bias of a projection whose output is a partial sum: added by tp rank 0 only.
  bool addFirstRankBias(Value read) {
    auto weight = read.getDefiningOp<moe::WeightOp>();
    auto param = weight ? SymbolTable::lookupNearestSymbolFrom<moe::ParamOp>(weight, weight.getParamAttr())
                        : moe::ParamOp();
    if (!param)
      return fail("an output projection's bias is not a moe.weight");
    if (param.getTrainable())
      return fail("an output projection's bias is trainable (each tp rank would add it)");
    plan.firstRankBiases.insert(weight);
    return true;
  }

  bool addPartialGrad(Value read) {
    auto weight = read.getDefiningOp<moe::WeightOp>();
    if (!weight)
      return fail("an adapter reads a weight that is not a moe.weight");
    plan.partialGrads.insert(weight);
    return true;
  }

  /// Traces a split value back to the projections of replicated values.
  bool intoRegion(Value v) {
    Operation *def = v.getDefiningOp();
    if (!def)
      return fail("its " + inputsName + " come straight from a layer argument");
    if (plan.region.contains(def))
      return true;
    if (tensorType(v).getRank() != 2 || tensorType(v).getDimSize(1) % ranks)
      return fail(plan.mlp ? "a gate/up value is not [tokens, features] with features split over tp"
                           : "a " + inputsName + " value is not [tokens, heads x head_dim]");
    if (auto rope = dyn_cast<moe::RopeOp>(def)) {
      if (!intoRegion(rope.getInput()))
        return false;
    } else if (auto norm = dyn_cast<moe::RMSNormOp>(def)) {
      // Per head: the weight is every head's (its gradient partial). Over every head: the weight
      // splits with the heads, and the rows' statistic is summed over tp.
      bool wholeRows = tensorType(norm.getWeight()).getDimSize(0) == tensorType(norm.getInput()).getDimSize(1);
      if (!intoRegion(norm.getInput()) ||
          !(wholeRows ? addWeight(norm.getWeight(), 0) : addPartialGrad(norm.getWeight())))
        return false;
      if (wholeRows)
        plan.rowNorms.insert(norm);
    } else if (auto add = dyn_cast<moe::AddOp>(def)) {
      if (!intoRegion(add.getLhs()) || !intoRegion(add.getRhs()))
        return false;
    } else if (auto parts = dyn_cast<moe::SplitOp>(def)) {
      if (parts.getGroups() % ranks)
        return fail("a projection splits into " + std::to_string(parts.getGroups()) +
                    " groups, which do not split over tp");
      if (!intoRegion(parts.getInput()))
        return false;
    } else if (auto linear = dyn_cast<moe::LinearOp>(def)) {
      // A bias splits with its projection's outputs.
      if (!addWeight(linear.getWeight(), 0) || (linear.getBias() && !addWeight(linear.getBias(), 0)))
        return false;
      plan.inputs.insert(linear.getInput());
    } else if (auto lora = dyn_cast<moe::LoRAOp>(def)) {
      if (!addWeight(lora.getLoraB(), 0) || !addPartialGrad(lora.getLoraA()))
        return false;
      plan.inputs.insert(lora.getInput());
    } else {
      return fail("its " + inputsName + " come from " + def->getName().getStringRef().str() +
                  ", which has no tensor-parallel rule");
    }
    plan.region.insert(def);
    return true;
  }

  int64_t ranks;
  std::string inputsName; // what the traced operands are, in messages
  std::string why;
};

RankedTensorType splitFeatures(Type type, int64_t ranks) {
  auto tensor = cast<RankedTensorType>(type);
  SmallVector<int64_t> shape(tensor.getShape());
  shape[1] /= ranks;
  return RankedTensorType::get(shape, tensor.getElementType());
}

/// Where a region's collectives come from, as their location (--emit=report lists it): "the
/// <count> <what> of @<layer>'s <mixer> split over tp = <ranks><per rank>".
Location splitLocation(Operation *center, int64_t count, llvm::StringRef what, llvm::StringRef mixer, int64_t ranks,
                       llvm::StringRef perRank = "") {
  auto layer = center->getParentOfType<moe::LayerOp>();
  std::string text = llvm::formatv("the {0} {1} of @{2}'s {3} split over tp = {4}{5}", count, what,
                                   layer ? layer.getSymName() : "model", mixer, ranks, perRank)
                         .str();
  return NameLoc::get(StringAttr::get(center->getContext(), text), center->getLoc());
}

std::string perRank(int64_t count, int64_t ranks, llvm::StringRef with = "") {
  return llvm::formatv(" ({0} per rank{1})", count / ranks, with).str();
}

/// An rms_norm over whole rows whose features (every head's) are split over tp: each rank's sum
/// of squares, summed over tp, normalises its features (the norm's result type is split already).
void shardRowNorm(HeadSplit &plan, moe::RMSNormOp norm, int64_t ranks) {
  OpBuilder b(norm);
  Value x = norm.getInput();
  int64_t features = tensorType(x).getDimSize(1) * ranks;
  auto layer = norm->getParentOfType<moe::LayerOp>();
  Location because = NameLoc::get(
      b.getStringAttr(llvm::formatv("the sum of squares of @{0}'s rms_norm over {1} features split over tp = {2}",
                                    layer ? layer.getSymName() : "model", features, ranks)
                          .str()),
      norm.getLoc());
  auto rowType = RankedTensorType::get({ShapedType::kDynamic, 1}, b.getF32Type());
  Value mine = b.create<moe::RowSumOfSquaresOp>(norm.getLoc(), rowType, x);
  Value all = b.create<moe::TpSumOp>(because, mine, b.getStringAttr("tp"));
  auto sharded = b.create<moe::ShardedRMSNormOp>(norm.getLoc(), norm.getType(), x, norm.getWeight(), all,
                                                 norm.getEpsAttr(), b.getI64IntegerAttr(features),
                                                 norm.getUnitOffsetAttr());
  norm.getResult().replaceAllUsesWith(sharded.getResult());
  plan.region.remove(norm); // before the op goes: a new op could take its address
  plan.region.insert(mine.getDefiningOp());
  plan.region.insert(sharded);
  norm.erase();
}

void apply(HeadSplit &plan, int64_t ranks) {
  Operation *center = plan.mlp                   ? plan.mlp
                      : plan.mla                 ? plan.mla
                      : plan.kda.getOperation()  ? plan.kda.getOperation()
                      : plan.gdn.getOperation()  ? plan.gdn.getOperation()
                      : plan.mamba.getOperation() ? plan.mamba.getOperation()
                                                 : plan.attention.getOperation();
  MLIRContext *context = center->getContext();
  OpBuilder b(context);
  StringAttr tp = b.getStringAttr("tp");
  for (HeadSplit::Split &split : plan.splits) {
    auto param = SymbolTable::lookupNearestSymbolFrom<moe::ParamOp>(split.weight, split.weight.getParamAttr());
    SmallVector<StringAttr> dims(param.getTensorType().getRank(), b.getStringAttr(""));
    dims[split.dim] = tp;
    param.setShardingAttr(moe::ShardingAttr::get(context, dims));
    if (!split.pieces.empty())
      param->setAttr(moe::kTpPiecesAttr, b.getDenseI64ArrayAttr(split.pieces));
    split.weight.getResult().setType(param.getLocalType());
  }
  for (moe::WeightOp weight : plan.partialGrads) {
    auto param = SymbolTable::lookupNearestSymbolFrom<moe::ParamOp>(weight, weight.getParamAttr());
    if (param.getTrainable())
      param->setAttr(moe::kTpPartialGradAttr, b.getUnitAttr());
  }
  for (moe::WeightOp weight : plan.firstRankBiases)
    SymbolTable::lookupNearestSymbolFrom<moe::ParamOp>(weight, weight.getParamAttr())
        ->setAttr(moe::kTpFirstRankAttr, b.getUnitAttr());
  for (Operation *op : plan.region) { // inputs before users: the walk inserted them in that order
    for (Value result : op->getResults())
      result.setType(splitFeatures(result.getType(), ranks));
    if (auto parts = dyn_cast<moe::SplitOp>(op))
      parts.setGroups(parts.getGroups() / ranks);
  }
  for (Operation *gate : plan.gates)
    gate->getResult(0).setType(splitFeatures(gate->getResult(0).getType(), ranks));
  // Where the region's collectives come from (their location; --emit=report lists it).
  Location because = center->getLoc();
  if (Operation *mla = plan.mla) {
    int64_t heads = mla->getAttrOfType<IntegerAttr>("num_heads").getInt();
    because = splitLocation(mla, heads, "heads", "latent attention", ranks, perRank(heads, ranks));
    mla->setAttr("num_heads", b.getI64IntegerAttr(heads / ranks));
    for (Value result : mla->getResults()) // the result, and the logsumexp (a column per head)
      result.setType(splitFeatures(result.getType(), ranks));
    // The shared rotated key: each rank's heads give part of its gradient.
    b.setInsertionPoint(mla);
    mla->setOperand(1, b.create<moe::TpEnterOp>(because, mla->getOperand(1), tp).getResult());
  } else if (moe::Mamba2Op mamba = plan.mamba) {
    int64_t heads = mamba.getNumHeads();
    because = splitLocation(mamba, heads, "heads", "Mamba-2 mixer", ranks, perRank(heads, ranks, ", with their groups"));
    mamba.setNumHeads(heads / ranks);
    mamba.setNumGroups(mamba.getNumGroups() / ranks);
    mamba.getResult().setType(splitFeatures(mamba.getResult().getType(), ranks));
  } else if (moe::GatedDeltaNetOp gdn = plan.gdn) {
    int64_t heads = gdn.getNumKeyHeads();
    because = splitLocation(gdn, heads, "key heads", "linear attention (Gated DeltaNet)", ranks,
                            perRank(heads, ranks, ", with their value heads"));
    gdn.setNumKeyHeads(heads / ranks);
    gdn.setNumValueHeads(gdn.getNumValueHeads() / ranks);
    gdn.getResult().setType(splitFeatures(gdn.getResult().getType(), ranks));
  } else if (moe::KDAOp kda = plan.kda) {
    int64_t heads = kda.getNumHeads();
    because = splitLocation(kda, heads, "heads", "linear attention (KDA)", ranks, perRank(heads, ranks));
    kda.setNumHeads(heads / ranks);
    kda.getResult().setType(splitFeatures(kda.getResult().getType(), ranks));
  } else if (moe::AttentionOp attention = plan.attention) {
    because = splitLocation(attention, attention.getNumHeads(), "heads", "attention", ranks,
                            perRank(attention.getNumHeads(), ranks));
    attention.setNumHeads(attention.getNumHeads() / ranks);
    attention.setNumKvHeads(attention.getNumKvHeads() / ranks);
    attention.getResult().setType(splitFeatures(attention.getResult().getType(), ranks));
    if (Value lse = attention.getLogsumexp()) // one column per head
      lse.setType(splitFeatures(lse.getType(), ranks));
  } else {
    Value h = plan.mlp->getResult(0);
    because = splitLocation(plan.mlp, tensorType(h).getDimSize(1), "intermediate features", "MLP", ranks);
    h.setType(splitFeatures(h.getType(), ranks));
  }
  for (Operation *op : plan.rowNorms)
    shardRowNorm(plan, cast<moe::RMSNormOp>(op), ranks);
  for (Value input : plan.inputs) {
    if (Operation *def = input.getDefiningOp())
      b.setInsertionPointAfter(def);
    else
      b.setInsertionPointToStart(cast<BlockArgument>(input).getOwner());
    auto enter = b.create<moe::TpEnterOp>(because, input, tp);
    input.replaceUsesWithIf(enter.getResult(), [&](OpOperand &use) { return plan.region.contains(use.getOwner()); });
  }
  for (HeadSplit::PieceAdapter &adapter : plan.pieceAdapters) {
    moe::LoRAOp lora = adapter.lora;
    auto add = cast<moe::AddOp>(*lora->user_begin());
    lora.getInputMutable().assign(add.getLhs().getDefiningOp<moe::LinearOp>().getInput()); // the entered input
    b.setInsertionPointAfter(lora);
    auto mine = b.create<moe::TpSliceFeaturesOp>(lora.getLoc(), splitFeatures(lora.getType(), ranks), lora.getResult(),
                                                 tp, b.getDenseI64ArrayAttr(adapter.pieces), b.getI64IntegerAttr(ranks));
    add.getRhsMutable().assign(mine.getResult());
  }
  // Narrow (bf16) data: the partial sums stay f32 until the ranks' parts are summed, so the
  // sum is rounded once, as one rank rounds it; where it is added to a narrower value (the
  // residual), moe.add takes the f32 right-hand side.
  Type f32 = b.getF32Type();
  bool widen = llvm::any_of(plan.partials, [](Value partial) {
    return !cast<RankedTensorType>(partial.getType()).getElementType().isF32();
  });
  for (Value partial : plan.exits)
    for (OpOperand &use : partial.getUses()) {
      auto add = dyn_cast<moe::AddOp>(use.getOwner());
      if (!(add && plan.partials.contains(add.getResult())) && !(add && use.getOperandNumber() == 1))
        widen = false;
    }
  if (widen)
    for (Value partial : plan.partials)
      partial.setType(cast<RankedTensorType>(partial.getType()).clone(f32));
  for (Value partial : plan.exits) {
    b.setInsertionPointAfterValue(partial);
    auto exit = b.create<moe::TpExitOp>(because, partial.getType(), partial, tp);
    partial.replaceUsesWithIf(exit.getResult(), [&](OpOperand &use) {
      Operation *user = use.getOwner();
      return user != exit.getOperation() && !(isa<moe::AddOp>(user) && plan.partials.contains(user->getResult(0)));
    });
  }
}

} // namespace

/// Why an expert MLP cannot split its intermediate features over tp ("" when it can).
std::string expertSplitBlocker(moe::ExpertMLPOp mlp, int64_t ranks) {
  if (mlp.getUpLoraA() || mlp.getGateLoraA() || mlp.getDownLoraA())
    return "it has expert adapters";
  for (Value operand : mlp->getOperands().drop_front(2)) {
    auto weight = operand.getDefiningOp<moe::WeightOp>();
    auto param = weight ? SymbolTable::lookupNearestSymbolFrom<moe::ParamOp>(weight, weight.getParamAttr())
                        : moe::ParamOp();
    if (!param)
      return "it reads a weight that is not a moe.weight";
    if (param.getShardingAttr() && !param.getShardingAttr().isReplicated())
      return "its experts are split over ep already";
    // Every rank adds its partial output's share; each would add a trained bias in full.
    if (operand == mlp.getDownBias() && param.getTrainable())
      return "its down projection's bias is trainable";
  }
  // fused_gate_up interleaves gate and up columns in pairs: a rank's window of whole pairs
  // is its intermediate features' gate and up.
  int64_t inter = tensorType(mlp.getUp()).getDimSize(mlp.getInOutLayout() ? 2 : 1) / (mlp.getFusedGateUp() ? 2 : 1);
  if (inter % ranks)
    return "its intermediate size does not split over tp";
  return "";
}

void splitExpertFeatures(moe::ExpertMLPOp mlp, int64_t ranks) {
  MLIRContext *context = mlp.getContext();
  OpBuilder b(context);
  StringAttr tp = b.getStringAttr("tp");
  auto split = [&](Value read, int dim) {
    auto weight = read.getDefiningOp<moe::WeightOp>();
    auto param = SymbolTable::lookupNearestSymbolFrom<moe::ParamOp>(weight, weight.getParamAttr());
    SmallVector<StringAttr> dims(param.getTensorType().getRank(), b.getStringAttr(""));
    dims[dim] = tp;
    param.setShardingAttr(moe::ShardingAttr::get(context, dims));
    weight.getResult().setType(param.getLocalType());
  };
  // The intermediate features: up's and gate's outputs, down's inputs ([E, out, in], or
  // [E, in, out] with in_out_layout), up's bias [E, 2 I] or [E, I].
  bool inOut = mlp.getInOutLayout();
  split(mlp.getUp(), inOut ? 2 : 1);
  if (mlp.getGate())
    split(mlp.getGate(), inOut ? 2 : 1);
  split(mlp.getDown(), inOut ? 1 : 2);
  if (mlp.getUpBias())
    split(mlp.getUpBias(), 1);
  // down's bias is added to a partial sum: tp rank 0 holds it, the others zeros.
  if (Value bias = mlp.getDownBias()) {
    auto weight = bias.getDefiningOp<moe::WeightOp>();
    SymbolTable::lookupNearestSymbolFrom<moe::ParamOp>(weight, weight.getParamAttr())
        ->setAttr(moe::kTpFirstRankAttr, b.getUnitAttr());
  }
  auto layer = mlp->getParentOfType<moe::LayerOp>();
  Location because = NameLoc::get(
      b.getStringAttr(llvm::formatv("the intermediate features of @{0}'s experts split over tp = {1}",
                                    layer ? layer.getSymName() : "model", ranks)
                          .str()),
      mlp.getLoc());
  // Dispatch and combine are linear in the tokens: when they serve only this MLP, the tokens
  // enter before the dispatch and the partial outputs leave after the combine, so both
  // all-reduces (the exit's forward, the enter's backward) carry [tokens, features] instead of
  // top-k copies of every token. The combine's weights then enter too: their gradient from a
  // rank's partial outputs is partial. Where the router reads the dispatched tokens and serves
  // only this dispatch and combine, it reads the entered tokens instead: every rank routes
  // every token the same way (a small product), its weights need no entry of their own, and
  // their partial gradient reaches the tokens' gradient through the router's backward, summed
  // over tp with the dispatch's by the one enter (a collective fewer each way).
  auto dispatch = mlp.getTokens().getDefiningOp<moe::DispatchOp>();
  auto combine = mlp.getResult().hasOneUse() ? dyn_cast<moe::CombineOp>(*mlp->user_begin()) : moe::CombineOp();
  auto router = combine ? combine.getWeights().getDefiningOp<moe::RouterOp>() : moe::RouterOp();
  bool tokensOnly = dispatch && mlp.getTokens().hasOneUse();
  auto onlyFor = [&](Value v, std::initializer_list<Operation *> users) {
    return llvm::all_of(v.getUsers(), [&](Operation *user) { return llvm::is_contained(users, user); });
  };
  bool routeInside = tokensOnly && router && router.getInput() == dispatch.getInput() &&
                     router.getIndices() == dispatch.getIndices() && combine.getIndices() == router.getIndices() &&
                     onlyFor(router.getWeights(), {combine}) && onlyFor(router.getIndices(), {dispatch, combine});
  if (routeInside) {
    b.setInsertionPoint(router);
    auto enter = b.create<moe::TpEnterOp>(because, dispatch.getInput(), tp);
    router.getInputMutable().assign(enter);
    dispatch.getInputMutable().assign(enter);
    // A trainable gate (or logit bias) now gets each rank's partial gradient: summed over tp.
    for (Value read : {router.getWeight(), router.getLogitBias()})
      if (auto weight = read ? read.getDefiningOp<moe::WeightOp>() : moe::WeightOp())
        if (auto param = SymbolTable::lookupNearestSymbolFrom<moe::ParamOp>(weight, weight.getParamAttr());
            param && param.getTrainable())
          param->setAttr(moe::kTpPartialGradAttr, b.getUnitAttr());
  } else if (tokensOnly) {
    b.setInsertionPoint(dispatch);
    dispatch.getInputMutable().assign(b.create<moe::TpEnterOp>(because, dispatch.getInput(), tp));
  } else {
    b.setInsertionPoint(mlp);
    mlp.getTokensMutable().assign(b.create<moe::TpEnterOp>(because, mlp.getTokens(), tp));
  }
  Operation *partial = combine ? combine.getOperation() : mlp.getOperation();
  if (combine && !routeInside) {
    b.setInsertionPoint(combine);
    combine.getWeightsMutable().assign(b.create<moe::TpEnterOp>(because, combine.getWeights(), tp));
  }
  // On narrower data each rank's partial output stays f32, and the sum over tp is rounded once:
  // the rounding one GPU's expert MLP (and combine) makes of its output.
  Type f32 = b.getF32Type();
  auto type = cast<RankedTensorType>(partial->getResult(0).getType());
  if (!type.getElementType().isF32()) {
    mlp.getResult().setType(cast<RankedTensorType>(mlp.getResult().getType()).clone(f32));
    partial->getResult(0).setType(type.clone(f32));
  }
  b.setInsertionPointAfter(partial);
  auto exit = b.create<moe::TpExitOp>(because, type, partial->getResult(0), tp);
  partial->getResult(0).replaceAllUsesExcept(exit.getResult(), exit);
}

/// One moe.tp_enter per value and axis: a value two split regions read (the normed tokens of a
/// shared expert and of the routed experts) has its gradients from both summed over tp by one
/// all-reduce in the backward.
void mergeEnters(moe::ModelOp model) {
  llvm::DenseMap<std::pair<Value, Attribute>, moe::TpEnterOp> first;
  SmallVector<moe::TpEnterOp> enters;
  model.walk([&](moe::TpEnterOp enter) { enters.push_back(enter); });
  for (moe::TpEnterOp enter : enters) { // walk order: each block's ops in order
    auto [it, inserted] = first.try_emplace({enter.getInput(), enter.getAxisAttr()}, enter);
    if (inserted || it->second->getBlock() != enter->getBlock())
      continue;
    enter.getResult().replaceAllUsesWith(it->second.getResult());
    enter.erase();
  }
}

/// add(tp_exit(a), tp_exit(b)) -> tp_exit(add(a, b)): two partial sums read only by their sum
/// (a shared expert's and the routed experts' outputs) summed over tp by one all-reduce; on
/// narrower data the partials are f32 and the sum is rounded once.
void mergeExits(moe::ModelOp model) {
  SmallVector<moe::AddOp> adds;
  model.walk([&](moe::AddOp add) { adds.push_back(add); });
  for (moe::AddOp add : adds) {
    auto lhs = add.getLhs().getDefiningOp<moe::TpExitOp>(), rhs = add.getRhs().getDefiningOp<moe::TpExitOp>();
    if (!lhs || !rhs || lhs == rhs || !lhs->hasOneUse() || !rhs->hasOneUse() ||
        lhs.getAxis() != rhs.getAxis() || lhs.getInput().getType() != rhs.getInput().getType())
      continue;
    OpBuilder b(add);
    auto sum = b.create<moe::AddOp>(add.getLoc(), lhs.getInput(), rhs.getInput());
    auto exit = b.create<moe::TpExitOp>(lhs.getLoc(), add.getType(), sum.getResult(), lhs.getAxisAttr());
    add.getResult().replaceAllUsesWith(exit.getResult());
    add.erase();
    lhs.erase();
    rhs.erase();
  }
}

/// The kind tp-replicate names `center` by ("" for an op that is no region's centre).
static llvm::StringRef regionKind(Operation *center) {
  if (isa<moe::AttentionOp>(center))
    return "attention";
  if (isa<moe::MLAOp, moe::SparseAttentionOp>(center))
    return "latent-attention";
  if (isa<moe::KDAOp, moe::GatedDeltaNetOp, moe::Mamba2Op>(center))
    return "linear-attention";
  if (isa<moe::ExpertMLPOp>(center))
    return "experts";
  if (isa<moe::GluOp, moe::ActivationOp>(center))
    return "mlp";
  return "";
}

LogicalResult annotateReplicated(moe::ModelOp model, llvm::ArrayRef<std::string> kinds) {
  static constexpr llvm::StringLiteral known[] = {"attention", "latent-attention", "linear-attention", "mlp",
                                                  "experts"};
  for (const std::string &kind : kinds)
    if (!llvm::is_contained(known, kind))
      return model.emitError("--moe-propagate-sharding: tp-replicate names '")
             << kind << "'; expected a comma-separated list of attention, latent-attention, linear-attention, mlp, "
                        "experts";
  UnitAttr unit = UnitAttr::get(model.getContext());
  model.walk([&](Operation *op) {
    llvm::StringRef kind = regionKind(op);
    if (!kind.empty() && llvm::is_contained(kinds, kind.str()))
      op->setAttr(moe::kTpReplicatedAttr, unit);
  });
  return success();
}

FailureOr<HeadSplitReport> splitAttentionHeads(moe::ModelOp model, int64_t ranks) {
  HeadSplitReport report;
  auto nameOf = [](Operation *center, llvm::StringRef what) {
    auto layer = center->getParentOfType<moe::LayerOp>();
    return (layer ? layer.getSymName().str() : std::string("the model")) + " (" + what.str() + ")";
  };
  // Grouped-query and latent attention, dense MLPs: each region split by the rules above, or
  // kept whole with the reason (or as the user's annotation asks).
  auto splitRegion = [&](Analysis analysis, Operation *center, llvm::StringRef what) {
    std::string name = nameOf(center, what);
    if (center->hasAttr(moe::kTpReplicatedAttr)) {
      report.replicated.push_back(name);
      return;
    }
    std::string why = analysis.run();
    if (!why.empty()) {
      report.kept.push_back({name, why});
      return;
    }
    apply(analysis.plan, ranks);
    report.split.push_back(name);
  };
  SmallVector<moe::AttentionOp> attentions;
  SmallVector<Operation *> latents, kdas;
  model.walk([&](Operation *op) {
    if (auto attention = dyn_cast<moe::AttentionOp>(op))
      attentions.push_back(attention);
    else if (isa<moe::MLAOp, moe::SparseAttentionOp>(op))
      latents.push_back(op);
    else if (isa<moe::KDAOp, moe::GatedDeltaNetOp, moe::Mamba2Op>(op))
      kdas.push_back(op);
  });
  for (moe::AttentionOp attention : attentions)
    splitRegion(Analysis(attention, ranks), attention, "attention");
  for (Operation *mla : latents)
    splitRegion(Analysis(mla, ranks), mla, "latent attention");
  for (Operation *mixer : kdas)
    splitRegion(Analysis(mixer, ranks), mixer, isa<moe::Mamba2Op>(mixer) ? "Mamba-2 mixer" : "linear attention");
  SmallVector<moe::ExpertMLPOp> mlps;
  model.walk([&](moe::ExpertMLPOp op) { mlps.push_back(op); });
  for (moe::ExpertMLPOp mlp : mlps) {
    std::string name = nameOf(mlp, "experts");
    if (mlp->hasAttr(moe::kTpReplicatedAttr)) {
      report.replicated.push_back(name);
      continue;
    }
    std::string why = expertSplitBlocker(mlp, ranks);
    if (!why.empty()) {
      if (!llvm::StringRef(why).ends_with("split over ep already")) // with ep, experts split there instead
        report.kept.push_back({name, why});
      continue;
    }
    splitExpertFeatures(mlp, ranks);
    report.split.push_back(name);
  }
  // Dense MLPs (a dense layer's, the shared experts'): an activation of projections whose
  // output a projection reads.
  SmallVector<Operation *> activations;
  model.walk([&](Operation *op) {
    if (isa<moe::GluOp, moe::ActivationOp>(op) &&
        llvm::any_of(op->getUsers(), [](Operation *user) { return isa<moe::LinearOp>(user); }))
      activations.push_back(op);
  });
  for (Operation *activation : activations)
    splitRegion(Analysis(activation, ranks), activation, "mlp");
  mergeEnters(model);
  mergeExits(model);
  // The annotations are decided (EmitPlan leaves any that stay, with no tp split, out of kernel attributes).
  model.walk([](Operation *op) { op->removeAttr(moe::kTpReplicatedAttr); });
  return report;
}

} // namespace moec::passes
