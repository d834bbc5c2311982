//===- Launch.h - launch checks of the CPU and CUDA attention kernels===//
//
// The checks that do not depend on where the data lives or how floats are
// stored. Every helper fails through ctx.fail with a message naming the
// operand or attribute at fault.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CHECKS_ATTENTION_LAUNCH_H_
#define RUNTIME_KERNELS_CHECKS_ATTENTION_LAUNCH_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/kernels/Kernel.h"

namespace moec::runtime::checks::attention {

/// Fails unless `t` is an i32/i64 tensor of exactly these dims; true for i64.
bool expectIndices(const KernelContext &ctx, const TensorRef &t, const char *what,
                   std::vector<int64_t> dims);
/// An integer attribute that must be positive.
int64_t positiveAttr(const KernelContext &ctx, const std::string &name);
/// An integer attribute that must not be negative.
int64_t nonNegativeAttr(const KernelContext &ctx, const std::string &name);

/// The step's sequences: `count` sequences of `length` rows cover the T rows.
struct Sequences {
  int64_t count = 0, length = 0;
};
Sequences sequencesOf(const KernelContext &ctx, int64_t tokens);

/// The number of forward operands of a `.backward` launch of an op with one
/// result: backward_segments[0], or all inputs but the trailing gradient
/// without it. Fails unless it lies in [minOperands, maxOperands].
size_t backwardOperands(const KernelContext &ctx, size_t minOperands, size_t maxOperands);
/// Checks that grad_of_inputs names distinct operands among `differentiable`,
/// one per output, each output f32 (or bf16 when `bf16`) shaped like its
/// operand. Returns grad_of_inputs.
std::vector<int64_t> checkGradOutputs(const KernelContext &ctx, size_t numOperands,
                                      const std::vector<int64_t> &differentiable, bool bf16);
/// Whether the launch carries the result's gradient (after the operands and
/// any saved results).
bool hasResultGradient(const KernelContext &ctx, size_t numOperands);

} // namespace moec::runtime::checks::attention

#endif // RUNTIME_KERNELS_CHECKS_ATTENTION_LAUNCH_H_
