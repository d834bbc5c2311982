//===- Differentiate.h - reverse mode over straight-line moe IR -*- C++ -*-===//
//
// The driver behind --moe-build-training-step: it walks ops backwards and asks
// each op's DifferentiableOpInterface for its backward. It also builds the
// training templates of a layer, which the memory planner reuses when it
// switches a layer to recomputation.
//
//===----------------------------------------------------------------------===//

#ifndef PASSES_BUILD_TRAINING_STEP_DIFFERENTIATE_H_
#define PASSES_BUILD_TRAINING_STEP_DIFFERENTIATE_H_

#include "dialects/moe/MoeOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"

namespace moec::passes {

/// Emits the backward of `ops` (straight-line, in forward order) at the
/// builder's insertion point. `grads` holds the seeds on entry and the
/// gradient of every value reached on return. Only values that depend on a
/// gradient source get gradients: a value in `sources`, a trainable
/// parameter's read, a layer with trainable parameters. Frozen weights get
/// none, so no weight gradient is ever computed for them.
///
/// A moe.combine of a moe.expert_mlp's outputs may get one moe.backward
/// "moe.expert_mlp_combine" for both: the expert outputs are then not read by
/// the backward, so not saved. `Fused` does that for every such pair, `Auto`
/// where the CUDA kernel has its one-pass form (bf16, gated SiLU with a
/// separate gate, no bias or LoRA: otherwise it would compute the expert
/// outputs again), `Separate` never.
enum class ExpertBackward { Separate, Auto, Fused };

mlir::LogicalResult differentiate(llvm::ArrayRef<mlir::Operation *> ops,
                                  const llvm::DenseSet<mlir::Value> &sources,
                                  mlir::OpBuilder &builder,
                                  llvm::DenseMap<mlir::Value, mlir::Value> &grads,
                                  ExpertBackward experts = ExpertBackward::Separate);

/// The model attribute (a string: separate, auto or fused) whose policy every layer template
/// follows (set by --moe-build-training-step=expert-backward=...).
inline constexpr llvm::StringLiteral kExpertBackward = "expert_backward";

/// What the backward of a layer keeps from its forward.
enum class Recompute {
  None,     ///< save every forward value the backward reads
  Regather, ///< as None, but a dispatch whose copies the backward reads gathers them again
            ///< there (from the saved tokens and routing) instead of saving them: top-k
            ///< copies of every token are the largest saved value of an MoE layer
  PerLayer, ///< save only the inputs and the routing; re-run the rest
};

llvm::StringRef toString(Recompute policy);

/// The pair of templates a layer trains with.
struct LayerTraining {
  /// (inputs...) -> (output, saved...), with `backward = @<backward>`.
  moe::LayerOp forward;
  /// (inputs..., saved..., d output) -> (d input for each float input).
  moe::LayerOp backward;
};

/// Builds, or finds when built before, the training templates of `layer` for
/// `policy`: `@<layer>_fwd`/`_bwd`, `@<layer>_fwd_regather`/`_bwd_regather`, or
/// `@<layer>_fwd_recompute`/`_bwd_recompute`. Regather on a layer without such a
/// dispatch gives the None pair.
/// Saved routing (router weights and indices, sparse-attention indices) is
/// never recomputed; recomputed forward ops carry the `recomputed` attribute.
mlir::FailureOr<LayerTraining> getOrBuildLayerTraining(moe::LayerOp layer, Recompute policy);

} // namespace moec::passes

#endif // PASSES_BUILD_TRAINING_STEP_DIFFERENTIATE_H_
