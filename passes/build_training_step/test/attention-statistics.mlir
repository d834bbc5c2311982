// RUN: moe-opt %s -split-input-file --pass-pipeline='builtin.module(moe.model(moe-build-training-step))' | FileCheck %s
// RUN: moe-opt %s -split-input-file --pass-pipeline='builtin.module(moe.model(moe-build-training-step{recompute=per-layer}))' | FileCheck %s --check-prefix=RECOMPUTE

// The trained layer's attention returns its softmax statistics too (logsumexp, [T, heads]); the
// forward saves them with the result, and the attention's backward reads both. The layer
// template itself (inference) is left as it was.
// CHECK-LABEL: moe.layer @block(
// CHECK: %{{.*}} = moe.attention {{.*}} -> tensor<?x16xf32>
// CHECK-LABEL: moe.layer @block_fwd(
// CHECK-SAME: -> (tensor<?x16xf32>, {{.*}}tensor<?x16xf32>, tensor<?x4xf32>)
// CHECK: %[[O:.*]], %[[LSE:.*]] = moe.attention {{.*}} -> (tensor<?x16xf32>, tensor<?x4xf32>)
// CHECK: moe.yield {{.*}}%[[O]], %[[LSE]] :
// CHECK-LABEL: moe.layer @block_bwd(
// CHECK-SAME: %[[SO:[a-z0-9]+]]: tensor<?x16xf32>, %[[SLSE:[a-z0-9]+]]: tensor<?x4xf32>, %{{.*}}: tensor<?x16xf32>) -> tensor<?x16xf32>
// CHECK-NOT: moe.attention %
// CHECK: moe.backward "moe.attention"(%{{.*}}, %{{.*}}, %{{.*}}) outputs(%[[SO]], %[[SLSE]]) grads(

// Recomputed per layer: the forward does not save the statistics, so it does not form them;
// the backward runs the attention again, statistics included, and its backward reads them.
// RECOMPUTE-LABEL: moe.layer @block_fwd_recompute(
// RECOMPUTE: moe.attention {{.*}} -> tensor<?x16xf32>
// RECOMPUTE-LABEL: moe.layer @block_bwd_recompute(
// RECOMPUTE: %[[O:.*]], %[[LSE:.*]] = moe.attention {{.*}}recomputed
// RECOMPUTE: moe.backward "moe.attention"({{.*}}) outputs(%[[O]], %[[LSE]]) grads(

moe.model @attn {
  moe.param @embed "model.embed_tokens.weight" : tensor<32x16xf32>
  moe.param @head "lm_head.weight" : tensor<32x16xf32>
  moe.layer @block(%x: tensor<?x16xf32>, %pos: tensor<?xi64>) -> tensor<?x16xf32> {
    moe.param @q "model.layers.{layer}.self_attn.q_proj.weight" : tensor<16x16xf32>
    moe.param @q_lora_A "base_model.model.model.layers.{layer}.self_attn.q_proj.lora_A.weight" trainable : tensor<4x16xf32>
    moe.param @q_lora_B "base_model.model.model.layers.{layer}.self_attn.q_proj.lora_B.weight" trainable : tensor<16x4xf32>
    moe.param @k "model.layers.{layer}.self_attn.k_proj.weight" : tensor<8x16xf32>
    moe.param @v "model.layers.{layer}.self_attn.v_proj.weight" : tensor<8x16xf32>
    moe.param @o "model.layers.{layer}.self_attn.o_proj.weight" : tensor<16x16xf32>
    %wq = moe.weight @q : tensor<16x16xf32>
    %q0 = moe.linear %x, %wq : (tensor<?x16xf32>, tensor<16x16xf32>) -> tensor<?x16xf32>
    %a = moe.weight @q_lora_A : tensor<4x16xf32>
    %b = moe.weight @q_lora_B : tensor<16x4xf32>
    %d = moe.lora %x, %a, %b {scale = 2.0 : f64} : (tensor<?x16xf32>, tensor<4x16xf32>, tensor<16x4xf32>) -> tensor<?x16xf32>
    %q = moe.add %q0, %d : tensor<?x16xf32>
    %wk = moe.weight @k : tensor<8x16xf32>
    %k = moe.linear %x, %wk : (tensor<?x16xf32>, tensor<8x16xf32>) -> tensor<?x8xf32>
    %wv = moe.weight @v : tensor<8x16xf32>
    %v = moe.linear %x, %wv : (tensor<?x16xf32>, tensor<8x16xf32>) -> tensor<?x8xf32>
    %att = moe.attention %q, %k, %v {num_heads = 4 : i64, num_kv_heads = 2 : i64, head_dim = 4 : i64, scale = 5.000000e-01 : f64} : (tensor<?x16xf32>, tensor<?x8xf32>, tensor<?x8xf32>) -> tensor<?x16xf32>
    %wo = moe.weight @o : tensor<16x16xf32>
    %out = moe.linear %att, %wo : (tensor<?x16xf32>, tensor<16x16xf32>) -> tensor<?x16xf32>
    %y = moe.add %x, %out : tensor<?x16xf32>
    moe.yield %y : tensor<?x16xf32>
  }
  func.func @forward(%ids: tensor<?xi64>, %pos: tensor<?xi64>) -> tensor<?x32xf32> {
    %t = moe.weight @embed : tensor<32x16xf32>
    %h0 = moe.embedding %ids, %t : (tensor<?xi64>, tensor<32x16xf32>) -> tensor<?x16xf32>
    %h1 = moe.apply_layer @block[0](%h0, %pos) : (tensor<?x16xf32>, tensor<?xi64>) -> tensor<?x16xf32>
    %w = moe.weight @head : tensor<32x16xf32>
    %l = moe.linear %h1, %w : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
    return %l : tensor<?x32xf32>
  }
}

// -----

// Latent attention (moe.mla) the same way: the forward saves its result and logsumexp.
// CHECK-LABEL: moe.layer @latent_fwd(
// CHECK: %[[O:.*]], %[[LSE:.*]] = moe.mla {{.*}} -> (tensor<?x8xf32>, tensor<?x2xf32>)
// CHECK: moe.yield {{.*}}%[[O]], %[[LSE]] :
// CHECK-LABEL: moe.layer @latent_bwd(
// CHECK: moe.backward "moe.mla"({{.*}}) outputs(%{{.*}}, %{{.*}}) grads(
moe.model @mla {
  moe.param @embed "model.embed_tokens.weight" : tensor<32x16xf32>
  moe.param @head "lm_head.weight" : tensor<32x16xf32>
  moe.layer @latent(%x: tensor<?x16xf32>, %pos: tensor<?xi64>) -> tensor<?x16xf32> {
    moe.param @q "model.layers.{layer}.self_attn.q_proj.weight" : tensor<12x16xf32>
    moe.param @q_lora_A "base_model.model.model.layers.{layer}.self_attn.q_proj.lora_A.weight" trainable : tensor<4x16xf32>
    moe.param @q_lora_B "base_model.model.model.layers.{layer}.self_attn.q_proj.lora_B.weight" trainable : tensor<12x4xf32>
    moe.param @kr "model.layers.{layer}.self_attn.kr.weight" : tensor<2x16xf32>
    moe.param @kv "model.layers.{layer}.self_attn.kv_b_proj.weight" : tensor<16x16xf32>
    moe.param @o "model.layers.{layer}.self_attn.o_proj.weight" : tensor<16x8xf32>
    %wq = moe.weight @q : tensor<12x16xf32>
    %q0 = moe.linear %x, %wq : (tensor<?x16xf32>, tensor<12x16xf32>) -> tensor<?x12xf32>
    %a = moe.weight @q_lora_A : tensor<4x16xf32>
    %b = moe.weight @q_lora_B : tensor<12x4xf32>
    %d = moe.lora %x, %a, %b {scale = 2.0 : f64} : (tensor<?x16xf32>, tensor<4x16xf32>, tensor<12x4xf32>) -> tensor<?x12xf32>
    %q = moe.add %q0, %d : tensor<?x12xf32>
    %wkr = moe.weight @kr : tensor<2x16xf32>
    %kr = moe.linear %x, %wkr : (tensor<?x16xf32>, tensor<2x16xf32>) -> tensor<?x2xf32>
    %wkv = moe.weight @kv : tensor<16x16xf32>
    %kv = moe.linear %x, %wkv : (tensor<?x16xf32>, tensor<16x16xf32>) -> tensor<?x16xf32>
    %att = moe.mla %q, %kr, %kv, %pos {num_heads = 2 : i64, qk_nope_head_dim = 4 : i64, qk_rope_head_dim = 2 : i64, v_head_dim = 4 : i64, scale = 5.000000e-01 : f64} : (tensor<?x12xf32>, tensor<?x2xf32>, tensor<?x16xf32>, tensor<?xi64>) -> tensor<?x8xf32>
    %wo = moe.weight @o : tensor<16x8xf32>
    %out = moe.linear %att, %wo : (tensor<?x8xf32>, tensor<16x8xf32>) -> tensor<?x16xf32>
    %y = moe.add %x, %out : tensor<?x16xf32>
    moe.yield %y : tensor<?x16xf32>
  }
  func.func @forward(%ids: tensor<?xi64>, %pos: tensor<?xi64>) -> tensor<?x32xf32> {
    %t = moe.weight @embed : tensor<32x16xf32>
    %h0 = moe.embedding %ids, %t : (tensor<?xi64>, tensor<32x16xf32>) -> tensor<?x16xf32>
    %h1 = moe.apply_layer @latent[0](%h0, %pos) : (tensor<?x16xf32>, tensor<?xi64>) -> tensor<?x16xf32>
    %w = moe.weight @head : tensor<32x16xf32>
    %l = moe.linear %h1, %w : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
    return %l : tensor<?x32xf32>
  }
}
