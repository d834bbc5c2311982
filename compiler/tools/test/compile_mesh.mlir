//===- compile_mesh.mlir - moec compile --mesh ----------------------------===//
//
// The golden qwen3_moe model (8 experts, top-2) on meshes: a plan with one
// program per rank, and the simulated report for a mesh no plan supports yet.
//
// RUN: moec compile %inputs/golden_qwen3_moe.json --lora-targets q_proj --lora-rank 4 \
// RUN:   --seq-len 96 --micro-batch 1 --mesh dp=2,ep=2 --emit=plan-text | FileCheck %s
// RUN: moec compile %inputs/golden_qwen3_moe.json --lora-targets q_proj --seq-len 96 \
// RUN:   --mesh dp=2,tp=2,pp=2,ep=2 --emit=report | FileCheck %s --check-prefix=REPORT
// RUN: not moec compile %inputs/golden_qwen3_moe.json --lora-targets q_proj --seq-len 96 \
// RUN:   --mesh tp=2 -o %t.moeplan 2>&1 | FileCheck %s --check-prefix=TP
// RUN: not moec compile %inputs/golden_qwen3_moe.json --mesh ep=2,ep=4 2>&1 \
// RUN:   | FileCheck %s --check-prefix=TWICE

// Four ranks, ep fastest: rank 1 is the second expert-parallel rank of the first
// data-parallel pair. Each binds its half of the experts; the expert exchange runs over ep,
// the attention adapters' gradients over all four.
// CHECK: mesh dp=2 tp=1 pp=1 ep=2 world=4
// CHECK: rank 0
// CHECK: group 0 ep [0,1]
// CHECK: group 1 dp+ep [0,1,2,3]
// CHECK: weight f32 [4,32,64]{{.*}}"model.layers.0.mlp.experts.{expert}.gate_proj.weight"
// CHECK: bind %{{[0-9]+}} "model.layers.0.mlp.experts.{expert}.gate_proj.weight" first_expert=0
// CHECK: expert_dispatch g0
// CHECK: expert_mlp
// CHECK: expert_combine g0
// CHECK: all_reduce g1
// CHECK: rank 1
// CHECK: group 0 ep [0,1]
// CHECK: bind %{{[0-9]+}} "model.layers.0.mlp.experts.{expert}.gate_proj.weight" first_expert=4
// CHECK: rank 2
// CHECK: group 0 ep [2,3]
// CHECK: bind %{{[0-9]+}} "model.layers.0.mlp.experts.{expert}.gate_proj.weight" first_expert=0

// REPORT: mesh dp=2,tp=2,pp=2,ep=2: 16 GPUs
// REPORT: memory per GPU
// REPORT: fits in 141 GB: yes
// REPORT: all-to-all      dispatch+combine
// REPORT: all-reduce      LoRA gradients        step      dp+ep

// TP: error: --moe-propagate-sharding: mesh 'tp=2': tp > 1 is not supported yet (dp and ep are)
// TP: moec: error: compiling {{.*}} failed
// TWICE: moec: error: --mesh 'ep=2,ep=4': axis ep is given twice
