//===- Routing.h - the routing kernels' shared pieces (internal) -*- C++ -*-===//
//
// router, dispatch, expert_mlp and combine: one file each (dispatch and
// combine share the expert-major row order), registered by RoutingKernels.cpp.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CPU_ROUTING_ROUTING_H_
#define RUNTIME_KERNELS_CPU_ROUTING_ROUTING_H_

#include <cstdint>
#include <vector>

#include "runtime/kernels/Kernel.h"
#include "runtime/kernels/checks/routing/RoutingChecks.h"

namespace moec::runtime::cpu::routing {

void routerForward(KernelContext &ctx);
void routerBackward(KernelContext &ctx);
void dispatchForward(KernelContext &ctx);
void dispatchBackward(KernelContext &ctx);
void combineForward(KernelContext &ctx);
void combineBackward(KernelContext &ctx);
void expertMlpForward(KernelContext &ctx);
void expertMlpBackward(KernelContext &ctx);
void expertMlpCombineBackward(KernelContext &ctx);

// Operand layout and index checks shared with the CUDA twins.
using checks::routing::expectIndices;
using checks::routing::OperandGroups;
using checks::routing::operandGroups;
using checks::routing::resultGrad;

/// The gradient outputs of a backward kernel, checked (see
/// checks::routing::gradOutputs; F32 here) and zeroed.
/// Returns, per forward operand, its gradient buffer or null.
std::vector<float *> gradOutputs(const KernelContext &ctx, int64_t numOperands,
                                 const std::vector<std::pair<int64_t, const char *>> &noGrad);

/// Fails unless `t` is an F32 tensor (the CPU kernels compute in f32).
void expectF32(const KernelContext &ctx, const TensorRef &t, const char *what);

/// For each copy (t, j) of indices [T, k], the row it takes in dispatch's
/// expert-major order: rows grouped by expert in increasing expert order and,
/// within one expert, in (token, slot) order (a stable counting sort). A negative
/// index (an expert on another rank) makes no copy: its row is -1. Fails on an
/// index >= numExperts. `counts` (if given) gets rows per expert.
std::vector<int64_t> expertMajorRows(const KernelContext &ctx, const TensorRef &indices,
                                     int64_t numExperts, std::vector<int64_t> *counts = nullptr);

} // namespace moec::runtime::cpu::routing

#endif // RUNTIME_KERNELS_CPU_ROUTING_ROUTING_H_
