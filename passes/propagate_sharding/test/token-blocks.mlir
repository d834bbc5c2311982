// RUN: moe-opt %inputs/tiny.mlir --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=ep=2 token-blocks=2}))' | FileCheck %s
// RUN: moe-opt %inputs/tiny.mlir --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=ep=2 token-blocks=2},moe-build-training-step))' | FileCheck %s --check-prefix=STEP
// RUN: not moe-opt %inputs/tiny.mlir --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=dp=2 token-blocks=2}))' 2>&1 | FileCheck %s --check-prefix=NOEP
// RUN: not moe-opt %inputs/tiny.mlir --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=ep=2 token-blocks=0}))' 2>&1 | FileCheck %s --check-prefix=ZERO

// Two token blocks: the hidden state, the expert indices and the router weights split into
// blocks, each block with its own route, sends, local experts and return, the returned rows
// joined. In the order the overlap schedule issues them: block 1's route and sends before
// block 0's return.
// CHECK: %[[W:.*]], %[[IDX:.*]] = moe.router
// CHECK: %[[X:.*]]:2 = moe.token_blocks %{{.*}} : tensor<?x16xf32> -> tensor<?x16xf32>, tensor<?x16xf32>
// CHECK-NEXT: %[[I:.*]]:2 = moe.token_blocks %[[IDX]] : tensor<?x2xi32> -> tensor<?x2xi32>, tensor<?x2xi32>
// CHECK-NEXT: %[[WB:.*]]:2 = moe.token_blocks %[[W]] : tensor<?x2xf32> -> tensor<?x2xf32>, tensor<?x2xf32>
// CHECK-NEXT: %[[L0:.*]], %[[LAY0:.*]] = moe.ep_route %[[I]]#0
// CHECK-NEXT: %[[S0:.*]] = moe.ep_send %[[X]]#0, %[[LAY0]]
// CHECK-NEXT: %[[SW0:.*]] = moe.ep_send %[[WB]]#0, %[[LAY0]]
// CHECK-NEXT: %[[T0:.*]], %[[C0:.*]] = moe.dispatch %[[S0]], %[[L0]] {num_experts = 2 : i64}
// CHECK-NEXT: %[[E0:.*]] = moe.expert_mlp %[[T0]], %[[C0]]
// CHECK-NEXT: %[[P0:.*]] = moe.combine %[[E0]], %[[L0]], %[[SW0]]
// CHECK-NEXT: %[[L1:.*]], %[[LAY1:.*]] = moe.ep_route %[[I]]#1
// CHECK-NEXT: %[[S1:.*]] = moe.ep_send %[[X]]#1, %[[LAY1]]
// CHECK-NEXT: %[[SW1:.*]] = moe.ep_send %[[WB]]#1, %[[LAY1]]
// CHECK-NEXT: %[[R0:.*]] = moe.ep_return %[[P0]], %[[LAY0]]
// CHECK-NEXT: %[[T1:.*]], %[[C1:.*]] = moe.dispatch %[[S1]], %[[L1]]
// CHECK-NEXT: %[[E1:.*]] = moe.expert_mlp %[[T1]], %[[C1]]
// CHECK-NEXT: %[[P1:.*]] = moe.combine %[[E1]], %[[L1]], %[[SW1]]
// CHECK-NEXT: %[[R1:.*]] = moe.ep_return %[[P1]], %[[LAY1]]
// CHECK-NEXT: %[[Y:.*]] = moe.concat_tokens %[[R0]], %[[R1]] : tensor<?x16xf32>, tensor<?x16xf32> -> tensor<?x16xf32>
// CHECK-NEXT: moe.add %{{.*}}, %[[Y]]
// CHECK-NOT: moe.ep_route

// The backward, built in reverse: the output gradient split into blocks, block 1's gradient
// sent and differentiated first, block 0's sent while block 1's experts run, the input rows'
// and router weights' gradients returned and joined.
// STEP-LABEL: moe.layer @block_bwd
// STEP: %[[G:.*]]:2 = moe.token_blocks
// STEP-NEXT: moe.ep_send %[[G]]#1
// STEP: moe.backward "moe.expert_mlp"
// STEP: moe.ep_send %[[G]]#0
// STEP: %[[DX1:.*]] = moe.ep_return
// STEP: %[[DW1:.*]] = moe.ep_return
// STEP: moe.backward "moe.expert_mlp"
// STEP: %[[DX0:.*]] = moe.ep_return
// STEP: %[[DW0:.*]] = moe.ep_return
// STEP-DAG: moe.concat_tokens %[[DX0]], %[[DX1]]
// STEP-DAG: moe.concat_tokens %[[DW0]], %[[DW1]]

// NOEP: error: --moe-propagate-sharding: token-blocks must be 1, or more with ep > 1 (it splits the expert exchange), got 2 on mesh dp=2
// ZERO: token-blocks must be 1, or more with ep > 1 (it splits the expert exchange), got 0
