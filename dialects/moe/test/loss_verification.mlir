// RUN: moe-opt %s -split-input-file -verify-diagnostics

// Tests that labels are one id per token.
func.func @labels_rank(%logits: tensor<?x151936xf32>, %labels: tensor<?x1xi64>) -> tensor<f32> {
  // expected-error @+1 {{'moe.cross_entropy' op labels must have rank 1, got 'tensor<?x1xi64>'}}
  %l = moe.cross_entropy %logits, %labels : (tensor<?x151936xf32>, tensor<?x1xi64>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Tests that logits are [tokens, vocab] (a batched [B, T, V] tensor is rejected).
func.func @logits_rank(%logits: tensor<4x?x151936xf32>, %labels: tensor<?xi64>) -> tensor<f32> {
  // expected-error @+1 {{'moe.cross_entropy' op logits must have rank 2, got 'tensor<4x?x151936xf32>'}}
  %l = moe.cross_entropy %logits, %labels : (tensor<4x?x151936xf32>, tensor<?xi64>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Tests that there is one label per logits row.
func.func @token_count(%logits: tensor<8x151936xf32>, %labels: tensor<7xi64>) -> tensor<f32> {
  // expected-error @+1 {{'moe.cross_entropy' op labels dimension 0 must be 8 (logits dimension 0), got 7}}
  %l = moe.cross_entropy %logits, %labels {shift_labels} : (tensor<8x151936xf32>, tensor<7xi64>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Tests that the loss is a scalar, not one value per token.
func.func @loss_per_token(%logits: tensor<?x151936xf32>, %labels: tensor<?xi64>) -> tensor<?xf32> {
  // expected-error @+1 {{'moe.cross_entropy' op result #0 must be 0D tensor of 32-bit float values, but got 'tensor<?xf32>'}}
  %l = moe.cross_entropy %logits, %labels : (tensor<?x151936xf32>, tensor<?xi64>) -> tensor<?xf32>
  return %l : tensor<?xf32>
}

// -----

// Tests that the loss is f32 even for bf16 logits.
func.func @loss_dtype(%logits: tensor<?x151936xbf16>, %labels: tensor<?xi64>) -> tensor<bf16> {
  // expected-error @+1 {{'moe.cross_entropy' op result #0 must be 0D tensor of 32-bit float values, but got 'tensor<bf16>'}}
  %l = moe.cross_entropy %logits, %labels : (tensor<?x151936xbf16>, tensor<?xi64>) -> tensor<bf16>
  return %l : tensor<bf16>
}

// -----

// Tests that labels are integer token ids.
func.func @labels_float(%logits: tensor<?x151936xf32>, %labels: tensor<?xf32>) -> tensor<f32> {
  // expected-error @+1 {{'moe.cross_entropy' op operand #1 must be ranked tensor of signless integer values, but got 'tensor<?xf32>'}}
  %l = moe.cross_entropy %logits, %labels : (tensor<?x151936xf32>, tensor<?xf32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Tests that logits are floating point.
func.func @logits_int(%logits: tensor<?x151936xi32>, %labels: tensor<?xi64>) -> tensor<f32> {
  // expected-error @+1 {{'moe.cross_entropy' op operand #0 must be ranked tensor of floating-point values, but got 'tensor<?x151936xi32>'}}
  %l = moe.cross_entropy %logits, %labels : (tensor<?x151936xi32>, tensor<?xi64>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Tests that ignore_index is a 64-bit integer.
func.func @ignore_index_type(%logits: tensor<?x151936xf32>, %labels: tensor<?xi64>) -> tensor<f32> {
  // expected-error @+1 {{'moe.cross_entropy' op attribute 'ignore_index' failed to satisfy constraint: 64-bit signless integer attribute}}
  %l = moe.cross_entropy %logits, %labels {ignore_index = -100 : i32} : (tensor<?x151936xf32>, tensor<?xi64>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Tests that the fused head's weight is [vocab, hidden] with the input's hidden size.
func.func @fused_hidden(%h: tensor<?x64xf32>, %head: tensor<256x32xf32>, %labels: tensor<?xi64>) -> tensor<f32> {
  // expected-error @+1 {{'moe.lm_head_cross_entropy' op weight dimension 1 must be 64 (input features), got 32}}
  %l, %lse = moe.lm_head_cross_entropy %h, %head, %labels : (tensor<?x64xf32>, tensor<256x32xf32>, tensor<?xi64>) -> (tensor<f32>, tensor<?xf32>)
  return %l : tensor<f32>
}

// -----

// Tests that the fused head's input and weight share their element type.
func.func @fused_dtype(%h: tensor<?x64xbf16>, %head: tensor<256x64xf32>, %labels: tensor<?xi64>) -> tensor<f32> {
  // expected-error @+1 {{'moe.lm_head_cross_entropy' op weight element type 'f32' differs from input element type 'bf16'}}
  %l, %lse = moe.lm_head_cross_entropy %h, %head, %labels : (tensor<?x64xbf16>, tensor<256x64xf32>, tensor<?xi64>) -> (tensor<f32>, tensor<?xf32>)
  return %l : tensor<f32>
}

// -----

// Tests that the fused head has one label per input row.
func.func @fused_labels(%h: tensor<8x64xf32>, %head: tensor<256x64xf32>, %labels: tensor<7xi64>) -> tensor<f32> {
  // expected-error @+1 {{'moe.lm_head_cross_entropy' op labels dimension 0 must be 8 (input dimension 0), got 7}}
  %l, %lse = moe.lm_head_cross_entropy %h, %head, %labels : (tensor<8x64xf32>, tensor<256x64xf32>, tensor<7xi64>) -> (tensor<f32>, tensor<8xf32>)
  return %l : tensor<f32>
}

// -----

// Tests that the input is [tokens, hidden].
func.func @fused_input_rank(%h: tensor<2x?x64xf32>, %head: tensor<256x64xf32>, %labels: tensor<?xi64>) -> tensor<f32> {
  // expected-error @+1 {{'moe.lm_head_cross_entropy' op input must have rank 2, got 'tensor<2x?x64xf32>'}}
  %l, %lse = moe.lm_head_cross_entropy %h, %head, %labels : (tensor<2x?x64xf32>, tensor<256x64xf32>, tensor<?xi64>) -> (tensor<f32>, tensor<?xf32>)
  return %l : tensor<f32>
}

// -----

// Tests that the logsumexp result has one f32 value per row.
func.func @fused_lse_rows(%h: tensor<8x64xf32>, %head: tensor<256x64xf32>, %labels: tensor<8xi64>) -> tensor<f32> {
  // expected-error @+1 {{'moe.lm_head_cross_entropy' op logsumexp dimension 0 must be 8 (input dimension 0), got 4}}
  %l, %lse = moe.lm_head_cross_entropy %h, %head, %labels : (tensor<8x64xf32>, tensor<256x64xf32>, tensor<8xi64>) -> (tensor<f32>, tensor<4xf32>)
  return %l : tensor<f32>
}

// -----

// Tests that the logsumexp stays f32 on a bf16 model.
func.func @fused_lse_dtype(%h: tensor<?x64xbf16>, %head: tensor<256x64xbf16>, %labels: tensor<?xi64>) -> tensor<f32> {
  // expected-error @+1 {{'moe.lm_head_cross_entropy' op result #1 must be ranked tensor of 32-bit float values, but got 'tensor<?xbf16>'}}
  %l, %lse = moe.lm_head_cross_entropy %h, %head, %labels {logits_type = bf16} : (tensor<?x64xbf16>, tensor<256x64xbf16>, tensor<?xi64>) -> (tensor<f32>, tensor<?xbf16>)
  return %l : tensor<f32>
}

// -----

// Tests that bf16 logits say so: the CPU's bf16 emulation rounds them by logits_type.
func.func @fused_logits_type_missing(%h: tensor<?x64xbf16>, %head: tensor<256x64xbf16>, %labels: tensor<?xi64>) -> tensor<f32> {
  // expected-error @+1 {{'moe.lm_head_cross_entropy' op needs logits_type = 'bf16' (the input element type; only f32 logits may leave it out)}}
  %l, %lse = moe.lm_head_cross_entropy %h, %head, %labels : (tensor<?x64xbf16>, tensor<256x64xbf16>, tensor<?xi64>) -> (tensor<f32>, tensor<?xf32>)
  return %l : tensor<f32>
}

// -----

// Tests that logits_type is the input's element type (the unfused head's result type).
func.func @fused_logits_type(%h: tensor<?x64xf32>, %head: tensor<256x64xf32>, %labels: tensor<?xi64>) -> tensor<f32> {
  // expected-error @+1 {{'moe.lm_head_cross_entropy' op logits_type 'bf16' differs from the input element type 'f32' (the type the unfused head's logits would have)}}
  %l, %lse = moe.lm_head_cross_entropy %h, %head, %labels {logits_type = bf16} : (tensor<?x64xf32>, tensor<256x64xf32>, tensor<?xi64>) -> (tensor<f32>, tensor<?xf32>)
  return %l : tensor<f32>
}

// -----

// Tests that a chunk holds at least one token.
func.func @fused_chunk(%h: tensor<?x64xf32>, %head: tensor<256x64xf32>, %labels: tensor<?xi64>) -> tensor<f32> {
  // expected-error @+1 {{'moe.lm_head_cross_entropy' op chunk_tokens must be positive, got 0}}
  %l, %lse = moe.lm_head_cross_entropy %h, %head, %labels {chunk_tokens = 0 : i64} : (tensor<?x64xf32>, tensor<256x64xf32>, tensor<?xi64>) -> (tensor<f32>, tensor<?xf32>)
  return %l : tensor<f32>
}

// -----

// Tests that the fused head's input gradient has the input's type.
func.func @fused_input_grad(%h: tensor<?x64xbf16>, %head: tensor<256x64xbf16>, %labels: tensor<?xi64>) -> tensor<?x64xf32> {
  // expected-error @+1 {{'moe.lm_head_cross_entropy' op input_grad must have the input's type 'tensor<?x64xbf16>', got 'tensor<?x64xf32>'}}
  %l, %lse, %dx = moe.lm_head_cross_entropy %h, %head, %labels {logits_type = bf16} : (tensor<?x64xbf16>, tensor<256x64xbf16>, tensor<?xi64>) -> (tensor<f32>, tensor<?xf32>, tensor<?x64xf32>)
  return %dx : tensor<?x64xf32>
}
