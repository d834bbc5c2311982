//===- CoreTestUtil.h - helpers for the core kernel tests -------*- C++ -*-===//

#ifndef RUNTIME_KERNELS_CPU_CORE_CORETESTUTIL_H_
#define RUNTIME_KERNELS_CPU_CORE_CORETESTUTIL_H_

#include <string>
#include <utility>
#include <vector>

#include "runtime/kernels/testing/KernelTesting.h"

namespace moec::runtime::cpu::core::testing {

using namespace moec::runtime::testing;

/// A registry holding the core kernels.
const KernelRegistry &registry();

/// The message of the KernelError `call.run()` throws, or "" when it runs.
std::string failureOf(KernelCall &call);

/// Expects |got - want| <= tolerance * max(1, |want|) everywhere.
void expectNear(const std::vector<float> &got, const std::vector<double> &want, double tolerance,
                const std::string &what);

/// The `.backward` launch of `forward` (its inputs as operands), asking for
/// the gradients of operands `wrt`, given the gradients of some results.
KernelCall backwardOf(KernelCall &forward, const std::vector<int64_t> &wrt,
                      std::vector<std::pair<int64_t, OwnedTensor>> resultGrads);

/// The same for an op whose rule passes its results to its backward (backwardUsesResults, as
/// lm_head_cross_entropy's): runs `forward` and passes its results after its operands.
KernelCall backwardWithResultsOf(KernelCall &forward, const std::vector<int64_t> &wrt,
                                 std::vector<std::pair<int64_t, OwnedTensor>> resultGrads);

/// The float values of a tensor, widened.
std::vector<double> widen(const OwnedTensor &t);

} // namespace moec::runtime::cpu::core::testing

#endif // RUNTIME_KERNELS_CPU_CORE_CORETESTUTIL_H_
