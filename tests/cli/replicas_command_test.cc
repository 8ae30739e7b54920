// meshctl against coordinator replicas, as docs/ha.md ("What clients do")
// and docs/cli.md promise: given every replica's address, or one target
// that names them all, it talks to the leader whichever is listed first;
// with no leader it exits 3 naming each replica's answer. A real
// CoordinatorServer leads and a real StandbyServer stands by, both in this
// process on 127.0.0.1.
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "cli/meshctl.h"
#include "coordinator/standby_server.h"
#include "tests/cli/run_meshctl.h"
#include "tests/util/in_process_coordinator.h"

namespace mesh::cli {
namespace replicas_command_test {

using ::testing::HasSubstr;

class ReplicasCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<mesh::testing::InProcessCoordinator>> leader =
        mesh::testing::InProcessCoordinator::Start();
    ASSERT_TRUE(leader.ok()) << leader.status();
    leader_ = *std::move(leader);
    standby_ = Standby();
    ASSERT_NE(standby_, nullptr);
  }

  std::unique_ptr<coordinator::StandbyServer> Standby() {
    absl::StatusOr<std::unique_ptr<coordinator::StandbyServer>> standby =
        coordinator::StandbyServer::Start("127.0.0.1", 0, grpc::InsecureServerCredentials());
    EXPECT_TRUE(standby.ok()) << standby.status();
    if (!standby.ok()) return nullptr;
    (*standby)->SetLeader(leader_->address());
    return *std::move(standby);
  }

  static std::string Address(const coordinator::StandbyServer& server) {
    return absl::StrCat("127.0.0.1:", server.port());
  }

  std::unique_ptr<mesh::testing::InProcessCoordinator> leader_;
  std::unique_ptr<coordinator::StandbyServer> standby_;
};

TEST_F(ReplicasCommandTest, AListOfReplicasReachesTheLeaderWhicheverComesFirst) {
  const std::string standby = Address(*standby_);
  for (const std::string& list : {absl::StrCat(standby, ",", leader_->address()),
                                  absl::StrCat(leader_->address(), ", ", standby)}) {
    SCOPED_TRACE(list);
    const Result listed = Meshctl({"--coordinator", list, "--timeout", "5", "list"});
    EXPECT_EQ(listed.code, kExitOk) << listed.err;
    const Result health = Meshctl({"--coordinator", list, "--timeout", "5", "health"});
    EXPECT_EQ(health.code, kExitOk) << health.err;
  }
  // The standby alone answers, but not as a coordinator that serves.
  const Result alone = Meshctl({"--coordinator", standby, "--timeout", "5", "list"});
  EXPECT_NE(alone.code, kExitOk);
  EXPECT_THAT(alone.err, HasSubstr(absl::StrCat("the leader is at ", leader_->address())));
}

TEST_F(ReplicasCommandTest, OneTargetNamingEveryReplicaReachesTheLeader) {
  // What a DNS name with a record per replica gives gRPC's resolver.
  const std::string one = absl::StrCat("ipv4:", Address(*standby_), ",", leader_->address());
  for (int i = 0; i < 5; ++i) {
    const Result listed = Meshctl({"--coordinator", one, "--timeout", "5", "list"});
    ASSERT_EQ(listed.code, kExitOk) << "call " << i << ": " << listed.err;
  }
}

TEST_F(ReplicasCommandTest, NoLeaderExitsThreeNamingEachReplicasAnswer) {
  std::unique_ptr<coordinator::StandbyServer> other = Standby();
  ASSERT_NE(other, nullptr);
  const std::string list = absl::StrCat(Address(*standby_), ",", Address(*other));
  const Result r = Meshctl({"--coordinator", list, "--timeout", "1", "list"});
  EXPECT_EQ(r.code, kExitUnreachable) << r.err;
  EXPECT_THAT(r.err, HasSubstr("no coordinator replica leads"));
  EXPECT_THAT(r.err, HasSubstr(Address(*standby_)));
  EXPECT_THAT(r.err, HasSubstr(Address(*other)));
  EXPECT_THAT(r.err, HasSubstr("NOT_SERVING"));
}

}  // namespace replicas_command_test
}  // namespace mesh::cli
