// RUN: moe-opt %s -split-input-file -verify-diagnostics

// Tests that a router cannot pick more experts than exist.
func.func @router_top_k(%x: tensor<?x2048xbf16>, %w: tensor<8x2048xbf16>) -> (tensor<?x16xf32>, tensor<?x16xi32>) {
  // expected-error @+1 {{'moe.router' op top_k (16) must not exceed the number of experts (8)}}
  %rw, %ri = moe.router %x, %w {top_k = 16 : i64, scoring = #moe<scoring softmax>} : (tensor<?x2048xbf16>, tensor<8x2048xbf16>) -> (tensor<?x16xf32>, tensor<?x16xi32>)
  return %rw, %ri : tensor<?x16xf32>, tensor<?x16xi32>
}

// -----

// Tests that a router needs top_k of at least one.
func.func @router_top_k_zero(%x: tensor<?x2048xbf16>, %w: tensor<128x2048xbf16>) -> (tensor<?x0xf32>, tensor<?x0xi32>) {
  // expected-error @+1 {{'moe.router' op top_k must be positive, got 0}}
  %rw, %ri = moe.router %x, %w {top_k = 0 : i64, scoring = #moe<scoring softmax>} : (tensor<?x2048xbf16>, tensor<128x2048xbf16>) -> (tensor<?x0xf32>, tensor<?x0xi32>)
  return %rw, %ri : tensor<?x0xf32>, tensor<?x0xi32>
}

// -----

// Tests that the router weight is [experts, hidden] in the input's hidden size.
func.func @router_weight(%x: tensor<?x2048xbf16>, %w: tensor<128x1024xbf16>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  // expected-error @+1 {{'moe.router' op weight dimension 1 must be 2048 (input features), got 1024}}
  %rw, %ri = moe.router %x, %w {top_k = 8 : i64, scoring = #moe<scoring softmax>} : (tensor<?x2048xbf16>, tensor<128x1024xbf16>) -> (tensor<?x8xf32>, tensor<?x8xi32>)
  return %rw, %ri : tensor<?x8xf32>, tensor<?x8xi32>
}

// -----

// Tests that the experts must split into n_group equal groups.
func.func @router_groups_divide(%x: tensor<?x7168xbf16>, %w: tensor<256x7168xbf16>, %cb: tensor<256xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  // expected-error @+1 {{'moe.router' op number of experts (256) must be a multiple of n_group (3)}}
  %rw, %ri = moe.router %x, %w correction_bias %cb {top_k = 8 : i64, scoring = #moe<scoring sigmoid>, n_group = 3 : i64, topk_group = 2 : i64} : (tensor<?x7168xbf16>, tensor<256x7168xbf16>, tensor<256xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>)
  return %rw, %ri : tensor<?x8xf32>, tensor<?x8xi32>
}

// -----

// Tests that topk_group cannot keep more groups than there are.
func.func @router_topk_group(%x: tensor<?x7168xbf16>, %w: tensor<256x7168xbf16>, %cb: tensor<256xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  // expected-error @+1 {{'moe.router' op topk_group (16) must not exceed n_group (8)}}
  %rw, %ri = moe.router %x, %w correction_bias %cb {top_k = 8 : i64, scoring = #moe<scoring sigmoid>, n_group = 8 : i64, topk_group = 16 : i64} : (tensor<?x7168xbf16>, tensor<256x7168xbf16>, tensor<256xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>)
  return %rw, %ri : tensor<?x8xf32>, tensor<?x8xi32>
}

// -----

// Tests that top_k must fit in the experts of the kept groups.
func.func @router_top_k_in_groups(%x: tensor<?x7168xbf16>, %w: tensor<256x7168xbf16>, %cb: tensor<256xf32>) -> (tensor<?x64xf32>, tensor<?x64xi32>) {
  // expected-error @+1 {{'moe.router' op top_k (64) exceeds the 32 experts in the topk_group best groups}}
  %rw, %ri = moe.router %x, %w correction_bias %cb {top_k = 64 : i64, scoring = #moe<scoring sigmoid>, n_group = 8 : i64, topk_group = 1 : i64} : (tensor<?x7168xbf16>, tensor<256x7168xbf16>, tensor<256xf32>) -> (tensor<?x64xf32>, tensor<?x64xi32>)
  return %rw, %ri : tensor<?x64xf32>, tensor<?x64xi32>
}

// -----

// Tests that a correction bias needs sigmoid scoring.
func.func @router_correction_bias_softmax(%x: tensor<?x2048xbf16>, %w: tensor<128x2048xbf16>, %cb: tensor<128xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  // expected-error @+1 {{'moe.router' op group-limited selection and correction_bias need sigmoid scoring}}
  %rw, %ri = moe.router %x, %w correction_bias %cb {top_k = 8 : i64, scoring = #moe<scoring softmax>} : (tensor<?x2048xbf16>, tensor<128x2048xbf16>, tensor<128xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>)
  return %rw, %ri : tensor<?x8xf32>, tensor<?x8xi32>
}

// -----

// Tests that group-limited selection needs sigmoid scoring.
func.func @router_groups_topk_softmax(%x: tensor<?x2880xbf16>, %w: tensor<32x2880xbf16>) -> (tensor<?x4xf32>, tensor<?x4xi32>) {
  // expected-error @+1 {{'moe.router' op group-limited selection and correction_bias need sigmoid scoring}}
  %rw, %ri = moe.router %x, %w {top_k = 4 : i64, scoring = #moe<scoring topk_softmax>, n_group = 4 : i64, topk_group = 2 : i64} : (tensor<?x2880xbf16>, tensor<32x2880xbf16>) -> (tensor<?x4xf32>, tensor<?x4xi32>)
  return %rw, %ri : tensor<?x4xf32>, tensor<?x4xi32>
}

// -----

// Tests that the correction bias has one entry per expert.
func.func @router_correction_bias_size(%x: tensor<?x7168xbf16>, %w: tensor<256x7168xbf16>, %cb: tensor<128xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  // expected-error @+1 {{'moe.router' op correction_bias must have 256 elements (one per expert), got 'tensor<128xf32>'}}
  %rw, %ri = moe.router %x, %w correction_bias %cb {top_k = 8 : i64, scoring = #moe<scoring sigmoid>, n_group = 8 : i64, topk_group = 4 : i64} : (tensor<?x7168xbf16>, tensor<256x7168xbf16>, tensor<128xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>)
  return %rw, %ri : tensor<?x8xf32>, tensor<?x8xi32>
}

// -----

// Tests that the logit bias has one entry per expert.
func.func @router_logit_bias_size(%x: tensor<?x2880xbf16>, %w: tensor<32x2880xbf16>, %lb: tensor<2880xbf16>) -> (tensor<?x4xf32>, tensor<?x4xi32>) {
  // expected-error @+1 {{'moe.router' op logit_bias must have 32 elements (one per expert), got 'tensor<2880xbf16>'}}
  %rw, %ri = moe.router %x, %w logit_bias %lb {top_k = 4 : i64, scoring = #moe<scoring topk_softmax>} : (tensor<?x2880xbf16>, tensor<32x2880xbf16>, tensor<2880xbf16>) -> (tensor<?x4xf32>, tensor<?x4xi32>)
  return %rw, %ri : tensor<?x4xf32>, tensor<?x4xi32>
}

// -----

// Tests that router outputs hold top_k entries per token.
func.func @router_result_width(%x: tensor<?x2048xbf16>, %w: tensor<128x2048xbf16>) -> (tensor<?x4xf32>, tensor<?x4xi32>) {
  // expected-error @+1 {{'moe.router' op result dimension 1 must be 8 (top_k), got 4}}
  %rw, %ri = moe.router %x, %w {top_k = 8 : i64, scoring = #moe<scoring softmax>} : (tensor<?x2048xbf16>, tensor<128x2048xbf16>) -> (tensor<?x4xf32>, tensor<?x4xi32>)
  return %rw, %ri : tensor<?x4xf32>, tensor<?x4xi32>
}

// -----

// Tests that router weights are f32 whatever the activation type.
func.func @router_weights_dtype(%x: tensor<?x2048xbf16>, %w: tensor<128x2048xbf16>) -> (tensor<?x8xbf16>, tensor<?x8xi32>) {
  // expected-error @+1 {{'moe.router' op result #0 must be ranked tensor of 32-bit float values, but got 'tensor<?x8xbf16>'}}
  %rw, %ri = moe.router %x, %w {top_k = 8 : i64, scoring = #moe<scoring softmax>} : (tensor<?x2048xbf16>, tensor<128x2048xbf16>) -> (tensor<?x8xbf16>, tensor<?x8xi32>)
  return %rw, %ri : tensor<?x8xbf16>, tensor<?x8xi32>
}

// -----

// Tests that dispatch counts have one entry per expert.
func.func @dispatch_counts(%x: tensor<?x2048xbf16>, %ri: tensor<?x8xi32>) -> (tensor<?x2048xbf16>, tensor<64xi64>) {
  // expected-error @+1 {{'moe.dispatch' op counts dimension 0 must be 128 (num_experts), got 64}}
  %tok, %cnt = moe.dispatch %x, %ri {num_experts = 128 : i64} : (tensor<?x2048xbf16>, tensor<?x8xi32>) -> (tensor<?x2048xbf16>, tensor<64xi64>)
  return %tok, %cnt : tensor<?x2048xbf16>, tensor<64xi64>
}

// -----

// Tests that dispatched tokens keep the hidden size.
func.func @dispatch_tokens(%x: tensor<?x2048xbf16>, %ri: tensor<?x8xi32>) -> (tensor<?x768xbf16>, tensor<128xi64>) {
  // expected-error @+1 {{'moe.dispatch' op tokens dimension 1 must be 2048 (input dimension 1), got 768}}
  %tok, %cnt = moe.dispatch %x, %ri {num_experts = 128 : i64} : (tensor<?x2048xbf16>, tensor<?x8xi32>) -> (tensor<?x768xbf16>, tensor<128xi64>)
  return %tok, %cnt : tensor<?x768xbf16>, tensor<128xi64>
}

// -----

// Tests that dispatch has one row of expert indices per token.
func.func @dispatch_indices(%x: tensor<16x2048xbf16>, %ri: tensor<8x8xi32>) -> (tensor<128x2048xbf16>, tensor<128xi64>) {
  // expected-error @+1 {{'moe.dispatch' op indices dimension 0 must be 16 (input dimension 0), got 8}}
  %tok, %cnt = moe.dispatch %x, %ri {num_experts = 128 : i64} : (tensor<16x2048xbf16>, tensor<8x8xi32>) -> (tensor<128x2048xbf16>, tensor<128xi64>)
  return %tok, %cnt : tensor<128x2048xbf16>, tensor<128xi64>
}

// -----

// Tests that relu2 experts cannot have a gate projection.
func.func @expert_mlp_relu2_gate(%tok: tensor<?x2688xbf16>, %cnt: tensor<128xi64>, %up: tensor<128x1856x2688xbf16>, %down: tensor<128x2688x1856xbf16>, %gate: tensor<128x1856x2688xbf16>) -> tensor<?x2688xbf16> {
  // expected-error @+1 {{'moe.expert_mlp' op relu2 experts have no gate projection}}
  %o = moe.expert_mlp %tok, %cnt, up %up, down %down gate %gate {activation = #moe<activation relu2>} : (tensor<?x2688xbf16>, tensor<128xi64>, tensor<128x1856x2688xbf16>, tensor<128x2688x1856xbf16>, tensor<128x1856x2688xbf16>) -> tensor<?x2688xbf16>
  return %o : tensor<?x2688xbf16>
}

// -----

// Tests that relu2 experts cannot have a fused gate either.
func.func @expert_mlp_relu2_fused(%tok: tensor<?x2688xbf16>, %cnt: tensor<128xi64>, %up: tensor<128x3712x2688xbf16>, %down: tensor<128x2688x1856xbf16>) -> tensor<?x2688xbf16> {
  // expected-error @+1 {{'moe.expert_mlp' op relu2 experts have no gate projection}}
  %o = moe.expert_mlp %tok, %cnt, up %up, down %down {activation = #moe<activation relu2>, fused_gate_up} : (tensor<?x2688xbf16>, tensor<128xi64>, tensor<128x3712x2688xbf16>, tensor<128x2688x1856xbf16>) -> tensor<?x2688xbf16>
  return %o : tensor<?x2688xbf16>
}

// -----

// Tests that clamped_swiglu experts need a clamp limit.
func.func @expert_mlp_clamped_no_limit(%tok: tensor<?x2880xbf16>, %cnt: tensor<32xi64>, %up: tensor<32x2880x5760xbf16>, %down: tensor<32x2880x2880xbf16>) -> tensor<?x2880xbf16> {
  // expected-error @+1 {{'moe.expert_mlp' op clamped_swiglu needs a limit}}
  %o = moe.expert_mlp %tok, %cnt, up %up, down %down {activation = #moe<activation clamped_swiglu>, fused_gate_up, in_out_layout} : (tensor<?x2880xbf16>, tensor<32xi64>, tensor<32x2880x5760xbf16>, tensor<32x2880x2880xbf16>) -> tensor<?x2880xbf16>
  return %o : tensor<?x2880xbf16>
}

// -----

// Tests that a separate gate and a fused gate_up are exclusive.
func.func @expert_mlp_gate_and_fused(%tok: tensor<?x2048xbf16>, %cnt: tensor<128xi64>, %up: tensor<128x1536x2048xbf16>, %down: tensor<128x2048x768xbf16>, %gate: tensor<128x768x2048xbf16>) -> tensor<?x2048xbf16> {
  // expected-error @+1 {{'moe.expert_mlp' op a separate gate operand cannot be combined with fused_gate_up}}
  %o = moe.expert_mlp %tok, %cnt, up %up, down %down gate %gate {activation = #moe<activation silu>, fused_gate_up} : (tensor<?x2048xbf16>, tensor<128xi64>, tensor<128x1536x2048xbf16>, tensor<128x2048x768xbf16>, tensor<128x768x2048xbf16>) -> tensor<?x2048xbf16>
  return %o : tensor<?x2048xbf16>
}

// -----

// Tests that a fused gate_up width must hold gate and up pairs (the verifier used to halve an odd width silently).
func.func @expert_mlp_fused_odd(%tok: tensor<?x2880xbf16>, %cnt: tensor<32xi64>, %up: tensor<32x2880x5761xbf16>, %down: tensor<32x2880x2880xbf16>) -> tensor<?x2880xbf16> {
  // expected-error @+1 {{'moe.expert_mlp' op fused_gate_up needs an even number of up outputs (gate and up interleaved), got 5761}}
  %o = moe.expert_mlp %tok, %cnt, up %up, down %down {activation = #moe<activation clamped_swiglu>, fused_gate_up, in_out_layout, limit = 7.0 : f64} : (tensor<?x2880xbf16>, tensor<32xi64>, tensor<32x2880x5761xbf16>, tensor<32x2880x2880xbf16>) -> tensor<?x2880xbf16>
  return %o : tensor<?x2880xbf16>
}

// -----

// Tests that up reads the token features in [E, out, in] layout.
func.func @expert_mlp_up_features(%tok: tensor<?x2048xbf16>, %cnt: tensor<128xi64>, %up: tensor<128x768x1024xbf16>, %down: tensor<128x2048x768xbf16>, %gate: tensor<128x768x2048xbf16>) -> tensor<?x2048xbf16> {
  // expected-error @+1 {{'moe.expert_mlp' op up dimension 2 must be 2048 (token features), got 1024}}
  %o = moe.expert_mlp %tok, %cnt, up %up, down %down gate %gate {activation = #moe<activation silu>} : (tensor<?x2048xbf16>, tensor<128xi64>, tensor<128x768x1024xbf16>, tensor<128x2048x768xbf16>, tensor<128x768x2048xbf16>) -> tensor<?x2048xbf16>
  return %o : tensor<?x2048xbf16>
}

// -----

// Tests that down reads the intermediate size that up produces.
func.func @expert_mlp_down_inter(%tok: tensor<?x2048xbf16>, %cnt: tensor<128xi64>, %up: tensor<128x768x2048xbf16>, %down: tensor<128x2048x1536xbf16>, %gate: tensor<128x768x2048xbf16>) -> tensor<?x2048xbf16> {
  // expected-error @+1 {{'moe.expert_mlp' op down dimension 2 must be 768 (expert intermediate size), got 1536}}
  %o = moe.expert_mlp %tok, %cnt, up %up, down %down gate %gate {activation = #moe<activation silu>} : (tensor<?x2048xbf16>, tensor<128xi64>, tensor<128x768x2048xbf16>, tensor<128x2048x1536xbf16>, tensor<128x768x2048xbf16>) -> tensor<?x2048xbf16>
  return %o : tensor<?x2048xbf16>
}

// -----

// Tests that in_out_layout rejects weights given in the [E, out, in] layout.
func.func @expert_mlp_in_out_layout(%tok: tensor<?x2048xbf16>, %cnt: tensor<64xi64>, %up: tensor<64x1536x2048xbf16>, %down: tensor<64x2048x768xbf16>) -> tensor<?x2048xbf16> {
  // expected-error @+1 {{'moe.expert_mlp' op up dimension 1 must be 2048 (token features), got 1536}}
  %o = moe.expert_mlp %tok, %cnt, up %up, down %down {activation = #moe<activation silu>, fused_gate_up, in_out_layout} : (tensor<?x2048xbf16>, tensor<64xi64>, tensor<64x1536x2048xbf16>, tensor<64x2048x768xbf16>) -> tensor<?x2048xbf16>
  return %o : tensor<?x2048xbf16>
}

// -----

// Tests that a separate gate matches up's shape.
func.func @expert_mlp_gate_shape(%tok: tensor<?x2048xbf16>, %cnt: tensor<128xi64>, %up: tensor<128x768x2048xbf16>, %down: tensor<128x2048x768xbf16>, %gate: tensor<128x1536x2048xbf16>) -> tensor<?x2048xbf16> {
  // expected-error @+1 {{'moe.expert_mlp' op gate dimension 1 must be 768 (expert intermediate size), got 1536}}
  %o = moe.expert_mlp %tok, %cnt, up %up, down %down gate %gate {activation = #moe<activation silu>} : (tensor<?x2048xbf16>, tensor<128xi64>, tensor<128x768x2048xbf16>, tensor<128x2048x768xbf16>, tensor<128x1536x2048xbf16>) -> tensor<?x2048xbf16>
  return %o : tensor<?x2048xbf16>
}

// -----

// Tests that counts have one entry per expert stacked in up.
func.func @expert_mlp_counts(%tok: tensor<?x2048xbf16>, %cnt: tensor<64xi64>, %up: tensor<128x768x2048xbf16>, %down: tensor<128x2048x768xbf16>, %gate: tensor<128x768x2048xbf16>) -> tensor<?x2048xbf16> {
  // expected-error @+1 {{'moe.expert_mlp' op counts dimension 0 must be 128 (number of experts), got 64}}
  %o = moe.expert_mlp %tok, %cnt, up %up, down %down gate %gate {activation = #moe<activation silu>} : (tensor<?x2048xbf16>, tensor<64xi64>, tensor<128x768x2048xbf16>, tensor<128x2048x768xbf16>, tensor<128x768x2048xbf16>) -> tensor<?x2048xbf16>
  return %o : tensor<?x2048xbf16>
}

// -----

// Tests that the fused up bias covers both gate and up outputs of every expert.
func.func @expert_mlp_up_bias(%tok: tensor<?x2880xbf16>, %cnt: tensor<32xi64>, %up: tensor<32x2880x5760xbf16>, %ub: tensor<32x2880xbf16>, %down: tensor<32x2880x2880xbf16>, %db: tensor<32x2880xbf16>) -> tensor<?x2880xbf16> {
  // expected-error @+1 {{'moe.expert_mlp' op up_bias must have 184320 elements (experts * up outputs), got 'tensor<32x2880xbf16>'}}
  %o = moe.expert_mlp %tok, %cnt, up %up, down %down up_bias %ub down_bias %db {activation = #moe<activation clamped_swiglu>, fused_gate_up, in_out_layout, limit = 7.0 : f64} : (tensor<?x2880xbf16>, tensor<32xi64>, tensor<32x2880x5760xbf16>, tensor<32x2880x2880xbf16>, tensor<32x2880xbf16>, tensor<32x2880xbf16>) -> tensor<?x2880xbf16>
  return %o : tensor<?x2880xbf16>
}

// -----

// Tests that the down bias has one hidden vector per expert.
func.func @expert_mlp_down_bias(%tok: tensor<?x2880xbf16>, %cnt: tensor<32xi64>, %up: tensor<32x2880x5760xbf16>, %ub: tensor<32x5760xbf16>, %down: tensor<32x2880x2880xbf16>, %db: tensor<2880xbf16>) -> tensor<?x2880xbf16> {
  // expected-error @+1 {{'moe.expert_mlp' op down_bias must have 92160 elements (experts * features), got 'tensor<2880xbf16>'}}
  %o = moe.expert_mlp %tok, %cnt, up %up, down %down up_bias %ub down_bias %db {activation = #moe<activation clamped_swiglu>, fused_gate_up, in_out_layout, limit = 7.0 : f64} : (tensor<?x2880xbf16>, tensor<32xi64>, tensor<32x2880x5760xbf16>, tensor<32x2880x2880xbf16>, tensor<32x5760xbf16>, tensor<2880xbf16>) -> tensor<?x2880xbf16>
  return %o : tensor<?x2880xbf16>
}

// -----

// Tests that combine's weights and indices agree on k.
func.func @combine_k(%eo: tensor<?x2048xbf16>, %ri: tensor<?x8xi32>, %rw: tensor<?x4xf32>) -> tensor<?x2048xbf16> {
  // expected-error @+1 {{'moe.combine' op weights dimension 1 must be 8 (indices dimension 1), got 4}}
  %y = moe.combine %eo, %ri, %rw : (tensor<?x2048xbf16>, tensor<?x8xi32>, tensor<?x4xf32>) -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}

// -----

// Tests that combine keeps the expert output's hidden size.
func.func @combine_features(%eo: tensor<?x2048xbf16>, %ri: tensor<?x8xi32>, %rw: tensor<?x8xf32>) -> tensor<?x1024xbf16> {
  // expected-error @+1 {{'moe.combine' op result dimension 1 must be 2048 (expert_output dimension 1), got 1024}}
  %y = moe.combine %eo, %ri, %rw : (tensor<?x2048xbf16>, tensor<?x8xi32>, tensor<?x8xf32>) -> tensor<?x1024xbf16>
  return %y : tensor<?x1024xbf16>
}

// -----

// Tests that combine keeps the expert output's element type or widens it to f32 (an
// expert-parallel rank's partial sum), never narrows it.
func.func @combine_dtype(%eo: tensor<?x2048xf32>, %ri: tensor<?x8xi32>, %rw: tensor<?x8xf32>) -> tensor<?x2048xbf16> {
  // expected-error @+1 {{'moe.combine' op result element type 'bf16' differs from expert_output element type 'f32'}}
  %y = moe.combine %eo, %ri, %rw : (tensor<?x2048xf32>, tensor<?x8xi32>, tensor<?x8xf32>) -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}

// -----

// Tests that an expert route's experts split over its ranks.
func.func @ep_route_uneven(%i: tensor<?x8xi32>) -> tensor<?x8xi32> {
  // expected-error @+1 {{'moe.ep_route' op needs ranks >= 1 dividing num_experts, got ranks = 3 and num_experts = 128}}
  %l, %layout = moe.ep_route %i {axis = "ep", ranks = 3 : i64, num_experts = 128 : i64} : (tensor<?x8xi32>) -> (tensor<?x8xi32>, tensor<2x6xi64>)
  return %l : tensor<?x8xi32>
}

// -----

// Tests that an expert route's layout has (tokens, copies) per rank, sent and received.
func.func @ep_route_layout(%i: tensor<?x8xi32>) -> tensor<?x8xi32> {
  // expected-error @+1 {{'moe.ep_route' op layout dimension 1 must be 4 (tokens and expert copies per rank), got 2}}
  %l, %layout = moe.ep_route %i {axis = "ep", ranks = 2 : i64, num_experts = 128 : i64} : (tensor<?x8xi32>) -> (tensor<?x8xi32>, tensor<2x2xi64>)
  return %l : tensor<?x8xi32>
}

// -----

// Tests that an expert route's room is at least what uniform routing fills.
func.func @ep_route_capacity_below_one(%i: tensor<?x8xi32>) -> tensor<?x8xi32> {
  // expected-error @+1 {{'moe.ep_route' op needs capacity_factor >= 1 (the room uniform routing fills), got 5.000000e-01}}
  %l, %layout = moe.ep_route %i {axis = "ep", ranks = 2 : i64, num_experts = 128 : i64, capacity_factor = 0.5 : f64} : (tensor<?x8xi32>) -> (tensor<?x8xi32>, tensor<2x4xi64>)
  return %l : tensor<?x8xi32>
}

// -----

// Tests that a route of every token to every rank has no capacity to bound.
func.func @ep_route_capacity_all_tokens(%i: tensor<?x8xi32>) -> tensor<?x8xi32> {
  // expected-error @+1 {{'moe.ep_route' op has capacity_factor and all_tokens: every token goes to every rank, the room is fixed}}
  %l, %layout = moe.ep_route %i {all_tokens, axis = "ep", ranks = 2 : i64, num_experts = 128 : i64, capacity_factor = 2.0 : f64} : (tensor<?x8xi32>) -> (tensor<?x8xi32>, tensor<2x4xi64>)
  return %l : tensor<?x8xi32>
}

// -----

// Tests that a send keeps its rows' width.
func.func @ep_send_width(%x: tensor<?x2048xbf16>, %layout: tensor<2x4xi64>) -> tensor<?x1024xbf16> {
  // expected-error @+1 {{'moe.ep_send' op result dimension 1 must be 2048 (input dimension 1), got 1024}}
  %y = moe.ep_send %x, %layout {axis = "ep", ranks = 2 : i64} : (tensor<?x2048xbf16>, tensor<2x4xi64>) -> tensor<?x1024xbf16>
  return %y : tensor<?x1024xbf16>
}

// -----

// Tests that a flat expert output is diagnosed (the verifier used to assert on it).
func.func @combine_expert_output_rank(%eo: tensor<?xbf16>, %ri: tensor<?x8xi32>, %rw: tensor<?x8xf32>) -> tensor<?x2048xbf16> {
  // expected-error @+1 {{'moe.combine' op expert_output must have rank 2, got 'tensor<?xbf16>'}}
  %y = moe.combine %eo, %ri, %rw : (tensor<?xbf16>, tensor<?x8xi32>, tensor<?x8xf32>) -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}

// -----

// Tests that token blocks keep the element type.
func.func @token_blocks_type(%x: tensor<?x16xbf16>) {
  // expected-error @+1 {{'moe.token_blocks' op block 'tensor<?x16xf32>' differs from 'tensor<?x16xbf16>' in element type or rank}}
  %a, %b = moe.token_blocks %x : tensor<?x16xbf16> -> tensor<?x16xbf16>, tensor<?x16xf32>
  return
}

// -----

// Tests that a block's row count is left to the runtime (the tokens per step).
func.func @token_blocks_rows(%x: tensor<?x16xbf16>) {
  // expected-error @+1 {{'moe.token_blocks' op block 'tensor<4x16xbf16>' must have a dynamic row count}}
  %a, %b = moe.token_blocks %x : tensor<?x16xbf16> -> tensor<4x16xbf16>, tensor<?x16xbf16>
  return
}

// -----

// Tests that the blocks keep the features.
func.func @concat_tokens_features(%a: tensor<?x16xbf16>, %b: tensor<?x8xbf16>) {
  // expected-error @+1 {{'moe.concat_tokens' op dimension 1 of block 'tensor<?x8xbf16>' differs from 'tensor<?x16xbf16>'}}
  %y = moe.concat_tokens %a, %b : tensor<?x16xbf16>, tensor<?x8xbf16> -> tensor<?x16xbf16>
  return
}

// -----

// Tests that one block is no split.
func.func @token_blocks_one(%x: tensor<?x16xbf16>) {
  // expected-error @+1 {{'moe.token_blocks' op needs at least 2 blocks, got 1}}
  %a = moe.token_blocks %x : tensor<?x16xbf16> -> tensor<?x16xbf16>
  return
}

// -----

// Tests that pre_activations are refused on experts whose backward does not read them (relu2).
func.func @expert_mlp_pre_activations_relu2(%tok: tensor<?x64xbf16>, %cnt: tensor<4xi64>, %up: tensor<4x32x64xbf16>, %down: tensor<4x64x32xbf16>) -> tensor<?x64xbf16> {
  // expected-error @+1 {{'moe.expert_mlp' op pre_activations are saved only for gated SiLU experts with a separate gate, no biases and no LoRA}}
  %o, %p = moe.expert_mlp %tok, %cnt, up %up, down %down {activation = #moe<activation relu2>} : (tensor<?x64xbf16>, tensor<4xi64>, tensor<4x32x64xbf16>, tensor<4x64x32xbf16>) -> (tensor<?x64xbf16>, tensor<?x64xf32>)
  return %o : tensor<?x64xbf16>
}

// -----

// Tests that pre_activations hold the gate's and the up's products side by side: 2 I columns.
func.func @expert_mlp_pre_activations_width(%tok: tensor<?x64xbf16>, %cnt: tensor<4xi64>, %up: tensor<4x32x64xbf16>, %down: tensor<4x64x32xbf16>, %gate: tensor<4x32x64xbf16>) -> tensor<?x64xbf16> {
  // expected-error @+1 {{'moe.expert_mlp' op pre_activations dimension 1 must be 64 (twice the expert intermediate size: gate, then up), got 32}}
  %o, %p = moe.expert_mlp %tok, %cnt, up %up, down %down gate %gate {activation = #moe<activation silu>} : (tensor<?x64xbf16>, tensor<4xi64>, tensor<4x32x64xbf16>, tensor<4x64x32xbf16>, tensor<4x32x64xbf16>) -> (tensor<?x64xbf16>, tensor<?x32xf32>)
  return %o : tensor<?x64xbf16>
}

// -----

// Tests that pre_activations are f32 (the products' accumulators, not a rounded copy).
func.func @expert_mlp_pre_activations_type(%tok: tensor<?x64xbf16>, %cnt: tensor<4xi64>, %up: tensor<4x32x64xbf16>, %down: tensor<4x64x32xbf16>, %gate: tensor<4x32x64xbf16>) -> tensor<?x64xbf16> {
  // expected-error @+1 {{'moe.expert_mlp' op result #1 must be ranked tensor of 32-bit float values, but got 'tensor<?x64xbf16>'}}
  %o, %p = moe.expert_mlp %tok, %cnt, up %up, down %down gate %gate {activation = #moe<activation silu>} : (tensor<?x64xbf16>, tensor<4xi64>, tensor<4x32x64xbf16>, tensor<4x64x32xbf16>, tensor<4x32x64xbf16>) -> (tensor<?x64xbf16>, tensor<?x64xbf16>)
  return %o : tensor<?x64xbf16>
}
