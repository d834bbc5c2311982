//===- train_tensor_parallel_router.mlir - a trainable router over tp ------===//
//
// With tp the router reads the experts' entered tokens, so each rank computes its gate's
// gradient from its partial expert outputs: a trainable gate (a model.mlir may mark any
// parameter trainable) gets moe.tp_partial_grad and its gradient is summed over tp. Two thread
// ranks, with and without sequence parallel, take the steps one rank takes. (The run ends in
// an error: a trainable gate has no PEFT name to export under; the steps are in metrics.jsonl.)
//
// RUN: rm -rf %t && mkdir -p %t
// RUN: moec import %inputs/tiny_qwen3_moe_4_layers.json -o %t/plain.mlir
// RUN: sed -e 's|moe.param @mlp_gate "\([^"]*\)" :|moe.param @mlp_gate "\1" trainable :|' %t/plain.mlir > %t/model.mlir
// RUN: moec compile %t/model.mlir --seq-len 32 --micro-batch 2 --lora-rank 4 --lora-targets q_proj -o %t/single.moeplan
// RUN: moec compile %t/model.mlir --seq-len 32 --micro-batch 2 --lora-rank 4 --lora-targets q_proj --mesh tp=2 \
// RUN:     -o %t/tp.moeplan
// RUN: moec compile %t/model.mlir --seq-len 32 --micro-batch 2 --lora-rank 4 --lora-targets q_proj --mesh tp=2 \
// RUN:     --emit=mlir 2>/dev/null | FileCheck %s --check-prefix=IR
// RUN: moec compile %t/model.mlir --seq-len 32 --micro-batch 2 --lora-rank 4 --lora-targets q_proj --mesh tp=2 \
// RUN:     --sequence-parallel -o %t/sp.moeplan
// RUN: moe-run init %inputs/tiny_qwen3_moe_4_layers.json --seed 0 --plan %t/single.moeplan -o %t/model
// RUN: not moe-run train --plan %t/single.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/single --steps 4 2>&1 | FileCheck %s --check-prefix=EXPORT
// RUN: not moe-run train --plan %t/tp.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/tp --steps 4 --nproc 2 2>/dev/null
// RUN: not moe-run train --plan %t/sp.moeplan --model %t/model --data %inputs/train.jsonl \
// RUN:     --out %t/sp --steps 4 --nproc 2 2>/dev/null
// RUN: python3 %inputs/same_losses.py %t/tp/metrics.jsonl %t/single/metrics.jsonl 1e-5 | FileCheck %s --check-prefix=SAME
// RUN: python3 %inputs/same_losses.py %t/sp/metrics.jsonl %t/single/metrics.jsonl 1e-5 | FileCheck %s --check-prefix=SAME

// IR: moe.param @mlp_gate "{{[^"]*}}" trainable : tensor<8x96xf32> {moe.tp_partial_grad}
// IR: moe.router %[[TOKENS:[0-9]+]]
// IR-SAME: : (tensor<?x96xf32>, tensor<8x96xf32>)
// EXPORT: step 4/4
// EXPORT: PEFT names start with "base_model.model." (the trained parameters are in {{.*}}checkpoint.safetensors)
// SAME: 4 steps agree within 1e-05
