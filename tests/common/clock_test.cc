#include "common/clock.h"

#include <gtest/gtest.h>

namespace mesh {
namespace clock_test {

TEST(FakeClock, MovesOnlyWhenAdvanced) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  EXPECT_EQ(clock.Now(), start);
  clock.Advance(absl::Milliseconds(1500));
  EXPECT_EQ(clock.Now() - start, absl::Milliseconds(1500));
  clock.Advance(absl::ZeroDuration());
  EXPECT_EQ(clock.Now() - start, absl::Milliseconds(1500));
}

TEST(FakeClock, StartsWhereTold) {
  FakeClock clock(absl::FromUnixSeconds(42));
  EXPECT_EQ(absl::ToUnixSeconds(clock.Now()), 42);
}

TEST(FakeClockDeathTest, GoingBackwardsIsAProgrammerError) {
  FakeClock clock;
  EXPECT_DEATH(clock.Advance(absl::Seconds(-1)), "cannot go backwards");
}

TEST(RealClock, FollowsWallTime) {
  const absl::Time before = absl::Now();
  const absl::Time now = Clock::Real()->Now();
  EXPECT_GE(now, before);
  EXPECT_LT(now - before, absl::Seconds(5));
  EXPECT_EQ(Clock::Real(), Clock::Real());
}

}  // namespace clock_test
}  // namespace mesh
