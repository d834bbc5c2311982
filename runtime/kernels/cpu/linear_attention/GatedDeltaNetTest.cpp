//===- GatedDeltaNetTest.cpp - gated_delta_net against a naive reference ---===//

#include <gtest/gtest.h>

#include <set>

#include "runtime/kernels/cpu/CpuKernels.h"
#include "runtime/kernels/cpu/linear_attention/ReferenceTesting.h"
#include "runtime/kernels/testing/KernelTesting.h"

namespace moec::runtime::testing {
namespace {

using namespace reference;

const KernelRegistry &registry() {
  static KernelRegistry r = [] {
    KernelRegistry out;
    cpu::registerLinearAttentionKernels(out);
    return out;
  }();
  return r;
}

struct Config {
  int64_t hk, hv, dk, dv, width, seqLen, batch;
  double eps = 1e-6;

  int64_t tokens() const { return seqLen * batch; }
  int64_t qkvzWidth() const { return 2 * hk * dk + 2 * hv * dv; }
  int64_t channels() const { return 2 * hk * dk + hv * dv; }
};

const std::vector<std::string> names = {"qkvz",  "ba",      "conv_weight",
                                        "a_log", "dt_bias", "norm_weight"};

std::vector<Vec> randomInputs(const Config &c, uint64_t seed) {
  Vec norm = doubles(randomTensor({c.dv}, seed + 5, 0.3f));
  for (double &w : norm)
    w = static_cast<float>(1.0 + w);
  return {doubles(randomTensor({c.tokens(), c.qkvzWidth()}, seed, 1.0f)),
          doubles(randomTensor({c.tokens(), 2 * c.hv}, seed + 1, 1.5f)),
          doubles(randomTensor({c.channels(), 1, c.width}, seed + 2, 0.6f)),
          doubles(randomTensor({c.hv}, seed + 3, 0.5f)),
          doubles(randomTensor({c.hv}, seed + 4, 0.5f)),
          norm};
}

KernelCall makeCall(const Config &c, const std::vector<Vec> &in) {
  KernelCall call(registry(), "gated_delta_net");
  call.input(tensor({c.tokens(), c.qkvzWidth()}, in[0]))
      .input(tensor({c.tokens(), 2 * c.hv}, in[1]))
      .input(tensor({c.channels(), 1, c.width}, in[2]))
      .input(tensor({c.hv}, in[3]))
      .input(tensor({c.hv}, in[4]))
      .input(tensor({c.dv}, in[5]))
      .attr("num_key_heads", c.hk)
      .attr("num_value_heads", c.hv)
      .attr("key_head_dim", c.dk)
      .attr("value_head_dim", c.dv)
      .attr("eps", c.eps)
      .output(plan::F32, {c.tokens(), c.hv * c.dv})
      .sequences(c.seqLen, c.batch);
  return call;
}

/// transformers' Qwen3NextGatedDeltaNet, one sequence at a time: the split of
/// fix_query_key_value_ordering, conv over concat(q, k, v), the recurrent rule
/// per value head, Qwen3NextRMSNormGated.
Vec referenceGdn(const Config &c, const std::vector<Vec> &in) {
  int64_t r = c.hv / c.hk, L = c.seqLen;
  Vec out(static_cast<size_t>(c.tokens() * c.hv * c.dv));
  for (int64_t b = 0; b < c.batch; ++b) {
    Mat qkvz = rows(in[0], c.qkvzWidth(), b * L, L), ba = rows(in[1], 2 * c.hv, b * L, L);
    Mat mixed(L), z(L), beta(L), a(L);
    for (int64_t t = 0; t < L; ++t) {
      // view [Hk, 2dk + 2r dv] then split [dk, dk, r dv, r dv]; ba: view [Hk, 2r], split [r, r].
      Vec q, k, v;
      size_t at = 0, atBa = 0;
      auto take = [](const Vec &row, size_t &cursor, int64_t n, Vec &into) {
        into.insert(into.end(), row.begin() + cursor, row.begin() + cursor + n);
        cursor += n;
      };
      for (int64_t kh = 0; kh < c.hk; ++kh) {
        take(qkvz[t], at, c.dk, q);
        take(qkvz[t], at, c.dk, k);
        take(qkvz[t], at, r * c.dv, v);
        take(qkvz[t], at, r * c.dv, z[t]);
        take(ba[t], atBa, r, beta[t]);
        take(ba[t], atBa, r, a[t]);
      }
      mixed[t] = q;
      mixed[t].insert(mixed[t].end(), k.begin(), k.end());
      mixed[t].insert(mixed[t].end(), v.begin(), v.end());
    }
    Mat conv = convSilu(mixed, in[2], c.width);
    for (int64_t h = 0; h < c.hv; ++h) {
      int64_t kh = h / r;
      Mat Q, K, V, G;
      Vec B;
      for (int64_t t = 0; t < L; ++t) {
        Q.push_back(l2normalize(Vec(conv[t].begin() + kh * c.dk, conv[t].begin() + (kh + 1) * c.dk),
                                1.0 / std::sqrt(static_cast<double>(c.dk))));
        int64_t k0 = c.hk * c.dk + kh * c.dk, v0 = 2 * c.hk * c.dk + h * c.dv;
        K.push_back(l2normalize(Vec(conv[t].begin() + k0, conv[t].begin() + k0 + c.dk), 1.0));
        V.emplace_back(conv[t].begin() + v0, conv[t].begin() + v0 + c.dv);
        B.push_back(sigmoid(beta[t][h]));
        G.emplace_back(c.dk, -std::exp(in[3][h]) * softplus(a[t][h] + in[4][h]));
      }
      Mat o = deltaRule(Q, K, V, B, G);
      for (int64_t t = 0; t < L; ++t) {
        Vec gate(z[t].begin() + h * c.dv, z[t].begin() + (h + 1) * c.dv);
        Vec y = gatedRmsNorm(o[t], gate, in[5], c.eps, /*siluGate=*/true);
        std::copy(y.begin(), y.end(), out.begin() + ((b * L + t) * c.hv + h) * c.dv);
      }
    }
  }
  return out;
}

void expectForwardMatches(const Config &c, uint64_t seed) {
  std::vector<Vec> in = randomInputs(c, seed);
  KernelCall call = makeCall(c, in);
  call.run();
  expectNear(call.result(0).floats(), referenceGdn(c, in), 1e-5, "gated_delta_net");
}

TEST(GatedDeltaNet, ForwardMatchesReference) {
  expectForwardMatches({2, 4, 4, 6, 4, 6, 2}, 1);  // two value heads per key head, two sequences
  expectForwardMatches({1, 3, 5, 4, 4, 9, 1}, 2);  // three per key head, dk > dv
  expectForwardMatches({2, 2, 8, 8, 4, 4, 3}, 3);  // no repetition, three short sequences
  expectForwardMatches({2, 4, 4, 4, 2, 12, 1}, 4); // a kernel of 2, a longer sequence
  Config epsilon{1, 2, 4, 4, 4, 5, 2};
  epsilon.eps = 1e-2;
  expectForwardMatches(epsilon, 5);
}

TEST(GatedDeltaNet, SequencesDoNotShareState) {
  Config two{2, 4, 4, 4, 4, 7, 2}, one{2, 4, 4, 4, 4, 7, 1};
  std::vector<Vec> in = randomInputs(two, 11);
  KernelCall both = makeCall(two, in);
  both.run();
  std::vector<float> together = both.result(0).floats();
  for (int64_t b = 0; b < 2; ++b) {
    std::vector<Vec> part = in;
    int64_t widths[2] = {two.qkvzWidth(), 2 * two.hv};
    for (int i = 0; i < 2; ++i)
      part[i] = Vec(in[i].begin() + b * 7 * widths[i], in[i].begin() + (b + 1) * 7 * widths[i]);
    KernelCall alone = makeCall(one, part);
    alone.run();
    std::vector<float> y = alone.result(0).floats();
    int64_t width = two.hv * two.dv;
    for (int64_t i = 0; i < 7 * width; ++i)
      ASSERT_EQ(y[i], together[b * 7 * width + i]) << "sequence " << b << " element " << i;
  }
}

/// Which output heads move when one input column moves, against the layout of
/// in_proj_qkvz / in_proj_ba written out by hand for Hk = 2, Hv = 4, dk = 2, dv = 3:
/// per key head [q q | k k | v v v (head 2kh) v v v (2kh+1) | z z z | z z z], and
/// ba per key head [b (2kh) b (2kh+1) | a (2kh) a (2kh+1)].
TEST(GatedDeltaNet, GroupedLayout) {
  Config c{2, 4, 2, 3, 4, 5, 1};
  const char *qkvzLayout[32] = {"q0", "q0", "k0", "k0", "v0", "v0", "v0", "v1", "v1", "v1", "z0",
                                "z0", "z0", "z1", "z1", "z1", "q1", "q1", "k1", "k1", "v2", "v2",
                                "v2", "v3", "v3", "v3", "z2", "z2", "z2", "z3", "z3", "z3"};
  const char *baLayout[8] = {"b0", "b1", "a0", "a1", "b2", "b3", "a2", "a3"};
  std::vector<Vec> in = randomInputs(c, 21);
  for (double &w : in[2])
    w = std::abs(w) + 0.2; // every tap passes its channel on
  KernelCall base = makeCall(c, in);
  base.run();
  std::vector<float> y0 = base.result(0).floats();
  auto moved = [&](int input, int64_t column, int64_t width) {
    std::vector<Vec> changed = in;
    for (int64_t t = 0; t < c.tokens(); ++t)
      changed[input][t * width + column] += 0.5;
    KernelCall call = makeCall(c, changed);
    call.run();
    std::vector<float> y = call.result(0).floats();
    std::set<int64_t> heads, outColumns;
    for (int64_t t = 0; t < c.tokens(); ++t)
      for (int64_t j = 0; j < c.hv * c.dv; ++j)
        if (std::abs(y[t * c.hv * c.dv + j] - y0[t * c.hv * c.dv + j]) > 1e-6) {
          heads.insert(j / c.dv);
          outColumns.insert(j);
        }
    return std::make_pair(heads, outColumns);
  };
  for (int64_t col = 0; col < 32; ++col) {
    std::string part = qkvzLayout[col];
    int64_t index = part[1] - '0';
    auto [heads, outColumns] = moved(0, col, 32);
    std::set<int64_t> expected = part[0] == 'q' || part[0] == 'k'
                                     ? std::set<int64_t>{2 * index, 2 * index + 1}
                                     : std::set<int64_t>{index};
    EXPECT_EQ(heads, expected) << "qkvz column " << col << " (" << part << ")";
    if (part[0] == 'z') { // a gate feeds exactly its own output channel
      int64_t channel = (col % 16 - 10) % 3;
      EXPECT_EQ(outColumns, std::set<int64_t>{index * 3 + channel}) << "qkvz column " << col;
    }
  }
  for (int64_t col = 0; col < 8; ++col) {
    std::string part = baLayout[col];
    EXPECT_EQ(moved(1, col, 8).first, std::set<int64_t>{part[1] - '0'})
        << "ba column " << col << " (" << part << ")";
  }
}

TEST(GatedDeltaNet, GradientsMatchCentralDifferences) {
  for (Config c : {Config{2, 4, 4, 6, 4, 6, 2}, Config{1, 3, 5, 4, 4, 9, 1}}) {
    KernelCall call = makeCall(c, randomInputs(c, 31));
    // q, k, v (qkvz and the conv) get a step of 1e-3: the per-head RMSNorm is
    // steep where a head's output is small (o_0 = (k.q) u at a sequence start)
    // and 1e-2 along a random direction of every element leaves an O(step^2)
    // error of up to 50 %. The others keep 1e-2, above the f32 rounding noise.
    GradientCheck steep = checkGradients(registry(), call, {0, 2}, {}, false, 1e-3);
    EXPECT_LT(steep.worstRelativeError, 1e-2) << steep.report;
    GradientCheck smooth = checkGradients(registry(), call, {1, 3, 4, 5});
    EXPECT_LT(smooth.worstRelativeError, 1e-2) << smooth.report;
  }
}

/// Backward launch with output gradient dy, all six gradients asked for.
std::vector<std::vector<float>> backward(const Config &c, const std::vector<Vec> &in, const Vec &dy,
                                         const std::vector<int64_t> &wrt,
                                         ThreadPool *pool = nullptr) {
  KernelCall forward = makeCall(c, in);
  KernelCall call(registry(), "gated_delta_net.backward");
  for (OwnedTensor &t : forward.inputsRef())
    call.input(t);
  call.input(tensor({c.tokens(), c.hv * c.dv}, dy));
  call.attributes() = forward.attributes();
  call.attr("grad_of_inputs", wrt)
      .attr("grad_of_outputs", std::vector<int64_t>{0})
      .attr("backward_segments", std::vector<int64_t>{6, 0, 1})
      .sequences(c.seqLen, c.batch)
      .threads(pool);
  for (int64_t i : wrt)
    call.output(plan::F32, forward.inputsRef()[i].shape);
  call.run();
  std::vector<std::vector<float>> out;
  for (size_t i = 0; i < wrt.size(); ++i)
    out.push_back(call.result(i).floats());
  return out;
}

TEST(GatedDeltaNet, EveryGradientElementMatchesTheReference) {
  Config c{2, 4, 3, 4, 4, 5, 2};
  std::vector<Vec> in = randomInputs(c, 41);
  Vec dy = doubles(randomTensor({c.tokens(), c.hv * c.dv}, 42));
  std::vector<int64_t> all = {0, 1, 2, 3, 4, 5};
  expectGradientsMatch([&](const std::vector<Vec> &x) { return referenceGdn(c, x); }, in, dy, all,
                       backward(c, in, dy, all), names);
}

TEST(GatedDeltaNet, LongSequenceGradientsUseCheckpoints) {
  // 40 tokens: the backward recomputes states from checkpoints every 7 tokens.
  Config c{1, 2, 4, 4, 4, 40, 1};
  std::vector<Vec> in = randomInputs(c, 51);
  Vec dy = doubles(randomTensor({c.tokens(), c.hv * c.dv}, 52));
  std::vector<int64_t> some = {0, 1, 3};
  expectGradientsMatch([&](const std::vector<Vec> &x) { return referenceGdn(c, x); }, in, dy, some,
                       backward(c, in, dy, some), names);
}

TEST(GatedDeltaNet, SubsetsAndThreadsGiveTheSameBits) {
  Config c{2, 4, 4, 4, 4, 6, 2};
  std::vector<Vec> in = randomInputs(c, 61);
  Vec dy = doubles(randomTensor({c.tokens(), c.hv * c.dv}, 62));
  std::vector<std::vector<float>> all = backward(c, in, dy, {0, 1, 2, 3, 4, 5});
  std::vector<std::vector<float>> some = backward(c, in, dy, {4, 2});
  EXPECT_EQ(some[0], all[4]);
  EXPECT_EQ(some[1], all[2]);
  ThreadPool pool(3);
  EXPECT_EQ(backward(c, in, dy, {0, 1, 2, 3, 4, 5}, &pool), all);
  KernelCall serial = makeCall(c, in), parallel = makeCall(c, in);
  parallel.threads(&pool);
  serial.run();
  parallel.run();
  EXPECT_EQ(serial.result(0).floats(), parallel.result(0).floats());
}

void expectFailure(KernelCall &call, const std::string &needle) {
  try {
    call.run();
    ADD_FAILURE() << "expected a failure mentioning " << needle;
  } catch (const KernelError &e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(GatedDeltaNet, BadLaunchesFail) {
  Config c{2, 4, 4, 4, 4, 3, 2};
  std::vector<Vec> in = randomInputs(c, 71);
  {
    KernelCall call = makeCall(c, in);
    call.inputsRef()[0] = randomTensor({c.tokens(), c.qkvzWidth() - 1}, 1);
    expectFailure(call, "qkvz");
  }
  {
    KernelCall call = makeCall(c, in);
    call.inputsRef()[1] = randomTensor({c.tokens(), c.hv}, 1);
    expectFailure(call, "ba");
  }
  {
    KernelCall call = makeCall(c, in);
    call.inputsRef()[2] = randomTensor({c.channels(), 4}, 1);
    expectFailure(call, "conv_weight");
  }
  {
    KernelCall call = makeCall(c, in);
    call.inputsRef()[4] = randomTensor({c.hv + 1}, 1);
    expectFailure(call, "dt_bias");
  }
  {
    KernelCall call = makeCall(c, in);
    call.attributes().erase("num_key_heads");
    expectFailure(call, "num_key_heads");
  }
  {
    KernelCall call = makeCall(c, in);
    call.attr("num_key_heads", int64_t(3));
    expectFailure(call, "num_value_heads");
  }
  {
    KernelCall call = makeCall(c, in);
    call.sequences(4, 2);
    expectFailure(call, "seq_len");
  }
  {
    KernelCall call = makeCall(c, in);
    call.inputsRef()[3] = zeroTensor(plan::BF16, {c.hv});
    expectFailure(call, "a_log must be f32");
  }
  KernelCall forward = makeCall(c, in);
  {
    KernelCall call(registry(), "gated_delta_net.backward");
    call.input(forward.inputsRef()[0]).input(forward.inputsRef()[1]);
    call.attributes() = forward.attributes();
    call.attr("grad_of_inputs", std::vector<int64_t>{0}).sequences(c.seqLen, c.batch);
    call.output(plan::F32, forward.inputsRef()[0].shape);
    expectFailure(call, "inputs");
  }
  {
    KernelCall call(registry(), "gated_delta_net.backward");
    for (OwnedTensor &t : forward.inputsRef())
      call.input(t);
    call.input(randomTensor({c.tokens(), c.hv * c.dv + 1}, 1));
    call.attributes() = forward.attributes();
    call.attr("grad_of_inputs", std::vector<int64_t>{0})
        .attr("grad_of_outputs", std::vector<int64_t>{0})
        .sequences(c.seqLen, c.batch)
        .output(plan::F32, forward.inputsRef()[0].shape);
    expectFailure(call, "the result's gradient has shape");
  }
  {
    KernelCall call(registry(), "gated_delta_net.backward");
    for (OwnedTensor &t : forward.inputsRef())
      call.input(t);
    call.input(randomTensor({c.tokens(), c.hv * c.dv}, 1));
    call.attributes() = forward.attributes();
    call.attr("grad_of_inputs", std::vector<int64_t>{1})
        .attr("grad_of_outputs", std::vector<int64_t>{0})
        .sequences(c.seqLen, c.batch)
        .output(plan::F32, forward.inputsRef()[0].shape);
    expectFailure(call, "gradient output 0 has shape");
  }
}

TEST(GatedDeltaNet, NoOutputGradientGivesZeros) {
  Config c{1, 2, 4, 4, 4, 3, 1};
  KernelCall forward = makeCall(c, randomInputs(c, 81));
  KernelCall call(registry(), "gated_delta_net.backward");
  for (OwnedTensor &t : forward.inputsRef())
    call.input(t);
  call.attributes() = forward.attributes();
  call.attr("grad_of_inputs", std::vector<int64_t>{0})
      .attr("grad_of_outputs", std::vector<int64_t>{})
      .attr("backward_segments", std::vector<int64_t>{6, 0, 0})
      .output(plan::F32, forward.inputsRef()[0].shape)
      .sequences(c.seqLen, c.batch);
  call.run();
  for (float g : call.result(0).floats())
    ASSERT_EQ(g, 0.0f);
}

} // namespace
} // namespace moec::runtime::testing
