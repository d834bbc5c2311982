//===- interrupted_mesh.mlir - Ctrl-C stops every rank at one step --------===//
//
// interrupted.mlir for a dp=2 plan run as two CPU thread ranks (--nproc 2): the interrupt
// reaches the ranks at different points of a step, but they agree at the next step boundary
// and stop together (a rank that stopped alone would leave the other waiting in a collective);
// rank 0 writes the checkpoint of step N, and --resume (again two ranks) finishes at N + 2.
//
// RUN: rm -rf %t && mkdir -p %t
// RUN: moec compile %root/models/tiny-qwen3-moe/config.json --seq-len 32 --micro-batch 1 \
// RUN:     --lora-rank 4 --mesh dp=2 -o %t/plan.moeplan
// RUN: moe-run init %root/models/tiny-qwen3-moe/config.json -o %t/model
// RUN: sh %inputs/interrupt.sh %t/interrupted.log moe-run train --plan %t/plan.moeplan --nproc 2 \
// RUN:     --model %t/model --data %inputs/train.jsonl --out %t/run --steps 1000000 --log-every 1000000 > %t/status
// RUN: { cat %t/status %t/interrupted.log; \
// RUN:   grep -ao '"step":"[0-9]*"' %t/run/checkpoint.safetensors; \
// RUN:   echo "metrics lines: $(wc -l < %t/run/metrics.jsonl)"; } | FileCheck %s --check-prefix=INTERRUPTED
//
// RUN: n=$(sed -n 's/^moe-run: interrupted at step \([0-9][0-9]*\);.*/\1/p' %t/interrupted.log); \
// RUN: { cat %t/interrupted.log; \
// RUN:   moe-run train --plan %t/plan.moeplan --nproc 2 --model %t/model --data %inputs/train.jsonl \
// RUN:       --out %t/run --steps $((n + 2)) --log-every 1 --resume 2>&1; \
// RUN:   python3 %inputs/check_metrics.py %t/run/metrics.jsonl $((n + 2)) 64 2; } \
// RUN:   | FileCheck %s --check-prefix=RESUMED
//
//===----------------------------------------------------------------------===//

// One line per event (rank 0's), whatever the number of ranks.
// INTERRUPTED:      exit status 130
// INTERRUPTED-NEXT: step 1/1000000  loss
// INTERRUPTED-NEXT: moe-run: interrupted at step [[#N:]]; checkpoint in {{.*}}run/checkpoint.safetensors (continue with --resume)
// INTERRUPTED-NEXT: "step":"[[#N]]"
// INTERRUPTED-NEXT: metrics lines: [[#N]]

// RESUMED:      moe-run: interrupted at step [[#N:]];
// RESUMED:      moe-run: resumed from {{.*}}run/checkpoint.safetensors at step [[#N]]
// RESUMED-NEXT: step [[#N+1]]/[[#N+2]]
// RESUMED:      step [[#N+2]]/[[#N+2]]
// RESUMED:      moe-run: trained [[#N+2]] steps
// RESUMED:      [[#N+2]] steps, keys
