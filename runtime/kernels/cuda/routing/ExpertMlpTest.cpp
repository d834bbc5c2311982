//===- ExpertMlpTest.cpp - CUDA expert_mlp (and backward) against the CPU --===//
//
// The CPU test's variants (gated silu, relu2 and silu ungated, gpt-oss fused
// interleaved clamped SwiGLU in both layouts with biases, expert LoRA on
// every projection / some projections) on its small shapes (an expert with
// no rows), then ragged loads over 8, 64 and 256 experts with odd sizes.
// The grouped GEMMs' edges: one expert holding most rows (several 128-row
// tiles) next to empty experts, row counts around the tile (127 / 128 / 129),
// in / out not multiples of 8 (in = 72, out = 100: the element-wise tile
// path) and multiples of 8 over several tiles (the cp.async path), LoRA
// ranks that are and are not multiples of 8; the gated SiLU's one-pass path
// (no LoRA, chunked sizes; and with LoRA of ranks 8 to 32 in the GEMMs' last k
// tile, in bf16). Backwards request every float operand's gradient,
// and some subsets. Invalid counts fault on the device
// (death tests in a fresh process).
//
//===----------------------------------------------------------------------===//

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>

#include <sys/wait.h>

#include "runtime/kernels/cuda/routing/RoutingCudaTestUtil.h"

namespace moec::runtime::cuda::routing::testing {
namespace {

using cpu::routing::testing::ExpertCase;
using cpu::routing::testing::expertCall;
using cpu::routing::testing::registry;
using cpu::routing::testing::tensorOf;
using moec::runtime::testing::indexTensor;

enum Group { Tokens, Counts, Up, Down, Gate, UpBias, DownBias, GateA, GateB, UpA, UpB, DownA, DownB };

/// The CPU test's base case: 3 experts, the middle one without rows; odd sizes.
ExpertCase baseCase(std::string activation, bool gated, uint64_t seed) {
  ExpertCase c;
  c.features = 5;
  c.experts = 3;
  c.inter = 4;
  c.counts = {4, 0, 3};
  c.activation = std::move(activation);
  c.x = randomBf16(c.rows() * c.features, seed);
  c.up = randomBf16(c.experts * c.inter * c.features, seed + 1, 0.7);
  c.down = randomBf16(c.experts * c.features * c.inter, seed + 2, 0.7);
  if (gated)
    c.gate = randomBf16(c.experts * c.inter * c.features, seed + 3, 0.7);
  return c;
}

/// Ragged loads: `counts` rows per expert, `features` in, `inter` hidden.
ExpertCase raggedCase(std::string activation, bool gated, std::vector<int64_t> counts,
                      int64_t features, int64_t inter, uint64_t seed) {
  ExpertCase c;
  c.features = features;
  c.experts = static_cast<int64_t>(counts.size());
  c.inter = inter;
  c.counts = std::move(counts);
  c.activation = std::move(activation);
  double scale = 1.5 / std::sqrt(static_cast<double>(features));
  c.x = randomBf16(c.rows() * c.features, seed);
  c.up = randomBf16(c.experts * c.inter * c.features, seed + 1, scale);
  c.down = randomBf16(c.experts * c.features * c.inter, seed + 2, scale);
  if (gated)
    c.gate = randomBf16(c.experts * c.inter * c.features, seed + 3, scale);
  return c;
}

void addLora(ExpertCase &c, bool gate, bool up, bool down, uint64_t seed, int64_t rank = 2) {
  c.rank = rank;
  c.loraScale = 2.0;
  int64_t e = c.experts, r = c.rank, d = c.features, n = c.inter;
  if (gate) {
    c.gateA = randomBf16(e * r * d, seed, 0.5);
    c.gateB = randomBf16(e * n * r, seed + 1, 0.5);
  }
  if (up) {
    c.upA = randomBf16(e * r * d, seed + 2, 0.5);
    c.upB = randomBf16(e * n * r, seed + 3, 0.5);
  }
  if (down) {
    c.downA = randomBf16(e * r * n, seed + 4, 0.5);
    c.downB = randomBf16(e * d * r, seed + 5, 0.5);
  }
}

/// gpt-oss: fused interleaved gate/up, biases, clamped SwiGLU with a limit
/// that some pre-activations exceed (both clamps active).
ExpertCase gptOssCase(bool inOut, std::vector<int64_t> counts, int64_t features, int64_t inter,
                      uint64_t seed) {
  ExpertCase c;
  c.features = features;
  c.experts = static_cast<int64_t>(counts.size());
  c.inter = inter;
  c.counts = std::move(counts);
  c.activation = "clamped_swiglu";
  c.fusedGateUp = true;
  c.inOutLayout = inOut;
  c.limit = 0.8;
  double scale = std::sqrt(5.0 / static_cast<double>(features));
  c.x = randomBf16(c.rows() * c.features, seed, 1.5);
  c.up = randomBf16(c.experts * c.features * 2 * c.inter, seed + 1, scale);
  c.down = randomBf16(c.experts * c.inter * c.features, seed + 2, 0.7 * scale);
  c.upBias = randomBf16(c.experts * 2 * c.inter, seed + 3, 0.3);
  c.downBias = randomBf16(c.experts * c.features, seed + 4, 0.3);
  return c;
}

ExpertCase gptOssSmall(bool inOut, uint64_t seed) { return gptOssCase(inOut, {2, 4, 1}, 5, 3, seed); }

/// Every up pre-activation's distance to a clamp (±limit): the gradient
/// jumps there, so the GPU's and the CPU's (f32-close) pre-activations must
/// lie on the same side.
double clampMargin(const ExpertCase &c) {
  if (c.activation != "clamped_swiglu")
    return 1e30;
  double margin = 1e30;
  int64_t row = 0;
  for (int64_t e = 0; e < c.experts; ++e)
    for (int64_t i = 0; i < c.counts[e]; ++i, ++row) {
      const double *x = c.x.data() + row * c.features;
      for (int64_t o = 0; o < c.upOut(); ++o) {
        double p = c.upBias.empty() ? 0.0 : c.upBias[e * c.upOut() + o];
        for (int64_t d = 0; d < c.features; ++d)
          p += x[d] * (c.inOutLayout ? c.up[(e * c.features + d) * c.upOut() + o]
                                     : c.up[(e * c.upOut() + o) * c.features + d]);
        margin = std::min({margin, std::abs(p - c.limit), std::abs(p + c.limit)});
      }
    }
  return margin;
}

ExpertCase awayFromClamps(const std::function<ExpertCase(uint64_t)> &make, uint64_t seed) {
  for (uint64_t s = seed; s < seed + 200000; s += 1000) {
    ExpertCase c = make(s);
    if (clampMargin(c) > 1e-4)
      return c;
  }
  ADD_FAILURE() << "no inputs away from the clamps near seed " << seed;
  return make(seed);
}

void expectForward(const ExpertCase &c) {
  expectGpuMatchesCpu([&] { return expertCall(c); });
}

/// The backward for the gradients of `groups` (operand groups; default:
/// every float operand present), the routing's output gradient random.
void expectBackward(const ExpertCase &c, std::vector<int> groups = {}) {
  std::vector<int64_t> operands;
  expertCall(c, &operands);
  if (groups.empty())
    for (int g = 0; g < 13; ++g)
      if (g != Counts && operands[g] >= 0)
        groups.push_back(g);
  std::vector<int64_t> wrt;
  for (int g : groups) {
    ASSERT_GE(operands[g], 0) << "operand group " << g << " is absent";
    wrt.push_back(operands[g]);
  }
  expectGpuMatchesCpu([&] {
    KernelCall forward = expertCall(c);
    std::vector<OwnedTensor> grads{
        tensorOf({c.rows(), c.features}, randomBf16(c.rows() * c.features, 77))};
    return backwardCall(registry(), forward, wrt, {0}, grads);
  });
}

void expectBoth(const ExpertCase &c) {
  expectForward(c);
  expectBackward(c);
}

/// Rows per expert of `tokens` tokens routed to `topK` of `experts` (skewed:
/// many experts get nothing).
std::vector<int64_t> routedCounts(int64_t tokens, int64_t topK, int64_t experts, uint64_t seed) {
  std::vector<int64_t> counts(experts, 0);
  for (int64_t e : skewedIndices(tokens, topK, experts, seed))
    ++counts[e];
  return counts;
}

// The CPU test's variants ------------------------------------------------------

TEST(CudaExpertMlp, SiluGated) { expectBoth(baseCase("silu", true, 1)); }

TEST(CudaExpertMlp, Relu2Ungated) { expectBoth(baseCase("relu2", false, 11)); }

TEST(CudaExpertMlp, SiluUngated) { expectBoth(baseCase("silu", false, 21)); }

TEST(CudaExpertMlp, GptOssFusedInOutClampedSwiglu) {
  expectBoth(awayFromClamps([](uint64_t s) { return gptOssSmall(true, s); }, 31));
}

TEST(CudaExpertMlp, FusedOutInLayoutClampedSwiglu) {
  expectBoth(awayFromClamps([](uint64_t s) { return gptOssSmall(false, s); }, 41));
}

TEST(CudaExpertMlp, SiluGatedWithLoraOnEveryProjection) {
  ExpertCase c = baseCase("silu", true, 51);
  addLora(c, true, true, true, 52);
  expectBoth(c);
}

TEST(CudaExpertMlp, Relu2WithUpAndDownLora) {
  ExpertCase c = baseCase("relu2", false, 61);
  addLora(c, false, true, true, 62);
  expectBoth(c);
}

TEST(CudaExpertMlp, SiluGatedWithGateLoraOnly) {
  ExpertCase c = baseCase("silu", true, 71);
  addLora(c, true, false, false, 72);
  c.counts = {0, 5, 2};
  expectBoth(c);
}

TEST(CudaExpertMlpBackward, OnlySomeGradientsRequested) {
  ExpertCase c = baseCase("silu", true, 91);
  addLora(c, false, true, false, 92);
  expectBackward(c, {UpB, Tokens});
  expectBackward(c, {Down, UpA});
  expectBackward(c, {Tokens});
}

// Ragged loads over more experts ------------------------------------------------

TEST(CudaExpertMlp, Ragged8ExpertsSiluGatedWithLora) {
  ExpertCase c = raggedCase("silu", true, {17, 0, 33, 1, 0, 40, 9, 0}, 33, 13, 101);
  addLora(c, true, true, true, 102, 4);
  expectBoth(c);
}

TEST(CudaExpertMlp, Ragged64ExpertsRelu2WithUpAndDownLora) {
  ExpertCase c = raggedCase("relu2", false, routedCounts(50, 6, 64, 111), 40, 24, 112);
  addLora(c, false, true, true, 113, 3);
  expectBoth(c);
}

TEST(CudaExpertMlp, Ragged256ExpertsSiluGated) {
  expectBoth(raggedCase("silu", true, routedCounts(100, 8, 256, 121), 16, 8, 122));
}

TEST(CudaExpertMlp, Ragged8ExpertsGptOss) {
  for (bool inOut : {true, false})
    expectBoth(awayFromClamps(
        [inOut](uint64_t s) { return gptOssCase(inOut, {13, 0, 40, 7, 1, 0, 30, 9}, 33, 13, s); },
        131));
}

TEST(CudaExpertMlp, Ragged64ExpertsSiluUngatedWithUpLora) {
  ExpertCase c = raggedCase("silu", false, routedCounts(37, 4, 64, 141), 20, 12, 142);
  addLora(c, false, true, false, 143, 5);
  expectBoth(c);
}

// Grouped-GEMM edges ----------------------------------------------------------

/// One expert with most rows (3 row tiles), empty experts around it; in = 72
/// (copy chunks) and out = 100 (element-wise), LoRA rank 16 on every projection.
TEST(CudaExpertMlp, OneExpertHoldsMostRowsIn72Out100WithLora) {
  ExpertCase c = raggedCase("silu", true, {0, 300, 0, 2, 0, 1, 0, 0}, 72, 100, 301);
  addLora(c, true, true, true, 302, 16);
  expectBoth(c);
}

/// The transposed sizes (in = 100: element-wise up projections), rank 3.
TEST(CudaExpertMlp, OneExpertHoldsMostRowsIn100Out72WithLora) {
  ExpertCase c = raggedCase("relu2", false, {1, 0, 290, 0, 4}, 100, 72, 311);
  addLora(c, false, true, true, 312, 3);
  expectBoth(c);
}

/// Rows around the 128-row tile, sizes that are multiples of 8 over several
/// 128-wide tiles but of no tile (136 in, 264 hidden): the cp.async path.
TEST(CudaExpertMlp, RowsAroundTheTileChunkedSizesWithLora) {
  ExpertCase c = raggedCase("silu", true, {129, 0, 128, 127, 0, 40, 1}, 136, 264, 321);
  addLora(c, true, false, true, 322, 8);
  expectBoth(c);
}

/// gpt-oss (fused, biases, in_out_layout and not) with one dominant expert.
TEST(CudaExpertMlp, GptOssOneExpertHoldsMostRows) {
  for (bool inOut : {true, false})
    expectBoth(awayFromClamps(
        [inOut](uint64_t s) { return gptOssCase(inOut, {0, 150, 0, 3, 1}, 40, 36, s); }, 331));
}

/// Many experts with skewed loads and moderate sizes.
TEST(CudaExpertMlp, Ragged128ExpertsSiluGatedWithLora) {
  ExpertCase c = raggedCase("silu", true, routedCounts(160, 8, 128, 341), 64, 48, 342);
  addLora(c, true, true, true, 343, 8);
  expectBoth(c);
}

/// LoRA as the GEMMs' last k tile (bf16; ranks <= 32, multiples of 8): rank 32 (the tile's
/// halves full) and 24 (zero columns past it), ragged over 32 experts, several row and n tiles.
TEST(CudaExpertMlp, Ragged32ExpertsSiluGatedWithRank32LoraTile) {
  ExpertCase c = raggedCase("silu", true, routedCounts(300, 8, 32, 351), 256, 192, 352);
  addLora(c, true, true, true, 353, 32);
  expectBoth(c);
}

TEST(CudaExpertMlp, SkewedSiluGatedWithRank24LoraTile) {
  ExpertCase c = raggedCase("silu", true, {260, 0, 3, 129, 0, 1}, 136, 264, 361);
  addLora(c, true, true, true, 362, 24);
  expectBoth(c);
}

// Invalid counts fault on the device ----------------------------------------------

/// Runs the CUDA kernel of `call` on device copies of its inputs (f32 as
/// given) and exits: 2 if it refused the launch, 3 with "device fault: ..." on
/// stderr if the stream reports an error, 0 otherwise.
[[noreturn]] void runAndExit(KernelCall call) {
  const KernelFn *fn = cudaRegistry().find(call.kernelName());
  KernelContext ctx;
  ctx.kernel = call.kernelName();
  for (OwnedTensor &t : call.inputsRef()) {
    TensorRef ref = t.ref();
    size_t bytes = t.bytes.size();
    cudaMalloc(&ref.data, std::max<size_t>(bytes, 1));
    cudaMemcpy(ref.data, t.bytes.data(), bytes, cudaMemcpyHostToDevice);
    ctx.inputs.push_back(ref);
  }
  for (size_t i = 0; i < call.numOutputs(); ++i) {
    TensorRef ref = call.result(i).ref();
    size_t bytes = call.result(i).bytes.size();
    cudaMalloc(&ref.data, std::max<size_t>(bytes, 1));
    ctx.outputs.push_back(ref);
  }
  ctx.attrs = &call.attributes();
  ctx.seqLen = call.inputsRef()[0].shape[0];
  ctx.microBatch = 1;
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  ctx.stream = stream;
  try {
    (*fn)(ctx);
  } catch (const KernelError &e) {
    std::fprintf(stderr, "refused: %s\n", e.what());
    std::exit(2);
  }
  cudaError_t error = cudaStreamSynchronize(stream);
  std::fflush(stdout); // the device's printf
  if (error != cudaSuccess) {
    std::fprintf(stderr, "device fault: %s\n", cudaGetErrorString(error));
    std::exit(3);
  }
  std::exit(0);
}

void expectDeviceFault(KernelCall call) {
  std::string why;
  if (!moec::runtime::testing::cudaDeviceAvailable(&why))
    GTEST_SKIP() << why;
  // A fresh process (fork + exec): the fault poisons its CUDA context.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // The trap surfaces either at the stream synchronisation (exit 3) or already at the launch
  // check of a later kernel of the same call (exit 2, "unspecified launch failure").
  auto faulted = [](int status) {
    return WIFEXITED(status) && (WEXITSTATUS(status) == 2 || WEXITSTATUS(status) == 3);
  };
  EXPECT_EXIT(runAndExit(std::move(call)), faulted, "device fault: |unspecified launch failure");
}

TEST(CudaExpertMlpDeathTest, NegativeCountFaults) {
  for (bool backward : {false, true}) {
    ExpertCase c = baseCase("silu", true, 201);
    KernelCall forward = expertCall(c);
    forward.inputsRef()[1] = indexTensor(plan::I64, {3}, {5, -1, 3}); // adds up to the 7 rows
    if (!backward) {
      expectDeviceFault(std::move(forward));
      continue;
    }
    std::vector<OwnedTensor> grads{
        tensorOf({c.rows(), c.features}, randomBf16(c.rows() * c.features, 202))};
    KernelCall call = backwardCall(registry(), forward, {0, 2}, {0}, grads);
    expectDeviceFault(std::move(call));
  }
}

TEST(CudaExpertMlpDeathTest, CountsAddingUpToMoreThanTheRowsFault) {
  ExpertCase c = baseCase("silu", true, 211);
  KernelCall call = expertCall(c);
  call.inputsRef()[1] = indexTensor(plan::I32, {3}, {4, 0, 4}); // 8 of 7 rows
  expectDeviceFault(std::move(call));
}

// Rows past the counted ones (expert parallel's received rows) are zero in the result and
// in the tokens' gradient, as on the CPU; outputs start poisoned, so this checks they are
// written.
TEST(CudaExpertMlp, UncountedRowsAreZeroWithLora) {
  ExpertCase c = raggedCase("silu", true, {13, 0, 40, 7}, 36, 20, 221);
  c.padding = 131;
  c.x = randomBf16(c.rows() * c.features, 222);
  addLora(c, true, true, true, 223, 4);
  expectBoth(c);
}

// Gated SiLU without LoRA or biases on 16-byte-copyable bf16 operands: gate and up in one
// grouped GEMM with the activation (forward) or its gradient (backward) in the epilogue, and
// the tokens' gradient as one GEMM of both products (GroupedGemmWgmma.cu). Ragged rows around
// the 128-row tile and an inter size over three column tiles; every gradient (the down
// weights' needs h, recomputed in one pass), then the tokens' alone (no h at all).
TEST(CudaExpertMlp, GatedSiluInOnePassRaggedRows) {
  ExpertCase c = raggedCase("silu", true, {129, 0, 128, 127, 0, 40, 1, 300}, 136, 264, 401);
  expectBoth(c);
  expectBackward(c, {Tokens});
}

TEST(CudaExpertMlp, GatedSiluInOnePass128Experts) {
  ExpertCase c = raggedCase("silu", true, routedCounts(160, 8, 128, 411), 64, 48, 412);
  expectBoth(c);
  expectBackward(c, {Tokens, Gate});
}

// The same path with rows past the counted ones: zero in the result and the tokens' gradient.
TEST(CudaExpertMlp, GatedSiluInOnePassUncountedRowsAreZero) {
  ExpertCase c = raggedCase("silu", true, {13, 0, 40, 7}, 64, 48, 421);
  c.padding = 131;
  c.x = randomBf16(c.rows() * c.features, 422);
  expectBoth(c);
  expectBackward(c, {Tokens});
}

// expert_mlp_combine.backward (moec --fused-expert-backward): the backward of combine(expert_mlp
// (rows), indices, weights) in one launch. `tokens` tokens routed to `topK` of the experts
// (skewed: ragged loads, empty experts), their copies in expert-major order as dispatch makes
// them; d result random, the weights positive. Gated SiLU in bf16 storage takes the one-pass
// path (the router weights' gradient from the gated GEMM's epilogue); f32 storage, other
// activations, LoRA and subsets of the gradients take the composed one.
/// savedPre: the forward's saved pre-activations passed too (its `outputs`, f32, from the CPU's
/// forward): the one-pass form then derives
/// the gate's and up's gradients from them element-wise instead of running the products again.
void expectExpertCombineBackward(ExpertCase c, int64_t tokens, int64_t topK, uint64_t seed,
                                 std::vector<int> groups = {Tokens}, bool someElsewhere = false,
                                 bool savedPre = false) {
  std::vector<int64_t> indices = skewedIndices(tokens, topK, c.experts, seed);
  if (someElsewhere) // an expert-parallel rank's received tokens: a third of their experts on other ranks
    for (size_t i = 0; i < indices.size(); i += 3)
      indices[i] = -1;
  c.counts.assign(c.experts, 0);
  for (int64_t e : indices)
    if (e >= 0)
      ++c.counts[e];
  c.x = randomBf16(c.rows() * c.features, seed + 1);
  std::vector<int64_t> operands;
  expertCall(c, &operands);
  std::vector<int64_t> wrt;
  for (int g : groups)
    wrt.push_back(operands[g]);
  const size_t weightsInput = expertCall(c).inputsRef().size() + 1;
  expectGpuMatchesCpu(
      [&] {
        KernelCall forward = expertCall(c);
        KernelCall call(registry(), "expert_mlp_combine.backward");
        call.attributes() = forward.attributes();
        const int64_t expertOperands = static_cast<int64_t>(forward.inputsRef().size());
        for (OwnedTensor &t : forward.inputsRef())
          call.input(t);
        Values weights = randomBf16(tokens * topK, seed + 2);
        for (double &w : weights)
          w = 0.05 + std::fabs(w);
        call.input(indexTensor(plan::I32, {tokens, topK}, indices));
        call.input(tensorOf({tokens, topK}, weights));
        if (savedPre) {
          forward.output(plan::F32, {c.rows(), 2 * c.inter});
          forward.run();
          call.input(forward.result(1));
        }
        call.input(tensorOf({tokens, c.features}, randomBf16(tokens * c.features, seed + 3)));
        std::vector<int64_t> all = wrt;
        all.push_back(expertOperands + 1); // the weights
        call.attr("grad_of_inputs", all).attr("grad_of_outputs", std::vector<int64_t>{0});
        call.attr("backward_segments", std::vector<int64_t>{expertOperands + 2, savedPre ? 1 : 0, 1});
        for (int64_t i : wrt)
          call.output(plan::F32, forward.inputsRef().at(i).shape);
        call.output(plan::F32, {tokens, topK});
        return call;
      },
      savedPre ? std::vector<size_t>{weightsInput, weightsInput + 1} : std::vector<size_t>{weightsInput},
      {wrt.size()}); // the router weights, their gradient and the pre-activations are f32
}

TEST(CudaExpertMlpCombine, GatedSiluRagged) {
  expectExpertCombineBackward(raggedCase("silu", true, std::vector<int64_t>(8, 0), 136, 264, 501), 100, 4, 502);
  // inter = 100: the tokens' gradient as two products in f32 (not one GEMM of 16-byte rows)
  expectExpertCombineBackward(raggedCase("silu", true, std::vector<int64_t>(8, 0), 64, 100, 503), 100, 4, 504);
}

TEST(CudaExpertMlpCombine, GatedSilu128Experts) {
  expectExpertCombineBackward(raggedCase("silu", true, std::vector<int64_t>(128, 0), 64, 136, 511), 300, 8, 512);
}

/// On an expert-parallel rank with the routed exchange, the experts hold only this rank's copies:
/// fewer rows than the received tokens' entries (-1: another rank's expert). The ep=2 routed run
/// on two H200s refused this launch ("the indices make 65536 copies but the experts have 36255
/// rows").
TEST(CudaExpertMlpCombine, SomeExpertsOnOtherRanks) {
  expectExpertCombineBackward(raggedCase("silu", true, std::vector<int64_t>(16, 0), 64, 136, 551), 200, 4, 552,
                              {Tokens}, true);
}

// The forward's saved pre-activations: the one-pass form (the gate's and up's gradients and the
// router weights' row dots from them in the down projection's gradient GEMM's epilogue; in an
// element-wise pass where that GEMM cannot copy W_down in 16-byte rows: inter = 100), with
// uncounted rows (a third of the entries on other ranks), and the composed form (a subset of
// gradients: the expert MLP's own backward reads them in place of its f32 pre-activations).
TEST(CudaExpertMlpCombine, SavedPreActivations) {
  expectExpertCombineBackward(raggedCase("silu", true, std::vector<int64_t>(8, 0), 136, 264, 561), 100, 4, 562,
                              {Tokens}, false, true);
  expectExpertCombineBackward(raggedCase("silu", true, std::vector<int64_t>(8, 0), 64, 100, 565), 100, 4, 566,
                              {Tokens}, false, true);
  expectExpertCombineBackward(raggedCase("silu", true, std::vector<int64_t>(16, 0), 64, 136, 571), 200, 4, 572,
                              {Tokens}, true, true);
  expectExpertCombineBackward(raggedCase("silu", true, std::vector<int64_t>(8, 0), 64, 48, 581), 60, 2, 582,
                              {Tokens, Gate}, false, true);
}

// The forward's second output on the one-pass path (from the gated GEMM's accumulators; rows past
// the counted ones zero) and on the composed one (in and out not multiples of 8).
TEST(CudaExpertMlp, SavesPreActivations) {
  for (ExpertCase c :
       {raggedCase("silu", true, {13, 0, 40, 7}, 64, 48, 591), raggedCase("silu", true, {5, 9, 0}, 72, 100, 592)}) {
    c.padding = 11;
    c.x = randomBf16(c.rows() * c.features, 593);
    expectGpuMatchesCpu([&] {
      KernelCall call = expertCall(c);
      call.output(plan::F32, {c.rows(), 2 * c.inter});
      return call;
    }, {}, {1}); // f32 whatever the storage
  }
}

TEST(CudaExpertMlpCombine, ComposedPaths) {
  expectExpertCombineBackward(raggedCase("relu2", false, std::vector<int64_t>(8, 0), 72, 100, 521), 50, 2, 522);
  ExpertCase lora = raggedCase("silu", true, std::vector<int64_t>(8, 0), 64, 48, 531);
  addLora(lora, true, true, true, 532, 4);
  expectExpertCombineBackward(lora, 60, 2, 533, {Tokens, UpA});
  expectExpertCombineBackward(raggedCase("silu", true, std::vector<int64_t>(8, 0), 64, 48, 541), 60, 2, 542,
                              {Tokens, Gate});
}

// Launch checks on the host (no GPU needed). The counts are checked on the
// device (see the death tests), so they are not among these.
TEST(CudaExpertMlpErrors, BadLaunchesNameTheProblem) {
  {
    expectRefused(expertCall(baseCase("gelu_tanh", true, 102)),
                  "unsupported expert activation 'gelu_tanh'");
  }
  {
    KernelCall call = expertCall(gptOssSmall(true, 103));
    call.attributes().erase("limit");
    expectRefused(call, "missing attribute 'limit'");
  }
  {
    ExpertCase c = baseCase("silu", true, 104);
    addLora(c, true, false, false, 105);
    KernelCall call = expertCall(c);
    call.attributes().erase("lora_scale");
    expectRefused(call, "missing attribute 'lora_scale'");
  }
  {
    KernelCall call = expertCall(baseCase("silu", true, 106));
    call.inputsRef()[3] = tensorOf({3, 5, 3}, randomBf16(3 * 5 * 3, 107));
    expectRefused(call, "down has shape [3,5,3], expected [3,5,4]");
  }
  {
    ExpertCase c = gptOssSmall(false, 108);
    c.rank = 1;
    c.loraScale = 1.0;
    c.upA = randomBf16(c.experts * c.features, 109);
    c.upB = randomBf16(c.experts * c.inter, 110);
    expectRefused(expertCall(c), "expert LoRA needs separate [out, in] expert weights");
  }
  {
    KernelCall call = expertCall(baseCase("silu", true, 111));
    call.attributes().erase("operand_segments");
    expectRefused(call, "missing attribute 'operand_segments'");
  }
  {
    KernelCall call = expertCall(baseCase("silu", true, 112));
    call.inputsRef()[1] = indexTensor(plan::I64, {4}, {4, 0, 3, 0});
    expectRefused(call, "counts has shape [4], expected [3]");
  }
}

} // namespace
} // namespace moec::runtime::cuda::routing::testing
