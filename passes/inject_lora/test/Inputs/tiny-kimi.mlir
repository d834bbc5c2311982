// Kimi-Linear's projections: a KDA layer and an MLA layer with routed experts (w1/w3/w2).
moe.model @kimi {
  moe.layer @kda_dense(%x: tensor<?x16xf32>, %pos: tensor<?xi64>) -> tensor<?x16xf32> attributes {token_mixer = "kda", channel_mixer = "dense"} {
    moe.param @self_attn_q_proj "model.layers.{layer}.self_attn.q_proj.weight" : tensor<16x16xf32>
    moe.param @self_attn_k_proj "model.layers.{layer}.self_attn.k_proj.weight" : tensor<16x16xf32>
    moe.param @self_attn_v_proj "model.layers.{layer}.self_attn.v_proj.weight" : tensor<16x16xf32>
    moe.param @self_attn_f_a_proj "model.layers.{layer}.self_attn.f_a_proj.weight" : tensor<4x16xf32>
    moe.param @self_attn_f_b_proj "model.layers.{layer}.self_attn.f_b_proj.weight" : tensor<16x4xf32>
    moe.param @self_attn_b_proj "model.layers.{layer}.self_attn.b_proj.weight" : tensor<2x16xf32>
    moe.param @self_attn_g_a_proj "model.layers.{layer}.self_attn.g_a_proj.weight" : tensor<4x16xf32>
    moe.param @self_attn_g_b_proj "model.layers.{layer}.self_attn.g_b_proj.weight" : tensor<16x4xf32>
    moe.param @self_attn_o_proj "model.layers.{layer}.self_attn.o_proj.weight" : tensor<16x16xf32>
    %wq = moe.weight @self_attn_q_proj : tensor<16x16xf32>
    %q = moe.linear %x, %wq : (tensor<?x16xf32>, tensor<16x16xf32>) -> tensor<?x16xf32>
    %wk = moe.weight @self_attn_k_proj : tensor<16x16xf32>
    %k = moe.linear %x, %wk : (tensor<?x16xf32>, tensor<16x16xf32>) -> tensor<?x16xf32>
    %wv = moe.weight @self_attn_v_proj : tensor<16x16xf32>
    %v = moe.linear %x, %wv : (tensor<?x16xf32>, tensor<16x16xf32>) -> tensor<?x16xf32>
    %wfa = moe.weight @self_attn_f_a_proj : tensor<4x16xf32>
    %fa = moe.linear %x, %wfa : (tensor<?x16xf32>, tensor<4x16xf32>) -> tensor<?x4xf32>
    %wfb = moe.weight @self_attn_f_b_proj : tensor<16x4xf32>
    %f = moe.linear %fa, %wfb : (tensor<?x4xf32>, tensor<16x4xf32>) -> tensor<?x16xf32>
    %wb = moe.weight @self_attn_b_proj : tensor<2x16xf32>
    %b = moe.linear %x, %wb : (tensor<?x16xf32>, tensor<2x16xf32>) -> tensor<?x2xf32>
    %wga = moe.weight @self_attn_g_a_proj : tensor<4x16xf32>
    %ga = moe.linear %x, %wga : (tensor<?x16xf32>, tensor<4x16xf32>) -> tensor<?x4xf32>
    %wgb = moe.weight @self_attn_g_b_proj : tensor<16x4xf32>
    %g = moe.linear %ga, %wgb : (tensor<?x4xf32>, tensor<16x4xf32>) -> tensor<?x16xf32>
    %qk = moe.add %q, %k : tensor<?x16xf32>
    %vf = moe.add %v, %f : tensor<?x16xf32>
    %s0 = moe.add %qk, %vf : tensor<?x16xf32>
    %s = moe.add %s0, %g : tensor<?x16xf32>
    %wo = moe.weight @self_attn_o_proj : tensor<16x16xf32>
    %o = moe.linear %s, %wo : (tensor<?x16xf32>, tensor<16x16xf32>) -> tensor<?x16xf32>
    %y = moe.add %x, %o : tensor<?x16xf32>
    moe.yield %y : tensor<?x16xf32>
  }
  moe.layer @mla_moe(%x: tensor<?x16xf32>, %pos: tensor<?xi64>) -> tensor<?x16xf32> attributes {token_mixer = "mla", channel_mixer = "moe"} {
    moe.param @self_attn_q_proj "model.layers.{layer}.self_attn.q_proj.weight" : tensor<16x16xf32>
    moe.param @self_attn_kv_a_proj_with_mqa "model.layers.{layer}.self_attn.kv_a_proj_with_mqa.weight" : tensor<8x16xf32>
    moe.param @self_attn_kv_b_proj "model.layers.{layer}.self_attn.kv_b_proj.weight" : tensor<16x8xf32>
    moe.param @self_attn_o_proj "model.layers.{layer}.self_attn.o_proj.weight" : tensor<16x16xf32>
    moe.param @block_sparse_moe_gate "model.layers.{layer}.block_sparse_moe.gate.weight" : tensor<4x16xf32>
    moe.param @block_sparse_moe_experts_w1 "model.layers.{layer}.block_sparse_moe.experts.{expert}.w1.weight" : tensor<4x8x16xf32>
    moe.param @block_sparse_moe_experts_w3 "model.layers.{layer}.block_sparse_moe.experts.{expert}.w3.weight" : tensor<4x8x16xf32>
    moe.param @block_sparse_moe_experts_w2 "model.layers.{layer}.block_sparse_moe.experts.{expert}.w2.weight" : tensor<4x16x8xf32>
    %wq = moe.weight @self_attn_q_proj : tensor<16x16xf32>
    %q = moe.linear %x, %wq : (tensor<?x16xf32>, tensor<16x16xf32>) -> tensor<?x16xf32>
    %wa = moe.weight @self_attn_kv_a_proj_with_mqa : tensor<8x16xf32>
    %kva = moe.linear %x, %wa : (tensor<?x16xf32>, tensor<8x16xf32>) -> tensor<?x8xf32>
    %wb = moe.weight @self_attn_kv_b_proj : tensor<16x8xf32>
    %kv = moe.linear %kva, %wb : (tensor<?x8xf32>, tensor<16x8xf32>) -> tensor<?x16xf32>
    %a = moe.add %q, %kv : tensor<?x16xf32>
    %wo = moe.weight @self_attn_o_proj : tensor<16x16xf32>
    %o = moe.linear %a, %wo : (tensor<?x16xf32>, tensor<16x16xf32>) -> tensor<?x16xf32>
    %h = moe.add %x, %o : tensor<?x16xf32>
    %wr = moe.weight @block_sparse_moe_gate : tensor<4x16xf32>
    %rw, %ri = moe.router %h, %wr {top_k = 2 : i64, scoring = #moe<scoring softmax>} : (tensor<?x16xf32>, tensor<4x16xf32>) -> (tensor<?x2xf32>, tensor<?x2xi32>)
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
