//===- LaunchChecks.h - linear-attention launch checks, CPU and CUDA -*- C++ -*-===//
//
// The launch checks of gated_delta_net and kda (and their .backward), shared by
// the CPU kernels and their CUDA twins. The backends differ only in the float
// storage they take, so the checks that test storage take the backend's test.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CHECKS_LINEAR_ATTENTION_LAUNCHCHECKS_H_
#define RUNTIME_KERNELS_CHECKS_LINEAR_ATTENTION_LAUNCHCHECKS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/kernels/Kernel.h"

namespace moec::runtime::checks::linattn {

/// A backend's storage check: fails unless `t` is a float tensor it takes.
using ExpectFloat = void (*)(const KernelContext &ctx, const TensorRef &t, const char *what);

struct Tokens {
  int64_t count = 0, seqLen = 0, sequences = 0;
};
/// Fails unless ctx's sequences cover `rows` token rows exactly.
Tokens tokensOf(const KernelContext &ctx, int64_t rows);
/// Fails unless `t` has `n` elements (any shape: [H] and [1,1,H,1] alike).
void expectNumel(const KernelContext &ctx, const TensorRef &t, const char *what, int64_t n,
                 const char *meaning);
/// A positive integer attribute.
int64_t positiveAttr(const KernelContext &ctx, const char *name);
/// Fails unless a conv weight is [channels, 1, K]; returns K.
int64_t convWidth(const KernelContext &ctx, const TensorRef &w, const char *what, int64_t channels);

/// Checks a `.backward` launch against Kernel.h's contract (`resultShape`: the
/// forward result's shape) and returns the forward result's gradient, or null
/// when none flows (all gradients zero).
const TensorRef *checkBackwardLayout(const KernelContext &ctx, size_t numOperands,
                                     const std::vector<int64_t> &resultShape, ExpectFloat expectFloat);

} // namespace moec::runtime::checks::linattn

#endif // RUNTIME_KERNELS_CHECKS_LINEAR_ATTENTION_LAUNCHCHECKS_H_
