//===- train_resume.mlir - 6 steps straight == 3 steps + --resume to 6 ----===//
//
// Training is deterministic and a checkpoint holds everything a run needs (LoRA weights, AdamW
// moments, step, data position): stopping at step 3 and resuming must give the bytes of the
// straight run. Then the PEFT adapter the run writes: its config and its tensors.
//
// RUN: rm -rf %t && mkdir -p %t
// RUN: moec compile %root/models/tiny-qwen3-moe/config.json --seq-len 32 --micro-batch 2 \
// RUN:     --lora-rank 4 -o %t/plan.moeplan
// RUN: moe-run init %root/models/tiny-qwen3-moe/config.json --seed 0 --plan %t/plan.moeplan \
// RUN:     -o %t/model 2>&1 | FileCheck %s --check-prefix=INIT
//
// (a) 6 steps straight, checkpointing every 3.
// RUN: moe-run train --plan %t/plan.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/a --steps 6 --checkpoint-every 3 --log-every 1 2>&1 \
// RUN:   | FileCheck %s --check-prefix=STRAIGHT
//
// (b) 3 steps, then --resume to 6 in the same folder.
// RUN: moe-run train --plan %t/plan.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/b --steps 3 --checkpoint-every 3 --log-every 1 2>&1 \
// RUN:   | FileCheck %s --check-prefix=FIRST
// RUN: moe-run train --plan %t/plan.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/b --steps 6 --checkpoint-every 3 --log-every 1 --resume 2>&1 \
// RUN:   | FileCheck %s --check-prefix=RESUMED
//
// Same checkpoint and adapter, byte for byte.
// RUN: cmp %t/a/checkpoint.safetensors %t/b/checkpoint.safetensors
// RUN: cmp %t/a/adapter/adapter_model.safetensors %t/b/adapter/adapter_model.safetensors
// RUN: grep -ao '"__metadata__":{[^}]*}' %t/b/checkpoint.safetensors | FileCheck %s --check-prefix=CKPT
//
// Same metrics, step for step (all but the throughput): 1-3 from the first run of (b), 4-6
// from the resumed one, each exactly once.
// RUN: sed 's/"tokens_per_s":[^,]*,//' %t/a/metrics.jsonl > %t/a.metrics
// RUN: sed 's/"tokens_per_s":[^,]*,//' %t/b/metrics.jsonl > %t/b.metrics
// RUN: diff %t/a.metrics %t/b.metrics
// RUN: FileCheck %s --check-prefix=METRICS --input-file %t/b.metrics
//
// The adapter: PEFT config with r = 4, and 2 layers x {q,k,v,o} x {A,B} = 16 tensors.
// RUN: FileCheck %s --check-prefix=CONFIG --input-file %t/a/adapter/adapter_config.json
// RUN: FileCheck %s --check-prefix=TARGETS --input-file %t/a/adapter/adapter_config.json
// RUN: grep -ao '"base_model[^"]*":{"dtype":"[A-Z0-9]*","shape":\[[0-9,]*\]' \
// RUN:     %t/a/adapter/adapter_model.safetensors | sort | FileCheck %s --check-prefix=TENSORS
// RUN: grep -ao '"base_model[^"]*":{' %t/a/adapter/adapter_model.safetensors | wc -l \
// RUN:   | FileCheck %s --check-prefix=COUNT
//
//===----------------------------------------------------------------------===//

// INIT: moe-run: wrote a random model (seed 0) to {{.*}}model

// STRAIGHT-NOT: resumed
// STRAIGHT: step 1/6  loss
// STRAIGHT-NEXT: step 2/6
// STRAIGHT-NEXT: step 3/6
// STRAIGHT-NEXT: step 4/6
// STRAIGHT-NEXT: step 5/6
// STRAIGHT-NEXT: step 6/6
// STRAIGHT-NEXT: moe-run: trained 6 steps

// FIRST-NOT: resumed
// FIRST: step 1/3
// FIRST-NEXT: step 2/3
// FIRST-NEXT: step 3/3
// FIRST-NEXT: moe-run: trained 3 steps

// RESUMED: moe-run: resumed from {{.*}}b/checkpoint.safetensors at step 3{{$}}
// RESUMED-NEXT: step 4/6
// RESUMED-NEXT: step 5/6
// RESUMED-NEXT: step 6/6
// RESUMED-NEXT: moe-run: trained 6 steps
// RESUMED-NEXT: adapter (PEFT): {{.*}}b/adapter
// RESUMED-NEXT: checkpoint: {{.*}}b/checkpoint.safetensors

// CKPT: "moec_checkpoint":"1","step":"6"

// METRICS:      {"step":1,"loss":{{[0-9.e+-]+}},"lr":0,"grad_norm":{{[0-9.e+-]+}},"expert_load":{"0":{"tokens":[
// METRICS-NEXT: {"step":2,"loss":
// METRICS-NEXT: {"step":3,"loss":
// METRICS-NEXT: {"step":4,"loss":
// METRICS-NEXT: {"step":5,"loss":
// METRICS-NEXT: {"step":6,"loss":{{.*}}
// METRICS-NOT:  "step"

// CONFIG-DAG: "peft_type": "LORA",
// CONFIG-DAG: {{^}}  "r": 4,
// CONFIG-DAG: "lora_alpha": 16,
// CONFIG-DAG: "task_type": "CAUSAL_LM",
// CONFIG-DAG: "use_dora": false,
// CONFIG-DAG: "use_rslora": false,

// TARGETS:      "target_modules": [
// TARGETS-NEXT:   "k_proj",
// TARGETS-NEXT:   "o_proj",
// TARGETS-NEXT:   "q_proj",
// TARGETS-NEXT:   "v_proj"
// TARGETS-NEXT: ],

// TENSORS:      "base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight":{"dtype":"F32","shape":[4,96]
// TENSORS-NEXT: "base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight":{"dtype":"F32","shape":[48,4]
// TENSORS-NEXT: "base_model.model.model.layers.0.self_attn.o_proj.lora_A.weight":{"dtype":"F32","shape":[4,96]
// TENSORS-NEXT: "base_model.model.model.layers.0.self_attn.o_proj.lora_B.weight":{"dtype":"F32","shape":[96,4]
// TENSORS-NEXT: "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight":{"dtype":"F32","shape":[4,96]
// TENSORS-NEXT: "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight":{"dtype":"F32","shape":[96,4]
// TENSORS-NEXT: "base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight":{"dtype":"F32","shape":[4,96]
// TENSORS-NEXT: "base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight":{"dtype":"F32","shape":[48,4]
// TENSORS-NEXT: "base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight":{"dtype":"F32","shape":[4,96]
// TENSORS-NEXT: "base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight":{"dtype":"F32","shape":[48,4]
// TENSORS-NEXT: "base_model.model.model.layers.1.self_attn.o_proj.lora_A.weight":{"dtype":"F32","shape":[4,96]
// TENSORS-NEXT: "base_model.model.model.layers.1.self_attn.o_proj.lora_B.weight":{"dtype":"F32","shape":[96,4]
// TENSORS-NEXT: "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight":{"dtype":"F32","shape":[4,96]
// TENSORS-NEXT: "base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight":{"dtype":"F32","shape":[96,4]
// TENSORS-NEXT: "base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight":{"dtype":"F32","shape":[4,96]
// TENSORS-NEXT: "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight":{"dtype":"F32","shape":[48,4]
// TENSORS-NOT:  base_model

// COUNT: {{^ *16$}}
