//===- OptimizerTest.cpp - adamw and sum_squares against PyTorch's formulas -===//
//
// The reference is torch.optim.AdamW's update written out in double (decoupled
// decay, bias-corrected moments) with clip_grad_norm_'s factor applied to the
// gradient; the kernels compute in float, so they agree to float rounding.

#include <cmath>

#include <gtest/gtest.h>

#include "runtime/kernels/cpu/core/CoreTestUtil.h"

namespace moec::runtime::cpu::core::testing {
namespace {

void run(const std::string &kernel, const google::protobuf::Map<std::string, plan::Attr> &attrs,
         std::vector<std::vector<float>> &inputs, std::vector<std::vector<float>> &outputs) {
  KernelContext ctx;
  ctx.kernel = kernel;
  ctx.attrs = &attrs;
  ctx.seqLen = 1;
  ctx.microBatch = 1;
  for (auto &in : inputs)
    ctx.inputs.push_back(TensorRef{plan::F32, {static_cast<int64_t>(in.size())}, in.data()});
  for (auto &out : outputs)
    ctx.outputs.push_back(TensorRef{plan::F32, {static_cast<int64_t>(out.size())}, out.data()});
  (*registry().find(kernel))(ctx);
}

TEST(AdamW, FollowsPyTorchOverThreeSteps) {
  const int64_t n = 257;
  const double lr = 2e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8, decay = 0.1, scale = 0.5;
  std::vector<float> p0 = randomTensor({n}, 1).floats();
  std::vector<std::vector<float>> state = {p0, std::vector<float>(n), std::vector<float>(n)};
  std::vector<double> p(p0.begin(), p0.end()), m(n), v(n);
  for (int step = 0; step < 3; ++step) {
    std::vector<std::vector<float>> grad = {randomTensor({n}, 10 + step).floats()};
    google::protobuf::Map<std::string, plan::Attr> attrs;
    attrs["lr"].set_f(lr);
    attrs["step"].set_i(step);
    attrs["beta1"].set_f(b1);
    attrs["beta2"].set_f(b2);
    attrs["eps"].set_f(eps);
    attrs["weight_decay"].set_f(decay);
    attrs["grad_scale"].set_f(scale);
    run("adamw", attrs, grad, state);
    int t = step + 1;
    for (int64_t i = 0; i < n; ++i) {
      double g = grad[0][i] * scale;
      p[i] *= 1 - lr * decay;
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      double mHat = m[i] / (1 - std::pow(b1, t)), vHat = v[i] / (1 - std::pow(b2, t));
      p[i] -= lr * mHat / (std::sqrt(vHat) + eps);
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(state[0][i], p[i], 1e-6) << "param " << i;
    EXPECT_NEAR(state[1][i], m[i], 1e-6 * std::abs(m[i]) + 1e-8) << "adam_m " << i;
    EXPECT_NEAR(state[2][i], v[i], 1e-5 * std::abs(v[i]) + 1e-12) << "adam_v " << i;
  }
}

TEST(SumSquares, OneDoubleSumPerInput) {
  std::vector<std::vector<float>> inputs = {{3, 4}, {}, randomTensor({1000}, 2).floats()};
  std::vector<std::vector<float>> out = {std::vector<float>(3, -1.0f)};
  run("sum_squares", {}, inputs, out);
  double want = 0;
  for (float x : inputs[2])
    want += double(x) * x;
  EXPECT_EQ(out[0][0], 25.0f);
  EXPECT_EQ(out[0][1], 0.0f);
  EXPECT_NEAR(out[0][2], want, 1e-6 * want);
}

TEST(SumSquares, NeedsOneResultPerInput) {
  std::vector<std::vector<float>> inputs = {{1}, {2}}, out = {std::vector<float>(3)};
  EXPECT_THROW(run("sum_squares", {}, inputs, out), KernelError);
}

} // namespace
} // namespace moec::runtime::cpu::core::testing
