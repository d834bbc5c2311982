//===- interrupted.mlir - Ctrl-C checkpoints, --resume finishes -----------===//
//
// A run of a million steps (logging only step 1) gets SIGINT about a second after its first
// step (Inputs/interrupt.sh waits for the first progress line, so the signal cannot come before
// moe-run handles it, nor after it has finished; `timeout` bounds it). It must stop with status
// 130 at some step N, saying so, with a checkpoint of step N, N metrics lines and no adapter;
// --resume to N + 2 then continues at step N + 1, finishes and writes the adapter.
//
// RUN: rm -rf %t && mkdir -p %t
// RUN: moec compile %root/models/tiny-qwen3-moe/config.json --seq-len 32 --micro-batch 2 \
// RUN:     --lora-rank 4 -o %t/plan.moeplan
// RUN: moe-run init %root/models/tiny-qwen3-moe/config.json --plan %t/plan.moeplan -o %t/model
// RUN: sh %inputs/interrupt.sh %t/interrupted.log moe-run train --plan %t/plan.moeplan \
// RUN:     --model %t/model --data %inputs/train.jsonl --out %t/run --steps 1000000 --log-every 1000000 > %t/status
// RUN: { cat %t/status %t/interrupted.log; \
// RUN:   grep -ao '"step":"[0-9]*"' %t/run/checkpoint.safetensors; \
// RUN:   echo "metrics lines: $(wc -l < %t/run/metrics.jsonl)"; \
// RUN:   ls %t/run; } | FileCheck %s --check-prefix=INTERRUPTED
//
// RUN: n=$(sed -n 's/^moe-run: interrupted at step \([0-9][0-9]*\);.*/\1/p' %t/interrupted.log); \
// RUN: { cat %t/interrupted.log; \
// RUN:   moe-run train --plan %t/plan.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:       --out %t/run --steps $((n + 2)) --log-every 1 --resume 2>&1; \
// RUN:   python3 %inputs/check_metrics.py %t/run/metrics.jsonl $((n + 2)) 64 2; \
// RUN:   ls %t/run; } | FileCheck %s --check-prefix=RESUMED
//
//===----------------------------------------------------------------------===//

// `timeout` forwards the SIGINT to moe-run and to its process group: moe-run gets it twice and
// must take the copies as one request (a clean-clone CI run once died of the second copy).
// INTERRUPTED:      exit status 130
// INTERRUPTED-NEXT: step 1/1000000  loss
// INTERRUPTED-NEXT: moe-run: interrupted at step [[#N:]]; checkpoint in {{.*}}run/checkpoint.safetensors (continue with --resume)
// INTERRUPTED-NEXT: "step":"[[#N]]"
// INTERRUPTED-NEXT: metrics lines: [[#N]]
// INTERRUPTED-NEXT: checkpoint.safetensors
// INTERRUPTED-NEXT: metrics.jsonl
// INTERRUPTED-NOT:  adapter

// RESUMED:      moe-run: interrupted at step [[#N:]];
// RESUMED:      moe-run: resumed from {{.*}}run/checkpoint.safetensors at step [[#N]]{{$}}
// RESUMED-NEXT: step [[#N+1]]/[[#N+2]]  loss
// RESUMED-NEXT: step [[#N+2]]/[[#N+2]]  loss
// RESUMED-NEXT: moe-run: trained [[#N+2]] steps
// RESUMED:      [[#N+2]] steps, keys expert_load grad_norm loss lr step tokens_per_s
// RESUMED:      adapter
// RESUMED-NEXT: checkpoint.safetensors
// RESUMED-NEXT: metrics.jsonl
