//===- CudaBackend.cpp - every CUDA kernel family -------------------------===//

#include "runtime/kernels/cuda/CudaKernels.h"

namespace moec::runtime::cuda {

void registerCudaKernels(KernelRegistry &registry) {
  registerCoreKernels(registry);
  registerAttentionKernels(registry);
  registerRoutingKernels(registry);
  registerLinearAttentionKernels(registry);
  registerMambaKernels(registry);
}

} // namespace moec::runtime::cuda
