//===- MoeVerifiers.cpp - shape, head-count and dtype checks of compute ops ===//
//
// Every check names the operand or attribute at fault and what was expected,
// so a config that imports into inconsistent IR fails with a useful message.
//
//===----------------------------------------------------------------------===//

#include "dialects/moe/MoeOps.h"

using namespace mlir;

namespace moec::moe {
namespace {

RankedTensorType tensorType(Value v) { return cast<RankedTensorType>(v.getType()); }

/// Emits the first failed check of an op; each method returns whether it held.
class Checker {
public:
  explicit Checker(Operation *op) : op(op) {}

  bool rank(StringRef name, Value v, int64_t expected) {
    if (tensorType(v).getRank() == expected)
      return true;
    op->emitOpError() << name << " must have rank " << expected << ", got " << v.getType();
    return false;
  }

  bool minRank(StringRef name, Value v, int64_t min) {
    if (tensorType(v).getRank() >= min)
      return true;
    op->emitOpError() << name << " must have rank at least " << min << ", got " << v.getType();
    return false;
  }

  /// Dimension `d` of `v` equals `expected`; a dynamic size matches anything.
  bool dim(StringRef name, Value v, int64_t d, int64_t expected, StringRef meaning) {
    int64_t size = tensorType(v).getDimSize(d);
    if (ShapedType::isDynamic(size) || ShapedType::isDynamic(expected) || size == expected)
      return true;
    op->emitOpError() << name << " dimension " << d << " must be " << expected << " (" << meaning
                      << "), got " << size;
    return false;
  }

  /// The same dimension size in two values (token counts, hidden sizes).
  bool sameDim(StringRef a, Value va, int64_t da, StringRef b, Value vb, int64_t db) {
    return dim(b, vb, db, tensorType(va).getDimSize(da), (a + " dimension " + Twine(da)).str());
  }

  bool positive(StringRef name, int64_t value) {
    if (value > 0)
      return true;
    op->emitOpError() << name << " must be positive, got " << value;
    return false;
  }

  bool divides(StringRef what, int64_t value, StringRef by, int64_t divisor) {
    if (divisor > 0 && !ShapedType::isDynamic(value) && value % divisor == 0)
      return true;
    if (ShapedType::isDynamic(value))
      return true;
    op->emitOpError() << what << " (" << value << ") must be a multiple of " << by << " ("
                      << divisor << ")";
    return false;
  }

  bool sameElementType(StringRef a, Value va, StringRef b, Value vb) {
    Type ta = tensorType(va).getElementType(), tb = tensorType(vb).getElementType();
    if (ta == tb)
      return true;
    op->emitOpError() << b << " element type " << tb << " differs from " << a << " element type "
                      << ta;
    return false;
  }

  bool numElements(StringRef name, Value v, int64_t expected, StringRef meaning) {
    RankedTensorType type = tensorType(v);
    if (!type.hasStaticShape() || type.getNumElements() == expected)
      return true;
    op->emitOpError() << name << " must have " << expected << " elements (" << meaning << "), got "
                      << v.getType();
    return false;
  }

private:
  Operation *op;
};

/// Activations are [tokens, features] with the input's element type.
bool activation(Checker &c, StringRef name, Value v, Value like, StringRef likeName) {
  return c.rank(name, v, 2) && c.sameDim(likeName, like, 0, name, v, 0) &&
         c.sameElementType(likeName, like, name, v);
}

bool positions(Checker &c, Value pos, Value like) {
  return c.rank("positions", pos, 1) && c.sameDim("input", like, 0, "positions", pos, 0);
}

bool ropeFits(Operation *op, RopeAttr rope, int64_t headDim, StringRef headName) {
  if (!rope)
    return true;
  if (rope.getDim() <= 0 || rope.getDim() % 2 != 0 || rope.getDim() > headDim) {
    op->emitOpError() << "rope dim (" << rope.getDim() << ") must be even, positive and at most "
                      << headName << " (" << headDim << ")";
    return false;
  }
  return true;
}

/// MLA and sparse attention share their operands.
/// An attention's optional logsumexp result: [tokens, num_heads] (f32 by its ODS type).
template <typename OpTy> LogicalResult verifyLogsumexp(OpTy op) {
  Checker c(op);
  Value lse = op.getLogsumexp();
  return success(!lse || (c.rank("logsumexp", lse, 2) &&
                          c.sameDim("query", op.getQuery(), 0, "logsumexp", lse, 0) &&
                          c.dim("logsumexp", lse, 1, op.getNumHeads(), "num_heads")));
}

template <typename OpTy>
LogicalResult verifyMLA(OpTy op) {
  Checker c(op);
  int64_t h = op.getNumHeads(), nope = op.getQkNopeHeadDim(), rope = op.getQkRopeHeadDim(),
          v = op.getVHeadDim();
  return success(
      c.positive("num_heads", h) && c.positive("v_head_dim", v) &&
      c.rank("query", op.getQuery(), 2) &&
      c.dim("query", op.getQuery(), 1, h * (nope + rope), "num_heads * (qk_nope + qk_rope)") &&
      activation(c, "key_rope", op.getKeyRope(), op.getQuery(), "query") &&
      c.dim("key_rope", op.getKeyRope(), 1, rope, "qk_rope_head_dim") &&
      activation(c, "key_value", op.getKeyValue(), op.getQuery(), "query") &&
      c.dim("key_value", op.getKeyValue(), 1, h * (nope + v), "num_heads * (qk_nope + v_head)") &&
      positions(c, op.getPositions(), op.getQuery()) &&
      activation(c, "result", op.getResult(), op.getQuery(), "query") &&
      c.dim("result", op.getResult(), 1, h * v, "num_heads * v_head_dim") &&
      (!op.getRopeAttr() || op.getRopeAttr().getDim() == rope ||
       (op.emitOpError() << "rope dim (" << op.getRopeAttr().getDim()
                         << ") must equal qk_rope_head_dim (" << rope << ")",
        false)));
}

/// A short causal depthwise convolution weight: [channels, 1, kernel].
bool convWeight(Checker &c, StringRef name, Value w, int64_t channels) {
  return c.rank(name, w, 3) && c.dim(name, w, 0, channels, "channels") &&
         c.dim(name, w, 1, 1, "depthwise");
}

} // namespace

LogicalResult EmbeddingOp::verify() {
  Checker c(*this);
  return success(c.rank("ids", getIds(), 1) && c.rank("table", getTable(), 2) &&
                 c.rank("result", getResult(), 2) &&
                 c.sameDim("ids", getIds(), 0, "result", getResult(), 0) &&
                 c.sameDim("table", getTable(), 1, "result", getResult(), 1) &&
                 c.sameElementType("table", getTable(), "result", getResult()));
}

LogicalResult RMSNormOp::verify() {
  Checker c(*this);
  RankedTensorType in = tensorType(getInput());
  if (!c.minRank("input", getInput(), 1))
    return failure();
  return success(c.rank("weight", getWeight(), 1) &&
                 c.divides("input feature size", in.getDimSize(in.getRank() - 1), "weight size",
                           tensorType(getWeight()).getDimSize(0)) &&
                 (getResult().getType() == in ||
                  (emitOpError() << "result type " << getResult().getType()
                                 << " differs from input type " << in,
                   false)));
}

/// A sharded RMSNorm's statistic: one f32 value per row of `like` ([T, 1]).
static bool rowSumOfSquares(Checker &c, Operation *op, StringRef name, Value v, Value like) {
  if (!c.rank(name, v, 2) || !c.sameDim("input", like, 0, name, v, 0) || !c.dim(name, v, 1, 1, "one per row"))
    return false;
  if (tensorType(v).getElementType().isF32())
    return true;
  op->emitOpError() << name << " must be f32, got " << v.getType();
  return false;
}

LogicalResult RowSumOfSquaresOp::verify() {
  Checker c(*this);
  return success(c.rank("input", getInput(), 2) && rowSumOfSquares(c, *this, "result", getResult(), getInput()));
}

LogicalResult ShardedRMSNormOp::verify() {
  Checker c(*this);
  RankedTensorType in = tensorType(getInput());
  if (!c.rank("input", getInput(), 2) || !c.rank("weight", getWeight(), 1) ||
      !c.dim("weight", getWeight(), 0, in.getDimSize(1), "the input's features") ||
      !rowSumOfSquares(c, *this, "sum_of_squares", getSumOfSquares(), getInput()) ||
      !c.divides("features", getFeatures(), "the input's features", in.getDimSize(1)))
    return failure();
  if (getResult().getType() != in)
    return emitOpError() << "result type " << getResult().getType() << " differs from input type " << in;
  return success();
}

LogicalResult LayerNormOp::verify() {
  Checker c(*this);
  RankedTensorType in = tensorType(getInput());
  if (!c.minRank("input", getInput(), 1))
    return failure();
  int64_t features = in.getDimSize(in.getRank() - 1);
  return success(c.rank("weight", getWeight(), 1) && c.rank("bias", getBias(), 1) &&
                 c.dim("weight", getWeight(), 0, features, "input features") &&
                 c.dim("bias", getBias(), 0, features, "input features") &&
                 (getResult().getType() == in ||
                  (emitOpError() << "result type " << getResult().getType()
                                 << " differs from input type " << in,
                   false)));
}

LogicalResult LinearOp::verify() {
  Checker c(*this);
  RankedTensorType in = tensorType(getInput()), out = tensorType(getResult());
  if (!c.minRank("input", getInput(), 1))
    return failure();
  int64_t last = in.getRank() - 1;
  if (!(c.rank("weight", getWeight(), 2) && c.rank("result", getResult(), in.getRank()) &&
        c.dim("weight", getWeight(), 1, in.getDimSize(last), "input features") &&
        c.dim("result", getResult(), last, tensorType(getWeight()).getDimSize(0),
              "weight output features") &&
        c.sameElementType("input", getInput(), "weight", getWeight()) &&
        // An f32 result on narrower data: a tensor-parallel rank's partial sum, kept exact
        // until the ranks' parts are summed.
        (out.getElementType().isF32() || c.sameElementType("input", getInput(), "result", getResult()))))
    return failure();
  for (int64_t d = 0; d < last; ++d)
    if (!c.dim("result", getResult(), d, in.getDimSize(d), "input"))
      return failure();
  if (getBias() && !(c.rank("bias", getBias(), 1) &&
                     c.dim("bias", getBias(), 0, out.getDimSize(last), "output features")))
    return failure();
  return success();
}


LogicalResult GluOp::verify() {
  if (getKind() == Activation::clamped_swiglu)
    return emitOpError("clamped_swiglu is an expert activation (moe.expert_mlp), not a moe.glu");
  return success();
}

LogicalResult SigmoidGateOp::verify() {
  Checker c(*this);
  RankedTensorType in = tensorType(getInput()), gate = tensorType(getGate());
  if (getResult().getType() != in)
    return emitOpError("result type ") << getResult().getType() << " differs from input type "
                                       << in;
  if (gate == in)
    return success();
  return success(c.rank("input", getInput(), 2) &&
                 activation(c, "gate", getGate(), getInput(), "input") &&
                 c.dim("gate", getGate(), 1, 1, "one gate per token, or one per feature"));
}

LogicalResult SplitOp::verify() {
  Checker c(*this);
  ArrayRef<int64_t> sizes = getSizes();
  if (sizes.size() != getResults().size())
    return emitOpError("has ") << sizes.size() << " sizes but " << getResults().size()
                               << " results";
  if (!c.rank("input", getInput(), 2) || !c.positive("groups", getGroups()))
    return failure();
  int64_t total = 0;
  for (auto [i, size] : llvm::enumerate(sizes)) {
    if (!c.positive("size", size) ||
        !activation(c, ("result #" + Twine(i)).str(), getResults()[i], getInput(), "input") ||
        !c.dim(("result #" + Twine(i)).str(), getResults()[i], 1, size * getGroups(),
               "size * groups"))
      return failure();
    total += size;
  }
  return success(c.dim("input", getInput(), 1, total * getGroups(), "sum(sizes) * groups"));
}

LogicalResult RopeOp::verify() {
  Checker c(*this);
  return success(c.rank("input", getInput(), 2) && c.positive("head_dim", getHeadDim()) &&
                 c.divides("input features", tensorType(getInput()).getDimSize(1), "head_dim",
                           getHeadDim()) &&
                 positions(c, getPositions(), getInput()) &&
                 ropeFits(*this, getRope(), getHeadDim(), "head_dim") &&
                 (getResult().getType() == getInput().getType() ||
                  (emitOpError("result type must equal the input type"), false)));
}

LogicalResult AttentionOp::verify() {
  Checker c(*this);
  int64_t h = getNumHeads(), kv = getNumKvHeads(), d = getHeadDim();
  if (!(c.positive("num_heads", h) && c.positive("num_kv_heads", kv) &&
        c.positive("head_dim", d) && c.divides("num_heads", h, "num_kv_heads", kv) &&
        c.rank("query", getQuery(), 2) && c.dim("query", getQuery(), 1, h * d, "num_heads * head_dim") &&
        activation(c, "key", getKey(), getQuery(), "query") &&
        c.dim("key", getKey(), 1, kv * d, "num_kv_heads * head_dim") &&
        activation(c, "value", getValue(), getQuery(), "query")))
    return failure();
  int64_t vFeatures = tensorType(getValue()).getDimSize(1);
  if (!(c.divides("value features", vFeatures, "num_kv_heads", kv) &&
        activation(c, "result", getResult(), getQuery(), "query")))
    return failure();
  if (!ShapedType::isDynamic(vFeatures) &&
      !c.dim("result", getResult(), 1, h * (vFeatures / kv), "num_heads * value head dim"))
    return failure();
  if (getSinks() && !(c.rank("sinks", getSinks(), 1) &&
                      c.dim("sinks", getSinks(), 0, h, "one sink logit per head")))
    return failure();
  if (getSlidingWindow() && !c.positive("sliding_window", *getSlidingWindow()))
    return failure();
  return verifyLogsumexp(*this);
}

LogicalResult MLAOp::verify() {
  if (failed(verifyMLA(*this)))
    return failure();
  return verifyLogsumexp(*this);
}

LogicalResult SparseAttentionOp::verify() {
  if (failed(verifyMLA(*this)))
    return failure();
  Checker c(*this);
  if (!(c.rank("indices", getIndices(), 2) && c.sameDim("query", getQuery(), 0, "indices", getIndices(), 0)))
    return failure();
  return verifyLogsumexp(*this);
}

LogicalResult DSAIndexerOp::verify() {
  Checker c(*this);
  int64_t h = getNumHeads(), d = getHeadDim();
  return success(c.positive("num_heads", h) && c.positive("head_dim", d) &&
                 c.positive("topk", getTopk()) && c.rank("query", getQuery(), 2) &&
                 c.dim("query", getQuery(), 1, h * d, "num_heads * head_dim") &&
                 activation(c, "key", getKey(), getQuery(), "query") &&
                 c.dim("key", getKey(), 1, d, "head_dim") &&
                 activation(c, "head_weights", getHeadWeights(), getQuery(), "query") &&
                 c.dim("head_weights", getHeadWeights(), 1, h, "num_heads") &&
                 positions(c, getPositions(), getQuery()) &&
                 ropeFits(*this, getRope(), d, "head_dim") &&
                 c.rank("indices", getIndices(), 2) &&
                 c.sameDim("query", getQuery(), 0, "indices", getIndices(), 0) &&
                 c.dim("indices", getIndices(), 1, getTopk(), "topk"));
}

LogicalResult GatedDeltaNetOp::verify() {
  Checker c(*this);
  int64_t hk = getNumKeyHeads(), hv = getNumValueHeads(), dk = getKeyHeadDim(),
          dv = getValueHeadDim();
  return success(
      c.positive("num_key_heads", hk) && c.positive("num_value_heads", hv) &&
      c.positive("key_head_dim", dk) && c.positive("value_head_dim", dv) &&
      c.divides("num_value_heads", hv, "num_key_heads", hk) && c.rank("qkvz", getQkvz(), 2) &&
      c.dim("qkvz", getQkvz(), 1, 2 * hk * dk + 2 * hv * dv, "2*Hk*dk + 2*Hv*dv") &&
      activation(c, "ba", getBa(), getQkvz(), "qkvz") &&
      c.dim("ba", getBa(), 1, 2 * hv, "2 * num_value_heads") &&
      convWeight(c, "conv_weight", getConvWeight(), 2 * hk * dk + hv * dv) &&
      c.numElements("a_log", getALog(), hv, "one per value head") &&
      c.numElements("dt_bias", getDtBias(), hv, "one per value head") &&
      c.numElements("norm_weight", getNormWeight(), dv, "value_head_dim") &&
      activation(c, "result", getResult(), getQkvz(), "qkvz") &&
      c.dim("result", getResult(), 1, hv * dv, "num_value_heads * value_head_dim"));
}

LogicalResult KDAOp::verify() {
  Checker c(*this);
  int64_t h = getNumHeads(), d = getHeadDim(), width = h * d;
  return success(
      c.positive("num_heads", h) && c.positive("head_dim", d) && c.rank("query", getQuery(), 2) &&
      c.dim("query", getQuery(), 1, width, "num_heads * head_dim") &&
      activation(c, "key", getKey(), getQuery(), "query") &&
      c.dim("key", getKey(), 1, width, "num_heads * head_dim") &&
      activation(c, "value", getValue(), getQuery(), "query") &&
      c.dim("value", getValue(), 1, width, "num_heads * head_dim") &&
      convWeight(c, "query_conv", getQueryConv(), width) &&
      convWeight(c, "key_conv", getKeyConv(), width) &&
      convWeight(c, "value_conv", getValueConv(), width) &&
      activation(c, "decay", getDecay(), getQuery(), "query") &&
      c.dim("decay", getDecay(), 1, width, "one decay per key channel") &&
      activation(c, "beta_logits", getBetaLogits(), getQuery(), "query") &&
      c.dim("beta_logits", getBetaLogits(), 1, h, "one beta per head") &&
      activation(c, "gate", getGate(), getQuery(), "query") &&
      c.dim("gate", getGate(), 1, width, "num_heads * head_dim") &&
      c.numElements("a_log", getALog(), h, "one per head") &&
      c.numElements("dt_bias", getDtBias(), width, "one per key channel") &&
      c.numElements("norm_weight", getNormWeight(), d, "head_dim") &&
      activation(c, "result", getResult(), getQuery(), "query") &&
      c.dim("result", getResult(), 1, width, "num_heads * head_dim"));
}

LogicalResult Mamba2Op::verify() {
  Checker c(*this);
  int64_t h = getNumHeads(), p = getHeadDim(), n = getStateSize(), g = getNumGroups();
  int64_t inner = h * p, convChannels = inner + 2 * g * n;
  if (!(c.positive("num_heads", h) && c.positive("head_dim", p) &&
        c.positive("state_size", n) && c.positive("num_groups", g) &&
        c.positive("chunk_size", getChunkSize()) &&
        c.divides("num_heads", h, "num_groups", g) && c.rank("zxbcdt", getZxbcdt(), 2) &&
        c.dim("zxbcdt", getZxbcdt(), 1, 2 * inner + 2 * g * n + h, "2*H*p + 2*G*N + H") &&
        convWeight(c, "conv_weight", getConvWeight(), convChannels) &&
        c.numElements("dt_bias", getDtBias(), h, "one per head") &&
        c.numElements("a_log", getALog(), h, "one per head") &&
        c.numElements("d_skip", getDSkip(), h, "one per head") &&
        c.numElements("norm_weight", getNormWeight(), inner, "num_heads * head_dim") &&
        activation(c, "result", getResult(), getZxbcdt(), "zxbcdt") &&
        c.dim("result", getResult(), 1, inner, "num_heads * head_dim")))
    return failure();
  if (getConvBias() && !c.numElements("conv_bias", getConvBias(), convChannels, "conv channels"))
    return failure();
  return success();
}

LogicalResult RouterOp::verify() {
  Checker c(*this);
  if (!(c.rank("input", getInput(), 2) && c.rank("weight", getWeight(), 2) &&
        c.dim("weight", getWeight(), 1, tensorType(getInput()).getDimSize(1), "input features")))
    return failure();
  int64_t e = getNumExperts(), k = getTopK(), groups = getNGroup(), keep = getTopkGroup();
  if (!c.positive("top_k", k) || !c.positive("n_group", groups) ||
      !c.positive("topk_group", keep))
    return failure();
  if (k > e)
    return emitOpError("top_k (") << k << ") must not exceed the number of experts (" << e << ")";
  if (!c.divides("number of experts", e, "n_group", groups))
    return failure();
  if (keep > groups)
    return emitOpError("topk_group (") << keep << ") must not exceed n_group (" << groups << ")";
  if (k > keep * (e / groups))
    return emitOpError("top_k (") << k << ") exceeds the " << keep * (e / groups)
                                  << " experts in the topk_group best groups";
  if (getScoring() != RouterScoring::sigmoid && (groups != 1 || getCorrectionBias()))
    return emitOpError("group-limited selection and correction_bias need sigmoid scoring");
  if (getCorrectionBias() && !c.numElements("correction_bias", getCorrectionBias(), e, "one per expert"))
    return failure();
  if (getLogitBias() && !c.numElements("logit_bias", getLogitBias(), e, "one per expert"))
    return failure();
  for (Value out : {getWeights(), getIndices()})
    if (!(c.rank("result", out, 2) && c.sameDim("input", getInput(), 0, "result", out, 0) &&
          c.dim("result", out, 1, k, "top_k")))
      return failure();
  return success();
}

LogicalResult DispatchOp::verify() {
  Checker c(*this);
  return success(c.rank("input", getInput(), 2) && c.rank("indices", getIndices(), 2) &&
                 c.sameDim("input", getInput(), 0, "indices", getIndices(), 0) &&
                 c.rank("tokens", getTokens(), 2) &&
                 c.sameDim("input", getInput(), 1, "tokens", getTokens(), 1) &&
                 c.sameElementType("input", getInput(), "tokens", getTokens()) &&
                 c.rank("counts", getCounts(), 1) &&
                 c.dim("counts", getCounts(), 0, getNumExperts(), "num_experts"));
}

/// Per-expert adapters: A [E, r, in] and B [E, out, r] for each adapted projection.
static LogicalResult verifyExpertLoRA(ExpertMLPOp op, Checker &c, int64_t e, int64_t d,
                                     int64_t inter) {
  struct Adapter {
    const char *name;
    Value a, b;
    int64_t in, out;
  };
  Adapter adapters[] = {{"gate_lora", op.getGateLoraA(), op.getGateLoraB(), d, inter},
                        {"up_lora", op.getUpLoraA(), op.getUpLoraB(), d, inter},
                        {"down_lora", op.getDownLoraA(), op.getDownLoraB(), inter, d}};
  int64_t rank = ShapedType::kDynamic;
  bool any = false;
  for (const Adapter &adapter : adapters) {
    if (!adapter.a)
      continue;
    any = true;
    if (op.getFusedGateUp() || op.getInOutLayout())
      return op.emitOpError("expert LoRA needs separate [out, in] expert weights, not fused_gate_up "
                         "or in_out_layout");
    std::string a = std::string(adapter.name) + " A", b = std::string(adapter.name) + " B";
    if (!(c.rank(a.c_str(), adapter.a, 3) && c.rank(b.c_str(), adapter.b, 3)))
      return failure();
    if (ShapedType::isDynamic(rank))
      rank = tensorType(adapter.a).getDimSize(1);
    if (!(c.dim(a.c_str(), adapter.a, 0, e, "number of experts") &&
          c.dim(a.c_str(), adapter.a, 1, rank, "LoRA rank") &&
          c.dim(a.c_str(), adapter.a, 2, adapter.in, "projection inputs") &&
          c.dim(b.c_str(), adapter.b, 0, e, "number of experts") &&
          c.dim(b.c_str(), adapter.b, 1, adapter.out, "projection outputs") &&
          c.dim(b.c_str(), adapter.b, 2, rank, "LoRA rank")))
      return failure();
  }
  if (op.getGateLoraA() && !op.getGate())
    return op.emitOpError("gate_lora needs a gate projection");
  if (any != static_cast<bool>(op.getLoraScaleAttr()))
    return op.emitOpError(any ? "expert LoRA needs lora_scale" : "lora_scale without expert LoRA");
  return success();
}

LogicalResult ExpertMLPOp::verify() {
  Checker c(*this);
  if (!(c.rank("tokens", getTokens(), 2) && c.rank("up", getUp(), 3) &&
        c.rank("down", getDown(), 3) && c.rank("counts", getCounts(), 1)))
    return failure();
  int64_t e = getNumExperts(), d = tensorType(getTokens()).getDimSize(1);
  bool inOut = getInOutLayout();
  // [E, out, in] per expert, or [E, in, out] for in_out_layout.
  int64_t inDim = inOut ? 1 : 2, outDim = inOut ? 2 : 1;
  int64_t upOut = tensorType(getUp()).getDimSize(outDim);
  int64_t inter = getFusedGateUp() ? upOut / 2 : upOut;
  if (getFusedGateUp() && !ShapedType::isDynamic(upOut) && upOut % 2 != 0)
    return emitOpError("fused_gate_up needs an even number of up outputs (gate and up "
                       "interleaved), got ")
           << upOut;
  if (!(c.dim("counts", getCounts(), 0, e, "number of experts") &&
        c.dim("up", getUp(), inDim, d, "token features") &&
        c.dim("down", getDown(), 0, e, "number of experts") &&
        c.dim("down", getDown(), inDim, inter, "expert intermediate size") &&
        c.dim("down", getDown(), outDim, d, "token features") &&
        (tensorType(getResult()).getElementType().isF32() // a tp rank's partial output, kept exact
             ? c.rank("result", getResult(), 2) && c.sameDim("tokens", getTokens(), 0, "result", getResult(), 0)
             : activation(c, "result", getResult(), getTokens(), "tokens")) &&
        c.dim("result", getResult(), 1, d, "token features")))
    return failure();
  if (getGate()) {
    if (getFusedGateUp())
      return emitOpError("a separate gate operand cannot be combined with fused_gate_up");
    if (!(c.rank("gate", getGate(), 3) && c.dim("gate", getGate(), 0, e, "number of experts") &&
          c.dim("gate", getGate(), outDim, inter, "expert intermediate size") &&
          c.dim("gate", getGate(), inDim, d, "token features")))
      return failure();
  }
  bool gated = getGate() || getFusedGateUp();
  Activation act = getActivation();
  if (act == Activation::relu2 && gated)
    return emitOpError("relu2 experts have no gate projection");
  if (act == Activation::clamped_swiglu && !getLimit())
    return emitOpError("clamped_swiglu needs a limit");
  if (getUpBias() && !c.numElements("up_bias", getUpBias(), e * upOut, "experts * up outputs"))
    return failure();
  if (getDownBias() && !c.numElements("down_bias", getDownBias(), e * d, "experts * features"))
    return failure();
  if (failed(verifyExpertLoRA(*this, c, e, d, inter)))
    return failure();
  if (Value pre = getPreActivations()) {
    if (!getGate() || act != Activation::silu || getUpBias() || getDownBias() || getLoraScaleAttr())
      return emitOpError("pre_activations are saved only for gated SiLU experts with a separate gate, no "
                         "biases and no LoRA");
    if (!(c.rank("pre_activations", pre, 2) && c.sameDim("tokens", getTokens(), 0, "pre_activations", pre, 0) &&
          c.dim("pre_activations", pre, 1, ShapedType::isDynamic(inter) ? inter : 2 * inter,
                "twice the expert intermediate size: gate, then up")))
      return failure();
  }
  return success();
}


LogicalResult CombineOp::verify() {
  Checker c(*this);
  return success(c.rank("expert_output", getExpertOutput(), 2) &&
                 c.rank("indices", getIndices(), 2) && c.rank("weights", getWeights(), 2) &&
                 c.sameDim("indices", getIndices(), 1, "weights", getWeights(), 1) &&
                 c.rank("result", getResult(), 2) &&
                 c.sameDim("indices", getIndices(), 0, "result", getResult(), 0) &&
                 c.sameDim("expert_output", getExpertOutput(), 1, "result", getResult(), 1) &&
                 // An f32 result on narrower data: an expert-parallel rank's partial sum, kept
                 // exact until the ranks' parts are added.
                 (tensorType(getResult()).getElementType().isF32() ||
                  c.sameElementType("expert_output", getExpertOutput(), "result", getResult())));
}

/// A LoRA adapter on `input`: lora_a [r, in], lora_b [out, r] of one type (f32, or the input's),
/// and a result [rows, out] of the input's type or f32 (moe.lora's update; moe.lora_linear's
/// output, whose f32 is a tensor-parallel rank's partial sum).
static bool adapterFits(Checker &c, Value input, Value loraA, Value loraB, Value result) {
  int64_t rank = tensorType(loraA).getDimSize(0);
  return c.rank("input", input, 2) && c.rank("lora_a", loraA, 2) && c.rank("lora_b", loraB, 2) &&
         c.dim("lora_a", loraA, 1, tensorType(input).getDimSize(1), "input features") &&
         c.dim("lora_b", loraB, 1, rank, "adapter rank") && c.sameElementType("lora_a", loraA, "lora_b", loraB) &&
         (tensorType(loraA).getElementType().isF32() || c.sameElementType("input", input, "lora_a", loraA)) &&
         c.rank("result", result, 2) && c.sameDim("input", input, 0, "result", result, 0) &&
         (tensorType(result).getElementType().isF32() || c.sameElementType("input", input, "result", result)) &&
         c.dim("result", result, 1, tensorType(loraB).getDimSize(0), "lora_b output features");
}

LogicalResult LoRAOp::verify() {
  Checker c(*this);
  return success(adapterFits(c, getInput(), getLoraA(), getLoraB(), getResult()));
}

LogicalResult LoRALinearOp::verify() {
  Checker c(*this);
  RankedTensorType w = tensorType(getWeight());
  if (!(c.rank("input", getInput(), 2) && c.rank("weight", getWeight(), 2) &&
        c.dim("weight", getWeight(), 1, tensorType(getInput()).getDimSize(1), "input features") &&
        c.sameElementType("input", getInput(), "weight", getWeight()) && c.rank("lora_b", getLoraB(), 2) &&
        c.dim("lora_b", getLoraB(), 0, w.getDimSize(0), "weight output features") &&
        adapterFits(c, getInput(), getLoraA(), getLoraB(), getResult())))
    return failure();
  Type result = tensorType(getResult()).getElementType();
  if (getBaseType() && *getBaseType() != result)
    return emitOpError() << "base_type " << *getBaseType() << " differs from the result's " << result;
  return success();
}

LogicalResult AddOp::verify() {
  Checker c(*this);
  auto lhs = tensorType(getLhs()), rhs = tensorType(getRhs());
  if (lhs.getShape() != rhs.getShape())
    return emitOpError() << "lhs and rhs must have the same shape, got " << lhs << " and " << rhs;
  // An f32 rhs on a narrower lhs: a LoRA update added once to a bf16 projection (PEFT's order).
  return success(rhs.getElementType().isF32() || c.sameElementType("lhs", getLhs(), "rhs", getRhs()));
}

LogicalResult CrossEntropyOp::verify() {
  Checker c(*this);
  return success(c.rank("logits", getLogits(), 2) && c.rank("labels", getLabels(), 1) &&
                 c.sameDim("logits", getLogits(), 0, "labels", getLabels(), 0));
}

LogicalResult LMHeadCrossEntropyOp::verify() {
  Checker c(*this);
  if (!(c.rank("input", getInput(), 2) && c.rank("weight", getWeight(), 2) &&
        c.dim("weight", getWeight(), 1, tensorType(getInput()).getDimSize(1), "input features") &&
        c.sameElementType("input", getInput(), "weight", getWeight()) && c.rank("labels", getLabels(), 1) &&
        c.sameDim("input", getInput(), 0, "labels", getLabels(), 0) &&
        c.rank("logsumexp", getLogsumexp(), 1) &&
        c.sameDim("input", getInput(), 0, "logsumexp", getLogsumexp(), 0) &&
        c.positive("chunk_tokens", getChunkTokens())))
    return failure();
  Type element = tensorType(getInput()).getElementType();
  std::optional<Type> logits = getLogitsType();
  if (logits && *logits != element)
    return emitOpError("logits_type ") << *logits << " differs from the input element type " << element
                                       << " (the type the unfused head's logits would have)";
  if (!logits && !element.isF32())
    return emitOpError("needs logits_type = ")
           << element << " (the input element type; only f32 logits may leave it out)";
  if (Value grad = getInputGrad(); grad && grad.getType() != getInput().getType())
    return emitOpError("input_grad must have the input's type ") << getInput().getType() << ", got "
                                                                  << grad.getType();
  return success();
}

/// An expert-parallel layout: [2, 2 ranks] ((tokens, copies) sent to and received from each rank).
static bool epLayout(Checker &c, Value layout, int64_t ranks) {
  return c.rank("layout", layout, 2) && c.dim("layout", layout, 0, 2, "sent and received") &&
         c.dim("layout", layout, 1, 2 * ranks, "tokens and expert copies per rank");
}

LogicalResult EpRouteOp::verify() {
  Checker c(*this);
  int64_t ranks = getRanks(), experts = getNumExperts();
  if (ranks < 1 || experts < 1 || experts % ranks != 0)
    return emitOpError("needs ranks >= 1 dividing num_experts, got ranks = ") << ranks << " and num_experts = "
                                                                             << experts;
  if (FloatAttr factor = getCapacityFactorAttr()) {
    if (getAllTokens())
      return emitOpError("has capacity_factor and all_tokens: every token goes to every rank, the room is fixed");
    if (!(factor.getValueAsDouble() >= 1.0))
      return emitOpError("needs capacity_factor >= 1 (the room uniform routing fills), got ") << factor.getValueAsDouble();
  }
  return success(c.rank("indices", getIndices(), 2) && c.rank("local_indices", getLocalIndices(), 2) &&
                 c.sameDim("indices", getIndices(), 1, "local_indices", getLocalIndices(), 1) &&
                 c.sameElementType("indices", getIndices(), "local_indices", getLocalIndices()) &&
                 epLayout(c, getLayout(), ranks));
}

/// ep_send and ep_return: rows in, rows out, the same width and element type (a return may
/// round f32 rows' sums to a narrower type).
template <typename Op>
static LogicalResult verifyEpRows(Op op, bool mayNarrow) {
  Checker c(op);
  if (op.getRanks() < 1)
    return op.emitOpError("needs ranks >= 1, got ") << op.getRanks();
  bool narrows = mayNarrow && tensorType(op.getInput()).getElementType().isF32();
  return success(c.rank("input", op.getInput(), 2) && c.rank("result", op.getResult(), 2) &&
                 c.sameDim("input", op.getInput(), 1, "result", op.getResult(), 1) &&
                 (narrows || c.sameElementType("input", op.getInput(), "result", op.getResult())) &&
                 epLayout(c, op.getLayout(), op.getRanks()));
}

LogicalResult EpSendOp::verify() { return verifyEpRows(*this, /*mayNarrow=*/false); }
LogicalResult EpReturnOp::verify() { return verifyEpRows(*this, /*mayNarrow=*/true); }

/// Sequence parallel moves rows: the leading (token) dimension must be dynamic.
static LogicalResult verifyTokenRows(Operation *op, Value input) {
  auto type = cast<RankedTensorType>(input.getType());
  if (type.getRank() < 1 || !type.isDynamicDim(0))
    return op->emitOpError("moves token rows: needs a dynamic leading dimension, got ") << type;
  return success();
}

/// moe.tp_slice_features and moe.tp_place_features: `whole` [T, F] of parts `pieces`, `part`
/// [T, F / ranks] a rank's share of each.
static LogicalResult verifyFeaturePieces(Operation *op, Value whole, Value part, int64_t ranks,
                                         ArrayRef<int64_t> pieces) {
  Checker c(op);
  if (!c.rank("whole", whole, 2) || !c.rank("part", part, 2) || !c.sameDim("whole", whole, 0, "part", part, 0) ||
      !c.sameElementType("whole", whole, "part", part))
    return failure();
  if (ranks < 2)
    return op->emitOpError("ranks must be at least 2, got ") << ranks;
  int64_t total = 0;
  for (int64_t columns : pieces) {
    if (columns <= 0 || columns % ranks)
      return op->emitOpError("a piece of ") << columns << " columns does not split over " << ranks << " ranks";
    total += columns;
  }
  return success(c.dim("whole", whole, 1, total, "the pieces' columns") &&
                 c.dim("part", part, 1, total / ranks, "a rank's share of the pieces"));
}

LogicalResult TpSliceFeaturesOp::verify() {
  return verifyFeaturePieces(*this, getInput(), getResult(), getRanks(), getPieces());
}

LogicalResult TpPlaceFeaturesOp::verify() {
  return verifyFeaturePieces(*this, getResult(), getInput(), getRanks(), getPieces());
}

LogicalResult TpExitOp::verify() {
  auto in = tensorType(getInput()), out = tensorType(getResult());
  if (getRows() && failed(verifyTokenRows(*this, getInput())))
    return failure();
  if (in.getShape() != out.getShape())
    return emitOpError("result shape ") << out << " differs from the input's " << in;
  if (in.getElementType() != out.getElementType() && !in.getElementType().isF32())
    return emitOpError("result element type ") << out.getElementType() << " differs from the input's "
                                              << in.getElementType() << " (only an f32 sum may be rounded)";
  return success();
}

LogicalResult TpEnterOp::verify() { return success(!getRows() || succeeded(verifyTokenRows(*this, getInput()))); }
LogicalResult TpGatherOp::verify() { return verifyTokenRows(*this, getInput()); }
LogicalResult TpSliceOp::verify() { return verifyTokenRows(*this, getInput()); }

LogicalResult ShiftLabelsOp::verify() {
  auto in = tensorType(getLabels()), out = tensorType(getResult());
  if (in.getRank() != 1 || in != out)
    return emitOpError("takes [T] labels to [T] labels of the same type, got ") << in << " -> " << out;
  return success();
}

/// Token blocks and their concatenation: `whole` and every block have the same element type and
/// rank (at least 1), the same trailing dimensions, and a dynamic row count in the blocks.
static LogicalResult verifyTokenBlocks(Operation *op, Type whole, TypeRange blocks) {
  if (blocks.size() < 2)
    return op->emitOpError("needs at least 2 blocks, got ") << blocks.size();
  auto full = cast<RankedTensorType>(whole);
  if (full.getRank() < 1)
    return op->emitOpError("needs token rows (rank >= 1), got ") << full;
  for (Type type : blocks) {
    auto block = cast<RankedTensorType>(type);
    if (block.getElementType() != full.getElementType() || block.getRank() != full.getRank())
      return op->emitOpError("block ") << block << " differs from " << full << " in element type or rank";
    if (!block.isDynamicDim(0))
      return op->emitOpError("block ") << block << " must have a dynamic row count";
    for (int64_t d = 1; d < full.getRank(); ++d)
      if (block.getDimSize(d) != full.getDimSize(d))
        return op->emitOpError("dimension ") << d << " of block " << block << " differs from " << full;
  }
  return success();
}

LogicalResult TokenBlocksOp::verify() {
  return verifyTokenBlocks(*this, getInput().getType(), getBlocks().getTypes());
}

LogicalResult ConcatTokensOp::verify() {
  return verifyTokenBlocks(*this, getResult().getType(), getBlocks().getTypes());
}

LogicalResult MicrobatchOp::verify() {
  int64_t index = getIndex(), count = getCount();
  if (count < 1 || index < 0 || index >= count)
    return emitOpError("needs 0 <= index < count, got index ") << index << " and count " << count;
  auto in = cast<RankedTensorType>(getInput().getType());
  auto out = cast<RankedTensorType>(getResult().getType());
  if (in.getElementType() != out.getElementType())
    return emitOpError("result element type ") << out.getElementType() << " differs from the input's "
                                                << in.getElementType();
  if (out.getRank() == 0) {
    if (in.getRank() != 1 || in.getDimSize(0) != count)
      return emitOpError("a scalar result takes one element of a 1-D input of ") << count
                                                                                 << " elements, got " << in;
    return success();
  }
  if (in.getRank() != out.getRank())
    return emitOpError("result rank ") << out.getRank() << " differs from the input's " << in.getRank();
  for (int64_t d = 1; d < in.getRank(); ++d)
    if (in.getDimSize(d) != out.getDimSize(d))
      return emitOpError("dimension ") << d << " of the result differs from the input's";
  return success();
}

LogicalResult StageExchangeOp::verify() {
  if (!getSend() && !getReceived())
    return emitOpError("neither sends nor receives");
  if (getPeer() < 0)
    return emitOpError("peer stage must be >= 0, got ") << getPeer();
  return success();
}

} // namespace moec::moe
