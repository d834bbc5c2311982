//===- PropagateSharding.td - sharding over the mesh -------*- tablegen -*-===//

#ifndef PASSES_PROPAGATE_SHARDING_PROPAGATESHARDING_TD_
#define PASSES_PROPAGATE_SHARDING_PROPAGATESHARDING_TD_

include "mlir/Pass/PassBase.td"

def PropagateShardingPass : Pass<"moe-propagate-sharding", "::moec::moe::ModelOp"> {
  let summary = "Places the model on a device mesh and inserts the collectives its forward needs.";
  let description = [{
    Runs before `--moe-build-training-step` (the training step then
    differentiates through the collectives: each knows its backward), and
    `--moe-sync-gradients` runs after it. The model gets a `mesh` attribute
    (`"dp=2,ep=2"`); every rank runs the same program on its own sequences.

    Data parallel (`dp`): nothing to change in the forward.

    Expert parallel (`ep`): the routed experts split over the `ep` ranks,
    `E / ep` each: consecutive, or as the model's `expert_placement`
    attribute lists them (layer index to an array of the E experts, each
    rank's in turn; moec --expert-placement / --expert-load sets it). A
    placement lists every expert on some rank and none twice on one, as
    many per rank (more than E / ep replicates experts: their params get
    `moe.ep_rows`, the local dispatch counts that many), covers every layer
    of a layer template or none, uses the routed exchange, and is refused
    for experts with adapters. Every parameter an `moe.expert_mlp`
    reads (weights, biases, expert adapters: each rank trains its experts'
    adapters) gets `sharding
    #moe.sharding<[ep, ...]>` and its `moe.weight` the type of one rank's
    part. Each token then travels once to every rank that holds one of its
    experts, not once per expert (top-8 of 128 experts over 2 ranks: one
    copy per rank instead of about four): `moe.ep_route` decides where each
    token goes and gives the received tokens' experts as local numbers (-1:
    on another rank), `moe.ep_send` sends the hidden state and the router
    weights, the local `moe.dispatch` / `moe.expert_mlp` / `moe.combine`
    run on the received tokens (this rank's share of each token's sum), and
    `moe.ep_return` brings each partial sum back to its token's rank, where
    the ranks' parts are added. On bf16 data the partial sums stay f32 (the
    combine writes f32) and the return rounds the ranks' sum once, the
    rounding one GPU's combine makes. The backward of each exchange is the
    other. `ep-exchange` picks how tokens travel: `routed` (as above: the
    route reads the tokens' experts on the host, where NCCL needs the message
    sizes), `all` (`all_tokens` on the route: every token to every rank,
    fixed sizes, no wait for the device; a token without an expert there
    makes no expert copy and a zero partial sum), or `auto` (the default:
    `all` where uniform routing gives a token an expert on a given rank with
    probability at least 0.9, e.g. top-8 of 128 experts over 2 ranks; else
    `routed`). A routed exchange's received rows are room for every token of
    every rank (nothing can overflow, but at ep = 32 and top-16 that is 32
    times what uniform routing fills); `ep-capacity-factor` F >= 1 sets
    `capacity_factor` on the routes instead: room for F times what uniform
    routing sends a rank, and a step whose routing needs more fails on
    every rank with a message that names the route.

    Tensor parallel (`tp`): the heads of every `moe.attention` whose
    projections can be traced split over the `tp` ranks, by the ops'
    sharding rules (Megatron's column and row split): q/k/v projections
    (and their adapters' B) by rows, per-head norms, RoPE, per-head splits
    and output gates follow, the attention keeps `heads / tp` heads, the
    output projection (and its adapter's A) splits by columns and makes a
    partial sum (f32 on narrower data, so the sum over tp is rounded once).
    `moe.tp_enter` marks where the replicated input enters
    (its backward sums the gradient over tp), `moe.tp_exit` sums the
    partial result where a replicated value is needed (the all-reduce).
    Replicated adapters read inside (A of q, B of o) get
    `moe.tp_partial_grad`: `--moe-sync-gradients` sums them over tp too.
    Expert MLPs not split over ep split their intermediate features (up and
    gate by rows, down by columns of each expert). Dispatch and combine are
    linear in the tokens, so `moe.tp_enter` goes before the `moe.dispatch`
    and `moe.tp_exit` after the `moe.combine` (the router, when it serves
    only them, reads the entered tokens: its weights' gradient from the
    partial outputs is partial, and reaches the tokens' gradient through the
    router's backward, summed over tp by the same enter; otherwise its
    weights enter on their own): the all-reduces
    carry a row per token, not a row per expert copy (on bf16 data the
    partial outputs and the combine are f32 and the exit rounds their sum
    once, where one GPU rounds its combine's output).
    Projection biases split with their outputs (q, k, v); an output
    projection's bias is held by tp rank 0 alone (`moe.tp_first_rank`: the
    other ranks bind zeros), so the sum over tp adds it once; attention
    sinks split with their heads (gpt-oss). gpt-oss's experts ([E, in, out]
    weights, gate and up interleaved in column pairs, biases) split the same
    features: each rank a window of whole (gate, up) pairs and its bias, and
    down's rows; down's bias is held by tp rank 0 alone.
    Latent attention (`moe.mla`, DSA's `moe.sparse_attention`) splits its
    heads likewise: query and key_value projections by rows, the output
    projection by columns; the rotated key part, shared by every head,
    enters as a replicated value (its gradient is summed over tp), and the
    DSA indexer stays whole.
    Dense MLPs (a dense layer's, the shared experts'; a `moe.glu` or
    `moe.activation` of projections that a projection reads) split their
    intermediate features by the attention's rules: gate and up (and their
    adapters' B) by rows, down (and its adapter's A) by columns, one
    `moe.tp_exit` of the partial sum. Regions that read one value share
    its `moe.tp_enter`, and two partial sums added together leave through
    one `moe.tp_exit` of their sum (a shared expert's next to the routed
    experts'). Kimi Delta Attention (`moe.kda`) splits its heads the same
    way, with its per-channel convolutions, `dt_bias` and `A_log`; the first
    projection of its low-rank decay and gate stays whole. Gated DeltaNet
    splits its key heads with their value heads (its fused projections hold
    one group per key head; the convolution over q, k and v splits in three
    pieces, `moe.tp_pieces`), Mamba-2 its heads with their groups (`in_proj`
    in five pieces; its adapter whole on every rank, each rank's columns of
    its output's pieces kept: `moe.tp_slice_features`). Everything else (the
    DSA indexer) stays whole: every tp rank computes it; an attention or MLP
    that cannot split is named in a warning, and a model with nothing to
    split fails.

    User annotations: a region's centre op (`moe.attention`, `moe.mla`,
    `moe.sparse_attention`, `moe.kda`, `moe.gated_delta_net`, `moe.mamba2`,
    an MLP's `moe.glu` / `moe.activation`, `moe.expert_mlp`) annotated
    `moe.tp_replicated` stays whole on every tp rank (a remark says so);
    `tp-replicate` annotates every region of the kinds it lists. With
    sequence parallel, routed experts kept whole run on each rank's rows:
    the MoE block then needs no collective at all, for whole expert weights
    on every rank.

    Sequence parallel (`sequence-parallel`, with tp > 1):
    between the split regions each tp rank holds only its rows of the hidden
    states (rank r of n: rows [r T / n, (r + 1) T / n)), so the norms,
    residual adds, routers and everything else an op computes token by token
    (the ops with the `Moe_Tokenwise` trait) run on T / n rows. A region's
    `moe.tp_enter` gets `rows` (an all-gather; its backward a
    reduce-scatter) and its `moe.tp_exit` `rows` (a reduce-scatter instead
    of the all-reduce; its backward an all-gather): the same bytes, 1 / n of
    the norm work, and activations between regions at 1 / n. The expert
    exchange (ep) runs on each tp rank's rows within its ep group (the
    ranks of one tp coordinate); expert adapters split over ep then get
    partial gradients, summed over `dp+tp`. An op that mixes tokens outside a region (a mixer kept whole,
    the DSA indexer) reads its inputs gathered (`moe.tp_gather`) and every
    rank computes it; where its result meets a rank's rows it is sliced
    (`moe.tp_slice`). A router outside the experts' region runs on a
    rank's rows and its indices are gathered for the region's dispatch; the
    embedding's output is sliced and `@forward`'s
    logits gathered; `--moe-build-training-step` then scores each rank's
    rows against its rows of the labels, shifted first (`moe.shift_labels`).
    Trainable parameters read on a rank's rows get `moe.tp_partial_grad`.

    Token blocks (`token-blocks = N`, with ep): each MoE block's tokens,
    expert indices and router weights are split into N consecutive blocks
    (`moe.token_blocks`), each block gets its own route, sends, dispatch,
    expert MLP, combine and return, and `moe.concat_tokens` joins the
    returned rows. Every token's rows are computed as before (the same
    experts, the same sums). The blocks are written in the order
    `--moe-schedule-overlap` issues them: block 0's route and sends, its
    experts, block 1's route and sends, block 0's return, block 1's
    experts, ..., the last return; the backward, built in reverse, then
    sends one block's gradient while the experts differentiate another.

    Pipeline parallel (`pp`) changes nothing here: `--moe-schedule-pipeline`
    splits the training step into stages.

    Before (`mesh=ep=2`, 8 experts):
    ```mlir
    %up = moe.weight @experts_up : tensor<8x32x16xf32>
    %tokens, %counts = moe.dispatch %x, %indices {num_experts = 8 : i64} : ...
    %y = moe.expert_mlp %tokens, %counts, up %up, down %down gate %gate {...}
    %out = moe.combine %y, %indices, %weights : ...
    ```
    After:
    ```mlir
    %up = moe.weight @experts_up : tensor<4x32x16xf32>
    %local, %layout = moe.ep_route %indices {axis = "ep", num_experts = 8 : i64, ranks = 2 : i64} : ...
    %rx = moe.ep_send %x, %layout {axis = "ep", ranks = 2 : i64} : ...
    %rw = moe.ep_send %weights, %layout {axis = "ep", ranks = 2 : i64} : ...
    %tokens, %counts = moe.dispatch %rx, %local {num_experts = 4 : i64} : ...
    %y = moe.expert_mlp %tokens, %counts, up %up, down %down gate %gate {...}
    %part = moe.combine %y, %local, %rw : ...
    %out = moe.ep_return %part, %layout {axis = "ep", ranks = 2 : i64} : ...
    ```
  }];
  let options = [
    ListOption<"tpReplicate", "tp-replicate", "std::string",
               "With tp > 1: region kinds kept whole on every tp rank (attention, latent-attention, "
               "linear-attention, mlp, experts), as a moe.tp_replicated annotation on an op does">,
    Option<"sequenceParallel", "sequence-parallel", "bool", "false",
           "With tp > 1: between the split regions each tp rank holds only its rows of the hidden "
           "states (reduce-scatter / all-gather instead of all-reduce)">,
    Option<"mesh", "mesh", "std::string", "\"\"",
           "Mesh axes and sizes, e.g. dp=2,ep=2 (empty: one rank), optionally followed by the rank "
           "order, fastest axis first: dp=2,tp=2;order=dp,tp (default tp, ep, dp, pp)">,
    Option<"epExchange", "ep-exchange", "std::string", "\"auto\"",
           "How expert parallel moves tokens: routed, all (every token to every rank) or auto">,
    Option<"epCapacityFactor", "ep-capacity-factor", "double", "0",
           "With ep > 1: each routed expert exchange keeps room for this many times what uniform "
           "routing sends a rank (at least 1; 0: room for every token of every rank)">,
    Option<"tokenBlocks", "token-blocks", "int64_t", "1",
           "With ep > 1: run each MoE block's expert exchange on this many blocks of its tokens "
           "(--moe-schedule-overlap sends one block while the experts compute another)">,
  ];
  let dependentDialects = ["::moec::moe::MoeDialect"];
}

#endif // PASSES_PROPAGATE_SHARDING_PROPAGATESHARDING_TD_
