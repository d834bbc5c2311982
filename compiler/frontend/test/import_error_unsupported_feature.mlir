//===- import_error_unsupported_feature.mlir - features MoEC lacks --------===//

// Tests that RoPE scaling other than default and yarn is rejected, under either spelling.
// RUN: not moec import %inputs/unsupported_rope_dynamic.json 2>&1 | FileCheck %s --match-full-lines --check-prefix=DYNAMIC
// DYNAMIC: moec: error: {{.*}}/Inputs/unsupported_rope_dynamic.json: key 'rope_scaling.type': unsupported RoPE scaling 'dynamic' (supported: default, yarn)
// RUN: not moec import %inputs/unsupported_rope_parameters_linear.json 2>&1 | FileCheck %s --match-full-lines --check-prefix=LINEAR
// LINEAR: moec: error: {{.*}}/Inputs/unsupported_rope_parameters_linear.json: key 'rope_parameters.rope_type': unsupported RoPE scaling 'linear' (supported: default, yarn)

// Tests that an unsupported activation is reported under the key the file uses.
// RUN: not moec import %inputs/unsupported_gelu.json 2>&1 | FileCheck %s --match-full-lines --check-prefix=GELU
// GELU: moec: error: {{.*}}/Inputs/unsupported_gelu.json: key 'hidden_act': unsupported activation 'gelu' (supported: silu, relu2)

// Tests that an unsupported router scoring is reported under the key the file uses.
// RUN: not moec import %inputs/unsupported_scoring.json 2>&1 | FileCheck %s --match-full-lines --check-prefix=SCORING
// SCORING: moec: error: {{.*}}/Inputs/unsupported_scoring.json: key 'scoring_func': unsupported router scoring 'sqrtsoftplus' (supported: softmax, sigmoid, topk_softmax)
// RUN: not moec import %inputs/unsupported_router_activation.json 2>&1 | FileCheck %s --match-full-lines --check-prefix=ROUTER
// ROUTER: moec: error: {{.*}}/Inputs/unsupported_router_activation.json: key 'moe_router_activation_func': unsupported router scoring 'relu' (supported: softmax, sigmoid, topk_softmax)

// Tests that an unsupported dtype is rejected.
// RUN: not moec import %inputs/unsupported_dtype.json 2>&1 | FileCheck %s --match-full-lines --check-prefix=DTYPE
// DTYPE: moec: error: {{.*}}/Inputs/unsupported_dtype.json: key 'torch_dtype': unsupported dtype 'float8_e4m3fn' (supported: bfloat16, float16, float32)

// Tests that MLP biases are rejected rather than dropped.
// RUN: not moec import %inputs/unsupported_mlp_bias.json 2>&1 | FileCheck %s --match-full-lines --check-prefix=BIAS
// BIAS: moec: error: {{.*}}/Inputs/unsupported_mlp_bias.json: key 'mlp_bias': MLP biases are not supported

// Tests that a multimodal config (text_config) is rejected.
// RUN: not moec import %inputs/unsupported_text_config.json 2>&1 | FileCheck %s --match-full-lines --check-prefix=TEXT
// TEXT: moec: error: {{.*}}/Inputs/unsupported_text_config.json: key 'text_config': multimodal configs are not supported; import the text model's config on its own
