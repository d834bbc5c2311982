// The tiny model placed on dp=2,ep=2 (--moe-propagate-sharding's output), with its routed
// experts' up projection made trainable by hand: a trainable parameter split over ep.
module {
  moe.model @tiny attributes {mesh = "dp=2,ep=2"} {
    moe.param @embed "model.embed_tokens.weight" : tensor<32x16xf32>
    moe.param @head "lm_head.weight" : tensor<32x16xf32>
    moe.layer @block(%arg0: tensor<?x16xf32>, %arg1: tensor<?xi64>) -> tensor<?x16xf32> {
      moe.param @norm "model.layers.{layer}.norm.weight" : tensor<16xf32>
      moe.param @q "model.layers.{layer}.q_proj.weight" : tensor<16x16xf32>
      moe.param @q_lora_A "base_model.model.model.layers.{layer}.q_proj.lora_A.weight" trainable : tensor<4x16xf32>
      moe.param @q_lora_B "base_model.model.model.layers.{layer}.q_proj.lora_B.weight" trainable : tensor<16x4xf32>
      moe.param @router "model.layers.{layer}.mlp.gate.weight" : tensor<4x16xf32>
      moe.param @up "model.layers.{layer}.mlp.experts.{expert}.up_proj.weight" trainable : tensor<4x8x16xf32> sharding #moe.sharding<[ep, _, _]>
      moe.param @down "model.layers.{layer}.mlp.experts.{expert}.down_proj.weight" : tensor<4x16x8xf32> sharding #moe.sharding<[ep, _, _]>
      %0 = moe.weight @norm : tensor<16xf32>
      %1 = moe.rms_norm %arg0, %0 {eps = 9.9999999999999995E-7 : f64} : (tensor<?x16xf32>, tensor<16xf32>) -> tensor<?x16xf32>
      %2 = moe.weight @q : tensor<16x16xf32>
      %3 = moe.linear %1, %2 : (tensor<?x16xf32>, tensor<16x16xf32>) -> tensor<?x16xf32>
      %4 = moe.weight @q_lora_A : tensor<4x16xf32>
      %5 = moe.weight @q_lora_B : tensor<16x4xf32>
      %6 = moe.lora %1, %4, %5 {scale = 2.000000e+00 : f64} : (tensor<?x16xf32>, tensor<4x16xf32>, tensor<16x4xf32>) -> tensor<?x16xf32>
      %7 = moe.add %3, %6 : tensor<?x16xf32>
      %8 = moe.weight @router : tensor<4x16xf32>
      %weights, %indices = moe.router %7, %8 {norm_topk_prob, scoring = #moe<scoring softmax>, top_k = 2 : i64} : (tensor<?x16xf32>, tensor<4x16xf32>) -> (tensor<?x2xf32>, tensor<?x2xi32>)
      %local_indices, %layout = moe.ep_route %indices {axis = "ep", num_experts = 4 : i64, ranks = 2 : i64} : (tensor<?x2xi32>) -> (tensor<?x2xi32>, tensor<2x4xi64>)
      %received = moe.ep_send %7, %layout {axis = "ep", ranks = 2 : i64} : (tensor<?x16xf32>, tensor<2x4xi64>) -> tensor<?x16xf32>
      %tokens, %counts = moe.dispatch %received, %local_indices {num_experts = 2 : i64} : (tensor<?x16xf32>, tensor<?x2xi32>) -> (tensor<?x16xf32>, tensor<2xi64>)
      %9 = moe.weight @up : tensor<2x8x16xf32>
      %10 = moe.weight @down : tensor<2x16x8xf32>
      %11 = moe.expert_mlp %tokens, %counts, up %9, down %10 {activation = #moe<activation relu2>} : (tensor<?x16xf32>, tensor<2xi64>, tensor<2x8x16xf32>, tensor<2x16x8xf32>) -> tensor<?x16xf32>
      %rw = moe.ep_send %weights, %layout {axis = "ep", ranks = 2 : i64} : (tensor<?x2xf32>, tensor<2x4xi64>) -> tensor<?x2xf32>
      %12 = moe.combine %11, %local_indices, %rw : (tensor<?x16xf32>, tensor<?x2xi32>, tensor<?x2xf32>) -> tensor<?x16xf32>
      %13 = moe.ep_return %12, %layout {axis = "ep", ranks = 2 : i64} : (tensor<?x16xf32>, tensor<2x4xi64>) -> tensor<?x16xf32>
      %14 = moe.add %arg0, %13 : tensor<?x16xf32>
      moe.yield %14 : tensor<?x16xf32>
    }
    func.func @forward(%arg0: tensor<?xi64>, %arg1: tensor<?xi64>) -> tensor<?x32xf32> {
      %0 = moe.weight @embed : tensor<32x16xf32>
      %1 = moe.embedding %arg0, %0 : (tensor<?xi64>, tensor<32x16xf32>) -> tensor<?x16xf32>
      %2 = moe.apply_layer @block[0] (%1, %arg1) : (tensor<?x16xf32>, tensor<?xi64>) -> tensor<?x16xf32>
      %3 = moe.apply_layer @block[1] (%2, %arg1) : (tensor<?x16xf32>, tensor<?xi64>) -> tensor<?x16xf32>
      %4 = moe.weight @head : tensor<32x16xf32>
      %5 = moe.linear %3, %4 : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
      return %5 : tensor<?x32xf32>
    }
  }
}

