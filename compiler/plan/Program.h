//===- Program.h - the training step flattened into buffers and steps -*- C++ -*-===//
//
// The form between the IR and the plan. Layer templates are instantiated once
// per layer (their `{layer}` parameters resolved), every value becomes a
// buffer with a role, a concrete shape for the chosen tokens per step, and
// a live range over the ordered steps. The memory planner assigns arena
// offsets to it; plan emission serialises it.
//
//===----------------------------------------------------------------------===//

#ifndef COMPILER_PLAN_PROGRAM_H_
#define COMPILER_PLAN_PROGRAM_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dialects/moe/MoeOps.h"
#include "runtime/plan/PlanFormat.h"

namespace moec::compiler {

struct ProgramBuffer {
  std::string name;
  plan::Role role = plan::ROLE_UNSPECIFIED;
  plan::DType dtype = plan::DTYPE_UNSPECIFIED;
  std::vector<int64_t> shape;
  int64_t bytes = 0;
  int first = -1, last = -1; // live range over step indices
  int64_t offset = -1;
  /// Checkpoint tensor (weights, LoRA parameters), layer index resolved.
  std::string tensor;
  /// The layer index of a parameter's tensor (-1: outside layers).
  int layer = -1;
  /// For a LoRA parameter: its gradient and AdamW moments.
  int grad = -1, adamM = -1, adamV = -1;
  /// The layer instance a workspace buffer belongs to: every instance of a
  /// template reuses the first one's offsets.
  int instance = -1;
  /// A parameter split over ep (and its gradient): its leading dimension is this rank's
  /// experts, `shape[0]` of them starting at `ep coordinate x shape[0]`, or those the
  /// model's expert_placement gives its layer (set per rank at emission).
  bool expertSplit = false;
  /// A parameter split over tp (attention heads; and its gradient and moments): the
  /// dimension, `shape[tpDim]` of it per rank starting at `tp coordinate x shape[tpDim]`.
  int tpDim = -1;
  /// A replicated trainable parameter whose gradient each tp rank holds a part of.
  bool tpPartialGrad = false;
  /// Split over tp with its tpDim stacking parts that split separately (moe.tp_pieces): the
  /// parts' whole extents; a rank's buffer holds its share of each, in order.
  std::vector<int64_t> tpPieces;
  /// A frozen bias of a tp-split projection's partial sums (moe.tp_first_rank): tp coordinate 0
  /// binds the tensor, the other tp ranks zeros, so the sum over tp adds it once.
  bool tpFirstRank = false;
  /// An expert route's received indices ([room for tokens, k]): room for `roomCopies` expert
  /// copies (every token of every rank, or what the route's capacity_factor allows); balanced
  /// routing fills `tokensPerRank` rows (this rank's own T) and T x k copies. FLOP counts of
  /// the buffers that follow the route (receivedRowsOf) use those rows.
  int64_t roomCopies = 0, tokensPerRank = 0;
  /// And the other ranks a token goes to on average (uniform routing, the layer's placement;
  /// ranks - 1 for a route that sends every token): the exchange's bytes (CollectiveBytes).
  double otherRanksPerToken = 0;
  /// Expert parallel: the route's received-indices buffer whose received rows this buffer's
  /// rows follow (plan.proto Buffer.received_rows_of); -1 = none.
  int receivedRowsOf = -1;
  /// With receivedRowsOf: the rows are the received tokens' expert copies (Buffer.received_copies).
  bool receivedCopies = false;
};

struct ProgramStep {
  std::string kernel; // "linear", "linear.backward", "accumulate_grad", ...
  /// Set for a collective (kernel is empty): "all_reduce" (inputs[i] pairs with
  /// outputs[i]), "expert_route", "expert_send" or "expert_return" (plan.proto's operand layouts), and
  /// the mesh axes it runs over ("dp", "dp+ep", "ep").
  std::string collective, axis;
  /// A pipeline exchange ("send_recv" over "pp"): the stage it sends to and receives from.
  int peerStage = -1;
  std::vector<int> inputs, outputs;
  mlir::DictionaryAttr attrs;
  plan::Phase phase = plan::FORWARD;
  int layer = -1;
  std::string origin;
  /// A collective's provenance: the sharding decision that inserted it ("the 128 experts of
  /// @gqa_moe split over ep = 2 (64 per rank)"), from its op's location; empty if unknown.
  std::string because;
  int64_t flops = 0;
  /// Scratch memory the kernel allocates for itself while it runs (the fused LM head's
  /// chunk of logits); 0 for kernels whose temporaries the plan does not count.
  int64_t scratchBytes = 0;
  /// The stream the host issues the step on (the op's moe.stream; 0 without).
  int stream = 0;
  /// An event step (no kernel, no collective, no buffers): Record marks the point after the
  /// work issued on its stream so far, Wait makes its stream wait for that point.
  enum class Event { None, Record, Wait } event = Event::None;
  int eventId = -1;
};

struct Program {
  int64_t seqLen = 0, microBatch = 0;
  /// A pipeline stage's program takes this many micro-batches per step (inputs hold them
  /// all); 1 otherwise.
  int64_t microBatches = 1;
  int stage = 0;
  /// Streams (the model's `streams`, --moe-schedule-overlap) and events between them.
  int numStreams = 1, numEvents = 0;
  std::vector<ProgramBuffer> buffers;
  std::vector<ProgramStep> steps;
  /// Template name of each layer instance, to share workspace offsets.
  std::vector<std::string> instanceTemplate;

  int64_t tokens() const { return seqLen * microBatch; }
  /// Bytes per role once offsets are assigned (the arena sizes).
  std::map<plan::Role, int64_t> arenaBytes() const;
  /// The largest scratch of one step (steps run one at a time).
  int64_t scratchBytes() const;
  /// The arenas plus the largest scratch.
  int64_t peakBytes() const;
};

/// Flattens `@train_step` of `model` for `seqLen x microBatch` tokens (a pipelined model:
/// `@train_step_stage<stage>`, each micro-batch of that size). Fails with a diagnostic on
/// IR it cannot place (no step function, unknown ops).
mlir::FailureOr<Program> buildProgram(moe::ModelOp model, int64_t seqLen, int64_t microBatch, int stage = 0);

/// The model's expert placement of a layer (moec --expert-placement): the experts of every ep
/// rank in turn; empty: consecutive ranges.
llvm::ArrayRef<int64_t> placementOf(moe::ModelOp model, int layer);

/// Pipeline stages of `model` (its `pipeline` attribute; 1 without) and micro-batches per step.
int pipelineStages(moe::ModelOp model);
int64_t pipelineMicroBatches(moe::ModelOp model);

/// Every stage's program (one for a model without a pipeline), offsets assigned.
mlir::FailureOr<std::vector<Program>> buildStagePrograms(moe::ModelOp model, int64_t seqLen, int64_t microBatch);

/// Assigns arena offsets: weights, LoRA parameters, gradients and optimizer
/// state are packed; activations and workspace reuse memory whose live
/// ranges do not overlap (largest first, lowest fitting offset).
void assignOffsets(Program &program);

} // namespace moec::compiler

#endif // COMPILER_PLAN_PROGRAM_H_
