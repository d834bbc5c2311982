// RUN: moe-opt %s -split-input-file --pass-pipeline='builtin.module(moe.model(moe-fuse-lora))' | FileCheck %s
// RUN: moe-opt %inputs/adapted.mlir --pass-pipeline='builtin.module(moe.model(moe-fuse-lora,moe-build-training-step))' | FileCheck %s --check-prefix=STEP
// RUN: moe-opt %inputs/adapted.mlir --moe-lora-training='seq-len=8 fuse-lora=true' | FileCheck %s --check-prefix=PIPELINE
// RUN: moe-opt %inputs/adapted.mlir --moe-lora-training='seq-len=8' | FileCheck %s --check-prefix=UNFUSED
// RUN: moe-opt %inputs/adapted.mlir --moe-lora-training='seq-len=8 micro-batch=2 memory-cap=40000 fuse-lora=true' | FileCheck %s --check-prefix=CAP

// Tests that a projection, the update of its input and their sum become one op with the
// update's scale and dropout and the sum's type, whichever side of the sum each is on.
// CHECK-LABEL: func.func @adapted(
// CHECK-SAME: %[[X:.*]]: tensor<?x16xf32>, %[[W:.*]]: tensor<32x16xf32>, %[[A:.*]]: tensor<4x16xf32>, %[[B:.*]]: tensor<32x4xf32>)
// CHECK: %[[Y:.*]] = moe.lora_linear %[[X]], %[[W]], %[[A]], %[[B]] {base_type = f32, dropout = 1.000000e-01 : f64, scale = 2.000000e+00 : f64} : (tensor<?x16xf32>, tensor<32x16xf32>, tensor<4x16xf32>, tensor<32x4xf32>) -> tensor<?x32xf32>
// CHECK: %[[Z:.*]] = moe.lora_linear %[[X]], %[[W]], %[[A]], %[[B]] {base_type = f32, scale = 5.000000e-01 : f64}
// CHECK-NOT: moe.linear
// CHECK-NOT: moe.lora {{[%]}}
// CHECK-NOT: moe.add
// CHECK: return %[[Y]], %[[Z]]
moe.model @fuses {
  func.func @adapted(%x: tensor<?x16xf32>, %w: tensor<32x16xf32>, %a: tensor<4x16xf32>, %b: tensor<32x4xf32>) -> (tensor<?x32xf32>, tensor<?x32xf32>) {
    %y = moe.linear %x, %w : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
    %d = moe.lora %x, %a, %b {scale = 2.0 : f64, dropout = 0.1 : f64} : (tensor<?x16xf32>, tensor<4x16xf32>, tensor<32x4xf32>) -> tensor<?x32xf32>
    %s = moe.add %y, %d : tensor<?x32xf32>
    %y2 = moe.linear %x, %w : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
    %d2 = moe.lora %x, %a, %b {scale = 0.5 : f64} : (tensor<?x16xf32>, tensor<4x16xf32>, tensor<32x4xf32>) -> tensor<?x32xf32>
    %s2 = moe.add %d2, %y2 : tensor<?x32xf32>
    return %s, %s2 : tensor<?x32xf32>, tensor<?x32xf32>
  }
}

// -----

// Tests that a bf16 projection with an f32 update fuses into the sum's bf16 result, rounding
// the projection's part to bf16 as the unfused linear did.
// CHECK-LABEL: func.func @bf16(
// CHECK: moe.lora_linear {{.*}} {base_type = bf16, scale = 2.000000e+00 : f64} : (tensor<?x16xbf16>, tensor<32x16xbf16>, tensor<4x16xf32>, tensor<32x4xf32>) -> tensor<?x32xbf16>
moe.model @bf16 {
  func.func @bf16(%x: tensor<?x16xbf16>, %w: tensor<32x16xbf16>, %a: tensor<4x16xf32>, %b: tensor<32x4xf32>) -> tensor<?x32xbf16> {
    %y = moe.linear %x, %w : (tensor<?x16xbf16>, tensor<32x16xbf16>) -> tensor<?x32xbf16>
    %d = moe.lora %x, %a, %b {scale = 2.0 : f64} : (tensor<?x16xbf16>, tensor<4x16xf32>, tensor<32x4xf32>) -> tensor<?x32xf32>
    %s = moe.add %y, %d : tensor<?x32xbf16>, tensor<?x32xf32>
    return %s : tensor<?x32xbf16>
  }
}

// -----

// Tests that what fusing would change stays: a projection with a bias, an update of another
// input, a projection or an update that something else reads too, a sum of two projections.
// CHECK-LABEL: func.func @kept(
// CHECK-NOT: moe.lora_linear
// CHECK-COUNT-4: moe.add
// CHECK-NOT: moe.lora_linear
moe.model @kept {
  func.func @kept(%x: tensor<?x16xf32>, %x2: tensor<?x16xf32>, %w: tensor<32x16xf32>, %bias: tensor<32xf32>,
                  %a: tensor<4x16xf32>, %b: tensor<32x4xf32>) -> (tensor<?x32xf32>, tensor<?x32xf32>, tensor<?x32xf32>, tensor<?x32xf32>, tensor<?x32xf32>) {
    %y = moe.linear %x, %w bias %bias : (tensor<?x16xf32>, tensor<32x16xf32>, tensor<32xf32>) -> tensor<?x32xf32>
    %d = moe.lora %x, %a, %b {scale = 2.0 : f64} : (tensor<?x16xf32>, tensor<4x16xf32>, tensor<32x4xf32>) -> tensor<?x32xf32>
    %s = moe.add %y, %d : tensor<?x32xf32>
    %y2 = moe.linear %x2, %w : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
    %d2 = moe.lora %x, %a, %b {scale = 2.0 : f64} : (tensor<?x16xf32>, tensor<4x16xf32>, tensor<32x4xf32>) -> tensor<?x32xf32>
    %s2 = moe.add %y2, %d2 : tensor<?x32xf32>
    %y3 = moe.linear %x, %w : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
    %d3 = moe.lora %x, %a, %b {scale = 2.0 : f64} : (tensor<?x16xf32>, tensor<4x16xf32>, tensor<32x4xf32>) -> tensor<?x32xf32>
    %s3 = moe.add %y3, %d3 : tensor<?x32xf32>
    %y4 = moe.linear %x, %w : (tensor<?x16xf32>, tensor<32x16xf32>) -> tensor<?x32xf32>
    %s4 = moe.add %y4, %y4 : tensor<?x32xf32>
    return %s, %s2, %s3, %d3, %s4 : tensor<?x32xf32>, tensor<?x32xf32>, tensor<?x32xf32>, tensor<?x32xf32>, tensor<?x32xf32>
  }
}

// Tests that the training step differentiates the fused op by its own backward: the input's
// and the adapter's gradients from one moe.backward (the frozen weight's not asked), no sum of
// the projection's and the update's input gradients.
// STEP: moe.lora_linear %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {base_type = f32, scale = 2.000000e+00 : f64}
// STEP: moe.backward "moe.lora_linear"(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) grads(%{{.*}}) {{.*}}grad_of_inputs = array<i64: 0, 2, 3>
// STEP-NOT: moe.backward "moe.lora"
// STEP-NOT: moe.backward "moe.linear"(%arg0

// Tests that moe-lora-training with fuse-lora fuses the forward after the step, whose backward
// keeps the unfused pair's two backward ops and their input gradients' sum; by default it does not.
// PIPELINE: moe.lora_linear
// PIPELINE-NOT: moe.lora {{[%]}}
// PIPELINE: moe.backward "moe.lora"
// PIPELINE: moe.backward "moe.linear"(%arg0
// PIPELINE: moe.add
// PIPELINE-NOT: moe.backward "moe.lora_linear"
// UNFUSED-NOT: moe.lora_linear
// UNFUSED: moe.lora {{[%]}}

// Tests that the template the training layers come from stays unfused, and that the layers
// memory planning rebuilds from it under a cap (here recomputed) are fused as the ones they
// replace were: the forward and its recomputed copy, the backward of the unfused ops.
// CAP: moe.layer @mlp(
// CAP-NOT: moe.lora_linear
// CAP: moe.lora {{[%]}}
// CAP: moe.layer @mlp_fwd_recompute(
// CAP: moe.lora_linear
// CAP: moe.layer @mlp_bwd_recompute(
// CAP: moe.lora_linear {{.*}}recomputed
// CAP: moe.backward "moe.lora"
// CAP: moe.backward "moe.linear"(%arg0
// CAP-NOT: moe.backward "moe.lora_linear"
