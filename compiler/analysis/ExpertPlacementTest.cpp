//===- ExpertPlacementTest.cpp - placements read, measured, balanced ------===//

#include "compiler/analysis/ExpertPlacement.h"

#include <cstdio>
#include <fstream>

#include "gtest/gtest.h"

namespace moec::analysis {
namespace {

std::string writeTemp(const std::string &name, const std::string &text) {
  const char *dir = std::getenv("TEST_TMPDIR");
  std::string path = std::string(dir ? dir : "/tmp") + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// Two heavy experts and six light ones over two ranks: consecutive ranges put both heavy
// experts on rank 0 (100 + 90 + 10 + 10 = 210 of 240 tokens: 1.75x the mean).
const std::vector<int64_t> kLoad = {100, 90, 10, 10, 10, 10, 5, 5};

TEST(ExpertPlacementTest, ConsecutiveRangesOfASkewedLoad) {
  EXPECT_DOUBLE_EQ(rankImbalance(kLoad, {}, 2), 210.0 * 2 / 240);
}

TEST(ExpertPlacementTest, BalancedPlacementSplitsTheHeavyExperts) {
  // By hand, busiest first to the least loaded rank with room (ties: the lower rank):
  // 0 -> r0 (100), 1 -> r1 (90), 2 -> r1 (100), 3 -> r0 (110), 4 -> r1 (110), 5 -> r0 (120),
  // 6 -> r1 (115, full), 7 -> r0 (125).
  std::vector<int64_t> placement = balancedPlacement(kLoad, 2, 4);
  EXPECT_EQ(placement, (std::vector<int64_t>{0, 3, 5, 7, 1, 2, 4, 6}));
  EXPECT_DOUBLE_EQ(rankImbalance(kLoad, placement, 2), 125.0 * 2 / 240);
}

TEST(ExpertPlacementTest, SpareSlotsReplicateTheBusiestExperts) {
  // Five slots per rank for eight experts: two copies. By hand: copies go to the most tokens per
  // copy, 0 (100 -> 50 a copy), then 1 (90 -> 45). Copies busiest first: 0 (50) -> r0, 0 -> r1
  // (not r0: it holds 0), 1 (45) -> r0 (50 vs 50: the lower), 1 -> r1, then 2..5 (10 each)
  // alternate r0, r1 (95 both), r0, r1, then 6, 7 (5 each) fill r0 (110), r1 (110).
  std::vector<int64_t> placement = balancedPlacement(kLoad, 2, 5);
  EXPECT_EQ(placement, (std::vector<int64_t>{0, 1, 2, 4, 6, 0, 1, 3, 5, 7}));
  EXPECT_DOUBLE_EQ(rankImbalance(kLoad, placement, 2), 1.0);
  // One expert holding most tokens: without replicas the best is one rank with it alone.
  std::vector<int64_t> hot = {600, 10, 10, 10, 10, 10, 10, 10};
  EXPECT_DOUBLE_EQ(rankImbalance(hot, balancedPlacement(hot, 2, 4), 2), 630.0 * 2 / 670);
  EXPECT_DOUBLE_EQ(rankImbalance(hot, balancedPlacement(hot, 2, 5), 2), 335.0 * 2 / 670);
  EXPECT_TRUE(balancedPlacement(hot, 2, 3).empty()); // six slots for eight experts
}

TEST(ExpertPlacementTest, OtherRanksPerTokenWithoutReplicas) {
  // Top-2 of 8 experts, 4 a rank: the other rank gets a token unless both its experts are
  // here, 1 - (4/8)(3/7) = 11/14; the same for the placement that lists those ranges.
  EXPECT_DOUBLE_EQ(otherRanksPerToken(8, 2, 2, {}), 11.0 / 14);
  EXPECT_DOUBLE_EQ(otherRanksPerToken(8, 2, 2, {4, 5, 6, 7, 0, 1, 2, 3}), 11.0 / 14);
  EXPECT_DOUBLE_EQ(otherRanksPerToken(8, 2, 1, {}), 0.0);
}

TEST(ExpertPlacementTest, OtherRanksPerTokenWithReplicas) {
  // Top-1 of 4 experts, rank 0 holds 0,1,2 and rank 1 holds 2,3,0: a token leaves its rank
  // only for the one expert that is not there (3 from rank 0, 1 from rank 1): 1/4 (consecutive
  // ranges would send half).
  EXPECT_DOUBLE_EQ(otherRanksPerToken(4, 1, 2, {0, 1, 2, 2, 3, 0}), 0.25);
  // Three ranks {0,1} {2,3} {3,0}: rank 0 sends expert 2 to rank 1 and expert 3 half to rank 1,
  // half to rank 2 (0.5 a token); rank 1 sends 1 to rank 0 and 0 half to each (0.5); rank 2
  // sends 1 to rank 0 and 2 to rank 1 (0.5).
  EXPECT_DOUBLE_EQ(otherRanksPerToken(4, 1, 3, {0, 1, 2, 3, 3, 0}), 0.5);
  // Top-2 of 8 over {0,1,2} {2,3,4} {4,5,6} {6,7,0}: a token's copies pick the same replica
  // index (t mod 2), so its two experts' destinations are not independent. Rank 0, even t: 3 and
  // 4 go to rank 1, 5 and 6 to rank 2, 7 to rank 3; a rank that m experts send to gets the token
  // with 1 - C(8 - m, 2)/C(8, 2): (26 + 26 + 14)/56; odd t: 3 | 4, 5 | 6, 7, the same 66/56.
  // Rank 1: even t 0, 1 | 5, 6 | 7 (66/56), odd t 1 | 5 | 0, 6, 7 (64/56); rank 2 alike mirrored
  // (64/56, 66/56); rank 3: 66/56 both. Mean: (132 + 130 + 130 + 132) / 448.
  EXPECT_DOUBLE_EQ(otherRanksPerToken(8, 2, 4, {0, 1, 2, 2, 3, 4, 4, 5, 6, 6, 7, 0}), 524.0 / 448);
}

TEST(ExpertPlacementTest, EveryRankHoldsItsShare) {
  std::vector<int64_t> load(128);
  for (size_t e = 0; e < load.size(); ++e)
    load[e] = static_cast<int64_t>((e * 37) % 101) + (e < 4 ? 5000 : 0);
  std::vector<int64_t> placement = balancedPlacement(load, 8, 16);
  ASSERT_EQ(placement.size(), 128u);
  std::vector<int> seen(128, 0);
  for (int64_t e : placement)
    ++seen.at(static_cast<size_t>(e));
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), 128);
  EXPECT_LT(rankImbalance(load, placement, 8), rankImbalance(load, {}, 8));
}

TEST(ExpertPlacementTest, ReadsAPlacementFile) {
  ExpertPlacement placement;
  std::string error;
  ASSERT_TRUE(readExpertPlacement(writeTemp("p.json", R"({"layers": {"1": [[3, 0], [1, 2]], "2": [[0, 1], [2, 3]]}})"),
                                  2, placement, error))
      << error;
  EXPECT_EQ(placement.at(1), (std::vector<int64_t>{3, 0, 1, 2}));
  EXPECT_EQ(placement.at(2), (std::vector<int64_t>{0, 1, 2, 3}));
}

TEST(ExpertPlacementTest, PlacementFileErrorsNameTheField) {
  ExpertPlacement placement;
  std::string error;
  std::string path = writeTemp("bad.json", R"({"layers": {"1": [[3, 0], [1]]}})");
  EXPECT_FALSE(readExpertPlacement(path, 2, placement, error));
  EXPECT_EQ(error, path + ": field 'layers.1': every ep rank must list the same number of experts");
  path = writeTemp("ranks.json", R"({"layers": {"1": [[3, 0, 1, 2]]}})");
  EXPECT_FALSE(readExpertPlacement(path, 2, placement, error));
  EXPECT_EQ(error, path + ": field 'layers.1': expected 2 lists of experts (one per ep rank)");
  path = writeTemp("key.json", R"({"layers": {"mlp": [[0], [1]]}})");
  EXPECT_FALSE(readExpertPlacement(path, 2, placement, error));
  EXPECT_EQ(error, path + ": field 'layers.mlp': expected a layer index as the key");
  EXPECT_FALSE(readExpertPlacement(writeTemp("none.json", "[]"), 2, placement, error));
  EXPECT_NE(error.find("expected {\"layers\""), std::string::npos) << error;
}

TEST(ExpertPlacementTest, SumsTheLoadOfEveryMetricsLine) {
  std::map<int64_t, std::vector<int64_t>> load;
  std::string error;
  std::string path = writeTemp("metrics.jsonl",
                               R"({"step":1,"loss":2.0,"expert_load":{"1":{"tokens":[3,1],"imbalance":1.5}}})"
                               "\n"
                               R"({"step":2,"loss":1.9,"expert_load":{"1":{"tokens":[2,4],"imbalance":1.3}}})"
                               "\n");
  ASSERT_TRUE(readExpertLoad(path, load, error)) << error;
  EXPECT_EQ(load.at(1), (std::vector<int64_t>{5, 5}));
  load.clear();
  path = writeTemp("notmetrics.jsonl", "{\"step\":1}\n");
  EXPECT_FALSE(readExpertLoad(path, load, error));
  EXPECT_EQ(error, path + ":1: no 'expert_load' (expected moe-run's metrics.jsonl)");
}

} // namespace
} // namespace moec::analysis
