// RUN: moe-opt %s -split-input-file | moe-opt -split-input-file | FileCheck %s
// RUN: moe-opt %s -split-input-file --mlir-print-op-generic | moe-opt -split-input-file | FileCheck %s

// Tests that a softmax router (Qwen3-30B-A3B: 128 experts, top 8, renormalised) round-trips without defaulted attributes.
// CHECK-LABEL: func.func @router_softmax(
// CHECK-SAME: %[[X:.*]]: tensor<?x2048xbf16>, %[[W:.*]]: tensor<128x2048xbf16>)
// CHECK: %[[RW:.*]], %[[RI:.*]] = moe.router %[[X]], %[[W]] {norm_topk_prob, scoring = #moe<scoring softmax>, top_k = 8 : i64} : (tensor<?x2048xbf16>, tensor<128x2048xbf16>) -> (tensor<?x8xf32>, tensor<?x8xi32>)
// CHECK: return %[[RW]], %[[RI]]
func.func @router_softmax(%x: tensor<?x2048xbf16>, %w: tensor<128x2048xbf16>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %rw, %ri = moe.router %x, %w {top_k = 8 : i64, scoring = #moe<scoring softmax>, norm_topk_prob} : (tensor<?x2048xbf16>, tensor<128x2048xbf16>) -> (tensor<?x8xf32>, tensor<?x8xi32>)
  return %rw, %ri : tensor<?x8xf32>, tensor<?x8xi32>
}

// -----

// Tests that a sigmoid router with correction bias and group-limited selection (DeepSeek-V3: 256 experts in 8 groups, best 4, top 8, scaling 2.5) round-trips.
// CHECK-LABEL: func.func @router_sigmoid_grouped(
// CHECK-SAME: %[[X:.*]]: tensor<?x7168xbf16>, %[[W:.*]]: tensor<256x7168xbf16>, %[[CB:.*]]: tensor<256xf32>)
// CHECK: %[[RW:.*]], %[[RI:.*]] = moe.router %[[X]], %[[W]] correction_bias %[[CB]] {n_group = 8 : i64, norm_topk_prob, scaling = 2.500000e+00 : f64, scoring = #moe<scoring sigmoid>, top_k = 8 : i64, topk_group = 4 : i64} : (tensor<?x7168xbf16>, tensor<256x7168xbf16>, tensor<256xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>)
// CHECK-NOT: logit_bias
func.func @router_sigmoid_grouped(%x: tensor<?x7168xbf16>, %w: tensor<256x7168xbf16>, %cb: tensor<256xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %rw, %ri = moe.router %x, %w correction_bias %cb {top_k = 8 : i64, scoring = #moe<scoring sigmoid>, n_group = 8 : i64, topk_group = 4 : i64, norm_topk_prob, scaling = 2.5 : f64} : (tensor<?x7168xbf16>, tensor<256x7168xbf16>, tensor<256xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>)
  return %rw, %ri : tensor<?x8xf32>, tensor<?x8xi32>
}

// -----

// Tests that a top-k-then-softmax router with a logit bias (gpt-oss-20b: 32 experts, top 4) keeps the bias in its own operand segment.
// CHECK-LABEL: func.func @router_topk_softmax(
// CHECK-SAME: %[[X:.*]]: tensor<?x2880xbf16>, %[[W:.*]]: tensor<32x2880xbf16>, %[[LB:.*]]: tensor<32xbf16>)
// CHECK: %[[RW:.*]], %[[RI:.*]] = moe.router %[[X]], %[[W]] logit_bias %[[LB]] {scoring = #moe<scoring topk_softmax>, top_k = 4 : i64} : (tensor<?x2880xbf16>, tensor<32x2880xbf16>, tensor<32xbf16>) -> (tensor<?x4xf32>, tensor<?x4xi32>)
// CHECK-NOT: correction_bias
func.func @router_topk_softmax(%x: tensor<?x2880xbf16>, %w: tensor<32x2880xbf16>, %lb: tensor<32xbf16>) -> (tensor<?x4xf32>, tensor<?x4xi32>) {
  %rw, %ri = moe.router %x, %w logit_bias %lb {top_k = 4 : i64, scoring = #moe<scoring topk_softmax>} : (tensor<?x2880xbf16>, tensor<32x2880xbf16>, tensor<32xbf16>) -> (tensor<?x4xf32>, tensor<?x4xi32>)
  return %rw, %ri : tensor<?x4xf32>, tensor<?x4xi32>
}

// -----

// Tests that a full Qwen3-style MoE block (router, dispatch, gated SiLU experts, combine) round-trips with its data flow.
// CHECK-LABEL: func.func @moe_block(
// CHECK-SAME: %[[X:.*]]: tensor<?x2048xbf16>, %[[WR:.*]]: tensor<128x2048xbf16>, %[[UP:.*]]: tensor<128x768x2048xbf16>, %[[GATE:.*]]: tensor<128x768x2048xbf16>, %[[DOWN:.*]]: tensor<128x2048x768xbf16>)
// CHECK: %[[RW:.*]], %[[RI:.*]] = moe.router %[[X]], %[[WR]]
// CHECK: %[[TOK:.*]], %[[CNT:.*]] = moe.dispatch %[[X]], %[[RI]] {num_experts = 128 : i64} : (tensor<?x2048xbf16>, tensor<?x8xi32>) -> (tensor<?x2048xbf16>, tensor<128xi64>)
// CHECK: %[[EO:.*]] = moe.expert_mlp %[[TOK]], %[[CNT]], up %[[UP]], down %[[DOWN]] gate %[[GATE]] {activation = #moe<activation silu>} : (tensor<?x2048xbf16>, tensor<128xi64>, tensor<128x768x2048xbf16>, tensor<128x2048x768xbf16>, tensor<128x768x2048xbf16>) -> tensor<?x2048xbf16>
// CHECK: %[[Y:.*]] = moe.combine %[[EO]], %[[RI]], %[[RW]] : (tensor<?x2048xbf16>, tensor<?x8xi32>, tensor<?x8xf32>) -> tensor<?x2048xbf16>
// CHECK: return %[[Y]]
func.func @moe_block(%x: tensor<?x2048xbf16>, %wr: tensor<128x2048xbf16>, %up: tensor<128x768x2048xbf16>, %gate: tensor<128x768x2048xbf16>, %down: tensor<128x2048x768xbf16>) -> tensor<?x2048xbf16> {
  %rw, %ri = moe.router %x, %wr {top_k = 8 : i64, scoring = #moe<scoring softmax>, norm_topk_prob} : (tensor<?x2048xbf16>, tensor<128x2048xbf16>) -> (tensor<?x8xf32>, tensor<?x8xi32>)
  %tokens, %counts = moe.dispatch %x, %ri {num_experts = 128 : i64} : (tensor<?x2048xbf16>, tensor<?x8xi32>) -> (tensor<?x2048xbf16>, tensor<128xi64>)
  %eo = moe.expert_mlp %tokens, %counts, up %up, down %down gate %gate {activation = #moe<activation silu>} : (tensor<?x2048xbf16>, tensor<128xi64>, tensor<128x768x2048xbf16>, tensor<128x2048x768xbf16>, tensor<128x768x2048xbf16>) -> tensor<?x2048xbf16>
  %y = moe.combine %eo, %ri, %rw : (tensor<?x2048xbf16>, tensor<?x8xi32>, tensor<?x8xf32>) -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}

// -----

// Tests that ungated relu2 experts (Nemotron-H: 128 experts, intermediate 1856) print no gate.
// CHECK-LABEL: func.func @expert_mlp_relu2(
// CHECK-SAME: %[[TOK:.*]]: tensor<?x2688xbf16>, %[[CNT:.*]]: tensor<128xi64>, %[[UP:.*]]: tensor<128x1856x2688xbf16>, %[[DOWN:.*]]: tensor<128x2688x1856xbf16>)
// CHECK: moe.expert_mlp %[[TOK]], %[[CNT]], up %[[UP]], down %[[DOWN]] {activation = #moe<activation relu2>} : (tensor<?x2688xbf16>, tensor<128xi64>, tensor<128x1856x2688xbf16>, tensor<128x2688x1856xbf16>) -> tensor<?x2688xbf16>
// CHECK-NOT: gate
func.func @expert_mlp_relu2(%tok: tensor<?x2688xbf16>, %cnt: tensor<128xi64>, %up: tensor<128x1856x2688xbf16>, %down: tensor<128x2688x1856xbf16>) -> tensor<?x2688xbf16> {
  %o = moe.expert_mlp %tok, %cnt, up %up, down %down {activation = #moe<activation relu2>} : (tensor<?x2688xbf16>, tensor<128xi64>, tensor<128x1856x2688xbf16>, tensor<128x2688x1856xbf16>) -> tensor<?x2688xbf16>
  return %o : tensor<?x2688xbf16>
}

// -----

// Tests that gpt-oss experts (fused interleaved gate_up in [in, out] layout, biases, clamped SwiGLU with limit 7) round-trip.
// CHECK-LABEL: func.func @expert_mlp_gpt_oss(
// CHECK-SAME: %[[TOK:.*]]: tensor<?x2880xbf16>, %[[CNT:.*]]: tensor<32xi64>, %[[UP:.*]]: tensor<32x2880x5760xbf16>, %[[UB:.*]]: tensor<32x5760xbf16>, %[[DOWN:.*]]: tensor<32x2880x2880xbf16>, %[[DB:.*]]: tensor<32x2880xbf16>)
// CHECK: moe.expert_mlp %[[TOK]], %[[CNT]], up %[[UP]], down %[[DOWN]] up_bias %[[UB]] down_bias %[[DB]] {activation = #moe<activation clamped_swiglu>, fused_gate_up, in_out_layout, limit = 7.000000e+00 : f64} : (tensor<?x2880xbf16>, tensor<32xi64>, tensor<32x2880x5760xbf16>, tensor<32x2880x2880xbf16>, tensor<32x5760xbf16>, tensor<32x2880xbf16>) -> tensor<?x2880xbf16>
func.func @expert_mlp_gpt_oss(%tok: tensor<?x2880xbf16>, %cnt: tensor<32xi64>, %up: tensor<32x2880x5760xbf16>, %ub: tensor<32x5760xbf16>, %down: tensor<32x2880x2880xbf16>, %db: tensor<32x2880xbf16>) -> tensor<?x2880xbf16> {
  %o = moe.expert_mlp %tok, %cnt, up %up, down %down up_bias %ub down_bias %db {activation = #moe<activation clamped_swiglu>, fused_gate_up, in_out_layout, limit = 7.0 : f64} : (tensor<?x2880xbf16>, tensor<32xi64>, tensor<32x2880x5760xbf16>, tensor<32x2880x2880xbf16>, tensor<32x5760xbf16>, tensor<32x2880xbf16>) -> tensor<?x2880xbf16>
  return %o : tensor<?x2880xbf16>
}

// -----

// Tests that in_out_layout with distinct hidden and intermediate sizes reads up as [E, D, 2I] and down as [E, I, D].
// CHECK-LABEL: func.func @expert_mlp_in_out_layout(
// CHECK-SAME: %[[TOK:.*]]: tensor<?x2048xbf16>, %[[CNT:.*]]: tensor<64xi64>, %[[UP:.*]]: tensor<64x2048x1536xbf16>, %[[DOWN:.*]]: tensor<64x768x2048xbf16>)
// CHECK: moe.expert_mlp %[[TOK]], %[[CNT]], up %[[UP]], down %[[DOWN]] {activation = #moe<activation silu>, fused_gate_up, in_out_layout} : (tensor<?x2048xbf16>, tensor<64xi64>, tensor<64x2048x1536xbf16>, tensor<64x768x2048xbf16>) -> tensor<?x2048xbf16>
func.func @expert_mlp_in_out_layout(%tok: tensor<?x2048xbf16>, %cnt: tensor<64xi64>, %up: tensor<64x2048x1536xbf16>, %down: tensor<64x768x2048xbf16>) -> tensor<?x2048xbf16> {
  %o = moe.expert_mlp %tok, %cnt, up %up, down %down {activation = #moe<activation silu>, fused_gate_up, in_out_layout} : (tensor<?x2048xbf16>, tensor<64xi64>, tensor<64x2048x1536xbf16>, tensor<64x768x2048xbf16>) -> tensor<?x2048xbf16>
  return %o : tensor<?x2048xbf16>
}

// -----

// Tests that token blocks and their concatenation round-trip (hidden rows and expert indices).
// CHECK-LABEL: func.func @token_blocks(
// CHECK: %[[X:.*]]:2 = moe.token_blocks %{{.*}} : tensor<?x16xbf16> -> tensor<?x16xbf16>, tensor<?x16xbf16>
// CHECK: moe.token_blocks %{{.*}} : tensor<?x8xi32> -> tensor<?x8xi32>, tensor<?x8xi32>, tensor<?x8xi32>
// CHECK: moe.concat_tokens %[[X]]#0, %[[X]]#1 : tensor<?x16xbf16>, tensor<?x16xbf16> -> tensor<?x16xbf16>
func.func @token_blocks(%x: tensor<?x16xbf16>, %i: tensor<?x8xi32>) -> tensor<?x16xbf16> {
  %x0, %x1 = moe.token_blocks %x : tensor<?x16xbf16> -> tensor<?x16xbf16>, tensor<?x16xbf16>
  %i0, %i1, %i2 = moe.token_blocks %i : tensor<?x8xi32> -> tensor<?x8xi32>, tensor<?x8xi32>, tensor<?x8xi32>
  %y = moe.concat_tokens %x0, %x1 : tensor<?x16xbf16>, tensor<?x16xbf16> -> tensor<?x16xbf16>
  return %y : tensor<?x16xbf16>
}
