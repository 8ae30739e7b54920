// meshctl run in-process against a real coordinator on 127.0.0.1:0.
#include "cli/meshctl.h"

#include <stdlib.h>

#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/version.h"
#include "coordinator/coordinator_server.h"
#include "tests/cli/run_meshctl.h"
#include "tests/util/in_process_coordinator.h"

namespace mesh::cli {
namespace meshctl_test {

using ::testing::HasSubstr;

class MeshctlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    unsetenv("MESH_COORDINATOR");
    auto server = mesh::testing::InProcessCoordinator::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  std::unique_ptr<mesh::testing::InProcessCoordinator> server_;
};

TEST_F(MeshctlTest, VersionShowsClientAndServerAsJson) {
  const Result r = Meshctl({"--coordinator", server_->address(), "-o", "json", "version"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const auto json = nlohmann::json::parse(r.out);
  EXPECT_EQ(json["client_version"], kVersion);
  EXPECT_EQ(json["server_version"], kVersion);
  EXPECT_EQ(json["server_protocol_version"], kProtocolVersion);
}

TEST_F(MeshctlTest, CreateJobMakesARecordWorkersCanJoin) {
  const Result r =
      Meshctl({"--coordinator", server_->address(), "-o", "json", "create-job", "--world-size", "4",
               "--mesh-shape", "2,2", "--dim-names", "dp,tp", "--job-id", "demo"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const auto json = nlohmann::json::parse(r.out);
  EXPECT_EQ(json["job_id"], "demo");
  EXPECT_EQ(json["generation"], 0);
  auto job = server_->coordination().GetJob("demo");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->layout.world_size, 4);
  EXPECT_EQ(job->layout.mesh_shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(job->layout.mesh_dim_names, (std::vector<std::string>{"dp", "tp"}));

  // The same id again is refused, and the record is unchanged.
  const Result again = Meshctl(
      {"--coordinator", server_->address(), "create-job", "--world-size", "2", "--job-id", "demo"});
  EXPECT_EQ(again.code, kExitRefused);
  EXPECT_THAT(again.err, HasSubstr("ALREADY_EXISTS"));
  EXPECT_EQ(server_->coordination().GetJob("demo")->layout.world_size, 4);
}

TEST_F(MeshctlTest, CreateJobWithABadShapeIsRefusedNamingIt) {
  const Result r = Meshctl({"--coordinator", server_->address(), "create-job", "--world-size", "4",
                            "--mesh-shape", "3,2"});
  EXPECT_EQ(r.code, kExitRefused);
  EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT"));
  EXPECT_THAT(r.err, HasSubstr("mesh_shape"));
  EXPECT_EQ(Meshctl({"create-job"}).code, kExitUsage);  // --world-size is required.
}

TEST_F(MeshctlTest, CoordinatorAddressComesFromTheEnvironment) {
  setenv("MESH_COORDINATOR", server_->address().c_str(), 1);
  const Result r = Meshctl({"health"});
  unsetenv("MESH_COORDINATOR");
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("SERVING"));
}

TEST_F(MeshctlTest, HealthOfAnUnknownServiceIsRefused) {
  const Result r = Meshctl({"--coordinator", server_->address(), "health", "--service", "no.Such"});
  EXPECT_EQ(r.code, kExitRefused);
  EXPECT_THAT(r.err, HasSubstr("NOT_FOUND"));
}

TEST_F(MeshctlTest, UnreachableCoordinatorIsExit3WithTheAddress) {
  const std::string address = server_->address();
  server_->Stop(absl::ZeroDuration());
  const Result r = Meshctl({"--coordinator", address, "--timeout", "1", "health"});
  EXPECT_EQ(r.code, kExitUnreachable);
  EXPECT_THAT(r.err, HasSubstr(address));
}

TEST_F(MeshctlTest, ClientOnlyVersionNeedsNoServer) {
  const Result r = Meshctl({"--coordinator", "127.0.0.1:1", "version", "--client", "-o", "yaml"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("client_version"));
}

TEST_F(MeshctlTest, UsageErrorsExitWith2) {
  EXPECT_EQ(Meshctl({}).code, kExitUsage);
  EXPECT_EQ(Meshctl({"frobnicate"}).code, kExitUsage);
  EXPECT_EQ(Meshctl({"-o", "xml", "version"}).code, kExitUsage);
  EXPECT_EQ(Meshctl({"--timeout", "-1", "health"}).code, kExitUsage);
}

TEST_F(MeshctlTest, HelpIsSuccess) {
  const Result r = Meshctl({"--help"});
  EXPECT_EQ(r.code, kExitOk);
  EXPECT_THAT(r.out, HasSubstr("health"));
}

}  // namespace meshctl_test
}  // namespace mesh::cli
