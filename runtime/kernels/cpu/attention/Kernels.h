//===- Kernels.h - the attention family's registration pieces --*- C++ -*-===//

#ifndef RUNTIME_KERNELS_CPU_ATTENTION_KERNELS_H_
#define RUNTIME_KERNELS_CPU_ATTENTION_KERNELS_H_

#include "runtime/kernels/Kernel.h"

namespace moec::runtime::cpu::attention {

void registerRopeKernels(KernelRegistry &registry);    // rope (Rope.cpp)
void registerGqaKernels(KernelRegistry &registry);     // attention (Attention.cpp)
void registerMlaKernels(KernelRegistry &registry);     // mla, sparse_attention (Mla.cpp)
void registerIndexerKernels(KernelRegistry &registry); // dsa_indexer (DsaIndexer.cpp)

} // namespace moec::runtime::cpu::attention

#endif // RUNTIME_KERNELS_CPU_ATTENTION_KERNELS_H_
