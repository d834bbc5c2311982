// Sequence parallel (tp = 2): between the split regions each tp rank holds its rows of the
// hidden states. The attention's and the experts' inputs are gathered (tp_enter with rows: an
// all-gather), their partial sums leave through a reduce-scatter (tp_exit with rows), the
// router runs on the gathered rows inside the experts' region, the embedding
// is sliced and @forward's logits gathered. The training step scores the rank's rows against
// its rows of the labels, shifted first.
// RUN: moe-opt %inputs/gqa.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{targets=q_proj,o_proj rank=4},moe-propagate-sharding{mesh=tp=2 sequence-parallel=true}))' | FileCheck %s
// RUN: moe-opt %inputs/gqa.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{targets=q_proj,o_proj rank=4},moe-propagate-sharding{mesh=tp=2 sequence-parallel=true},moe-build-training-step))' | FileCheck %s --check-prefix=STEP
// An attention kept whole (4 heads, 2 key/value heads over tp = 4) reads gathered rows, and
// its output is sliced back to the rank's rows; q's adapter, on the rank's rows, gets a
// partial gradient, o's, on every row, the whole one.
// RUN: moe-opt %inputs/gqa.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{targets=q_proj,o_proj rank=4},moe-propagate-sharding{mesh=tp=4 sequence-parallel=true}))' 2>/dev/null | FileCheck %s --check-prefix=WHOLE
// RUN: not moe-opt %inputs/gqa.mlir --pass-pipeline='builtin.module(moe.model(moe-propagate-sharding{mesh=dp=2 sequence-parallel=true}))' 2>&1 | FileCheck %s --check-prefix=NO-TP
// RUN: not moe-opt %inputs/gqa.mlir --moe-lora-training='seq-len=8 sequence-parallel=true' 2>&1 | FileCheck %s --check-prefix=NO-MESH

// CHECK: moe.model @Qwen3MoeForCausalLM attributes {{{.*}}sequence_parallel
// CHECK-LABEL: moe.layer @gqa_moe(
// CHECK: %[[NORM:.*]] = moe.rms_norm %arg0
// CHECK: %[[X:.*]] = moe.tp_enter %[[NORM]] {axis = "tp", rows}
// CHECK: moe.linear %[[X]]
// CHECK: moe.attention
// CHECK: %[[ATTN:.*]] = moe.tp_exit %{{.*}} {axis = "tp", rows}
// CHECK: %[[H:.*]] = moe.add %arg0, %[[ATTN]]
// CHECK: %[[NORM2:.*]] = moe.rms_norm %[[H]]
// CHECK: %[[TOKENS:.*]] = moe.tp_enter %[[NORM2]] {axis = "tp", rows}
// CHECK: %weights, %indices = moe.router %[[TOKENS]]
// CHECK: moe.dispatch %[[TOKENS]], %indices
// CHECK: moe.combine %{{.*}}, %indices, %weights
// CHECK: %[[MOE:.*]] = moe.tp_exit %{{.*}} {axis = "tp", rows}
// CHECK: %[[OUT:.*]] = moe.add %[[H]], %[[MOE]]
// CHECK: moe.yield %[[OUT]]
// CHECK-LABEL: func.func @forward(
// CHECK: %[[E:.*]] = moe.embedding
// CHECK: %[[MINE:.*]] = moe.tp_slice %[[E]] {axis = "tp"}
// CHECK: moe.apply_layer @gqa_moe[0] (%[[MINE]], %arg1)
// CHECK: %[[LOGITS:.*]] = moe.linear
// CHECK: %[[ALL:.*]] = moe.tp_gather %[[LOGITS]] {axis = "tp"} : tensor<?x256xf32>
// CHECK: return %[[ALL]]

// STEP-LABEL: func.func @train_step(
// STEP: %[[LOGITS:.*]] = moe.linear
// STEP-NOT: moe.tp_gather
// STEP: %[[NEXT:.*]] = moe.shift_labels %arg2
// STEP: %[[MINE:.*]] = moe.tp_slice %[[NEXT]] {axis = "tp"} : tensor<?xi64>
// STEP: moe.cross_entropy %[[LOGITS]], %[[MINE]] :

// WHOLE: moe.param @self_attn_q_proj_lora_A {{.*}} {moe.tp_partial_grad}
// WHOLE: moe.param @self_attn_q_proj_lora_B {{.*}} {moe.tp_partial_grad}
// WHOLE-NOT: moe.param @self_attn_o_proj_lora_A {{.*}}tp_partial_grad
// WHOLE: moe.param @self_attn_o_proj_lora_B "{{[^"]*}}" trainable : tensor<64x4xf32>{{$}}
// WHOLE: %[[Q:.*]] = moe.tp_gather %{{.*}} {axis = "tp"} : tensor<?x64xf32>
// WHOLE: %[[RESULT:.*]] = moe.attention %[[Q]]
// WHOLE: %[[O:.*]] = moe.add
// WHOLE: %[[ROWS:.*]] = moe.tp_slice %[[O]] {axis = "tp"}
// WHOLE: moe.add %arg0, %[[ROWS]]

// NO-TP: error: --moe-propagate-sharding: sequence-parallel needs tp > 1 (it splits the tokens over tp); mesh dp=2
// NO-MESH: error: --moe-propagate-sharding: sequence-parallel needs tp > 1 (it splits the tokens over tp); mesh dp=1
