//===- train_tensor_parallel.mlir - tp ranks train like one rank -----------===//
//
// dp=2, tp=2 (each attention's heads split over two ranks; the rest computed by both) as four
// CPU thread ranks takes the steps one rank takes on the global batch: the same losses and
// gradient norms, from a written model and from random weights made on each rank (its rows of
// q/k/v and its columns of o of the one-rank model). The exported adapter (every rank's parts
// of the split adapters put together) scores the data as one rank's does; a run stopped at step
// 2 resumes from its checkpoint (whole tensors; each rank takes its part) to the same step 4.
//
// RUN: rm -rf %t && mkdir -p %t && cp %inputs/tiny_qwen3_moe_4_layers.json %t/config.json
// RUN: moec compile %t/config.json --seq-len 32 --micro-batch 2 --lora-rank 4 --mesh dp=2,tp=2 \
// RUN:     -o %t/tp.moeplan 2>&1 | FileCheck %s --check-prefix=COMPILE
// RUN: moec compile %t/config.json --seq-len 32 --micro-batch 4 --lora-rank 4 -o %t/single.moeplan
// RUN: moe-run init %t/config.json --seed 0 --plan %t/single.moeplan -o %t/model
// RUN: moe-run train --plan %t/tp.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/tp --steps 4 --log-every 2 --nproc 4 2>&1 | FileCheck %s --check-prefix=TRAIN
// RUN: moe-run train --plan %t/single.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/single --steps 4 2>/dev/null
// RUN: python3 %inputs/same_losses.py %t/tp/metrics.jsonl %t/single/metrics.jsonl 1e-5 \
// RUN:   | FileCheck %s --check-prefix=SAME
// RUN: python3 %inputs/check_metrics.py %t/tp/metrics.jsonl 4 128 2 | FileCheck %s --check-prefix=METRICS
// RUN: moe-run forward --plan %t/single.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --adapter %t/tp/adapter > %t/tp_forward
// RUN: moe-run forward --plan %t/single.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --adapter %t/single/adapter > %t/single_forward
// RUN: diff %t/tp_forward %t/single_forward
// RUN: moe-run train --plan %t/tp.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/resumed --steps 2 --nproc 4 2>/dev/null
// RUN: moe-run train --plan %t/tp.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/resumed --steps 4 --nproc 4 --resume 2>/dev/null
// RUN: python3 %inputs/same_losses.py %t/resumed/metrics.jsonl %t/single/metrics.jsonl 1e-5 \
// RUN:   | FileCheck %s --check-prefix=SAME
// RUN: moe-run train --plan %t/tp.moeplan --random-weights 3 --data %inputs/train.jsonl \
// RUN:     --out %t/tp_random --steps 3 --nproc 4 2>/dev/null
// RUN: moe-run train --plan %t/single.moeplan --random-weights 3 --data %inputs/train.jsonl \
// RUN:     --out %t/single_random --steps 3 2>/dev/null
// RUN: python3 %inputs/same_losses.py %t/tp_random/metrics.jsonl %t/single_random/metrics.jsonl 1e-5 \
// RUN:   | FileCheck %s --check-prefix=SAME-RANDOM

// COMPILE: moec: wrote {{.*}}tp.moeplan ({{[0-9]+}} steps, {{[0-9]+}} buffers per rank, 4 ranks)
// TRAIN: step 1/4  loss
// TRAIN-NOT: step 1/4
// TRAIN: moe-run: trained 4 steps
// TRAIN-NOT: moe-run: trained
// SAME: 4 steps agree within 1e-05
// METRICS: 4 steps
// METRICS: expert_load: layers 0 1 2 3, experts 8, 256 routed tokens per layer
// SAME-RANDOM: 3 steps agree within 1e-05
