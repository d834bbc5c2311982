//===- RandomTest.cpp - fill_random on the GPU against the CPU ------------===//
//
// The two backends share the formula (runtime/kernels/RandomFill.h), so a
// random model made on the GPU equals one made on the CPU.

#include "runtime/kernels/cuda/core/CoreCompare.h"

namespace moec::runtime::cuda::core::testing {
namespace {

TEST(CudaFillRandom, MatchesCpuForEveryKind) {
  SKIP_WITHOUT_GPU();
  for (const char *kind : {"normal", "zeros", "ones", "a_log", "dt_bias"})
    for (int64_t n : {1, 7, 1000, 300001})
      expectMatchesCpu(
          [&] {
            KernelCall call(registry(), "fill_random");
            call.output(plan::F32, {n}).attr("kind", kind).attr("stream", int64_t(12345)).attr("std", 0.02);
            return call;
          },
          std::string("fill_random ") + kind + " x" + std::to_string(n));
}

} // namespace
} // namespace moec::runtime::cuda::core::testing
