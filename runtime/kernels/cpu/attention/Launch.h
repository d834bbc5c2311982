//===- Launch.h - launch checks shared by the attention kernels -*- C++ -*-===//
//
// Validation happens before any parallel section (a kernel body must not
// throw from a worker), so every helper here fails through ctx.fail with a
// message naming the operand or attribute at fault.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CPU_ATTENTION_LAUNCH_H_
#define RUNTIME_KERNELS_CPU_ATTENTION_LAUNCH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/kernels/Kernel.h"

namespace moec::runtime::cpu::attention {

/// Fails unless `t` is an f32 tensor of these dims (-1 = any); returns its data.
float *floatTensor(const KernelContext &ctx, const TensorRef &t, const char *what,
                   std::vector<int64_t> dims);
/// Fails unless `t` is an i32/i64 tensor of exactly these dims.
void expectIndices(const KernelContext &ctx, const TensorRef &t, const char *what,
                   std::vector<int64_t> dims);
/// An integer attribute that must be positive.
int64_t positiveAttr(const KernelContext &ctx, const std::string &name);

/// The step's sequences: `count` sequences of `length` rows cover the T rows.
struct Sequences {
  int64_t count = 0, length = 0;
};
Sequences sequencesOf(const KernelContext &ctx, int64_t tokens);

/// The number of forward operands of a `.backward` launch of an op with one
/// result: backward_segments[0], or all inputs but the trailing gradient
/// without it. Fails unless it lies in [minOperands, maxOperands].
size_t backwardOperands(const KernelContext &ctx, size_t minOperands, size_t maxOperands);
/// Checks the rest of the backward launch once the forward operands are
/// validated: grad_of_inputs names distinct operands among `differentiable`,
/// each output is f32 shaped like its operand, the result gradient (if any)
/// is f32 [rows, cols]. Zeroes the outputs; returns the result gradient, or
/// null when grad_of_outputs is empty (every gradient is then zero).
const float *checkBackward(const KernelContext &ctx, size_t numOperands,
                           const std::vector<int64_t> &differentiable, int64_t rows, int64_t cols);
/// The gradient output of forward operand `operand`, or null when not asked for.
float *gradFor(const KernelContext &ctx, int64_t operand);

} // namespace moec::runtime::cpu::attention

#endif // RUNTIME_KERNELS_CPU_ATTENTION_LAUNCH_H_
