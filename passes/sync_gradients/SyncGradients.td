//===- SyncGradients.td - gradients summed over ranks -----*- tablegen -*-===//

#ifndef PASSES_SYNC_GRADIENTS_SYNCGRADIENTS_TD_
#define PASSES_SYNC_GRADIENTS_SYNCGRADIENTS_TD_

include "mlir/Pass/PassBase.td"

def SyncGradientsPass : Pass<"moe-sync-gradients", "::moec::moe::ModelOp"> {
  let summary = "Makes a sharded training step compute the global batch's loss and gradients.";
  let description = [{
    Runs after `--moe-build-training-step` on a model that
    `--moe-propagate-sharding` placed on a mesh (its `mesh` attribute);
    nothing to do for one rank. Every data-parallel and expert-parallel rank
    runs `@train_step` on its own sequences (`dp x ep` shards of the global
    batch).

    The loss is the mean over the global batch's scored tokens, so rank r's
    part of it is `n_r / N` of its own mean: the backward's seed,
    `moe.fill 1.0`, becomes a fourth argument of `@train_step`,
    `loss_weight`, that the runtime sets to `n_r / N` each step. After each
    layer's backward, `moe.all_reduce_grads` sums that layer's gradients
    over the ranks that computed the same parameters on other tokens:
    `dp+ep` for replicated parameters, `dp` (with `experts`) for parameters
    split over `ep` (each expert-parallel rank owns its experts), and
    `dp+ep+tp` (with `tp_partial`) for replicated parameters read inside a
    tensor-parallel attention (`moe.tp_partial_grad`: each tp rank has its
    heads' share of the gradient). One bucket
    per layer, so the runtime may overlap it with the next layer's backward;
    when model-level parameters are trainable, one more with `layer = -1`
    after the backward covers them. A bucket over an axis of size 1 is left
    out.

    Before (`mesh = "dp=2"`):
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
      moe.all_reduce_grads {axis = "dp+ep", layer = 1 : i64}
      %d0 = moe.apply_layer @block_bwd[0] (...)
      moe.all_reduce_grads {axis = "dp+ep", layer = 0 : i64}
      return %loss : tensor<f32>
    }
    ```
  }];
  let dependentDialects = ["::moec::moe::MoeDialect", "::mlir::func::FuncDialect"];
}

#endif // PASSES_SYNC_GRADIENTS_SYNCGRADIENTS_TD_
