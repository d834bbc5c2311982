//===- import_error_unknown_model_type.mlir - model_type not in the table -===//

// Tests that an unknown model_type without the common keys is rejected,
// listing what is missing and the known model types.
// RUN: not moec import %inputs/unknown_model_type.json 2>&1 | FileCheck %s --match-full-lines --check-prefix=UNKNOWN
// UNKNOWN: moec: error: {{.*}}/Inputs/unknown_model_type.json: key 'model_type': 'llama4_moe' is not a known model type and its features are not recognisable (missing hidden_size, vocab_size); known model types: qwen3_moe, qwen3_next, mixtral, olmoe, deepseek_v3, deepseek_v32, kimi_k2, kimi_linear, nemotron_h, gpt_oss

// Tests that an unknown model_type whose features are the common ones imports
// with the default checkpoint names.
// RUN: moec import %inputs/unknown_model_type_plain.json --strict 2>&1 | FileCheck %s --check-prefix=PLAIN
// PLAIN-NOT: warning
// PLAIN-LABEL: moe.model @MyMoeForCausalLM attributes
// PLAIN-SAME: model_type = "my_moe"
// PLAIN: moe.param @embed_tokens "model.embed_tokens.weight" : tensor<256x64xbf16>
// PLAIN: moe.layer @gqa_moe(
// PLAIN: moe.param @mlp_experts_up_proj "model.layers.{layer}.mlp.experts.{expert}.up_proj.weight" : tensor<8x32x64xbf16>
// PLAIN: moe.apply_layer @gqa_moe[0]
// PLAIN-NEXT: moe.apply_layer @gqa_moe[1]
// PLAIN-NOT: moe.apply_layer
