// A two-layer model with LoRA on q (the training-step test's model).
moe.model @tiny {
  moe.param @embed "model.embed_tokens.weight" : tensor<32x16xf32>
  moe.param @head "lm_head.weight" : tensor<32x16xf32>
  moe.layer @block(%x: tensor<?x16xf32>, %pos: tensor<?xi64>) -> tensor<?x16xf32> {
    moe.param @norm "model.layers.{layer}.norm.weight" : tensor<16xf32>
    moe.param @q "model.layers.{layer}.q_proj.weight" : tensor<16x16xf32>
    moe.param @q_lora_A "base_model.model.model.layers.{layer}.q_proj.lora_A.weight" trainable : tensor<4x16xf32>
    moe.param @q_lora_B "base_model.model.model.layers.{layer}.q_proj.lora_B.weight" trainable : tensor<16x4xf32>
    moe.param @router "model.layers.{layer}.mlp.gate.weight" : tensor<4x16xf32>
    moe.param @up "model.layers.{layer}.mlp.experts.{expert}.up_proj.weight" : tensor<4x8x16xf32>
    moe.param @down "model.layers.{layer}.mlp.experts.{expert}.down_proj.weight" : tensor<4x16x8xf32>
    %wn = moe.weight @norm : tensor<16xf32>
    %n = moe.rms_norm %x, %wn {eps = 1.0e-6 : f64} : (tensor<?x16xf32>, tensor<16xf32>) -> tensor<?x16xf32>
    %wq = moe.weight @q : tensor<16x16xf32>
    %q = moe.linear %n, %wq : (tensor<?x16xf32>, tensor<16x16xf32>) -> tensor<?x16xf32>
    %a = moe.weight @q_lora_A : tensor<4x16xf32>
    %b = moe.weight @q_lora_B : tensor<16x4xf32>
    %d = moe.lora %n, %a, %b {scale = 2.0 : f64} : (tensor<?x16xf32>, tensor<4x16xf32>, tensor<16x4xf32>) -> tensor<?x16xf32>
    %q2 = moe.add %q, %d : tensor<?x16xf32>
    %wr = moe.weight @router : tensor<4x16xf32>
    %rw, %ri = moe.router %q2, %wr {top_k = 2 : i64, scoring = #moe<scoring softmax>, norm_topk_prob} : (tensor<?x16xf32>, tensor<4x16xf32>) -> (tensor<?x2xf32>, tensor<?x2xi32>)
    %tok, %cnt = moe.dispatch %q2, %ri {num_experts = 4 : i64} : (tensor<?x16xf32>, tensor<?x2xi32>) -> (tensor<?x16xf32>, tensor<4xi64>)
    %wu = moe.weight @up : tensor<4x8x16xf32>
    %wd = moe.weight @down : tensor<4x16x8xf32>
    %e = moe.expert_mlp %tok, %cnt, up %wu, down %wd {activation = #moe<activation relu2>} : (tensor<?x16xf32>, tensor<4xi64>, tensor<4x8x16xf32>, tensor<4x16x8xf32>) -> tensor<?x16xf32>
    %c = moe.combine %e, %ri, %rw : (tensor<?x16xf32>, tensor<?x2xi32>, tensor<?x2xf32>) -> tensor<?x16xf32>
    %y = moe.add %x, %c : tensor<?x16xf32>
    moe.yield %y : tensor<?x16xf32>
  }
  func.func @forward(%ids: tensor<?xi64>, %pos: tensor<?xi64>) -> tensor<?x32xf32> {
    %t = moe.weight @embed : tensor<32x16xf32>
    %h0 = moe.embedding %ids, %t : (tensor<?xi64>, tensor<32x16xf32>) -> tensor<?x16xf32>
    %h1 = moe.apply_layer @block[0](%h0, %pos) : (tensor<?x16xf32>, tensor<?xi64>) -> tensor<?x16xf32>
    %h2 = moe.apply_layer @block[1](%h1, %pos) : (tensor<?x16xf32>, tensor<?xi64>) -> tensor<?x16xf32>
    %w = moe.weight @head : tensor<32x16xf32>
    %l = moe.linear %h2, %w : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
    return %l : tensor<?x32xf32>
  }
}
