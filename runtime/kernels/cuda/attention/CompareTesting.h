//===- CompareTesting.h - CUDA-vs-CPU comparisons for the attention tests -*- C++ -*-===//
//
// Each comparison builds a fresh launch (the harness rounds a call's inputs
// to bf16 in place) and runs it with F32 and with BF16 storage. runBf16 and
// expectBlocksClose add a stricter BF16 check: per head of each row as well
// as over the whole output.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CUDA_ATTENTION_COMPARETESTING_H_
#define RUNTIME_KERNELS_CUDA_ATTENTION_COMPARETESTING_H_

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "runtime/kernels/cpu/CpuKernels.h"
#include "runtime/kernels/cuda/CudaKernels.h"
#include "runtime/kernels/testing/CudaCompare.h"
#include "runtime/kernels/testing/KernelTesting.h"
#include "runtime/plan/PlanFormat.h"

namespace moec::runtime::cuda::attention::testing {

using runtime::testing::CudaCompareOptions;
using runtime::testing::CudaComparison;
using runtime::testing::KernelCall;
using runtime::testing::OwnedTensor;

/// The CPU (oracle) and CUDA registries of the attention family.
struct Registries {
  Registries() {
    cpu::registerAttentionKernels(cpu);
    cuda::registerAttentionKernels(gpu);
  }
  KernelRegistry cpu, gpu;
};

/// Compares make()'s launch on the GPU with the CPU, in F32 then in BF16
/// storage; skips the test when there is no GPU.
inline void compareBoth(const KernelRegistry &gpu, const std::function<KernelCall()> &make,
                        const std::string &what, CudaCompareOptions options = {}) {
  for (plan::DType storage : {plan::F32, plan::BF16}) {
    KernelCall call = make();
    options.storage = storage;
    CudaComparison r = runtime::testing::compareCudaWithCpu(gpu, call, options);
    if (r.skipped)
      GTEST_SKIP() << r.why;
    EXPECT_TRUE(r.ok) << what << " with " << plan::dtypeName(storage) << " storage:\n" << r.report;
  }
}

/// make()'s launch with BF16 storage, as compareCudaWithCpu runs it: float
/// inputs rounded to bf16, the CPU kernel (the oracle) on them, the GPU kernel
/// on bf16 copies with its bf16 outputs poisoned (NaN) first. Outputs as floats.
struct Bf16Run {
  bool skipped = false;
  std::string why; // when skipped, or when the GPU run failed
  std::vector<std::vector<float>> cpu, gpu;
};

namespace detail {
inline uint16_t toBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffff) > 0x7f800000)
    return 0x7fc0;
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}
inline float fromBf16(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
} // namespace detail

/// Rounds an f32 tensor's values to bf16 in place (no-op on other types): inputs that BF16
/// storage then passes unchanged.
inline void roundToBf16(OwnedTensor &t) {
  if (t.dtype != plan::F32)
    return;
  auto *values = reinterpret_cast<float *>(t.bytes.data());
  for (int64_t e = 0; e < t.numel(); ++e)
    values[e] = detail::fromBf16(detail::toBf16(values[e]));
}

inline Bf16Run runBf16(const KernelRegistry &gpu, KernelCall call) {
  Bf16Run r;
  if (!runtime::testing::cudaDeviceAvailable(&r.why)) {
    r.skipped = true;
    return r;
  }
  std::vector<OwnedTensor> &inputs = call.inputsRef();
  for (OwnedTensor &t : inputs)
    roundToBf16(t);
  call.run();
  std::vector<void *> buffers;
  auto upload = [&](const OwnedTensor &t) {
    TensorRef ref;
    ref.shape = t.shape;
    ref.dtype = t.dtype == plan::F32 ? plan::BF16 : t.dtype;
    const size_t n = static_cast<size_t>(t.numel()), bytes = n * plan::dtypeSize(ref.dtype);
    cudaMalloc(&ref.data, std::max<size_t>(bytes, 1));
    buffers.push_back(ref.data);
    if (t.dtype != plan::F32) {
      cudaMemcpy(ref.data, t.bytes.data(), bytes, cudaMemcpyHostToDevice);
      return ref;
    }
    std::vector<uint16_t> half(n);
    const auto *values = reinterpret_cast<const float *>(t.bytes.data());
    for (size_t e = 0; e < n; ++e)
      half[e] = detail::toBf16(values[e]);
    cudaMemcpy(ref.data, half.data(), bytes, cudaMemcpyHostToDevice);
    return ref;
  };
  KernelContext ctx;
  ctx.kernel = call.kernelName();
  for (const OwnedTensor &t : inputs)
    ctx.inputs.push_back(upload(t));
  for (size_t i = 0; i < call.numOutputs(); ++i) {
    const OwnedTensor &expected = call.result(i);
    TensorRef ref;
    ref.shape = expected.shape;
    ref.dtype = plan::BF16;
    const size_t bytes = static_cast<size_t>(expected.numel()) * 2;
    cudaMalloc(&ref.data, std::max<size_t>(bytes, 1));
    buffers.push_back(ref.data);
    cudaMemset(ref.data, 0xff, bytes); // poison: NaN
    ctx.outputs.push_back(ref);
    r.cpu.push_back(expected.floats());
  }
  ctx.attrs = &call.attributes();
  ctx.seqLen = call.seqLen();
  ctx.microBatch = call.microBatch();
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  ctx.stream = stream;
  try {
    const KernelFn *fn = gpu.find(call.kernelName());
    if (!fn)
      ctx.fail("the CUDA backend has no kernel '" + call.kernelName() + "'");
    (*fn)(ctx);
    cudaError_t error = cudaStreamSynchronize(stream);
    if (error != cudaSuccess)
      r.why = std::string("the CUDA kernel failed: ") + cudaGetErrorString(error);
  } catch (const KernelError &e) {
    r.why = std::string("the CUDA kernel refused the launch: ") + e.what();
  }
  cudaStreamDestroy(stream);
  if (r.why.empty())
    for (size_t i = 0; i < ctx.outputs.size(); ++i) {
      const TensorRef &out = ctx.outputs[i];
      std::vector<uint16_t> half(static_cast<size_t>(out.numel()));
      cudaMemcpy(half.data(), out.data, half.size() * 2, cudaMemcpyDeviceToHost);
      std::vector<float> values(half.size());
      for (size_t e = 0; e < half.size(); ++e)
        values[e] = detail::fromBf16(half[e]);
      r.gpu.push_back(std::move(values));
    }
  for (void *p : buffers)
    cudaFree(p);
  return r;
}

/// The harness's BF16 check of every output (all finite, ||gpu - cpu|| <= tol
/// ||cpu||), and the same per block of blocks[i] consecutive elements (one
/// head of one row) with twice the tolerance against max(||cpu||_block, a
/// tenth of the average block norm), so an error confined to a few rows (a
/// tile's edge, one sequence) shows too. Errors up to 1e-5 pass: rounding
/// noise where the exact value is 0 (a window of 1 gives dq = dk = 0).
inline void expectBlocksClose(const Bf16Run &r, const std::vector<int64_t> &blocks,
                              const std::string &what, double tol = 2e-2) {
  ASSERT_TRUE(r.why.empty()) << what << ": " << r.why;
  ASSERT_EQ(r.gpu.size(), blocks.size()) << what;
  for (size_t o = 0; o < r.gpu.size(); ++o) {
    const std::vector<float> &got = r.gpu[o], &want = r.cpu[o];
    const int64_t n = static_cast<int64_t>(got.size()), block = blocks[o], count = n / block;
    constexpr double kNoise = 1e-5;
    double diff = 0, norm = 0, worst = 0;
    int64_t nonFinite = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double delta = static_cast<double>(got[i]) - want[i];
      nonFinite += !std::isfinite(got[i]);
      diff += delta * delta;
      norm += static_cast<double>(want[i]) * want[i];
      worst = std::max(worst, std::abs(delta));
    }
    const std::string name = what + ", output " + std::to_string(o);
    EXPECT_EQ(nonFinite, 0) << name << ": elements not finite (unwritten: poisoned)";
    const double rel = norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
    if (worst > kNoise) {
      EXPECT_LE(rel, tol) << name << ": relative error " << rel;
    }
    const double floor = std::sqrt(norm / static_cast<double>(count)) / 10;
    int reported = 0;
    for (int64_t b = 0; b < count && reported < 5; ++b) {
      double bd = 0, bn = 0, bw = 0;
      for (int64_t i = b * block; i < (b + 1) * block; ++i) {
        const double delta = static_cast<double>(got[i]) - want[i];
        bd += delta * delta;
        bn += static_cast<double>(want[i]) * want[i];
        bw = std::max(bw, std::abs(delta));
      }
      if (bw > kNoise && std::sqrt(bd) > 2 * tol * std::max(std::sqrt(bn), floor)) {
        ++reported;
        ADD_FAILURE() << name << ": block " << b << " of " << block << " elements: error "
                      << std::sqrt(bd) << ", norm " << std::sqrt(bn);
      }
    }
  }
}

/// Runs `call` (on whatever registry it was built for) and expects a
/// KernelError whose message contains `text`. With the CUDA registry this
/// checks the host-side launch checks, which fail before any CUDA call.
inline void expectFailure(KernelCall call, const std::string &text) {
  try {
    call.run();
    ADD_FAILURE() << "no failure, expected: " << text;
  } catch (const KernelError &e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

/// The same launch set up for another registry (same inputs, outputs, attributes).
inline KernelCall onRegistry(const KernelRegistry &registry, KernelCall &call) {
  KernelCall other(registry, call.kernelName());
  for (OwnedTensor &t : call.inputsRef())
    other.input(t);
  for (size_t i = 0; i < call.numOutputs(); ++i)
    other.output(call.result(i).dtype, call.result(i).shape);
  other.attributes() = call.attributes();
  if (call.seqLen() > 0)
    other.sequences(call.seqLen(), call.microBatch());
  return other;
}

/// The `.backward` launch of `forward` as checkGradients builds it: the
/// forward operands, then the result's gradient; outputs are the gradients of
/// `wrt`. An empty `gradOut` shape means grad_of_outputs is empty (no gradient flows).
inline KernelCall backwardOf(const KernelRegistry &registry, KernelCall forward,
                             const std::vector<int64_t> &wrt, uint64_t seed, bool withGrad = true) {
  KernelCall backward(registry, forward.kernelName() + ".backward");
  backward.attributes() = forward.attributes();
  int64_t operands = static_cast<int64_t>(forward.inputsRef().size());
  for (OwnedTensor &t : forward.inputsRef())
    backward.input(t);
  if (withGrad)
    backward.input(runtime::testing::randomTensor(forward.result(0).shape, seed));
  backward.attr("grad_of_inputs", wrt)
      .attr("grad_of_outputs", withGrad ? std::vector<int64_t>{0} : std::vector<int64_t>{})
      .attr("backward_segments", std::vector<int64_t>{operands, 0, withGrad ? 1 : 0})
      .sequences(forward.seqLen(), forward.microBatch());
  for (int64_t i : wrt)
    backward.output(plan::F32, forward.inputsRef().at(static_cast<size_t>(i)).shape);
  return backward;
}

} // namespace moec::runtime::cuda::attention::testing

#endif // RUNTIME_KERNELS_CUDA_ATTENTION_COMPARETESTING_H_
