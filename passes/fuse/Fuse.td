//===- Fuse.td - fusion pass -------------------------------*- tablegen -*-===//

#ifndef PASSES_FUSE_FUSE_TD_
#define PASSES_FUSE_FUSE_TD_

include "mlir/Pass/PassBase.td"

def FusePass : Pass<"moe-fuse", "::moec::moe::ModelOp"> {
  let summary = "Replaces op patterns with fused ops whose kernels need less memory and time.";
  let description = [{
    One fusion so far: the LM head and the loss. A `moe.linear` without
    bias whose only user is a `moe.cross_entropy` becomes one
    `moe.lm_head_cross_entropy` (its `logits_type` the logits' element
    type: where they were rounded, they still are), whose kernels compute
    `chunk-tokens` rows of logits at a time: the `[tokens, vocab]` logits
    and their gradient (2 x 1.2 GB in bf16 for Qwen3's 151,936-token
    vocabulary at 4096 tokens) never exist whole.

    The loss is built by `--moe-build-training-step`, so the pass runs after
    it (`moe-lora-training` runs it between the training step and memory
    planning) and also rewrites the backward the step has for the pair: the
    `moe.backward` of the loss, whose only user is the `moe.backward` of the
    head, become the fused op's own backward, built by its
    `DifferentiableOpInterface`, with the same input gradients (the hidden
    states', and the weight's when it is trainable). Logits read by anything
    else (another loss, a returned value), a head with a bias, an input that
    is not `[tokens, hidden]` or a backward of another shape stay unfused.

    Before (`chunk-tokens=1024`):
    ```mlir
    %logits = moe.linear %h, %head : (tensor<?x64xf32>, tensor<256x64xf32>) -> tensor<?x256xf32>
    %loss = moe.cross_entropy %logits, %labels {shift_labels}
        : (tensor<?x256xf32>, tensor<?xi64>) -> tensor<f32>
    %seed = moe.fill 1.0 : tensor<f32>
    %dlogits = moe.backward "moe.cross_entropy"(%logits, %labels) grads(%seed) {...}
    %dh = moe.backward "moe.linear"(%h, %head) grads(%dlogits) {grad_of_inputs = array<i64: 0>, ...}
    ```
    After:
    ```mlir
    %loss, %lse = moe.lm_head_cross_entropy %h, %head, %labels
        {chunk_tokens = 1024 : i64, logits_type = f32, shift_labels}
        : (tensor<?x64xf32>, tensor<256x64xf32>, tensor<?xi64>) -> (tensor<f32>, tensor<?xf32>)
    %seed = moe.fill 1.0 : tensor<f32>
    %dh = moe.backward "moe.lm_head_cross_entropy"(%h, %head, %labels) outputs(%loss, %lse) grads(%seed)
        {grad_of_inputs = array<i64: 0>, grad_of_outputs = array<i64: 0>, ...}
    ```
  }];
  let options = [
    Option<"chunkTokens", "chunk-tokens", "int64_t", "1024",
           "Rows of logits the fused LM head and loss hold at a time">,
  ];
  let dependentDialects = ["::moec::moe::MoeDialect"];
}

#endif // PASSES_FUSE_FUSE_TD_
