//===- train_tensor_parallel_olmoe.mlir - norms over every head over tp ---===//
//
// OLMoE's q/k norms normalise all heads of a token together (weights of num_heads x head_dim),
// so splitting the heads over tp = 2 splits every norm's rows: each rank sums the squares of
// its features, moe.tp_sum adds the two parts (an all-reduce of one f32 per token), and
// moe.sharded_rms_norm normalises each rank's features by the whole rows' statistic; in the
// backward the statistic's gradient is summed over tp again. Two thread ranks then train like
// one, with and without sequence parallel (q/k adapters on the split heads), and the exported
// adapter scores the data as one rank's does. Leaving that backward sum out moves the
// gradient norms by 1% (same_losses compares them).
//
// RUN: rm -rf %t && mkdir -p %t
// RUN: moec compile %inputs/tiny_olmoe.json --seq-len 32 --micro-batch 2 --lora-rank 4 --mesh tp=2 \
// RUN:     -o %t/tp.moeplan 2>&1 | FileCheck %s --check-prefix=COMPILE
// RUN: moec compile %inputs/tiny_olmoe.json --seq-len 32 --micro-batch 2 --lora-rank 4 --mesh tp=2 \
// RUN:     --sequence-parallel -o %t/sp.moeplan 2>/dev/null
// RUN: moec compile %inputs/tiny_olmoe.json --seq-len 32 --micro-batch 2 --lora-rank 4 -o %t/single.moeplan
// RUN: moec compile %inputs/tiny_olmoe.json --seq-len 32 --micro-batch 2 --lora-rank 4 --mesh tp=2 \
// RUN:     --emit=report 2>/dev/null | FileCheck %s --check-prefix=REPORT
// RUN: moe-run init %inputs/tiny_olmoe.json --seed 0 --plan %t/single.moeplan -o %t/model
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
// A q norm trained in full (modules_to_save) splits with the heads too; its export is whole.
// RUN: moec import %inputs/tiny_olmoe.json | sed 's|\("model.layers.{layer}.self_attn.q_norm.weight"\)|\1 trainable|' \
// RUN:     > %t/trained_norm.mlir
// RUN: moec compile %t/trained_norm.mlir --seq-len 32 --micro-batch 2 --lora-rank 4 -o %t/norm_single.moeplan 2>/dev/null
// RUN: moec compile %t/trained_norm.mlir --seq-len 32 --micro-batch 2 --lora-rank 4 --mesh tp=2 \
// RUN:     -o %t/norm_tp.moeplan 2>/dev/null
// RUN: moe-run train --plan %t/norm_single.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/norm_single --steps 4 2>/dev/null
// RUN: moe-run train --plan %t/norm_tp.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/norm_tp --steps 4 --nproc 2 2>/dev/null
// RUN: python3 %inputs/same_losses.py %t/norm_tp/metrics.jsonl %t/norm_single/metrics.jsonl 1e-5 | FileCheck %s --check-prefix=SAME
// RUN: FileCheck %s --check-prefix=SAVED < %t/norm_tp/adapter/adapter_config.json
// RUN: moe-run forward --plan %t/norm_single.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --adapter %t/norm_tp/adapter > %t/norm_tp_forward
// RUN: moe-run forward --plan %t/norm_single.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --adapter %t/norm_single/adapter > %t/norm_single_forward
// RUN: diff %t/norm_tp_forward %t/norm_single_forward

// COMPILE-NOT: warning
// COMPILE: moec: wrote {{.*}}tp.moeplan ({{[0-9]+}} steps, {{[0-9]+}} buffers per rank, 2 ranks)
// REPORT: the sum of squares of @gqa_moe's rms_norm over 64 features split over tp = 2: all_reduce x8
// SAME: 4 steps agree within 1e-05
// SAVED: "modules_to_save": [
// SAVED-NEXT: "model.layers.0.self_attn.q_norm",
// SAVED-NEXT: "model.layers.1.self_attn.q_norm"
