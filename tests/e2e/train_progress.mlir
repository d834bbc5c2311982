//===- train_progress.mlir - progress lines, metrics.jsonl, the loss falls -===//
//
// 30 steps on the bundled synthetic task (models/tiny-qwen3-moe/train.jsonl, copied to Inputs/)
// at lr 3e-3 with 2 warmup steps: the progress line at steps 1, 10, 20 and 30 (--log-every 10),
// the learning rate of the schedule (warmup, then cosine down to 10% of the peak), one metrics
// line per step with every key, and the loss falls.
//
// RUN: rm -rf %t && mkdir -p %t
// RUN: moec compile %root/models/tiny-qwen3-moe/config.json --seq-len 32 --micro-batch 2 \
// RUN:     --lora-rank 4 --lr 3e-3 --warmup-steps 2 --total-steps 30 -o %t/plan.moeplan
// RUN: moe-run init %root/models/tiny-qwen3-moe/config.json --plan %t/plan.moeplan -o %t/model
// RUN: moe-run train --plan %t/plan.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/run --log-every 10 2>&1 | FileCheck %s --strict-whitespace --check-prefix=PROGRESS
// RUN: python3 %inputs/check_metrics.py %t/run/metrics.jsonl 30 64 2 | FileCheck %s --check-prefix=METRICS
//
// --steps overrides the plan's total steps; --log-every 0 logs every step.
// RUN: moe-run train --plan %t/plan.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/short --steps 2 --log-every 0 2>&1 | FileCheck %s --check-prefix=SHORT
// RUN: python3 %inputs/check_metrics.py %t/short/metrics.jsonl 2 64 2 | FileCheck %s --check-prefix=SHORT-METRICS
//
//===----------------------------------------------------------------------===//

// PROGRESS:      {{^}}step 1/30  loss {{[0-9]+\.[0-9][0-9][0-9][0-9]}}  lr 0.00e+00  grad_norm {{[0-9]+\.[0-9][0-9][0-9]}}  {{[0-9]+}} tok/s  eta {{([0-9]+s|[0-9]+m[0-9]+s|[0-9]+h[0-9]+m)$}}
// PROGRESS-NEXT: {{^}}step 10/30  loss {{[0-9]+\.[0-9][0-9][0-9][0-9]}}  lr 2.60e-03  grad_norm {{[0-9]+\.[0-9][0-9][0-9]}}  {{[0-9]+}} tok/s  eta {{([0-9]+s|[0-9]+m[0-9]+s)$}}
// PROGRESS-NEXT: {{^}}step 20/30  loss {{[0-9]+\.[0-9][0-9][0-9][0-9]}}  lr 1.20e-03  grad_norm {{[0-9]+\.[0-9][0-9][0-9]}}  {{[0-9]+}} tok/s  eta {{([0-9]+s|[0-9]+m[0-9]+s)$}}
// PROGRESS-NEXT: {{^}}step 30/30  loss {{[0-9]+\.[0-9][0-9][0-9][0-9]}}  lr 3.08e-04  grad_norm {{[0-9]+\.[0-9][0-9][0-9]}}  {{[0-9]+}} tok/s  eta 0s{{$}}
// PROGRESS-NEXT: {{^}}moe-run: trained 30 steps{{$}}
// PROGRESS-NEXT: {{^}}  adapter (PEFT):  {{.*}}run/adapter{{$}}
// PROGRESS-NEXT: {{^}}  checkpoint:      {{.*}}run/checkpoint.safetensors{{$}}
// PROGRESS-NEXT: {{^}}  metrics:         {{.*}}run/metrics.jsonl{{$}}

// METRICS:      30 steps, keys expert_load grad_norm loss lr step tokens_per_s
// METRICS-NEXT: expert_load: layers 0 1, experts 8, 128 routed tokens per layer
// METRICS-NEXT: loss fell by more than 1: step 1 {{[0-9.]+}}, step 30 {{[0-9.]+}}

// SHORT:      step 1/2  loss
// SHORT-NEXT: step 2/2  loss {{.*}} lr 1.50e-03
// SHORT-NEXT: moe-run: trained 2 steps
// SHORT-METRICS: 2 steps, keys
