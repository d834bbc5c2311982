// RUN: moe-opt %s -split-input-file | moe-opt -split-input-file | FileCheck %s
// RUN: moe-opt %s -split-input-file --mlir-print-op-generic | moe-opt -split-input-file | FileCheck %s

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

// -----

// Tests that stacked per-expert, sharded and replicated parameters keep their attributes.
// CHECK-LABEL: moe.model @experts attributes {hidden_size = 2048 : i64, num_experts = 128 : i64, num_layers = 48 : i64}
// CHECK: moe.layer @moe_block(%[[X:.*]]: tensor<?x2048xbf16>) -> tensor<?x2048xbf16> attributes {channel_mixer = "moe", layers = array<i64: 0, 1, 2>, token_mixer = "gqa"}
// CHECK: moe.param @router "model.layers.{layer}.mlp.gate.weight" : tensor<128x2048xbf16> sharding #moe.sharding<replicated>
// CHECK: moe.param @experts_up "model.layers.{layer}.mlp.experts.{expert}.up_proj.weight" : tensor<128x768x2048xbf16> sharding #moe.sharding<[ep, _, _]>
// CHECK: moe.param @experts_down "model.layers.{layer}.mlp.experts.{expert}.down_proj.weight" trainable : tensor<128x2048x768xbf16> sharding #moe.sharding<[ep, _, tp]>
// CHECK: %[[UP:.*]] = moe.weight @experts_up : tensor<128x768x2048xbf16>
// CHECK: %[[DOWN:.*]] = moe.weight @experts_down : tensor<128x2048x768xbf16>
// CHECK: moe.yield %[[X]] : tensor<?x2048xbf16>
moe.model @experts attributes {hidden_size = 2048 : i64, num_experts = 128 : i64, num_layers = 48 : i64} {
  moe.layer @moe_block(%x: tensor<?x2048xbf16>) -> tensor<?x2048xbf16> attributes {token_mixer = "gqa", channel_mixer = "moe", layers = array<i64: 0, 1, 2>} {
    moe.param @router "model.layers.{layer}.mlp.gate.weight" : tensor<128x2048xbf16> sharding #moe.sharding<replicated>
    moe.param @experts_up "model.layers.{layer}.mlp.experts.{expert}.up_proj.weight" : tensor<128x768x2048xbf16> sharding #moe.sharding<[ep, _, _]>
    moe.param @experts_down "model.layers.{layer}.mlp.experts.{expert}.down_proj.weight" trainable : tensor<128x2048x768xbf16> sharding #moe.sharding<[ep, _, tp]>
    %up = moe.weight @experts_up : tensor<128x768x2048xbf16>
    %down = moe.weight @experts_down : tensor<128x2048x768xbf16>
    moe.yield %x : tensor<?x2048xbf16>
  }
}

// -----

// Tests that a layer template with several inputs and outputs is applied with matching operands and results.
// CHECK-LABEL: moe.model @multi
// CHECK: moe.layer @block(%[[X:.*]]: tensor<?x8xf32>, %[[POS:.*]]: tensor<?xi64>) -> (tensor<?x8xf32>, tensor<?xi64>)
// CHECK: moe.yield %[[X]], %[[POS]] : tensor<?x8xf32>, tensor<?xi64>
// CHECK: func.func @forward(%[[H:.*]]: tensor<?x8xf32>, %[[P:.*]]: tensor<?xi64>) -> tensor<?x8xf32>
// CHECK: %[[R0:.*]]:2 = moe.apply_layer @block[0] (%[[H]], %[[P]]) : (tensor<?x8xf32>, tensor<?xi64>) -> (tensor<?x8xf32>, tensor<?xi64>)
// CHECK: %[[R1:.*]]:2 = moe.apply_layer @block[7] (%[[R0]]#0, %[[R0]]#1) : (tensor<?x8xf32>, tensor<?xi64>) -> (tensor<?x8xf32>, tensor<?xi64>)
// CHECK: return %[[R1]]#0
moe.model @multi {
  moe.layer @block(%x: tensor<?x8xf32>, %pos: tensor<?xi64>) -> (tensor<?x8xf32>, tensor<?xi64>) {
    moe.yield %x, %pos : tensor<?x8xf32>, tensor<?xi64>
  }
  func.func @forward(%h: tensor<?x8xf32>, %p: tensor<?xi64>) -> tensor<?x8xf32> {
    %a:2 = moe.apply_layer @block[0](%h, %p) : (tensor<?x8xf32>, tensor<?xi64>) -> (tensor<?x8xf32>, tensor<?xi64>)
    %b:2 = moe.apply_layer @block[7](%a#0, %a#1) : (tensor<?x8xf32>, tensor<?xi64>) -> (tensor<?x8xf32>, tensor<?xi64>)
    return %b#0 : tensor<?x8xf32>
  }
}

// -----

// Tests that an explicit all-unsplit sharding keeps its per-dimension form.
// CHECK-LABEL: moe.model @explicit_unsplit
// CHECK: sharding #moe.sharding<[_, _]>
moe.model @explicit_unsplit {
  moe.param @w "w.weight" : tensor<4x4xf32> sharding #moe.sharding<[_, _]>
}
