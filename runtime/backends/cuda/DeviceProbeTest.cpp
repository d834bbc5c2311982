//===- DeviceProbeTest.cpp - the probe kernel; skips without a GPU --------===//
//
// Runs in CI, which has no GPU: there the test is reported as skipped, not
// failed, so the same target also guards the GPU machine.
//
//===----------------------------------------------------------------------===//

#include "runtime/backends/cuda/DeviceProbe.h"

#include <gtest/gtest.h>

namespace moec::runtime::cuda {
namespace {

TEST(DeviceProbeTest, VectorAddKernelIsCorrect) {
  ProbeResult result = probeDevices();
  if (result.outcome == ProbeOutcome::NoGpu)
    GTEST_SKIP() << result.status;

  EXPECT_GT(result.deviceCount, 0) << result.status;
  EXPECT_EQ(result.outcome, ProbeOutcome::KernelOk) << result.status;
}

TEST(DeviceProbeTest, StatusIsNeverEmpty) {
  // Whatever the machine, callers always get something to print.
  EXPECT_FALSE(probeDevices().status.empty());
}

} // namespace
} // namespace moec::runtime::cuda
