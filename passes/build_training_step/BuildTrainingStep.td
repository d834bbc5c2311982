//===- BuildTrainingStep.td - the training step pass -------*- tablegen -*-===//

#ifndef PASSES_BUILD_TRAINING_STEP_BUILDTRAININGSTEP_TD_
#define PASSES_BUILD_TRAINING_STEP_BUILDTRAININGSTEP_TD_

include "mlir/Pass/PassBase.td"

def BuildTrainingStepPass : Pass<"moe-build-training-step", "::moec::moe::ModelOp"> {
  let summary = "Builds the LoRA training step: loss, backward, optimizer.";
  let description = [{
    Adds `func.func @train_step(%ids, %positions, %labels) -> loss`: the
    forward of `@forward`, Hugging Face's causal-LM cross-entropy (labels
    shifted by one inside, label -100 ignored), and the backward built from
    each op's differentiation rule (`DifferentiableOpInterface`). Only
    values that depend on a trainable parameter get gradients, so frozen
    weights never get a weight gradient; each trainable parameter's
    gradient is a `moe.param_grad`.

    Each layer template gets a training pair: `@<t>_fwd` returns its output
    and the values its backward reads, `@<t>_bwd` takes them and returns
    the input gradient. With `recompute=per-layer` the pair is
    `@<t>_fwd_recompute`/`@<t>_bwd_recompute`: the forward saves only the
    routing (router weights and indices, sparse-attention indices) and the
    backward re-runs the rest of the layer (ops marked `recomputed`), never
    re-deciding a routing. With `recompute=regather` (`@<t>_fwd_regather`) an
    MoE layer saves what `none` saves except the copies a `moe.dispatch` makes
    for a `moe.expert_mlp` (top-k rows per token, an MoE layer's largest saved
    value) and the outputs of its norms and RoPE: the backward gathers the
    copies again from the saved tokens and routing and re-runs the norms and
    RoPE on what they read (the layer input, projections a norm's backward
    reads anyway). The optimizer is a `moe.optimizer`.

    With `expert-backward=fused` (or `auto`, the default, where the CUDA
    kernel has a one-pass form: bf16, gated SiLU with a separate gate, no
    bias or LoRA), a `moe.combine` of a `moe.expert_mlp`'s outputs (read by
    nothing else) gets one backward for both,
    `moe.backward "moe.expert_mlp_combine"` (inputs: the expert MLP's
    operands, then the combine's indices and weights; gradients: the expert
    operands' that need one, then the weights'). The combine's own backward
    reads the expert outputs for the router weights' gradient (d y . expert
    output); the fused one forms it inside the experts' backward, so the
    expert outputs (top-k rows of hidden size per token) are not saved. In a
    layer that saves (`recompute=none`), a gated SiLU expert MLP (separate
    gate, no bias or LoRA) with this backward also saves its
    `pre_activations` ([rows, 2 I] f32: gate x, then up x), the fused
    backward's `outputs`: it then does not run the gate and up products
    again. The model gets the policy as its `expert_backward` attribute,
    which every layer template built later (the memory planner's recompute
    pairs) follows.

    Before (after `--moe-inject-lora`):
    ```mlir
    moe.layer @gqa_moe(%x, %pos) -> ... { ... moe.yield %out }
    func.func @forward(%ids, %pos) -> logits {
      %h = moe.apply_layer @gqa_moe[0](%e, %pos) ...
    }
    ```
    After:
    ```mlir
    moe.layer @gqa_moe_fwd(%x, %pos) -> (out, saved...) attributes {backward = @gqa_moe_bwd, ...}
    moe.layer @gqa_moe_bwd(%x, %pos, saved..., %dout) -> dx { ... moe.param_grad @q_proj_lora_A, %da ... }
    func.func @train_step(%ids, %pos, %labels) -> tensor<f32> {
      %h, %s:N = moe.apply_layer @gqa_moe_fwd[0](%e, %pos)
      ...
      %loss = moe.cross_entropy %logits, %labels {shift_labels}
      %seed = moe.fill 1.0 : tensor<f32>
      %dlogits = moe.backward "moe.cross_entropy"(%logits, %labels) grads(%seed) ...
      ...
      %dx = moe.apply_layer @gqa_moe_bwd[0](%e, %pos, %s..., %dh)
      return %loss
    }
    moe.optimizer {kind = "adamw", lr = 1.0e-04 : f64, ...}
    ```
  }];
  let options = [
    Option<"recompute", "recompute", "std::string", "\"none\"",
           "What layers keep for their backward: none (save every value read), regather (as "
           "none, but gather the experts' token copies and run norms and RoPE again) or per-layer (save inputs and "
           "routing, recompute the rest)">,
    Option<"expertBackward", "expert-backward", "std::string", "\"auto\"",
           "How an expert MLP and the moe.combine of its outputs are differentiated: fused (one "
           "moe.backward \"moe.expert_mlp_combine\", the expert outputs not saved), auto (fused "
           "where the CUDA kernel has its one-pass form: bf16, gated SiLU, no bias or LoRA) or "
           "separate (each op's own backward)">,
    Option<"lr", "lr", "double", "1e-4", "Peak learning rate">,
    Option<"beta1", "beta1", "double", "0.9", "AdamW beta1">,
    Option<"beta2", "beta2", "double", "0.999", "AdamW beta2">,
    Option<"eps", "eps", "double", "1e-8", "AdamW epsilon">,
    Option<"weightDecay", "weight-decay", "double", "0.0", "AdamW decoupled weight decay">,
    Option<"warmupSteps", "warmup-steps", "int64_t", "10", "Linear warmup steps">,
    Option<"totalSteps", "total-steps", "int64_t", "1000", "Steps of the schedule">,
    Option<"schedule", "schedule", "std::string", "\"cosine\"", "cosine or constant">,
    Option<"minLrRatio", "min-lr-ratio", "double", "0.1",
           "Learning rate at the end of the cosine, as a fraction of lr">,
    Option<"maxGradNorm", "max-grad-norm", "double", "1.0",
           "Clip the global gradient norm to this (0 = no clipping)">,
  ];
  let dependentDialects = ["::moec::moe::MoeDialect", "::mlir::func::FuncDialect"];
}

#endif // PASSES_BUILD_TRAINING_STEP_BUILDTRAININGSTEP_TD_
