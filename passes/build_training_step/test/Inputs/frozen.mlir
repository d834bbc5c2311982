// A model with nothing trainable, for the error test.
moe.model @frozen {
  moe.param @head "lm_head.weight" : tensor<32x16xf32>
  func.func @forward(%ids: tensor<?xi64>, %pos: tensor<?xi64>) -> tensor<?x32xf32> {
    %w = moe.weight @head : tensor<32x16xf32>
    %e = moe.embedding %ids, %w : (tensor<?xi64>, tensor<32x16xf32>) -> tensor<?x16xf32>
    %l = moe.linear %e, %w : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
    return %l : tensor<?x32xf32>
  }
}
