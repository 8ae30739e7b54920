// The real mesh-coordinator and meshctl binaries, as separate processes on
// 127.0.0.1: start on port 0, report the port, serve, obey flags, env and a
// config file, and stop cleanly on SIGTERM.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "cli/admin_client.h"
#include "mesh/v1/admin.grpc.pb.h"
#include "mesh/v1/worker.grpc.pb.h"
#include "tests/util/proc.h"
#include "tests/util/subprocess.h"

namespace mesh {
namespace coordinator_process_test {

using ::mesh::testing::ExitCode;
using ::mesh::testing::Subprocess;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr absl::Duration kStartTimeout = absl::Seconds(20);
constexpr absl::Duration kStopTimeout = absl::Seconds(20);
constexpr char kBanner[] = "mesh-coordinator listening on ";

// Starts the coordinator and returns it with the address it printed.
std::pair<Subprocess, std::string> StartCoordinator(std::vector<std::string> args,
                                                    std::vector<std::string> env = {}) {
  args.insert(args.begin(), {MESH_COORDINATOR_BIN, "--insecure"});
  auto process = Subprocess::Start(args, env);
  EXPECT_TRUE(process.ok()) << process.status();
  auto line = process->ReadLine(kStartTimeout);
  EXPECT_TRUE(line.ok()) << line.status();
  EXPECT_THAT(*line, StartsWith(kBanner));
  return {*std::move(process), line->substr(sizeof(kBanner) - 1)};
}

int RunMeshctl(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {MESHCTL_BIN};
  argv.insert(argv.end(), args.begin(), args.end());
  auto process = Subprocess::Start(argv);
  EXPECT_TRUE(process.ok());
  auto status = process->Wait(absl::Seconds(20));
  EXPECT_TRUE(status.ok()) << status.status();
  return status.ok() ? ExitCode(*status) : -1;
}

TEST(CoordinatorProcess, ServesOnAPickedPortAndStopsOnSigterm) {
  // A short grace: idle client connections (ours) hold a draining server
  // until the grace ends, and this test should not wait the default 5 s.
  auto [coordinator, address] = StartCoordinator({"--port", "0", "--shutdown-grace", "0.5"});
  EXPECT_THAT(address, StartsWith("127.0.0.1:"));

  cli::AdminClient client(cli::MakeChannel(address));
  auto info = client.GetServerInfo(absl::Seconds(10));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->pid(), coordinator.pid());

  EXPECT_EQ(RunMeshctl({"--coordinator", address, "health"}), 0);
  EXPECT_EQ(RunMeshctl({"--coordinator", address, "version"}), 0);

  coordinator.Signal(SIGTERM);
  auto status = coordinator.Wait(kStopTimeout);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(ExitCode(*status), 0);
  EXPECT_EQ(RunMeshctl({"--coordinator", address, "--timeout", "1", "health"}), 3);
}

TEST(CoordinatorProcess, AWildcardListenerPrintsTheAddressItBound) {
  auto [coordinator, address] =
      StartCoordinator({"--listen", "0.0.0.0", "--port", "0", "--shutdown-grace", "0.5"});
  // The address as bound, not a loopback one it never bound alone.
  ASSERT_THAT(address, StartsWith("0.0.0.0:"));
  int port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port)) << address;
  // Every local address reaches it.
  EXPECT_EQ(RunMeshctl({"--coordinator", "127.0.0.1:" + std::to_string(port), "health"}), 0);
  coordinator.Signal(SIGTERM);
  auto status = coordinator.Wait(kStopTimeout);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(ExitCode(*status), 0);
}

// A certificate file that is missing or holds no certificate is a bad flag
// value: a usage error (exit 2) naming the file, before anything starts.
TEST(CoordinatorProcess, UnusableCertificateFilesAreUsageErrors) {
  const std::string dir = ::testing::TempDir();
  const std::string junk = dir + "/mesh_not_pem_" + std::to_string(getpid());
  std::ofstream(junk) << "not a certificate\n";
  const std::string missing = dir + "/mesh_missing_" + std::to_string(getpid()) + ".pem";
  for (const auto& [cert, key] : {std::pair{missing, missing}, std::pair{junk, junk}}) {
    ::mesh::testing::CommandOutput run =
        ::mesh::testing::RunMerged({MESH_COORDINATOR_BIN, "--port", "0", "--tls-cert", cert,
                                    "--tls-key", key, "--tls-client-ca", junk},
                                   absl::Seconds(20));
    EXPECT_EQ(run.code, 2) << run.output;
    EXPECT_THAT(run.output, HasSubstr(cert)) << run.output;
    EXPECT_THAT(run.output, ::testing::Not(HasSubstr("listening on"))) << run.output;
  }
  unlink(junk.c_str());
}

TEST(CoordinatorProcess, PortFileAndEnvironmentConfigure) {
  const std::string port_file = ::testing::TempDir() + "/mesh_port_" + std::to_string(getpid());
  auto [coordinator, address] =
      StartCoordinator({}, {"MESH_PORT=0", "MESH_PORT_FILE=" + port_file});
  std::ifstream in(port_file);
  int port = 0;
  in >> port;
  EXPECT_GT(port, 0);
  EXPECT_TRUE(absl::EndsWith(address, ":" + std::to_string(port)));
  unlink(port_file.c_str());
}

TEST(CoordinatorProcess, FlagBeatsEnvironmentBeatsConfigFile) {
  const std::string config =
      ::testing::TempDir() + "/mesh_cfg_" + std::to_string(getpid()) + ".yaml";
  std::ofstream(config) << "listen: 0.0.0.0\nport: 1\n";
  // Config says 0.0.0.0:1; env overrides the port; the flag overrides listen.
  auto [coordinator, address] =
      StartCoordinator({"--config", config, "--listen", "127.0.0.1"}, {"MESH_PORT=0"});
  EXPECT_THAT(address, StartsWith("127.0.0.1:"));
  EXPECT_NE(address, "127.0.0.1:1");
  unlink(config.c_str());
}

// Heartbeat settings reach ranks in their join reply, and KV limits are
// enforced: each comes from a different layer of the precedence.
TEST(CoordinatorProcess, HeartbeatAndKvLimitFlagsTakeEffect) {
  const std::string config =
      ::testing::TempDir() + "/mesh_cfg_kv_" + std::to_string(getpid()) + ".yaml";
  std::ofstream(config) << "kv-max-value-bytes: 100\nheartbeat-timeout: 7\n";
  auto [coordinator, address] =
      StartCoordinator({"--port", "0", "--config", config, "--heartbeat-interval", "0.25",
                        "--shutdown-grace", "0.5"},
                       {"MESH_HEARTBEAT_TIMEOUT=3"});
  unlink(config.c_str());

  auto channel = cli::MakeChannel(address);
  auto admin = v1::AdminService::NewStub(channel);
  auto worker = v1::WorkerService::NewStub(channel);
  const auto deadline = [] { return std::chrono::system_clock::now() + std::chrono::seconds(10); };

  v1::CreateJobRequest create;
  create.set_world_size(1);
  v1::CreateJobResponse created;
  {
    grpc::ClientContext context;
    context.set_deadline(deadline());
    ASSERT_TRUE(admin->CreateJob(&context, create, &created).ok());
  }
  v1::RankContext rank;
  rank.set_job_id(created.job_id());
  rank.set_incarnation(1);

  v1::JoinRequest join;
  *join.mutable_context() = rank;
  join.set_host("host-a");
  join.set_timeout_seconds(5);
  v1::JoinResponse joined;
  {
    grpc::ClientContext context;
    context.set_deadline(deadline());
    grpc::Status status = worker->Join(&context, join, &joined);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  EXPECT_DOUBLE_EQ(joined.heartbeat_interval_seconds(), 0.25);  // Flag.
  EXPECT_DOUBLE_EQ(joined.heartbeat_timeout_seconds(), 3);      // Env beats config.

  for (const auto& [size, code] : {std::pair{100, grpc::StatusCode::OK},
                                   std::pair{101, grpc::StatusCode::RESOURCE_EXHAUSTED}}) {
    v1::KvSetRequest set;
    *set.mutable_context() = rank;
    set.set_key("k");
    set.set_value(std::string(size, 'x'));
    v1::KvSetResponse set_response;
    grpc::ClientContext context;
    context.set_deadline(deadline());
    EXPECT_EQ(worker->KvSet(&context, set, &set_response).error_code(), code) << size;
  }

  coordinator.Signal(SIGTERM);
  auto status = coordinator.Wait(kStopTimeout);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(ExitCode(*status), 0);
}

TEST(CoordinatorProcess, BadFlagsAndConfigAreUsageErrors) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{MESH_COORDINATOR_BIN, "--port", "70000"},
        std::vector<std::string>{MESH_COORDINATOR_BIN, "--log-format", "xml"},
        // Rejected by ValidateOptions: the timeout must exceed the interval.
        std::vector<std::string>{MESH_COORDINATOR_BIN, "--heartbeat-timeout", "1",
                                 "--heartbeat-interval", "2"},
        std::vector<std::string>{MESH_COORDINATOR_BIN, "--kv-max-keys", "0"},
        // Only names refused by default may be allowed: not reserved ones,
        // not malformed ones, not names that need no allowing.
        std::vector<std::string>{MESH_COORDINATOR_BIN, "--allow-job-env", "LD_LIBRARY_PATH,RANK"},
        std::vector<std::string>{MESH_COORDINATOR_BIN, "--allow-job-env", "MESH_TOKEN"},
        std::vector<std::string>{MESH_COORDINATOR_BIN, "--allow-job-env", "A=B"},
        std::vector<std::string>{MESH_COORDINATOR_BIN, "--allow-job-env", "PATH"},
        std::vector<std::string>{MESH_COORDINATOR_BIN, "--config", "/nonexistent.yaml"}}) {
    auto process = Subprocess::Start(args);
    ASSERT_TRUE(process.ok());
    auto status = process->Wait(absl::Seconds(20));
    ASSERT_TRUE(status.ok());
    EXPECT_EQ(ExitCode(*status), 2) << args[1] << " " << args[2];
  }
}

}  // namespace coordinator_process_test
}  // namespace mesh
