// HangDetector on its own: reports in, diagnoses out, with explicit times.
#include "coordinator/hang_detector.h"

#include <optional>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/time/time.h"

namespace mesh::coordinator {
namespace hang_detector_test {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(300);
const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);

GroupProgressReport Idle(const std::string& name, std::vector<int> members, uint64_t completed,
                         absl::Duration since_completed) {
  GroupProgressReport r;
  r.name = name;
  r.members = std::move(members);
  r.entered = completed;
  r.completed = completed;
  r.completed_kind = v1::COLLECTIVE_KIND_ALL_REDUCE;
  r.since_completed = since_completed;
  return r;
}

GroupProgressReport Waiting(const std::string& name, std::vector<int> members, uint64_t op,
                            absl::Duration waiting,
                            v1::CollectiveKind kind = v1::COLLECTIVE_KIND_ALL_REDUCE) {
  GroupProgressReport r;
  r.name = name;
  r.members = std::move(members);
  r.entered = op;
  r.completed = op - 1;
  r.pending_kind = kind;
  r.completed_kind = v1::COLLECTIVE_KIND_ALL_REDUCE;
  r.waiting = waiting;
  return r;
}

const std::vector<int> kTp = {0, 1, 2, 3};

// The example: three ranks wait in all_reduce #1734, rank 1 is
// still past #1733.
TEST(HangDetectorTest, NamesTheRankThatNeverEnteredTheOp) {
  HangDetector detector(4, kTimeout);
  for (int rank : {0, 2, 3}) {
    detector.Report(rank, {Waiting("tp", kTp, 1734, absl::Seconds(1))}, kT0);
  }
  detector.Report(1, {Idle("tp", kTp, 1733, absl::Seconds(2))}, kT0);
  EXPECT_FALSE(detector.Diagnose(kT0 + absl::Seconds(200)).has_value());

  // Rank 1 keeps reporting the same progress, as a rank stuck outside any
  // collective does; the waiters keep waiting.
  detector.Report(1, {Idle("tp", {}, 1733, absl::Seconds(300))}, kT0 + absl::Seconds(298));
  std::optional<HangDiagnosis> hang = detector.Diagnose(kT0 + absl::Seconds(299));
  ASSERT_TRUE(hang.has_value());
  EXPECT_EQ(hang->culprit, 1);
  EXPECT_EQ(hang->group, "tp");
  EXPECT_EQ(hang->seq, 1734u);
  EXPECT_EQ(hang->kind, v1::COLLECTIVE_KIND_ALL_REDUCE);
  EXPECT_THAT(hang->waiting, ElementsAre(0, 2, 3));
  EXPECT_THAT(hang->missing, ElementsAre(1));
  EXPECT_EQ(hang->waited, absl::Seconds(300));
  EXPECT_EQ(hang->message,
            "hang in group 'tp' (ranks 0-3): ranks 0, 2, 3 have waited 300 s in all_reduce "
            "#1734; rank 1 never entered it (last: all_reduce #1733, completed 301 s ago)");
}

TEST(HangDetectorTest, LongComputationBetweenCollectivesIsNotAHang) {
  HangDetector detector(4, kTimeout);
  for (int minute = 0; minute <= 30; ++minute) {
    const absl::Time now = kT0 + absl::Minutes(minute);
    for (int rank = 0; rank < 4; ++rank) {
      detector.Report(rank, {Idle("tp", kTp, 5, absl::Minutes(minute))}, now);
    }
    EXPECT_FALSE(detector.Diagnose(now).has_value()) << minute << " min";
  }
}

TEST(HangDetectorTest, EveryRankInTheOpIsNotThisKindOfHang) {
  // All members entered: the op is the backend's to time out, not a rank
  // that never arrived.
  HangDetector detector(2, kTimeout);
  detector.Report(0, {Waiting("world", {0, 1}, 7, absl::Hours(1))}, kT0);
  detector.Report(1, {Waiting("world", {0, 1}, 7, absl::Hours(1))}, kT0);
  EXPECT_FALSE(detector.Diagnose(kT0 + absl::Hours(1)).has_value());
}

TEST(HangDetectorTest, ClockStartsWhenTheWaiterStartedWaiting) {
  HangDetector detector(2, kTimeout);
  // Rank 0 has waited 100 s when the report arrives.
  detector.Report(0, {Waiting("world", {0, 1}, 6, absl::Seconds(100))}, kT0);
  detector.Report(1, {Idle("world", {0, 1}, 5, absl::Seconds(101))}, kT0);
  EXPECT_FALSE(detector.Diagnose(kT0 + absl::Seconds(199)).has_value());
  std::optional<HangDiagnosis> hang = detector.Diagnose(kT0 + absl::Seconds(200));
  ASSERT_TRUE(hang.has_value());
  EXPECT_EQ(hang->culprit, 1);
  EXPECT_THAT(hang->message, HasSubstr("rank 0 has waited 300 s in all_reduce #6"));
}

TEST(HangDetectorTest, ALaggardReportOlderThanTheWaitDoesNotCount) {
  HangDetector detector(2, kTimeout);
  detector.Report(1, {Idle("world", {0, 1}, 5, absl::Seconds(1))}, kT0);
  // Rank 0 started waiting after rank 1's last report: nothing says rank 1
  // has not entered op 6 since.
  detector.Report(0, {Waiting("world", {0, 1}, 6, absl::Seconds(1))}, kT0 + absl::Seconds(10));
  EXPECT_FALSE(detector.Diagnose(kT0 + absl::Seconds(400)).has_value());
  detector.Report(1, {Idle("world", {}, 5, absl::Seconds(400))}, kT0 + absl::Seconds(400));
  EXPECT_TRUE(detector.Diagnose(kT0 + absl::Seconds(400)).has_value());
}

TEST(HangDetectorTest, ACompletedOpEndsTheWait) {
  HangDetector detector(2, kTimeout);
  detector.Report(0, {Waiting("world", {0, 1}, 6, absl::Seconds(200))}, kT0);
  detector.Report(1, {Idle("world", {0, 1}, 5, absl::Seconds(200))}, kT0);
  // Rank 1 arrives; both complete op 6.
  detector.Report(1, {Idle("world", {}, 6, absl::Seconds(0))}, kT0 + absl::Seconds(50));
  detector.Report(0, {Idle("world", {}, 6, absl::Seconds(0))}, kT0 + absl::Seconds(50));
  EXPECT_FALSE(detector.Diagnose(kT0 + absl::Seconds(500)).has_value());
}

TEST(HangDetectorTest, PrefersTheRankStuckOutsideEveryCollective) {
  // dp = {0, 1}: rank 0 waits for rank 1 in all_reduce #3.
  // tp = {1, 2}: rank 1 waits for rank 2 in broadcast #8; rank 2 is stuck
  // outside. The longest wait is rank 0's, but the culprit named in dp is
  // rank 1, which is a victim; the tp diagnosis names rank 2.
  HangDetector detector(3, kTimeout);
  detector.Report(0, {Waiting("dp", {0, 1}, 3, absl::Seconds(500))}, kT0);
  detector.Report(1,
                  {Idle("dp", {0, 1}, 2, absl::Seconds(501)),
                   Waiting("tp", {1, 2}, 8, absl::Seconds(400), v1::COLLECTIVE_KIND_BROADCAST)},
                  kT0 + absl::Seconds(1));
  detector.Report(2, {Idle("tp", {1, 2}, 7, absl::Seconds(401))}, kT0 + absl::Seconds(1));
  std::optional<HangDiagnosis> hang = detector.Diagnose(kT0 + absl::Seconds(1));
  ASSERT_TRUE(hang.has_value());
  EXPECT_EQ(hang->group, "dp");
  EXPECT_EQ(hang->culprit, 1);
  EXPECT_THAT(hang->message, HasSubstr("it waits in broadcast #8 of group 'tp'"));
}

TEST(HangDetectorTest, AmongSeveralMissingRanksTheOneWaitingNowhereIsNamed) {
  HangDetector detector(3, kTimeout);
  const std::vector<int> world = {0, 1, 2};
  detector.Report(0, {Waiting("world", world, 4, absl::Seconds(400))}, kT0);
  // Rank 1 has not entered op 4 of world either, but waits in a group of
  // its own; rank 2 waits nowhere.
  detector.Report(
      1,
      {Idle("world", world, 3, absl::Seconds(400)), Waiting("side", {1, 2}, 1, absl::Seconds(399))},
      kT0 + absl::Seconds(1));
  detector.Report(2, {Idle("world", world, 3, absl::Seconds(400))}, kT0 + absl::Seconds(1));
  std::optional<HangDiagnosis> hang = detector.Diagnose(kT0 + absl::Seconds(2));
  ASSERT_TRUE(hang.has_value());
  EXPECT_EQ(hang->group, "world");
  EXPECT_THAT(hang->missing, ElementsAre(1, 2));
  EXPECT_EQ(hang->culprit, 2);
  EXPECT_THAT(hang->message, HasSubstr("rank 1 did not enter it either"));
}

TEST(HangDetectorTest, AMemberThatNeverReportedTheGroupIsMissing) {
  HangDetector detector(2, kTimeout);
  detector.Report(0, {Waiting("pair", {0, 1}, 1, absl::Seconds(301))}, kT0);
  std::optional<HangDiagnosis> hang = detector.Diagnose(kT0);
  ASSERT_TRUE(hang.has_value());
  EXPECT_EQ(hang->culprit, 1);
  EXPECT_THAT(hang->message, HasSubstr("rank 1 never entered it (never reported this group)"));
}

TEST(HangDetectorTest, AsksForMembersItDoesNotKnow) {
  HangDetector detector(2, kTimeout);
  EXPECT_TRUE(detector.Report(0, {Waiting("world", {}, 2, absl::Seconds(1))}, kT0));
  EXPECT_FALSE(detector.Report(0, {Waiting("world", {0, 1}, 2, absl::Seconds(1))}, kT0));
  EXPECT_FALSE(detector.Report(1, {Idle("world", {}, 1, absl::Seconds(1))}, kT0));
}

TEST(HangDetectorTest, IgnoresMembersOutsideTheWorldOrWithoutTheReporter) {
  HangDetector detector(2, kTimeout);
  EXPECT_TRUE(detector.Report(0, {Waiting("bad", {0, 7}, 2, absl::Hours(1))}, kT0));
  EXPECT_TRUE(detector.Report(0, {Waiting("other", {1}, 2, absl::Hours(1))}, kT0));
  EXPECT_FALSE(detector.Diagnose(kT0 + absl::Hours(1)).has_value());
}

TEST(HangDetectorTest, ARenamedMembershipStartsOver) {
  HangDetector detector(3, kTimeout);
  detector.Report(0, {Waiting("g", {0, 1}, 9, absl::Seconds(400))}, kT0);
  detector.Report(1, {Idle("g", {0, 1}, 8, absl::Seconds(400))}, kT0 + absl::Seconds(1));
  ASSERT_TRUE(detector.Diagnose(kT0 + absl::Seconds(1)).has_value());
  // A new group under the same name: the old progress no longer applies.
  detector.Report(0, {Idle("g", {0, 2}, 0, absl::Seconds(1))}, kT0 + absl::Seconds(2));
  EXPECT_FALSE(detector.Diagnose(kT0 + absl::Seconds(2)).has_value());
}

TEST(HangDetectorTest, FormatRankList) {
  EXPECT_EQ(FormatRankList({}), "");
  EXPECT_EQ(FormatRankList({3}), "3");
  EXPECT_EQ(FormatRankList({3, 0, 1, 2}), "0-3");
  EXPECT_EQ(FormatRankList({0, 2, 4, 5, 6, 7, 9}), "0, 2, 4-7, 9");
  EXPECT_EQ(FormatRankList({2, 3, 3}), "2, 3");
}

}  // namespace hang_detector_test
}  // namespace mesh::coordinator
