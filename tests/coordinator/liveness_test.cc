#include "coordinator/liveness.h"

#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace mesh::coordinator {
namespace liveness_test {

constexpr absl::Duration kTimeout = absl::Seconds(10);

class LivenessTrackerTest : public ::testing::Test {
 protected:
  // Which rank is dead now, or -1.
  int DeadNow(const LivenessTracker& tracker) const {
    const std::optional<LivenessTracker::Silent> dead = tracker.FirstDead(clock_.Now());
    return dead.has_value() ? dead->rank : -1;
  }

  FakeClock clock_;
};

TEST_F(LivenessTrackerTest, NobodyIsDeadBeforeStart) {
  LivenessTracker tracker(3, kTimeout);
  EXPECT_FALSE(tracker.started());
  tracker.Heartbeat(1, clock_.Now());  // Ignored: not tracking yet.
  clock_.Advance(10 * kTimeout);
  EXPECT_EQ(DeadNow(tracker), -1);
}

TEST_F(LivenessTrackerTest, ARankIsDeadOnlyWhenSilentForStrictlyLongerThanTheTimeout) {
  LivenessTracker tracker(2, kTimeout);
  clock_.Advance(absl::Minutes(5));  // Time before Start does not count.
  tracker.Start(clock_.Now());
  EXPECT_TRUE(tracker.started());
  clock_.Advance(kTimeout);
  EXPECT_EQ(DeadNow(tracker), -1) << "silent for exactly the timeout is still alive";
  clock_.Advance(absl::Milliseconds(1));
  const std::optional<LivenessTracker::Silent> dead = tracker.FirstDead(clock_.Now());
  ASSERT_TRUE(dead.has_value());
  EXPECT_EQ(dead->rank, 0);  // Both silent since Start: the lowest first.
  EXPECT_EQ(dead->silent, kTimeout + absl::Milliseconds(1));
}

TEST_F(LivenessTrackerTest, HeartbeatsAtNineTenthsOfTheTimeoutNeverCauseAFalsePositive) {
  LivenessTracker tracker(4, kTimeout);
  tracker.Start(clock_.Now());
  const absl::Duration period = kTimeout * 9 / 10;
  for (int round = 0; round < 200; ++round) {
    // Look at every 100 ms of the period, up to and including the heartbeat.
    for (absl::Duration t = absl::ZeroDuration(); t < period; t += absl::Milliseconds(100)) {
      clock_.Advance(absl::Milliseconds(100));
      ASSERT_EQ(DeadNow(tracker), -1) << "false positive in round " << round;
    }
    for (int rank = 0; rank < 4; ++rank) tracker.Heartbeat(rank, clock_.Now());
  }
}

TEST_F(LivenessTrackerTest, TheLongestSilentRankIsReportedWhateverItsNumber) {
  LivenessTracker tracker(4, kTimeout);
  tracker.Start(clock_.Now());
  // Rank 3 stops first; ranks 0..2 keep going for a while, then rank 1 stops.
  for (int second = 1; second <= 8; ++second) {
    clock_.Advance(absl::Seconds(1));
    for (int rank : {0, 1, 2}) tracker.Heartbeat(rank, clock_.Now());
  }
  clock_.Advance(absl::Seconds(3));  // Rank 3: 11 s silent; the others 3 s.
  std::optional<LivenessTracker::Silent> dead = tracker.FirstDead(clock_.Now());
  ASSERT_TRUE(dead.has_value());
  EXPECT_EQ(dead->rank, 3);
  EXPECT_EQ(dead->silent, absl::Seconds(11));

  // Once rank 3 is back, nobody is dead; then rank 1 falls silent.
  tracker.Heartbeat(3, clock_.Now());
  EXPECT_EQ(DeadNow(tracker), -1);
  for (int second = 1; second <= 12; ++second) {
    clock_.Advance(absl::Seconds(1));
    for (int rank : {0, 2, 3}) tracker.Heartbeat(rank, clock_.Now());
  }
  EXPECT_EQ(DeadNow(tracker), 1);
}

TEST_F(LivenessTrackerTest, ARankThatLeftIsNeverDead) {
  LivenessTracker tracker(3, kTimeout);
  tracker.Leave(2);  // Before Start.
  tracker.Start(clock_.Now());
  tracker.Leave(0);  // After Start.
  tracker.Leave(0);  // Idempotent.
  EXPECT_TRUE(tracker.left(0));
  EXPECT_FALSE(tracker.left(1));
  for (int second = 0; second < 30; ++second) {
    clock_.Advance(absl::Seconds(1));
    tracker.Heartbeat(1, clock_.Now());
    tracker.Heartbeat(0, clock_.Now());  // Ignored: it left.
    ASSERT_EQ(DeadNow(tracker), -1) << second;
  }
  clock_.Advance(kTimeout + absl::Seconds(1));
  EXPECT_EQ(DeadNow(tracker), 1);
}

TEST_F(LivenessTrackerTest, EveryRankLeftMeansNobodyToDeclareDead) {
  LivenessTracker tracker(2, kTimeout);
  tracker.Start(clock_.Now());
  tracker.Leave(1);
  tracker.Leave(0);
  clock_.Advance(10 * kTimeout);
  EXPECT_EQ(DeadNow(tracker), -1);
}

// A wall clock may step back; a heartbeat then counts at the latest time
// already seen, which keeps the ranks in order of last heartbeat, so the
// front of the order is always the longest-silent rank.
TEST_F(LivenessTrackerTest, AHeartbeatFromAClockThatSteppedBackCountsAtTheLatestTimeSeen) {
  LivenessTracker tracker(3, kTimeout);
  const absl::Time start = clock_.Now();
  tracker.Start(start);
  tracker.Heartbeat(0, start + absl::Seconds(5));
  tracker.Heartbeat(1, start + absl::Seconds(2));  // Stepped back: counts at +5 s.
  std::optional<LivenessTracker::Silent> dead =
      tracker.FirstDead(start + kTimeout + absl::Seconds(1));
  ASSERT_TRUE(dead.has_value());
  EXPECT_EQ(dead->rank, 2);  // Silent since the start.

  tracker.Heartbeat(2, start + absl::Seconds(6));
  EXPECT_FALSE(tracker.FirstDead(start + absl::Seconds(5) + kTimeout).has_value())
      << "rank 1's heartbeat counted at its stepped-back time";
  const absl::Time later = start + absl::Seconds(5) + kTimeout + absl::Milliseconds(1);
  dead = tracker.FirstDead(later);
  ASSERT_TRUE(dead.has_value());
  EXPECT_EQ(dead->rank, 0);  // Seen at +5 s before rank 1 was.
  tracker.Heartbeat(0, later);
  dead = tracker.FirstDead(later);
  ASSERT_TRUE(dead.has_value());
  EXPECT_EQ(dead->rank, 1);
}

TEST_F(LivenessTrackerTest, ALargeWorldFindsItsOneSilentRank) {
  constexpr int kWorld = 100000;
  constexpr int kSilent = 77777;
  LivenessTracker tracker(kWorld, kTimeout);
  tracker.Start(clock_.Now());
  for (int step = 0; step < 3; ++step) {
    clock_.Advance(absl::Seconds(5));
    for (int rank = 0; rank < kWorld; ++rank) {
      if (rank != kSilent) tracker.Heartbeat(rank, clock_.Now());
    }
  }
  EXPECT_EQ(DeadNow(tracker), kSilent);
}

TEST_F(LivenessTrackerTest, AForgivenStallDoesNotCountButLaterSilenceDoes) {
  LivenessTracker tracker(3, kTimeout);
  tracker.Start(clock_.Now());
  clock_.Advance(absl::Seconds(4));
  tracker.Heartbeat(1, clock_.Now());  // Rank 1 seen at 4 s; 0 and 2 at 0 s.
  clock_.Advance(absl::Seconds(20));   // The coordinator was stopped for 20 s.
  EXPECT_NE(DeadNow(tracker), -1) << "without forgiveness, the pause kills";
  tracker.ForgiveStall(absl::Seconds(20), clock_.Now());
  EXPECT_EQ(DeadNow(tracker), -1);
  // Silences resume where they were: ranks 0 and 2 had 4 s behind them,
  // so they die 6 s on (lowest first), rank 1 4 s after that.
  clock_.Advance(absl::Seconds(6));
  EXPECT_EQ(DeadNow(tracker), -1);
  clock_.Advance(absl::Milliseconds(1));
  EXPECT_EQ(DeadNow(tracker), 0);
}

TEST_F(LivenessTrackerTest, AForgivenStallNeverMovesALastSightingPastNow) {
  LivenessTracker tracker(2, kTimeout);
  tracker.Start(clock_.Now());
  clock_.Advance(absl::Seconds(1));
  tracker.Heartbeat(0, clock_.Now());
  // A stall longer than the time since the sighting (the grace is what the
  // coordinator lost, not credit for the future).
  tracker.ForgiveStall(absl::Seconds(30), clock_.Now());
  clock_.Advance(kTimeout + absl::Milliseconds(1));
  const std::optional<LivenessTracker::Silent> dead = tracker.FirstDead(clock_.Now());
  ASSERT_TRUE(dead.has_value());
  EXPECT_EQ(dead->silent, kTimeout + absl::Milliseconds(1));
  tracker.ForgiveStall(absl::ZeroDuration(), clock_.Now());  // A no-op.
  EXPECT_EQ(DeadNow(tracker), dead->rank);
}

}  // namespace liveness_test
}  // namespace mesh::coordinator
