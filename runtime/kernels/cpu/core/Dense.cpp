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

  LoraArgs(const KernelContext &ctx, size_t operands) {
    if (operands != 3)
      ctx.fail("expected 3 operands (input, lora_a, lora_b), got " + std::to_string(operands));
    const TensorRef &loraA = ctx.in(1), &loraB = ctx.in(2);
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
};

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
  const TensorRef *dx = launch.operandGrad(0), *da = launch.operandGrad(1),
                  *db = launch.operandGrad(2);
  if (db) { // dB = scale dyᵀ h
    std::vector<float> h = l.down();
    gemm(true, false, l.out, l.rank, l.rows, l.scale, dy, l.out, h.data(), l.rank, 0.0f,
         floats(ctx, *db, "the lora_b gradient"), l.rank);
  }
  if (!dx && !da)
    return;
  // dh = scale dy B [rows, r]; dx = dh A; dA = dhᵀ x.
  std::vector<float> dh(static_cast<size_t>(l.rows * l.rank));
  gemm(false, false, l.rows, l.rank, l.out, l.scale, dy, l.out, l.b, l.rank, 0.0f, dh.data(),
       l.rank);
  if (dx)
    gemm(false, false, l.rows, l.in, l.rank, 1.0f, dh.data(), l.rank, l.a, l.in, 0.0f,
         floats(ctx, *dx, "the input gradient"), l.in);
  if (da)
    gemm(true, false, l.rank, l.in, l.rows, 1.0f, dh.data(), l.rank, l.x, l.in, 0.0f,
         floats(ctx, *da, "the lora_a gradient"), l.in);
}

} // namespace

void registerDenseKernels(KernelRegistry &registry) {
  registry.add("linear", linear);
  registry.add("linear.backward", linearBackward);
  registry.add("lora", lora);
  registry.add("lora.backward", loraBackward);
}

} // namespace moec::runtime::cpu::core
