// Two MLPs of one input whose outputs are summed before the residual (as a shared expert's
// output joins the routed experts'): a gated one (32 features) and a relu2 one (16 features).
module {
  moe.model @Parallel attributes {hidden_size = 16 : i64, model_type = "parallel_test", num_layers = 1 : i64, vocab_size = 32 : i64} {
    moe.param @embed_tokens "model.embed_tokens.weight" : tensor<32x16xf32>
    moe.param @lm_head "lm_head.weight" : tensor<32x16xf32>
    moe.layer @two(%arg0: tensor<?x16xf32>, %arg1: tensor<?xi64>) -> tensor<?x16xf32> attributes {channel_mixer = "dense", layers = array<i64: 0>, token_mixer = "none"} {
      moe.param @norm "model.layers.{layer}.norm.weight" : tensor<16xf32>
      moe.param @a_gate "model.layers.{layer}.a.gate_proj.weight" : tensor<32x16xf32>
      moe.param @a_up "model.layers.{layer}.a.up_proj.weight" : tensor<32x16xf32>
      moe.param @a_down "model.layers.{layer}.a.down_proj.weight" : tensor<16x32xf32>
      moe.param @b_up "model.layers.{layer}.b.up_proj.weight" : tensor<16x16xf32>
      moe.param @b_down "model.layers.{layer}.b.down_proj.weight" : tensor<16x16xf32>
      %0 = moe.weight @norm : tensor<16xf32>
      %1 = moe.rms_norm %arg0, %0 {eps = 9.9999999999999995E-7 : f64} : (tensor<?x16xf32>, tensor<16xf32>) -> tensor<?x16xf32>
      %2 = moe.weight @a_gate : tensor<32x16xf32>
      %3 = moe.linear %1, %2 : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
      %4 = moe.weight @a_up : tensor<32x16xf32>
      %5 = moe.linear %1, %4 : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
      %6 = moe.glu silu %3, %5 : tensor<?x32xf32>
      %7 = moe.weight @a_down : tensor<16x32xf32>
      %8 = moe.linear %6, %7 : (tensor<?x32xf32>, tensor<16x32xf32>) -> tensor<?x16xf32>
      %9 = moe.weight @b_up : tensor<16x16xf32>
      %10 = moe.linear %1, %9 : (tensor<?x16xf32>, tensor<16x16xf32>) -> tensor<?x16xf32>
      %11 = moe.activation relu2 %10 : tensor<?x16xf32>
      %12 = moe.weight @b_down : tensor<16x16xf32>
      %13 = moe.linear %11, %12 : (tensor<?x16xf32>, tensor<16x16xf32>) -> tensor<?x16xf32>
      %14 = moe.add %8, %13 : tensor<?x16xf32>
      %15 = moe.add %arg0, %14 : tensor<?x16xf32>
      moe.yield %15 : tensor<?x16xf32>
    }
    func.func @forward(%arg0: tensor<?xi64>, %arg1: tensor<?xi64>) -> tensor<?x32xf32> {
      %0 = moe.weight @embed_tokens : tensor<32x16xf32>
      %1 = moe.embedding %arg0, %0 : (tensor<?xi64>, tensor<32x16xf32>) -> tensor<?x16xf32>
      %2 = moe.apply_layer @two[0] (%1, %arg1) : (tensor<?x16xf32>, tensor<?xi64>) -> tensor<?x16xf32>
      %3 = moe.weight @lm_head : tensor<32x16xf32>
      %4 = moe.linear %2, %3 : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
      return %4 : tensor<?x32xf32>
    }
  }
}
