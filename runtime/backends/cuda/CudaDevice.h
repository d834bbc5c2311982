//===- CudaDevice.h - GPU memory, a stream and the CUDA kernels -*- C++ -*-===//
//
// Plain C++: callers need no CUDA headers.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_BACKENDS_CUDA_CUDADEVICE_H_
#define RUNTIME_BACKENDS_CUDA_CUDADEVICE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "runtime/exec/Device.h"

namespace moec::runtime::cuda {

/// GPU `ordinal` with one stream, plain cudaMalloc (no managed memory) and the CUDA
/// kernels. Fails with a message (no driver, no GPU, bad ordinal) instead of aborting.
absl::StatusOr<std::unique_ptr<Device>> makeCudaDevice(int ordinal = 0);

/// GPUs this process sees (0 without a driver or a GPU).
int cudaDeviceCount();

} // namespace moec::runtime::cuda

#endif // RUNTIME_BACKENDS_CUDA_CUDADEVICE_H_
