//===- ChunkedDeltaRule.h - the gated delta rule in chunks (WY / UT form) -*- C++ -*-===//
//
// The chunked (parallel over time) gated delta rule, forward and backward,
// written once as a driver over a handful of primitives. ChunkedDeltaRule.cu
// runs the driver with device primitives (CUDA kernels and batched cuBLAS f32
// products); ChunkedReference.cpp runs the same driver with plain host loops,
// so the host test (ChunkedDeltaRuleTest.cpp, no GPU) checks the whole
// algorithm, every product's shape, transposition and stride, against the CPU
// recurrent kernel. Only the primitives themselves need a GPU to be checked.
//
// Per (sequence, value head), S is [dk, dv] and S = 0 at each sequence start.
// The recurrence (cpu/linear_attention/DeltaRule.h):
//   S_t = a_t S_{t-1} + k_t u_t^T,  a_t = exp(g_t),  u_t = beta_t (v_t - a_t S_{t-1}^T k_t),
//   o_t = S_t^T q_t.
// Time is cut into chunks of C rows (C = 64 on the GPU); the last chunk of a
// sequence is padded with q = k = v = 0, beta = g = 0: such rows leave the
// state alone, and their outputs and gradients are dropped. In one chunk
// (rows t, s in [0, C), S the state before the chunk, L = C - 1 the last row):
//
//   gam_t = g_0 + ... + g_t (double: exp of differences of large sums), Gam_t = exp(gam_t)
//   KK = K K^T;  A_ts = beta_t KK_ts exp(gam_t - gam_s) for s < t, else 0
//   T = (I + A)^-1                           (unit lower triangular; forward substitution)
//   Kg = diag(beta Gam) K,  Vb = diag(beta) V,  W = T Kg,  U = T Vb
//   Kd = diag(exp(gam_L - gam)) K,  Qg = diag(Gam) Q
//   V' = U - W S                             (the u_t of every row)        } the sweep, in
//   S_next = Gam_L S + Kd^T V'                                             } chunk order
//   P = (Q K^T) o M,  M_ts = exp(gam_t - gam_s) for s <= t, else 0
//   O = Qg S + P V'
//
// Why: inside the chunk S_t = Gam_t S + sum_{s<=t} exp(gam_t - gam_s) k_s u_s^T, so
// u_t + beta_t sum_{s<t} exp(gam_t - gam_s) (k_t.k_s) u_s = beta_t v_t - beta_t Gam_t S^T k_t,
// that is (I + A) V' = Vb - Kg S, V' = U - W S; o_t = S_t^T q_t gives O; S_next = S_L.
//
// Backward. Given dO and dS_next (the gradient of the state after the chunk):
//   dV' = Kd dS_next + P^T dO,  dS = Gam_L dS_next + Qg^T dO - W^T dV'     (reverse sweep)
// then, for every chunk in parallel (S, dS_next from the sweeps):
//   dQg = dO S^T,  dP = dO V'^T,  dPm = dP o M
//   dQ  = dPm K + diag(Gam) dQg
//   dKd = V' dS_next^T
//   dW  = -dV' S^T,  dT = dV' Vb^T + dW Kg^T,  dVb = T^T dV',  dKg = T^T dW
//   dA  = -T^T dT T^T,  B_ts = beta_t dA_ts exp(gam_t - gam_s) for s < t, else 0
//   dK  = dPm^T Q + diag(exp(gam_L - gam)) dKd + diag(beta Gam) dKg + B K + B^T K
//   dV  = diag(beta) dVb
//   dbeta_t = v_t.dVb_t + Gam_t k_t.dKg_t + sum_{s<t} dA_ts KK_ts exp(gam_t - gam_s)
//   dgam_t  = Gam_t q_t.dQg_t - rho_t + beta_t Gam_t k_t.dKg_t
//             + sum_s (dP o P)_ts - sum_s (dP o P)_st + sum_s (dA o A)_ts - sum_s (dA o A)_st
//             + [t = L] (sum_s rho_s + Gam_L <S, dS_next>),   rho_t = exp(gam_L - gam_t) k_t.dKd_t
//   dg_t = sum_{u >= t} dgam_u                (gam is a cumulative sum of g)
// with P and A the masked matrices above. Each line is the chain rule through
// one forward line: S_next (dKd, dV', rho, Gam_L), O (dQg, dP, dV', dS), V'
// (dW, dS), W and U (dT, dKg, dVb), T (dA), A (B, dbeta, dA o A), and the
// decays exp(gam_t - gam_s), exp(gam_t), exp(gam_L - gam_t) (the dgam terms).
//
// Layouts (all row-major, "packed"): task = sequence * heads + head; the chunk
// blocks of a task are consecutive (block = task * chunks + n), and so are the
// C rows of a block. Row matrices are [rows, width] (rows = blocks * C), square
// ones [blocks, C, C], states [blocks, dk, dv]. q and k are packed per value
// head (value head h reads key head h / (heads / keyHeads)).
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CUDA_LINEAR_ATTENTION_CHUNKEDDELTARULE_H_
#define RUNTIME_KERNELS_CUDA_LINEAR_ATTENTION_CHUNKEDDELTARULE_H_

#include <cstdint>

#ifdef __CUDACC__
#define CHUNKED_HD __host__ __device__
#else
#define CHUNKED_HD
#endif

namespace moec::runtime::cuda::linattn::chunked {

/// Shapes of one launch.
struct Dims {
  int64_t sequences = 0, seqLen = 0, heads = 0, keyHeads = 0, dk = 0, dv = 0, chunk = 64;

  CHUNKED_HD int64_t chunks() const { return (seqLen + chunk - 1) / chunk; } // per sequence
  CHUNKED_HD int64_t tasks() const { return sequences * heads; }
  CHUNKED_HD int64_t blocks() const { return tasks() * chunks(); }
  CHUNKED_HD int64_t rows() const { return blocks() * chunk; }
  CHUNKED_HD int64_t tokens() const { return sequences * seqLen; }
  /// The token of packed row `row` (-1 for padding) and its value head.
  CHUNKED_HD int64_t tokenOf(int64_t row, int64_t *head) const {
    int64_t perTask = chunks() * chunk, task = row / perTask, pos = row % perTask;
    *head = task % heads;
    return pos < seqLen ? (task / heads) * seqLen + pos : -1;
  }
  /// The packed row of token t, value head h.
  CHUNKED_HD int64_t rowOf(int64_t t, int64_t h) const {
    return ((t / seqLen) * heads + h) * chunks() * chunk + t % seqLen;
  }
};

/// The operands of one launch, token-major as the recurrent kernels take them.
template <typename Real> struct Problem {
  Dims dims;
  const Real *q = nullptr, *k = nullptr; // [T, keyHeads * dk], normalised (q also scaled)
  const Real *v = nullptr;               // v(t, h, j) = v[t * vLd + vOff + h * dv + j]
  int64_t vLd = 0, vOff = 0;
  const Real *beta = nullptr, *g = nullptr; // [T, heads]: beta, log decay
};

/// Gradients: q, k per value head [T, heads * dk] (the caller sums the heads
/// sharing a key head), v at v[t * vLd + vOff + h * dv + j], beta and g [T, heads].
template <typename Real> struct Grads {
  Real *q = nullptr, *k = nullptr, *v = nullptr, *beta = nullptr, *g = nullptr;
  int64_t vLd = 0, vOff = 0;
};

/// What the forward keeps for the backward (packed layouts, see the header comment).
template <typename Real> struct Saved {
  Real *q = nullptr, *k = nullptr, *v = nullptr, *beta = nullptr; // rows x dk, dk, dv, 1
  double *gam = nullptr;                                          // rows
  Real *kk = nullptr, *a = nullptr, *t = nullptr, *p = nullptr;   // blocks x C x C
  Real *kg = nullptr, *vb = nullptr, *w = nullptr, *u = nullptr, *kd = nullptr, *qg = nullptr;
  Real *states = nullptr; // blocks x dk x dv: the state before each chunk
  Real *vNew = nullptr;   // rows x dv: V'
};

/// The per-row factor of rowScale, from the chunk's beta and gam.
enum class RowFactor { Beta, Gamma, BetaGamma, ToEnd }; // beta, Gam, beta Gam, exp(gam_L - gam)

/// One sequential pass over the chunks of every task, parallel over tasks
/// and value columns: with S = 0 first, for each chunk c in order (reverse:
/// last to first)
///   states[c] = S;  E = a0[c] + s1 m1[c] S;  e[c] = E;  S = exp(gam_L(c)) S + y[c] + s2 m2[c]^T E
/// a0, e: [blocks, C, dv]; m1, m2: [blocks, C, dk]; y (optional), states: [blocks, dk, dv].
template <typename Real> struct SweepArgs {
  bool reverse = false;
  const Real *a0 = nullptr, *m1 = nullptr, *m2 = nullptr, *y = nullptr;
  Real s1 = 0, s2 = 0;
  const double *gam = nullptr;
  Real *states = nullptr, *e = nullptr;
};

/// The inputs of the per-row scalars dbeta and dg (the backward's last lines).
template <typename Real> struct ScalarArgs {
  const Real *q = nullptr, *dqg = nullptr, *k = nullptr, *dkd = nullptr, *dkg = nullptr; // rows x dk
  const Real *v = nullptr, *dvb = nullptr;                                               // rows x dv
  const Real *p = nullptr, *dp = nullptr, *a = nullptr, *da = nullptr, *kk = nullptr;    // blocks x C x C
  const Real *states = nullptr, *dStates = nullptr;                                      // blocks x dk x dv
  const Real *beta = nullptr;
  const double *gam = nullptr;
};

// The primitives an `Ops` backend provides (Real is its float type):
//   template <typename T> T *alloc(int64_t n);      // uninitialised scratch
//   void packRows(const Dims &, const Real *src, int64_t ld, int64_t off, int64_t headDiv,
//                 int64_t width, Real *dst);
//       dst[row, j] = src[t * ld + off + (h / headDiv) * width + j] for the token t and head h
//       of the row, 0 on padding rows.
//   void packDecay(const Dims &, const Real *g, double *gam);   // g [T, heads] -> gam per row
//   void unpackRows(const Dims &, const Real *src, int64_t width, Real *dst, int64_t ld, int64_t off);
//       dst[t * ld + off + h * width + j] = src[row(t, h), j] for every token and head.
//   void gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, Real alpha,
//             const Real *a, int64_t lda, int64_t strideA, const Real *b, int64_t ldb,
//             int64_t strideB, Real beta, Real *c, int64_t ldc, int64_t strideC, int64_t batch);
//       row-major C = alpha op(A) op(B) + beta C per batch entry (C not read when beta = 0).
//   void lowerDecay(const Dims &, const double *gam, const Real *beta, bool strict,
//                   const Real *src, Real *dst);
//       dst_ts = beta_t (if beta) src_ts exp(gam_t - gam_s) for s < t (strict) or s <= t, else 0;
//       dst may be src.
//   void invertUnitLower(const Dims &, const Real *a, Real *t);  // t = (I + a)^-1, a strictly lower
//   void rowScale(const Dims &, RowFactor, const double *gam, const Real *beta, const Real *src,
//                 int64_t width, bool accumulate, Real *dst);    // dst (+)= factor_row * src
//   void sweep(const Dims &, const SweepArgs<Real> &);
//   void rowScalars(const Dims &, const ScalarArgs<Real> &, Real *dBeta, Real *dg); // packed rows

/// o [T, heads * dv] (every element written); fills `s` for the backward.
template <class Ops, typename Real> void forward(Ops &ops, const Problem<Real> &p, Real *o, Saved<Real> &s) {
  const Dims &d = p.dims;
  if (d.blocks() == 0)
    return;
  const int64_t C = d.chunk, nc = d.blocks(), rows = d.rows(), dk = d.dk, dv = d.dv;
  const int64_t CC = C * C, Ck = C * dk, Cv = C * dv, kv = dk * dv;

  s.q = ops.template alloc<Real>(rows * dk);
  s.k = ops.template alloc<Real>(rows * dk);
  s.v = ops.template alloc<Real>(rows * dv);
  s.beta = ops.template alloc<Real>(rows);
  s.gam = ops.template alloc<double>(rows);
  ops.packRows(d, p.q, d.keyHeads * dk, 0, d.heads / d.keyHeads, dk, s.q);
  ops.packRows(d, p.k, d.keyHeads * dk, 0, d.heads / d.keyHeads, dk, s.k);
  ops.packRows(d, p.v, p.vLd, p.vOff, 1, dv, s.v);
  ops.packRows(d, p.beta, d.heads, 0, 1, 1, s.beta);
  ops.packDecay(d, p.g, s.gam);

  // A, T = (I + A)^-1, W = T Kg, U = T Vb.
  s.kk = ops.template alloc<Real>(nc * CC);
  ops.gemm(false, true, C, C, dk, Real(1), s.k, dk, Ck, s.k, dk, Ck, Real(0), s.kk, C, CC, nc);
  s.a = ops.template alloc<Real>(nc * CC);
  ops.lowerDecay(d, s.gam, s.beta, true, s.kk, s.a);
  s.t = ops.template alloc<Real>(nc * CC);
  ops.invertUnitLower(d, s.a, s.t);
  s.kg = ops.template alloc<Real>(rows * dk);
  ops.rowScale(d, RowFactor::BetaGamma, s.gam, s.beta, s.k, dk, false, s.kg);
  s.vb = ops.template alloc<Real>(rows * dv);
  ops.rowScale(d, RowFactor::Beta, s.gam, s.beta, s.v, dv, false, s.vb);
  s.w = ops.template alloc<Real>(rows * dk);
  ops.gemm(false, false, C, dk, C, Real(1), s.t, C, CC, s.kg, dk, Ck, Real(0), s.w, dk, Ck, nc);
  s.u = ops.template alloc<Real>(rows * dv);
  ops.gemm(false, false, C, dv, C, Real(1), s.t, C, CC, s.vb, dv, Cv, Real(0), s.u, dv, Cv, nc);

  // The sweep: V' = U - W S, S = Gam_L S + Kd^T V'.
  s.kd = ops.template alloc<Real>(rows * dk);
  ops.rowScale(d, RowFactor::ToEnd, s.gam, s.beta, s.k, dk, false, s.kd);
  s.states = ops.template alloc<Real>(nc * kv);
  s.vNew = ops.template alloc<Real>(rows * dv);
  SweepArgs<Real> sweep;
  sweep.a0 = s.u;
  sweep.m1 = s.w;
  sweep.s1 = Real(-1);
  sweep.m2 = s.kd;
  sweep.s2 = Real(1);
  sweep.gam = s.gam;
  sweep.states = s.states;
  sweep.e = s.vNew;
  ops.sweep(d, sweep);

  // O = Qg S + P V'.
  s.p = ops.template alloc<Real>(nc * CC);
  ops.gemm(false, true, C, C, dk, Real(1), s.q, dk, Ck, s.k, dk, Ck, Real(0), s.p, C, CC, nc);
  ops.lowerDecay(d, s.gam, static_cast<const Real *>(nullptr), false, s.p, s.p);
  s.qg = ops.template alloc<Real>(rows * dk);
  ops.rowScale(d, RowFactor::Gamma, s.gam, s.beta, s.q, dk, false, s.qg);
  Real *op = ops.template alloc<Real>(rows * dv);
  ops.gemm(false, false, C, dv, dk, Real(1), s.qg, dk, Ck, s.states, dv, kv, Real(0), op, dv, Cv, nc);
  ops.gemm(false, false, C, dv, C, Real(1), s.p, C, CC, s.vNew, dv, Cv, Real(1), op, dv, Cv, nc);
  ops.unpackRows(d, op, dv, o, d.heads * dv, 0);
}

/// Every gradient of `g` written in full, given dO [T, heads * dv] and the forward's `s`.
template <class Ops, typename Real>
void backward(Ops &ops, const Problem<Real> &p, const Saved<Real> &s, const Real *dO, const Grads<Real> &g) {
  const Dims &d = p.dims;
  if (d.blocks() == 0)
    return;
  const int64_t C = d.chunk, nc = d.blocks(), rows = d.rows(), dk = d.dk, dv = d.dv;
  const int64_t CC = C * C, Ck = C * dk, Cv = C * dv, kv = dk * dv;
  auto rowsOf = [&](int64_t width) { return ops.template alloc<Real>(rows * width); };
  auto squares = [&] { return ops.template alloc<Real>(nc * CC); };

  Real *dOp = rowsOf(dv);
  ops.packRows(d, dO, d.heads * dv, 0, 1, dv, dOp);

  // The reverse sweep: dV' = P^T dO + Kd dS_next, dS = Gam_L dS_next + Qg^T dO - W^T dV'.
  Real *x = rowsOf(dv);
  ops.gemm(true, false, C, dv, C, Real(1), s.p, C, CC, dOp, dv, Cv, Real(0), x, dv, Cv, nc);
  Real *y = ops.template alloc<Real>(nc * kv);
  ops.gemm(true, false, dk, dv, C, Real(1), s.qg, dk, Ck, dOp, dv, Cv, Real(0), y, dv, kv, nc);
  Real *dStates = ops.template alloc<Real>(nc * kv); // dS_next of each chunk
  Real *dvNew = rowsOf(dv);
  SweepArgs<Real> sweep;
  sweep.reverse = true;
  sweep.a0 = x;
  sweep.m1 = s.kd;
  sweep.s1 = Real(1);
  sweep.m2 = s.w;
  sweep.s2 = Real(-1);
  sweep.y = y;
  sweep.gam = s.gam;
  sweep.states = dStates;
  sweep.e = dvNew;
  ops.sweep(d, sweep);

  // O = Qg S + P V': dQ, the dPm^T Q part of dK.
  Real *dqg = rowsOf(dk);
  ops.gemm(false, true, C, dk, dv, Real(1), dOp, dv, Cv, s.states, dv, kv, Real(0), dqg, dk, Ck, nc);
  Real *dp = squares();
  ops.gemm(false, true, C, C, dv, Real(1), dOp, dv, Cv, s.vNew, dv, Cv, Real(0), dp, C, CC, nc);
  Real *dpm = squares();
  ops.lowerDecay(d, s.gam, static_cast<const Real *>(nullptr), false, dp, dpm);
  Real *dq = rowsOf(dk);
  ops.gemm(false, false, C, dk, C, Real(1), dpm, C, CC, s.k, dk, Ck, Real(0), dq, dk, Ck, nc);
  ops.rowScale(d, RowFactor::Gamma, s.gam, s.beta, dqg, dk, true, dq);
  Real *dk_ = rowsOf(dk);
  ops.gemm(true, false, C, dk, C, Real(1), dpm, C, CC, s.q, dk, Ck, Real(0), dk_, dk, Ck, nc);

  // S_next = Gam_L S + Kd^T V'.
  Real *dkd = rowsOf(dk);
  ops.gemm(false, true, C, dk, dv, Real(1), s.vNew, dv, Cv, dStates, dv, kv, Real(0), dkd, dk, Ck, nc);
  ops.rowScale(d, RowFactor::ToEnd, s.gam, s.beta, dkd, dk, true, dk_);

  // V' = U - W S, W = T Kg, U = T Vb.
  Real *dw = rowsOf(dk);
  ops.gemm(false, true, C, dk, dv, Real(-1), dvNew, dv, Cv, s.states, dv, kv, Real(0), dw, dk, Ck, nc);
  Real *dt = squares();
  ops.gemm(false, true, C, C, dv, Real(1), dvNew, dv, Cv, s.vb, dv, Cv, Real(0), dt, C, CC, nc);
  ops.gemm(false, true, C, C, dk, Real(1), dw, dk, Ck, s.kg, dk, Ck, Real(1), dt, C, CC, nc);
  Real *dvb = rowsOf(dv);
  ops.gemm(true, false, C, dv, C, Real(1), s.t, C, CC, dvNew, dv, Cv, Real(0), dvb, dv, Cv, nc);
  Real *dkg = rowsOf(dk);
  ops.gemm(true, false, C, dk, C, Real(1), s.t, C, CC, dw, dk, Ck, Real(0), dkg, dk, Ck, nc);
  ops.rowScale(d, RowFactor::BetaGamma, s.gam, s.beta, dkg, dk, true, dk_);

  // T = (I + A)^-1, A from K K^T.
  Real *m = squares();
  ops.gemm(true, false, C, C, C, Real(1), s.t, C, CC, dt, C, CC, Real(0), m, C, CC, nc);
  Real *da = squares();
  ops.gemm(false, true, C, C, C, Real(-1), m, C, CC, s.t, C, CC, Real(0), da, C, CC, nc);
  Real *bm = squares();
  ops.lowerDecay(d, s.gam, s.beta, true, da, bm);
  ops.gemm(false, false, C, dk, C, Real(1), bm, C, CC, s.k, dk, Ck, Real(1), dk_, dk, Ck, nc);
  ops.gemm(true, false, C, dk, C, Real(1), bm, C, CC, s.k, dk, Ck, Real(1), dk_, dk, Ck, nc);

  Real *dvp = rowsOf(dv);
  ops.rowScale(d, RowFactor::Beta, s.gam, s.beta, dvb, dv, false, dvp);

  // dbeta and dg.
  ScalarArgs<Real> sc;
  sc.q = s.q;
  sc.dqg = dqg;
  sc.k = s.k;
  sc.dkd = dkd;
  sc.dkg = dkg;
  sc.v = s.v;
  sc.dvb = dvb;
  sc.p = s.p;
  sc.dp = dp;
  sc.a = s.a;
  sc.da = da;
  sc.kk = s.kk;
  sc.states = s.states;
  sc.dStates = dStates;
  sc.beta = s.beta;
  sc.gam = s.gam;
  Real *dBeta = rowsOf(1), *dg = rowsOf(1);
  ops.rowScalars(d, sc, dBeta, dg);

  ops.unpackRows(d, dq, dk, g.q, d.heads * dk, 0);
  ops.unpackRows(d, dk_, dk, g.k, d.heads * dk, 0);
  ops.unpackRows(d, dvp, dv, g.v, g.vLd, g.vOff);
  ops.unpackRows(d, dBeta, 1, g.beta, d.heads, 0);
  ops.unpackRows(d, dg, 1, g.g, d.heads, 0);
}

} // namespace moec::runtime::cuda::linattn::chunked

#endif // RUNTIME_KERNELS_CUDA_LINEAR_ATTENTION_CHUNKEDDELTARULE_H_
