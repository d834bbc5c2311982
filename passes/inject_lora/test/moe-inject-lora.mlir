// RUN: moe-opt %s --pass-pipeline='builtin.module(moe.model(moe-inject-lora{targets=q_proj,o_proj rank=4 alpha=8}))' | FileCheck %s
// RUN: moe-opt %s --pass-pipeline='builtin.module(moe.model(moe-inject-lora{targets=all-linear rank=2 alpha=2}))' | FileCheck %s --check-prefix=ALL
// RUN: not moe-opt %s --pass-pipeline='builtin.module(moe.model(moe-inject-lora{targets=q_prj}))' 2>&1 | FileCheck %s --check-prefix=TYPO

// Tests that targeted projections get trainable PEFT-named A and B and an added update, and
// that the base weights stay frozen.
// CHECK-LABEL: moe.layer @attn
// CHECK: moe.param @self_attn_q_proj "model.layers.{layer}.self_attn.q_proj.weight" : tensor<8x16xf32>
// CHECK-NEXT: moe.param @self_attn_q_proj_lora_A "base_model.model.model.layers.{layer}.self_attn.q_proj.lora_A.weight" trainable : tensor<4x16xf32>
// CHECK-NEXT: moe.param @self_attn_q_proj_lora_B "base_model.model.model.layers.{layer}.self_attn.q_proj.lora_B.weight" trainable : tensor<8x4xf32>
// CHECK: moe.param @self_attn_o_proj_lora_A "base_model.model.model.layers.{layer}.self_attn.o_proj.lora_A.weight" trainable : tensor<4x8xf32>
// CHECK-NOT: k_proj_lora
// CHECK: %[[Q:.*]] = moe.linear %[[X:.*]], %{{.*}} :
// CHECK: %[[A:.*]] = moe.weight @self_attn_q_proj_lora_A
// CHECK: %[[B:.*]] = moe.weight @self_attn_q_proj_lora_B
// CHECK: %[[D:.*]] = moe.lora %[[X]], %[[A]], %[[B]] {scale = 2.000000e+00 : f64}
// CHECK: %[[Q2:.*]] = moe.add %[[Q]], %[[D]]
// CHECK: moe.linear %[[Q2]], %{{.*}} :
// The k projection is not a target and stays as it was.
// CHECK: %[[K:.*]] = moe.linear %[[X]]
// CHECK-NEXT: moe.add %[[Q2]], %[[K]]

// all-linear adapts all four projection calls (o_proj is called twice, with one adapter).
// ALL-COUNT-2: moe.param @self_attn_o_proj_lora
// ALL-COUNT-4: moe.lora
// ALL-NOT: moe.lora

// A misspelt target is an error that lists the projections the model has.
// TYPO: error: moe-inject-lora: target(s) q_prj match no projection; the model's projections are: k_proj, o_proj, q_proj
moe.model @tiny {
  moe.layer @attn(%x: tensor<?x16xf32>) -> tensor<?x16xf32> {
    moe.param @self_attn_q_proj "model.layers.{layer}.self_attn.q_proj.weight" : tensor<8x16xf32>
    moe.param @self_attn_k_proj "model.layers.{layer}.self_attn.k_proj.weight" : tensor<8x16xf32>
    moe.param @self_attn_o_proj "model.layers.{layer}.self_attn.o_proj.weight" : tensor<16x8xf32>
    %wq = moe.weight @self_attn_q_proj : tensor<8x16xf32>
    %q = moe.linear %x, %wq : (tensor<?x16xf32>, tensor<8x16xf32>) -> tensor<?x8xf32>
    %wo = moe.weight @self_attn_o_proj : tensor<16x8xf32>
    %o = moe.linear %q, %wo : (tensor<?x8xf32>, tensor<16x8xf32>) -> tensor<?x16xf32>
    %wk = moe.weight @self_attn_k_proj : tensor<8x16xf32>
    %k = moe.linear %x, %wk : (tensor<?x16xf32>, tensor<8x16xf32>) -> tensor<?x8xf32>
    %s = moe.add %q, %k : tensor<?x8xf32>
    %y = moe.linear %s, %wo : (tensor<?x8xf32>, tensor<16x8xf32>) -> tensor<?x16xf32>
    %r = moe.add %o, %y : tensor<?x16xf32>
    moe.yield %r : tensor<?x16xf32>
  }
}
