//===- PlanText.h - a plan as text for humans and lit tests -----*- C++ -*-===//
//
// `moec compile --emit=plan-text` prints this; lit tests grep it, so the
// format is stable: one fact per line, fields in a fixed order, map
// attributes sorted by key, doubles in their shortest round-trip form.
// Free-form strings (names, tensors, origins) are double-quoted with C
// escapes; enum values outside the schema print as `unknown(N)`.
//
//   plan v2 model=Qwen3MoeForCausalLM model_type=qwen3_moe seq=4096x2
//   mesh dp=1 tp=2 pp=1 ep=1 world=2 recompute=per-layer
//   optimizer adamw lr=0.0001 betas=0.9,0.999 eps=1e-08 weight_decay=0 warmup=100/1000 schedule=cosine min_lr_ratio=0.1 max_grad_norm=1
//   lora r=16 alpha=32 dropout=0 expert_lora=false targets=q_proj,v_proj
//   rank 0 streams=2 events=1 groups=1 buffers=16 weights=3 steps=9
//     arena activation 16777216 (16.0 MiB)
//     group 0 tp [0,1]
//     %12 activation bf16 [4096,2048] @0+16777216 live 3..57 "layer3.q"
//     bind %0 "model.layers.3.self_attn.q_proj.weight" slice [0+2048,0+4096]
//     bind %1 "model.layers.3.mlp.experts.{expert}.up_proj.weight" first_expert=64
//     bind %8 "model.layers.1.mlp.experts.{expert}.up_proj.weight" experts=7,2,4,1
//     #17 fwd L3 s0 linear %3, %5 -> %9 {flops=34359738368, transpose_b=true}  // "origin"
//     #18 fwd L3 s0 record e0
//     #19 fwd L3 s1 wait e0
//     #20 fwd L3 s1 all_reduce g0 %9 -> %9
//   lora_tensor "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight" rank=0 param=%2 grad=%4 adam_m=%6 adam_v=%7
//
// seq is seq_len x micro_batch; mesh axes of 0 print as 1; `@offset+size`
// are bytes in the role's arena; `live a..b` is inclusive; steps print
// `L<layer>` only inside a layer, a kernel's tuned variant as
// `kernel:variant`, and the origin only when set; a slice is start+size per
// dimension; an expert placement prints as the binding's `experts=` and the
// route's `placement=` (each rank's experts in turn). A plan without an optimizer or LoRA layout prints
// `optimizer none` / `lora none`.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_PLAN_PLANTEXT_H_
#define RUNTIME_PLAN_PLANTEXT_H_

#include <string>

#include "runtime/plan/plan.pb.h"

namespace moec::plan {

/// The text form above. Works on any plan, valid or not (it is how one looks
/// at a plan the validator rejected), and never fails.
std::string planToText(const Plan &plan);

} // namespace moec::plan

#endif // RUNTIME_PLAN_PLANTEXT_H_
