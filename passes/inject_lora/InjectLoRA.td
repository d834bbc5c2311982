//===- InjectLoRA.td - LoRA injection pass -----------------*- tablegen -*-===//

#ifndef PASSES_INJECT_LORA_INJECTLORA_TD_
#define PASSES_INJECT_LORA_INJECTLORA_TD_

include "mlir/Pass/PassBase.td"

def InjectLoRAPass : Pass<"moe-inject-lora", "::moec::moe::ModelOp"> {
  let summary = "Adds trainable LoRA adapters to the targeted projections, per layer type and per expert.";
  let description = [{
    For every `moe.linear` in a layer template whose module name (the last
    part of its weight's checkpoint name before `.weight`, as PEFT's
    `target_modules` uses it) is a target, adds two trainable parameters
    named as PEFT names them and the adapter's update to the projection's
    output. The base weight stays frozen. `all-linear` targets every
    projection in the layers (PEFT also leaves the LM head out). A target
    that matches no projection is an error that lists the projections the
    model has.

    A target `TYPE:module` (`kda:o_proj`, `gqa:q_proj`, `moe:gate_proj`)
    applies only to the layer templates whose name, `token_mixer` or
    `channel_mixer` is `TYPE`; an unknown type, or one without that
    projection, is an error that lists the templates, their types and their
    projections.

    `expert-lora` also adapts the routed experts: each targeted gate/up/down
    projection of a `moe.expert_mlp` (`gate_proj`/`up_proj`/`down_proj`,
    Mixtral's `w1`/`w3`/`w2`; all three for `all-linear`) gets one adapter
    per expert, `A: [E, r, in]` and `B: [E, out, r]`, whose tensor names are
    PEFT's per-expert names with `{expert}` standing for the stacked leading
    dimension. Without it, routed experts are never adapted (as PEFT does
    not adapt transformers 5's fused 3D expert parameters). gpt-oss's fused
    expert tensors cannot take expert LoRA.

    `adapter-config` reads a PEFT `adapter_config.json` (or a directory
    holding one); its `r`, `lora_alpha`, `lora_dropout`, `target_modules`
    and `use_rslora` replace the options. Features that would train another
    adapter (DoRA, rank or alpha patterns, `layers_to_transform`, biases,
    `modules_to_save`, `target_parameters`, regex targets, ...) are errors.
    `rslora` scales updates by `alpha / sqrt(r)` instead of `alpha / r`.

    The model gets a `lora` dictionary (`r`, `alpha`, `dropout`, the adapted
    module names as `targets`, and `expert_lora` / `rslora` when set) for
    adapter export.

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

    Before (`targets=up_proj expert-lora rank=4 alpha=8`, 8 experts):
    ```mlir
    moe.param @mlp_experts_up_proj "model.layers.{layer}.mlp.experts.{expert}.up_proj.weight" : tensor<8x32x64xf32>
    ...
    %y = moe.expert_mlp %t, %counts, up %up, down %down gate %gate {activation = #moe<activation silu>} : ...
    ```
    After:
    ```mlir
    moe.param @mlp_experts_up_proj_lora_A "base_model.model.model.layers.{layer}.mlp.experts.{expert}.up_proj.lora_A.weight" trainable : tensor<8x4x64xf32>
    moe.param @mlp_experts_up_proj_lora_B "base_model.model.model.layers.{layer}.mlp.experts.{expert}.up_proj.lora_B.weight" trainable : tensor<8x32x4xf32>
    ...
    %ua = moe.weight @mlp_experts_up_proj_lora_A : tensor<8x4x64xf32>
    %ub = moe.weight @mlp_experts_up_proj_lora_B : tensor<8x32x4xf32>
    %y = moe.expert_mlp %t, %counts, up %up, down %down gate %gate up_lora %ua, %ub
        {activation = #moe<activation silu>, lora_scale = 2.0 : f64} : ...
    ```
  }];
  let options = [
    Option<"rank", "rank", "int64_t", "8", "Adapter rank r">,
    Option<"alpha", "alpha", "double", "16.0", "Scale numerator: updates are scaled by alpha / r">,
    Option<"dropout", "dropout", "double", "0.0", "Dropout on the adapter input during training">,
    ListOption<"targets", "targets", "std::string",
               "Module names to adapt (q_proj, o_proj, in_proj_qkvz, ...) or all-linear; "
               "TYPE:module limits one to the layer templates of that type (kda:o_proj)">,
    Option<"expertLora", "expert-lora", "bool", "false",
           "Also adapt routed experts' targeted gate/up/down projections, one adapter per expert">,
    Option<"rslora", "rslora", "bool", "false", "Scale updates by alpha / sqrt(r) (rsLoRA)">,
    Option<"adapterConfig", "adapter-config", "std::string", "\"\"",
           "PEFT adapter_config.json (or its directory) whose r, lora_alpha, lora_dropout, "
           "target_modules and use_rslora replace the options">,
  ];
  let dependentDialects = ["::moec::moe::MoeDialect"];
}

#endif // PASSES_INJECT_LORA_INJECTLORA_TD_
