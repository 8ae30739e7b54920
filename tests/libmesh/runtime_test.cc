// Runtime: the worker environment contract (ResolveWorkerConfig), and the
// runtime's life against a real in-process coordinator on 127.0.0.1:0 with
// a recording fake backend (no collectives): join, heartbeats, clean
// shutdown, failure propagation (hang, ReportError, lost coordinator).
#include "mesh/runtime.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "libmesh/src/coordinator_client.h"
#include "mesh/store.h"
#include "tests/common/test_metrics.h"
#include "tests/util/in_process_coordinator.h"
#include "tests/util/test_pki.h"

namespace mesh {
namespace runtime_test {

using ::testing::HasSubstr;
using ::testing::Not;

// ---- ResolveWorkerConfig ----------------------------------------------------

EnvLookup MapEnv(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::map<std::string, std::string> FullEnv() {
  return {{"MESH_COORDINATOR", "coord.example:7450"},
          {"MESH_JOB_ID", "train-1"},
          {"MESH_GENERATION", "3"},
          {"MESH_RANK", "5"},
          {"MESH_WORLD_SIZE", "8"},
          {"MESH_LOCAL_RANK", "1"},
          {"MESH_LOCAL_WORLD_SIZE", "4"},
          {"MESH_NODE_RANK", "1"}};
}

RuntimeOptions WithEnv(std::map<std::string, std::string> vars) {
  RuntimeOptions options;
  options.env = MapEnv(std::move(vars));
  return options;
}

void ExpectInvalid(const RuntimeOptions& options, const std::string& substring) {
  absl::StatusOr<WorkerConfig> config = ResolveWorkerConfig(options);
  ASSERT_FALSE(config.ok()) << "expected an error containing: " << substring;
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << config.status();
  EXPECT_THAT(std::string(config.status().message()), HasSubstr(substring));
}

TEST(WorkerConfigTest, ReadsEveryVariable) {
  absl::StatusOr<WorkerConfig> config = ResolveWorkerConfig(WithEnv(FullEnv()));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->coordinator, "coord.example:7450");
  EXPECT_EQ(config->job_id, "train-1");
  EXPECT_EQ(config->generation, 3);
  EXPECT_EQ(config->rank, 5);
  EXPECT_EQ(config->world_size, 8);
  EXPECT_EQ(config->local_rank, 1);
  EXPECT_EQ(config->local_world_size, 4);
  EXPECT_EQ(config->node_rank, 1);
  EXPECT_EQ(config->auth_token, "");
  EXPECT_EQ(config->tls_ca, "");
}

TEST(WorkerConfigTest, TokenNeedsTheCoordinatorsCa) {
  auto env = FullEnv();
  env["MESH_TOKEN"] = "s3cr3t-token";
  ExpectInvalid(WithEnv(env), "MESH_TLS_CA is not");
  absl::StatusOr<WorkerConfig> config = ResolveWorkerConfig(WithEnv(env));
  EXPECT_THAT(std::string(config.status().message()), Not(HasSubstr("s3cr3t"))) << "a secret";
}

TEST(WorkerConfigTest, TlsFilesAreReadAndChecked) {
  auto env = FullEnv();
  env["MESH_TOKEN"] = "s3cr3t-token";
  env["MESH_TLS_CA"] = "/nonexistent/ca.pem";
  absl::StatusOr<WorkerConfig> config = ResolveWorkerConfig(WithEnv(env));
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound) << config.status();
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("/nonexistent/ca.pem"));

  if (!::mesh::testing::HaveOpenssl()) GTEST_SKIP() << "no openssl to make a CA";
  char dir[] = "/tmp/mesh-runtime-tls-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  auto pki = ::mesh::testing::MakeTestPki(std::string(dir) + "/pki");
  ASSERT_TRUE(pki.ok()) << pki.status();
  env["MESH_TLS_CA"] = pki->ca_cert;
  env["MESH_TLS_CERT"] = pki->client_cert;
  env["MESH_TLS_KEY"] = pki->client_key;
  env["MESH_TLS_SERVER_NAME"] = "localhost";
  config = ResolveWorkerConfig(WithEnv(env));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->auth_token, "s3cr3t-token");
  EXPECT_EQ(config->tls_ca, pki->ca_cert);
  EXPECT_EQ(config->tls_cert, pki->client_cert);
  EXPECT_EQ(config->tls_key, pki->client_key);
  EXPECT_EQ(config->tls_server_name, "localhost");
  std::filesystem::remove_all(dir);
}

TEST(WorkerConfigTest, OptionalVariablesMayBeAbsentOrEmpty) {
  auto env = FullEnv();
  env.erase("MESH_LOCAL_RANK");
  env.erase("MESH_NODE_RANK");
  env.erase("MESH_TOKEN");
  env["MESH_LOCAL_WORLD_SIZE"] = "";  // `export X=` counts as unset.
  absl::StatusOr<WorkerConfig> config = ResolveWorkerConfig(WithEnv(env));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->local_rank, -1);
  EXPECT_EQ(config->local_world_size, -1);
  EXPECT_EQ(config->node_rank, -1);
  EXPECT_EQ(config->auth_token, "");
}

TEST(WorkerConfigTest, OptionsOverrideTheEnvironment) {
  RuntimeOptions options = WithEnv(FullEnv());
  options.coordinator = "127.0.0.1:9000";
  options.job_id = "other";
  options.generation = 0;
  options.rank = 0;
  options.world_size = 2;
  options.local_rank = 0;
  options.local_world_size = 2;
  options.node_rank = 0;
  absl::StatusOr<WorkerConfig> config = ResolveWorkerConfig(options);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->coordinator, "127.0.0.1:9000");
  EXPECT_EQ(config->job_id, "other");
  EXPECT_EQ(config->generation, 0);
  EXPECT_EQ(config->rank, 0);
  EXPECT_EQ(config->world_size, 2);
  EXPECT_EQ(config->local_world_size, 2);

  // An option that is wrong is reported as the option.
  options.rank = 7;
  ExpectInvalid(options, "MESH_RANK (from RuntimeOptions::rank) is 7; it must be in [0, 1]");
}

TEST(WorkerConfigTest, WithoutAnEnvironmentOnlyOptionsCount) {
  RuntimeOptions options;
  options.env = nullptr;
  ExpectInvalid(options, "MESH_COORDINATOR is not set");
  options.coordinator = "127.0.0.1:1";
  options.job_id = "j";
  options.generation = 0;
  options.rank = 0;
  options.world_size = 1;
  EXPECT_TRUE(ResolveWorkerConfig(options).ok());
}

TEST(WorkerConfigTest, MissingRequiredVariablesAreNamed) {
  for (const char* name :
       {"MESH_COORDINATOR", "MESH_JOB_ID", "MESH_GENERATION", "MESH_RANK", "MESH_WORLD_SIZE"}) {
    auto env = FullEnv();
    env.erase(name);
    ExpectInvalid(WithEnv(env), absl::StrCat(name, " is not set"));
  }
}

TEST(WorkerConfigTest, MalformedValuesAreNamed) {
  struct Case {
    std::string variable;
    std::string value;
    std::string message;
  };
  const Case cases[] = {
      {"MESH_RANK", "abc", "MESH_RANK (from the environment) is 'abc', not an integer"},
      {"MESH_RANK", "8", "MESH_RANK (from the environment) is 8; it must be in [0, 7]"},
      {"MESH_RANK", "-1", "must be in [0, 7]"},
      {"MESH_RANK", "1.5", "not an integer"},
      {"MESH_WORLD_SIZE", "0", "MESH_WORLD_SIZE (from the environment) is 0"},
      {"MESH_WORLD_SIZE", "99999999999", "not an integer"},
      {"MESH_GENERATION", "-2", "MESH_GENERATION (from the environment) is -2"},
      {"MESH_GENERATION", "x1", "not an integer"},
      {"MESH_LOCAL_WORLD_SIZE", "9", "MESH_LOCAL_WORLD_SIZE (from the environment) is 9"},
      {"MESH_LOCAL_RANK", "4", "MESH_LOCAL_RANK (from the environment) is 4; it must be in [0, 3]"},
      {"MESH_NODE_RANK", "-1", "MESH_NODE_RANK (from the environment) is -1"},
      {"MESH_COORDINATOR", "coord.example", "is 'coord.example', not host:port"},
      {"MESH_COORDINATOR", "coord.example:", "not host:port"},
      {"MESH_COORDINATOR", "coord.example:0", "not host:port"},
      {"MESH_COORDINATOR", "coord.example:65536", "not host:port"},
      {"MESH_COORDINATOR", ":7450", "not host:port"},
      {"MESH_COORDINATOR", "::1:7450", "not host:port"},
      {"MESH_JOB_ID", "has space", "MESH_JOB_ID (from the environment) is 'has space'"},
      {"MESH_JOB_ID", std::string(129, 'a'), "1 to 128"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.variable, "=", c.value));
    auto env = FullEnv();
    env[c.variable] = c.value;
    ExpectInvalid(WithEnv(env), c.message);
  }
}

TEST(WorkerConfigTest, AcceptedCoordinatorForms) {
  for (const char* target :
       {"localhost:7450", "10.0.0.1:1", "[::1]:7450", "dns:///coord:7450", "unix:/tmp/c.sock"}) {
    auto env = FullEnv();
    env["MESH_COORDINATOR"] = target;
    absl::StatusOr<WorkerConfig> config = ResolveWorkerConfig(WithEnv(env));
    EXPECT_TRUE(config.ok()) << target << ": " << config.status();
  }
}

TEST(WorkerConfigTest, BadTokenIsRejectedWithoutEchoingIt) {
  auto env = FullEnv();
  env["MESH_TOKEN"] = "secret\nvalue";
  absl::StatusOr<WorkerConfig> config = ResolveWorkerConfig(WithEnv(env));
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("MESH_TOKEN"));
  EXPECT_THAT(std::string(config.status().message()), Not(HasSubstr("secret")));
}

// ---- The runtime against a real coordinator ---------------------------------

// Records AbortAll; makes no groups.
class RecordingFactory final : public ProcessGroupFactory {
 public:
  RecordingFactory(int rank, int world_size) : rank_(rank), world_size_(world_size) {}
  int world_rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  absl::StatusOr<std::shared_ptr<ProcessGroup>> World() override {
    return absl::UnimplementedError("recording factory");
  }
  absl::StatusOr<std::vector<std::shared_ptr<ProcessGroup>>> NewGroups(
      const std::vector<GroupSpec>&) override {
    return absl::UnimplementedError("recording factory");
  }
  absl::StatusOr<std::vector<std::shared_ptr<ProcessGroup>>> NewGroupsAmongMembers(
      const std::vector<GroupSpec>&) override {
    return absl::UnimplementedError("recording factory");
  }
  void AbortAll(absl::Status reason) override {
    absl::MutexLock lock(&mu_);
    aborts_.push_back(std::move(reason));
  }
  std::vector<absl::Status> aborts() const {
    absl::MutexLock lock(&mu_);
    return aborts_;
  }

 private:
  const int rank_;
  const int world_size_;
  mutable absl::Mutex mu_;
  std::vector<absl::Status> aborts_ ABSL_GUARDED_BY(mu_);
};

// Polls `done` every 5 ms for at most `limit`.
bool WaitFor(const std::function<bool()>& done, absl::Duration limit) {
  const absl::Time deadline = absl::Now() + limit;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

// A TCP listener on 127.0.0.1 at a port the kernel picks, standing where a
// coordinator will listen. Not thread-safe.
class PlaceHolder {
 public:
  PlaceHolder() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) return;
    const int one = 1;
    setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof(addr);
    if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd_, 8) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      Close();
      return;
    }
    port_ = ntohs(addr.sin_port);
  }
  ~PlaceHolder() { Close(); }
  PlaceHolder(const PlaceHolder&) = delete;
  PlaceHolder& operator=(const PlaceHolder&) = delete;

  bool ok() const { return port_ > 0; }
  int port() const { return port_; }

  // Waits up to `limit` for a client to connect, then closes that
  // connection at once. Returns whether one came.
  bool AcceptAndDrop(absl::Duration limit) {
    pollfd pfd{fd_, POLLIN, 0};
    if (poll(&pfd, 1, static_cast<int>(absl::ToInt64Milliseconds(limit))) != 1) return false;
    const int conn = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) return false;
    close(conn);
    return true;
  }

  // Stops listening, so the port is free for the coordinator. Idempotent.
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  int port_ = 0;
};

class RuntimeTest : public ::testing::Test {
 protected:
  static constexpr absl::Duration kInterval = absl::Milliseconds(50);
  static constexpr absl::Duration kTimeout = absl::Milliseconds(300);

  static coordinator::CoordinatorConfig Config(absl::Duration interval = kInterval,
                                               absl::Duration timeout = kTimeout) {
    coordinator::CoordinatorConfig config = testing::InProcessCoordinator::DefaultConfig();
    config.coordination.heartbeat_interval = interval;
    config.coordination.heartbeat_timeout = timeout;
    return config;
  }

  void StartCoordinator(int world_size, absl::Duration interval = kInterval,
                        absl::Duration timeout = kTimeout) {
    StartCoordinator(world_size, Config(interval, timeout));
  }

  // A coordinator serving job "job" of `world_size` ranks on a 1-D mesh "dp".
  void StartCoordinator(int world_size, const coordinator::CoordinatorConfig& config) {
    {
      absl::MutexLock lock(&mu_);
      factories_.resize(world_size);
    }
    auto coordinator = testing::InProcessCoordinator::Start(config);
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = *std::move(coordinator);
    ASSERT_TRUE(coordinator_->CreateJob("job", world_size, {world_size}, {"dp"}).ok());
  }

  RuntimeOptions Options(int rank, int world_size) {
    RuntimeOptions options;
    options.env = nullptr;
    if (coordinator_ != nullptr) options.coordinator = coordinator_->address();
    options.job_id = "job";
    options.generation = 0;
    options.rank = rank;
    options.world_size = world_size;
    options.host = absl::StrCat("host-", rank);
    options.join_timeout = absl::Seconds(20);
    options.rpc_timeout = absl::Seconds(5);
    options.backend.name = "recording";
    options.backend.make_factory =
        [this](
            const BackendContext& context) -> absl::StatusOr<std::shared_ptr<ProcessGroupFactory>> {
      auto factory = std::make_shared<RecordingFactory>(context.join.rank, context.join.world_size);
      absl::MutexLock lock(&mu_);
      factories_[context.join.rank] = factory;
      return factory;
    };
    return options;
  }

  // Joins every rank at once (Join waits for the whole world).
  std::vector<absl::StatusOr<std::unique_ptr<Runtime>>> InitAll(
      std::vector<RuntimeOptions> options) {
    std::vector<absl::StatusOr<std::unique_ptr<Runtime>>> runtimes(options.size());
    std::vector<std::thread> threads;
    for (size_t r = 0; r < options.size(); ++r) {
      threads.emplace_back([&, r] { runtimes[r] = Runtime::Init(std::move(options[r])); });
    }
    for (auto& t : threads) t.join();
    return runtimes;
  }

  std::vector<std::unique_ptr<Runtime>> InitWorld(int world_size) {
    std::vector<RuntimeOptions> options;
    for (int r = 0; r < world_size; ++r) options.push_back(Options(r, world_size));
    std::vector<std::unique_ptr<Runtime>> out;
    for (auto& runtime : InitAll(std::move(options))) {
      EXPECT_TRUE(runtime.ok()) << runtime.status();
      if (runtime.ok()) out.push_back(*std::move(runtime));
    }
    return out;
  }

  std::shared_ptr<RecordingFactory> Factory(int rank) {
    absl::MutexLock lock(&mu_);
    return factories_[rank];
  }

  bool JobFailed() { return coordinator_->JobFailed("job"); }

  // Successful heartbeats the coordinator has answered (its RPC metrics):
  // only for a coordinator configured with `metrics = &registry_`.
  uint64_t HeartbeatsAnswered() const {
    return registry_.HistogramCount("mesh_coordinator_rpc_duration_seconds",
                                    {"mesh.v1.WorkerService", "Heartbeat", "OK"});
  }

  // Moves the coordinator's FakeClock `clock_` forward by `total` in steps
  // of a quarter of `timeout`, running its liveness check (Tick) after each.
  // Before each step, waits until the coordinator has answered at least two
  // more heartbeats per rank in `live` than before the previous step. A rank
  // is declared dead only after silence longer than `timeout` of coordinator
  // time, i.e. only if it sends nothing through four steps in a row, however
  // slowly this machine runs. Returns false when the heartbeats stop coming
  // (30 s of real time for one step).
  bool AdvanceWhileHeartbeating(absl::Duration total, absl::Duration timeout, int live) {
    const absl::Duration step = timeout / 4;
    for (absl::Duration moved; moved < total; moved += step) {
      const uint64_t before = HeartbeatsAnswered();
      if (!WaitFor([&] { return HeartbeatsAnswered() >= before + 2 * live; }, absl::Seconds(30))) {
        return false;
      }
      clock_.Advance(step);
      coordinator_->coordination().Tick();
    }
    return true;
  }

  // For a coordinator on a FakeClock with its ticker off; both outlive
  // coordinator_ (declared before it).
  FakeClock clock_;
  metrics::testing::TestRegistry registry_;
  std::unique_ptr<testing::InProcessCoordinator> coordinator_;
  absl::Mutex mu_;
  std::vector<std::shared_ptr<RecordingFactory>> factories_ ABSL_GUARDED_BY(mu_);
};

TEST_F(RuntimeTest, JoinInfoComesFromTheCoordinator) {
  StartCoordinator(2);
  auto runtimes = InitWorld(2);
  ASSERT_EQ(runtimes.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    const JoinInfo& info = runtimes[r]->info();
    EXPECT_EQ(info.rank, r);
    EXPECT_EQ(info.world_size, 2);
    EXPECT_EQ(info.local_rank, 0);  // One rank per host.
    EXPECT_EQ(info.local_world_size, 1);
    EXPECT_EQ(info.node_rank, r);
    EXPECT_EQ(info.num_nodes, 2);
    EXPECT_EQ(info.mesh_shape, std::vector<int64_t>{2});
    EXPECT_EQ(info.mesh_dim_names, std::vector<std::string>{"dp"});
    EXPECT_EQ(info.heartbeat_interval, kInterval);
    EXPECT_EQ(info.heartbeat_timeout, kTimeout);
    EXPECT_EQ(info.host, absl::StrCat("host-", r));
    EXPECT_NE(info.incarnation, 0u);
    EXPECT_TRUE(info.world_unique_id.empty());
    EXPECT_TRUE(runtimes[r]->health().ok());
    // The Runtime's factory wraps the backend's (to track collective
    // progress) and forwards to it.
    EXPECT_EQ(runtimes[r]->process_group_factory()->world_rank(), r);
    EXPECT_THAT(runtimes[r]->process_group_factory()->World().status().message(),
                HasSubstr("recording factory"));
  }
  EXPECT_NE(runtimes[0]->info().incarnation, runtimes[1]->info().incarnation);
  // The store is the job's: what one rank sets, the other reads.
  ASSERT_TRUE(runtimes[0]->store()->Set("k", "v").ok());
  absl::StatusOr<std::string> value = runtimes[1]->store()->Get("k");
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "v");
}

TEST_F(RuntimeTest, HeartbeatsKeepRanksAliveAndShutdownLeavesCleanly) {
  // The coordinator's time is a FakeClock that moves only once the ranks'
  // heartbeats have reached it (AdvanceWhileHeartbeating), so its liveness
  // check sees what the heartbeats do, not how busy this machine is. The
  // timeout is long in real time too: the runtimes bound their heartbeat
  // calls by it.
  constexpr absl::Duration kLongTimeout = absl::Seconds(10);
  coordinator::CoordinatorConfig config = Config(kInterval, kLongTimeout);
  config.clock = &clock_;
  config.run_ticker = false;
  config.metrics = &registry_;
  StartCoordinator(2, config);
  auto runtimes = InitWorld(2);
  ASSERT_EQ(runtimes.size(), 2u);
  // Six heartbeat timeouts with nothing else going on: without heartbeats
  // the coordinator would declare both ranks dead.
  ASSERT_TRUE(AdvanceWhileHeartbeating(6 * kLongTimeout, kLongTimeout, /*live=*/2))
      << "the ranks stopped heartbeating";
  EXPECT_FALSE(JobFailed());
  for (auto& runtime : runtimes) EXPECT_TRUE(runtime->health().ok()) << runtime->health();

  // Rank 0 leaves; rank 1 stays healthy well past the heartbeat timeout.
  EXPECT_TRUE(runtimes[0]->Shutdown().ok());
  EXPECT_TRUE(runtimes[0]->Shutdown().ok());  // Idempotent.
  EXPECT_EQ(runtimes[0]->health().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(AdvanceWhileHeartbeating(3 * kLongTimeout, kLongTimeout, /*live=*/1))
      << "rank 1 stopped heartbeating";
  EXPECT_FALSE(JobFailed());
  EXPECT_TRUE(runtimes[1]->health().ok()) << runtimes[1]->health();
  EXPECT_TRUE(runtimes[1]->Shutdown().ok());
  EXPECT_FALSE(JobFailed());
  EXPECT_TRUE(Factory(0)->aborts().empty());
  EXPECT_TRUE(Factory(1)->aborts().empty());
}

TEST_F(RuntimeTest, AHungRankIsNamedToItsPeerWhichAbortsItsGroups) {
  StartCoordinator(3);
  std::vector<RuntimeOptions> options;
  std::atomic<int> failures{0};
  for (int r = 0; r < 3; ++r) {
    options.push_back(Options(r, 3));
    options.back().on_failure = [&failures](const absl::Status&) { ++failures; };
  }
  auto results = InitAll(std::move(options));
  for (auto& result : results) ASSERT_TRUE(result.ok()) << result.status();
  const absl::Time hung_at = absl::Now();
  (*results[2])->SimulateHangForTesting();

  for (int r : {0, 1}) {
    ASSERT_TRUE(WaitFor([&] { return !Factory(r)->aborts().empty(); }, absl::Seconds(10)))
        << "rank " << r << " never aborted its groups";
  }
  // Detected after the heartbeat timeout plus a few intervals, not minutes.
  EXPECT_LT(absl::Now() - hung_at, kTimeout + 20 * kInterval);
  for (int r : {0, 1}) {
    const absl::Status error = (*results[r])->health();
    EXPECT_EQ(error.code(), absl::StatusCode::kAborted) << error;
    EXPECT_THAT(std::string(error.message()), HasSubstr("rank 2 (host-2)"));
    ASSERT_EQ(Factory(r)->aborts().size(), 1u);
    EXPECT_EQ(Factory(r)->aborts()[0], error);
    // A failed runtime refuses to make groups.
    EXPECT_EQ((*results[r])->InitDeviceMesh({3}).status().code(), absl::StatusCode::kAborted);
    // Nothing to leave once the job failed.
    EXPECT_TRUE((*results[r])->Shutdown().ok());
  }
  EXPECT_EQ(failures.load(), 2);
  // The hung rank never heard of it: it sent and received nothing.
  EXPECT_TRUE(Factory(2)->aborts().empty());
}

TEST_F(RuntimeTest, ReportErrorFailsEveryRankIncludingTheReporter) {
  StartCoordinator(2);
  auto runtimes = InitWorld(2);
  ASSERT_EQ(runtimes.size(), 2u);
  ASSERT_TRUE(runtimes[1]->ReportError("CUDA out of memory").ok());
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(WaitFor([&] { return !runtimes[r]->health().ok(); }, absl::Seconds(10)));
    const absl::Status error = runtimes[r]->health();
    EXPECT_EQ(error.code(), absl::StatusCode::kAborted);
    EXPECT_THAT(std::string(error.message()), HasSubstr("rank 1 (host-1)"));
    EXPECT_THAT(std::string(error.message()), HasSubstr("CUDA out of memory"));
    ASSERT_TRUE(WaitFor([&] { return !Factory(r)->aborts().empty(); }, absl::Seconds(10)));
    EXPECT_EQ(Factory(r)->aborts()[0], error);
  }
  EXPECT_TRUE(JobFailed());
}

// In-place recovery (docs/elastic.md): a rank that reports an error is lost,
// not the job. It fails alone; the others stay healthy, agree through
// AliveRanks that they two carry on, and see the new membership epoch.
TEST_F(RuntimeTest, WithInPlaceRecoveryALostRankFailsAloneAndTheOthersAgreeOnTheRest) {
  StartCoordinator(3);
  ASSERT_TRUE(coordinator_->coordination().RemoveJob("job", "re-created in place").ok());
  coordinator::JobLayout layout;
  layout.job_id = "job";
  layout.world_size = 3;
  layout.in_place = true;
  ASSERT_TRUE(coordinator_->CreateJob(layout).ok());
  auto runtimes = InitWorld(3);
  ASSERT_EQ(runtimes.size(), 3u);
  EXPECT_EQ(runtimes[0]->info().membership_epoch, 0);

  ASSERT_TRUE(runtimes[2]->ReportError("CUDA out of memory").ok());
  ASSERT_TRUE(WaitFor([&] { return !runtimes[2]->health().ok(); }, absl::Seconds(10)));
  EXPECT_THAT(std::string(runtimes[2]->health().message()), HasSubstr("CUDA out of memory"));

  std::vector<absl::StatusOr<AliveRanksResult>> agreed(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] { agreed[r] = runtimes[r]->AliveRanks(absl::Seconds(10)); });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(agreed[r].ok()) << agreed[r].status();
    ASSERT_EQ(agreed[r]->ranks.size(), 2u);
    EXPECT_EQ(agreed[r]->ranks[0].rank, 0);
    EXPECT_EQ(agreed[r]->ranks[1].rank, 1);
    EXPECT_EQ(agreed[r]->ranks[1].incarnation, runtimes[1]->info().incarnation);
    EXPECT_EQ(agreed[r]->membership_epoch, 1);
    EXPECT_EQ(agreed[r]->round, 1);
    EXPECT_TRUE(runtimes[r]->health().ok()) << runtimes[r]->health();
  }
  ASSERT_TRUE(WaitFor([&] { return runtimes[0]->membership_epoch() == 1; }, absl::Seconds(10)));
  EXPECT_FALSE(JobFailed());
  EXPECT_TRUE(Factory(0)->aborts().empty()) << "a lost peer aborts nobody's groups";
  // The lost rank's own call is refused with its error.
  EXPECT_EQ(runtimes[2]->AliveRanks(absl::Seconds(1)).status().code(), absl::StatusCode::kAborted);
}

TEST_F(RuntimeTest, FinishReportsAnOwnErrorOnceAndLeavesOnSuccess) {
  StartCoordinator(3);
  auto runtimes = InitWorld(3);
  ASSERT_EQ(runtimes.size(), 3u);
  // Rank 2 finishes well: it leaves, and nobody fails.
  EXPECT_TRUE(runtimes[2]->Finish(absl::OkStatus()).ok());
  EXPECT_EQ(runtimes[2]->health().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(JobFailed());
  // Rank 1's own error becomes the job's, naming it.
  const absl::Status oom = absl::ResourceExhaustedError("CUDA out of memory");
  EXPECT_EQ(runtimes[1]->Finish(oom), oom);
  ASSERT_TRUE(WaitFor([&] { return !runtimes[0]->health().ok(); }, absl::Seconds(10)));
  const absl::Status error = runtimes[0]->health();
  EXPECT_THAT(std::string(error.message()), HasSubstr("rank 1 (host-1)"));
  EXPECT_THAT(std::string(error.message()), HasSubstr("CUDA out of memory"));
  EXPECT_TRUE(JobFailed());
  // Rank 0 then fails because of it: its Finish returns its own status,
  // and the job's error stays rank 1's.
  const absl::Status peer = absl::AbortedError("collective failed");
  EXPECT_EQ(runtimes[0]->Finish(peer), peer);
  EXPECT_EQ(runtimes[0]->health(), error);
}

TEST_F(RuntimeTest, LosingTheCoordinatorFailsRanksWithUnavailable) {
  StartCoordinator(2);
  auto runtimes = InitWorld(2);
  ASSERT_EQ(runtimes.size(), 2u);
  coordinator_->Stop(absl::Milliseconds(100));
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(WaitFor([&] { return !runtimes[r]->health().ok(); }, absl::Seconds(15)));
    const absl::Status error = runtimes[r]->health();
    EXPECT_EQ(error.code(), absl::StatusCode::kUnavailable) << error;
    EXPECT_THAT(std::string(error.message()), HasSubstr("lost the coordinator"));
    EXPECT_EQ(Factory(r)->aborts().size(), 1u);
  }
}

TEST_F(RuntimeTest, WorldUniqueIdFromRankZeroReachesEveryRank) {
  StartCoordinator(3);
  const std::string id(128, '\x42');
  std::atomic<int> generated{0};
  std::vector<RuntimeOptions> options;
  for (int r = 0; r < 3; ++r) {
    options.push_back(Options(r, 3));
    options.back().backend.make_world_unique_id = [&]() -> absl::StatusOr<std::string> {
      ++generated;
      return id;
    };
  }
  auto results = InitAll(std::move(options));
  for (auto& result : results) {
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ((*result)->info().world_unique_id, id);
  }
  EXPECT_EQ(generated.load(), 1);  // Rank 0 only.
}

TEST_F(RuntimeTest, AJoinReplyThatContradictsTheEnvironmentFailsTheJob) {
  StartCoordinator(2);
  std::vector<RuntimeOptions> options = {Options(0, 2), Options(1, 2)};
  options[1].local_world_size = 2;  // The coordinator sees one rank per host.
  auto results = InitAll(std::move(options));
  ASSERT_FALSE(results[1].ok());
  EXPECT_EQ(results[1].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(results[1].status().message()),
              HasSubstr("MESH_LOCAL_WORLD_SIZE is 2 but the coordinator's join reply says 1"));
  // Rank 1 told the coordinator, so rank 0 fails too instead of waiting:
  // during its own Init, or right after it.
  absl::Status rank0 = results[0].status();
  if (results[0].ok()) {
    ASSERT_TRUE(WaitFor([&] { return !(*results[0])->health().ok(); }, absl::Seconds(10)));
    rank0 = (*results[0])->health();
  }
  EXPECT_EQ(rank0.code(), absl::StatusCode::kAborted) << rank0;
  EXPECT_THAT(std::string(rank0.message()), HasSubstr("rank 1 (host-1)"));
  EXPECT_THAT(std::string(rank0.message()), HasSubstr("MESH_LOCAL_WORLD_SIZE is 2"));
}

TEST_F(RuntimeTest, InitErrorsNameWhatWentWrong) {
  StartCoordinator(1);
  RuntimeOptions unknown = Options(0, 1);
  unknown.job_id = "no-such-job";
  absl::StatusOr<std::unique_ptr<Runtime>> runtime = Runtime::Init(unknown);
  EXPECT_EQ(runtime.status().code(), absl::StatusCode::kNotFound) << runtime.status();
  EXPECT_THAT(std::string(runtime.status().message()), HasSubstr("rank 0 of job no-such-job"));

  RuntimeOptions no_backend = Options(0, 1);
  no_backend.backend.make_factory = nullptr;
  EXPECT_EQ(Runtime::Init(no_backend).status().code(), absl::StatusCode::kInvalidArgument);

  RuntimeOptions bad_timeout = Options(0, 1);
  bad_timeout.join_timeout = absl::ZeroDuration();
  EXPECT_THAT(std::string(Runtime::Init(bad_timeout).status().message()),
              HasSubstr("join_timeout"));

  RuntimeOptions failing_backend = Options(0, 1);
  failing_backend.backend.make_factory =
      [](const BackendContext&) -> absl::StatusOr<std::shared_ptr<ProcessGroupFactory>> {
    return absl::InternalError("no transport");
  };
  runtime = Runtime::Init(failing_backend);
  EXPECT_EQ(runtime.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(runtime.status().message()), HasSubstr("no transport"));
  // It reported itself, so the generation is failed rather than waiting for
  // a rank that will never heartbeat.
  EXPECT_TRUE(JobFailed());
}

TEST_F(RuntimeTest, JoinTimesOutNamingTheMissingRank) {
  StartCoordinator(2);
  RuntimeOptions alone = Options(0, 2);
  alone.join_timeout = absl::Milliseconds(300);
  absl::StatusOr<std::unique_ptr<Runtime>> runtime = Runtime::Init(alone);
  EXPECT_EQ(runtime.status().code(), absl::StatusCode::kDeadlineExceeded) << runtime.status();
  EXPECT_THAT(std::string(runtime.status().message()), HasSubstr("missing ranks 1"));
}

TEST_F(RuntimeTest, JoinWaitsForACoordinatorThatComesUpLate) {
  // A bare listener holds a free port until the worker has dialed it: that
  // first attempt is accepted and dropped, finding no coordinator, so the
  // worker is retrying when the coordinator comes up on the port.
  PlaceHolder holder;
  ASSERT_TRUE(holder.ok()) << "cannot listen on 127.0.0.1";
  RuntimeOptions options = Options(0, 1);
  options.coordinator = absl::StrCat("127.0.0.1:", holder.port());
  options.join_timeout = absl::Seconds(30);

  absl::StatusOr<std::unique_ptr<Runtime>> runtime = absl::UnknownError("not run");
  std::thread worker([&] { runtime = Runtime::Init(options); });
  const bool dialed = holder.AcceptAndDrop(absl::Seconds(30));
  holder.Close();
  if (!dialed) {
    worker.join();
    FAIL() << "the worker never dialed the coordinator's address; Init: " << runtime.status();
  }

  coordinator::CoordinatorConfig config = Config();
  config.port = holder.port();
  {
    absl::MutexLock lock(&mu_);
    factories_.resize(1);
  }
  auto coordinator = testing::InProcessCoordinator::Start(config);
  if (!coordinator.ok()) {
    worker.join();
    GTEST_SKIP() << "port " << holder.port() << " was taken meanwhile: " << coordinator.status();
  }
  coordinator_ = *std::move(coordinator);
  ASSERT_TRUE(coordinator_->CreateJob("job", 1, {1}, {"dp"}).ok());
  worker.join();
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  EXPECT_TRUE((*runtime)->health().ok());
}

TEST_F(RuntimeTest, AnUnreachableCoordinatorIsUnavailableAtTheJoinDeadline) {
  StartCoordinator(1);
  const std::string address = coordinator_->address();
  coordinator_->Stop();
  RuntimeOptions options = Options(0, 1);
  options.coordinator = address;
  options.join_timeout = absl::Milliseconds(500);
  absl::StatusOr<std::unique_ptr<Runtime>> runtime = Runtime::Init(options);
  EXPECT_EQ(runtime.status().code(), absl::StatusCode::kUnavailable) << runtime.status();
  EXPECT_THAT(std::string(runtime.status().message()), HasSubstr(address));
}

// The unique-ID broker calls the NCCL backend builds on, through the client
// the runtime uses.
TEST_F(RuntimeTest, ClientPublishesAndFetchesUniqueIdsInOneCallEach) {
  // These bare clients do not heartbeat: a long timeout keeps them alive.
  StartCoordinator(2, kInterval, absl::Seconds(60));
  std::vector<std::shared_ptr<internal::CoordinatorClient>> clients;
  for (int r = 0; r < 2; ++r) {
    RankIdentity identity{"job", 0, r, 1000u + r};
    internal::CoordinatorClientOptions options;
    options.auth_token = "token";  // Sent as metadata; this coordinator ignores it.
    clients.push_back(internal::NewGrpcCoordinatorClient(
        *internal::NewCoordinatorChannel(coordinator_->address()), coordinator_->address(),
        identity, options));
  }
  std::vector<absl::StatusOr<internal::JoinResult>> joined(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      internal::JoinParams params;
      params.host = "h";
      params.timeout = absl::Seconds(10);
      joined[r] = clients[r]->Join(params);
    });
  }
  for (auto& t : threads) t.join();
  for (auto& j : joined) ASSERT_TRUE(j.ok()) << j.status();

  const std::string a(128, 'a');
  const std::string b(128, 'b');
  ASSERT_TRUE(
      clients[0]->PublishUniqueIds({{"mesh0/tp/0", a}, {"mesh0/tp/1", b}}, absl::Seconds(5)).ok());
  const std::vector<std::string> keys = {"mesh0/tp/1", "mesh0/tp/0"};
  absl::StatusOr<std::vector<std::string>> ids = clients[1]->GetUniqueIds(keys, absl::Seconds(5));
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, (std::vector<std::string>{b, a}));
  // A key nobody publishes: DEADLINE_EXCEEDED from the coordinator, naming it.
  const std::vector<std::string> missing = {"mesh0/dp/0"};
  ids = clients[1]->GetUniqueIds(missing, absl::Milliseconds(100));
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kDeadlineExceeded) << ids.status();
  EXPECT_THAT(std::string(ids.status().message()), HasSubstr("mesh0/dp/0"));
  for (auto& client : clients) EXPECT_TRUE(client->Leave(absl::Seconds(5)).ok());
}

}  // namespace runtime_test
}  // namespace mesh
