// RUN: moe-opt %s -split-input-file | moe-opt -split-input-file | FileCheck %s
// RUN: moe-opt %s -split-input-file --mlir-print-op-generic | moe-opt -split-input-file | FileCheck %s

// Tests that a cross-entropy with default attributes prints neither ignore_index nor shift_labels.
// CHECK-LABEL: func.func @cross_entropy(
// CHECK-SAME: %[[LOGITS:.*]]: tensor<?x151936xf32>, %[[LABELS:.*]]: tensor<?xi64>)
// CHECK: %[[L:.*]] = moe.cross_entropy %[[LOGITS]], %[[LABELS]] : (tensor<?x151936xf32>, tensor<?xi64>) -> tensor<f32>
// CHECK-NOT: ignore_index
// CHECK-NOT: shift_labels
// CHECK: return %[[L]]
func.func @cross_entropy(%logits: tensor<?x151936xf32>, %labels: tensor<?xi64>) -> tensor<f32> {
  %l = moe.cross_entropy %logits, %labels : (tensor<?x151936xf32>, tensor<?xi64>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Tests that the causal-LM label shift and a custom ignore_index survive the round trip.
// CHECK-LABEL: func.func @cross_entropy_shift(
// CHECK-SAME: %[[LOGITS:.*]]: tensor<?x201088xbf16>, %[[LABELS:.*]]: tensor<?xi32>)
// CHECK: moe.cross_entropy %[[LOGITS]], %[[LABELS]] {ignore_index = -1 : i64, shift_labels} : (tensor<?x201088xbf16>, tensor<?xi32>) -> tensor<f32>
func.func @cross_entropy_shift(%logits: tensor<?x201088xbf16>, %labels: tensor<?xi32>) -> tensor<f32> {
  %l = moe.cross_entropy %logits, %labels {shift_labels, ignore_index = -1 : i64} : (tensor<?x201088xbf16>, tensor<?xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Tests that an ignore_index spelled equal to its default (-100) is dropped from the printed form.
// CHECK-LABEL: func.func @cross_entropy_default_ignore(
// CHECK: moe.cross_entropy %{{.*}}, %{{.*}} {shift_labels} : (tensor<?x32000xf32>, tensor<?xi64>) -> tensor<f32>
func.func @cross_entropy_default_ignore(%logits: tensor<?x32000xf32>, %labels: tensor<?xi64>) -> tensor<f32> {
  %l = moe.cross_entropy %logits, %labels {ignore_index = -100 : i64, shift_labels} : (tensor<?x32000xf32>, tensor<?xi64>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Tests that the LM head and loss chain (final norm, linear to the vocabulary, cross-entropy) round-trips.
// CHECK-LABEL: func.func @lm_head_loss(
// CHECK-SAME: %[[H:.*]]: tensor<?x2048xbf16>, %[[NW:.*]]: tensor<2048xbf16>, %[[HEAD:.*]]: tensor<151936x2048xbf16>, %[[LABELS:.*]]: tensor<?xi64>)
// CHECK: %[[N:.*]] = moe.rms_norm %[[H]], %[[NW]]
// CHECK: %[[LOGITS:.*]] = moe.linear %[[N]], %[[HEAD]] : (tensor<?x2048xbf16>, tensor<151936x2048xbf16>) -> tensor<?x151936xbf16>
// CHECK: %[[L:.*]] = moe.cross_entropy %[[LOGITS]], %[[LABELS]] {shift_labels} : (tensor<?x151936xbf16>, tensor<?xi64>) -> tensor<f32>
// CHECK: return %[[L]]
func.func @lm_head_loss(%h: tensor<?x2048xbf16>, %nw: tensor<2048xbf16>, %head: tensor<151936x2048xbf16>, %labels: tensor<?xi64>) -> tensor<f32> {
  %n = moe.rms_norm %h, %nw {eps = 1.0e-06 : f64} : (tensor<?x2048xbf16>, tensor<2048xbf16>) -> tensor<?x2048xbf16>
  %logits = moe.linear %n, %head : (tensor<?x2048xbf16>, tensor<151936x2048xbf16>) -> tensor<?x151936xbf16>
  %l = moe.cross_entropy %logits, %labels {shift_labels} : (tensor<?x151936xbf16>, tensor<?xi64>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Tests that the fused LM head and loss round-trips with its attributes, the default chunk dropped.
// CHECK-LABEL: func.func @lm_head_cross_entropy(
// CHECK-SAME: %[[H:.*]]: tensor<?x2048xbf16>, %[[HEAD:.*]]: tensor<151936x2048xbf16>, %[[LABELS:.*]]: tensor<?xi64>)
// CHECK: %[[L:.*]], %[[LSE:.*]] = moe.lm_head_cross_entropy %[[H]], %[[HEAD]], %[[LABELS]] {logits_type = bf16, shift_labels} : (tensor<?x2048xbf16>, tensor<151936x2048xbf16>, tensor<?xi64>) -> (tensor<f32>, tensor<?xf32>)
// CHECK-NOT: chunk_tokens
// CHECK: return %[[L]], %[[LSE]]
func.func @lm_head_cross_entropy(%h: tensor<?x2048xbf16>, %head: tensor<151936x2048xbf16>, %labels: tensor<?xi64>) -> (tensor<f32>, tensor<?xf32>) {
  %l, %lse = moe.lm_head_cross_entropy %h, %head, %labels {shift_labels, chunk_tokens = 1024 : i64, logits_type = bf16} : (tensor<?x2048xbf16>, tensor<151936x2048xbf16>, tensor<?xi64>) -> (tensor<f32>, tensor<?xf32>)
  return %l, %lse : tensor<f32>, tensor<?xf32>
}

// -----

// Tests that another chunk size, ignore_index and i32 labels on static shapes survive the round trip,
// and that f32 logits may leave logits_type out.
// CHECK-LABEL: func.func @lm_head_cross_entropy_attrs(
// CHECK: moe.lm_head_cross_entropy %{{.*}}, %{{.*}}, %{{.*}} {chunk_tokens = 256 : i64, ignore_index = -1 : i64} : (tensor<96x64xf32>, tensor<256x64xf32>, tensor<96xi32>) -> (tensor<f32>, tensor<96xf32>)
func.func @lm_head_cross_entropy_attrs(%h: tensor<96x64xf32>, %head: tensor<256x64xf32>, %labels: tensor<96xi32>) -> tensor<f32> {
  %l, %lse = moe.lm_head_cross_entropy %h, %head, %labels {ignore_index = -1 : i64, chunk_tokens = 256 : i64} : (tensor<96x64xf32>, tensor<256x64xf32>, tensor<96xi32>) -> (tensor<f32>, tensor<96xf32>)
  return %l : tensor<f32>
}
