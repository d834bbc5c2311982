//===- train_tensor_parallel_mamba.mlir - Mamba-2 with in_proj's adapter ---===//
//
// tp=2 on a tiny Nemotron-H (Mamba-2, attention, MoE layers) with all-linear's adapters, in_proj's
// included: in_proj splits in its five pieces (z, x, B, C, dt) while its adapter stays whole on
// every rank, each rank keeping its columns of each piece of the adapter's output
// (moe.tp_slice_features; its backward moe.tp_place_features), so the adapter's gradients are
// partial sums over tp. Two thread ranks take one rank's steps, with and without sequence
// parallel, and the exported adapter (in_proj's B whole) scores the data as one rank's does.
//
// RUN: rm -rf %t && mkdir -p %t
// RUN: moec compile %inputs/tiny_nemotron_h.json --seq-len 32 --micro-batch 2 --lora-rank 4 --mesh tp=2 \
// RUN:     -o %t/tp.moeplan 2>&1 | FileCheck %s --check-prefix=COMPILE
// RUN: moec compile %inputs/tiny_nemotron_h.json --seq-len 32 --micro-batch 2 --lora-rank 4 --mesh tp=2 \
// RUN:     --sequence-parallel -o %t/sp.moeplan 2>/dev/null
// RUN: moec compile %inputs/tiny_nemotron_h.json --seq-len 32 --micro-batch 2 --lora-rank 4 -o %t/single.moeplan
// RUN: moec compile %inputs/tiny_nemotron_h.json --seq-len 32 --micro-batch 2 --lora-rank 4 --mesh tp=2 \
// RUN:     --emit=plan-text 2>/dev/null | FileCheck %s --check-prefix=SLICE
// RUN: moe-run init %inputs/tiny_nemotron_h.json --seed 0 --plan %t/single.moeplan -o %t/model
// RUN: moe-run train --plan %t/single.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/single --steps 4 2>/dev/null
// RUN: moe-run train --plan %t/tp.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/tp --steps 4 --nproc 2 2>/dev/null
// RUN: python3 %inputs/same_losses.py %t/tp/metrics.jsonl %t/single/metrics.jsonl 1e-5 | FileCheck %s --check-prefix=SAME
// RUN: moe-run train --plan %t/sp.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/sp --steps 4 --nproc 2 2>/dev/null
// RUN: python3 %inputs/same_losses.py %t/sp/metrics.jsonl %t/single/metrics.jsonl 1e-5 | FileCheck %s --check-prefix=SAME
// RUN: moe-run forward --plan %t/single.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --adapter %t/tp/adapter > %t/tp_forward
// RUN: moe-run forward --plan %t/single.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --adapter %t/single/adapter > %t/single_forward
// RUN: diff %t/tp_forward %t/single_forward

// COMPILE-NOT: warning
// COMPILE: moec: wrote {{.*}}tp.moeplan ({{[0-9]+}} steps, {{[0-9]+}} buffers per rank, 2 ranks)
// SLICE: rank 0
// SLICE: tp_slice_features {{.*}} index=0, pieces=[64,64,32,32,4], ranks=2}
// SLICE: tp_place_features {{.*}} index=0, pieces=[64,64,32,32,4], ranks=2}
// SLICE: rank 1
// SLICE: tp_slice_features {{.*}} index=1, pieces=[64,64,32,32,4], ranks=2}
// SLICE: tp_place_features {{.*}} index=1, pieces=[64,64,32,32,4], ranks=2}
// SAME: 4 steps agree within 1e-05
