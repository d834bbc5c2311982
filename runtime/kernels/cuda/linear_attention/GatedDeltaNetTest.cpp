//===- GatedDeltaNetTest.cpp - gated_delta_net on CUDA against the CPU twin ===//
//
// The CPU test's configurations plus ragged sequence lengths (7, 13, 33, 100),
// several sequences, dk = dv = 16, 64 and 128 (the real size: the backward
// then needs opt-in shared memory), in F32 and BF16 storage. The backward's
// parameter gradients (conv_weight, a_log, dt_bias, norm_weight) are sums over
// every token whose terms cancel, so in F32 they are compared at 1e-4 instead
// of 1e-5 (f32 state and intermediates against the CPU's double).
//
// Both forms of the delta rule (DeltaRulePath.h): the default (chunked, for
// every configuration here) on all of the above, the recurrent fallback
// pinned on the same configurations, and the chunked form pinned on long and
// ragged sequences (100, 130, 257, 1000 tokens: partial chunks, many chunks),
// dk = dv = 128, dk up to 256 and dv above 128 (several value blocks of the
// sweep), forward and all six gradients.
//
//===----------------------------------------------------------------------===//

#include <gtest/gtest.h>

#include <sstream>

#include "runtime/kernels/cpu/CpuKernels.h"
#include "runtime/kernels/cuda/CudaKernels.h"
#include "runtime/kernels/cuda/linear_attention/DeltaRulePath.h"
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
  int64_t hk, hv, dk, dv, width, seqLen, batch;
  double eps = 1e-6;

  int64_t tokens() const { return seqLen * batch; }
  int64_t qkvzWidth() const { return 2 * hk * dk + 2 * hv * dv; }
  int64_t channels() const { return 2 * hk * dk + hv * dv; }
  std::string text() const {
    std::ostringstream out;
    out << "Hk " << hk << " Hv " << hv << " dk " << dk << " dv " << dv << " K " << width << " seq_len "
        << seqLen << " x " << batch << " eps " << eps;
    return out.str();
  }
};

/// The CPU test's inputs: qkvz, ba, conv_weight, a_log, dt_bias, norm_weight (1 + U(-0.3, 0.3)).
std::vector<OwnedTensor> randomInputs(const Config &c, uint64_t seed) {
  OwnedTensor norm = randomTensor({c.dv}, seed + 5, 0.3f);
  auto *w = reinterpret_cast<float *>(norm.bytes.data());
  for (int64_t i = 0; i < c.dv; ++i)
    w[i] += 1.0f;
  std::vector<OwnedTensor> in;
  in.push_back(randomTensor({c.tokens(), c.qkvzWidth()}, seed, 1.0f));
  in.push_back(randomTensor({c.tokens(), 2 * c.hv}, seed + 1, 1.5f));
  in.push_back(randomTensor({c.channels(), 1, c.width}, seed + 2, 0.6f));
  in.push_back(randomTensor({c.hv}, seed + 3, 0.5f));
  in.push_back(randomTensor({c.hv}, seed + 4, 0.5f));
  in.push_back(norm);
  return in;
}

void setAttrs(KernelCall &call, const Config &c) {
  call.attr("num_key_heads", c.hk)
      .attr("num_value_heads", c.hv)
      .attr("key_head_dim", c.dk)
      .attr("value_head_dim", c.dv)
      .attr("eps", c.eps)
      .sequences(c.seqLen, c.batch);
}

KernelCall forwardCall(const Config &c, uint64_t seed) {
  KernelCall call(cpuKernels(), "gated_delta_net");
  for (OwnedTensor &t : randomInputs(c, seed))
    call.input(t);
  setAttrs(call, c);
  call.output(plan::F32, {c.tokens(), c.hv * c.dv});
  return call;
}

/// The backward as checkGradients launches it: operands, the result's gradient; `wrt` outputs.
KernelCall backwardCall(const Config &c, uint64_t seed, const std::vector<int64_t> &wrt,
                        bool withGradient = true) {
  KernelCall call(cpuKernels(), "gated_delta_net.backward");
  std::vector<OwnedTensor> in = randomInputs(c, seed);
  for (OwnedTensor &t : in)
    call.input(t);
  if (withGradient)
    call.input(randomTensor({c.tokens(), c.hv * c.dv}, seed + 100));
  setAttrs(call, c);
  call.attr("grad_of_inputs", wrt)
      .attr("grad_of_outputs", withGradient ? std::vector<int64_t>{0} : std::vector<int64_t>{})
      .attr("backward_segments", std::vector<int64_t>{6, 0, withGradient ? 1 : 0});
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
    {2, 4, 4, 6, 4, 6, 2},
    {1, 3, 5, 4, 4, 9, 1},
    {2, 2, 8, 8, 4, 4, 3},
    {2, 4, 4, 4, 2, 12, 1},
    {1, 2, 4, 4, 4, 5, 2, 1e-2},
    {2, 4, 4, 4, 4, 7, 2},
    // Ragged lengths, several sequences, larger heads.
    {2, 4, 16, 16, 4, 7, 2},
    {1, 1, 16, 16, 4, 13, 1},
    {2, 4, 16, 16, 4, 33, 2},
    {2, 6, 16, 16, 3, 33, 1},
    {1, 2, 64, 64, 4, 100, 2},
    {2, 4, 16, 32, 4, 13, 2},
    {1, 2, 32, 16, 4, 33, 2},
    {1, 2, 128, 128, 4, 33, 1},
};

using cuda::linattn::DeltaRulePath;

/// Pins the delta rule's form for one test; back to the default after it.
class PathGuard {
public:
  explicit PathGuard(DeltaRulePath path) { cuda::linattn::setDeltaRulePath(path); }
  ~PathGuard() { cuda::linattn::setDeltaRulePath(DeltaRulePath::Auto); }
};

TEST(CudaGatedDeltaNet, ForwardMatchesCpu) {
  uint64_t seed = 1;
  for (const Config &c : forwardConfigs) {
    ++seed;
    COMPARE([&] { return forwardCall(c, seed); }, "forward " + c.text());
  }
}

TEST(CudaGatedDeltaNet, RecurrentForwardMatchesCpu) {
  PathGuard path(DeltaRulePath::Recurrent);
  uint64_t seed = 101;
  for (const Config &c : forwardConfigs) {
    ++seed;
    COMPARE([&] { return forwardCall(c, seed); }, "recurrent forward " + c.text());
  }
}

const std::vector<Config> backwardConfigs = {
    // The CPU test's.
    {2, 4, 4, 6, 4, 6, 2},
    {1, 3, 5, 4, 4, 9, 1},
    {2, 4, 3, 4, 4, 5, 2},
    {1, 2, 4, 4, 4, 40, 1}, // checkpoints every 7 tokens
    {2, 4, 4, 4, 4, 6, 2},
    // Ragged lengths, several sequences, larger heads.
    {2, 4, 16, 16, 4, 7, 2},
    {2, 4, 16, 16, 4, 33, 2},
    {1, 1, 16, 16, 4, 13, 3},
    {1, 2, 64, 64, 4, 100, 2},
    {2, 4, 16, 32, 4, 13, 2},
    {1, 2, 32, 16, 3, 33, 2},
    {1, 2, 128, 128, 4, 33, 1},
};

TEST(CudaGatedDeltaNet, ActivationGradientsMatchCpu) {
  uint64_t seed = 30;
  for (const Config &c : backwardConfigs) {
    ++seed;
    COMPARE([&] { return backwardCall(c, seed, {0, 1}); }, "d qkvz, d ba " + c.text());
  }
}

TEST(CudaGatedDeltaNet, ParameterGradientsMatchCpu) {
  uint64_t seed = 60;
  for (const Config &c : backwardConfigs) {
    ++seed;
    COMPARE(
        [&] {
          return backwardCall(c, seed, {2, 3, 4, 5});
        },
        "d conv_weight, a_log, dt_bias, norm_weight " + c.text(), 1e-4);
  }
}

TEST(CudaGatedDeltaNet, RecurrentGradientsMatchCpu) {
  PathGuard path(DeltaRulePath::Recurrent);
  uint64_t seed = 130;
  for (const Config &c : backwardConfigs) {
    ++seed;
    COMPARE([&] { return backwardCall(c, seed, {0, 1}); }, "recurrent d qkvz, d ba " + c.text());
    COMPARE([&] { return backwardCall(c, seed, {2, 3, 4, 5}); },
            "recurrent d conv_weight, a_log, dt_bias, norm_weight " + c.text(), 1e-4);
  }
}

// Long and ragged sequences on the chunked form: partial last chunks, many
// chunks per sequence, several sequences, the widest sweep (dk 256) and dv
// spread over several blocks of 32 value columns.
const std::vector<Config> chunkedConfigs = {
    {1, 2, 128, 128, 4, 100, 1},
    {2, 4, 128, 128, 4, 257, 1},
    {1, 2, 128, 128, 4, 1000, 1},
    {1, 2, 128, 128, 4, 128, 2},
    {2, 4, 32, 48, 4, 257, 2},
    {1, 3, 16, 24, 4, 1000, 1},
    {2, 2, 64, 64, 3, 100, 3},
    {1, 2, 192, 160, 4, 130, 1},
    {1, 1, 256, 40, 4, 70, 2},
};

TEST(CudaGatedDeltaNet, ChunkedLongSequencesMatchCpu) {
  PathGuard path(DeltaRulePath::Chunked);
  uint64_t seed = 200;
  for (const Config &c : chunkedConfigs) {
    ++seed;
    COMPARE([&] { return forwardCall(c, seed); }, "chunked forward " + c.text());
    COMPARE([&] { return backwardCall(c, seed, {0, 1}); }, "chunked d qkvz, d ba " + c.text());
    COMPARE([&] { return backwardCall(c, seed, {2, 3, 4, 5}); },
            "chunked d conv_weight, a_log, dt_bias, norm_weight " + c.text(), 1e-4);
  }
}

TEST(CudaGatedDeltaNet, GradientSubsetsInAnyOrder) {
  Config c{2, 4, 8, 8, 4, 13, 2};
  COMPARE([&] { return backwardCall(c, 91, {4, 0, 5, 1, 3, 2}); }, "all six, shuffled", 1e-4);
  COMPARE([&] { return backwardCall(c, 92, {5}); }, "norm_weight alone", 1e-4);
  COMPARE([&] { return backwardCall(c, 93, {1}); }, "ba alone");
}

TEST(CudaGatedDeltaNet, NoOutputGradientGivesZeros) {
  Config c{1, 2, 4, 4, 4, 3, 1};
  COMPARE([&] { return backwardCall(c, 95, {0, 3}, /*withGradient=*/false); }, "no gradient");
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

KernelCall cudaForward(const Config &c) {
  KernelCall call(cudaKernels(), "gated_delta_net");
  for (OwnedTensor &t : randomInputs(c, 71))
    call.input(t);
  setAttrs(call, c);
  call.output(plan::F32, {c.tokens(), c.hv * c.dv});
  return call;
}

TEST(CudaGatedDeltaNet, BadLaunchesFail) {
  Config c{2, 4, 4, 4, 4, 3, 2};
  {
    KernelCall call = cudaForward(c);
    call.inputsRef()[0] = randomTensor({c.tokens(), c.qkvzWidth() - 1}, 1);
    expectFailure(call, "qkvz");
  }
  {
    KernelCall call = cudaForward(c);
    call.inputsRef()[1] = randomTensor({c.tokens(), c.hv}, 1);
    expectFailure(call, "ba");
  }
  {
    KernelCall call = cudaForward(c);
    call.inputsRef()[2] = randomTensor({c.channels(), 4}, 1);
    expectFailure(call, "conv_weight");
  }
  {
    KernelCall call = cudaForward(c);
    call.inputsRef()[4] = randomTensor({c.hv + 1}, 1);
    expectFailure(call, "dt_bias");
  }
  {
    KernelCall call = cudaForward(c);
    call.attributes().erase("num_key_heads");
    expectFailure(call, "num_key_heads");
  }
  {
    KernelCall call = cudaForward(c);
    call.attr("num_key_heads", int64_t(3));
    expectFailure(call, "num_value_heads");
  }
  {
    KernelCall call = cudaForward(c);
    call.sequences(4, 2);
    expectFailure(call, "seq_len");
  }
  {
    KernelCall call = cudaForward(c);
    call.inputsRef()[3] = zeroTensor(plan::F16, {c.hv});
    expectFailure(call, "a_log must be f32 or bf16");
  }
  KernelCall forward = cudaForward(c);
  {
    KernelCall call(cudaKernels(), "gated_delta_net.backward");
    call.input(forward.inputsRef()[0]).input(forward.inputsRef()[1]);
    call.attributes() = forward.attributes();
    call.attr("grad_of_inputs", std::vector<int64_t>{0}).sequences(c.seqLen, c.batch);
    call.output(plan::F32, forward.inputsRef()[0].shape);
    expectFailure(call, "inputs");
  }
  {
    KernelCall call(cudaKernels(), "gated_delta_net.backward");
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
    KernelCall call(cudaKernels(), "gated_delta_net.backward");
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

} // namespace
} // namespace moec::runtime::testing
