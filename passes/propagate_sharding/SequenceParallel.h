//===- SequenceParallel.h - the residual stream in rows over tp -*- C++ -*-===//
//
// Sequence parallel for --moe-propagate-sharding (after the tp split): between the split
// regions each tp rank holds only its rows of the hidden states, so the norms, residual adds,
// routers and everything else that works token by token run on T / tp rows; a region gathers
// its input's rows (all-gather) and leaves through a reduce-scatter instead of an all-reduce.
//
//===----------------------------------------------------------------------===//

#ifndef PASSES_PROPAGATE_SHARDING_SEQUENCEPARALLEL_H_
#define PASSES_PROPAGATE_SHARDING_SEQUENCEPARALLEL_H_

#include "dialects/moe/MoeOps.h"

namespace moec::passes {

/// Rewrites @forward and the layer templates it applies so that the hidden states between
/// layers are each tp rank's rows (the model's `sequence_parallel`): moe.tp_enter and
/// moe.tp_exit with `rows`, moe.tp_gather before an op that mixes tokens, moe.tp_slice where a
/// value every rank computed meets a rank's rows, the logits gathered before @forward returns.
/// Trainable parameters read on a rank's rows get moe.tp_partial_grad. Fails with a
/// diagnostic on IR it cannot place.
mlir::LogicalResult applySequenceParallel(moe::ModelOp model);

} // namespace moec::passes

#endif // PASSES_PROPAGATE_SHARDING_SEQUENCEPARALLEL_H_
