//===- train_pipeline.mlir - pipeline stages train like one rank -----------===//
//
// A four-layer model on four pipeline stages (one layer each, four micro-batches of one
// sequence per step in 1F1B order, --nproc 4 CPU thread ranks) takes the steps one rank takes
// with --micro-batch 4: the same losses and gradient norms, the global batch's expert loads
// of every layer in rank 0's metrics. The adapter it exports gathers every stage's tensors:
// it scores the data as one rank's adapter does. A checkpoint holds every stage's tensors
// too: a run stopped at step 2 and resumed takes the same steps 3 and 4. Three stages
// (uneven: layers 0-1, 2, 3) with two micro-batches of two sequences, and random weights made
// on each stage (its part of the one-rank model), agree as well.
//
// RUN: rm -rf %t && mkdir -p %t && cp %inputs/tiny_qwen3_moe_4_layers.json %t/config.json
// RUN: moec compile %t/config.json --seq-len 32 --micro-batch 1 --lora-rank 4 --mesh pp=4 \
// RUN:     --pipeline-micro-batches 4 -o %t/pp4.moeplan 2>&1 | FileCheck %s --check-prefix=COMPILE
// RUN: moec compile %t/config.json --seq-len 32 --micro-batch 4 --lora-rank 4 -o %t/single.moeplan
// RUN: moe-run init %t/config.json --seed 0 --plan %t/single.moeplan -o %t/model
// RUN: moe-run train --plan %t/pp4.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/pp4 --steps 4 --log-every 2 --nproc 4 2>&1 | FileCheck %s --check-prefix=PIPELINE
// RUN: moe-run train --plan %t/single.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/single --steps 4 --log-every 2 2>/dev/null
// RUN: python3 %inputs/same_losses.py %t/pp4/metrics.jsonl %t/single/metrics.jsonl 1e-5 \
// RUN:   | FileCheck %s --check-prefix=SAME
// RUN: python3 %inputs/check_metrics.py %t/pp4/metrics.jsonl 4 128 2 | FileCheck %s --check-prefix=METRICS
// RUN: moe-run forward --plan %t/single.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --adapter %t/pp4/adapter > %t/pp4_forward
// RUN: moe-run forward --plan %t/single.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --adapter %t/single/adapter > %t/single_forward
// RUN: diff %t/pp4_forward %t/single_forward
// RUN: moe-run train --plan %t/pp4.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/resumed --steps 2 --nproc 4 2>/dev/null
// RUN: moe-run train --plan %t/pp4.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/resumed --steps 4 --nproc 4 --resume 2>&1 | FileCheck %s --check-prefix=RESUMED
// RUN: python3 %inputs/same_losses.py %t/resumed/metrics.jsonl %t/single/metrics.jsonl 1e-5 \
// RUN:   | FileCheck %s --check-prefix=SAME
// RUN: moec compile %t/config.json --seq-len 32 --micro-batch 2 --lora-rank 4 --mesh pp=3 \
// RUN:     --pipeline-micro-batches 2 -o %t/pp3.moeplan 2>/dev/null
// RUN: moe-run train --plan %t/pp3.moeplan --random-weights 3 --data %inputs/train.jsonl \
// RUN:     --out %t/pp3_random --steps 3 --nproc 3 2>/dev/null
// RUN: moe-run train --plan %t/single.moeplan --random-weights 3 --data %inputs/train.jsonl \
// RUN:     --out %t/single_random --steps 3 2>/dev/null
// RUN: python3 %inputs/same_losses.py %t/pp3_random/metrics.jsonl %t/single_random/metrics.jsonl 1e-5 \
// RUN:   | FileCheck %s --check-prefix=SAME-RANDOM
// RUN: not moec compile %t/config.json --seq-len 32 --mesh pp=8 -o %t/bad.moeplan 2>&1 \
// RUN:   | FileCheck %s --check-prefix=TOO-MANY

// COMPILE: moec: wrote {{.*}}pp4.moeplan ({{[0-9]+}} steps, {{[0-9]+}} buffers per rank, 4 ranks)
// PIPELINE: step 1/4  loss
// PIPELINE-NOT: step 1/4
// PIPELINE: step 4/4
// PIPELINE: moe-run: trained 4 steps
// PIPELINE-NOT: moe-run: trained
// SAME: 4 steps agree within 1e-05
// METRICS: 4 steps
// METRICS: expert_load: layers 0 1 2 3, experts 8, 256 routed tokens per layer
// RESUMED: moe-run: resumed from {{.*}}checkpoint.safetensors at step 2
// RESUMED: moe-run: trained 4 steps
// SAME-RANDOM: 3 steps agree within 1e-05
// TOO-MANY: error: --moe-schedule-pipeline: pp = 8 needs at least 8 layers, the model has 4
