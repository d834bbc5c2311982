//===- DsaIndexerTest.cpp - dsa_indexer vs a naive ranking and torch.topk -===//

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "runtime/kernels/cpu/CpuKernels.h"
#include "runtime/kernels/cpu/attention/Reference.h"
#include "runtime/kernels/cpu/attention/TorchTopK.h"
#include "runtime/kernels/testing/KernelTesting.h"

namespace moec::runtime::cpu::attention {
namespace {

using namespace testing;
namespace ref = reference;

class DsaIndexerTest : public ::testing::Test {
protected:
  void SetUp() override { registerAttentionKernels(registry); }

  KernelCall call(OwnedTensor query, OwnedTensor key, OwnedTensor weights,
                  std::vector<int64_t> positions, int64_t heads, int64_t dim, int64_t ropeDim,
                  int64_t topk, int64_t len, plan::DType outType = plan::I32) {
    int64_t tokens = static_cast<int64_t>(positions.size());
    KernelCall k(registry, "dsa_indexer");
    k.input(std::move(query))
        .input(std::move(key))
        .input(std::move(weights))
        .input(indexTensor(plan::I64, {tokens}, positions))
        .output(outType, {tokens, topk})
        .attr("num_heads", heads)
        .attr("head_dim", dim)
        .attr("topk", topk)
        .attr("rope.theta", 10000.0)
        .attr("rope.dim", ropeDim)
        .attr("rope.style", "half")
        .sequences(len, tokens / len);
    return k;
  }

  /// One query head (1, 0) over keys (k0[s], 0) at position 0 (no rotation),
  /// unit weights: the scores are relu(k0 · 2^-½), as in the torch data.
  void expectTorchPicks(const std::vector<float> &keys, int64_t topk,
                        const std::vector<int64_t> &want) {
    int64_t len = static_cast<int64_t>(keys.size()), tokens = 2 * len;
    std::vector<float> q, k;
    for (int64_t t = 0; t < tokens; ++t) {
      q.insert(q.end(), {1.0f, 0.0f});
      k.insert(k.end(), {keys[t % len], 0.0f});
    }
    KernelCall c =
        call(floatTensor({tokens, 2}, q), floatTensor({tokens, 2}, k),
             filledTensor({tokens, 1}, 1.0f), std::vector<int64_t>(tokens, 0), 1, 2, 2, topk, len);
    c.run();
    std::vector<int64_t> got = c.result(0).indices();
    for (int64_t b = 0; b < 2; ++b) // both sequences pick alike
      for (int64_t t = 0; t < len; ++t)
        for (int64_t j = 0; j < topk; ++j)
          ASSERT_EQ(got[(b * len + t) * topk + j], want[t * topk + j])
              << "sequence " << b << " row " << t << " slot " << j;
  }

  KernelRegistry registry;
};

TEST_F(DsaIndexerTest, TiesResolveAsTorchTopk) {
  expectTorchPicks(torch_topk::kMixedKeys, 5, torch_topk::kMixed5);
  expectTorchPicks(torch_topk::kMixedKeys, 16, torch_topk::kMixed16);
  expectTorchPicks(std::vector<float>(16, 0.0f), 5, torch_topk::kZeros5);
  std::vector<float> sparse(200, -1.0f);
  for (int64_t s = 0; s < 200; s += 37)
    sparse[s] = 0.5f;
  expectTorchPicks(sparse, 3, torch_topk::kLong3);
  expectTorchPicks(std::vector<float>(200, 0.0f), 3, torch_topk::kLongZeros3);
}

TEST_F(DsaIndexerTest, TopKEqualsNaiveRanking) {
  // 2 sequences of 12, 3 heads of 8 whose leading 4 features rotate.
  const int64_t heads = 3, dim = 8, ropeDim = 4, len = 12, tokens = 24;
  std::vector<int64_t> positions;
  for (int64_t t = 0; t < tokens; ++t)
    positions.push_back((t % len) * 2 + 1);
  for (int64_t topk : {5, 12, 15}) {
    for (plan::DType outType : {plan::I32, plan::I64}) {
      KernelCall c = call(randomTensor({tokens, heads * dim}, 31), randomTensor({tokens, dim}, 32),
                          randomTensor({tokens, heads}, 33), positions, heads, dim, ropeDim, topk,
                          len, outType);
      c.run();
      std::vector<int64_t> got = c.result(0).indices();
      std::vector<float> q = c.inputsRef()[0].floats(), k = c.inputsRef()[1].floats(),
                         w = c.inputsRef()[2].floats();
      ref::Rope r;
      r.dim = ropeDim;
      int exact = 0;
      for (int64_t t = 0; t < tokens; ++t) {
        int64_t first = t - t % len, last = t % len;
        // I[t,s] = Σ_h w·H^-½ · relu(q_h·k_s · D^-½) with the leading features rotated.
        std::vector<double> score(last + 1, 0.0);
        for (int64_t s = 0; s <= last; ++s) {
          ref::Vec ks = ref::rope(r, ref::slice(k, dim, first + s, 1, 0, dim)[0],
                                  double(positions[first + s]));
          for (int64_t h = 0; h < heads; ++h) {
            ref::Vec qh = ref::rope(r, ref::slice(q, heads * dim, t, 1, h * dim, dim)[0],
                                    double(positions[t]));
            score[s] += w[t * heads + h] / std::sqrt(double(heads)) *
                        std::max(0.0, ref::dot(qh, ks) / std::sqrt(double(dim)));
          }
        }
        std::vector<double> sorted = score;
        std::sort(sorted.rbegin(), sorted.rend());
        int64_t count = std::min(topk, last + 1);
        std::set<int64_t> picked;
        for (int64_t j = 0; j < topk; ++j) {
          int64_t s = got[t * topk + j];
          if (j >= count) {
            EXPECT_EQ(s, -1) << "row " << t << " pads slot " << j;
            continue;
          }
          ASSERT_TRUE(s >= 0 && s <= last) << "row " << t << " picked " << s;
          picked.insert(s);
          EXPECT_GE(score[s], sorted[count - 1] - 1e-6) << "row " << t << " picked " << s;
          if (j > 0) { // torch.topk's order: by decreasing score
            EXPECT_LE(score[s], score[got[t * topk + j - 1]] + 1e-6);
          }
        }
        EXPECT_EQ(static_cast<int64_t>(picked.size()), count) << "row " << t << " repeats a key";
        // Where no tie straddles the cut, the set is exactly the naive top-k.
        if (count <= last && sorted[count - 1] - sorted[count] < 1e-4)
          continue;
        std::set<int64_t> want;
        for (int64_t s = 0; s <= last; ++s)
          if (score[s] >= sorted[count - 1])
            want.insert(s);
        EXPECT_EQ(picked, want) << "row " << t;
        ++exact;
      }
      EXPECT_GE(exact, tokens / 2) << "too many ties to compare sets";
    }
  }
}

TEST_F(DsaIndexerTest, PositionsAndRopeMatter) {
  // The same inputs at other positions rank differently somewhere: RoPE reaches the scores.
  const int64_t tokens = 16;
  std::vector<int64_t> near(tokens), far(tokens);
  for (int64_t t = 0; t < tokens; ++t) {
    near[t] = t;
    far[t] = 50 * t;
  }
  KernelCall a = call(randomTensor({tokens, 16}, 41), randomTensor({tokens, 8}, 42),
                      filledTensor({tokens, 2}, 1.0f), near, 2, 8, 8, 4, tokens);
  KernelCall b = call(randomTensor({tokens, 16}, 41), randomTensor({tokens, 8}, 42),
                      filledTensor({tokens, 2}, 1.0f), far, 2, 8, 8, 4, tokens);
  a.run();
  b.run();
  EXPECT_NE(a.result(0).indices(), b.result(0).indices());
}

TEST_F(DsaIndexerTest, ThreadsChangeNothing) {
  auto make = [&] {
    std::vector<int64_t> positions(20);
    for (int64_t t = 0; t < 20; ++t)
      positions[t] = t % 10;
    return call(randomTensor({20, 12}, 51), randomTensor({20, 6}, 52), randomTensor({20, 2}, 53),
                positions, 2, 6, 2, 4, 10);
  };
  KernelCall serial = make(), parallel = make();
  ThreadPool pool(3);
  parallel.threads(&pool);
  serial.run();
  parallel.run();
  EXPECT_EQ(serial.result(0).indices(), parallel.result(0).indices());
}

TEST_F(DsaIndexerTest, BadLaunchesFailWithAMessage) {
  auto expectFailure = [&](KernelCall k, const std::string &text) {
    try {
      k.run();
      ADD_FAILURE() << "no failure, expected: " << text;
    } catch (const KernelError &e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  auto good = [&] {
    return call(randomTensor({8, 16}, 1), randomTensor({8, 8}, 2), randomTensor({8, 2}, 3),
                std::vector<int64_t>(8, 0), 2, 8, 4, 3, 4);
  };
  KernelCall topk = good();
  topk.attributes().erase("topk");
  expectFailure(topk, "missing attribute 'topk'");
  KernelCall key = good();
  key.inputsRef()[1] = randomTensor({8, 6}, 2);
  expectFailure(key, "key has shape [8,6], expected [8,8]");
  KernelCall weights = good();
  weights.inputsRef()[2] = randomTensor({8, 3}, 2);
  expectFailure(weights, "head_weights has shape [8,3], expected [8,2]");
  KernelCall out = good();
  out.result(0) = zeroTensor(plan::I32, {8, 4});
  expectFailure(out, "indices has shape [8,4], expected [8,3]");
  KernelCall dtype = good();
  dtype.result(0) = zeroTensor(plan::F32, {8, 3});
  expectFailure(dtype, "indices must be i32 or i64");
  KernelCall rope = good();
  rope.attr("rope.dim", 10);
  expectFailure(rope, "at most 8");
}

} // namespace
} // namespace moec::runtime::cpu::attention
