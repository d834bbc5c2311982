//===- summary_qwen3_30b.mlir - moec import --summary on Qwen3-30B-A3B ----===//

// Tests that the summary of Qwen3-30B-A3B gives its published size: 30.5B
// parameters, 3.3B active (8 of 128 experts).
// RUN: moec import %root/models/qwen3-30b-a3b/config.json --summary | FileCheck %s
// RUN: moec import %root/models/qwen3-30b-a3b/config.json --emit=summary | FileCheck %s
// CHECK-LABEL: model: Qwen3MoeForCausalLM (model_type qwen3_moe), 48 layers, hidden 2048, vocab 151936
// CHECK-NEXT: layer type count token mixer channel mixer params/layer active/layer
// CHECK-NEXT: gqa_moe 48 gqa moe 623,120,640 56,889,600
// CHECK-NEXT: embedding/norm/head 622,331,904
// CHECK-NEXT: total parameters: 30,532,122,624 (30.53B)
// CHECK-NEXT: active per token: 3,353,032,704 (3.35B)
// CHECK-NEXT: bytes in bf16: 61,064,245,248 (61.06 GB)
// CHECK-NOT: {{.}}
