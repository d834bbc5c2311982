// RUN: moe-opt %inputs/tiny-moe.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{targets=gate_proj,up_proj,down_proj expert-lora rank=2 alpha=8}))' | FileCheck %s
// RUN: moe-opt %inputs/tiny-moe.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{targets=gate_proj,up_proj,down_proj rank=2 alpha=8}))' | FileCheck %s --check-prefix=NOEXPERT
// RUN: moe-opt %inputs/tiny-moe.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{targets=up_proj expert-lora rslora rank=4 alpha=8}))' | FileCheck %s --check-prefix=RSLORA
// RUN: moe-opt %inputs/tiny-moe.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{targets=all-linear expert-lora rank=2 alpha=4},moe-build-training-step))' | FileCheck %s --check-prefix=TRAIN
// RUN: moe-opt %inputs/mixtral-experts.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{targets=w1,w3,q_proj expert-lora rank=2 alpha=4}))' | FileCheck %s --check-prefix=MIXTRAL
// RUN: not moe-opt %inputs/mixtral-experts.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{targets=w1}))' 2>&1 | FileCheck %s --check-prefix=NEEDFLAG
// RUN: not moe-opt %inputs/tiny-moe.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{targets=o_proj expert-lora}))' 2>&1 | FileCheck %s --check-prefix=NOEXPERTTARGET
// RUN: not moe-opt %inputs/tiny-moe.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{targets=up_proj expert-lora dropout=0.1}))' 2>&1 | FileCheck %s --check-prefix=DROPOUT
// RUN: not moe-opt %inputs/fused-experts.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{targets=all-linear expert-lora}))' 2>&1 | FileCheck %s --check-prefix=FUSED
// RUN: moe-opt %inputs/fused-experts.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{targets=all-linear}))' | FileCheck %s --check-prefix=FUSEDOFF

// Tests that expert-lora gives each targeted routed-expert projection one adapter per
// expert, A [E, r, in] and B [E, out, r] with PEFT's per-expert names ({expert} stays: the
// leading dimension stacks the experts), and rebuilds moe.expert_mlp with them and
// lora_scale = alpha / r; dense projections of the same name are adapted as before.
// CHECK: moe.model @tiny attributes {lora = {alpha = 8.000000e+00 : f64, dropout = 0.000000e+00 : f64, expert_lora, r = 2 : i64, targets = ["down_proj", "gate_proj", "up_proj"]}}
// CHECK-LABEL: moe.layer @kda_dense
// CHECK: moe.param @mlp_gate_proj_lora_A "base_model.model.model.layers.{layer}.mlp.gate_proj.lora_A.weight" trainable : tensor<2x16xf32>
// CHECK-LABEL: moe.layer @gqa_moe
// CHECK: moe.param @mlp_experts_gate_proj "model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight" : tensor<4x8x16xf32>
// CHECK-NEXT: moe.param @mlp_experts_gate_proj_lora_A "base_model.model.model.layers.{layer}.mlp.experts.{expert}.gate_proj.lora_A.weight" trainable : tensor<4x2x16xf32>
// CHECK-NEXT: moe.param @mlp_experts_gate_proj_lora_B "base_model.model.model.layers.{layer}.mlp.experts.{expert}.gate_proj.lora_B.weight" trainable : tensor<4x8x2xf32>
// CHECK-NEXT: moe.param @mlp_experts_up_proj "model.layers.{layer}.mlp.experts.{expert}.up_proj.weight" : tensor<4x8x16xf32>
// CHECK-NEXT: moe.param @mlp_experts_up_proj_lora_A "base_model.model.model.layers.{layer}.mlp.experts.{expert}.up_proj.lora_A.weight" trainable : tensor<4x2x16xf32>
// CHECK-NEXT: moe.param @mlp_experts_up_proj_lora_B "base_model.model.model.layers.{layer}.mlp.experts.{expert}.up_proj.lora_B.weight" trainable : tensor<4x8x2xf32>
// CHECK-NEXT: moe.param @mlp_experts_down_proj "model.layers.{layer}.mlp.experts.{expert}.down_proj.weight" : tensor<4x16x8xf32>
// CHECK-NEXT: moe.param @mlp_experts_down_proj_lora_A "base_model.model.model.layers.{layer}.mlp.experts.{expert}.down_proj.lora_A.weight" trainable : tensor<4x2x8xf32>
// CHECK-NEXT: moe.param @mlp_experts_down_proj_lora_B "base_model.model.model.layers.{layer}.mlp.experts.{expert}.down_proj.lora_B.weight" trainable : tensor<4x16x2xf32>
// CHECK: %[[TOK:.*]], %[[CNT:.*]] = moe.dispatch
// CHECK: %[[G:.*]] = moe.weight @mlp_experts_gate_proj :
// CHECK: %[[U:.*]] = moe.weight @mlp_experts_up_proj :
// CHECK: %[[D:.*]] = moe.weight @mlp_experts_down_proj :
// CHECK: %[[GA:.*]] = moe.weight @mlp_experts_gate_proj_lora_A : tensor<4x2x16xf32>
// CHECK: %[[GB:.*]] = moe.weight @mlp_experts_gate_proj_lora_B : tensor<4x8x2xf32>
// CHECK: %[[UA:.*]] = moe.weight @mlp_experts_up_proj_lora_A
// CHECK: %[[UB:.*]] = moe.weight @mlp_experts_up_proj_lora_B
// CHECK: %[[DA:.*]] = moe.weight @mlp_experts_down_proj_lora_A
// CHECK: %[[DB:.*]] = moe.weight @mlp_experts_down_proj_lora_B
// CHECK: %[[E:.*]] = moe.expert_mlp %[[TOK]], %[[CNT]], up %[[U]], down %[[D]] gate %[[G]] gate_lora %[[GA]], %[[GB]] up_lora %[[UA]], %[[UB]] down_lora %[[DA]], %[[DB]] {activation = #moe<activation silu>, lora_scale = 4.000000e+00 : f64}
// CHECK-NEXT: moe.combine %[[E]],
// CHECK-NOT: moe.expert_mlp

// Without expert-lora the routed experts stay frozen even though their names are targets
// (PEFT does not adapt transformers 5's fused 3D expert parameters either).
// NOEXPERT: lora = {alpha = 8.000000e+00 : f64, dropout = 0.000000e+00 : f64, r = 2 : i64, targets = ["down_proj", "gate_proj", "up_proj"]}
// NOEXPERT: moe.param @mlp_down_proj_lora_B
// NOEXPERT-NOT: experts_{{.*}}_lora
// NOEXPERT: moe.expert_mlp %{{.*}}, %{{.*}}, up %{{.*}}, down %{{.*}} gate %{{.*}} {activation = #moe<activation silu>} :

// rsLoRA scales by alpha / sqrt(r) (8 / 2), and the model records it.
// RSLORA: lora = {alpha = 8.000000e+00 : f64, dropout = 0.000000e+00 : f64, expert_lora, r = 4 : i64, rslora, targets = ["up_proj"]}
// RSLORA: moe.lora {{.*}} {scale = 4.000000e+00 : f64}
// RSLORA: moe.expert_mlp {{.*}} up_lora %{{.*}}, %{{.*}} {activation = #moe<activation silu>, lora_scale = 4.000000e+00 : f64}

// The training step reaches the expert adapters: each gets a weight gradient.
// TRAIN-DAG: moe.param_grad @mlp_experts_gate_proj_lora_A
// TRAIN-DAG: moe.param_grad @mlp_experts_gate_proj_lora_B
// TRAIN-DAG: moe.param_grad @mlp_experts_up_proj_lora_A
// TRAIN-DAG: moe.param_grad @mlp_experts_up_proj_lora_B
// TRAIN-DAG: moe.param_grad @mlp_experts_down_proj_lora_A
// TRAIN-DAG: moe.param_grad @mlp_experts_down_proj_lora_B
// TRAIN-DAG: moe.param_grad @self_attn_q_proj_lora_A
// TRAIN-NOT: moe.param_grad @mlp_experts_up_proj,
// TRAIN-LABEL: func.func @train_step

// Mixtral names its experts' projections w1 (gate), w3 (up) and w2 (down).
// MIXTRAL: lora = {{{.*}}expert_lora, r = 2 : i64, targets = ["q_proj", "w1", "w3"]}
// MIXTRAL: moe.param @block_sparse_moe_experts_w1_lora_A "base_model.model.model.layers.{layer}.block_sparse_moe.experts.{expert}.w1.lora_A.weight" trainable : tensor<4x2x16xf32>
// MIXTRAL: moe.param @block_sparse_moe_experts_w3_lora_B "base_model.model.model.layers.{layer}.block_sparse_moe.experts.{expert}.w3.lora_B.weight" trainable : tensor<4x8x2xf32>
// MIXTRAL-NOT: w2_lora
// MIXTRAL: moe.expert_mlp {{.*}} gate_lora %{{.*}}, %{{.*}} up_lora %{{.*}}, %{{.*}} {activation = #moe<activation silu>, lora_scale = 2.000000e+00 : f64}

// An expert projection named without expert-lora says how to adapt it.
// NEEDFLAG: error: moe-inject-lora: target(s) w1 match no projection; the model's projections are: o_proj, q_proj; w1 is a routed-expert projection: set expert-lora to adapt it

// expert-lora with no expert projection among the targets is an error naming them.
// NOEXPERTTARGET: error: moe-inject-lora: expert-lora is set but no target names a routed-expert projection; the expert projections are: down_proj, gate_proj, up_proj

// moe.expert_mlp has no dropout, so expert adapters refuse it rather than train without it.
// DROPOUT: error: moe-inject-lora: expert-lora does not support dropout yet, got 1.000000e-01; use dropout 0

// gpt-oss's fused [in, out] expert tensors cannot take per-expert adapters...
// FUSED: error: moe-inject-lora: expert LoRA on fused expert tensors (fused_gate_up / in_out_layout, as gpt-oss stores them) is not supported; leave expert-lora off
// ...but the model's other projections can.
// FUSEDOFF: lora = {{{.*}}targets = ["q_proj"]}
// FUSEDOFF: moe.expert_mlp {{.*}} {activation = #moe<activation clamped_swiglu>, fused_gate_up, in_out_layout, limit = 7.000000e+00 : f64}
