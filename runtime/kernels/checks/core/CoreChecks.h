//===- CoreChecks.h - launch checks of the core kernels ---------*- C++ -*-===//
//
// The host-side checks shared by the core CPU and CUDA kernels: launch
// checks that name the offending tensor and the `.backward` launch layout
// of Kernel.h. Storage types are left to each backend.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CHECKS_CORE_CORECHECKS_H_
#define RUNTIME_KERNELS_CHECKS_CORE_CORECHECKS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/kernels/Kernel.h"
#include "runtime/kernels/checks/core/AdamW.h"

namespace moec::runtime::checks::core {

/// "[2,3]".
std::string shapeText(const std::vector<int64_t> &shape);
/// Fails unless `t` holds I32 or I64 indices.
void expectIndices(const KernelContext &ctx, const TensorRef &t, const std::string &what);
/// Fails unless `a` and `b` have the same shape.
void expectSameShape(const KernelContext &ctx, const TensorRef &a, const std::string &aName,
                     const TensorRef &b, const std::string &bName);
/// Fails unless `t` has rank >= 1 and last dimension `features` (-1 = any); returns the
/// number of rows (product of the other dimensions).
int64_t rowsOf(const KernelContext &ctx, const TensorRef &t, const std::string &what,
               int64_t features = -1);
/// Fails unless `t` has x's shape with its last dimension replaced by `last`.
void expectRowsShape(const KernelContext &ctx, const TensorRef &t, const std::string &what,
                     const TensorRef &x, int64_t last);

/// The operands of `lm_head_cross_entropy` (and of its backward): input [T, H], weight
/// [V, H], labels [T] (i32 or i64); a positive `chunk_tokens` (LmHeadLoss.h's default when
/// absent), with `shift_labels` whole sequences, and `logits_type` (when given) "f32" or
/// "bf16". Storage types are left to the backend.
struct LmHeadLossShape {
  int64_t rows, hidden, vocab;
  int64_t chunk;                                     // rows of logits per chunk
  plan::DType logitsType = plan::DTYPE_UNSPECIFIED; // what logits round to; unspecified: f32
};
LmHeadLossShape checkLmHeadLoss(const KernelContext &ctx);

/// The inputs and outputs of a `.backward` launch (see Kernel.h): forward
/// operands, forward results, gradients of some results; gradients of some
/// operands out.
class BackwardLaunch {
public:
  /// A backend's check of a gradient's storage type, failing with `what`.
  using GradCheck = void (*)(const KernelContext &ctx, const TensorRef &t,
                             const std::string &what);

  /// Checks the layout against `backward_segments` (when present), that the
  /// result gradients name one of the forward op's `numResults` results, and
  /// that each requested operand gradient is in `differentiable`, has its
  /// operand's shape and passes `checkGrad` (when given).
  BackwardLaunch(const KernelContext &ctx, size_t numResults,
                 const std::vector<int64_t> &differentiable, GradCheck checkGrad = nullptr);

  size_t numOperands() const { return operands; }
  /// How many forward results the launch passes (backward_segments; 0 without it).
  size_t numResults() const { return results; }
  /// The gradient arriving at forward result `result`, or null (= zero).
  const TensorRef *resultGrad(int64_t result) const;
  /// The gradient of the op's one result, which must be given, have `shape`
  /// and pass `checkGrad` (when given).
  const TensorRef &resultGrad0(const std::vector<int64_t> &shape) const;
  /// Where to write the gradient of forward operand `operand`, or null if not asked.
  const TensorRef *operandGrad(int64_t operand) const;

private:
  const KernelContext &ctx;
  GradCheck checkGrad;
  size_t operands = 0, results = 0;
  std::vector<int64_t> gradOfOutputs, gradOfInputs;
};

/// lm_head_cross_entropy's backward: the forward's results (loss, logsumexp[, input_grad]), a
/// gradient for the loss only; the logsumexp must be f32 [rows]; returns it.
const TensorRef &lmHeadLossLogsumexp(const KernelContext &ctx, const BackwardLaunch &launch, int64_t rows);
/// The forward's input_grad result (the input's shape and type) when the launch passes it, else null.
const TensorRef *lmHeadLossInputGrad(const KernelContext &ctx, const BackwardLaunch &launch);

/// adamw: grad in; param, adam_m, adam_v out (updated in place), all of one shape; returns
/// the step's constants from the launch's attributes.
AdamWConstants adamwLaunch(const KernelContext &ctx);

/// The `microbatch` launch (a pipelined step's micro-batch `index` of `count` equal row blocks
/// of its input, or for a scalar result element `index`): (byte offset, bytes) to copy.
std::pair<size_t, size_t> microbatchBytes(const KernelContext &ctx);

/// shift_labels: labels [T] in, [T] of the same index type out, T whole sequences of the
/// step's seq_len; `ignore` is ignore_index (-100 when absent).
struct ShiftLabelsShape {
  int64_t rows, seqLen, ignore;
  bool i64;
};
ShiftLabelsShape checkShiftLabels(const KernelContext &ctx);

/// row_sum_of_squares (input [T, F]; result [T, 1], f32) and sharded_rms_norm (input [T, F],
/// weight [F], sum_of_squares [T, 1] f32 of whole rows of `features` >= F elements): the rows
/// and the input's features. `ss` names the sum's tensor (row_sum_of_squares: its result).
struct RowSumOfSquaresShape {
  int64_t rows, features;
};
RowSumOfSquaresShape checkRowSumOfSquares(const KernelContext &ctx, const TensorRef &input, const TensorRef &ss,
                                          const std::string &ssName);
struct ShardedRmsNormShape {
  int64_t rows, features, wholeFeatures;
  float eps;
  bool unitOffset;
};
ShardedRmsNormShape checkShardedRmsNorm(const KernelContext &ctx);

/// A type attribute that names where a fused kernel rounds (f32 or bf16: logits_type,
/// base_type): DTYPE_UNSPECIFIED when absent, a failure naming it for any other value.
plan::DType roundingTypeAttr(const KernelContext &ctx, const std::string &name);

/// lora_linear's launch beyond the shapes each backend reads: lora_b must end in the weight's
/// output features; returns base_type (roundingTypeAttr), where the projection's part rounds.
plan::DType checkLoraLinear(const KernelContext &ctx, int64_t weightOut, int64_t loraOut);

/// One contiguous copy of a `token_blocks` or `concat_tokens` launch.
struct BlockCopy {
  void *dst;
  const void *src;
  size_t bytes;
};
/// The `token_blocks` launch (one input, N >= 2 blocks out) and `concat_tokens` (the blocks in,
/// one output): block b is rows [b n / N, (b + 1) n / N) of the whole tensor's n rows, every
/// block with the whole's dtype and trailing dimensions. Returns the copies that make the
/// outputs, one per block (each backend only copies).
std::vector<BlockCopy> tokenBlockCopies(const KernelContext &ctx);

/// One strided copy: `height` rows of `width` bytes from `src` (rows `spitch` bytes apart) to
/// `dst` (rows `dpitch` apart).
struct StridedCopy {
  void *dst;
  size_t dpitch;
  const void *src;
  size_t spitch, width, height;
};
/// tp_slice_features (input [T, F] of parts `pieces` summing to F -> result [T, F / ranks]: tp
/// rank `index`'s columns of each part) and tp_place_features (those columns back in place in a
/// [T, F] result, zeros in the others): the bytes to zero first (tp_place_features' result) and
/// the copies, one per part (each backend only zeroes and copies).
struct FeatureCopies {
  void *zero = nullptr;
  size_t zeroBytes = 0;
  std::vector<StridedCopy> copies;
};
FeatureCopies sliceFeatureCopies(const KernelContext &ctx);

} // namespace moec::runtime::checks::core

#endif // RUNTIME_KERNELS_CHECKS_CORE_CORECHECKS_H_
