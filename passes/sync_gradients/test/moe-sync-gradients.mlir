// RUN: moe-opt %inputs/tiny.mlir --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=dp=2},moe-build-training-step,moe-sync-gradients))' | FileCheck %s
// RUN: moe-opt %inputs/tiny.mlir --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=dp=1},moe-build-training-step,moe-sync-gradients))' | FileCheck %s --check-prefix=SINGLE
// RUN: moe-opt %inputs/tiny.mlir --pass-pipeline='builtin.module(moe.model(moe-build-training-step,moe-sync-gradients))' | FileCheck %s --check-prefix=SINGLE
// RUN: moe-opt %inputs/tiny_trainable_experts.mlir --pass-pipeline='builtin.module(moe.model(moe-build-training-step,moe-sync-gradients))' | FileCheck %s --check-prefix=EXPERTS
// RUN: not moe-opt %inputs/tiny.mlir --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=dp=2},moe-sync-gradients))' 2>&1 | FileCheck %s --check-prefix=NOSTEP
// RUN: not moe-opt %inputs/tiny.mlir --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=dp=2},moe-build-training-step,moe-sync-gradients,moe-sync-gradients))' 2>&1 | FileCheck %s --check-prefix=TWICE

// Data parallel: the loss seed becomes the step's fourth argument (this rank's share of the
// global loss), and each layer's gradients are summed over the ranks right after that
// layer's backward, in backward order.
// CHECK: func.func @train_step(%{{.*}}: tensor<?xi64>, %{{.*}}: tensor<?xi64>, %{{.*}}: tensor<?xi64>, %[[WEIGHT:.*]]: tensor<f32>) -> tensor<f32>
// CHECK-NOT: moe.fill
// CHECK: moe.backward "moe.cross_entropy"({{.*}}) grads(%[[WEIGHT]])
// CHECK: moe.apply_layer @block_bwd[1]
// CHECK-NEXT: moe.all_reduce_grads {axis = "dp+ep", layer = 1 : i64}
// CHECK-NEXT: moe.apply_layer @block_bwd[0]
// CHECK-NEXT: moe.all_reduce_grads {axis = "dp+ep", layer = 0 : i64}
// The frozen embedding and head: no model-level bucket.
// CHECK-NEXT: return

// One rank: the step is unchanged.
// SINGLE: func.func @train_step(%{{.*}}: tensor<?xi64>, %{{.*}}: tensor<?xi64>, %{{.*}}: tensor<?xi64>) -> tensor<f32>
// SINGLE: moe.fill 1.000000e+00 : tensor<f32>
// SINGLE-NOT: moe.all_reduce_grads

// Trainable parameters split over ep (expert adapters; made by hand here) are summed over dp
// only, in their own bucket.
// EXPERTS: moe.apply_layer @block_bwd[1]
// EXPERTS-NEXT: moe.all_reduce_grads {axis = "dp+ep", layer = 1 : i64}
// EXPERTS-NEXT: moe.all_reduce_grads {axis = "dp", experts, layer = 1 : i64}

// NOSTEP: error: --moe-sync-gradients: no func.func @train_step; run --moe-build-training-step first
// TWICE: error: 'func.func' op must take (ids, positions, labels) before --moe-sync-gradients; it takes 4 arguments (did the pass run already?)
