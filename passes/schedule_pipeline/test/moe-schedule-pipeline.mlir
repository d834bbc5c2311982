// RUN: moe-opt %inputs/tiny.mlir --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=dp=2,pp=2},moe-build-training-step,moe-sync-gradients,moe-schedule-pipeline{micro-batches=2}))' | FileCheck %s
// RUN: moe-opt %inputs/tiny.mlir --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=dp=2},moe-build-training-step,moe-sync-gradients,moe-schedule-pipeline))' | FileCheck %s --check-prefix=NOPIPE
// RUN: not moe-opt %inputs/tiny.mlir --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=pp=4},moe-build-training-step,moe-sync-gradients,moe-schedule-pipeline))' 2>&1 | FileCheck %s --check-prefix=SHORT
// RUN: not moe-opt %inputs/tiny.mlir --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=pp=2},moe-build-training-step,moe-schedule-pipeline))' 2>&1 | FileCheck %s --check-prefix=NOSYNC

// Two stages, two micro-batches, 1F1B. Stage 0 (layer 0, the embedding): it fills the pipeline
// with micro-batch 0, then sends micro-batch 1's activation while it receives micro-batch 0's
// gradient, in one exchange (stage 1 sends that gradient while it receives the activation:
// neither waits for the other to receive first). Gradients are summed over dp once, after
// the last backward.
// CHECK: moe.model @tiny attributes {{.*}}pipeline = {micro_batches = 2 : i64, stages = 2 : i64}
// CHECK-LABEL: func.func @train_step_stage0(
// CHECK-SAME: %[[IDS:[^:]*]]: tensor<?xi64>, %{{[^:]*}}: tensor<?xi64>, %{{[^:]*}}: tensor<?xi64>, %{{[^:]*}}: tensor<2xf32>) attributes {pipeline_stage = 0 : i64}
// CHECK: moe.microbatch %[[IDS]] {count = 2 : i64, index = 0 : i64} : tensor<?xi64> -> tensor<?xi64>
// CHECK: moe.embedding
// CHECK: %[[F0:.*]]:8 = moe.apply_layer @block_fwd[0]
// CHECK-NEXT: moe.stage_exchange send(%[[F0]]#0 : tensor<?x16xf32>) {peer = 1 : i64}
// CHECK: moe.microbatch %[[IDS]] {count = 2 : i64, index = 1 : i64}
// CHECK: %[[F1:.*]]:8 = moe.apply_layer @block_fwd[0]
// CHECK-NEXT: %[[G0:.*]] = moe.stage_exchange send(%[[F1]]#0 : tensor<?x16xf32>) {backward, peer = 1 : i64} -> tensor<?x16xf32>
// CHECK-NEXT: moe.apply_layer @block_bwd[0] ({{.*}}, %[[G0]]) {moe.pipeline_backward}
// CHECK-NEXT: %[[G1:.*]] = moe.stage_exchange {backward, peer = 1 : i64} -> tensor<?x16xf32>
// CHECK-NEXT: moe.apply_layer @block_bwd[0] ({{.*}}, %[[G1]]) {moe.pipeline_backward}
// CHECK-NEXT: moe.all_reduce_grads {axis = "dp+ep", layer = 0 : i64, moe.pipeline_backward}
// CHECK-NEXT: return
//
// Stage 1 (layer 1, the head and the loss): each micro-batch's backward right after its
// forward, seeded by that micro-batch's loss weight; it returns both losses.
// CHECK-LABEL: func.func @train_step_stage1(
// CHECK-SAME: %[[W:[^:]*]]: tensor<2xf32>) -> (tensor<f32>, tensor<f32>) attributes {pipeline_stage = 1 : i64}
// CHECK-NEXT: %[[A0:.*]] = moe.stage_exchange {peer = 0 : i64} -> tensor<?x16xf32>
// CHECK: moe.apply_layer @block_fwd[1] (%[[A0]],
// CHECK: %[[L0:.*]] = moe.cross_entropy
// CHECK: %[[W0:.*]] = moe.microbatch %[[W]] {count = 2 : i64, index = 0 : i64} : tensor<2xf32> -> tensor<f32>
// CHECK: moe.backward "moe.cross_entropy"({{.*}}) grads(%[[W0]])
// CHECK: %[[D0:.*]] = moe.apply_layer @block_bwd[1]
// CHECK-NEXT: %[[A1:.*]] = moe.stage_exchange send(%[[D0]] : tensor<?x16xf32>) {backward, peer = 0 : i64} -> tensor<?x16xf32>
// CHECK: moe.apply_layer @block_fwd[1] (%[[A1]],
// CHECK: %[[L1:.*]] = moe.cross_entropy
// CHECK: %[[D1:.*]] = moe.apply_layer @block_bwd[1]
// CHECK-NEXT: moe.stage_exchange send(%[[D1]] : tensor<?x16xf32>) {backward, peer = 0 : i64}
// CHECK-NEXT: moe.all_reduce_grads {axis = "dp+ep", layer = 1 : i64, moe.pipeline_backward}
// CHECK-NEXT: return %[[L0]], %[[L1]] : tensor<f32>, tensor<f32>
// CHECK-NOT: func.func @train_step(

// Without pp the step stays one function.
// NOPIPE: func.func @train_step(
// NOPIPE-NOT: pipeline_stage

// SHORT: error: --moe-schedule-pipeline: pp = 4 needs at least 4 layers, the model has 2
// NOSYNC: error: --moe-schedule-pipeline: needs @train_step with its loss_weight argument; run --moe-build-training-step and --moe-sync-gradients first
