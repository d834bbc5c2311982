//===- compile_models.mlir - every bundled model compiles to a valid plan -===//
//
// Each plan goes through the runtime's validator inside moec before it is written.
//
// RUN: for m in %root/models/*/config.json; do \
// RUN:   echo "== $m"; moec compile $m --seq-len 1024 -o %t.moeplan 2>&1 || echo "FAILED $m"; \
// RUN: done | FileCheck %s
//
//===----------------------------------------------------------------------===//

// CHECK: == {{.*}}deepseek-v3.2-exp/config.json
// CHECK-NEXT: moec: wrote
// CHECK: == {{.*}}deepseek-v3/config.json
// CHECK-NEXT: moec: wrote
// CHECK: == {{.*}}gpt-oss-120b/config.json
// CHECK-NEXT: moec: wrote
// CHECK: == {{.*}}kimi-k2-instruct/config.json
// CHECK-NEXT: moec: wrote
// CHECK: == {{.*}}kimi-linear-48b-a3b/config.json
// CHECK-NEXT: moec: wrote
// CHECK: == {{.*}}mixtral-8x7b/config.json
// CHECK-NEXT: moec: wrote
// CHECK: == {{.*}}nemotron-3-super-120b-a12b/config.json
// CHECK-NEXT: moec: wrote
// CHECK: == {{.*}}olmoe-1b-7b/config.json
// CHECK-NEXT: moec: wrote
// CHECK: == {{.*}}qwen3-235b-a22b/config.json
// CHECK-NEXT: moec: wrote
// CHECK: == {{.*}}qwen3-30b-a3b/config.json
// CHECK-NEXT: moec: wrote
// CHECK: == {{.*}}qwen3-next-80b-a3b/config.json
// CHECK-NEXT: moec: wrote
// CHECK: == {{.*}}seed-case-2.8t/config.json
// CHECK-NEXT: moec: wrote
// CHECK-NOT: FAILED
