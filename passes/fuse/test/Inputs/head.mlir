// A model reduced to what the loss sees: embedding, a trainable final norm (so that the
// hidden states need a gradient), the frozen LM head.
moe.model @head {
  moe.param @embed "model.embed_tokens.weight" : tensor<32x16xf32>
  moe.param @norm "model.norm.weight" trainable : tensor<16xf32>
  moe.param @head "lm_head.weight" : tensor<32x16xf32>
  func.func @forward(%ids: tensor<?xi64>, %pos: tensor<?xi64>) -> tensor<?x32xf32> {
    %t = moe.weight @embed : tensor<32x16xf32>
    %h = moe.embedding %ids, %t : (tensor<?xi64>, tensor<32x16xf32>) -> tensor<?x16xf32>
    %wn = moe.weight @norm : tensor<16xf32>
    %n = moe.rms_norm %h, %wn {eps = 1.0e-6 : f64} : (tensor<?x16xf32>, tensor<16xf32>) -> tensor<?x16xf32>
    %w = moe.weight @head : tensor<32x16xf32>
    %l = moe.linear %n, %w : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
    return %l : tensor<?x32xf32>
  }
}
