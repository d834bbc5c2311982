// RUN: moe-opt %s -split-input-file | moe-opt -split-input-file | FileCheck %s
// RUN: moe-opt %s -split-input-file --mlir-print-op-generic | moe-opt -split-input-file | FileCheck %s

// Tests that full half-style RoPE (Qwen3: 32 heads of 128, theta 1e6) round-trips.
// CHECK-LABEL: func.func @rope_full(
// CHECK-SAME: %[[X:.*]]: tensor<?x4096xbf16>, %[[POS:.*]]: tensor<?xi64>)
// CHECK: moe.rope %[[X]], %[[POS]] {head_dim = 128 : i64, rope = #moe.rope<theta = 1.000000e+06, dim = 128, style = half>} : (tensor<?x4096xbf16>, tensor<?xi64>) -> tensor<?x4096xbf16>
func.func @rope_full(%x: tensor<?x4096xbf16>, %pos: tensor<?xi64>) -> tensor<?x4096xbf16> {
  %y = moe.rope %x, %pos {head_dim = 128 : i64, rope = #moe.rope<theta = 1.0e6, dim = 128, style = half>} : (tensor<?x4096xbf16>, tensor<?xi64>) -> tensor<?x4096xbf16>
  return %y : tensor<?x4096xbf16>
}

// -----

// Tests that partial RoPE (only the first 64 of 128 features of each head rotate) keeps both sizes.
// CHECK-LABEL: func.func @rope_partial(
// CHECK-SAME: %[[X:.*]]: tensor<?x1024xbf16>, %[[POS:.*]]: tensor<?xi32>)
// CHECK: moe.rope %[[X]], %[[POS]] {head_dim = 128 : i64, rope = #moe.rope<theta = 1.000000e+04, dim = 64, style = half>} : (tensor<?x1024xbf16>, tensor<?xi32>) -> tensor<?x1024xbf16>
func.func @rope_partial(%x: tensor<?x1024xbf16>, %pos: tensor<?xi32>) -> tensor<?x1024xbf16> {
  %y = moe.rope %x, %pos {head_dim = 128 : i64, rope = #moe.rope<theta = 1.0e4, dim = 64, style = half>} : (tensor<?x1024xbf16>, tensor<?xi32>) -> tensor<?x1024xbf16>
  return %y : tensor<?x1024xbf16>
}

// -----

// Tests that interleaved RoPE (DeepSeek's rope key, one shared head of 64) keeps its style.
// CHECK-LABEL: func.func @rope_interleaved(
// CHECK-SAME: %[[KPE:.*]]: tensor<?x64xbf16>, %[[POS:.*]]: tensor<?xi64>)
// CHECK: moe.rope %[[KPE]], %[[POS]] {head_dim = 64 : i64, rope = #moe.rope<theta = 1.000000e+04, dim = 64, style = interleaved>} : (tensor<?x64xbf16>, tensor<?xi64>) -> tensor<?x64xbf16>
func.func @rope_interleaved(%kpe: tensor<?x64xbf16>, %pos: tensor<?xi64>) -> tensor<?x64xbf16> {
  %y = moe.rope %kpe, %pos {head_dim = 64 : i64, rope = #moe.rope<theta = 1.0e4, dim = 64, style = interleaved>} : (tensor<?x64xbf16>, tensor<?xi64>) -> tensor<?x64xbf16>
  return %y : tensor<?x64xbf16>
}

// -----

// Tests that YaRN scaling parameters (DeepSeek-V3: factor 40 over 4096 positions) survive the round trip.
// CHECK-LABEL: func.func @rope_yarn(
// CHECK-SAME: %[[X:.*]]: tensor<?x4096xbf16>, %[[POS:.*]]: tensor<?xi64>)
// CHECK: moe.rope %[[X]], %[[POS]] {head_dim = 128 : i64, rope = #moe.rope<theta = 1.000000e+04, dim = 128, style = half, yarn = <factor = 4.000000e+01, original_max_position = 4096, beta_fast = 3.200000e+01, beta_slow = 1.000000e+00, mscale = 1.000000e+00, mscale_all_dim = 7.070000e-01>>} : (tensor<?x4096xbf16>, tensor<?xi64>) -> tensor<?x4096xbf16>
func.func @rope_yarn(%x: tensor<?x4096xbf16>, %pos: tensor<?xi64>) -> tensor<?x4096xbf16> {
  %y = moe.rope %x, %pos {head_dim = 128 : i64, rope = #moe.rope<theta = 1.0e4, dim = 128, style = half, yarn = #moe.yarn<factor = 40.0, original_max_position = 4096, beta_fast = 32.0, beta_slow = 1.0, mscale = 1.0, mscale_all_dim = 0.707>>} : (tensor<?x4096xbf16>, tensor<?xi64>) -> tensor<?x4096xbf16>
  return %y : tensor<?x4096xbf16>
}

// -----

// Tests that grouped-query attention (Qwen3-30B-A3B: 32 query heads over 4 kv heads of 128) round-trips without optional parts.
// CHECK-LABEL: func.func @attention_gqa(
// CHECK-SAME: %[[Q:.*]]: tensor<?x4096xbf16>, %[[K:.*]]: tensor<?x512xbf16>, %[[V:.*]]: tensor<?x512xbf16>)
// CHECK: %[[O:.*]] = moe.attention %[[Q]], %[[K]], %[[V]] {head_dim = 128 : i64, num_heads = 32 : i64, num_kv_heads = 4 : i64, scale = 0.088388347648318433 : f64} : (tensor<?x4096xbf16>, tensor<?x512xbf16>, tensor<?x512xbf16>) -> tensor<?x4096xbf16>
// CHECK-NOT: sinks
// CHECK-NOT: sliding_window
// CHECK: return %[[O]]
func.func @attention_gqa(%q: tensor<?x4096xbf16>, %k: tensor<?x512xbf16>, %v: tensor<?x512xbf16>) -> tensor<?x4096xbf16> {
  %o = moe.attention %q, %k, %v {num_heads = 32 : i64, num_kv_heads = 4 : i64, head_dim = 128 : i64, scale = 0.088388347648318433 : f64} : (tensor<?x4096xbf16>, tensor<?x512xbf16>, tensor<?x512xbf16>) -> tensor<?x4096xbf16>
  return %o : tensor<?x4096xbf16>
}

// -----

// Tests that attention with its softmax statistics (the training step's form) round-trips.
// CHECK-LABEL: func.func @attention_logsumexp(
// CHECK: %[[O:.*]], %[[LSE:.*]] = moe.attention %{{.*}}, %{{.*}}, %{{.*}} {head_dim = 128 : i64, num_heads = 32 : i64, num_kv_heads = 4 : i64, scale = 0.088388347648318433 : f64} : (tensor<?x4096xbf16>, tensor<?x512xbf16>, tensor<?x512xbf16>) -> (tensor<?x4096xbf16>, tensor<?x32xf32>)
// CHECK: return %[[O]], %[[LSE]]
func.func @attention_logsumexp(%q: tensor<?x4096xbf16>, %k: tensor<?x512xbf16>, %v: tensor<?x512xbf16>) -> (tensor<?x4096xbf16>, tensor<?x32xf32>) {
  %o, %lse = moe.attention %q, %k, %v {num_heads = 32 : i64, num_kv_heads = 4 : i64, head_dim = 128 : i64, scale = 0.088388347648318433 : f64} : (tensor<?x4096xbf16>, tensor<?x512xbf16>, tensor<?x512xbf16>) -> (tensor<?x4096xbf16>, tensor<?x32xf32>)
  return %o, %lse : tensor<?x4096xbf16>, tensor<?x32xf32>
}

// -----

// Tests that gpt-oss attention (64 heads over 8 kv heads of 64, 128-token window, one sink per head) keeps sinks and window.
// CHECK-LABEL: func.func @attention_window_sinks(
// CHECK-SAME: %[[Q:.*]]: tensor<?x4096xbf16>, %[[K:.*]]: tensor<?x512xbf16>, %[[V:.*]]: tensor<?x512xbf16>, %[[S:.*]]: tensor<64xbf16>)
// CHECK: moe.attention %[[Q]], %[[K]], %[[V]] sinks %[[S]] {head_dim = 64 : i64, num_heads = 64 : i64, num_kv_heads = 8 : i64, scale = 1.250000e-01 : f64, sliding_window = 128 : i64} : (tensor<?x4096xbf16>, tensor<?x512xbf16>, tensor<?x512xbf16>, tensor<64xbf16>) -> tensor<?x4096xbf16>
func.func @attention_window_sinks(%q: tensor<?x4096xbf16>, %k: tensor<?x512xbf16>, %v: tensor<?x512xbf16>, %s: tensor<64xbf16>) -> tensor<?x4096xbf16> {
  %o = moe.attention %q, %k, %v sinks %s {num_heads = 64 : i64, num_kv_heads = 8 : i64, head_dim = 64 : i64, scale = 0.125 : f64, sliding_window = 128 : i64} : (tensor<?x4096xbf16>, tensor<?x512xbf16>, tensor<?x512xbf16>, tensor<64xbf16>) -> tensor<?x4096xbf16>
  return %o : tensor<?x4096xbf16>
}

// -----

// Tests that attention with a value head dim different from the query head dim round-trips.
// CHECK-LABEL: func.func @attention_value_dim(
// CHECK-SAME: %[[Q:.*]]: tensor<?x3072xbf16>, %[[K:.*]]: tensor<?x3072xbf16>, %[[V:.*]]: tensor<?x2048xbf16>)
// CHECK: moe.attention %[[Q]], %[[K]], %[[V]] {head_dim = 192 : i64, num_heads = 16 : i64, num_kv_heads = 16 : i64, scale = 7.812500e-02 : f64} : (tensor<?x3072xbf16>, tensor<?x3072xbf16>, tensor<?x2048xbf16>) -> tensor<?x2048xbf16>
func.func @attention_value_dim(%q: tensor<?x3072xbf16>, %k: tensor<?x3072xbf16>, %v: tensor<?x2048xbf16>) -> tensor<?x2048xbf16> {
  %o = moe.attention %q, %k, %v {num_heads = 16 : i64, num_kv_heads = 16 : i64, head_dim = 192 : i64, scale = 0.078125 : f64} : (tensor<?x3072xbf16>, tensor<?x3072xbf16>, tensor<?x2048xbf16>) -> tensor<?x2048xbf16>
  return %o : tensor<?x2048xbf16>
}

// -----

// Tests that MLA with interleaved YaRN RoPE (DeepSeek-V2-Lite: 16 heads, nope 128, rope 64, v 128) round-trips.
// CHECK-LABEL: func.func @mla(
// CHECK-SAME: %[[Q:.*]]: tensor<?x3072xbf16>, %[[KPE:.*]]: tensor<?x64xbf16>, %[[KV:.*]]: tensor<?x4096xbf16>, %[[POS:.*]]: tensor<?xi64>)
// CHECK: %[[O:.*]] = moe.mla %[[Q]], %[[KPE]], %[[KV]], %[[POS]] {num_heads = 16 : i64, qk_nope_head_dim = 128 : i64, qk_rope_head_dim = 64 : i64, rope = #moe.rope<theta = 1.000000e+04, dim = 64, style = interleaved, yarn = <factor = 4.000000e+01, original_max_position = 4096, beta_fast = 3.200000e+01, beta_slow = 1.000000e+00, mscale = 1.000000e+00, mscale_all_dim = 1.000000e+00>>, scale = 1.250000e-01 : f64, v_head_dim = 128 : i64} : (tensor<?x3072xbf16>, tensor<?x64xbf16>, tensor<?x4096xbf16>, tensor<?xi64>) -> tensor<?x2048xbf16>
// CHECK: return %[[O]]
func.func @mla(%q: tensor<?x3072xbf16>, %kpe: tensor<?x64xbf16>, %kv: tensor<?x4096xbf16>, %pos: tensor<?xi64>) -> tensor<?x2048xbf16> {
  %o = moe.mla %q, %kpe, %kv, %pos {num_heads = 16 : i64, qk_nope_head_dim = 128 : i64, qk_rope_head_dim = 64 : i64, v_head_dim = 128 : i64, scale = 0.125 : f64, rope = #moe.rope<theta = 1.0e4, dim = 64, style = interleaved, yarn = #moe.yarn<factor = 40.0, original_max_position = 4096, beta_fast = 32.0, beta_slow = 1.0, mscale = 1.0, mscale_all_dim = 1.0>>} : (tensor<?x3072xbf16>, tensor<?x64xbf16>, tensor<?x4096xbf16>, tensor<?xi64>) -> tensor<?x2048xbf16>
  return %o : tensor<?x2048xbf16>
}

// -----

// Tests that NoPE MLA (Kimi-Linear: 32 heads, no rope attribute) prints no rope.
// CHECK-LABEL: func.func @mla_nope(
// CHECK-SAME: %[[Q:.*]]: tensor<?x6144xbf16>, %[[KPE:.*]]: tensor<?x64xbf16>, %[[KV:.*]]: tensor<?x8192xbf16>, %[[POS:.*]]: tensor<?xi64>)
// CHECK: moe.mla %[[Q]], %[[KPE]], %[[KV]], %[[POS]] {num_heads = 32 : i64, qk_nope_head_dim = 128 : i64, qk_rope_head_dim = 64 : i64, scale = 7.812500e-02 : f64, v_head_dim = 128 : i64} : (tensor<?x6144xbf16>, tensor<?x64xbf16>, tensor<?x8192xbf16>, tensor<?xi64>) -> tensor<?x4096xbf16>
// CHECK-NOT: #moe.rope
func.func @mla_nope(%q: tensor<?x6144xbf16>, %kpe: tensor<?x64xbf16>, %kv: tensor<?x8192xbf16>, %pos: tensor<?xi64>) -> tensor<?x4096xbf16> {
  %o = moe.mla %q, %kpe, %kv, %pos {num_heads = 32 : i64, qk_nope_head_dim = 128 : i64, qk_rope_head_dim = 64 : i64, v_head_dim = 128 : i64, scale = 0.078125 : f64} : (tensor<?x6144xbf16>, tensor<?x64xbf16>, tensor<?x8192xbf16>, tensor<?xi64>) -> tensor<?x4096xbf16>
  return %o : tensor<?x4096xbf16>
}

// -----

// Tests that DeepSeek Sparse Attention (indexer then sparse MLA, DeepSeek-V3.2: 64 indexer heads of 128, top 2048) round-trips.
// CHECK-LABEL: func.func @dsa(
// CHECK-SAME: %[[IQ:.*]]: tensor<?x8192xbf16>, %[[IK:.*]]: tensor<?x128xbf16>, %[[HW:.*]]: tensor<?x64xbf16>, %[[Q:.*]]: tensor<?x24576xbf16>, %[[KPE:.*]]: tensor<?x64xbf16>, %[[KV:.*]]: tensor<?x32768xbf16>, %[[POS:.*]]: tensor<?xi64>)
// CHECK: %[[IDX:.*]] = moe.dsa_indexer %[[IQ]], %[[IK]], %[[HW]], %[[POS]] {head_dim = 128 : i64, num_heads = 64 : i64, rope = #moe.rope<theta = 1.000000e+04, dim = 64, style = half>, topk = 2048 : i64} : (tensor<?x8192xbf16>, tensor<?x128xbf16>, tensor<?x64xbf16>, tensor<?xi64>) -> tensor<?x2048xi32>
// CHECK: %[[O:.*]] = moe.sparse_attention %[[Q]], %[[KPE]], %[[KV]], %[[POS]], %[[IDX]] {num_heads = 128 : i64, qk_nope_head_dim = 128 : i64, qk_rope_head_dim = 64 : i64, rope = #moe.rope<theta = 1.000000e+04, dim = 64, style = interleaved>, scale = 7.812500e-02 : f64, v_head_dim = 128 : i64} : (tensor<?x24576xbf16>, tensor<?x64xbf16>, tensor<?x32768xbf16>, tensor<?xi64>, tensor<?x2048xi32>) -> tensor<?x16384xbf16>
// CHECK: return %[[O]]
func.func @dsa(%iq: tensor<?x8192xbf16>, %ik: tensor<?x128xbf16>, %hw: tensor<?x64xbf16>, %q: tensor<?x24576xbf16>, %kpe: tensor<?x64xbf16>, %kv: tensor<?x32768xbf16>, %pos: tensor<?xi64>) -> tensor<?x16384xbf16> {
  %idx = moe.dsa_indexer %iq, %ik, %hw, %pos {num_heads = 64 : i64, head_dim = 128 : i64, topk = 2048 : i64, rope = #moe.rope<theta = 1.0e4, dim = 64, style = half>} : (tensor<?x8192xbf16>, tensor<?x128xbf16>, tensor<?x64xbf16>, tensor<?xi64>) -> tensor<?x2048xi32>
  %o = moe.sparse_attention %q, %kpe, %kv, %pos, %idx {num_heads = 128 : i64, qk_nope_head_dim = 128 : i64, qk_rope_head_dim = 64 : i64, v_head_dim = 128 : i64, scale = 0.078125 : f64, rope = #moe.rope<theta = 1.0e4, dim = 64, style = interleaved>} : (tensor<?x24576xbf16>, tensor<?x64xbf16>, tensor<?x32768xbf16>, tensor<?xi64>, tensor<?x2048xi32>) -> tensor<?x16384xbf16>
  return %o : tensor<?x16384xbf16>
}
