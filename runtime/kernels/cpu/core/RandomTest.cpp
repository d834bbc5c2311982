//===- RandomTest.cpp - fill_random: the distributions by kind ------------===//

#include <cmath>

#include "gtest/gtest.h"
#include "runtime/kernels/cpu/core/CoreTestUtil.h"
#include "runtime/kernels/testing/KernelTesting.h"

namespace moec::runtime::cpu::core {
namespace {

using namespace moec::runtime::testing;
using testing::registry;

std::vector<float> fill(const char *kind, int64_t n, int64_t stream, double stddev = 0.02) {
  KernelCall call(registry(), "fill_random");
  call.output(plan::F32, {n}).attr("kind", kind).attr("stream", stream).attr("std", stddev);
  call.run();
  return call.result(0).floats();
}

TEST(FillRandom, NormalHasTheRequestedMeanAndSpread) {
  std::vector<float> v = fill("normal", 200000, 7, 0.25);
  double sum = 0, squares = 0;
  for (float x : v) {
    sum += x;
    squares += static_cast<double>(x) * x;
  }
  double mean = sum / v.size(), stddev = std::sqrt(squares / v.size() - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.25 * 4 / std::sqrt(200000.0)); // 4 standard errors
  EXPECT_NEAR(stddev, 0.25, 0.25 * 0.01);
}

TEST(FillRandom, ConstantsAndStateSpaceRanges) {
  for (float x : fill("zeros", 100, 1))
    EXPECT_EQ(x, 0.0f);
  for (float x : fill("ones", 100, 1))
    EXPECT_EQ(x, 1.0f);
  for (float x : fill("a_log", 10000, 3)) { // log(U[1, 16))
    EXPECT_GE(x, 0.0f);
    EXPECT_LT(x, std::log(16.0f));
  }
  for (float x : fill("dt_bias", 10000, 3)) { // softplus(x) = dt in [1e-3, 1e-1]
    double dt = std::log1p(std::exp(static_cast<double>(x)));
    EXPECT_GE(dt, 1e-3 * (1 - 1e-4));
    EXPECT_LE(dt, 1e-1 * (1 + 1e-4));
  }
}

TEST(FillRandom, APureFunctionOfStreamAndIndex) {
  EXPECT_EQ(fill("normal", 1000, 42), fill("normal", 1000, 42));
  EXPECT_NE(fill("normal", 1000, 42), fill("normal", 1000, 43));
  // A longer buffer starts with the same values: element i depends on i only.
  std::vector<float> longer = fill("normal", 2000, 42), shorter = fill("normal", 1000, 42);
  EXPECT_TRUE(std::equal(shorter.begin(), shorter.end(), longer.begin()));
}

TEST(FillRandom, FirstIndexGivesAPartOfTheWholeTensor) {
  // An expert-parallel rank's half of a tensor: elements 1200.. of the whole one.
  std::vector<float> whole = fill("normal", 2400, 42);
  KernelCall call(registry(), "fill_random");
  call.output(plan::F32, {1200}).attr("kind", "normal").attr("stream", int64_t(42)).attr("std", 0.02);
  call.attr("first_index", int64_t(1200));
  call.run();
  std::vector<float> part = call.result(0).floats();
  EXPECT_TRUE(std::equal(part.begin(), part.end(), whole.begin() + 1200));
}

TEST(FillRandom, ColumnsGiveATensorParallelRanksPart) {
  // Columns 4..7 of every row of a [3, 8] tensor (a tp rank's half of a row-split projection).
  std::vector<float> whole = fill("normal", 24, 42);
  KernelCall call(registry(), "fill_random");
  call.output(plan::F32, {3, 4}).attr("kind", "normal").attr("stream", int64_t(42)).attr("std", 0.02);
  call.attr("whole_columns", int64_t(8)).attr("first_column", int64_t(4));
  call.run();
  std::vector<float> part = call.result(0).floats();
  for (int row = 0; row < 3; ++row)
    for (int column = 0; column < 4; ++column)
      EXPECT_EQ(part[row * 4 + column], whole[row * 8 + 4 + column]) << row << ", " << column;
}

TEST(FillRandom, RejectsUnknownKinds) {
  KernelCall call(registry(), "fill_random");
  call.output(plan::F32, {4}).attr("kind", "uniform").attr("stream", int64_t(1));
  try {
    call.run();
    FAIL() << "an unknown kind was accepted";
  } catch (const KernelError &error) {
    EXPECT_NE(std::string(error.what()).find("unknown kind 'uniform'"), std::string::npos) << error.what();
  }
}

} // namespace
} // namespace moec::runtime::cpu::core
