//===- LmHeadLoss.cu - the LM head fused with the loss, chunked -----------===//
//
// The twin of cpu/core/LmHeadLoss.cpp. Per chunk of `chunk_tokens` rows, in
// stream-ordered scratch: a cuBLAS product writes the chunk's logits in the
// storage type of the input (bf16 on a bf16 model: where the unfused linear
// rounds its result), then one block per row reduces it.
//
//   forward:  logsumexp and the row's loss (cross_entropy's row kernel
//             arithmetic), then the mean over the counted rows (Tokens.cu).
//   backward: the chunk's logits again, turned in place into d logits =
//             dloss / counted * (exp(logit - logsumexp) - onehot), rounded to
//             the storage type as the unfused backward's d logits are; then
//             d input = d logits W (each row within its chunk) and
//             d weight += d logitsᵀ input (f32 across the chunks: in the
//             gradient itself when it is f32, else in an f32 accumulator
//             rounded once at the end).
//   input_grad (a frozen head): the forward turns each chunk into d logits
//             for dloss = 1 right after its row reductions and writes that
//             chunk's d input; the backward scales it by dloss.
//
// Labels are read on the device: a label that is neither ignore_index nor a
// class makes the loss and every gradient NaN, where the CPU refuses the launch.
//
//===----------------------------------------------------------------------===//

#include <algorithm>

#include "runtime/kernels/checks/core/LmHeadLoss.h"
#include "runtime/kernels/cuda/CudaGemm.h"
#include "runtime/kernels/cuda/core/CoreCommon.cuh"
#include "runtime/plan/PlanFormat.h"

namespace moec::runtime::cuda::core {

namespace {

/// input [T, H] and weight [V, H] of one storage type, labels [T].
struct LmHeadLossArgs {
  checks::core::LmHeadLossShape s;
  const TensorRef &input, &weight;
  plan::DType storage;
  LossTargets targets;

  explicit LmHeadLossArgs(const KernelContext &ctx)
      : s(checks::core::checkLmHeadLoss(ctx)), input(ctx.in(0)), weight(ctx.in(1)) {
    expectFloats(ctx, input, "input");
    expectFloats(ctx, weight, "weight");
    if (weight.dtype != input.dtype)
      ctx.fail(std::string("weight is ") + plan::dtypeName(weight.dtype) + ", expected the input's " +
               plan::dtypeName(input.dtype));
    storage = input.dtype;
    // The chunk is held in the storage type, which is what logits_type must say (absent: f32).
    plan::DType logits = s.logitsType == plan::DTYPE_UNSPECIFIED ? plan::F32 : s.logitsType;
    if (logits != storage)
      ctx.fail(std::string("logits_type ") + plan::dtypeName(logits) + " differs from the input's " +
               plan::dtypeName(storage));
    if (s.vocab > 0x7fffffff || s.hidden > 0x7fffffff || s.chunk > 0x7fffffff)
      ctx.fail("a head of " + std::to_string(s.vocab) + " x " + std::to_string(s.hidden) +
               " is too large for one product");
    targets = lossTargets(ctx, ctx.in(2), s.vocab);
  }

  int64_t elementBytes() const { return plan::dtypeSize(storage); }
  int threads() const { return rowThreads(s.vocab, 512); }

  /// Rows [begin, begin + n) of the input.
  const void *inputRows(int64_t begin) const {
    return static_cast<const uint8_t *>(input.data) + begin * s.hidden * elementBytes();
  }

  /// chunk[n, V] = input rows [begin, begin + n) Wᵀ, in the storage type.
  void logits(const KernelContext &ctx, int64_t begin, int64_t n, void *chunk) const {
    if (s.hidden == 0) // an empty sum, which cuBLAS need not write
      return fillFloats(ctx, FloatOut{chunk, storage == plan::BF16}, n * s.vocab, 0.0f);
    gemm(ctx, false, true, n, s.vocab, s.hidden, 1.0f, inputRows(begin), s.hidden, weight.data, s.hidden,
         storage, 0.0f, chunk, s.vocab, storage);
  }
};

/// lse[t] and rowLoss[t] = lse[t] - logits[t, target] for the rows of one chunk (0 on rows
/// that do not count, NaN on a bad label). Grid: one block per row of the chunk.
__global__ void headLossRowsKernel(FloatIn chunk, int64_t begin, LossTargets targets, int64_t vocab,
                                   float *lse, float *rowLoss) {
  __shared__ float shared[32];
  int64_t r = blockIdx.x, t = begin + r, target = targets(t);
  if (target < 0) { // uniform over the block
    if (threadIdx.x == 0) {
      lse[t] = target == -1 ? 0.0f : NAN;
      rowLoss[t] = target == -1 ? 0.0f : NAN;
    }
    return;
  }
  int64_t base = r * vocab;
  float top, sum;
  rowSoftmaxStats(chunk, base, vocab, shared, top, sum);
  if (threadIdx.x == 0) {
    lse[t] = top + logf(sum);
    rowLoss[t] = (top - chunk[base + target]) + logf(sum); // cross_entropy's order of operations
  }
}

/// chunk[r] = scale (exp(chunk[r] - lse[t]) - onehot(target)) in place, zeros on rows that do
/// not count (NaN on a bad label). Grid: one block per row of the chunk.
__global__ void headLossGradKernel(FloatOut chunk, int64_t begin, LossTargets targets, int64_t vocab,
                                   const float *lse, const float *scalePtr) {
  int64_t r = blockIdx.x, t = begin + r, target = targets(t), base = r * vocab;
  if (target < 0) { // uniform over the block
    float value = target == -1 ? 0.0f : NAN;
    for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x)
      chunk.set(base + v, value);
    return;
  }
  float scale = *scalePtr, l = lse[t];
  for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) {
    float p = expf(chunk.get(base + v) - l);
    chunk.set(base + v, scale * (p - (v == target ? 1.0f : 0.0f)));
  }
}

/// headLossRowsKernel then headLossGradKernel in one block per row, on bf16 chunks whose rows
/// allow 16-byte loads (vocab % 8 == 0): one pass of vector loads for the row's max and its sum
/// of exponentials together (each thread rescales its sum when its max grows), one pass for d
/// logits. Two reads and a write of the chunk instead of three reads and a write in 2-byte
/// accesses: the softmax passes of the LM head at P4's 16384 tokens move 15 GB, not 20.
__global__ void headLossRowsGradBf16Kernel(__nv_bfloat16 *chunk, int64_t begin, LossTargets targets, int64_t vocab,
                                           float *lse, float *rowLoss, const float *scalePtr) {
  __shared__ float shared[32];
  int64_t r = blockIdx.x, t = begin + r, target = targets(t);
  uint4 *row = reinterpret_cast<uint4 *>(chunk + r * vocab);
  int64_t vectors = vocab / 8;
  if (target < 0) { // uniform over the block
    float value = target == -1 ? 0.0f : NAN;
    __nv_bfloat162 pair = __floats2bfloat162_rn(value, value);
    uint4 fill;
    fill.x = fill.y = fill.z = fill.w = *reinterpret_cast<uint32_t *>(&pair);
    for (int64_t i = threadIdx.x; i < vectors; i += blockDim.x)
      row[i] = fill;
    if (threadIdx.x == 0) {
      lse[t] = value;
      rowLoss[t] = value;
    }
    return;
  }
  float m = -INFINITY, sum = 0.0f;
  for (int64_t i = threadIdx.x; i < vectors; i += blockDim.x) {
    uint4 raw = row[i];
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&raw);
    float v[8];
    for (int j = 0; j < 4; ++j) {
      float2 f = __bfloat1622float2(h[j]);
      v[2 * j] = f.x;
      v[2 * j + 1] = f.y;
    }
    float top = m;
    for (float x : v)
      top = fmaxf(top, x);
    float part = 0.0f;
    for (float x : v)
      part += expf(x - top);
    sum = (m == -INFINITY ? 0.0f : sum * expf(m - top)) + part;
    m = top;
  }
  float top = blockMax(m, shared);
  float total = blockSum(m == -INFINITY ? 0.0f : sum * expf(m - top), shared);
  float l = top + logf(total);
  if (threadIdx.x == 0) {
    lse[t] = l;
    rowLoss[t] = (top - __bfloat162float(chunk[r * vocab + target])) + logf(total); // cross_entropy's order
  }
  __syncthreads(); // every thread read its row before any writes d logits over it
  float scale = *scalePtr;
  for (int64_t i = threadIdx.x; i < vectors; i += blockDim.x) {
    uint4 raw = row[i];
    __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&raw);
    for (int j = 0; j < 4; ++j) {
      float2 f = __bfloat1622float2(h[j]);
      int64_t v = 8 * i + 2 * j;
      f.x = scale * (expf(f.x - l) - (v == target ? 1.0f : 0.0f));
      f.y = scale * (expf(f.y - l) - (v + 1 == target ? 1.0f : 0.0f));
      h[j] = __floats2bfloat162_rn(f.x, f.y);
    }
    row[i] = raw;
  }
}

/// out[i] = *scale * in[i] (the input gradient the forward formed, for a loss gradient of 1).
__global__ void scaleKernel(FloatIn in, FloatIn scale, FloatOut out, int64_t n) {
  const float s = scale[0];
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out.set(i, s * in[i]);
}

/// out[i] = in[i], rounded to out's storage type.
__global__ void roundKernel(const float *in, FloatOut out, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out.set(i, in[i]);
}

/// d input rows [begin, begin + n) = d logits W, into `dx` (f32 or the storage type).
void inputGradRows(const KernelContext &ctx, const LmHeadLossArgs &a, int64_t begin, int64_t n, const void *dlogits,
                   const TensorRef &dx) {
  gemm(ctx, false, false, n, a.s.hidden, a.s.vocab, 1.0f, dlogits, a.s.vocab, a.weight.data, a.s.hidden, a.storage,
       0.0f, static_cast<uint8_t *>(dx.data) + begin * a.s.hidden * plan::dtypeSize(dx.dtype), a.s.hidden,
       dx.dtype);
}

// With no counted position the loss and its gradient are 0, as cross_entropy's. With a third
// output (input_grad) each chunk's logits also become d logits for a loss gradient of 1 and
// then that chunk's rows of the input gradient: the backward computes no logits again.
void lmHeadCrossEntropy(KernelContext &ctx) {
  LmHeadLossArgs a(ctx);
  const int64_t rows = a.s.rows, vocab = a.s.vocab;
  if (ctx.outputs.size() != 2 && ctx.outputs.size() != 3)
    ctx.fail("expected 2 or 3 outputs (loss, logsumexp[, input_grad]), got " + std::to_string(ctx.outputs.size()));
  ctx.expectShape(ctx.out(0), "loss", {});
  ctx.expectShape(ctx.out(1), "logsumexp", {rows});
  FloatOut loss = floatOut(ctx, ctx.out(0), "loss");
  if (ctx.out(1).dtype != plan::F32)
    ctx.fail(std::string("logsumexp must be f32, got ") + plan::dtypeName(ctx.out(1).dtype));
  float *lse = static_cast<float *>(ctx.out(1).data);
  const TensorRef *dx = ctx.outputs.size() == 3 ? &ctx.out(2) : nullptr;
  if (dx) {
    ctx.expectShape(*dx, "input_grad", {rows, a.s.hidden});
    if (dx->dtype != a.storage)
      ctx.fail(std::string("input_grad must have the input's type ") + plan::dtypeName(a.storage) + ", got " +
               plan::dtypeName(dx->dtype));
  }
  Workspace ws(ctx);
  float *rowLoss = ws.alloc<float>(rows);
  void *chunk = ws.bytes(static_cast<size_t>(std::max<int64_t>(1, a.s.chunk * vocab * a.elementBytes())));
  float *scale = nullptr; // 1 / counted rows: the loss gradient 1 spread over the mean
  if (dx && vocab > 0) {
    float *one = ws.alloc<float>(2);
    fillFloats(ctx, FloatOut{one, false}, 1, 1.0f);
    scale = one + 1;
    lossGradScale(ctx, a.targets, rows, FloatIn{one, false}, scale);
  } else if (dx) { // no class: nothing counts
    fillFloats(ctx, floatOut(ctx, *dx, "input_grad"), rows * a.s.hidden, 0.0f);
  }
  for (int64_t begin = 0; begin < rows; begin += a.s.chunk) {
    int64_t n = std::min(a.s.chunk, rows - begin);
    a.logits(ctx, begin, n, chunk);
    if (scale && a.storage == plan::BF16 && vocab % 8 == 0) { // both passes, 16-byte accesses
      headLossRowsGradBf16Kernel<<<blockCount(ctx, n), a.threads(), 0, streamOf(ctx)>>>(
          static_cast<__nv_bfloat16 *>(chunk), begin, a.targets, vocab, lse, rowLoss, scale);
      checkLaunch(ctx, "lm_head_cross_entropy (with the input gradient)");
      inputGradRows(ctx, a, begin, n, chunk, *dx);
      continue;
    }
    headLossRowsKernel<<<blockCount(ctx, n), a.threads(), 0, streamOf(ctx)>>>(
        FloatIn{chunk, a.storage == plan::BF16}, begin, a.targets, vocab, lse, rowLoss);
    checkLaunch(ctx, "lm_head_cross_entropy");
    if (scale) {
      headLossGradKernel<<<blockCount(ctx, n), a.threads(), 0, streamOf(ctx)>>>(
          FloatOut{chunk, a.storage == plan::BF16}, begin, a.targets, vocab, lse, scale);
      checkLaunch(ctx, "lm_head_cross_entropy (input gradient)");
      inputGradRows(ctx, a, begin, n, chunk, *dx);
    }
  }
  meanLoss(ctx, a.targets, rowLoss, rows, loss);
}

void lmHeadCrossEntropyBackward(KernelContext &ctx) {
  BackwardLaunch launch(ctx, 2, {0, 1});
  LmHeadLossArgs a(ctx);
  const int64_t rows = a.s.rows, vocab = a.s.vocab, hidden = a.s.hidden;
  const float *lse = checks::core::lmHeadLossLogsumexp(ctx, launch, rows).f32();
  FloatIn dloss = floatIn(ctx, launch.resultGrad0({}), "the result gradient");
  const TensorRef *dxRef = launch.operandGrad(0), *dwRef = launch.operandGrad(1);
  if (!dxRef && !dwRef)
    return;
  if (dxRef && dxRef->dtype != plan::F32 && dxRef->dtype != a.storage)
    ctx.fail(std::string("the input gradient must be f32 or the input's ") + plan::dtypeName(a.storage) +
             ", got " + plan::dtypeName(dxRef->dtype));
  // d weight accumulates over the chunks in f32: the gradient itself, or scratch.
  Workspace ws(ctx);
  float *dwAcc = nullptr;
  if (dwRef) {
    FloatOut dw = floatOut(ctx, *dwRef, "the weight gradient");
    dwAcc = dw.bf16 ? ws.alloc<float>(vocab * hidden) : static_cast<float *>(dwRef->data);
    if (rows == 0 || vocab == 0)
      fillFloats(ctx, dw, vocab * hidden, 0.0f);
  }
  if (vocab == 0) { // no class: nothing counts (a bad label: the CPU refuses the launch)
    if (dxRef)
      fillFloats(ctx, floatOut(ctx, *dxRef, "the input gradient"), rows * hidden, 0.0f);
    return;
  }
  if (const TensorRef *saved = checks::core::lmHeadLossInputGrad(ctx, launch); saved && dxRef) {
    // The forward formed d input for a loss gradient of 1: scale it; only d weight needs logits.
    scaleKernel<<<gridFor(rows * hidden), kThreads, 0, streamOf(ctx)>>>(
        FloatIn{saved->data, saved->dtype == plan::BF16}, dloss,
        floatOut(ctx, *dxRef, "the input gradient"), rows * hidden);
    checkLaunch(ctx, "lm_head_cross_entropy.backward (input gradient)");
    dxRef = nullptr;
    if (!dwRef)
      return;
  }
  float *scale = ws.alloc<float>(1);
  lossGradScale(ctx, a.targets, rows, dloss, scale);
  void *chunk = ws.bytes(static_cast<size_t>(std::max<int64_t>(1, a.s.chunk * vocab * a.elementBytes())));
  FloatOut d{chunk, a.storage == plan::BF16};
  for (int64_t begin = 0; begin < rows; begin += a.s.chunk) {
    int64_t n = std::min(a.s.chunk, rows - begin);
    a.logits(ctx, begin, n, chunk);
    headLossGradKernel<<<blockCount(ctx, n), a.threads(), 0, streamOf(ctx)>>>(d, begin, a.targets, vocab,
                                                                              lse, scale);
    checkLaunch(ctx, "lm_head_cross_entropy.backward");
    if (dxRef) // d input = d logits W
      inputGradRows(ctx, a, begin, n, chunk, *dxRef);
    if (dwRef) // d weight += d logitsᵀ input
      gemm(ctx, true, false, vocab, hidden, n, 1.0f, chunk, vocab, a.inputRows(begin), hidden, a.storage,
           begin == 0 ? 0.0f : 1.0f, dwAcc, hidden, plan::F32);
  }
  if (dwRef && dwRef->dtype == plan::BF16 && rows > 0 && vocab * hidden > 0) {
    roundKernel<<<gridFor(vocab * hidden), kThreads, 0, streamOf(ctx)>>>(
        dwAcc, FloatOut{dwRef->data, true}, vocab * hidden);
    checkLaunch(ctx, "lm_head_cross_entropy.backward (weight gradient)");
  }
}

} // namespace

void registerLmHeadLossKernels(KernelRegistry &registry) {
  registry.add("lm_head_cross_entropy", lmHeadCrossEntropy);
  registry.add("lm_head_cross_entropy.backward", lmHeadCrossEntropyBackward);
}

} // namespace moec::runtime::cuda::core
