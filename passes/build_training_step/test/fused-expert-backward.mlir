// RUN: moe-opt %s --pass-pipeline='builtin.module(moe.model(moe-build-training-step{expert-backward=fused}))' | FileCheck %s
// RUN: moe-opt %s --pass-pipeline='builtin.module(moe.model(moe-build-training-step))' | FileCheck %s --check-prefix=SEPARATE
// RUN: moe-opt %s --pass-pipeline='builtin.module(moe.model(moe-build-training-step{expert-backward=separate}))' | FileCheck %s --check-prefix=SEPARATE
// RUN: not moe-opt %s --pass-pipeline='builtin.module(moe.model(moe-build-training-step{expert-backward=together}))' 2>&1 | FileCheck %s --check-prefix=BAD

// Tests that an unknown policy is an error naming the accepted ones.
// BAD: expert-backward must be auto, fused or separate, got 'together'

// Tests that with expert-backward=fused the expert MLP and the combine of its outputs get one backward,
// "moe.expert_mlp_combine" (the expert MLP's operands, then the combine's indices and weights),
// giving the expert rows' and the weights' gradients. The combine's weight gradient came from
// the expert outputs, which the forward therefore saved; now nothing in the backward reads them
// and the forward does not return them.
// CHECK: moe.model @moe attributes {expert_backward = "fused"
// CHECK-LABEL: moe.layer @block_fwd(
// CHECK: %[[E:.*]] = moe.expert_mlp
// CHECK: moe.combine %[[E]]
// CHECK-NOT: %[[E]]
// CHECK-LABEL: moe.layer @block_bwd(
// CHECK-NOT: moe.backward "moe.combine"
// CHECK-NOT: moe.backward "moe.expert_mlp"(
// CHECK: %[[G:.*]]:2 = moe.backward "moe.expert_mlp_combine"(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) grads(%{{.*}}) {forward_attrs = {activation = #moe<activation relu2>{{.*}}}, grad_of_inputs = array<i64: 0, 5>, grad_of_outputs = array<i64: 0>}
// CHECK: moe.backward "moe.dispatch"({{.*}}) grads(%[[G]]#0)
// CHECK: moe.backward "moe.router"({{.*}}) grads(%[[G]]#1)

// Separate (and auto here: f32, relu2, no gate, which the CUDA kernel's one-pass form does not
// take): the combine's backward reads the saved expert outputs.
// SEPARATE-LABEL: moe.layer @block_bwd(
// SEPARATE: moe.backward "moe.combine"
// SEPARATE: moe.backward "moe.expert_mlp"(

moe.model @moe {
  moe.param @embed "model.embed_tokens.weight" : tensor<32x16xf32>
  moe.param @head "lm_head.weight" : tensor<32x16xf32>
  moe.layer @block(%x: tensor<?x16xf32>, %pos: tensor<?xi64>) -> tensor<?x16xf32> {
    moe.param @q "model.layers.{layer}.q_proj.weight" : tensor<16x16xf32>
    moe.param @q_lora_A "base_model.model.model.layers.{layer}.q_proj.lora_A.weight" trainable : tensor<4x16xf32>
    moe.param @q_lora_B "base_model.model.model.layers.{layer}.q_proj.lora_B.weight" trainable : tensor<16x4xf32>
    moe.param @router "model.layers.{layer}.mlp.gate.weight" : tensor<4x16xf32>
    moe.param @up "model.layers.{layer}.mlp.experts.{expert}.up_proj.weight" : tensor<4x8x16xf32>
    moe.param @down "model.layers.{layer}.mlp.experts.{expert}.down_proj.weight" : tensor<4x16x8xf32>
    %wq = moe.weight @q : tensor<16x16xf32>
    %q = moe.linear %x, %wq : (tensor<?x16xf32>, tensor<16x16xf32>) -> tensor<?x16xf32>
    %a = moe.weight @q_lora_A : tensor<4x16xf32>
    %b = moe.weight @q_lora_B : tensor<16x4xf32>
    %d = moe.lora %x, %a, %b {scale = 2.0 : f64} : (tensor<?x16xf32>, tensor<4x16xf32>, tensor<16x4xf32>) -> tensor<?x16xf32>
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
    %w = moe.weight @head : tensor<32x16xf32>
    %l = moe.linear %h1, %w : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
    return %l : tensor<?x32xf32>
  }
}
