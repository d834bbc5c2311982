// RUN: moe-opt %s -split-input-file | moe-opt -split-input-file | FileCheck %s
// RUN: moe-opt %s -split-input-file --mlir-print-op-generic | moe-opt -split-input-file | FileCheck %s

// Tests that an embedding lookup round-trips with a dynamic token dimension.
// CHECK-LABEL: func.func @embedding(
// CHECK-SAME: %[[IDS:.*]]: tensor<?xi64>, %[[TABLE:.*]]: tensor<151936x2048xbf16>)
// CHECK: %[[E:.*]] = moe.embedding %[[IDS]], %[[TABLE]] : (tensor<?xi64>, tensor<151936x2048xbf16>) -> tensor<?x2048xbf16>
// CHECK: return %[[E]]
func.func @embedding(%ids: tensor<?xi64>, %table: tensor<151936x2048xbf16>) -> tensor<?x2048xbf16> {
  %e = moe.embedding %ids, %table : (tensor<?xi64>, tensor<151936x2048xbf16>) -> tensor<?x2048xbf16>
  return %e : tensor<?x2048xbf16>
}

// -----

// Tests that an RMSNorm over the whole feature dimension keeps its eps.
// CHECK-LABEL: func.func @rms_norm(
// CHECK-SAME: %[[X:.*]]: tensor<?x2048xbf16>, %[[W:.*]]: tensor<2048xbf16>)
// CHECK: moe.rms_norm %[[X]], %[[W]] {eps = 9.9999999999999995E-7 : f64} : (tensor<?x2048xbf16>, tensor<2048xbf16>) -> tensor<?x2048xbf16>
// CHECK-NOT: unit_offset
func.func @rms_norm(%x: tensor<?x2048xbf16>, %w: tensor<2048xbf16>) -> tensor<?x2048xbf16> {
  %y = moe.rms_norm %x, %w {eps = 1.0e-06 : f64} : (tensor<?x2048xbf16>, tensor<2048xbf16>) -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}

// -----

// Tests that the (1 + w) form of RMSNorm (Qwen3-Next's zero-centred weights) keeps unit_offset.
// CHECK-LABEL: func.func @rms_norm_unit_offset(
// CHECK-SAME: %[[X:.*]]: tensor<?x2048xbf16>, %[[W:.*]]: tensor<2048xbf16>)
// CHECK: moe.rms_norm %[[X]], %[[W]] {eps = 9.9999999999999995E-7 : f64, unit_offset} : (tensor<?x2048xbf16>, tensor<2048xbf16>) -> tensor<?x2048xbf16>
func.func @rms_norm_unit_offset(%x: tensor<?x2048xbf16>, %w: tensor<2048xbf16>) -> tensor<?x2048xbf16> {
  %y = moe.rms_norm %x, %w {eps = 1.0e-06 : f64, unit_offset} : (tensor<?x2048xbf16>, tensor<2048xbf16>) -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}

// -----

// Tests that a per-head q norm (32 heads of 128, one weight per head feature) round-trips.
// CHECK-LABEL: func.func @rms_norm_per_head(
// CHECK-SAME: %[[Q:.*]]: tensor<?x4096xbf16>, %[[W:.*]]: tensor<128xbf16>)
// CHECK: moe.rms_norm %[[Q]], %[[W]] {eps = 9.9999999999999995E-7 : f64} : (tensor<?x4096xbf16>, tensor<128xbf16>) -> tensor<?x4096xbf16>
func.func @rms_norm_per_head(%q: tensor<?x4096xbf16>, %w: tensor<128xbf16>) -> tensor<?x4096xbf16> {
  %y = moe.rms_norm %q, %w {eps = 1.0e-06 : f64} : (tensor<?x4096xbf16>, tensor<128xbf16>) -> tensor<?x4096xbf16>
  return %y : tensor<?x4096xbf16>
}

// -----

// Tests that a LayerNorm with weight and bias (DeepSeek-V3.2's indexer key norm) round-trips.
// CHECK-LABEL: func.func @layer_norm(
// CHECK-SAME: %[[X:.*]]: tensor<?x128xbf16>, %[[W:.*]]: tensor<128xbf16>, %[[B:.*]]: tensor<128xbf16>)
// CHECK: moe.layer_norm %[[X]], %[[W]], %[[B]] {eps = 9.9999999999999995E-7 : f64} : (tensor<?x128xbf16>, tensor<128xbf16>, tensor<128xbf16>) -> tensor<?x128xbf16>
func.func @layer_norm(%x: tensor<?x128xbf16>, %w: tensor<128xbf16>, %b: tensor<128xbf16>) -> tensor<?x128xbf16> {
  %y = moe.layer_norm %x, %w, %b {eps = 1.0e-06 : f64} : (tensor<?x128xbf16>, tensor<128xbf16>, tensor<128xbf16>) -> tensor<?x128xbf16>
  return %y : tensor<?x128xbf16>
}

// -----

// Tests that a projection without bias prints no bias keyword.
// CHECK-LABEL: func.func @linear(
// CHECK-SAME: %[[X:.*]]: tensor<?x2048xbf16>, %[[W:.*]]: tensor<4096x2048xbf16>)
// CHECK: moe.linear %[[X]], %[[W]] : (tensor<?x2048xbf16>, tensor<4096x2048xbf16>) -> tensor<?x4096xbf16>
// CHECK-NOT: bias
func.func @linear(%x: tensor<?x2048xbf16>, %w: tensor<4096x2048xbf16>) -> tensor<?x4096xbf16> {
  %y = moe.linear %x, %w : (tensor<?x2048xbf16>, tensor<4096x2048xbf16>) -> tensor<?x4096xbf16>
  return %y : tensor<?x4096xbf16>
}

// -----

// Tests that a projection with bias (gpt-oss q_proj) keeps its bias operand.
// CHECK-LABEL: func.func @linear_bias(
// CHECK-SAME: %[[X:.*]]: tensor<?x2880xbf16>, %[[W:.*]]: tensor<4096x2880xbf16>, %[[B:.*]]: tensor<4096xbf16>)
// CHECK: moe.linear %[[X]], %[[W]] bias %[[B]] : (tensor<?x2880xbf16>, tensor<4096x2880xbf16>, tensor<4096xbf16>) -> tensor<?x4096xbf16>
func.func @linear_bias(%x: tensor<?x2880xbf16>, %w: tensor<4096x2880xbf16>, %b: tensor<4096xbf16>) -> tensor<?x4096xbf16> {
  %y = moe.linear %x, %w bias %b : (tensor<?x2880xbf16>, tensor<4096x2880xbf16>, tensor<4096xbf16>) -> tensor<?x4096xbf16>
  return %y : tensor<?x4096xbf16>
}

// -----

// Tests that a dense SwiGLU MLP with a residual (linear, glu, add) round-trips.
// CHECK-LABEL: func.func @swiglu_mlp(
// CHECK-SAME: %[[X:.*]]: tensor<?x2048xbf16>, %[[WG:.*]]: tensor<6144x2048xbf16>, %[[WU:.*]]: tensor<6144x2048xbf16>, %[[WD:.*]]: tensor<2048x6144xbf16>)
// CHECK: %[[G:.*]] = moe.linear %[[X]], %[[WG]] : (tensor<?x2048xbf16>, tensor<6144x2048xbf16>) -> tensor<?x6144xbf16>
// CHECK: %[[U:.*]] = moe.linear %[[X]], %[[WU]] : (tensor<?x2048xbf16>, tensor<6144x2048xbf16>) -> tensor<?x6144xbf16>
// CHECK: %[[H:.*]] = moe.glu silu %[[G]], %[[U]] : tensor<?x6144xbf16>
// CHECK: %[[D:.*]] = moe.linear %[[H]], %[[WD]] : (tensor<?x6144xbf16>, tensor<2048x6144xbf16>) -> tensor<?x2048xbf16>
// CHECK: %[[R:.*]] = moe.add %[[X]], %[[D]] : tensor<?x2048xbf16>
// CHECK: return %[[R]]
func.func @swiglu_mlp(%x: tensor<?x2048xbf16>, %wg: tensor<6144x2048xbf16>, %wu: tensor<6144x2048xbf16>, %wd: tensor<2048x6144xbf16>) -> tensor<?x2048xbf16> {
  %g = moe.linear %x, %wg : (tensor<?x2048xbf16>, tensor<6144x2048xbf16>) -> tensor<?x6144xbf16>
  %u = moe.linear %x, %wu : (tensor<?x2048xbf16>, tensor<6144x2048xbf16>) -> tensor<?x6144xbf16>
  %h = moe.glu silu %g, %u : tensor<?x6144xbf16>
  %d = moe.linear %h, %wd : (tensor<?x6144xbf16>, tensor<2048x6144xbf16>) -> tensor<?x2048xbf16>
  %r = moe.add %x, %d : tensor<?x2048xbf16>
  return %r : tensor<?x2048xbf16>
}

// -----

// Tests that every elementwise activation kind keeps its keyword.
// CHECK-LABEL: func.func @activations(
// CHECK-SAME: %[[X:.*]]: tensor<?x1856xbf16>)
// CHECK: %[[A:.*]] = moe.activation relu2 %[[X]] : tensor<?x1856xbf16>
// CHECK: %[[B:.*]] = moe.activation gelu_tanh %[[A]] : tensor<?x1856xbf16>
// CHECK: %[[C:.*]] = moe.activation silu %[[B]] : tensor<?x1856xbf16>
// CHECK: %[[D:.*]] = moe.activation sigmoid %[[C]] : tensor<?x1856xbf16>
// CHECK: return %[[D]]
func.func @activations(%x: tensor<?x1856xbf16>) -> tensor<?x1856xbf16> {
  %a = moe.activation relu2 %x : tensor<?x1856xbf16>
  %b = moe.activation gelu_tanh %a : tensor<?x1856xbf16>
  %c = moe.activation silu %b : tensor<?x1856xbf16>
  %d = moe.activation sigmoid %c : tensor<?x1856xbf16>
  return %d : tensor<?x1856xbf16>
}

// -----

// Tests that a sigmoid gate takes a per-feature gate (attention output) or one gate per token (shared expert).
// CHECK-LABEL: func.func @sigmoid_gate(
// CHECK-SAME: %[[O:.*]]: tensor<?x4096xbf16>, %[[G:.*]]: tensor<?x4096xbf16>, %[[S:.*]]: tensor<?x2048xbf16>, %[[SG:.*]]: tensor<?x1xbf16>)
// CHECK: moe.sigmoid_gate %[[O]], %[[G]] : (tensor<?x4096xbf16>, tensor<?x4096xbf16>) -> tensor<?x4096xbf16>
// CHECK: moe.sigmoid_gate %[[S]], %[[SG]] : (tensor<?x2048xbf16>, tensor<?x1xbf16>) -> tensor<?x2048xbf16>
func.func @sigmoid_gate(%o: tensor<?x4096xbf16>, %g: tensor<?x4096xbf16>, %s: tensor<?x2048xbf16>, %sg: tensor<?x1xbf16>) -> (tensor<?x4096xbf16>, tensor<?x2048xbf16>) {
  %a = moe.sigmoid_gate %o, %g : (tensor<?x4096xbf16>, tensor<?x4096xbf16>) -> tensor<?x4096xbf16>
  %b = moe.sigmoid_gate %s, %sg : (tensor<?x2048xbf16>, tensor<?x1xbf16>) -> tensor<?x2048xbf16>
  return %a, %b : tensor<?x4096xbf16>, tensor<?x2048xbf16>
}

// -----

// Tests that a fused projection (kv_a_proj_with_mqa) splits into latent and rope key; groups defaults to 1.
// CHECK-LABEL: func.func @split(
// CHECK-SAME: %[[KVA:.*]]: tensor<?x576xbf16>)
// CHECK: %[[PARTS:.*]]:2 = moe.split %[[KVA]] {sizes = array<i64: 512, 64>} : (tensor<?x576xbf16>) -> (tensor<?x512xbf16>, tensor<?x64xbf16>)
// CHECK: return %[[PARTS]]#0, %[[PARTS]]#1
func.func @split(%kva: tensor<?x576xbf16>) -> (tensor<?x512xbf16>, tensor<?x64xbf16>) {
  %ckv, %kpe = moe.split %kva {sizes = array<i64: 512, 64>} : (tensor<?x576xbf16>) -> (tensor<?x512xbf16>, tensor<?x64xbf16>)
  return %ckv, %kpe : tensor<?x512xbf16>, tensor<?x64xbf16>
}

// -----

// Tests that a per-head split (Qwen3-Next q_proj into query and gate, 16 heads of 256) keeps groups.
// CHECK-LABEL: func.func @split_per_head(
// CHECK-SAME: %[[QG:.*]]: tensor<?x8192xbf16>)
// CHECK: %[[PARTS:.*]]:2 = moe.split %[[QG]] {groups = 16 : i64, sizes = array<i64: 256, 256>} : (tensor<?x8192xbf16>) -> (tensor<?x4096xbf16>, tensor<?x4096xbf16>)
func.func @split_per_head(%qg: tensor<?x8192xbf16>) -> (tensor<?x4096xbf16>, tensor<?x4096xbf16>) {
  %q, %g = moe.split %qg {sizes = array<i64: 256, 256>, groups = 16 : i64} : (tensor<?x8192xbf16>) -> (tensor<?x4096xbf16>, tensor<?x4096xbf16>)
  return %q, %g : tensor<?x4096xbf16>, tensor<?x4096xbf16>
}

// -----

// Tests that a LoRA update round-trips with its scale and dropout.
// CHECK-LABEL: func.func @lora
// CHECK: moe.lora %{{.*}}, %{{.*}}, %{{.*}} {dropout = 5.000000e-02 : f64, scale = 2.000000e+00 : f64} : (tensor<?x64xf32>, tensor<4x64xf32>, tensor<32x4xf32>) -> tensor<?x32xf32>
func.func @lora(%x: tensor<?x64xf32>, %a: tensor<4x64xf32>, %b: tensor<32x4xf32>) -> tensor<?x32xf32> {
  %d = moe.lora %x, %a, %b {scale = 2.0 : f64, dropout = 0.05 : f64} : (tensor<?x64xf32>, tensor<4x64xf32>, tensor<32x4xf32>) -> tensor<?x32xf32>
  return %d : tensor<?x32xf32>
}

// -----

// Tests that a projection with its adapter round-trips with its base type.
// CHECK-LABEL: func.func @lora_linear
// CHECK: moe.lora_linear %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {base_type = bf16, scale = 2.000000e+00 : f64} : (tensor<?x64xbf16>, tensor<32x64xbf16>, tensor<4x64xf32>, tensor<32x4xf32>) -> tensor<?x32xbf16>
func.func @lora_linear(%x: tensor<?x64xbf16>, %w: tensor<32x64xbf16>, %a: tensor<4x64xf32>, %b: tensor<32x4xf32>) -> tensor<?x32xbf16> {
  %y = moe.lora_linear %x, %w, %a, %b {scale = 2.0 : f64, base_type = bf16} : (tensor<?x64xbf16>, tensor<32x64xbf16>, tensor<4x64xf32>, tensor<32x4xf32>) -> tensor<?x32xbf16>
  return %y : tensor<?x32xbf16>
}

// -----

// Tests that f32 adapters on bf16 activations (the importer's bf16 models) round-trip.
// CHECK-LABEL: func.func @lora_f32_on_bf16
// CHECK: moe.lora %{{.*}}, %{{.*}}, %{{.*}} {scale = 2.000000e+00 : f64} : (tensor<?x64xbf16>, tensor<4x64xf32>, tensor<32x4xf32>) -> tensor<?x32xbf16>
func.func @lora_f32_on_bf16(%x: tensor<?x64xbf16>, %a: tensor<4x64xf32>, %b: tensor<32x4xf32>) -> tensor<?x32xbf16> {
  %d = moe.lora %x, %a, %b {scale = 2.0 : f64} : (tensor<?x64xbf16>, tensor<4x64xf32>, tensor<32x4xf32>) -> tensor<?x32xbf16>
  return %d : tensor<?x32xbf16>
}

// -----

// Tests an f32 LoRA update added to a bf16 projection: the rhs type is printed when it differs.
// CHECK-LABEL: func.func @lora_update(
// CHECK: %[[D:.*]] = moe.lora %{{.*}}, %{{.*}}, %{{.*}} {scale = 2.000000e+00 : f64} : (tensor<?x64xbf16>, tensor<4x64xf32>, tensor<32x4xf32>) -> tensor<?x32xf32>
// CHECK: moe.add %{{.*}}, %[[D]] : tensor<?x32xbf16>, tensor<?x32xf32>
func.func @lora_update(%x: tensor<?x64xbf16>, %y: tensor<?x32xbf16>, %a: tensor<4x64xf32>, %b: tensor<32x4xf32>) -> tensor<?x32xbf16> {
  %d = moe.lora %x, %a, %b {scale = 2.0 : f64} : (tensor<?x64xbf16>, tensor<4x64xf32>, tensor<32x4xf32>) -> tensor<?x32xf32>
  %r = moe.add %y, %d : tensor<?x32xbf16>, tensor<?x32xf32>
  return %r : tensor<?x32xbf16>
}

// -----

// Tests that a sharded RMSNorm (a tp rank's 1024 of 2048 features, the whole rows' sum of
// squares summed over tp) round-trips with its whole rows' feature count.
// CHECK-LABEL: func.func @sharded_rms_norm(
// CHECK: %[[S:.*]] = moe.row_sum_of_squares %{{.*}} : (tensor<?x1024xbf16>) -> tensor<?x1xf32>
// CHECK: %[[ALLROWS:.*]] = moe.tp_sum %[[S]] {axis = "tp"} : tensor<?x1xf32>
// CHECK: moe.sharded_rms_norm %{{.*}}, %{{.*}}, %[[ALLROWS]] {eps = 1.000000e-05 : f64, features = 2048 : i64} : (tensor<?x1024xbf16>, tensor<1024xbf16>, tensor<?x1xf32>) -> tensor<?x1024xbf16>
func.func @sharded_rms_norm(%x: tensor<?x1024xbf16>, %w: tensor<1024xbf16>) -> tensor<?x1024xbf16> {
  %s = moe.row_sum_of_squares %x : (tensor<?x1024xbf16>) -> tensor<?x1xf32>
  %all = moe.tp_sum %s {axis = "tp"} : tensor<?x1xf32>
  %y = moe.sharded_rms_norm %x, %w, %all {eps = 1.0e-05 : f64, features = 2048 : i64} : (tensor<?x1024xbf16>, tensor<1024xbf16>, tensor<?x1xf32>) -> tensor<?x1024xbf16>
  return %y : tensor<?x1024xbf16>
}

// -----

// Tests that a tp rank's columns of each piece, and their placement back, round-trip.
// CHECK-LABEL: func.func @tp_features(
// CHECK: %[[MINE:.*]] = moe.tp_slice_features %{{.*}} {axis = "tp", pieces = array<i64: 32, 32, 16, 16, 4>, ranks = 2 : i64} : (tensor<?x100xf32>) -> tensor<?x50xf32>
// CHECK: moe.tp_place_features %[[MINE]] {axis = "tp", pieces = array<i64: 32, 32, 16, 16, 4>, ranks = 2 : i64} : (tensor<?x50xf32>) -> tensor<?x100xf32>
func.func @tp_features(%x: tensor<?x100xf32>) -> tensor<?x100xf32> {
  %mine = moe.tp_slice_features %x {axis = "tp", pieces = array<i64: 32, 32, 16, 16, 4>, ranks = 2 : i64} : (tensor<?x100xf32>) -> tensor<?x50xf32>
  %back = moe.tp_place_features %mine {axis = "tp", pieces = array<i64: 32, 32, 16, 16, 4>, ranks = 2 : i64} : (tensor<?x50xf32>) -> tensor<?x100xf32>
  return %back : tensor<?x100xf32>
}
