// The same in bf16 with a trainable LM head (a model.mlir may mark any parameter trainable).
moe.model @head {
  moe.param @embed "model.embed_tokens.weight" : tensor<32x16xbf16>
  moe.param @norm "model.norm.weight" trainable : tensor<16xbf16>
  moe.param @head "lm_head.weight" trainable : tensor<32x16xbf16>
  func.func @forward(%ids: tensor<?xi64>, %pos: tensor<?xi64>) -> tensor<?x32xbf16> {
    %t = moe.weight @embed : tensor<32x16xbf16>
    %h = moe.embedding %ids, %t : (tensor<?xi64>, tensor<32x16xbf16>) -> tensor<?x16xbf16>
    %wn = moe.weight @norm : tensor<16xbf16>
    %n = moe.rms_norm %h, %wn {eps = 1.0e-6 : f64} : (tensor<?x16xbf16>, tensor<16xbf16>) -> tensor<?x16xbf16>
    %w = moe.weight @head : tensor<32x16xbf16>
    %l = moe.linear %n, %w : (tensor<?x16xbf16>, tensor<32x16xbf16>) -> tensor<?x32xbf16>
    return %l : tensor<?x32xbf16>
  }
}
