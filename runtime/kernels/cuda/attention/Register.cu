//===- Register.cu - the CUDA attention family's kernels ------------------===//

#include "runtime/kernels/cuda/CudaKernels.h"
#include "runtime/kernels/cuda/attention/Kernels.cuh"

namespace moec::runtime::cuda {

void registerAttentionKernels(KernelRegistry &registry) {
  attention::registerRopeKernels(registry);
  attention::registerGqaKernels(registry);
  attention::registerMlaKernels(registry);
  attention::registerIndexerKernels(registry);
}

} // namespace moec::runtime::cuda
