//===- summary_seed_case.mlir - moec import --summary on the seed case ----===//

// Tests that the seed case (models/seed-case-2.8t) counts the 2.76T parameters
// and 88.1B active per token that models/README.md states, by layer type.
// RUN: moec import %root/models/seed-case-2.8t/config.json --summary | FileCheck %s
// CHECK-LABEL: model: KimiLinearForCausalLM (model_type kimi_linear), 93 layers, hidden 7168, vocab 163840
// CHECK-NEXT: layer type count token mixer channel mixer params/layer active/layer
// CHECK-NEXT: kda_dense 1 kda dense 635,754,688 635,754,688
// CHECK-NEXT: kda_moe 68 kda moe 30,024,326,208 957,799,488
// CHECK-NEXT: dsa_moe 24 dsa moe 29,900,031,104 833,504,384
// CHECK-NEXT: embedding/norm/head 2,348,817,408
// CHECK-NEXT: total parameters: 2,762,239,500,736 (2.76T)
// CHECK-NEXT: active per token: 88,119,042,496 (88.12B)
// CHECK-NEXT: bytes in bf16: 5,524,479,001,472 (5524.48 GB)
