//===- Trainer.h - LoRA training on an Executor -----------------*- C++ -*-===//
//
// One training step = inputs in, forward and backward through the plan,
// global-norm clipping, AdamW on every trainable tensor of the plan's LoRA
// layout. The adapter (f32) and its AdamW moments live in the plan's
// LORA_PARAM and OPTIMIZER_STATE buffers on the device and are updated there
// (the `sum_squares` and `adamw` kernels); per step the host reads one sum of
// squares per tensor and the expert counts, nothing else. Checkpoints hold the
// adapter, the moments and the step count in one safetensors file, written
// atomically, so a resumed run takes the bit-identical next step.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_TRAIN_TRAINER_H_
#define RUNTIME_TRAIN_TRAINER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/exec/Executor.h"

namespace moec::runtime {

struct Batch {
  // One per token: micro_batch x seq_len (x micro_batches for a pipeline stage's plan).
  std::vector<int64_t> ids, positions, labels;
};

struct StepStats {
  int64_t step = 0; // optimizer steps taken, after this one
  float loss = 0;
  double lr = 0, gradNorm = 0;
  /// Tokens routed to each expert, per MoE layer (forward of this step; of the global batch
  /// when the plan has several ranks).
  std::map<int, std::vector<int64_t>> expertLoad;
  /// With experts split over ep: the expert copies each ep rank computed, per MoE layer (its
  /// experts' load, as the plan's expert placement puts them).
  std::map<int, std::vector<int64_t>> epRankLoad;
};

class Trainer {
public:
  explicit Trainer(Executor &executor);
  ~Trainer();
  Trainer(const Trainer &) = delete;
  Trainer &operator=(const Trainer &) = delete;

  /// PEFT's default initialisation: A ~ U(-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform with
  /// a = sqrt(5)), B = 0, from `seed` and each tensor's name. A checkpoint weight trained in
  /// full keeps the value the executor bound; every tensor's AdamW moments start at zero.
  absl::Status initAdapter(uint64_t seed);
  /// Sets the adapter tensors from `tensors` (PEFT name -> f32 values, stacked for
  /// `{expert}` names); every plan tensor must be there with its size, except a checkpoint
  /// weight trained in full, which keeps its value when absent.
  absl::Status setAdapter(const std::map<std::string, std::vector<float>> &tensors);
  /// The adapter as PEFT name -> f32 values (stacked for `{expert}` names), read from the device.
  /// On a pipeline each stage holds its layers' tensors: every rank must call this (and
  /// gradients(), saveCheckpoint()) at the same point, as a collective that gathers them all.
  absl::StatusOr<std::map<std::string, std::vector<float>>> adapter();
  absl::StatusOr<std::map<std::string, std::vector<float>>> gradients();
  /// Shapes of every adapter tensor of the plan, by PEFT name.
  std::map<std::string, std::vector<int64_t>> shapes() const;
  /// Whether adapter(), gradients() and saveCheckpoint() are collectives (a pipeline or a
  /// tensor-parallel plan: the ranks hold different tensors or parts of them).
  bool gathers() const { return gathering; }

  /// The communicator over every rank of a sharded plan (not owned): each rank's loss
  /// weight needs the global count of scored tokens, and the loss is summed over ranks.
  void setWorld(comm::Communicator *world) { this->world = world; }
  /// Sums one value (I64 or F32) over the world's ranks through device memory.
  absl::StatusOr<double> sumOverRanks(double value, plan::DType dtype);
  /// Every rank's `local` status, agreed on before a collective: if any rank failed, every rank
  /// returns an error (its own, or that others failed), so none waits for a rank that is not
  /// coming. Itself a collective (one sum over the world).
  absl::Status agree(absl::Status local, const std::string &what);

  /// Forward and backward for `batch` (this rank's sequences); gradients are left in the
  /// plan's buffers. For a sharded plan: the loss of the global batch, the same on every rank.
  absl::StatusOr<float> forwardBackward(const Batch &batch);
  /// Clipping and AdamW with the schedule's learning rate; counts the step.
  absl::StatusOr<StepStats> optimizerStep();
  /// forwardBackward, then optimizerStep.
  absl::StatusOr<StepStats> trainStep(const Batch &batch);

  /// Writes params, moments, step and `extra` metadata to `path` (temp file + fsync + rename);
  /// on several ranks only rank 0 writes.
  absl::Status saveCheckpoint(const std::string &path, const std::map<std::string, std::string> &extra);
  /// Restores what saveCheckpoint wrote; `extra` receives its metadata.
  absl::Status loadCheckpoint(const std::string &path, std::map<std::string, std::string> &extra);

  int64_t step() const { return steps; }

private:
  struct Tensor {
    std::string name;
    uint32_t param, grad, m, v; // plan buffers (f32)
    std::vector<int64_t> shape; // of the buffers: the whole tensor, or a tp rank's part
    size_t size;
    int holder = 0;             // the rank the layout names for it
    std::vector<int64_t> start; // where the part starts in the whole tensor (empty: all of it)
    bool fromCheckpoint = false; // a checkpoint weight trained in full (the plan binds it)
  };
  /// A tensor's part from its whole values (by its PEFT name), and the way back.
  std::vector<float> partOf(const Tensor &t, const std::vector<float> &whole) const;
  void placePart(const Tensor &t, const std::vector<float> &part, std::vector<float> &whole) const;
  /// Each forward dispatch's counts go to slot (layer, micro-batch) of a layout every rank
  /// shares, so that one sum over ranks gives the global load even when each pipeline stage
  /// has other layers.
  struct CountsSlot {
    int layer;
    uint32_t buffer;
    size_t offset, count; // in int64 elements
    bool ownRows = false; // the dispatch routes this tp rank's rows (sequence parallel): every tp rank counts
  };
  /// Values of one buffer kind of every plan tensor (a collective on a pipeline: each
  /// stage's first rank contributes its own, the others zeros).
  absl::StatusOr<std::map<std::string, std::vector<float>>> collect(uint32_t Tensor::*buffer);

  /// Positions of `labels` (one micro-batch's) the loss scores (the loss kernels' rule: shifted
  /// within each sequence, ignore_index left out; sequence parallel: this tp rank's rows).
  int64_t scoredTokens(const std::vector<int64_t> &labels) const;

  Executor &executor;
  comm::Communicator *world = nullptr;
  bool shiftLabels = true;
  int64_t ignoreIndex = -100;
  std::vector<Tensor> tensors;    // this rank's
  std::vector<Tensor> allTensors; // the plan's, buffers of their holding ranks
  std::vector<std::string> names; // every tensor once, in layout order
  std::map<std::string, std::vector<int64_t>> wholeShapes;
  int rankIndex = 0;
  /// gathering: ranks hold different tensors (pp) or parts (tp); countsTokens: this rank's
  /// loss and token counts are its data shard's (a pipeline's last stage; tp coordinate 0, or
  /// every tp rank with sequence parallel); countsLoads: tp coordinate 0 (the expert loads of
  /// dispatches of a tp rank's own rows are every rank's).
  bool gathering = false, countsTokens = true, countsLoads = true;
  /// Sequence parallel: tp rank tpIndex of tpSize scores the loss on its rows of the labels.
  bool sequenceParallel = false;
  int tpIndex = 0, tpSize = 1;
  int64_t microBatches = 1;
  size_t countsTotal = 0;
  std::map<int, std::pair<size_t, size_t>> loadSlots; // layer -> (offset, experts) in countsCopy
  std::map<int, size_t> loadDispatches;                // layer -> forward dispatches per step
  void *sums = nullptr;       // device: one f32 sum of squares per tensor
  void *countsCopy = nullptr; // device: every MoE layer's counts of this step
  void *worldScratch = nullptr; // device: one value summed over ranks
  std::map<int, CountsSlot> countsAtStep; // by plan step index
  int64_t steps = 0;
  float lastLoss = 0;
  std::map<int, std::vector<int64_t>> lastLoad;
  /// Per MoE layer split over ep: the expert at each position of the ranks' experts in turn
  /// (rank = position / experts per rank): the route's placement, or consecutive ranges; and
  /// the layer's number of experts.
  std::map<int, std::vector<int64_t>> placedExperts;
  std::map<int, int64_t> expertCount;
  std::map<int, std::vector<int64_t>> lastRankLoad;
};

} // namespace moec::runtime

#endif // RUNTIME_TRAIN_TRAINER_H_
