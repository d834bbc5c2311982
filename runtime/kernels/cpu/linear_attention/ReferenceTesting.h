//===- ReferenceTesting.h - naive double references for the tests -*- C++ -*-===//
//
// Straight from the formulas (transformers' torch_recurrent_gated_delta_rule
// and torch_recurrent_kda, F.conv1d with padding K-1), one sequence and one
// head at a time, in double; written apart from the kernels on purpose.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CPU_LINEAR_ATTENTION_REFERENCETESTING_H_
#define RUNTIME_KERNELS_CPU_LINEAR_ATTENTION_REFERENCETESTING_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "runtime/kernels/testing/KernelTesting.h"

namespace moec::runtime::testing::reference {

using Vec = std::vector<double>;
using Mat = std::vector<Vec>;

inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline double silu(double x) { return x / (1.0 + std::exp(-x)); }
inline double softplus(double x) { return x > 20 ? x : std::log(1.0 + std::exp(x)); }

inline Vec doubles(const OwnedTensor &t) {
  std::vector<float> f = t.floats();
  return Vec(f.begin(), f.end());
}

inline OwnedTensor tensor(std::vector<int64_t> shape, const Vec &values) {
  return floatTensor(std::move(shape), std::vector<float>(values.begin(), values.end()));
}

/// Rows [first, first + count) of a row-major [*, width] array.
inline Mat rows(const Vec &flat, int64_t width, int64_t first, int64_t count) {
  Mat out;
  for (int64_t t = first; t < first + count; ++t)
    out.emplace_back(flat.begin() + t * width, flat.begin() + (t + 1) * width);
  return out;
}

/// Columns [first, first + count) of every row.
inline Mat columns(const Mat &m, int64_t first, int64_t count) {
  Mat out;
  for (const Vec &row : m)
    out.emplace_back(row.begin() + first, row.begin() + first + count);
  return out;
}

/// F.conv1d(x^T, w, padding=K-1, groups=C)[..., :L] then SiLU; x: [L][C], w: [C*K] ([C,1,K]).
inline Mat convSilu(const Mat &x, const Vec &w, int64_t K) {
  int64_t L = static_cast<int64_t>(x.size()), C = static_cast<int64_t>(x[0].size());
  Mat padded(static_cast<size_t>(K - 1), Vec(static_cast<size_t>(C), 0.0));
  padded.insert(padded.end(), x.begin(), x.end());
  Mat out(static_cast<size_t>(L), Vec(static_cast<size_t>(C)));
  for (int64_t t = 0; t < L; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0;
      for (int64_t j = 0; j < K; ++j)
        acc += w[c * K + j] * padded[t + j][c];
      out[t][c] = silu(acc);
    }
  return out;
}

inline Vec l2normalize(const Vec &x, double scale) {
  double sum = 0;
  for (double v : x)
    sum += v * v;
  Vec out(x);
  for (double &v : out)
    v *= scale / std::sqrt(sum + 1e-6);
  return out;
}

/// The recurrent delta rule of one head over one sequence: q, k: [L][dk] (already
/// normalised), v: [L][dv], beta: [L], logDecay: [L][dk] (equal entries for a
/// per-head decay). Returns o: [L][dv].
inline Mat deltaRule(const Mat &q, const Mat &k, const Mat &v, const Vec &beta,
                     const Mat &logDecay) {
  size_t L = q.size(), dk = q[0].size(), dv = v[0].size();
  Mat S(dk, Vec(dv, 0.0)), out;
  for (size_t t = 0; t < L; ++t) {
    for (size_t i = 0; i < dk; ++i)
      for (double &s : S[i])
        s *= std::exp(logDecay[t][i]);
    Vec kvMem(dv, 0.0);
    for (size_t j = 0; j < dv; ++j)
      for (size_t i = 0; i < dk; ++i)
        kvMem[j] += S[i][j] * k[t][i];
    for (size_t i = 0; i < dk; ++i)
      for (size_t j = 0; j < dv; ++j)
        S[i][j] += k[t][i] * (v[t][j] - kvMem[j]) * beta[t];
    Vec o(dv, 0.0);
    for (size_t j = 0; j < dv; ++j)
      for (size_t i = 0; i < dk; ++i)
        o[j] += S[i][j] * q[t][i];
    out.push_back(o);
  }
  return out;
}

/// rmsnorm(o) * w * act(gate), act = SiLU or sigmoid.
inline Vec gatedRmsNorm(const Vec &o, const Vec &gate, const Vec &w, double eps, bool siluGate) {
  double mean = 0;
  for (double v : o)
    mean += v * v / static_cast<double>(o.size());
  Vec out(o.size());
  for (size_t j = 0; j < o.size(); ++j)
    out[j] = o[j] / std::sqrt(mean + eps) * w[j] * (siluGate ? silu(gate[j]) : sigmoid(gate[j]));
  return out;
}

inline void expectNear(const std::vector<float> &actual, const Vec &expected, double tolerance,
                       const std::string &what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  double scale = 0, worst = 0;
  size_t at = 0;
  for (double e : expected)
    scale = std::max(scale, std::abs(e));
  for (size_t i = 0; i < actual.size(); ++i)
    if (std::abs(actual[i] - expected[i]) > worst) {
      worst = std::abs(actual[i] - expected[i]);
      at = i;
    }
  EXPECT_LE(worst, tolerance * std::max(scale, 1e-3))
      << what << ": worst error " << worst << " at " << at << " (" << actual[at] << " vs "
      << expected[at] << "), largest value " << scale;
}

/// Every element of each gradient against central differences (step 1e-5, in
/// double) of L = sum(dy * f(inputs)), f being a double reference.
inline void expectGradientsMatch(const std::function<Vec(const std::vector<Vec> &)> &f,
                                 std::vector<Vec> inputs, const Vec &dy,
                                 const std::vector<int64_t> &wrt,
                                 const std::vector<std::vector<float>> &grads,
                                 const std::vector<std::string> &names) {
  auto loss = [&](const std::vector<Vec> &x) {
    Vec y = f(x);
    double sum = 0;
    for (size_t i = 0; i < y.size(); ++i)
      sum += dy[i] * y[i];
    return sum;
  };
  const double h = 1e-5;
  for (size_t w = 0; w < wrt.size(); ++w) {
    Vec &x = inputs[wrt[w]];
    Vec numeric(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      double keep = x[i];
      x[i] = keep + h;
      double plus = loss(inputs);
      x[i] = keep - h;
      double minus = loss(inputs);
      x[i] = keep;
      numeric[i] = (plus - minus) / (2 * h);
    }
    expectNear(grads[w], numeric, 1e-4, "gradient of " + names[wrt[w]]);
  }
}

} // namespace moec::runtime::testing::reference

#endif // RUNTIME_KERNELS_CPU_LINEAR_ATTENTION_REFERENCETESTING_H_
