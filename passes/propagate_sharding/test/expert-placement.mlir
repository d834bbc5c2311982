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
// RUN: sed 's/^moe.model @tiny {/moe.model @tiny attributes {expert_placement = {"0" = array<i64: 0, 1, 3, 2, 3, 0>, "1" = array<i64: 1, 1, 2, 3, 0, 2>}} {/' %inputs/tiny.mlir \
// RUN:   | not moe-opt --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=ep=2}))' 2>&1 | FileCheck %s --check-prefix=ONERANK
// RUN: sed 's/^moe.model @tiny {/moe.model @tiny attributes {expert_placement = {"0" = array<i64: 0, 1, 3, 2, 3, 0>, "1" = array<i64: 1, 2, 3, 0>}} {/' %inputs/tiny.mlir \
// RUN:   | not moe-opt --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=ep=2}))' 2>&1 | FileCheck %s --check-prefix=UNEQUAL
// RUN: sed 's/^moe.model @tiny {/moe.model @tiny attributes {expert_placement = {"0" = array<i64: 0, 1, 3, 2, 3, 0>, "1" = array<i64: 1, 2, 3, 0, 2, 1>}} {/' %inputs/tiny.mlir \
// RUN:   | moe-opt --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=ep=2}))' --mlir-print-debuginfo | FileCheck %s --check-prefix=REPLICATED
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
// TWICE: error: 'moe.expert_mlp' op expert_placement of layer 0 leaves expert 2 on no rank, got array<i64: 3, 0, 3, 1>
// SHORT: error: 'moe.expert_mlp' op expert_placement of layer 0 must list the experts of each of the 2 ep ranks, as many each and every one of its 4 experts at least once (array<i64>), got array<i64: 3, 0, 2>
// ONERANK: error: 'moe.expert_mlp' op expert_placement of layer 1 must list experts 0..3, none twice on one rank, got array<i64: 1, 1, 2, 3, 0, 2>
// UNEQUAL: error: 'moe.expert_mlp' op expert_placement gives the layers of @block 3 and 2 experts per rank; they share one program: give them as many
// NOLAYER: error: --moe-propagate-sharding: expert_placement names layer '7', which is not a layer with routed experts
// ALL: error: 'moe.expert_mlp' op has an expert placement, which needs ep-exchange routed or auto (every token to every rank renumbers the experts as consecutive ranges)
// LORA: error: 'moe.expert_mlp' op trains its experts (@up_lora_A, an expert adapter): an expert placement is not supported with trainable experts yet

// Three experts per rank where two would do: experts 3 and 0 of layer 0 (2 and 1 of layer 1)
// live on both ranks. Each rank's expert tensors have three rows, the local dispatch counts
// three experts.
// REPLICATED: moe.param @up {{.*}} : tensor<4x8x16xf32> sharding #moe.sharding<[ep, _, _]> {moe.ep_rows = 3 : i64}
// REPLICATED: moe.dispatch {{.*}} {num_experts = 3 : i64} : (tensor<?x16xf32>, tensor<?x2xi32>) -> (tensor<?x16xf32>, tensor<3xi64>)
// REPLICATED: moe.weight @up : tensor<3x8x16xf32>
// REPLICATED: #{{loc[0-9]*}} = loc("the 4 experts of @block split over ep = 2 (3 per rank, as expert_placement places and replicates them)"
