//===- CoreTestUtil.cpp - helpers for the core kernel tests ---------------===//

#include "runtime/kernels/cpu/core/CoreTestUtil.h"

#include <cmath>

#include <gtest/gtest.h>

#include "runtime/kernels/cpu/CpuKernels.h"

namespace moec::runtime::cpu::core::testing {

const KernelRegistry &registry() {
  static const KernelRegistry kernels = [] {
    KernelRegistry r;
    registerCoreKernels(r);
    return r;
  }();
  return kernels;
}

std::string failureOf(KernelCall &call) {
  try {
    call.run();
  } catch (const KernelError &e) {
    return e.what();
  }
  return "";
}

void expectNear(const std::vector<float> &got, const std::vector<double> &want, double tolerance,
                const std::string &what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_LE(std::abs(got[i] - want[i]), tolerance * std::max(1.0, std::abs(want[i])))
        << what << " [" << i << "]: got " << got[i] << ", want " << want[i];
}

KernelCall backwardOf(KernelCall &forward, const std::vector<int64_t> &wrt,
                      std::vector<std::pair<int64_t, OwnedTensor>> resultGrads) {
  KernelCall backward(registry(), forward.kernelName() + ".backward");
  backward.attributes() = forward.attributes();
  std::vector<int64_t> gradOfOutputs;
  for (OwnedTensor &t : forward.inputsRef())
    backward.input(t);
  for (auto &[result, grad] : resultGrads) {
    gradOfOutputs.push_back(result);
    backward.input(std::move(grad));
  }
  backward.attr("grad_of_inputs", wrt).attr("grad_of_outputs", gradOfOutputs);
  backward.attr("backward_segments",
                std::vector<int64_t>{static_cast<int64_t>(forward.inputsRef().size()), 0,
                                     static_cast<int64_t>(gradOfOutputs.size())});
  backward.sequences(forward.seqLen(), forward.microBatch());
  for (int64_t index : wrt)
    backward.output(plan::F32, forward.inputsRef().at(index).shape);
  return backward;
}

KernelCall backwardWithResultsOf(KernelCall &forward, const std::vector<int64_t> &wrt,
                                 std::vector<std::pair<int64_t, OwnedTensor>> resultGrads) {
  forward.run();
  KernelCall backward(registry(), forward.kernelName() + ".backward");
  backward.attributes() = forward.attributes();
  for (OwnedTensor &t : forward.inputsRef())
    backward.input(t);
  for (size_t i = 0; i < forward.numOutputs(); ++i)
    backward.input(forward.result(i));
  std::vector<int64_t> gradOfOutputs;
  for (auto &[result, grad] : resultGrads) {
    gradOfOutputs.push_back(result);
    backward.input(std::move(grad));
  }
  backward.attr("grad_of_inputs", wrt).attr("grad_of_outputs", gradOfOutputs);
  backward.attr("backward_segments",
                std::vector<int64_t>{static_cast<int64_t>(forward.inputsRef().size()),
                                     static_cast<int64_t>(forward.numOutputs()),
                                     static_cast<int64_t>(gradOfOutputs.size())});
  backward.sequences(forward.seqLen(), forward.microBatch());
  for (int64_t index : wrt)
    backward.output(plan::F32, forward.inputsRef().at(index).shape);
  return backward;
}

std::vector<double> widen(const OwnedTensor &t) {
  std::vector<float> f = t.floats();
  return {f.begin(), f.end()};
}

} // namespace moec::runtime::cpu::core::testing
