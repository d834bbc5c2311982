// RUN: moe-opt %s | moe-opt | FileCheck %s

// Tests that a model with a parameter, a layer template and a forward function round-trips.
// CHECK-LABEL: moe.model @tiny
// CHECK: moe.param @embed "model.embed_tokens.weight" : tensor<16x8xf32>
// CHECK: moe.param @lm_head "lm_head.weight" trainable : tensor<16x8xf32> sharding #moe.sharding<[tp, _]>
// CHECK: moe.layer @block(%[[X:.*]]: tensor<?x8xf32>) -> tensor<?x8xf32>
// CHECK: moe.param @norm "model.layers.{layer}.norm.weight" : tensor<8xf32>
// CHECK: %[[W:.*]] = moe.weight @norm : tensor<8xf32>
// CHECK: moe.rms_norm %[[X]], %[[W]]
// CHECK: moe.apply_layer @block[0]
// CHECK: moe.apply_layer @block[1]
moe.model @tiny attributes {hidden_size = 8 : i64} {
  moe.param @embed "model.embed_tokens.weight" : tensor<16x8xf32>
  moe.param @lm_head "lm_head.weight" trainable : tensor<16x8xf32> sharding #moe.sharding<[tp, _]>
  moe.layer @block(%x: tensor<?x8xf32>) -> tensor<?x8xf32> {
    moe.param @norm "model.layers.{layer}.norm.weight" : tensor<8xf32>
    %w = moe.weight @norm : tensor<8xf32>
    %y = moe.rms_norm %x, %w {eps = 1.0e-06 : f64} : (tensor<?x8xf32>, tensor<8xf32>) -> tensor<?x8xf32>
    moe.yield %y : tensor<?x8xf32>
  }
  func.func @forward(%ids: tensor<?xi64>) -> tensor<?x16xf32> {
    %table = moe.weight @embed : tensor<16x8xf32>
    %e = moe.embedding %ids, %table : (tensor<?xi64>, tensor<16x8xf32>) -> tensor<?x8xf32>
    %h0 = moe.apply_layer @block[0](%e) : (tensor<?x8xf32>) -> tensor<?x8xf32>
    %h1 = moe.apply_layer @block[1](%h0) : (tensor<?x8xf32>) -> tensor<?x8xf32>
    %head = moe.weight @lm_head : tensor<16x8xf32>
    %logits = moe.linear %h1, %head : (tensor<?x8xf32>, tensor<16x8xf32>) -> tensor<?x16xf32>
    return %logits : tensor<?x16xf32>
  }
}
