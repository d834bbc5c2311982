//===- train_fused_experts.mlir - gpt-oss layout end to end on the CPU ----===//
//
// Inputs/tiny_gpt_oss.json is gpt-oss-120b's config shrunk to 2 layers of width 64 (4 experts,
// vocab 256, float32). It exercises what no golden model has: fused 3-D expert tensors
// (`mlp.experts.gate_up_proj` [E, in, 2I] with biases, bound whole, not per expert), the
// clamped SwiGLU, attention sinks, biased q/k/v/o and a sliding-window layer.
//
// RUN: rm -rf %t && mkdir -p %t
// RUN: moec compile %inputs/tiny_gpt_oss.json --seq-len 32 --micro-batch 2 --lora-rank 4 \
// RUN:     --emit=plan-text 2>/dev/null | FileCheck %s --check-prefix=PLAN
// RUN: moec compile %inputs/tiny_gpt_oss.json --seq-len 32 --micro-batch 2 --lora-rank 4 \
// RUN:     -o %t/plan.moeplan 2>/dev/null
// RUN: moe-run init %inputs/tiny_gpt_oss.json --plan %t/plan.moeplan -o %t/model
// RUN: moe-run train --plan %t/plan.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/run --steps 3 --log-every 1 2>&1 | FileCheck %s
//
//===----------------------------------------------------------------------===//

// The fused expert tensors are bound whole (no {expert} pattern).
// PLAN-DAG: bind %{{[0-9]+}} "model.layers.0.mlp.experts.gate_up_proj"
// PLAN-DAG: bind %{{[0-9]+}} "model.layers.0.mlp.experts.gate_up_proj_bias"
// PLAN-DAG: bind %{{[0-9]+}} "model.layers.1.self_attn.sinks"
// PLAN: expert_mlp {{.*}}activation="clamped_swiglu"

// CHECK: step 1/3  loss {{[0-9]+\.[0-9]+}}
// CHECK: step 3/3  loss {{[0-9]+\.[0-9]+}}
// CHECK: moe-run: trained 3 steps
