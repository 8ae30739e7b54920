#include "coordinator/server_info.h"

#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/version.h"

namespace mesh::coordinator {
namespace server_info_test {

TEST(ServerInfo, UptimeFollowsTheInjectedClock) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  ServerInfo info(&clock);
  EXPECT_EQ(info.Snapshot().uptime, absl::ZeroDuration());
  clock.Advance(absl::Minutes(3));
  const ServerInfoSnapshot snapshot = info.Snapshot();
  EXPECT_EQ(snapshot.start_time, start);
  EXPECT_EQ(snapshot.uptime, absl::Minutes(3));
}

TEST(ServerInfo, ReportsVersionProcessAndFeatures) {
  FakeClock clock;
  const ServerInfoSnapshot snapshot = ServerInfo(&clock).Snapshot();
  EXPECT_EQ(snapshot.version, kVersion);
  EXPECT_EQ(snapshot.protocol_version, kProtocolVersion);
  EXPECT_EQ(snapshot.pid, getpid());
  EXPECT_FALSE(snapshot.hostname.empty());
  EXPECT_THAT(snapshot.features, ::testing::Contains("gloo"));
}

}  // namespace server_info_test
}  // namespace mesh::coordinator
