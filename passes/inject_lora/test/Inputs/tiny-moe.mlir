// Two layer templates: a KDA layer with a dense MLP, a GQA layer with Qwen-style routed experts.
moe.model @tiny {
  moe.param @embed "model.embed_tokens.weight" : tensor<32x16xf32>
  moe.param @head "lm_head.weight" : tensor<32x16xf32>
  moe.layer @kda_dense(%x: tensor<?x16xf32>, %pos: tensor<?xi64>) -> tensor<?x16xf32> attributes {token_mixer = "kda", channel_mixer = "dense"} {
    moe.param @self_attn_o_proj "model.layers.{layer}.self_attn.o_proj.weight" : tensor<16x16xf32>
    moe.param @mlp_gate_proj "model.layers.{layer}.mlp.gate_proj.weight" : tensor<8x16xf32>
    moe.param @mlp_up_proj "model.layers.{layer}.mlp.up_proj.weight" : tensor<8x16xf32>
    moe.param @mlp_down_proj "model.layers.{layer}.mlp.down_proj.weight" : tensor<16x8xf32>
    %wo = moe.weight @self_attn_o_proj : tensor<16x16xf32>
    %o = moe.linear %x, %wo : (tensor<?x16xf32>, tensor<16x16xf32>) -> tensor<?x16xf32>
    %h = moe.add %x, %o : tensor<?x16xf32>
    %wg = moe.weight @mlp_gate_proj : tensor<8x16xf32>
    %g = moe.linear %h, %wg : (tensor<?x16xf32>, tensor<8x16xf32>) -> tensor<?x8xf32>
    %wu = moe.weight @mlp_up_proj : tensor<8x16xf32>
    %u = moe.linear %h, %wu : (tensor<?x16xf32>, tensor<8x16xf32>) -> tensor<?x8xf32>
    %a = moe.glu silu %g, %u : tensor<?x8xf32>
    %wd = moe.weight @mlp_down_proj : tensor<16x8xf32>
    %d = moe.linear %a, %wd : (tensor<?x8xf32>, tensor<16x8xf32>) -> tensor<?x16xf32>
    %y = moe.add %h, %d : tensor<?x16xf32>
    moe.yield %y : tensor<?x16xf32>
  }
  moe.layer @gqa_moe(%x: tensor<?x16xf32>, %pos: tensor<?xi64>) -> tensor<?x16xf32> attributes {token_mixer = "gqa", channel_mixer = "moe"} {
    moe.param @self_attn_q_proj "model.layers.{layer}.self_attn.q_proj.weight" : tensor<16x16xf32>
    moe.param @self_attn_k_proj "model.layers.{layer}.self_attn.k_proj.weight" : tensor<8x16xf32>
    moe.param @self_attn_v_proj "model.layers.{layer}.self_attn.v_proj.weight" : tensor<8x16xf32>
    moe.param @self_attn_o_proj "model.layers.{layer}.self_attn.o_proj.weight" : tensor<16x8xf32>
    moe.param @mlp_gate "model.layers.{layer}.mlp.gate.weight" : tensor<4x16xf32>
    moe.param @mlp_experts_gate_proj "model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight" : tensor<4x8x16xf32>
    moe.param @mlp_experts_up_proj "model.layers.{layer}.mlp.experts.{expert}.up_proj.weight" : tensor<4x8x16xf32>
    moe.param @mlp_experts_down_proj "model.layers.{layer}.mlp.experts.{expert}.down_proj.weight" : tensor<4x16x8xf32>
    %wq = moe.weight @self_attn_q_proj : tensor<16x16xf32>
    %q = moe.linear %x, %wq : (tensor<?x16xf32>, tensor<16x16xf32>) -> tensor<?x16xf32>
    %wk = moe.weight @self_attn_k_proj : tensor<8x16xf32>
    %k = moe.linear %x, %wk : (tensor<?x16xf32>, tensor<8x16xf32>) -> tensor<?x8xf32>
    %wv = moe.weight @self_attn_v_proj : tensor<8x16xf32>
    %v = moe.linear %x, %wv : (tensor<?x16xf32>, tensor<8x16xf32>) -> tensor<?x8xf32>
    %kv = moe.add %k, %v : tensor<?x8xf32>
    %wo = moe.weight @self_attn_o_proj : tensor<16x8xf32>
    %o = moe.linear %kv, %wo : (tensor<?x8xf32>, tensor<16x8xf32>) -> tensor<?x16xf32>
    %qo = moe.add %q, %o : tensor<?x16xf32>
    %h = moe.add %x, %qo : tensor<?x16xf32>
    %wr = moe.weight @mlp_gate : tensor<4x16xf32>
    %rw, %ri = moe.router %h, %wr {top_k = 2 : i64, scoring = #moe<scoring softmax>, norm_topk_prob} : (tensor<?x16xf32>, tensor<4x16xf32>) -> (tensor<?x2xf32>, tensor<?x2xi32>)
    %tok, %cnt = moe.dispatch %h, %ri {num_experts = 4 : i64} : (tensor<?x16xf32>, tensor<?x2xi32>) -> (tensor<?x16xf32>, tensor<4xi64>)
    %eg = moe.weight @mlp_experts_gate_proj : tensor<4x8x16xf32>
    %eu = moe.weight @mlp_experts_up_proj : tensor<4x8x16xf32>
    %ed = moe.weight @mlp_experts_down_proj : tensor<4x16x8xf32>
    %e = moe.expert_mlp %tok, %cnt, up %eu, down %ed gate %eg {activation = #moe<activation silu>} : (tensor<?x16xf32>, tensor<4xi64>, tensor<4x8x16xf32>, tensor<4x16x8xf32>, tensor<4x8x16xf32>) -> tensor<?x16xf32>
    %c = moe.combine %e, %ri, %rw : (tensor<?x16xf32>, tensor<?x2xi32>, tensor<?x2xf32>) -> tensor<?x16xf32>
    %y = moe.add %h, %c : tensor<?x16xf32>
    moe.yield %y : tensor<?x16xf32>
  }
  func.func @forward(%ids: tensor<?xi64>, %pos: tensor<?xi64>) -> tensor<?x32xf32> {
    %t = moe.weight @embed : tensor<32x16xf32>
    %h0 = moe.embedding %ids, %t : (tensor<?xi64>, tensor<32x16xf32>) -> tensor<?x16xf32>
    %h1 = moe.apply_layer @kda_dense[0](%h0, %pos) : (tensor<?x16xf32>, tensor<?xi64>) -> tensor<?x16xf32>
    %h2 = moe.apply_layer @gqa_moe[1](%h1, %pos) : (tensor<?x16xf32>, tensor<?xi64>) -> tensor<?x16xf32>
    %w = moe.weight @head : tensor<32x16xf32>
    %l = moe.linear %h2, %w : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
    return %l : tensor<?x32xf32>
  }
}
