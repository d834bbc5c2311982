// RUN: moe-opt %s -split-input-file -verify-diagnostics

// Tests that value heads must split evenly over key heads.
func.func @gdn_head_ratio(%qkvz: tensor<?x10240xbf16>, %ba: tensor<?x48xbf16>, %conv: tensor<7168x1x4xbf16>, %alog: tensor<24xf32>, %dt: tensor<24xbf16>, %norm: tensor<128xf32>) -> tensor<?x3072xbf16> {
  // expected-error @+1 {{'moe.gated_delta_net' op num_value_heads (24) must be a multiple of num_key_heads (16)}}
  %o = moe.gated_delta_net %qkvz, %ba, %conv, %alog, %dt, %norm {num_key_heads = 16 : i64, num_value_heads = 24 : i64, key_head_dim = 128 : i64, value_head_dim = 128 : i64, eps = 1.0e-06 : f64} : (tensor<?x10240xbf16>, tensor<?x48xbf16>, tensor<7168x1x4xbf16>, tensor<24xf32>, tensor<24xbf16>, tensor<128xf32>) -> tensor<?x3072xbf16>
  return %o : tensor<?x3072xbf16>
}

// -----

// Tests that the fused qkvz width must be 2*Hk*dk + 2*Hv*dv (a qkv-only projection is rejected).
func.func @gdn_qkvz_width(%qkvz: tensor<?x8192xbf16>, %ba: tensor<?x64xbf16>, %conv: tensor<8192x1x4xbf16>, %alog: tensor<32xf32>, %dt: tensor<32xbf16>, %norm: tensor<128xf32>) -> tensor<?x4096xbf16> {
  // expected-error @+1 {{'moe.gated_delta_net' op qkvz dimension 1 must be 12288 (2*Hk*dk + 2*Hv*dv), got 8192}}
  %o = moe.gated_delta_net %qkvz, %ba, %conv, %alog, %dt, %norm {num_key_heads = 16 : i64, num_value_heads = 32 : i64, key_head_dim = 128 : i64, value_head_dim = 128 : i64, eps = 1.0e-06 : f64} : (tensor<?x8192xbf16>, tensor<?x64xbf16>, tensor<8192x1x4xbf16>, tensor<32xf32>, tensor<32xbf16>, tensor<128xf32>) -> tensor<?x4096xbf16>
  return %o : tensor<?x4096xbf16>
}

// -----

// Tests that ba holds one b and one a per value head.
func.func @gdn_ba_width(%qkvz: tensor<?x12288xbf16>, %ba: tensor<?x32xbf16>, %conv: tensor<8192x1x4xbf16>, %alog: tensor<32xf32>, %dt: tensor<32xbf16>, %norm: tensor<128xf32>) -> tensor<?x4096xbf16> {
  // expected-error @+1 {{'moe.gated_delta_net' op ba dimension 1 must be 64 (2 * num_value_heads), got 32}}
  %o = moe.gated_delta_net %qkvz, %ba, %conv, %alog, %dt, %norm {num_key_heads = 16 : i64, num_value_heads = 32 : i64, key_head_dim = 128 : i64, value_head_dim = 128 : i64, eps = 1.0e-06 : f64} : (tensor<?x12288xbf16>, tensor<?x32xbf16>, tensor<8192x1x4xbf16>, tensor<32xf32>, tensor<32xbf16>, tensor<128xf32>) -> tensor<?x4096xbf16>
  return %o : tensor<?x4096xbf16>
}

// -----

// Tests that ba has the element type of qkvz.
func.func @gdn_ba_dtype(%qkvz: tensor<?x12288xbf16>, %ba: tensor<?x64xf32>, %conv: tensor<8192x1x4xbf16>, %alog: tensor<32xf32>, %dt: tensor<32xbf16>, %norm: tensor<128xf32>) -> tensor<?x4096xbf16> {
  // expected-error @+1 {{'moe.gated_delta_net' op ba element type 'f32' differs from qkvz element type 'bf16'}}
  %o = moe.gated_delta_net %qkvz, %ba, %conv, %alog, %dt, %norm {num_key_heads = 16 : i64, num_value_heads = 32 : i64, key_head_dim = 128 : i64, value_head_dim = 128 : i64, eps = 1.0e-06 : f64} : (tensor<?x12288xbf16>, tensor<?x64xf32>, tensor<8192x1x4xbf16>, tensor<32xf32>, tensor<32xbf16>, tensor<128xf32>) -> tensor<?x4096xbf16>
  return %o : tensor<?x4096xbf16>
}

// -----

// Tests that the conv covers q, k and v channels only (z is not convolved).
func.func @gdn_conv_channels(%qkvz: tensor<?x12288xbf16>, %ba: tensor<?x64xbf16>, %conv: tensor<12288x1x4xbf16>, %alog: tensor<32xf32>, %dt: tensor<32xbf16>, %norm: tensor<128xf32>) -> tensor<?x4096xbf16> {
  // expected-error @+1 {{'moe.gated_delta_net' op conv_weight dimension 0 must be 8192 (channels), got 12288}}
  %o = moe.gated_delta_net %qkvz, %ba, %conv, %alog, %dt, %norm {num_key_heads = 16 : i64, num_value_heads = 32 : i64, key_head_dim = 128 : i64, value_head_dim = 128 : i64, eps = 1.0e-06 : f64} : (tensor<?x12288xbf16>, tensor<?x64xbf16>, tensor<12288x1x4xbf16>, tensor<32xf32>, tensor<32xbf16>, tensor<128xf32>) -> tensor<?x4096xbf16>
  return %o : tensor<?x4096xbf16>
}

// -----

// Tests that the conv is depthwise ([channels, 1, kernel], not [channels, kernel, 1]).
func.func @gdn_conv_depthwise(%qkvz: tensor<?x12288xbf16>, %ba: tensor<?x64xbf16>, %conv: tensor<8192x4x1xbf16>, %alog: tensor<32xf32>, %dt: tensor<32xbf16>, %norm: tensor<128xf32>) -> tensor<?x4096xbf16> {
  // expected-error @+1 {{'moe.gated_delta_net' op conv_weight dimension 1 must be 1 (depthwise), got 4}}
  %o = moe.gated_delta_net %qkvz, %ba, %conv, %alog, %dt, %norm {num_key_heads = 16 : i64, num_value_heads = 32 : i64, key_head_dim = 128 : i64, value_head_dim = 128 : i64, eps = 1.0e-06 : f64} : (tensor<?x12288xbf16>, tensor<?x64xbf16>, tensor<8192x4x1xbf16>, tensor<32xf32>, tensor<32xbf16>, tensor<128xf32>) -> tensor<?x4096xbf16>
  return %o : tensor<?x4096xbf16>
}

// -----

// Tests that A_log has one entry per value head (not per key head).
func.func @gdn_a_log(%qkvz: tensor<?x12288xbf16>, %ba: tensor<?x64xbf16>, %conv: tensor<8192x1x4xbf16>, %alog: tensor<16xf32>, %dt: tensor<32xbf16>, %norm: tensor<128xf32>) -> tensor<?x4096xbf16> {
  // expected-error @+1 {{'moe.gated_delta_net' op a_log must have 32 elements (one per value head), got 'tensor<16xf32>'}}
  %o = moe.gated_delta_net %qkvz, %ba, %conv, %alog, %dt, %norm {num_key_heads = 16 : i64, num_value_heads = 32 : i64, key_head_dim = 128 : i64, value_head_dim = 128 : i64, eps = 1.0e-06 : f64} : (tensor<?x12288xbf16>, tensor<?x64xbf16>, tensor<8192x1x4xbf16>, tensor<16xf32>, tensor<32xbf16>, tensor<128xf32>) -> tensor<?x4096xbf16>
  return %o : tensor<?x4096xbf16>
}

// -----

// Tests that the gated norm weight is one value head wide.
func.func @gdn_norm_weight(%qkvz: tensor<?x12288xbf16>, %ba: tensor<?x64xbf16>, %conv: tensor<8192x1x4xbf16>, %alog: tensor<32xf32>, %dt: tensor<32xbf16>, %norm: tensor<4096xf32>) -> tensor<?x4096xbf16> {
  // expected-error @+1 {{'moe.gated_delta_net' op norm_weight must have 128 elements (value_head_dim), got 'tensor<4096xf32>'}}
  %o = moe.gated_delta_net %qkvz, %ba, %conv, %alog, %dt, %norm {num_key_heads = 16 : i64, num_value_heads = 32 : i64, key_head_dim = 128 : i64, value_head_dim = 128 : i64, eps = 1.0e-06 : f64} : (tensor<?x12288xbf16>, tensor<?x64xbf16>, tensor<8192x1x4xbf16>, tensor<32xf32>, tensor<32xbf16>, tensor<4096xf32>) -> tensor<?x4096xbf16>
  return %o : tensor<?x4096xbf16>
}

// -----

// Tests that the Gated DeltaNet output has every value head.
func.func @gdn_result(%qkvz: tensor<?x12288xbf16>, %ba: tensor<?x64xbf16>, %conv: tensor<8192x1x4xbf16>, %alog: tensor<32xf32>, %dt: tensor<32xbf16>, %norm: tensor<128xf32>) -> tensor<?x2048xbf16> {
  // expected-error @+1 {{'moe.gated_delta_net' op result dimension 1 must be 4096 (num_value_heads * value_head_dim), got 2048}}
  %o = moe.gated_delta_net %qkvz, %ba, %conv, %alog, %dt, %norm {num_key_heads = 16 : i64, num_value_heads = 32 : i64, key_head_dim = 128 : i64, value_head_dim = 128 : i64, eps = 1.0e-06 : f64} : (tensor<?x12288xbf16>, tensor<?x64xbf16>, tensor<8192x1x4xbf16>, tensor<32xf32>, tensor<32xbf16>, tensor<128xf32>) -> tensor<?x2048xbf16>
  return %o : tensor<?x2048xbf16>
}

// -----

// Tests that KDA needs a positive head count.
func.func @kda_heads(%q: tensor<?x4096xbf16>, %k: tensor<?x4096xbf16>, %v: tensor<?x4096xbf16>, %qc: tensor<4096x1x4xbf16>, %kc: tensor<4096x1x4xbf16>, %vc: tensor<4096x1x4xbf16>, %decay: tensor<?x4096xbf16>, %beta: tensor<?x32xbf16>, %gate: tensor<?x4096xbf16>, %alog: tensor<32xf32>, %dt: tensor<4096xf32>, %norm: tensor<128xbf16>) -> tensor<?x4096xbf16> {
  // expected-error @+1 {{'moe.kda' op num_heads must be positive, got 0}}
  %o = moe.kda %q, %k, %v, %qc, %kc, %vc, %decay, %beta, %gate, %alog, %dt, %norm {num_heads = 0 : i64, head_dim = 128 : i64, eps = 1.0e-06 : f64} : (tensor<?x4096xbf16>, tensor<?x4096xbf16>, tensor<?x4096xbf16>, tensor<4096x1x4xbf16>, tensor<4096x1x4xbf16>, tensor<4096x1x4xbf16>, tensor<?x4096xbf16>, tensor<?x32xbf16>, tensor<?x4096xbf16>, tensor<32xf32>, tensor<4096xf32>, tensor<128xbf16>) -> tensor<?x4096xbf16>
  return %o : tensor<?x4096xbf16>
}

// -----

// Tests that each KDA conv covers all query/key/value channels.
func.func @kda_key_conv(%q: tensor<?x4096xbf16>, %k: tensor<?x4096xbf16>, %v: tensor<?x4096xbf16>, %qc: tensor<4096x1x4xbf16>, %kc: tensor<2048x1x4xbf16>, %vc: tensor<4096x1x4xbf16>, %decay: tensor<?x4096xbf16>, %beta: tensor<?x32xbf16>, %gate: tensor<?x4096xbf16>, %alog: tensor<32xf32>, %dt: tensor<4096xf32>, %norm: tensor<128xbf16>) -> tensor<?x4096xbf16> {
  // expected-error @+1 {{'moe.kda' op key_conv dimension 0 must be 4096 (channels), got 2048}}
  %o = moe.kda %q, %k, %v, %qc, %kc, %vc, %decay, %beta, %gate, %alog, %dt, %norm {num_heads = 32 : i64, head_dim = 128 : i64, eps = 1.0e-06 : f64} : (tensor<?x4096xbf16>, tensor<?x4096xbf16>, tensor<?x4096xbf16>, tensor<4096x1x4xbf16>, tensor<2048x1x4xbf16>, tensor<4096x1x4xbf16>, tensor<?x4096xbf16>, tensor<?x32xbf16>, tensor<?x4096xbf16>, tensor<32xf32>, tensor<4096xf32>, tensor<128xbf16>) -> tensor<?x4096xbf16>
  return %o : tensor<?x4096xbf16>
}

// -----

// Tests that KDA's beta is one logit per head (not per channel).
func.func @kda_beta(%q: tensor<?x4096xbf16>, %k: tensor<?x4096xbf16>, %v: tensor<?x4096xbf16>, %qc: tensor<4096x1x4xbf16>, %kc: tensor<4096x1x4xbf16>, %vc: tensor<4096x1x4xbf16>, %decay: tensor<?x4096xbf16>, %beta: tensor<?x4096xbf16>, %gate: tensor<?x4096xbf16>, %alog: tensor<32xf32>, %dt: tensor<4096xf32>, %norm: tensor<128xbf16>) -> tensor<?x4096xbf16> {
  // expected-error @+1 {{'moe.kda' op beta_logits dimension 1 must be 32 (one beta per head), got 4096}}
  %o = moe.kda %q, %k, %v, %qc, %kc, %vc, %decay, %beta, %gate, %alog, %dt, %norm {num_heads = 32 : i64, head_dim = 128 : i64, eps = 1.0e-06 : f64} : (tensor<?x4096xbf16>, tensor<?x4096xbf16>, tensor<?x4096xbf16>, tensor<4096x1x4xbf16>, tensor<4096x1x4xbf16>, tensor<4096x1x4xbf16>, tensor<?x4096xbf16>, tensor<?x4096xbf16>, tensor<?x4096xbf16>, tensor<32xf32>, tensor<4096xf32>, tensor<128xbf16>) -> tensor<?x4096xbf16>
  return %o : tensor<?x4096xbf16>
}

// -----

// Tests that KDA's dt_bias is per key channel (not per head).
func.func @kda_dt_bias(%q: tensor<?x4096xbf16>, %k: tensor<?x4096xbf16>, %v: tensor<?x4096xbf16>, %qc: tensor<4096x1x4xbf16>, %kc: tensor<4096x1x4xbf16>, %vc: tensor<4096x1x4xbf16>, %decay: tensor<?x4096xbf16>, %beta: tensor<?x32xbf16>, %gate: tensor<?x4096xbf16>, %alog: tensor<32xf32>, %dt: tensor<32xf32>, %norm: tensor<128xbf16>) -> tensor<?x4096xbf16> {
  // expected-error @+1 {{'moe.kda' op dt_bias must have 4096 elements (one per key channel), got 'tensor<32xf32>'}}
  %o = moe.kda %q, %k, %v, %qc, %kc, %vc, %decay, %beta, %gate, %alog, %dt, %norm {num_heads = 32 : i64, head_dim = 128 : i64, eps = 1.0e-06 : f64} : (tensor<?x4096xbf16>, tensor<?x4096xbf16>, tensor<?x4096xbf16>, tensor<4096x1x4xbf16>, tensor<4096x1x4xbf16>, tensor<4096x1x4xbf16>, tensor<?x4096xbf16>, tensor<?x32xbf16>, tensor<?x4096xbf16>, tensor<32xf32>, tensor<32xf32>, tensor<128xbf16>) -> tensor<?x4096xbf16>
  return %o : tensor<?x4096xbf16>
}

// -----

// Tests that KDA's decay has the query's element type.
func.func @kda_decay_dtype(%q: tensor<?x4096xbf16>, %k: tensor<?x4096xbf16>, %v: tensor<?x4096xbf16>, %qc: tensor<4096x1x4xbf16>, %kc: tensor<4096x1x4xbf16>, %vc: tensor<4096x1x4xbf16>, %decay: tensor<?x4096xf32>, %beta: tensor<?x32xbf16>, %gate: tensor<?x4096xbf16>, %alog: tensor<32xf32>, %dt: tensor<4096xf32>, %norm: tensor<128xbf16>) -> tensor<?x4096xbf16> {
  // expected-error @+1 {{'moe.kda' op decay element type 'f32' differs from query element type 'bf16'}}
  %o = moe.kda %q, %k, %v, %qc, %kc, %vc, %decay, %beta, %gate, %alog, %dt, %norm {num_heads = 32 : i64, head_dim = 128 : i64, eps = 1.0e-06 : f64} : (tensor<?x4096xbf16>, tensor<?x4096xbf16>, tensor<?x4096xbf16>, tensor<4096x1x4xbf16>, tensor<4096x1x4xbf16>, tensor<4096x1x4xbf16>, tensor<?x4096xf32>, tensor<?x32xbf16>, tensor<?x4096xbf16>, tensor<32xf32>, tensor<4096xf32>, tensor<128xbf16>) -> tensor<?x4096xbf16>
  return %o : tensor<?x4096xbf16>
}

// -----

// Tests that Mamba-2 heads must split evenly over the B/C groups.
func.func @mamba2_groups(%zx: tensor<?x17536xbf16>, %conv: tensor<9344x1x4xbf16>, %dt: tensor<128xf32>, %alog: tensor<128xf32>, %d: tensor<128xf32>, %norm: tensor<8192xbf16>) -> tensor<?x8192xbf16> {
  // expected-error @+1 {{'moe.mamba2' op num_heads (128) must be a multiple of num_groups (3)}}
  %o = moe.mamba2 %zx, %conv, %dt, %alog, %d, %norm {num_heads = 128 : i64, head_dim = 64 : i64, state_size = 128 : i64, num_groups = 3 : i64, chunk_size = 128 : i64, eps = 1.0e-05 : f64} : (tensor<?x17536xbf16>, tensor<9344x1x4xbf16>, tensor<128xf32>, tensor<128xf32>, tensor<128xf32>, tensor<8192xbf16>) -> tensor<?x8192xbf16>
  return %o : tensor<?x8192xbf16>
}

// -----

// Tests that the fused in_proj output must include the dt part (2*H*p + 2*G*N + H).
func.func @mamba2_zxbcdt(%zx: tensor<?x18432xbf16>, %conv: tensor<10240x1x4xbf16>, %dt: tensor<128xf32>, %alog: tensor<128xf32>, %d: tensor<128xf32>, %norm: tensor<8192xbf16>) -> tensor<?x8192xbf16> {
  // expected-error @+1 {{'moe.mamba2' op zxbcdt dimension 1 must be 18560 (2*H*p + 2*G*N + H), got 18432}}
  %o = moe.mamba2 %zx, %conv, %dt, %alog, %d, %norm {num_heads = 128 : i64, head_dim = 64 : i64, state_size = 128 : i64, num_groups = 8 : i64, chunk_size = 128 : i64, eps = 1.0e-05 : f64} : (tensor<?x18432xbf16>, tensor<10240x1x4xbf16>, tensor<128xf32>, tensor<128xf32>, tensor<128xf32>, tensor<8192xbf16>) -> tensor<?x8192xbf16>
  return %o : tensor<?x8192xbf16>
}

// -----

// Tests that the Mamba-2 conv covers x, B and C channels.
func.func @mamba2_conv_channels(%zx: tensor<?x18560xbf16>, %conv: tensor<8192x1x4xbf16>, %dt: tensor<128xf32>, %alog: tensor<128xf32>, %d: tensor<128xf32>, %norm: tensor<8192xbf16>) -> tensor<?x8192xbf16> {
  // expected-error @+1 {{'moe.mamba2' op conv_weight dimension 0 must be 10240 (channels), got 8192}}
  %o = moe.mamba2 %zx, %conv, %dt, %alog, %d, %norm {num_heads = 128 : i64, head_dim = 64 : i64, state_size = 128 : i64, num_groups = 8 : i64, chunk_size = 128 : i64, eps = 1.0e-05 : f64} : (tensor<?x18560xbf16>, tensor<8192x1x4xbf16>, tensor<128xf32>, tensor<128xf32>, tensor<128xf32>, tensor<8192xbf16>) -> tensor<?x8192xbf16>
  return %o : tensor<?x8192xbf16>
}

// -----

// Tests that the Mamba-2 conv bias has one entry per conv channel.
func.func @mamba2_conv_bias(%zx: tensor<?x18560xbf16>, %conv: tensor<10240x1x4xbf16>, %cb: tensor<8192xbf16>, %dt: tensor<128xf32>, %alog: tensor<128xf32>, %d: tensor<128xf32>, %norm: tensor<8192xbf16>) -> tensor<?x8192xbf16> {
  // expected-error @+1 {{'moe.mamba2' op conv_bias must have 10240 elements (conv channels), got 'tensor<8192xbf16>'}}
  %o = moe.mamba2 %zx, %conv conv_bias %cb, %dt, %alog, %d, %norm {num_heads = 128 : i64, head_dim = 64 : i64, state_size = 128 : i64, num_groups = 8 : i64, chunk_size = 128 : i64, eps = 1.0e-05 : f64} : (tensor<?x18560xbf16>, tensor<10240x1x4xbf16>, tensor<8192xbf16>, tensor<128xf32>, tensor<128xf32>, tensor<128xf32>, tensor<8192xbf16>) -> tensor<?x8192xbf16>
  return %o : tensor<?x8192xbf16>
}

// -----

// Tests that the Mamba-2 skip D has one entry per head.
func.func @mamba2_d_skip(%zx: tensor<?x18560xbf16>, %conv: tensor<10240x1x4xbf16>, %dt: tensor<128xf32>, %alog: tensor<128xf32>, %d: tensor<8192xf32>, %norm: tensor<8192xbf16>) -> tensor<?x8192xbf16> {
  // expected-error @+1 {{'moe.mamba2' op d_skip must have 128 elements (one per head), got 'tensor<8192xf32>'}}
  %o = moe.mamba2 %zx, %conv, %dt, %alog, %d, %norm {num_heads = 128 : i64, head_dim = 64 : i64, state_size = 128 : i64, num_groups = 8 : i64, chunk_size = 128 : i64, eps = 1.0e-05 : f64} : (tensor<?x18560xbf16>, tensor<10240x1x4xbf16>, tensor<128xf32>, tensor<128xf32>, tensor<8192xf32>, tensor<8192xbf16>) -> tensor<?x8192xbf16>
  return %o : tensor<?x8192xbf16>
}

// -----

// Tests that the Mamba-2 scan needs a positive chunk size.
func.func @mamba2_chunk(%zx: tensor<?x18560xbf16>, %conv: tensor<10240x1x4xbf16>, %dt: tensor<128xf32>, %alog: tensor<128xf32>, %d: tensor<128xf32>, %norm: tensor<8192xbf16>) -> tensor<?x8192xbf16> {
  // expected-error @+1 {{'moe.mamba2' op chunk_size must be positive, got 0}}
  %o = moe.mamba2 %zx, %conv, %dt, %alog, %d, %norm {num_heads = 128 : i64, head_dim = 64 : i64, state_size = 128 : i64, num_groups = 8 : i64, chunk_size = 0 : i64, eps = 1.0e-05 : f64} : (tensor<?x18560xbf16>, tensor<10240x1x4xbf16>, tensor<128xf32>, tensor<128xf32>, tensor<128xf32>, tensor<8192xbf16>) -> tensor<?x8192xbf16>
  return %o : tensor<?x8192xbf16>
}

// -----

// Tests that the Mamba-2 output is num_heads * head_dim wide.
func.func @mamba2_result(%zx: tensor<?x18560xbf16>, %conv: tensor<10240x1x4xbf16>, %dt: tensor<128xf32>, %alog: tensor<128xf32>, %d: tensor<128xf32>, %norm: tensor<8192xbf16>) -> tensor<?x4096xbf16> {
  // expected-error @+1 {{'moe.mamba2' op result dimension 1 must be 8192 (num_heads * head_dim), got 4096}}
  %o = moe.mamba2 %zx, %conv, %dt, %alog, %d, %norm {num_heads = 128 : i64, head_dim = 64 : i64, state_size = 128 : i64, num_groups = 8 : i64, chunk_size = 128 : i64, eps = 1.0e-05 : f64} : (tensor<?x18560xbf16>, tensor<10240x1x4xbf16>, tensor<128xf32>, tensor<128xf32>, tensor<128xf32>, tensor<8192xbf16>) -> tensor<?x4096xbf16>
  return %o : tensor<?x4096xbf16>
}
