// A Mixtral-style layer: routed experts named w1 (gate), w3 (up), w2 (down).
moe.model @mixtral {
  moe.layer @gqa_moe(%x: tensor<?x16xf32>, %pos: tensor<?xi64>) -> tensor<?x16xf32> attributes {token_mixer = "gqa", channel_mixer = "moe"} {
    moe.param @self_attn_q_proj "model.layers.{layer}.self_attn.q_proj.weight" : tensor<16x16xf32>
    moe.param @self_attn_o_proj "model.layers.{layer}.self_attn.o_proj.weight" : tensor<16x16xf32>
    moe.param @block_sparse_moe_gate "model.layers.{layer}.block_sparse_moe.gate.weight" : tensor<4x16xf32>
    moe.param @block_sparse_moe_experts_w1 "model.layers.{layer}.block_sparse_moe.experts.{expert}.w1.weight" : tensor<4x8x16xf32>
    moe.param @block_sparse_moe_experts_w3 "model.layers.{layer}.block_sparse_moe.experts.{expert}.w3.weight" : tensor<4x8x16xf32>
    moe.param @block_sparse_moe_experts_w2 "model.layers.{layer}.block_sparse_moe.experts.{expert}.w2.weight" : tensor<4x16x8xf32>
    %wq = moe.weight @self_attn_q_proj : tensor<16x16xf32>
    %q = moe.linear %x, %wq : (tensor<?x16xf32>, tensor<16x16xf32>) -> tensor<?x16xf32>
    %wo = moe.weight @self_attn_o_proj : tensor<16x16xf32>
    %o = moe.linear %q, %wo : (tensor<?x16xf32>, tensor<16x16xf32>) -> tensor<?x16xf32>
    %h = moe.add %x, %o : tensor<?x16xf32>
    %wr = moe.weight @block_sparse_moe_gate : tensor<4x16xf32>
    %rw, %ri = moe.router %h, %wr {top_k = 2 : i64, scoring = #moe<scoring softmax>, norm_topk_prob} : (tensor<?x16xf32>, tensor<4x16xf32>) -> (tensor<?x2xf32>, tensor<?x2xi32>)
    %tok, %cnt = moe.dispatch %h, %ri {num_experts = 4 : i64} : (tensor<?x16xf32>, tensor<?x2xi32>) -> (tensor<?x16xf32>, tensor<4xi64>)
    %w1 = moe.weight @block_sparse_moe_experts_w1 : tensor<4x8x16xf32>
    %w3 = moe.weight @block_sparse_moe_experts_w3 : tensor<4x8x16xf32>
    %w2 = moe.weight @block_sparse_moe_experts_w2 : tensor<4x16x8xf32>
    %e = moe.expert_mlp %tok, %cnt, up %w3, down %w2 gate %w1 {activation = #moe<activation silu>} : (tensor<?x16xf32>, tensor<4xi64>, tensor<4x8x16xf32>, tensor<4x16x8xf32>, tensor<4x8x16xf32>) -> tensor<?x16xf32>
    %c = moe.combine %e, %ri, %rw : (tensor<?x16xf32>, tensor<?x2xi32>, tensor<?x2xf32>) -> tensor<?x16xf32>
    %y = moe.add %h, %c : tensor<?x16xf32>
    moe.yield %y : tensor<?x16xf32>
  }
}
