//===- CpuKernels.h - the CPU backend's kernel families ---------*- C++ -*-===//
//
// One folder per family; each registers its forward and `.backward` kernels.
// The CPU kernels are the reference (the oracle the CUDA kernels are compared
// with): f32 data, f32 or wider accumulation, deterministic for a fixed
// thread count. See ../Kernel.h for the launch contract.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CPU_CPUKERNELS_H_
#define RUNTIME_KERNELS_CPU_CPUKERNELS_H_

#include "runtime/kernels/Kernel.h"

namespace moec::runtime::cpu {

/// embedding, rms_norm, layer_norm, linear, lora, add, activation, glu,
/// sigmoid_gate, split, cross_entropy, fill, accumulate_grad (core/).
void registerCoreKernels(KernelRegistry &registry);
/// rope, attention, mla, sparse_attention, dsa_indexer (attention/).
void registerAttentionKernels(KernelRegistry &registry);
/// router, dispatch, expert_mlp, combine (routing/).
void registerRoutingKernels(KernelRegistry &registry);
/// gated_delta_net, kda (linear_attention/).
void registerLinearAttentionKernels(KernelRegistry &registry);
/// mamba2 (mamba/).
void registerMambaKernels(KernelRegistry &registry);

/// Every family above: the CPU backend.
void registerCpuKernels(KernelRegistry &registry);

} // namespace moec::runtime::cpu

#endif // RUNTIME_KERNELS_CPU_CPUKERNELS_H_
