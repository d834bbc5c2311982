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
    `E / ep` consecutive experts each. Every parameter an `moe.expert_mlp`
    reads (weights, biases, expert adapters: each rank trains its experts'
    adapters) gets `sharding
    #moe.sharding<[ep, ...]>` and its `moe.weight` the type of one rank's
    part. Around the expert MLP, `moe.all_to_all_dispatch` sends each
    dispatched row to its expert's rank (with this rank's counts per local
    expert, and the layout the way back needs) and `moe.all_to_all_combine`
    returns the results to the rows' ranks before `moe.combine`. Routing is
    computed on every rank for its own tokens, so the router, dispatch and
    combine are unchanged.

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
    gate by rows, down by columns of each expert): `moe.tp_enter` on the
    dispatched tokens, `moe.tp_exit` on the partial output before
    `moe.combine`. Everything else (MLA, DSA, linear attention, dense MLPs,
    shared experts) stays whole: every tp rank computes it; an attention or
    expert MLP that cannot split is named in a warning, and a model with
    nothing to split fails.

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
    %tokens, %counts = moe.dispatch %x, %indices {num_experts = 8 : i64} : ...
    %recv, %local, %sources = moe.all_to_all_dispatch %tokens, %counts {axis = "ep", ranks = 2 : i64} : ...
    %y = moe.expert_mlp %recv, %local, up %up, down %down gate %gate {...}
    %back = moe.all_to_all_combine %y, %sources, %counts {axis = "ep", ranks = 2 : i64} : ...
    %out = moe.combine %back, %indices, %weights : ...
    ```
  }];
  let options = [
    Option<"mesh", "mesh", "std::string", "\"\"",
           "Mesh axes and sizes, e.g. dp=2,ep=2 (empty: one rank)">,
  ];
  let dependentDialects = ["::moec::moe::MoeDialect"];
}

#endif // PASSES_PROPAGATE_SHARDING_PROPAGATESHARDING_TD_
