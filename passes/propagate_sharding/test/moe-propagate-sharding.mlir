// RUN: moe-opt %inputs/tiny.mlir --pass-pipeline='builtin.module(moe.model(moe-build-training-step,moe-propagate-sharding{mesh=dp=2}))' | FileCheck %s
// RUN: moe-opt %inputs/tiny.mlir --pass-pipeline='builtin.module(moe.model(moe-build-training-step,moe-propagate-sharding{mesh=dp=1}))' | FileCheck %s --check-prefix=SINGLE
// RUN: moe-opt %inputs/tiny.mlir --moe-lora-training='seq-len=8 mesh=dp=4' | FileCheck %s --check-prefix=PIPELINE
// RUN: not moe-opt %inputs/tiny.mlir --pass-pipeline='builtin.module(moe.model(moe-build-training-step,moe-propagate-sharding{mesh=ep=2}))' 2>&1 | FileCheck %s --check-prefix=EP
// RUN: not moe-opt %inputs/tiny.mlir --pass-pipeline='builtin.module(moe.model(moe-build-training-step,moe-propagate-sharding{mesh=dp=x}))' 2>&1 | FileCheck %s --check-prefix=BAD
// RUN: not moe-opt %inputs/tiny.mlir --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=dp=2}))' 2>&1 | FileCheck %s --check-prefix=NOSTEP
// RUN: not moe-opt %inputs/tiny.mlir --pass-pipeline='builtin.module(moe.model(moe-build-training-step,moe-propagate-sharding{mesh=dp=2},moe-propagate-sharding{mesh=dp=2}))' 2>&1 | FileCheck %s --check-prefix=TWICE

// Data parallel: the model records the mesh; the loss seed becomes the step's fourth argument
// (this rank's share of the global loss), and each layer's gradients are summed over dp right
// after that layer's backward, in backward order.
// CHECK: moe.model @tiny attributes {{{.*}}mesh = "dp=2"
// CHECK: func.func @train_step(%{{.*}}: tensor<?xi64>, %{{.*}}: tensor<?xi64>, %{{.*}}: tensor<?xi64>, %[[WEIGHT:.*]]: tensor<f32>) -> tensor<f32>
// CHECK-NOT: moe.fill
// CHECK: moe.backward "moe.cross_entropy"({{.*}}) grads(%[[WEIGHT]])
// CHECK: moe.apply_layer @block_bwd[1]
// CHECK-NEXT: moe.all_reduce_grads {axis = "dp", layer = 1 : i64}
// CHECK-NEXT: moe.apply_layer @block_bwd[0]
// CHECK-NEXT: moe.all_reduce_grads {axis = "dp", layer = 0 : i64}
// The frozen embedding and head: no model-level bucket.
// CHECK-NEXT: return

// One rank: the mesh is recorded, the step is unchanged.
// SINGLE: moe.model @tiny attributes {{{.*}}mesh = "dp=1"
// SINGLE: func.func @train_step(%{{.*}}: tensor<?xi64>, %{{.*}}: tensor<?xi64>, %{{.*}}: tensor<?xi64>) -> tensor<f32>
// SINGLE: moe.fill 1.000000e+00 : tensor<f32>
// SINGLE-NOT: moe.all_reduce_grads

// The pipeline runs the pass after the training step when given a mesh.
// PIPELINE: mesh = "dp=4"
// PIPELINE: moe.all_reduce_grads {axis = "dp", layer = 1 : i64}

// EP: error: --moe-propagate-sharding: mesh 'ep=2': ep > 1 is not supported yet (only dp)
// BAD: error: --moe-propagate-sharding: mesh 'dp=x': size of dp must be a whole number >= 1, not 'x'
// NOSTEP: error: --moe-propagate-sharding: no func.func @train_step; run --moe-build-training-step first
// TWICE: error: 'func.func' op must take (ids, positions, labels) before sharding; it takes 4 arguments (is the model sharded already?)
