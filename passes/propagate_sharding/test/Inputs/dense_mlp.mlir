// One dense layer, a gated MLP (gate and up 32 x 16, down 16 x 32) after its norm, and a
// residual add: what a dense layer or a shared expert looks like after `moec import`.
module {
  moe.model @Dense attributes {hidden_size = 16 : i64, model_type = "dense_test", num_layers = 1 : i64, vocab_size = 32 : i64} {
    moe.param @embed_tokens "model.embed_tokens.weight" : tensor<32x16xf32>
    moe.param @lm_head "lm_head.weight" : tensor<32x16xf32>
    moe.layer @dense(%arg0: tensor<?x16xf32>, %arg1: tensor<?xi64>) -> tensor<?x16xf32> attributes {channel_mixer = "dense", layers = array<i64: 0>, token_mixer = "none"} {
      moe.param @norm "model.layers.{layer}.post_attention_layernorm.weight" : tensor<16xf32>
      moe.param @mlp_gate_proj "model.layers.{layer}.mlp.gate_proj.weight" : tensor<32x16xf32>
      moe.param @mlp_up_proj "model.layers.{layer}.mlp.up_proj.weight" : tensor<32x16xf32>
      moe.param @mlp_down_proj "model.layers.{layer}.mlp.down_proj.weight" : tensor<16x32xf32>
      %0 = moe.weight @norm : tensor<16xf32>
      %1 = moe.rms_norm %arg0, %0 {eps = 9.9999999999999995E-7 : f64} : (tensor<?x16xf32>, tensor<16xf32>) -> tensor<?x16xf32>
      %2 = moe.weight @mlp_gate_proj : tensor<32x16xf32>
      %3 = moe.linear %1, %2 : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
      %4 = moe.weight @mlp_up_proj : tensor<32x16xf32>
      %5 = moe.linear %1, %4 : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
      %6 = moe.glu silu %3, %5 : tensor<?x32xf32>
      %7 = moe.weight @mlp_down_proj : tensor<16x32xf32>
      %8 = moe.linear %6, %7 : (tensor<?x32xf32>, tensor<16x32xf32>) -> tensor<?x16xf32>
      %9 = moe.add %arg0, %8 : tensor<?x16xf32>
      moe.yield %9 : tensor<?x16xf32>
    }
    func.func @forward(%arg0: tensor<?xi64>, %arg1: tensor<?xi64>) -> tensor<?x32xf32> {
      %0 = moe.weight @embed_tokens : tensor<32x16xf32>
      %1 = moe.embedding %arg0, %0 : (tensor<?xi64>, tensor<32x16xf32>) -> tensor<?x16xf32>
      %2 = moe.apply_layer @dense[0] (%1, %arg1) : (tensor<?x16xf32>, tensor<?xi64>) -> tensor<?x16xf32>
      %3 = moe.weight @lm_head : tensor<32x16xf32>
      %4 = moe.linear %2, %3 : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
      return %4 : tensor<?x32xf32>
    }
  }
}
