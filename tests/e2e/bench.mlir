//===- bench.mlir - moe-run bench: step time, tokens/s, the plan's FLOP/s -===//
//
// RUN: rm -rf %t && mkdir -p %t
// RUN: moec compile %root/models/tiny-qwen3-moe/config.json --seq-len 32 --micro-batch 2 \
// RUN:     --lora-rank 4 -o %t/plan.moeplan
// RUN: moe-run bench --plan %t/plan.moeplan --random-weights 0 --steps 3 --warmup 1 | FileCheck %s
// RUN: env MOEC_PROFILE=1 moe-run bench --plan %t/plan.moeplan --random-weights 0 --steps 2 --warmup 1 \
// RUN:     2>&1 >/dev/null | FileCheck %s --check-prefix=PROFILE
// RUN: moec compile %root/models/tiny-qwen3-moe/config.json --seq-len 32 --micro-batch 2 \
// RUN:     --lora-rank 4 --dtype bfloat16 -o %t/bf16.moeplan
// RUN: moe-run bench --plan %t/bf16.moeplan --random-weights 0 --steps 3 --warmup 1 | FileCheck %s
// RUN: moe-run bench --plan %t/plan.moeplan --random-weights 0 --steps 1 --warmup 0 --backend auto 2>&1 \
// RUN:     | FileCheck %s --check-prefix=AUTO
// RUN: not moe-run bench --plan %t/plan.moeplan --random-weights 0 --steps 0 2>&1 \
// RUN:     | FileCheck %s --check-prefix=ZERO
//
//===----------------------------------------------------------------------===//

// 2 x 32 tokens per step; the FLOP count is the plan's (compiler/plan/Flops.cpp).
// CHECK: Qwen3MoeForCausalLM on cpu ({{[0-9]+}} threads): 64 tokens per step, median step {{[0-9.]+}} ms over 3 steps (after 1 warm-up), {{[0-9]+}} tokens/s, {{[0-9.e+-]+}} TFLOP/s of the plan's {{[0-9.e+-]+}} TFLOP per step
// ZERO: moe-run: error: --steps must be positive

// --backend auto says which device it took: the GPU when there is one, else the CPU and why.
// AUTO: moe-run: --backend auto: {{cuda:0 \(.*\)|cpu \([0-9]+ threads\) \(.+\)}}
// Before the first step it says where the steps run (the default backend is the CPU).
// AUTO: moe-run bench: 0 warm-up and 1 timed steps on {{cuda|cpu}}
// AUTO: Qwen3MoeForCausalLM on {{cuda|cpu}}

// A bf16 plan runs on the CPU too (bf16 storage emulated).
// The per-kernel profile covers the runs after the first (warm-up 1 + 2 steps = 2 runs), one
// line per kernel; the LM head fused with the loss (--moe-fuse) is apart from the layers.
// PROFILE: MOEC_PROFILE: {{[0-9.]+}} ms in kernels and collectives per run over 2 run(s) after the first
// PROFILE-DAG: {{^}}  expert_mlp.backward {{.*}} 2 calls per run
// PROFILE-DAG: {{^}}  lm_head_cross_entropy (outside layers) {{.*}} 1 calls per run
// PROFILE-DAG: {{^}}  lm_head_cross_entropy.backward (outside layers) {{.*}} 1 calls per run
