//===- MoeOps.h - moe dialect ops -------------------------------*- C++ -*-===//

#ifndef DIALECTS_MOE_MOEOPS_H_
#define DIALECTS_MOE_MOEOPS_H_

#include "dialects/moe/MoeAttributes.h"
#include "dialects/moe/MoeDialect.h"
#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/RegionKindInterface.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/CallInterfaces.h"
#include "mlir/Interfaces/ControlFlowInterfaces.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

namespace moec::moe {
/// Whether `type` is a tensor of floats (a value that can carry a gradient).
bool isFloatTensor(mlir::Type type);
/// The default differentiation rule: one moe.backward for `op` (see
/// DifferentiableOpInterface).
mlir::LogicalResult buildGenericBackward(mlir::Operation *op, mlir::OpBuilder &builder,
                                         mlir::ValueRange resultGrads, llvm::ArrayRef<bool> wanted,
                                         llvm::SmallVectorImpl<mlir::Value> &operandGrads);
/// The attribute on a training forward template naming its backward template.
constexpr llvm::StringLiteral kBackwardTemplateAttr = "backward";
/// The discardable attribute --moe-schedule-pipeline puts on the backward work of a stage
/// function (its forward and backward work interleave, so order alone does not say).
constexpr llvm::StringLiteral kPipelineBackwardAttr = "moe.pipeline_backward";
/// The discardable attribute --moe-propagate-sharding puts on a replicated trainable
/// parameter read inside a tensor-parallel region: each tp rank computes only its heads'
/// share of its gradient, so the gradient sum runs over tp too.
constexpr llvm::StringLiteral kTpPartialGradAttr = "moe.tp_partial_grad";
/// The discardable attribute --moe-propagate-sharding puts on an expert parameter split over
/// ep when an expert placement replicates experts: each rank holds this many experts (more
/// than E / ep), its leading dimension in getLocalType().
constexpr llvm::StringLiteral kEpRowsAttr = "moe.ep_rows";
/// The discardable attribute --moe-propagate-sharding puts on a parameter split over tp whose
/// split dimension stacks parts that split separately (Gated DeltaNet's convolution over q, k
/// and v): the parts' whole extents, in order. A rank holds its share of each part, in order.
constexpr llvm::StringLiteral kTpPiecesAttr = "moe.tp_pieces";
/// The discardable attribute --moe-propagate-sharding puts on the frozen bias of a projection
/// whose output is a partial sum over tp (an attention's output projection): only tp rank 0
/// holds it (the others zeros), so the sum adds it once.
constexpr llvm::StringLiteral kTpFirstRankAttr = "moe.tp_first_rank";
/// A user's annotation on a tensor-parallel region's centre op (moe.attention, moe.mla,
/// moe.sparse_attention, moe.kda, moe.gated_delta_net, moe.mamba2, an MLP's moe.glu or
/// moe.activation, moe.expert_mlp): --moe-propagate-sharding keeps it whole on every tp rank
/// (with sequence parallel, tokenwise work such as routed experts then runs on each rank's rows).
constexpr llvm::StringLiteral kTpReplicatedAttr = "moe.tp_replicated";
/// The discardable attribute sequence parallel puts on a moe.dispatch of a tp rank's rows: its
/// expert counts differ per tp rank (the plan's launch keeps it: the runtime sums every
/// rank's loads, not tp rank 0's alone).
constexpr llvm::StringLiteral kTpRowsAttr = "moe.tp_rows";
/// The stream an op's step is issued on (--moe-schedule-overlap; absent: stream 0), and on the
/// model how many streams its plan has.
constexpr llvm::StringLiteral kStreamAttr = "moe.stream";
constexpr llvm::StringLiteral kStreamsAttr = "streams";

/// The prefix of a PEFT tensor name. A moe.param named with it is a LoRA adapter's tensor
/// (--moe-inject-lora adds them; the runtime initialises them); any other is a checkpoint
/// tensor (trainable: trained in full, exported under this prefix as a module to save).
constexpr llvm::StringLiteral kPeftNamePrefix = "base_model.model.";
inline bool isAdapterTensorName(llvm::StringRef tensorName) { return tensorName.starts_with(kPeftNamePrefix); }

/// The op computes each token's results from that token's rows alone (MoeOps.td: Moe_Tokenwise).
template <typename ConcreteType>
class Tokenwise : public mlir::OpTrait::TraitBase<ConcreteType, Tokenwise> {};
} // namespace moec::moe

#include "dialects/moe/MoeInterfaces.h.inc"

#define GET_OP_CLASSES
#include "dialects/moe/MoeOps.h.inc"

#endif // DIALECTS_MOE_MOEOPS_H_
