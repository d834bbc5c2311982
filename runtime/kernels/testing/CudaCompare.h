//===- CudaCompare.h - a CUDA kernel against its CPU twin -------*- C++ -*-===//
//
//   KernelCall call(cpuKernels, "rms_norm");  // set up as for a CPU test
//   ...
//   CudaComparison r = compareCudaWithCpu(cudaKernels, call, {plan::BF16});
//   if (r.skipped) GTEST_SKIP() << r.why;
//   EXPECT_TRUE(r.ok) << r.report;
//
// Runs the launch on the CPU (the oracle: the call's own registry) and on the GPU with the same
// inputs; GPU outputs are poisoned (NaN, -1) before the run, every element
// is compared, and the error of each float output is ||gpu - cpu|| / ||cpu||.
// With BF16 storage, float inputs are rounded to bf16 first (so the CPU sees
// exactly what the GPU stores) and the tolerance is DESIGN.md's 2e-2.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_TESTING_CUDACOMPARE_H_
#define RUNTIME_KERNELS_TESTING_CUDACOMPARE_H_

#include <string>
#include <vector>

#include "runtime/kernels/testing/KernelTesting.h"

namespace moec::runtime::testing {

struct CudaCompareOptions {
  plan::DType storage = plan::F32;
  /// Float inputs / outputs that stay f32 with BF16 storage (router weights, the loss, ...).
  std::vector<size_t> f32Inputs, f32Outputs;
  /// 0: 1e-5 for F32 storage, 2e-2 for BF16.
  double tolerance = 0;
  /// An output whose largest error is below this also passes: values that are rounding noise
  /// around zero (a one-feature norm's gradient) have no meaningful relative error.
  double absoluteFloor = 1e-7;
};

struct CudaComparison {
  bool skipped = false; // no GPU here
  std::string why;      // the reason when skipped
  bool ok = false;
  std::vector<double> errors; // per output: relative error (floats) or mismatching elements (ints)
  std::string report;         // one line per output
};

/// Whether a GPU can run kernels here, with the reason when not.
bool cudaDeviceAvailable(std::string *why);

CudaComparison compareCudaWithCpu(const KernelRegistry &cuda, KernelCall &call,
                                  const CudaCompareOptions &options = {});

} // namespace moec::runtime::testing

#endif // RUNTIME_KERNELS_TESTING_CUDACOMPARE_H_
