// A gpt-oss-style layer: gate and up interleaved in one [in, out] tensor per layer, with biases.
moe.model @gpt_oss {
  moe.layer @gqa_moe(%x: tensor<?x16xf32>, %pos: tensor<?xi64>) -> tensor<?x16xf32> attributes {token_mixer = "gqa", channel_mixer = "moe"} {
    moe.param @self_attn_q_proj "model.layers.{layer}.self_attn.q_proj.weight" : tensor<16x16xf32>
    moe.param @mlp_router "model.layers.{layer}.mlp.router.weight" : tensor<4x16xf32>
    moe.param @mlp_experts_gate_up_proj "model.layers.{layer}.mlp.experts.gate_up_proj" : tensor<4x16x16xf32>
    moe.param @mlp_experts_gate_up_proj_bias "model.layers.{layer}.mlp.experts.gate_up_proj_bias" : tensor<4x16xf32>
    moe.param @mlp_experts_down_proj "model.layers.{layer}.mlp.experts.down_proj" : tensor<4x8x16xf32>
    moe.param @mlp_experts_down_proj_bias "model.layers.{layer}.mlp.experts.down_proj_bias" : tensor<4x16xf32>
    %wq = moe.weight @self_attn_q_proj : tensor<16x16xf32>
    %q = moe.linear %x, %wq : (tensor<?x16xf32>, tensor<16x16xf32>) -> tensor<?x16xf32>
    %wr = moe.weight @mlp_router : tensor<4x16xf32>
    %rw, %ri = moe.router %q, %wr {top_k = 2 : i64, scoring = #moe<scoring topk_softmax>} : (tensor<?x16xf32>, tensor<4x16xf32>) -> (tensor<?x2xf32>, tensor<?x2xi32>)
    %tok, %cnt = moe.dispatch %q, %ri {num_experts = 4 : i64} : (tensor<?x16xf32>, tensor<?x2xi32>) -> (tensor<?x16xf32>, tensor<4xi64>)
    %gu = moe.weight @mlp_experts_gate_up_proj : tensor<4x16x16xf32>
    %gub = moe.weight @mlp_experts_gate_up_proj_bias : tensor<4x16xf32>
    %d = moe.weight @mlp_experts_down_proj : tensor<4x8x16xf32>
    %db = moe.weight @mlp_experts_down_proj_bias : tensor<4x16xf32>
    %e = moe.expert_mlp %tok, %cnt, up %gu, down %d up_bias %gub down_bias %db {activation = #moe<activation clamped_swiglu>, fused_gate_up, in_out_layout, limit = 7.0 : f64} : (tensor<?x16xf32>, tensor<4xi64>, tensor<4x16x16xf32>, tensor<4x8x16xf32>, tensor<4x16xf32>, tensor<4x16xf32>) -> tensor<?x16xf32>
    %c = moe.combine %e, %ri, %rw : (tensor<?x16xf32>, tensor<?x2xi32>, tensor<?x2xf32>) -> tensor<?x16xf32>
    %y = moe.add %x, %c : tensor<?x16xf32>
    moe.yield %y : tensor<?x16xf32>
  }
}
