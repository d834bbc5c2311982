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

namespace moec::runtime::cpu::routing {

void routerForward(KernelContext &ctx);
void routerBackward(KernelContext &ctx);
void dispatchForward(KernelContext &ctx);
void dispatchBackward(KernelContext &ctx);
void combineForward(KernelContext &ctx);
void combineBackward(KernelContext &ctx);
void expertMlpForward(KernelContext &ctx);
void expertMlpBackward(KernelContext &ctx);

/// Where each forward operand group sits among the launch's inputs, from
/// `operand_segments` (required: these ops have several optional operands).
/// `optional[g]` says whether group g may be absent.
struct OperandGroups {
  std::vector<int64_t> input; // per group: index into ctx.inputs, or -1 when absent
  int64_t present = 0;        // number of forward operands

  bool has(size_t group) const { return input[group] >= 0; }
  const TensorRef *get(const KernelContext &ctx, size_t group) const {
    return has(group) ? &ctx.inputs[input[group]] : nullptr;
  }
};
OperandGroups operandGroups(const KernelContext &ctx, const std::vector<bool> &optional);

/// A backward kernel's gradient of forward result `result` (located through
/// `backward_segments` and `grad_of_outputs`), or null when it is not passed.
const TensorRef *resultGrad(const KernelContext &ctx, int64_t result);

/// The gradient outputs of a backward kernel, checked: each entry of
/// grad_of_inputs must name a forward operand in [0, numOperands) that is not
/// in `noGrad` (index tensors, buffers; the message says why), and its output
/// must be an F32 tensor of that operand's size. Outputs are zeroed.
/// Returns, per forward operand, its gradient buffer or null.
std::vector<float *> gradOutputs(const KernelContext &ctx, int64_t numOperands,
                                 const std::vector<std::pair<int64_t, const char *>> &noGrad);

/// Fails unless `t` is an F32 tensor (the CPU kernels compute in f32).
void expectF32(const KernelContext &ctx, const TensorRef &t, const char *what);

/// For each copy (t, j) of indices [T, k], the row it takes in dispatch's
/// expert-major order: rows grouped by expert in increasing expert order and,
/// within one expert, in (token, slot) order (a stable counting sort). Fails on
/// an index outside [0, numExperts). `counts` (if given) gets rows per expert.
std::vector<int64_t> expertMajorRows(const KernelContext &ctx, const TensorRef &indices,
                                     int64_t numExperts, std::vector<int64_t> *counts = nullptr);

} // namespace moec::runtime::cpu::routing

#endif // RUNTIME_KERNELS_CPU_ROUTING_ROUTING_H_
