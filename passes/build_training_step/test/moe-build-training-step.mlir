// RUN: moe-opt %s --pass-pipeline='builtin.module(moe.model(moe-build-training-step))' | FileCheck %s
// RUN: moe-opt %s --pass-pipeline='builtin.module(moe.model(moe-build-training-step{recompute=per-layer lr=2e-4 warmup-steps=5 total-steps=50}))' | FileCheck %s --check-prefix=RECOMPUTE
// RUN: moe-opt %s --pass-pipeline='builtin.module(moe.model(moe-build-training-step{recompute=regather}))' | FileCheck %s --check-prefix=REGATHER
// RUN: not moe-opt %s --pass-pipeline='builtin.module(moe.model(moe-build-training-step{recompute=always}))' 2>&1 | FileCheck %s --check-prefix=POLICY
// RUN: not moe-opt %s --pass-pipeline='builtin.module(moe.model(moe-build-training-step,moe-build-training-step))' 2>&1 | FileCheck %s --check-prefix=TWICE
// RUN: not moe-opt %s --pass-pipeline='builtin.module(moe.model(moe-build-training-step{total-steps=0}))' 2>&1 | FileCheck %s --check-prefix=STEPS
// RUN: not moe-opt %inputs/frozen.mlir --pass-pipeline='builtin.module(moe.model(moe-build-training-step))' 2>&1 | FileCheck %s --check-prefix=FROZEN

// The training forward returns the layer output and every value its backward reads; the
// backward template takes them back, after the layer inputs, and ends with the output gradient.
// CHECK-LABEL: moe.layer @block_fwd(%{{.*}}: tensor<?x16xf32>, %{{.*}}: tensor<?xi64>) -> (tensor<?x16xf32>, {{.*}}tensor<?x2xf32>, tensor<?x2xi32>
// CHECK-SAME: backward = @block_bwd
// CHECK: moe.layer @block_bwd(%[[X:.*]]: tensor<?x16xf32>, %{{.*}}: tensor<?xi64>, {{.*}}%[[DY:[a-z0-9]+]]: tensor<?x16xf32>) -> tensor<?x16xf32>
// The router's backward gets the experts it chose (as saved values), not a new choice.
// CHECK: moe.backward "moe.router"({{.*}}) outputs(%{{.*}}, %{{.*}}) grads
// Only the adapter gets weight gradients: the frozen projection gets an input gradient only.
// CHECK: moe.backward "moe.lora"({{.*}}) grads({{.*}}) {{{.*}}grad_of_inputs = array<i64: 0, 1, 2>
// CHECK-DAG: moe.param_grad @q_lora_B
// CHECK-DAG: moe.param_grad @q_lora_A
// CHECK: moe.backward "moe.linear"({{.*}}) grads({{.*}}) {{{.*}}grad_of_inputs = array<i64: 0>
// CHECK-NOT: moe.param_grad @q,
// CHECK-NOT: moe.param_grad @up
// CHECK-NOT: moe.router %
// CHECK: moe.yield
// The step: forward through the training templates, HF's shifted loss, seed 1, backward in reverse layer order.
// CHECK: func.func @train_step(%[[IDS:.*]]: tensor<?xi64>, %[[POS:.*]]: tensor<?xi64>, %[[LABELS:.*]]: tensor<?xi64>) -> tensor<f32>
// CHECK: %[[H0:.*]]:[[N:[0-9]+]] = moe.apply_layer @block_fwd[0]
// CHECK: %[[H1:.*]]:[[N]] = moe.apply_layer @block_fwd[1] (%[[H0]]#0, %[[POS]])
// CHECK: %[[LOSS:.*]] = moe.cross_entropy %[[LOGITS:.*]], %[[LABELS]] {shift_labels}
// CHECK: %[[SEED:.*]] = moe.fill 1.000000e+00 : tensor<f32>
// CHECK: moe.backward "moe.cross_entropy"(%[[LOGITS]], %[[LABELS]]) grads(%[[SEED]]) {forward_attrs = {ignore_index = -100 : i64, shift_labels}
// CHECK: moe.apply_layer @block_bwd[1] (%[[H0]]#0, %[[POS]], %[[H1]]#1,
// CHECK: moe.apply_layer @block_bwd[0]
// The frozen embedding and LM head get no gradient.
// CHECK-NOT: moe.param_grad
// CHECK: return %[[LOSS]] : tensor<f32>
// CHECK: moe.optimizer {beta1 = 9.000000e-01 : f64, beta2 = 0.99899999999999999 : f64, eps = 1.000000e-08 : f64, kind = "adamw", lr = 1.000000e-04 : f64, max_grad_norm = 1.000000e+00 : f64, min_lr_ratio = 1.000000e-01 : f64, schedule = "cosine", total_steps = 1000 : i64, warmup_steps = 10 : i64, weight_decay = 0.000000e+00 : f64}

// Recompute per layer: the forward keeps only the routing; the backward re-runs the rest,
// marked `recomputed`, but never the router.
// RECOMPUTE-LABEL: moe.layer @block_fwd_recompute(%{{.*}}: tensor<?x16xf32>, %{{.*}}: tensor<?xi64>) -> (tensor<?x16xf32>, tensor<?x2xf32>, tensor<?x2xi32>)
// RECOMPUTE: moe.layer @block_bwd_recompute(%{{.*}}: tensor<?x16xf32>, %{{.*}}: tensor<?xi64>, %[[RW:.*]]: tensor<?x2xf32>, %[[RI:.*]]: tensor<?x2xi32>, %{{.*}}: tensor<?x16xf32>) -> tensor<?x16xf32>
// RECOMPUTE-NOT: moe.router %
// RECOMPUTE: moe.rms_norm {{.*}}recomputed
// RECOMPUTE: moe.dispatch %{{.*}}, %[[RI]] {{{.*}}recomputed}
// RECOMPUTE: moe.expert_mlp {{.*}}recomputed
// The layer output itself is not needed: combine is not re-run.
// RECOMPUTE-NOT: moe.combine %
// RECOMPUTE: moe.backward "moe.router"({{.*}}) outputs(%[[RW]], %[[RI]])
// RECOMPUTE-LABEL: func.func @train_step
// RECOMPUTE: moe.optimizer {{{.*}}lr = 2.000000e-04 : f64{{.*}}total_steps = 50 : i64, warmup_steps = 5 : i64

// Regather: the forward saves what `none` saves but the dispatch's expert copies and the
// norm's output (it saves what they read: the tokens the dispatch reads and the routing; the
// norm's input is the layer input); the backward runs the norm and the gather again, marked
// `recomputed`, and nothing else of the forward runs twice.
// REGATHER: moe.model @tiny attributes {expert_backward = "auto", recompute = "regather"}
// REGATHER-LABEL: moe.layer @block_fwd_regather(
// REGATHER-SAME: -> (tensor<?x16xf32>, tensor<?x16xf32>, tensor<?x2xf32>, tensor<?x2xi32>, tensor<?x16xf32>)
// REGATHER-LABEL: moe.layer @block_bwd_regather(
// REGATHER-NOT: moe.expert_mlp %
// REGATHER: moe.rms_norm %arg0, %{{.*}} recomputed
// REGATHER-NOT: moe.linear %
// REGATHER-NOT: moe.expert_mlp %
// REGATHER: %[[TOK:.*]], %[[CNT:.*]] = moe.dispatch %{{.*}}, %{{.*}} {{{.*}}recomputed}
// REGATHER-NOT: moe.expert_mlp %
// REGATHER: moe.backward "moe.expert_mlp"(%[[TOK]], %[[CNT]],
// REGATHER-LABEL: func.func @train_step
// REGATHER: moe.apply_layer @block_fwd_regather[0]
// REGATHER: moe.apply_layer @block_bwd_regather[0]

// POLICY: error: moe-build-training-step: recompute must be none, regather or per-layer, got 'always'
// TWICE: error: moe-build-training-step: the model already has @train_step
// STEPS: error: 'moe.optimizer' op need 0 <= warmup_steps <= total_steps and total_steps > 0, got 10 and 0
// FROZEN: error: moe-build-training-step: no parameter is trainable; run --moe-inject-lora first

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
