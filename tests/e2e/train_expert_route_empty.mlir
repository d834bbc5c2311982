//===- train_expert_route_empty.mlir - a rank with no tokens to compute ---===//
//
// Expert parallel with top-1 routing over 8 experts and 2 tokens per rank: in some layers one
// rank's experts get no token at all (the route sends it nothing; its dispatch, expert MLP,
// combine and their backwards see zero rows). Training still equals one rank on both
// ranks' sequences.
//
// RUN: rm -rf %t && mkdir -p %t
// RUN: moec compile %inputs/tiny_qwen3_moe_top1.json --seq-len 2 --micro-batch 1 --lora-rank 4 \
// RUN:     --mesh ep=2 -o %t/mesh.moeplan
// RUN: moec compile %inputs/tiny_qwen3_moe_top1.json --seq-len 2 --micro-batch 2 --lora-rank 4 \
// RUN:     -o %t/single.moeplan
// RUN: moe-run train --plan %t/mesh.moeplan --random-weights 1 --data %inputs/train.jsonl \
// RUN:     --out %t/mesh --steps 2 --nproc 2 2>/dev/null
// RUN: moe-run train --plan %t/single.moeplan --random-weights 1 --data %inputs/train.jsonl \
// RUN:     --out %t/single --steps 2 2>/dev/null
// RUN: python3 %inputs/empty_expert_rank.py %t/mesh/metrics.jsonl | FileCheck %s --check-prefix=EMPTY
// RUN: python3 %inputs/same_losses.py %t/mesh/metrics.jsonl %t/single/metrics.jsonl 1e-5 \
// RUN:   | FileCheck %s --check-prefix=SAME
//
// EMPTY: step {{[0-9]+}} layer {{[0-9]+}}: ep ranks {{\[0, [0-9]+\]|\[[0-9]+, 0\]}}
// EMPTY: {{[1-9][0-9]*}} layer steps with an expert-parallel rank that received nothing
// SAME: 2 steps agree within 1e-05
