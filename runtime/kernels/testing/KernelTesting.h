//===- KernelTesting.h - run one kernel in a test, check its gradients -*- C++ -*-===//
//
//   KernelCall call(registry, "rms_norm");
//   call.input(randomTensor({6, 8}, 1)).input(onesTensor({8})).attr("eps", 1e-6)
//       .output(plan::F32, {6, 8});
//   call.run();                      // throws KernelError on a bad launch
//   std::vector<float> y = call.result(0).floats();
//
//   // The backward kernel against central differences of the forward:
//   GradientCheck check = checkGradients(registry, call, /*wrt=*/{0, 1});
//   EXPECT_LT(check.worstRelativeError, 1e-3) << check.report;
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_TESTING_KERNELTESTING_H_
#define RUNTIME_KERNELS_TESTING_KERNELTESTING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/kernels/Kernel.h"

namespace moec::runtime::testing {

/// A tensor that owns its bytes.
struct OwnedTensor {
  plan::DType dtype = plan::F32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;

  int64_t numel() const;
  TensorRef ref();
  std::vector<float> floats() const;     // F32 only
  std::vector<int64_t> indices() const;  // I32 or I64
};

OwnedTensor floatTensor(std::vector<int64_t> shape, const std::vector<float> &values);
/// Uniform in [-scale, scale), reproducible from `seed`.
OwnedTensor randomTensor(std::vector<int64_t> shape, uint64_t seed, float scale = 1.0f);
OwnedTensor filledTensor(std::vector<int64_t> shape, float value);
OwnedTensor indexTensor(plan::DType dtype, std::vector<int64_t> shape, const std::vector<int64_t> &values);
OwnedTensor zeroTensor(plan::DType dtype, std::vector<int64_t> shape);

/// One launch of one kernel, with owned inputs, outputs and attributes.
class KernelCall {
public:
  KernelCall(const KernelRegistry &registry, std::string kernel);

  KernelCall &input(OwnedTensor tensor);
  KernelCall &output(plan::DType dtype, std::vector<int64_t> shape);
  KernelCall &attr(const std::string &name, int64_t value);
  KernelCall &attr(const std::string &name, int value) { return attr(name, int64_t(value)); }
  KernelCall &attr(const std::string &name, double value);
  KernelCall &attr(const std::string &name, bool value);
  KernelCall &attr(const std::string &name, const char *value);
  KernelCall &attr(const std::string &name, const std::string &value);
  KernelCall &attr(const std::string &name, const std::vector<int64_t> &values);
  /// Sequences: the rows of token-major tensors are microBatch sequences of seqLen.
  KernelCall &sequences(int64_t seqLen, int64_t microBatch);
  KernelCall &threads(ThreadPool *pool);

  /// Zeroes the outputs, then runs the kernel (KernelError on a bad launch).
  void run();
  OwnedTensor &result(size_t i) { return outputs.at(i); }
  size_t numOutputs() const { return outputs.size(); }
  std::vector<OwnedTensor> &inputsRef() { return inputs; }
  const std::string &kernelName() const { return kernel; }
  const google::protobuf::Map<std::string, plan::Attr> &attributes() const { return attrs; }
  google::protobuf::Map<std::string, plan::Attr> &attributes() { return attrs; }
  int64_t seqLen() const { return seq; }
  int64_t microBatch() const { return batch; }

private:
  const KernelRegistry &registry;
  std::string kernel;
  std::vector<OwnedTensor> inputs, outputs;
  google::protobuf::Map<std::string, plan::Attr> attrs;
  int64_t seq = 0, batch = 1;
  ThreadPool *pool = nullptr;
};

struct GradientCheck {
  double worstRelativeError = 0; // over the checked inputs: |analytic - numeric| / max(|numeric|, floor)
  std::string report;            // one line per checked input
};

/// Checks `<forward>.backward` against the forward kernel of `forward` (already
/// set up with its inputs, outputs and attributes): with a random projection
/// r of the outputs listed in `outputsWithGrad` (default: all float outputs)
/// and L = Σ r·y, compares the backward's gradient of each input in `wrt`
/// along random directions with central differences (L(x+εv) - L(x-εv)) / 2ε
/// computed from the forward kernel. `backwardUsesResults` passes the
/// forward results to the backward, as the router's rule does.
GradientCheck checkGradients(const KernelRegistry &registry, KernelCall &forward,
                             const std::vector<int64_t> &wrt,
                             std::vector<int64_t> outputsWithGrad = {},
                             bool backwardUsesResults = false, double epsilon = 1e-2,
                             int directions = 3);

} // namespace moec::runtime::testing

#endif // RUNTIME_KERNELS_TESTING_KERNELTESTING_H_
