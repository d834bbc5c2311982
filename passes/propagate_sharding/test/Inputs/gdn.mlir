// One Gated DeltaNet layer (2 key heads and 4 value heads of 4 features, conv kernel 4) after its
// norm, and a residual add: a Qwen3-Next token mixer as `moec import` writes it.
module {
  moe.model @Gdn attributes {hidden_size = 16 : i64, model_type = "gdn_test", num_layers = 1 : i64, vocab_size = 32 : i64} {
    moe.param @embed_tokens "model.embed_tokens.weight" : tensor<32x16xf32>
    moe.param @lm_head "lm_head.weight" : tensor<32x16xf32>
    moe.layer @gdn(%arg0: tensor<?x16xf32>, %arg1: tensor<?xi64>) -> tensor<?x16xf32> attributes {channel_mixer = "none", layers = array<i64: 0>, token_mixer = "gated_delta_net"} {
      moe.param @norm "model.layers.{layer}.input_layernorm.weight" : tensor<16xf32>
      moe.param @in_proj_qkvz "model.layers.{layer}.linear_attn.in_proj_qkvz.weight" : tensor<48x16xf32>
      moe.param @in_proj_ba "model.layers.{layer}.linear_attn.in_proj_ba.weight" : tensor<8x16xf32>
      moe.param @conv "model.layers.{layer}.linear_attn.conv1d.weight" : tensor<32x1x4xf32>
      moe.param @a_log "model.layers.{layer}.linear_attn.A_log" : tensor<4xf32>
      moe.param @dt_bias "model.layers.{layer}.linear_attn.dt_bias" : tensor<4xf32>
      moe.param @o_norm "model.layers.{layer}.linear_attn.norm.weight" : tensor<4xf32>
      moe.param @out_proj "model.layers.{layer}.linear_attn.out_proj.weight" : tensor<16x16xf32>
      %w = moe.weight @norm : tensor<16xf32>
      %x = moe.rms_norm %arg0, %w {eps = 9.9999999999999995E-7 : f64} : (tensor<?x16xf32>, tensor<16xf32>) -> tensor<?x16xf32>
      %wqkvz = moe.weight @in_proj_qkvz : tensor<48x16xf32>
      %qkvz = moe.linear %x, %wqkvz : (tensor<?x16xf32>, tensor<48x16xf32>) -> tensor<?x48xf32>
      %wba = moe.weight @in_proj_ba : tensor<8x16xf32>
      %ba = moe.linear %x, %wba : (tensor<?x16xf32>, tensor<8x16xf32>) -> tensor<?x8xf32>
      %conv = moe.weight @conv : tensor<32x1x4xf32>
      %alog = moe.weight @a_log : tensor<4xf32>
      %dt = moe.weight @dt_bias : tensor<4xf32>
      %on = moe.weight @o_norm : tensor<4xf32>
      %o = moe.gated_delta_net %qkvz, %ba, %conv, %alog, %dt, %on {num_key_heads = 2 : i64, num_value_heads = 4 : i64, key_head_dim = 4 : i64, value_head_dim = 4 : i64, eps = 1.0e-6 : f64} : (tensor<?x48xf32>, tensor<?x8xf32>, tensor<32x1x4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<?x16xf32>
      %wo = moe.weight @out_proj : tensor<16x16xf32>
      %out = moe.linear %o, %wo : (tensor<?x16xf32>, tensor<16x16xf32>) -> tensor<?x16xf32>
      %y = moe.add %arg0, %out : tensor<?x16xf32>
      moe.yield %y : tensor<?x16xf32>
    }
    func.func @forward(%arg0: tensor<?xi64>, %arg1: tensor<?xi64>) -> tensor<?x32xf32> {
      %0 = moe.weight @embed_tokens : tensor<32x16xf32>
      %1 = moe.embedding %arg0, %0 : (tensor<?xi64>, tensor<32x16xf32>) -> tensor<?x16xf32>
      %2 = moe.apply_layer @gdn[0] (%1, %arg1) : (tensor<?x16xf32>, tensor<?xi64>) -> tensor<?x16xf32>
      %3 = moe.weight @lm_head : tensor<32x16xf32>
      %4 = moe.linear %2, %3 : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
      return %4 : tensor<?x32xf32>
    }
  }
}
