//===- import_roundtrip_golden.mlir - imported IR parses and re-prints ----===//
//
// Inputs/golden_*.json are copies of the golden tiny models' config.json
// (shared/golden/<family>/), which are not under %root.
//
//===----------------------------------------------------------------------===//

// Tests that Qwen3-Next (Gated DeltaNet, gated attention, (1+w) norms) imports
// to IR that moe-opt parses, and that printing is a fixed point.
// RUN: moec import %inputs/golden_qwen3_next.json -o %t.next.mlir
// RUN: moe-opt %t.next.mlir -o %t.next.once.mlir
// RUN: moe-opt %t.next.once.mlir -o %t.next.twice.mlir
// RUN: diff %t.next.mlir %t.next.once.mlir
// RUN: diff %t.next.once.mlir %t.next.twice.mlir
// RUN: moec import %inputs/golden_qwen3_next.json | moe-opt | moe-opt | FileCheck %s --check-prefix=NEXT
// NEXT-LABEL: moe.model @Qwen3NextForCausalLM
// NEXT: moe.layer @gated_delta_net_moe({{.*}}layers = array<i64: 0, 1, 2>, token_mixer = "gated_delta_net"}
// NEXT: moe.rms_norm {{.*}}unit_offset}
// NEXT: moe.gated_delta_net {{.*}}{eps = {{.*}}, key_head_dim = 16 : i64, num_key_heads = 2 : i64, num_value_heads = 4 : i64, value_head_dim = 16 : i64}
// NEXT: moe.sigmoid_gate
// NEXT: moe.layer @gqa_moe({{.*}}layers = array<i64: 3>, token_mixer = "gqa"}
// NEXT: moe.split {{.*}}{groups = 4 : i64, sizes = array<i64: 16, 16>}
// NEXT: moe.rope {{.*}}dim = 4, style = half>
// NEXT: moe.sigmoid_gate
// NEXT: moe.apply_layer @gated_delta_net_moe[0]
// NEXT-NEXT: moe.apply_layer @gated_delta_net_moe[1]
// NEXT-NEXT: moe.apply_layer @gated_delta_net_moe[2]
// NEXT-NEXT: moe.apply_layer @gqa_moe[3]

// Tests the same for DeepSeek-V3.2 (MLA with the sparse-attention indexer,
// group-limited sigmoid router with correction bias).
// RUN: moec import %inputs/golden_deepseek_v32.json -o %t.dsa.mlir
// RUN: moe-opt %t.dsa.mlir -o %t.dsa.once.mlir
// RUN: moe-opt %t.dsa.once.mlir -o %t.dsa.twice.mlir
// RUN: diff %t.dsa.mlir %t.dsa.once.mlir
// RUN: diff %t.dsa.once.mlir %t.dsa.twice.mlir
// RUN: moec import %inputs/golden_deepseek_v32.json | moe-opt | moe-opt | FileCheck %s --check-prefix=DSA
// DSA-LABEL: moe.model @DeepseekV32ForCausalLM
// DSA: moe.layer @dsa_dense(
// DSA: moe.dsa_indexer {{.*}}{head_dim = 16 : i64, num_heads = 2 : i64, rope = #moe.rope<theta = 1.000000e+04, dim = 8, style = half>, topk = 32 : i64}
// DSA: moe.sparse_attention {{.*}}style = interleaved>
// DSA: moe.layer @dsa_moe(
// DSA: moe.router {{.*}} correction_bias {{.*}}{n_group = 2 : i64, norm_topk_prob, scaling = 2.500000e+00 : f64, scoring = #moe<scoring sigmoid>, top_k = 2 : i64}
// DSA: moe.apply_layer @dsa_dense[0]
// DSA-NEXT: moe.apply_layer @dsa_moe[1]
