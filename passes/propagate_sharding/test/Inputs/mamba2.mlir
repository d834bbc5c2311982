// One Mamba-2 mixer (2 heads of 4 features, 2 groups, state 4, conv kernel 4) after its norm, and
// a residual add: a Nemotron-H token mixer as `moec import` writes it.
module {
  moe.model @Mamba attributes {hidden_size = 16 : i64, model_type = "mamba_test", num_layers = 1 : i64, vocab_size = 32 : i64} {
    moe.param @embed_tokens "backbone.embeddings.weight" : tensor<32x16xf32>
    moe.param @lm_head "lm_head.weight" : tensor<32x16xf32>
    moe.layer @mamba2(%arg0: tensor<?x16xf32>, %arg1: tensor<?xi64>) -> tensor<?x16xf32> attributes {channel_mixer = "none", layers = array<i64: 0>, token_mixer = "mamba2"} {
      moe.param @norm "backbone.layers.{layer}.norm.weight" : tensor<16xf32>
      moe.param @in_proj "backbone.layers.{layer}.mixer.in_proj.weight" : tensor<34x16xf32>
      moe.param @conv "backbone.layers.{layer}.mixer.conv1d.weight" : tensor<24x1x4xf32>
      moe.param @conv_bias "backbone.layers.{layer}.mixer.conv1d.bias" : tensor<24xf32>
      moe.param @dt_bias "backbone.layers.{layer}.mixer.dt_bias" : tensor<2xf32>
      moe.param @a_log "backbone.layers.{layer}.mixer.A_log" : tensor<2xf32>
      moe.param @d "backbone.layers.{layer}.mixer.D" : tensor<2xf32>
      moe.param @mixer_norm "backbone.layers.{layer}.mixer.norm.weight" : tensor<8xf32>
      moe.param @out_proj "backbone.layers.{layer}.mixer.out_proj.weight" : tensor<16x8xf32>
      %w = moe.weight @norm : tensor<16xf32>
      %x = moe.rms_norm %arg0, %w {eps = 1.0e-5 : f64} : (tensor<?x16xf32>, tensor<16xf32>) -> tensor<?x16xf32>
      %win = moe.weight @in_proj : tensor<34x16xf32>
      %zxbcdt = moe.linear %x, %win : (tensor<?x16xf32>, tensor<34x16xf32>) -> tensor<?x34xf32>
      %conv = moe.weight @conv : tensor<24x1x4xf32>
      %cb = moe.weight @conv_bias : tensor<24xf32>
      %dt = moe.weight @dt_bias : tensor<2xf32>
      %alog = moe.weight @a_log : tensor<2xf32>
      %d = moe.weight @d : tensor<2xf32>
      %mn = moe.weight @mixer_norm : tensor<8xf32>
      %o = moe.mamba2 %zxbcdt, %conv conv_bias %cb, %dt, %alog, %d, %mn {chunk_size = 8 : i64, eps = 1.0e-5 : f64, head_dim = 4 : i64, num_groups = 2 : i64, num_heads = 2 : i64, state_size = 4 : i64} : (tensor<?x34xf32>, tensor<24x1x4xf32>, tensor<24xf32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<8xf32>) -> tensor<?x8xf32>
      %wo = moe.weight @out_proj : tensor<16x8xf32>
      %out = moe.linear %o, %wo : (tensor<?x8xf32>, tensor<16x8xf32>) -> tensor<?x16xf32>
      %y = moe.add %arg0, %out : tensor<?x16xf32>
      moe.yield %y : tensor<?x16xf32>
    }
    func.func @forward(%arg0: tensor<?xi64>, %arg1: tensor<?xi64>) -> tensor<?x32xf32> {
      %0 = moe.weight @embed_tokens : tensor<32x16xf32>
      %1 = moe.embedding %arg0, %0 : (tensor<?xi64>, tensor<32x16xf32>) -> tensor<?x16xf32>
      %2 = moe.apply_layer @mamba2[0] (%1, %arg1) : (tensor<?x16xf32>, tensor<?xi64>) -> tensor<?x16xf32>
      %3 = moe.weight @lm_head : tensor<32x16xf32>
      %4 = moe.linear %2, %3 : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
      return %4 : tensor<?x32xf32>
    }
  }
}
