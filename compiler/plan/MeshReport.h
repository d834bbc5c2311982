//===- MeshReport.h - what one training step costs per GPU of a mesh -*- C++ -*-===//
//
// `moec compile ... --mesh dp=..,tp=..,pp=..,ep=.. --emit=report`: from the
// single-rank Program (one replica's micro-batch), the memory each GPU of the
// mesh holds by role, per pipeline stage, and the bytes each collective moves
// per step, with a time at stated link speeds. An estimate by simple, stated
// rules (printed with the report), not a sharded plan: it answers "does this
// mesh fit, and where does the step's communication go" before one exists.
//
//===----------------------------------------------------------------------===//

#ifndef COMPILER_PLAN_MESHREPORT_H_
#define COMPILER_PLAN_MESHREPORT_H_

#include <cstdint>
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
  /// --tp-replicate experts: routed experts stay whole on every tp rank.
  bool expertsWholeOverTp = false;
};

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
  /// The program passed in already holds collectives (compiled for a mesh): the estimate
  /// expects the single-rank program, and the report says so.
  bool shardedProgram = false;
  std::vector<StageEstimate> stages;
  int worstMemoryStage = 0, slowestCommStage = 0;
  bool fits = false;
  int64_t marginBytes = 0; // gpuBytes - worst total (negative: over by that much)
  /// One line per rule the numbers rest on, as the report prints them.
  std::vector<std::string> assumptions;
};

/// The estimate for `mesh`; `program` is the single-rank program of one replica's
/// micro-batch (its seqLen x microBatch tokens), with offsets assigned.
MeshEstimate estimateMesh(const Program &program, const moe::MeshShape &mesh,
                          const MeshOptions &options = {});

/// Memory per GPU by role and stage, whether it fits in `gpuBytes`, communication per step
/// by collective, and the assumptions; suggestions when it does not fit.
void printMeshReport(moe::ModelOp model, const Program &program, const moe::MeshShape &mesh, int64_t gpuBytes,
                     llvm::raw_ostream &os);
void printMeshReport(moe::ModelOp model, const Program &program, const moe::MeshShape &mesh,
                     const MeshOptions &options, llvm::raw_ostream &os);

} // namespace moec::compiler

#endif // COMPILER_PLAN_MESHREPORT_H_
