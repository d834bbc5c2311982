// RUN: moe-opt %s --pass-pipeline='builtin.module(moe.model(moe-build-training-step))' | FileCheck %s

// Tests that pre-activations nothing reads are dropped again: here the layer's output does not
// use its experts (their combine is dead), so no gradient reaches them, their backward is not
// fused with the combine's, and the forward template's expert MLP saves nothing.
// CHECK-LABEL: moe.layer @block_fwd(
// CHECK-NOT: tensor<?x24xf32>
// CHECK: moe.expert_mlp {{.*}} -> tensor<?x16xbf16>
// CHECK-NOT: tensor<?x24xf32>
// CHECK-LABEL: moe.layer @block_bwd(

moe.model @moe {
  moe.param @embed "model.embed_tokens.weight" : tensor<32x16xbf16>
  moe.param @head "lm_head.weight" : tensor<32x16xbf16>
  moe.layer @block(%x: tensor<?x16xbf16>, %pos: tensor<?xi64>) -> tensor<?x16xbf16> {
    moe.param @q "model.layers.{layer}.q_proj.weight" : tensor<16x16xbf16>
    moe.param @q_lora_A "base_model.model.model.layers.{layer}.q_proj.lora_A.weight" trainable : tensor<4x16xf32>
    moe.param @q_lora_B "base_model.model.model.layers.{layer}.q_proj.lora_B.weight" trainable : tensor<16x4xf32>
    moe.param @router "model.layers.{layer}.mlp.gate.weight" : tensor<4x16xbf16>
    moe.param @gate "model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight" : tensor<4x12x16xbf16>
    moe.param @up "model.layers.{layer}.mlp.experts.{expert}.up_proj.weight" : tensor<4x12x16xbf16>
    moe.param @down "model.layers.{layer}.mlp.experts.{expert}.down_proj.weight" : tensor<4x16x12xbf16>
    %wq = moe.weight @q : tensor<16x16xbf16>
    %q = moe.linear %x, %wq : (tensor<?x16xbf16>, tensor<16x16xbf16>) -> tensor<?x16xbf16>
    %a = moe.weight @q_lora_A : tensor<4x16xf32>
    %b = moe.weight @q_lora_B : tensor<16x4xf32>
    %d = moe.lora %x, %a, %b {scale = 2.0 : f64} : (tensor<?x16xbf16>, tensor<4x16xf32>, tensor<16x4xf32>) -> tensor<?x16xbf16>
    %q2 = moe.add %q, %d : tensor<?x16xbf16>
    %wr = moe.weight @router : tensor<4x16xbf16>
    %rw, %ri = moe.router %q2, %wr {top_k = 2 : i64, scoring = #moe<scoring softmax>, norm_topk_prob} : (tensor<?x16xbf16>, tensor<4x16xbf16>) -> (tensor<?x2xf32>, tensor<?x2xi32>)
    %tok, %cnt = moe.dispatch %q2, %ri {num_experts = 4 : i64} : (tensor<?x16xbf16>, tensor<?x2xi32>) -> (tensor<?x16xbf16>, tensor<4xi64>)
    %wg = moe.weight @gate : tensor<4x12x16xbf16>
    %wu = moe.weight @up : tensor<4x12x16xbf16>
    %wd = moe.weight @down : tensor<4x16x12xbf16>
    %e = moe.expert_mlp %tok, %cnt, up %wu, down %wd gate %wg {activation = #moe<activation silu>} : (tensor<?x16xbf16>, tensor<4xi64>, tensor<4x12x16xbf16>, tensor<4x16x12xbf16>, tensor<4x12x16xbf16>) -> tensor<?x16xbf16>
    %c = moe.combine %e, %ri, %rw : (tensor<?x16xbf16>, tensor<?x2xi32>, tensor<?x2xf32>) -> tensor<?x16xbf16>
    %y = moe.add %x, %q2 : tensor<?x16xbf16>
    moe.yield %y : tensor<?x16xbf16>
  }
  func.func @forward(%ids: tensor<?xi64>, %pos: tensor<?xi64>) -> tensor<?x32xbf16> {
    %t = moe.weight @embed : tensor<32x16xbf16>
    %h0 = moe.embedding %ids, %t : (tensor<?xi64>, tensor<32x16xbf16>) -> tensor<?x16xbf16>
    %h1 = moe.apply_layer @block[0](%h0, %pos) : (tensor<?x16xbf16>, tensor<?xi64>) -> tensor<?x16xbf16>
    %w = moe.weight @head : tensor<32x16xbf16>
    %l = moe.linear %h1, %w : (tensor<?x16xbf16>, tensor<32x16xbf16>) -> tensor<?x32xbf16>
    return %l : tensor<?x32xbf16>
  }
}
