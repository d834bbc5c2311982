//===- Reference.h - naive double-precision attention math for the tests -*- C++ -*-===//
//
// Written straight from the formulas (transformers' modeling_rope_utils,
// rotate_half, DeepSeek's complex rotation, softmax attention), sharing no
// code with the kernels.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CPU_ATTENTION_REFERENCE_H_
#define RUNTIME_KERNELS_CPU_ATTENTION_REFERENCE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "runtime/kernels/testing/KernelTesting.h"

namespace moec::runtime::cpu::attention::reference {

using Vec = std::vector<double>;
using Mat = std::vector<Vec>;

struct Rope {
  double theta = 10000;
  int64_t dim = 0;
  bool interleaved = false;
  bool yarn = false;
  double factor = 1, betaFast = 32, betaSlow = 1, mscale = 1, mscaleAllDim = 0;
  int64_t originalMax = 0;
  bool truncate = true;
};

inline Vec inverseFrequencies(const Rope &r) {
  int64_t half = r.dim / 2;
  Vec inv(half);
  double low = 0, high = 0;
  if (r.yarn) {
    // The dimension whose wavelength fits `rotations` times in the original context.
    auto dimFor = [&](double rotations) {
      return r.dim * std::log(r.originalMax / (rotations * 2 * M_PI)) / (2 * std::log(r.theta));
    };
    low = r.truncate ? std::floor(dimFor(r.betaFast)) : dimFor(r.betaFast);
    high = r.truncate ? std::ceil(dimFor(r.betaSlow)) : dimFor(r.betaSlow);
    low = std::max(0.0, low);
    high = std::min(double(r.dim - 1), high);
    if (high == low)
      high += 0.001;
  }
  for (int64_t i = 0; i < half; ++i) {
    double base = std::pow(r.theta, 2.0 * i / r.dim);
    if (!r.yarn) {
      inv[i] = 1 / base;
      continue;
    }
    double ramp = std::min(1.0, std::max(0.0, (i - low) / (high - low)));
    // ramp 0: keep the original frequency; ramp 1: divide it by the factor.
    inv[i] = (1 - ramp) / base + ramp / (r.factor * base);
  }
  return inv;
}

inline double attentionFactor(const Rope &r) {
  if (!r.yarn)
    return 1;
  auto m = [&](double scale) { return r.factor <= 1 ? 1.0 : 0.1 * scale * std::log(r.factor) + 1; };
  return r.mscale != 0 && r.mscaleAllDim != 0 ? m(r.mscale) / m(r.mscaleAllDim) : m(1);
}

/// transformers: x·cos + rotate_half(x)·sin on the first r.dim features, with
/// cos/sin = cat(freqs, freqs) scaled by the attention factor; interleaved
/// (DeepSeek rope_interleave) first reorders x to [x0, x2, ..., x1, x3, ...].
inline Vec rope(const Rope &r, const Vec &x, double position) {
  int64_t d = r.dim, half = d / 2;
  Vec in(x.begin(), x.begin() + d);
  if (r.interleaved)
    for (int64_t i = 0; i < half; ++i) {
      in[i] = x[2 * i];
      in[half + i] = x[2 * i + 1];
    }
  Vec inv = inverseFrequencies(r), out = x;
  double a = attentionFactor(r);
  for (int64_t j = 0; j < d; ++j) {
    double angle = inv[j % half] * position;
    double rotated = j < half ? -in[j + half] : in[j - half];
    out[j] = a * (in[j] * std::cos(angle) + rotated * std::sin(angle));
  }
  return out;
}

/// DeepSeek's own rotation: adjacent pairs (x[2i], x[2i+1]) as complex
/// numbers times e^{iθ_i p}, in place.
inline Vec complexRope(const Rope &r, const Vec &x, double position) {
  Vec inv = inverseFrequencies(r), out = x;
  double a = attentionFactor(r);
  for (int64_t i = 0; i < r.dim / 2; ++i) {
    double c = std::cos(inv[i] * position), s = std::sin(inv[i] * position);
    out[2 * i] = a * (x[2 * i] * c - x[2 * i + 1] * s);
    out[2 * i + 1] = a * (x[2 * i] * s + x[2 * i + 1] * c);
  }
  return out;
}

using Allowed = std::function<bool(int64_t t, int64_t s)>;

inline double dot(const Vec &a, const Vec &b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i)
    sum += a[i] * b[i];
  return sum;
}

/// Softmax weights of row t (the sink's share left out); empty row -> zeros.
inline Vec weights(const Mat &q, const Mat &k, double scale, const Allowed &allowed,
                   const double *sink, int64_t t) {
  int64_t n = static_cast<int64_t>(k.size());
  Vec p(n, 0.0);
  double denominator = sink ? std::exp(*sink) : 0.0;
  for (int64_t s = 0; s < n; ++s)
    if (allowed(t, s)) {
      p[s] = std::exp(scale * dot(q[t], k[s]));
      denominator += p[s];
    }
  for (double &v : p)
    v = denominator > 0 ? v / denominator : 0;
  return p;
}

/// One head over one sequence: out[t] = Σ_s p[t][s] v[s].
inline Mat attend(const Mat &q, const Mat &k, const Mat &v, double scale, const Allowed &allowed,
                  const double *sink = nullptr) {
  Mat out(q.size(), Vec(v[0].size(), 0.0));
  for (size_t t = 0; t < q.size(); ++t) {
    Vec p = weights(q, k, scale, allowed, sink, t);
    for (size_t s = 0; s < k.size(); ++s)
      for (size_t j = 0; j < v[s].size(); ++j)
        out[t][j] += p[s] * v[s][j];
  }
  return out;
}

struct AttendGrads {
  Mat dq, dk, dv;
  double dsink = 0;
};

/// The gradients of Σ dOut·attend(...) by the chain rule through the softmax.
inline AttendGrads attendBackward(const Mat &q, const Mat &k, const Mat &v, double scale,
                                  const Allowed &allowed, const double *sink, const Mat &dOut) {
  AttendGrads g;
  g.dq.assign(q.size(), Vec(q[0].size(), 0.0));
  g.dk.assign(k.size(), Vec(k[0].size(), 0.0));
  g.dv.assign(v.size(), Vec(v[0].size(), 0.0));
  for (size_t t = 0; t < q.size(); ++t) {
    Vec p = weights(q, k, scale, allowed, sink, t);
    Vec dp(k.size());
    double mean = 0; // Σ_s p_s dp_s; the sink's dp is 0 (it has no value)
    for (size_t s = 0; s < k.size(); ++s) {
      dp[s] = dot(dOut[t], v[s]);
      mean += p[s] * dp[s];
    }
    if (sink) {
      double total = 0;
      for (double w : p)
        total += w;
      g.dsink += (1 - total) * (0 - mean);
    }
    for (size_t s = 0; s < k.size(); ++s) {
      double dz = p[s] * (dp[s] - mean) * scale;
      for (size_t j = 0; j < q[t].size(); ++j) {
        g.dq[t][j] += dz * k[s][j];
        g.dk[s][j] += dz * q[t][j];
      }
      for (size_t j = 0; j < v[s].size(); ++j)
        g.dv[s][j] += p[s] * dOut[t][j];
    }
  }
  return g;
}

/// Rows [row0, row0+rows) and columns [col0, col0+cols) of a row-major [*, width] array.
inline Mat slice(const std::vector<float> &data, int64_t width, int64_t row0, int64_t rows,
                 int64_t col0, int64_t cols) {
  Mat m(rows, Vec(cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      m[r][c] = data[(row0 + r) * width + col0 + c];
  return m;
}

/// Largest |a - b| over matching entries of `got` (row-major [*, width]) and `want`.
inline double maxError(const std::vector<float> &got, int64_t width, int64_t row0, int64_t col0,
                       const Mat &want) {
  double worst = 0;
  for (size_t r = 0; r < want.size(); ++r)
    for (size_t c = 0; c < want[r].size(); ++c)
      worst = std::max(worst, std::abs(got[(row0 + r) * width + col0 + c] - want[r][c]));
  return worst;
}

/// The `.backward` launch of `forward` (set up with inputs, outputs and
/// attributes) for the gradients of operands `wrt`, given the result's gradient.
inline testing::KernelCall backwardOf(const KernelRegistry &registry, testing::KernelCall &forward,
                                      const std::vector<int64_t> &wrt,
                                      testing::OwnedTensor gradOut) {
  testing::KernelCall backward(registry, forward.kernelName() + ".backward");
  backward.attributes() = forward.attributes();
  int64_t operands = static_cast<int64_t>(forward.inputsRef().size());
  for (testing::OwnedTensor &t : forward.inputsRef())
    backward.input(t);
  backward.input(std::move(gradOut))
      .attr("grad_of_inputs", wrt)
      .attr("grad_of_outputs", std::vector<int64_t>{0})
      .attr("backward_segments", std::vector<int64_t>{operands, 0, 1})
      .sequences(forward.seqLen(), forward.microBatch());
  for (int64_t i : wrt)
    backward.output(plan::F32, forward.inputsRef().at(i).shape);
  return backward;
}

} // namespace moec::runtime::cpu::attention::reference

#endif // RUNTIME_KERNELS_CPU_ATTENTION_REFERENCE_H_
