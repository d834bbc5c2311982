// RUN: moe-opt %s --pass-pipeline='builtin.module(moe.model(moe-build-training-step))' | FileCheck %s
// RUN: moe-opt %s --pass-pipeline='builtin.module(moe.model(moe-build-training-step{recompute=per-layer}))' | FileCheck %s --check-prefix=RECOMPUTE
// RUN: moe-opt %s --pass-pipeline='builtin.module(moe.model(moe-build-training-step{recompute=regather}))' | FileCheck %s --check-prefix=RECOMPUTE
// RUN: moe-opt %s --pass-pipeline='builtin.module(moe.model(moe-build-training-step{expert-backward=separate}))' | FileCheck %s --check-prefix=RECOMPUTE
// RUN: not moe-opt %s --pass-pipeline='builtin.module(moe.model(moe-build-training-step,moe-inject-lora{targets=gate_proj expert-lora}))' 2>&1 | FileCheck %s --check-prefix=LORA-AFTER

// Tests that a layer that saves its activations (recompute=none, the default) saves its gated
// SiLU experts' pre-activations where their backward is fused with the combine's (auto: bf16, a
// separate gate, no bias or LoRA): the forward's expert MLP returns them ([rows, 2 I] f32: gate,
// then up), the forward template yields them, and the fused backward reads them as its
// `outputs` instead of running the gate and up products again.
// CHECK-LABEL: moe.layer @block_fwd(
// CHECK: %[[E:.*]], %[[P:.*]] = moe.expert_mlp {{.*}} -> (tensor<?x16xbf16>, tensor<?x24xf32>)
// CHECK: moe.yield {{.*}}, %[[P]] :
// CHECK-LABEL: moe.layer @block_bwd(
// CHECK-SAME: %[[SAVED:[a-z0-9]+]]: tensor<?x24xf32>, %{{[a-z0-9]+}}: tensor<?x16xbf16>)
// CHECK-NOT: moe.expert_mlp
// CHECK: moe.backward "moe.expert_mlp_combine"({{.*}}) outputs(%[[SAVED]]) grads(

// Tests that a layer that recomputes (per-layer: the whole expert MLP would run again for them;
// regather: the experts' rows are not saved either), and a model whose expert backward is not
// fused, saves no pre-activations: the backward runs the gate and up products.
// RECOMPUTE-NOT: tensor<?x24xf32>
// RECOMPUTE-NOT: "moe.expert_mlp_combine"({{.*}}) outputs(

// Tests that expert LoRA injected after the training step (into a template whose experts save
// their pre-activations, which LoRA on gate or up would change) is refused with the order to use.
// LORA-AFTER: error: moe-inject-lora: this expert MLP saves its pre_activations (a training template); inject LoRA before --moe-build-training-step

moe.model @moe {
  moe.param @embed "model.embed_tokens.weight" : tensor<32x16xbf16>
  moe.param @head "lm_head.weight" : tensor<32x16xbf16>
  moe.layer @block(%x: tensor<?x16xbf16>, %pos: tensor<?xi64>) -> tensor<?x16xbf16> {
    moe.param @q "model.layers.{layer}.q_proj.weight" : tensor<16x16xbf16>
    moe.param @q_lora_A "base_model.model.model.layers.{layer}.q_proj.lora_A.weight" trainable : tensor<4x16xf32>
    moe.param @q_lora_B "base_model.model.model.layers.{layer}.q_proj.lora_B.weight" trainable : tensor<16x4xf32>
    moe.param @router "model.layers.{layer}.mlp.gate.weight" : tensor<4x16xbf16>
    moe.param @gate "model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight" : tensor<4x12x16xbf16>
    moe.param @up "model.layers.{layer}.mlp.experts.{expert}.up_proj.weight" : tensor<4x12x16xbf16>
    moe.param @down "model.layers.{layer}.mlp.experts.{expert}.down_proj.weight" : tensor<4x16x12xbf16>
    %wq = moe.weight @q : tensor<16x16xbf16>
    %q = moe.linear %x, %wq : (tensor<?x16xbf16>, tensor<16x16xbf16>) -> tensor<?x16xbf16>
    %a = moe.weight @q_lora_A : tensor<4x16xf32>
    %b = moe.weight @q_lora_B : tensor<16x4xf32>
    %d = moe.lora %x, %a, %b {scale = 2.0 : f64} : (tensor<?x16xbf16>, tensor<4x16xf32>, tensor<16x4xf32>) -> tensor<?x16xbf16>
    %q2 = moe.add %q, %d : tensor<?x16xbf16>
    %wr = moe.weight @router : tensor<4x16xbf16>
    %rw, %ri = moe.router %q2, %wr {top_k = 2 : i64, scoring = #moe<scoring softmax>, norm_topk_prob} : (tensor<?x16xbf16>, tensor<4x16xbf16>) -> (tensor<?x2xf32>, tensor<?x2xi32>)
    %tok, %cnt = moe.dispatch %q2, %ri {num_experts = 4 : i64} : (tensor<?x16xbf16>, tensor<?x2xi32>) -> (tensor<?x16xbf16>, tensor<4xi64>)
    %wg = moe.weight @gate : tensor<4x12x16xbf16>
    %wu = moe.weight @up : tensor<4x12x16xbf16>
    %wd = moe.weight @down : tensor<4x16x12xbf16>
    %e = moe.expert_mlp %tok, %cnt, up %wu, down %wd gate %wg {activation = #moe<activation silu>} : (tensor<?x16xbf16>, tensor<4xi64>, tensor<4x12x16xbf16>, tensor<4x16x12xbf16>, tensor<4x12x16xbf16>) -> tensor<?x16xbf16>
    %c = moe.combine %e, %ri, %rw : (tensor<?x16xbf16>, tensor<?x2xi32>, tensor<?x2xf32>) -> tensor<?x16xbf16>
    %y = moe.add %x, %c : tensor<?x16xbf16>
    moe.yield %y : tensor<?x16xbf16>
  }
  func.func @forward(%ids: tensor<?xi64>, %pos: tensor<?xi64>) -> tensor<?x32xbf16> {
    %t = moe.weight @embed : tensor<32x16xbf16>
    %h0 = moe.embedding %ids, %t : (tensor<?xi64>, tensor<32x16xbf16>) -> tensor<?x16xbf16>
    %h1 = moe.apply_layer @block[0](%h0, %pos) : (tensor<?x16xbf16>, tensor<?xi64>) -> tensor<?x16xbf16>
    %w = moe.weight @head : tensor<32x16xbf16>
    %l = moe.linear %h1, %w : (tensor<?x16xbf16>, tensor<32x16xbf16>) -> tensor<?x32xbf16>
    return %l : tensor<?x32xbf16>
  }
}
