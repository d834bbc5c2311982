//===- PlanTextTest.cpp - the text dump prints what lit tests grep --------===//

#include "runtime/plan/PlanText.h"

#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "runtime/plan/TestPlan.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace moec::plan {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Lt;

std::vector<std::string> linesOf(const Plan &plan) { return absl::StrSplit(planToText(plan), '\n'); }

TEST(PlanText, Header) {
  std::vector<std::string> lines = linesOf(testing::makeValidPlan());
  ASSERT_GE(lines.size(), 4u);
  EXPECT_EQ(lines[0], "plan v2 model=Qwen3MoeForCausalLM model_type=qwen3_moe seq=128x2");
  EXPECT_EQ(lines[1], "mesh dp=1 tp=2 pp=1 ep=1 world=2 recompute=per-layer");
  EXPECT_EQ(lines[2], "optimizer adamw lr=0.0001 betas=0.9,0.999 eps=1e-08 weight_decay=0 warmup=10/100 "
                      "schedule=cosine min_lr_ratio=0.1 max_grad_norm=1");
  EXPECT_EQ(lines[3], "lora r=4 alpha=8 dropout=0 expert_lora=false targets=q_proj");
}

TEST(PlanText, RankArenasGroupsAndBuffers) {
  std::vector<std::string> lines = linesOf(testing::makeValidPlan());
  EXPECT_THAT(lines, Contains("rank 0 streams=2 events=1 groups=1 buffers=16 weights=3 steps=10"));
  EXPECT_THAT(lines, Contains("  arena activation 49152 (48.0 KiB)"));
  EXPECT_THAT(lines, Contains("  arena input 2056 (2.0 KiB)"));
  EXPECT_THAT(lines, Contains("  group 0 tp [0,1]"));
  EXPECT_THAT(lines, Contains("  %13 activation bf16 [256,32] @32768+16384 live 1..5 \"layer0.q\""));
  EXPECT_THAT(lines, Contains("  %1 weight bf16 [4,16,64] @4096+8192 live 0..9 \"model.layers.0.mlp.experts.gate_proj\""));
  EXPECT_THAT(lines, Contains("  %11 input f32 [] @2048+4 live 0..9 \"loss\""));
}

TEST(PlanText, WeightBindings) {
  std::vector<std::string> lines = linesOf(testing::makeValidPlan());
  // Rank 1's slice starts at row 32 and its experts at 4.
  EXPECT_THAT(lines, Contains("  bind %0 \"model.layers.0.self_attn.q_proj.weight\" slice [32+32,0+64]"));
  EXPECT_THAT(lines, Contains("  bind %1 \"model.layers.0.mlp.experts.{expert}.gate_proj.weight\" first_expert=4"));
  EXPECT_THAT(lines, Contains("  bind %2 \"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight\""));
}

TEST(PlanText, Steps) {
  std::vector<std::string> lines = linesOf(testing::makeValidPlan());
  EXPECT_THAT(lines, Contains("  #0 fwd s0 embedding %10 -> %12 {flops=0, vocab_size=1000}"));
  EXPECT_THAT(lines, Contains("  #1 fwd L0 s0 linear:tile128 %12, %0, %2, %3 -> %13 {flops=2097152, act=\"none\", "
                              "lora_scale=2, perm=[1,0], transpose_b=true}  // \"model.layers.0.self_attn.q_proj\""));
  EXPECT_THAT(lines, Contains("  #2 fwd L0 s0 record e0"));
  EXPECT_THAT(lines, Contains("  #3 fwd L0 s1 wait e0"));
  EXPECT_THAT(lines, Contains("  #4 fwd L0 s1 all_reduce g0 %13 -> %13"));
  EXPECT_THAT(lines, Contains("  #7 bwd L0 s1 linear.backward %11, %2, %3 -> %15, %4, %5 {flops=0}"));
}

TEST(PlanText, LoraTensors) {
  std::vector<std::string> lines = linesOf(testing::makeValidPlan());
  EXPECT_THAT(lines, Contains("lora_tensor \"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight\" rank=0 "
                              "param=%2 grad=%4 adam_m=%6 adam_v=%7"));
  EXPECT_THAT(lines, Contains("lora_tensor \"base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight\" rank=0 "
                              "param=%3 grad=%5 adam_m=%8 adam_v=%9"));
}

TEST(PlanText, SectionsComeInOrder) {
  std::string text = planToText(testing::makeValidPlan());
  size_t rank0 = text.find("rank 0 "), rank1 = text.find("rank 1 ");
  size_t arena = text.find("  arena weight"), group = text.find("  group 0"), buffer = text.find("  %0 weight");
  size_t bind = text.find("  bind %0"), step = text.find("  #0 fwd"), lora = text.find("lora_tensor");
  EXPECT_THAT(rank0, Lt(arena));
  EXPECT_THAT(arena, Lt(group));
  EXPECT_THAT(group, Lt(buffer));
  EXPECT_THAT(buffer, Lt(bind));
  EXPECT_THAT(bind, Lt(step));
  EXPECT_THAT(step, Lt(rank1));
  EXPECT_THAT(rank1, Lt(lora));
  EXPECT_EQ(text.back(), '\n');
}

TEST(PlanText, AttributesPrintSortedWhateverTheInsertionOrder) {
  Plan plan = testing::makeValidPlan();
  Plan reversed = plan;
  for (Rank &rank : *reversed.mutable_ranks()) {
    auto *attrs = rank.mutable_steps(1)->mutable_launch()->mutable_attrs();
    google::protobuf::Map<std::string, Attr> copy = *attrs;
    attrs->clear();
    for (const char *key : {"transpose_b", "perm", "lora_scale", "act"})
      (*attrs)[key] = copy[key];
  }
  EXPECT_EQ(planToText(plan), planToText(reversed));
}

TEST(PlanText, PrintsInvalidPlansWithoutFailing) {
  Plan plan = testing::makeValidPlan();
  plan.clear_optimizer();
  plan.clear_lora();
  Rank &rank = *plan.mutable_ranks(0);
  rank.mutable_buffers(12)->set_role(static_cast<Role>(42));
  rank.mutable_buffers(12)->set_dtype(DTYPE_UNSPECIFIED);
  rank.mutable_steps(5)->clear_launch();
  rank.mutable_steps(4)->mutable_collective()->set_kind(static_cast<Collective::Kind>(42));
  std::vector<std::string> lines = linesOf(plan);
  EXPECT_THAT(lines, Contains("optimizer none"));
  EXPECT_THAT(lines, Contains("lora none"));
  EXPECT_THAT(lines, Contains("  %12 unknown(42) unspecified [256,64] @0+32768 live 0..1 \"layer0.x\""));
  EXPECT_THAT(lines, Contains("  #5 fwd L0 s1 <no kind>"));
  EXPECT_THAT(lines, Contains("  #4 fwd L0 s1 unknown(42) g0 %13 -> %13"));
}

TEST(PlanText, EscapesNames) {
  Plan plan = testing::makeValidPlan();
  plan.mutable_ranks(0)->mutable_buffers(12)->set_name("a \"quoted\"\nname");
  EXPECT_THAT(planToText(plan), HasSubstr("live 0..1 \"a \\\"quoted\\\"\\nname\"\n"));
}

} // namespace
} // namespace moec::plan
