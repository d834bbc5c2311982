//===- FuseLoRA.td - projection and adapter fusion pass ----*- tablegen -*-===//

#ifndef PASSES_FUSE_LORA_FUSELORA_TD_
#define PASSES_FUSE_LORA_FUSELORA_TD_

include "mlir/Pass/PassBase.td"

def FuseLoRAPass : Pass<"moe-fuse-lora", "::moec::moe::ModelOp"> {
  let summary = "Each adapted projection and its LoRA update as one moe.lora_linear.";
  let description = [{
    `--moe-inject-lora` adapts a projection as PEFT does: `moe.linear`, a
    `moe.lora` of the same input (its update in f32) and a `moe.add` of the
    two. On a GPU that writes the f32 update and reads it back in the add
    (for Qwen3-30B-A3B's q projection at 16384 tokens: 256 MB written, 384
    MB read, 128 MB written again), and the backward sums the two input
    gradients in another pass. This pass rewrites the three ops into one
    `moe.lora_linear`, whose kernels add the update in the product that
    writes the output: its projection's part rounded where the linear's
    result was (`base_type`), so the forward gives the unfused ops' values.

    A `moe.add` fuses when one operand is a `moe.linear` without bias and the
    other a `moe.lora` of the same input, each read by the add alone. Anything
    else (a bias, a value read elsewhere, a collective in between) stays as
    it is. The backward ops read the input, the weights and the output's
    gradient, not these results, so after `--moe-build-training-step` (where
    `moe-lora-training` runs it, with `fuse-lora` on) the step's backward is left
    as it was: the same sums of input gradients in the same order, which the
    bf16 alignment tests hold to PEFT's (its Adam steps amplify a change of
    summation order in the last bits). Before the step, the fused op is
    differentiated by its own rule: one `moe.backward "moe.lora_linear"`
    whose kernel adds the adapter's input gradient onto the projection's
    (one pass less; the sums in another order).

    The layer templates the training layers were built from (`layer_template`)
    stay unfused: under a memory cap, `--moe-plan-memory` rebuilds layers from
    them (recompute, regather) by differentiating the unfused ops, then fuses
    the rebuilt forward and recomputed copies as the layers they replace were.

    Before:
    ```mlir
    %y = moe.linear %x, %w : (tensor<?x64xf32>, tensor<32x64xf32>) -> tensor<?x32xf32>
    %d = moe.lora %x, %a, %b {scale = 2.0 : f64} : (tensor<?x64xf32>, tensor<4x64xf32>, tensor<32x4xf32>) -> tensor<?x32xf32>
    %s = moe.add %y, %d : tensor<?x32xf32>
    ```
    After:
    ```mlir
    %s = moe.lora_linear %x, %w, %a, %b {scale = 2.0 : f64}
        : (tensor<?x64xf32>, tensor<32x64xf32>, tensor<4x64xf32>, tensor<32x4xf32>) -> tensor<?x32xf32>
    ```
  }];
  let dependentDialects = ["::moec::moe::MoeDialect"];
}

#endif // PASSES_FUSE_LORA_FUSELORA_TD_
