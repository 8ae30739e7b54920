#include "common/coordinator_targets.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"

namespace mesh {
namespace coordinator_targets_test {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(SplitCoordinatorTargets, SplitsAtCommasAndTrims) {
  EXPECT_THAT(SplitCoordinatorTargets("a:1"), ElementsAre("a:1"));
  EXPECT_THAT(SplitCoordinatorTargets(" a:1 , b:2,,c:3 "), ElementsAre("a:1", "b:2", "c:3"));
  EXPECT_TRUE(SplitCoordinatorTargets(" , ").empty());
  // A gRPC URI is one channel with an address list of its own.
  EXPECT_THAT(SplitCoordinatorTargets("ipv4:127.0.0.1:1,127.0.0.1:2"),
              ElementsAre("ipv4:127.0.0.1:1,127.0.0.1:2"));
  EXPECT_THAT(SplitCoordinatorTargets("dns:///mesh:7450"), ElementsAre("dns:///mesh:7450"));
}

TEST(MayNameSeveralReplicas, NamesAndAddressListsButNotOneAddress) {
  EXPECT_TRUE(MayNameSeveralReplicas("mesh-coordinator:7450"));
  EXPECT_TRUE(MayNameSeveralReplicas("coord.example.com:7450"));
  EXPECT_TRUE(MayNameSeveralReplicas("dns:///mesh:7450"));
  EXPECT_TRUE(MayNameSeveralReplicas("ipv4:10.0.0.1:7450,10.0.0.2:7450"));
  EXPECT_TRUE(MayNameSeveralReplicas("ipv6:[::1]:7450,[::2]:7450"));
  EXPECT_FALSE(MayNameSeveralReplicas("127.0.0.1:7450"));
  EXPECT_FALSE(MayNameSeveralReplicas("[::1]:7450"));
  EXPECT_FALSE(MayNameSeveralReplicas("localhost:7450"));
  EXPECT_FALSE(MayNameSeveralReplicas("LocalHost:7450"));
  EXPECT_FALSE(MayNameSeveralReplicas("ipv4:10.0.0.1:7450"));
  EXPECT_FALSE(MayNameSeveralReplicas("unix:/run/mesh.sock"));
  EXPECT_FALSE(MayNameSeveralReplicas("unix-abstract:mesh"));
}

TEST(LeaderTracker, RotatesOncePerFailure) {
  LeaderTracker tracker({"a", "b", "c"});
  EXPECT_EQ(tracker.current(), 0u);
  tracker.Rotate(0);
  EXPECT_EQ(tracker.current(), 1u);
  // A second caller that also failed on replica 0 finds it moved on already.
  tracker.Rotate(0);
  EXPECT_EQ(tracker.current(), 1u);
  tracker.Rotate(1);
  tracker.Rotate(2);
  EXPECT_EQ(tracker.current(), 0u);
  EXPECT_EQ(tracker.target(tracker.current()), "a");
}

std::shared_ptr<grpc::Channel> Channel(const std::string& target) {
  return grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
}

TEST(FindLeader, OneTargetIsTheLeaderWithoutACall) {
  int made = 0;
  absl::StatusOr<std::string> leader = FindLeader(
      {"127.0.0.1:1"},
      [&](const std::string& target) -> absl::StatusOr<std::shared_ptr<grpc::Channel>> {
        ++made;
        return Channel(target);
      },
      absl::Now());
  ASSERT_TRUE(leader.ok()) << leader.status();
  EXPECT_EQ(*leader, "127.0.0.1:1");
  EXPECT_EQ(made, 0);
}

TEST(FindLeader, NoneServingIsUnavailableByTheDeadlineNamingEach) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> leader = FindLeader(
      {"127.0.0.1:1", "127.0.0.1:2"},
      [](const std::string& target) -> absl::StatusOr<std::shared_ptr<grpc::Channel>> {
        return Channel(target);
      },
      start + absl::Seconds(1));
  EXPECT_EQ(leader.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(leader.status().message(), HasSubstr("127.0.0.1:1"));
  EXPECT_THAT(leader.status().message(), HasSubstr("127.0.0.1:2"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

TEST(FindLeader, NoTargetsAndChannelErrorsAreReturned) {
  auto never = [](const std::string&) -> absl::StatusOr<std::shared_ptr<grpc::Channel>> {
    return absl::FailedPreconditionError("unreadable CA");
  };
  EXPECT_EQ(FindLeader({}, never, absl::Now()).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FindLeader({"a:1", "b:2"}, never, absl::Now()).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace coordinator_targets_test
}  // namespace mesh
