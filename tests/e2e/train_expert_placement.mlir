//===- train_expert_placement.mlir - experts placed by a measured load ----===//
//
// The loop a user runs: train, then compile again with the experts placed by the load the
// run measured (moec --expert-load METRICS.jsonl), then train on the placed plan. Placement
// moves experts between ep ranks, not tokens between experts: the losses equal one rank's,
// each expert gets the same tokens, and the busiest rank gets fewer. Random weights on each
// rank are its experts' parts of the one-rank model, wherever the placement puts them.
//
// RUN: rm -rf %t && mkdir -p %t
// RUN: moec compile %root/models/tiny-qwen3-moe/config.json --seq-len 32 --micro-batch 4 --lora-rank 4 \
// RUN:     -o %t/single.moeplan
// RUN: moec compile %root/models/tiny-qwen3-moe/config.json --seq-len 32 --micro-batch 1 --lora-rank 4 \
// RUN:     --mesh dp=2,ep=2 --ep-exchange routed -o %t/mesh.moeplan
// RUN: moe-run train --plan %t/mesh.moeplan --random-weights 3 --data %inputs/train.jsonl \
// RUN:     --out %t/mesh --steps 3 --nproc 4 2>/dev/null
// RUN: moec compile %root/models/tiny-qwen3-moe/config.json --seq-len 32 --micro-batch 1 --lora-rank 4 \
// RUN:     --mesh dp=2,ep=2 --expert-load %t/mesh/metrics.jsonl -o %t/placed.moeplan 2>&1 \
// RUN:   | FileCheck %s --check-prefix=COMPILE
// RUN: moe-run train --plan %t/placed.moeplan --random-weights 3 --data %inputs/train.jsonl \
// RUN:     --out %t/placed --steps 3 --nproc 4 2>/dev/null
// RUN: moe-run train --plan %t/single.moeplan --random-weights 3 --data %inputs/train.jsonl \
// RUN:     --out %t/single --steps 3 2>/dev/null
// RUN: python3 %inputs/same_losses.py %t/placed/metrics.jsonl %t/single/metrics.jsonl 1e-5 \
// RUN:   | FileCheck %s --check-prefix=SAME
// RUN: python3 %inputs/placed_load.py %t/placed/metrics.jsonl %t/mesh/metrics.jsonl | FileCheck %s --check-prefix=LOAD
// With a spare expert per rank for copies of the busiest experts: still one rank's losses and
// the same tokens per expert.
// RUN: moec compile %root/models/tiny-qwen3-moe/config.json --seq-len 32 --micro-batch 1 --lora-rank 4 \
// RUN:     --mesh dp=2,ep=2 --expert-load %t/mesh/metrics.jsonl --replicate-experts 1 --emit=plan-text 2>&1 \
// RUN:   | FileCheck %s --check-prefix=REPLICATED
// RUN: moec compile %root/models/tiny-qwen3-moe/config.json --seq-len 32 --micro-batch 1 --lora-rank 4 \
// RUN:     --mesh dp=2,ep=2 --expert-load %t/mesh/metrics.jsonl --replicate-experts 1 -o %t/replicated.moeplan
// RUN: moe-run train --plan %t/replicated.moeplan --random-weights 3 --data %inputs/train.jsonl \
// RUN:     --out %t/replicated --steps 3 --nproc 4 2>/dev/null
// RUN: python3 %inputs/same_losses.py %t/replicated/metrics.jsonl %t/single/metrics.jsonl 1e-5 \
// RUN:   | FileCheck %s --check-prefix=SAME
// RUN: python3 %inputs/placed_load.py %t/replicated/metrics.jsonl %t/mesh/metrics.jsonl --equal-tokens-only \
// RUN:   | FileCheck %s --check-prefix=TOKENS
// On pipeline stages too (ep=2, pp=2: one MoE layer a stage): rank 0 writes every layer's
// tokens per expert in expert order and its ep ranks' shares.
// RUN: moec compile %root/models/tiny-qwen3-moe/config.json --seq-len 32 --micro-batch 1 --lora-rank 4 \
// RUN:     --mesh ep=2,pp=2 --pipeline-micro-batches 2 --expert-load %t/mesh/metrics.jsonl -o %t/pp.moeplan
// RUN: moe-run train --plan %t/pp.moeplan --random-weights 3 --data %inputs/train.jsonl \
// RUN:     --out %t/pp --steps 3 --nproc 4 2>/dev/null
// RUN: python3 %inputs/same_losses.py %t/pp/metrics.jsonl %t/single/metrics.jsonl 1e-5 \
// RUN:   | FileCheck %s --check-prefix=SAME
// RUN: python3 %inputs/placed_load.py %t/pp/metrics.jsonl %t/mesh/metrics.jsonl --equal-tokens-only \
// RUN:   | FileCheck %s --check-prefix=TOKENS
// RUN: not moec compile %root/models/tiny-qwen3-moe/config.json --mesh ep=2 --expert-load %t/mesh/metrics.jsonl \
// RUN:     --replicate-experts 5 -o %t/x.moeplan 2>&1 | FileCheck %s --check-prefix=TOOMANY

// COMPILE: moec: experts placed by the load in {{.*}}metrics.jsonl: {{[0-9]+}} MoE layers; the busiest ep rank's tokens over the mean, worst layer: {{[0-9.]+}} with consecutive experts, {{[0-9.]+}} placed
// COMPILE: moec: wrote {{.*}}placed.moeplan
// SAME: 3 steps agree within 1e-05
// LOAD: tokens per expert equal over 3 steps
// LOAD: worst ep imbalance: {{[0-9.]+}} placed, {{[0-9.]+}} consecutive
// LOAD: placed no worse
// REPLICATED: moec: experts placed by the load in {{.*}}metrics.jsonl: 2 MoE layers, 1 spare experts per rank for copies of the busiest
// REPLICATED: weight f32 [5,
// REPLICATED: experts={{[0-9]+(,[0-9]+){4}$}}
// REPLICATED: expert_route {{.*}} placement={{[0-9]+(,[0-9]+){9} }}
// TOKENS: tokens per expert equal over 3 steps
// TOOMANY: moec: error: {{.*}}metrics.jsonl: layer 0: cannot spread copies of its 8 experts over 2 ranks of 9 (at most one copy of an expert per rank)
