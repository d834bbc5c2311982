//===- CpuBackend.cpp - every CPU kernel family ---------------------------===//

#include "runtime/kernels/cpu/CpuKernels.h"

namespace moec::runtime::cpu {

void registerCpuKernels(KernelRegistry &registry) {
  registerCoreKernels(registry);
  registerAttentionKernels(registry);
  registerRoutingKernels(registry);
  registerLinearAttentionKernels(registry);
  registerMambaKernels(registry);
}

} // namespace moec::runtime::cpu
