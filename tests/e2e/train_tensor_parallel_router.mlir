//===- train_tensor_parallel_router.mlir - a router trained in full, over tp -===//
//
// A model.mlir may mark any checkpoint weight trainable: here every layer's router (gate). It
// starts from the checkpoint (the plan binds it), trains in full next to the q_proj adapters,
// and is exported as PEFT's modules_to_save. With tp the router reads the experts' entered
// tokens, so each rank computes its gate's gradient from its partial expert outputs: the gate
// gets moe.tp_partial_grad and its gradient is summed over tp. Two thread ranks, with and
// without sequence parallel, take the steps one rank takes and write the same adapter.
// A parameter PEFT cannot save (gpt-oss's attention sinks), or a module trained in part (gpt-oss's
// router weight without its bias), is refused before the first step.
//
// RUN: rm -rf %t && mkdir -p %t
// RUN: moec import %inputs/tiny_qwen3_moe_4_layers.json -o %t/plain.mlir
// RUN: sed -e 's|moe.param @mlp_gate "\([^"]*\)" :|moe.param @mlp_gate "\1" trainable :|' %t/plain.mlir > %t/model.mlir
// RUN: moec compile %t/model.mlir --seq-len 32 --micro-batch 2 --lora-rank 4 --lora-targets q_proj -o %t/single.moeplan
// RUN: moec compile %t/plain.mlir --seq-len 32 --micro-batch 2 --lora-rank 4 --lora-targets q_proj -o %t/frozen.moeplan
// RUN: moec compile %t/model.mlir --seq-len 32 --micro-batch 2 --lora-rank 4 --lora-targets q_proj --mesh tp=2 \
// RUN:     -o %t/tp.moeplan
// RUN: moec compile %t/model.mlir --seq-len 32 --micro-batch 2 --lora-rank 4 --lora-targets q_proj --mesh tp=2 \
// RUN:     --emit=mlir 2>/dev/null | FileCheck %s --check-prefix=IR
// RUN: moec compile %t/model.mlir --seq-len 32 --micro-batch 2 --lora-rank 4 --lora-targets q_proj --mesh tp=2 \
// RUN:     --emit=plan-text 2>/dev/null | FileCheck %s --check-prefix=PLAN
// RUN: moec compile %t/model.mlir --seq-len 32 --micro-batch 2 --lora-rank 4 --lora-targets q_proj --mesh tp=2 \
// RUN:     --sequence-parallel -o %t/sp.moeplan
// RUN: moe-run init %inputs/tiny_qwen3_moe_4_layers.json --seed 0 --plan %t/single.moeplan -o %t/model
//
// The trainable gate starts at the checkpoint's value: before a step, the model is the frozen one.
// RUN: moe-run forward --plan %t/single.moeplan --model %t/model --data %inputs/train.jsonl > %t/start_trainable
// RUN: moe-run forward --plan %t/frozen.moeplan --model %t/model --data %inputs/train.jsonl > %t/start_frozen
// RUN: diff %t/start_trainable %t/start_frozen
//
// RUN: moe-run train --plan %t/single.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/single --steps 4 2>/dev/null
// RUN: moe-run train --plan %t/tp.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/tp --steps 4 --nproc 2 2>/dev/null
// RUN: moe-run train --plan %t/sp.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/sp --steps 4 --nproc 2 2>/dev/null
// RUN: python3 %inputs/same_losses.py %t/tp/metrics.jsonl %t/single/metrics.jsonl 1e-5 | FileCheck %s --check-prefix=SAME
// RUN: python3 %inputs/same_losses.py %t/sp/metrics.jsonl %t/single/metrics.jsonl 1e-5 | FileCheck %s --check-prefix=SAME
// RUN: FileCheck %s --check-prefix=CONFIG < %t/single/adapter/adapter_config.json
//
// The adapters (with the trained gates) score the data alike, and unlike the start.
// RUN: moe-run forward --plan %t/single.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --adapter %t/single/adapter > %t/single_forward
// RUN: moe-run forward --plan %t/single.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --adapter %t/tp/adapter > %t/tp_forward
// RUN: moe-run forward --plan %t/single.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --adapter %t/sp/adapter > %t/sp_forward
// RUN: diff %t/tp_forward %t/single_forward
// RUN: diff %t/sp_forward %t/single_forward
// RUN: not diff %t/single_forward %t/start_frozen > /dev/null
// A frozen-gate plan refuses the adapter: it has no gate to load. The other way round, an adapter
// of LoRA tensors alone leaves the trainable gates at the checkpoint's value.
// RUN: not moe-run forward --plan %t/frozen.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --adapter %t/single/adapter 2>&1 | FileCheck %s --check-prefix=FROZEN
// RUN: moe-run train --plan %t/frozen.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/frozen --steps 2 2>/dev/null
// RUN: moe-run forward --plan %t/frozen.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --adapter %t/frozen/adapter > %t/lora_only_frozen
// RUN: moe-run forward --plan %t/single.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --adapter %t/frozen/adapter > %t/lora_only_trainable
// RUN: diff %t/lora_only_frozen %t/lora_only_trainable
//
// In bf16 a weight trained in full has no f32 master copy (adapters are f32): moec says so.
// RUN: sed -e 's|"dtype": "float32"|"dtype": "bfloat16"|' %inputs/tiny_qwen3_moe_4_layers.json > %t/bf16.json
// RUN: moec import %t/bf16.json | sed -e 's|moe.param @mlp_gate "\([^"]*\)" :|moe.param @mlp_gate "\1" trainable :|' > %t/bf16.mlir
// RUN: moec compile %t/bf16.mlir --seq-len 32 --lora-rank 4 --lora-targets q_proj -o %t/bf16.moeplan 2>&1 \
// RUN:     | FileCheck %s --check-prefix=BF16
// RUN: moec import %inputs/tiny_gpt_oss.json -o %t/gpt_oss.mlir
// RUN: sed -e 's|moe.param @self_attn_sinks "\([^"]*\)" :|moe.param @self_attn_sinks "\1" trainable :|' \
// RUN:     %t/gpt_oss.mlir > %t/sinks.mlir
// RUN: moec compile %t/sinks.mlir --seq-len 32 --micro-batch 2 --lora-rank 4 -o %t/sinks.moeplan
// RUN: not moe-run train --plan %t/sinks.moeplan --random-weights 0 --data %inputs/train.jsonl \
// RUN:     --out %t/sinks --steps 2 2>&1 | FileCheck %s --check-prefix=SINKS
// PEFT loads a module to save whole: gpt-oss's router trained without its bias is refused too.
// RUN: sed -e 's|moe.param @mlp_router "\([^"]*\)" :|moe.param @mlp_router "\1" trainable :|' \
// RUN:     %t/gpt_oss.mlir > %t/router.mlir
// RUN: moec compile %t/router.mlir --seq-len 32 --micro-batch 2 --lora-rank 4 --lora-targets q_proj -o %t/router.moeplan
// RUN: not moe-run train --plan %t/router.moeplan --random-weights 0 --data %inputs/train.jsonl \
// RUN:     --out %t/router --steps 2 2>&1 | FileCheck %s --check-prefix=ROUTER

// IR: moe.param @mlp_gate "{{[^"]*}}" trainable : tensor<8x96xf32> {moe.tp_partial_grad}
// IR: moe.router %[[TOKENS:[0-9]+]]
// IR-SAME: : (tensor<?x96xf32>, tensor<8x96xf32>)
// PLAN: bind %[[GATE:[0-9]+]] "model.layers.0.mlp.gate.weight"
// PLAN: lora_tensor "base_model.model.model.layers.0.mlp.gate.weight" rank=0 param=%[[GATE]]
// CONFIG: "modules_to_save": [
// CONFIG-NEXT: "model.layers.0.mlp.gate",
// CONFIG-NEXT: "model.layers.1.mlp.gate",
// CONFIG-NEXT: "model.layers.2.mlp.gate",
// CONFIG-NEXT: "model.layers.3.mlp.gate"
// CONFIG-NEXT: ],
// FROZEN: unexpected tensor 'base_model.model.model.layers.0.mlp.gate.weight'
// SINKS: sinks.moeplan: its trained tensors make no PEFT adapter: tensor 'base_model.model.model.layers.0.self_attn.sinks' is neither a LoRA tensor
// SINKS-NOT: step 1/
// ROUTER: module 'model.layers.0.mlp.router' is trained in full but its 'bias' is frozen; PEFT saves and loads a module to save whole: mark model.layers.0.mlp.router.bias trainable too, or neither
// ROUTER-NOT: step 1/
// BF16: moec: warning: @mlp_gate (and any other trainable checkpoint weight not in f32) trains in its own dtype with no f32 master copy
// SAME: 4 steps agree within 1e-05
