//===- CudaKernels.h - the CUDA backend's kernel families -------*- C++ -*-===//
//
// The same kernel names and launch contract as the CPU backend
// (../Kernel.h), one folder per family mirroring cpu/. Each CUDA kernel is
// checked against its CPU twin by a comparison test (../testing/CudaCompare.h).
// Plain C++: callers need no CUDA headers.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CUDA_CUDAKERNELS_H_
#define RUNTIME_KERNELS_CUDA_CUDAKERNELS_H_

#include "runtime/kernels/Kernel.h"

namespace moec::runtime::cuda {

void registerCoreKernels(KernelRegistry &registry);            // core/
void registerAttentionKernels(KernelRegistry &registry);       // attention/
void registerRoutingKernels(KernelRegistry &registry);         // routing/
void registerLinearAttentionKernels(KernelRegistry &registry); // linear_attention/
void registerMambaKernels(KernelRegistry &registry);           // mamba/

/// Every family above: the CUDA backend.
void registerCudaKernels(KernelRegistry &registry);

} // namespace moec::runtime::cuda

#endif // RUNTIME_KERNELS_CUDA_CUDAKERNELS_H_
