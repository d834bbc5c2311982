//===- Register.cpp - the attention family's kernels ----------------------===//

#include "runtime/kernels/cpu/CpuKernels.h"
#include "runtime/kernels/cpu/attention/Kernels.h"

namespace moec::runtime::cpu {

void registerAttentionKernels(KernelRegistry &registry) {
  attention::registerRopeKernels(registry);
  attention::registerGqaKernels(registry);
  attention::registerMlaKernels(registry);
  attention::registerIndexerKernels(registry);
}

} // namespace moec::runtime::cpu
