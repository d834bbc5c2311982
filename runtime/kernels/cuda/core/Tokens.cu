//===- Tokens.cu - embedding and cross_entropy, forward and backward ------===//
//
// The two kernels that read token ids. The ids and labels live on the
// device, so they are checked there instead of on the host: an id outside
// the table gives a NaN row (forward; its gradient is dropped), a label
// that is neither ignore_index nor a class makes the loss (and the logits'
// gradient) NaN, where the CPU kernels refuse the launch. Both reductions add
// in a fixed order: the table gradient sums each id's tokens in token order
// (a stable radix sort of the ids, then one block per run of equal ids), the
// loss sums the rows' losses in a fixed tree.
//
//===----------------------------------------------------------------------===//

#include <cub/device/device_radix_sort.cuh>

#include "runtime/kernels/cuda/core/CoreCommon.cuh"

namespace moec::runtime::cuda::core {

namespace {

//===----------------------------------------------------------------------===//
// embedding
//===----------------------------------------------------------------------===//

/// ids [T] (i32 or i64), table [V, D].
struct EmbeddingArgs {
  IndexIn ids;
  FloatIn table;
  int64_t tokens, vocab, dim;

  EmbeddingArgs(const KernelContext &ctx) {
    const TensorRef &idRef = ctx.in(0);
    expectIndices(ctx, idRef, "ids");
    ctx.expectShape(idRef, "ids", {-1});
    ctx.expectShape(ctx.in(1), "table", {-1, -1});
    ids = indexIn(ctx, idRef, "ids");
    table = floatIn(ctx, ctx.in(1), "table");
    tokens = idRef.dim(0);
    vocab = ctx.in(1).dim(0);
    dim = ctx.in(1).dim(1);
    if (vocab >= 0x7fffffff)
      ctx.fail("a table of " + std::to_string(vocab) + " rows is too large");
  }
};

/// Grid: one block per token.
__global__ void embeddingKernel(IndexIn ids, FloatIn table, FloatOut y, int64_t vocab,
                                int64_t dim) {
  int64_t t = blockIdx.x, id = ids[t];
  bool valid = id >= 0 && id < vocab;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x)
    y.set(t * dim + j, valid ? table[id * dim + j] : NAN);
}

/// Sort keys: the id (vocab for an id outside the table), and the token.
__global__ void embeddingKeysKernel(IndexIn ids, int64_t tokens, int64_t vocab, uint32_t *keys,
                                    uint32_t *order) {
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < tokens;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t id = ids[t];
    keys[t] = static_cast<uint32_t>(id >= 0 && id < vocab ? id : vocab);
    order[t] = static_cast<uint32_t>(t);
  }
}

/// Grid: one block per sorted position; the block at the start of a run of
/// equal ids writes that table row: Σ dy[t] over the run's tokens, in token order.
__global__ void embeddingGradKernel(const uint32_t *keys, const uint32_t *order, FloatIn dy,
                                    FloatOut dtable, int64_t tokens, int64_t vocab, int64_t dim) {
  int64_t p = blockIdx.x;
  uint32_t key = keys[p];
  if (key >= vocab || (p > 0 && keys[p - 1] == key))
    return; // not a run's start (uniform over the block)
  int64_t end = p + 1;
  while (end < tokens && keys[end] == key)
    ++end;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
    float sum = 0.0f;
    for (int64_t k = p; k < end; ++k)
      sum += dy[static_cast<int64_t>(order[k]) * dim + j];
    dtable.set(static_cast<int64_t>(key) * dim + j, sum);
  }
}

void embedding(KernelContext &ctx) {
  EmbeddingArgs a(ctx);
  const TensorRef &result = ctx.out(0);
  ctx.expectShape(result, "result", {a.tokens, a.dim});
  FloatOut y = floatOut(ctx, result, "result");
  if (a.tokens == 0 || a.dim == 0)
    return;
  embeddingKernel<<<blockCount(ctx, a.tokens), rowThreads(a.dim), 0, streamOf(ctx)>>>(
      a.ids, a.table, y, a.vocab, a.dim);
  checkLaunch(ctx, "embedding");
}

void embeddingBackward(KernelContext &ctx) {
  BackwardLaunch launch(ctx, 1, {1});
  EmbeddingArgs a(ctx);
  FloatIn dy = floatIn(ctx, launch.resultGrad0({a.tokens, a.dim}), "the result gradient");
  const TensorRef *dtRef = launch.operandGrad(1);
  if (!dtRef)
    return;
  FloatOut dtable = floatOut(ctx, *dtRef, "the table gradient");
  fillFloats(ctx, dtable, a.vocab * a.dim, 0.0f); // rows no token uses
  if (a.tokens == 0 || a.dim == 0)
    return;
  if (a.tokens > 0x7fffffff)
    ctx.fail(std::to_string(a.tokens) + " tokens are too many for one launch");
  Workspace ws(ctx);
  int n = static_cast<int>(a.tokens);
  uint32_t *keys = ws.alloc<uint32_t>(n), *order = ws.alloc<uint32_t>(n);
  uint32_t *sortedKeys = ws.alloc<uint32_t>(n), *sortedOrder = ws.alloc<uint32_t>(n);
  embeddingKeysKernel<<<gridFor(n), kThreads, 0, streamOf(ctx)>>>(a.ids, n, a.vocab, keys, order);
  checkLaunch(ctx, "embedding.backward (keys)");
  int endBit = 1; // keys are in [0, vocab]
  while (endBit < 32 && (int64_t(1) << endBit) <= a.vocab)
    ++endBit;
  size_t tempBytes = 0;
  if (cub::DeviceRadixSort::SortPairs(nullptr, tempBytes, keys, sortedKeys, order, sortedOrder, n,
                                      0, endBit, streamOf(ctx)) != cudaSuccess)
    ctx.fail("embedding.backward: cannot size the radix sort");
  void *temp = ws.bytes(tempBytes < 1 ? 1 : tempBytes);
  cudaError_t error = cub::DeviceRadixSort::SortPairs(temp, tempBytes, keys, sortedKeys, order,
                                                      sortedOrder, n, 0, endBit, streamOf(ctx));
  if (error != cudaSuccess)
    ctx.fail(std::string("embedding.backward (sort): ") + cudaGetErrorString(error));
  checkLaunch(ctx, "embedding.backward (sort)");
  embeddingGradKernel<<<static_cast<unsigned>(n), rowThreads(a.dim), 0, streamOf(ctx)>>>(
      sortedKeys, sortedOrder, dy, dtable, n, a.vocab, a.dim);
  checkLaunch(ctx, "embedding.backward");
}

//===----------------------------------------------------------------------===//
// cross_entropy
//===----------------------------------------------------------------------===//

/// logits [T, V], labels [T].
struct CrossEntropyArgs {
  FloatIn logits;
  int64_t rows, vocab;
  LossTargets targets;

  CrossEntropyArgs(const KernelContext &ctx) {
    const TensorRef &labels = ctx.in(1);
    ctx.expectShape(ctx.in(0), "logits", {-1, -1});
    logits = floatIn(ctx, ctx.in(0), "logits");
    rows = ctx.in(0).dim(0);
    vocab = ctx.in(0).dim(1);
    expectIndices(ctx, labels, "labels");
    ctx.expectShape(labels, "labels", {rows});
    if (ctx.attrBool("shift_labels") && (ctx.seqLen <= 0 || rows % ctx.seqLen != 0))
      ctx.fail("shift_labels needs whole sequences: " + std::to_string(rows) +
               " rows are not a multiple of seq_len " + std::to_string(ctx.seqLen));
    targets = lossTargets(ctx, labels, vocab);
  }

  int threads() const { return rowThreads(vocab, 512); }
};

/// rowLoss[t] = log Σ exp(logits[t]) - logits[t, target] (0 when t does not count).
/// Grid: one block per row.
__global__ void crossEntropyRowsKernel(FloatIn logits, LossTargets targets, int64_t vocab,
                                       float *rowLoss) {
  __shared__ float shared[32];
  int64_t t = blockIdx.x, target = targets(t);
  if (target < 0) { // uniform over the block
    if (threadIdx.x == 0)
      rowLoss[t] = target == -1 ? 0.0f : NAN;
    return;
  }
  int64_t base = t * vocab;
  float top, sum;
  rowSoftmaxStats(logits, base, vocab, shared, top, sum);
  if (threadIdx.x == 0)
    rowLoss[t] = (top - logits[base + target]) + logf(sum);
}

/// One block: the counted rows' sum (in double) and count; NaN if any label is bad.
__device__ __forceinline__ void countRows(LossTargets targets, const float *rowLoss, int64_t rows,
                                          double *shared, double &sum, double &counted,
                                          double &bad) {
  double s = 0.0, c = 0.0, b = 0.0;
  for (int64_t t = threadIdx.x; t < rows; t += blockDim.x) {
    int64_t target = targets(t);
    if (target >= 0) {
      c += 1.0;
      if (rowLoss)
        s += rowLoss[t];
    } else if (target == -2) {
      b += 1.0;
    }
  }
  sum = blockSum(s, shared);
  counted = blockSum(c, shared);
  bad = blockSum(b, shared);
}

constexpr int kCountThreads = 1024;

/// loss = mean of the counted rows' losses, 0 when none counts. Grid: 1 block.
__global__ void crossEntropyMeanKernel(LossTargets targets, const float *rowLoss, int64_t rows,
                                       FloatOut loss) {
  __shared__ double shared[32];
  double sum, counted, bad;
  countRows(targets, rowLoss, rows, shared, sum, counted, bad);
  if (threadIdx.x == 0)
    loss.set(0, bad > 0 ? NAN : counted > 0 ? static_cast<float>(sum / counted) : 0.0f);
}

/// scale = dloss / counted (0 when none counts, NaN when a label is bad). Grid: 1 block.
__global__ void crossEntropyScaleKernel(LossTargets targets, int64_t rows, FloatIn dloss,
                                        float *scale) {
  __shared__ double shared[32];
  double sum, counted, bad;
  countRows(targets, nullptr, rows, shared, sum, counted, bad);
  if (threadIdx.x == 0)
    *scale = bad > 0 ? NAN
                     : counted > 0 ? static_cast<float>(static_cast<double>(dloss[0]) / counted)
                                   : 0.0f;
}

/// d logits[t] = scale (softmax(logits[t]) - onehot(target)), zeros where t does
/// not count. Grid: one block per row.
__global__ void crossEntropyBackwardKernel(FloatIn logits, LossTargets targets, int64_t vocab,
                                           const float *scalePtr, FloatOut dlogits) {
  __shared__ float shared[32];
  int64_t t = blockIdx.x, target = targets(t), base = t * vocab;
  if (target < 0) { // uniform over the block
    float value = target == -1 ? 0.0f : NAN;
    for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x)
      dlogits.set(base + v, value);
    return;
  }
  float top, sum;
  rowSoftmaxStats(logits, base, vocab, shared, top, sum);
  float scale = *scalePtr;
  for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) {
    float p = expf(logits[base + v] - top) / sum;
    dlogits.set(base + v, scale * (p - (v == target ? 1.0f : 0.0f)));
  }
}

// With no counted position the loss and its gradient are 0; transformers
// gives nan there (a mean over nothing), which would poison the step.
void crossEntropy(KernelContext &ctx) {
  CrossEntropyArgs a(ctx);
  const TensorRef &result = ctx.out(0);
  ctx.expectShape(result, "loss", {});
  FloatOut loss = floatOut(ctx, result, "loss");
  Workspace ws(ctx);
  float *rowLoss = ws.alloc<float>(a.rows);
  if (a.rows > 0 && a.vocab > 0) {
    crossEntropyRowsKernel<<<blockCount(ctx, a.rows), a.threads(), 0, streamOf(ctx)>>>(
        a.logits, a.targets, a.vocab, rowLoss);
    checkLaunch(ctx, "cross_entropy");
  }
  meanLoss(ctx, a.targets, rowLoss, a.rows, loss);
}

/// d logits[t] = dloss / counted * (softmax(logits[t]) - onehot(target)).
void crossEntropyBackward(KernelContext &ctx) {
  BackwardLaunch launch(ctx, 1, {0});
  CrossEntropyArgs a(ctx);
  FloatIn dloss = floatIn(ctx, launch.resultGrad0({}), "the result gradient");
  const TensorRef *dlRef = launch.operandGrad(0);
  if (!dlRef)
    return;
  FloatOut dlogits = floatOut(ctx, *dlRef, "the logits gradient");
  if (a.rows == 0 || a.vocab == 0)
    return;
  Workspace ws(ctx);
  float *scale = ws.alloc<float>(1);
  lossGradScale(ctx, a.targets, a.rows, dloss, scale);
  crossEntropyBackwardKernel<<<blockCount(ctx, a.rows), a.threads(), 0, streamOf(ctx)>>>(
      a.logits, a.targets, a.vocab, scale, dlogits);
  checkLaunch(ctx, "cross_entropy.backward");
}

//===----------------------------------------------------------------------===//
// shift_labels
//===----------------------------------------------------------------------===//

template <typename Index>
__global__ void shiftLabelsKernel(const Index *labels, Index *result, int64_t rows, int64_t seqLen, int64_t ignore) {
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < rows;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x)
    result[t] = (t + 1) % seqLen == 0 ? static_cast<Index>(ignore) : labels[t + 1];
}

/// Each position's next label within its sequence; the last position of a sequence is ignored.
void shiftLabels(KernelContext &ctx) {
  checks::core::ShiftLabelsShape s = checks::core::checkShiftLabels(ctx);
  if (s.rows == 0)
    return;
  if (s.i64)
    shiftLabelsKernel<<<gridFor(s.rows), kThreads, 0, streamOf(ctx)>>>(
        static_cast<const int64_t *>(ctx.in(0).data), static_cast<int64_t *>(ctx.out(0).data), s.rows, s.seqLen, s.ignore);
  else
    shiftLabelsKernel<<<gridFor(s.rows), kThreads, 0, streamOf(ctx)>>>(
        static_cast<const int32_t *>(ctx.in(0).data), static_cast<int32_t *>(ctx.out(0).data), s.rows, s.seqLen, s.ignore);
}

} // namespace

LossTargets lossTargets(const KernelContext &ctx, const TensorRef &labels, int64_t vocab) {
  bool shift = ctx.attrBool("shift_labels");
  return LossTargets{indexIn(ctx, labels, "labels"), vocab, shift ? ctx.seqLen : 1,
                     ctx.attrInt("ignore_index", -100), shift};
}

void meanLoss(const KernelContext &ctx, const LossTargets &targets, const float *rowLoss, int64_t rows,
              FloatOut loss) {
  crossEntropyMeanKernel<<<1, kCountThreads, 0, streamOf(ctx)>>>(targets, rowLoss, rows, loss);
  checkLaunch(ctx, "loss (mean)");
}

void lossGradScale(const KernelContext &ctx, const LossTargets &targets, int64_t rows, FloatIn dloss,
                   float *scale) {
  crossEntropyScaleKernel<<<1, kCountThreads, 0, streamOf(ctx)>>>(targets, rows, dloss, scale);
  checkLaunch(ctx, "loss gradient (scale)");
}

void registerTokenKernels(KernelRegistry &registry) {
  registry.add("embedding", embedding);
  registry.add("embedding.backward", embeddingBackward);
  registry.add("cross_entropy", crossEntropy);
  registry.add("cross_entropy.backward", crossEntropyBackward);
  registry.add("shift_labels", shiftLabels);
}

} // namespace moec::runtime::cuda::core
