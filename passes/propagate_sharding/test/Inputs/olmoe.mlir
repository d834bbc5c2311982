// A one-layer OLMoE as `moec import` writes it (tests/e2e/Inputs/tiny_olmoe.json with one layer):
// its q/k norms span every head (weights [64] on [T, 4 x 16]).
module {
  moe.model @OlmoeForCausalLM attributes {hidden_size = 64 : i64, max_position_embeddings = 1024 : i64, model_type = "olmoe", num_layers = 1 : i64, vocab_size = 256 : i64} {
    moe.param @embed_tokens "model.embed_tokens.weight" : tensor<256x64xf32>
    moe.param @final_norm "model.norm.weight" : tensor<64xf32>
    moe.param @lm_head "lm_head.weight" : tensor<256x64xf32>
    moe.layer @gqa_moe(%arg0: tensor<?x64xf32>, %arg1: tensor<?xi64>) -> tensor<?x64xf32> attributes {channel_mixer = "moe", layers = array<i64: 0>, token_mixer = "gqa"} {
      moe.param @input_layernorm "model.layers.{layer}.input_layernorm.weight" : tensor<64xf32>
      moe.param @self_attn_q_proj "model.layers.{layer}.self_attn.q_proj.weight" : tensor<64x64xf32>
      moe.param @self_attn_k_proj "model.layers.{layer}.self_attn.k_proj.weight" : tensor<64x64xf32>
      moe.param @self_attn_v_proj "model.layers.{layer}.self_attn.v_proj.weight" : tensor<64x64xf32>
      moe.param @self_attn_q_norm "model.layers.{layer}.self_attn.q_norm.weight" : tensor<64xf32>
      moe.param @self_attn_k_norm "model.layers.{layer}.self_attn.k_norm.weight" : tensor<64xf32>
      moe.param @self_attn_o_proj "model.layers.{layer}.self_attn.o_proj.weight" : tensor<64x64xf32>
      moe.param @post_attention_layernorm "model.layers.{layer}.post_attention_layernorm.weight" : tensor<64xf32>
      moe.param @mlp_gate "model.layers.{layer}.mlp.gate.weight" : tensor<8x64xf32>
      moe.param @mlp_experts_gate_proj "model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight" : tensor<8x32x64xf32>
      moe.param @mlp_experts_up_proj "model.layers.{layer}.mlp.experts.{expert}.up_proj.weight" : tensor<8x32x64xf32>
      moe.param @mlp_experts_down_proj "model.layers.{layer}.mlp.experts.{expert}.down_proj.weight" : tensor<8x64x32xf32>
      %0 = moe.weight @input_layernorm : tensor<64xf32>
      %1 = moe.rms_norm %arg0, %0 {eps = 1.000000e-05 : f64} : (tensor<?x64xf32>, tensor<64xf32>) -> tensor<?x64xf32>
      %2 = moe.weight @self_attn_q_proj : tensor<64x64xf32>
      %3 = moe.linear %1, %2 : (tensor<?x64xf32>, tensor<64x64xf32>) -> tensor<?x64xf32>
      %4 = moe.weight @self_attn_k_proj : tensor<64x64xf32>
      %5 = moe.linear %1, %4 : (tensor<?x64xf32>, tensor<64x64xf32>) -> tensor<?x64xf32>
      %6 = moe.weight @self_attn_v_proj : tensor<64x64xf32>
      %7 = moe.linear %1, %6 : (tensor<?x64xf32>, tensor<64x64xf32>) -> tensor<?x64xf32>
      %8 = moe.weight @self_attn_q_norm : tensor<64xf32>
      %9 = moe.rms_norm %3, %8 {eps = 1.000000e-05 : f64} : (tensor<?x64xf32>, tensor<64xf32>) -> tensor<?x64xf32>
      %10 = moe.weight @self_attn_k_norm : tensor<64xf32>
      %11 = moe.rms_norm %5, %10 {eps = 1.000000e-05 : f64} : (tensor<?x64xf32>, tensor<64xf32>) -> tensor<?x64xf32>
      %12 = moe.rope %9, %arg1 {head_dim = 16 : i64, rope = #moe.rope<theta = 1.000000e+04, dim = 16, style = half>} : (tensor<?x64xf32>, tensor<?xi64>) -> tensor<?x64xf32>
      %13 = moe.rope %11, %arg1 {head_dim = 16 : i64, rope = #moe.rope<theta = 1.000000e+04, dim = 16, style = half>} : (tensor<?x64xf32>, tensor<?xi64>) -> tensor<?x64xf32>
      %result = moe.attention %12, %13, %7 {head_dim = 16 : i64, num_heads = 4 : i64, num_kv_heads = 4 : i64, scale = 2.500000e-01 : f64} : (tensor<?x64xf32>, tensor<?x64xf32>, tensor<?x64xf32>) -> tensor<?x64xf32>
      %14 = moe.weight @self_attn_o_proj : tensor<64x64xf32>
      %15 = moe.linear %result, %14 : (tensor<?x64xf32>, tensor<64x64xf32>) -> tensor<?x64xf32>
      %16 = moe.add %arg0, %15 : tensor<?x64xf32>
      %17 = moe.weight @post_attention_layernorm : tensor<64xf32>
      %18 = moe.rms_norm %16, %17 {eps = 1.000000e-05 : f64} : (tensor<?x64xf32>, tensor<64xf32>) -> tensor<?x64xf32>
      %19 = moe.weight @mlp_gate : tensor<8x64xf32>
      %weights, %indices = moe.router %18, %19 {scoring = #moe<scoring softmax>, top_k = 2 : i64} : (tensor<?x64xf32>, tensor<8x64xf32>) -> (tensor<?x2xf32>, tensor<?x2xi32>)
      %tokens, %counts = moe.dispatch %18, %indices {num_experts = 8 : i64} : (tensor<?x64xf32>, tensor<?x2xi32>) -> (tensor<?x64xf32>, tensor<8xi64>)
      %20 = moe.weight @mlp_experts_gate_proj : tensor<8x32x64xf32>
      %21 = moe.weight @mlp_experts_up_proj : tensor<8x32x64xf32>
      %22 = moe.weight @mlp_experts_down_proj : tensor<8x64x32xf32>
      %result_0 = moe.expert_mlp %tokens, %counts, up %21, down %22 gate %20 {activation = #moe<activation silu>} : (tensor<?x64xf32>, tensor<8xi64>, tensor<8x32x64xf32>, tensor<8x64x32xf32>, tensor<8x32x64xf32>) -> tensor<?x64xf32>
      %23 = moe.combine %result_0, %indices, %weights : (tensor<?x64xf32>, tensor<?x2xi32>, tensor<?x2xf32>) -> tensor<?x64xf32>
      %24 = moe.add %16, %23 : tensor<?x64xf32>
      moe.yield %24 : tensor<?x64xf32>
    }
    func.func @forward(%arg0: tensor<?xi64>, %arg1: tensor<?xi64>) -> tensor<?x256xf32> {
      %0 = moe.weight @embed_tokens : tensor<256x64xf32>
      %1 = moe.embedding %arg0, %0 : (tensor<?xi64>, tensor<256x64xf32>) -> tensor<?x64xf32>
      %2 = moe.apply_layer @gqa_moe[0] (%1, %arg1) : (tensor<?x64xf32>, tensor<?xi64>) -> tensor<?x64xf32>
      %3 = moe.weight @final_norm : tensor<64xf32>
      %4 = moe.rms_norm %2, %3 {eps = 1.000000e-05 : f64} : (tensor<?x64xf32>, tensor<64xf32>) -> tensor<?x64xf32>
      %5 = moe.weight @lm_head : tensor<256x64xf32>
      %6 = moe.linear %4, %5 : (tensor<?x64xf32>, tensor<256x64xf32>) -> tensor<?x256xf32>
      return %6 : tensor<?x256xf32>
    }
  }
}

