//===- train_rank_order.mlir - ranks numbered in another order ------------===//
//
// --rank-order says how ranks are numbered, the fastest-varying axis first (default tp, ep, dp,
// pp: tp's per-layer collectives within a node first). Ranks 0-7 share a node, so the axes
// listed first keep their collectives on NVLink. The plan carries the order (mesh.rank_order)
// and every group lists its ranks: numbered ep, dp, tp, pp on dp=2,tp=2,ep=2, rank 0's tp group
// is ranks 0 and 4, its ep group 0 and 1, its dp+ep group 0-3 and the expert adapters' dp+tp
// group 0, 2, 4 and 6; rank 5 (ep 1, dp 0, tp 1) is in 1 and 5, 4 and 5, 4-7, and 1, 3, 5, 7.
// Training on that plan (8 CPU thread ranks; tp ranks share their sequences, dp and ep ranks
// each have their own) takes the steps one rank takes on the global batch, and its exported
// adapter scores the data as one rank's does; the same with pp and tp first (pp=2,tp=2,ep=2
// numbered pp, tp, ep, dp) and in the default order.
//
// RUN: rm -rf %t && mkdir -p %t && cp %inputs/tiny_qwen3_moe_4_layers.json %t/config.json
// RUN: moec compile %t/config.json --seq-len 32 --micro-batch 1 --lora-rank 4 --expert-lora \
// RUN:     --lora-targets q_proj,gate_proj,up_proj,down_proj --mesh dp=2,tp=2,ep=2 --rank-order ep,dp \
// RUN:     --emit=plan-text 2>/dev/null | FileCheck %s --check-prefix=PLAN
// RUN: moec compile %t/config.json --seq-len 32 --micro-batch 1 --lora-rank 4 --expert-lora \
// RUN:     --lora-targets q_proj,gate_proj,up_proj,down_proj --mesh dp=2,tp=2,ep=2 --rank-order ep,dp \
// RUN:     -o %t/mesh.moeplan 2>/dev/null
// RUN: moec compile %t/config.json --seq-len 32 --micro-batch 4 --lora-rank 4 --expert-lora \
// RUN:     --lora-targets q_proj,gate_proj,up_proj,down_proj -o %t/single.moeplan 2>/dev/null
// RUN: moe-run init %t/config.json --seed 0 --plan %t/single.moeplan -o %t/model
// RUN: moe-run train --plan %t/mesh.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/mesh --steps 4 --nproc 8 2>/dev/null
// RUN: moe-run train --plan %t/single.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/single --steps 4 2>/dev/null
// RUN: python3 %inputs/same_losses.py %t/mesh/metrics.jsonl %t/single/metrics.jsonl 1e-5 \
// RUN:   | FileCheck %s --check-prefix=SAME
// RUN: moe-run forward --plan %t/single.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --adapter %t/mesh/adapter > %t/mesh_forward
// RUN: moe-run forward --plan %t/single.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --adapter %t/single/adapter > %t/single_forward
// RUN: diff %t/mesh_forward %t/single_forward
// RUN: moec compile %t/config.json --seq-len 32 --micro-batch 1 --lora-rank 4 --expert-lora \
// RUN:     --lora-targets q_proj,gate_proj,up_proj,down_proj --mesh pp=2,tp=2,ep=2 --rank-order pp,tp \
// RUN:     --pipeline-micro-batches 2 -o %t/pipeline.moeplan 2>/dev/null
// RUN: moe-run train --plan %t/pipeline.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/pipeline --steps 4 --nproc 8 2>/dev/null
// RUN: python3 %inputs/same_losses.py %t/pipeline/metrics.jsonl %t/single/metrics.jsonl 1e-5 \
// RUN:   | FileCheck %s --check-prefix=SAME
// RUN: moec compile %t/config.json --seq-len 32 --micro-batch 1 --lora-rank 4 --expert-lora \
// RUN:     --lora-targets q_proj,gate_proj,up_proj,down_proj --mesh dp=2,tp=2,ep=2 -o %t/default.moeplan 2>/dev/null
// RUN: moe-run train --plan %t/default.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/default --steps 4 --nproc 8 2>/dev/null
// RUN: python3 %inputs/same_losses.py %t/default/metrics.jsonl %t/single/metrics.jsonl 1e-5 \
// RUN:   | FileCheck %s --check-prefix=SAME
//
// The mesh report says where another order communicates faster. dp=4,tp=2,ep=2 on nodes of 8
// numbered ep, dp, tp, pp puts tp at stride 8, across nodes; ep then tp (--rank-order ep: the
// rest in the default order) keeps both in a node (of the orders that do, the one that moves
// the fewest axes). In the default order nothing is faster.
// RUN: moec compile %t/config.json --seq-len 32 --micro-batch 1 --lora-rank 4 --mesh dp=4,tp=2,ep=2 \
// RUN:     --rank-order ep,dp --emit=report 2>/dev/null | FileCheck %s --check-prefix=REPORT
// RUN: moec compile %t/config.json --seq-len 32 --micro-batch 1 --lora-rank 4 --mesh dp=4,tp=2,ep=2 \
// RUN:     --emit=report 2>/dev/null | FileCheck %s --check-prefix=DEFAULT
//
// RUN: not moec compile %t/config.json --mesh tp=2 --rank-order tp,tp -o %t/x.moeplan 2>&1 \
// RUN:   | FileCheck %s --check-prefix=TWICE
// RUN: not moec compile %t/config.json --mesh tp=2 --rank-order tp,xp -o %t/x.moeplan 2>&1 \
// RUN:   | FileCheck %s --check-prefix=AXIS
// RUN: moec compile %t/config.json --rank-order tp -o %t/one.moeplan 2>&1 | FileCheck %s --check-prefix=ONE

// PLAN: mesh dp=2 tp=2 pp=1 ep=2 world=8 recompute=none rank_order=ep,dp,tp,pp
// PLAN: rank 0
// PLAN: group 0 tp [0,4]
// PLAN-NEXT: group 1 ep [0,1]
// PLAN-NEXT: group 2 dp+ep [0,1,2,3]
// PLAN-NEXT: group 3 dp+ep+tp [0,1,2,3,4,5,6,7]
// PLAN-NEXT: group 4 dp+tp [0,2,4,6]
// PLAN: rank 5
// PLAN: group 0 tp [1,5]
// PLAN-NEXT: group 1 ep [4,5]
// PLAN-NEXT: group 2 dp+ep [4,5,6,7]
// PLAN-NEXT: group 3 dp+ep+tp [0,1,2,3,4,5,6,7]
// PLAN-NEXT: group 4 dp+tp [1,3,5,7]
// SAME: 4 steps agree within 1e-05
// REPORT: rank order: --rank-order ep (ep, tp within a node) would take
// REPORT: ranks: numbered ep,dp,tp,pp (the fastest first: --rank-order), 8 GPUs per node: ep (stride 1) within a node; dp (stride 2) within a node; tp (stride 8) spans nodes
// DEFAULT-NOT: rank order:
// DEFAULT: ranks: numbered tp,ep,dp,pp (the fastest first, moec's default), 8 GPUs per node: tp (stride 1) within a node; ep (stride 2) within a node; dp (stride 4) spans nodes
// TWICE: moec: error: --rank-order 'tp,tp': axis tp is listed twice
// AXIS: moec: error: --rank-order 'tp,xp': 'xp' is not an axis (dp, tp, pp, ep); a rank order lists axes, the fastest first
// ONE: moec: warning: --rank-order has no effect without a --mesh
