//===- train_expert_capacity.mlir - bounded room for the expert exchange --===//
//
// Expert parallel keeps room for the tokens other ranks send: by default every token of every
// rank (nothing overflows, but the expert-side rows are ep times what balanced routing fills).
// --ep-capacity-factor F keeps F times what uniform routing sends a rank instead. The tiny
// Qwen3-MoE (8 experts, top-2) over ep = 4 with 32 tokens per rank: a token has an expert on
// a given rank with probability 1 - C(6,2)/C(8,2) = 13/28, so F = 1.5 keeps
// ceil(1.5 x 4 x 32 x 13/28) = 90 received tokens (not 128) and 1.5 x 32 x 2 = 96 expert
// copies (not 128 x 2). Training on that room equals one rank on the four ranks' sequences.
//
// RUN: rm -rf %t && mkdir -p %t
// RUN: moec compile %root/models/tiny-qwen3-moe/config.json --seq-len 32 --micro-batch 1 --lora-rank 4 \
// RUN:     --mesh ep=4 --ep-capacity-factor 1.5 --emit=plan-text | FileCheck %s --check-prefix=ROOM
// RUN: moec compile %root/models/tiny-qwen3-moe/config.json --seq-len 32 --micro-batch 1 --lora-rank 4 \
// RUN:     --mesh ep=4 --emit=plan-text | FileCheck %s --check-prefix=WHOLE
// RUN: moec compile %root/models/tiny-qwen3-moe/config.json --seq-len 32 --micro-batch 1 --lora-rank 4 \
// RUN:     --mesh ep=4 --ep-capacity-factor 1.5 -o %t/bounded.moeplan
// RUN: moec compile %root/models/tiny-qwen3-moe/config.json --seq-len 32 --micro-batch 4 --lora-rank 4 \
// RUN:     -o %t/single.moeplan
// RUN: moe-run train --plan %t/bounded.moeplan --random-weights 3 --data %inputs/train.jsonl \
// RUN:     --out %t/bounded --steps 3 --nproc 4 2>/dev/null
// RUN: moe-run train --plan %t/single.moeplan --random-weights 3 --data %inputs/train.jsonl \
// RUN:     --out %t/single --steps 3 2>/dev/null
// RUN: python3 %inputs/same_losses.py %t/bounded/metrics.jsonl %t/single/metrics.jsonl 1e-5 \
// RUN:   | FileCheck %s --check-prefix=SAME
//
// A placement that replicates experts (three of the eight on each of the four ranks, each
// expert on one or two): a rank holds more experts, so more tokens may have one there. The
// room follows the placement: 1 - C(5,2)/C(8,2) = 9/14, ceil(1.5 x 4 x 32 x 9/14) = 124
// received tokens; still 96 copies (every copy goes to one replica). It trains like one rank.
// The report's exchange bytes follow the placement too: a copy whose expert is on the sending
// rank stays, another goes to one of its expert's replicas, token t's to replica t mod 2. A
// token goes to a rank unless neither of its two experts sends it there: 1 - C(8 - m, 2)/C(8, 2)
// with m the experts that do. Rank 0 ({0,1,2}), even t: 3 and 4 to rank 1, 5 and 6 to rank 2,
// 7 to rank 3: (26 + 26 + 14)/56; odd t: 3 | 4, 5 | 6, 7: 66/56 again. Rank 1: 66/56 and (0, 1,
// 5 to one rank each, 0, 6, 7 to rank 3) 64/56; rank 2 the same mirrored; rank 3 66/56 twice:
// 524/448 other ranks a token (ExpertPlacementTest). Each forward return sends 32 tokens x 96
// f32 x 524/448 = 14,373 bytes, two routes 28,746 (consecutive experts, m = 2 for each of three
// ranks: 12,288 x 78/56 a route, 34,230).
// RUN: echo '{"layers": {"0": [[0,1,2],[2,3,4],[4,5,6],[6,7,0]], "1": [[0,1,2],[2,3,4],[4,5,6],[6,7,0]]}}' \
// RUN:   > %t/replicated.json
// RUN: moec compile %root/models/tiny-qwen3-moe/config.json --seq-len 32 --micro-batch 1 --lora-rank 4 \
// RUN:     --mesh ep=4 --ep-capacity-factor 1.5 --expert-placement %t/replicated.json --emit=plan-text \
// RUN:   | FileCheck %s --check-prefix=REPLICATED
// RUN: moec compile %root/models/tiny-qwen3-moe/config.json --seq-len 32 --micro-batch 1 --lora-rank 4 \
// RUN:     --mesh ep=4 --ep-capacity-factor 1.5 --expert-placement %t/replicated.json --emit=report \
// RUN:   | FileCheck %s --check-prefix=REPLICATED-BYTES
// RUN: moec compile %root/models/tiny-qwen3-moe/config.json --seq-len 32 --micro-batch 1 --lora-rank 4 \
// RUN:     --mesh ep=4 --ep-capacity-factor 1.5 --emit=report | FileCheck %s --check-prefix=CONSECUTIVE-BYTES
// RUN: moec compile %root/models/tiny-qwen3-moe/config.json --seq-len 32 --micro-batch 1 --lora-rank 4 \
// RUN:     --mesh ep=4 --ep-capacity-factor 1.5 --expert-placement %t/replicated.json -o %t/replicated.moeplan
// RUN: moe-run train --plan %t/replicated.moeplan --random-weights 3 --data %inputs/train.jsonl \
// RUN:     --out %t/replicated --steps 3 --nproc 4 2>/dev/null
// RUN: python3 %inputs/same_losses.py %t/replicated/metrics.jsonl %t/single/metrics.jsonl 1e-5 \
// RUN:   | FileCheck %s --check-prefix=SAME
//
// Routing more uneven than the room: top-1 of 8 experts, 2 tokens per rank over ep = 2 (the
// routing train_expert_route_empty.mlir shows, where one rank's experts get every token). At
// F = 1 the room is ceil(2 x 2 x 1/2) = 2 tokens and 2 copies; the first MoE layer sends one
// rank 3 (1.5 x its room: about 1.75 would hold it). Both ranks stop at that route, before
// anything is sent, naming it, the counts and the factor that would do.
// RUN: moec compile %inputs/tiny_qwen3_moe_top1.json --seq-len 2 --micro-batch 1 --lora-rank 4 \
// RUN:     --mesh ep=2 --ep-capacity-factor 1 -o %t/tight.moeplan
// RUN: not moe-run train --plan %t/tight.moeplan --random-weights 1 --data %inputs/train.jsonl \
// RUN:     --out %t/tight --steps 2 --nproc 2 2>&1 | FileCheck %s --check-prefix=OVER
// At the factor the message names, the same steps train like one rank.
// RUN: moec compile %inputs/tiny_qwen3_moe_top1.json --seq-len 2 --micro-batch 1 --lora-rank 4 \
// RUN:     --mesh ep=2 --ep-capacity-factor 1.75 -o %t/enough.moeplan
// RUN: moec compile %inputs/tiny_qwen3_moe_top1.json --seq-len 2 --micro-batch 2 --lora-rank 4 \
// RUN:     -o %t/top1.moeplan
// RUN: moe-run train --plan %t/enough.moeplan --random-weights 1 --data %inputs/train.jsonl \
// RUN:     --out %t/enough --steps 2 --nproc 2 2>/dev/null
// RUN: moe-run train --plan %t/top1.moeplan --random-weights 1 --data %inputs/train.jsonl \
// RUN:     --out %t/top1 --steps 2 2>/dev/null
// RUN: python3 %inputs/same_losses.py %t/enough/metrics.jsonl %t/top1/metrics.jsonl 1e-5 \
// RUN:   | FileCheck %s --check-prefix=ENOUGH
//
// Bad flags, and a layer whose exchange sends every token to every rank (fixed room).
// RUN: not moec compile %root/models/tiny-qwen3-moe/config.json --mesh ep=2 --ep-capacity-factor 0.5 \
// RUN:     -o %t/x.moeplan 2>&1 | FileCheck %s --check-prefix=BELOW
// RUN: not moec compile %root/models/tiny-qwen3-moe/config.json --ep-capacity-factor 2 -o %t/x.moeplan 2>&1 \
// RUN:   | FileCheck %s --check-prefix=NOEP
// RUN: not moec compile %root/models/tiny-qwen3-moe/config.json --mesh ep=2 --ep-exchange all \
// RUN:     --ep-capacity-factor 2 -o %t/x.moeplan 2>&1 | FileCheck %s --check-prefix=ALL
// RUN: moec compile %root/models/qwen3-30b-a3b/config.json --seq-len 64 --mesh ep=2 --ep-capacity-factor 2 \
// RUN:     --emit=mlir -o %t/auto.mlir 2>&1 | FileCheck %s --check-prefix=FIXED

// ROOM: expert_route g0 {{.*}} capacity_factor=1.5
// ROOM: i32 [90,2] {{.*}}"layer0.ep_route.{{[0-9]+}}#0" rows_of %[[R:[0-9]+]]
// ROOM: f32 [90,96] {{.*}}"layer0.ep_send.{{[0-9]+}}" rows_of %[[R]]
// ROOM: f32 [96,96] {{.*}}"layer0.dispatch.{{[0-9]+}}#0" copies_of %[[R]]
// REPLICATED: i32 [124,2] {{.*}}"layer0.ep_route.{{[0-9]+}}#0" rows_of %[[R:[0-9]+]]
// REPLICATED: f32 [96,96] {{.*}}"layer0.dispatch.{{[0-9]+}}#0" copies_of %[[R]]
// REPLICATED-BYTES: expert_return ep forward 2 28,746
// CONSECUTIVE-BYTES: expert_return ep forward 2 34,230
// WHOLE: i32 [128,2] {{.*}}"layer0.ep_route.{{[0-9]+}}#0" rows_of %[[R:[0-9]+]]
// WHOLE: f32 [256,96] {{.*}}"layer0.dispatch.{{[0-9]+}}#0" copies_of %[[R]]
// SAME: 3 steps agree within 1e-05
// ENOUGH: 2 steps agree within 1e-05
// OVER: moe-run: error: training step 1: step {{[0-9]+}} (expert_route) {{.*}}expert route 'layer0.ep_route.{{[0-9]+}}#0': ep rank {{[01]}} of 2 would receive 3 tokens and 3 expert copies, and the plan has room for 2 and 2 (capacity_factor 1: that many times what uniform routing sends a rank); the routing is more uneven: this step needs about --ep-capacity-factor 1.75 (or 0: room for every token)
// OVER: moe-run: error: training step 1: {{.*}}ep rank {{[01]}} of 2 would receive 3 tokens
// BELOW: moec: error: --ep-capacity-factor bounds the expert exchange's room: it needs ep > 1 in --mesh and a factor of at least 1 (0: no bound), got 0.5 with --mesh 'ep=2'
// NOEP: moec: error: --ep-capacity-factor {{.*}}got 2 with --mesh ''
// ALL: moec: error: --ep-capacity-factor bounds the routed exchange; --ep-exchange all sends every token to every rank
// FIXED: moec: warning: --moe-propagate-sharding: ep-capacity-factor does not bound @{{[a-z_]+}}'s expert exchange: ep-exchange auto sends every token to every rank there
