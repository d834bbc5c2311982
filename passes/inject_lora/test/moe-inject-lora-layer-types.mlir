// RUN: moe-opt %inputs/tiny-moe.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{targets=kda:o_proj,gqa_moe:k_proj,moe:up_proj,gate_proj expert-lora rank=2 alpha=4}))' | FileCheck %s
// RUN: moe-opt %inputs/tiny-moe.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{targets=dense:all-linear rank=2 alpha=4}))' | FileCheck %s --check-prefix=DENSE
// RUN: not moe-opt %inputs/tiny-moe.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{targets=q_proj,mla:q_proj}))' 2>&1 | FileCheck %s --check-prefix=UNKNOWN
// RUN: not moe-opt %inputs/tiny-moe.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{targets=dense:q_proj}))' 2>&1 | FileCheck %s --check-prefix=NOPROJ
// RUN: not moe-opt %inputs/tiny-moe.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{targets=moe:gate_proj}))' 2>&1 | FileCheck %s --check-prefix=EXPERTONLY
// RUN: not moe-opt %inputs/tiny-moe.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{targets=:q_proj}))' 2>&1 | FileCheck %s --check-prefix=MALFORMED

// Tests that a target TYPE:module applies only to the layer templates whose name,
// token_mixer or channel_mixer is TYPE, while an unqualified target applies everywhere:
// kda:o_proj adapts the KDA layer's o_proj but not the GQA layer's; gqa_moe:k_proj names
// the template itself; moe:up_proj reaches the routed experts but not the dense MLP's up_proj;
// gate_proj adapts both the dense MLP and the experts.
// CHECK: lora = {alpha = 4.000000e+00 : f64, dropout = 0.000000e+00 : f64, expert_lora, r = 2 : i64, targets = ["gate_proj", "k_proj", "o_proj", "up_proj"]}
// CHECK-LABEL: moe.layer @kda_dense
// CHECK: moe.param @self_attn_o_proj_lora_A
// CHECK-NOT: moe.param @mlp_up_proj_lora
// CHECK: moe.param @mlp_gate_proj_lora_A
// CHECK-NOT: moe.param @mlp_up_proj_lora
// CHECK-LABEL: moe.layer @gqa_moe
// CHECK-NOT: moe.param @self_attn_o_proj_lora
// CHECK: moe.param @self_attn_k_proj_lora_A
// CHECK-NOT: moe.param @self_attn_o_proj_lora
// CHECK: moe.param @mlp_experts_gate_proj_lora_A
// CHECK: moe.param @mlp_experts_up_proj_lora_A
// CHECK-NOT: moe.param @self_attn_o_proj_lora
// CHECK: moe.expert_mlp {{.*}} gate_lora %{{.*}}, %{{.*}} up_lora %{{.*}}, %{{.*}} {activation
// CHECK-LABEL: func.func @forward

// A qualified all-linear adapts every projection of those templates only.
// DENSE: targets = ["down_proj", "gate_proj", "o_proj", "up_proj"]
// DENSE-LABEL: moe.layer @kda_dense
// DENSE-COUNT-4: moe.lora
// DENSE-LABEL: moe.layer @gqa_moe
// DENSE-NOT: moe.lora

// A type no template has, or one whose templates lack the projection, is an error listing
// the templates, their types (token and channel mixer) and their projections.
// UNKNOWN: error: moe-inject-lora: target mla:q_proj: no layer template is of type mla; the layer templates, their types and projections: @kda_dense (kda, dense): down_proj, gate_proj, o_proj, up_proj; @gqa_moe (gqa, moe): k_proj, o_proj, q_proj, v_proj [experts: down_proj, gate_proj, up_proj]
// NOPROJ: error: moe-inject-lora: target dense:q_proj matches no projection in layers of type dense; the layer templates, their types and projections: @kda_dense (kda, dense): down_proj, gate_proj, o_proj, up_proj; @gqa_moe
// EXPERTONLY: error: moe-inject-lora: target moe:gate_proj matches no projection in layers of type moe; gate_proj is a routed-expert projection: set expert-lora to adapt it; the layer templates
// MALFORMED: error: moe-inject-lora: target ':q_proj' is neither a module name nor TYPE:module
