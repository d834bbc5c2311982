// One Kimi Delta Attention layer (4 heads of 4 features, conv kernel 4, low-rank decay and
// gate through 4 features) after its norm, and a residual add: a Kimi-Linear token mixer as
// `moec import` writes it.
module {
  moe.model @Kda attributes {hidden_size = 16 : i64, model_type = "kda_test", num_layers = 1 : i64, vocab_size = 32 : i64} {
    moe.param @embed_tokens "model.embed_tokens.weight" : tensor<32x16xf32>
    moe.param @lm_head "lm_head.weight" : tensor<32x16xf32>
    moe.layer @kda(%arg0: tensor<?x16xf32>, %arg1: tensor<?xi64>) -> tensor<?x16xf32> attributes {channel_mixer = "none", layers = array<i64: 0>, token_mixer = "kda"} {
      moe.param @norm "model.layers.{layer}.input_layernorm.weight" : tensor<16xf32>
      moe.param @q_proj "model.layers.{layer}.self_attn.q_proj.weight" : tensor<16x16xf32>
      moe.param @k_proj "model.layers.{layer}.self_attn.k_proj.weight" : tensor<16x16xf32>
      moe.param @v_proj "model.layers.{layer}.self_attn.v_proj.weight" : tensor<16x16xf32>
      moe.param @q_conv "model.layers.{layer}.self_attn.q_conv1d.weight" : tensor<16x1x4xf32>
      moe.param @k_conv "model.layers.{layer}.self_attn.k_conv1d.weight" : tensor<16x1x4xf32>
      moe.param @v_conv "model.layers.{layer}.self_attn.v_conv1d.weight" : tensor<16x1x4xf32>
      moe.param @f_a_proj "model.layers.{layer}.self_attn.f_a_proj.weight" : tensor<4x16xf32>
      moe.param @f_b_proj "model.layers.{layer}.self_attn.f_b_proj.weight" : tensor<16x4xf32>
      moe.param @b_proj "model.layers.{layer}.self_attn.b_proj.weight" : tensor<4x16xf32>
      moe.param @g_a_proj "model.layers.{layer}.self_attn.g_a_proj.weight" : tensor<4x16xf32>
      moe.param @g_b_proj "model.layers.{layer}.self_attn.g_b_proj.weight" : tensor<16x4xf32>
      moe.param @a_log "model.layers.{layer}.self_attn.A_log" : tensor<1x1x4x1xf32>
      moe.param @dt_bias "model.layers.{layer}.self_attn.dt_bias" : tensor<16xf32>
      moe.param @o_norm "model.layers.{layer}.self_attn.o_norm.weight" : tensor<4xf32>
      moe.param @o_proj "model.layers.{layer}.self_attn.o_proj.weight" : tensor<16x16xf32>
      %w = moe.weight @norm : tensor<16xf32>
      %x = moe.rms_norm %arg0, %w {eps = 9.9999999999999995E-7 : f64} : (tensor<?x16xf32>, tensor<16xf32>) -> tensor<?x16xf32>
      %wq = moe.weight @q_proj : tensor<16x16xf32>
      %q = moe.linear %x, %wq : (tensor<?x16xf32>, tensor<16x16xf32>) -> tensor<?x16xf32>
      %wk = moe.weight @k_proj : tensor<16x16xf32>
      %k = moe.linear %x, %wk : (tensor<?x16xf32>, tensor<16x16xf32>) -> tensor<?x16xf32>
      %wv = moe.weight @v_proj : tensor<16x16xf32>
      %v = moe.linear %x, %wv : (tensor<?x16xf32>, tensor<16x16xf32>) -> tensor<?x16xf32>
      %qc = moe.weight @q_conv : tensor<16x1x4xf32>
      %kc = moe.weight @k_conv : tensor<16x1x4xf32>
      %vc = moe.weight @v_conv : tensor<16x1x4xf32>
      %wfa = moe.weight @f_a_proj : tensor<4x16xf32>
      %fa = moe.linear %x, %wfa : (tensor<?x16xf32>, tensor<4x16xf32>) -> tensor<?x4xf32>
      %wfb = moe.weight @f_b_proj : tensor<16x4xf32>
      %decay = moe.linear %fa, %wfb : (tensor<?x4xf32>, tensor<16x4xf32>) -> tensor<?x16xf32>
      %wb = moe.weight @b_proj : tensor<4x16xf32>
      %beta = moe.linear %x, %wb : (tensor<?x16xf32>, tensor<4x16xf32>) -> tensor<?x4xf32>
      %wga = moe.weight @g_a_proj : tensor<4x16xf32>
      %ga = moe.linear %x, %wga : (tensor<?x16xf32>, tensor<4x16xf32>) -> tensor<?x4xf32>
      %wgb = moe.weight @g_b_proj : tensor<16x4xf32>
      %gate = moe.linear %ga, %wgb : (tensor<?x4xf32>, tensor<16x4xf32>) -> tensor<?x16xf32>
      %alog = moe.weight @a_log : tensor<1x1x4x1xf32>
      %dt = moe.weight @dt_bias : tensor<16xf32>
      %on = moe.weight @o_norm : tensor<4xf32>
      %o = moe.kda %q, %k, %v, %qc, %kc, %vc, %decay, %beta, %gate, %alog, %dt, %on {num_heads = 4 : i64, head_dim = 4 : i64, eps = 1.0e-6 : f64} : (tensor<?x16xf32>, tensor<?x16xf32>, tensor<?x16xf32>, tensor<16x1x4xf32>, tensor<16x1x4xf32>, tensor<16x1x4xf32>, tensor<?x16xf32>, tensor<?x4xf32>, tensor<?x16xf32>, tensor<1x1x4x1xf32>, tensor<16xf32>, tensor<4xf32>) -> tensor<?x16xf32>
      %wo = moe.weight @o_proj : tensor<16x16xf32>
      %out = moe.linear %o, %wo : (tensor<?x16xf32>, tensor<16x16xf32>) -> tensor<?x16xf32>
      %y = moe.add %arg0, %out : tensor<?x16xf32>
      moe.yield %y : tensor<?x16xf32>
    }
    func.func @forward(%arg0: tensor<?xi64>, %arg1: tensor<?xi64>) -> tensor<?x32xf32> {
      %0 = moe.weight @embed_tokens : tensor<32x16xf32>
      %1 = moe.embedding %arg0, %0 : (tensor<?xi64>, tensor<32x16xf32>) -> tensor<?x16xf32>
      %2 = moe.apply_layer @kda[0] (%1, %arg1) : (tensor<?x16xf32>, tensor<?xi64>) -> tensor<?x16xf32>
      %3 = moe.weight @lm_head : tensor<32x16xf32>
      %4 = moe.linear %2, %3 : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
      return %4 : tensor<?x32xf32>
    }
  }
}
