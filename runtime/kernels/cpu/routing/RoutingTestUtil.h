//===- RoutingTestUtil.h - naive references for the routing tests -*- C++ -*-===//
//
// Plain double-precision loops straight from the formulas (model_math.md §1,
// transformers' routers and experts), independent of the kernels, plus
// helpers that build the kernels' launches from the same test cases.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CPU_ROUTING_ROUTINGTESTUTIL_H_
#define RUNTIME_KERNELS_CPU_ROUTING_ROUTINGTESTUTIL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/kernels/testing/KernelTesting.h"

namespace moec::runtime::cpu::routing::testing {

using moec::runtime::testing::KernelCall;
using moec::runtime::testing::OwnedTensor;
using Values = std::vector<double>;

/// The kernels under test.
const KernelRegistry &registry();

/// Uniform in [-scale, scale), exactly representable in f32.
Values randomValues(int64_t n, uint64_t seed, double scale = 1.0);
OwnedTensor tensorOf(std::vector<int64_t> shape, const Values &values);
Values valuesOf(const OwnedTensor &t);
/// max |a - b| / max(1, max |b|).
double relativeError(const std::vector<float> &a, const Values &b);

struct RouterCase {
  int64_t tokens = 0, features = 0, experts = 0, topK = 0;
  std::string scoring = "softmax";
  int64_t groups = 1, keepGroups = 1;
  bool normalize = false;
  double scaling = 1.0;
  Values x, w, logitBias, correction; // an empty bias is absent
};

struct Routing {
  std::vector<int64_t> indices; // [T, k], best first
  Values weights;               // [T, k]
  /// The smallest gap that decides the selection or its order (in logits for
  /// the softmax scorings, in biased scores for sigmoid): inputs moved by less
  /// keep the same routing.
  double margin = 1e30;
};

/// The reference router; with `fixed` it only weighs the given experts.
Routing naiveRoute(const RouterCase &c, const std::vector<int64_t> *fixed = nullptr);
/// The router launch (operand_segments, attributes, outputs) for a case.
KernelCall routerCall(const RouterCase &c);

struct ExpertCase {
  int64_t features = 0, experts = 0, inter = 0, rank = 0;
  std::vector<int64_t> counts;
  std::string activation = "silu";
  bool fusedGateUp = false, inOutLayout = false;
  double limit = 0, loraScale = 0;
  Values x;                                    // [R, D]
  Values up, down, gate;                       // gate empty = ungated (or fused)
  Values upBias, downBias;                     // empty = absent
  Values gateA, gateB, upA, upB, downA, downB; // empty = no adapter

  /// Rows past the counted ones (an expert-parallel rank's room for received rows): random
  /// in x, zero in the result and in x's gradient.
  int64_t padding = 0;
  int64_t rows() const;
  int64_t upOut() const { return fusedGateUp ? 2 * inter : inter; }
};

/// One expert's MLP on one row, in double.
Values naiveExpertRow(const ExpertCase &c, int64_t expert, const double *row);
/// All rows, each through the expert its row range belongs to.
Values naiveExperts(const ExpertCase &c);
/// The expert_mlp launch for a case. `operands` gets, per operand group
/// (tokens, counts, up, ...), its index among the inputs or -1.
KernelCall expertCall(const ExpertCase &c, std::vector<int64_t> *operands = nullptr);

/// Runs `<forward>.backward` for `forward` (already run) with the given output
/// gradients, and returns the gradients of `wrt`. `withResults` passes every forward result
/// to the backward; `saved` (when not empty) passes these instead (an expert MLP's saved
/// pre-activations).
std::vector<std::vector<float>> runBackward(KernelCall &forward, const std::vector<int64_t> &wrt,
                                            const std::vector<int64_t> &outputsWithGrad,
                                            const std::vector<OwnedTensor> &outputGrads,
                                            bool withResults = false, const std::vector<OwnedTensor> &saved = {});

/// Central differences in double of f with respect to every element of `p`.
Values numericGradient(Values &p, const std::function<double()> &f, double h = 1e-6);

} // namespace moec::runtime::cpu::routing::testing

#endif // RUNTIME_KERNELS_CPU_ROUTING_ROUTINGTESTUTIL_H_
