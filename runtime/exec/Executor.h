//===- Executor.h - runs one rank of a plan on a backend --------*- C++ -*-===//
//
// Owns the rank's arenas (one device allocation per role), gives every
// buffer its place in them, binds weights from a checkpoint by name, and
// runs the steps in order through the device's kernel registry. It knows
// nothing of training: the trainer sets inputs, runs a step, and reads
// gradients (read/write copy between the device and the host).
//
// On a device that computes in f32 only (the CPU), a plan with bf16 buffers
// runs on a copy of the plan whose bf16 buffers are f32 at twice the offsets,
// rounded to bf16 after every write: bf16 storage with f32 arithmetic, what
// the CUDA kernels do, so the CPU is the reference in bf16 too.
//
// MOEC_PROFILE=1 synchronises after every step and prints, at exit, the time
// spent per kernel (a breakdown for tuning; the synchronisation costs some).
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_EXEC_EXECUTOR_H_
#define RUNTIME_EXEC_EXECUTOR_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/comm/Communicator.h"
#include "runtime/exec/Device.h"
#include "runtime/kernels/Kernel.h"
#include "runtime/plan/plan.pb.h"
#include "runtime/weights/Checkpoint.h"

namespace moec::runtime {

class StepProfile;

class Executor {
public:
  /// Checks the plan (runtime/plan validator) and that every kernel it names
  /// is in the device's registry, then allocates the rank's arenas. `plan`
  /// and `device` must outlive the executor.
  static absl::StatusOr<std::unique_ptr<Executor>> create(const plan::Plan &plan, int rank, Device &device);
  ~Executor();

  /// Fills every WEIGHT buffer from its binding (per-expert, sliced, converted to the
  /// buffer's dtype). Errors name the tensor and the checkpoint.
  absl::Status bindWeights(weights::Checkpoint &checkpoint);

  /// Copies token ids, positions and labels (int64, one per token) into the INPUT buffers
  /// `input_ids`, `positions`, `labels`.
  absl::Status setInputs(const std::vector<int64_t> &ids, const std::vector<int64_t> &positions,
                         const std::vector<int64_t> &labels);

  /// The communicators of this rank's groups, one per entry of the rank's `groups` (in
  /// that order; not owned). A plan with collective steps runs only once they are set.
  absl::Status setCommunicators(std::vector<comm::Communicator *> byGroup);
  /// Whether the plan is sharded: its loss seed is this rank's share of the global loss
  /// (the INPUT `loss_weight`, see --moe-propagate-sharding), set before each run.
  bool hasLossWeight() const { return findBuffer("loss_weight").has_value(); }
  /// One weight per micro-batch (one unless the plan is a pipeline stage's).
  absl::Status setLossWeights(const std::vector<float> &weights);

  /// Sets every GRADIENT buffer to zero (before a step's backward accumulates into them).
  absl::Status zeroGradients();

  /// Runs every step in order. `afterStep(index)` (optional) sees each step's outputs
  /// (through read()) before later steps reuse their memory. Errors name the step, its
  /// kernel and origin; with `syncEachStep` (or MOEC_SYNC_STEPS=1) a device fault does too.
  absl::Status run(const std::function<void(int)> &afterStep = {});

  /// Runs one kernel outside the plan's steps (e.g. fill_random on a weight buffer).
  absl::Status launch(const std::string &kernel, const std::vector<uint32_t> &inputs,
                      const std::vector<uint32_t> &outputs,
                      const google::protobuf::Map<std::string, plan::Attr> &attrs);

  /// The same on tensors the caller owns (device memory of this executor's device), e.g. a
  /// scratch result next to plan buffers; no bf16 emulation applies.
  absl::Status launchOn(const std::string &kernel, std::vector<TensorRef> inputs,
                        std::vector<TensorRef> outputs,
                        const google::protobuf::Map<std::string, plan::Attr> &attrs);

  /// launch() on rows [firstRow, firstRow + rows) of the plan buffer `output` (its leading
  /// dimension), e.g. fill_random on one expert of an expert-parallel rank's experts.
  absl::Status launchOnRows(const std::string &kernel, uint32_t output, int64_t firstRow, int64_t rows,
                            const google::protobuf::Map<std::string, plan::Attr> &attrs);

  /// The scalar in the INPUT buffer `loss`.
  absl::StatusOr<float> loss();
  /// Each micro-batch's loss: `loss`, or `loss.0`, `loss.1`, ... on a pipeline's last stage;
  /// none on its other stages.
  absl::StatusOr<std::vector<float>> losses();

  /// The buffer as the device holds it (its data is a device pointer).
  TensorRef buffer(uint32_t id) const;
  /// A buffer's values as f32 (converted from bf16/f16), and back.
  absl::StatusOr<std::vector<float>> readFloats(uint32_t id);
  absl::Status writeFloats(uint32_t id, const std::vector<float> &values);
  /// The first buffer with this name.
  std::optional<uint32_t> findBuffer(const std::string &name) const;
  const plan::Rank &rankPlan() const { return *rankProto; }
  const plan::Plan &planProto() const { return *plan; }
  Device &device() { return *dev; }
  void setSyncEachStep(bool sync) { syncEachStep = sync; }
  /// Times the collectives of the next runs: waits for the device before and after each,
  /// so the sum is the step's exposed communication (the plan orders everything on one
  /// stream). Resets the sum.
  void setTimeCollectives(bool on) {
    timeCollectives = on;
    collectiveTime = 0;
    exchangeTime[0] = exchangeTime[1] = exchangeTime[2] = 0;
  }
  double collectiveSeconds() const { return collectiveTime; }
  /// Of that, the expert exchange's parts: "routing X ms, messages Y ms, gathering and summing Z ms".
  std::string exchangeBreakdown() const;
  /// The step the host is issuing now ("step 12 (expert_send) [moe.ep_send in
  /// @..[3]]"), for a watchdog on another thread; the device may be behind it.
  std::string issuingStep() const;

private:
  Executor() = default;
  /// One kernel call on buffers; a KernelError comes back as a status with its message.
  absl::Status invoke(const KernelFn &fn, const std::string &kernel,
                      const google::protobuf::Map<std::string, plan::Attr> &attrs,
                      const std::vector<uint32_t> &inputs, const std::vector<uint32_t> &outputs,
                      bool zeroOutputs);
  absl::Status invokeOn(const KernelFn &fn, const std::string &kernel,
                        const google::protobuf::Map<std::string, plan::Attr> &attrs,
                        std::vector<TensorRef> inputs, std::vector<TensorRef> outputs);

  /// Rewrites the owned plan copy for bf16 emulation (see the file comment).
  void emulateBf16(int rank);
  /// Rounds the buffers among `ids` that hold emulated bf16.
  absl::Status roundEmulated(const std::vector<uint32_t> &ids);
  /// Runs a Collective step on its group's communicator.
  absl::Status collective(const plan::Collective &collective);
  /// ALL_GATHER / REDUCE_SCATTER of token rows (sequence parallel).
  absl::Status gatherOrScatter(const plan::Collective &collective, comm::Communicator &comm);
  /// EXPERT_ROUTE / EXPERT_SEND / EXPERT_RETURN (plan.proto): the route on the host from the
  /// experts' indices, then one message per pair of ranks, gathered (or summed) by one kernel.
  absl::Status expertExchange(const plan::Collective &collective, comm::Communicator &comm);
  absl::Status expertRoute(const plan::Collective &collective, comm::Communicator &comm);
  absl::Status allTokensRoute(const plan::Collective &collective, comm::Communicator &comm);
  /// The expert exchange's rows in flight, grouped by source rank: grown on demand, kept.
  absl::Status reserveStaging(size_t bytes);

  const plan::Plan *plan = nullptr;
  const plan::Rank *rankProto = nullptr;
  std::unique_ptr<plan::Plan> emulatedPlan; // the plan, bf16 buffers as f32 (CPU)
  std::vector<bool> roundsToBf16;           // per buffer id, in the emulated plan
  std::unique_ptr<StepProfile> profile;      // MOEC_PROFILE=1
  Device *dev = nullptr;
  std::map<plan::Role, void *> arenas;
  std::vector<const KernelFn *> stepKernels; // null for non-launch steps
  std::vector<comm::Communicator *> communicators; // by group index
  std::map<std::string, uint32_t> byName;
  bool syncEachStep = false;
  void *staging = nullptr;
  size_t stagingBytes = 0;
  /// An expert route of this run, on the host: which of this rank's tokens go to which rank.
  struct ExpertRoute {
    std::vector<size_t> sent, received; // tokens to and from each rank of the group
    std::vector<int64_t> tokensSent;    // the sent tokens, grouped by destination rank (device rows)
    std::vector<int64_t> rowOf;         // [tokens, ranks]: a token's row among them, or -1
    bool allTokens = false;             // every token to every rank, in token order (no gather)
  };
  /// Each route of this run by its layout buffer (the sends and returns of its layer read it;
  /// a recomputed route writes it again).
  std::map<uint32_t, ExpertRoute> routes;
  /// Tokens and expert copies each expert route received in this run, by its received-indices
  /// buffer (see invoke()).
  struct Received {
    int64_t tokens = 0, copies = 0;
  };
  std::map<uint32_t, Received> receivedRows;
  /// Fails (the same way on every rank of the group) when a rank would receive more tokens or
  /// expert copies than the route's buffers hold; `counts` holds every rank's layout row 0.
  absl::Status roomFor(const plan::Collective &collective, const std::vector<int64_t> &counts, int n,
                       int64_t roomTokens);
  /// Each route's room for expert copies, by its received-indices buffer (from the plan).
  std::map<uint32_t, int64_t> copiesRoom;
  /// Keeps a route for its layer's sends and returns (and, timed, adds its time since `start`).
  absl::Status keepRoute(const plan::Collective &collective, Received got, ExpertRoute route,
                         std::chrono::steady_clock::time_point start);
  bool timeCollectives = false;
  double collectiveTime = 0;
  double exchangeTime[3] = {0, 0, 0}; // messages, gathering and summing rows, routing
  std::atomic<int> issuing{-1};
};

} // namespace moec::runtime

#endif // RUNTIME_EXEC_EXECUTOR_H_
