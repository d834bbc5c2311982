//===- Mamba2Test.cpp - the CUDA mamba2 kernels against the CPU ones ------===//
//
// Every launch is set up as cpu/mamba/Mamba2Test.cpp does, run on the CPU (the
// oracle) and on the GPU, F32 and BF16 storage (compareCudaWithCpu).

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/kernels/cpu/CpuKernels.h"
#include "runtime/kernels/cuda/CudaKernels.h"
#include "runtime/kernels/testing/CudaCompare.h"
#include "runtime/kernels/testing/KernelTesting.h"

namespace moec::runtime::cuda {
namespace {

using testing::compareCudaWithCpu;
using testing::CudaCompareOptions;
using testing::CudaComparison;
using testing::floatTensor;
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
  int64_t numOperands() const { return convBias ? 7 : 6; }
  std::string name() const {
    return "H=" + std::to_string(heads) + " p=" + std::to_string(headDim) + " N=" + std::to_string(state) +
           " G=" + std::to_string(groups) + " K=" + std::to_string(kernel) + " S=" + std::to_string(seqLen) +
           " B=" + std::to_string(batch) + " chunk=" + std::to_string(chunk) + (convBias ? " bias" : " no-bias") +
           (dtMin > 0 ? " dt_min=" + std::to_string(dtMin) : "");
  }
};

const std::vector<Config> &configs() {
  static const std::vector<Config> all = {
      // The CPU test's configurations.
      {2, 2, 3, 1, 4, 7, 2, 3, true},   // G=1, chunks of 3 (checkpoints inside a sequence)
      {4, 3, 2, 2, 4, 6, 2, 4, false},  // G=2, no conv bias
      {4, 2, 4, 2, 4, 12, 2, 5, true},  // G=2, longer sequences, uneven last chunk
      {3, 4, 2, 1, 4, 5, 2, 32, false}, // odd head count, chunk longer than the sequence
      {2, 2, 2, 2, 2, 9, 3, 4, true},   // one head per group, K=2, three sequences
      // Lengths and widths that fit no block size.
      {4, 3, 5, 2, 4, 33, 3, 8, true},           // 3 sequences of 33, uneven chunks
      {3, 5, 7, 1, 2, 100, 2, 16, false, 0.3},   // K=2, time_step_min clamps some tokens
      {6, 4, 16, 3, 3, 13, 4, 100, true, 0.1},   // K=3, G=3, chunk longer than the sequence
      {4, 24, 48, 2, 4, 100, 2, 64, true},       // several state rows per warp, columns per lane
      {2, 64, 128, 1, 4, 33, 2, 8, false},       // Nemotron-H's head (p=64, N=128)
      {2, 64, 256, 2, 4, 7, 2, 3, true, 0.05},   // backward scan above 48 KiB of shared memory
  };
  return all;
}

const KernelRegistry &cpuRegistry() {
  static KernelRegistry r = [] {
    KernelRegistry reg;
    cpu::registerMambaKernels(reg);
    return reg;
  }();
  return r;
}

const KernelRegistry &cudaRegistry() {
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

KernelCall forwardCall(const KernelRegistry &registry, const Config &c, const Params &p) {
  KernelCall call(registry, "mamba2");
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

/// mamba2.backward for `wrt` (present-operand indices), as the default rule launches it.
KernelCall backwardCall(const KernelRegistry &registry, const Config &c, const Params &p,
                        const std::vector<float> &gOut, const std::vector<int64_t> &wrt) {
  KernelCall fwd = forwardCall(registry, c, p);
  KernelCall call(registry, "mamba2.backward");
  call.attributes() = fwd.attributes();
  int64_t numOperands = static_cast<int64_t>(fwd.inputsRef().size());
  for (OwnedTensor &t : fwd.inputsRef())
    call.input(t);
  call.input(floatTensor({c.tokens(), c.inner()}, gOut))
      .attr("grad_of_inputs", wrt)
      .attr("grad_of_outputs", std::vector<int64_t>{0})
      .attr("backward_segments", std::vector<int64_t>{numOperands, 0, 1})
      .sequences(c.seqLen, c.batch);
  for (int64_t i : wrt)
    call.output(plan::F32, fwd.inputsRef().at(i).shape);
  return call;
}

std::vector<int64_t> allOperands(const Config &c) {
  std::vector<int64_t> all(c.numOperands());
  for (size_t i = 0; i < all.size(); ++i)
    all[i] = static_cast<int64_t>(i);
  return all;
}

const char *storageName(plan::DType storage) { return storage == plan::BF16 ? "bf16" : "f32"; }

TEST(CudaMamba2, ForwardMatchesCpu) {
  for (const Config &c : configs())
    for (plan::DType storage : {plan::F32, plan::BF16}) {
      SCOPED_TRACE(c.name() + " " + storageName(storage));
      KernelCall call = forwardCall(cpuRegistry(), c, makeParams(c, 11));
      CudaComparison r = compareCudaWithCpu(cudaRegistry(), call, {storage});
      if (r.skipped)
        GTEST_SKIP() << r.why;
      EXPECT_TRUE(r.ok) << r.report;
    }
}

TEST(CudaMamba2, BackwardMatchesCpu) {
  for (const Config &c : configs())
    for (plan::DType storage : {plan::F32, plan::BF16}) {
      SCOPED_TRACE(c.name() + " " + storageName(storage));
      Params p = makeParams(c, 31);
      std::vector<float> gOut = uniform(c.tokens() * c.inner(), 32, 1.0f);
      KernelCall call = backwardCall(cpuRegistry(), c, p, gOut, allOperands(c));
      CudaComparison r = compareCudaWithCpu(cudaRegistry(), call, {storage});
      if (r.skipped)
        GTEST_SKIP() << r.why;
      EXPECT_TRUE(r.ok) << r.report;
    }
}

TEST(CudaMamba2, SomeGradientsInAnyOrder) {
  // Subsets skip kernels and outputs (no zxbcdt gradient, only the norm's, ...).
  for (const Config &c : {configs()[2], configs()[5], configs()[6]})
    for (const std::vector<int64_t> &wrt : std::vector<std::vector<int64_t>>{
             {5, 0, 2}, {static_cast<int64_t>(c.numOperands()) - 1}, {1}, {0}, {3, 4}})
      for (plan::DType storage : {plan::F32, plan::BF16}) {
        std::string list;
        for (int64_t i : wrt)
          list += " " + std::to_string(i);
        SCOPED_TRACE(c.name() + " wrt" + list + " " + storageName(storage));
        Params p = makeParams(c, 51);
        std::vector<float> gOut = uniform(c.tokens() * c.inner(), 52, 1.0f);
        KernelCall call = backwardCall(cpuRegistry(), c, p, gOut, wrt);
        CudaComparison r = compareCudaWithCpu(cudaRegistry(), call, {storage});
        if (r.skipped)
          GTEST_SKIP() << r.why;
        EXPECT_TRUE(r.ok) << r.report;
      }
}

TEST(CudaMamba2, TimeStepMinClamps) {
  // The CPU test's setup: tokens whose softplus falls below time_step_min use the minimum and
  // pass no gradient to dt.
  Config c = configs()[1];
  c.dtMin = 0.2;
  Params p = makeParams(c, 71);
  int64_t dtColumn = c.inner() + c.channels();
  for (int64_t row = 0; row < c.tokens(); ++row)
    for (int64_t h = 0; h < c.heads; ++h) // softplus(-3) = 0.049 (clamped), softplus(1) = 1.31
      p.zxbcdt[row * c.width() + dtColumn + h] = ((row + h) % 2 ? -3.0f : 1.0f) - p.dtBias[h];
  std::vector<float> gOut = uniform(c.tokens() * c.inner(), 72, 1.0f);
  for (plan::DType storage : {plan::F32, plan::BF16}) {
    SCOPED_TRACE(storageName(storage));
    KernelCall fwd = forwardCall(cpuRegistry(), c, p);
    CudaComparison r = compareCudaWithCpu(cudaRegistry(), fwd, {storage});
    if (r.skipped)
      GTEST_SKIP() << r.why;
    EXPECT_TRUE(r.ok) << r.report;
    KernelCall bwd = backwardCall(cpuRegistry(), c, p, gOut, allOperands(c));
    r = compareCudaWithCpu(cudaRegistry(), bwd, {storage});
    EXPECT_TRUE(r.ok) << r.report;
  }
}

TEST(CudaMamba2, MixedStorage) {
  // zxbcdt, the result and its gradient in bf16; the small parameters and their gradients in f32.
  for (const Config &c : {configs()[0], configs()[8]}) {
    SCOPED_TRACE(c.name());
    Params p = makeParams(c, 91);
    CudaCompareOptions options;
    options.storage = plan::BF16;
    for (int64_t i = 1; i < c.numOperands(); ++i)
      options.f32Inputs.push_back(static_cast<size_t>(i));
    KernelCall fwd = forwardCall(cpuRegistry(), c, p);
    CudaComparison r = compareCudaWithCpu(cudaRegistry(), fwd, options);
    if (r.skipped)
      GTEST_SKIP() << r.why;
    EXPECT_TRUE(r.ok) << r.report;

    std::vector<float> gOut = uniform(c.tokens() * c.inner(), 92, 1.0f);
    KernelCall bwd = backwardCall(cpuRegistry(), c, p, gOut, allOperands(c));
    for (int64_t i = 1; i < c.numOperands(); ++i)
      options.f32Outputs.push_back(static_cast<size_t>(i));
    r = compareCudaWithCpu(cudaRegistry(), bwd, options);
    EXPECT_TRUE(r.ok) << r.report;
  }
}

void expectFailure(KernelCall &call, const std::string &needle) {
  try {
    call.run();
    ADD_FAILURE() << "expected a failure naming '" << needle << "'";
  } catch (const KernelError &e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(CudaMamba2, BadLaunchesFail) {
  // The CUDA kernels themselves, given host buffers: every launch here fails in the host
  // checks, before anything touches the device, so this runs without a GPU too.
  Config c = configs()[1]; // no conv bias: 6 operands
  Params p = makeParams(c, 81);
  const KernelRegistry &cuda = cudaRegistry();
  {
    KernelCall call = forwardCall(cuda, c, p);
    call.inputsRef()[0] = randomTensor({c.tokens(), c.width() + 1}, 1);
    expectFailure(call, "zxbcdt");
  }
  {
    KernelCall call = forwardCall(cuda, c, p);
    call.attributes().erase("num_groups");
    expectFailure(call, "missing attribute 'num_groups'");
  }
  {
    KernelCall call = forwardCall(cuda, c, p);
    call.attr("num_groups", 3);
    expectFailure(call, "multiple of num_groups");
  }
  {
    KernelCall call = forwardCall(cuda, c, p);
    call.attr("chunk_size", 0);
    expectFailure(call, "chunk_size must be positive");
  }
  {
    KernelCall call = forwardCall(cuda, c, p);
    call.inputsRef()[1] = randomTensor({c.channels(), 2, c.kernel}, 1);
    expectFailure(call, "conv_weight");
  }
  {
    KernelCall call = forwardCall(cuda, c, p);
    call.inputsRef()[4] = randomTensor({c.heads + 1}, 1); // d_skip
    expectFailure(call, "d_skip must have 4 elements");
  }
  {
    KernelCall call = forwardCall(cuda, c, p);
    call.inputsRef()[2] = testing::zeroTensor(plan::I32, {c.heads}); // dt_bias
    expectFailure(call, "dt_bias must be f32");
  }
  {
    KernelCall call = forwardCall(cuda, c, p);
    call.sequences(c.seqLen + 1, c.batch);
    expectFailure(call, "micro_batch");
  }
  {
    Config biased = c;
    biased.convBias = true;
    Params q = makeParams(biased, 82);
    KernelCall call = forwardCall(cuda, biased, q);
    call.inputsRef()[2] = randomTensor({c.channels() - 1}, 1);
    expectFailure(call, "conv_bias must have");
  }
  {
    KernelCall call = forwardCall(cuda, c, p);
    call.inputsRef().pop_back();
    expectFailure(call, "expected 6 or 7 forward operands");
  }
  {
    // A backward whose gradient output does not match its operand.
    KernelCall fwd = forwardCall(cuda, c, p);
    KernelCall call(cuda, "mamba2.backward");
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
} // namespace moec::runtime::cuda
