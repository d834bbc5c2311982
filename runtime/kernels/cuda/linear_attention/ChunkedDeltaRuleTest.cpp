//===- ChunkedDeltaRuleTest.cpp - the chunked delta rule against the recurrent one ===//
//
// Runs on the host, no GPU: ChunkedDeltaRule.h's driver with the host
// primitives of ChunkedReference.cpp, in double (the algorithm, to rounding)
// and in float (the f32 arithmetic of the CUDA path), against the CPU
// kernels' recurrent delta rule (cpu/linear_attention/DeltaRule.cpp, double):
// o and every gradient (q, k, v, beta, g), every element, on sequence lengths
// below, at and above the chunk size and not multiples of it, several
// sequences and heads, grouped key heads, odd widths, strong and weak decay,
// and v read from / written to a strided, offset layout (the conv buffer's).
//
//===----------------------------------------------------------------------===//

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/kernels/cpu/linear_attention/DeltaRule.h"
#include "runtime/kernels/cuda/linear_attention/ChunkedReference.h"

namespace moec::runtime::cuda::linattn::chunked {
namespace {

using Doubles = std::vector<double>;

struct Config {
  int64_t sequences, seqLen, heads, keyHeads, dk, dv, chunk;
  double maxDecay = 3.0; // g in (-maxDecay, 0)

  int64_t tokens() const { return sequences * seqLen; }
  std::string text() const {
    std::ostringstream out;
    out << sequences << " x " << seqLen << " tokens, heads " << heads << "/" << keyHeads << ", dk " << dk
        << ", dv " << dv << ", chunk " << chunk << ", g > -" << maxDecay;
    return out.str();
  }
};

/// Inputs as the GPU kernels see them: normalised q (scaled) and k, v inside a wider row.
struct Inputs {
  Config c;
  int64_t vLd = 0, vOff = 0;
  Doubles q, k, v, vWide, beta, g, dO;

  Inputs(const Config &config, uint64_t seed) : c(config) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> u(-1.0, 1.0), unit(0.0, 1.0);
    int64_t T = c.tokens(), KW = c.keyHeads * c.dk, VW = c.heads * c.dv;
    auto normalised = [&](double scale) {
      Doubles x(static_cast<size_t>(T * KW));
      for (double &e : x)
        e = u(rng);
      for (int64_t r = 0; r < T * c.keyHeads; ++r) {
        double sum = 0;
        for (int64_t i = 0; i < c.dk; ++i)
          sum += x[r * c.dk + i] * x[r * c.dk + i];
        for (int64_t i = 0; i < c.dk; ++i)
          x[r * c.dk + i] *= scale / std::sqrt(sum + 1e-6);
      }
      return x;
    };
    q = normalised(1.0 / std::sqrt(static_cast<double>(c.dk)));
    k = normalised(1.0);
    v.resize(static_cast<size_t>(T * VW));
    for (double &e : v)
      e = u(rng);
    vOff = 3;
    vLd = VW + 5;
    vWide.assign(static_cast<size_t>(T * vLd), 0.0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < VW; ++j)
        vWide[t * vLd + vOff + j] = v[t * VW + j];
    beta.resize(static_cast<size_t>(T * c.heads));
    g.resize(beta.size());
    for (size_t i = 0; i < beta.size(); ++i) {
      beta[i] = 1.0 / (1.0 + std::exp(-3.0 * u(rng)));
      g[i] = -c.maxDecay * unit(rng);
    }
    dO.resize(static_cast<size_t>(T * VW));
    for (double &e : dO)
      e = u(rng);
  }
};

struct Results {
  Doubles o, dq, dk, dv, dbeta, dg;
};

Results recurrent(const Inputs &in) {
  const Config &c = in.c;
  KernelContext ctx;
  ctx.kernel = "delta rule test";
  checks::linattn::Tokens tokens;
  tokens.count = c.tokens();
  tokens.seqLen = c.seqLen;
  tokens.sequences = c.sequences;
  cpu::linattn::DeltaRule rule;
  rule.heads = c.heads;
  rule.keyHeads = c.keyHeads;
  rule.keyDim = c.dk;
  rule.valueDim = c.dv;
  rule.q = in.q.data();
  rule.k = in.k.data();
  rule.v = in.v.data();
  rule.beta = in.beta.data();
  rule.logDecay = in.g.data();
  Results r;
  cpu::linattn::deltaRuleForward(ctx, tokens, rule, r.o);
  cpu::linattn::DeltaRuleGrads grads;
  cpu::linattn::deltaRuleBackward(ctx, tokens, rule, in.dO, grads);
  r.dq = grads.q;
  r.dk = grads.k;
  r.dv = grads.v;
  r.dbeta = grads.beta;
  r.dg = grads.logDecay;
  return r;
}

template <typename Real> std::vector<Real> as(const Doubles &x) {
  return std::vector<Real>(x.begin(), x.end());
}
template <typename Real> Doubles doubles(const std::vector<Real> &x) { return Doubles(x.begin(), x.end()); }

constexpr double kSentinel = 12345.0;

template <typename Real> Results chunkedRun(const Inputs &in) {
  const Config &c = in.c;
  int64_t T = c.tokens();
  std::vector<Real> q = as<Real>(in.q), k = as<Real>(in.k), v = as<Real>(in.vWide), beta = as<Real>(in.beta),
                    g = as<Real>(in.g), dO = as<Real>(in.dO);
  Problem<Real> p;
  p.dims.sequences = c.sequences;
  p.dims.seqLen = c.seqLen;
  p.dims.heads = c.heads;
  p.dims.keyHeads = c.keyHeads;
  p.dims.dk = c.dk;
  p.dims.dv = c.dv;
  p.dims.chunk = c.chunk;
  p.q = q.data();
  p.k = k.data();
  p.v = v.data();
  p.vLd = in.vLd;
  p.vOff = in.vOff;
  p.beta = beta.data();
  p.g = g.data();

  // Outputs start as NaN: an element the chunked form does not write fails the comparison.
  const Real nan = std::numeric_limits<Real>::quiet_NaN();
  std::vector<Real> o(static_cast<size_t>(T * c.heads * c.dv), nan);
  hostForward(p, o.data());
  std::vector<Real> dq(static_cast<size_t>(T * c.heads * c.dk), nan), dk(dq.size(), nan);
  std::vector<Real> dvWide(static_cast<size_t>(T * in.vLd), static_cast<Real>(kSentinel));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < c.heads * c.dv; ++j)
      dvWide[t * in.vLd + in.vOff + j] = nan;
  std::vector<Real> dbeta(static_cast<size_t>(T * c.heads), nan), dg(dbeta.size(), nan);
  Grads<Real> grads;
  grads.q = dq.data();
  grads.k = dk.data();
  grads.v = dvWide.data();
  grads.vLd = in.vLd;
  grads.vOff = in.vOff;
  grads.beta = dbeta.data();
  grads.g = dg.data();
  hostBackward(p, dO.data(), grads);

  Results r;
  r.o = doubles(o);
  r.dq = doubles(dq);
  r.dk = doubles(dk);
  r.dbeta = doubles(dbeta);
  r.dg = doubles(dg);
  r.dv.resize(static_cast<size_t>(T * c.heads * c.dv));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < in.vLd; ++j) {
      bool inside = j >= in.vOff && j < in.vOff + c.heads * c.dv;
      if (inside)
        r.dv[t * c.heads * c.dv + j - in.vOff] = dvWide[t * in.vLd + j];
      else
        EXPECT_EQ(static_cast<double>(dvWide[t * in.vLd + j]), kSentinel) << "dv wrote outside its columns";
    }
  return r;
}

/// ||x - ref|| / ||ref|| (NaN if any element is NaN).
double relativeError(const Doubles &x, const Doubles &ref) {
  EXPECT_EQ(x.size(), ref.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < x.size() && i < ref.size(); ++i) {
    diff += (x[i] - ref[i]) * (x[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-300);
}

void expectClose(const Results &got, const Results &ref, double tolerance, const std::string &what) {
  const char *names[] = {"o", "dq", "dk", "dv", "dbeta", "dg"};
  const Doubles *g[] = {&got.o, &got.dq, &got.dk, &got.dv, &got.dbeta, &got.dg};
  const Doubles *r[] = {&ref.o, &ref.dq, &ref.dk, &ref.dv, &ref.dbeta, &ref.dg};
  std::ostringstream line;
  for (int i = 0; i < 6; ++i) {
    double e = relativeError(*g[i], *r[i]);
    line << " " << names[i] << " " << e;
    EXPECT_LT(e, tolerance) << what << ": " << names[i];
  }
  std::printf("%s:%s\n", what.c_str(), line.str().c_str());
}

const std::vector<Config> configs = {
    // One partial chunk, several sequences.
    {3, 5, 3, 3, 4, 6, 64},
    // Ragged lengths around the chunk size, grouped key heads, odd widths.
    {1, 100, 2, 1, 16, 16, 64},
    {2, 257, 4, 2, 8, 12, 64},
    {1, 64, 1, 1, 32, 32, 64},
    {2, 65, 2, 2, 7, 5, 64},
    {1, 300, 2, 1, 32, 48, 64, 12.0},
    {1, 200, 1, 1, 16, 8, 64, 0.02},
    // Small chunks: many of them per sequence.
    {2, 37, 2, 1, 5, 7, 16},
    {1, 50, 2, 2, 6, 6, 8, 8.0},
    // The real head size.
    {1, 1000, 2, 1, 128, 128, 64},
};

TEST(ChunkedDeltaRule, DoubleMatchesRecurrent) {
  uint64_t seed = 10;
  for (const Config &c : configs) {
    Inputs in(c, ++seed);
    Results ref = recurrent(in);
    expectClose(chunkedRun<double>(in), ref, 1e-9, "double " + c.text());
  }
}

TEST(ChunkedDeltaRule, FloatMatchesRecurrent) {
  uint64_t seed = 40;
  for (const Config &c : configs) {
    Inputs in(c, ++seed);
    Results ref = recurrent(in);
    expectClose(chunkedRun<float>(in), ref, 1e-4, "float " + c.text());
  }
}

// Sequences are independent: changing the second sequence leaves the first one's outputs alone.
TEST(ChunkedDeltaRule, SequencesDoNotLeak) {
  Config c{2, 70, 2, 1, 8, 8, 64};
  Inputs a(c, 91), b(c, 91);
  int64_t half = c.seqLen;
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  for (int64_t t = half; t < 2 * half; ++t)
    for (int64_t j = 0; j < c.heads * c.dv; ++j)
      b.vWide[t * b.vLd + b.vOff + j] = u(rng);
  Results ra = chunkedRun<double>(a), rb = chunkedRun<double>(b);
  for (int64_t t = 0; t < half; ++t)
    for (int64_t j = 0; j < c.heads * c.dv; ++j)
      EXPECT_EQ(ra.o[t * c.heads * c.dv + j], rb.o[t * c.heads * c.dv + j]) << "token " << t;
}

} // namespace
} // namespace moec::runtime::cuda::linattn::chunked
