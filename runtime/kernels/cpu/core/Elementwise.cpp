//===- Elementwise.cpp - add, activations, gates, split, fill, accumulate -===//
//
// Activations are evaluated in double and rounded once to f32.
//
//===----------------------------------------------------------------------===//

#include <algorithm>
#include <cmath>
#include <cstring>

#include "runtime/kernels/cpu/core/CoreCommon.h"

namespace moec::runtime::cpu::core {

namespace {

enum class Activation { Silu, GeluTanh, Relu2, Sigmoid };

Activation activationOf(const KernelContext &ctx) {
  std::string kind = ctx.attrString("kind");
  if (kind == "silu")
    return Activation::Silu;
  if (kind == "gelu_tanh")
    return Activation::GeluTanh;
  if (kind == "relu2")
    return Activation::Relu2;
  if (kind == "sigmoid")
    return Activation::Sigmoid;
  if (kind == "clamped_swiglu")
    ctx.fail("activation 'clamped_swiglu' is only used inside expert_mlp, not here");
  ctx.fail("unknown activation '" + kind + "' (supported: silu, gelu_tanh, relu2, sigmoid)");
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// gelu_tanh is torch's gelu(approximate="tanh"): 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³))).
constexpr double kGeluC = 0.7978845608028654, kGeluA = 0.044715;

double activate(Activation kind, double x) {
  switch (kind) {
  case Activation::Silu:
    return x * sigmoid(x);
  case Activation::GeluTanh:
    return 0.5 * x * (1.0 + std::tanh(kGeluC * (x + kGeluA * x * x * x)));
  case Activation::Relu2:
    return x > 0 ? x * x : 0.0;
  case Activation::Sigmoid:
    return sigmoid(x);
  }
  return 0.0;
}

double derivative(Activation kind, double x) {
  switch (kind) {
  case Activation::Silu: {
    double s = sigmoid(x);
    return s * (1.0 + x * (1.0 - s));
  }
  case Activation::GeluTanh: {
    double t = std::tanh(kGeluC * (x + kGeluA * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * kGeluC * (1.0 + 3.0 * kGeluA * x * x);
  }
  case Activation::Relu2:
    return x > 0 ? 2.0 * x : 0.0;
  case Activation::Sigmoid: {
    double s = sigmoid(x);
    return s * (1.0 - s);
  }
  }
  return 0.0;
}

/// Runs fn(i) for every i in [0, n) across the pool.
template <typename Fn> void forEach(const KernelContext &ctx, int64_t n, Fn fn) {
  ctx.parallelFor(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      fn(i);
  });
}

void add(KernelContext &ctx) {
  const TensorRef &lhs = ctx.in(0), &rhs = ctx.in(1), &result = ctx.out(0);
  expectSameShape(ctx, rhs, "rhs", lhs, "lhs");
  expectSameShape(ctx, result, "result", lhs, "lhs");
  const float *a = floats(ctx, lhs, "lhs"), *b = floats(ctx, rhs, "rhs");
  float *y = floats(ctx, result, "result");
  forEach(ctx, lhs.numel(), [&](int64_t i) { y[i] = a[i] + b[i]; });
}

void activation(KernelContext &ctx) {
  Activation kind = activationOf(ctx);
  const TensorRef &input = ctx.in(0), &result = ctx.out(0);
  expectSameShape(ctx, result, "result", input, "input");
  const float *x = floats(ctx, input, "input");
  float *y = floats(ctx, result, "result");
  forEach(ctx, input.numel(), [&](int64_t i) { y[i] = static_cast<float>(activate(kind, x[i])); });
}

void activationBackward(KernelContext &ctx) {
  BackwardLaunch launch(ctx, 1, {0});
  Activation kind = activationOf(ctx);
  const TensorRef &input = ctx.in(0);
  const float *x = floats(ctx, input, "input");
  const float *dy = floats(ctx, launch.resultGrad0(input.shape), "the result gradient");
  if (const TensorRef *dxRef = launch.operandGrad(0)) {
    float *dx = floats(ctx, *dxRef, "the input gradient");
    forEach(ctx, input.numel(),
            [&](int64_t i) { dx[i] = static_cast<float>(dy[i] * derivative(kind, x[i])); });
  }
}

void glu(KernelContext &ctx) {
  Activation kind = activationOf(ctx);
  const TensorRef &gate = ctx.in(0), &up = ctx.in(1), &result = ctx.out(0);
  expectSameShape(ctx, up, "up", gate, "gate");
  expectSameShape(ctx, result, "result", gate, "gate");
  const float *g = floats(ctx, gate, "gate"), *u = floats(ctx, up, "up");
  float *y = floats(ctx, result, "result");
  forEach(ctx, gate.numel(),
          [&](int64_t i) { y[i] = static_cast<float>(activate(kind, g[i]) * u[i]); });
}

void gluBackward(KernelContext &ctx) {
  BackwardLaunch launch(ctx, 1, {0, 1});
  Activation kind = activationOf(ctx);
  const TensorRef &gate = ctx.in(0), &up = ctx.in(1);
  expectSameShape(ctx, up, "up", gate, "gate");
  const float *g = floats(ctx, gate, "gate"), *u = floats(ctx, up, "up");
  const float *dy = floats(ctx, launch.resultGrad0(gate.shape), "the result gradient");
  const TensorRef *dgRef = launch.operandGrad(0), *duRef = launch.operandGrad(1);
  float *dg = dgRef ? floats(ctx, *dgRef, "the gate gradient") : nullptr;
  float *du = duRef ? floats(ctx, *duRef, "the up gradient") : nullptr;
  forEach(ctx, gate.numel(), [&](int64_t i) {
    if (dg)
      dg[i] = static_cast<float>(static_cast<double>(dy[i]) * u[i] * derivative(kind, g[i]));
    if (du)
      du[i] = static_cast<float>(dy[i] * activate(kind, g[i]));
  });
}

/// sigmoid_gate as rows of `width` features sharing one gate value: the
/// same-shape gate is rows = numel, width = 1; the [T, 1] gate is rows = T.
struct GateArgs {
  const float *x, *g;
  int64_t rows, width;

  GateArgs(const KernelContext &ctx) {
    const TensorRef &input = ctx.in(0), &gate = ctx.in(1);
    x = floats(ctx, input, "input");
    g = floats(ctx, gate, "gate");
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
  float *y = floats(ctx, result, "result");
  forEach(ctx, a.rows, [&](int64_t row) {
    float s = static_cast<float>(sigmoid(a.g[row]));
    for (int64_t j = row * a.width; j < (row + 1) * a.width; ++j)
      y[j] = a.x[j] * s;
  });
}

void sigmoidGateBackward(KernelContext &ctx) {
  BackwardLaunch launch(ctx, 1, {0, 1});
  GateArgs a(ctx);
  const float *dy = floats(ctx, launch.resultGrad0(ctx.in(0).shape), "the result gradient");
  const TensorRef *dxRef = launch.operandGrad(0), *dgRef = launch.operandGrad(1);
  float *dx = dxRef ? floats(ctx, *dxRef, "the input gradient") : nullptr;
  float *dg = dgRef ? floats(ctx, *dgRef, "the gate gradient") : nullptr;
  forEach(ctx, a.rows, [&](int64_t row) {
    double s = sigmoid(a.g[row]), dot = 0;
    for (int64_t j = row * a.width; j < (row + 1) * a.width; ++j) {
      dot += static_cast<double>(dy[j]) * a.x[j];
      if (dx)
        dx[j] = static_cast<float>(dy[j] * s);
    }
    if (dg)
      dg[row] = static_cast<float>(dot * s * (1.0 - s));
  });
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
    floats(ctx, ctx.in(0), "input");
  }

  /// Copies part i of every group between the input row and part i's row.
  template <typename Copy> void forEachPart(int64_t row, size_t i, Copy copy) const {
    int64_t width = groups * groupWidth, part = groups * sizes[i];
    for (int64_t g = 0; g < groups; ++g)
      copy(row * width + g * groupWidth + offsets[i], row * part + g * sizes[i], sizes[i]);
  }
};

void split(KernelContext &ctx) {
  SplitArgs a(ctx);
  if (ctx.outputs.size() != a.sizes.size())
    ctx.fail("expected " + std::to_string(a.sizes.size()) + " results (one per size), got " +
             std::to_string(ctx.outputs.size()));
  const float *x = floats(ctx, ctx.in(0), "input");
  std::vector<float *> parts;
  for (size_t i = 0; i < a.sizes.size(); ++i) {
    std::string what = "result " + std::to_string(i);
    expectRowsShape(ctx, ctx.outputs[i], what, ctx.in(0), a.groups * a.sizes[i]);
    parts.push_back(floats(ctx, ctx.outputs[i], what));
  }
  forEach(ctx, a.rows, [&](int64_t row) {
    for (size_t i = 0; i < parts.size(); ++i)
      a.forEachPart(row, i, [&](int64_t from, int64_t to, int64_t n) {
        std::copy(x + from, x + from + n, parts[i] + to);
      });
  });
}

void splitBackward(KernelContext &ctx) {
  SplitArgs a(ctx);
  BackwardLaunch launch(ctx, a.sizes.size(), {0});
  std::vector<const float *> grads; // null: that result's gradient is zero
  for (size_t i = 0; i < a.sizes.size(); ++i) {
    const TensorRef *grad = launch.resultGrad(static_cast<int64_t>(i));
    std::string what = "the gradient of result " + std::to_string(i);
    if (grad)
      expectRowsShape(ctx, *grad, what, ctx.in(0), a.groups * a.sizes[i]);
    grads.push_back(grad ? floats(ctx, *grad, what) : nullptr);
  }
  const TensorRef *dxRef = launch.operandGrad(0);
  if (!dxRef)
    return;
  float *dx = floats(ctx, *dxRef, "the input gradient");
  forEach(ctx, a.rows, [&](int64_t row) {
    for (size_t i = 0; i < grads.size(); ++i)
      a.forEachPart(row, i, [&](int64_t to, int64_t from, int64_t n) {
        if (grads[i])
          std::copy(grads[i] + from, grads[i] + from + n, dx + to);
        else
          std::fill(dx + to, dx + to + n, 0.0f);
      });
  });
}

void fill(KernelContext &ctx) {
  float value = static_cast<float>(ctx.attrFloat("value"));
  const TensorRef &result = ctx.out(0);
  float *y = floats(ctx, result, "result");
  forEach(ctx, result.numel(), [&](int64_t i) { y[i] = value; });
}

void microbatch(KernelContext &ctx) {
  auto [offset, bytes] = checks::core::microbatchBytes(ctx);
  std::memcpy(ctx.out(0).data, static_cast<const char *>(ctx.in(0).data) + offset, bytes);
}

/// token_blocks and concat_tokens: each block's rows copied out of or into the whole tensor.
void tokenBlocks(KernelContext &ctx) {
  for (const checks::core::BlockCopy &copy : checks::core::tokenBlockCopies(ctx))
    std::memcpy(copy.dst, copy.src, copy.bytes);
}

/// tp_slice_features and tp_place_features: a tp rank's columns of each part, row by row.
void sliceFeatures(KernelContext &ctx) {
  checks::core::FeatureCopies work = checks::core::sliceFeatureCopies(ctx);
  if (work.zeroBytes)
    std::memset(work.zero, 0, work.zeroBytes);
  for (const checks::core::StridedCopy &copy : work.copies)
    for (size_t row = 0; row < copy.height; ++row)
      std::memcpy(static_cast<char *>(copy.dst) + row * copy.dpitch,
                  static_cast<const char *>(copy.src) + row * copy.spitch, copy.width);
}

/// The one kernel that accumulates: acc += g (the executor zeroes gradients once per step).
void accumulateGrad(KernelContext &ctx) {
  const TensorRef &grad = ctx.in(0), &acc = ctx.out(0);
  expectSameShape(ctx, grad, "the gradient", acc, "the accumulator");
  const float *g = floats(ctx, grad, "the gradient");
  float *sum = floats(ctx, acc, "the accumulator");
  forEach(ctx, acc.numel(), [&](int64_t i) { sum[i] += g[i]; });
}

} // namespace

void registerElementwiseKernels(KernelRegistry &registry) {
  registry.add("add", add);
  registry.add("activation", activation);
  registry.add("activation.backward", activationBackward);
  registry.add("glu", glu);
  registry.add("glu.backward", gluBackward);
  registry.add("sigmoid_gate", sigmoidGate);
  registry.add("sigmoid_gate.backward", sigmoidGateBackward);
  registry.add("split", split);
  registry.add("split.backward", splitBackward);
  registry.add("fill", fill);
  registry.add("microbatch", microbatch);
  registry.add("tp_slice_features", sliceFeatures, OutputInit::Any); // every column written
  registry.add("tp_place_features", sliceFeatures, OutputInit::Any); // zeros, then the columns
  registry.add("token_blocks", tokenBlocks);
  registry.add("concat_tokens", tokenBlocks);
  registry.add("accumulate_grad", accumulateGrad);
}

} // namespace moec::runtime::cpu::core
