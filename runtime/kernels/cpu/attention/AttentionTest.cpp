//===- AttentionTest.cpp - attention and attention.backward vs a naive reference ===//

#include <gtest/gtest.h>

#include <limits>

#include "runtime/kernels/cpu/CpuKernels.h"
#include "runtime/kernels/cpu/attention/Reference.h"
#include "runtime/kernels/testing/KernelTesting.h"

namespace moec::runtime::cpu::attention {
namespace {

using namespace testing;
namespace ref = reference;

struct Config {
  int64_t heads, kvHeads, headDim, valueDim, len, window;
  bool sinks;
};

std::ostream &operator<<(std::ostream &os, const Config &c) {
  return os << "H" << c.heads << " KV" << c.kvHeads << " d" << c.headDim << " dv" << c.valueDim
            << " L" << c.len << " window " << c.window << (c.sinks ? " sinks" : "");
}

class AttentionTest : public ::testing::TestWithParam<Config> {
protected:
  void SetUp() override { registerAttentionKernels(registry); }

  /// Two sequences of c.len tokens.
  KernelCall call(const Config &c, uint64_t seed = 1) {
    int64_t tokens = 2 * c.len;
    KernelCall k(registry, "attention");
    k.input(randomTensor({tokens, c.heads * c.headDim}, seed))
        .input(randomTensor({tokens, c.kvHeads * c.headDim}, seed + 1))
        .input(randomTensor({tokens, c.kvHeads * c.valueDim}, seed + 2));
    if (c.sinks)
      k.input(randomTensor({c.heads}, seed + 3, 1.5f));
    k.output(plan::F32, {tokens, c.heads * c.valueDim})
        .attr("num_heads", c.heads)
        .attr("num_kv_heads", c.kvHeads)
        .attr("head_dim", c.headDim)
        .attr("scale", 1.0 / std::sqrt(static_cast<double>(c.headDim)))
        .sequences(c.len, 2);
    if (c.window)
      k.attr("sliding_window", c.window);
    return k;
  }

  /// Per (sequence, head): the reference's q, k, v, mask and sink.
  struct Head {
    ref::Mat q, k, v;
    ref::Allowed allowed;
    double sink = 0;
    bool hasSink = false;
  };
  Head head(KernelCall &k, const Config &c, int64_t b, int64_t h) {
    int64_t g = h / (c.heads / c.kvHeads), row = b * c.len;
    Head out;
    out.q = ref::slice(k.inputsRef()[0].floats(), c.heads * c.headDim, row, c.len, h * c.headDim,
                       c.headDim);
    out.k = ref::slice(k.inputsRef()[1].floats(), c.kvHeads * c.headDim, row, c.len, g * c.headDim,
                       c.headDim);
    out.v = ref::slice(k.inputsRef()[2].floats(), c.kvHeads * c.valueDim, row, c.len,
                       g * c.valueDim, c.valueDim);
    int64_t window = c.window;
    // transformers' sliding window: the last `window` keys, the token included.
    out.allowed = [window](int64_t t, int64_t s) { return s <= t && (!window || t - s < window); };
    if (c.sinks) {
      out.hasSink = true;
      out.sink = k.inputsRef()[3].floats()[h];
    }
    return out;
  }

  KernelRegistry registry;
};

TEST_P(AttentionTest, ForwardMatchesReference) {
  Config c = GetParam();
  KernelCall k = call(c);
  k.run();
  std::vector<float> out = k.result(0).floats();
  double scale = 1.0 / std::sqrt(static_cast<double>(c.headDim));
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < c.heads; ++h) {
      Head r = head(k, c, b, h);
      ref::Mat want = ref::attend(r.q, r.k, r.v, scale, r.allowed, r.hasSink ? &r.sink : nullptr);
      EXPECT_LT(ref::maxError(out, c.heads * c.valueDim, b * c.len, h * c.valueDim, want), 2e-6)
          << "sequence " << b << " head " << h;
    }
}

TEST_P(AttentionTest, LogsumexpMatchesReference) {
  // The training step's form: the same result, and log Σ exp(z) per (query, head), the sink's
  // exp included.
  Config c = GetParam();
  KernelCall k = call(c);
  k.output(plan::F32, {2 * c.len, c.heads});
  k.run();
  KernelCall plain = call(c);
  plain.run();
  EXPECT_EQ(k.result(0).floats(), plain.result(0).floats());
  std::vector<float> lse = k.result(1).floats();
  double scale = 1.0 / std::sqrt(static_cast<double>(c.headDim));
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < c.heads; ++h) {
      Head r = head(k, c, b, h);
      for (int64_t t = 0; t < c.len; ++t) {
        double sum = r.hasSink ? std::exp(r.sink) : 0.0;
        for (int64_t s = 0; s <= t; ++s)
          if (r.allowed(t, s))
            sum += std::exp(scale * ref::dot(r.q[t], r.k[s]));
        EXPECT_NEAR(lse[(b * c.len + t) * c.heads + h], std::log(sum), 2e-6)
            << "sequence " << b << " head " << h << " row " << t;
      }
    }
}

TEST_P(AttentionTest, BackwardMatchesNumericGradients) {
  Config c = GetParam();
  KernelCall k = call(c);
  std::vector<int64_t> wrt = {0, 1, 2};
  if (c.sinks)
    wrt.push_back(3);
  GradientCheck check = checkGradients(registry, k, wrt);
  EXPECT_LT(check.worstRelativeError, 1e-2) << check.report;
}

TEST_P(AttentionTest, BackwardMatchesReference) {
  Config c = GetParam();
  KernelCall k = call(c);
  std::vector<int64_t> wrt = {0, 1, 2};
  if (c.sinks)
    wrt.push_back(3);
  int64_t tokens = 2 * c.len, ldo = c.heads * c.valueDim;
  KernelCall back = ref::backwardOf(registry, k, wrt, randomTensor({tokens, ldo}, 42));
  back.run();
  std::vector<float> dOut = back.inputsRef().back().floats();
  std::vector<float> dq = back.result(0).floats(), dk = back.result(1).floats(),
                     dv = back.result(2).floats();
  double scale = 1.0 / std::sqrt(static_cast<double>(c.headDim));
  int64_t group = c.heads / c.kvHeads;
  std::vector<double> dsink(c.heads, 0.0);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t g = 0; g < c.kvHeads; ++g) {
      ref::Mat dkSum(c.len, ref::Vec(c.headDim, 0.0)), dvSum(c.len, ref::Vec(c.valueDim, 0.0));
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        Head r = head(k, c, b, h);
        ref::AttendGrads want = ref::attendBackward(
            r.q, r.k, r.v, scale, r.allowed, r.hasSink ? &r.sink : nullptr,
            ref::slice(dOut, ldo, b * c.len, c.len, h * c.valueDim, c.valueDim));
        EXPECT_LT(ref::maxError(dq, c.heads * c.headDim, b * c.len, h * c.headDim, want.dq), 1e-5);
        for (int64_t t = 0; t < c.len; ++t) {
          for (int64_t j = 0; j < c.headDim; ++j)
            dkSum[t][j] += want.dk[t][j];
          for (int64_t j = 0; j < c.valueDim; ++j)
            dvSum[t][j] += want.dv[t][j];
        }
        dsink[h] += want.dsink;
      }
      EXPECT_LT(ref::maxError(dk, c.kvHeads * c.headDim, b * c.len, g * c.headDim, dkSum), 1e-5);
      EXPECT_LT(ref::maxError(dv, c.kvHeads * c.valueDim, b * c.len, g * c.valueDim, dvSum), 1e-5);
    }
  if (c.sinks) {
    std::vector<float> ds = back.result(3).floats();
    for (int64_t h = 0; h < c.heads; ++h)
      EXPECT_NEAR(ds[h], dsink[h], 1e-5) << "sink " << h;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Variants, AttentionTest,
    ::testing::Values(Config{4, 2, 8, 8, 7, 0, false},  // GQA 2:1
                      Config{3, 3, 5, 3, 6, 0, false},  // MHA, value dim != head dim
                      Config{6, 2, 4, 4, 9, 0, false},  // GQA 3:1
                      Config{4, 1, 8, 6, 16, 3, false}, // MQA, sliding window 3
                      Config{2, 2, 8, 8, 5, 1, false},  // window 1: each token sees itself
                      Config{2, 2, 8, 8, 5, 0, true},   // gpt-oss sinks
                      Config{4, 2, 6, 6, 9, 4, true})); // sinks and a sliding window

class AttentionEdgeTest : public AttentionTest {};

TEST_F(AttentionEdgeTest, WindowAsLongAsTheSequenceChangesNothing) {
  Config dense{4, 2, 8, 8, 7, 0, false}, windowed{4, 2, 8, 8, 7, 7, false};
  KernelCall a = call(dense), b = call(windowed);
  a.run();
  b.run();
  EXPECT_EQ(a.result(0).floats(), b.result(0).floats());
}

TEST_F(AttentionEdgeTest, SequencesDoNotSeeEachOther) {
  Config c{4, 2, 8, 8, 6, 0, false};
  KernelCall a = call(c), b = call(c);
  // Change the second sequence's keys and values only.
  for (int i : {1, 2}) {
    std::vector<float> x = b.inputsRef()[i].floats();
    for (size_t j = x.size() / 2; j < x.size(); ++j)
      x[j] = -x[j] + 0.25f;
    b.inputsRef()[i] = floatTensor(b.inputsRef()[i].shape, x);
  }
  a.run();
  b.run();
  std::vector<float> ya = a.result(0).floats(), yb = b.result(0).floats();
  std::vector<float> firstA(ya.begin(), ya.begin() + ya.size() / 2),
      firstB(yb.begin(), yb.begin() + yb.size() / 2);
  EXPECT_EQ(firstA, firstB);
  // The first token of each sequence reads only its own value.
  std::vector<float> v = a.inputsRef()[2].floats();
  for (int64_t b2 = 0; b2 < 2; ++b2)
    for (int64_t h = 0; h < 4; ++h)
      for (int64_t j = 0; j < 8; ++j)
        EXPECT_NEAR(ya[b2 * 6 * 32 + h * 8 + j], v[b2 * 6 * 16 + (h / 2) * 8 + j], 1e-6);
}

TEST_F(AttentionEdgeTest, VanishingSinksEqualNoSinks) {
  Config plain{2, 2, 8, 8, 5, 0, false}, sinks{2, 2, 8, 8, 5, 0, true};
  KernelCall a = call(plain), b = call(sinks);
  b.inputsRef()[3] = filledTensor({2}, -1e30f);
  a.run();
  b.run();
  EXPECT_EQ(a.result(0).floats(), b.result(0).floats());
}

TEST_F(AttentionEdgeTest, ThreadsChangeNothing) {
  Config c{4, 2, 6, 6, 9, 4, true};
  KernelCall serial = call(c), parallel = call(c);
  ThreadPool pool(3);
  parallel.threads(&pool);
  serial.run();
  parallel.run();
  EXPECT_EQ(serial.result(0).floats(), parallel.result(0).floats());
  OwnedTensor dOut = randomTensor({18, 24}, 8);
  KernelCall serialBack = ref::backwardOf(registry, serial, {0, 1, 2, 3}, dOut);
  KernelCall parallelBack = ref::backwardOf(registry, parallel, {0, 1, 2, 3}, dOut);
  parallelBack.threads(&pool);
  serialBack.run();
  parallelBack.run();
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(serialBack.result(i).floats(), parallelBack.result(i).floats()) << "gradient " << i;
}

TEST_F(AttentionEdgeTest, BadLaunchesFailWithAMessage) {
  auto expectFailure = [&](KernelCall k, const std::string &text) {
    try {
      k.run();
      ADD_FAILURE() << "no failure, expected: " << text;
    } catch (const KernelError &e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  Config c{4, 2, 8, 8, 4, 0, false};
  KernelCall ratio = call(c);
  ratio.attr("num_kv_heads", 3);
  expectFailure(ratio, "multiple of num_kv_heads");
  KernelCall scale = call(c);
  scale.attributes().erase("scale");
  expectFailure(scale, "missing attribute 'scale'");
  KernelCall window = call(c);
  window.attr("sliding_window", 0);
  expectFailure(window, "'sliding_window' must be positive");
  KernelCall key = call(c);
  key.inputsRef()[1] = randomTensor({8, 8}, 3);
  expectFailure(key, "key has shape [8,8], expected [8,16]");
  KernelCall sequences = call(c);
  sequences.sequences(3, 2);
  expectFailure(sequences, "do not cover the 8 token rows");
  KernelCall sinks = call(c);
  sinks.input(randomTensor({3}, 1));
  expectFailure(sinks, "sinks has shape [3], expected [4]");
  KernelCall result = call(c);
  result.result(0) = zeroTensor(plan::F32, {8, 16});
  expectFailure(result, "result has shape [8,16], expected [8,32]");
  // A backward asked for the gradient of sinks the forward does not have.
  KernelCall forward = call(c);
  KernelCall noSinks = ref::backwardOf(registry, forward, {0}, randomTensor({8, 32}, 5));
  noSinks.attr("grad_of_inputs", std::vector<int64_t>{0, 3}).output(plan::F32, {4});
  expectFailure(noSinks, "operand 3");
}

} // namespace
} // namespace moec::runtime::cpu::attention
