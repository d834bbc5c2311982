//===- TensorParallel.h - attention heads and experts over tp ---*- C++ -*-===//
//
// Tensor parallel for --moe-propagate-sharding: each moe.attention whose q, k, v and output
// projections can be traced splits its heads over the tp ranks (Megatron's column/row split),
// each expert MLP not split over ep its intermediate features; everything else stays
// replicated (every tp rank computes it).
//
//===----------------------------------------------------------------------===//

#ifndef PASSES_PROPAGATE_SHARDING_TENSORPARALLEL_H_
#define PASSES_PROPAGATE_SHARDING_TENSORPARALLEL_H_

#include <string>
#include <utility>
#include <vector>

#include "dialects/moe/MoeOps.h"

namespace moec::passes {

/// Which layer templates' attention ("<layer> (attention)", "<layer> (latent attention)"), dense
/// MLPs ("<layer> (mlp)") and
/// experts ("<layer> (experts)") were split, and for the others why not.
struct HeadSplitReport {
  std::vector<std::string> split;
  std::vector<std::pair<std::string, std::string>> kept;
  std::vector<std::string> replicated; // annotated moe.tp_replicated: kept whole as asked
};

/// The region kinds `--moe-propagate-sharding`'s tp-replicate names: attention, latent-attention,
/// linear-attention (KDA, Gated DeltaNet, Mamba-2), mlp (dense MLPs, shared experts), experts.
/// Annotates every centre op of `kinds` with moe.tp_replicated; fails naming an unknown kind.
mlir::LogicalResult annotateReplicated(moe::ModelOp model, llvm::ArrayRef<std::string> kinds);

/// Splits the heads of every grouped-query and latent attention, and the intermediate features
/// of every dense and
/// expert MLP, that can be split over `ranks` tp ranks (the model's `mesh` attribute must be set). Fails
/// only on IR it cannot rewrite after checking it.
mlir::FailureOr<HeadSplitReport> splitAttentionHeads(moe::ModelOp model, int64_t ranks);

} // namespace moec::passes

#endif // PASSES_PROPAGATE_SHARDING_TENSORPARALLEL_H_
