#include "coordinator/barrier_table.h"

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/time/time.h"
#include "tests/util/status_matchers.h"

namespace mesh::coordinator {
namespace barrier_table_test {

using ::mesh::testing::IsOk;
using ::mesh::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using Code = absl::StatusCode;

const absl::Time kNow = absl::FromUnixSeconds(1'000'000);

TEST(BarrierTableTest, NormalizeParticipantsSortsAndTreatsTheWholeWorldAsEmpty) {
  const BarrierTable table(4);
  absl::StatusOr<std::vector<int>> p = table.NormalizeParticipants({3, 1}, 1);
  ASSERT_THAT(p, IsOk());
  EXPECT_THAT(*p, ElementsAre(1, 3));
  p = table.NormalizeParticipants({}, 2);
  ASSERT_THAT(p, IsOk());
  EXPECT_THAT(*p, IsEmpty());
  p = table.NormalizeParticipants({3, 0, 2, 1}, 2);
  ASSERT_THAT(p, IsOk());
  EXPECT_THAT(*p, IsEmpty()) << "every rank listed is the same barrier as none listed";
}

TEST(BarrierTableTest, NormalizeParticipantsRejectsDuplicatesBadRanksAndOutsiders) {
  const BarrierTable table(4);
  EXPECT_THAT(table.NormalizeParticipants({1, 1}, 1), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(table.NormalizeParticipants({0, 4}, 0), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(table.NormalizeParticipants({-1, 0}, 0), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(table.NormalizeParticipants({0, 1}, 2), StatusIs(Code::kInvalidArgument));
  // Four entries, but not the world: a duplicate is caught before the size.
  EXPECT_THAT(table.NormalizeParticipants({0, 1, 2, 2}, 0), StatusIs(Code::kInvalidArgument));
}

TEST(BarrierTableTest, TheFirstOpenFixesParticipantsAndDeadline) {
  BarrierTable table(4);
  bool created = false;
  BarrierTable::Barrier& b = table.Open("sync", {1, 3}, kNow, absl::Seconds(5), &created);
  EXPECT_TRUE(created);
  EXPECT_EQ(b.deadline(), kNow + absl::Seconds(5));
  EXPECT_EQ(b.timeout(), absl::Seconds(5));
  EXPECT_EQ(b.expected(), 2);
  EXPECT_THAT(b.participants(), ElementsAre(1, 3));

  BarrierTable::Barrier& again =
      table.Open("sync", {}, kNow + absl::Seconds(1), absl::Minutes(1), &created);
  EXPECT_FALSE(created);
  EXPECT_EQ(&again, &b);
  EXPECT_EQ(again.deadline(), kNow + absl::Seconds(5));
  EXPECT_THAT(again.participants(), ElementsAre(1, 3));
  EXPECT_EQ(table.Find("sync"), &b);
  EXPECT_EQ(table.Find("other"), nullptr);
}

TEST(BarrierTableTest, ArriveCountsEachParticipantOnceAndReportsTheLast) {
  BarrierTable table(3);
  bool created = false;
  BarrierTable::Barrier& b = table.Open("all", {}, kNow, absl::Seconds(5), &created);
  EXPECT_EQ(b.expected(), 3);
  EXPECT_THAT(b.Missing(), ElementsAre(0, 1, 2));
  EXPECT_FALSE(b.Arrive(2));
  EXPECT_FALSE(b.Arrive(2));  // Again: still one arrival.
  EXPECT_EQ(b.arrived_count(), 1);
  EXPECT_FALSE(b.Arrive(0));
  EXPECT_THAT(b.Missing(), ElementsAre(1));
  EXPECT_TRUE(b.arrived(0));
  EXPECT_FALSE(b.arrived(1));
  EXPECT_TRUE(b.Arrive(1));
  EXPECT_THAT(b.Missing(), IsEmpty());
}

TEST(BarrierTableTest, ASubsetBarrierIncludesOnlyItsParticipants) {
  BarrierTable table(4);
  bool created = false;
  BarrierTable::Barrier& b = table.Open("pair", {0, 2}, kNow, absl::Seconds(5), &created);
  EXPECT_TRUE(b.Includes(0));
  EXPECT_FALSE(b.Includes(1));
  EXPECT_TRUE(b.Includes(2));
  EXPECT_FALSE(b.Includes(4));
  EXPECT_FALSE(b.Includes(-1));
  EXPECT_THAT(b.Missing(), ElementsAre(0, 2));
}

TEST(BarrierTableTest, FinishHandsOutTheWaitersOnceAndKeepsTheResult) {
  BarrierTable table(2);
  bool created = false;
  BarrierTable::Barrier& b = table.Open("sync", {}, kNow, absl::Seconds(5), &created);
  b.AddWaiter(7);
  b.AddWaiter(9);
  EXPECT_FALSE(b.result().has_value());
  EXPECT_THAT(table.Finish("sync", absl::OkStatus()), ElementsAre(7, 9));
  ASSERT_TRUE(b.result().has_value());
  EXPECT_THAT(*b.result(), IsOk());
  EXPECT_EQ(b.num_waiters(), 0u);
}

TEST(BarrierTableTest, AwaitingRankNamesOpenBarriersTheRankHasNotReached) {
  BarrierTable table(3);
  bool created = false;
  table.Open("all", {}, kNow, absl::Seconds(5), &created);
  table.Open("pair01", {0, 1}, kNow, absl::Seconds(5), &created);
  table.Open("pair02", {0, 2}, kNow, absl::Seconds(5), &created).Arrive(2);
  table.Open("done", {}, kNow, absl::Seconds(5), &created);
  table.Finish("done", absl::OkStatus());
  EXPECT_THAT(table.AwaitingRank(2), ElementsAre("all"));
  EXPECT_THAT(table.AwaitingRank(1), ElementsAre("all", "pair01"));
  EXPECT_THAT(table.AwaitingRank(0), ElementsAre("all", "pair01", "pair02"));
}

TEST(BarrierTableTest, FinishAllEndsOpenBarriersAndKeepsEarlierResults) {
  BarrierTable table(2);
  bool created = false;
  BarrierTable::Barrier& done = table.Open("done", {}, kNow, absl::Seconds(5), &created);
  table.Finish("done", absl::OkStatus());
  BarrierTable::Barrier& open = table.Open("open", {}, kNow, absl::Seconds(5), &created);
  open.AddWaiter(3);
  table.FinishAll(absl::AbortedError("generation ended"));
  ASSERT_TRUE(done.result().has_value());
  EXPECT_THAT(*done.result(), IsOk());
  ASSERT_TRUE(open.result().has_value());
  EXPECT_THAT(*open.result(), StatusIs(Code::kAborted));
  EXPECT_EQ(open.num_waiters(), 0u);
  EXPECT_THAT(table.AwaitingRank(0), IsEmpty());
}

TEST(BarrierTableTest, DescribeParticipants) {
  EXPECT_EQ(BarrierTable::DescribeParticipants({}), "all ranks");
  EXPECT_EQ(BarrierTable::DescribeParticipants({1, 3}), "{1,3}");
}

}  // namespace barrier_table_test
}  // namespace mesh::coordinator
