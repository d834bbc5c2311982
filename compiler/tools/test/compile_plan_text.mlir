//===- compile_plan_text.mlir - moec compile --emit=plan-text -------------===//
//
// The golden qwen3_moe model (Inputs/golden_qwen3_moe.json is a copy of
// shared/golden/qwen3_moe/config.json) with the golden adapter's settings, for
// the golden batch of 2 x 96 tokens.
//
// RUN: moec compile %inputs/golden_qwen3_moe.json --lora-targets q_proj,k_proj,v_proj,o_proj \
// RUN:   --lora-rank 4 --lora-alpha 8 --seq-len 96 --micro-batch 2 --emit=plan-text | FileCheck %s
// RUN: moec compile %inputs/golden_qwen3_moe.json --lora-targets q_proj --lora-rank 4 \
// RUN:   --seq-len 96 --micro-batch 2 --recompute per-layer --emit=plan-text \
// RUN:   | FileCheck %s --check-prefix=RECOMPUTE
// RUN: moec compile %inputs/golden_qwen3_moe.json --lora-targets q_proj --seq-len 96 -o %t.moeplan 2>&1 \
// RUN:   | FileCheck %s --check-prefix=BINARY
// RUN: moec compile %inputs/golden_qwen3_moe.json --lora-targets q_proj --seq-len 96 --micro-batch 2 \
// RUN:   --no-fuse --emit=plan-text | FileCheck %s --check-prefix=UNFUSED
// RUN: moec compile %inputs/golden_qwen3_moe.json --lora-targets q_proj,k_proj,v_proj,o_proj \
// RUN:   --lora-rank 4 --lora-alpha 8 --seq-len 96 --micro-batch 2 --fuse-lora --emit=plan-text \
// RUN:   | FileCheck %s --check-prefix=FUSELORA
// RUN: moec compile %inputs/golden_qwen3_moe.json --lora-targets q_proj --seq-len 96 --emit=report \
// RUN:   --mlir-print-ir-after-all 2>&1 | FileCheck %s --check-prefix=IR
//
//===----------------------------------------------------------------------===//

// CHECK: plan v2 model=Qwen3MoeForCausalLM model_type=qwen3_moe seq=96x2
// CHECK-NEXT: mesh dp=1 tp=1 pp=1 ep=1 world=1 recompute=none
// CHECK-NEXT: optimizer adamw lr=0.0001 betas=0.9,0.999 eps=1e-08 weight_decay=0 warmup=10/1000 schedule=cosine min_lr_ratio=0.1 max_grad_norm=1
// CHECK-NEXT: lora r=4 alpha=8 dropout=0 expert_lora=false targets=k_proj,o_proj,q_proj,v_proj
// Inputs are 2 x 96 = 192 tokens.
// CHECK: %0 input i64 [192] {{.*}} "input_ids"
// CHECK: %1 input i64 [192] {{.*}} "positions"
// CHECK: %2 input i64 [192] {{.*}} "labels"
// Frozen weights are bound by checkpoint name, the layer index in place; stacked experts by pattern.
// CHECK-DAG: bind %{{[0-9]+}} "model.layers.0.self_attn.q_proj.weight"
// CHECK-DAG: bind %{{[0-9]+}} "model.layers.1.mlp.experts.{expert}.up_proj.weight" first_expert=0
// Dispatched tokens: one row per (token, chosen expert): 192 x top-2.
// CHECK-DAG: activation f32 [384,64] {{.*}} "layer0.dispatch.{{[0-9]+}}#0"
// The step: forward, loss, backward; gradients only for the adapters.
// CHECK: fwd L0 s0 linear
// CHECK: fwd L0 s0 lora
// The LM head and the loss are one fused launch (--moe-fuse): the loss, a logsumexp per token
// and (the head is frozen) the input's gradient, which the backward scales.
// CHECK: fwd s0 lm_head_cross_entropy %{{[0-9]+}}, %{{[0-9]+}}, %2 -> %{{[0-9]+}}, %{{[0-9]+}}, %{{[0-9]+}} {{{.*}}chunk_tokens=1024, ignore_index=-100, logits_type="f32", shift_labels=true
// CHECK: bwd s0 lm_head_cross_entropy.backward {{.*}}backward_segments=[3,3,1], {{.*}}grad_of_inputs=[0]
// CHECK: bwd L1 s0 lora.backward {{.*}}grad_of_inputs=[0,1,2]
// CHECK: bwd L1 s0 accumulate_grad
// CHECK: bwd L1 s0 linear.backward {{.*}}grad_of_inputs=[0]
// CHECK-NOT: fwd L1
// CHECK: bwd L0 s0 accumulate_grad
// 2 layers x 4 projections x (A, B).
// CHECK-COUNT-16: lora_tensor "base_model.model.model.layers.{{[01]}}.self_attn.{{[qkvo]}}_proj.lora_{{[AB]}}.weight"
// CHECK-NOT: lora_tensor

// RECOMPUTE: recompute=per-layer
// RECOMPUTE: recompute L1 s0 linear
// RECOMPUTE-NOT: recompute L1 s0 router
// RECOMPUTE: bwd L1 s0 router.backward

// --no-fuse keeps the head a linear: its [192, 256] logits are an activation moe-align reads.
// UNFUSED: activation f32 [192,256] {{.*}} "logits"
// UNFUSED: fwd s0 linear
// UNFUSED: fwd s0 cross_entropy {{.*}}ignore_index=-100, {{.*}}shift_labels=true
// UNFUSED: bwd s0 cross_entropy.backward
// UNFUSED-NOT: lm_head_cross_entropy

// BINARY: moec: wrote {{.*}}.moeplan ({{[0-9]+}} steps, {{[0-9]+}} buffers)

// IR: IR Dump After InjectLoRAPass
// IR: IR Dump After BuildTrainingStepPass
// IR: IR Dump After FusePass
// IR: IR Dump After PlanMemoryPass
// IR: parameters: total

// An adapter's settings (Inputs/adapter/adapter_config.json is the golden qwen3_moe one:
// r=4, alpha=8, q/k/v/o) replace the --lora-* flags; expert LoRA adds per-expert adapters.
// RUN: moec compile %inputs/golden_qwen3_moe.json --adapter %inputs/adapter --lora-rank 16 --seq-len 96 \
// RUN:   --emit=plan-text | FileCheck %s --check-prefix=ADAPTER
// ADAPTER: lora r=4 alpha=8 dropout=0 expert_lora=false targets=k_proj,o_proj,q_proj,v_proj
// RUN: moec compile %inputs/golden_qwen3_moe.json --lora-targets q_proj,up_proj --expert-lora --rslora \
// RUN:   --seq-len 96 --emit=plan-text | FileCheck %s --check-prefix=EXPERTS
// EXPERTS: lora r=8 alpha=16 dropout=0 expert_lora=true rslora=true targets=q_proj,up_proj
// EXPERTS: lora_param f32 [8,8,64] {{.*}} "base_model.model.model.layers.0.mlp.experts.{expert}.up_proj.lora_A.weight"
// Operand positions count present operands only: tokens, counts, up, down, gate, up_lora A and B.
// EXPERTS: bwd L1 s0 expert_mlp.backward {{.*}}grad_of_inputs=[0,5,6], {{.*}}lora_scale=5.656854

// --fuse-lora: each adapted projection's forward is one launch with its LoRA update
// (--moe-fuse-lora), its projection's part rounded where the linear's was; the backward keeps
// the unfused ops.
// FUSELORA: fwd L0 s0 lora_linear {{.*}}base_type="f32"
// FUSELORA-NOT: fwd L0 s0 lora {{.*}}
// FUSELORA: bwd L1 s0 lora.backward {{.*}}grad_of_inputs=[0,1,2]
// FUSELORA: bwd L1 s0 linear.backward {{.*}}grad_of_inputs=[0]
// FUSELORA-NOT: lora_linear.backward
