//===- Elementwise.cu - add, activations, gates, split, fill, accumulate --===//
//
// Grid-stride loops over elements, f32 arithmetic (expf/tanhf, no fast-math
// intrinsics), one rounding to the output's storage type. The one reduction
// (the [T, 1] gate's gradient) is a warp per row.
//
//===----------------------------------------------------------------------===//

#include "runtime/kernels/cuda/core/CoreCommon.cuh"

namespace moec::runtime::cuda::core {

namespace {

#define GRID_STRIDE(i, n)                                                                          \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n);          \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

enum Activation : int { kSilu, kGeluTanh, kRelu2, kSigmoid };

Activation activationOf(const KernelContext &ctx) {
  std::string kind = ctx.attrString("kind");
  if (kind == "silu")
    return kSilu;
  if (kind == "gelu_tanh")
    return kGeluTanh;
  if (kind == "relu2")
    return kRelu2;
  if (kind == "sigmoid")
    return kSigmoid;
  if (kind == "clamped_swiglu")
    ctx.fail("activation 'clamped_swiglu' is only used inside expert_mlp, not here");
  ctx.fail("unknown activation '" + kind + "' (supported: silu, gelu_tanh, relu2, sigmoid)");
}

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

// gelu_tanh is torch's gelu(approximate="tanh"): 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³))).
constexpr float kGeluC = 0.7978845608028654f, kGeluA = 0.044715f;

__device__ __forceinline__ float activate(int kind, float x) {
  switch (kind) {
  case kSilu:
    return x * sigmoidf(x);
  case kGeluTanh:
    return 0.5f * x * (1.0f + tanhf(kGeluC * (x + kGeluA * x * x * x)));
  case kRelu2:
    return x > 0.0f ? x * x : 0.0f;
  default: // kSigmoid
    return sigmoidf(x);
  }
}

__device__ __forceinline__ float derivative(int kind, float x) {
  switch (kind) {
  case kSilu: {
    float s = sigmoidf(x);
    return s * (1.0f + x * (1.0f - s));
  }
  case kGeluTanh: {
    float t = tanhf(kGeluC * (x + kGeluA * x * x * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluC * (1.0f + 3.0f * kGeluA * x * x);
  }
  case kRelu2:
    return x > 0.0f ? 2.0f * x : 0.0f;
  default: { // kSigmoid
    float s = sigmoidf(x);
    return s * (1.0f - s);
  }
  }
}

//===----------------------------------------------------------------------===//
// Kernels
//===----------------------------------------------------------------------===//

__global__ void addKernel(FloatIn a, FloatIn b, FloatOut y, int64_t n) {
  GRID_STRIDE(i, n) y.set(i, a[i] + b[i]);
}

/// Eight consecutive elements of an f32 or bf16 tensor, moved in 16-byte pieces: the residual
/// and adapter adds are a few hundred launches a step over [tokens, hidden], bound by memory.
template <typename T>
struct Eight;
template <>
struct Eight<float> {
  float4 lo, hi;
  __device__ __forceinline__ float operator[](int i) const { return i < 4 ? (&lo.x)[i] : (&hi.x)[i - 4]; }
  __device__ __forceinline__ void set(int i, float v) { (i < 4 ? (&lo.x)[i] : (&hi.x)[i - 4]) = v; }
};
template <>
struct Eight<__nv_bfloat16> {
  uint4 raw;
  __device__ __forceinline__ float operator[](int i) const {
    return __bfloat162float(reinterpret_cast<const __nv_bfloat16 *>(&raw)[i]);
  }
  __device__ __forceinline__ void set(int i, float v) {
    reinterpret_cast<__nv_bfloat16 *>(&raw)[i] = __float2bfloat16(v);
  }
};

/// addKernel's sums (the same f32 add and rounding per element), eight at a time.
template <typename A, typename B, typename Y>
__global__ void addEightsKernel(const Eight<A> *a, const Eight<B> *b, Eight<Y> *y, int64_t groups) {
  GRID_STRIDE(g, groups) {
    Eight<A> va = a[g];
    Eight<B> vb = b[g];
    Eight<Y> vy;
#pragma unroll
    for (int i = 0; i < 8; ++i)
      vy.set(i, va[i] + vb[i]);
    y[g] = vy;
  }
}

__global__ void activationKernel(int kind, FloatIn x, FloatOut y, int64_t n) {
  GRID_STRIDE(i, n) y.set(i, activate(kind, x[i]));
}

__global__ void activationBackwardKernel(int kind, FloatIn x, FloatIn dy, FloatOut dx, int64_t n) {
  GRID_STRIDE(i, n) dx.set(i, dy[i] * derivative(kind, x[i]));
}

__global__ void gluKernel(int kind, FloatIn g, FloatIn u, FloatOut y, int64_t n) {
  GRID_STRIDE(i, n) y.set(i, activate(kind, g[i]) * u[i]);
}

/// dg.p or du.p may be null (not asked).
__global__ void gluBackwardKernel(int kind, FloatIn g, FloatIn u, FloatIn dy, FloatOut dg,
                                  FloatOut du, int64_t n) {
  GRID_STRIDE(i, n) {
    float gate = g[i], grad = dy[i];
    if (dg.p)
      dg.set(i, grad * u[i] * derivative(kind, gate));
    if (du.p)
      du.set(i, grad * activate(kind, gate));
  }
}

/// y[i] = x[i] σ(g[i / width]).
__global__ void sigmoidGateKernel(FloatIn x, FloatIn g, FloatOut y, int64_t n, int64_t width) {
  GRID_STRIDE(i, n) y.set(i, x[i] * sigmoidf(g[i / width]));
}

/// The same-shape gate: dx = dy σ(g), dg = dy x σ(g) (1 - σ(g)), elementwise.
__global__ void sigmoidGateBackwardKernel(FloatIn x, FloatIn g, FloatIn dy, FloatOut dx,
                                          FloatOut dg, int64_t n) {
  GRID_STRIDE(i, n) {
    float s = sigmoidf(g[i]), grad = dy[i];
    if (dx.p)
      dx.set(i, grad * s);
    if (dg.p)
      dg.set(i, grad * x[i] * s * (1.0f - s));
  }
}

constexpr int kRowsPerBlock = kThreads / 32; // one warp per row

/// The [rows, 1] gate of x [rows, width]: a warp per row; dg[row] = Σ_j dy x · σ(1 - σ).
__global__ void sigmoidGateRowsBackwardKernel(FloatIn x, FloatIn g, FloatIn dy, FloatOut dx,
                                              FloatOut dg, int64_t rows, int64_t width) {
  int lane = threadIdx.x % 32;
  int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (row >= rows)
    return; // the whole warp
  float s = sigmoidf(g[row]), dot = 0.0f;
  for (int64_t j = lane; j < width; j += 32) {
    int64_t i = row * width + j;
    float grad = dy[i];
    dot += grad * x[i];
    if (dx.p)
      dx.set(i, grad * s);
  }
  for (int offset = 16; offset > 0; offset >>= 1)
    dot += __shfl_xor_sync(0xffffffffu, dot, offset);
  if (dg.p && lane == 0)
    dg.set(row, dot * s * (1.0f - s));
}

/// Part `i` of split: element e of the part [rows, groups * size] sits at
/// row * width + g * groupWidth + offset + j of x. toParts: part[e] = x[...];
/// else x[...] = part[e] (or 0 when the part has no gradient, part.p null).
struct SplitPart {
  int64_t size, offset, groups, groupWidth, rows;

  __device__ __forceinline__ int64_t source(int64_t e) const {
    int64_t partWidth = groups * size, row = e / partWidth, rem = e % partWidth;
    return row * groups * groupWidth + (rem / size) * groupWidth + offset + rem % size;
  }
};

__global__ void splitKernel(SplitPart part, FloatIn x, FloatOut y) {
  GRID_STRIDE(e, part.rows * part.groups * part.size) y.set(e, x[part.source(e)]);
}

__global__ void splitBackwardKernel(SplitPart part, FloatIn grad, FloatOut dx) {
  GRID_STRIDE(e, part.rows * part.groups * part.size)
  dx.set(part.source(e), grad.p ? grad[e] : 0.0f);
}

__global__ void accumulateKernel(FloatIn g, FloatOut acc, int64_t n) {
  GRID_STRIDE(i, n) acc.set(i, acc.get(i) + g[i]);
}

//===----------------------------------------------------------------------===//
// Launches
//===----------------------------------------------------------------------===//

#define LAUNCH(kernel, n, what, ...)                                                               \
  do {                                                                                             \
    if ((n) > 0) {                                                                                 \
      kernel<<<gridFor(n), kThreads, 0, streamOf(ctx)>>>(__VA_ARGS__);                             \
      checkLaunch(ctx, what);                                                                      \
    }                                                                                              \
  } while (0)

/// The eight-at-a-time add for element types A, B, Y.
template <typename A, typename B, typename Y>
void launchAddEights(KernelContext &ctx, const TensorRef &lhs, const TensorRef &rhs, const TensorRef &result,
                     int64_t groups) {
  addEightsKernel<A, B, Y><<<gridFor(groups), kThreads, 0, streamOf(ctx)>>>(
      static_cast<const Eight<A> *>(lhs.data), static_cast<const Eight<B> *>(rhs.data),
      static_cast<Eight<Y> *>(result.data), groups);
  checkLaunch(ctx, "add");
}

template <typename A, typename B>
void launchAddEightsInto(KernelContext &ctx, const TensorRef &lhs, const TensorRef &rhs, const TensorRef &result,
                         int64_t groups) {
  if (result.dtype == plan::BF16)
    launchAddEights<A, B, __nv_bfloat16>(ctx, lhs, rhs, result, groups);
  else
    launchAddEights<A, B, float>(ctx, lhs, rhs, result, groups);
}

template <typename A>
void launchAddEightsOf(KernelContext &ctx, const TensorRef &lhs, const TensorRef &rhs, const TensorRef &result,
                       int64_t groups) {
  if (rhs.dtype == plan::BF16)
    launchAddEightsInto<A, __nv_bfloat16>(ctx, lhs, rhs, result, groups);
  else
    launchAddEightsInto<A, float>(ctx, lhs, rhs, result, groups);
}

void add(KernelContext &ctx) {
  const TensorRef &lhs = ctx.in(0), &rhs = ctx.in(1), &result = ctx.out(0);
  expectSameShape(ctx, rhs, "rhs", lhs, "lhs");
  expectSameShape(ctx, result, "result", lhs, "lhs");
  FloatIn a = floatIn(ctx, lhs, "lhs"), b = floatIn(ctx, rhs, "rhs");
  FloatOut y = floatOut(ctx, result, "result");
  int64_t n = lhs.numel();
  auto address = [](const TensorRef &t) { return reinterpret_cast<uintptr_t>(t.data); };
  if (n > 0 && n % 8 == 0 && (address(lhs) | address(rhs) | address(result)) % 16 == 0) {
    if (lhs.dtype == plan::BF16)
      launchAddEightsOf<__nv_bfloat16>(ctx, lhs, rhs, result, n / 8);
    else
      launchAddEightsOf<float>(ctx, lhs, rhs, result, n / 8);
    return;
  }
  LAUNCH(addKernel, n, "add", a, b, y, n);
}

void activation(KernelContext &ctx) {
  Activation kind = activationOf(ctx);
  const TensorRef &input = ctx.in(0), &result = ctx.out(0);
  expectSameShape(ctx, result, "result", input, "input");
  FloatIn x = floatIn(ctx, input, "input");
  FloatOut y = floatOut(ctx, result, "result");
  int64_t n = input.numel();
  LAUNCH(activationKernel, n, "activation", kind, x, y, n);
}

void activationBackward(KernelContext &ctx) {
  BackwardLaunch launch(ctx, 1, {0});
  Activation kind = activationOf(ctx);
  const TensorRef &input = ctx.in(0);
  FloatIn x = floatIn(ctx, input, "input");
  FloatIn dy = floatIn(ctx, launch.resultGrad0(input.shape), "the result gradient");
  if (const TensorRef *dxRef = launch.operandGrad(0)) {
    FloatOut dx = floatOut(ctx, *dxRef, "the input gradient");
    int64_t n = input.numel();
    LAUNCH(activationBackwardKernel, n, "activation.backward", kind, x, dy, dx, n);
  }
}

void glu(KernelContext &ctx) {
  Activation kind = activationOf(ctx);
  const TensorRef &gate = ctx.in(0), &up = ctx.in(1), &result = ctx.out(0);
  expectSameShape(ctx, up, "up", gate, "gate");
  expectSameShape(ctx, result, "result", gate, "gate");
  FloatIn g = floatIn(ctx, gate, "gate"), u = floatIn(ctx, up, "up");
  FloatOut y = floatOut(ctx, result, "result");
  int64_t n = gate.numel();
  LAUNCH(gluKernel, n, "glu", kind, g, u, y, n);
}

void gluBackward(KernelContext &ctx) {
  BackwardLaunch launch(ctx, 1, {0, 1});
  Activation kind = activationOf(ctx);
  const TensorRef &gate = ctx.in(0), &up = ctx.in(1);
  expectSameShape(ctx, up, "up", gate, "gate");
  FloatIn g = floatIn(ctx, gate, "gate"), u = floatIn(ctx, up, "up");
  FloatIn dy = floatIn(ctx, launch.resultGrad0(gate.shape), "the result gradient");
  const TensorRef *dgRef = launch.operandGrad(0), *duRef = launch.operandGrad(1);
  FloatOut dg = dgRef ? floatOut(ctx, *dgRef, "the gate gradient") : FloatOut{};
  FloatOut du = duRef ? floatOut(ctx, *duRef, "the up gradient") : FloatOut{};
  int64_t n = gate.numel();
  if (dgRef || duRef)
    LAUNCH(gluBackwardKernel, n, "glu.backward", kind, g, u, dy, dg, du, n);
}

/// sigmoid_gate as rows of `width` features sharing one gate value: the
/// same-shape gate is rows = numel, width = 1; the [T, 1] gate is rows = T.
struct GateArgs {
  FloatIn x, g;
  int64_t rows, width;

  GateArgs(const KernelContext &ctx) {
    const TensorRef &input = ctx.in(0), &gate = ctx.in(1);
    x = floatIn(ctx, input, "input");
    g = floatIn(ctx, gate, "gate");
    if (gate.shape == input.shape) {
      rows = input.numel();
      width = 1;
      return;
    }
    ctx.expectShape(input, "input (with a gate of another shape)", {-1, -1});
    ctx.expectShape(gate, "gate", {input.dim(0), 1});
    rows = input.dim(0);
    width = input.dim(1);
  }
};

void sigmoidGate(KernelContext &ctx) {
  GateArgs a(ctx);
  const TensorRef &result = ctx.out(0);
  expectSameShape(ctx, result, "result", ctx.in(0), "input");
  FloatOut y = floatOut(ctx, result, "result");
  int64_t n = a.rows * a.width;
  LAUNCH(sigmoidGateKernel, n, "sigmoid_gate", a.x, a.g, y, n, a.width);
}

void sigmoidGateBackward(KernelContext &ctx) {
  BackwardLaunch launch(ctx, 1, {0, 1});
  GateArgs a(ctx);
  FloatIn dy = floatIn(ctx, launch.resultGrad0(ctx.in(0).shape), "the result gradient");
  const TensorRef *dxRef = launch.operandGrad(0), *dgRef = launch.operandGrad(1);
  FloatOut dx = dxRef ? floatOut(ctx, *dxRef, "the input gradient") : FloatOut{};
  FloatOut dg = dgRef ? floatOut(ctx, *dgRef, "the gate gradient") : FloatOut{};
  if (!dxRef && !dgRef)
    return;
  if (a.width == 1) {
    LAUNCH(sigmoidGateBackwardKernel, a.rows, "sigmoid_gate.backward", a.x, a.g, dy, dx, dg,
           a.rows);
    return;
  }
  if (a.rows == 0)
    return;
  unsigned blocks = blockCount(ctx, (a.rows + kRowsPerBlock - 1) / kRowsPerBlock);
  sigmoidGateRowsBackwardKernel<<<blocks, kThreads, 0, streamOf(ctx)>>>(a.x, a.g, dy, dx, dg,
                                                                       a.rows, a.width);
  checkLaunch(ctx, "sigmoid_gate.backward");
}

/// split: the features of x [..., groups * Σsizes] viewed as [groups, Σsizes].
struct SplitArgs {
  std::vector<int64_t> sizes, offsets; // offsets[i]: where part i starts inside a group
  int64_t groups, groupWidth = 0, rows;

  SplitArgs(const KernelContext &ctx) {
    sizes = ctx.attrInts("sizes");
    groups = ctx.attrInt("groups", 1);
    if (sizes.empty())
      ctx.fail("sizes is empty");
    if (groups <= 0)
      ctx.fail("groups must be positive, got " + std::to_string(groups));
    for (int64_t size : sizes) {
      if (size <= 0)
        ctx.fail("sizes " + shapeText(sizes) + " must all be positive");
      offsets.push_back(groupWidth);
      groupWidth += size;
    }
    rows = rowsOf(ctx, ctx.in(0), "input", groups * groupWidth);
    expectFloats(ctx, ctx.in(0), "input");
  }

  SplitPart part(size_t i) const { return SplitPart{sizes[i], offsets[i], groups, groupWidth, rows}; }
};

void split(KernelContext &ctx) {
  SplitArgs a(ctx);
  if (ctx.outputs.size() != a.sizes.size())
    ctx.fail("expected " + std::to_string(a.sizes.size()) + " results (one per size), got " +
             std::to_string(ctx.outputs.size()));
  FloatIn x = floatIn(ctx, ctx.in(0), "input");
  std::vector<FloatOut> parts;
  for (size_t i = 0; i < a.sizes.size(); ++i) {
    std::string what = "result " + std::to_string(i);
    expectRowsShape(ctx, ctx.outputs[i], what, ctx.in(0), a.groups * a.sizes[i]);
    parts.push_back(floatOut(ctx, ctx.outputs[i], what));
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    int64_t n = a.rows * a.groups * a.sizes[i];
    LAUNCH(splitKernel, n, "split", a.part(i), x, parts[i]);
  }
}

void splitBackward(KernelContext &ctx) {
  SplitArgs a(ctx);
  BackwardLaunch launch(ctx, a.sizes.size(), {0});
  std::vector<FloatIn> grads; // p null: that result's gradient is zero
  for (size_t i = 0; i < a.sizes.size(); ++i) {
    const TensorRef *grad = launch.resultGrad(static_cast<int64_t>(i));
    std::string what = "the gradient of result " + std::to_string(i);
    if (grad)
      expectRowsShape(ctx, *grad, what, ctx.in(0), a.groups * a.sizes[i]);
    grads.push_back(grad ? floatIn(ctx, *grad, what) : FloatIn{});
  }
  const TensorRef *dxRef = launch.operandGrad(0);
  if (!dxRef)
    return;
  FloatOut dx = floatOut(ctx, *dxRef, "the input gradient");
  // The parts partition the features: every element of dx is written once.
  for (size_t i = 0; i < grads.size(); ++i) {
    int64_t n = a.rows * a.groups * a.sizes[i];
    LAUNCH(splitBackwardKernel, n, "split.backward", a.part(i), grads[i], dx);
  }
}

void fill(KernelContext &ctx) {
  float value = static_cast<float>(ctx.attrFloat("value"));
  const TensorRef &result = ctx.out(0);
  fillFloats(ctx, floatOut(ctx, result, "result"), result.numel(), value);
}

void microbatch(KernelContext &ctx) {
  auto [offset, bytes] = checks::core::microbatchBytes(ctx);
  cudaError_t status = cudaMemcpyAsync(ctx.out(0).data, static_cast<const char *>(ctx.in(0).data) + offset, bytes,
                                       cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(ctx.stream));
  if (status != cudaSuccess)
    ctx.fail(std::string("microbatch: ") + cudaGetErrorString(status));
}

/// token_blocks and concat_tokens: each block's rows copied out of or into the whole tensor,
/// ordered with the kernels.
void tokenBlocks(KernelContext &ctx) {
  for (const checks::core::BlockCopy &copy : checks::core::tokenBlockCopies(ctx))
    if (cudaError_t status = cudaMemcpyAsync(copy.dst, copy.src, copy.bytes, cudaMemcpyDeviceToDevice,
                                             static_cast<cudaStream_t>(ctx.stream));
        status != cudaSuccess)
      ctx.fail(ctx.kernel + ": " + cudaGetErrorString(status));
}

/// tp_slice_features and tp_place_features: a tp rank's columns of each part, one 2-D copy a part,
/// ordered with the kernels.
void sliceFeatures(KernelContext &ctx) {
  checks::core::FeatureCopies work = checks::core::sliceFeatureCopies(ctx);
  if (work.zeroBytes)
    if (cudaError_t status = cudaMemsetAsync(work.zero, 0, work.zeroBytes, static_cast<cudaStream_t>(ctx.stream));
        status != cudaSuccess)
      ctx.fail(ctx.kernel + ": " + cudaGetErrorString(status));
  for (const checks::core::StridedCopy &copy : work.copies)
    if (cudaError_t status = cudaMemcpy2DAsync(copy.dst, copy.dpitch, copy.src, copy.spitch, copy.width, copy.height,
                                               cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(ctx.stream));
        status != cudaSuccess)
      ctx.fail(ctx.kernel + ": " + cudaGetErrorString(status));
}

/// The one kernel that accumulates: acc += g, in f32, rounded once to acc's storage type.
void accumulateGrad(KernelContext &ctx) {
  const TensorRef &grad = ctx.in(0), &acc = ctx.out(0);
  expectSameShape(ctx, grad, "the gradient", acc, "the accumulator");
  FloatIn g = floatIn(ctx, grad, "the gradient");
  FloatOut sum = floatOut(ctx, acc, "the accumulator");
  int64_t n = acc.numel();
  LAUNCH(accumulateKernel, n, "accumulate_grad", g, sum, n);
}

} // namespace

void registerElementwiseKernels(KernelRegistry &registry) {
  // Element-wise maps write every element: no zeroing pass first (Kernel.h, OutputInit).
  registry.add("add", add, OutputInit::Any);
  registry.add("activation", activation, OutputInit::Any);
  registry.add("activation.backward", activationBackward);
  registry.add("glu", glu, OutputInit::Any);
  registry.add("glu.backward", gluBackward);
  registry.add("sigmoid_gate", sigmoidGate);
  registry.add("sigmoid_gate.backward", sigmoidGateBackward);
  registry.add("split", split);
  registry.add("split.backward", splitBackward);
  registry.add("fill", fill);
  registry.add("microbatch", microbatch);
  registry.add("tp_slice_features", sliceFeatures, OutputInit::Any); // every column written
  registry.add("tp_place_features", sliceFeatures, OutputInit::Any); // zeros, then the columns
  // Block copies write every byte of their outputs.
  registry.add("token_blocks", tokenBlocks, OutputInit::Any);
  registry.add("concat_tokens", tokenBlocks, OutputInit::Any);
  registry.add("accumulate_grad", accumulateGrad);
}

} // namespace moec::runtime::cuda::core
