//===- LaunchEnvTest.cpp - launcher variables, through a fake getenv ------===//

#include "runtime/comm/LaunchEnv.h"

#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace moec::runtime::comm {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

absl::StatusOr<LaunchEnv> readFrom(const std::map<std::string, std::string> &vars) {
  return readLaunchEnv([&](const char *name) -> const char * {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

std::string errorOf(const std::map<std::string, std::string> &vars) {
  absl::StatusOr<LaunchEnv> env = readFrom(vars);
  EXPECT_FALSE(env.ok());
  return env.ok() ? "" : std::string(env.status().message());
}

TEST(LaunchEnvTest, NothingSetIsOneRank) {
  absl::StatusOr<LaunchEnv> env = readFrom({{"PATH", "/bin"}, {"MASTER_PORT", "junk"}});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->rank, 0);
  EXPECT_EQ(env->worldSize, 1);
  EXPECT_EQ(env->localRank, 0);
  EXPECT_EQ(env->source, "none");
}

TEST(LaunchEnvTest, Torchrun) {
  absl::StatusOr<LaunchEnv> env = readFrom({{"RANK", "5"},
                                            {"WORLD_SIZE", "16"},
                                            {"LOCAL_RANK", "1"},
                                            {"MASTER_ADDR", "node17"},
                                            {"MASTER_PORT", "12345"}});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->rank, 5);
  EXPECT_EQ(env->worldSize, 16);
  EXPECT_EQ(env->localRank, 1);
  EXPECT_EQ(env->masterAddr, "node17");
  EXPECT_EQ(env->masterPort, 12345);
  EXPECT_EQ(env->source, "torchrun");
}

TEST(LaunchEnvTest, TorchrunDefaults) {
  absl::StatusOr<LaunchEnv> env = readFrom({{"RANK", "1"}, {"WORLD_SIZE", "2"}});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->localRank, 1);
  EXPECT_EQ(env->masterAddr, "127.0.0.1");
  EXPECT_EQ(env->masterPort, 29500);
}

TEST(LaunchEnvTest, TorchrunWinsOverSlurm) {
  // torchrun started by srun: both sets are there, torchrun's describes this process.
  absl::StatusOr<LaunchEnv> env = readFrom({{"RANK", "3"},
                                            {"WORLD_SIZE", "8"},
                                            {"LOCAL_RANK", "3"},
                                            {"SLURM_PROCID", "0"},
                                            {"SLURM_NTASKS", "1"},
                                            {"SLURM_LOCALID", "0"}});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->source, "torchrun");
  EXPECT_EQ(env->rank, 3);
  EXPECT_EQ(env->worldSize, 8);
}

TEST(LaunchEnvTest, Slurm) {
  absl::StatusOr<LaunchEnv> env = readFrom({{"SLURM_PROCID", "9"},
                                            {"SLURM_NTASKS", "16"},
                                            {"SLURM_LOCALID", "1"},
                                            {"SLURM_LAUNCH_NODE_IPADDR", "10.0.0.7"}});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->rank, 9);
  EXPECT_EQ(env->worldSize, 16);
  EXPECT_EQ(env->localRank, 1);
  EXPECT_EQ(env->masterAddr, "10.0.0.7");
  EXPECT_EQ(env->masterPort, 29500);
  EXPECT_EQ(env->source, "slurm");
}

TEST(LaunchEnvTest, SlurmMasterAddrWins) {
  absl::StatusOr<LaunchEnv> env = readFrom({{"SLURM_PROCID", "0"},
                                            {"SLURM_NTASKS", "2"},
                                            {"SLURM_LOCALID", "0"},
                                            {"SLURM_LAUNCH_NODE_IPADDR", "10.0.0.7"},
                                            {"MASTER_ADDR", "10.0.0.9"},
                                            {"MASTER_PORT", "40000"}});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->masterAddr, "10.0.0.9");
  EXPECT_EQ(env->masterPort, 40000);
}

TEST(LaunchEnvTest, SlurmWithoutAnAddress) {
  EXPECT_THAT(errorOf({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}}),
              AllOf(HasSubstr("MASTER_ADDR"), HasSubstr("SLURM_LAUNCH_NODE_IPADDR")));
}

TEST(LaunchEnvTest, SlurmAllocationShellIsOneRank) {
  // An salloc shell or a batch script without srun: SLURM_NTASKS alone is no launch.
  absl::StatusOr<LaunchEnv> env = readFrom({{"SLURM_NTASKS", "8"}, {"SLURM_JOB_ID", "42"}});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->source, "none");
  EXPECT_EQ(env->worldSize, 1);
}

TEST(LaunchEnvTest, SlurmNeedsLocalId) {
  EXPECT_THAT(errorOf({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"MASTER_ADDR", "a"}}),
              HasSubstr("SLURM_LOCALID is not set"));
}

TEST(LaunchEnvTest, OpenMpi) {
  absl::StatusOr<LaunchEnv> env = readFrom(
      {{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->rank, 2);
  EXPECT_EQ(env->worldSize, 4);
  EXPECT_EQ(env->localRank, 0);
  EXPECT_EQ(env->masterAddr, "127.0.0.1");
  EXPECT_EQ(env->masterPort, 29500);
  EXPECT_EQ(env->source, "openmpi");
}

TEST(LaunchEnvTest, NonNumeric) {
  EXPECT_THAT(errorOf({{"RANK", "one"}, {"WORLD_SIZE", "2"}}),
              AllOf(HasSubstr("RANK=\"one\""), HasSubstr("an integer in [0, 2)")));
  EXPECT_THAT(errorOf({{"RANK", "1x"}, {"WORLD_SIZE", "2"}}), HasSubstr("RANK=\"1x\""));
  EXPECT_THAT(errorOf({{"RANK", "0"}, {"WORLD_SIZE", "two"}}),
              AllOf(HasSubstr("WORLD_SIZE=\"two\""), HasSubstr("integer >= 1")));
  EXPECT_THAT(errorOf({{"RANK", "0"}, {"WORLD_SIZE", "99999999999999999999"}}), HasSubstr("WORLD_SIZE="));
  EXPECT_THAT(errorOf({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "http"}}),
              AllOf(HasSubstr("MASTER_PORT=\"http\""), HasSubstr("[1, 65535]")));
  EXPECT_THAT(errorOf({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}),
              HasSubstr("MASTER_PORT=\"70000\""));
}

TEST(LaunchEnvTest, RankOutOfRange) {
  EXPECT_THAT(errorOf({{"RANK", "2"}, {"WORLD_SIZE", "2"}}),
              AllOf(HasSubstr("RANK=\"2\""), HasSubstr("[0, 2)"), HasSubstr("WORLD_SIZE=2")));
  EXPECT_THAT(errorOf({{"RANK", "-1"}, {"WORLD_SIZE", "2"}}), HasSubstr("RANK=\"-1\""));
  EXPECT_THAT(errorOf({{"OMPI_COMM_WORLD_RANK", "0"},
                       {"OMPI_COMM_WORLD_SIZE", "2"},
                       {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}}),
              AllOf(HasSubstr("OMPI_COMM_WORLD_LOCAL_RANK=\"2\""), HasSubstr("on its node")));
}

TEST(LaunchEnvTest, WorldBelowOne) {
  EXPECT_THAT(errorOf({{"RANK", "0"}, {"WORLD_SIZE", "0"}}),
              AllOf(HasSubstr("WORLD_SIZE=\"0\""), HasSubstr("number of processes")));
  EXPECT_THAT(errorOf({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "-3"}}), HasSubstr("SLURM_NTASKS=\"-3\""));
}

TEST(LaunchEnvTest, PartialSet) {
  EXPECT_THAT(errorOf({{"RANK", "0"}}), AllOf(HasSubstr("RANK is set"), HasSubstr("WORLD_SIZE is not")));
  EXPECT_THAT(errorOf({{"WORLD_SIZE", "4"}}),
              AllOf(HasSubstr("WORLD_SIZE is set"), HasSubstr("RANK is not")));
  EXPECT_THAT(errorOf({{"SLURM_PROCID", "0"}}), HasSubstr("SLURM_NTASKS is not"));
  EXPECT_THAT(errorOf({{"OMPI_COMM_WORLD_SIZE", "4"}}), HasSubstr("OMPI_COMM_WORLD_RANK is not"));
  // An empty variable is an unset one.
  EXPECT_THAT(errorOf({{"RANK", "0"}, {"WORLD_SIZE", ""}}), HasSubstr("WORLD_SIZE is not"));
}

} // namespace
} // namespace moec::runtime::comm
