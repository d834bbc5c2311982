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
#include <vector>

#include "runtime/kernels/Kernel.h"
#include "runtime/kernels/checks/attention/Launch.h"

namespace moec::runtime::cpu::attention {

/// Fails unless `t` is an f32 tensor of these dims (-1 = any); returns its data.
float *floatTensor(const KernelContext &ctx, const TensorRef &t, const char *what,
                   std::vector<int64_t> dims);
using checks::attention::backwardOperands;
using checks::attention::expectIndices;
using checks::attention::nonNegativeAttr;
using checks::attention::positiveAttr;
using checks::attention::Sequences;
using checks::attention::sequencesOf;

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
