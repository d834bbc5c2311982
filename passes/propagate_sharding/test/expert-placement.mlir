// Expert placement: the model's expert_placement attribute (moec --expert-placement or
// --expert-load) says which experts each ep rank holds, per layer; the pass checks it and
// the route's location says the experts are placed (plan emission reads the tables).
//
// RUN: sed 's/^moe.model @tiny {/moe.model @tiny attributes {expert_placement = {"0" = array<i64: 3, 0, 2, 1>, "1" = array<i64: 1, 2, 3, 0>}} {/' %inputs/tiny.mlir \
// RUN:   | moe-opt --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=ep=2}))' --mlir-print-debuginfo | FileCheck %s
// RUN: sed 's/^moe.model @tiny {/moe.model @tiny attributes {expert_placement = {"0" = array<i64: 3, 0, 2, 1>}} {/' %inputs/tiny.mlir \
// RUN:   | not moe-opt --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=ep=2}))' 2>&1 | FileCheck %s --check-prefix=PARTIAL
// RUN: sed 's/^moe.model @tiny {/moe.model @tiny attributes {expert_placement = {"0" = array<i64: 3, 0, 3, 1>, "1" = array<i64: 1, 2, 3, 0>}} {/' %inputs/tiny.mlir \
// RUN:   | not moe-opt --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=ep=2}))' 2>&1 | FileCheck %s --check-prefix=TWICE
// RUN: sed 's/^moe.model @tiny {/moe.model @tiny attributes {expert_placement = {"0" = array<i64: 3, 0, 2>, "1" = array<i64: 1, 2, 3, 0>}} {/' %inputs/tiny.mlir \
// RUN:   | not moe-opt --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=ep=2}))' 2>&1 | FileCheck %s --check-prefix=SHORT
// RUN: sed 's/^moe.model @tiny {/moe.model @tiny attributes {expert_placement = {"0" = array<i64: 3, 0, 2, 1>, "1" = array<i64: 1, 2, 3, 0>, "7" = array<i64: 0, 1, 2, 3>}} {/' %inputs/tiny.mlir \
// RUN:   | not moe-opt --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=ep=2}))' 2>&1 | FileCheck %s --check-prefix=NOLAYER
// RUN: sed 's/^moe.model @tiny {/moe.model @tiny attributes {expert_placement = {"0" = array<i64: 3, 0, 2, 1>, "1" = array<i64: 1, 2, 3, 0>}} {/' %inputs/tiny.mlir \
// RUN:   | not moe-opt --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=ep=2 ep-exchange=all}))' 2>&1 | FileCheck %s --check-prefix=ALL
// RUN: sed 's/^moe.model @tiny {/moe.model @tiny attributes {expert_placement = {"0" = array<i64: 3, 0, 2, 1>, "1" = array<i64: 1, 2, 3, 0>}} {/' %inputs/tiny.mlir \
// RUN:   | not moe-opt --pass-pipeline='builtin.module(moe.model(moe-inject-lora{targets=up_proj expert-lora=true rank=2},moe-propagate-sharding{mesh=ep=2}))' 2>&1 | FileCheck %s --check-prefix=LORA

// CHECK: moe.model @tiny attributes {expert_placement = {"0" = array<i64: 3, 0, 2, 1>, "1" = array<i64: 1, 2, 3, 0>}, mesh = "ep=2"}
// CHECK: moe.param @up {{.*}} sharding #moe.sharding<[ep, _, _]>
// CHECK: moe.ep_route {{.*}} loc(#[[ROUTE:loc[0-9]*]])
// CHECK: #[[ROUTE]] = loc("the 4 experts of @block split over ep = 2 (2 per rank, as expert_placement places them)"

// PARTIAL: error: 'moe.expert_mlp' op expert_placement places 1 of the 2 layers of @block, which share one program: place all of them or none
// TWICE: error: 'moe.expert_mlp' op expert_placement of layer 0 must list each of experts 0..3 once, got array<i64: 3, 0, 3, 1>
// SHORT: error: 'moe.expert_mlp' op expert_placement of layer 0 must list its 4 experts (array<i64>), got array<i64: 3, 0, 2>
// NOLAYER: error: --moe-propagate-sharding: expert_placement names layer '7', which is not a layer with routed experts
// ALL: error: 'moe.expert_mlp' op has an expert placement, which needs ep-exchange routed or auto (every token to every rank renumbers the experts as consecutive ranges)
// LORA: error: 'moe.expert_mlp' op has adapters on its experts (@up_lora_A): an expert placement is not supported with expert LoRA yet
