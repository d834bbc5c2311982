//===- Dense.cpp - linear and lora, forward and backward ------------------===//
//
// Both are products with weights in the checkpoint's [out, in] layout (PEFT's
// for lora_A [r, in] and lora_B [out, r]); every product goes through
// cpu::gemm. Leading dimensions of the input are flattened into rows.
//
//===----------------------------------------------------------------------===//

#include <algorithm>
#include <sstream>

#include "runtime/kernels/cpu/Gemm.h"
#include "runtime/kernels/cpu/core/CoreCommon.h"

namespace moec::runtime::cpu::core {

namespace {

/// linear: x [..., in], weight [out, in], optional bias [out].
struct LinearArgs {
  const float *x, *w, *b = nullptr;
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
    x = floats(ctx, ctx.in(0), "input");
    w = floats(ctx, weight, "weight");
    if (operands == 3) {
      ctx.expectShape(ctx.in(2), "bias", {out});
      b = floats(ctx, ctx.in(2), "bias");
    }
  }
};

void linear(KernelContext &ctx) {
  LinearArgs a(ctx, ctx.inputs.size());
  const TensorRef &result = ctx.out(0);
  expectRowsShape(ctx, result, "result", ctx.in(0), a.out);
  float *y = floats(ctx, result, "result");
  if (a.b)
    ctx.parallelFor(a.rows, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row)
        std::copy(a.b, a.b + a.out, y + row * a.out);
    });
  gemm(false, true, a.rows, a.out, a.in, 1.0f, a.x, a.in, a.w, a.in, a.b ? 1.0f : 0.0f, y, a.out);
}

void linearBackward(KernelContext &ctx) {
  BackwardLaunch launch(ctx, 1, {0, 1, 2});
  LinearArgs a(ctx, launch.numOperands());
  std::vector<int64_t> shape = ctx.in(0).shape;
  shape.back() = a.out;
  const float *dy = floats(ctx, launch.resultGrad0(shape), "the result gradient");
  if (const TensorRef *dx = launch.operandGrad(0)) // dx = dy W
    gemm(false, false, a.rows, a.in, a.out, 1.0f, dy, a.out, a.w, a.in, 0.0f,
         floats(ctx, *dx, "the input gradient"), a.in);
  if (const TensorRef *dw = launch.operandGrad(1)) // dW = dyᵀ x
    gemm(true, false, a.out, a.in, a.rows, 1.0f, dy, a.out, a.x, a.in, 0.0f,
         floats(ctx, *dw, "the weight gradient"), a.in);
  if (const TensorRef *dbRef = launch.operandGrad(2)) {
    float *db = floats(ctx, *dbRef, "the bias gradient");
    std::vector<double> sums =
        rowBlocks(ctx, a.rows, a.out, [&](int64_t begin, int64_t end, double *partial) {
          for (int64_t row = begin; row < end; ++row)
            for (int64_t j = 0; j < a.out; ++j)
              partial[j] += dy[row * a.out + j];
        });
    for (int64_t j = 0; j < a.out; ++j)
      db[j] = static_cast<float>(sums[j]);
  }
}

/// lora: x [..., in], lora_a [r, in], lora_b [out, r]; y = scale (x Aᵀ) Bᵀ.
struct LoraArgs {
  const float *x, *a, *b;
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
    x = floats(ctx, ctx.in(0), "input");
    a = floats(ctx, loraA, "lora_a");
    b = floats(ctx, loraB, "lora_b");
    scale = static_cast<float>(ctx.attrFloat("scale"));
    double dropout = ctx.attrFloat("dropout", 0.0);
    if (dropout != 0.0) {
      std::ostringstream message;
      message << "lora dropout " << dropout
              << " is not supported by the CPU backend yet (train with lora dropout 0)";
      ctx.fail(message.str());
    }
  }

  /// h = x Aᵀ [rows, r].
  std::vector<float> down() const {
    std::vector<float> h(static_cast<size_t>(rows * rank));
    gemm(false, true, rows, rank, in, 1.0f, x, in, a, in, 0.0f, h.data(), rank);
    return h;
  }

  /// The adapter's gradients for the result gradient dy (null: not asked): dB = scale dyᵀ h;
  /// dh = scale dy B [rows, r]; dx = dh A, added to what dx holds when dxBeta is 1; dA = dhᵀ x.
  void backward(const float *dy, float *dx, float dxBeta, float *da, float *db) const {
    if (db) {
      std::vector<float> h = down();
      gemm(true, false, out, rank, rows, scale, dy, out, h.data(), rank, 0.0f, db, rank);
    }
    if (!dx && !da)
      return;
    std::vector<float> dh(static_cast<size_t>(rows * rank));
    gemm(false, false, rows, rank, out, scale, dy, out, b, rank, 0.0f, dh.data(), rank);
    if (dx)
      gemm(false, false, rows, in, rank, 1.0f, dh.data(), rank, a, in, dxBeta, dx, in);
    if (da)
      gemm(true, false, rank, in, rows, 1.0f, dh.data(), rank, x, in, 0.0f, da, in);
  }
};

/// The gradient's data, or null when it is not asked.
float *gradOrNull(const KernelContext &ctx, const TensorRef *grad, const std::string &what) {
  return grad ? floats(ctx, *grad, what) : nullptr;
}

void lora(KernelContext &ctx) {
  LoraArgs l(ctx, ctx.inputs.size());
  const TensorRef &result = ctx.out(0);
  expectRowsShape(ctx, result, "result", ctx.in(0), l.out);
  std::vector<float> h = l.down();
  gemm(false, true, l.rows, l.out, l.rank, l.scale, h.data(), l.rank, l.b, l.rank, 0.0f,
       floats(ctx, result, "result"), l.out);
}

void loraBackward(KernelContext &ctx) {
  BackwardLaunch launch(ctx, 1, {0, 1, 2});
  LoraArgs l(ctx, launch.numOperands());
  std::vector<int64_t> shape = ctx.in(0).shape;
  shape.back() = l.out;
  const float *dy = floats(ctx, launch.resultGrad0(shape), "the result gradient");
  l.backward(dy, gradOrNull(ctx, launch.operandGrad(0), "the input gradient"), 0.0f,
             gradOrNull(ctx, launch.operandGrad(1), "the lora_a gradient"),
             gradOrNull(ctx, launch.operandGrad(2), "the lora_b gradient"));
}

//===----------------------------------------------------------------------===//
// lora_linear: y = x Wᵀ + scale (x Aᵀ) Bᵀ (--moe-fuse-lora)
//===----------------------------------------------------------------------===//

/// x [..., in], weight [out, in], lora_a [r, in], lora_b [out, r].
struct LoraLinearArgs {
  LinearArgs base;
  LoraArgs lora;

  bool roundBase = false; // base_type bf16: the projection's own output and input gradient round

  LoraLinearArgs(const KernelContext &ctx, size_t operands)
      : base(ctx, 2), // the input and the weight (operands 0 and 1; LoraArgs counts all four)
        lora(ctx, operands, 2),
        roundBase(checks::core::checkLoraLinear(ctx, base.out, lora.out) == plan::BF16) {}

  /// The projection's part of an output [rows, width], rounded as its unfused op's result was.
  void roundBasePart(const KernelContext &ctx, float *data, int64_t rows, int64_t width) const {
    if (!roundBase)
      return;
    ctx.parallelFor(rows, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin * width; i < end * width; ++i)
        data[i] = roundToBf16(data[i]);
    });
  }
};

void loraLinear(KernelContext &ctx) {
  LoraLinearArgs f(ctx, ctx.inputs.size());
  const TensorRef &result = ctx.out(0);
  expectRowsShape(ctx, result, "result", ctx.in(0), f.base.out);
  float *y = floats(ctx, result, "result");
  gemm(false, true, f.base.rows, f.base.out, f.base.in, 1.0f, f.base.x, f.base.in, f.base.w, f.base.in, 0.0f, y,
       f.base.out);
  f.roundBasePart(ctx, y, f.base.rows, f.base.out);
  std::vector<float> h = f.lora.down();
  gemm(false, true, f.lora.rows, f.lora.out, f.lora.rank, f.lora.scale, h.data(), f.lora.rank, f.lora.b,
       f.lora.rank, 1.0f, y, f.lora.out);
}

void loraLinearBackward(KernelContext &ctx) {
  BackwardLaunch launch(ctx, 1, {0, 1, 2, 3});
  LoraLinearArgs f(ctx, launch.numOperands());
  const LoraArgs &l = f.lora;
  std::vector<int64_t> shape = ctx.in(0).shape;
  shape.back() = l.out;
  const float *dy = floats(ctx, launch.resultGrad0(shape), "the result gradient");
  if (float *dw = gradOrNull(ctx, launch.operandGrad(1), "the weight gradient")) // dW = dyᵀ x
    gemm(true, false, l.out, l.in, l.rows, 1.0f, dy, l.out, l.x, l.in, 0.0f, dw, l.in);
  // dx = dy W (rounded as the projection's own input gradient), then the adapter's part onto it.
  float *dx = gradOrNull(ctx, launch.operandGrad(0), "the input gradient");
  if (dx) {
    gemm(false, false, l.rows, l.in, l.out, 1.0f, dy, l.out, f.base.w, l.in, 0.0f, dx, l.in);
    f.roundBasePart(ctx, dx, l.rows, l.in);
  }
  l.backward(dy, dx, 1.0f, gradOrNull(ctx, launch.operandGrad(2), "the lora_a gradient"),
             gradOrNull(ctx, launch.operandGrad(3), "the lora_b gradient"));
}

} // namespace

void registerDenseKernels(KernelRegistry &registry) {
  registry.add("linear", linear);
  registry.add("linear.backward", linearBackward);
  registry.add("lora", lora);
  registry.add("lora.backward", loraBackward);
  registry.add("lora_linear", loraLinear);
  registry.add("lora_linear.backward", loraLinearBackward);
}

} // namespace moec::runtime::cpu::core
