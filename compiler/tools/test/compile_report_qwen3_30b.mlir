//===- compile_report_qwen3_30b.mlir - moec compile --emit=report ---------===//
//
// Qwen3-30B-A3B with LoRA r=32 on q/k/v/o at 4096 tokens. The trainable count
// is PEFT's (26.7M) worked out by hand: per layer r * (in + out) for
// q 2048->4096, k 2048->512, v 2048->512, o 4096->2048
//   = 32 * (6144 + 2560 + 2560 + 6144) = 557,056, times 48 layers = 26,738,688.
// The total adds it to the 30,532,122,624 base parameters (summary_qwen3_30b.mlir).
//
// RUN: moec compile %root/models/qwen3-30b-a3b/config.json --lora-rank 32 --lora-alpha 64 \
// RUN:   --lora-targets q_proj,k_proj,v_proj,o_proj --seq-len 4096 --emit=report | FileCheck %s
// RUN: moec compile %root/models/qwen3-30b-a3b/config.json --lora-rank 32 --lora-alpha 64 \
// RUN:   --lora-targets q_proj,k_proj,v_proj,o_proj --seq-len 4096 --recompute per-layer \
// RUN:   --emit=report | FileCheck %s --check-prefix=RECOMPUTE
//
//===----------------------------------------------------------------------===//

// CHECK: model: Qwen3MoeForCausalLM (qwen3_moe)
// CHECK: tokens per step: 4096 (seq-len 4096 x micro-batch 1)
// CHECK: parameters: total 30,558,861,312 (30.56B), trainable 26,738,688 (26.74M, 0.0875%)
// CHECK: lora: alpha=64 dropout=0 r=32 targets=k_proj,o_proj,q_proj,v_proj
// CHECK: recompute: none
// bf16, gated SiLU experts without LoRA: each layer's expert MLP and combine have one backward.
// CHECK-NEXT: expert backward: 48 expert MLP(s) differentiated with their combine (the expert outputs not saved), 0 apart
// Forward linear FLOPs, by hand: 2 * 4096 tokens * 48 layers * (attention projections
// 2048*(4096+512+512) + 4096*2048 = 18,874,368, router 2048*128 = 262,144 counted apart)
//   = 7,421,703,487,488: 7.422 T. The LM head, fused with the loss (--moe-fuse), is
// 2 * 4096 * 2048 * 151936 = 2,549,063,090,176: 2.549 T.
// Without recompute the frozen projections' backward is their input gradient only: 1x; the
// frozen fused head forms its input's gradient in the forward (2x there) and its backward only
// scales it.
// CHECK: kernel forward backward recompute
// CHECK: linear 7.422 7.422 0.000
// CHECK: lm_head_cross_entropy 5.098 0.000 0.000
// CHECK: total
// The weights in bf16: 30,532,122,624 * 2 bytes (each buffer rounded up to 256 bytes).
// CHECK: memory per rank (arena sizes):
// CHECK-NEXT: weight 56.87 GiB
// LoRA parameters and their gradients in f32 (adapters stay f32 on a bf16 model, as PEFT keeps
// them) and two f32 AdamW moments: 4, 4 and 8 bytes per trainable parameter (26,738,688).
// CHECK-NEXT: lora_param 0.10 GiB 106,954,752
// CHECK-NEXT: optimizer_state 0.20 GiB 213,909,504
// CHECK: gradient 0.10 GiB 106,954,752
// The fused head's scratch: a chunk of 1024 tokens x 151936 bf16 logits, and a float per token.
// CHECK: scratch 0.29 GiB 311,181,312 (largest kernel scratch, outside the arenas)
// CHECK: peak

// Unfused, the head is a linear like the others and the logits (and their gradient) are
// activations: no scratch line.
// RUN: moec compile %root/models/qwen3-30b-a3b/config.json --lora-rank 32 --lora-alpha 64 \
// RUN:   --lora-targets q_proj,k_proj,v_proj,o_proj --seq-len 4096 --no-fuse --emit=report \
// RUN:   | FileCheck %s --check-prefix=UNFUSED
// UNFUSED: linear 9.971 9.971 0.000
// UNFUSED-NOT: lm_head_cross_entropy
// UNFUSED-NOT: scratch
// UNFUSED: peak

// --fuse-lora: in the forward each adapted projection is one op with its update (--moe-fuse-lora):
// the adapters add 2 * 4096 * 48 * 32 * ((2048+4096) + (2048+512) * 2 + (4096+2048)) = 0.219 T;
// the backward keeps the unfused ops (the adapters' twice their forward). Under a memory cap the
// layers memory planning switches (here 23 recomputed, 25 regathered) are fused like the others:
// the recompute column has 23 of 48 layers' projections.
// RUN: moec compile %root/models/qwen3-30b-a3b/config.json --lora-rank 32 --lora-alpha 64 \
// RUN:   --lora-targets q_proj,k_proj,v_proj,o_proj --seq-len 4096 --memory-cap 61GiB --fuse-lora \
// RUN:   --emit=report | FileCheck %s --check-prefix=CAPPED
// CAPPED: recompute: mixed (23 layer(s) recomputed, 25 gather their experts' token copies again in the backward)
// CAPPED: linear 0.000 7.422 0.000
// CAPPED: lora 0.000 0.438 0.000
// CAPPED: lora_linear 7.641 0.000 3.661

// Recomputing each layer re-runs its forward in the backward; the saved activations shrink.
// RECOMPUTE: recompute: per-layer
// RECOMPUTE: linear 7.422 7.422 7.422
// RECOMPUTE: activation {{[0-9]\.[0-9]+}} GiB

// Expert parallel over 2 ranks: a token has an expert on the other rank unless all 8 of its
// experts are among this rank's 64: 1 - C(64,8)/C(128,8) = 0.99690, so --ep-exchange=auto sends
// every token to every rank (fixed message sizes). Per layer, by hand: the hidden state
// 4096 x 2048 bf16 = 16,777,216 bytes and the router weights 4096 x 8 f32 = 131,072 go out
// (forward sends: 96 = 2 per layer, 48 x 16,908,288 = 811,597,824); the partial sums come back
// in f32, 4096 x 2048 x 4 = 33,554,432 (x 48 = 1,610,612,736); the route sends the experts,
// 4096 x 8 x 4 bytes x 48 = 6,291,456. The backward's returns carry the sends' gradients.
// RUN: moec compile %root/models/qwen3-30b-a3b/config.json --lora-rank 32 --lora-alpha 64 \
// RUN:   --lora-targets q_proj,k_proj,v_proj,o_proj --seq-len 4096 --mesh ep=2 --emit=report \
// RUN:   | FileCheck %s --check-prefix=EP
// EP: expert_return    ep       forward       48  1,610,612,736
// EP: expert_return    ep       backward      96    811,597,824
// EP: expert_route     ep       forward       48      6,291,456  every token's experts to every rank
// EP: expert_send      ep       forward       96    811,597,824  hidden states and router weights of every token to every rank
// The replay of the step on its streams (kernels at their floors, collectives at GPU.md's
// NCCL bus bandwidths): without --overlap every collective is exposed; with it, the expert
// exchange in two token blocks and the gradient sums on stream 1. By hand from the bytes above:
// the forward sends 811,597,824 / 279 GB/s = 2.909 ms, the gradient sums 106,954,752 / 314 GB/s
// = 0.341 ms (hidden under the backward's projections).
// EP: communication and compute (predicted: kernels at their floors, 802 TFLOP/s or 4.27 TB/s; collectives at 279 GB/s all-to-all, 314 GB/s all-reduce and sends):
// EP-NEXT: streams 1: compute {{[0-9.]+}} ms, communication [[COMM:[0-9.]+]] ms; the step [[STEP:[0-9.]+]] ms (one stream: [[STEP]] ms)
// EP-NEXT: exposed communication [[COMM]] ms of [[COMM]] (100%)
// RUN: moec compile %root/models/qwen3-30b-a3b/config.json --lora-rank 32 --lora-alpha 64 \
// RUN:   --lora-targets q_proj,k_proj,v_proj,o_proj --seq-len 4096 --mesh ep=2 --overlap --emit=report \
// RUN:   | FileCheck %s --check-prefix=OVERLAP
// OVERLAP: streams 2: compute {{[0-9.]+}} ms, communication [[COMM:[0-9.]+]] ms; the step {{[0-9.]+}} ms (one stream: {{[0-9.]+}} ms)
// OVERLAP-NEXT: exposed communication {{[0-9.]+}} ms of [[COMM]] ({{[1-9][0-9]?}}%)
// OVERLAP-NEXT: collective phase count time ms hidden ms runs under (ms of it)
// OVERLAP-NEXT: all_reduce backward 48 0.341 0.341 linear 0.341
// OVERLAP: expert_send forward 192 2.909 {{[0-9.]+}} dispatch

// With --ep-exchange=routed a token goes only where it has an expert: 0.99690 of the bytes
// (the route: per layer 131,072 x 0.99690 = 130,666 bytes, x 48 = 6,271,968).
// RUN: moec compile %root/models/qwen3-30b-a3b/config.json --lora-rank 32 --lora-alpha 64 \
// RUN:   --lora-targets q_proj,k_proj,v_proj,o_proj --seq-len 4096 --mesh ep=2 --ep-exchange routed \
// RUN:   --emit=report | FileCheck %s --check-prefix=ROUTED
// ROUTED: expert_route     ep       forward       48      6,271,968  each token's experts to the ranks that hold them
// RUN: not moec compile %root/models/qwen3-30b-a3b/config.json --mesh ep=2 --ep-exchange some 2>&1 \
// RUN:   | FileCheck %s --check-prefix=BADEXCHANGE
// BADEXCHANGE: --ep-exchange must be auto, routed or all, got 'some'

// Over 8 ranks (16 experts each) a token has an expert on a given other rank with probability
// 1 - C(112,8)/C(128,8) = 0.6674 only: auto keeps the routed exchange. The route sends each
// token's 8 experts (32 bytes) to the 7 other ranks in that share: 4096 x 32 x 7 x 0.6674 =
// 612,360 bytes a layer, x 48 = 29,393,280.
// RUN: moec compile %root/models/qwen3-30b-a3b/config.json --lora-rank 32 --lora-alpha 64 \
// RUN:   --lora-targets q_proj,k_proj,v_proj,o_proj --seq-len 4096 --mesh ep=8 --emit=report \
// RUN:   | FileCheck %s --check-prefix=EP8
// EP8: expert_route     ep       forward       48     29,393,280  each token's experts to the ranks that hold them
// EP8: the 128 experts of @gqa_moe split over ep = 8 (16 per rank): expert_return x144, expert_route x48, expert_send x144
