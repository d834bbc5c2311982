//===- compile_mesh.mlir - moec compile --mesh ----------------------------===//
//
// The golden qwen3_moe model (8 experts, top-2) on meshes: a plan with one
// program per rank (dp, ep; tp), and the simulated report for any mesh.
//
// RUN: moec compile %inputs/golden_qwen3_moe.json --lora-targets q_proj --lora-rank 4 \
// RUN:   --seq-len 96 --micro-batch 1 --mesh dp=2,ep=2 --emit=plan-text | FileCheck %s
// RUN: moec compile %inputs/golden_qwen3_moe.json --lora-targets q_proj --seq-len 96 \
// RUN:   --mesh dp=2,tp=2,pp=2,ep=2 --sequence-parallel=false --emit=report 2>/dev/null | FileCheck %s --check-prefix=REPORT
// RUN: moec compile %inputs/golden_qwen3_moe.json --lora-targets q_proj --seq-len 96 \
// RUN:   --mesh dp=2,ep=2 --emit=report | FileCheck %s --check-prefix=PLANREPORT
// RUN: moec compile %inputs/golden_qwen3_moe.json --lora-targets q_proj,o_proj --lora-rank 4 --seq-len 96 \
// RUN:   --mesh tp=2 --emit=plan-text | FileCheck %s --check-prefix=TP
// RUN: moec compile %inputs/golden_qwen3_moe.json --dtype bfloat16 --seq-len 96 --mesh ep=2 --emit=mlir \
// RUN:   | FileCheck %s --check-prefix=WIDE
// RUN: moec compile %root/models/deepseek-v3/config.json --seq-len 64 --mesh tp=8 --emit=report \
// RUN:   | FileCheck %s --check-prefix=LATENT
// RUN: moec compile %root/models/seed-case-2.8t/config.json --mesh dp=16,tp=8,pp=4,ep=32 --emit=report \
// RUN:   | FileCheck %s --check-prefix=SEED
// RUN: moec compile %root/models/seed-case-2.8t/config.json --mesh dp=16,tp=8,pp=4,ep=32 --sequence-parallel \
// RUN:     --ep-capacity-factor 2 --emit=report | FileCheck %s --check-prefix=SEED-FITS
// RUN: moec compile %root/models/qwen3-30b-a3b/config.json --seq-len 1024 --mesh ep=4,pp=2,tp=2 --sequence-parallel \
// RUN:     --ep-capacity-factor 1.5 --emit=report 2>/dev/null | FileCheck %s --check-prefix=FIXED-ROOM
// RUN: moec compile %root/models/qwen3-30b-a3b/config.json --seq-len 8192 --micro-batch 4 --mesh tp=2,pp=2,ep=2 \
// RUN:     --ep-exchange routed --sequence-parallel=false --emit=report 2>/dev/null | FileCheck %s --check-prefix=NO-HELP
// RUN: moec compile %root/models/qwen3-30b-a3b/config.json --seq-len 4096 --mesh tp=2,pp=2,ep=2 --sequence-parallel \
// RUN:     --ep-exchange routed --ep-capacity-factor 1.5 --memory-cap 60GB --emit=report | FileCheck %s --check-prefix=CAPPED
// RUN: moec compile %inputs/golden_qwen3_moe.json --seq-len 96 --mesh tp=2,ep=2 --sequence-parallel=false \
// RUN:     -o %t.moeplan 2>&1 | FileCheck %s --check-prefix=TPEP
// RUN: moec compile %inputs/golden_qwen3_moe.json --seq-len 95 --mesh tp=2,ep=2 -o %t.moeplan 2>&1 \
// RUN:   | FileCheck %s --check-prefix=TPEP-ODD
// RUN: moec compile %inputs/golden_qwen3_moe.json --seq-len 96 --mesh tp=2,ep=2 --emit=plan-text 2>&1 \
// RUN:   | FileCheck %s --check-prefix=TPEP-SP
// RUN: not moec compile %inputs/golden_qwen3_moe.json --mesh ep=2,ep=4 2>&1 \
// RUN:   | FileCheck %s --check-prefix=TWICE
// RUN: moec compile %inputs/golden_qwen3_moe.json --lora-targets q_proj --seq-len 96 --mesh ep=2 \
// RUN:   --expert-load %inputs/qwen3_moe_metrics.jsonl --emit=plan-text 2>&1 | FileCheck %s --check-prefix=LOAD
// RUN: not moec compile %inputs/golden_qwen3_moe.json --expert-load %inputs/qwen3_moe_metrics.jsonl 2>&1 \
// RUN:   | FileCheck %s --check-prefix=LOADNOEP
// RUN: not moec compile %inputs/golden_qwen3_moe.json --mesh ep=4 --expert-load %inputs/golden_qwen3_moe.json 2>&1 \
// RUN:   | FileCheck %s --check-prefix=LOADBAD

// Four ranks, ep before dp: rank 1 is the second expert-parallel rank of the first
// data-parallel pair. Each binds its half of the experts; the expert exchange runs over ep,
// the attention adapters' gradients over all four.
// CHECK: mesh dp=2 tp=1 pp=1 ep=2 world=4
// CHECK: rank 0
// CHECK: group 0 ep [0,1]
// CHECK: group 1 dp+ep [0,1,2,3]
// CHECK: "layer0.ep_route.{{[0-9]+}}#0" rows_of %[[ROUTED:[0-9]+]]
// CHECK: "layer0.dispatch.{{[0-9]+}}#0" copies_of %[[ROUTED]]
// CHECK: weight f32 [4,32,64]{{.*}}"model.layers.0.mlp.experts.{expert}.gate_proj.weight"
// CHECK: bind %{{[0-9]+}} "model.layers.0.mlp.experts.{expert}.gate_proj.weight" first_expert=0
// CHECK: expert_route g0
// CHECK: expert_send g0
// CHECK: expert_mlp
// CHECK: expert_return g0
// CHECK: all_reduce g1
// CHECK: rank 1
// CHECK: group 0 ep [0,1]
// CHECK: bind %{{[0-9]+}} "model.layers.0.mlp.experts.{expert}.gate_proj.weight" first_expert=4
// CHECK: rank 2
// CHECK: group 0 ep [2,3]
// CHECK: bind %{{[0-9]+}} "model.layers.0.mlp.experts.{expert}.gate_proj.weight" first_expert=0

// Without sequence parallel (a tp all-reduce): the estimate plans the mesh without pp (dp=2,tp=2,ep=2) and splits its layers over the two
// stages: each stage's collectives run once per micro-batch (4), the gradient sums once a step.
// REPORT: mesh dp=2,tp=2,pp=2,ep=2: 16 GPUs
// REPORT: recompute: none; sequence parallel: no; expert exchange room: every token of every rank
// REPORT: memory per GPU
// REPORT: fits in 141 GB: yes
// REPORT: all_reduce      LoRA gradients        step      dp+ep          4       1
// REPORT: all_reduce      tp partial sums       fwd       tp             2       4
// REPORT: expert_send     tokens to experts     fwd       ep             2       8
// REPORT: send_recv       activations           fwd       pp             2       4
// REPORT: planned: the passes place the model on the mesh without pp (dp=2,tp=2,ep=2)

// A mesh that small is planned too: each pipeline stage's own collectives follow. One layer
// per stage, four micro-batches of 96 tokens: the attention's partial output [96, 64] f32
// (24,576 bytes; a ring of two sends it once) is summed over tp once per micro-batch, its
// input's gradient once per backward; stage 0 sends each micro-batch's hidden state (24,576
// bytes) to stage 1, four in all (those issued with a backward's exchange count there).
// REPORT: the plan's own collectives, pipeline stage 0 of 2:
// REPORT: all_reduce       tp       forward        4         98,304  the partial sums of split heads
// REPORT: all_reduce       tp       backward       4         98,304
// REPORT: send_recv        pp       forward        1         24,576  a micro-batch's hidden state to the next pipeline stage
// REPORT: send_recv        pp       backward       4         73,728
// REPORT: where they come from (--moe-propagate-sharding):
// REPORT-NEXT: the 4 heads of @gqa_moe's attention split over tp = 2 (2 per rank): all_reduce x8
// REPORT-NEXT: the 8 experts of @gqa_moe split over ep = 2 (4 per rank): expert_return x12, expert_route x4, expert_send x12
// REPORT: the plan's own collectives, pipeline stage 1 of 2:

// A plan's report lists its collectives. Per layer (2), a token goes to the other
// expert-parallel rank when one of its 2 experts (of 8) is there: all but C(4,2)/C(8,2) = 6/28
// of the 96 tokens. Its hidden state (64 f32: 256 bytes) goes there and its partial sum comes
// back (96 x 256 x 22/28 = 19,310 bytes a layer each way), with its router weights (2 f32:
// 603 bytes) and its experts (2 i32, the route: 603 bytes); the backward returns what the
// forward sent and sends what it returned. The adapter of q_proj (A [8, 64], B [64, 8], f32:
// 4,096 bytes a layer) is summed over all four ranks: a ring sends 2 x 3/4 of it.
// PLANREPORT: collectives per step (mesh dp=2,ep=2; bytes this rank sends, uniform routing):
// PLANREPORT: all_reduce       dp+ep    backward       2         12,288  LoRA gradients
// PLANREPORT: expert_return    ep       forward        2         38,620  each rank's partial expert sums back
// PLANREPORT: expert_return    ep       backward       4         39,826
// PLANREPORT: expert_route     ep       forward        2          1,206  each token's experts
// PLANREPORT: expert_send      ep       forward        4         39,826  hidden states and router weights
// PLANREPORT: expert_send      ep       backward       2         38,620
// Each kind, traced to the sharding that inserted it (two layer instances of one template).
// PLANREPORT: where they come from (--moe-propagate-sharding):
// PLANREPORT-NEXT: the 8 experts of @gqa_moe split over ep = 2 (4 per rank): expert_return x6, expert_route x2, expert_send x6

// On bf16 data each expert-parallel rank's partial sum stays f32, and the return rounds the
// ranks' sum once, as one GPU's combine rounds its sum.
// WIDE: %[[PART:.*]] = moe.combine %{{.*}} : (tensor<?x64xbf16>, tensor<?x2xi32>, tensor<?x2xf32>) -> tensor<?x64xf32>
// WIDE-NEXT: %[[SUM:.*]] = moe.ep_return %[[PART]], %{{.*}} : (tensor<?x64xf32>, tensor<2x4xi64>) -> tensor<?x64xbf16>
// WIDE-NEXT: moe.add %{{.*}}, %[[SUM]] : tensor<?x64xbf16>

// Tensor parallel: each rank binds its rows of q/k/v and its columns of o; the attention's
// output is summed over tp (the forward's all-reduce; the backward's sums the input's
// gradient), and the adapters' partial gradients are summed over tp once per layer.
// TP: mesh dp=1 tp=2 pp=1 ep=1 world=2
// TP: rank 0
// TP: group 0 tp [0,1]
// TP-NEXT: group 1 dp+ep+tp [0,1]
// TP: bind {{.*}} "model.layers.0.self_attn.q_proj.weight" slice [0+32,0+64]
// TP: bind {{.*}} "model.layers.0.self_attn.o_proj.weight" slice [0+64,0+32]
// TP: fwd L0 s0 all_reduce g0 {{.*}} // "moe.tp_exit in @gqa_moe_fwd[0]"
// TP: bwd L1 s0 all_reduce g0 {{.*}} // "moe.tp_exit in @gqa_moe_bwd[1]"
// TP: bwd L1 s0 all_reduce g1 {{.*}} // "moe.all_reduce_grads"
// TP: rank 1
// TP: bind {{.*}} "model.layers.0.self_attn.q_proj.weight" slice [32+32,0+64]
// TP: bind {{.*}} "model.layers.0.self_attn.o_proj.weight" slice [0+64,32+32]
// TWICE: moec: error: --mesh 'ep=2,ep=4': axis ep is given twice

// Qwen3-30B's top-8 of 128 experts over 4 ranks: auto sends every token to every rank, whose
// room the factor does not bound, and the report says so.
// FIXED-ROOM: expert exchange room: every token (each is sent to every rank)
// At ep = 2 a capacity factor of 2 bounds nothing (twice the balanced load is every token):
// not suggested; sequence parallel is.
// NO-HELP: to fit, try (same micro-batch):
// NO-HELP-NOT: --ep-capacity-factor
// NO-HELP: --mesh tp=2,pp=2,ep=2 --sequence-parallel (8 GPUs
// NO-HELP-NOT: --ep-capacity-factor
// A suggestion without sequence parallel says so: moec's default with tp and ep is on.
// NO-HELP: --mesh tp=2,pp=4,ep=2 --sequence-parallel=false (16 GPUs
// NO-HELP-NOT: --ep-capacity-factor
// NO-HELP: communication per step per GPU
// The plan's own stages take the command's --recompute (none), not a suggestion's.
// NO-HELP: the plan's own collectives, pipeline stage 0 of 2:
// NO-HELP-NOT: recompute
// NO-HELP: the plan's own collectives, pipeline stage 1 of 2:
// The memory cap caps a rank of the planned mesh: the report's one-rank program and slice
// do not take it, and the plan's stages do.
// CAPPED: fits in 141 GB: yes
// CAPPED: the plan's own collectives, pipeline stage 0 of 2:

// Experts split over ep are whole on every tp rank: without sequence parallel both tp ranks
// route every token. So moec turns it on with tp and ep, where the step's tokens split over tp.
// TPEP: moec: warning: without sequence parallel (--sequence-parallel=false) every tp rank routes every token to the experts (tp = 2 times the expert work, the exchange's bytes and its room)
// TPEP-ODD: moec: warning: without sequence parallel (the 95 tokens of a step do not split over tp = 2) every tp rank routes every token
// TPEP-SP-NOT: warning
// TPEP-SP: reduce_scatter

// The 2.76T seed case on 16,384 GPUs: as planned by default (sequence parallel, as with tp and
// ep) it does not fit: the expert exchange keeps room for every token of 32 ranks. The report
// plans the alternatives and finds those that fit, each with its cost.
// SEED: mesh dp=16,tp=8,pp=4,ep=32: 16,384 GPUs (2,048 nodes of 8)
// SEED: recompute: none; sequence parallel: yes (the backward gathers the regions' inputs again); expert exchange room: every token of every rank
// SEED: memory per GPU (GB = 1e9 bytes):
// SEED: routed experts
// SEED: optimizer_state
// SEED: fits in 141 GB: no
// SEED: to fit, try (same micro-batch):
// SEED: --mesh dp=16,tp=8,pp=4,ep=32 --ep-capacity-factor 2 --sequence-parallel (16,384 GPUs; room for twice the expert rows balanced routing sends, not every token of every rank): worst stage {{[0-9.]+}} GB, fits; per GPU per step {{[0-9.]+}} s of communication, {{[0-9]+}} TFLOP
// SEED: --mesh dp=16,tp=8,pp=4,ep=32 --sequence-parallel --recompute per-layer (16,384 GPUs; keeps only the layers' inputs and routing): worst stage {{[0-9.]+}} GB, fits
// SEED: --mesh dp=16,tp=8,pp=4,ep=32 --ep-capacity-factor 2 --sequence-parallel --recompute per-layer (16,384 GPUs; with the above): worst stage {{[0-9.]+}} GB, fits
// SEED: communication per step per GPU
// SEED: all_reduce        LoRA gradients        step
// SEED: expert_send       tokens to experts
// SEED-FITS: recompute: none; sequence parallel: yes (the backward gathers the regions' inputs again); expert exchange room: 2 x what uniform routing sends a rank
// SEED-FITS: fits in 141 GB: yes
// SEED-FITS-NOT: to fit, try
// SEED-FITS: reduce_scatter    sequence parallel
// SEED-FITS-NOT: rank order:
// SEED-FITS: ranks: numbered tp,ep,dp,pp (the fastest first, moec's default), 8 GPUs per node: tp (stride 1) within a node; ep (stride 8) spans nodes

// DeepSeek-V3 over tp = 8: multi-head latent attention splits its 128 heads, the dense layers'
// MLPs and the shared experts their intermediate features, the routed experts theirs.
// LATENT: where they come from (--moe-propagate-sharding):
// LATENT-DAG: the 128 heads of @mla_dense's latent attention split over tp = 8 (16 per rank): all_reduce x{{[0-9]+}}
// LATENT-DAG: the 18432 intermediate features of @mla_dense's MLP split over tp = 8: all_reduce x{{[0-9]+}}
// LATENT-DAG: the 128 heads of @mla_moe's latent attention split over tp = 8 (16 per rank): all_reduce x{{[0-9]+}}
// LATENT-DAG: the intermediate features of @mla_moe's experts split over tp = 8: all_reduce x{{[0-9]+}}
// LATENT-DAG: the 2048 intermediate features of @mla_moe's MLP split over tp = 8: all_reduce x{{[0-9]+}}

// Experts placed by a measured load (moe-run's metrics.jsonl, two steps summed): layer 0's
// tokens [50, 40, 5, 5, 5, 5, 5, 5] put 100 of 120 on rank 0 with consecutive experts (1.667x
// the mean); busiest first, each to the least loaded rank with room, rank 0 holds experts
// 0, 4, 6, 7 (65 tokens: 1.083x). Layer 1's even load alternates. Each rank binds its experts
// in that order, and the route carries the table.
// LOAD: moec: experts placed by the load in {{.*}}qwen3_moe_metrics.jsonl: 2 MoE layers; the busiest ep rank's tokens over the mean, worst layer: 1.667 with consecutive experts, 1.083 placed
// LOAD: rank 0
// LOAD: bind %{{[0-9]+}} "model.layers.0.mlp.experts.{expert}.gate_proj.weight" experts=0,4,6,7
// LOAD: bind %{{[0-9]+}} "model.layers.1.mlp.experts.{expert}.gate_proj.weight" experts=0,2,4,6
// LOAD: expert_route g0 {{.*}} placement=0,4,6,7,1,2,3,5
// LOAD: expert_route g0 {{.*}} placement=0,2,4,6,1,3,5,7
// LOAD: rank 1
// LOAD: bind %{{[0-9]+}} "model.layers.0.mlp.experts.{expert}.gate_proj.weight" experts=1,2,3,5
// LOADNOEP: moec: error: --expert-placement and --expert-load place experts over ep ranks: give --mesh with ep > 1
// LOADBAD: moec: error: {{.*}}golden_qwen3_moe.json:1: not JSON
