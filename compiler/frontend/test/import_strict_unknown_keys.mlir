//===- import_strict_unknown_keys.mlir - keys the importer does not use ---===//

// Tests that unused keys are a warning by default and the IR is still written.
// RUN: moec import %inputs/unknown_keys.json 2>&1 | FileCheck %s --check-prefix=WARN
// WARN: moec: warning: {{.*}}/Inputs/unknown_keys.json: keys not used by the importer: attn_logit_softcapping, my_custom_flag{{$}}
// WARN: moe.model @Qwen3MoeForCausalLM

// Tests that --strict turns them into an error and writes no IR.
// RUN: not moec import %inputs/unknown_keys.json --strict 2>&1 | FileCheck %s --match-full-lines --check-prefix=STRICT --implicit-check-not=moe.model
// STRICT: moec: error: {{.*}}/Inputs/unknown_keys.json: keys not used by the importer: attn_logit_softcapping, my_custom_flag (--strict)

// Tests that unused keys inside a nested object are named with its prefix.
// RUN: moec import %inputs/unknown_nested_key.json 2>&1 | FileCheck %s --check-prefix=NESTED
// NESTED: moec: warning: {{.*}}/Inputs/unknown_nested_key.json: keys not used by the importer: rope_scaling.extrapolation{{$}}
// RUN: not moec import %inputs/unknown_nested_key.json --strict 2>&1 | FileCheck %s --match-full-lines --check-prefix=NESTED-STRICT
// NESTED-STRICT: moec: error: {{.*}}/Inputs/unknown_nested_key.json: keys not used by the importer: rope_scaling.extrapolation (--strict)

// Tests that a config whose keys are all used imports under --strict without a warning.
// RUN: moec import %inputs/tiny_qwen3_moe.json --strict 2>&1 | FileCheck %s --check-prefix=CLEAN
// CLEAN-NOT: warning
// CLEAN: moe.model @Qwen3MoeForCausalLM

// Tests that keys superseded by a more explicit one count as used: a
// transformers config carries first_k_dense_replace next to mlp_layer_types.
// RUN: moec import %inputs/golden_deepseek_v32.json --strict 2>&1 | FileCheck %s --check-prefix=SUPERSEDED
// SUPERSEDED-NOT: warning
// SUPERSEDED: moe.layer @dsa_dense({{.*}}layers = array<i64: 0>
// SUPERSEDED: moe.layer @dsa_moe({{.*}}layers = array<i64: 1, 2, 3>
