// RUN: moe-opt %s -split-input-file -verify-diagnostics

// Tests that embedding ids must be a flat list of tokens.
func.func @embedding_ids_rank(%ids: tensor<?x1xi64>, %table: tensor<151936x2048xbf16>) -> tensor<?x2048xbf16> {
  // expected-error @+1 {{'moe.embedding' op ids must have rank 1, got 'tensor<?x1xi64>'}}
  %e = moe.embedding %ids, %table : (tensor<?x1xi64>, tensor<151936x2048xbf16>) -> tensor<?x2048xbf16>
  return %e : tensor<?x2048xbf16>
}

// -----

// Tests that the embedding result width must be the table's hidden size.
func.func @embedding_width(%ids: tensor<?xi64>, %table: tensor<151936x2048xbf16>) -> tensor<?x1024xbf16> {
  // expected-error @+1 {{'moe.embedding' op result dimension 1 must be 2048 (table dimension 1), got 1024}}
  %e = moe.embedding %ids, %table : (tensor<?xi64>, tensor<151936x2048xbf16>) -> tensor<?x1024xbf16>
  return %e : tensor<?x1024xbf16>
}

// -----

// Tests that the embedding result keeps the table's element type.
func.func @embedding_dtype(%ids: tensor<?xi64>, %table: tensor<151936x2048xbf16>) -> tensor<?x2048xf32> {
  // expected-error @+1 {{'moe.embedding' op result element type 'f32' differs from table element type 'bf16'}}
  %e = moe.embedding %ids, %table : (tensor<?xi64>, tensor<151936x2048xbf16>) -> tensor<?x2048xf32>
  return %e : tensor<?x2048xf32>
}

// -----

// Tests that an RMSNorm weight must divide the feature dimension into whole groups.
func.func @rms_norm_group(%x: tensor<?x4096xbf16>, %w: tensor<100xbf16>) -> tensor<?x4096xbf16> {
  // expected-error @+1 {{'moe.rms_norm' op input feature size (4096) must be a multiple of weight size (100)}}
  %y = moe.rms_norm %x, %w {eps = 1.0e-06 : f64} : (tensor<?x4096xbf16>, tensor<100xbf16>) -> tensor<?x4096xbf16>
  return %y : tensor<?x4096xbf16>
}

// -----

// Tests that an RMSNorm weight is a vector.
func.func @rms_norm_weight_rank(%x: tensor<?x2048xbf16>, %w: tensor<1x2048xbf16>) -> tensor<?x2048xbf16> {
  // expected-error @+1 {{'moe.rms_norm' op weight must have rank 1, got 'tensor<1x2048xbf16>'}}
  %y = moe.rms_norm %x, %w {eps = 1.0e-06 : f64} : (tensor<?x2048xbf16>, tensor<1x2048xbf16>) -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}

// -----

// Tests that an RMSNorm result has the input's type.
func.func @rms_norm_result(%x: tensor<?x2048xbf16>, %w: tensor<2048xbf16>) -> tensor<?x2048xf32> {
  // expected-error @+1 {{'moe.rms_norm' op result type 'tensor<?x2048xf32>' differs from input type 'tensor<?x2048xbf16>'}}
  %y = moe.rms_norm %x, %w {eps = 1.0e-06 : f64} : (tensor<?x2048xbf16>, tensor<2048xbf16>) -> tensor<?x2048xf32>
  return %y : tensor<?x2048xf32>
}

// -----

// Tests that an RMSNorm of a scalar is diagnosed (the verifier used to assert on it).
func.func @rms_norm_scalar(%x: tensor<f32>, %w: tensor<2048xf32>) -> tensor<f32> {
  // expected-error @+1 {{'moe.rms_norm' op input must have rank at least 1, got 'tensor<f32>'}}
  %y = moe.rms_norm %x, %w {eps = 1.0e-06 : f64} : (tensor<f32>, tensor<2048xf32>) -> tensor<f32>
  return %y : tensor<f32>
}

// -----

// Tests that a LayerNorm bias covers the whole feature dimension.
func.func @layer_norm_bias(%x: tensor<?x128xbf16>, %w: tensor<128xbf16>, %b: tensor<64xbf16>) -> tensor<?x128xbf16> {
  // expected-error @+1 {{'moe.layer_norm' op bias dimension 0 must be 128 (input features), got 64}}
  %y = moe.layer_norm %x, %w, %b {eps = 1.0e-06 : f64} : (tensor<?x128xbf16>, tensor<128xbf16>, tensor<64xbf16>) -> tensor<?x128xbf16>
  return %y : tensor<?x128xbf16>
}

// -----

// Tests that a LayerNorm weight covers the whole feature dimension (it is not per-group like RMSNorm).
func.func @layer_norm_weight(%x: tensor<?x128xbf16>, %w: tensor<64xbf16>, %b: tensor<128xbf16>) -> tensor<?x128xbf16> {
  // expected-error @+1 {{'moe.layer_norm' op weight dimension 0 must be 128 (input features), got 64}}
  %y = moe.layer_norm %x, %w, %b {eps = 1.0e-06 : f64} : (tensor<?x128xbf16>, tensor<64xbf16>, tensor<128xbf16>) -> tensor<?x128xbf16>
  return %y : tensor<?x128xbf16>
}

// -----

// Tests that a linear weight in [out, in] layout must match the input features.
func.func @linear_in_features(%x: tensor<?x2048xbf16>, %w: tensor<4096x1024xbf16>) -> tensor<?x4096xbf16> {
  // expected-error @+1 {{'moe.linear' op weight dimension 1 must be 2048 (input features), got 1024}}
  %y = moe.linear %x, %w : (tensor<?x2048xbf16>, tensor<4096x1024xbf16>) -> tensor<?x4096xbf16>
  return %y : tensor<?x4096xbf16>
}

// -----

// Tests that a weight given in [in, out] layout is rejected through the input features.
func.func @linear_transposed(%x: tensor<?x2048xbf16>, %w: tensor<2048x4096xbf16>) -> tensor<?x4096xbf16> {
  // expected-error @+1 {{'moe.linear' op weight dimension 1 must be 2048 (input features), got 4096}}
  %y = moe.linear %x, %w : (tensor<?x2048xbf16>, tensor<2048x4096xbf16>) -> tensor<?x4096xbf16>
  return %y : tensor<?x4096xbf16>
}

// -----

// Tests that the linear result width is the weight's output features.
func.func @linear_out_features(%x: tensor<?x2048xbf16>, %w: tensor<4096x2048xbf16>) -> tensor<?x2048xbf16> {
  // expected-error @+1 {{'moe.linear' op result dimension 1 must be 4096 (weight output features), got 2048}}
  %y = moe.linear %x, %w : (tensor<?x2048xbf16>, tensor<4096x2048xbf16>) -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}

// -----

// Tests that a linear weight must have the input's element type.
func.func @linear_dtype(%x: tensor<?x2048xbf16>, %w: tensor<4096x2048xf32>) -> tensor<?x4096xbf16> {
  // expected-error @+1 {{'moe.linear' op weight element type 'f32' differs from input element type 'bf16'}}
  %y = moe.linear %x, %w : (tensor<?x2048xbf16>, tensor<4096x2048xf32>) -> tensor<?x4096xbf16>
  return %y : tensor<?x4096xbf16>
}

// -----

// Tests that a linear keeps the token count.
func.func @linear_tokens(%x: tensor<8x2048xbf16>, %w: tensor<4096x2048xbf16>) -> tensor<4x4096xbf16> {
  // expected-error @+1 {{'moe.linear' op result dimension 0 must be 8 (input), got 4}}
  %y = moe.linear %x, %w : (tensor<8x2048xbf16>, tensor<4096x2048xbf16>) -> tensor<4x4096xbf16>
  return %y : tensor<4x4096xbf16>
}

// -----

// Tests that a linear bias has one entry per output feature.
func.func @linear_bias(%x: tensor<?x2880xbf16>, %w: tensor<4096x2880xbf16>, %b: tensor<2880xbf16>) -> tensor<?x4096xbf16> {
  // expected-error @+1 {{'moe.linear' op bias dimension 0 must be 4096 (output features), got 2880}}
  %y = moe.linear %x, %w bias %b : (tensor<?x2880xbf16>, tensor<4096x2880xbf16>, tensor<2880xbf16>) -> tensor<?x4096xbf16>
  return %y : tensor<?x4096xbf16>
}

// -----

// Tests that a linear of a scalar is diagnosed (the verifier used to assert on it).
func.func @linear_scalar(%x: tensor<f32>, %w: tensor<4096x2048xf32>) -> tensor<f32> {
  // expected-error @+1 {{'moe.linear' op input must have rank at least 1, got 'tensor<f32>'}}
  %y = moe.linear %x, %w : (tensor<f32>, tensor<4096x2048xf32>) -> tensor<f32>
  return %y : tensor<f32>
}

// -----

// Tests that an add's rhs may be f32 on a bf16 lhs, but not narrower than the lhs.
func.func @add_mismatch(%a: tensor<?x2048xf32>, %b: tensor<?x2048xbf16>) -> tensor<?x2048xf32> {
  // expected-error @+1 {{'moe.add' op rhs element type 'bf16' differs from lhs element type 'f32'}}
  %r = moe.add %a, %b : tensor<?x2048xf32>, tensor<?x2048xbf16>
  return %r : tensor<?x2048xf32>
}

// -----

// Tests that an add's operands have one shape.
func.func @add_shapes(%a: tensor<?x2048xbf16>, %b: tensor<?x1024xbf16>) -> tensor<?x2048xbf16> {
  // expected-error @+1 {{'moe.add' op lhs and rhs must have the same shape, got 'tensor<?x2048xbf16>' and 'tensor<?x1024xbf16>'}}
  %r = moe.add %a, %b : tensor<?x2048xbf16>, tensor<?x1024xbf16>
  return %r : tensor<?x2048xbf16>
}

// -----

// Tests that the result has the lhs type (only the generic form can spell another).
func.func @add_result(%a: tensor<?x2048xbf16>, %b: tensor<?x2048xf32>) -> tensor<?x2048xf32> {
  // expected-error @+1 {{'moe.add' op failed to verify that all of {lhs, result} have same type}}
  %r = "moe.add"(%a, %b) : (tensor<?x2048xbf16>, tensor<?x2048xf32>) -> tensor<?x2048xf32>
  return %r : tensor<?x2048xf32>
}

// -----

// Tests that clamped_swiglu is refused on moe.glu (it belongs to moe.expert_mlp).
func.func @glu_clamped_swiglu(%g: tensor<?x2880xbf16>, %u: tensor<?x2880xbf16>) -> tensor<?x2880xbf16> {
  // expected-error @+1 {{'moe.glu' op clamped_swiglu is an expert activation (moe.expert_mlp), not a moe.glu}}
  %h = moe.glu clamped_swiglu %g, %u : tensor<?x2880xbf16>
  return %h : tensor<?x2880xbf16>
}

// -----

// Tests that a sigmoid gate is either per feature or one per token, nothing in between.
func.func @sigmoid_gate_width(%x: tensor<?x4096xbf16>, %g: tensor<?x32xbf16>) -> tensor<?x4096xbf16> {
  // expected-error @+1 {{'moe.sigmoid_gate' op gate dimension 1 must be 1 (one gate per token, or one per feature), got 32}}
  %y = moe.sigmoid_gate %x, %g : (tensor<?x4096xbf16>, tensor<?x32xbf16>) -> tensor<?x4096xbf16>
  return %y : tensor<?x4096xbf16>
}

// -----

// Tests that a per-token gate must have the input's element type.
func.func @sigmoid_gate_dtype(%x: tensor<?x2048xbf16>, %g: tensor<?x1xf32>) -> tensor<?x2048xbf16> {
  // expected-error @+1 {{'moe.sigmoid_gate' op gate element type 'f32' differs from input element type 'bf16'}}
  %y = moe.sigmoid_gate %x, %g : (tensor<?x2048xbf16>, tensor<?x1xf32>) -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}

// -----

// Tests that a sigmoid gate result has the input's type.
func.func @sigmoid_gate_result(%x: tensor<?x4096xbf16>, %g: tensor<?x4096xbf16>) -> tensor<?x2048xbf16> {
  // expected-error @+1 {{'moe.sigmoid_gate' op result type 'tensor<?x2048xbf16>' differs from input type 'tensor<?x4096xbf16>'}}
  %y = moe.sigmoid_gate %x, %g : (tensor<?x4096xbf16>, tensor<?x4096xbf16>) -> tensor<?x2048xbf16>
  return %y : tensor<?x2048xbf16>
}

// -----

// Tests that a sigmoid gate of a vector is diagnosed (the verifier used to assert on a scalar).
func.func @sigmoid_gate_input_rank(%x: tensor<2048xbf16>, %g: tensor<?x1xbf16>) -> tensor<2048xbf16> {
  // expected-error @+1 {{'moe.sigmoid_gate' op input must have rank 2, got 'tensor<2048xbf16>'}}
  %y = moe.sigmoid_gate %x, %g : (tensor<2048xbf16>, tensor<?x1xbf16>) -> tensor<2048xbf16>
  return %y : tensor<2048xbf16>
}

// -----

// Tests that split sizes must sum to the input width.
func.func @split_sum(%kva: tensor<?x600xbf16>) -> (tensor<?x512xbf16>, tensor<?x64xbf16>) {
  // expected-error @+1 {{'moe.split' op input dimension 1 must be 576 (sum(sizes) * groups), got 600}}
  %ckv, %kpe = moe.split %kva {sizes = array<i64: 512, 64>} : (tensor<?x600xbf16>) -> (tensor<?x512xbf16>, tensor<?x64xbf16>)
  return %ckv, %kpe : tensor<?x512xbf16>, tensor<?x64xbf16>
}

// -----

// Tests that a split has one size per result.
func.func @split_count(%kva: tensor<?x576xbf16>) -> (tensor<?x512xbf16>, tensor<?x64xbf16>) {
  // expected-error @+1 {{'moe.split' op has 3 sizes but 2 results}}
  %ckv, %kpe = moe.split %kva {sizes = array<i64: 512, 32, 32>} : (tensor<?x576xbf16>) -> (tensor<?x512xbf16>, tensor<?x64xbf16>)
  return %ckv, %kpe : tensor<?x512xbf16>, tensor<?x64xbf16>
}

// -----

// Tests that a per-head split scales each result by the number of groups.
func.func @split_groups(%qg: tensor<?x8192xbf16>) -> (tensor<?x4096xbf16>, tensor<?x256xbf16>) {
  // expected-error @+1 {{'moe.split' op result #1 dimension 1 must be 4096 (size * groups), got 256}}
  %q, %g = moe.split %qg {sizes = array<i64: 256, 256>, groups = 16 : i64} : (tensor<?x8192xbf16>) -> (tensor<?x4096xbf16>, tensor<?x256xbf16>)
  return %q, %g : tensor<?x4096xbf16>, tensor<?x256xbf16>
}

// -----

// Tests that split sizes must be positive.
func.func @split_zero(%x: tensor<?x512xbf16>) -> (tensor<?x512xbf16>, tensor<?x0xbf16>) {
  // expected-error @+1 {{'moe.split' op size must be positive, got 0}}
  %a, %b = moe.split %x {sizes = array<i64: 512, 0>} : (tensor<?x512xbf16>) -> (tensor<?x512xbf16>, tensor<?x0xbf16>)
  return %a, %b : tensor<?x512xbf16>, tensor<?x0xbf16>
}

// -----

// Tests that lora_b must take the adapter rank that lora_a produces.
func.func @lora_rank_mismatch(%x: tensor<?x64xf32>, %a: tensor<4x64xf32>, %b: tensor<32x8xf32>) -> tensor<?x32xf32> {
  // expected-error @+1 {{'moe.lora' op lora_b dimension 1 must be 4 (adapter rank), got 8}}
  %d = moe.lora %x, %a, %b {scale = 2.0 : f64} : (tensor<?x64xf32>, tensor<4x64xf32>, tensor<32x8xf32>) -> tensor<?x32xf32>
  return %d : tensor<?x32xf32>
}

// -----

// Tests that lora_a must read the input's features.
func.func @lora_input_mismatch(%x: tensor<?x64xf32>, %a: tensor<4x32xf32>, %b: tensor<32x4xf32>) -> tensor<?x32xf32> {
  // expected-error @+1 {{'moe.lora' op lora_a dimension 1 must be 64 (input features), got 32}}
  %d = moe.lora %x, %a, %b {scale = 2.0 : f64} : (tensor<?x64xf32>, tensor<4x32xf32>, tensor<32x4xf32>) -> tensor<?x32xf32>
  return %d : tensor<?x32xf32>
}

// -----

// Tests that a bf16 activation may take f32 adapters (PEFT keeps adapters in f32) but not
// adapters of another 16-bit type.
func.func @lora_f16_adapter_on_bf16(%x: tensor<?x64xbf16>, %a: tensor<4x64xf16>, %b: tensor<32x4xf16>) -> tensor<?x32xbf16> {
  // expected-error @+1 {{'moe.lora' op lora_a element type 'f16' differs from input element type 'bf16'}}
  %d = moe.lora %x, %a, %b {scale = 2.0 : f64} : (tensor<?x64xbf16>, tensor<4x64xf16>, tensor<32x4xf16>) -> tensor<?x32xbf16>
  return %d : tensor<?x32xbf16>
}

// -----

// Tests that lora_linear's adapter must end in the weight's output features.
func.func @lora_linear_out_mismatch(%x: tensor<?x64xf32>, %w: tensor<32x64xf32>, %a: tensor<4x64xf32>, %b: tensor<16x4xf32>) -> tensor<?x32xf32> {
  // expected-error @+1 {{'moe.lora_linear' op lora_b dimension 0 must be 32 (weight output features), got 16}}
  %y = moe.lora_linear %x, %w, %a, %b {scale = 2.0 : f64} : (tensor<?x64xf32>, tensor<32x64xf32>, tensor<4x64xf32>, tensor<16x4xf32>) -> tensor<?x32xf32>
  return %y : tensor<?x32xf32>
}

// -----

// Tests that lora_linear's base_type is the result's element type (where the projection rounds).
func.func @lora_linear_base_type(%x: tensor<?x64xbf16>, %w: tensor<32x64xbf16>, %a: tensor<4x64xf32>, %b: tensor<32x4xf32>) -> tensor<?x32xbf16> {
  // expected-error @+1 {{'moe.lora_linear' op base_type 'f32' differs from the result's 'bf16'}}
  %y = moe.lora_linear %x, %w, %a, %b {scale = 2.0 : f64, base_type = f32} : (tensor<?x64xbf16>, tensor<32x64xbf16>, tensor<4x64xf32>, tensor<32x4xf32>) -> tensor<?x32xbf16>
  return %y : tensor<?x32xbf16>
}

// -----

// Tests that a row's sum of squares is one f32 per row.
func.func @row_sum_of_squares_type(%x: tensor<?x1024xbf16>) -> tensor<?x1xbf16> {
  // expected-error @+1 {{'moe.row_sum_of_squares' op result must be f32, got 'tensor<?x1xbf16>'}}
  %s = moe.row_sum_of_squares %x : (tensor<?x1024xbf16>) -> tensor<?x1xbf16>
  return %s : tensor<?x1xbf16>
}

// -----

// Tests that a sharded RMSNorm's weight is the rank's part of the features.
func.func @sharded_rms_norm_weight(%x: tensor<?x1024xbf16>, %w: tensor<2048xbf16>, %s: tensor<?x1xf32>) -> tensor<?x1024xbf16> {
  // expected-error @+1 {{'moe.sharded_rms_norm' op weight dimension 0 must be 1024 (the input's features), got 2048}}
  %y = moe.sharded_rms_norm %x, %w, %s {eps = 1.0e-05 : f64, features = 2048 : i64} : (tensor<?x1024xbf16>, tensor<2048xbf16>, tensor<?x1xf32>) -> tensor<?x1024xbf16>
  return %y : tensor<?x1024xbf16>
}

// -----

// Tests that the whole rows hold a multiple of the rank's features.
func.func @sharded_rms_norm_features(%x: tensor<?x1024xbf16>, %w: tensor<1024xbf16>, %s: tensor<?x1xf32>) -> tensor<?x1024xbf16> {
  // expected-error @+1 {{'moe.sharded_rms_norm' op features (1000) must be a multiple of the input's features (1024)}}
  %y = moe.sharded_rms_norm %x, %w, %s {eps = 1.0e-05 : f64, features = 1000 : i64} : (tensor<?x1024xbf16>, tensor<1024xbf16>, tensor<?x1xf32>) -> tensor<?x1024xbf16>
  return %y : tensor<?x1024xbf16>
}

// -----

// Tests that every piece splits over the ranks.
func.func @tp_slice_features_uneven(%x: tensor<?x100xf32>) -> tensor<?x50xf32> {
  // expected-error @+1 {{'moe.tp_slice_features' op a piece of 3 columns does not split over 2 ranks}}
  %mine = moe.tp_slice_features %x {axis = "tp", pieces = array<i64: 32, 32, 16, 16, 3, 1>, ranks = 2 : i64} : (tensor<?x100xf32>) -> tensor<?x50xf32>
  return %mine : tensor<?x50xf32>
}

// -----

// Tests that the pieces cover the whole value's columns.
func.func @tp_place_features_columns(%x: tensor<?x50xf32>) -> tensor<?x96xf32> {
  // expected-error @+1 {{'moe.tp_place_features' op whole dimension 1 must be 100 (the pieces' columns), got 96}}
  %back = moe.tp_place_features %x {axis = "tp", pieces = array<i64: 32, 32, 16, 16, 4>, ranks = 2 : i64} : (tensor<?x50xf32>) -> tensor<?x96xf32>
  return %back : tensor<?x96xf32>
}
