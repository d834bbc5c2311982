//===- DispatchCombineTest.cpp - CUDA dispatch / combine against the CPU --===//
//
// The CPU test's sample (expert 2 of 5 empty, experts repeated across slots)
// and ragged random routings over 8, 64 and 256 experts (skewed: the high
// experts often get no rows), token and feature counts that are not
// multiples of any block size, and what an expert-parallel rank sees (other
// ranks' experts as -1). The expert-major order and the counts must match
// exactly (the dispatched rows in f32 are copies: exact too).
//
//===----------------------------------------------------------------------===//

#include <gtest/gtest.h>

#include "runtime/kernels/cuda/routing/RoutingCudaTestUtil.h"

namespace moec::runtime::cuda::routing::testing {
namespace {

using cpu::routing::testing::registry;
using cpu::routing::testing::tensorOf;
using moec::runtime::testing::indexTensor;

struct Case {
  int64_t tokens, topK, features, experts;
  std::vector<int64_t> indices;

  /// Expert copies made: one per non-negative index (a row each).
  int64_t copies() const {
    int64_t n = 0;
    for (int64_t e : indices)
      n += e >= 0;
    return n;
  }
};

/// The CPU test's sample: expert 2 of 5 gets nothing; tokens repeat experts.
Case sampleCase() {
  return {7, 3, 5, 5, {4, 0, 1, 1, 3, 0, 0, 4, 3, 3, 1, 4, 0, 1, 3, 4, 3, 0, 1, 0, 4}};
}

Case randomCase(int64_t tokens, int64_t topK, int64_t features, int64_t experts, uint64_t seed) {
  return {tokens, topK, features, experts, skewedIndices(tokens, topK, experts, seed)};
}

/// What rank `rank` of `ranks` expert-parallel ranks sees of `c`: its experts renumbered from
/// 0, every other expert -1 (no copy here).
Case localCase(Case c, int64_t ranks, int64_t rank) {
  int64_t per = c.experts / ranks;
  for (int64_t &e : c.indices)
    e = e / per == rank ? e - rank * per : -1;
  c.experts = per;
  return c;
}

std::vector<Case> cases() {
  return {sampleCase(),
          localCase(randomCase(33, 2, 13, 8, 8), 2, 0),
          localCase(randomCase(257, 4, 33, 64, 9), 4, 3),
          localCase(randomCase(1000, 8, 33, 256, 10), 2, 1),
          randomCase(1, 1, 7, 8, 1),
          randomCase(33, 2, 13, 8, 2),
          randomCase(13, 8, 5, 8, 3), // every expert in every token
          randomCase(100, 6, 130, 64, 4),
          randomCase(257, 4, 33, 64, 5),
          randomCase(1000, 8, 33, 256, 6),
          randomCase(37, 8, 300, 256, 7),
          // Features a multiple of 8: rows move eight values at a time.
          randomCase(100, 6, 64, 64, 11),
          localCase(randomCase(257, 8, 128, 64, 12), 2, 1),
          randomCase(37, 8, 2048, 128, 13)};
}

KernelCall dispatchCall(const Case &c, uint64_t seed, plan::DType indexType = plan::I32) {
  KernelCall call(registry(), "dispatch");
  call.input(tensorOf({c.tokens, c.features}, randomBf16(c.tokens * c.features, seed)))
      .input(indexTensor(indexType, {c.tokens, c.topK}, c.indices))
      .attr("num_experts", c.experts)
      .output(plan::F32, {c.copies(), c.features})
      .output(plan::I64, {c.experts});
  return call;
}

KernelCall combineCall(const Case &c, uint64_t seed, plan::DType indexType = plan::I32) {
  KernelCall call(registry(), "combine");
  call.input(tensorOf({c.copies(), c.features}, randomBf16(c.copies() * c.features, seed)))
      .input(indexTensor(indexType, {c.tokens, c.topK}, c.indices))
      .input(tensorOf({c.tokens, c.topK}, randomBf16(c.tokens * c.topK, seed + 1)))
      .output(plan::F32, {c.tokens, c.features});
  return call;
}

TEST(CudaDispatch, RowsAreExpertMajorAndStable) {
  uint64_t seed = 10;
  for (const Case &c : cases())
    for (plan::DType type : {plan::I32, plan::I64}) {
      SCOPED_TRACE("tokens " + std::to_string(c.tokens) + ", experts " +
                   std::to_string(c.experts));
      expectGpuMatchesCpu([&] { return dispatchCall(c, seed, type); });
      ++seed;
    }
}

TEST(CudaDispatchBackward, SumsEachTokensCopies) {
  uint64_t seed = 100;
  for (const Case &c : cases())
    for (plan::DType type : {plan::I32, plan::I64}) {
      SCOPED_TRACE("tokens " + std::to_string(c.tokens) + ", experts " +
                   std::to_string(c.experts));
      expectGpuMatchesCpu([&] {
        KernelCall forward = dispatchCall(c, seed, type);
        std::vector<OwnedTensor> grads{tensorOf(
            {c.copies(), c.features}, randomBf16(c.copies() * c.features, seed + 1))};
        return backwardCall(registry(), forward, {0}, {0}, grads);
      });
      seed += 2;
    }
}

TEST(CudaCombine, WeightedSumOfEachTokensCopies) {
  uint64_t seed = 200;
  for (const Case &c : cases())
    for (plan::DType type : {plan::I32, plan::I64}) {
      SCOPED_TRACE("tokens " + std::to_string(c.tokens) + ", experts " +
                   std::to_string(c.experts));
      // The router's weights stay f32.
      expectGpuMatchesCpu([&] { return combineCall(c, seed, type); }, {2});
      seed += 2;
    }
}

TEST(CudaCombineBackward, ExpertOutputsAndWeights) {
  uint64_t seed = 300;
  // grad_of_inputs orders, and the position of the weights' gradient (f32).
  std::vector<std::pair<std::vector<int64_t>, std::vector<size_t>>> requests = {
      {{0, 2}, {1}}, {{2, 0}, {0}}, {{2}, {0}}, {{0}, {}}};
  for (const Case &c : cases())
    for (const auto &[wrt, f32Outputs] : requests) {
      SCOPED_TRACE("tokens " + std::to_string(c.tokens) + ", experts " +
                   std::to_string(c.experts) + ", " + std::to_string(wrt.size()) + " grads");
      expectGpuMatchesCpu(
          [&] {
            KernelCall forward = combineCall(c, seed);
            std::vector<OwnedTensor> grads{
                tensorOf({c.tokens, c.features}, randomBf16(c.tokens * c.features, seed + 2))};
            return backwardCall(registry(), forward, wrt, {0}, grads);
          },
          {2}, f32Outputs);
      seed += 3;
    }
}

TEST(CudaCombineBackward, NoGradientOfResultGivesZeros) {
  Case c = sampleCase();
  expectGpuMatchesCpu(
      [&] {
        KernelCall forward = combineCall(c, 400);
        return backwardCall(registry(), forward, {0, 2}, {}, {});
      },
      {2}, {1});
}

TEST(CudaDispatchCombineErrors, BadLaunchesNameTheProblem) {
  Case c = sampleCase();
  {
    KernelCall call = dispatchCall(c, 11);
    call.attributes().erase("num_experts");
    expectRefused(call, "missing attribute 'num_experts'");
  }
  {
    KernelCall call(registry(), "dispatch");
    call.input(tensorOf({c.tokens, c.features}, randomBf16(c.tokens * c.features, 11)))
        .input(indexTensor(plan::I32, {c.tokens, c.topK}, c.indices))
        .attr("num_experts", c.experts)
        .output(plan::F32, {c.tokens * c.topK + 1, c.features})
        .output(plan::I64, {c.experts});
    expectRefused(call, "tokens has shape [22,5], expected [rows, 5] with rows <= 21 (a row per expert copy)");
  }
  {
    KernelCall call = dispatchCall(c, 11);
    call.result(1).dtype = plan::I32;
    expectRefused(call, "counts must be i64");
  }
  {
    KernelCall call = combineCall(c, 12);
    call.inputsRef()[0] = tensorOf({c.tokens * c.topK + 1, c.features},
                                   randomBf16((c.tokens * c.topK + 1) * c.features, 13));
    expectRefused(call, "expert_output has shape [22,5], expected [rows, 5] with rows <= 21");
  }
  {
    KernelCall forward = combineCall(c, 14);
    std::vector<OwnedTensor> grads{
        tensorOf({c.tokens, c.features}, randomBf16(c.tokens * c.features, 15))};
    expectRefused(backwardCall(registry(), forward, {1}, {0}, grads), "indices are integers");
  }
}

} // namespace
} // namespace moec::runtime::cuda::routing::testing
