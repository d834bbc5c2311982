//===- DeviceProbe.h - GPU count and a kernel smoke test --------*- C++ -*-===//
//
// Plain C++ on purpose: callers (tests, tools) are built by the host compiler
// and must not need the CUDA headers.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_BACKENDS_CUDA_DEVICEPROBE_H_
#define RUNTIME_BACKENDS_CUDA_DEVICEPROBE_H_

#include <string>

namespace moec::runtime::cuda {

enum class ProbeOutcome {
  /// No driver or no device: expected on CI and dev machines, not an error.
  NoGpu,
  /// A vector-add kernel ran on device 0 and produced the right sums.
  KernelOk,
  /// The kernel ran but produced wrong sums.
  KernelWrong,
  /// Any other CUDA failure (e.g. the binary has no code for this GPU).
  CudaError,
};

struct ProbeResult {
  ProbeOutcome outcome = ProbeOutcome::CudaError;
  int deviceCount = 0;
  /// One line for humans; starts with "no GPU available" for NoGpu.
  std::string status;
};

/// Counts the GPUs and, if there is one, checks a trivial kernel on device 0.
/// Never aborts: every CUDA error comes back as a ProbeResult.
ProbeResult probeDevices();

} // namespace moec::runtime::cuda

#endif // RUNTIME_BACKENDS_CUDA_DEVICEPROBE_H_
