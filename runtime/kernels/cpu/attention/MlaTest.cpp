//===- MlaTest.cpp - mla and sparse_attention vs a naive reference --------===//

#include <gtest/gtest.h>

#include <limits>
#include <random>
#include <set>

#include "runtime/kernels/cpu/CpuKernels.h"
#include "runtime/kernels/cpu/attention/Reference.h"
#include "runtime/kernels/testing/KernelTesting.h"

namespace moec::runtime::cpu::attention {
namespace {

using namespace testing;
namespace ref = reference;

enum class Pe { None, Half, Interleaved };

struct Config {
  int64_t heads, nope, rope, vDim, len;
  Pe pe;
  bool yarn;
};

std::ostream &operator<<(std::ostream &os, const Config &c) {
  const char *pe[] = {"NoPE", "half", "interleaved"};
  return os << "H" << c.heads << " nope" << c.nope << " rope" << c.rope << " v" << c.vDim << " L"
            << c.len << " " << pe[static_cast<int>(c.pe)] << (c.yarn ? " yarn" : "");
}

constexpr double kScale = 0.3;

std::vector<int64_t> positions(int64_t len) {
  std::vector<int64_t> p;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < len; ++t)
      p.push_back(2 * t + 5 * b);
  return p;
}

class MlaTest : public ::testing::TestWithParam<Config> {
protected:
  void SetUp() override { registerAttentionKernels(registry); }

  ref::Rope ropeOf(const Config &c) {
    ref::Rope r;
    r.dim = c.rope;
    r.interleaved = c.pe == Pe::Interleaved;
    if (c.yarn) {
      r.yarn = true;
      r.factor = 8;
      r.originalMax = 16;
      r.mscale = 1;
      r.mscaleAllDim = 0.5; // an attention factor != 1 reaches the scores
    }
    return r;
  }

  /// Two sequences of c.len tokens; `indices` makes it sparse_attention.
  KernelCall call(const Config &c, const std::vector<int64_t> *indices = nullptr,
                  int64_t topk = 0) {
    int64_t tokens = 2 * c.len;
    KernelCall k(registry, indices ? "sparse_attention" : "mla");
    k.input(randomTensor({tokens, c.heads * (c.nope + c.rope)}, 11))
        .input(randomTensor({tokens, c.rope}, 12))
        .input(randomTensor({tokens, c.heads * (c.nope + c.vDim)}, 13))
        .input(indexTensor(plan::I64, {tokens}, positions(c.len)));
    if (indices)
      k.input(indexTensor(plan::I32, {tokens, topk}, *indices));
    k.output(plan::F32, {tokens, c.heads * c.vDim})
        .attr("num_heads", c.heads)
        .attr("qk_nope_head_dim", c.nope)
        .attr("qk_rope_head_dim", c.rope)
        .attr("v_head_dim", c.vDim)
        .attr("scale", kScale)
        .sequences(c.len, 2);
    if (c.pe != Pe::None) {
      ref::Rope r = ropeOf(c);
      k.attr("rope.theta", r.theta)
          .attr("rope.dim", c.rope)
          .attr("rope.style", c.pe == Pe::Half ? "half" : "interleaved");
      if (c.yarn)
        k.attr("rope.yarn.factor", r.factor)
            .attr("rope.yarn.original_max_position", r.originalMax)
            .attr("rope.yarn.beta_fast", r.betaFast)
            .attr("rope.yarn.beta_slow", r.betaSlow)
            .attr("rope.yarn.mscale", r.mscale)
            .attr("rope.yarn.mscale_all_dim", r.mscaleAllDim);
    }
    return k;
  }

  struct HeadInputs {
    ref::Mat q, keys, v;
  };
  /// The reference's inputs: explicit per-head q = [q_nope | RoPE(q_pe)], k = [k_nope |
  /// RoPE(k_pe)]; interleaved uses DeepSeek's own in-place complex rotation.
  HeadInputs headInputs(KernelCall &k, const Config &c, int64_t b, int64_t h) {
    int64_t qk = c.nope + c.rope, kvw = c.nope + c.vDim, row = b * c.len;
    std::vector<float> query = k.inputsRef()[0].floats(), keyRope = k.inputsRef()[1].floats(),
                       kv = k.inputsRef()[2].floats();
    std::vector<int64_t> pos = positions(c.len);
    ref::Rope r = ropeOf(c);
    ref::Mat q = ref::slice(query, c.heads * qk, row, c.len, h * qk, qk);
    ref::Mat kNope = ref::slice(kv, c.heads * kvw, row, c.len, h * kvw, c.nope);
    ref::Mat kPe = ref::slice(keyRope, c.rope, row, c.len, 0, c.rope);
    ref::Mat v = ref::slice(kv, c.heads * kvw, row, c.len, h * kvw + c.nope, c.vDim);
    ref::Mat keys(c.len);
    for (int64_t t = 0; t < c.len; ++t) {
      double p = static_cast<double>(pos[row + t]);
      ref::Vec qPe(q[t].begin() + c.nope, q[t].end());
      if (c.pe != Pe::None) {
        qPe = c.pe == Pe::Half ? ref::rope(r, qPe, p) : ref::complexRope(r, qPe, p);
        kPe[t] = c.pe == Pe::Half ? ref::rope(r, kPe[t], p) : ref::complexRope(r, kPe[t], p);
      }
      std::copy(qPe.begin(), qPe.end(), q[t].begin() + c.nope);
      keys[t] = kNope[t];
      keys[t].insert(keys[t].end(), kPe[t].begin(), kPe[t].end());
    }
    return {q, keys, v};
  }

  ref::Mat expected(KernelCall &k, const Config &c, int64_t b, int64_t h, const ref::Allowed &allowed) {
    HeadInputs in = headInputs(k, c, b, h);
    return ref::attend(in.q, in.keys, in.v, kScale, allowed);
  }

  KernelRegistry registry;
};

ref::Allowed causal() {
  return [](int64_t t, int64_t s) { return s <= t; };
}

TEST_P(MlaTest, ForwardMatchesReference) {
  Config c = GetParam();
  KernelCall k = call(c);
  k.run();
  std::vector<float> out = k.result(0).floats();
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < c.heads; ++h)
      EXPECT_LT(ref::maxError(out, c.heads * c.vDim, b * c.len, h * c.vDim,
                              expected(k, c, b, h, causal())),
                2e-6)
          << "sequence " << b << " head " << h;
}

TEST_P(MlaTest, LogsumexpMatchesReference) {
  // The training step's form: the same result, and log Σ exp(z) over the allowed keys per
  // (query, head).
  Config c = GetParam();
  KernelCall k = call(c);
  k.output(plan::F32, {2 * c.len, c.heads});
  k.run();
  KernelCall plain = call(c);
  plain.run();
  EXPECT_EQ(k.result(0).floats(), plain.result(0).floats());
  std::vector<float> lse = k.result(1).floats();
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < c.heads; ++h) {
      HeadInputs in = headInputs(k, c, b, h);
      for (int64_t t = 0; t < c.len; ++t) {
        double sum = 0;
        for (int64_t s = 0; s <= t; ++s)
          sum += std::exp(kScale * ref::dot(in.q[t], in.keys[s]));
        EXPECT_NEAR(lse[(b * c.len + t) * c.heads + h], std::log(sum), 2e-5)
            << "sequence " << b << " head " << h << " row " << t;
      }
    }
}

TEST_P(MlaTest, BackwardMatchesNumericGradients) {
  Config c = GetParam();
  KernelCall k = call(c);
  GradientCheck check = checkGradients(registry, k, {0, 1, 2});
  EXPECT_LT(check.worstRelativeError, 1e-2) << check.report;
}

/// Each row selects the keys of `keep` (a few, duplicated, some future, -1s).
std::vector<int64_t> someIndices(int64_t len, int64_t topk, uint64_t seed,
                                 std::vector<std::set<int64_t>> &keep) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> indices;
  keep.assign(2 * len, {});
  for (int64_t t = 0; t < 2 * len; ++t)
    for (int64_t j = 0; j < topk; ++j) {
      int64_t s = static_cast<int64_t>(rng() % (len + 2)) - 1;
      s = s >= len ? -1 : s;
      indices.push_back(s);
      if (s >= 0)
        keep[t].insert(s);
    }
  return indices;
}

/// someIndices (top 4, seed 3) with row 0 of sequence 0 selecting nothing.
std::vector<int64_t> indicesWithAnEmptyRow(int64_t len, std::vector<std::set<int64_t>> &keep) {
  std::vector<int64_t> indices = someIndices(len, 4, 3, keep);
  std::fill_n(indices.begin(), 4, -1);
  keep[0].clear();
  return indices;
}

TEST_P(MlaTest, SparseLogsumexpMatchesReference) {
  // Over the selected keys; +inf on a row that selects none.
  Config c = GetParam();
  std::vector<std::set<int64_t>> keep;
  std::vector<int64_t> indices = indicesWithAnEmptyRow(c.len, keep);
  KernelCall k = call(c, &indices, 4);
  k.output(plan::F32, {2 * c.len, c.heads});
  k.run();
  std::vector<float> lse = k.result(1).floats();
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < c.heads; ++h) {
      HeadInputs in = headInputs(k, c, b, h);
      for (int64_t t = 0; t < c.len; ++t) {
        double sum = 0;
        for (int64_t s : keep[b * c.len + t])
          if (s <= t)
            sum += std::exp(kScale * ref::dot(in.q[t], in.keys[s]));
        const float got = lse[(b * c.len + t) * c.heads + h];
        const std::string where = "sequence " + std::to_string(b) + " head " + std::to_string(h) + " row " +
                                  std::to_string(t);
        if (sum == 0)
          EXPECT_EQ(got, std::numeric_limits<float>::infinity()) << where;
        else
          EXPECT_NEAR(got, std::log(sum), 2e-5) << where;
      }
    }
}

TEST_P(MlaTest, SparseMatchesReference) {
  Config c = GetParam();
  std::vector<std::set<int64_t>> keep;
  std::vector<int64_t> indices = indicesWithAnEmptyRow(c.len, keep);
  KernelCall k = call(c, &indices, 4);
  k.run();
  std::vector<float> out = k.result(0).floats();
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < c.heads; ++h) {
      const std::vector<std::set<int64_t>> *rows = &keep;
      int64_t row = b * c.len;
      ref::Allowed allowed = [rows, row](int64_t t, int64_t s) {
        return s <= t && (*rows)[row + t].count(s) > 0;
      };
      EXPECT_LT(
          ref::maxError(out, c.heads * c.vDim, row, h * c.vDim, expected(k, c, b, h, allowed)),
          2e-6)
          << "sequence " << b << " head " << h;
    }
  for (int64_t j = 0; j < c.heads * c.vDim; ++j)
    EXPECT_EQ(out[j], 0.0f) << "a row with no key outputs zero";
}

TEST_P(MlaTest, SparseBackwardMatchesNumericGradients) {
  Config c = GetParam();
  std::vector<std::set<int64_t>> keep;
  std::vector<int64_t> indices = someIndices(c.len, 5, 4, keep);
  KernelCall k = call(c, &indices, 5);
  GradientCheck check = checkGradients(registry, k, {0, 1, 2});
  EXPECT_LT(check.worstRelativeError, 1e-2) << check.report;
}

TEST_P(MlaTest, SparseWithEveryKeySelectedEqualsDense) {
  Config c = GetParam();
  // Every position of the sequence in a scrambled order, plus -1s and a duplicate.
  int64_t topk = c.len + 3;
  std::vector<int64_t> indices;
  for (int64_t t = 0; t < 2 * c.len; ++t) {
    for (int64_t j = 0; j < c.len; ++j)
      indices.push_back((j * 5 + t) % c.len);
    indices.insert(indices.end(), {-1, t % c.len, -1});
  }
  KernelCall dense = call(c), sparse = call(c, &indices, topk);
  dense.run();
  sparse.run();
  EXPECT_EQ(dense.result(0).floats(), sparse.result(0).floats());
  OwnedTensor dOut = randomTensor({2 * c.len, c.heads * c.vDim}, 21);
  KernelCall denseBack = ref::backwardOf(registry, dense, {0, 1, 2}, dOut);
  KernelCall sparseBack = ref::backwardOf(registry, sparse, {0, 1, 2}, dOut);
  denseBack.run();
  sparseBack.run();
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(denseBack.result(i).floats(), sparseBack.result(i).floats()) << "gradient " << i;
}

INSTANTIATE_TEST_SUITE_P(Variants, MlaTest,
                         ::testing::Values(Config{2, 6, 4, 5, 7, Pe::Half, false},
                                           Config{3, 4, 6, 4, 6, Pe::Interleaved, false},
                                           Config{2, 8, 4, 8, 9, Pe::Interleaved, true},
                                           Config{2, 6, 4, 6, 8, Pe::None, false})); // Kimi NoPE

class MlaEdgeTest : public MlaTest {};

TEST_F(MlaEdgeTest, ThreadsChangeNothing) {
  Config c{2, 8, 4, 8, 9, Pe::Interleaved, true};
  std::vector<std::set<int64_t>> keep;
  std::vector<int64_t> indices = someIndices(c.len, 5, 6, keep);
  KernelCall serial = call(c, &indices, 5), parallel = call(c, &indices, 5);
  ThreadPool pool(3);
  parallel.threads(&pool);
  serial.run();
  parallel.run();
  EXPECT_EQ(serial.result(0).floats(), parallel.result(0).floats());
  OwnedTensor dOut = randomTensor({18, 16}, 8);
  KernelCall serialBack = ref::backwardOf(registry, serial, {0, 1, 2}, dOut);
  KernelCall parallelBack = ref::backwardOf(registry, parallel, {0, 1, 2}, dOut);
  parallelBack.threads(&pool);
  serialBack.run();
  parallelBack.run();
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(serialBack.result(i).floats(), parallelBack.result(i).floats()) << "gradient " << i;
}

TEST_F(MlaEdgeTest, BadLaunchesFailWithAMessage) {
  auto expectFailure = [&](KernelCall k, const std::string &text) {
    try {
      k.run();
      ADD_FAILURE() << "no failure, expected: " << text;
    } catch (const KernelError &e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  Config c{2, 6, 4, 5, 4, Pe::Half, false};
  KernelCall rope = call(c);
  rope.attr("rope.dim", 2);
  expectFailure(rope, "rope.dim (2) must equal qk_rope_head_dim (4)");
  KernelCall kv = call(c);
  kv.inputsRef()[2] = randomTensor({8, 20}, 1);
  expectFailure(kv, "key_value has shape [8,20], expected [8,22]");
  KernelCall heads = call(c);
  heads.attributes().erase("num_heads");
  expectFailure(heads, "missing attribute 'num_heads'");
  std::vector<int64_t> bad(8 * 2, 0);
  bad[5] = 4; // row 2 names position 4 of a 4-token sequence
  expectFailure(call(c, &bad, 2), "indices[2] holds 4, outside [-1, seq_len = 4)");
  KernelCall count = call(c);
  count.input(indexTensor(plan::I32, {8, 2}, bad));
  expectFailure(count, "expected 4 inputs");
  KernelCall positions = call(c);
  positions.inputsRef()[3] = randomTensor({8}, 1);
  expectFailure(positions, "positions must be i32 or i64");
  KernelCall forward = call(c);
  KernelCall back = ref::backwardOf(registry, forward, {0}, randomTensor({8, 10}, 2));
  back.attr("grad_of_inputs", std::vector<int64_t>{0, 3}).output(plan::F32, {8});
  expectFailure(back, "operand 3, which has no gradient");
}

} // namespace
} // namespace moec::runtime::cpu::attention
