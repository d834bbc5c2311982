//===- SchedulePipeline.td - pipeline stages in 1F1B order -*- tablegen -*-===//

#ifndef PASSES_SCHEDULE_PIPELINE_SCHEDULEPIPELINE_TD_
#define PASSES_SCHEDULE_PIPELINE_SCHEDULEPIPELINE_TD_

include "mlir/Pass/PassBase.td"

def SchedulePipelinePass : Pass<"moe-schedule-pipeline", "::moec::moe::ModelOp"> {
  let summary = "Splits the training step into pipeline stages that run micro-batches in 1F1B order.";
  let description = [{
    Runs after `--moe-sync-gradients` on a model placed on a mesh with
    `pp > 1` (nothing to do otherwise). The layers split into `pp`
    contiguous stages of as equal size as possible (stage `s` holds layers
    `[s L / pp, (s + 1) L / pp)`); the embedding goes with stage 0, the final
    norm, LM head and loss with the last. `@train_step` becomes one function
    per stage, `@train_step_stage<s>`, taking the inputs of
    `micro-batches` micro-batches at once (each `moe.microbatch` of them)
    and the loss weight of each (`loss_weight: tensor<M x f32>`); the last
    stage returns each micro-batch's loss.

    Each stage runs its micro-batches in the 1F1B order: `pp - 1 - s`
    forwards to fill the pipeline, then one forward and one backward in
    turn, then the remaining backwards, so a stage holds the activations of
    at most `pp - s` micro-batches. `moe.stage_exchange` carries the hidden
    state forward and its gradient back. Both sides of a boundary issue its
    transfers in the same order; where their orders swap two neighbouring
    transfers (a stage sends the next activation while its neighbour sends
    a gradient back), the two are one exchange, so neighbouring stages never
    both wait to send. Gradients accumulate over micro-batches; each
    layer's `moe.all_reduce_grads` runs once, after its last backward.

    The model gets `pipeline = {stages, micro_batches}`.

    Before (`mesh = "pp=2"`, two layers):
    ```mlir
    func.func @train_step(%ids, %pos, %labels, %loss_weight: tensor<f32>) -> tensor<f32> {
      %h = moe.embedding %ids, ...
      %0:3 = moe.apply_layer @block_fwd[0] (%h, %pos) ...
      %1:3 = moe.apply_layer @block_fwd[1] (%0#0, %pos) ...
      ... loss, its backward seeded by %loss_weight ...
      %d1 = moe.apply_layer @block_bwd[1] (%0#0, %pos, ...)
      %d0 = moe.apply_layer @block_bwd[0] (%h, %pos, ..., %d1)
      return %loss : tensor<f32>
    }
    ```
    After (`micro-batches=2`), stage 0:
    ```mlir
    func.func @train_step_stage0(%ids, %pos, %labels, %loss_weight: tensor<2xf32>)
        attributes {pipeline_stage = 0 : i64} {
      %ids0 = moe.microbatch %ids {count = 2 : i64, index = 0 : i64} ...
      ... forward of layer 0 on micro-batch 0 ...
      moe.stage_exchange send(%a0 : tensor<?x64xf32>) {peer = 1 : i64}
      ... forward of layer 0 on micro-batch 1 ...
      %g0 = moe.stage_exchange send(%a1 : tensor<?x64xf32>) {backward, peer = 1 : i64} -> tensor<?x64xf32>
      ... backward of layer 0 on micro-batch 0, then 1 ...
      moe.all_reduce_grads ...
      return
    }
    ```
  }];
  let options = [
    Option<"microBatches", "micro-batches", "int64_t", /*default=*/"0",
           "Micro-batches per step on each pipeline (0: 2 x pp)">,
  ];
  let dependentDialects = ["::moec::moe::MoeDialect", "::mlir::func::FuncDialect"];
}

#endif // PASSES_SCHEDULE_PIPELINE_SCHEDULEPIPELINE_TD_
