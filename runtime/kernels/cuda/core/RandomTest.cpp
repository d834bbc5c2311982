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

TEST(CudaFillRandom, MatchesCpuForAPartOfTheTensor) {
  SKIP_WITHOUT_GPU();
  // An expert-parallel rank's elements (first_index), a tensor-parallel rank's columns of every
  // row (whole_columns, first_column), and the same with a row wider than the last dimension.
  struct Part {
    std::vector<int64_t> shape;
    int64_t first, columns, whole, from;
  };
  for (const Part &p : std::vector<Part>{{{100, 33}, 4000, 0, 0, 0},
                                         {{64, 48}, 0, 48, 96, 48},
                                         {{4, 8, 16}, 1024, 128, 256, 128}})
    expectMatchesCpu(
        [&] {
          KernelCall call(registry(), "fill_random");
          call.output(plan::F32, p.shape).attr("kind", "normal").attr("stream", int64_t(7)).attr("std", 0.02);
          call.attr("first_index", p.first);
          if (p.whole > 0)
            call.attr("columns", p.columns).attr("whole_columns", p.whole).attr("first_column", p.from);
          return call;
        },
        "fill_random part of " + shapeText(p.shape));
}

} // namespace
} // namespace moec::runtime::cuda::core::testing
