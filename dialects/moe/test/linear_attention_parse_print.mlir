// RUN: moe-opt %s -split-input-file | moe-opt -split-input-file | FileCheck %s
// RUN: moe-opt %s -split-input-file --mlir-print-op-generic | moe-opt -split-input-file | FileCheck %s

// Tests that a Gated DeltaNet mixer (Qwen3-Next: 16 key heads, 32 value heads, both of 128) round-trips.
// CHECK-LABEL: func.func @gated_delta_net(
// CHECK-SAME: %[[QKVZ:.*]]: tensor<?x12288xbf16>, %[[BA:.*]]: tensor<?x64xbf16>, %[[CONV:.*]]: tensor<8192x1x4xbf16>, %[[ALOG:.*]]: tensor<32xf32>, %[[DT:.*]]: tensor<32xbf16>, %[[NORM:.*]]: tensor<128xf32>)
// CHECK: %[[O:.*]] = moe.gated_delta_net %[[QKVZ]], %[[BA]], %[[CONV]], %[[ALOG]], %[[DT]], %[[NORM]] {eps = 9.9999999999999995E-7 : f64, key_head_dim = 128 : i64, num_key_heads = 16 : i64, num_value_heads = 32 : i64, value_head_dim = 128 : i64} : (tensor<?x12288xbf16>, tensor<?x64xbf16>, tensor<8192x1x4xbf16>, tensor<32xf32>, tensor<32xbf16>, tensor<128xf32>) -> tensor<?x4096xbf16>
// CHECK: return %[[O]]
func.func @gated_delta_net(%qkvz: tensor<?x12288xbf16>, %ba: tensor<?x64xbf16>, %conv: tensor<8192x1x4xbf16>, %alog: tensor<32xf32>, %dt: tensor<32xbf16>, %norm: tensor<128xf32>) -> tensor<?x4096xbf16> {
  %o = moe.gated_delta_net %qkvz, %ba, %conv, %alog, %dt, %norm {num_key_heads = 16 : i64, num_value_heads = 32 : i64, key_head_dim = 128 : i64, value_head_dim = 128 : i64, eps = 1.0e-06 : f64} : (tensor<?x12288xbf16>, tensor<?x64xbf16>, tensor<8192x1x4xbf16>, tensor<32xf32>, tensor<32xbf16>, tensor<128xf32>) -> tensor<?x4096xbf16>
  return %o : tensor<?x4096xbf16>
}

// -----

// Tests that a Kimi Delta Attention mixer (Kimi-Linear: 32 heads of 128, three short convs) keeps its twelve operands in order.
// CHECK-LABEL: func.func @kda(
// CHECK-SAME: %[[Q:.*]]: tensor<?x4096xbf16>, %[[K:.*]]: tensor<?x4096xbf16>, %[[V:.*]]: tensor<?x4096xbf16>, %[[QC:.*]]: tensor<4096x1x4xbf16>, %[[KC:.*]]: tensor<4096x1x4xbf16>, %[[VC:.*]]: tensor<4096x1x4xbf16>, %[[DECAY:.*]]: tensor<?x4096xbf16>, %[[BETA:.*]]: tensor<?x32xbf16>, %[[GATE:.*]]: tensor<?x4096xbf16>, %[[ALOG:.*]]: tensor<1x1x32x1xf32>, %[[DT:.*]]: tensor<4096xf32>, %[[NORM:.*]]: tensor<128xbf16>)
// CHECK: %[[O:.*]] = moe.kda %[[Q]], %[[K]], %[[V]], %[[QC]], %[[KC]], %[[VC]], %[[DECAY]], %[[BETA]], %[[GATE]], %[[ALOG]], %[[DT]], %[[NORM]] {eps = 9.9999999999999995E-7 : f64, head_dim = 128 : i64, num_heads = 32 : i64} : (tensor<?x4096xbf16>, tensor<?x4096xbf16>, tensor<?x4096xbf16>, tensor<4096x1x4xbf16>, tensor<4096x1x4xbf16>, tensor<4096x1x4xbf16>, tensor<?x4096xbf16>, tensor<?x32xbf16>, tensor<?x4096xbf16>, tensor<1x1x32x1xf32>, tensor<4096xf32>, tensor<128xbf16>) -> tensor<?x4096xbf16>
// CHECK: return %[[O]]
func.func @kda(%q: tensor<?x4096xbf16>, %k: tensor<?x4096xbf16>, %v: tensor<?x4096xbf16>, %qc: tensor<4096x1x4xbf16>, %kc: tensor<4096x1x4xbf16>, %vc: tensor<4096x1x4xbf16>, %decay: tensor<?x4096xbf16>, %beta: tensor<?x32xbf16>, %gate: tensor<?x4096xbf16>, %alog: tensor<1x1x32x1xf32>, %dt: tensor<4096xf32>, %norm: tensor<128xbf16>) -> tensor<?x4096xbf16> {
  %o = moe.kda %q, %k, %v, %qc, %kc, %vc, %decay, %beta, %gate, %alog, %dt, %norm {num_heads = 32 : i64, head_dim = 128 : i64, eps = 1.0e-06 : f64} : (tensor<?x4096xbf16>, tensor<?x4096xbf16>, tensor<?x4096xbf16>, tensor<4096x1x4xbf16>, tensor<4096x1x4xbf16>, tensor<4096x1x4xbf16>, tensor<?x4096xbf16>, tensor<?x32xbf16>, tensor<?x4096xbf16>, tensor<1x1x32x1xf32>, tensor<4096xf32>, tensor<128xbf16>) -> tensor<?x4096xbf16>
  return %o : tensor<?x4096xbf16>
}

// -----

// Tests that a Mamba-2 mixer with a conv bias (Nemotron-H: 128 heads of 64, state 128, 8 groups) prints conv_bias.
// CHECK-LABEL: func.func @mamba2_conv_bias(
// CHECK-SAME: %[[ZX:.*]]: tensor<?x18560xbf16>, %[[CONV:.*]]: tensor<10240x1x4xbf16>, %[[CB:.*]]: tensor<10240xbf16>, %[[DT:.*]]: tensor<128xf32>, %[[ALOG:.*]]: tensor<128xf32>, %[[D:.*]]: tensor<128xf32>, %[[NORM:.*]]: tensor<8192xbf16>)
// CHECK: %[[O:.*]] = moe.mamba2 %[[ZX]], %[[CONV]] conv_bias %[[CB]], %[[DT]], %[[ALOG]], %[[D]], %[[NORM]] {chunk_size = 128 : i64, eps = 1.000000e-05 : f64, head_dim = 64 : i64, num_groups = 8 : i64, num_heads = 128 : i64, state_size = 128 : i64} : (tensor<?x18560xbf16>, tensor<10240x1x4xbf16>, tensor<10240xbf16>, tensor<128xf32>, tensor<128xf32>, tensor<128xf32>, tensor<8192xbf16>) -> tensor<?x8192xbf16>
// CHECK: return %[[O]]
func.func @mamba2_conv_bias(%zx: tensor<?x18560xbf16>, %conv: tensor<10240x1x4xbf16>, %cb: tensor<10240xbf16>, %dt: tensor<128xf32>, %alog: tensor<128xf32>, %d: tensor<128xf32>, %norm: tensor<8192xbf16>) -> tensor<?x8192xbf16> {
  %o = moe.mamba2 %zx, %conv conv_bias %cb, %dt, %alog, %d, %norm {num_heads = 128 : i64, head_dim = 64 : i64, state_size = 128 : i64, num_groups = 8 : i64, chunk_size = 128 : i64, eps = 1.0e-05 : f64} : (tensor<?x18560xbf16>, tensor<10240x1x4xbf16>, tensor<10240xbf16>, tensor<128xf32>, tensor<128xf32>, tensor<128xf32>, tensor<8192xbf16>) -> tensor<?x8192xbf16>
  return %o : tensor<?x8192xbf16>
}

// -----

// Tests that a Mamba-2 mixer without conv bias (one group) prints no conv_bias.
// CHECK-LABEL: func.func @mamba2_no_bias(
// CHECK-SAME: %[[ZX:.*]]: tensor<?x8512xbf16>, %[[CONV:.*]]: tensor<4352x1x4xbf16>, %[[DT:.*]]: tensor<64xf32>, %[[ALOG:.*]]: tensor<64xf32>, %[[D:.*]]: tensor<64xf32>, %[[NORM:.*]]: tensor<4096xbf16>)
// CHECK: moe.mamba2 %[[ZX]], %[[CONV]], %[[DT]], %[[ALOG]], %[[D]], %[[NORM]] {chunk_size = 256 : i64, eps = 1.000000e-05 : f64, head_dim = 64 : i64, num_groups = 1 : i64, num_heads = 64 : i64, state_size = 128 : i64} : (tensor<?x8512xbf16>, tensor<4352x1x4xbf16>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<4096xbf16>) -> tensor<?x4096xbf16>
// CHECK-NOT: conv_bias
func.func @mamba2_no_bias(%zx: tensor<?x8512xbf16>, %conv: tensor<4352x1x4xbf16>, %dt: tensor<64xf32>, %alog: tensor<64xf32>, %d: tensor<64xf32>, %norm: tensor<4096xbf16>) -> tensor<?x4096xbf16> {
  %o = moe.mamba2 %zx, %conv, %dt, %alog, %d, %norm {num_heads = 64 : i64, head_dim = 64 : i64, state_size = 128 : i64, num_groups = 1 : i64, chunk_size = 256 : i64, eps = 1.0e-05 : f64} : (tensor<?x8512xbf16>, tensor<4352x1x4xbf16>, tensor<64xf32>, tensor<64xf32>, tensor<64xf32>, tensor<4096xbf16>) -> tensor<?x4096xbf16>
  return %o : tensor<?x4096xbf16>
}
