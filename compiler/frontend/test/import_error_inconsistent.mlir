//===- import_error_inconsistent.mlir - configs that contradict themselves ===//

// Tests that key/value heads must divide the attention heads.
// RUN: not moec import %inputs/inconsistent_kv_heads.json 2>&1 | FileCheck %s --match-full-lines --check-prefix=KV
// KV: moec: error: {{.*}}/Inputs/inconsistent_kv_heads.json: key 'num_key_value_heads': must divide num_attention_heads (4), got 3

// Tests that top-k may not exceed the number of experts.
// RUN: not moec import %inputs/inconsistent_top_k.json 2>&1 | FileCheck %s --match-full-lines --check-prefix=TOPK
// TOPK: moec: error: {{.*}}/Inputs/inconsistent_top_k.json: key 'num_experts_per_tok': must be between 1 and the number of experts (8), got 9

// Tests that layer_types must have one entry per layer.
// RUN: not moec import %inputs/inconsistent_layer_types.json 2>&1 | FileCheck %s --match-full-lines --check-prefix=TYPES
// TYPES: moec: error: {{.*}}/Inputs/inconsistent_layer_types.json: key 'layer_types': has 3 entries but num_hidden_layers is 2

// Tests the expert groups: n_group divides the experts, topk_group is at most n_group.
// RUN: not moec import %inputs/inconsistent_n_group.json 2>&1 | FileCheck %s --match-full-lines --check-prefix=NGROUP
// NGROUP: moec: error: {{.*}}/Inputs/inconsistent_n_group.json: key 'n_group': must divide the number of experts (8), got 3
// RUN: not moec import %inputs/inconsistent_topk_group.json 2>&1 | FileCheck %s --match-full-lines --check-prefix=TOPKGROUP
// TOPKGROUP: moec: error: {{.*}}/Inputs/inconsistent_topk_group.json: key 'topk_group': must be between 1 and n_group (2), got 3

// Tests that the well-formed Kimi-Linear base of the configs below imports:
// 1-based kda_layers 1..3 and full_attn_layers 4 are layers 0..2 and 3.
// RUN: moec import %inputs/tiny_kimi_linear.json --strict 2>&1 | FileCheck %s --check-prefix=KIMI
// KIMI-NOT: error
// KIMI: moe.apply_layer @kda_dense[0]
// KIMI-NEXT: moe.apply_layer @kda_moe[1]
// KIMI-NEXT: moe.apply_layer @kda_moe[2]
// KIMI-NEXT: moe.apply_layer @mla_moe[3]

// Tests that Kimi-Linear's 1-based layer numbers must lie in 1..num_hidden_layers.
// RUN: not moec import %inputs/inconsistent_kimi_layer_number.json 2>&1 | FileCheck %s --match-full-lines --check-prefix=KIMIHIGH
// KIMIHIGH: moec: error: {{.*}}/Inputs/inconsistent_kimi_layer_number.json: key 'linear_attn_config.full_attn_layers': layer number 5 is outside 1..4 (1-based)
// RUN: not moec import %inputs/inconsistent_kimi_layer_zero.json 2>&1 | FileCheck %s --match-full-lines --check-prefix=KIMIZERO
// KIMIZERO: moec: error: {{.*}}/Inputs/inconsistent_kimi_layer_zero.json: key 'linear_attn_config.kda_layers': layer number 0 is outside 1..4 (1-based)

// Tests that a Kimi-Linear layer is listed exactly once.
// RUN: not moec import %inputs/inconsistent_kimi_layer_twice.json 2>&1 | FileCheck %s --match-full-lines --check-prefix=KIMITWICE
// KIMITWICE: moec: error: {{.*}}/Inputs/inconsistent_kimi_layer_twice.json: key 'linear_attn_config.full_attn_layers': layer number 3 is listed twice
// RUN: not moec import %inputs/inconsistent_kimi_layer_unlisted.json 2>&1 | FileCheck %s --match-full-lines --check-prefix=KIMIUNLISTED
// KIMIUNLISTED: moec: error: {{.*}}/Inputs/inconsistent_kimi_layer_unlisted.json: key 'linear_attn_config': layer number 3 is in neither kda_layers nor full_attn_layers
