// RUN: moe-opt %inputs/tiny_lora.mlir --pass-pipeline='builtin.module(moe.model(moe-build-training-step,moe-plan-memory{seq-len=8 micro-batch=2}))' | FileCheck %s
// RUN: moe-opt %inputs/tiny_lora.mlir --pass-pipeline='builtin.module(moe.model(moe-build-training-step,moe-plan-memory{seq-len=8 micro-batch=2 memory-cap=45000}))' | FileCheck %s --check-prefix=CAP
// RUN: moe-opt %inputs/tiny_lora.mlir --pass-pipeline='builtin.module(moe.model(moe-build-training-step,moe-plan-memory{seq-len=8 micro-batch=2 memory-cap=42000}))' | FileCheck %s --check-prefix=CAP2
// RUN: moe-opt %inputs/dense_lora.mlir --pass-pipeline='builtin.module(moe.model(moe-build-training-step,moe-plan-memory{seq-len=8 micro-batch=2 memory-cap=40000}))' | FileCheck %s --check-prefix=DENSE
// RUN: not moe-opt %inputs/tiny_lora.mlir --pass-pipeline='builtin.module(moe.model(moe-build-training-step,moe-plan-memory{seq-len=8 micro-batch=2 memory-cap=30KiB}))' 2>&1 | FileCheck %s --check-prefix=TOOSMALL
// RUN: not moe-opt %inputs/tiny_lora.mlir --pass-pipeline='builtin.module(moe.model(moe-build-training-step,moe-plan-memory{memory-cap=lots}))' 2>&1 | FileCheck %s --check-prefix=BADCAP
// RUN: not moe-opt %inputs/tiny_lora.mlir --pass-pipeline='builtin.module(moe.model(moe-plan-memory))' 2>&1 | FileCheck %s --check-prefix=NOSTEP
// The named pipeline moec runs gives the same plan (no lora-targets: the model keeps its adapter)
// without fusion; with it (the default) the LM head's logits give way to its kernel's scratch.
// RUN: moe-opt %inputs/tiny_lora.mlir --moe-lora-training='seq-len=8 micro-batch=2 fuse=false' | FileCheck %s
// RUN: moe-opt %inputs/tiny_lora.mlir --moe-lora-training='seq-len=8 micro-batch=2' | FileCheck %s --check-prefix=FUSED

// Sizes by hand for 8 x 2 = 16 tokens, f32, each buffer rounded up to 256 bytes:
//   weights: embed 32x16 (2048) + head (2048) + 2 layers x (norm 64->256, q 16x16 1024,
//            router 4x16 256, up 4x8x16 2048, down 2048 = 5632) = 15360
//   LoRA: 2 layers x (A 4x16 256 + B 16x4 256) = 1024; gradients the same; AdamW m and v: 2048
//   inputs: ids, positions, labels 16 x i64 (128->256 each) + the f32 loss (4->256) = 1024
// CHECK: memory_plan = {activation = [[ACT:[0-9]+]] : i64, gradient = 1024 : i64, input = 1024 : i64, lora_param = 1024 : i64, micro_batch = 2 : i64, optimizer_state = 2048 : i64, peak = [[PEAK:[0-9]+]] : i64, seq_len = 8 : i64, weight = 15360 : i64, workspace = [[WS:[0-9]+]] : i64}
// CHECK-SAME: recompute = "none"

// Fused: the [16, 32] logits and their gradient (2 x 2048 bytes) leave the activations; the
// scratch is one chunk of logits (every token: 16 x 32 f32, 2048) and a float per token (64).
// FUSED: memory_plan = {activation = {{[0-9]+}} : i64, gradient = 1024 : i64, input = 1024 : i64, lora_param = 1024 : i64, micro_batch = 2 : i64, optimizer_state = 2048 : i64, peak = {{[0-9]+}} : i64, scratch = 2112 : i64, seq_len = 8 : i64, weight = 15360 : i64, workspace = {{[0-9]+}} : i64}

// Peaks seen: 46080 saving everything; 42752 with both layers gathering their experts' token
// copies (16 tokens x top-2 rows of 16 f32) and running their norm again in the backward
// instead of saving them; 40704 recomputing layer 0 and regathering layer 1; 37632 recomputing
// both.
// Under a 45000-byte cap regathering is enough: no layer recomputes.
// CAP: peak = 42752 : i64
// CAP-SAME: recompute = "regather", regather_layers = array<i64: 0, 1>
// CAP-NOT: moe.layer @block_fwd(
// CAP: moe.layer @block_fwd_regather(
// CAP: moe.layer @block_bwd_regather(
// CAP: moe.rms_norm {{.*}}recomputed
// CAP: moe.dispatch {{.*}}recomputed
// CAP: moe.apply_layer @block_fwd_regather[0]
// CAP: moe.apply_layer @block_fwd_regather[1]
// CAP: moe.apply_layer @block_bwd_regather[1]
// CAP: moe.apply_layer @block_bwd_regather[0]
// Under 42000 bytes the first layer also recomputes (first layers first: their saved values
// live longest).
// CAP2: peak = 40704 : i64
// CAP2-SAME: recompute = "mixed", recompute_layers = array<i64: 0>, regather_layers = array<i64: 1>
// CAP2: moe.apply_layer @block_fwd_recompute[0]
// CAP2: moe.apply_layer @block_fwd_regather[1]
// CAP2: moe.apply_layer @block_bwd_regather[1]
// CAP2: moe.apply_layer @block_bwd_recompute[0]

// A layer without experts has nothing to gather again: over the cap (41216 bytes saving
// everything) it recomputes (37120).
// DENSE: peak = 37120 : i64
// DENSE-SAME: recompute = "per-layer", recompute_layers = array<i64: 0>
// DENSE-NOT: regather
// DENSE: moe.apply_layer @mlp_fwd_recompute[0]

// TOOSMALL: error: moe-plan-memory: the step needs 0.00 GiB with every layer recomputed, above the cap of 0.00 GiB: 0.00 GiB missing
// BADCAP: error: moe-plan-memory: memory-cap 'lots' is not a size (expected bytes or a number with KB/MB/GB/TB or KiB/MiB/GiB/TiB, e.g. 80GiB)
// NOSTEP: error: no func.func @train_step; run --moe-build-training-step first
