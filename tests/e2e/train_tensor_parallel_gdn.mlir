//===- train_tensor_parallel_gdn.mlir - Gated DeltaNet split over tp --------===//
//
// tp=2 on a tiny Qwen3-Next (three Gated DeltaNet layers, one attention layer) as two CPU thread
// ranks takes the steps one rank takes: each rank holds its key heads' block of in_proj_qkvz and
// in_proj_ba (and of their adapters' B), its share of each of the convolution's three parts
// (q, k, v: the plan's weight pieces), of A_log and dt_bias, and its columns of out_proj. Both
// from a written model (the checkpoint read in pieces) and from random weights made on each
// rank (each piece filled as the one-rank tensor has it); the exported adapter scores the data
// as one rank's does.
//
// RUN: rm -rf %t && mkdir -p %t && cp %inputs/tiny_qwen3_next.json %t/config.json
// RUN: moec compile %t/config.json --seq-len 32 --micro-batch 2 --lora-rank 4 --mesh tp=2 \
// RUN:     --lora-targets in_proj_qkvz,in_proj_ba,out_proj,q_proj,o_proj --emit=report | FileCheck %s --check-prefix=REPORT
// RUN: moec compile %t/config.json --seq-len 32 --micro-batch 2 --lora-rank 4 --mesh tp=2 \
// RUN:     --lora-targets in_proj_qkvz,in_proj_ba,out_proj,q_proj,o_proj -o %t/tp.moeplan
// RUN: moec compile %t/config.json --seq-len 32 --micro-batch 2 --lora-rank 4 \
// RUN:     --lora-targets in_proj_qkvz,in_proj_ba,out_proj,q_proj,o_proj -o %t/single.moeplan
// RUN: moe-run init %t/config.json --seed 0 --plan %t/single.moeplan -o %t/model
// RUN: moe-run train --plan %t/tp.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/tp --steps 3 --nproc 2 2>/dev/null
// RUN: moe-run train --plan %t/single.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/single --steps 3 2>/dev/null
// RUN: python3 %inputs/same_losses.py %t/tp/metrics.jsonl %t/single/metrics.jsonl 1e-5 \
// RUN:   | FileCheck %s --check-prefix=SAME
// RUN: moe-run forward --plan %t/single.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --adapter %t/tp/adapter > %t/tp_forward
// RUN: moe-run forward --plan %t/single.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --adapter %t/single/adapter > %t/single_forward
// RUN: diff %t/tp_forward %t/single_forward
// RUN: moe-run train --plan %t/tp.moeplan --random-weights 3 --data %inputs/train.jsonl \
// RUN:     --out %t/tp_random --steps 3 --nproc 2 2>/dev/null
// RUN: moe-run train --plan %t/single.moeplan --random-weights 3 --data %inputs/train.jsonl \
// RUN:     --out %t/single_random --steps 3 2>/dev/null
// RUN: python3 %inputs/same_losses.py %t/tp_random/metrics.jsonl %t/single_random/metrics.jsonl 1e-5 \
// RUN:   | FileCheck %s --check-prefix=SAME

// REPORT: the 2 key heads of @gated_delta_net_moe's linear attention (Gated DeltaNet) split over tp = 2
// SAME: 3 steps agree within 1e-05
