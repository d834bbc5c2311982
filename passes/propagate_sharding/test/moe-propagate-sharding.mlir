// RUN: moe-opt %inputs/tiny.mlir --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=ep=2}))' | FileCheck %s
// RUN: moe-opt %inputs/tiny.mlir --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=dp=2}))' | FileCheck %s --check-prefix=DP
// RUN: moe-opt %inputs/tiny.mlir --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=ep=2 ep-exchange=all}))' | FileCheck %s --check-prefix=ALL
// RUN: moe-opt %inputs/tiny.mlir --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=ep=2 ep-exchange=routed}))' | FileCheck %s --check-prefix=ROUTED
// RUN: not moe-opt %inputs/tiny.mlir --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=ep=2 ep-exchange=some}))' 2>&1 | FileCheck %s --check-prefix=BADEXCHANGE
// RUN: moe-opt %inputs/tiny.mlir --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=ep=2},moe-build-training-step))' | FileCheck %s --check-prefix=STEP
// RUN: moe-opt %inputs/tiny.mlir --moe-lora-training='seq-len=8 mesh=dp=2,ep=2' | FileCheck %s --check-prefix=PIPELINE
// RUN: moe-opt %inputs/tiny.mlir --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=tp=2}))' 2>&1 | FileCheck %s --check-prefix=TP
// RUN: not moe-opt %inputs/tiny.mlir --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=tp=3}))' 2>&1 | FileCheck %s --check-prefix=TP3
// RUN: moe-opt %inputs/gqa.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{targets=q_proj,o_proj rank=4},moe-propagate-sharding{mesh=tp=2}))' | FileCheck %s --check-prefix=HEADS
// RUN: moe-opt %inputs/parallel_mlps.mlir --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=tp=2}))' | FileCheck %s --check-prefix=MERGE
// RUN: moe-opt %inputs/dense_mlp.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{targets=up_proj,down_proj rank=4},moe-propagate-sharding{mesh=tp=2}))' | FileCheck %s --check-prefix=MLP
// RUN: moe-opt %inputs/gqa.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{targets=q_proj,o_proj rank=4},moe-propagate-sharding{mesh=tp=2},moe-build-training-step,moe-sync-gradients))' | FileCheck %s --check-prefix=HEADS-STEP
// RUN: moe-opt %inputs/gdn.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{targets=in_proj_qkvz,out_proj rank=2},moe-propagate-sharding{mesh=tp=2}))' | FileCheck %s --check-prefix=GDN
// RUN: moe-opt %inputs/mamba2.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{targets=out_proj rank=2},moe-propagate-sharding{mesh=tp=2}))' | FileCheck %s --check-prefix=MAMBA
// RUN: moe-opt %inputs/mamba2.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{targets=in_proj rank=2},moe-propagate-sharding{mesh=tp=2}))' 2>&1 | FileCheck %s --check-prefix=MAMBA-LORA
// RUN: moe-opt %inputs/mamba2.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{targets=in_proj rank=2},moe-propagate-sharding{mesh=tp=2},moe-build-training-step))' | FileCheck %s --check-prefix=MAMBA-LORA-STEP
// RUN: moe-opt %inputs/kda.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{targets=f_b_proj,o_proj rank=2},moe-propagate-sharding{mesh=tp=2}))' | FileCheck %s --check-prefix=KDA
// RUN: moe-opt %inputs/olmoe.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{targets=q_proj,k_proj rank=2},moe-propagate-sharding{mesh=tp=2}))' 2>&1 | FileCheck %s --check-prefix=OLMOE
// RUN: moe-opt %inputs/olmoe.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{targets=q_proj rank=2},moe-propagate-sharding{mesh=tp=2},moe-build-training-step))' | FileCheck %s --check-prefix=OLMOE-STEP
// RUN: not moe-opt %inputs/tiny.mlir --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=ep=3}))' 2>&1 | FileCheck %s --check-prefix=UNEVEN
// RUN: not moe-opt %inputs/tiny.mlir --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=dp=x}))' 2>&1 | FileCheck %s --check-prefix=BAD
// RUN: not moe-opt %inputs/tiny.mlir --pass-pipeline='builtin.module(moe.model(moe-build-training-step,moe-propagate-sharding{mesh=dp=2}))' 2>&1 | FileCheck %s --check-prefix=AFTER
// RUN: not moe-opt %inputs/tiny.mlir --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=dp=2},moe-propagate-sharding{mesh=dp=2}))' 2>&1 | FileCheck %s --check-prefix=TWICE

// Expert parallel: the expert parameters split over ep (their weights are one rank's two of
// the four experts). The route sends each token once to every rank holding one of its
// experts (with its experts as local numbers); the hidden state and the router weights go
// there; dispatch, expert MLP and combine run on the received tokens with the local experts;
// each rank's partial sums come back to the tokens' ranks.
// CHECK: moe.model @tiny attributes {mesh = "ep=2"}
// CHECK: moe.param @router {{.*}} : tensor<4x16xf32>{{$}}
// CHECK: moe.param @up {{.*}} : tensor<4x8x16xf32> sharding #moe.sharding<[ep, _, _]>
// CHECK: moe.param @down {{.*}} : tensor<4x16x8xf32> sharding #moe.sharding<[ep, _, _]>
// CHECK: %[[W:.*]], %[[IDX:.*]] = moe.router
// CHECK: %[[LOCAL:.*]], %[[LAYOUT:.*]] = moe.ep_route %[[IDX]] {axis = "ep", num_experts = 4 : i64, ranks = 2 : i64} : (tensor<?x2xi32>) -> (tensor<?x2xi32>, tensor<2x4xi64>)
// CHECK: %[[X:.*]] = moe.ep_send %[[H:.*]], %[[LAYOUT]] {axis = "ep", ranks = 2 : i64} : (tensor<?x16xf32>, tensor<2x4xi64>) -> tensor<?x16xf32>
// CHECK: %[[TOK:.*]], %[[CNT:.*]] = moe.dispatch %[[X]], %[[LOCAL]] {num_experts = 2 : i64} : (tensor<?x16xf32>, tensor<?x2xi32>) -> (tensor<?x16xf32>, tensor<2xi64>)
// CHECK: %[[UP:.*]] = moe.weight @up : tensor<2x8x16xf32>
// CHECK: %[[DOWN:.*]] = moe.weight @down : tensor<2x16x8xf32>
// CHECK: %[[Y:.*]] = moe.expert_mlp %[[TOK]], %[[CNT]], up %[[UP]], down %[[DOWN]]
// CHECK: %[[RW:.*]] = moe.ep_send %[[W]], %[[LAYOUT]] {axis = "ep", ranks = 2 : i64} : (tensor<?x2xf32>, tensor<2x4xi64>) -> tensor<?x2xf32>
// CHECK: %[[PART:.*]] = moe.combine %[[Y]], %[[LOCAL]], %[[RW]]
// CHECK: %[[OUT:.*]] = moe.ep_return %[[PART]], %[[LAYOUT]] {axis = "ep", ranks = 2 : i64}
// CHECK: moe.add %{{.*}}, %[[OUT]]

// How tokens travel (ep-exchange): the default (auto) routes here, since with top-2 of 4
// experts over 2 ranks a token has no expert on a given rank with probability
// C(2,2)/C(4,2) = 1/6 (auto sends every token only when that is below 0.1). `all` marks the
// route: every token to every rank.
// ALL: moe.ep_route %{{.*}} {all_tokens, axis = "ep", num_experts = 4 : i64, ranks = 2 : i64}
// ROUTED: moe.ep_route %{{.*}} {axis = "ep", num_experts = 4 : i64, ranks = 2 : i64}
// BADEXCHANGE: ep-exchange must be auto, routed or all, got 'some'

// Data parallel only: the mesh, nothing else.
// DP: moe.model @tiny attributes {mesh = "dp=2"}
// DP-NOT: sharding
// DP-NOT: moe.ep_

// The training step differentiates through the exchange: a send's backward is a return of
// the gradient and the other way round, over the same layout (the router weights' gradient
// comes back summed like the hidden state's).
// STEP-LABEL: moe.layer @block_bwd
// STEP: moe.ep_send %{{.*}}, %[[L:.*]] {axis = "ep", ranks = 2 : i64}
// STEP: moe.backward "moe.combine"
// STEP: moe.ep_return %{{.*}}, %[[L]] {axis = "ep", ranks = 2 : i64} : (tensor<?x2xf32>
// STEP: moe.backward "moe.expert_mlp"
// STEP: moe.backward "moe.dispatch"
// STEP: moe.ep_return %{{.*}}, %[[L]] {axis = "ep", ranks = 2 : i64} : (tensor<?x16xf32>
// STEP: moe.backward "moe.router"

// The pipeline places the model before the step and sums gradients after it.
// PIPELINE: mesh = "dp=2,ep=2"
// PIPELINE: moe.ep_route
// PIPELINE: moe.all_reduce_grads {axis = "dp+ep", layer = 1 : i64}

// Tensor parallel on experts: each rank computes every expert on its half of the intermediate
// features (up by rows, down by columns), from the same tokens (moe.tp_enter: their gradient is
// summed over tp) to a partial output, summed before the combine (moe.tp_exit).
// TP: moe.param @up {{.*}} : tensor<4x8x16xf32> sharding #moe.sharding<[_, tp, _]>
// TP-NEXT: moe.param @down {{.*}} : tensor<4x16x8xf32> sharding #moe.sharding<[_, _, tp]>
// The tokens enter before the dispatch and the partial sums leave after the combine (both are
// linear in the tokens: the all-reduces carry one row per token, not one per expert copy); the
// router reads the entered tokens (its weights' partial gradient reaches theirs through its
// backward: no entry of their own).
// TP: %[[IN:.*]] = moe.tp_enter %{{.*}} {axis = "tp"} : tensor<?x16xf32>
// TP-NEXT: %weights, %indices = moe.router %[[IN]],
// TP-NEXT: %tokens, %counts = moe.dispatch %[[IN]], %indices
// TP: %[[Y:.*]] = moe.expert_mlp %tokens, %counts, up %{{.*}}, down %{{.*}} {{.*}} : (tensor<?x16xf32>, tensor<4xi64>, tensor<4x4x16xf32>, tensor<4x16x4xf32>) -> tensor<?x16xf32>
// TP-NEXT: %[[C:.*]] = moe.combine %[[Y]], %indices, %weights
// TP-NEXT: moe.tp_exit %[[C]] {axis = "tp"} : tensor<?x16xf32> -> tensor<?x16xf32>
// TP3: error: --moe-propagate-sharding: tp = 3 splits attention heads (moe.attention, moe.mla, moe.sparse_attention, moe.kda, moe.gated_delta_net, moe.mamba2), dense MLPs and expert MLPs, and @block (experts) cannot: its intermediate size does not split over tp;

// Tensor parallel: the attention's heads split over tp (2 of 4 query heads, 1 of 2 key/value
// heads per rank). q/k/v projections split by rows (their outputs are this rank's heads), the
// output projection by columns (its output is a partial sum); the adapters follow (B of q by
// rows, A of o by columns); the replicated A of q and B of o get partial gradients (each rank
// sees its heads' share), summed over tp after the backward. The normed input enters the
// region through moe.tp_enter (its gradient is summed over tp), the partial output leaves it
// through moe.tp_exit (the all-reduce) before the residual add.
// HEADS: moe.param @self_attn_q_proj {{.*}} : tensor<64x64xf32> sharding #moe.sharding<[tp, _]>
// HEADS-NEXT: moe.param @self_attn_q_proj_lora_A {{.*}} trainable : tensor<4x64xf32> {moe.tp_partial_grad}
// HEADS-NEXT: moe.param @self_attn_q_proj_lora_B {{.*}} trainable : tensor<64x4xf32> sharding #moe.sharding<[tp, _]>
// HEADS-NEXT: moe.param @self_attn_k_proj {{.*}} : tensor<32x64xf32> sharding #moe.sharding<[tp, _]>
// HEADS-NEXT: moe.param @self_attn_v_proj {{.*}} : tensor<32x64xf32> sharding #moe.sharding<[tp, _]>
// HEADS: moe.param @self_attn_o_proj {{.*}} : tensor<64x64xf32> sharding #moe.sharding<[_, tp]>
// HEADS-NEXT: moe.param @self_attn_o_proj_lora_A {{.*}} trainable : tensor<4x64xf32> sharding #moe.sharding<[_, tp]>
// HEADS-NEXT: moe.param @self_attn_o_proj_lora_B {{.*}} trainable : tensor<64x4xf32> {moe.tp_partial_grad}
// HEADS: %[[N:.*]] = moe.rms_norm %arg0
// HEADS-NEXT: %[[IN:.*]] = moe.tp_enter %[[N]] {axis = "tp"} : tensor<?x64xf32>
// HEADS: moe.linear %[[IN]], %{{.*}} : (tensor<?x64xf32>, tensor<32x64xf32>) -> tensor<?x32xf32>
// HEADS: moe.attention {{.*}} {head_dim = 16 : i64, num_heads = 2 : i64, num_kv_heads = 1 : i64, {{.*}}} : (tensor<?x32xf32>, tensor<?x16xf32>, tensor<?x16xf32>) -> tensor<?x32xf32>
// HEADS: %[[SUM:.*]] = moe.add
// HEADS-NEXT: %[[OUT:.*]] = moe.tp_exit %[[SUM]] {axis = "tp"} : tensor<?x64xf32> -> tensor<?x64xf32>
// HEADS-NEXT: moe.add %arg0, %[[OUT]]
// The backward of tp_enter is the sum over tp (tp_exit on the gradient); the partial
// gradients get their own bucket, over tp.
// HEADS-STEP: moe.layer @gqa_moe_bwd
// HEADS-STEP: moe.tp_exit %{{.*}} {axis = "tp"}
// HEADS-STEP: moe.all_reduce_grads {axis = "dp+ep+tp", layer = 1 : i64, tp_partial}
// OLMoE's q/k norms span every head: split over tp = 2 with the heads (each rank 32 of the 64
// features and of the weight), each rank's sum of squares is summed over tp (moe.tp_sum) and
// normalises its features as the whole rows' statistic would. No warning: the attention splits.
// OLMOE-NOT: warning
// OLMOE: moe.param @self_attn_q_norm {{.*}} : tensor<64xf32> sharding #moe.sharding<[tp]>
// OLMOE: %[[Q:.*]] = moe.add
// OLMOE: %[[W:.*]] = moe.weight @self_attn_q_norm : tensor<32xf32>
// OLMOE-NEXT: %[[MINE:.*]] = moe.row_sum_of_squares %[[Q]] : (tensor<?x32xf32>) -> tensor<?x1xf32>
// OLMOE-NEXT: %[[ROWS:.*]] = moe.tp_sum %[[MINE]] {axis = "tp"} : tensor<?x1xf32>
// OLMOE-NEXT: %[[N:.*]] = moe.sharded_rms_norm %[[Q]], %[[W]], %[[ROWS]] {eps = 1.000000e-05 : f64, features = 64 : i64} : (tensor<?x32xf32>, tensor<32xf32>, tensor<?x1xf32>) -> tensor<?x32xf32>
// OLMOE-NEXT: moe.weight @self_attn_k_norm : tensor<32xf32>
// OLMOE-NEXT: moe.row_sum_of_squares
// OLMOE-NEXT: moe.tp_sum
// OLMOE-NEXT: moe.sharded_rms_norm {{.*}} features = 64
// OLMOE: moe.rope %[[N]]
// OLMOE: moe.attention {{.*}} num_heads = 2 : i64, num_kv_heads = 2 : i64
// In the backward the statistic's gradient, which every rank's features give part of, is summed
// over tp again before it reaches each rank's q through row_sum_of_squares.
// OLMOE-STEP: moe.layer @gqa_moe_bwd
// OLMOE-STEP: %[[DS:.*]]:2 = moe.backward "moe.sharded_rms_norm"({{.*}}grad_of_inputs = array<i64: 0, 2>
// OLMOE-STEP-NEXT: %[[SUM:.*]] = moe.tp_sum %[[DS]]#1 {axis = "tp"} : tensor<?x1xf32>
// OLMOE-STEP-NEXT: moe.backward "moe.row_sum_of_squares"({{.*}}) grads(%[[SUM]])
// UNEVEN: error: 'moe.expert_mlp' op has 4 experts, which do not split over ep = 3
// BAD: error: --moe-propagate-sharding: mesh 'dp=x': size of dp must be a whole number >= 1, not 'x'
// AFTER: error: --moe-propagate-sharding: runs before --moe-build-training-step (the step differentiates through the collectives); the model already has @train_step
// TWICE: error: --moe-propagate-sharding: the model is placed already (mesh = "dp=2")

// A dense MLP over tp = 2 splits its 32 intermediate features: gate, up and the up adapter's B
// on out, down and the down adapter's A on in; the adapters' other factors are replicated with
// gradients summed over tp. The norm's output enters once, the down projection and its adapter
// are partial sums added before one moe.tp_exit, then the residual.
// MLP: moe.param @mlp_gate_proj {{.*}} : tensor<32x16xf32> sharding #moe.sharding<[tp, _]>
// MLP: moe.param @mlp_up_proj {{.*}} : tensor<32x16xf32> sharding #moe.sharding<[tp, _]>
// MLP: moe.param @mlp_up_proj_lora_A {{.*}} trainable : tensor<4x16xf32> {moe.tp_partial_grad}
// MLP: moe.param @mlp_up_proj_lora_B {{.*}} trainable : tensor<32x4xf32> sharding #moe.sharding<[tp, _]>
// MLP: moe.param @mlp_down_proj {{.*}} : tensor<16x32xf32> sharding #moe.sharding<[_, tp]>
// MLP: moe.param @mlp_down_proj_lora_A {{.*}} trainable : tensor<4x32xf32> sharding #moe.sharding<[_, tp]>
// MLP: moe.param @mlp_down_proj_lora_B {{.*}} trainable : tensor<16x4xf32> {moe.tp_partial_grad}
// MLP: %[[N:.*]] = moe.rms_norm
// MLP-NEXT: %[[IN:.*]] = moe.tp_enter %[[N]] {axis = "tp"} : tensor<?x16xf32>
// MLP: moe.linear %[[IN]], {{.*}} -> tensor<?x16xf32>
// MLP: %[[H:.*]] = moe.glu {{.*}} : tensor<?x16xf32>
// MLP: %[[D:.*]] = moe.linear %[[H]], {{.*}} : (tensor<?x16xf32>, tensor<16x16xf32>) -> tensor<?x16xf32>
// MLP: %[[DL:.*]] = moe.lora %[[H]]
// MLP: %[[SUM:.*]] = moe.add %[[D]], %[[DL]]
// MLP-NEXT: %[[OUT:.*]] = moe.tp_exit %[[SUM]] {axis = "tp"}
// MLP-NEXT: moe.add %arg0, %[[OUT]]

// Two split MLPs of one input, summed: one moe.tp_enter for both (one all-reduce of the input's
// gradient) and one moe.tp_exit of the sum of their partial outputs.
// MERGE: %[[IN:.*]] = moe.tp_enter %{{.*}} {axis = "tp"} : tensor<?x16xf32>
// MERGE-NOT: moe.tp_enter
// MERGE: moe.glu {{.*}} : tensor<?x16xf32>
// MERGE: moe.linear %[[IN]], {{.*}} -> tensor<?x8xf32>
// MERGE: moe.activation {{.*}} : tensor<?x8xf32>
// MERGE: %[[SUM:.*]] = moe.add
// MERGE-NEXT: %[[OUT:.*]] = moe.tp_exit %[[SUM]] {axis = "tp"}
// MERGE-NEXT: moe.add %arg0, %[[OUT]]
// MERGE-NOT: moe.tp_exit

// Gated DeltaNet splits its key heads with their value heads: in_proj_qkvz and in_proj_ba hold one
// group per key head, so they split on out (the adapter's B too); the convolution over
// concat(q, k, v) splits each of its three parts (moe.tp_pieces: the parts' whole extents);
// A_log and dt_bias by value head; the shared norm stays whole; one partial sum leaves after
// out_proj.
// GDN: moe.param @in_proj_qkvz {{.*}} : tensor<48x16xf32> sharding #moe.sharding<[tp, _]>
// GDN: moe.param @in_proj_qkvz_lora_A {{.*}} : tensor<2x16xf32> {moe.tp_partial_grad}
// GDN: moe.param @in_proj_qkvz_lora_B {{.*}} sharding #moe.sharding<[tp, _]>
// GDN: moe.param @in_proj_ba {{.*}} sharding #moe.sharding<[tp, _]>
// GDN: moe.param @conv {{.*}} : tensor<32x1x4xf32> sharding #moe.sharding<[tp, _, _]> {moe.tp_pieces = array<i64: 8, 8, 16>}
// GDN: moe.param @a_log {{.*}} : tensor<4xf32> sharding #moe.sharding<[tp]>
// GDN: moe.param @dt_bias {{.*}} : tensor<4xf32> sharding #moe.sharding<[tp]>
// GDN: moe.param @o_norm {{.*}} : tensor<4xf32>{{$}}
// GDN: moe.param @out_proj {{.*}} sharding #moe.sharding<[_, tp]>
// GDN: %[[IN:.*]] = moe.tp_enter
// GDN: moe.linear %[[IN]], {{.*}} -> tensor<?x24xf32>
// GDN: moe.linear %[[IN]], {{.*}} -> tensor<?x4xf32>
// GDN: %[[O:.*]] = moe.gated_delta_net {{.*}} num_key_heads = 1 : i64, num_value_heads = 2 : i64{{.*}} -> tensor<?x8xf32>
// GDN: moe.linear %[[O]], {{.*}} : (tensor<?x8xf32>, tensor<16x8xf32>) -> tensor<?x16xf32>
// GDN: moe.tp_exit
// GDN-NEXT: moe.add %arg0

// Mamba-2 splits its heads with their groups: in_proj in five pieces (z, x, B, C, dt, each split),
// the convolution and its bias in three (x, B, C), dt_bias, A_log and D by head, the grouped
// norm's weight by group; one partial sum leaves after out_proj.
// MAMBA: moe.param @in_proj {{.*}} : tensor<34x16xf32> sharding #moe.sharding<[tp, _]> {moe.tp_pieces = array<i64: 8, 8, 8, 8, 2>}
// MAMBA: moe.param @conv {{.*}} sharding #moe.sharding<[tp, _, _]> {moe.tp_pieces = array<i64: 8, 8, 8>}
// MAMBA: moe.param @conv_bias {{.*}} sharding #moe.sharding<[tp]> {moe.tp_pieces = array<i64: 8, 8, 8>}
// MAMBA: moe.param @dt_bias {{.*}} sharding #moe.sharding<[tp]>
// MAMBA: moe.param @a_log {{.*}} sharding #moe.sharding<[tp]>
// MAMBA: moe.param @d {{.*}} sharding #moe.sharding<[tp]>
// MAMBA: moe.param @mixer_norm {{.*}} sharding #moe.sharding<[tp]>
// MAMBA: moe.param @out_proj {{.*}} sharding #moe.sharding<[_, tp]>
// MAMBA: %[[IN:.*]] = moe.tp_enter
// MAMBA: moe.linear %[[IN]], {{.*}} -> tensor<?x17xf32>
// MAMBA: %[[O:.*]] = moe.mamba2 {{.*}} num_groups = 1 : i64, num_heads = 1 : i64{{.*}} -> tensor<?x4xf32>
// MAMBA: moe.linear %[[O]], {{.*}} : (tensor<?x4xf32>, tensor<16x4xf32>) -> tensor<?x16xf32>
// MAMBA: moe.tp_exit
// MAMBA-NEXT: moe.add %arg0

// An adapter on in_proj stays whole on every rank (A and B replicated, their gradients partial:
// summed over tp); each rank keeps its columns of each of the adapter output's five pieces
// (moe.tp_slice_features) and adds them to its in_proj pieces. No warning: the mixer splits.
// MAMBA-LORA-NOT: warning
// MAMBA-LORA: moe.param @in_proj_lora_A {{.*}} trainable : tensor<2x16xf32> {moe.tp_partial_grad}
// MAMBA-LORA-NEXT: moe.param @in_proj_lora_B {{.*}} trainable : tensor<34x2xf32> {moe.tp_partial_grad}
// MAMBA-LORA: %[[IN:.*]] = moe.tp_enter
// MAMBA-LORA: %[[BASE:.*]] = moe.linear %[[IN]], {{.*}} -> tensor<?x17xf32>
// MAMBA-LORA: %[[DELTA:.*]] = moe.lora %[[IN]], {{.*}} -> tensor<?x34xf32>
// MAMBA-LORA-NEXT: %[[MINE:.*]] = moe.tp_slice_features %[[DELTA]] {axis = "tp", pieces = array<i64: 8, 8, 8, 8, 2>, ranks = 2 : i64} : (tensor<?x34xf32>) -> tensor<?x17xf32>
// MAMBA-LORA-NEXT: moe.add %[[BASE]], %[[MINE]] : tensor<?x17xf32>
// The backward puts the rank's columns of the gradient back in place (zeros elsewhere) for the
// adapter's backward; it saves no [T, 34] output of the adapter for that.
// MAMBA-LORA-STEP: moe.layer @mamba2_bwd
// MAMBA-LORA-STEP: %[[G:.*]] = moe.tp_place_features %{{.*}} {axis = "tp", pieces = array<i64: 8, 8, 8, 8, 2>, ranks = 2 : i64} : (tensor<?x17xf32>) -> tensor<?x34xf32>
// MAMBA-LORA-STEP-NEXT: moe.backward "moe.lora"({{.*}}) grads(%[[G]])

// KDA splits its heads: q/k/v, the beta logits and the second projections of the low-rank decay
// and gate split on out (the first stays whole: its output enters the region), the per-channel
// convolutions and dt_bias by channel, A_log by head; the shared per-head norm stays whole; one
// partial sum leaves after o_proj.
// KDA: moe.param @q_proj {{.*}} sharding #moe.sharding<[tp, _]>
// KDA: moe.param @q_conv {{.*}} : tensor<16x1x4xf32> sharding #moe.sharding<[tp, _, _]>
// KDA: moe.param @f_a_proj {{.*}} : tensor<4x16xf32>{{$}}
// KDA: moe.param @f_b_proj {{.*}} sharding #moe.sharding<[tp, _]>
// KDA: moe.param @f_b_proj_lora_A {{.*}} {moe.tp_partial_grad}
// KDA: moe.param @f_b_proj_lora_B {{.*}} sharding #moe.sharding<[tp, _]>
// KDA: moe.param @b_proj {{.*}} sharding #moe.sharding<[tp, _]>
// KDA: moe.param @g_a_proj {{.*}} : tensor<4x16xf32>{{$}}
// KDA: moe.param @a_log {{.*}} : tensor<1x1x4x1xf32> sharding #moe.sharding<[_, _, tp, _]>
// KDA: moe.param @dt_bias {{.*}} : tensor<16xf32> sharding #moe.sharding<[tp]>
// KDA: moe.param @o_norm {{.*}} : tensor<4xf32>{{$}}
// KDA: moe.param @o_proj {{.*}} sharding #moe.sharding<[_, tp]>
// KDA: %[[X:.*]] = moe.rms_norm
// KDA-NEXT: %[[IN:.*]] = moe.tp_enter %[[X]] {axis = "tp"} : tensor<?x16xf32>
// KDA: %[[FA:.*]] = moe.linear %[[X]], {{.*}} -> tensor<?x4xf32>
// KDA-NEXT: %[[FAIN:.*]] = moe.tp_enter %[[FA]] {axis = "tp"} : tensor<?x4xf32>
// KDA: moe.linear %[[FAIN]], {{.*}} -> tensor<?x8xf32>
// KDA: %[[O:.*]] = moe.kda {{.*}} num_heads = 2 : i64{{.*}} -> tensor<?x8xf32>
// KDA: moe.linear %[[O]], {{.*}} : (tensor<?x8xf32>, tensor<16x8xf32>) -> tensor<?x16xf32>
// KDA: moe.tp_exit
// KDA-NEXT: moe.add %arg0
