// RUN: moe-opt %s -split-input-file --pass-pipeline='builtin.module(moe.model(moe-fuse))' | FileCheck %s
// RUN: moe-opt %s -split-input-file --pass-pipeline='builtin.module(moe.model(moe-fuse{chunk-tokens=256}))' | FileCheck %s --check-prefix=CHUNK
// RUN: moe-opt %inputs/head.mlir --pass-pipeline='builtin.module(moe.model(moe-build-training-step,moe-fuse))' | FileCheck %s --check-prefix=STEP
// RUN: moe-opt %inputs/trainable_head.mlir --pass-pipeline='builtin.module(moe.model(moe-build-training-step,moe-fuse))' | FileCheck %s --check-prefix=TRAINABLE
// RUN: moe-opt %inputs/head.mlir --moe-lora-training='seq-len=8' | FileCheck %s --check-prefix=PIPELINE
// RUN: moe-opt %inputs/head.mlir --moe-lora-training='seq-len=8 fuse=false' | FileCheck %s --check-prefix=UNFUSED
// RUN: not moe-opt %inputs/head.mlir --pass-pipeline='builtin.module(moe.model(moe-fuse{chunk-tokens=0}))' 2>&1 | FileCheck %s --check-prefix=CHUNKERR

// Tests that an LM head whose only user is the loss becomes one fused op with the loss's
// attributes, the default chunk and the logits' element type.
// CHECK-LABEL: func.func @fused(
// CHECK-SAME: %[[H:.*]]: tensor<?x16xf32>, %[[W:.*]]: tensor<32x16xf32>, %[[LABELS:.*]]: tensor<?xi64>)
// CHECK: %[[LOSS:.*]], %{{.*}} = moe.lm_head_cross_entropy %[[H]], %[[W]], %[[LABELS]] {ignore_index = -1 : i64, logits_type = f32, shift_labels} : (tensor<?x16xf32>, tensor<32x16xf32>, tensor<?xi64>) -> (tensor<f32>, tensor<?xf32>)
// CHECK-NOT: moe.linear
// CHECK-NOT: moe.cross_entropy
// CHECK: return %[[LOSS]] : tensor<f32>
// CHUNK-LABEL: func.func @fused(
// CHUNK: moe.lm_head_cross_entropy {{.*}} {chunk_tokens = 256 : i64, ignore_index = -1 : i64, logits_type = f32, shift_labels}
moe.model @fused_head {
  func.func @fused(%h: tensor<?x16xf32>, %w: tensor<32x16xf32>, %labels: tensor<?xi64>) -> tensor<f32> {
    %logits = moe.linear %h, %w : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
    %loss = moe.cross_entropy %logits, %labels {ignore_index = -1 : i64, shift_labels} : (tensor<?x32xf32>, tensor<?xi64>) -> tensor<f32>
    return %loss : tensor<f32>
  }
}

// -----

// Tests that logits another op reads (here: returned) stay whole: the head and loss are not fused.
// CHECK-LABEL: func.func @logits_returned(
// CHECK: %[[LOGITS:.*]] = moe.linear
// CHECK: moe.cross_entropy %[[LOGITS]]
// CHECK-NOT: moe.lm_head_cross_entropy
// CHUNK-LABEL: func.func @logits_returned(
// CHUNK-NOT: moe.lm_head_cross_entropy
moe.model @returned {
  func.func @logits_returned(%h: tensor<?x16xf32>, %w: tensor<32x16xf32>, %labels: tensor<?xi64>) -> (tensor<f32>, tensor<?x32xf32>) {
    %logits = moe.linear %h, %w : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
    %loss = moe.cross_entropy %logits, %labels : (tensor<?x32xf32>, tensor<?xi64>) -> tensor<f32>
    return %loss, %logits : tensor<f32>, tensor<?x32xf32>
  }
}

// -----

// Tests that two losses of the same logits are not fused (each would need the logits).
// CHECK-LABEL: func.func @two_losses(
// CHECK: moe.linear
// CHECK-COUNT-2: moe.cross_entropy
// CHECK-NOT: moe.lm_head_cross_entropy
moe.model @two {
  func.func @two_losses(%h: tensor<?x16xf32>, %w: tensor<32x16xf32>, %labels: tensor<?xi64>) -> (tensor<f32>, tensor<f32>) {
    %logits = moe.linear %h, %w : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
    %a = moe.cross_entropy %logits, %labels : (tensor<?x32xf32>, tensor<?xi64>) -> tensor<f32>
    %b = moe.cross_entropy %logits, %labels {shift_labels} : (tensor<?x32xf32>, tensor<?xi64>) -> tensor<f32>
    return %a, %b : tensor<f32>, tensor<f32>
  }
}

// -----

// Tests that a head with a bias is not fused (the fused op has none).
// CHECK-LABEL: func.func @bias(
// CHECK: moe.linear %{{.*}}, %{{.*}} bias
// CHECK: moe.cross_entropy
// CHECK-NOT: moe.lm_head_cross_entropy
moe.model @biased {
  func.func @bias(%h: tensor<?x16xf32>, %w: tensor<32x16xf32>, %b: tensor<32xf32>, %labels: tensor<?xi64>) -> tensor<f32> {
    %logits = moe.linear %h, %w bias %b : (tensor<?x16xf32>, tensor<32x16xf32>, tensor<32xf32>) -> tensor<?x32xf32>
    %loss = moe.cross_entropy %logits, %labels : (tensor<?x32xf32>, tensor<?xi64>) -> tensor<f32>
    return %loss : tensor<f32>
  }
}

// -----

// Tests that logits the loss reads from anything but a moe.linear (a LoRA sum) are not fused.
// CHECK-LABEL: func.func @adapted_head(
// CHECK: moe.add
// CHECK: moe.cross_entropy
// CHECK-NOT: moe.lm_head_cross_entropy
moe.model @adapted {
  func.func @adapted_head(%h: tensor<?x16xf32>, %w: tensor<32x16xf32>, %d: tensor<?x32xf32>, %labels: tensor<?xi64>) -> tensor<f32> {
    %logits = moe.linear %h, %w : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
    %sum = moe.add %logits, %d : tensor<?x32xf32>
    %loss = moe.cross_entropy %sum, %labels : (tensor<?x32xf32>, tensor<?xi64>) -> tensor<f32>
    return %loss : tensor<f32>
  }
}

// -----

// Tests that a backward whose logits gradient is read by more than the head's backward is
// left alone: the fused backward never makes that gradient.
// CHECK-LABEL: func.func @gradient_read_twice(
// CHECK: moe.linear
// CHECK: moe.cross_entropy
// CHECK: moe.backward "moe.cross_entropy"
// CHECK: moe.backward "moe.linear"
// CHECK-NOT: moe.lm_head_cross_entropy
moe.model @twice {
  func.func @gradient_read_twice(%h: tensor<?x16xf32>, %w: tensor<32x16xf32>, %labels: tensor<?xi64>) -> (tensor<f32>, tensor<?x16xf32>, tensor<?x32xf32>) {
    %logits = moe.linear %h, %w : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
    %loss = moe.cross_entropy %logits, %labels {shift_labels} : (tensor<?x32xf32>, tensor<?xi64>) -> tensor<f32>
    %seed = moe.fill 1.0 : tensor<f32>
    %dlogits = moe.backward "moe.cross_entropy"(%logits, %labels) grads(%seed) {forward_attrs = {ignore_index = -100 : i64, shift_labels}, grad_of_inputs = array<i64: 0>, grad_of_outputs = array<i64: 0>} : (tensor<?x32xf32>, tensor<?xi64>, tensor<f32>) -> tensor<?x32xf32>
    %dh = moe.backward "moe.linear"(%h, %w) grads(%dlogits) {forward_attrs = {}, grad_of_inputs = array<i64: 0>, grad_of_outputs = array<i64: 0>} : (tensor<?x16xf32>, tensor<32x16xf32>, tensor<?x32xf32>) -> tensor<?x16xf32>
    return %loss, %dh, %dlogits : tensor<f32>, tensor<?x16xf32>, tensor<?x32xf32>
  }
}

// In the training step: the loss, its backward and the head's backward become the fused op and
// its backward (built by the op's differentiation rule), which gives the hidden states'
// gradient only: the head is frozen, so the forward forms that gradient (input_grad) and the
// backward reads it. @forward's head has no loss and stays.
// STEP-LABEL: func.func @forward(
// STEP: moe.linear
// STEP-LABEL: func.func @train_step(
// STEP-SAME: %[[IDS:[a-z0-9]+]]: tensor<?xi64>, %{{.*}}: tensor<?xi64>, %[[LABELS:[a-z0-9]+]]: tensor<?xi64>)
// STEP: %[[N:.*]] = moe.rms_norm
// STEP: %[[W:.*]] = moe.weight @head
// STEP-NOT: moe.linear
// STEP: %[[LOSS:.*]], %[[LSE:.*]], %[[DX:.*]] = moe.lm_head_cross_entropy %[[N]], %[[W]], %[[LABELS]] {logits_type = f32, shift_labels} : (tensor<?x16xf32>, tensor<32x16xf32>, tensor<?xi64>) -> (tensor<f32>, tensor<?xf32>, tensor<?x16xf32>)
// STEP: %[[SEED:.*]] = moe.fill 1.000000e+00 : tensor<f32>
// STEP: %[[DN:.*]] = moe.backward "moe.lm_head_cross_entropy"(%[[N]], %[[W]], %[[LABELS]]) outputs(%[[LOSS]], %[[LSE]], %[[DX]]) grads(%[[SEED]])
// STEP-SAME: {forward_attrs = {chunk_tokens = 1024 : i64, ignore_index = -100 : i64, logits_type = f32, shift_labels}, grad_of_inputs = array<i64: 0>, grad_of_outputs = array<i64: 0>}
// STEP-SAME: -> tensor<?x16xf32>
// STEP: moe.backward "moe.rms_norm"(%{{.*}}, %{{.*}}) grads(%[[DN]])
// STEP-NOT: moe.cross_entropy
// STEP-NOT: "moe.linear"
// STEP-NOT: moe.param_grad @head
// STEP: return %[[LOSS]] : tensor<f32>

// A trainable head: the fused backward also gives the weight's gradient, which goes where the
// head's backward sent it.
// TRAINABLE-LABEL: func.func @train_step(
// TRAINABLE: %[[W:.*]] = moe.weight @head : tensor<32x16xbf16>
// TRAINABLE: %[[LOSS:.*]], %[[LSE:.*]] = moe.lm_head_cross_entropy %{{.*}}, %[[W]], %{{.*}} {logits_type = bf16, shift_labels} : (tensor<?x16xbf16>, tensor<32x16xbf16>, tensor<?xi64>) -> (tensor<f32>, tensor<?xf32>)
// TRAINABLE: %[[G:.*]]:2 = moe.backward "moe.lm_head_cross_entropy"({{.*}}) outputs(%[[LOSS]], %[[LSE]]) grads({{.*}}) {{{.*}}grad_of_inputs = array<i64: 0, 1>
// TRAINABLE-SAME: -> (tensor<?x16xbf16>, tensor<32x16xbf16>)
// TRAINABLE: moe.param_grad @head, %[[G]]#1 : tensor<32x16xbf16>
// TRAINABLE-NOT: moe.cross_entropy

// The named pipeline fuses by default (between the training step and memory planning, whose
// plan then counts the fused kernel's scratch); fuse=false keeps the logits.
// PIPELINE: memory_plan = {{{.*}}scratch = {{[0-9]+}} : i64
// PIPELINE: moe.lm_head_cross_entropy
// PIPELINE-NOT: moe.cross_entropy
// UNFUSED-NOT: scratch =
// UNFUSED: moe.cross_entropy
// UNFUSED-NOT: lm_head_cross_entropy

// CHUNKERR: error: moe-fuse: chunk-tokens must be positive, got 0
