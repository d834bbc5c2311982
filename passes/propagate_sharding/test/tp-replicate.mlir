// User annotations: a region's centre op annotated moe.tp_replicated stays whole on every tp
// rank (a remark, not a warning); tp-replicate annotates every region of the kinds it lists.
// RUN: moe-opt %inputs/gqa.mlir --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=tp=2 tp-replicate=experts}))' 2>&1 | FileCheck %s
// RUN: sed -e 's/moe.attention %12, %13, %7 {/moe.attention %12, %13, %7 {moe.tp_replicated, /' %inputs/gqa.mlir \
// RUN:   | moe-opt --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=tp=2}))' 2>&1 | FileCheck %s --check-prefix=IR
// RUN: not moe-opt %inputs/gqa.mlir --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=tp=2 tp-replicate=attention,experts}))' 2>&1 | FileCheck %s --check-prefix=NONE
// RUN: not moe-opt %inputs/gqa.mlir --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=tp=2 tp-replicate=heads}))' 2>&1 | FileCheck %s --check-prefix=KIND
// RUN: not moe-opt %inputs/gqa.mlir --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=dp=2 tp-replicate=experts}))' 2>&1 | FileCheck %s --check-prefix=NO-TP

// CHECK: remark: --moe-propagate-sharding: tp = 2 keeps @gqa_moe (experts) whole on every tp rank, as annotated (moe.tp_replicated)
// CHECK-NOT: warning
// CHECK: moe.param @self_attn_q_proj {{.*}} sharding #moe.sharding<[tp, _]>
// CHECK: moe.param @mlp_experts_gate_proj "{{[^"]*}}" : tensor<8x32x64xf32>{{$}}
// CHECK: moe.tp_exit
// CHECK-NOT: moe.tp_replicated
// CHECK: moe.dispatch
// CHECK-NOT: moe.tp_exit
// CHECK: moe.yield

// IR: remark: --moe-propagate-sharding: tp = 2 keeps @gqa_moe (attention) whole on every tp rank, as annotated (moe.tp_replicated)
// IR: moe.param @self_attn_q_proj "{{[^"]*}}" : tensor<64x64xf32>{{$}}
// IR: moe.param @mlp_experts_gate_proj {{.*}} sharding #moe.sharding<[_, tp, _]>
// IR-NOT: moe.tp_replicated

// NONE: error: --moe-propagate-sharding: tp = 2 splits attention heads {{.*}}this model has none to split (experts split over ep stay whole; the rest is annotated moe.tp_replicated)
// KIND: error: --moe-propagate-sharding: tp-replicate names 'heads'; expected a comma-separated list of attention, latent-attention, linear-attention, mlp, experts
// NO-TP: error: --moe-propagate-sharding: tp-replicate keeps tensor-parallel regions whole; it needs tp > 1, mesh dp=2
