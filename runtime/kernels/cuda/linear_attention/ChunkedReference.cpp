//===- ChunkedReference.cpp - the chunked delta rule on the host (tests only) ===//
//
// Arithmetic follows the CUDA kernels: products and the state in Real
// (cuBLAS accumulates in f32), decay factors from the double gam, the
// per-row scalars summed in double.
//
//===----------------------------------------------------------------------===//

#include "runtime/kernels/cuda/linear_attention/ChunkedReference.h"

#include <cmath>
#include <limits>

namespace moec::runtime::cuda::linattn::chunked {

template <typename Real> template <typename T> T *HostOps<Real>::alloc(int64_t n) {
  buffers.emplace_back(new char[static_cast<size_t>(n > 0 ? n : 1) * sizeof(T)]);
  T *p = reinterpret_cast<T *>(buffers.back().get());
  for (int64_t i = 0; i < n; ++i)
    p[i] = std::numeric_limits<T>::quiet_NaN();
  return p;
}

template <typename Real>
void HostOps<Real>::packRows(const Dims &d, const Real *src, int64_t ld, int64_t off, int64_t headDiv,
                             int64_t width, Real *dst) {
  for (int64_t row = 0; row < d.rows(); ++row) {
    int64_t h = 0, t = d.tokenOf(row, &h);
    for (int64_t j = 0; j < width; ++j)
      dst[row * width + j] = t < 0 ? Real(0) : src[t * ld + off + (h / headDiv) * width + j];
  }
}

template <typename Real> void HostOps<Real>::packDecay(const Dims &d, const Real *g, double *gam) {
  for (int64_t c = 0; c < d.blocks(); ++c) {
    double sum = 0;
    for (int64_t i = 0; i < d.chunk; ++i) {
      int64_t row = c * d.chunk + i, h = 0, t = d.tokenOf(row, &h);
      if (t >= 0)
        sum += static_cast<double>(g[t * d.heads + h]);
      gam[row] = sum;
    }
  }
}

template <typename Real>
void HostOps<Real>::unpackRows(const Dims &d, const Real *src, int64_t width, Real *dst, int64_t ld,
                               int64_t off) {
  for (int64_t t = 0; t < d.tokens(); ++t)
    for (int64_t h = 0; h < d.heads; ++h)
      for (int64_t j = 0; j < width; ++j)
        dst[t * ld + off + h * width + j] = src[d.rowOf(t, h) * width + j];
}

template <typename Real>
void HostOps<Real>::gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, Real alpha, const Real *a,
                         int64_t lda, int64_t strideA, const Real *b, int64_t ldb, int64_t strideB, Real beta,
                         Real *c, int64_t ldc, int64_t strideC, int64_t batch) {
  for (int64_t e = 0; e < batch; ++e) {
    const Real *A = a + e * strideA, *B = b + e * strideB;
    Real *Cm = c + e * strideC;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        Real sum = 0;
        for (int64_t l = 0; l < k; ++l)
          sum += (transA ? A[l * lda + i] : A[i * lda + l]) * (transB ? B[j * ldb + l] : B[l * ldb + j]);
        Real &out = Cm[i * ldc + j];
        out = beta == Real(0) ? alpha * sum : alpha * sum + beta * out;
      }
  }
}

template <typename Real>
void HostOps<Real>::lowerDecay(const Dims &d, const double *gam, const Real *beta, bool strict,
                               const Real *src, Real *dst) {
  const int64_t C = d.chunk;
  for (int64_t c = 0; c < d.blocks(); ++c)
    for (int64_t t = 0; t < C; ++t)
      for (int64_t s = 0; s < C; ++s) {
        int64_t at = (c * C + t) * C + s;
        bool keep = strict ? s < t : s <= t;
        double f = beta ? static_cast<double>(beta[c * C + t]) : 1.0;
        dst[at] = keep ? static_cast<Real>(static_cast<double>(src[at]) * f *
                                           std::exp(gam[c * C + t] - gam[c * C + s]))
                       : Real(0);
      }
}

// Column j of T: T_jj = 1, T_ij = -sum_{j <= l < i} A_il T_lj (rows below j), 0 above.
template <typename Real> void HostOps<Real>::invertUnitLower(const Dims &d, const Real *a, Real *t) {
  const int64_t C = d.chunk;
  for (int64_t c = 0; c < d.blocks(); ++c) {
    const Real *A = a + c * C * C;
    Real *T = t + c * C * C;
    for (int64_t j = 0; j < C; ++j)
      for (int64_t i = 0; i < C; ++i) {
        if (i <= j) {
          T[i * C + j] = i == j ? Real(1) : Real(0);
          continue;
        }
        Real sum = 0;
        for (int64_t l = j; l < i; ++l)
          sum += A[i * C + l] * T[l * C + j];
        T[i * C + j] = -sum;
      }
  }
}

namespace {

double rowFactor(const Dims &d, RowFactor factor, const double *gam, double beta, int64_t row) {
  switch (factor) {
  case RowFactor::Beta:
    return beta;
  case RowFactor::Gamma:
    return std::exp(gam[row]);
  case RowFactor::BetaGamma:
    return beta * std::exp(gam[row]);
  case RowFactor::ToEnd:
    return std::exp(gam[(row / d.chunk) * d.chunk + d.chunk - 1] - gam[row]);
  }
  return 0;
}

} // namespace

template <typename Real>
void HostOps<Real>::rowScale(const Dims &d, RowFactor factor, const double *gam, const Real *beta,
                             const Real *src, int64_t width, bool accumulate, Real *dst) {
  for (int64_t row = 0; row < d.rows(); ++row) {
    Real f = static_cast<Real>(rowFactor(d, factor, gam, static_cast<double>(beta[row]), row));
    for (int64_t j = 0; j < width; ++j) {
      Real x = f * src[row * width + j];
      dst[row * width + j] = accumulate ? dst[row * width + j] + x : x;
    }
  }
}

template <typename Real> void HostOps<Real>::sweep(const Dims &d, const SweepArgs<Real> &a) {
  const int64_t C = d.chunk, dk = d.dk, dv = d.dv, N = d.chunks();
  std::vector<Real> S(static_cast<size_t>(dk * dv)), E(static_cast<size_t>(C * dv));
  for (int64_t task = 0; task < d.tasks(); ++task) {
    std::fill(S.begin(), S.end(), Real(0));
    for (int64_t step = 0; step < N; ++step) {
      int64_t c = task * N + (a.reverse ? N - 1 - step : step);
      const Real *m1 = a.m1 + c * C * dk, *m2 = a.m2 + c * C * dk, *a0 = a.a0 + c * C * dv;
      std::copy(S.begin(), S.end(), a.states + c * dk * dv);
      for (int64_t r = 0; r < C; ++r)
        for (int64_t j = 0; j < dv; ++j) {
          Real sum = 0;
          for (int64_t i = 0; i < dk; ++i)
            sum += m1[r * dk + i] * S[i * dv + j];
          E[r * dv + j] = a0[r * dv + j] + a.s1 * sum;
        }
      std::copy(E.begin(), E.end(), a.e + c * C * dv);
      Real decay = static_cast<Real>(std::exp(a.gam[c * C + C - 1]));
      for (int64_t i = 0; i < dk; ++i)
        for (int64_t j = 0; j < dv; ++j) {
          Real sum = 0;
          for (int64_t r = 0; r < C; ++r)
            sum += m2[r * dk + i] * E[r * dv + j];
          Real y = a.y ? a.y[c * dk * dv + i * dv + j] : Real(0);
          S[i * dv + j] = decay * S[i * dv + j] + y + a.s2 * sum;
        }
    }
  }
}

template <typename Real>
void HostOps<Real>::rowScalars(const Dims &d, const ScalarArgs<Real> &a, Real *dBeta, Real *dg) {
  const int64_t C = d.chunk, dk = d.dk, dv = d.dv, kv = dk * dv;
  std::vector<double> dGam(static_cast<size_t>(C));
  auto dot = [](const Real *x, const Real *y, int64_t n) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i)
      sum += static_cast<double>(x[i]) * y[i];
    return sum;
  };
  for (int64_t c = 0; c < d.blocks(); ++c) {
    const double *gam = a.gam + c * C;
    const Real *P = a.p + c * C * C, *dP = a.dp + c * C * C, *A = a.a + c * C * C, *dA = a.da + c * C * C;
    const Real *KK = a.kk + c * C * C;
    double last = gam[C - 1], rhoSum = 0;
    for (int64_t t = 0; t < C; ++t) {
      int64_t row = c * C + t;
      double G = std::exp(gam[t]), beta = a.beta[row];
      double qdq = dot(a.q + row * dk, a.dqg + row * dk, dk);
      double kdkd = dot(a.k + row * dk, a.dkd + row * dk, dk);
      double kdkg = dot(a.k + row * dk, a.dkg + row * dk, dk);
      double vdvb = dot(a.v + row * dv, a.dvb + row * dv, dv);
      double rowZ = 0, colZ = 0, rowY = 0, colY = 0, rowB = 0;
      for (int64_t s = 0; s < C; ++s) {
        if (s <= t)
          rowZ += static_cast<double>(dP[t * C + s]) * P[t * C + s];
        if (s >= t)
          colZ += static_cast<double>(dP[s * C + t]) * P[s * C + t];
        if (s < t) {
          rowY += static_cast<double>(dA[t * C + s]) * A[t * C + s];
          rowB += static_cast<double>(dA[t * C + s]) * KK[t * C + s] * std::exp(gam[t] - gam[s]);
        }
        if (s > t)
          colY += static_cast<double>(dA[s * C + t]) * A[s * C + t];
      }
      double rho = std::exp(last - gam[t]) * kdkd;
      rhoSum += rho;
      dBeta[row] = static_cast<Real>(vdvb + G * kdkg + rowB);
      dGam[t] = G * qdq - rho + beta * G * kdkg + rowZ - colZ + rowY - colY;
    }
    dGam[C - 1] += rhoSum + std::exp(last) * dot(a.states + c * kv, a.dStates + c * kv, kv);
    double sum = 0;
    for (int64_t t = C - 1; t >= 0; --t) {
      sum += dGam[t];
      dg[c * C + t] = static_cast<Real>(sum);
    }
  }
}

template <typename Real> void hostForward(const Problem<Real> &p, Real *o) {
  HostOps<Real> ops;
  Saved<Real> s;
  forward(ops, p, o, s);
}

template <typename Real> void hostBackward(const Problem<Real> &p, const Real *dO, const Grads<Real> &g) {
  HostOps<Real> ops;
  Saved<Real> s;
  std::vector<Real> o(static_cast<size_t>(p.dims.tokens() * p.dims.heads * p.dims.dv));
  forward(ops, p, o.data(), s);
  backward(ops, p, s, dO, g);
}

template class HostOps<float>;
template class HostOps<double>;
template void hostForward<float>(const Problem<float> &, float *);
template void hostForward<double>(const Problem<double> &, double *);
template void hostBackward<float>(const Problem<float> &, const float *, const Grads<float> &);
template void hostBackward<double>(const Problem<double> &, const double *, const Grads<double> &);

} // namespace moec::runtime::cuda::linattn::chunked
