// One dense layer with an adapter on its up projection (plan_memory's dense_lora.mlir: lit suites read their own Inputs).
module {
  moe.model @DenseOnly attributes {hidden_size = 16 : i64, lora = {alpha = 8.000000e+00 : f64, dropout = 0.000000e+00 : f64, r = 4 : i64, targets = ["up_proj"]}, model_type = "dense_test", num_layers = 1 : i64, vocab_size = 32 : i64} {
    moe.param @embed_tokens "model.embed_tokens.weight" : tensor<32x16xf32>
    moe.param @lm_head "lm_head.weight" : tensor<32x16xf32>
    moe.layer @mlp(%x: tensor<?x16xf32>, %pos: tensor<?xi64>) -> tensor<?x16xf32> attributes {channel_mixer = "dense", layers = array<i64: 0>, token_mixer = "none"} {
      moe.param @up "model.layers.{layer}.mlp.up_proj.weight" : tensor<64x16xf32>
      moe.param @up_lora_A "base_model.model.model.layers.{layer}.mlp.up_proj.lora_A.weight" trainable : tensor<4x16xf32>
      moe.param @up_lora_B "base_model.model.model.layers.{layer}.mlp.up_proj.lora_B.weight" trainable : tensor<64x4xf32>
      moe.param @down "model.layers.{layer}.mlp.down_proj.weight" : tensor<16x64xf32>
      %w = moe.weight @up : tensor<64x16xf32>
      %u = moe.linear %x, %w : (tensor<?x16xf32>, tensor<64x16xf32>) -> tensor<?x64xf32>
      %a = moe.weight @up_lora_A : tensor<4x16xf32>
      %b = moe.weight @up_lora_B : tensor<64x4xf32>
      %l = moe.lora %x, %a, %b {scale = 2.000000e+00 : f64} : (tensor<?x16xf32>, tensor<4x16xf32>, tensor<64x4xf32>) -> tensor<?x64xf32>
      %s = moe.add %u, %l : tensor<?x64xf32>
      %h = moe.activation relu2 %s : tensor<?x64xf32>
      %d = moe.weight @down : tensor<16x64xf32>
      %y = moe.linear %h, %d : (tensor<?x64xf32>, tensor<16x64xf32>) -> tensor<?x16xf32>
      %r = moe.add %x, %y : tensor<?x16xf32>
      moe.yield %r : tensor<?x16xf32>
    }
    func.func @forward(%ids: tensor<?xi64>, %pos: tensor<?xi64>) -> tensor<?x32xf32> {
      %e = moe.weight @embed_tokens : tensor<32x16xf32>
      %0 = moe.embedding %ids, %e : (tensor<?xi64>, tensor<32x16xf32>) -> tensor<?x16xf32>
      %1 = moe.apply_layer @mlp[0] (%0, %pos) : (tensor<?x16xf32>, tensor<?xi64>) -> tensor<?x16xf32>
      %h = moe.weight @lm_head : tensor<32x16xf32>
      %2 = moe.linear %1, %h : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
      return %2 : tensor<?x32xf32>
    }
  }
}
