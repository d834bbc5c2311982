//===- RoutingChecks.h - routing launch checks (CPU and CUDA) ---*- C++ -*-===//
//
// The host side of router, dispatch, expert_mlp and combine that the CPU
// kernels and their CUDA twins share: operand layout, attribute parsing and
// checks, with the same messages. Each side passes its own float dtype check
// (f32 on the CPU, f32 or bf16 on the GPU).
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CHECKS_ROUTING_ROUTINGCHECKS_H_
#define RUNTIME_KERNELS_CHECKS_ROUTING_ROUTINGCHECKS_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "runtime/kernels/Kernel.h"

namespace moec::runtime::checks::routing {

/// A side's check that `t` is a float tensor it computes with (`what` names it).
using ExpectFloat = void (*)(const KernelContext &ctx, const TensorRef &t, const char *what);

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
/// must pass `expectFloat` and have that operand's size. Not zeroed.
/// Returns, per forward operand, its gradient output or null.
std::vector<const TensorRef *>
gradOutputs(const KernelContext &ctx, int64_t numOperands,
            const std::vector<std::pair<int64_t, const char *>> &noGrad, ExpectFloat expectFloat);

/// Fails unless `t` is an I32 or I64 tensor.
void expectIndices(const KernelContext &ctx, const TensorRef &t);

/// An expert MLP's saved pre-activations ([rows, 2 inter] f32: gate x, then up x), checked against its tokens: the forward's second output, or what a backward launch
/// passes as the forward's results (backward_segments [operands, 1, grads]: the one input after
/// the operands). Null where there are none. `savable`: the experts have a separate gate, no up
/// bias and no LoRA on gate or up (the verifier's rule: then G and U are all of the
/// pre-activations); else pre-activations are refused.
const TensorRef *forwardPreActivations(const KernelContext &ctx, const TensorRef &tokens, int64_t inter,
                                       bool savable);
const TensorRef *savedPreActivations(const KernelContext &ctx, const TensorRef &tokens, int64_t inter,
                                     bool savable);

/// An expert_mlp_combine.backward launch (the backward of combine(expert_mlp(...), indices,
/// weights) in one): the expert MLP's operands first (operand_segments: its groups), then the
/// combine's indices and weights, then its saved pre-activations if any, then d result; outputs the gradients grad_of_inputs lists, the
/// weights' last.
struct ExpertCombineLaunch {
  int64_t expertOperands = 0;
  const TensorRef *indices = nullptr, *weights = nullptr, *dResult = nullptr;
  const TensorRef *preActivations = nullptr; // the expert MLP's, where it saved them (its `outputs`)
  bool wantWeights = false;
  std::vector<int64_t> expertGrads; // the expert operands in grad_of_inputs, in order
};
ExpertCombineLaunch expertCombineLaunch(const KernelContext &ctx);

/// The kernel's definition, on either side: the expert outputs again (`forward`, into e), the
/// combine's backward (`combineBackward`: d expert outputs into de, and the weights' gradient),
/// the expert MLP's backward from de (`expertBackward`). e and de: [rows, hidden] buffers of the
/// side's choosing.
using Kernel = void (*)(KernelContext &ctx);
void composeExpertCombineBackward(const KernelContext &ctx, const ExpertCombineLaunch &launch, TensorRef e,
                                  TensorRef de, Kernel forward, Kernel combineBackward, Kernel expertBackward);

} // namespace moec::runtime::checks::routing

#endif // RUNTIME_KERNELS_CHECKS_ROUTING_ROUTINGCHECKS_H_
