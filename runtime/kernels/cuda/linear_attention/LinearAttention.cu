//===- LinearAttention.cu - registers the CUDA linear-attention kernels ----===//

#include "runtime/kernels/cuda/CudaKernels.h"
#include "runtime/kernels/cuda/linear_attention/LinearAttentionCommon.cuh"

namespace moec::runtime::cuda {

void registerLinearAttentionKernels(KernelRegistry &registry) {
  linattn::registerGatedDeltaNetKernels(registry);
  linattn::registerKdaKernels(registry);
}

} // namespace moec::runtime::cuda
