//===- compile_overlap.mlir - moec compile --overlap ----------------------===//
//
// The golden qwen3_moe model on ep=2 with --overlap (two token blocks implied): the expert
// exchange on stream 1, the compute on stream 0, an event after each step the other stream
// needs and a wait before the step that needs it.
//
// RUN: moec compile %inputs/golden_qwen3_moe.json --lora-targets q_proj --lora-rank 4 \
// RUN:   --seq-len 96 --micro-batch 1 --mesh ep=2 --overlap --emit=plan-text | FileCheck %s
// RUN: moec compile %inputs/golden_qwen3_moe.json --lora-targets q_proj --lora-rank 4 \
// RUN:   --seq-len 96 --micro-batch 1 --mesh dp=2 --overlap --emit=plan-text | FileCheck %s --check-prefix=DP
// RUN: moec compile %inputs/golden_qwen3_moe.json --lora-targets q_proj --seq-len 96 --overlap \
// RUN:   -o %t.moeplan 2>&1 | FileCheck %s --check-prefix=ONE

// CHECK: rank 0 streams=2 events=
// Block 0: its route and sends on stream 1 after the token blocks are made (one event each,
// recorded right after the step the other stream needs).
// CHECK: fwd L0 s0 token_blocks
// CHECK-NEXT: fwd L0 s0 token_blocks
// CHECK-NEXT: fwd L0 s0 record e[[IDX:[0-9]+]]
// CHECK: fwd L0 s1 wait e[[IDX]]
// CHECK-NEXT: fwd L0 s1 expert_route
// CHECK-NEXT: fwd L0 s1 expert_send
// CHECK-NEXT: fwd L0 s1 record e[[SENT0:[0-9]+]]
// CHECK: fwd L0 s0 wait e[[SENT0]]
// CHECK-NEXT: fwd L0 s0 dispatch
// CHECK-NEXT: fwd L0 s0 expert_mlp
// Block 1's route and sends are issued while block 0's experts run, before block 0's return.
// CHECK: fwd L0 s0 combine
// CHECK-NEXT: fwd L0 s0 record e[[DONE0:[0-9]+]]
// CHECK-NEXT: fwd L0 s1 expert_route
// CHECK-NEXT: fwd L0 s1 expert_send
// CHECK-NEXT: fwd L0 s1 record e[[SENT1:[0-9]+]]
// CHECK: fwd L0 s1 wait e[[DONE0]]
// CHECK-NEXT: fwd L0 s1 expert_return
// CHECK: fwd L0 s0 wait e[[SENT1]]
// CHECK-NEXT: fwd L0 s0 dispatch
// CHECK: fwd L0 s1 expert_return
// CHECK: fwd L0 s0 wait
// CHECK-NEXT: fwd L0 s0 wait
// CHECK-NEXT: fwd L0 s0 concat_tokens
// Layer 1's gradient sum on stream 1, after the accumulations it waits for, while layer 0's
// backward goes on on stream 0.
// CHECK: bwd L1 s1 wait e{{[0-9]+}} // "moe.all_reduce_grads"
// CHECK: bwd L1 s1 all_reduce
// CHECK-NEXT: bwd L0 s0 token_blocks

// dp only: nothing in a layer to split, the gradient sums alone go to stream 1.
// DP: rank 0 streams=2
// DP-NOT: token_blocks
// DP: bwd L1 s1 all_reduce

// ONE: moec: warning: --overlap has no effect without a --mesh
