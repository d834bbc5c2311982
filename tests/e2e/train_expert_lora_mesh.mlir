//===- train_expert_lora_mesh.mlir - expert adapters split over ep --------===//
//
// Adapters on the routed experts (--expert-lora) with the experts split over ep: each
// expert-parallel rank trains its experts' adapters. dp=2,ep=2 (four CPU thread ranks) takes
// the steps one rank takes on the global batch; the exported adapter (every rank's experts put
// together) scores the data as one rank's does; a run resumed from its checkpoint takes the
// same steps; and on eight ranks with pp and tp as well (ep=2,pp=2,tp=2) the same again.
//
// RUN: rm -rf %t && mkdir -p %t && cp %inputs/tiny_qwen3_moe_4_layers.json %t/config.json
// RUN: moec compile %t/config.json --seq-len 32 --micro-batch 1 --lora-rank 4 --expert-lora \
// RUN:     --lora-targets q_proj,gate_proj,up_proj,down_proj --mesh dp=2,ep=2 -o %t/mesh.moeplan 2>/dev/null
// RUN: moec compile %t/config.json --seq-len 32 --micro-batch 4 --lora-rank 4 --expert-lora \
// RUN:     --lora-targets q_proj,gate_proj,up_proj,down_proj -o %t/single.moeplan 2>/dev/null
// RUN: moe-run init %t/config.json --seed 0 --plan %t/single.moeplan -o %t/model
// RUN: moe-run train --plan %t/mesh.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/mesh --steps 4 --nproc 4 2>&1 | FileCheck %s --check-prefix=TRAIN
// RUN: moe-run train --plan %t/single.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/single --steps 4 2>/dev/null
// RUN: python3 %inputs/same_losses.py %t/mesh/metrics.jsonl %t/single/metrics.jsonl 1e-5 \
// RUN:   | FileCheck %s --check-prefix=SAME
// RUN: moe-run forward --plan %t/single.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --adapter %t/mesh/adapter > %t/mesh_forward
// RUN: moe-run forward --plan %t/single.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --adapter %t/single/adapter > %t/single_forward
// RUN: diff %t/mesh_forward %t/single_forward
// RUN: moe-run train --plan %t/mesh.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/resumed --steps 2 --nproc 4 2>/dev/null
// RUN: moe-run train --plan %t/mesh.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/resumed --steps 4 --nproc 4 --resume 2>/dev/null
// RUN: python3 %inputs/same_losses.py %t/resumed/metrics.jsonl %t/single/metrics.jsonl 1e-5 \
// RUN:   | FileCheck %s --check-prefix=SAME
// RUN: moec compile %t/config.json --seq-len 32 --micro-batch 1 --lora-rank 4 --expert-lora \
// RUN:     --lora-targets q_proj,gate_proj,up_proj,down_proj --mesh ep=2,pp=2,tp=2 \
// RUN:     --pipeline-micro-batches 2 -o %t/eight.moeplan 2>/dev/null
// RUN: moe-run train --plan %t/eight.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/eight --steps 4 --nproc 8 2>/dev/null
// RUN: python3 %inputs/same_losses.py %t/eight/metrics.jsonl %t/single/metrics.jsonl 1e-5 \
// RUN:   | FileCheck %s --check-prefix=SAME

// TRAIN: moe-run: trained 4 steps
// SAME: 4 steps agree within 1e-05
