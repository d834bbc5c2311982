//===- import_error_missing_key.mlir - required config keys ---------------===//

// Tests that a missing model dimension names the key.
// RUN: not moec import %inputs/missing_hidden_size.json 2>&1 | FileCheck %s --match-full-lines --check-prefix=HIDDEN
// HIDDEN: moec: error: {{.*}}/Inputs/missing_hidden_size.json: key 'hidden_size': missing required key (an integer)

// Tests that a MoE config without top-k names the first spelling of the key.
// RUN: not moec import %inputs/missing_num_experts_per_tok.json 2>&1 | FileCheck %s --match-full-lines --check-prefix=TOPK
// TOPK: moec: error: {{.*}}/Inputs/missing_num_experts_per_tok.json: key 'num_experts_per_tok': missing required key (an integer)

// Tests that an MLA layer (kv_lora_rank set) requires its head dimensions.
// RUN: not moec import %inputs/missing_qk_rope_head_dim.json 2>&1 | FileCheck %s --match-full-lines --check-prefix=MLA
// MLA: moec: error: {{.*}}/Inputs/missing_qk_rope_head_dim.json: key 'qk_rope_head_dim': missing required key (an integer)

// Tests that a key missing from a nested object is named with the object's prefix.
// RUN: not moec import %inputs/missing_yarn_factor.json 2>&1 | FileCheck %s --match-full-lines --check-prefix=YARN
// YARN: moec: error: {{.*}}/Inputs/missing_yarn_factor.json: key 'rope_scaling.factor': missing required key (a number)
// RUN: not moec import %inputs/missing_kda_num_heads.json 2>&1 | FileCheck %s --match-full-lines --check-prefix=KDA
// KDA: moec: error: {{.*}}/Inputs/missing_kda_num_heads.json: key 'linear_attn_config.num_heads': missing required key (an integer)
