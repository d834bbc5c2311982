//===- compile_errors.mlir - moec compile on bad input --------------------===//
//
// RUN: not moec compile %t.missing.json 2>&1 | FileCheck %s --check-prefix=MISSING
// RUN: not moec compile %inputs/golden_qwen3_moe.json --lora-targets q_prj 2>&1 | FileCheck %s --check-prefix=TARGET
// RUN: not moec compile %inputs/golden_qwen3_moe.json --seq-len 96 --memory-cap 100KiB 2>&1 | FileCheck %s --check-prefix=CAP
// RUN: not moec compile %inputs/golden_qwen3_moe.json --recompute sometimes 2>&1 | FileCheck %s --check-prefix=POLICY
// RUN: not moec compile %inputs/golden_qwen3_moe.json --emit=binary 2>&1 | FileCheck %s --check-prefix=EMIT
// RUN: not moec compile %s 2>&1 | FileCheck %s --check-prefix=NOMODEL
// RUN: not moec compile %s --dtype bfloat16 2>&1 | FileCheck %s --check-prefix=MLIR-DTYPE
// RUN: not moec frobnicate 2>&1 | FileCheck %s --check-prefix=COMMAND
// RUN: not moec compile %inputs/golden_qwen3_moe.json --seq-len 0 2>&1 | FileCheck %s --check-prefix=SEQ
//
//===----------------------------------------------------------------------===//

// MISSING: moec: error: {{.*}}missing.json: {{.*}}
// TARGET: error: moe-inject-lora: target(s) q_prj match no projection; the model's projections are: k_proj, o_proj, q_proj, v_proj
// TARGET: moec: error: compiling {{.*}}golden_qwen3_moe.json failed (see the diagnostics above)
// CAP: error: moe-plan-memory: the step needs {{[0-9.]+}} GiB with every layer recomputed, above the cap of 0.00 GiB
// POLICY: error: moe-build-training-step: recompute must be none, regather or per-layer, got 'sometimes'
// EMIT: Cannot find option named 'binary'!
// NOMODEL: moec: error: {{.*}}compile_errors.mlir: no moe.model in the module
// MLIR-DTYPE: moec: error: --dtype bfloat16 applies when importing a config.json; {{.*}}compile_errors.mlir keeps the element types it has
// COMMAND: moec: error: unknown command 'frobnicate'
// SEQ: error: sequence length and micro-batch must be positive, got 0 and 1
