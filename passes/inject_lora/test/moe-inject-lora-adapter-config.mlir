// RUN: moe-opt %inputs/tiny-moe.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{targets=up_proj rank=16 alpha=1 adapter-config=%inputs/qwen3_moe}))' | FileCheck %s --check-prefix=QWEN
// RUN: moe-opt %inputs/tiny-kimi.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{adapter-config=%inputs/kimi_linear_adapter_config.json}))' | FileCheck %s --check-prefix=KIMI
// RUN: moe-opt %inputs/tiny-moe.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{adapter-config=%inputs/adapter-rslora.json expert-lora}))' | FileCheck %s --check-prefix=RSLORA
// RUN: not moe-opt %inputs/tiny-moe.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{adapter-config=%inputs/adapter-use-dora.json}))' 2>&1 | FileCheck %s --check-prefix=DORA
// RUN: not moe-opt %inputs/tiny-moe.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{adapter-config=%inputs/adapter-rank-pattern.json}))' 2>&1 | FileCheck %s --check-prefix=RANKPAT
// RUN: not moe-opt %inputs/tiny-moe.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{adapter-config=%inputs/adapter-alpha-pattern.json}))' 2>&1 | FileCheck %s --check-prefix=ALPHAPAT
// RUN: not moe-opt %inputs/tiny-moe.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{adapter-config=%inputs/adapter-layers-to-transform.json}))' 2>&1 | FileCheck %s --check-prefix=LAYERS
// RUN: not moe-opt %inputs/tiny-moe.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{adapter-config=%inputs/adapter-bias.json}))' 2>&1 | FileCheck %s --check-prefix=BIAS
// RUN: not moe-opt %inputs/tiny-moe.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{adapter-config=%inputs/adapter-lora-bias.json}))' 2>&1 | FileCheck %s --check-prefix=LORABIAS
// RUN: not moe-opt %inputs/tiny-moe.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{adapter-config=%inputs/adapter-modules-to-save.json}))' 2>&1 | FileCheck %s --check-prefix=SAVE
// RUN: not moe-opt %inputs/tiny-moe.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{adapter-config=%inputs/adapter-exclude-modules.json}))' 2>&1 | FileCheck %s --check-prefix=EXCLUDE
// RUN: not moe-opt %inputs/tiny-moe.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{adapter-config=%inputs/adapter-fan-in-fan-out.json}))' 2>&1 | FileCheck %s --check-prefix=FANIN
// RUN: not moe-opt %inputs/tiny-moe.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{adapter-config=%inputs/adapter-target-parameters.json}))' 2>&1 | FileCheck %s --check-prefix=PARAMS
// RUN: not moe-opt %inputs/tiny-moe.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{adapter-config=%inputs/adapter-peft-type.json}))' 2>&1 | FileCheck %s --check-prefix=PEFTTYPE
// RUN: not moe-opt %inputs/tiny-moe.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{adapter-config=%inputs/adapter-regex-targets.json}))' 2>&1 | FileCheck %s --check-prefix=REGEX
// RUN: not moe-opt %inputs/tiny-moe.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{adapter-config=%inputs/adapter-null-targets.json}))' 2>&1 | FileCheck %s --check-prefix=NULLTARGETS
// RUN: not moe-opt %inputs/tiny-moe.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{adapter-config=%inputs/adapter-missing-r.json}))' 2>&1 | FileCheck %s --check-prefix=MISSING
// RUN: not moe-opt %inputs/tiny-moe.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{adapter-config=%inputs/adapter-wrong-type.json}))' 2>&1 | FileCheck %s --check-prefix=WRONGTYPE
// RUN: not moe-opt %inputs/tiny-moe.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{adapter-config=%inputs/adapter-wrong-flag-type.json}))' 2>&1 | FileCheck %s --check-prefix=WRONGFLAG
// RUN: not moe-opt %inputs/tiny-moe.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{adapter-config=%inputs/adapter-malformed.json}))' 2>&1 | FileCheck %s --check-prefix=MALFORMED
// RUN: not moe-opt %inputs/tiny-moe.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{adapter-config=%inputs/no-such-file.json}))' 2>&1 | FileCheck %s --check-prefix=NOFILE
// RUN: not moe-opt %inputs/tiny-moe.mlir --pass-pipeline='builtin.module(moe.model(moe-inject-lora{adapter-config=%inputs}))' 2>&1 | FileCheck %s --check-prefix=NODIRFILE

// Tests that a PEFT adapter_config.json (here the golden qwen3_moe one, read from its
// directory) replaces rank, alpha, dropout and targets: r 4 and alpha 8 (scale 2), its four
// attention targets, not the options' up_proj.
// QWEN: lora = {alpha = 8.000000e+00 : f64, dropout = 0.000000e+00 : f64, r = 4 : i64, targets = ["k_proj", "o_proj", "q_proj", "v_proj"]}
// QWEN: moe.param @self_attn_q_proj_lora_A "base_model.model.model.layers.{layer}.self_attn.q_proj.lora_A.weight" trainable : tensor<4x16xf32>
// QWEN-NOT: up_proj_lora
// QWEN: moe.lora {{.*}} {scale = 2.000000e+00 : f64}
// QWEN-NOT: up_proj_lora

// The golden kimi_linear config: every one of its eleven targets matches a KDA or MLA projection.
// KIMI: lora = {alpha = 8.000000e+00 : f64, dropout = 0.000000e+00 : f64, r = 4 : i64, targets = ["b_proj", "f_a_proj", "f_b_proj", "g_a_proj", "g_b_proj", "k_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "q_proj", "v_proj"]}
// KIMI-LABEL: moe.layer @kda_dense
// KIMI-COUNT-9: moe.lora
// KIMI-LABEL: moe.layer @mla_moe
// KIMI-COUNT-4: moe.lora
// KIMI-NOT: moe.lora
// KIMI-NOT: lora_scale

// use_rslora scales by lora_alpha / sqrt(r) (8 / 2), on dense and expert adapters alike.
// RSLORA: lora = {alpha = 8.000000e+00 : f64, dropout = 0.000000e+00 : f64, expert_lora, r = 4 : i64, rslora, targets = ["q_proj", "up_proj"]}
// RSLORA: moe.lora {{.*}} {scale = 4.000000e+00 : f64}
// RSLORA: moe.expert_mlp {{.*}} up_lora {{.*}}lora_scale = 4.000000e+00 : f64

// Settings that would train a different adapter are refused, naming the file, the key, what
// the file asks for and what is supported.
// DORA: error: moe-inject-lora: {{.*}}adapter-use-dora.json: key 'use_dora': true asks for DoRA (weight-decomposed LoRA), which is not supported; only plain LoRA (false) is
// RANKPAT: error: moe-inject-lora: {{.*}}adapter-rank-pattern.json: key 'rank_pattern': {"q_proj":8} asks for per-module ranks, which is not supported; one r for every target ({})
// ALPHAPAT: error: moe-inject-lora: {{.*}}adapter-alpha-pattern.json: key 'alpha_pattern': {"q_proj":16} asks for per-module alphas, which is not supported; one lora_alpha for every target ({})
// LAYERS: error: moe-inject-lora: {{.*}}adapter-layers-to-transform.json: key 'layers_to_transform': [0,1] asks for adapting a subset of the layers, which is not supported; every layer is adapted (null); qualify targets by layer type instead (e.g. kda:o_proj)
// BIAS: error: moe-inject-lora: {{.*}}adapter-bias.json: key 'bias': "lora_only" asks for training the base model's biases, which is not supported; only "none" is
// LORABIAS: error: moe-inject-lora: {{.*}}adapter-lora-bias.json: key 'lora_bias': true asks for a trainable bias on lora_B, which is not supported; only false is
// SAVE: error: moe-inject-lora: {{.*}}adapter-modules-to-save.json: key 'modules_to_save': ["lm_head"] asks for fully trained copies of modules, which is not supported; only LoRA adapters are trained (null)
// EXCLUDE: error: moe-inject-lora: {{.*}}adapter-exclude-modules.json: key 'exclude_modules': ["o_proj"] asks for excluding modules, which is not supported; list only the modules to adapt in target_modules (null)
// FANIN: error: moe-inject-lora: {{.*}}adapter-fan-in-fan-out.json: key 'fan_in_fan_out': true asks for [in, out] (Conv1D) base weights, which is not supported; the projections are [out, in] (false)
// PARAMS: error: moe-inject-lora: {{.*}}adapter-target-parameters.json: key 'target_parameters': ["mlp.experts.gate_up_proj"] asks for adapters on raw parameters, which is not supported; use the expert-lora option to adapt routed experts' projections ([])
// PEFTTYPE: error: moe-inject-lora: {{.*}}adapter-peft-type.json: key 'peft_type': "LOHA" asks for another adapter method, which is not supported; only "LORA" is
// REGEX: error: moe-inject-lora: {{.*}}adapter-regex-targets.json: key 'target_modules': ".*\\.(q|v)_proj" asks for a regular expression, which is not supported; list the module names instead, or use "all-linear"

// Unreadable, malformed, incomplete or mistyped configs name the file and the key.
// NULLTARGETS: error: moe-inject-lora: {{.*}}adapter-null-targets.json: key 'target_modules': missing or null (the modules to adapt: a list of names or "all-linear")
// MISSING: error: moe-inject-lora: {{.*}}adapter-missing-r.json: key 'r': missing or null (the adapter rank)
// WRONGTYPE: error: moe-inject-lora: {{.*}}adapter-wrong-type.json: key 'r': expected a positive integer, got "4"
// WRONGFLAG: error: moe-inject-lora: {{.*}}adapter-wrong-flag-type.json: key 'use_dora': expected true or false, got "no"
// MALFORMED: error: moe-inject-lora: {{.*}}adapter-malformed.json: malformed JSON: [2:0, byte=97]: Expected , or } after object property
// NOFILE: error: moe-inject-lora: {{.*}}no-such-file.json: cannot read: No such file or directory
// NODIRFILE: error: moe-inject-lora: {{.*}}Inputs/adapter_config.json: cannot read: No such file or directory
