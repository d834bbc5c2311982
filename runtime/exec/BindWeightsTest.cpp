//===- BindWeightsTest.cpp - weights bound as an expert placement puts them -===//

#include <cstdlib>
#include <numeric>

#include "gtest/gtest.h"
#include "runtime/exec/Device.h"
#include "runtime/exec/Executor.h"
#include "runtime/plan/PlanFormat.h"
#include "runtime/weights/Checkpoint.h"
#include "runtime/weights/SafetensorsWriter.h"

namespace moec::runtime {
namespace {

// A checkpoint with four experts, stacked in one [4, 2, 3] tensor and as four [2, 3]
// `{expert}` tensors: element (e, i, j) = 100 e + 10 i + j.
class BindWeightsTest : public ::testing::Test {
protected:
  void SetUp() override {
    const char *dir = std::getenv("TEST_TMPDIR");
    path = std::string(dir ? dir : "/tmp") + "/experts.safetensors";
    for (int e = 0; e < 4; ++e)
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 3; ++j)
          stacked.push_back(100.0f * e + 10.0f * i + j);
    weights::SafetensorsWriter writer;
    ASSERT_TRUE(writer.add("stacked.w", weights::DType::F32, {4, 2, 3}, stacked.data(), stacked.size() * 4).ok());
    for (int e = 0; e < 4; ++e)
      ASSERT_TRUE(writer
                      .add("experts." + std::to_string(e) + ".w", weights::DType::F32, {2, 3}, stacked.data() + 6 * e,
                           24)
                      .ok());
    ASSERT_TRUE(writer.write(path).ok());
  }

  /// One rank, one weight buffer of `shape` bound to `tensor` as the placement puts rows.
  plan::Plan planFor(const std::string &tensor, std::vector<int64_t> shape, std::vector<int64_t> experts,
                     std::vector<std::pair<int64_t, int64_t>> slice = {}) {
    plan::Plan plan;
    plan.set_version(plan::kPlanVersion);
    plan.set_seq_len(1);
    plan.set_micro_batch(1);
    plan.set_recompute("none");
    plan::Rank *rank = plan.add_ranks();
    rank->set_num_streams(1);
    rank->set_num_events(1);
    plan::Step *step = rank->add_steps(); // a plan has steps; this one does nothing
    step->mutable_record()->set_id(0);
    step->set_phase(plan::FORWARD);
    int64_t bytes = 4 * std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
    plan::Arena *arena = rank->add_arenas();
    arena->set_role(plan::WEIGHT);
    arena->set_size_bytes(bytes);
    plan::Buffer *buffer = rank->add_buffers();
    buffer->set_name("w");
    buffer->set_role(plan::WEIGHT);
    buffer->set_dtype(plan::F32);
    for (int64_t d : shape)
      buffer->add_shape(d);
    buffer->set_size_bytes(bytes);
    plan::WeightBinding *binding = rank->add_weights();
    binding->set_tensor(tensor);
    for (int64_t e : experts)
      binding->add_experts(e);
    for (auto [start, size] : slice) {
      plan::Slice::Range *range = binding->mutable_slice()->add_dims();
      range->set_start(start);
      range->set_size(size);
    }
    return plan;
  }

  std::vector<float> bound(const plan::Plan &plan) {
    std::unique_ptr<Device> device = makeCpuDevice(1);
    auto executor = Executor::create(plan, 0, *device);
    EXPECT_TRUE(executor.ok()) << executor.status().message();
    auto checkpoint = weights::Checkpoint::open(path);
    EXPECT_TRUE(checkpoint.ok()) << checkpoint.status();
    if (!executor.ok() || !checkpoint.ok())
      return {};
    absl::Status s = (*executor)->bindWeights(**checkpoint);
    EXPECT_TRUE(s.ok()) << s;
    return (*executor)->readFloats(0).value_or(std::vector<float>{});
  }

  std::string path;
  std::vector<float> stacked;
};

std::vector<float> rowsOf(const std::vector<float> &all, std::vector<int> experts, int perExpert = 6) {
  std::vector<float> out;
  for (int e : experts)
    out.insert(out.end(), all.begin() + perExpert * e, all.begin() + perExpert * (e + 1));
  return out;
}

TEST_F(BindWeightsTest, ExpertTensorsInPlacementOrder) {
  EXPECT_EQ(bound(planFor("experts.{expert}.w", {2, 2, 3}, {3, 1})), rowsOf(stacked, {3, 1}));
}

TEST_F(BindWeightsTest, StackedTensorRowsInPlacementOrder) {
  EXPECT_EQ(bound(planFor("stacked.w", {2, 2, 3}, {2, 0})), rowsOf(stacked, {2, 0}));
}

TEST_F(BindWeightsTest, StackedTensorRowsWithAWindowOfEach) {
  // Columns 1..2 of each placed expert (a slice that leaves out the expert dimension).
  std::vector<float> want;
  for (int e : {3, 0})
    for (int i = 0; i < 2; ++i)
      for (int j = 1; j < 3; ++j)
        want.push_back(100.0f * e + 10.0f * i + j);
  EXPECT_EQ(bound(planFor("stacked.w", {2, 2, 2}, {3, 0}, {{0, 2}, {1, 2}})), want);
}

} // namespace
} // namespace moec::runtime
