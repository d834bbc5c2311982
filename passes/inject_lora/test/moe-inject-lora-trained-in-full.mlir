// RUN: moe-opt %s --pass-pipeline='builtin.module(moe.model(moe-inject-lora{targets=all-linear rank=2 alpha=2}))' | FileCheck %s
// RUN: not moe-opt %s --pass-pipeline='builtin.module(moe.model(moe-inject-lora{targets=q_proj,k_proj rank=2 alpha=2}))' 2>&1 | FileCheck %s --check-prefix=NAMED

// A checkpoint weight the model trains in full (q_proj here) gets no adapter: PEFT saves a module
// to save whole or adapts it, not both. all-linear leaves it out and adapts the others; a target
// that names it is an error.
// CHECK: moe.param @self_attn_q_proj "model.layers.{layer}.self_attn.q_proj.weight" trainable : tensor<8x16xf32>
// CHECK-NOT: q_proj_lora
// CHECK: moe.param @self_attn_k_proj_lora_A
// CHECK-COUNT-1: moe.lora
// CHECK-NOT: moe.lora
// NAMED: error: moe-inject-lora: @self_attn_q_proj is trained in full (trainable in the model), so 'q_proj' cannot also get an adapter
moe.model @tiny {
  moe.layer @attn(%x: tensor<?x16xf32>) -> tensor<?x16xf32> {
    moe.param @self_attn_q_proj "model.layers.{layer}.self_attn.q_proj.weight" trainable : tensor<8x16xf32>
    moe.param @self_attn_k_proj "model.layers.{layer}.self_attn.k_proj.weight" : tensor<8x16xf32>
    %wq = moe.weight @self_attn_q_proj : tensor<8x16xf32>
    %q = moe.linear %x, %wq : (tensor<?x16xf32>, tensor<8x16xf32>) -> tensor<?x8xf32>
    %wk = moe.weight @self_attn_k_proj : tensor<8x16xf32>
    %k = moe.linear %x, %wk : (tensor<?x16xf32>, tensor<8x16xf32>) -> tensor<?x8xf32>
    %s = moe.add %q, %k : tensor<?x8xf32>
    moe.yield %x : tensor<?x16xf32>
  }
}
