//===- KdaTest.cpp - kda on CUDA against the CPU twin ----------------------===//
//
// The CPU test's configurations plus ragged sequence lengths (7, 13, 33, 100),
// several sequences, head_dim 16, 64 and 128 (the real size), different conv
// widths for q, k and v, in F32 and BF16 storage. The backward's parameter
// gradients (the convs, a_log, dt_bias, norm_weight) are sums over every token
// whose terms cancel, so in F32 they are compared at 1e-4 instead of 1e-5.
//
//===----------------------------------------------------------------------===//

#include <gtest/gtest.h>

#include <sstream>

#include "runtime/kernels/cpu/CpuKernels.h"
#include "runtime/kernels/cuda/CudaKernels.h"
#include "runtime/kernels/testing/CudaCompare.h"
#include "runtime/kernels/testing/KernelTesting.h"

namespace moec::runtime::testing {
namespace {

const KernelRegistry &cpuKernels() {
  static KernelRegistry r = [] {
    KernelRegistry out;
    cpu::registerLinearAttentionKernels(out);
    return out;
  }();
  return r;
}

const KernelRegistry &cudaKernels() {
  static KernelRegistry r = [] {
    KernelRegistry out;
    cuda::registerLinearAttentionKernels(out);
    return out;
  }();
  return r;
}

struct Config {
  int64_t heads, dim, width, seqLen, batch;
  double eps = 1e-5;
  int64_t keyWidth = 0, valueWidth = 0; // conv widths of k and v when not `width`

  int64_t tokens() const { return seqLen * batch; }
  int64_t features() const { return heads * dim; }
  int64_t convWidth(int i) const {
    int64_t w[3] = {width, keyWidth ? keyWidth : width, valueWidth ? valueWidth : width};
    return w[i];
  }
  std::string text() const {
    std::ostringstream out;
    out << "H " << heads << " d " << dim << " K " << convWidth(0) << "/" << convWidth(1) << "/"
        << convWidth(2) << " seq_len " << seqLen << " x " << batch << " eps " << eps;
    return out.str();
  }
};

enum Operand {
  Query,
  Key,
  Value,
  QueryConv,
  KeyConv,
  ValueConv,
  Decay,
  BetaLogits,
  Gate,
  ALog,
  DtBias,
  NormWeight
};

std::vector<std::vector<int64_t>> shapes(const Config &c) {
  int64_t T = c.tokens(), W = c.features();
  return {{T, W},
          {T, W},
          {T, W},
          {W, 1, c.convWidth(0)},
          {W, 1, c.convWidth(1)},
          {W, 1, c.convWidth(2)},
          {T, W},
          {T, c.heads},
          {T, W},
          {1, 1, c.heads, 1},
          {W},
          {c.dim}};
}

/// The CPU test's inputs (norm_weight = 1 + U(-0.3, 0.3)).
std::vector<OwnedTensor> randomInputs(const Config &c, uint64_t seed) {
  const float scales[] = {1.0f, 1.0f, 1.0f, 0.6f, 0.6f, 0.6f, 1.0f, 1.5f, 1.5f, 0.5f, 0.5f, 0.3f};
  std::vector<std::vector<int64_t>> s = shapes(c);
  std::vector<OwnedTensor> in;
  for (size_t i = 0; i < s.size(); ++i)
    in.push_back(randomTensor(s[i], seed + i, scales[i]));
  auto *w = reinterpret_cast<float *>(in[NormWeight].bytes.data());
  for (int64_t i = 0; i < c.dim; ++i)
    w[i] += 1.0f;
  return in;
}

void setAttrs(KernelCall &call, const Config &c) {
  call.attr("num_heads", c.heads).attr("head_dim", c.dim).attr("eps", c.eps).sequences(c.seqLen, c.batch);
}

KernelCall forwardCall(const KernelRegistry &registry, const Config &c, uint64_t seed) {
  KernelCall call(registry, "kda");
  for (OwnedTensor &t : randomInputs(c, seed))
    call.input(t);
  setAttrs(call, c);
  call.output(plan::F32, {c.tokens(), c.features()});
  return call;
}

KernelCall backwardCall(const Config &c, uint64_t seed, const std::vector<int64_t> &wrt,
                        bool withGradient = true) {
  KernelCall call(cpuKernels(), "kda.backward");
  std::vector<OwnedTensor> in = randomInputs(c, seed);
  for (OwnedTensor &t : in)
    call.input(t);
  if (withGradient)
    call.input(randomTensor({c.tokens(), c.features()}, seed + 100));
  setAttrs(call, c);
  call.attr("grad_of_inputs", wrt)
      .attr("grad_of_outputs", withGradient ? std::vector<int64_t>{0} : std::vector<int64_t>{})
      .attr("backward_segments", std::vector<int64_t>{12, 0, withGradient ? 1 : 0});
  for (int64_t i : wrt)
    call.output(plan::F32, in[i].shape);
  return call;
}

/// Compares a fresh call in F32 and in BF16 storage; skips the test without a GPU.
template <typename MakeCall>
void compareBoth(const MakeCall &make, const std::string &what, double f32Tolerance = 0) {
  for (plan::DType storage : {plan::F32, plan::BF16}) {
    KernelCall call = make();
    CudaCompareOptions options;
    options.storage = storage;
    if (storage == plan::F32)
      options.tolerance = f32Tolerance;
    CudaComparison r = compareCudaWithCpu(cudaKernels(), call, options);
    if (r.skipped)
      GTEST_SKIP() << r.why;
    EXPECT_TRUE(r.ok) << what << (storage == plan::F32 ? " (f32)" : " (bf16)") << "\n" << r.report;
  }
}

#define COMPARE(...)                                                                                         \
  do {                                                                                                       \
    compareBoth(__VA_ARGS__);                                                                                \
    if (::testing::Test::IsSkipped())                                                                        \
      return;                                                                                                \
  } while (0)

const std::vector<Config> forwardConfigs = {
    // The CPU test's.
    {2, 4, 4, 6, 2},
    {3, 5, 4, 9, 1},
    {1, 8, 2, 12, 1},
    {4, 4, 4, 4, 3},
    {2, 4, 4, 5, 2, 1e-2},
    {2, 4, 4, 7, 2},
    // Ragged lengths, several sequences, larger heads, different conv widths.
    {2, 16, 4, 7, 2},
    {1, 16, 4, 13, 3},
    {2, 16, 4, 33, 2},
    {1, 64, 4, 100, 2},
    {2, 64, 3, 13, 1},
    {3, 16, 2, 33, 2, 1e-5, 3, 4},
    {1, 128, 4, 33, 1},
};

TEST(CudaKda, ForwardMatchesCpu) {
  uint64_t seed = 1;
  for (const Config &c : forwardConfigs) {
    ++seed;
    COMPARE([&] { return forwardCall(cpuKernels(), c, seed); }, "forward " + c.text());
  }
}

const std::vector<Config> backwardConfigs = {
    // The CPU test's.
    {2, 4, 4, 6, 2},
    {1, 6, 3, 8, 1},
    {2, 3, 4, 5, 2},
    {1, 4, 4, 30, 1}, // checkpoints every 6 tokens
    // Ragged lengths, several sequences, larger heads, different conv widths.
    {2, 16, 4, 7, 2},
    {2, 16, 4, 33, 2},
    {1, 16, 4, 13, 3},
    {1, 64, 4, 100, 2},
    {3, 16, 2, 33, 2, 1e-5, 3, 4},
    {1, 128, 4, 33, 1},
};

TEST(CudaKda, ActivationGradientsMatchCpu) {
  uint64_t seed = 30;
  for (const Config &c : backwardConfigs) {
    ++seed;
    COMPARE(
        [&] {
          return backwardCall(c, seed, {Query, Key, Value, Decay, BetaLogits, Gate});
        },
        "d query, key, value, decay, beta_logits, gate " + c.text());
  }
}

TEST(CudaKda, ParameterGradientsMatchCpu) {
  uint64_t seed = 60;
  for (const Config &c : backwardConfigs) {
    ++seed;
    COMPARE(
        [&] {
          return backwardCall(c, seed, {QueryConv, KeyConv, ValueConv, ALog, DtBias, NormWeight});
        },
        "d convs, a_log, dt_bias, norm_weight " + c.text(), 1e-4);
  }
}

TEST(CudaKda, GradientSubsetsInAnyOrder) {
  Config c{2, 8, 4, 13, 2};
  COMPARE(
      [&] {
        return backwardCall(c, 91, {10, 0, 11, 7, 3, 9, 1, 8, 2, 6, 5, 4});
      },
      "all twelve, shuffled", 1e-4);
  COMPARE([&] { return backwardCall(c, 92, {DtBias}); }, "dt_bias alone", 1e-4);
  COMPARE([&] { return backwardCall(c, 93, {Gate}); }, "gate alone");
}

TEST(CudaKda, NoOutputGradientGivesZeros) {
  Config c{2, 4, 4, 3, 1};
  COMPARE([&] { return backwardCall(c, 95, {Query, ALog}, /*withGradient=*/false); }, "no gradient");
}

// Bad launches fail on the host, before any device work (these run without a GPU).
void expectFailure(KernelCall &call, const std::string &needle) {
  try {
    call.run();
    ADD_FAILURE() << "expected a failure mentioning " << needle;
  } catch (const KernelError &e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(CudaKda, BadLaunchesFail) {
  Config c{2, 4, 4, 3, 2};
  struct Bad {
    int operand;
    std::vector<int64_t> shape;
    const char *needle;
  };
  for (const Bad &bad : std::vector<Bad>{{Key, {6, 9}, "key"},
                                         {ValueConv, {8, 1}, "value_conv"},
                                         {Decay, {6, 2}, "decay"},
                                         {BetaLogits, {6, 8}, "beta_logits"},
                                         {Gate, {5, 8}, "gate"},
                                         {ALog, {1, 1, 3, 1}, "a_log"},
                                         {DtBias, {2}, "dt_bias"},
                                         {NormWeight, {8}, "norm_weight"}}) {
    KernelCall call = forwardCall(cudaKernels(), c, 71);
    call.inputsRef()[bad.operand] = randomTensor(bad.shape, 1);
    expectFailure(call, bad.needle);
  }
  {
    KernelCall call = forwardCall(cudaKernels(), c, 71);
    call.attributes().erase("head_dim");
    expectFailure(call, "head_dim");
  }
  {
    KernelCall call = forwardCall(cudaKernels(), c, 71);
    call.attributes().erase("eps");
    expectFailure(call, "eps");
  }
  {
    KernelCall call = forwardCall(cudaKernels(), c, 71);
    call.inputsRef()[Gate] = zeroTensor(plan::F16, {6, 8});
    expectFailure(call, "gate must be f32 or bf16");
  }
  {
    KernelCall call = forwardCall(cudaKernels(), c, 71);
    call.sequences(2, 2);
    expectFailure(call, "seq_len");
  }
  {
    KernelCall forward = forwardCall(cudaKernels(), c, 71);
    KernelCall call(cudaKernels(), "kda.backward");
    for (OwnedTensor &t : forward.inputsRef())
      call.input(t);
    call.input(randomTensor({c.tokens(), c.features()}, 1));
    call.attributes() = forward.attributes();
    call.attr("grad_of_inputs", std::vector<int64_t>{12})
        .attr("grad_of_outputs", std::vector<int64_t>{0})
        .sequences(c.seqLen, c.batch)
        .output(plan::F32, {1});
    expectFailure(call, "grad_of_inputs names operand 12");
  }
}

} // namespace
} // namespace moec::runtime::testing
