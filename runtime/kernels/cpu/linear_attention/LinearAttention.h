//===- LinearAttention.h - the linear-attention kernel files -----*- C++ -*-===//

#ifndef RUNTIME_KERNELS_CPU_LINEAR_ATTENTION_LINEARATTENTION_H_
#define RUNTIME_KERNELS_CPU_LINEAR_ATTENTION_LINEARATTENTION_H_

#include "runtime/kernels/Kernel.h"

namespace moec::runtime::cpu::linattn {

/// gated_delta_net and gated_delta_net.backward (GatedDeltaNet.cpp).
void registerGatedDeltaNetKernels(KernelRegistry &registry);
/// kda and kda.backward (Kda.cpp).
void registerKdaKernels(KernelRegistry &registry);

} // namespace moec::runtime::cpu::linattn

#endif // RUNTIME_KERNELS_CPU_LINEAR_ATTENTION_LINEARATTENTION_H_
