//===- MeshReport.h - what one training step costs per GPU of a mesh -*- C++ -*-===//
//
// `moec compile ... --mesh dp=..,tp=..,pp=..,ep=.. --emit=report`: the memory
// each GPU of the mesh holds by role, per pipeline stage, and the bytes each
// collective moves per step, with a time at stated link speeds. The passes plan
// the mesh without its pipeline (the slice: dp, tp, ep), and rank 0's program
// of it gives every buffer and collective as the plan would hold them; the
// pipeline stages are simulated by stated rules (printed with the report), so
// any mesh is estimated in seconds without emitting a program per rank.
//
//===----------------------------------------------------------------------===//

#ifndef COMPILER_PLAN_MESHREPORT_H_
#define COMPILER_PLAN_MESHREPORT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "compiler/plan/Program.h"
#include "dialects/moe/MeshShape.h"
#include "llvm/Support/raw_ostream.h"

namespace moec::compiler {

/// The H200's 141 GB as decimal bytes. The device reports 143,771 MiB (150.8e9 bytes); the
/// difference is left for the CUDA context, NCCL's buffers and allocator fragmentation.
constexpr int64_t kH200Bytes = 141'000'000'000;

struct MeshOptions {
  int64_t gpuBytes = kH200Bytes;
  int64_t gpusPerNode = 8;
  double intraNodeBytesPerSecond = 900e9; // NVLink (H200 SXM)
  double interNodeBytesPerSecond = 50e9;  // 400 Gb/s per GPU
  /// Micro-batches per step and pipeline; 0 = 2 x pp, as the plan has them
  /// (--moe-schedule-pipeline's default).
  int64_t microBatches = 0;
  /// The slice's --ep-capacity-factor (0: none), for the report and its suggestions.
  double epCapacityFactor = 0;
};

/// What a slice is planned with: the mesh (its pp dropped), --ep-capacity-factor and
/// --sequence-parallel.
struct SliceChoice {
  moe::MeshShape mesh;
  double epCapacityFactor = 0;
  bool sequenceParallel = false;
  bool recomputeLayers = false; // --recompute per-layer (else the command's --recompute)
};

/// Plans the slice of another choice, for the suggestions of a report whose mesh does not
/// fit; moec compiles the model again. Null: only pipeline suggestions.
using SlicePlanner = std::function<mlir::FailureOr<Program>(const SliceChoice &choice)>;

/// Bytes one GPU holds, by role (each buffer padded to 256 bytes, as the arenas are).
struct MemoryByRole {
  int64_t weight = 0, loraParam = 0, gradient = 0, optimizerState = 0, activation = 0, workspace = 0,
          scratch = 0, input = 0;
  /// Part of `weight` that is routed experts (split by ep).
  int64_t expertWeight = 0;
  /// `activation` = savedActivation x inFlight + transientActivation.
  int64_t savedActivation = 0, transientActivation = 0;
  int64_t total() const {
    return weight + loraParam + gradient + optimizerState + activation + workspace + scratch + input;
  }
};

/// One collective (or point-to-point transfer) of a step, as seen by one GPU.
struct CommEstimate {
  std::string collective; // "all-to-all", "all-gather", "reduce-scatter", "all-reduce", "send/recv"
  std::string what;       // "dispatch+combine", "LoRA gradients", ...
  std::string phase;      // "fwd", "bwd", "recompute", "step" (once per step, after the last backward)
  std::string axis;       // "ep", "tp", "dp", "dp+ep", "pp"
  int64_t groupSize = 1;
  int64_t count = 0; // per step
  int64_t bytes = 0; // sent per GPU per step (what NCCL's bus bandwidth counts)
  bool crossesNodes = false;
  double seconds = 0;
};

struct StageEstimate {
  int stage = 0;
  int firstLayer = 0, endLayer = 0; // layers [firstLayer, endLayer)
  bool embedding = false, lmHead = false;
  int64_t inFlight = 1; // micro-batches whose activations the stage holds (1F1B)
  MemoryByRole memory;
  std::vector<CommEstimate> comm;
  double commSeconds = 0;
  int64_t flopsPerGpu = 0; // per step
};

struct MeshEstimate {
  moe::MeshShape mesh;
  MeshOptions options;
  int64_t microBatches = 1;
  int64_t tokensPerMicroBatch = 0; // per dp x ep replica (the Program's tokens)
  int64_t globalTokensPerStep = 0;
  int64_t numLayers = 0, hiddenSize = 0;
  bool recomputes = false;
  std::vector<StageEstimate> stages;
  int worstMemoryStage = 0, slowestCommStage = 0;
  bool fits = false;
  int64_t marginBytes = 0; // gpuBytes - worst total (negative: over by that much)
  /// One line per rule the numbers rest on, as the report prints them.
  std::vector<std::string> assumptions;
};

/// The estimate for `mesh`; `slice` is rank 0's program of the model compiled for `mesh`
/// without pp (one replica's micro-batch of seqLen x microBatch tokens), offsets assigned.
MeshEstimate estimateMesh(const Program &slice, const moe::MeshShape &mesh, const MeshOptions &options = {});

/// Memory per GPU by role and stage, whether it fits in `options.gpuBytes`, communication
/// per step by collective, and the assumptions; suggestions when it does not fit.
void printMeshReport(moe::ModelOp model, const Program &slice, const moe::MeshShape &mesh,
                     const MeshOptions &options, const SlicePlanner &plan, llvm::raw_ostream &os);

} // namespace moec::compiler

#endif // COMPILER_PLAN_MESHREPORT_H_
