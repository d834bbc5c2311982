//===- OptimizerTest.cpp - schedule, AdamW and clipping by hand -----------===//
//
// AdamW's element update (checks/core/AdamW.h, what the adamw kernels run) against
// PyTorch's arithmetic done by hand.

#include "runtime/train/Optimizer.h"

#include <cmath>

#include "runtime/kernels/checks/core/AdamW.h"

#include "gtest/gtest.h"

namespace moec::runtime {
namespace {

plan::Optimizer settings(const char *schedule) {
  plan::Optimizer o;
  o.set_kind("adamw");
  o.set_lr(1e-3);
  o.set_beta1(0.9);
  o.set_beta2(0.999);
  o.set_eps(1e-8);
  o.set_weight_decay(0.01);
  o.set_warmup_steps(10);
  o.set_total_steps(110);
  o.set_schedule(schedule);
  o.set_min_lr_ratio(0.1);
  o.set_max_grad_norm(1.0);
  return o;
}

TEST(LearningRateTest, WarmsUpLinearlyFromZeroThenFollowsTheCosineToItsFloor) {
  plan::Optimizer o = settings("cosine");
  EXPECT_DOUBLE_EQ(learningRate(o, 0), 0.0);
  EXPECT_DOUBLE_EQ(learningRate(o, 5), 0.5e-3);
  EXPECT_DOUBLE_EQ(learningRate(o, 10), 1e-3);
  // Halfway through the 100 decay steps cos = 0: 0.1 + 0.9 * 0.5 = 0.55 of lr.
  EXPECT_NEAR(learningRate(o, 60), 0.55e-3, 1e-15);
  EXPECT_NEAR(learningRate(o, 110), 0.1e-3, 1e-15);
  EXPECT_NEAR(learningRate(o, 500), 0.1e-3, 1e-15);
}

TEST(LearningRateTest, ConstantAfterWarmup) {
  plan::Optimizer o = settings("constant");
  EXPECT_DOUBLE_EQ(learningRate(o, 2), 0.2e-3);
  EXPECT_DOUBLE_EQ(learningRate(o, 10), 1e-3);
  EXPECT_DOUBLE_EQ(learningRate(o, 1000), 1e-3);
}

TEST(AdamWTest, FirstStepByHand) {
  // p = 1, g = 0.5, lr = 1e-3, wd = 0.01, t = 1:
  //   p *= 1 - 1e-5 -> 0.99999; m = 0.05; v = 0.00025;
  //   denom = sqrt(v) / sqrt(1 - 0.999) + 1e-8 = 0.5 + 1e-8; step size = lr / (1 - 0.9) = 0.01
  //   p = 0.99999 - 0.01 * 0.05 / (0.5 + 1e-8) = 0.99899000002
  float p = 1.0f, g = 0.5f, m = 0.0f, v = 0.0f;
  adamwElement(adamwConstants(1e-3, 0, 0.9, 0.999, 1e-8, 0.01, 1.0), p, g, m, v);
  EXPECT_NEAR(m, 0.05, 1e-8);
  EXPECT_NEAR(v, 0.00025, 1e-10);
  EXPECT_NEAR(p, 0.99899000002, 1e-7);
}

TEST(AdamWTest, BiasCorrectionMakesTheFirstStepsLrSized) {
  // Without decay, |Δp| = lr * |m̂| / (sqrt(v̂) + eps) ≈ lr for a constant gradient.
  float p = 0.0f, g = -2.0f, m = 0.0f, v = 0.0f;
  for (int step = 0; step < 3; ++step) {
    float before = p;
    adamwElement(adamwConstants(1e-3, step, 0.9, 0.999, 1e-8, 0.0, 1.0), p, g, m, v);
    EXPECT_NEAR(p - before, 1e-3, 1e-8) << "step " << step;
  }
}

TEST(ClippingTest, Factor) {
  double norm = 5.0;
  EXPECT_NEAR(clipFactor(norm, 1.0), 1.0 / (5.0 + 1e-6), 1e-15);
  EXPECT_DOUBLE_EQ(clipFactor(norm, 10.0), 1.0);
  EXPECT_DOUBLE_EQ(clipFactor(norm, 0.0), 1.0); // 0 = clipping off
}

} // namespace
} // namespace moec::runtime
