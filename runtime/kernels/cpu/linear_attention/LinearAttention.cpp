//===- LinearAttention.cpp - registers the linear-attention kernels -------===//

#include "runtime/kernels/cpu/linear_attention/LinearAttention.h"

#include "runtime/kernels/cpu/CpuKernels.h"

namespace moec::runtime::cpu {

void registerLinearAttentionKernels(KernelRegistry &registry) {
  linattn::registerGatedDeltaNetKernels(registry);
  linattn::registerKdaKernels(registry);
}

} // namespace moec::runtime::cpu
