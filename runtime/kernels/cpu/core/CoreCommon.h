//===- CoreCommon.h - helpers shared by the core CPU kernels ----*- C++ -*-===//
//
// Launch checks that name the offending tensor, the `.backward` launch
// layout of Kernel.h, and a row-blocked reduction whose result does not
// depend on the thread count.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CPU_CORE_CORECOMMON_H_
#define RUNTIME_KERNELS_CPU_CORE_CORECOMMON_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/kernels/Kernel.h"

namespace moec::runtime::cpu::core {

/// The f32 data of `t`, or a failure naming `what`.
float *floats(const KernelContext &ctx, const TensorRef &t, const std::string &what);
/// Fails unless `t` holds I32 or I64 indices.
void expectIndices(const KernelContext &ctx, const TensorRef &t, const std::string &what);
/// Fails unless `a` and `b` have the same shape.
void expectSameShape(const KernelContext &ctx, const TensorRef &a, const std::string &aName,
                     const TensorRef &b, const std::string &bName);
/// Fails unless `t` has rank >= 1 and last dimension `features` (-1 = any); returns the
/// number of rows (product of the other dimensions).
int64_t rowsOf(const KernelContext &ctx, const TensorRef &t, const std::string &what,
               int64_t features = -1);
/// Fails unless `t` has x's shape with its last dimension replaced by `last`.
void expectRowsShape(const KernelContext &ctx, const TensorRef &t, const std::string &what,
                     const TensorRef &x, int64_t last);
/// "[2,3]".
std::string shapeText(const std::vector<int64_t> &shape);

/// The inputs and outputs of a `.backward` launch (see Kernel.h): forward
/// operands, forward results, gradients of some results; gradients of some
/// operands out.
class BackwardLaunch {
public:
  /// Checks the layout against `backward_segments` (when present), that the
  /// result gradients name one of the forward op's `numResults` results, and
  /// that each requested operand gradient is in `differentiable` and has its
  /// operand's shape.
  BackwardLaunch(const KernelContext &ctx, size_t numResults,
                 const std::vector<int64_t> &differentiable);

  size_t numOperands() const { return operands; }
  const TensorRef &operand(size_t i) const { return ctx.inputs[i]; }
  /// The gradient arriving at forward result `result`, or null (= zero).
  const TensorRef *resultGrad(int64_t result) const;
  /// The gradient of the op's one result, which must be given and have `shape`.
  const float *resultGrad0(const std::vector<int64_t> &shape) const;
  /// Where to write the gradient of forward operand `operand`, or null if not asked.
  const TensorRef *operandGrad(int64_t operand) const;

private:
  const KernelContext &ctx;
  size_t operands = 0, results = 0;
  std::vector<int64_t> gradOfOutputs, gradOfInputs;
};

/// Runs fn(begin, end, partial) over rows [0, rows) in fixed blocks of rows,
/// in parallel, each block adding into its own `width` doubles; returns the
/// blocks' sums added in block order. Blocks do not depend on the thread
/// count, so neither does the result.
std::vector<double> rowBlocks(const KernelContext &ctx, int64_t rows, int64_t width,
                              const std::function<void(int64_t, int64_t, double *)> &fn);

/// The registration functions of each file.
void registerNormKernels(KernelRegistry &registry);
void registerDenseKernels(KernelRegistry &registry);
void registerElementwiseKernels(KernelRegistry &registry);
void registerTokenKernels(KernelRegistry &registry);
/// fill_random (Random.cpp): random weights, as on the GPU (../../RandomFill.h).
void registerRandomKernels(KernelRegistry &registry);

} // namespace moec::runtime::cpu::core

#endif // RUNTIME_KERNELS_CPU_CORE_CORECOMMON_H_
