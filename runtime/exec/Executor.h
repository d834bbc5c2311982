//===- Executor.h - runs one rank of a plan on a backend --------*- C++ -*-===//
//
// Owns the rank's arenas (one allocation per role), gives every buffer its
// place in them, binds weights from a checkpoint by name, and runs the
// steps in order through the backend's kernel registry. It knows nothing of
// training: the trainer sets inputs, runs a step, and reads gradients.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_EXEC_EXECUTOR_H_
#define RUNTIME_EXEC_EXECUTOR_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/kernels/Kernel.h"
#include "runtime/plan/plan.pb.h"
#include "runtime/weights/Checkpoint.h"

namespace moec::runtime {

class Executor {
public:
  /// Checks the plan (runtime/plan validator) and that every kernel it names
  /// is in `kernels`, then allocates the rank's arenas. `plan`, `kernels` and
  /// `pool` must outlive the executor.
  static absl::StatusOr<std::unique_ptr<Executor>> create(const plan::Plan &plan, int rank,
                                                          const KernelRegistry &kernels,
                                                          ThreadPool *pool);

  /// Fills every WEIGHT buffer from its binding (per-expert, sliced, converted to the
  /// buffer's dtype). Errors name the tensor and the checkpoint.
  absl::Status bindWeights(weights::Checkpoint &checkpoint);

  /// Copies token ids, positions and labels (int64, one per token) into the INPUT buffers
  /// `input_ids`, `positions`, `labels`.
  absl::Status setInputs(const std::vector<int64_t> &ids, const std::vector<int64_t> &positions,
                         const std::vector<int64_t> &labels);

  /// Sets every GRADIENT buffer to zero (before a step's backward accumulates into them).
  void zeroGradients();

  /// Runs every step in order. `afterStep(index)` (optional) sees each step's outputs
  /// before later steps reuse their memory. Errors name the step, its kernel and origin.
  absl::Status run(const std::function<void(int)> &afterStep = {});

  /// The scalar in the INPUT buffer `loss`.
  float loss() const;

  TensorRef buffer(uint32_t id) const;
  /// The first buffer with this name.
  std::optional<uint32_t> findBuffer(const std::string &name) const;
  const plan::Rank &rankPlan() const { return *rankProto; }
  const plan::Plan &planProto() const { return *plan; }
  int64_t tokens() const { return plan->seq_len() * plan->micro_batch(); }

private:
  Executor() = default;

  const plan::Plan *plan = nullptr;
  const plan::Rank *rankProto = nullptr;
  ThreadPool *pool = nullptr;
  std::map<plan::Role, std::vector<uint8_t>> arenas;
  std::vector<const KernelFn *> stepKernels; // null for non-launch steps
  std::map<std::string, uint32_t> byName;
};

} // namespace moec::runtime

#endif // RUNTIME_EXEC_EXECUTOR_H_
