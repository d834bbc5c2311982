//===- import_models.mlir - the bundled configs import -------------------===//

// Every bundled config in models/ imports under --strict (the importer uses
// every key), the IR it prints parses again (moe-opt), and its structure is the
// config's: the layer templates, which layers apply each, and the checkpoint
// names and shapes of one template's parameters (expert tensors stacked under
// `{expert}`).

// Tests that deepseek-v3.2-exp imports as 3 x dsa_dense, 58 x dsa_moe.
// RUN: moec import %root/models/deepseek-v3.2-exp/config.json --strict | moe-opt | FileCheck %s --check-prefix=DSA
// DSA-LABEL: moe.model @DeepseekV32ForCausalLM attributes
// DSA-SAME: model_type = "deepseek_v32", num_layers = 61
// DSA-NEXT: moe.param @embed_tokens "model.embed_tokens.weight" : tensor<129280x7168xbf16>
// DSA-NEXT: moe.param @final_norm "model.norm.weight" : tensor<7168xbf16>
// DSA-NEXT: moe.param @lm_head "lm_head.weight" : tensor<129280x7168xbf16>
// DSA: moe.layer @dsa_dense({{.*}}) -> tensor<{{.*}}> attributes {channel_mixer = "dense", layers = array<i64: 0, 1, 2>, token_mixer = "dsa"} {
// DSA: moe.layer @dsa_moe({{.*}}) -> tensor<{{.*}}> attributes {channel_mixer = "moe", layers = array<i64: 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60>, token_mixer = "dsa"} {
// DSA-NEXT: moe.param @input_layernorm "model.layers.{layer}.input_layernorm.weight" : tensor<7168xbf16>
// DSA-NEXT: moe.param @self_attn_q_a_proj "model.layers.{layer}.self_attn.q_a_proj.weight" : tensor<1536x7168xbf16>
// DSA-NEXT: moe.param @self_attn_q_a_layernorm "model.layers.{layer}.self_attn.q_a_layernorm.weight" : tensor<1536xbf16>
// DSA-NEXT: moe.param @self_attn_q_b_proj "model.layers.{layer}.self_attn.q_b_proj.weight" : tensor<24576x1536xbf16>
// DSA-NEXT: moe.param @self_attn_kv_a_proj_with_mqa "model.layers.{layer}.self_attn.kv_a_proj_with_mqa.weight" : tensor<576x7168xbf16>
// DSA-NEXT: moe.param @self_attn_kv_a_layernorm "model.layers.{layer}.self_attn.kv_a_layernorm.weight" : tensor<512xbf16>
// DSA-NEXT: moe.param @self_attn_kv_b_proj "model.layers.{layer}.self_attn.kv_b_proj.weight" : tensor<32768x512xbf16>
// DSA-NEXT: moe.param @self_attn_indexer_wq_b "model.layers.{layer}.self_attn.indexer.wq_b.weight" : tensor<8192x1536xbf16>
// DSA-NEXT: moe.param @self_attn_indexer_wk "model.layers.{layer}.self_attn.indexer.wk.weight" : tensor<128x7168xbf16>
// DSA-NEXT: moe.param @self_attn_indexer_k_norm "model.layers.{layer}.self_attn.indexer.k_norm.weight" : tensor<128xbf16>
// DSA-NEXT: moe.param @self_attn_indexer_k_norm_bias "model.layers.{layer}.self_attn.indexer.k_norm.bias" : tensor<128xbf16>
// DSA-NEXT: moe.param @self_attn_indexer_weights_proj "model.layers.{layer}.self_attn.indexer.weights_proj.weight" : tensor<64x7168xbf16>
// DSA-NEXT: moe.param @self_attn_o_proj "model.layers.{layer}.self_attn.o_proj.weight" : tensor<7168x16384xbf16>
// DSA-NEXT: moe.param @post_attention_layernorm "model.layers.{layer}.post_attention_layernorm.weight" : tensor<7168xbf16>
// DSA-NEXT: moe.param @mlp_gate "model.layers.{layer}.mlp.gate.weight" : tensor<256x7168xbf16>
// DSA-NEXT: moe.param @mlp_gate_e_score_correction_bias "model.layers.{layer}.mlp.gate.e_score_correction_bias" : tensor<256xbf16>
// DSA-NEXT: moe.param @mlp_experts_gate_proj "model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight" : tensor<256x2048x7168xbf16>
// DSA-NEXT: moe.param @mlp_experts_up_proj "model.layers.{layer}.mlp.experts.{expert}.up_proj.weight" : tensor<256x2048x7168xbf16>
// DSA-NEXT: moe.param @mlp_experts_down_proj "model.layers.{layer}.mlp.experts.{expert}.down_proj.weight" : tensor<256x7168x2048xbf16>
// DSA-NEXT: moe.param @mlp_shared_experts_up_proj "model.layers.{layer}.mlp.shared_experts.up_proj.weight" : tensor<2048x7168xbf16>
// DSA-NEXT: moe.param @mlp_shared_experts_gate_proj "model.layers.{layer}.mlp.shared_experts.gate_proj.weight" : tensor<2048x7168xbf16>
// DSA-NEXT: moe.param @mlp_shared_experts_down_proj "model.layers.{layer}.mlp.shared_experts.down_proj.weight" : tensor<7168x2048xbf16>
// DSA-NEXT: moe.weight
// DSA: func.func @forward
// DSA-NEXT: moe.weight @embed_tokens
// DSA-NEXT: moe.embedding
// DSA-NEXT: moe.apply_layer @dsa_dense[0]
// DSA-COUNT-2: moe.apply_layer @dsa_dense[
// DSA-NEXT: moe.apply_layer @dsa_moe[3]
// DSA-COUNT-57: moe.apply_layer @dsa_moe[
// DSA-NOT: moe.apply_layer
// DSA: moe.weight @final_norm

// Tests that deepseek-v3 imports as 3 x mla_dense, 58 x mla_moe.
// RUN: moec import %root/models/deepseek-v3/config.json --strict | moe-opt | FileCheck %s --check-prefix=DEEPSEEK
// DEEPSEEK-LABEL: moe.model @DeepseekV3ForCausalLM attributes
// DEEPSEEK-SAME: model_type = "deepseek_v3", num_layers = 61
// DEEPSEEK-NEXT: moe.param @embed_tokens "model.embed_tokens.weight" : tensor<129280x7168xbf16>
// DEEPSEEK-NEXT: moe.param @final_norm "model.norm.weight" : tensor<7168xbf16>
// DEEPSEEK-NEXT: moe.param @lm_head "lm_head.weight" : tensor<129280x7168xbf16>
// DEEPSEEK: moe.layer @mla_dense({{.*}}) -> tensor<{{.*}}> attributes {channel_mixer = "dense", layers = array<i64: 0, 1, 2>, token_mixer = "mla"} {
// DEEPSEEK: moe.layer @mla_moe({{.*}}) -> tensor<{{.*}}> attributes {channel_mixer = "moe", layers = array<i64: 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60>, token_mixer = "mla"} {
// DEEPSEEK-NEXT: moe.param @input_layernorm "model.layers.{layer}.input_layernorm.weight" : tensor<7168xbf16>
// DEEPSEEK-NEXT: moe.param @self_attn_q_a_proj "model.layers.{layer}.self_attn.q_a_proj.weight" : tensor<1536x7168xbf16>
// DEEPSEEK-NEXT: moe.param @self_attn_q_a_layernorm "model.layers.{layer}.self_attn.q_a_layernorm.weight" : tensor<1536xbf16>
// DEEPSEEK-NEXT: moe.param @self_attn_q_b_proj "model.layers.{layer}.self_attn.q_b_proj.weight" : tensor<24576x1536xbf16>
// DEEPSEEK-NEXT: moe.param @self_attn_kv_a_proj_with_mqa "model.layers.{layer}.self_attn.kv_a_proj_with_mqa.weight" : tensor<576x7168xbf16>
// DEEPSEEK-NEXT: moe.param @self_attn_kv_a_layernorm "model.layers.{layer}.self_attn.kv_a_layernorm.weight" : tensor<512xbf16>
// DEEPSEEK-NEXT: moe.param @self_attn_kv_b_proj "model.layers.{layer}.self_attn.kv_b_proj.weight" : tensor<32768x512xbf16>
// DEEPSEEK-NEXT: moe.param @self_attn_o_proj "model.layers.{layer}.self_attn.o_proj.weight" : tensor<7168x16384xbf16>
// DEEPSEEK-NEXT: moe.param @post_attention_layernorm "model.layers.{layer}.post_attention_layernorm.weight" : tensor<7168xbf16>
// DEEPSEEK-NEXT: moe.param @mlp_gate "model.layers.{layer}.mlp.gate.weight" : tensor<256x7168xbf16>
// DEEPSEEK-NEXT: moe.param @mlp_gate_e_score_correction_bias "model.layers.{layer}.mlp.gate.e_score_correction_bias" : tensor<256xbf16>
// DEEPSEEK-NEXT: moe.param @mlp_experts_gate_proj "model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight" : tensor<256x2048x7168xbf16>
// DEEPSEEK-NEXT: moe.param @mlp_experts_up_proj "model.layers.{layer}.mlp.experts.{expert}.up_proj.weight" : tensor<256x2048x7168xbf16>
// DEEPSEEK-NEXT: moe.param @mlp_experts_down_proj "model.layers.{layer}.mlp.experts.{expert}.down_proj.weight" : tensor<256x7168x2048xbf16>
// DEEPSEEK-NEXT: moe.param @mlp_shared_experts_up_proj "model.layers.{layer}.mlp.shared_experts.up_proj.weight" : tensor<2048x7168xbf16>
// DEEPSEEK-NEXT: moe.param @mlp_shared_experts_gate_proj "model.layers.{layer}.mlp.shared_experts.gate_proj.weight" : tensor<2048x7168xbf16>
// DEEPSEEK-NEXT: moe.param @mlp_shared_experts_down_proj "model.layers.{layer}.mlp.shared_experts.down_proj.weight" : tensor<7168x2048xbf16>
// DEEPSEEK-NEXT: moe.weight
// DEEPSEEK: func.func @forward
// DEEPSEEK-NEXT: moe.weight @embed_tokens
// DEEPSEEK-NEXT: moe.embedding
// DEEPSEEK-NEXT: moe.apply_layer @mla_dense[0]
// DEEPSEEK-COUNT-2: moe.apply_layer @mla_dense[
// DEEPSEEK-NEXT: moe.apply_layer @mla_moe[3]
// DEEPSEEK-COUNT-57: moe.apply_layer @mla_moe[
// DEEPSEEK-NOT: moe.apply_layer
// DEEPSEEK: moe.weight @final_norm

// Tests that gpt-oss-120b imports as 18 x gqa_sliding_moe, 18 x gqa_moe.
// RUN: moec import %root/models/gpt-oss-120b/config.json --strict | moe-opt | FileCheck %s --check-prefix=GPTOSS
// GPTOSS-LABEL: moe.model @GptOssForCausalLM attributes
// GPTOSS-SAME: model_type = "gpt_oss", num_layers = 36
// GPTOSS-NEXT: moe.param @embed_tokens "model.embed_tokens.weight" : tensor<201088x2880xbf16>
// GPTOSS-NEXT: moe.param @final_norm "model.norm.weight" : tensor<2880xbf16>
// GPTOSS-NEXT: moe.param @lm_head "lm_head.weight" : tensor<201088x2880xbf16>
// GPTOSS: moe.layer @gqa_sliding_moe({{.*}}) -> tensor<{{.*}}> attributes {channel_mixer = "moe", layers = array<i64: 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34>, token_mixer = "gqa"} {
// GPTOSS-NEXT: moe.param @input_layernorm "model.layers.{layer}.input_layernorm.weight" : tensor<2880xbf16>
// GPTOSS-NEXT: moe.param @self_attn_q_proj "model.layers.{layer}.self_attn.q_proj.weight" : tensor<4096x2880xbf16>
// GPTOSS-NEXT: moe.param @self_attn_q_proj_bias "model.layers.{layer}.self_attn.q_proj.bias" : tensor<4096xbf16>
// GPTOSS-NEXT: moe.param @self_attn_k_proj "model.layers.{layer}.self_attn.k_proj.weight" : tensor<512x2880xbf16>
// GPTOSS-NEXT: moe.param @self_attn_k_proj_bias "model.layers.{layer}.self_attn.k_proj.bias" : tensor<512xbf16>
// GPTOSS-NEXT: moe.param @self_attn_v_proj "model.layers.{layer}.self_attn.v_proj.weight" : tensor<512x2880xbf16>
// GPTOSS-NEXT: moe.param @self_attn_v_proj_bias "model.layers.{layer}.self_attn.v_proj.bias" : tensor<512xbf16>
// GPTOSS-NEXT: moe.param @self_attn_sinks "model.layers.{layer}.self_attn.sinks" : tensor<64xbf16>
// GPTOSS-NEXT: moe.param @self_attn_o_proj "model.layers.{layer}.self_attn.o_proj.weight" : tensor<2880x4096xbf16>
// GPTOSS-NEXT: moe.param @self_attn_o_proj_bias "model.layers.{layer}.self_attn.o_proj.bias" : tensor<2880xbf16>
// GPTOSS-NEXT: moe.param @post_attention_layernorm "model.layers.{layer}.post_attention_layernorm.weight" : tensor<2880xbf16>
// GPTOSS-NEXT: moe.param @mlp_router "model.layers.{layer}.mlp.router.weight" : tensor<128x2880xbf16>
// GPTOSS-NEXT: moe.param @mlp_router_bias "model.layers.{layer}.mlp.router.bias" : tensor<128xbf16>
// GPTOSS-NEXT: moe.param @mlp_experts_gate_up_proj "model.layers.{layer}.mlp.experts.gate_up_proj" : tensor<128x2880x5760xbf16>
// GPTOSS-NEXT: moe.param @mlp_experts_gate_up_proj_bias "model.layers.{layer}.mlp.experts.gate_up_proj_bias" : tensor<128x5760xbf16>
// GPTOSS-NEXT: moe.param @mlp_experts_down_proj "model.layers.{layer}.mlp.experts.down_proj" : tensor<128x2880x2880xbf16>
// GPTOSS-NEXT: moe.param @mlp_experts_down_proj_bias "model.layers.{layer}.mlp.experts.down_proj_bias" : tensor<128x2880xbf16>
// GPTOSS-NEXT: moe.weight
// GPTOSS: moe.layer @gqa_moe({{.*}}) -> tensor<{{.*}}> attributes {channel_mixer = "moe", layers = array<i64: 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31, 33, 35>, token_mixer = "gqa"} {
// GPTOSS: func.func @forward
// GPTOSS-NEXT: moe.weight @embed_tokens
// GPTOSS-NEXT: moe.embedding
// GPTOSS-NEXT: moe.apply_layer @gqa_sliding_moe[0]
// GPTOSS-NEXT: moe.apply_layer @gqa_moe[1]
// GPTOSS-NEXT: moe.apply_layer @gqa_sliding_moe[2]
// GPTOSS-NEXT: moe.apply_layer @gqa_moe[3]
// GPTOSS-NEXT: moe.apply_layer @gqa_sliding_moe[4]
// GPTOSS-COUNT-31: moe.apply_layer
// GPTOSS-NOT: moe.apply_layer
// GPTOSS: moe.weight @final_norm

// Tests that kimi-k2-instruct imports as 1 x mla_dense, 60 x mla_moe.
// RUN: moec import %root/models/kimi-k2-instruct/config.json --strict | moe-opt | FileCheck %s --check-prefix=KIMIK2
// KIMIK2-LABEL: moe.model @DeepseekV3ForCausalLM attributes
// KIMIK2-SAME: model_type = "kimi_k2", num_layers = 61
// KIMIK2-NEXT: moe.param @embed_tokens "model.embed_tokens.weight" : tensor<163840x7168xbf16>
// KIMIK2-NEXT: moe.param @final_norm "model.norm.weight" : tensor<7168xbf16>
// KIMIK2-NEXT: moe.param @lm_head "lm_head.weight" : tensor<163840x7168xbf16>
// KIMIK2: moe.layer @mla_dense({{.*}}) -> tensor<{{.*}}> attributes {channel_mixer = "dense", layers = array<i64: 0>, token_mixer = "mla"} {
// KIMIK2: moe.layer @mla_moe({{.*}}) -> tensor<{{.*}}> attributes {channel_mixer = "moe", layers = array<i64: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60>, token_mixer = "mla"} {
// KIMIK2-NEXT: moe.param @input_layernorm "model.layers.{layer}.input_layernorm.weight" : tensor<7168xbf16>
// KIMIK2-NEXT: moe.param @self_attn_q_a_proj "model.layers.{layer}.self_attn.q_a_proj.weight" : tensor<1536x7168xbf16>
// KIMIK2-NEXT: moe.param @self_attn_q_a_layernorm "model.layers.{layer}.self_attn.q_a_layernorm.weight" : tensor<1536xbf16>
// KIMIK2-NEXT: moe.param @self_attn_q_b_proj "model.layers.{layer}.self_attn.q_b_proj.weight" : tensor<12288x1536xbf16>
// KIMIK2-NEXT: moe.param @self_attn_kv_a_proj_with_mqa "model.layers.{layer}.self_attn.kv_a_proj_with_mqa.weight" : tensor<576x7168xbf16>
// KIMIK2-NEXT: moe.param @self_attn_kv_a_layernorm "model.layers.{layer}.self_attn.kv_a_layernorm.weight" : tensor<512xbf16>
// KIMIK2-NEXT: moe.param @self_attn_kv_b_proj "model.layers.{layer}.self_attn.kv_b_proj.weight" : tensor<16384x512xbf16>
// KIMIK2-NEXT: moe.param @self_attn_o_proj "model.layers.{layer}.self_attn.o_proj.weight" : tensor<7168x8192xbf16>
// KIMIK2-NEXT: moe.param @post_attention_layernorm "model.layers.{layer}.post_attention_layernorm.weight" : tensor<7168xbf16>
// KIMIK2-NEXT: moe.param @mlp_gate "model.layers.{layer}.mlp.gate.weight" : tensor<384x7168xbf16>
// KIMIK2-NEXT: moe.param @mlp_gate_e_score_correction_bias "model.layers.{layer}.mlp.gate.e_score_correction_bias" : tensor<384xbf16>
// KIMIK2-NEXT: moe.param @mlp_experts_gate_proj "model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight" : tensor<384x2048x7168xbf16>
// KIMIK2-NEXT: moe.param @mlp_experts_up_proj "model.layers.{layer}.mlp.experts.{expert}.up_proj.weight" : tensor<384x2048x7168xbf16>
// KIMIK2-NEXT: moe.param @mlp_experts_down_proj "model.layers.{layer}.mlp.experts.{expert}.down_proj.weight" : tensor<384x7168x2048xbf16>
// KIMIK2-NEXT: moe.param @mlp_shared_experts_up_proj "model.layers.{layer}.mlp.shared_experts.up_proj.weight" : tensor<2048x7168xbf16>
// KIMIK2-NEXT: moe.param @mlp_shared_experts_gate_proj "model.layers.{layer}.mlp.shared_experts.gate_proj.weight" : tensor<2048x7168xbf16>
// KIMIK2-NEXT: moe.param @mlp_shared_experts_down_proj "model.layers.{layer}.mlp.shared_experts.down_proj.weight" : tensor<7168x2048xbf16>
// KIMIK2-NEXT: moe.weight
// KIMIK2: func.func @forward
// KIMIK2-NEXT: moe.weight @embed_tokens
// KIMIK2-NEXT: moe.embedding
// KIMIK2-NEXT: moe.apply_layer @mla_dense[0]
// KIMIK2-NEXT: moe.apply_layer @mla_moe[1]
// KIMIK2-COUNT-59: moe.apply_layer @mla_moe[
// KIMIK2-NOT: moe.apply_layer
// KIMIK2: moe.weight @final_norm

// Tests that kimi-linear-48b-a3b imports as 1 x kda_dense, 19 x kda_moe, 7 x mla_moe.
// RUN: moec import %root/models/kimi-linear-48b-a3b/config.json --strict | moe-opt | FileCheck %s --check-prefix=KIMILINEAR
// KIMILINEAR-LABEL: moe.model @KimiLinearForCausalLM attributes
// KIMILINEAR-SAME: model_type = "kimi_linear", num_layers = 27
// KIMILINEAR-NEXT: moe.param @embed_tokens "model.embed_tokens.weight" : tensor<163840x2304xbf16>
// KIMILINEAR-NEXT: moe.param @final_norm "model.norm.weight" : tensor<2304xbf16>
// KIMILINEAR-NEXT: moe.param @lm_head "lm_head.weight" : tensor<163840x2304xbf16>
// KIMILINEAR: moe.layer @kda_dense({{.*}}) -> tensor<{{.*}}> attributes {channel_mixer = "dense", layers = array<i64: 0>, token_mixer = "kda"} {
// KIMILINEAR: moe.layer @kda_moe({{.*}}) -> tensor<{{.*}}> attributes {channel_mixer = "moe", layers = array<i64: 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, 16, 17, 18, 20, 21, 22, 24, 25>, token_mixer = "kda"} {
// KIMILINEAR: moe.layer @mla_moe({{.*}}) -> tensor<{{.*}}> attributes {channel_mixer = "moe", layers = array<i64: 3, 7, 11, 15, 19, 23, 26>, token_mixer = "mla"} {
// KIMILINEAR-NEXT: moe.param @input_layernorm "model.layers.{layer}.input_layernorm.weight" : tensor<2304xbf16>
// KIMILINEAR-NEXT: moe.param @self_attn_q_proj "model.layers.{layer}.self_attn.q_proj.weight" : tensor<6144x2304xbf16>
// KIMILINEAR-NEXT: moe.param @self_attn_kv_a_proj_with_mqa "model.layers.{layer}.self_attn.kv_a_proj_with_mqa.weight" : tensor<576x2304xbf16>
// KIMILINEAR-NEXT: moe.param @self_attn_kv_a_layernorm "model.layers.{layer}.self_attn.kv_a_layernorm.weight" : tensor<512xbf16>
// KIMILINEAR-NEXT: moe.param @self_attn_kv_b_proj "model.layers.{layer}.self_attn.kv_b_proj.weight" : tensor<8192x512xbf16>
// KIMILINEAR-NEXT: moe.param @self_attn_o_proj "model.layers.{layer}.self_attn.o_proj.weight" : tensor<2304x4096xbf16>
// KIMILINEAR-NEXT: moe.param @post_attention_layernorm "model.layers.{layer}.post_attention_layernorm.weight" : tensor<2304xbf16>
// KIMILINEAR-NEXT: moe.param @block_sparse_moe_gate "model.layers.{layer}.block_sparse_moe.gate.weight" : tensor<256x2304xbf16>
// KIMILINEAR-NEXT: moe.param @block_sparse_moe_gate_e_score_correction_bias "model.layers.{layer}.block_sparse_moe.gate.e_score_correction_bias" : tensor<256xbf16>
// KIMILINEAR-NEXT: moe.param @block_sparse_moe_experts_w1 "model.layers.{layer}.block_sparse_moe.experts.{expert}.w1.weight" : tensor<256x1024x2304xbf16>
// KIMILINEAR-NEXT: moe.param @block_sparse_moe_experts_w3 "model.layers.{layer}.block_sparse_moe.experts.{expert}.w3.weight" : tensor<256x1024x2304xbf16>
// KIMILINEAR-NEXT: moe.param @block_sparse_moe_experts_w2 "model.layers.{layer}.block_sparse_moe.experts.{expert}.w2.weight" : tensor<256x2304x1024xbf16>
// KIMILINEAR-NEXT: moe.param @block_sparse_moe_shared_experts_up_proj "model.layers.{layer}.block_sparse_moe.shared_experts.up_proj.weight" : tensor<1024x2304xbf16>
// KIMILINEAR-NEXT: moe.param @block_sparse_moe_shared_experts_gate_proj "model.layers.{layer}.block_sparse_moe.shared_experts.gate_proj.weight" : tensor<1024x2304xbf16>
// KIMILINEAR-NEXT: moe.param @block_sparse_moe_shared_experts_down_proj "model.layers.{layer}.block_sparse_moe.shared_experts.down_proj.weight" : tensor<2304x1024xbf16>
// KIMILINEAR-NEXT: moe.weight
// KIMILINEAR: func.func @forward
// KIMILINEAR-NEXT: moe.weight @embed_tokens
// KIMILINEAR-NEXT: moe.embedding
// KIMILINEAR-NEXT: moe.apply_layer @kda_dense[0]
// KIMILINEAR-NEXT: moe.apply_layer @kda_moe[1]
// KIMILINEAR-NEXT: moe.apply_layer @kda_moe[2]
// KIMILINEAR-NEXT: moe.apply_layer @mla_moe[3]
// KIMILINEAR-NEXT: moe.apply_layer @kda_moe[4]
// KIMILINEAR-COUNT-22: moe.apply_layer
// KIMILINEAR-NOT: moe.apply_layer
// KIMILINEAR: moe.weight @final_norm

// Tests that mixtral-8x7b imports as 32 x gqa_moe.
// RUN: moec import %root/models/mixtral-8x7b/config.json --strict | moe-opt | FileCheck %s --check-prefix=MIXTRAL
// MIXTRAL-LABEL: moe.model @MixtralForCausalLM attributes
// MIXTRAL-SAME: model_type = "mixtral", num_layers = 32
// MIXTRAL-NEXT: moe.param @embed_tokens "model.embed_tokens.weight" : tensor<32000x4096xbf16>
// MIXTRAL-NEXT: moe.param @final_norm "model.norm.weight" : tensor<4096xbf16>
// MIXTRAL-NEXT: moe.param @lm_head "lm_head.weight" : tensor<32000x4096xbf16>
// MIXTRAL: moe.layer @gqa_moe({{.*}}) -> tensor<{{.*}}> attributes {channel_mixer = "moe", layers = array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31>, token_mixer = "gqa"} {
// MIXTRAL-NEXT: moe.param @input_layernorm "model.layers.{layer}.input_layernorm.weight" : tensor<4096xbf16>
// MIXTRAL-NEXT: moe.param @self_attn_q_proj "model.layers.{layer}.self_attn.q_proj.weight" : tensor<4096x4096xbf16>
// MIXTRAL-NEXT: moe.param @self_attn_k_proj "model.layers.{layer}.self_attn.k_proj.weight" : tensor<1024x4096xbf16>
// MIXTRAL-NEXT: moe.param @self_attn_v_proj "model.layers.{layer}.self_attn.v_proj.weight" : tensor<1024x4096xbf16>
// MIXTRAL-NEXT: moe.param @self_attn_o_proj "model.layers.{layer}.self_attn.o_proj.weight" : tensor<4096x4096xbf16>
// MIXTRAL-NEXT: moe.param @post_attention_layernorm "model.layers.{layer}.post_attention_layernorm.weight" : tensor<4096xbf16>
// MIXTRAL-NEXT: moe.param @block_sparse_moe_gate "model.layers.{layer}.block_sparse_moe.gate.weight" : tensor<8x4096xbf16>
// MIXTRAL-NEXT: moe.param @block_sparse_moe_experts_w1 "model.layers.{layer}.block_sparse_moe.experts.{expert}.w1.weight" : tensor<8x14336x4096xbf16>
// MIXTRAL-NEXT: moe.param @block_sparse_moe_experts_w3 "model.layers.{layer}.block_sparse_moe.experts.{expert}.w3.weight" : tensor<8x14336x4096xbf16>
// MIXTRAL-NEXT: moe.param @block_sparse_moe_experts_w2 "model.layers.{layer}.block_sparse_moe.experts.{expert}.w2.weight" : tensor<8x4096x14336xbf16>
// MIXTRAL-NEXT: moe.weight
// MIXTRAL: func.func @forward
// MIXTRAL-NEXT: moe.weight @embed_tokens
// MIXTRAL-NEXT: moe.embedding
// MIXTRAL-NEXT: moe.apply_layer @gqa_moe[0]
// MIXTRAL-COUNT-31: moe.apply_layer @gqa_moe[
// MIXTRAL-NOT: moe.apply_layer
// MIXTRAL: moe.weight @final_norm

// Tests that nemotron-3-super-120b-a12b imports as 40 x mamba2, 40 x moe, 8 x gqa.
// RUN: moec import %root/models/nemotron-3-super-120b-a12b/config.json --strict | moe-opt | FileCheck %s --check-prefix=NEMOTRON
// NEMOTRON-LABEL: moe.model @NemotronHForCausalLM attributes
// NEMOTRON-SAME: model_type = "nemotron_h", num_layers = 88
// NEMOTRON-NEXT: moe.param @embed_tokens "backbone.embeddings.weight" : tensor<131072x4096xbf16>
// NEMOTRON-NEXT: moe.param @final_norm "backbone.norm_f.weight" : tensor<4096xbf16>
// NEMOTRON-NEXT: moe.param @lm_head "lm_head.weight" : tensor<131072x4096xbf16>
// NEMOTRON: moe.layer @mamba2({{.*}}) -> tensor<{{.*}}> attributes {channel_mixer = "none", layers = array<i64: 0, 2, 4, 6, 9, 11, 13, 15, 18, 20, 22, 24, 27, 29, 31, 33, 35, 38, 40, 42, 44, 46, 49, 51, 53, 55, 57, 60, 62, 64, 66, 68, 71, 73, 75, 77, 80, 82, 84, 86>, token_mixer = "mamba2"} {
// NEMOTRON: moe.layer @moe({{.*}}) -> tensor<{{.*}}> attributes {channel_mixer = "moe", layers = array<i64: 1, 3, 5, 8, 10, 12, 14, 17, 19, 21, 23, 26, 28, 30, 32, 34, 37, 39, 41, 43, 45, 48, 50, 52, 54, 56, 59, 61, 63, 65, 67, 70, 72, 74, 76, 79, 81, 83, 85, 87>, token_mixer = "none"} {
// NEMOTRON-NEXT: moe.param @norm "backbone.layers.{layer}.norm.weight" : tensor<4096xbf16>
// NEMOTRON-NEXT: moe.param @mixer_gate "backbone.layers.{layer}.mixer.gate.weight" : tensor<512x4096xbf16>
// NEMOTRON-NEXT: moe.param @mixer_gate_e_score_correction_bias "backbone.layers.{layer}.mixer.gate.e_score_correction_bias" : tensor<512xbf16>
// NEMOTRON-NEXT: moe.param @mixer_fc1_latent_proj "backbone.layers.{layer}.mixer.fc1_latent_proj.weight" : tensor<1024x4096xbf16>
// NEMOTRON-NEXT: moe.param @mixer_experts_up_proj "backbone.layers.{layer}.mixer.experts.{expert}.up_proj.weight" : tensor<512x2688x1024xbf16>
// NEMOTRON-NEXT: moe.param @mixer_experts_down_proj "backbone.layers.{layer}.mixer.experts.{expert}.down_proj.weight" : tensor<512x1024x2688xbf16>
// NEMOTRON-NEXT: moe.param @mixer_fc2_latent_proj "backbone.layers.{layer}.mixer.fc2_latent_proj.weight" : tensor<4096x1024xbf16>
// NEMOTRON-NEXT: moe.param @mixer_shared_experts_up_proj "backbone.layers.{layer}.mixer.shared_experts.up_proj.weight" : tensor<5376x4096xbf16>
// NEMOTRON-NEXT: moe.param @mixer_shared_experts_down_proj "backbone.layers.{layer}.mixer.shared_experts.down_proj.weight" : tensor<4096x5376xbf16>
// NEMOTRON-NEXT: moe.weight
// NEMOTRON: moe.layer @gqa({{.*}}) -> tensor<{{.*}}> attributes {channel_mixer = "none", layers = array<i64: 7, 16, 25, 36, 47, 58, 69, 78>, token_mixer = "gqa"} {
// NEMOTRON: func.func @forward
// NEMOTRON-NEXT: moe.weight @embed_tokens
// NEMOTRON-NEXT: moe.embedding
// NEMOTRON-NEXT: moe.apply_layer @mamba2[0]
// NEMOTRON-NEXT: moe.apply_layer @moe[1]
// NEMOTRON-NEXT: moe.apply_layer @mamba2[2]
// NEMOTRON-NEXT: moe.apply_layer @moe[3]
// NEMOTRON-NEXT: moe.apply_layer @mamba2[4]
// NEMOTRON-COUNT-83: moe.apply_layer
// NEMOTRON-NOT: moe.apply_layer
// NEMOTRON: moe.weight @final_norm

// Tests that olmoe-1b-7b imports as 16 x gqa_moe.
// RUN: moec import %root/models/olmoe-1b-7b/config.json --strict | moe-opt | FileCheck %s --check-prefix=OLMOE
// OLMOE-LABEL: moe.model @OlmoeForCausalLM attributes
// OLMOE-SAME: model_type = "olmoe", num_layers = 16
// OLMOE-NEXT: moe.param @embed_tokens "model.embed_tokens.weight" : tensor<50304x2048xbf16>
// OLMOE-NEXT: moe.param @final_norm "model.norm.weight" : tensor<2048xbf16>
// OLMOE-NEXT: moe.param @lm_head "lm_head.weight" : tensor<50304x2048xbf16>
// OLMOE: moe.layer @gqa_moe({{.*}}) -> tensor<{{.*}}> attributes {channel_mixer = "moe", layers = array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15>, token_mixer = "gqa"} {
// OLMOE-NEXT: moe.param @input_layernorm "model.layers.{layer}.input_layernorm.weight" : tensor<2048xbf16>
// OLMOE-NEXT: moe.param @self_attn_q_proj "model.layers.{layer}.self_attn.q_proj.weight" : tensor<2048x2048xbf16>
// OLMOE-NEXT: moe.param @self_attn_k_proj "model.layers.{layer}.self_attn.k_proj.weight" : tensor<2048x2048xbf16>
// OLMOE-NEXT: moe.param @self_attn_v_proj "model.layers.{layer}.self_attn.v_proj.weight" : tensor<2048x2048xbf16>
// OLMOE-NEXT: moe.param @self_attn_q_norm "model.layers.{layer}.self_attn.q_norm.weight" : tensor<2048xbf16>
// OLMOE-NEXT: moe.param @self_attn_k_norm "model.layers.{layer}.self_attn.k_norm.weight" : tensor<2048xbf16>
// OLMOE-NEXT: moe.param @self_attn_o_proj "model.layers.{layer}.self_attn.o_proj.weight" : tensor<2048x2048xbf16>
// OLMOE-NEXT: moe.param @post_attention_layernorm "model.layers.{layer}.post_attention_layernorm.weight" : tensor<2048xbf16>
// OLMOE-NEXT: moe.param @mlp_gate "model.layers.{layer}.mlp.gate.weight" : tensor<64x2048xbf16>
// OLMOE-NEXT: moe.param @mlp_experts_gate_proj "model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight" : tensor<64x1024x2048xbf16>
// OLMOE-NEXT: moe.param @mlp_experts_up_proj "model.layers.{layer}.mlp.experts.{expert}.up_proj.weight" : tensor<64x1024x2048xbf16>
// OLMOE-NEXT: moe.param @mlp_experts_down_proj "model.layers.{layer}.mlp.experts.{expert}.down_proj.weight" : tensor<64x2048x1024xbf16>
// OLMOE-NEXT: moe.weight
// OLMOE: func.func @forward
// OLMOE-NEXT: moe.weight @embed_tokens
// OLMOE-NEXT: moe.embedding
// OLMOE-NEXT: moe.apply_layer @gqa_moe[0]
// OLMOE-COUNT-15: moe.apply_layer @gqa_moe[
// OLMOE-NOT: moe.apply_layer
// OLMOE: moe.weight @final_norm

// Tests that qwen3-235b-a22b imports as 94 x gqa_moe.
// RUN: moec import %root/models/qwen3-235b-a22b/config.json --strict | moe-opt | FileCheck %s --check-prefix=QWEN235B
// QWEN235B-LABEL: moe.model @Qwen3MoeForCausalLM attributes
// QWEN235B-SAME: model_type = "qwen3_moe", num_layers = 94
// QWEN235B-NEXT: moe.param @embed_tokens "model.embed_tokens.weight" : tensor<151936x4096xbf16>
// QWEN235B-NEXT: moe.param @final_norm "model.norm.weight" : tensor<4096xbf16>
// QWEN235B-NEXT: moe.param @lm_head "lm_head.weight" : tensor<151936x4096xbf16>
// QWEN235B: moe.layer @gqa_moe({{.*}}) -> tensor<{{.*}}> attributes {channel_mixer = "moe", layers = array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93>, token_mixer = "gqa"} {
// QWEN235B-NEXT: moe.param @input_layernorm "model.layers.{layer}.input_layernorm.weight" : tensor<4096xbf16>
// QWEN235B-NEXT: moe.param @self_attn_q_proj "model.layers.{layer}.self_attn.q_proj.weight" : tensor<8192x4096xbf16>
// QWEN235B-NEXT: moe.param @self_attn_k_proj "model.layers.{layer}.self_attn.k_proj.weight" : tensor<512x4096xbf16>
// QWEN235B-NEXT: moe.param @self_attn_v_proj "model.layers.{layer}.self_attn.v_proj.weight" : tensor<512x4096xbf16>
// QWEN235B-NEXT: moe.param @self_attn_q_norm "model.layers.{layer}.self_attn.q_norm.weight" : tensor<128xbf16>
// QWEN235B-NEXT: moe.param @self_attn_k_norm "model.layers.{layer}.self_attn.k_norm.weight" : tensor<128xbf16>
// QWEN235B-NEXT: moe.param @self_attn_o_proj "model.layers.{layer}.self_attn.o_proj.weight" : tensor<4096x8192xbf16>
// QWEN235B-NEXT: moe.param @post_attention_layernorm "model.layers.{layer}.post_attention_layernorm.weight" : tensor<4096xbf16>
// QWEN235B-NEXT: moe.param @mlp_gate "model.layers.{layer}.mlp.gate.weight" : tensor<128x4096xbf16>
// QWEN235B-NEXT: moe.param @mlp_experts_gate_proj "model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight" : tensor<128x1536x4096xbf16>
// QWEN235B-NEXT: moe.param @mlp_experts_up_proj "model.layers.{layer}.mlp.experts.{expert}.up_proj.weight" : tensor<128x1536x4096xbf16>
// QWEN235B-NEXT: moe.param @mlp_experts_down_proj "model.layers.{layer}.mlp.experts.{expert}.down_proj.weight" : tensor<128x4096x1536xbf16>
// QWEN235B-NEXT: moe.weight
// QWEN235B: func.func @forward
// QWEN235B-NEXT: moe.weight @embed_tokens
// QWEN235B-NEXT: moe.embedding
// QWEN235B-NEXT: moe.apply_layer @gqa_moe[0]
// QWEN235B-COUNT-93: moe.apply_layer @gqa_moe[
// QWEN235B-NOT: moe.apply_layer
// QWEN235B: moe.weight @final_norm

// Tests that qwen3-30b-a3b imports as 48 x gqa_moe.
// RUN: moec import %root/models/qwen3-30b-a3b/config.json --strict | moe-opt | FileCheck %s --check-prefix=QWEN30B
// QWEN30B-LABEL: moe.model @Qwen3MoeForCausalLM attributes
// QWEN30B-SAME: model_type = "qwen3_moe", num_layers = 48
// QWEN30B-NEXT: moe.param @embed_tokens "model.embed_tokens.weight" : tensor<151936x2048xbf16>
// QWEN30B-NEXT: moe.param @final_norm "model.norm.weight" : tensor<2048xbf16>
// QWEN30B-NEXT: moe.param @lm_head "lm_head.weight" : tensor<151936x2048xbf16>
// QWEN30B: moe.layer @gqa_moe({{.*}}) -> tensor<{{.*}}> attributes {channel_mixer = "moe", layers = array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47>, token_mixer = "gqa"} {
// QWEN30B-NEXT: moe.param @input_layernorm "model.layers.{layer}.input_layernorm.weight" : tensor<2048xbf16>
// QWEN30B-NEXT: moe.param @self_attn_q_proj "model.layers.{layer}.self_attn.q_proj.weight" : tensor<4096x2048xbf16>
// QWEN30B-NEXT: moe.param @self_attn_k_proj "model.layers.{layer}.self_attn.k_proj.weight" : tensor<512x2048xbf16>
// QWEN30B-NEXT: moe.param @self_attn_v_proj "model.layers.{layer}.self_attn.v_proj.weight" : tensor<512x2048xbf16>
// QWEN30B-NEXT: moe.param @self_attn_q_norm "model.layers.{layer}.self_attn.q_norm.weight" : tensor<128xbf16>
// QWEN30B-NEXT: moe.param @self_attn_k_norm "model.layers.{layer}.self_attn.k_norm.weight" : tensor<128xbf16>
// QWEN30B-NEXT: moe.param @self_attn_o_proj "model.layers.{layer}.self_attn.o_proj.weight" : tensor<2048x4096xbf16>
// QWEN30B-NEXT: moe.param @post_attention_layernorm "model.layers.{layer}.post_attention_layernorm.weight" : tensor<2048xbf16>
// QWEN30B-NEXT: moe.param @mlp_gate "model.layers.{layer}.mlp.gate.weight" : tensor<128x2048xbf16>
// QWEN30B-NEXT: moe.param @mlp_experts_gate_proj "model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight" : tensor<128x768x2048xbf16>
// QWEN30B-NEXT: moe.param @mlp_experts_up_proj "model.layers.{layer}.mlp.experts.{expert}.up_proj.weight" : tensor<128x768x2048xbf16>
// QWEN30B-NEXT: moe.param @mlp_experts_down_proj "model.layers.{layer}.mlp.experts.{expert}.down_proj.weight" : tensor<128x2048x768xbf16>
// QWEN30B-NEXT: moe.weight
// QWEN30B: func.func @forward
// QWEN30B-NEXT: moe.weight @embed_tokens
// QWEN30B-NEXT: moe.embedding
// QWEN30B-NEXT: moe.apply_layer @gqa_moe[0]
// QWEN30B-COUNT-47: moe.apply_layer @gqa_moe[
// QWEN30B-NOT: moe.apply_layer
// QWEN30B: moe.weight @final_norm

// Tests that qwen3-next-80b-a3b imports as 36 x gated_delta_net_moe, 12 x gqa_moe.
// RUN: moec import %root/models/qwen3-next-80b-a3b/config.json --strict | moe-opt | FileCheck %s --check-prefix=QWENNEXT
// QWENNEXT-LABEL: moe.model @Qwen3NextForCausalLM attributes
// QWENNEXT-SAME: model_type = "qwen3_next", num_layers = 48
// QWENNEXT-NEXT: moe.param @embed_tokens "model.embed_tokens.weight" : tensor<151936x2048xbf16>
// QWENNEXT-NEXT: moe.param @final_norm "model.norm.weight" : tensor<2048xbf16>
// QWENNEXT-NEXT: moe.param @lm_head "lm_head.weight" : tensor<151936x2048xbf16>
// QWENNEXT: moe.layer @gated_delta_net_moe({{.*}}) -> tensor<{{.*}}> attributes {channel_mixer = "moe", layers = array<i64: 0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, 16, 17, 18, 20, 21, 22, 24, 25, 26, 28, 29, 30, 32, 33, 34, 36, 37, 38, 40, 41, 42, 44, 45, 46>, token_mixer = "gated_delta_net"} {
// QWENNEXT-NEXT: moe.param @input_layernorm "model.layers.{layer}.input_layernorm.weight" : tensor<2048xbf16>
// QWENNEXT-NEXT: moe.param @linear_attn_in_proj_qkvz "model.layers.{layer}.linear_attn.in_proj_qkvz.weight" : tensor<12288x2048xbf16>
// QWENNEXT-NEXT: moe.param @linear_attn_in_proj_ba "model.layers.{layer}.linear_attn.in_proj_ba.weight" : tensor<64x2048xbf16>
// QWENNEXT-NEXT: moe.param @linear_attn_conv1d "model.layers.{layer}.linear_attn.conv1d.weight" : tensor<8192x1x4xbf16>
// QWENNEXT-NEXT: moe.param @linear_attn_A_log "model.layers.{layer}.linear_attn.A_log" : tensor<32xbf16>
// QWENNEXT-NEXT: moe.param @linear_attn_dt_bias "model.layers.{layer}.linear_attn.dt_bias" : tensor<32xbf16>
// QWENNEXT-NEXT: moe.param @linear_attn_norm "model.layers.{layer}.linear_attn.norm.weight" : tensor<128xbf16>
// QWENNEXT-NEXT: moe.param @linear_attn_out_proj "model.layers.{layer}.linear_attn.out_proj.weight" : tensor<2048x4096xbf16>
// QWENNEXT-NEXT: moe.param @post_attention_layernorm "model.layers.{layer}.post_attention_layernorm.weight" : tensor<2048xbf16>
// QWENNEXT-NEXT: moe.param @mlp_gate "model.layers.{layer}.mlp.gate.weight" : tensor<512x2048xbf16>
// QWENNEXT-NEXT: moe.param @mlp_experts_gate_proj "model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight" : tensor<512x512x2048xbf16>
// QWENNEXT-NEXT: moe.param @mlp_experts_up_proj "model.layers.{layer}.mlp.experts.{expert}.up_proj.weight" : tensor<512x512x2048xbf16>
// QWENNEXT-NEXT: moe.param @mlp_experts_down_proj "model.layers.{layer}.mlp.experts.{expert}.down_proj.weight" : tensor<512x2048x512xbf16>
// QWENNEXT-NEXT: moe.param @mlp_shared_expert_up_proj "model.layers.{layer}.mlp.shared_expert.up_proj.weight" : tensor<512x2048xbf16>
// QWENNEXT-NEXT: moe.param @mlp_shared_expert_gate_proj "model.layers.{layer}.mlp.shared_expert.gate_proj.weight" : tensor<512x2048xbf16>
// QWENNEXT-NEXT: moe.param @mlp_shared_expert_down_proj "model.layers.{layer}.mlp.shared_expert.down_proj.weight" : tensor<2048x512xbf16>
// QWENNEXT-NEXT: moe.param @mlp_shared_expert_gate "model.layers.{layer}.mlp.shared_expert_gate.weight" : tensor<1x2048xbf16>
// QWENNEXT-NEXT: moe.weight
// QWENNEXT: moe.layer @gqa_moe({{.*}}) -> tensor<{{.*}}> attributes {channel_mixer = "moe", layers = array<i64: 3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 43, 47>, token_mixer = "gqa"} {
// QWENNEXT: func.func @forward
// QWENNEXT-NEXT: moe.weight @embed_tokens
// QWENNEXT-NEXT: moe.embedding
// QWENNEXT-NEXT: moe.apply_layer @gated_delta_net_moe[0]
// QWENNEXT-NEXT: moe.apply_layer @gated_delta_net_moe[1]
// QWENNEXT-NEXT: moe.apply_layer @gated_delta_net_moe[2]
// QWENNEXT-NEXT: moe.apply_layer @gqa_moe[3]
// QWENNEXT-NEXT: moe.apply_layer @gated_delta_net_moe[4]
// QWENNEXT-COUNT-43: moe.apply_layer
// QWENNEXT-NOT: moe.apply_layer
// QWENNEXT: moe.weight @final_norm

// Tests that seed-case-2.8t imports as 1 x kda_dense, 68 x kda_moe, 24 x dsa_moe.
// RUN: moec import %root/models/seed-case-2.8t/config.json --strict | moe-opt | FileCheck %s --check-prefix=SEED
// SEED-LABEL: moe.model @KimiLinearForCausalLM attributes
// SEED-SAME: model_type = "kimi_linear", num_layers = 93
// SEED-NEXT: moe.param @embed_tokens "model.embed_tokens.weight" : tensor<163840x7168xbf16>
// SEED-NEXT: moe.param @final_norm "model.norm.weight" : tensor<7168xbf16>
// SEED-NEXT: moe.param @lm_head "lm_head.weight" : tensor<163840x7168xbf16>
// SEED: moe.layer @kda_dense({{.*}}) -> tensor<{{.*}}> attributes {channel_mixer = "dense", layers = array<i64: 0>, token_mixer = "kda"} {
// SEED: moe.layer @kda_moe({{.*}}) -> tensor<{{.*}}> attributes {channel_mixer = "moe", layers = array<i64: 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, 16, 17, 18, 20, 21, 22, 24, 25, 26, 28, 29, 30, 32, 33, 34, 36, 37, 38, 40, 41, 42, 44, 45, 46, 48, 49, 50, 52, 53, 54, 56, 57, 58, 60, 61, 62, 64, 65, 66, 68, 69, 70, 72, 73, 74, 76, 77, 78, 80, 81, 82, 84, 85, 86, 88, 89, 90>, token_mixer = "kda"} {
// SEED-NEXT: moe.param @input_layernorm "model.layers.{layer}.input_layernorm.weight" : tensor<7168xbf16>
// SEED-NEXT: moe.param @self_attn_q_proj "model.layers.{layer}.self_attn.q_proj.weight" : tensor<8192x7168xbf16>
// SEED-NEXT: moe.param @self_attn_k_proj "model.layers.{layer}.self_attn.k_proj.weight" : tensor<8192x7168xbf16>
// SEED-NEXT: moe.param @self_attn_v_proj "model.layers.{layer}.self_attn.v_proj.weight" : tensor<8192x7168xbf16>
// SEED-NEXT: moe.param @self_attn_q_conv1d "model.layers.{layer}.self_attn.q_conv1d.weight" : tensor<8192x1x4xbf16>
// SEED-NEXT: moe.param @self_attn_k_conv1d "model.layers.{layer}.self_attn.k_conv1d.weight" : tensor<8192x1x4xbf16>
// SEED-NEXT: moe.param @self_attn_v_conv1d "model.layers.{layer}.self_attn.v_conv1d.weight" : tensor<8192x1x4xbf16>
// SEED-NEXT: moe.param @self_attn_f_a_proj "model.layers.{layer}.self_attn.f_a_proj.weight" : tensor<128x7168xbf16>
// SEED-NEXT: moe.param @self_attn_f_b_proj "model.layers.{layer}.self_attn.f_b_proj.weight" : tensor<8192x128xbf16>
// SEED-NEXT: moe.param @self_attn_b_proj "model.layers.{layer}.self_attn.b_proj.weight" : tensor<64x7168xbf16>
// SEED-NEXT: moe.param @self_attn_g_a_proj "model.layers.{layer}.self_attn.g_a_proj.weight" : tensor<128x7168xbf16>
// SEED-NEXT: moe.param @self_attn_g_b_proj "model.layers.{layer}.self_attn.g_b_proj.weight" : tensor<8192x128xbf16>
// SEED-NEXT: moe.param @self_attn_A_log "model.layers.{layer}.self_attn.A_log" : tensor<1x1x64x1xbf16>
// SEED-NEXT: moe.param @self_attn_dt_bias "model.layers.{layer}.self_attn.dt_bias" : tensor<8192xbf16>
// SEED-NEXT: moe.param @self_attn_o_norm "model.layers.{layer}.self_attn.o_norm.weight" : tensor<128xbf16>
// SEED-NEXT: moe.param @self_attn_o_proj "model.layers.{layer}.self_attn.o_proj.weight" : tensor<7168x8192xbf16>
// SEED-NEXT: moe.param @post_attention_layernorm "model.layers.{layer}.post_attention_layernorm.weight" : tensor<7168xbf16>
// SEED-NEXT: moe.param @block_sparse_moe_gate "model.layers.{layer}.block_sparse_moe.gate.weight" : tensor<896x7168xbf16>
// SEED-NEXT: moe.param @block_sparse_moe_gate_e_score_correction_bias "model.layers.{layer}.block_sparse_moe.gate.e_score_correction_bias" : tensor<896xbf16>
// SEED-NEXT: moe.param @block_sparse_moe_fc1_latent_proj "model.layers.{layer}.block_sparse_moe.fc1_latent_proj.weight" : tensor<3584x7168xbf16>
// SEED-NEXT: moe.param @block_sparse_moe_experts_w1 "model.layers.{layer}.block_sparse_moe.experts.{expert}.w1.weight" : tensor<896x3072x3584xbf16>
// SEED-NEXT: moe.param @block_sparse_moe_experts_w3 "model.layers.{layer}.block_sparse_moe.experts.{expert}.w3.weight" : tensor<896x3072x3584xbf16>
// SEED-NEXT: moe.param @block_sparse_moe_experts_w2 "model.layers.{layer}.block_sparse_moe.experts.{expert}.w2.weight" : tensor<896x3584x3072xbf16>
// SEED-NEXT: moe.param @block_sparse_moe_fc2_latent_proj "model.layers.{layer}.block_sparse_moe.fc2_latent_proj.weight" : tensor<7168x3584xbf16>
// SEED-NEXT: moe.param @block_sparse_moe_shared_experts_up_proj "model.layers.{layer}.block_sparse_moe.shared_experts.up_proj.weight" : tensor<6144x7168xbf16>
// SEED-NEXT: moe.param @block_sparse_moe_shared_experts_gate_proj "model.layers.{layer}.block_sparse_moe.shared_experts.gate_proj.weight" : tensor<6144x7168xbf16>
// SEED-NEXT: moe.param @block_sparse_moe_shared_experts_down_proj "model.layers.{layer}.block_sparse_moe.shared_experts.down_proj.weight" : tensor<7168x6144xbf16>
// SEED-NEXT: moe.weight
// SEED: moe.layer @dsa_moe({{.*}}) -> tensor<{{.*}}> attributes {channel_mixer = "moe", layers = array<i64: 3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 43, 47, 51, 55, 59, 63, 67, 71, 75, 79, 83, 87, 91, 92>, token_mixer = "dsa"} {
// SEED: func.func @forward
// SEED-NEXT: moe.weight @embed_tokens
// SEED-NEXT: moe.embedding
// SEED-NEXT: moe.apply_layer @kda_dense[0]
// SEED-NEXT: moe.apply_layer @kda_moe[1]
// SEED-NEXT: moe.apply_layer @kda_moe[2]
// SEED-NEXT: moe.apply_layer @dsa_moe[3]
// SEED-NEXT: moe.apply_layer @kda_moe[4]
// SEED-COUNT-88: moe.apply_layer
// SEED-NOT: moe.apply_layer
// SEED: moe.weight @final_norm
