//===- InjectLoRA.td - LoRA injection pass -----------------*- tablegen -*-===//

#ifndef PASSES_INJECT_LORA_INJECTLORA_TD_
#define PASSES_INJECT_LORA_INJECTLORA_TD_

include "mlir/Pass/PassBase.td"

def InjectLoRAPass : Pass<"moe-inject-lora", "::moec::moe::ModelOp"> {
  let summary = "Adds trainable LoRA adapters to the targeted projections.";
  let description = [{
    For every `moe.linear` in a layer template whose module name (the last
    part of its weight's checkpoint name before `.weight`, as PEFT's
    `target_modules` uses it) is a target, adds two trainable parameters
    named as PEFT names them and the adapter's update to the projection's
    output. The base weight stays frozen. `all-linear` targets every
    projection in the layers (PEFT also leaves the LM head out). A target
    that matches no projection is an error that lists the projections the
    model has.

    Before (`targets=q_proj rank=4 alpha=8`):
    ```mlir
    moe.param @self_attn_q_proj "model.layers.{layer}.self_attn.q_proj.weight" : tensor<64x64xf32>
    ...
    %q = moe.linear %x, %w : (tensor<?x64xf32>, tensor<64x64xf32>) -> tensor<?x64xf32>
    ```
    After:
    ```mlir
    moe.param @self_attn_q_proj_lora_A "base_model.model.model.layers.{layer}.self_attn.q_proj.lora_A.weight" trainable : tensor<4x64xf32>
    moe.param @self_attn_q_proj_lora_B "base_model.model.model.layers.{layer}.self_attn.q_proj.lora_B.weight" trainable : tensor<64x4xf32>
    ...
    %q = moe.linear %x, %w : (tensor<?x64xf32>, tensor<64x64xf32>) -> tensor<?x64xf32>
    %a = moe.weight @self_attn_q_proj_lora_A : tensor<4x64xf32>
    %b = moe.weight @self_attn_q_proj_lora_B : tensor<64x4xf32>
    %d = moe.lora %x, %a, %b {scale = 2.0 : f64} : ...
    %q2 = moe.add %q, %d : tensor<?x64xf32>
    ```
  }];
  let options = [
    Option<"rank", "rank", "int64_t", "8", "Adapter rank r">,
    Option<"alpha", "alpha", "double", "16.0", "Scale numerator: updates are scaled by alpha / r">,
    Option<"dropout", "dropout", "double", "0.0", "Dropout on the adapter input during training">,
    ListOption<"targets", "targets", "std::string",
               "Module names to adapt (q_proj, o_proj, in_proj_qkvz, ...) or all-linear">,
  ];
  let dependentDialects = ["::moec::moe::MoeDialect"];
}

#endif // PASSES_INJECT_LORA_INJECTLORA_TD_
