// The timeout rule every waiting RPC of the coordinator applies, JobService's
// WaitJob and WorkerService's Join, barriers and key waits alike (they share
// coordinator/rpc_helpers.h).
#include "coordinator/rpc_helpers.h"

#include <chrono>

#include <gtest/gtest.h>

namespace mesh::coordinator {
namespace rpc_helpers_test {

using Clock = std::chrono::system_clock;

const Clock::time_point kNow = Clock::time_point() + std::chrono::hours(24 * 365 * 50);
constexpr Clock::time_point kNoDeadline = Clock::time_point::max();

TEST(EffectiveTimeoutTest, NeitherSetIsZeroForTheServerDefault) {
  EXPECT_EQ(EffectiveTimeout(kNoDeadline, 0, kNow), absl::ZeroDuration());
}

TEST(EffectiveTimeoutTest, TheSmallerOfRequestTimeoutAndDeadlineWins) {
  EXPECT_EQ(EffectiveTimeout(kNoDeadline, 2.5, kNow), absl::Seconds(2.5));
  EXPECT_EQ(EffectiveTimeout(kNow + std::chrono::seconds(10), 2.5, kNow), absl::Seconds(2.5));
  EXPECT_EQ(EffectiveTimeout(kNow + std::chrono::seconds(1), 2.5, kNow), absl::Seconds(1));
  EXPECT_EQ(EffectiveTimeout(kNow + std::chrono::seconds(3), 0, kNow), absl::Seconds(3));
}

// A client whose deadline has passed has given up: the wait must end at
// once, not fall back to the server's default of minutes. (The services'
// two copies of this rule once disagreed here.)
TEST(EffectiveTimeoutTest, AnExpiredDeadlineEndsTheWaitAtOnce) {
  for (const double request : {0.0, 30.0}) {
    EXPECT_EQ(EffectiveTimeout(kNow - std::chrono::seconds(1), request, kNow), absl::Nanoseconds(1))
        << "request timeout " << request;
    EXPECT_EQ(EffectiveTimeout(kNow, request, kNow), absl::Nanoseconds(1))
        << "request timeout " << request;
  }
}

TEST(EffectiveTimeoutTest, ANegativeRequestTimeoutCountsAsUnset) {
  EXPECT_EQ(EffectiveTimeout(kNoDeadline, -5, kNow), absl::ZeroDuration());
}

}  // namespace rpc_helpers_test
}  // namespace mesh::coordinator
