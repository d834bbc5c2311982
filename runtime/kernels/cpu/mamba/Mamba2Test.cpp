//===- Mamba2Test.cpp - mamba2 against a naive double reference -----------===//

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/kernels/cpu/CpuKernels.h"
#include "runtime/kernels/testing/KernelTesting.h"

namespace moec::runtime::cpu {
namespace {

using testing::checkGradients;
using testing::floatTensor;
using testing::GradientCheck;
using testing::KernelCall;
using testing::OwnedTensor;
using testing::randomTensor;

struct Config {
  int64_t heads, headDim, state, groups, kernel, seqLen, batch, chunk;
  bool convBias;
  double dtMin = 0;

  int64_t inner() const { return heads * headDim; }
  int64_t channels() const { return inner() + 2 * groups * state; }
  int64_t width() const { return inner() + channels() + heads; }
  int64_t tokens() const { return seqLen * batch; }
  std::string name() const {
    return "H=" + std::to_string(heads) + " p=" + std::to_string(headDim) +
           " N=" + std::to_string(state) + " G=" + std::to_string(groups) +
           " K=" + std::to_string(kernel) + " S=" + std::to_string(seqLen) +
           " chunk=" + std::to_string(chunk) + (convBias ? " bias" : " no-bias");
  }
};

const std::vector<Config> &configs() {
  static const std::vector<Config> all = {
      {2, 2, 3, 1, 4, 7, 2, 3, true},   // G=1, chunks of 3 (checkpoints inside a sequence)
      {4, 3, 2, 2, 4, 6, 2, 4, false},  // G=2, no conv bias
      {4, 2, 4, 2, 4, 12, 2, 5, true},  // G=2, longer sequences, uneven last chunk
      {3, 4, 2, 1, 4, 5, 2, 32, false}, // odd head count, chunk longer than the sequence
      {2, 2, 2, 2, 2, 9, 3, 4, true},   // one head per group, K=2, three sequences
  };
  return all;
}

KernelRegistry &registry() {
  static KernelRegistry r = [] {
    KernelRegistry reg;
    registerMambaKernels(reg);
    return reg;
  }();
  return r;
}

/// The forward operands, in ODS order (conv_bias empty when absent).
struct Params {
  std::vector<float> zxbcdt, convWeight, convBias, dtBias, aLog, dSkip, normWeight;
};

std::vector<float> uniform(int64_t n, uint64_t seed, float scale, float offset = 0) {
  std::vector<float> v = randomTensor({n}, seed, scale).floats();
  for (float &x : v)
    x += offset;
  return v;
}

Params makeParams(const Config &c, uint64_t seed) {
  Params p;
  p.zxbcdt = uniform(c.tokens() * c.width(), seed, 1.0f);
  p.convWeight = uniform(c.channels() * c.kernel, seed + 1, 0.4f);
  if (c.convBias)
    p.convBias = uniform(c.channels(), seed + 2, 0.3f);
  p.dtBias = uniform(c.heads, seed + 3, 0.5f, -0.5f);
  p.aLog = uniform(c.heads, seed + 4, 1.0f);
  p.dSkip = uniform(c.heads, seed + 5, 1.0f);
  p.normWeight = uniform(c.inner(), seed + 6, 0.5f, 1.0f);
  return p;
}

std::vector<std::vector<float> *> operands(Params &p) {
  std::vector<std::vector<float> *> ops = {&p.zxbcdt, &p.convWeight};
  if (!p.convBias.empty())
    ops.push_back(&p.convBias);
  for (std::vector<float> *v : {&p.dtBias, &p.aLog, &p.dSkip, &p.normWeight})
    ops.push_back(v);
  return ops;
}

double silu(double v) { return v / (1 + std::exp(-v)); }

/// Straight from the formulas, in double: conv + SiLU, softplus/clamp, the
/// recurrence per head, gated group RMSNorm.
std::vector<double> reference(const Config &c, const Params &p) {
  int64_t T = c.tokens(), W = c.width(), inner = c.inner(), C = c.channels();
  std::vector<double> out(T * inner);
  for (int64_t b = 0; b < c.batch; ++b) {
    std::vector<double> act(c.seqLen * C), dt(c.seqLen * c.heads), y(c.seqLen * inner);
    for (int64_t t = 0; t < c.seqLen; ++t) {
      for (int64_t ch = 0; ch < C; ++ch) {
        double v = c.convBias ? p.convBias[ch] : 0.0;
        for (int64_t k = 0; k < c.kernel; ++k) {
          int64_t src = t - (c.kernel - 1) + k;
          if (src >= 0)
            v += double(p.convWeight[ch * c.kernel + k]) *
                 p.zxbcdt[(b * c.seqLen + src) * W + inner + ch];
        }
        act[t * C + ch] = silu(v);
      }
      for (int64_t h = 0; h < c.heads; ++h) {
        double u = double(p.zxbcdt[(b * c.seqLen + t) * W + inner + C + h]) + p.dtBias[h];
        dt[t * c.heads + h] = std::max(std::log(1 + std::exp(u)), c.dtMin);
      }
    }
    for (int64_t h = 0; h < c.heads; ++h) {
      int64_t g = h / (c.heads / c.groups);
      double A = -std::exp(double(p.aLog[h]));
      std::vector<double> s(c.headDim * c.state, 0.0);
      for (int64_t t = 0; t < c.seqLen; ++t) {
        double d = dt[t * c.heads + h];
        for (int64_t i = 0; i < c.headDim; ++i) {
          double x = act[t * C + h * c.headDim + i], yi = p.dSkip[h] * x;
          for (int64_t n = 0; n < c.state; ++n) {
            double B = act[t * C + inner + g * c.state + n];
            double Cv = act[t * C + inner + c.groups * c.state + g * c.state + n];
            s[i * c.state + n] = std::exp(d * A) * s[i * c.state + n] + d * x * B;
            yi += Cv * s[i * c.state + n];
          }
          y[t * inner + h * c.headDim + i] = yi;
        }
      }
    }
    int64_t m = inner / c.groups;
    for (int64_t t = 0; t < c.seqLen; ++t)
      for (int64_t g = 0; g < c.groups; ++g) {
        double ms = 0;
        std::vector<double> v(m);
        for (int64_t j = 0; j < m; ++j) {
          v[j] = y[t * inner + g * m + j] * silu(p.zxbcdt[(b * c.seqLen + t) * W + g * m + j]);
          ms += v[j] * v[j] / m;
        }
        for (int64_t j = 0; j < m; ++j)
          out[(b * c.seqLen + t) * inner + g * m + j] =
              v[j] / std::sqrt(ms + 1e-5) * p.normWeight[g * m + j];
      }
  }
  return out;
}

void setAttrs(KernelCall &call, const Config &c) {
  call.attr("num_heads", c.heads)
      .attr("head_dim", c.headDim)
      .attr("state_size", c.state)
      .attr("num_groups", c.groups)
      .attr("chunk_size", c.chunk)
      .attr("eps", 1e-5)
      .sequences(c.seqLen, c.batch);
  if (c.dtMin > 0)
    call.attr("time_step_min", c.dtMin);
}

KernelCall forwardCall(const Config &c, const Params &p) {
  KernelCall call(registry(), "mamba2");
  call.input(floatTensor({c.tokens(), c.width()}, p.zxbcdt))
      .input(floatTensor({c.channels(), 1, c.kernel}, p.convWeight));
  if (c.convBias)
    call.input(floatTensor({c.channels()}, p.convBias));
  call.input(floatTensor({c.heads}, p.dtBias))
      .input(floatTensor({c.heads}, p.aLog))
      .input(floatTensor({c.heads}, p.dSkip))
      .input(floatTensor({c.inner()}, p.normWeight))
      .output(plan::F32, {c.tokens(), c.inner()});
  setAttrs(call, c);
  return call;
}

/// Runs mamba2.backward for `wrt` (present-operand indices) with output gradient `gOut`.
std::vector<std::vector<float>> backward(const Config &c, const Params &p,
                                         const std::vector<float> &gOut,
                                         const std::vector<int64_t> &wrt,
                                         ThreadPool *pool = nullptr) {
  KernelCall fwd = forwardCall(c, p);
  KernelCall call(registry(), "mamba2.backward");
  call.attributes() = fwd.attributes();
  int64_t numOperands = static_cast<int64_t>(fwd.inputsRef().size());
  for (OwnedTensor &t : fwd.inputsRef())
    call.input(t);
  call.input(floatTensor({c.tokens(), c.inner()}, gOut))
      .attr("grad_of_inputs", wrt)
      .attr("grad_of_outputs", std::vector<int64_t>{0})
      .attr("backward_segments", std::vector<int64_t>{numOperands, 0, 1})
      .sequences(c.seqLen, c.batch)
      .threads(pool);
  for (int64_t i : wrt)
    call.output(plan::F32, fwd.inputsRef().at(i).shape);
  call.run();
  std::vector<std::vector<float>> grads;
  for (size_t i = 0; i < wrt.size(); ++i)
    grads.push_back(call.result(i).floats());
  return grads;
}

std::vector<int64_t> allOperands(const Config &c) {
  std::vector<int64_t> all(c.convBias ? 7 : 6);
  for (size_t i = 0; i < all.size(); ++i)
    all[i] = static_cast<int64_t>(i);
  return all;
}

TEST(Mamba2, ForwardMatchesNaiveReference) {
  ThreadPool pool(3);
  for (const Config &c : configs()) {
    SCOPED_TRACE(c.name());
    Params p = makeParams(c, 11);
    std::vector<double> want = reference(c, p);
    for (ThreadPool *threads : {static_cast<ThreadPool *>(nullptr), &pool}) {
      KernelCall call = forwardCall(c, p);
      call.threads(threads).run();
      std::vector<float> got = call.result(0).floats();
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], want[i], 2e-5 * (1 + std::abs(want[i]))) << "element " << i;
    }
  }
}

TEST(Mamba2, SequencesDoNotShareStateOrConv) {
  Config c = configs()[2];
  Params p = makeParams(c, 21);
  KernelCall call = forwardCall(c, p);
  call.run();
  std::vector<float> before = call.result(0).floats();
  // Change every row of sequence 0: sequence 1's output must not move.
  Params changed = p;
  for (int64_t i = 0; i < c.seqLen * c.width(); ++i)
    changed.zxbcdt[i] = -changed.zxbcdt[i] + 0.25f;
  KernelCall again = forwardCall(c, changed);
  again.run();
  std::vector<float> after = again.result(0).floats();
  int64_t split = c.seqLen * c.inner();
  EXPECT_TRUE(std::equal(before.begin() + split, before.end(), after.begin() + split));
  EXPECT_FALSE(std::equal(before.begin(), before.begin() + split, after.begin()));

  // Sequence 1 run on its own gives the same rows.
  Config alone = c;
  alone.batch = 1;
  Params second = p;
  second.zxbcdt.erase(second.zxbcdt.begin(), second.zxbcdt.begin() + c.seqLen * c.width());
  KernelCall single = forwardCall(alone, second);
  single.run();
  std::vector<float> own = single.result(0).floats();
  EXPECT_TRUE(std::equal(own.begin(), own.end(), before.begin() + split));
}

TEST(Mamba2, BackwardMatchesReferenceDifferences) {
  // Every gradient element against double central differences of the reference.
  for (const Config &c : configs()) {
    SCOPED_TRACE(c.name());
    Params p = makeParams(c, 31);
    std::vector<float> gOut = uniform(c.tokens() * c.inner(), 32, 1.0f);
    std::vector<std::vector<float>> grads = backward(c, p, gOut, allOperands(c));
    auto loss = [&](const Params &q) {
      std::vector<double> y = reference(c, q);
      double l = 0;
      for (size_t i = 0; i < y.size(); ++i)
        l += y[i] * gOut[i];
      return l;
    };
    std::vector<std::vector<float> *> ops = operands(p);
    for (size_t op = 0; op < ops.size(); ++op) {
      SCOPED_TRACE("operand " + std::to_string(op));
      std::vector<float> &values = *ops[op];
      ASSERT_EQ(grads[op].size(), values.size());
      for (size_t i = 0; i < values.size(); ++i) {
        float saved = values[i];
        // A float step that is exactly representable keeps the difference honest.
        float h = std::max(std::abs(saved), 1.0f) * 1.0f / 4096;
        values[i] = saved + h;
        double plus = loss(p);
        values[i] = saved - h;
        double minus = loss(p);
        values[i] = saved;
        double numeric = (plus - minus) / (double(saved + h) - double(saved - h));
        ASSERT_NEAR(grads[op][i], numeric, 1e-3 * (1 + std::abs(numeric))) << "element " << i;
      }
    }
  }
}

TEST(Mamba2, GradientCheckEveryInput) {
  for (const Config &c : configs()) {
    SCOPED_TRACE(c.name());
    KernelCall call = forwardCall(c, makeParams(c, 41));
    // A step of 3e-3 balances f32 rounding of the outputs against the curvature
    // of the chain (conv -> SSM products -> normalisation over small groups).
    GradientCheck check = checkGradients(registry(), call, allOperands(c), {}, false, 3e-3);
    EXPECT_LT(check.worstRelativeError, 1e-2) << check.report;
  }
}

TEST(Mamba2, SomeGradientsInAnyOrder) {
  Config c = configs()[2];
  Params p = makeParams(c, 51);
  std::vector<float> gOut = uniform(c.tokens() * c.inner(), 52, 1.0f);
  std::vector<std::vector<float>> all = backward(c, p, gOut, allOperands(c));
  std::vector<std::vector<float>> some = backward(c, p, gOut, {5, 0, 2});
  EXPECT_EQ(some[0], all[5]);
  EXPECT_EQ(some[1], all[0]);
  EXPECT_EQ(some[2], all[2]);
}

TEST(Mamba2, ThreadCountDoesNotChangeResults) {
  ThreadPool two(2), five(5);
  for (const Config &c : configs()) {
    SCOPED_TRACE(c.name());
    Params p = makeParams(c, 61);
    std::vector<float> gOut = uniform(c.tokens() * c.inner(), 62, 1.0f);
    std::vector<std::vector<float>> serial = backward(c, p, gOut, allOperands(c));
    for (ThreadPool *pool : {&two, &five}) {
      EXPECT_EQ(backward(c, p, gOut, allOperands(c), pool), serial);
      KernelCall a = forwardCall(c, p), b = forwardCall(c, p);
      a.run();
      b.threads(pool).run();
      EXPECT_EQ(a.result(0).floats(), b.result(0).floats());
    }
  }
}

TEST(Mamba2, TimeStepMinClamps) {
  // transformers' torch_forward clamps dt at time_step_min: tokens whose
  // softplus falls below it use the minimum and pass no gradient to dt.
  Config c = configs()[1];
  c.dtMin = 0.2;
  Params p = makeParams(c, 71);
  int64_t dtColumn = c.inner() + c.channels();
  for (int64_t row = 0; row < c.tokens(); ++row)
    for (int64_t h = 0; h < c.heads; ++h) // softplus(-3) = 0.049 (clamped), softplus(1) = 1.31
      p.zxbcdt[row * c.width() + dtColumn + h] = ((row + h) % 2 ? -3.0f : 1.0f) - p.dtBias[h];
  std::vector<double> want = reference(c, p);
  KernelCall call = forwardCall(c, p);
  call.run();
  std::vector<float> got = call.result(0).floats();
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 2e-5 * (1 + std::abs(want[i]))) << "element " << i;
  Config unclamped = c;
  unclamped.dtMin = 0;
  KernelCall free = forwardCall(unclamped, p);
  free.run();
  EXPECT_NE(free.result(0).floats(), got);

  std::vector<float> gOut = uniform(c.tokens() * c.inner(), 72, 1.0f);
  std::vector<float> gZ = backward(c, p, gOut, {0})[0];
  for (int64_t row = 0; row < c.tokens(); ++row)
    for (int64_t h = 0; h < c.heads; ++h) {
      float g = gZ[row * c.width() + dtColumn + h];
      if ((row + h) % 2)
        EXPECT_EQ(g, 0.0f);
      else
        EXPECT_NE(g, 0.0f);
    }
  GradientCheck check = checkGradients(registry(), call, allOperands(c), {}, false, 3e-3);
  EXPECT_LT(check.worstRelativeError, 1e-2) << check.report;
}

void expectFailure(KernelCall &call, const std::string &needle) {
  try {
    call.run();
    ADD_FAILURE() << "expected a failure naming '" << needle << "'";
  } catch (const KernelError &e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Mamba2, BadLaunchesFail) {
  Config c = configs()[1]; // no conv bias: 6 operands
  Params p = makeParams(c, 81);
  {
    KernelCall call = forwardCall(c, p);
    call.inputsRef()[0] = randomTensor({c.tokens(), c.width() + 1}, 1);
    expectFailure(call, "zxbcdt");
  }
  {
    KernelCall call = forwardCall(c, p);
    call.attributes().erase("num_groups");
    expectFailure(call, "missing attribute 'num_groups'");
  }
  {
    KernelCall call = forwardCall(c, p);
    call.attr("num_groups", 3);
    expectFailure(call, "multiple of num_groups");
  }
  {
    KernelCall call = forwardCall(c, p);
    call.attr("chunk_size", 0);
    expectFailure(call, "chunk_size must be positive");
  }
  {
    KernelCall call = forwardCall(c, p);
    call.inputsRef()[1] = randomTensor({c.channels(), 2, c.kernel}, 1);
    expectFailure(call, "conv_weight");
  }
  {
    KernelCall call = forwardCall(c, p);
    call.inputsRef()[4] = randomTensor({c.heads + 1}, 1); // d_skip
    expectFailure(call, "d_skip must have 4 elements");
  }
  {
    KernelCall call = forwardCall(c, p);
    call.inputsRef()[2] = testing::zeroTensor(plan::I32, {c.heads}); // dt_bias
    expectFailure(call, "dt_bias must be f32");
  }
  {
    KernelCall call = forwardCall(c, p);
    call.sequences(c.seqLen + 1, c.batch);
    expectFailure(call, "micro_batch");
  }
  {
    Config biased = c;
    biased.convBias = true;
    Params q = makeParams(biased, 82);
    KernelCall call = forwardCall(biased, q);
    call.inputsRef()[2] = randomTensor({c.channels() - 1}, 1);
    expectFailure(call, "conv_bias must have");
  }
  {
    KernelCall call = forwardCall(c, p);
    call.inputsRef().pop_back();
    expectFailure(call, "expected 6 or 7 forward operands");
  }
  {
    // A backward whose gradient output does not match its operand.
    KernelCall fwd = forwardCall(c, p);
    KernelCall call(registry(), "mamba2.backward");
    call.attributes() = fwd.attributes();
    for (OwnedTensor &t : fwd.inputsRef())
      call.input(t);
    call.input(randomTensor({c.tokens(), c.inner()}, 2))
        .attr("grad_of_inputs", std::vector<int64_t>{1})
        .attr("grad_of_outputs", std::vector<int64_t>{0})
        .output(plan::F32, {c.channels(), 1});
    expectFailure(call, "gradient output 0");
  }
}

} // namespace
} // namespace moec::runtime::cpu
