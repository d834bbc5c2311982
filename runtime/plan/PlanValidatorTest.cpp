//===- PlanValidatorTest.cpp - each rule rejects with a precise message ---===//
//
// Every test starts from the valid plan of TestPlan.cpp (its buffer and step
// numbers are listed there), breaks one field and checks that the message
// names the place and the field.
//
//===----------------------------------------------------------------------===//

#include "runtime/plan/PlanValidator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <string>

#include "google/protobuf/stubs/logging.h"
#include "runtime/plan/PlanFormat.h"
#include "runtime/plan/PlanText.h"
#include "runtime/plan/TestPlan.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace moec::plan {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::SizeIs;
using ::testing::StartsWith;

// The validation message, or "OK".
std::string messageOf(const Plan &plan) {
  absl::Status status = validatePlan(plan);
  if (status.ok())
    return "OK";
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  return std::string(status.message());
}

class PlanValidatorTest : public ::testing::Test {
protected:
  Plan plan = testing::makeValidPlan();
  Rank &rank0() { return *plan.mutable_ranks(0); }
  Buffer &buffer0(int id) { return *rank0().mutable_buffers(id); }
  Step &step0(int index) { return *rank0().mutable_steps(index); }
};

TEST_F(PlanValidatorTest, ValidPlanPasses) {
  EXPECT_EQ(messageOf(plan), "OK");
  EXPECT_THAT(findPlanProblems(plan), SizeIs(0));
}

TEST_F(PlanValidatorTest, ForwardOnlyPlanNeedsNoOptimizerOrLora) {
  plan.clear_optimizer();
  plan.clear_lora();
  // The adapters become frozen weights, placed after the others.
  for (Rank &rank : *plan.mutable_ranks()) {
    rank.mutable_arenas(0)->set_size_bytes(12288 + 1536);
    for (int id : {2, 3}) {
      rank.mutable_buffers(id)->set_role(WEIGHT);
      rank.mutable_buffers(id)->set_offset(rank.buffers(id).offset() + 12288);
    }
  }
  // Buffer 3 is now a weight without a binding.
  EXPECT_THAT(messageOf(plan), HasSubstr("rank 0, buffer 3 \"q_proj.lora_B\": weight buffer has no weight binding"));
  for (Rank &rank : *plan.mutable_ranks()) {
    WeightBinding *binding = rank.add_weights();
    binding->set_buffer(3);
    binding->set_tensor("lora_B");
  }
  EXPECT_EQ(messageOf(plan), "OK");
}

TEST_F(PlanValidatorTest, RejectsWrongVersion) {
  plan.set_version(kPlanVersion + 1);
  EXPECT_THAT(messageOf(plan), AllOf(StartsWith("invalid plan: 1 problem(s)\n"), HasSubstr("version is 3, expected 2")));
}

TEST_F(PlanValidatorTest, RejectsARankOrderWithoutEachAxisOnce) {
  for (const char *axis : {"tp", "ep", "dp", "tp"})
    plan.mutable_mesh()->add_rank_order(axis);
  EXPECT_THAT(messageOf(plan), HasSubstr("mesh.rank_order is tp,ep,dp,tp, expected each of dp, tp, pp, ep once "
                                         "(the fastest first; empty: tp,ep,dp,pp)"));
  plan.mutable_mesh()->set_rank_order(3, "pp");
  EXPECT_EQ(messageOf(plan), "OK");
}

TEST(MeshCoordinate, FollowsTheRankOrder) {
  Mesh mesh;
  mesh.set_dp(2);
  mesh.set_tp(2);
  mesh.set_ep(2);
  // The default order, tp, then ep, dp, pp: rank 5 = 1 + 2*(0 + 2*1) is tp 1, ep 0, dp 1.
  EXPECT_EQ(meshCoordinate(mesh, 5, "tp"), 1);
  EXPECT_EQ(meshCoordinate(mesh, 5, "ep"), 0);
  EXPECT_EQ(meshCoordinate(mesh, 5, "dp"), 1);
  EXPECT_EQ(meshCoordinate(mesh, 5, "pp"), 0);
  // ep, then dp, tp: rank 5 is ep 1, dp 0, tp 1.
  for (const char *axis : {"ep", "dp", "tp", "pp"})
    mesh.add_rank_order(axis);
  EXPECT_EQ(meshCoordinate(mesh, 5, "ep"), 1);
  EXPECT_EQ(meshCoordinate(mesh, 5, "dp"), 0);
  EXPECT_EQ(meshCoordinate(mesh, 5, "tp"), 1);
}

TEST_F(PlanValidatorTest, RejectsNoRanks) {
  plan.clear_ranks();
  plan.clear_lora();
  plan.mutable_mesh()->set_tp(0);
  EXPECT_THAT(messageOf(plan), HasSubstr("ranks is empty, expected at least one rank"));
}

TEST_F(PlanValidatorTest, RejectsRankNotAtItsIndex) {
  plan.mutable_ranks(1)->set_rank(0);
  EXPECT_THAT(messageOf(plan), HasSubstr("ranks[1]: rank is 0, expected its index 1"));
}

TEST_F(PlanValidatorTest, RejectsMeshThatDoesNotMatchTheRanks) {
  plan.mutable_mesh()->set_ep(2);
  EXPECT_THAT(messageOf(plan), HasSubstr("mesh dp x tp x pp x ep is 1x2x1x2 = 4, expected the number of ranks (2)"));
}

TEST_F(PlanValidatorTest, RejectsUnknownRecompute) {
  plan.set_recompute("sometimes");
  EXPECT_THAT(messageOf(plan), HasSubstr("recompute is \"sometimes\", expected \"none\", \"regather\", \"per-layer\" or \"mixed\""));
}

TEST_F(PlanValidatorTest, RejectsBufferIdNotAtItsIndex) {
  buffer0(5).set_id(7);
  EXPECT_THAT(messageOf(plan), HasSubstr("rank 0, buffer 5 \"q_proj.lora_B.grad\": id is 7, expected its index 5"));
}

TEST_F(PlanValidatorTest, RejectsUnspecifiedRoleAndDtype) {
  buffer0(12).set_role(ROLE_UNSPECIFIED);
  buffer0(13).set_dtype(static_cast<DType>(42));
  std::string message = messageOf(plan);
  EXPECT_THAT(message, HasSubstr("rank 0, buffer 12 \"layer0.x\": role is unspecified, expected a role"));
  EXPECT_THAT(message, HasSubstr("rank 0, buffer 13 \"layer0.q\": dtype is unknown (42), expected f32"));
}

TEST_F(PlanValidatorTest, RejectsNonPositiveDimension) {
  buffer0(12).set_shape(1, 0);
  EXPECT_THAT(messageOf(plan), HasSubstr("rank 0, buffer 12 \"layer0.x\": shape[1] is 0, expected > 0"));
}

TEST_F(PlanValidatorTest, RejectsSizeBytesMismatch) {
  buffer0(12).set_size_bytes(100);
  EXPECT_THAT(messageOf(plan), HasSubstr("rank 0, buffer 12 \"layer0.x\": size_bytes is 100, expected 32768 "
                                         "(shape [256,64] x 2 bytes of bf16)"));
}

TEST_F(PlanValidatorTest, RejectsOffsetPastTheArena) {
  buffer0(13).set_offset(40000);
  EXPECT_THAT(messageOf(plan), HasSubstr("rank 0, buffer 13 \"layer0.q\": offset + size_bytes is 40000 + 16384, "
                                         "expected <= the activation arena's size_bytes (49152)"));
}

TEST_F(PlanValidatorTest, RejectsNegativeOffset) {
  buffer0(13).set_offset(-8);
  EXPECT_THAT(messageOf(plan), HasSubstr("rank 0, buffer 13 \"layer0.q\": offset is -8, expected >= 0"));
}

TEST_F(PlanValidatorTest, RejectsBufferWithoutArena) {
  rank0().mutable_arenas()->RemoveLast(); // the workspace arena
  EXPECT_THAT(messageOf(plan), HasSubstr("rank 0, buffer 14 \"layer0.mlp_out\": role is workspace but the rank has "
                                         "no workspace arena"));
}

TEST_F(PlanValidatorTest, RejectsTwoArenasForOneRole) {
  rank0().mutable_arenas(1)->set_role(WEIGHT);
  EXPECT_THAT(messageOf(plan), HasSubstr("rank 0, arenas[1]: same role as arenas[0] (weight), expected one arena "
                                         "per role"));
}

TEST_F(PlanValidatorTest, RejectsLiveRangeOutsideTheSteps) {
  buffer0(13).set_last_step(10);
  EXPECT_THAT(messageOf(plan), HasSubstr("rank 0, buffer 13 \"layer0.q\": live range first_step..last_step is 1..10, "
                                         "expected 0 <= first_step <= last_step < 10 (steps)"));
}

TEST_F(PlanValidatorTest, RejectsGradientThatDoesNotSpanEveryStep) {
  buffer0(4).set_first_step(7);
  EXPECT_THAT(messageOf(plan), HasSubstr("rank 0, buffer 4 \"q_proj.lora_A.grad\": live range first_step..last_step "
                                         "is 7..9, expected 0..9 (gradient buffers span every step)"));
}

TEST_F(PlanValidatorTest, RejectsOverlappingLiveBuffersInOneArena) {
  // %14 holds bytes [0, 65536) at steps 5..6; %15 reuses them from step 6.
  buffer0(15).set_first_step(6);
  EXPECT_THAT(messageOf(plan),
              HasSubstr("rank 0, buffer 15 \"layer0.dq\": bytes [0, 65536) live 6..9 overlap buffer 14 "
                        "\"layer0.mlp_out\" at bytes [0, 65536) live 5..6 in the workspace arena"));
}

TEST_F(PlanValidatorTest, RejectsPartlyOverlappingLiveBuffers) {
  // %13 (steps 1..5) moved into the second half of %12 (steps 0..1).
  buffer0(13).set_offset(16384);
  EXPECT_THAT(messageOf(plan), HasSubstr("rank 0, buffer 13 \"layer0.q\": bytes [16384, 32768) live 1..5 overlap "
                                         "buffer 12 \"layer0.x\" at bytes [0, 32768) live 0..1 in the activation arena"));
}

TEST_F(PlanValidatorTest, InputBuffersHoldTheirBytesAtEveryStep) {
  // The loss is written at step 6, but the runtime reads it after the last step.
  buffer0(11).set_first_step(6);
  buffer0(11).set_last_step(7);
  buffer0(10).set_last_step(6);
  buffer0(11).set_offset(0);
  EXPECT_THAT(messageOf(plan), HasSubstr("rank 0, buffer 11 \"loss\": bytes [0, 4) live 0..9 overlap buffer 10 "
                                         "\"input_ids\" at bytes [0, 2048) live 0..9 in the input arena"));
}

TEST_F(PlanValidatorTest, RejectsStepUsingABufferOutsideItsLiveRange) {
  buffer0(12).set_last_step(0);
  EXPECT_THAT(messageOf(plan), HasSubstr("rank 0, step 1 (linear, origin \"model.layers.0.self_attn.q_proj\"): "
                                         "launch.inputs[0] is buffer 12 \"layer0.x\" whose live range 0..0 does not "
                                         "include step 1"));
}

TEST_F(PlanValidatorTest, RejectsStepReferencingAMissingBuffer) {
  step0(1).mutable_launch()->set_inputs(1, 99);
  EXPECT_THAT(messageOf(plan), HasSubstr("rank 0, step 1 (linear, origin \"model.layers.0.self_attn.q_proj\"): "
                                         "launch.inputs[1] is 99: missing buffer (rank has 16 buffers)"));
}

TEST_F(PlanValidatorTest, RejectsCollectiveReferencingAMissingBuffer) {
  step0(4).mutable_collective()->set_outputs(0, 16);
  EXPECT_THAT(messageOf(plan), HasSubstr("rank 0, step 4 (all_reduce): collective.outputs[0] is 16: missing buffer"));
}

TEST_F(PlanValidatorTest, RejectsWritingAWeight) {
  step0(7).mutable_launch()->set_outputs(0, 0);
  EXPECT_THAT(messageOf(plan), HasSubstr("rank 0, step 7 (linear.backward): launch.outputs[0] writes buffer 0 "
                                         "\"model.layers.0.self_attn.q_proj.weight\" of role weight"));
}

TEST_F(PlanValidatorTest, RejectsReadingAnActivationBeforeItIsWritten) {
  step0(0).mutable_launch()->clear_outputs(); // the embedding no longer writes %12
  EXPECT_THAT(messageOf(plan), HasSubstr("launch.inputs[0] reads buffer 12 "
                                         "\"layer0.x\" before any step writes it"));
}

TEST_F(PlanValidatorTest, RejectsEmptyKernelName) {
  step0(5).mutable_launch()->clear_kernel();
  EXPECT_THAT(messageOf(plan), HasSubstr("rank 0, step 5 (launch): launch.kernel is empty"));
}

TEST_F(PlanValidatorTest, RejectsAttrWithoutValue) {
  (*step0(0).mutable_launch()->mutable_attrs())["axis"];
  EXPECT_THAT(messageOf(plan), HasSubstr("rank 0, step 0 (embedding): launch.attrs[\"axis\"] has no value"));
}

TEST_F(PlanValidatorTest, RejectsStepWithoutKind) {
  step0(5).clear_launch();
  EXPECT_THAT(messageOf(plan), HasSubstr("rank 0, step 5 (no kind): kind is not set"));
}

TEST_F(PlanValidatorTest, RejectsUnspecifiedPhase) {
  step0(6).set_phase(PHASE_UNSPECIFIED);
  EXPECT_THAT(messageOf(plan), HasSubstr("rank 0, step 6 (cross_entropy): phase is unspecified, expected fwd, bwd or "
                                         "recompute"));
}

TEST_F(PlanValidatorTest, RejectsBadStream) {
  step0(3).set_stream(2);
  EXPECT_THAT(messageOf(plan), HasSubstr("rank 0, step 3 (wait): stream is 2, expected < num_streams (2)"));
}

TEST_F(PlanValidatorTest, RejectsBadEvent) {
  step0(2).mutable_record()->set_id(3);
  std::string message = messageOf(plan);
  EXPECT_THAT(message, HasSubstr("rank 0, step 2 (record): record.id is 3, expected < num_events (1)"));
  // With the record gone, the wait waits for nothing.
  EXPECT_THAT(message, HasSubstr("rank 0, step 3 (wait): wait.id is 0, expected an event recorded by an earlier step"));
}

TEST_F(PlanValidatorTest, RejectsStepsOfTwoStreamsThatNoEventOrders) {
  // Step 3 records instead of waiting: stream 1's all-reduce of %13 (step 4) no longer waits
  // for stream 0's linear that writes it (step 1), and stream 1 may run on while %12's last
  // use on stream 0 (step 1) is still going.
  step0(3).clear_wait();
  step0(3).mutable_record()->set_id(0);
  std::string message = messageOf(plan);
  EXPECT_THAT(message, HasSubstr("rank 0, step 4 (all_reduce): on stream 1 reads buffer 13 \"layer0.q\", which "
                                 "step 1 on stream 0 uses, with no event ordering the two"));
  EXPECT_THAT(message, HasSubstr("live range ends at step 1, but step 9 on stream 1 may run before its last use on "
                                 "another stream completes"));
}

TEST_F(PlanValidatorTest, RejectsWaitOnAnUnknownEvent) {
  step0(3).mutable_wait()->set_id(1);
  EXPECT_THAT(messageOf(plan), HasSubstr("rank 0, step 3 (wait): wait.id is 1, expected < num_events (1)"));
}

TEST_F(PlanValidatorTest, RejectsBadGroupIndex) {
  step0(4).mutable_collective()->set_group(3);
  EXPECT_THAT(messageOf(plan),
              HasSubstr("rank 0, step 4 (all_reduce): collective.group is 3, expected < the number of groups (1)"));
}

TEST_F(PlanValidatorTest, RejectsGroupRankOutsideTheWorld) {
  rank0().mutable_groups(0)->add_ranks(5);
  EXPECT_THAT(messageOf(plan), HasSubstr("rank 0, groups[0] (tp): ranks[2] is 5, expected in [0, 2)"));
}

TEST_F(PlanValidatorTest, RejectsGroupListingARankTwice) {
  rank0().mutable_groups(0)->set_ranks(0, 1);
  EXPECT_THAT(messageOf(plan), HasSubstr("rank 0, groups[0] (tp): ranks[1] is 1, listed twice"));
}

TEST_F(PlanValidatorTest, RejectsGroupWithoutItsOwnRank) {
  rank0().mutable_groups(0)->mutable_ranks()->RemoveLast();
  rank0().mutable_groups(0)->set_ranks(0, 1);
  EXPECT_THAT(messageOf(plan), HasSubstr("rank 0, groups[0] (tp): ranks [1] do not include this rank 0"));
}

TEST_F(PlanValidatorTest, RejectsGroupThatAMemberDoesNotDeclare) {
  plan.mutable_ranks(1)->mutable_groups(0)->set_axis("dp");
  std::string message = messageOf(plan);
  EXPECT_THAT(message, HasSubstr("group tp [0,1] (declared by rank 0 as groups[0]): member rank 1 does not declare it"));
  EXPECT_THAT(message, HasSubstr("group dp [0,1] (declared by rank 1 as groups[0]): member rank 0 does not declare it"));
}

TEST_F(PlanValidatorTest, AcceptsJoinedAxesAndRejectsARepeatedOne) {
  for (Rank &rank : *plan.mutable_ranks())
    rank.mutable_groups(0)->set_axis("dp+ep");
  plan.mutable_mesh()->set_tp(1);
  plan.mutable_mesh()->set_dp(2);
  EXPECT_EQ(messageOf(plan), "OK");
  for (Rank &rank : *plan.mutable_ranks())
    rank.mutable_groups(0)->set_axis("dp+dp");
  EXPECT_THAT(messageOf(plan), HasSubstr("rank 0, groups[0] (dp+dp): axis is \"dp+dp\", expected mesh axes "
                                         "(\"dp\", \"tp\", \"ep\", \"pp\") joined by '+', each once"));
}

/// Step 4 of both ranks becomes an expert route over the two-rank group: indices [6, 2] i32
/// in, received indices `received` and the layout [2, 4] i64 out (input buffers appended
/// past the test plan's inputs, so no live range conflicts).
void makeExpertRoute(Plan &plan, std::initializer_list<int64_t> received, int64_t experts = 4) {
  for (Rank &rank : *plan.mutable_ranks()) {
    int64_t at = 2056;
    auto add = [&](const char *name, DType dtype, std::initializer_list<int64_t> shape) {
      uint32_t id = testing::addTestBuffer(rank, name, INPUT, dtype, shape, at, 0, 9);
      at += rank.buffers(static_cast<int>(id)).size_bytes();
      return id;
    };
    uint32_t indices = add("indices", I32, {6, 2}), layout = add("layout", I64, {2, 4}),
             local = add("local", I32, received);
    for (Arena &arena : *rank.mutable_arenas())
      if (arena.role() == INPUT)
        arena.set_size_bytes(at);
    Collective *c = rank.mutable_steps(4)->mutable_collective();
    c->set_kind(Collective::EXPERT_ROUTE);
    c->set_num_experts(experts);
    c->clear_inputs();
    c->clear_outputs();
    c->add_inputs(indices);
    for (uint32_t id : {local, layout})
      c->add_outputs(id);
  }
}

TEST_F(PlanValidatorTest, AcceptsAnExpertRouteOfTheRightShapes) {
  makeExpertRoute(plan, {12, 2});
  EXPECT_EQ(messageOf(plan), "OK");
}

TEST_F(PlanValidatorTest, RejectsAnExpertRouteWithoutRoomForEveryRanksTokens) {
  makeExpertRoute(plan, {10, 2});
  EXPECT_THAT(messageOf(plan), HasSubstr("rank 0, step 4 (expert_route): expert_route: local_indices has 10 rows "
                                         "for 6 tokens, expected 2 T = 12 (group size 2)"));
}

TEST_F(PlanValidatorTest, AcceptsLessRoomOnlyWithACapacityFactorOfAtLeastOne) {
  makeExpertRoute(plan, {10, 2});
  for (Rank &rank : *plan.mutable_ranks())
    rank.mutable_steps(4)->mutable_collective()->set_capacity_factor(1.5);
  EXPECT_EQ(messageOf(plan), "OK");
  rank0().mutable_steps(4)->mutable_collective()->set_capacity_factor(0.5);
  EXPECT_THAT(messageOf(plan), HasSubstr("capacity_factor is 0.5, expected 0 (room for every token) or at least 1"));
  rank0().mutable_steps(4)->mutable_collective()->set_capacity_factor(1.5);
  rank0().mutable_steps(4)->mutable_collective()->set_all_tokens(true);
  EXPECT_THAT(messageOf(plan), HasSubstr("capacity_factor is set on an all_tokens expert_route (its room is fixed)"));
}

TEST_F(PlanValidatorTest, RejectsABoundedRouteWithMoreRoomThanEveryRanksTokens) {
  makeExpertRoute(plan, {14, 2});
  for (Rank &rank : *plan.mutable_ranks())
    rank.mutable_steps(4)->mutable_collective()->set_capacity_factor(1.5);
  EXPECT_THAT(messageOf(plan), HasSubstr("local_indices has 14 rows for 6 tokens, expected 1 to 2 T = 12 "
                                         "(capacity_factor room)"));
}

TEST_F(PlanValidatorTest, AcceptsAnAllTokensRouteAndRejectsAllTokensElsewhere) {
  makeExpertRoute(plan, {12, 2});
  plan::Step *route = nullptr, *other = nullptr;
  for (plan::Step &step : *plan.mutable_ranks(0)->mutable_steps())
    if (step.has_collective())
      (step.collective().kind() == plan::Collective::EXPERT_ROUTE ? route : other) = &step;
  ASSERT_TRUE(route && other) << "the fixture has a route and another collective";
  route->mutable_collective()->set_all_tokens(true);
  EXPECT_EQ(messageOf(plan), "OK");
  other->mutable_collective()->set_all_tokens(true);
  EXPECT_THAT(messageOf(plan), HasSubstr("all_tokens is set on a "));
}

TEST_F(PlanValidatorTest, RejectsAnExpertRouteWhoseExpertsDoNotSplitOverTheGroup) {
  makeExpertRoute(plan, {12, 2}, 3);
  EXPECT_THAT(messageOf(plan), HasSubstr("expert_route: num_experts is 3, expected a positive multiple of the group "
                                         "size (2)"));
}

TEST_F(PlanValidatorTest, AcceptsAnExpertPlacementAndRejectsOneThatMissesAnExpert) {
  makeExpertRoute(plan, {12, 2});
  Collective *route = rank0().mutable_steps(4)->mutable_collective();
  for (int64_t e : {3, 0, 2, 1})
    route->add_placement(e);
  EXPECT_EQ(messageOf(plan), "OK");
  const char *expected = "expert_route: placement has 4 entries, expected each of the 2 ranks' experts in turn (as "
                         "many each, none twice on a rank) covering the 4 experts, on a route that does not send "
                         "every token to every rank";
  route->set_placement(2, 3); // expert 3 twice, 2 nowhere
  EXPECT_THAT(messageOf(plan), HasSubstr(expected));
  route->set_placement(2, 2);
  route->set_placement(1, 3); // expert 3 twice on rank 0
  EXPECT_THAT(messageOf(plan), HasSubstr(expected));
  route->set_placement(1, 0);
  route->set_all_tokens(true);
  EXPECT_THAT(messageOf(plan), HasSubstr("experts in turn"));
  route->set_all_tokens(false);
  for (int64_t e : {0, 3}) // three experts per rank, [3, 0, 2] and [1, 0, 3]: 0 and 3 on both
    route->add_placement(e);
  EXPECT_EQ(messageOf(plan), "OK");
}

TEST_F(PlanValidatorTest, RejectsPlacedExpertsThatDoNotMatchTheBuffersRows) {
  // Weights[1] binds the [4, 16, 64] experts buffer: a placement lists one expert per row.
  WeightBinding &experts = *rank0().mutable_weights(1);
  for (int64_t e : {7, 6, 5, 4})
    experts.add_experts(e);
  EXPECT_EQ(messageOf(plan), "OK");
  experts.add_experts(3);
  EXPECT_THAT(messageOf(plan), HasSubstr("experts lists 5 experts for buffer 1"));
  experts.clear_experts();
  experts.add_experts(-1);
  EXPECT_THAT(messageOf(plan), HasSubstr("experts holds -1, expected expert numbers >= 0"));
}

TEST_F(PlanValidatorTest, RejectsPlacedExpertWeightsThatAreNotWhatTheRoutePlacesThere) {
  makeExpertRoute(plan, {12, 2});
  for (Rank &rank : *plan.mutable_ranks()) { // layer 0's route; every expert on both ranks
    rank.mutable_steps(4)->set_layer(0);
    for (int64_t e : {3, 0, 2, 1, 0, 1, 2, 3})
      rank.mutable_steps(4)->mutable_collective()->add_placement(e);
  }
  WeightBinding &experts = *rank0().mutable_weights(1); // layer 0's [4, 16, 64] experts buffer
  for (int64_t e : {3, 0, 2, 1})
    experts.add_experts(e);
  EXPECT_EQ(messageOf(plan), "OK");
  experts.set_experts(0, 1);
  experts.set_experts(3, 3); // rank 0's four experts in another order
  EXPECT_THAT(messageOf(plan), HasSubstr("rank 0, weights[1] \"model.layers.0.mlp.experts.{expert}.gate_proj.weight\": "
                                         "experts are [1,0,2,3], expected [3,0,2,1]: what layer 0's expert route "
                                         "places on this rank, in its order"));
  experts.set_experts(3, 1);
  EXPECT_THAT(messageOf(plan), HasSubstr("experts lists an expert twice"));
  experts.set_experts(3, 9);
  EXPECT_THAT(messageOf(plan), HasSubstr("experts holds 9, expected experts below the route's num_experts (4)"));
}

TEST_F(PlanValidatorTest, RejectsAnExpertRouteWithMissingOutputs) {
  makeExpertRoute(plan, {12, 2});
  rank0().mutable_steps(4)->mutable_collective()->mutable_outputs()->RemoveLast();
  EXPECT_THAT(messageOf(plan), HasSubstr("expert_route has 1 inputs and 1 outputs, expected (indices) -> "
                                         "(local_indices, layout)"));
}

TEST_F(PlanValidatorTest, RejectsReceivedRowsOfABufferThatDoesNotExist) {
  buffer0(0).set_received_rows_of(static_cast<uint32_t>(rank0().buffers_size()) + 5);
  EXPECT_THAT(messageOf(plan), HasSubstr(absl::StrCat("received_rows_of is ", rank0().buffers_size() + 5,
                                                      ", expected 1 + the id of a [rows, k] buffer")));
}

TEST_F(PlanValidatorTest, AcceptsAPipelineExchangeThatSendsReceivesOrBoth) {
  for (Rank &rank : *plan.mutable_ranks())
    rank.mutable_steps(4)->mutable_collective()->set_kind(Collective::SEND_RECV);
  EXPECT_EQ(messageOf(plan), "OK"); // sends its input, receives its output
  rank0().mutable_steps(4)->mutable_collective()->clear_outputs();
  plan.mutable_ranks(1)->mutable_steps(4)->mutable_collective()->clear_inputs();
  EXPECT_EQ(messageOf(plan), "OK"); // rank 0 only sends, rank 1 only receives
}

TEST_F(PlanValidatorTest, RejectsAPipelineExchangeWhoseSendNobodyReceives) {
  for (Rank &rank : *plan.mutable_ranks())
    rank.mutable_steps(4)->mutable_collective()->set_kind(Collective::SEND_RECV);
  plan.mutable_ranks(1)->mutable_steps(4)->mutable_collective()->clear_outputs();
  EXPECT_THAT(messageOf(plan), HasSubstr("send_recv #0: rank 0 (step 4) sends 16384 bytes of bf16 but rank 1 (step 4) "
                                         "receives nothing, expected what one sends to be what the other receives"));
}

TEST_F(PlanValidatorTest, RejectsAPipelineExchangeThatMovesNothing) {
  for (Rank &rank : *plan.mutable_ranks()) {
    Collective *c = rank.mutable_steps(4)->mutable_collective();
    c->set_kind(Collective::SEND_RECV);
    c->clear_inputs();
    c->clear_outputs();
  }
  EXPECT_THAT(messageOf(plan), HasSubstr("rank 0, step 4 (send_recv): send_recv has 0 inputs and 0 outputs, "
                                         "expected at most one of each and at least one"));
}

TEST_F(PlanValidatorTest, RejectsMembersIssuingDifferentCollectives) {
  plan.mutable_ranks(1)->mutable_steps(8)->mutable_collective()->set_kind(Collective::BROADCAST);
  EXPECT_THAT(messageOf(plan), HasSubstr("group tp [0,1]: collective #1 on it is broadcast at rank 1 step 8 but "
                                         "all_reduce at rank 0 step 8"));
}

TEST_F(PlanValidatorTest, RejectsMembersIssuingDifferentNumbersOfCollectives) {
  Rank &rank1 = *plan.mutable_ranks(1);
  rank1.mutable_steps(8)->mutable_launch()->set_kernel("noop"); // was the gradient all-reduce
  EXPECT_THAT(messageOf(plan), HasSubstr("group tp [0,1]: rank 1 issues 1 collectives on it but rank 0 issues 2"));
}

TEST_F(PlanValidatorTest, RejectsCollectiveWithWrongOutputSize) {
  for (Rank &rank : *plan.mutable_ranks())
    rank.mutable_steps(8)->mutable_collective()->set_kind(Collective::ALL_GATHER);
  EXPECT_THAT(messageOf(plan), HasSubstr("rank 0, step 8 (all_gather): all_gather outputs[0] buffer 4 "
                                         "\"q_proj.lora_A.grad\" is 1024 bytes, expected inputs[i] x group size"));
}

TEST_F(PlanValidatorTest, RejectsWeightBindingToAMissingBuffer) {
  rank0().mutable_weights(0)->set_buffer(42);
  std::string message = messageOf(plan);
  EXPECT_THAT(message, HasSubstr("rank 0, weights[0] \"model.layers.0.self_attn.q_proj.weight\": buffer is 42: "
                                 "missing buffer (rank has 16 buffers)"));
  EXPECT_THAT(message, HasSubstr("rank 0, buffer 0 \"model.layers.0.self_attn.q_proj.weight\": weight buffer has no "
                                 "weight binding"));
}

TEST_F(PlanValidatorTest, RejectsWeightBindingToAnActivation) {
  rank0().mutable_weights(2)->set_buffer(12);
  EXPECT_THAT(messageOf(plan), HasSubstr("weights[2] \"base_model.model.model.layers.0.self_attn.q_proj.lora_A."
                                         "weight\": buffer 12 \"layer0.x\" has role activation, expected "
                                         "weight or lora_param"));
}

TEST_F(PlanValidatorTest, RejectsTwoBindingsOfOneBuffer) {
  rank0().mutable_weights(1)->set_buffer(0);
  EXPECT_THAT(messageOf(plan), HasSubstr("rank 0, weights[1] \"model.layers.0.mlp.experts.{expert}.gate_proj.weight\": "
                                         "buffer 0 \"model.layers.0.self_attn.q_proj.weight\" is already bound "
                                         "by weights[0]"));
}

TEST_F(PlanValidatorTest, RejectsUnresolvedLayer) {
  rank0().mutable_weights(0)->set_tensor("model.layers.{layer}.self_attn.q_proj.weight");
  EXPECT_THAT(messageOf(plan), HasSubstr("rank 0, weights[0] \"model.layers.{layer}.self_attn.q_proj.weight\": tensor "
                                         "contains unresolved {layer}"));
}

TEST_F(PlanValidatorTest, RejectsEmptyTensorName) {
  rank0().mutable_weights(0)->clear_tensor();
  EXPECT_THAT(messageOf(plan), HasSubstr("rank 0, weights[0] \"\": tensor is empty"));
}

TEST_F(PlanValidatorTest, RejectsSliceThatDoesNotMatchTheBuffer) {
  Slice *slice = rank0().mutable_weights(0)->mutable_slice();
  slice->mutable_dims(0)->set_size(64);
  slice->mutable_dims(1)->set_start(-1);
  std::string message = messageOf(plan);
  EXPECT_THAT(message, HasSubstr("weights[0] \"model.layers.0.self_attn.q_proj.weight\": slice.dims[0].size is 64, "
                                 "expected 32 (dimension 0 of buffer 0"));
  EXPECT_THAT(message, HasSubstr("slice.dims[1].start is -1, expected >= 0"));
}

// A tensor-parallel rank's share of each part of a stacked tensor (Gated DeltaNet's convolution):
// windows of the whole tensor whose rows fill the buffer in order.
TEST_F(PlanValidatorTest, PiecesFillTheBufferFromTheWholeTensor) {
  WeightBinding *binding = rank0().mutable_weights(0); // buffer [32, 64]
  binding->clear_slice();
  binding->add_whole_shape(64);
  binding->add_whole_shape(64);
  auto piece = [&](int64_t start, int64_t rows) {
    Slice *p = binding->add_pieces();
    p->add_dims()->set_start(start);
    p->mutable_dims(0)->set_size(rows);
    p->add_dims()->set_size(64);
    return p;
  };
  piece(0, 16);
  Slice *second = piece(32, 16);
  EXPECT_EQ(messageOf(plan), "OK");
  second->mutable_dims(0)->set_size(8);
  EXPECT_THAT(messageOf(plan), HasSubstr("pieces hold 24 rows, buffer 0"));
  second->mutable_dims(0)->set_size(16);
  second->mutable_dims(0)->set_start(56);
  EXPECT_THAT(messageOf(plan), HasSubstr("pieces[1].dims[0] is 56+16, outside the tensor's 64"));
  second->mutable_dims(0)->set_start(32);
  binding->mutable_slice()->add_dims()->set_size(32);
  EXPECT_THAT(messageOf(plan), HasSubstr("pieces need a buffer of rank >= 1 with whole_shape of its rank, and no slice"));
}

// A tp rank other than 0 binds the bias of a partial sum as zeros: no tensor window with it.
TEST_F(PlanValidatorTest, ZerosBindNoWindow) {
  WeightBinding *binding = rank0().mutable_weights(0); // buffer [32, 64]
  binding->clear_slice();
  binding->set_zeros(true);
  EXPECT_EQ(messageOf(plan), "OK");
  binding->mutable_slice()->add_dims()->set_size(32);
  binding->mutable_slice()->add_dims()->set_size(64);
  EXPECT_THAT(messageOf(plan), HasSubstr("zeros binds no tensor: it takes no slice, pieces, {expert} or experts"));
}

TEST_F(PlanValidatorTest, ExpertSliceSkipsTheExpertDimension) {
  Slice *slice = rank0().mutable_weights(1)->mutable_slice();
  for (int64_t size : {16, 64}) {
    Slice::Range *range = slice->add_dims();
    range->set_size(size);
  }
  EXPECT_EQ(messageOf(plan), "OK");
  slice->add_dims()->set_size(1);
  EXPECT_THAT(messageOf(plan), HasSubstr("slice has 3 dims, expected 2"));
}

TEST_F(PlanValidatorTest, RejectsLoraTensorWithWrongRoles) {
  LoraTensor *tensor = plan.mutable_lora()->mutable_tensors(0);
  tensor->set_grad(6);
  tensor->set_adam_v(4);
  std::string message = messageOf(plan);
  std::string where = "lora.tensors[0] \"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight\": ";
  EXPECT_THAT(message, HasSubstr(where + "grad is buffer 6 \"q_proj.lora_A.adam_m\" of role optimizer_state, "
                                         "expected gradient"));
  EXPECT_THAT(message, HasSubstr(where + "adam_v is buffer 4 \"q_proj.lora_A.grad\" of role gradient, expected "
                                         "optimizer_state"));
}

TEST_F(PlanValidatorTest, RejectsLoraTensorWithMismatchedShapes) {
  plan.mutable_lora()->mutable_tensors(0)->set_adam_m(8);
  EXPECT_THAT(messageOf(plan), HasSubstr("lora_A.weight\": adam_m buffer 8 \"q_proj.lora_B.adam_m\" has shape [32,4], "
                                         "expected the param's shape [4,64]"));
}

TEST_F(PlanValidatorTest, AcceptsATensorParallelPartAndRejectsAWindowOfAnotherSize) {
  Slice *slice = plan.mutable_lora()->mutable_tensors(0)->mutable_slice(); // lora_A [4, 64]
  for (int64_t size : {4, 64})
    slice->add_dims()->set_size(size);
  slice->mutable_dims(1)->set_start(64); // the second half of a [4, 128] tensor
  EXPECT_EQ(messageOf(plan), "OK");
  slice->mutable_dims(1)->set_size(32);
  EXPECT_THAT(messageOf(plan), HasSubstr("lora_A.weight\": slice has 2 dims, expected the window of the param "
                                         "[4,64] (start >= 0, its size in every dimension)"));
}

TEST_F(PlanValidatorTest, RejectsLoraTensorOnAMissingRankOrBuffer) {
  plan.mutable_lora()->mutable_tensors(0)->set_rank(2);
  plan.mutable_lora()->mutable_tensors(1)->set_param(77);
  std::string message = messageOf(plan);
  EXPECT_THAT(message, HasSubstr("lora.tensors[0] \"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight\": "
                                 "rank is 2, expected in [0, 2)"));
  EXPECT_THAT(message, HasSubstr("lora.tensors[1] \"base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight\": "
                                 "param is 77: missing buffer"));
}

TEST_F(PlanValidatorTest, RejectsBadLoraHyperparameters) {
  plan.mutable_lora()->set_r(0);
  plan.mutable_lora()->clear_target_modules();
  std::string message = messageOf(plan);
  EXPECT_THAT(message, HasSubstr("lora.r is 0, expected > 0"));
  EXPECT_THAT(message, HasSubstr("lora.target_modules is empty"));
}

TEST_F(PlanValidatorTest, RejectsBadOptimizer) {
  Optimizer *opt = plan.mutable_optimizer();
  opt->set_kind("sgd");
  opt->set_lr(std::nan(""));
  opt->set_beta1(1.0);
  opt->set_eps(0);
  opt->set_warmup_steps(200);
  opt->set_schedule("linear");
  std::string message = messageOf(plan);
  EXPECT_THAT(message, StartsWith("invalid plan: 6 problem(s)\n"));
  EXPECT_THAT(message, HasSubstr("optimizer.kind is \"sgd\", expected \"adamw\""));
  EXPECT_THAT(message, HasSubstr("optimizer.lr is nan, expected > 0"));
  EXPECT_THAT(message, HasSubstr("optimizer.beta1 is 1, expected in [0, 1)"));
  EXPECT_THAT(message, HasSubstr("optimizer.eps is 0, expected > 0"));
  EXPECT_THAT(message, HasSubstr("optimizer.warmup_steps is 200, expected in [0, total_steps] = [0, 100]"));
  EXPECT_THAT(message, HasSubstr("optimizer.schedule is \"linear\", expected \"cosine\" or \"constant\""));
}

TEST_F(PlanValidatorTest, TrainingPlanNeedsAnOptimizer) {
  plan.clear_optimizer();
  EXPECT_THAT(messageOf(plan), HasSubstr("optimizer.kind is \"\", expected \"adamw\""));
}

TEST_F(PlanValidatorTest, CapsTheNumberOfMessages) {
  for (Buffer &buffer : *rank0().mutable_buffers())
    buffer.set_size_bytes(buffer.size_bytes() + 1);
  std::vector<std::string> problems = findPlanProblems(plan, 5);
  ASSERT_THAT(problems, SizeIs(6));
  EXPECT_EQ(problems.back(), "... and 11 more problem(s)");
  EXPECT_THAT(messageOf(plan), StartsWith("invalid plan: 16 problem(s)\n"));
}

// Corrupt bytes that still parse must give messages, never a crash, in both
// the validator and the text dump.
TEST(PlanValidatorRobustness, CorruptedPlansNeverCrash) {
  std::string bytes;
  ASSERT_TRUE(testing::makeValidPlan().SerializeToString(&bytes));
  std::mt19937 random(1234);
  google::protobuf::LogSilencer quiet; // corrupt strings fail UTF-8 checks loudly
  int rejected = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string corrupt = bytes;
    for (int flips = 1 + trial % 4; flips > 0; --flips)
      corrupt[random() % corrupt.size()] = static_cast<char>(random());
    Plan plan;
    if (!plan.ParseFromString(corrupt))
      continue;
    rejected += !validatePlan(plan).ok();
    EXPECT_FALSE(planToText(plan).empty());
  }
  EXPECT_GT(rejected, 100);
}

// A plan as large as a deep model's: 100k buffers reusing the bytes of an
// arena in turn, one step each. The overlap check must stay O(n log n).
TEST(PlanValidatorScale, HundredThousandBuffers) {
  constexpr int kBuffers = 100000;
  Plan plan;
  plan.set_version(kPlanVersion);
  plan.set_seq_len(8);
  plan.set_micro_batch(1);
  plan.set_recompute("none");
  Rank *rank = plan.add_ranks();
  rank->set_num_streams(1);
  Arena *arena = rank->add_arenas();
  arena->set_role(ACTIVATION);
  arena->set_size_bytes(4096);
  for (int i = 0; i < kBuffers; ++i) {
    Buffer *buffer = rank->add_buffers();
    buffer->set_id(i);
    buffer->set_role(ACTIVATION);
    buffer->set_dtype(F32);
    buffer->add_shape(256);
    buffer->set_size_bytes(1024);
    buffer->set_offset(1024 * (i % 4));
    buffer->set_first_step(i);
    buffer->set_last_step(std::min(i + 3, kBuffers - 1));
    Step *step = rank->add_steps();
    step->set_phase(FORWARD);
    step->set_layer(-1);
    step->mutable_launch()->set_kernel("copy");
    step->mutable_launch()->add_outputs(i);
  }
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(messageOf(plan), "OK");
  // One buffer living one step too long collides with the next user of its bytes.
  rank->mutable_buffers(500)->set_last_step(504);
  EXPECT_THAT(messageOf(plan), HasSubstr("rank 0, buffer 504 \"\": bytes [0, 1024) live 504..507 overlap buffer 500"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

} // namespace
} // namespace moec::plan
