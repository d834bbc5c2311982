// RUN: moe-opt %inputs/tiny.mlir --moe-lora-training='seq-len=8 mesh=dp=2,ep=2 token-blocks=2 overlap=true' | FileCheck %s
// RUN: moe-opt %inputs/tiny.mlir --pass-pipeline='builtin.module(moe.model(moe-schedule-overlap))' 2>&1 | FileCheck %s --check-prefix=NONE
// RUN: not moe-opt %inputs/tiny.mlir --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=ep=2},moe-schedule-overlap,moe-schedule-overlap))' 2>&1 | FileCheck %s --check-prefix=TWICE

// The expert exchange and the gradient sums on stream 1; the compute stays on stream 0.
// CHECK: moe.model @tiny attributes {{{.*}}streams = 2 : i64
// CHECK: moe.ep_route {{.*}}moe.stream = 1 : i64
// CHECK: moe.ep_send {{.*}}moe.stream = 1 : i64
// CHECK: moe.dispatch
// CHECK-NOT: moe.stream
// CHECK-SAME: num_experts = 2 : i64}
// CHECK: moe.ep_return {{.*}}moe.stream = 1 : i64
// CHECK: moe.all_reduce_grads {{.*}}moe.stream = 1 : i64

// NONE: warning: --moe-schedule-overlap: nothing to overlap (no expert exchange or gradient sums: one rank, or a mesh of tp/pp only); the plan keeps one stream
// NONE-NOT: streams =

// TWICE: error: --moe-schedule-overlap: the model is scheduled already (streams = 2 : i64)
