//===- PropagateSharding.td - sharding over the mesh -------*- tablegen -*-===//

#ifndef PASSES_PROPAGATE_SHARDING_PROPAGATESHARDING_TD_
#define PASSES_PROPAGATE_SHARDING_PROPAGATESHARDING_TD_

include "mlir/Pass/PassBase.td"

def PropagateShardingPass : Pass<"moe-propagate-sharding", "::moec::moe::ModelOp"> {
  let summary = "Places the training step on a device mesh and inserts the collectives it needs.";
  let description = [{
    Runs after `--moe-build-training-step`. The model gets a `mesh`
    attribute (`"dp=2"`); every rank then runs the same `@train_step` on its
    own `micro-batch` sequences (the global batch is `dp` times larger).

    Data parallel (`dp`): what one rank would compute on the global batch is
    the sum over ranks of each rank's share. The loss is the mean over the
    global batch's counted tokens, so rank r's part of it is
    `n_r / N` of its own mean: the backward's seed, `moe.fill 1.0`, becomes
    a fourth argument of `@train_step`, `loss_weight`, that the runtime sets
    to `n_r / N` each step. After each layer's backward a
    `moe.all_reduce_grads {axis = "dp", layer = i}` sums that layer's LoRA
    gradients over the ranks (one bucket per layer, so the runtime may
    overlap it with the next layer's backward); when model-level parameters
    are trainable, one more with `layer = -1` after the backward covers them.

    Tensor, pipeline and expert parallel (`tp`, `pp`, `ep` > 1) are not
    supported yet: the pass fails and says so.

    Before (`mesh=dp=2`):
    ```mlir
    func.func @train_step(%ids: tensor<?xi64>, %pos: tensor<?xi64>, %labels: tensor<?xi64>) -> tensor<f32> {
      ...
      %seed = moe.fill 1.0 : tensor<f32>
      ...
      %d1 = moe.apply_layer @block_bwd[1] (...)
      %d0 = moe.apply_layer @block_bwd[0] (...)
      return %loss : tensor<f32>
    }
    ```
    After:
    ```mlir
    func.func @train_step(%ids: tensor<?xi64>, %pos: tensor<?xi64>, %labels: tensor<?xi64>,
                          %loss_weight: tensor<f32>) -> tensor<f32> {
      ...
      %d1 = moe.apply_layer @block_bwd[1] (...)
      moe.all_reduce_grads {axis = "dp", layer = 1 : i64}
      %d0 = moe.apply_layer @block_bwd[0] (...)
      moe.all_reduce_grads {axis = "dp", layer = 0 : i64}
      return %loss : tensor<f32>
    }
    ```
  }];
  let options = [
    Option<"mesh", "mesh", "std::string", "\"\"",
           "Mesh axes and sizes, e.g. dp=2 (empty: one rank)">,
  ];
  let dependentDialects = ["::moec::moe::MoeDialect", "::mlir::func::FuncDialect"];
}

#endif // PASSES_PROPAGATE_SHARDING_PROPAGATESHARDING_TD_
