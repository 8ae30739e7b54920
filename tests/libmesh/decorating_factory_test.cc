// DecoratingProcessGroupFactory::AbortGroupsWith (libmesh/src/decorating_factory.h),
// through the ProgressProcessGroupFactory the Runtime uses, over a
// hand-written inner factory that keeps every group it made: which groups a
// lost rank aborts (the world's included), and which it leaves alone (groups
// without it, groups their users dropped, groups made later).
#include "libmesh/src/decorating_factory.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "libmesh/src/progress_group.h"
#include "mesh/progress.h"
#include "tests/libmesh/fake_process_group.h"
#include "tests/util/status_matchers.h"

namespace mesh {
namespace decorating_factory_test {

using ::mesh::testing::IsOk;
using ::mesh::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::SizeIs;

using ::mesh::testing::FakeGroup;

using ::mesh::testing::FakeFactory;

// What in-place recovery passes when a heartbeat first names a lost rank.
absl::Status Lost(int rank) {
  return absl::AbortedError(
      absl::StrCat("job j1 generation 0: rank ", rank, " (host-b) lost: missed heartbeats"));
}

class DecoratingFactoryTest : public ::testing::Test {
 protected:
  // Rank 0 of a world of 4.
  DecoratingFactoryTest()
      : inner_(std::make_shared<FakeFactory>(/*rank=*/0, /*world_size=*/4)),
        factory_(std::make_shared<internal::ProgressProcessGroupFactory>(
            inner_, std::make_shared<ProgressRegistry>())) {}

  // The decorated groups of `specs`; empty, with the test failed, on error.
  std::vector<std::shared_ptr<ProcessGroup>> NewGroups(const std::vector<GroupSpec>& specs) {
    auto groups = factory_->NewGroups(specs);
    EXPECT_TRUE(groups.ok()) << groups.status();
    if (!groups.ok()) return {};
    return *std::move(groups);
  }

  const std::shared_ptr<FakeFactory> inner_;
  const std::shared_ptr<internal::ProgressProcessGroupFactory> factory_;
};

TEST_F(DecoratingFactoryTest, GroupsWithinAMembershipAreDecoratedAndAbortedButNotTheMembership) {
  auto membership = factory_->NewMembership(GroupSpec{"e1/m", 0, {0, 2, 3}}, nullptr);
  ASSERT_THAT(membership, IsOk());
  // The inner factory's own membership, not a wrapper: the backend derives
  // the next one from it.
  EXPECT_EQ((*membership)->family(), "e1/m");
  auto groups = factory_->NewGroupsWithin(**membership, {GroupSpec{"e1/dp", 0, {0, 2, 3}}});
  ASSERT_THAT(groups, IsOk());
  ASSERT_THAT(*groups, SizeIs(1));
  EXPECT_EQ(inner_->within(), std::vector<std::string>{"e1/m"});
  ASSERT_NE((*groups)[0], inner_->made("e1/dp/0")) << "decorated";
  factory_->AbortGroupsWith({2}, Lost(2));
  EXPECT_THAT((*groups)[0]->health(), StatusIs(absl::StatusCode::kAborted, HasSubstr("rank 2")));
  // A later membership of the survivors derives from the one it held.
  auto survivors = factory_->NewMembership(GroupSpec{"e2/m", 0, {0, 3}}, *membership);
  EXPECT_THAT(survivors, IsOk());
}

TEST_F(DecoratingFactoryTest, AbortsTheGroupsThatIncludeAListedRankWithTheGivenReason) {
  std::vector<std::shared_ptr<ProcessGroup>> groups =
      NewGroups({GroupSpec{"mesh/dp", 0, {0, 2}}, GroupSpec{"mesh/tp", 0, {0, 1}},
                 GroupSpec{"mesh/pp", 1, {0, 3}}});
  ASSERT_THAT(groups, SizeIs(3));
  // The decorators the caller holds, not the backend's groups.
  ASSERT_NE(groups[0], inner_->made("mesh/dp/0"));

  factory_->AbortGroupsWith({2, 3}, Lost(2));

  EXPECT_EQ(groups[0]->health(), Lost(2));
  EXPECT_EQ(inner_->made("mesh/dp/0")->health(), Lost(2));
  EXPECT_EQ(groups[2]->health(), Lost(2));
  EXPECT_THAT(groups[1]->health(), IsOk());
  EXPECT_EQ(inner_->made("mesh/tp/0")->aborts(), 0);
}

TEST_F(DecoratingFactoryTest, ARankInNoGroupAbortsNothing) {
  std::vector<std::shared_ptr<ProcessGroup>> groups =
      NewGroups({GroupSpec{"mesh/dp", 0, {0, 2}}, GroupSpec{"mesh/tp", 0, {0, 1}}});
  ASSERT_THAT(groups, SizeIs(2));
  factory_->AbortGroupsWith({3}, Lost(3));
  EXPECT_EQ(inner_->made("mesh/dp/0")->aborts(), 0);
  EXPECT_EQ(inner_->made("mesh/tp/0")->aborts(), 0);
}

TEST_F(DecoratingFactoryTest, TheWorldGroupCounts) {
  auto world = factory_->World();
  ASSERT_TRUE(world.ok()) << world.status();
  std::vector<std::shared_ptr<ProcessGroup>> groups = NewGroups({GroupSpec{"mesh/tp", 0, {0, 1}}});
  ASSERT_THAT(groups, SizeIs(1));

  factory_->AbortGroupsWith({3}, Lost(3));

  EXPECT_EQ((*world)->health(), Lost(3));
  EXPECT_EQ(inner_->world()->health(), Lost(3));
  EXPECT_THAT(groups[0]->health(), IsOk());
}

TEST_F(DecoratingFactoryTest, AWorldNobodyAskedForIsNeitherMadeNorAborted) {
  std::vector<std::shared_ptr<ProcessGroup>> groups = NewGroups({GroupSpec{"mesh/dp", 0, {0, 3}}});
  factory_->AbortGroupsWith({3}, Lost(3));
  // World() is collective: AbortGroupsWith must not call it.
  EXPECT_EQ(inner_->world_calls(), 0);
  EXPECT_EQ(groups[0]->health(), Lost(3));
}

TEST_F(DecoratingFactoryTest, AGroupItsUserDroppedIsSkipped) {
  std::vector<std::shared_ptr<ProcessGroup>> groups =
      NewGroups({GroupSpec{"mesh/dp", 0, {0, 2}}, GroupSpec{"mesh/pp", 0, {0, 2}}});
  ASSERT_THAT(groups, SizeIs(2));
  groups[0].reset();  // The user drops mesh/dp/0; the backend's group lives on here.

  factory_->AbortGroupsWith({2}, Lost(2));

  EXPECT_EQ(inner_->made("mesh/dp/0")->aborts(), 0);
  EXPECT_EQ(groups[1]->health(), Lost(2));
}

TEST_F(DecoratingFactoryTest, GroupsFromNewGroupsAmongMembersAreTrackedToo) {
  auto groups = factory_->NewGroupsAmongMembers(
      {GroupSpec{"elastic/r1/dp", 0, {0, 2}}, GroupSpec{"elastic/r1/tp", 0, {0, 1}}});
  ASSERT_TRUE(groups.ok()) << groups.status();
  ASSERT_THAT(*groups, SizeIs(2));
  EXPECT_EQ(inner_->members_only_calls(), 1);

  factory_->AbortGroupsWith({2}, Lost(2));

  EXPECT_EQ((*groups)[0]->health(), Lost(2));
  EXPECT_THAT((*groups)[1]->health(), IsOk());
}

TEST_F(DecoratingFactoryTest, LaterGroupsAreUntouched) {
  std::vector<std::shared_ptr<ProcessGroup>> before = NewGroups({GroupSpec{"mesh/dp", 0, {0, 2}}});
  factory_->AbortGroupsWith({2}, Lost(2));
  ASSERT_EQ(before[0]->health(), Lost(2));

  // A rebuild that still includes rank 2 (it came back), and the world,
  // both made after the abort.
  std::vector<std::shared_ptr<ProcessGroup>> after = NewGroups({GroupSpec{"mesh/dp", 1, {0, 2}}});
  ASSERT_THAT(after, SizeIs(1));
  auto world = factory_->World();
  ASSERT_TRUE(world.ok()) << world.status();
  EXPECT_THAT(after[0]->health(), IsOk());
  EXPECT_EQ(inner_->made("mesh/dp/1")->aborts(), 0);
  EXPECT_THAT((*world)->health(), IsOk());

  // A later loss of the same rank does reach them.
  factory_->AbortGroupsWith({2}, Lost(2));
  EXPECT_THAT(after[0]->health(), StatusIs(absl::StatusCode::kAborted, HasSubstr("rank 2")));
  EXPECT_THAT((*world)->health(), StatusIs(absl::StatusCode::kAborted, HasSubstr("rank 2")));
}

}  // namespace decorating_factory_test
}  // namespace mesh
