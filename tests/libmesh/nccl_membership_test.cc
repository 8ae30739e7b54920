// In-place recovery's memberships on the NCCL backend, over the scripted
// NcclApi (fake_nccl_api.h): NewMembership makes a communicator of the
// members from a brokered unique ID, shrinks it with ncclCommShrink when
// members are lost (NCCL >= 2.27), shares it when the members stay, and
// NewGroupsWithin splits the members' groups from it. Each case asserts the
// result, the NCCL calls made in order, and that nothing a real NCCL would
// punish happened (the fake's violations: a call after ncclCommAbort, an
// abort under an unpublished child, a shrink that excludes the caller).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "backends/nccl/nccl_factory.h"
#include "backends/nccl/unique_id_broker.h"
#include "mesh/process_group_nccl.h"
#include "tests/libmesh/fake_nccl_api.h"
#include "tests/libmesh/nccl_seam_test_util.h"

namespace mesh::nccl {
namespace nccl_seam_test {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using testing::FakeNcclApi;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::StartsWith;

// The brokered key of a membership's communicator (a members-only call).
std::string MembershipKey(const std::string& family) {
  return absl::StrCat("nccl/uid/members/", family, "/0");
}

GroupSpec MembershipOf(const std::string& family, std::vector<int> ranks) {
  return GroupSpec{family, 0, std::move(ranks)};
}

class NcclMembershipTest : public ::testing::Test {
 protected:
  void TearDown() override {
    factory_.reset();
    EXPECT_THAT(api_.violations(), IsEmpty());
  }

  // Rank `rank` of a world of 4, its broker already holding the unique IDs
  // of the memberships `families` (as their first members would have
  // published them).
  ProcessGroupFactory& Factory(int rank, const std::vector<std::string>& families = {"e1/m"},
                               NcclProcessGroupFactoryOptions options = Options(4)) {
    options.world_rank = rank;
    auto broker = std::make_unique<MapBroker>();
    for (const std::string& family : families) broker->map[MembershipKey(family)] = IdBytes('m');
    broker_ = broker.get();
    auto factory = CreateNcclFactory(std::move(options), std::move(broker), api_);
    EXPECT_TRUE(factory.ok()) << factory.status();
    factory_ = *std::move(factory);
    return *factory_;
  }

  int At(const std::string& entry) {
    const int index = api_.LogIndex(entry);
    EXPECT_GE(index, 0) << entry << " is not in the log";
    return index;
  }
  int Count(const std::string& prefix) {
    int n = 0;
    for (const std::string& entry : api_.log()) n += entry.rfind(prefix, 0) == 0 ? 1 : 0;
    return n;
  }

  FakeNcclApi api_;  // Declared first: outlives the factory.
  MapBroker* broker_ = nullptr;
  std::unique_ptr<NcclProcessGroupFactory> factory_;
};

TEST_F(NcclMembershipTest, AFirstMembershipIsBrokeredAndItsGroupsAreSplitFromIt) {
  ProcessGroupFactory& factory = Factory(/*rank=*/1);
  auto membership = factory.NewMembership(MembershipOf("e1/m", {0, 1, 2, 3}), nullptr);
  ASSERT_TRUE(membership.ok()) << membership.status();
  EXPECT_EQ((*membership)->ranks(), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ((*membership)->family(), "e1/m");
  EXPECT_GE(At("CommInitRankConfig(e1/m/0)"), 0);
  EXPECT_EQ(broker_->fetched, std::vector<std::string>{MembershipKey("e1/m")});

  // A (2, 2) dp x tp mesh: rank 1 is in dp group 1 ({1, 3}) and tp group 0
  // ({0, 1}). Both come from splits of the membership's communicator, and
  // no further unique ID is exchanged.
  api_.ScriptSplit({.child = {.count = 2, .rank = 0}});
  api_.ScriptSplit({.child = {.count = 2, .rank = 1}});
  auto groups = factory.NewGroupsWithin(
      **membership, {GroupSpec{"e1/dp", 1, {1, 3}}, GroupSpec{"e1/tp", 0, {0, 1}}});
  ASSERT_TRUE(groups.ok()) << groups.status();
  ASSERT_EQ(groups->size(), 2u);
  EXPECT_EQ((*groups)[0]->name(), "e1/dp/1");
  EXPECT_EQ((*groups)[0]->rank(), 0);
  EXPECT_EQ((*groups)[1]->name(), "e1/tp/0");
  EXPECT_EQ((*groups)[1]->rank(), 1);
  EXPECT_EQ(Count("CommSplit(e1/m/0)"), 2);
  // Color: the group's index in its family; key: the rank's place in it.
  EXPECT_EQ(api_.split_args(),
            (std::vector<std::string>{"e1/m/0: color 1, key 0", "e1/m/0: color 0, key 1"}));
  EXPECT_EQ(Count("CommInitRankConfig("), 2) << "the world's and the membership's only";
  EXPECT_EQ(broker_->fetched.size(), 1u);
  FakeDeviceBuffer buffer;
  EXPECT_TRUE((*groups)[0]->AllReduce(buffer.tensor(), ReduceOp::kSum).ok());
  // No op ever runs on the membership's own communicator.
  EXPECT_THAT(api_.log(), Not(Contains(StartsWith("AllReduce(e1/m/0"))));
}

TEST_F(NcclMembershipTest, LosingAMemberShrinksTheCommunicatorWithoutAUniqueId) {
  ProcessGroupFactory& factory = Factory(/*rank=*/3);
  auto first = factory.NewMembership(MembershipOf("e1/m", {0, 1, 2, 3}), nullptr);
  ASSERT_TRUE(first.ok()) << first.status();
  // Rank 2 is lost: the survivors derive theirs from the first. Rank 3
  // becomes rank 2 of three, which the factory checks against what NCCL
  // made (the fake derives the child's shape from the exclusions).
  auto shrunk = factory.NewMembership(MembershipOf("e2/m", {0, 1, 3}), *first);
  ASSERT_TRUE(shrunk.ok()) << shrunk.status();
  EXPECT_GE(At("CommShrink(e1/m/0, excluding 2, abort)"), 0);
  EXPECT_LT(api_.LogIndex("CommInitRankConfig(e2/m/0)"), 0);
  EXPECT_EQ(broker_->fetched, std::vector<std::string>{MembershipKey("e1/m")});

  // The first is released with ncclCommAbort (a local call; a finalize
  // could wait on the lost rank), the shrunk one stays.
  first->reset();
  EXPECT_TRUE(api_.aborted("e1/m/0"));
  EXPECT_FALSE(api_.destroyed("e1/m/0"));
  EXPECT_FALSE(api_.aborted("e2/m/0"));
  api_.ScriptSplit({.child = {.count = 3, .rank = 2}});
  auto groups = factory.NewGroupsWithin(**shrunk, {GroupSpec{"e2/dp", 0, {0, 1, 3}}});
  ASSERT_TRUE(groups.ok()) << groups.status();
  EXPECT_EQ((*groups)[0]->rank(), 2);
  EXPECT_GE(At("CommSplit(e2/m/0)"), 0);
}

TEST_F(NcclMembershipTest, SeveralLostMembersAreExcludedInOneShrinkByTheirRanksInThePrevious) {
  ProcessGroupFactory& factory = Factory(/*rank=*/2);
  auto first = factory.NewMembership(MembershipOf("e1/m", {0, 1, 2, 3}), nullptr);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = factory.NewMembership(MembershipOf("e2/m", {1, 2, 3}), *first);
  ASSERT_TRUE(second.ok()) << second.status();
  // Ranks of the second's communicator are 0, 1, 2 for world ranks 1, 2, 3:
  // losing world ranks 1 and 3 excludes its ranks 0 and 2.
  auto third = factory.NewMembership(MembershipOf("e3/m", {2}), *second);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_LT(At("CommShrink(e1/m/0, excluding 0, abort)"),
            At("CommShrink(e2/m/0, excluding 0 2, abort)"));
}

TEST_F(NcclMembershipTest, TheSameMembersShareTheCommunicator) {
  ProcessGroupFactory& factory = Factory(/*rank=*/0);
  auto first = factory.NewMembership(MembershipOf("e1/m", {0, 1, 3}), nullptr);
  ASSERT_TRUE(first.ok()) << first.status();
  const size_t calls = api_.log().size();
  // A rebuild after a failed collective with nobody lost.
  auto again = factory.NewMembership(MembershipOf("e2/m", {0, 1, 3}), *first);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(api_.log().size(), calls) << "no NCCL call at all";
  EXPECT_EQ((*again)->family(), "e2/m");
  first->reset();
  EXPECT_FALSE(api_.aborted("e1/m/0")) << "the second still holds it";
  api_.ScriptSplit({.child = {.count = 3, .rank = 0}});
  auto groups = factory.NewGroupsWithin(**again, {GroupSpec{"e2/dp", 0, {0, 1, 3}}});
  ASSERT_TRUE(groups.ok()) << groups.status();
  EXPECT_GE(At("CommSplit(e1/m/0)"), 0);
  again->reset();
  EXPECT_TRUE(api_.aborted("e1/m/0"));
}

TEST_F(NcclMembershipTest, AGrowIsANewBrokeredCommunicatorAndAPreviousMissingAMemberIsRefused) {
  ProcessGroupFactory& factory = Factory(/*rank=*/1, {"e1/m", "e2/m"});
  auto small = factory.NewMembership(MembershipOf("e1/m", {0, 1, 3}), nullptr);
  ASSERT_TRUE(small.ok()) << small.status();
  // The replacement for rank 2 has no previous membership, so nobody may
  // derive from one: passing it anyway is a caller's error, named.
  auto refused = factory.NewMembership(MembershipOf("e2/m", {0, 1, 2, 3}), *small);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              AllOf(HasSubstr("rank 2"), HasSubstr("e1/m"), HasSubstr("e2/m")));
  auto grown = factory.NewMembership(MembershipOf("e2/m", {0, 1, 2, 3}), nullptr);
  ASSERT_TRUE(grown.ok()) << grown.status();
  EXPECT_GE(At("CommInitRankConfig(e2/m/0)"), 0);
  EXPECT_THAT(api_.log(), Not(Contains(StartsWith("CommShrink("))));
}

TEST_F(NcclMembershipTest, BeforeNccl227AShrinkIsABrokeredInit) {
  api_.set_version(NCCL_VERSION(2, 26, 5));
  ProcessGroupFactory& factory = Factory(/*rank=*/1, {"e1/m", "e2/m"});
  auto first = factory.NewMembership(MembershipOf("e1/m", {0, 1, 2, 3}), nullptr);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = factory.NewMembership(MembershipOf("e2/m", {0, 1, 3}), *first);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_THAT(api_.log(), Not(Contains(StartsWith("CommShrink("))));
  EXPECT_GE(At("CommInitRankConfig(e2/m/0)"), 0);
  EXPECT_EQ(broker_->fetched,
            (std::vector<std::string>{MembershipKey("e1/m"), MembershipKey("e2/m")}));
  // Its groups are still split from it.
  api_.ScriptSplit({.child = {.count = 3, .rank = 1}});
  ASSERT_TRUE(factory.NewGroupsWithin(**second, {GroupSpec{"e2/dp", 0, {0, 1, 3}}}).ok());
  EXPECT_GE(At("CommSplit(e2/m/0)"), 0);
}

TEST_F(NcclMembershipTest, WithoutSplitsAMembershipHoldsNoCommunicatorAndGroupsAreBrokered) {
  NcclProcessGroupFactoryOptions options = Options(4);
  options.group_creation = NcclGroupCreation::kUniqueIds;
  ProcessGroupFactory& factory = Factory(/*rank=*/0, {}, options);
  auto first = factory.NewMembership(MembershipOf("e1/m", {0, 1, 3}), nullptr);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_LT(api_.LogIndex("CommInitRankConfig(e1/m/0)"), 0);
  auto second = factory.NewMembership(MembershipOf("e2/m", {0, 3}), *first);
  ASSERT_TRUE(second.ok()) << second.status();
  auto groups = factory.NewGroupsWithin(**second, {GroupSpec{"e2/dp", 0, {0, 3}}});
  ASSERT_TRUE(groups.ok()) << groups.status();
  EXPECT_GE(At("CommInitRankConfig(e2/dp/0)"), 0);
  EXPECT_EQ(broker_->published, std::vector<std::string>{"nccl/uid/members/e2/dp/0"});
  EXPECT_THAT(api_.log(), Not(Contains(StartsWith("CommSplit("))));
  EXPECT_THAT(api_.log(), Not(Contains(StartsWith("CommShrink("))));
}

TEST_F(NcclMembershipTest, SplitsSharingResourcesMakeMembershipsWithoutACommunicator) {
  // NCCL lets the variable override every config: split children would share
  // the membership's abort flag, so aborting an old mesh's groups would
  // abort the membership too. Memberships then hold nothing and groups are
  // brokered.
  const char* before = std::getenv("NCCL_COMM_SPLIT_SHARE_RESOURCES");
  const std::string saved = before != nullptr ? before : "";
  ::setenv("NCCL_COMM_SPLIT_SHARE_RESOURCES", "1", 1);
  ProcessGroupFactory& factory = Factory(/*rank=*/0, {});
  auto membership = factory.NewMembership(MembershipOf("e1/m", {0, 3}), nullptr);
  auto groups = membership.ok()
                    ? factory.NewGroupsWithin(**membership, {GroupSpec{"e1/dp", 0, {0, 3}}})
                    : membership.status();
  if (before != nullptr) {
    ::setenv("NCCL_COMM_SPLIT_SHARE_RESOURCES", saved.c_str(), 1);
  } else {
    ::unsetenv("NCCL_COMM_SPLIT_SHARE_RESOURCES");
  }
  ASSERT_TRUE(membership.ok()) << membership.status();
  ASSERT_TRUE(groups.ok()) << groups.status();
  EXPECT_LT(api_.LogIndex("CommInitRankConfig(e1/m/0)"), 0);
  EXPECT_GE(At("CommInitRankConfig(e1/dp/0)"), 0);
  EXPECT_THAT(api_.log(), Not(Contains(StartsWith("CommSplit("))));
}

TEST_F(NcclMembershipTest, AShrinkPublishedLateIsAwaited) {
  ProcessGroupFactory& factory = Factory(/*rank=*/0);
  auto first = factory.NewMembership(MembershipOf("e1/m", {0, 1, 2, 3}), nullptr);
  ASSERT_TRUE(first.ok()) << first.status();
  // NCCL 2.28 returns ncclSuccess while the child's job still runs; the
  // child appears after a few polls of the parent and is then in progress.
  api_.ScriptSplit(
      {.parent_polls = 2, .publish_after_parent_polls = 3, .child = {.init_polls = 2}});
  auto shrunk = factory.NewMembership(MembershipOf("e2/m", {0, 3}), *first);
  ASSERT_TRUE(shrunk.ok()) << shrunk.status();
  EXPECT_LT(At("CommShrink(e1/m/0, excluding 1 2, abort)"), At("Publish(e2/m/0)"));
  EXPECT_EQ(api_.unpublished_splits(), 0);
}

TEST_F(NcclMembershipTest, AShrinkPastItsDeadlineAbortsTheParentOnlyOnceTheChildIsPublished) {
  NcclProcessGroupFactoryOptions options = Options(4);
  options.init_timeout = absl::Milliseconds(80);
  ProcessGroupFactory& factory = Factory(/*rank=*/0, {"e1/m"}, options);
  auto first = factory.NewMembership(MembershipOf("e1/m", {0, 1, 2, 3}), nullptr);
  ASSERT_TRUE(first.ok()) << first.status();
  // A survivor that never calls: NCCL's job never publishes the child.
  api_.ScriptSplit({.parent_polls = 0, .publish_after_parent_polls = -1});
  const absl::Time start = absl::Now();
  auto shrunk = factory.NewMembership(MembershipOf("e2/m", {0, 1, 3}), *first);
  ASSERT_FALSE(shrunk.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(shrunk.status().code(), absl::StatusCode::kDeadlineExceeded) << shrunk.status();
  EXPECT_THAT(std::string(shrunk.status().message()),
              AllOf(HasSubstr("ncclCommShrink"), HasSubstr("e2/m/0")));
  // Releasing it waits (up to the destroy timeout) for NCCL's job.
  std::thread late([&] {
    absl::SleepFor(absl::Milliseconds(30));  // Several watchdog passes.
    EXPECT_FALSE(api_.aborted("e1/m/0")) << "aborted while the shrunk child was unpublished";
    api_.PublishPendingSplits();  // NCCL's job finishes late.
  });
  first->reset();
  late.join();
  EXPECT_TRUE(api_.aborted("e1/m/0"));
  EXPECT_LT(At("CommAbort(e1/m/0)"), At("CommAbort(e2/m/0)"));
}

TEST_F(NcclMembershipTest, ASynchronousShrinkFailureAbortsTheParentAndNamesTheCall) {
  ProcessGroupFactory& factory = Factory(/*rank=*/0);
  auto first = factory.NewMembership(MembershipOf("e1/m", {0, 1, 2, 3}), nullptr);
  ASSERT_TRUE(first.ok()) << first.status();
  api_.ScriptSplit({.call_result = ncclRemoteError});
  auto shrunk = factory.NewMembership(MembershipOf("e2/m", {0, 1}), *first);
  ASSERT_FALSE(shrunk.ok());
  EXPECT_EQ(shrunk.status().code(), absl::StatusCode::kUnavailable) << shrunk.status();
  EXPECT_THAT(std::string(shrunk.status().message()), HasSubstr("ncclCommShrink of"));
  EXPECT_TRUE(api_.aborted("e1/m/0"));
  // A later shrink of the broken membership fails with that reason rather
  // than touching the aborted communicator.
  auto again = factory.NewMembership(MembershipOf("e3/m", {0, 1}), *first);
  ASSERT_FALSE(again.ok());
  EXPECT_THAT(std::string(again.status().message()), HasSubstr("failed shrink"));
}

TEST_F(NcclMembershipTest, AMembershipWhoseCommunicatorFailedCannotBeShrunk) {
  ProcessGroupFactory& factory = Factory(/*rank=*/0);
  auto first = factory.NewMembership(MembershipOf("e1/m", {0, 1, 2, 3}), nullptr);
  ASSERT_TRUE(first.ok()) << first.status();
  // The watchdog aborts a membership communicator with an asynchronous
  // error like any other.
  api_.SetAsyncError("e1/m/0", ncclRemoteError);
  ASSERT_TRUE(Eventually([&] { return api_.aborted("e1/m/0"); }));
  auto shrunk = factory.NewMembership(MembershipOf("e2/m", {0, 1}), *first);
  ASSERT_FALSE(shrunk.ok());
  EXPECT_EQ(shrunk.status().code(), absl::StatusCode::kUnavailable) << shrunk.status();
  EXPECT_THAT(std::string(shrunk.status().message()), HasSubstr("asynchronous NCCL error"));
  EXPECT_THAT(api_.log(), Not(Contains(StartsWith("CommShrink("))));
}

TEST_F(NcclMembershipTest, AbortAllAbortsTheMembershipAndLaterCallsGiveTheReason) {
  ProcessGroupFactory& factory = Factory(/*rank=*/0);
  auto first = factory.NewMembership(MembershipOf("e1/m", {0, 1, 2, 3}), nullptr);
  ASSERT_TRUE(first.ok()) << first.status();
  factory.AbortAll(absl::AbortedError("rank 3 (host-d) failed: exit code 1"));
  EXPECT_TRUE(api_.aborted("e1/m/0"));
  for (const auto& previous : {std::shared_ptr<Membership>(), *first}) {
    auto next = factory.NewMembership(MembershipOf("e2/m", {0, 1}), previous);
    ASSERT_FALSE(next.ok());
    EXPECT_EQ(next.status().code(), absl::StatusCode::kAborted) << next.status();
    EXPECT_THAT(std::string(next.status().message()), HasSubstr("rank 3 (host-d) failed"));
  }
  auto groups = factory.NewGroupsWithin(**first, {GroupSpec{"e1/dp", 0, {0, 1, 2, 3}}});
  ASSERT_FALSE(groups.ok());
  EXPECT_EQ(groups.status().code(), absl::StatusCode::kAborted) << groups.status();
  EXPECT_THAT(api_.log(), Not(Contains(StartsWith("CommSplit("))));
}

TEST_F(NcclMembershipTest, BadSpecsAreInvalidArgumentsNamingTheRanks) {
  ProcessGroupFactory& factory = Factory(/*rank=*/1);
  for (const std::vector<int>& ranks :
       {std::vector<int>{}, std::vector<int>{1, 0}, std::vector<int>{0, 2}, std::vector<int>{1, 4},
        std::vector<int>{1, 1}}) {
    auto membership = factory.NewMembership(MembershipOf("e1/m", ranks), nullptr);
    ASSERT_FALSE(membership.ok()) << absl::StrJoin(ranks, ",");
    EXPECT_EQ(membership.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(membership.status().message()), HasSubstr("membership 'e1/m'"));
  }
  auto membership = factory.NewMembership(MembershipOf("e1/m", {0, 1, 3}), nullptr);
  ASSERT_TRUE(membership.ok()) << membership.status();
  auto outside = factory.NewGroupsWithin(**membership, {GroupSpec{"e1/dp", 0, {1, 2}}});
  ASSERT_FALSE(outside.ok());
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(outside.status().message()),
              AllOf(HasSubstr("rank 2"), HasSubstr("membership 'e1/m'")));
  EXPECT_THAT(api_.log(), Not(Contains(StartsWith("CommSplit("))));
}

}  // namespace
}  // namespace nccl_seam_test
}  // namespace mesh::nccl
