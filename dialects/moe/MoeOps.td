//===- MoeOps.td - moe dialect ops -------------------------*- tablegen -*-===//
//
// Structure ops (model, parameters, layer templates) first, then the compute
// ops grouped as the kernels are: norms and projections, positions,
// attention variants, linear attention, routing and experts, the loss.
//
//===----------------------------------------------------------------------===//

#ifndef DIALECTS_MOE_MOEOPS_TD_
#define DIALECTS_MOE_MOEOPS_TD_

include "MoeDialect.td"
include "MoeAttributes.td"
include "MoeEnums.td"
include "MoeInterfaces.td"
include "mlir/IR/OpBase.td"
include "mlir/Interfaces/InferTypeOpInterface.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/IR/RegionKindInterface.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/Interfaces/FunctionInterfaces.td"
include "mlir/Interfaces/ControlFlowInterfaces.td"
include "mlir/Interfaces/CallInterfaces.td"

class Moe_Op<string mnemonic, list<Trait> traits = []> : Op<Moe_Dialect, mnemonic, traits>;

// Compute ops are pure, verified in C++ (shapes, head counts, dtypes) and
// differentiable; `backward` lists the interface methods an op overrides.
class Moe_ComputeOp<string mnemonic, list<Trait> traits = [], list<string> backward = []>
    : Moe_Op<mnemonic, !listconcat(
          [Pure, DeclareOpInterfaceMethods<Moe_DifferentiableOpInterface, backward>], traits)> {
  let hasVerifier = 1;
}

// Each token's results come from that token's rows alone: run on a subset of the tokens (one
// rank's rows under sequence parallel), the op gives those tokens' results. moe.dispatch,
// moe.expert_mlp and moe.combine hold it together: the expert copies and counts are then the
// subset's; so do the expert exchange's ops (ep_route, ep_send, ep_return, token blocks), whose
// ep group's ranks share a tp coordinate: each tp rank exchanges its own rows.
def Moe_Tokenwise : NativeOpTrait<"Tokenwise"> {
  let cppNamespace = "::moec::moe";
}

def Moe_Tensor : RankedTensorOf<[AnyFloat]>;
def Moe_IndexTensor : RankedTensorOf<[AnySignlessInteger]>;

//===----------------------------------------------------------------------===//
// Structure
//===----------------------------------------------------------------------===//

def Moe_ModelOp : Moe_Op<"model", [
    Symbol, SymbolTable, IsolatedFromAbove, NoTerminator, SingleBlock,
    NoRegionArguments]> {
  let summary = "A whole model: its parameters, layer templates and forward function.";
  let description = [{
    The top-level container. Model-wide facts the importer read from the
    configuration are attributes (`hidden_size`, `vocab_size`, `num_layers`,
    ...). The body holds model-level `moe.param`s (embedding, final norm,
    LM head), one `moe.layer` per distinct layer structure and a
    `func.func @forward`.

    ```mlir
    moe.model @Qwen3MoeForCausalLM attributes {hidden_size = 64 : i64} {
      moe.param @embed_tokens "model.embed_tokens.weight" : tensor<256x64xf32>
      ...
    }
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "$sym_name attr-dict-with-keyword $body";
  let hasVerifier = 1;
}

def Moe_ParamOp : Moe_Op<"param", [Symbol]> {
  let summary = "A parameter tensor bound by name to a checkpoint tensor.";
  let description = [{
    `tensor_name` is the checkpoint name. Inside a `moe.layer` template it
    contains `{layer}`, replaced by the layer index of each instance; a
    stacked expert tensor contains `{expert}` and has the experts as its
    leading dimension (bound from one checkpoint tensor per expert). A
    parameter is frozen unless `trainable` is set. A LoRA adapter's tensors
    (added by --moe-inject-lora) are named by their PEFT name,
    `base_model.model.<module>.lora_A.weight`, and start fresh; any other
    trainable parameter is a checkpoint weight trained in full: it starts from
    the checkpoint and is exported as a PEFT module to save. `sharding` says how its
    dimensions split over the mesh (replicated when absent); the type is the
    whole tensor, and the `moe.weight` that reads it has the type of one
    rank's part (the model's `mesh` attribute gives the axis sizes).

    ```mlir
    moe.param @q_proj "model.layers.{layer}.self_attn.q_proj.weight" : tensor<4096x2048xbf16>
    moe.param @experts_up "model.layers.{layer}.mlp.experts.{expert}.up_proj.weight"
        : tensor<128x768x2048xbf16> sharding #moe.sharding<[ep, _, _]>
    ```
  }];
  let arguments = (ins
    SymbolNameAttr:$sym_name,
    StrAttr:$tensor_name,
    TypeAttrOf<AnyRankedTensor>:$type,
    UnitAttr:$trainable,
    OptionalAttr<Moe_ShardingAttr>:$sharding
  );
  let assemblyFormat = [{
    $sym_name $tensor_name (`trainable` $trainable^)? `:` $type
    (`sharding` qualified($sharding)^)? attr-dict
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    ::mlir::RankedTensorType getTensorType() {
      return ::llvm::cast<::mlir::RankedTensorType>(getType());
    }
    /// Number of elements of this parameter.
    int64_t getNumElements() { return getTensorType().getNumElements(); }
    /// Whether the leading dimension stacks one checkpoint tensor per expert.
    bool isPerExpert() { return getTensorName().contains("{expert}"); }
    /// The sharding, replicated when none is set.
    ShardingAttr getShardingOrReplicated();
    /// The part one rank holds: each dimension the sharding splits divided by the size of
    /// its axis in the enclosing model's `mesh`; the whole type when replicated or without
    /// a mesh. Fails (null) when a dimension does not divide evenly.
    ::mlir::RankedTensorType getLocalType();
  }];
}

def Moe_WeightOp : Moe_Op<"weight", [Pure, DeclareOpInterfaceMethods<SymbolUserOpInterface>,
    DeclareOpInterfaceMethods<Moe_DifferentiableOpInterface, ["isGradientSource", "buildBackward"]>]> {
  let summary = "Reads a parameter as a value.";
  let description = [{
    Looks the parameter up in the nearest symbol table (the enclosing
    `moe.layer`, else the `moe.model`); the result type must equal the
    parameter's.

    ```mlir
    %w = moe.weight @q_proj : tensor<4096x2048xbf16>
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$param);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$param attr-dict `:` type($result)";
}

def Moe_LayerOp : Moe_Op<"layer", [
    Symbol, SymbolTable, IsolatedFromAbove, FunctionOpInterface,
    AutomaticAllocationScope]> {
  let summary = "A layer template: parameters and math shared by every layer of one structure.";
  let description = [{
    One template per distinct (token mixer, channel mixer, shapes)
    structure; `moe.apply_layer` instantiates it once per layer, so the IR
    and compile time do not grow with depth. `token_mixer` and
    `channel_mixer` name the structure for reports; `layers` lists the
    layer indices that use it.

    ```mlir
    moe.layer @gqa_moe(%x: tensor<?x64xf32>, %pos: tensor<?xi64>) -> tensor<?x64xf32>
        attributes {token_mixer = "gqa", channel_mixer = "moe", layers = array<i64: 0, 1>} {
      moe.param @input_layernorm "model.layers.{layer}.input_layernorm.weight" : tensor<64xf32>
      ...
      moe.yield %out : tensor<?x64xf32>
    }
    ```
  }];
  let arguments = (ins
    SymbolNameAttr:$sym_name,
    TypeAttrOf<FunctionType>:$function_type,
    OptionalAttr<DictArrayAttr>:$arg_attrs,
    OptionalAttr<DictArrayAttr>:$res_attrs
  );
  let regions = (region SizedRegion<1>:$body);
  let hasCustomAssemblyFormat = 1;
  let extraClassDeclaration = [{
    ::llvm::ArrayRef<::mlir::Type> getArgumentTypes() { return getFunctionType().getInputs(); }
    ::llvm::ArrayRef<::mlir::Type> getResultTypes() { return getFunctionType().getResults(); }
    ::mlir::Region *getCallableRegion() { return &getBody(); }
  }];
}

def Moe_YieldOp : Moe_Op<"yield", [Pure, HasParent<"LayerOp">, ReturnLike, Terminator]> {
  let summary = "Returns a layer template's outputs.";
  let arguments = (ins Variadic<AnyType>:$values);
  let assemblyFormat = "($values^ `:` type($values))? attr-dict";
  let hasVerifier = 1;
}

def Moe_ApplyLayerOp : Moe_Op<"apply_layer", [DeclareOpInterfaceMethods<SymbolUserOpInterface>,
    DeclareOpInterfaceMethods<Moe_DifferentiableOpInterface, ["isGradientSource", "buildBackward"]>]> {
  let summary = "One layer: a template instantiated at a layer index.";
  let description = [{
    Runs template `callee` with its `{layer}` parameters bound to layer
    `index`.

    ```mlir
    %h1 = moe.apply_layer @gqa_moe[1](%h0, %pos) : (tensor<?x64xf32>, tensor<?xi64>) -> tensor<?x64xf32>
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$callee, I64Attr:$index, Variadic<AnyType>:$operands);
  let results = (outs Variadic<AnyType>:$results);
  let assemblyFormat = [{
    $callee `[` $index `]` `(` $operands `)` attr-dict `:` functional-type($operands, $results)
  }];
}

//===----------------------------------------------------------------------===//
// Embedding, norms, projections, elementwise
//===----------------------------------------------------------------------===//

def Moe_EmbeddingOp : Moe_ComputeOp<"embedding", [Moe_Tokenwise]> {
  let summary = "Looks token ids up in an embedding table.";
  let description = [{
    `ids: [T]`, `table: [V, D]` -> `[T, D]`.

    ```mlir
    %e = moe.embedding %ids, %table : (tensor<?xi64>, tensor<256x64xf32>) -> tensor<?x64xf32>
    ```
  }];
  let arguments = (ins Moe_IndexTensor:$ids, Moe_Tensor:$table);
  let results = (outs Moe_Tensor:$result);
  let assemblyFormat = "$ids `,` $table attr-dict `:` functional-type(operands, results)";
}

def Moe_RMSNormOp : Moe_ComputeOp<"rms_norm", [Moe_Tokenwise]> {
  let summary = "RMSNorm over groups of the last dimension, optionally with (1 + w).";
  let description = [{
    `y = x / sqrt(mean(x^2) + eps) * w`, or `* (1 + w)` with `unit_offset`
    (Qwen3-Next's zero-centred weights). The normalised group is the size of
    `weight`: the whole feature dimension for a layer norm, one head for
    per-head q/k norms (`x: [T, H*hd]`, `weight: [hd]`).

    ```mlir
    %y = moe.rms_norm %x, %w {eps = 1.0e-06 : f64} : (tensor<?x64xf32>, tensor<64xf32>) -> tensor<?x64xf32>
    ```
  }];
  let arguments = (ins Moe_Tensor:$input, Moe_Tensor:$weight, F64Attr:$eps, UnitAttr:$unit_offset);
  let results = (outs Moe_Tensor:$result);
  let assemblyFormat = "$input `,` $weight attr-dict `:` functional-type(operands, results)";
}

def Moe_RowSumOfSquaresOp : Moe_ComputeOp<"row_sum_of_squares", [Moe_Tokenwise]> {
  let summary = "The sum of squares of each row, in f32 (a sharded RMSNorm's statistic).";
  let description = [{
    `x: [T, F]` -> `[T, 1]` f32: each row's `sum(x^2)`. Under tensor
    parallel a rank holds only some features of a row that one norm spans
    (OLMoE's q/k norms over every head): each rank's sum is a part of the
    row's, summed over tp (`moe.tp_sum`) before `moe.sharded_rms_norm`.

    ```mlir
    %s = moe.row_sum_of_squares %q : (tensor<?x32xbf16>) -> tensor<?x1xf32>
    ```
  }];
  let arguments = (ins Moe_Tensor:$input);
  let results = (outs Moe_Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
}

def Moe_ShardedRMSNormOp : Moe_ComputeOp<"sharded_rms_norm", [Moe_Tokenwise]> {
  let summary = "RMSNorm of a rank's features of each row, given the whole row's sum of squares.";
  let description = [{
    `y = x / sqrt(sum_of_squares / features + eps) * w` (or `* (1 + w)` with
    `unit_offset`), where `x: [T, F_local]` and `weight: [F_local]` are this
    rank's part of rows of `features` elements and `sum_of_squares: [T, 1]`
    (f32) is the whole rows' (`moe.tp_sum` of `moe.row_sum_of_squares`). The
    backward treats `sum_of_squares` as an operand: its gradient goes back
    through the sum to every rank's part of x.

    ```mlir
    %y = moe.sharded_rms_norm %q, %w, %all {eps = 1.0e-06 : f64, features = 64 : i64}
        : (tensor<?x32xf32>, tensor<32xf32>, tensor<?x1xf32>) -> tensor<?x32xf32>
    ```
  }];
  let arguments = (ins Moe_Tensor:$input, Moe_Tensor:$weight, Moe_Tensor:$sum_of_squares, F64Attr:$eps,
                       I64Attr:$features, UnitAttr:$unit_offset);
  let results = (outs Moe_Tensor:$result);
  let assemblyFormat = "$input `,` $weight `,` $sum_of_squares attr-dict `:` functional-type(operands, results)";
}

def Moe_LayerNormOp : Moe_ComputeOp<"layer_norm", [Moe_Tokenwise]> {
  let summary = "LayerNorm (mean and variance) with weight and bias over the last dimension.";
  let arguments = (ins Moe_Tensor:$input, Moe_Tensor:$weight, Moe_Tensor:$bias, F64Attr:$eps);
  let results = (outs Moe_Tensor:$result);
  let assemblyFormat = "$input `,` $weight `,` $bias attr-dict `:` functional-type(operands, results)";
}

def Moe_LinearOp : Moe_ComputeOp<"linear", [Moe_Tokenwise]> {
  let summary = "y = x W^T (+ b), W in the checkpoint's [out, in] layout.";
  let description = [{
    Every projection of the model is one of these (attention projections,
    MLPs, latent projections, the LM head), so LoRA injection and fusion
    see them all the same way.

    ```mlir
    %q = moe.linear %x, %wq : (tensor<?x64xf32>, tensor<64x64xf32>) -> tensor<?x64xf32>
    %y = moe.linear %x, %w bias %b : (tensor<?x64xf32>, tensor<32x64xf32>, tensor<32xf32>) -> tensor<?x32xf32>
    ```
  }];
  let arguments = (ins Moe_Tensor:$input, Moe_Tensor:$weight, Optional<Moe_Tensor>:$bias);
  let results = (outs Moe_Tensor:$result);
  let assemblyFormat = [{
    $input `,` $weight (`bias` $bias^)? attr-dict `:` functional-type(operands, results)
  }];
}

def Moe_AddOp : Moe_ComputeOp<"add", [Moe_Tokenwise, AllTypesMatch<["lhs", "result"]>], ["buildBackward"]> {
  let summary = "Elementwise sum (residual connections, LoRA updates).";
  let description = [{
    The result has the type of `lhs`; `rhs` has its shape and its element type,
    or f32: a LoRA update computed in f32 is rounded once, in the sum, as PEFT
    adds its f32 update to a bf16 projection before casting back.
  }];
  let arguments = (ins Moe_Tensor:$lhs, Moe_Tensor:$rhs);
  let results = (outs Moe_Tensor:$result);
  // `: T` when both sides have type T, `: T, f32-type` otherwise.
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` custom<AddTypes>(type($lhs), type($rhs))";
}

def Moe_ActivationOp : Moe_ComputeOp<"activation", [Moe_Tokenwise, SameOperandsAndResultType]> {
  let summary = "Elementwise activation (relu² MLPs).";
  let arguments = (ins Moe_Tensor:$input, Moe_ActivationAttr:$kind);
  let results = (outs Moe_Tensor:$result);
  let assemblyFormat = "$kind $input attr-dict `:` type($result)";
  // Same types in and out is all there is to check.
  let hasVerifier = 0;
}

def Moe_GluOp : Moe_ComputeOp<"glu", [Moe_Tokenwise, SameOperandsAndResultType]> {
  let summary = "Gated linear unit: act(gate) * up (SwiGLU MLPs).";
  let arguments = (ins Moe_Tensor:$gate, Moe_Tensor:$up, Moe_ActivationAttr:$kind);
  let results = (outs Moe_Tensor:$result);
  let assemblyFormat = "$kind $gate `,` $up attr-dict `:` type($result)";
}

def Moe_SigmoidGateOp : Moe_ComputeOp<"sigmoid_gate", [Moe_Tokenwise]> {
  let summary = "x * sigmoid(g): attention output gates and shared-expert gates.";
  let description = [{
    `g` has the shape of `x` (Qwen3-Next's per-feature attention output
    gate) or `[T, 1]` (a scalar gate per token, as on Qwen3-Next's shared
    expert).
  }];
  let arguments = (ins Moe_Tensor:$input, Moe_Tensor:$gate);
  let results = (outs Moe_Tensor:$result);
  let assemblyFormat = "$input `,` $gate attr-dict `:` functional-type(operands, results)";
}

def Moe_SplitOp : Moe_ComputeOp<"split", [Moe_Tokenwise]> {
  let summary = "Splits the feature dimension into parts, optionally within equal groups.";
  let description = [{
    The feature dimension is viewed as `[groups, sum(sizes)]`; result `i`
    takes `sizes[i]` features of every group. `groups = 1` splits a fused
    projection (`kv_a_proj_with_mqa` into latent and rope key); `groups = H`
    splits per head (Qwen3-Next's `q_proj` into query and gate).

    ```mlir
    %ckv, %kpe = moe.split %kva {sizes = array<i64: 16, 8>} : (tensor<?x24xf32>) -> (tensor<?x16xf32>, tensor<?x8xf32>)
    ```
  }];
  let arguments = (ins Moe_Tensor:$input, DenseI64ArrayAttr:$sizes,
                   DefaultValuedAttr<I64Attr, "1">:$groups);
  let results = (outs Variadic<Moe_Tensor>:$results);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
}

//===----------------------------------------------------------------------===//
// Positions and attention
//===----------------------------------------------------------------------===//

def Moe_RopeOp : Moe_ComputeOp<"rope", [Moe_Tokenwise]> {
  let summary = "Rotary position embedding of every head (full, partial, interleaved, YaRN).";
  let description = [{
    `x: [T, H*head_dim]`; the first `rope.dim` features of each head rotate
    (partial RoPE when `rope.dim < head_dim`).

    ```mlir
    %q = moe.rope %x, %pos {head_dim = 16 : i64, rope = #moe.rope<theta = 1.000000e+04, dim = 16, style = half>}
        : (tensor<?x64xf32>, tensor<?xi64>) -> tensor<?x64xf32>
    ```
  }];
  let arguments = (ins Moe_Tensor:$input, Moe_IndexTensor:$positions, I64Attr:$head_dim, Moe_RopeAttr:$rope);
  let results = (outs Moe_Tensor:$result);
  let assemblyFormat = "$input `,` $positions attr-dict `:` functional-type(operands, results)";
}

def Moe_AttentionOp : Moe_ComputeOp<"attention", [], ["backwardUsesResults"]> {
  let summary = "Causal grouped-query attention (sliding window, sinks).";
  let description = [{
    `q: [T, H*d]`, `k: [T, Hkv*d]`, `v: [T, Hkv*dv]` -> `[T, H*dv]`; query
    head `h` reads key/value head `h / (H / Hkv)`. `sliding_window` limits
    each query to the last `w` keys; `sinks: [H]` adds one learned logit per
    head to the softmax denominator (gpt-oss). q/k norms, RoPE and output
    gates are separate ops around it.

    An optional second result `logsumexp: [T, H]` (f32) holds the natural
    log of each (query, head)'s softmax denominator, the sink included
    (`+inf` on a row with no allowed key and no sink, so that its
    probabilities `exp(z - logsumexp)` are 0). `--moe-build-training-step`
    adds it to the attentions of the layers it trains: the backward then
    reads it and the result instead of running the forward's key loop again
    for these statistics.

    ```mlir
    %o = moe.attention %q, %k, %v {num_heads = 4 : i64, num_kv_heads = 2 : i64, head_dim = 16 : i64, scale = 2.500000e-01 : f64}
        : (tensor<?x64xf32>, tensor<?x32xf32>, tensor<?x32xf32>) -> tensor<?x64xf32>
    %o2, %lse = moe.attention %q, %k, %v {num_heads = 4 : i64, num_kv_heads = 2 : i64, head_dim = 16 : i64, scale = 2.500000e-01 : f64}
        : (tensor<?x64xf32>, tensor<?x32xf32>, tensor<?x32xf32>) -> (tensor<?x64xf32>, tensor<?x4xf32>)
    ```
  }];
  let arguments = (ins Moe_Tensor:$query, Moe_Tensor:$key, Moe_Tensor:$value,
                   Optional<Moe_Tensor>:$sinks,
                   I64Attr:$num_heads, I64Attr:$num_kv_heads, I64Attr:$head_dim,
                   F64Attr:$scale, OptionalAttr<I64Attr>:$sliding_window);
  let results = (outs Moe_Tensor:$result, Optional<RankedTensorOf<[F32]>>:$logsumexp);
  let assemblyFormat = [{
    $query `,` $key `,` $value (`sinks` $sinks^)? attr-dict `:` functional-type(operands, results)
  }];
}

// Common operands and attributes of the two MLA forms.
class Moe_MLAOpBase<string mnemonic, dag extraOperands, dag outputs = (outs Moe_Tensor:$result),
                    list<string> backward = []>
    : Moe_ComputeOp<mnemonic, [], backward> {
  let arguments = !con((ins Moe_Tensor:$query, Moe_Tensor:$key_rope, Moe_Tensor:$key_value,
                            Moe_IndexTensor:$positions),
                       extraOperands,
                       (ins I64Attr:$num_heads, I64Attr:$qk_nope_head_dim,
                            I64Attr:$qk_rope_head_dim, I64Attr:$v_head_dim, F64Attr:$scale,
                            OptionalAttr<Moe_RopeAttr>:$rope));
  let results = outputs;
}

def Moe_MLAOp : Moe_MLAOpBase<"mla", (ins),
                              (outs Moe_Tensor:$result, Optional<RankedTensorOf<[F32]>>:$logsumexp),
                              ["backwardUsesResults"]> {
  let summary = "Multi-head latent attention core (DeepSeek-V3, Kimi).";
  let description = [{
    Inputs are the projections around it: `query: [T, H*(nope+rope)]`
    (`q_b_proj` or `q_proj`), `key_rope: [T, rope]` (the key part shared by
    all heads, from `kv_a_proj_with_mqa`), `key_value: [T, H*(nope+v)]`
    (`kv_b_proj` of the normed latent). The trailing `rope` features of
    each query head and `key_rope` rotate with `rope`; without `rope` the
    layer is NoPE (Kimi-Linear). Output `[T, H*v]`, before `o_proj`; and,
    as `moe.attention`'s, an optional `logsumexp: [T, H]` (f32) that
    `--moe-build-training-step` adds so that the backward reads the
    softmax statistics instead of recomputing them.
  }];
  let assemblyFormat = [{
    $query `,` $key_rope `,` $key_value `,` $positions attr-dict `:` functional-type(operands, results)
  }];
}

def Moe_SparseAttentionOp : Moe_MLAOpBase<"sparse_attention", (ins Moe_IndexTensor:$indices),
                                          (outs Moe_Tensor:$result,
                                                Optional<RankedTensorOf<[F32]>>:$logsumexp),
                                          ["backwardUsesResults"]> {
  let summary = "DeepSeek Sparse Attention: MLA over the keys an indexer selected.";
  let description = [{
    As `moe.mla`, but query `t` attends only to the positions in row `t`
    of `indices: [T, topk]` (from `moe.dsa_indexer`; entries past the
    causal limit are `-1`). No dense mask is formed. The optional
    `logsumexp` is `moe.mla`'s, over the selected keys.
  }];
  let assemblyFormat = [{
    $query `,` $key_rope `,` $key_value `,` $positions `,` $indices attr-dict `:` functional-type(operands, results)
  }];
}

def Moe_DSAIndexerOp : Moe_ComputeOp<"dsa_indexer"> {
  let summary = "DeepSeek Sparse Attention's lightning indexer and top-k selection.";
  let description = [{
    `I[t,s] = sum_h w[t,h] * relu(q[t,h] . k[s])` over causal `s <= t`,
    then the `topk` largest per query: `indices: [T, topk]` (i32, `-1`
    where fewer than `topk` keys exist). `query: [T, H*d]` (`wq_b` of the
    MLA query latent), `key: [T, d]` (`wk` then LayerNorm), `head_weights:
    [T, H]` (`weights_proj`). The leading `rope.dim` features of query and
    key rotate (non-interleaved, unlike MLA).
  }];
  let arguments = (ins Moe_Tensor:$query, Moe_Tensor:$key, Moe_Tensor:$head_weights,
                   Moe_IndexTensor:$positions,
                   I64Attr:$num_heads, I64Attr:$head_dim, I64Attr:$topk, Moe_RopeAttr:$rope);
  let results = (outs Moe_IndexTensor:$indices);
  let assemblyFormat = [{
    $query `,` $key `,` $head_weights `,` $positions attr-dict `:` functional-type(operands, results)
  }];
}

//===----------------------------------------------------------------------===//
// Linear attention and state-space mixers
//===----------------------------------------------------------------------===//

def Moe_GatedDeltaNetOp : Moe_ComputeOp<"gated_delta_net"> {
  let summary = "Gated DeltaNet token mixer (Qwen3-Next), from its fused input projections.";
  let description = [{
    `qkvz: [T, 2*Hk*dk + 2*Hv*dv]` and `ba: [T, 2*Hv]` in the grouped
    per-key-head layout of `in_proj_qkvz` / `in_proj_ba`; short causal
    depthwise convolution (`conv_weight: [2*Hk*dk + Hv*dv, 1, K]`) and SiLU
    on q, k, v; `beta = sigmoid(b)`, `g = -exp(A_log) * softplus(a +
    dt_bias)`; L2-normed q, k; the gated delta rule; per-head RMSNorm
    (`norm_weight: [dv]`) gated by SiLU(z). Output `[T, Hv*dv]`, before
    `out_proj`.
  }];
  let arguments = (ins Moe_Tensor:$qkvz, Moe_Tensor:$ba, Moe_Tensor:$conv_weight,
                   Moe_Tensor:$a_log, Moe_Tensor:$dt_bias, Moe_Tensor:$norm_weight,
                   I64Attr:$num_key_heads, I64Attr:$num_value_heads,
                   I64Attr:$key_head_dim, I64Attr:$value_head_dim, F64Attr:$eps);
  let results = (outs Moe_Tensor:$result);
  let assemblyFormat = [{
    $qkvz `,` $ba `,` $conv_weight `,` $a_log `,` $dt_bias `,` $norm_weight attr-dict
    `:` functional-type(operands, results)
  }];
}

def Moe_KDAOp : Moe_ComputeOp<"kda"> {
  let summary = "Kimi Delta Attention token mixer (Kimi-Linear).";
  let description = [{
    `query`, `key`, `value: [T, H*d]` (projections), each through its own
    short causal conv (`[H*d, 1, K]`) and SiLU; per-channel decay
    `g = -exp(A_log) * softplus(decay + dt_bias)` from `decay: [T, H*d]`
    (`f_b_proj(f_a_proj(x))`); `beta = sigmoid(beta_logits: [T, H])`; the
    delta rule with a diagonal decay; per-head RMSNorm (`norm_weight: [d]`)
    times `sigmoid(gate: [T, H*d])` (`g_b_proj(g_a_proj(x))`). Output
    `[T, H*d]`, before `o_proj`.
  }];
  let arguments = (ins Moe_Tensor:$query, Moe_Tensor:$key, Moe_Tensor:$value,
                   Moe_Tensor:$query_conv, Moe_Tensor:$key_conv, Moe_Tensor:$value_conv,
                   Moe_Tensor:$decay, Moe_Tensor:$beta_logits, Moe_Tensor:$gate,
                   Moe_Tensor:$a_log, Moe_Tensor:$dt_bias, Moe_Tensor:$norm_weight,
                   I64Attr:$num_heads, I64Attr:$head_dim, F64Attr:$eps);
  let results = (outs Moe_Tensor:$result);
  let assemblyFormat = [{
    $query `,` $key `,` $value `,` $query_conv `,` $key_conv `,` $value_conv `,` $decay `,`
    $beta_logits `,` $gate `,` $a_log `,` $dt_bias `,` $norm_weight attr-dict
    `:` functional-type(operands, results)
  }];
}

def Moe_Mamba2Op : Moe_ComputeOp<"mamba2"> {
  let summary = "Mamba-2 mixer (Nemotron-H), from the fused in_proj output.";
  let description = [{
    `zxbcdt: [T, 2*H*p + 2*G*N + H]` splits into the gate `z`, the conv
    input `xBC` (causal depthwise conv `conv_weight: [H*p + 2*G*N, 1, K]`,
    optional bias, SiLU) and `dt`; `dt = max(softplus(dt + dt_bias),
    time_step_min)` (transformers' torch path clamps; 0 = no clamp),
    `A = -exp(A_log)`; the chunked SSD scan with skip `D`; a gated RMSNorm
    over groups of `H*p/G` (`norm_weight: [H*p]`). Output `[T, H*p]`,
    before `out_proj`.
  }];
  let arguments = (ins Moe_Tensor:$zxbcdt, Moe_Tensor:$conv_weight, Optional<Moe_Tensor>:$conv_bias,
                   Moe_Tensor:$dt_bias, Moe_Tensor:$a_log, Moe_Tensor:$d_skip, Moe_Tensor:$norm_weight,
                   I64Attr:$num_heads, I64Attr:$head_dim, I64Attr:$state_size, I64Attr:$num_groups,
                   I64Attr:$chunk_size, F64Attr:$eps,
                   DefaultValuedAttr<F64Attr, "0.0">:$time_step_min);
  let results = (outs Moe_Tensor:$result);
  let assemblyFormat = [{
    $zxbcdt `,` $conv_weight (`conv_bias` $conv_bias^)? `,` $dt_bias `,` $a_log `,` $d_skip `,` $norm_weight
    attr-dict `:` functional-type(operands, results)
  }];
}

//===----------------------------------------------------------------------===//
// Routing and experts
//===----------------------------------------------------------------------===//

def Moe_RouterOp : Moe_ComputeOp<"router", [Moe_Tokenwise, AttrSizedOperandSegments], ["backwardUsesResults"]> {
  let summary = "Scores experts and picks the top-k per token.";
  let description = [{
    `weight: [E, D]`. `softmax`: softmax over all experts, top-k.
    `sigmoid`: per-expert sigmoid; top-k on scores plus the optional
    `correction_bias: [E]`, within the `topk_group` best of `n_group` expert
    groups (a group scores as the sum of its two best biased scores); the
    weights are the unbiased scores. `topk_softmax`: top-k on raw logits,
    softmax over the k. Then optional renormalisation (`norm_topk_prob`)
    and multiplication by `scaling`. Outputs `weights: [T, k]` (f32) and
    `indices: [T, k]` (i32).

    ```mlir
    %w, %i = moe.router %x, %wr {top_k = 2 : i64, scoring = #moe<scoring softmax>, norm_topk_prob}
        : (tensor<?x64xf32>, tensor<8x64xf32>) -> (tensor<?x2xf32>, tensor<?x2xi32>)
    ```
  }];
  let arguments = (ins Moe_Tensor:$input, Moe_Tensor:$weight,
                   Optional<Moe_Tensor>:$logit_bias, Optional<Moe_Tensor>:$correction_bias,
                   I64Attr:$top_k, Moe_RouterScoringAttr:$scoring,
                   DefaultValuedAttr<I64Attr, "1">:$n_group,
                   DefaultValuedAttr<I64Attr, "1">:$topk_group,
                   UnitAttr:$norm_topk_prob,
                   DefaultValuedAttr<F64Attr, "1.0">:$scaling);
  let results = (outs RankedTensorOf<[F32]>:$weights, RankedTensorOf<[I32]>:$indices);
  let assemblyFormat = [{
    $input `,` $weight (`logit_bias` $logit_bias^)? (`correction_bias` $correction_bias^)?
    attr-dict `:` functional-type(operands, results)
  }];
  let extraClassDeclaration = [{
    int64_t getNumExperts() {
      return ::llvm::cast<::mlir::RankedTensorType>(getWeight().getType()).getDimSize(0);
    }
  }];
}

def Moe_DispatchOp : Moe_ComputeOp<"dispatch", [Moe_Tokenwise]> {
  let summary = "Permutes token copies into expert-major order.";
  let description = [{
    Each token goes to its k experts: `input: [T, D]`, `indices: [T, k]`
    -> `tokens: [T*k, D]` grouped by expert, and `counts: [E]` rows per
    expert. A negative index is an expert on another rank (what
    `moe.ep_route` gives): that copy is not made, and the rows past the
    counted ones are room.
  }];
  let arguments = (ins Moe_Tensor:$input, Moe_IndexTensor:$indices, I64Attr:$num_experts);
  let results = (outs Moe_Tensor:$tokens, RankedTensorOf<[I64]>:$counts);
  let assemblyFormat = "$input `,` $indices attr-dict `:` functional-type(operands, results)";
}

def Moe_ExpertMLPOp : Moe_ComputeOp<"expert_mlp", [Moe_Tokenwise, AttrSizedOperandSegments]> {
  let summary = "Every expert's MLP over its rows of the dispatched tokens (grouped GEMM).";
  let description = [{
    Rows `[offset_e, offset_e + counts[e])` of `tokens` go through expert
    `e`; rows past the counted ones (an expert-parallel rank's received rows
    have room for every row any rank could send) are zero in the result. With `gate` (`[E, I, D]`): `down(act(gate x) * up x)`; without:
    `down(act(up x))` (relu² experts). Weights stack the experts in their
    leading dimension in the checkpoint's `[out, in]` layout: `up: [E, I,
    D]`, `down: [E, D, I]`. gpt-oss stores `[in, out]` with gate and up
    interleaved in one tensor (`fused_gate_up`, `in_out_layout`) and adds
    biases.

    Expert LoRA: each projection may carry one adapter per expert, `A: [E,
    r, in]` and `B: [E, out, r]` in PEFT's per-expert layout, adding
    `lora_scale * B_e (A_e x)` to that projection's output for expert `e`.

    An optional second result `pre_activations: [rows, 2 I]` (f32: the
    products' accumulators, what a backward would compute again) holds each
    row's `gate x` in columns `[0, I)` and `up x` in `[I, 2 I)` (zero past
    the counted rows). Only gated SiLU experts with a
    separate gate, no biases and no LoRA have it:
    `--moe-build-training-step` adds it to the expert MLPs of layers that
    save their activations (`recompute=none`) where the experts' backward is
    fused with the combine's, so that the backward reads the pre-activations
    instead of running the gate and up products again.

    ```mlir
    %y = moe.expert_mlp %t, %counts, up %up, down %down gate %gate
        up_lora %ua, %ub down_lora %da, %db {activation = #moe<activation silu>, lora_scale = 2.0 : f64}
        : (...) -> tensor<?x2048xbf16>
    ```
  }];
  let arguments = (ins Moe_Tensor:$tokens, RankedTensorOf<[I64]>:$counts,
                   Moe_Tensor:$up, Moe_Tensor:$down, Optional<Moe_Tensor>:$gate,
                   Optional<Moe_Tensor>:$up_bias, Optional<Moe_Tensor>:$down_bias,
                   Optional<Moe_Tensor>:$gate_lora_a, Optional<Moe_Tensor>:$gate_lora_b,
                   Optional<Moe_Tensor>:$up_lora_a, Optional<Moe_Tensor>:$up_lora_b,
                   Optional<Moe_Tensor>:$down_lora_a, Optional<Moe_Tensor>:$down_lora_b,
                   Moe_ActivationAttr:$activation, UnitAttr:$fused_gate_up, UnitAttr:$in_out_layout,
                   OptionalAttr<F64Attr>:$limit, OptionalAttr<F64Attr>:$lora_scale);
  let results = (outs Moe_Tensor:$result, Optional<RankedTensorOf<[F32]>>:$pre_activations);
  let assemblyFormat = [{
    $tokens `,` $counts `,` `up` $up `,` `down` $down (`gate` $gate^)? (`up_bias` $up_bias^)?
    (`down_bias` $down_bias^)? (`gate_lora` $gate_lora_a^ `,` $gate_lora_b)?
    (`up_lora` $up_lora_a^ `,` $up_lora_b)? (`down_lora` $down_lora_a^ `,` $down_lora_b)?
    attr-dict `:` functional-type(operands, results)
  }];
  let extraClassDeclaration = [{
    int64_t getNumExperts() {
      return ::llvm::cast<::mlir::RankedTensorType>(getUp().getType()).getDimSize(0);
    }
  }];
}

def Moe_CombineOp : Moe_ComputeOp<"combine", [Moe_Tokenwise]> {
  let summary = "Un-permutes expert outputs and sums each token's k copies by router weight.";
  let description = [{
    The inverse of `moe.dispatch` with the same `indices`: `result[t] = Σ_j
    weights[t, j] * expert_output[row of (t, j)]`, slots in order, f32
    accumulation. A negative index (an expert on another rank) adds nothing;
    its weight's gradient is zero here.
  }];
  let arguments = (ins Moe_Tensor:$expert_output, Moe_IndexTensor:$indices,
                   RankedTensorOf<[F32]>:$weights);
  let results = (outs Moe_Tensor:$result);
  let assemblyFormat = [{
    $expert_output `,` $indices `,` $weights attr-dict `:` functional-type(operands, results)
  }];
}

//===----------------------------------------------------------------------===//
// Adapters
//===----------------------------------------------------------------------===//

def Moe_LoRAOp : Moe_ComputeOp<"lora", [Moe_Tokenwise]> {
  let summary = "A LoRA adapter's update: scale * (x A^T) B^T.";
  let description = [{
    `lora_a: [r, in]`, `lora_b: [out, r]` in PEFT's layout, of the input's
    element type or f32 (adapters stay f32 on a bf16 model, as PEFT keeps
    them); the result (the input's element type or f32) is added to the frozen
    projection's output. `scale` is `alpha / r`;
    `dropout` applies to `x` during training only.

    ```mlir
    %d = moe.lora %x, %a, %b {scale = 2.0 : f64} : (tensor<?x64xf32>, tensor<4x64xf32>, tensor<64x4xf32>) -> tensor<?x64xf32>
    ```
  }];
  let arguments = (ins Moe_Tensor:$input, Moe_Tensor:$lora_a, Moe_Tensor:$lora_b, F64Attr:$scale,
                   DefaultValuedAttr<F64Attr, "0.0">:$dropout);
  let results = (outs Moe_Tensor:$result);
  let assemblyFormat = "$input `,` $lora_a `,` $lora_b attr-dict `:` functional-type(operands, results)";
}

def Moe_LoRALinearOp : Moe_ComputeOp<"lora_linear", [Moe_Tokenwise]> {
  let summary = "A projection with its LoRA adapter in one: x W^T + scale * (x A^T) B^T (--moe-fuse-lora).";
  let description = [{
    What a `moe.linear` (no bias), the `moe.lora` of the same input and the
    `moe.add` of the two compute, as one op: its kernel adds the low-rank
    update onto the projection's output as it writes it (no f32 update
    written and read back), and its backward adds the adapter's part of the
    input gradient onto the projection's (no separate sum). `weight: [out,
    in]`; `lora_a`, `lora_b`, `scale` and `dropout` as on `moe.lora`; the
    result has the type the `moe.add` had (the projection's). `base_type`
    is where the unfused ops rounded: the projection's own output, and its
    own input gradient, are rounded to it before the adapter's part is added
    (bf16 on a bf16 model, as PEFT's base layer rounds its output; absent:
    f32).

    ```mlir
    %y = moe.lora_linear %x, %w, %a, %b {base_type = f32, scale = 2.0 : f64}
        : (tensor<?x64xf32>, tensor<32x64xf32>, tensor<4x64xf32>, tensor<32x4xf32>) -> tensor<?x32xf32>
    ```
  }];
  let arguments = (ins Moe_Tensor:$input, Moe_Tensor:$weight, Moe_Tensor:$lora_a, Moe_Tensor:$lora_b,
                   F64Attr:$scale, DefaultValuedAttr<F64Attr, "0.0">:$dropout,
                   OptionalAttr<TypeAttrOf<AnyFloat>>:$base_type);
  let results = (outs Moe_Tensor:$result);
  let assemblyFormat = [{
    $input `,` $weight `,` $lora_a `,` $lora_b attr-dict `:` functional-type(operands, results)
  }];
}

//===----------------------------------------------------------------------===//
// Loss
//===----------------------------------------------------------------------===//

def Moe_CrossEntropyOp : Moe_ComputeOp<"cross_entropy"> {
  let summary = "Mean causal-LM cross-entropy over labelled positions.";
  let description = [{
    `logits: [T, V]`, `labels: [T]`. With `shift_labels` position `t` is
    scored against `labels[t+1]` (Hugging Face's causal-LM shift); labels
    equal to `ignore_index` do not count. Result: a scalar f32.
  }];
  let arguments = (ins Moe_Tensor:$logits, Moe_IndexTensor:$labels,
                   DefaultValuedAttr<I64Attr, "-100">:$ignore_index, UnitAttr:$shift_labels);
  let results = (outs 0DTensorOf<[F32]>:$loss);
  let assemblyFormat = "$logits `,` $labels attr-dict `:` functional-type(operands, results)";
}

def Moe_ShiftLabelsOp : Moe_ComputeOp<"shift_labels"> {
  let summary = "Each position's next label, per sequence (the causal-LM shift, done once).";
  let description = [{
    `labels: [T]`, T a whole number of sequences of the step's `seq_len`:
    position t takes `labels[t + 1]`, and the last position of each
    sequence takes `ignore_index`. `moe.cross_entropy` with `shift_labels`
    on `labels` scores what it scores without, on the result. Sequence
    parallel shifts before each rank takes its rows: a rank's last position
    is scored against the next rank's first label.

    ```mlir
    %next = moe.shift_labels %labels {ignore_index = -100 : i64} : tensor<?xi64> -> tensor<?xi64>
    ```
  }];
  let arguments = (ins Moe_IndexTensor:$labels, DefaultValuedAttr<I64Attr, "-100">:$ignore_index);
  let results = (outs Moe_IndexTensor:$result);
  let assemblyFormat = "$labels attr-dict `:` type($labels) `->` type($result)";
}

def Moe_LMHeadCrossEntropyOp : Moe_ComputeOp<"lm_head_cross_entropy", [], ["backwardUsesResults"]> {
  let summary = "The LM head and the causal-LM loss in one, chunked over tokens (--moe-fuse).";
  let description = [{
    `moe.cross_entropy(moe.linear(input, weight), labels)` without the
    `[T, V]` logits: `input: [T, H]`, `weight: [V, H]` (the LM head, or the
    tied embedding), `labels: [T]`; `ignore_index` and `shift_labels` as on
    `moe.cross_entropy` (mean over the counted positions, 0 when none
    counts). The kernels compute `chunk_tokens` rows of logits at a time in
    scratch memory, so neither the logits nor their gradient ever exist
    whole.

    Rounding: each chunk of logits is rounded to `logits_type` (f32
    accumulation first), the element type the unfused head's logits had:
    the input's, bf16 on a bf16 model, exactly where the unfused
    `moe.linear` rounds its result. The softmax and the loss are f32, and
    the logits' gradient is rounded to `logits_type` before its products,
    as the unfused `moe.cross_entropy` backward's result is. `logits_type`
    must be the input's element type and may be left out only when that is
    f32: it spells out what the input's type implies because a backend that
    emulates bf16 storage in f32 buffers (the CPU's) cannot see it on the
    tensors.

    Results: the loss (a scalar f32) and `logsumexp: [T]` (f32), the log of
    each counted row's softmax denominator (0 on rows that do not count),
    which the backward reads instead of reducing every row again. The
    backward recomputes each chunk's logits (one more `[T, H] x [H, V]`
    product) and writes the gradient of `input` and, when the weight is
    trainable, of `weight`.

    An optional third result `input_grad: [T, H]` (the input's type) is the
    gradient of the loss with respect to `input` for a loss gradient of 1,
    formed in the forward while each chunk's logits are at hand (d logits
    rounded to `logits_type` as the backward rounds them). The backward then
    only scales it by the loss's gradient: no logits are computed again.
    `--moe-fuse` adds it when the head's weight takes no gradient (LoRA
    training).

    ```mlir
    %loss, %lse = moe.lm_head_cross_entropy %h, %head, %labels
        {shift_labels, chunk_tokens = 1024 : i64, logits_type = bf16}
        : (tensor<?x2048xbf16>, tensor<151936x2048xbf16>, tensor<?xi64>) -> (tensor<f32>, tensor<?xf32>)
    ```
  }];
  let arguments = (ins Moe_Tensor:$input, Moe_Tensor:$weight, Moe_IndexTensor:$labels,
                   DefaultValuedAttr<I64Attr, "-100">:$ignore_index, UnitAttr:$shift_labels,
                   DefaultValuedAttr<I64Attr, "1024">:$chunk_tokens,
                   OptionalAttr<TypeAttrOf<AnyFloat>>:$logits_type);
  let results = (outs 0DTensorOf<[F32]>:$loss, RankedTensorOf<[F32]>:$logsumexp,
                      Optional<Moe_Tensor>:$input_grad);
  let assemblyFormat = [{
    $input `,` $weight `,` $labels attr-dict `:` functional-type(operands, results)
  }];
}

//===----------------------------------------------------------------------===//
// Training: built by --moe-build-training-step
//===----------------------------------------------------------------------===//

def Moe_FillOp : Moe_Op<"fill", [Pure]> {
  let summary = "A tensor with every element equal to `value`.";
  let description = [{
    The training step seeds the backward pass with `d loss / d loss`: a
    scalar 1.0 (a runtime accumulating micro-batches may scale it).

    ```mlir
    %seed = moe.fill 1.0 : tensor<f32>
    ```
  }];
  let arguments = (ins F64Attr:$value);
  let results = (outs AnyStaticShapeTensor:$result);
  let assemblyFormat = "$value attr-dict `:` type($result)";
}

def Moe_BackwardOp : Moe_Op<"backward", [Pure, AttrSizedOperandSegments]> {
  let summary = "The backward of one forward op: gradients of the requested inputs.";
  let description = [{
    Emitted by an op's default differentiation rule. `forward` names the
    forward op and `forward_attrs` carries its attributes; `inputs` are the
    forward op's operands (saved or recomputed values), `outputs` its
    results when its rule needs them (the router's chosen experts),
    `output_grads` the
    gradients arriving at the forward results listed in `grad_of_outputs`
    (the others contribute zero). There is one result per entry of
    `grad_of_inputs`: the gradient of that forward operand. The runtime's
    kernel is `<forward op without "moe.">.backward`.

    One `forward` names a pair of ops rather than one:
    `"moe.expert_mlp_combine"`, the backward of a `moe.combine` of a
    `moe.expert_mlp`'s outputs in one (`--moe-build-training-step`'s
    `expert-backward`): its inputs are the expert MLP's operands
    (`forward_attrs` are its attributes), then the combine's indices and
    weights; no expert output among them. Its `outputs` are the expert
    MLP's `pre_activations` where it saves them (else none).

    ```mlir
    %dx = moe.backward "moe.linear"(%x, %w) grads(%dy)
        {forward_attrs = {}, grad_of_inputs = array<i64: 0>, grad_of_outputs = array<i64: 0>}
        : (tensor<?x64xf32>, tensor<64x64xf32>, tensor<?x64xf32>) -> tensor<?x64xf32>
    ```
  }];
  let arguments = (ins StrAttr:$forward, DictionaryAttr:$forward_attrs,
                   DenseI64ArrayAttr:$grad_of_inputs, DenseI64ArrayAttr:$grad_of_outputs,
                   Variadic<AnyType>:$inputs, Variadic<AnyType>:$outputs,
                   Variadic<AnyType>:$output_grads);
  let results = (outs Variadic<AnyType>:$input_grads);
  let assemblyFormat = [{
    $forward `(` $inputs `)` (`outputs` `(` $outputs^ `)`)? `grads` `(` $output_grads `)` attr-dict
    `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// The runtime kernel that computes this backward ("linear.backward").
    std::string getKernelName();
  }];
}

def Moe_ParamGradOp : Moe_Op<"param_grad", [DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "Accumulates a gradient into a trainable parameter's gradient buffer.";
  let description = [{
    Only trainable parameters have gradients; inside a layer template the
    gradient belongs to the parameter of the layer being run.

    ```mlir
    moe.param_grad @q_proj_lora_A, %da : tensor<4x64xf32>
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$param, AnyRankedTensor:$grad);
  let assemblyFormat = "$param `,` $grad attr-dict `:` type($grad)";
}

def Moe_OptimizerOp : Moe_Op<"optimizer", [HasParent<"ModelOp">]> {
  let summary = "The optimizer and learning-rate schedule of the training step.";
  let description = [{
    AdamW over every trainable parameter. The learning rate warms up
    linearly for `warmup_steps`, then decays along a cosine to
    `min_lr_ratio * lr` at `total_steps` (`schedule = "constant"` keeps
    it flat); the global gradient norm is clipped to `max_grad_norm`
    (0 = off) before the update.

    ```mlir
    moe.optimizer {kind = "adamw", lr = 1.0e-4 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64,
                   eps = 1.0e-8 : f64, weight_decay = 0.0 : f64, warmup_steps = 10 : i64,
                   total_steps = 1000 : i64, schedule = "cosine", min_lr_ratio = 0.1 : f64,
                   max_grad_norm = 1.0 : f64}
    ```
  }];
  let arguments = (ins StrAttr:$kind, F64Attr:$lr, F64Attr:$beta1, F64Attr:$beta2, F64Attr:$eps,
                   F64Attr:$weight_decay, I64Attr:$warmup_steps, I64Attr:$total_steps,
                   StrAttr:$schedule, F64Attr:$min_lr_ratio, F64Attr:$max_grad_norm);
  let assemblyFormat = "attr-dict";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Collectives: inserted by --moe-propagate-sharding
//===----------------------------------------------------------------------===//

def Moe_AllReduceGradsOp : Moe_Op<"all_reduce_grads"> {
  let summary = "Sums the gradients one layer instance accumulated over a mesh axis.";
  let description = [{
    After a layer's backward, the gradients of the trainable parameters it
    accumulated (every `moe.param_grad` of that instance's template) are
    summed over the ranks of `axis`: the ranks that computed the same
    parameters on different tokens. `layer` is the layer index (-1: the
    model-level parameters, after the whole backward). One op per layer is
    one bucket, so the reduction of layer i can run while layer i-1's
    backward computes. `axis` names mesh axes joined by `+` ("dp",
    "dp+ep": a replicated parameter sees the tokens of both). With
    `experts`, the bucket holds only the gradients of parameters split over
    `ep` (summed over `dp`: each expert-parallel rank owns its experts);
    with `tp_partial`, only replicated parameters of which each
    tensor-parallel rank holds a partial gradient (read inside a split
    attention, or on a tp rank's rows: summed over `tp` too); with both,
    parameters split over `ep` of which each tp rank holds a partial
    gradient (sequence parallel: each tp rank's rows go to the experts;
    summed over `dp+tp`); without either, the others.

    ```mlir
    moe.all_reduce_grads {axis = "dp+ep", layer = 3 : i64}
    moe.all_reduce_grads {axis = "dp", experts, layer = 3 : i64}
    moe.all_reduce_grads {axis = "dp+ep+tp", layer = 3 : i64, tp_partial}
    moe.all_reduce_grads {axis = "dp+tp", experts, layer = 3 : i64, tp_partial}
    ```
  }];
  let arguments = (ins StrAttr:$axis, I64Attr:$layer, UnitAttr:$experts, UnitAttr:$tp_partial);
  let assemblyFormat = "attr-dict";
}

// Expert parallel: inserted by --moe-propagate-sharding. Each token travels once to
// every rank that holds one of its experts (not once per expert), and each rank
// returns one partial sum per token it received.
//
// Pure: a function of its operands when every rank runs it (they all run the same program),
// so a backward that does not read it drops it like any other forward op.
def Moe_EpRouteOp : Moe_Op<"ep_route", [Pure, Moe_Tokenwise]> {
  let summary = "Decides which ranks each token goes to (expert parallel) and sends them its experts.";
  let description = [{
    The `ranks` ranks of `axis` each hold `num_experts / ranks` consecutive
    experts (rank j: `[j E/ranks, (j+1) E/ranks)`). `indices: [T, k]` are
    this rank's tokens' experts. A token goes to every rank that holds at
    least one of its k experts, once. Results: `local_indices: [ranks T, k]`,
    the tokens this rank receives, grouped by source rank (in token order
    within a source), each with its experts as this rank's local expert
    numbers and -1 where the expert lives on another rank (only the first
    rows, as many as were received, are its value; the rest is room for
    every token of every rank); `layout: [2, 2 ranks]` (i64), the tokens and
    expert copies this rank sends to each rank (row 0) and receives from each
    rank (row 1), which `moe.ep_send` and `moe.ep_return` of the same layer
    use. Not
    differentiable (indices only).

    With `all_tokens`, every token goes to every rank (a token without an
    expert there has k times -1): the messages have fixed sizes, so no rank
    waits for its tokens' experts on the host; the layout's copy counts are
    then -1 (not counted). The compiler picks it where nearly every token
    has an expert on every rank anyway (`--ep-exchange`).

    With `capacity_factor` F (at least 1; routed only), the plan keeps room
    for F times what uniform routing sends this rank instead of room for
    every token of every rank: F x ranks x T x (the chance that a token has
    an expert here) received tokens and F x T x k expert copies, each at
    most the worst case. A step whose routing needs more fails on every rank
    with a message naming the route (`moec --ep-capacity-factor`).

    ```mlir
    %local, %layout = moe.ep_route %indices {axis = "ep", ranks = 2 : i64, num_experts = 8 : i64}
        : (tensor<?x2xi32>) -> (tensor<?x2xi32>, tensor<2x4xi64>)
    %all, %fixed = moe.ep_route %indices {all_tokens, axis = "ep", ranks = 2 : i64, num_experts = 128 : i64}
        : (tensor<?x8xi32>) -> (tensor<?x8xi32>, tensor<2x4xi64>)
    ```
  }];
  let arguments = (ins Moe_IndexTensor:$indices, StrAttr:$axis, I64Attr:$ranks, I64Attr:$num_experts,
                       UnitAttr:$all_tokens, OptionalAttr<F64Attr>:$capacity_factor);
  let results = (outs Moe_IndexTensor:$local_indices, RankedTensorOf<[I64]>:$layout);
  let assemblyFormat = "$indices attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Moe_EpSendOp : Moe_Op<"ep_send", [Pure, Moe_Tokenwise,
    DeclareOpInterfaceMethods<Moe_DifferentiableOpInterface, ["buildBackward"]>]> {
  let summary = "Sends each token's row to the ranks that hold its experts (expert parallel).";
  let description = [{
    `input: [T, W]` holds one row per token of this rank (the hidden state,
    or the router weights); each row goes to the ranks `layout` (from
    `moe.ep_route`) names. The result `[ranks T, W]` holds the rows this rank
    receives in the order of `moe.ep_route`'s `local_indices` (the rest is
    room). The backward is `moe.ep_return` of the gradient: a token's
    gradient is the sum of what every rank it went to computes.

    ```mlir
    %rows = moe.ep_send %x, %layout {axis = "ep", ranks = 2 : i64}
        : (tensor<?x64xf32>, tensor<2x4xi64>) -> tensor<?x64xf32>
    ```
  }];
  let arguments = (ins Moe_Tensor:$input, RankedTensorOf<[I64]>:$layout, StrAttr:$axis, I64Attr:$ranks);
  let results = (outs Moe_Tensor:$result);
  let assemblyFormat = "$input `,` $layout attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Moe_EpReturnOp : Moe_Op<"ep_return", [Pure, Moe_Tokenwise,
    DeclareOpInterfaceMethods<Moe_DifferentiableOpInterface, ["buildBackward"]>]> {
  let summary = "Returns each received token's row to its source rank, summed there (expert parallel).";
  let description = [{
    The inverse of `moe.ep_send`: `input: [ranks T, W]` holds a row per
    received token (a rank's partial sum of its experts' outputs); each goes
    back to the rank it came from, and the result `[T, W]` is, per token of
    this rank, the sum over the ranks it went to, in rank order (f32
    accumulation; f32 rows may sum into a narrower result, rounded once).
    The backward is `moe.ep_send` of the gradient.

    ```mlir
    %y = moe.ep_return %partial, %layout {axis = "ep", ranks = 2 : i64}
        : (tensor<?x64xf32>, tensor<2x4xi64>) -> tensor<?x64xf32>
    ```
  }];
  let arguments = (ins Moe_Tensor:$input, RankedTensorOf<[I64]>:$layout, StrAttr:$axis, I64Attr:$ranks);
  let results = (outs Moe_Tensor:$result);
  let assemblyFormat = "$input `,` $layout attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

// Token blocks: with `token-blocks = N`, --moe-propagate-sharding runs each MoE block's expert
// exchange on N blocks of its tokens, so that --moe-schedule-overlap can send one block while
// the experts compute another.
def Moe_TokenBlocksOp : Moe_Op<"token_blocks", [Pure, Moe_Tokenwise,
    DeclareOpInterfaceMethods<Moe_DifferentiableOpInterface, ["buildBackward"]>]> {
  let summary = "Splits the token rows into consecutive blocks (expert-exchange overlap).";
  let description = [{
    With `n` rows and `N` results, block `b` is rows `[b n / N, (b + 1) n / N)`
    of the leading dimension; the other dimensions and the element type are
    the input's (token rows of any type: hidden states, router weights,
    expert indices). The backward is `moe.concat_tokens` of the blocks'
    gradients.

    ```mlir
    %x0, %x1 = moe.token_blocks %x : tensor<?x64xf32> -> tensor<?x64xf32>, tensor<?x64xf32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$input);
  let results = (outs Variadic<AnyRankedTensor>:$blocks);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($blocks)";
  let hasVerifier = 1;
}

def Moe_ConcatTokensOp : Moe_Op<"concat_tokens", [Pure, Moe_Tokenwise,
    DeclareOpInterfaceMethods<Moe_DifferentiableOpInterface, ["buildBackward"]>]> {
  let summary = "Joins token blocks back into one tensor (the inverse of moe.token_blocks).";
  let description = [{
    The operands are the blocks `moe.token_blocks` makes of `n` rows (block
    `b` has `(b + 1) n / N - b n / N` rows), in order; the result has their
    `n` rows. The backward is `moe.token_blocks` of the result's gradient.

    ```mlir
    %y = moe.concat_tokens %y0, %y1 : tensor<?x64xf32>, tensor<?x64xf32> -> tensor<?x64xf32>
    ```
  }];
  let arguments = (ins Variadic<AnyRankedTensor>:$blocks);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$blocks attr-dict `:` type($blocks) `->` type($result)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Pipeline parallel: inserted by --moe-schedule-pipeline
//===----------------------------------------------------------------------===//

def Moe_MicrobatchOp : Moe_Op<"microbatch", [Pure]> {
  let summary = "One micro-batch's rows of a step input (pipeline parallel).";
  let description = [{
    A pipelined step takes `count` micro-batches at once; micro-batch
    `index` is rows `[index n / count, (index + 1) n / count)` of the
    leading dimension (`n` rows). A rank-0 result takes element `index` of
    a 1-D input of `count` elements (a micro-batch's loss weight).

    ```mlir
    %ids1 = moe.microbatch %ids {index = 1 : i64, count = 4 : i64} : tensor<?xi64> -> tensor<?xi64>
    %w1 = moe.microbatch %weights {index = 1 : i64, count = 4 : i64} : tensor<4xf32> -> tensor<f32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$input, I64Attr:$index, I64Attr:$count);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def Moe_StageExchangeOp : Moe_Op<"stage_exchange"> {
  let summary = "Sends to and receives from the neighbouring pipeline stage, grouped.";
  let description = [{
    Point-to-point between this rank and the rank of stage `peer` that
    shares its other mesh coordinates: `send` (if given) goes there, and
    `received` (if present) comes from there. One op is one grouped
    exchange, so two neighbouring stages that both send in the same slot of
    the 1F1B schedule never wait on each other; both sides issue their
    exchanges with each other in the same order. `backward` marks an
    exchange of the backward pass (a gradient goes to the previous stage
    or comes from the next). `received` has the rows of one micro-batch.

    ```mlir
    moe.stage_exchange send(%h : tensor<?x64xf32>) {peer = 1 : i64}
    %dh = moe.stage_exchange send(%h1 : tensor<?x64xf32>) {peer = 1 : i64} -> tensor<?x64xf32>
    ```
  }];
  let arguments = (ins Optional<AnyRankedTensor>:$send, I64Attr:$peer, UnitAttr:$backward);
  let results = (outs Optional<AnyRankedTensor>:$received);
  let assemblyFormat = "(`send` `(` $send^ `:` type($send) `)`)? attr-dict (`->` type($received)^)?";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Tensor parallel: inserted by --moe-propagate-sharding
//===----------------------------------------------------------------------===//

def Moe_TpEnterOp : Moe_Op<"tp_enter", [Pure, SameOperandsAndResultType,
    DeclareOpInterfaceMethods<Moe_DifferentiableOpInterface, ["buildBackward"]>]> {
  let summary = "Where a replicated value enters a tensor-parallel region (identity).";
  let description = [{
    Every rank of `axis` holds the same `input`; the ops after this one
    compute that rank's part (its attention heads). The forward is the
    identity; the backward sums the parts' gradients over `axis`
    (`moe.tp_exit` on the gradient), since each rank's heads contribute to
    the input's gradient.

    With `rows` (sequence parallel) each rank holds its rows of the input
    (rank r: rows [r T / n, (r + 1) T / n) of T over n ranks) and the region
    reads all of them: the forward gathers the rows over `axis`
    (all-gather), and the backward sums the parts' gradients and gives each
    rank its rows (reduce-scatter: `moe.tp_exit` with `rows`).

    ```mlir
    %x1 = moe.tp_enter %x {axis = "tp"} : tensor<?x64xf32>
    %x2 = moe.tp_enter %shard {axis = "tp", rows} : tensor<?x64xf32>
    ```
  }];
  let arguments = (ins Moe_Tensor:$input, StrAttr:$axis, UnitAttr:$rows);
  let results = (outs Moe_Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Moe_TpExitOp : Moe_Op<"tp_exit", [Pure,
    DeclareOpInterfaceMethods<Moe_DifferentiableOpInterface, ["buildBackward"]>]> {
  let summary = "Sums the ranks' partial results of a tensor-parallel region (all-reduce).";
  let description = [{
    Each rank of `axis` holds a partial sum (its heads' share of the output
    projection); the result, the same on every rank, is their sum: of the
    input's type, or an f32 sum rounded once to a narrower result (an
    expert's output, rounded where one GPU's expert MLP rounds it). The
    backward is the identity: every rank's part depends on the sum the same
    way.

    With `rows` (sequence parallel) each rank keeps only its rows of the sum
    (reduce-scatter), and the backward gathers the rows' gradients over
    `axis` (all-gather: `moe.tp_gather`).

    ```mlir
    %y = moe.tp_exit %partial {axis = "tp"} : tensor<?x64xf32> -> tensor<?x64xf32>
    %e = moe.tp_exit %experts {axis = "tp"} : tensor<?x64xf32> -> tensor<?x64xbf16>
    %s = moe.tp_exit %partial {axis = "tp", rows} : tensor<?x64xf32> -> tensor<?x64xf32>
    ```
  }];
  let arguments = (ins Moe_Tensor:$input, StrAttr:$axis, UnitAttr:$rows);
  let results = (outs Moe_Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def Moe_TpSumOp : Moe_Op<"tp_sum", [Pure, SameOperandsAndResultType,
    DeclareOpInterfaceMethods<Moe_DifferentiableOpInterface, ["buildBackward"]>]> {
  let summary = "Sums a statistic over a mesh axis inside a tensor-parallel region (all-reduce).";
  let description = [{
    Each rank of `axis` holds a part of a sum that every rank's split work
    reads again (the sum of squares of rows whose features are split: a
    sharded RMSNorm). The result, the same on every rank, is the sum. Unlike
    `moe.tp_exit`, whose readers compute the same on every rank, each rank's
    readers contribute their own part of the result's gradient: the backward
    is the sum over `axis` again.

    ```mlir
    %all = moe.tp_sum %mine {axis = "tp"} : tensor<?x1xf32>
    ```
  }];
  let arguments = (ins Moe_Tensor:$input, StrAttr:$axis);
  let results = (outs Moe_Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
}

def Moe_TpSliceFeaturesOp : Moe_ComputeOp<"tp_slice_features", [Moe_Tokenwise], ["buildBackward"]> {
  let summary = "A tp rank's columns of each part of a value every rank holds whole.";
  let description = [{
    `input: [T, F]` stacks parts of `pieces` columns (in order, summing to
    F) that split over the `ranks` ranks of `axis` separately; rank k keeps
    columns [k P / n, (k + 1) P / n) of each part P, concatenated:
    `[T, F / n]`. No communication: every rank computed the whole input (the
    adapter of a projection whose weight splits in pieces, Mamba-2's
    in_proj). The backward is `moe.tp_place_features` of the gradient: this
    rank's share of the input's gradient, summed where the input's readers
    sum it (`moe.tp_partial_grad`, `moe.tp_enter`).

    ```mlir
    %mine = moe.tp_slice_features %delta {axis = "tp", pieces = array<i64: 32, 32, 16, 16, 4>, ranks = 2 : i64}
        : (tensor<?x100xf32>) -> tensor<?x50xf32>
    ```
  }];
  let arguments = (ins Moe_Tensor:$input, StrAttr:$axis, DenseI64ArrayAttr:$pieces, I64Attr:$ranks);
  let results = (outs Moe_Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
}

def Moe_TpPlaceFeaturesOp : Moe_ComputeOp<"tp_place_features", [Moe_Tokenwise], ["buildBackward"]> {
  let summary = "A tp rank's columns of each part put back in place, zeros elsewhere.";
  let description = [{
    The adjoint of `moe.tp_slice_features` (same attributes): `input:
    [T, F / n]` holds rank k's columns of each part; the result `[T, F]`
    has them where they came from and zeros in the other ranks' columns.
    Its backward is `moe.tp_slice_features` of the gradient.

    ```mlir
    %whole = moe.tp_place_features %grad {axis = "tp", pieces = array<i64: 32, 32, 16, 16, 4>, ranks = 2 : i64}
        : (tensor<?x50xf32>) -> tensor<?x100xf32>
    ```
  }];
  let arguments = (ins Moe_Tensor:$input, StrAttr:$axis, DenseI64ArrayAttr:$pieces, I64Attr:$ranks);
  let results = (outs Moe_Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
}

def Moe_TpGatherOp : Moe_Op<"tp_gather", [Pure, SameOperandsAndResultType,
    DeclareOpInterfaceMethods<Moe_DifferentiableOpInterface, ["buildBackward"]>]> {
  let summary = "Gathers every rank's rows over a mesh axis (all-gather; sequence parallel).";
  let description = [{
    Each rank of `axis` holds its rows of a value (rank r: rows
    [r T / n, (r + 1) T / n) of T over n ranks); the result, the same on
    every rank, has all T rows in rank order. What reads it computes the
    same on every rank (a token mixer kept whole, the logits `@forward`
    returns), so the gradient of each rank's rows is its rows of the
    result's gradient: the backward is `moe.tp_slice`, no communication.

    ```mlir
    %all = moe.tp_gather %shard {axis = "tp"} : tensor<?x64xf32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$input, StrAttr:$axis);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Moe_TpSliceOp : Moe_Op<"tp_slice", [Pure, SameOperandsAndResultType,
    DeclareOpInterfaceMethods<Moe_DifferentiableOpInterface, ["buildBackward"]>]> {
  let summary = "This rank's rows of a value every rank of a mesh axis holds (sequence parallel).";
  let description = [{
    Every rank of `axis` holds the same `input` of T rows; rank r keeps
    rows [r T / n, (r + 1) T / n) (no communication). The backward gathers
    the rows' gradients (`moe.tp_gather`): every rank computed the whole
    input, and needs all of its gradient.

    ```mlir
    %mine = moe.tp_slice %embedded {axis = "tp"} : tensor<?x64xf32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$input, StrAttr:$axis);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
  let hasVerifier = 1;
}

#endif // DIALECTS_MOE_MOEOPS_TD_
