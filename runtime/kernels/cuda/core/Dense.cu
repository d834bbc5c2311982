//===- Dense.cu - linear and lora, forward and backward -------------------===//
//
// Weights in the checkpoint's [out, in] layout (PEFT's for lora_A [r, in] and
// lora_B [out, r]); every product goes through cuBLAS (gemmAny: cuda::gemm,
// f32 accumulation). Leading dimensions of the input are flattened into rows.
// LoRA's intermediate h = x Aᵀ (and dh) is kept in bf16 when both of its
// factors are bf16, as PEFT has it in a bf16 model, in f32 otherwise.
//
//===----------------------------------------------------------------------===//

#include <algorithm>
#include <sstream>

#include "runtime/kernels/cuda/core/CoreCommon.cuh"

namespace moec::runtime::cuda::core {

namespace {

Matrix matrixOf(const TensorRef &t) { return Matrix{t.data, t.dtype, t.numel()}; }

//===----------------------------------------------------------------------===//
// linear
//===----------------------------------------------------------------------===//

/// x [..., in], weight [out, in], optional bias [out].
struct LinearArgs {
  const TensorRef *x, *w, *b = nullptr;
  int64_t rows, in, out;

  LinearArgs(const KernelContext &ctx, size_t operands) {
    if (operands != 2 && operands != 3)
      ctx.fail("expected 2 or 3 operands (input, weight, optional bias), got " +
               std::to_string(operands));
    const TensorRef &weight = ctx.in(1);
    ctx.expectShape(weight, "weight", {-1, -1});
    out = weight.dim(0);
    in = weight.dim(1);
    rows = rowsOf(ctx, ctx.in(0), "input", in);
    x = &ctx.in(0);
    w = &weight;
    expectFloats(ctx, *x, "input");
    expectFloats(ctx, *w, "weight");
    if (operands == 3) {
      ctx.expectShape(ctx.in(2), "bias", {out});
      b = &ctx.in(2);
      expectFloats(ctx, *b, "bias");
    }
  }
};

/// y[row, j] = b[j]. Grid-stride over rows * out.
__global__ void broadcastRowsKernel(FloatIn b, FloatOut y, int64_t rows, int64_t width) {
  int64_t n = rows * width;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y.set(i, b[i % width]);
}

void linear(KernelContext &ctx) {
  LinearArgs a(ctx, ctx.inputs.size());
  const TensorRef &result = ctx.out(0);
  expectRowsShape(ctx, result, "result", ctx.in(0), a.out);
  FloatOut y = floatOut(ctx, result, "result");
  if (a.rows == 0 || a.out == 0)
    return;
  Workspace ws(ctx);
  if (a.b) { // y = b, then y += x Wᵀ
    broadcastRowsKernel<<<gridFor(a.rows * a.out), kThreads, 0, streamOf(ctx)>>>(
        FloatIn{a.b->data, a.b->dtype == plan::BF16}, y, a.rows, a.out);
    checkLaunch(ctx, "linear (bias)");
  }
  gemmAny(ctx, ws, false, true, a.rows, a.out, a.in, 1.0f, matrixOf(*a.x), a.in, matrixOf(*a.w),
          a.in, a.b ? 1.0f : 0.0f, result.data, result.dtype);
}

void linearBackward(KernelContext &ctx) {
  BackwardLaunch launch(ctx, 1, {0, 1, 2});
  LinearArgs a(ctx, launch.numOperands());
  std::vector<int64_t> shape = ctx.in(0).shape;
  shape.back() = a.out;
  const TensorRef &dy = launch.resultGrad0(shape);
  Workspace ws(ctx);
  if (const TensorRef *dx = launch.operandGrad(0)) // dx = dy W
    gemmAny(ctx, ws, false, false, a.rows, a.in, a.out, 1.0f, matrixOf(dy), a.out, matrixOf(*a.w),
            a.in, 0.0f, dx->data, dx->dtype);
  if (const TensorRef *dw = launch.operandGrad(1)) // dW = dyᵀ x
    gemmAny(ctx, ws, true, false, a.out, a.in, a.rows, 1.0f, matrixOf(dy), a.out, matrixOf(*a.x),
            a.in, 0.0f, dw->data, dw->dtype);
  if (const TensorRef *db = launch.operandGrad(2)) // db = Σ_rows dy
    columnSums(ctx, ws, RowSum{FloatIn{dy.data, dy.dtype == plan::BF16}, a.out}, a.rows, a.out,
               floatOut(ctx, *db, "the bias gradient"), "linear.backward (bias)");
}

//===----------------------------------------------------------------------===//
// lora
//===----------------------------------------------------------------------===//

/// x [..., in], lora_a [r, in], lora_b [out, r]; y = scale (x Aᵀ) Bᵀ.
struct LoraArgs {
  const TensorRef *x, *a, *b;
  int64_t rows, in, rank, out;
  float scale;

  /// lora_a and lora_b are operands `first` and `first` + 1 (2 and 3 of lora_linear).
  LoraArgs(const KernelContext &ctx, size_t operands, int first = 1) {
    if (first == 1 && operands != 3)
      ctx.fail("expected 3 operands (input, lora_a, lora_b), got " + std::to_string(operands));
    if (first == 2 && operands != 4)
      ctx.fail("expected 4 operands (input, weight, lora_a, lora_b), got " + std::to_string(operands));
    const TensorRef &loraA = ctx.in(first), &loraB = ctx.in(first + 1);
    ctx.expectShape(loraA, "lora_a", {-1, -1});
    rank = loraA.dim(0);
    in = loraA.dim(1);
    ctx.expectShape(loraB, "lora_b", {-1, rank});
    out = loraB.dim(0);
    rows = rowsOf(ctx, ctx.in(0), "input", in);
    x = &ctx.in(0);
    a = &loraA;
    b = &loraB;
    expectFloats(ctx, *x, "input");
    expectFloats(ctx, *a, "lora_a");
    expectFloats(ctx, *b, "lora_b");
    scale = static_cast<float>(ctx.attrFloat("scale"));
    double dropout = ctx.attrFloat("dropout", 0.0);
    if (dropout != 0.0) {
      std::ostringstream message;
      message << "lora dropout " << dropout
              << " is not supported by the CUDA backend yet (train with lora dropout 0)";
      ctx.fail(message.str());
    }
  }

  /// bf16 when both factors are bf16, else f32.
  static plan::DType productType(const TensorRef &p, const TensorRef &q) {
    return p.dtype == plan::BF16 && q.dtype == plan::BF16 ? plan::BF16 : plan::F32;
  }

  /// h = x Aᵀ [rows, r] in scratch.
  Matrix down(const KernelContext &ctx, Workspace &ws) const {
    plan::DType type = productType(*x, *a);
    void *h = ws.bytes(static_cast<size_t>(std::max<int64_t>(rows * rank, 1)) *
                       (type == plan::BF16 ? 2 : 4));
    gemmAny(ctx, ws, false, true, rows, rank, in, 1.0f, matrixOf(*x), in, matrixOf(*a), in, 0.0f,
            h, type);
    return Matrix{h, type, rows * rank};
  }

  /// The adapter's gradients for the result gradient dy (null: not asked): dB = scale dyᵀ h;
  /// dh = scale dy B [rows, r]; dx = dh A, added to what dx holds when dxBeta is 1; dA = dhᵀ x.
  void backward(const KernelContext &ctx, Workspace &ws, const TensorRef &dy, const TensorRef *dx, float dxBeta,
                const TensorRef *da, const TensorRef *db) const {
    Matrix g = matrixOf(dy);
    if (db) {
      Matrix h = down(ctx, ws);
      gemmAny(ctx, ws, true, false, out, rank, rows, scale, g, out, h, rank, 0.0f, db->data, db->dtype);
    }
    if (!dx && !da)
      return;
    plan::DType dhType = productType(dy, *b);
    void *dhData =
        ws.bytes(static_cast<size_t>(std::max<int64_t>(rows * rank, 1)) * (dhType == plan::BF16 ? 2 : 4));
    gemmAny(ctx, ws, false, false, rows, rank, out, scale, g, out, matrixOf(*b), rank, 0.0f, dhData, dhType);
    Matrix dh{dhData, dhType, rows * rank};
    if (dx)
      gemmAny(ctx, ws, false, false, rows, in, rank, 1.0f, dh, rank, matrixOf(*a), in, dxBeta, dx->data,
              dx->dtype);
    if (da)
      gemmAny(ctx, ws, true, false, rank, in, rows, 1.0f, dh, rank, matrixOf(*x), in, 0.0f, da->data, da->dtype);
  }
};

void lora(KernelContext &ctx) {
  LoraArgs l(ctx, ctx.inputs.size());
  const TensorRef &result = ctx.out(0);
  expectRowsShape(ctx, result, "result", ctx.in(0), l.out);
  expectFloats(ctx, result, "result");
  if (l.rows == 0 || l.out == 0)
    return;
  Workspace ws(ctx);
  Matrix h = l.down(ctx, ws);
  gemmAny(ctx, ws, false, true, l.rows, l.out, l.rank, l.scale, h, l.rank, matrixOf(*l.b), l.rank,
          0.0f, result.data, result.dtype);
}

void loraBackward(KernelContext &ctx) {
  BackwardLaunch launch(ctx, 1, {0, 1, 2});
  LoraArgs l(ctx, launch.numOperands());
  std::vector<int64_t> shape = ctx.in(0).shape;
  shape.back() = l.out;
  Workspace ws(ctx);
  l.backward(ctx, ws, launch.resultGrad0(shape), launch.operandGrad(0), 0.0f, launch.operandGrad(1),
             launch.operandGrad(2));
}

//===----------------------------------------------------------------------===//
// lora_linear: y = x Wᵀ + scale (x Aᵀ) Bᵀ (--moe-fuse-lora)
//===----------------------------------------------------------------------===//

/// x [..., in], weight [out, in], lora_a [r, in], lora_b [out, r].
struct LoraLinearArgs {
  LinearArgs base;
  LoraArgs lora;

  plan::DType baseType; // base_type (unspecified: none given)

  LoraLinearArgs(const KernelContext &ctx, size_t operands)
      : base(ctx, 2), // the input and the weight (operands 0 and 1; LoraArgs counts all four)
        lora(ctx, operands, 2), baseType(checks::core::checkLoraLinear(ctx, base.out, lora.out)) {}

  /// The projection's part rounds in the buffer it is written to: base_type must be its type.
  void expectBaseType(const KernelContext &ctx, const TensorRef &t, const std::string &what) const {
    if (baseType != plan::DTYPE_UNSPECIFIED && baseType != t.dtype)
      ctx.fail(std::string("base_type ") + plan::dtypeName(baseType) + " differs from the " + what + "'s " +
               plan::dtypeName(t.dtype));
  }
};

/// y = x Wᵀ, then the update onto y in its own product (beta 1): the update is never written
/// in f32 and read back, and y is rounded once, as the unfused add rounds it.
void loraLinear(KernelContext &ctx) {
  LoraLinearArgs f(ctx, ctx.inputs.size());
  const LinearArgs &a = f.base;
  const LoraArgs &l = f.lora;
  const TensorRef &result = ctx.out(0);
  expectRowsShape(ctx, result, "result", ctx.in(0), a.out);
  expectFloats(ctx, result, "result");
  f.expectBaseType(ctx, result, "result");
  if (a.rows == 0 || a.out == 0)
    return;
  Workspace ws(ctx);
  gemmAny(ctx, ws, false, true, a.rows, a.out, a.in, 1.0f, matrixOf(*a.x), a.in, matrixOf(*a.w), a.in, 0.0f,
          result.data, result.dtype);
  Matrix h = l.down(ctx, ws);
  gemmAny(ctx, ws, false, true, l.rows, l.out, l.rank, l.scale, h, l.rank, matrixOf(*l.b), l.rank, 1.0f,
          result.data, result.dtype);
}

/// dx = dy W, then dh A onto it (beta 1); dA, dB as lora.backward's; dW when asked.
void loraLinearBackward(KernelContext &ctx) {
  BackwardLaunch launch(ctx, 1, {0, 1, 2, 3});
  LoraLinearArgs f(ctx, launch.numOperands());
  const LoraArgs &l = f.lora;
  std::vector<int64_t> shape = ctx.in(0).shape;
  shape.back() = l.out;
  const TensorRef &dy = launch.resultGrad0(shape);
  const TensorRef *dx = launch.operandGrad(0), *dw = launch.operandGrad(1);
  if (dx)
    f.expectBaseType(ctx, *dx, "input gradient");
  Workspace ws(ctx);
  if (dw) // dW = dyᵀ x
    gemmAny(ctx, ws, true, false, l.out, l.in, l.rows, 1.0f, matrixOf(dy), l.out, matrixOf(*l.x), l.in, 0.0f,
            dw->data, dw->dtype);
  if (dx) // the projection's part, rounded in dx's type; the adapter's goes onto it
    gemmAny(ctx, ws, false, false, l.rows, l.in, l.out, 1.0f, matrixOf(dy), l.out, matrixOf(*f.base.w), l.in,
            0.0f, dx->data, dx->dtype);
  l.backward(ctx, ws, dy, dx, 1.0f, launch.operandGrad(2), launch.operandGrad(3));
}

} // namespace

void registerDenseKernels(KernelRegistry &registry) {
  // GEMMs with beta 0 (or over the broadcast bias) write every element; an empty sum fills
  // zeros (gemmAny with k = 0).
  registry.add("linear", linear, OutputInit::Any);
  registry.add("linear.backward", linearBackward, OutputInit::Any);
  registry.add("lora", lora, OutputInit::Any);
  registry.add("lora.backward", loraBackward, OutputInit::Any);
  registry.add("lora_linear", loraLinear, OutputInit::Any);
  registry.add("lora_linear.backward", loraLinearBackward, OutputInit::Any);
}

} // namespace moec::runtime::cuda::core
