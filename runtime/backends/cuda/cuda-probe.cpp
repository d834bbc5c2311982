//===- cuda-probe.cpp - can this machine run MoEC's CUDA code? ------------===//
//
// Exits 0 when there is no GPU (a valid answer, e.g. on CI) or the kernel is
// right; 1 on any CUDA failure or a wrong result.
//
//===----------------------------------------------------------------------===//

#include "runtime/backends/cuda/DeviceProbe.h"

#include <cstdio>

using namespace moec::runtime::cuda;

int main() {
  ProbeResult result = probeDevices();
  std::printf("cuda-probe: %s\n", result.status.c_str());
  return result.outcome == ProbeOutcome::NoGpu ||
                 result.outcome == ProbeOutcome::KernelOk
             ? 0
             : 1;
}
