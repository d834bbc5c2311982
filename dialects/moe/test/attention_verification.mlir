// RUN: moe-opt %s -split-input-file -verify-diagnostics

// Tests that an odd rope dim is rejected (rotary pairs need an even count).
func.func @rope_odd(%x: tensor<?x4096xbf16>, %pos: tensor<?xi64>) -> tensor<?x4096xbf16> {
  // expected-error @+1 {{'moe.rope' op rope dim (63) must be even, positive and at most head_dim (128)}}
  %y = moe.rope %x, %pos {head_dim = 128 : i64, rope = #moe.rope<theta = 1.0e4, dim = 63, style = half>} : (tensor<?x4096xbf16>, tensor<?xi64>) -> tensor<?x4096xbf16>
  return %y : tensor<?x4096xbf16>
}

// -----

// Tests that a rope dim larger than the head is rejected.
func.func @rope_too_wide(%x: tensor<?x4096xbf16>, %pos: tensor<?xi64>) -> tensor<?x4096xbf16> {
  // expected-error @+1 {{'moe.rope' op rope dim (256) must be even, positive and at most head_dim (128)}}
  %y = moe.rope %x, %pos {head_dim = 128 : i64, rope = #moe.rope<theta = 1.0e4, dim = 256, style = half>} : (tensor<?x4096xbf16>, tensor<?xi64>) -> tensor<?x4096xbf16>
  return %y : tensor<?x4096xbf16>
}

// -----

// Tests that a zero rope dim is rejected.
func.func @rope_zero(%x: tensor<?x4096xbf16>, %pos: tensor<?xi64>) -> tensor<?x4096xbf16> {
  // expected-error @+1 {{'moe.rope' op rope dim (0) must be even, positive and at most head_dim (128)}}
  %y = moe.rope %x, %pos {head_dim = 128 : i64, rope = #moe.rope<theta = 1.0e4, dim = 0, style = half>} : (tensor<?x4096xbf16>, tensor<?xi64>) -> tensor<?x4096xbf16>
  return %y : tensor<?x4096xbf16>
}

// -----

// Tests that the input must hold a whole number of heads.
func.func @rope_heads(%x: tensor<?x4000xbf16>, %pos: tensor<?xi64>) -> tensor<?x4000xbf16> {
  // expected-error @+1 {{'moe.rope' op input features (4000) must be a multiple of head_dim (128)}}
  %y = moe.rope %x, %pos {head_dim = 128 : i64, rope = #moe.rope<theta = 1.0e4, dim = 128, style = half>} : (tensor<?x4000xbf16>, tensor<?xi64>) -> tensor<?x4000xbf16>
  return %y : tensor<?x4000xbf16>
}

// -----

// Tests that there is one position per token.
func.func @rope_positions(%x: tensor<8x4096xbf16>, %pos: tensor<4xi64>) -> tensor<8x4096xbf16> {
  // expected-error @+1 {{'moe.rope' op positions dimension 0 must be 8 (input dimension 0), got 4}}
  %y = moe.rope %x, %pos {head_dim = 128 : i64, rope = #moe.rope<theta = 1.0e4, dim = 128, style = half>} : (tensor<8x4096xbf16>, tensor<4xi64>) -> tensor<8x4096xbf16>
  return %y : tensor<8x4096xbf16>
}

// -----

// Tests that RoPE keeps the input type.
func.func @rope_result(%x: tensor<?x4096xbf16>, %pos: tensor<?xi64>) -> tensor<?x4096xf32> {
  // expected-error @+1 {{'moe.rope' op result type must equal the input type}}
  %y = moe.rope %x, %pos {head_dim = 128 : i64, rope = #moe.rope<theta = 1.0e4, dim = 128, style = half>} : (tensor<?x4096xbf16>, tensor<?xi64>) -> tensor<?x4096xf32>
  return %y : tensor<?x4096xf32>
}

// -----

// Tests that query heads must split evenly over the key/value heads.
func.func @attention_gqa_ratio(%q: tensor<?x4096xbf16>, %k: tensor<?x640xbf16>, %v: tensor<?x640xbf16>) -> tensor<?x4096xbf16> {
  // expected-error @+1 {{'moe.attention' op num_heads (32) must be a multiple of num_kv_heads (5)}}
  %o = moe.attention %q, %k, %v {num_heads = 32 : i64, num_kv_heads = 5 : i64, head_dim = 128 : i64, scale = 0.088 : f64} : (tensor<?x4096xbf16>, tensor<?x640xbf16>, tensor<?x640xbf16>) -> tensor<?x4096xbf16>
  return %o : tensor<?x4096xbf16>
}

// -----

// Tests that the query width must be num_heads * head_dim.
func.func @attention_query_width(%q: tensor<?x2048xbf16>, %k: tensor<?x512xbf16>, %v: tensor<?x512xbf16>) -> tensor<?x4096xbf16> {
  // expected-error @+1 {{'moe.attention' op query dimension 1 must be 4096 (num_heads * head_dim), got 2048}}
  %o = moe.attention %q, %k, %v {num_heads = 32 : i64, num_kv_heads = 4 : i64, head_dim = 128 : i64, scale = 0.088 : f64} : (tensor<?x2048xbf16>, tensor<?x512xbf16>, tensor<?x512xbf16>) -> tensor<?x4096xbf16>
  return %o : tensor<?x4096xbf16>
}

// -----

// Tests that the key width must be num_kv_heads * head_dim (a key projected for every query head is rejected).
func.func @attention_key_width(%q: tensor<?x4096xbf16>, %k: tensor<?x4096xbf16>, %v: tensor<?x512xbf16>) -> tensor<?x4096xbf16> {
  // expected-error @+1 {{'moe.attention' op key dimension 1 must be 512 (num_kv_heads * head_dim), got 4096}}
  %o = moe.attention %q, %k, %v {num_heads = 32 : i64, num_kv_heads = 4 : i64, head_dim = 128 : i64, scale = 0.088 : f64} : (tensor<?x4096xbf16>, tensor<?x4096xbf16>, tensor<?x512xbf16>) -> tensor<?x4096xbf16>
  return %o : tensor<?x4096xbf16>
}

// -----

// Tests that keys must have the query's element type.
func.func @attention_key_dtype(%q: tensor<?x4096xbf16>, %k: tensor<?x512xf32>, %v: tensor<?x512xbf16>) -> tensor<?x4096xbf16> {
  // expected-error @+1 {{'moe.attention' op key element type 'f32' differs from query element type 'bf16'}}
  %o = moe.attention %q, %k, %v {num_heads = 32 : i64, num_kv_heads = 4 : i64, head_dim = 128 : i64, scale = 0.088 : f64} : (tensor<?x4096xbf16>, tensor<?x512xf32>, tensor<?x512xbf16>) -> tensor<?x4096xbf16>
  return %o : tensor<?x4096xbf16>
}

// -----

// Tests that keys and queries cover the same tokens.
func.func @attention_tokens(%q: tensor<16x4096xbf16>, %k: tensor<8x512xbf16>, %v: tensor<16x512xbf16>) -> tensor<16x4096xbf16> {
  // expected-error @+1 {{'moe.attention' op key dimension 0 must be 16 (query dimension 0), got 8}}
  %o = moe.attention %q, %k, %v {num_heads = 32 : i64, num_kv_heads = 4 : i64, head_dim = 128 : i64, scale = 0.088 : f64} : (tensor<16x4096xbf16>, tensor<8x512xbf16>, tensor<16x512xbf16>) -> tensor<16x4096xbf16>
  return %o : tensor<16x4096xbf16>
}

// -----

// Tests that the value width must hold whole kv heads.
func.func @attention_value_width(%q: tensor<?x4096xbf16>, %k: tensor<?x512xbf16>, %v: tensor<?x510xbf16>) -> tensor<?x4096xbf16> {
  // expected-error @+1 {{'moe.attention' op value features (510) must be a multiple of num_kv_heads (4)}}
  %o = moe.attention %q, %k, %v {num_heads = 32 : i64, num_kv_heads = 4 : i64, head_dim = 128 : i64, scale = 0.088 : f64} : (tensor<?x4096xbf16>, tensor<?x512xbf16>, tensor<?x510xbf16>) -> tensor<?x4096xbf16>
  return %o : tensor<?x4096xbf16>
}

// -----

// Tests that a value tensor without a feature dimension is diagnosed (the verifier used to assert on it).
func.func @attention_value_rank(%q: tensor<?x4096xbf16>, %k: tensor<?x512xbf16>, %v: tensor<512xbf16>) -> tensor<?x4096xbf16> {
  // expected-error @+1 {{'moe.attention' op value must have rank 2, got 'tensor<512xbf16>'}}
  %o = moe.attention %q, %k, %v {num_heads = 32 : i64, num_kv_heads = 4 : i64, head_dim = 128 : i64, scale = 0.088 : f64} : (tensor<?x4096xbf16>, tensor<?x512xbf16>, tensor<512xbf16>) -> tensor<?x4096xbf16>
  return %o : tensor<?x4096xbf16>
}

// -----

// Tests that the result has every query head (not just the kv heads).
func.func @attention_result_width(%q: tensor<?x4096xbf16>, %k: tensor<?x512xbf16>, %v: tensor<?x512xbf16>) -> tensor<?x512xbf16> {
  // expected-error @+1 {{'moe.attention' op result dimension 1 must be 4096 (num_heads * value head dim), got 512}}
  %o = moe.attention %q, %k, %v {num_heads = 32 : i64, num_kv_heads = 4 : i64, head_dim = 128 : i64, scale = 0.088 : f64} : (tensor<?x4096xbf16>, tensor<?x512xbf16>, tensor<?x512xbf16>) -> tensor<?x512xbf16>
  return %o : tensor<?x512xbf16>
}

// -----

// Tests that sinks hold one logit per query head.
func.func @attention_sinks(%q: tensor<?x4096xbf16>, %k: tensor<?x512xbf16>, %v: tensor<?x512xbf16>, %s: tensor<8xbf16>) -> tensor<?x4096xbf16> {
  // expected-error @+1 {{'moe.attention' op sinks dimension 0 must be 64 (one sink logit per head), got 8}}
  %o = moe.attention %q, %k, %v sinks %s {num_heads = 64 : i64, num_kv_heads = 8 : i64, head_dim = 64 : i64, scale = 0.125 : f64, sliding_window = 128 : i64} : (tensor<?x4096xbf16>, tensor<?x512xbf16>, tensor<?x512xbf16>, tensor<8xbf16>) -> tensor<?x4096xbf16>
  return %o : tensor<?x4096xbf16>
}

// -----

// Tests that an empty sliding window is rejected.
func.func @attention_window(%q: tensor<?x4096xbf16>, %k: tensor<?x512xbf16>, %v: tensor<?x512xbf16>) -> tensor<?x4096xbf16> {
  // expected-error @+1 {{'moe.attention' op sliding_window must be positive, got 0}}
  %o = moe.attention %q, %k, %v {num_heads = 64 : i64, num_kv_heads = 8 : i64, head_dim = 64 : i64, scale = 0.125 : f64, sliding_window = 0 : i64} : (tensor<?x4096xbf16>, tensor<?x512xbf16>, tensor<?x512xbf16>) -> tensor<?x4096xbf16>
  return %o : tensor<?x4096xbf16>
}

// -----

// Tests that the statistics have one column per query head.
func.func @attention_logsumexp_heads(%q: tensor<?x4096xbf16>, %k: tensor<?x512xbf16>, %v: tensor<?x512xbf16>) -> tensor<?x8xf32> {
  // expected-error @+1 {{'moe.attention' op logsumexp dimension 1 must be 32 (num_heads), got 8}}
  %o, %lse = moe.attention %q, %k, %v {num_heads = 32 : i64, num_kv_heads = 4 : i64, head_dim = 128 : i64, scale = 0.088 : f64} : (tensor<?x4096xbf16>, tensor<?x512xbf16>, tensor<?x512xbf16>) -> (tensor<?x4096xbf16>, tensor<?x8xf32>)
  return %lse : tensor<?x8xf32>
}

// -----

// Tests that the statistics are f32 whatever the storage type.
func.func @attention_logsumexp_type(%q: tensor<?x4096xbf16>, %k: tensor<?x512xbf16>, %v: tensor<?x512xbf16>) -> tensor<?x32xbf16> {
  // expected-error @+1 {{'moe.attention' op result #1 must be ranked tensor of 32-bit float values}}
  %o, %lse = moe.attention %q, %k, %v {num_heads = 32 : i64, num_kv_heads = 4 : i64, head_dim = 128 : i64, scale = 0.088 : f64} : (tensor<?x4096xbf16>, tensor<?x512xbf16>, tensor<?x512xbf16>) -> (tensor<?x4096xbf16>, tensor<?x32xbf16>)
  return %lse : tensor<?x32xbf16>
}

// -----

// Tests that zero kv heads are rejected before any division by them.
func.func @attention_zero_kv(%q: tensor<?x4096xbf16>, %k: tensor<?x512xbf16>, %v: tensor<?x512xbf16>) -> tensor<?x4096xbf16> {
  // expected-error @+1 {{'moe.attention' op num_kv_heads must be positive, got 0}}
  %o = moe.attention %q, %k, %v {num_heads = 32 : i64, num_kv_heads = 0 : i64, head_dim = 128 : i64, scale = 0.088 : f64} : (tensor<?x4096xbf16>, tensor<?x512xbf16>, tensor<?x512xbf16>) -> tensor<?x4096xbf16>
  return %o : tensor<?x4096xbf16>
}

// -----

// Tests that MLA's rope dim must equal qk_rope_head_dim.
func.func @mla_rope_dim(%q: tensor<?x3072xbf16>, %kpe: tensor<?x64xbf16>, %kv: tensor<?x4096xbf16>, %pos: tensor<?xi64>) -> tensor<?x2048xbf16> {
  // expected-error @+1 {{'moe.mla' op rope dim (32) must equal qk_rope_head_dim (64)}}
  %o = moe.mla %q, %kpe, %kv, %pos {num_heads = 16 : i64, qk_nope_head_dim = 128 : i64, qk_rope_head_dim = 64 : i64, v_head_dim = 128 : i64, scale = 0.072 : f64, rope = #moe.rope<theta = 1.0e4, dim = 32, style = interleaved>} : (tensor<?x3072xbf16>, tensor<?x64xbf16>, tensor<?x4096xbf16>, tensor<?xi64>) -> tensor<?x2048xbf16>
  return %o : tensor<?x2048xbf16>
}

// -----

// Tests that MLA's query holds nope and rope parts of every head.
func.func @mla_query_width(%q: tensor<?x2048xbf16>, %kpe: tensor<?x64xbf16>, %kv: tensor<?x4096xbf16>, %pos: tensor<?xi64>) -> tensor<?x2048xbf16> {
  // expected-error @+1 {{'moe.mla' op query dimension 1 must be 3072 (num_heads * (qk_nope + qk_rope)), got 2048}}
  %o = moe.mla %q, %kpe, %kv, %pos {num_heads = 16 : i64, qk_nope_head_dim = 128 : i64, qk_rope_head_dim = 64 : i64, v_head_dim = 128 : i64, scale = 0.072 : f64} : (tensor<?x2048xbf16>, tensor<?x64xbf16>, tensor<?x4096xbf16>, tensor<?xi64>) -> tensor<?x2048xbf16>
  return %o : tensor<?x2048xbf16>
}

// -----

// Tests that MLA's shared rope key is one head of qk_rope_head_dim.
func.func @mla_key_rope(%q: tensor<?x3072xbf16>, %kpe: tensor<?x1024xbf16>, %kv: tensor<?x4096xbf16>, %pos: tensor<?xi64>) -> tensor<?x2048xbf16> {
  // expected-error @+1 {{'moe.mla' op key_rope dimension 1 must be 64 (qk_rope_head_dim), got 1024}}
  %o = moe.mla %q, %kpe, %kv, %pos {num_heads = 16 : i64, qk_nope_head_dim = 128 : i64, qk_rope_head_dim = 64 : i64, v_head_dim = 128 : i64, scale = 0.072 : f64} : (tensor<?x3072xbf16>, tensor<?x1024xbf16>, tensor<?x4096xbf16>, tensor<?xi64>) -> tensor<?x2048xbf16>
  return %o : tensor<?x2048xbf16>
}

// -----

// Tests that MLA's key_value holds nope key and value parts of every head.
func.func @mla_key_value(%q: tensor<?x3072xbf16>, %kpe: tensor<?x64xbf16>, %kv: tensor<?x3072xbf16>, %pos: tensor<?xi64>) -> tensor<?x2048xbf16> {
  // expected-error @+1 {{'moe.mla' op key_value dimension 1 must be 4096 (num_heads * (qk_nope + v_head)), got 3072}}
  %o = moe.mla %q, %kpe, %kv, %pos {num_heads = 16 : i64, qk_nope_head_dim = 128 : i64, qk_rope_head_dim = 64 : i64, v_head_dim = 128 : i64, scale = 0.072 : f64} : (tensor<?x3072xbf16>, tensor<?x64xbf16>, tensor<?x3072xbf16>, tensor<?xi64>) -> tensor<?x2048xbf16>
  return %o : tensor<?x2048xbf16>
}

// -----

// Tests that the MLA result is num_heads * v_head_dim wide.
func.func @mla_result(%q: tensor<?x3072xbf16>, %kpe: tensor<?x64xbf16>, %kv: tensor<?x4096xbf16>, %pos: tensor<?xi64>) -> tensor<?x3072xbf16> {
  // expected-error @+1 {{'moe.mla' op result dimension 1 must be 2048 (num_heads * v_head_dim), got 3072}}
  %o = moe.mla %q, %kpe, %kv, %pos {num_heads = 16 : i64, qk_nope_head_dim = 128 : i64, qk_rope_head_dim = 64 : i64, v_head_dim = 128 : i64, scale = 0.072 : f64} : (tensor<?x3072xbf16>, tensor<?x64xbf16>, tensor<?x4096xbf16>, tensor<?xi64>) -> tensor<?x3072xbf16>
  return %o : tensor<?x3072xbf16>
}

// -----

// Tests that sparse attention shares MLA's checks (here the rope dim).
func.func @sparse_attention_rope(%q: tensor<?x24576xbf16>, %kpe: tensor<?x64xbf16>, %kv: tensor<?x32768xbf16>, %pos: tensor<?xi64>, %idx: tensor<?x2048xi32>) -> tensor<?x16384xbf16> {
  // expected-error @+1 {{'moe.sparse_attention' op rope dim (128) must equal qk_rope_head_dim (64)}}
  %o = moe.sparse_attention %q, %kpe, %kv, %pos, %idx {num_heads = 128 : i64, qk_nope_head_dim = 128 : i64, qk_rope_head_dim = 64 : i64, v_head_dim = 128 : i64, scale = 0.072 : f64, rope = #moe.rope<theta = 1.0e4, dim = 128, style = interleaved>} : (tensor<?x24576xbf16>, tensor<?x64xbf16>, tensor<?x32768xbf16>, tensor<?xi64>, tensor<?x2048xi32>) -> tensor<?x16384xbf16>
  return %o : tensor<?x16384xbf16>
}

// -----

// Tests that sparse attention has one row of selected keys per query.
func.func @sparse_attention_indices(%q: tensor<16x24576xbf16>, %kpe: tensor<16x64xbf16>, %kv: tensor<16x32768xbf16>, %pos: tensor<16xi64>, %idx: tensor<8x2048xi32>) -> tensor<16x16384xbf16> {
  // expected-error @+1 {{'moe.sparse_attention' op indices dimension 0 must be 16 (query dimension 0), got 8}}
  %o = moe.sparse_attention %q, %kpe, %kv, %pos, %idx {num_heads = 128 : i64, qk_nope_head_dim = 128 : i64, qk_rope_head_dim = 64 : i64, v_head_dim = 128 : i64, scale = 0.072 : f64} : (tensor<16x24576xbf16>, tensor<16x64xbf16>, tensor<16x32768xbf16>, tensor<16xi64>, tensor<8x2048xi32>) -> tensor<16x16384xbf16>
  return %o : tensor<16x16384xbf16>
}

// -----

// Tests that the indexer key is a single head of head_dim.
func.func @dsa_indexer_key(%q: tensor<?x8192xbf16>, %k: tensor<?x64xbf16>, %w: tensor<?x64xbf16>, %pos: tensor<?xi64>) -> tensor<?x2048xi32> {
  // expected-error @+1 {{'moe.dsa_indexer' op key dimension 1 must be 128 (head_dim), got 64}}
  %idx = moe.dsa_indexer %q, %k, %w, %pos {num_heads = 64 : i64, head_dim = 128 : i64, topk = 2048 : i64, rope = #moe.rope<theta = 1.0e4, dim = 64, style = half>} : (tensor<?x8192xbf16>, tensor<?x64xbf16>, tensor<?x64xbf16>, tensor<?xi64>) -> tensor<?x2048xi32>
  return %idx : tensor<?x2048xi32>
}

// -----

// Tests that the indexer has one weight per head per token.
func.func @dsa_indexer_head_weights(%q: tensor<?x8192xbf16>, %k: tensor<?x128xbf16>, %w: tensor<?x32xbf16>, %pos: tensor<?xi64>) -> tensor<?x2048xi32> {
  // expected-error @+1 {{'moe.dsa_indexer' op head_weights dimension 1 must be 64 (num_heads), got 32}}
  %idx = moe.dsa_indexer %q, %k, %w, %pos {num_heads = 64 : i64, head_dim = 128 : i64, topk = 2048 : i64, rope = #moe.rope<theta = 1.0e4, dim = 64, style = half>} : (tensor<?x8192xbf16>, tensor<?x128xbf16>, tensor<?x32xbf16>, tensor<?xi64>) -> tensor<?x2048xi32>
  return %idx : tensor<?x2048xi32>
}

// -----

// Tests that the indexer selects exactly topk keys per query.
func.func @dsa_indexer_topk(%q: tensor<?x8192xbf16>, %k: tensor<?x128xbf16>, %w: tensor<?x64xbf16>, %pos: tensor<?xi64>) -> tensor<?x1024xi32> {
  // expected-error @+1 {{'moe.dsa_indexer' op indices dimension 1 must be 2048 (topk), got 1024}}
  %idx = moe.dsa_indexer %q, %k, %w, %pos {num_heads = 64 : i64, head_dim = 128 : i64, topk = 2048 : i64, rope = #moe.rope<theta = 1.0e4, dim = 64, style = half>} : (tensor<?x8192xbf16>, tensor<?x128xbf16>, tensor<?x64xbf16>, tensor<?xi64>) -> tensor<?x1024xi32>
  return %idx : tensor<?x1024xi32>
}

// -----

// Tests that the indexer's rope must fit its head.
func.func @dsa_indexer_rope(%q: tensor<?x8192xbf16>, %k: tensor<?x128xbf16>, %w: tensor<?x64xbf16>, %pos: tensor<?xi64>) -> tensor<?x2048xi32> {
  // expected-error @+1 {{'moe.dsa_indexer' op rope dim (192) must be even, positive and at most head_dim (128)}}
  %idx = moe.dsa_indexer %q, %k, %w, %pos {num_heads = 64 : i64, head_dim = 128 : i64, topk = 2048 : i64, rope = #moe.rope<theta = 1.0e4, dim = 192, style = half>} : (tensor<?x8192xbf16>, tensor<?x128xbf16>, tensor<?x64xbf16>, tensor<?xi64>) -> tensor<?x2048xi32>
  return %idx : tensor<?x2048xi32>
}
