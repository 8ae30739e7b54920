// Authentication and authorization through real gRPC: an in-process
// CoordinatorServer on 127.0.0.1:0 with TLS (certificates made by openssl
// for the test), token authentication and mTLS, and clients holding admin,
// user, agent and worker tokens. Each case checks the status code and that
// nothing the refused call aimed at was changed.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "common/security.h"
#include "coordinator/coordinator_server.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "mesh/v1/admin.grpc.pb.h"
#include "mesh/v1/job.grpc.pb.h"
#include "mesh/v1/worker.grpc.pb.h"
#include "tests/coordinator/job_rpc_test_util.h"
#include "tests/util/test_pki.h"

namespace mesh::coordinator {
namespace auth_rpc_test {

using ::mesh::coordinator::testing::Context;
using ::mesh::coordinator::testing::Spec;
using ::mesh::coordinator::testing::StreamReader;
using ::testing::HasSubstr;
using namespace mesh::v1;  // NOLINT

constexpr char kAdminToken[] = "admin-token-0123456789";
constexpr char kAliceToken[] = "alice-token-0123456789";
constexpr char kBobToken[] = "bob-token-000123456789";
constexpr char kAgentToken[] = "agent-token-node-1-0123";

MATCHER_P(HasCode, code, "") {
  *result_listener << "status " << arg.error_code() << ": " << arg.error_message();
  return arg.error_code() == code;
}

class AuthRpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!mesh::testing::HaveOpenssl()) GTEST_SKIP() << "no openssl binary to make certificates";
    char tmpl[] = "/tmp/mesh-auth-rpc-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto pki = mesh::testing::MakeTestPki(dir_ + "/pki");
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_ = *std::move(pki);
    tokens_ = dir_ + "/tokens.yaml";
    std::ofstream(tokens_) << "tokens:\n"
                           << "  - {name: ops, role: admin, token: " << kAdminToken << "}\n"
                           << "  - {name: alice, role: user, token: " << kAliceToken << "}\n"
                           << "  - {name: bob, role: user, token: " << kBobToken << "}\n"
                           << "  - {name: node-1, role: agent, token: " << kAgentToken << "}\n";
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(absl::ZeroDuration());
    server_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  void Start(bool mtls = false) {
    CoordinatorConfig config;
    config.listen_host = "127.0.0.1";
    config.port = 0;
    config.security.tls.cert_file = pki_.server_cert;
    config.security.tls.key_file = pki_.server_key;
    if (mtls) config.security.tls.client_ca_file = pki_.ca_cert;
    config.security.auth.tokens_file = tokens_;
    config.state_dir = dir_ + "/state";
    auto server = CoordinatorServer::Start(config);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  // A TLS channel trusting the test CA, presenting `token` (empty: none) and,
  // with `client_cert`, the test client certificate.
  std::shared_ptr<grpc::Channel> Channel(const std::string& token, bool client_cert = false) {
    security::ClientSecurity security;
    security.ca_file = pki_.ca_cert;
    security.token = token;
    if (client_cert) {
      security.cert_file = pki_.client_cert;
      security.key_file = pki_.client_key;
    }
    auto channel = security::MakeChannel(server_->address(), security);
    EXPECT_TRUE(channel.ok()) << channel.status();
    return *channel;
  }

  std::unique_ptr<JobService::Stub> Jobs(const std::string& token) {
    return JobService::NewStub(Channel(token));
  }
  std::unique_ptr<WorkerService::Stub> Workers(const std::string& token) {
    return WorkerService::NewStub(Channel(token));
  }
  std::unique_ptr<NodeService::Stub> Nodes(const std::string& token) {
    return NodeService::NewStub(Channel(token));
  }

  // An ad-hoc job (no owner) made by the admin, with one key set in it.
  void MakeAdHocJob(const std::string& job_id) {
    auto admin = AdminService::NewStub(Channel(kAdminToken));
    CreateJobRequest create;
    create.set_job_id(job_id);
    create.set_world_size(1);
    CreateJobResponse created;
    ASSERT_TRUE(admin->CreateJob(Context().get(), create, &created).ok());
    Join(kAdminToken, job_id, 0);
    KvSetRequest set;
    *set.mutable_context() = RankOf(job_id, 0);
    set.set_key("secret");
    set.set_value("original");
    KvSetResponse ignored;
    ASSERT_TRUE(Workers(kAdminToken)->KvSet(Context().get(), set, &ignored).ok());
  }

  // Rank 0 of `job_id` at `generation`, as the one process of these tests.
  static RankContext RankOf(const std::string& job_id, int64_t generation) {
    RankContext context;
    context.set_job_id(job_id);
    context.set_generation(generation);
    context.set_rank(0);
    context.set_incarnation(7);
    return context;
  }

  // Joins rank 0 of a world of one (KV calls need a joined rank).
  void Join(const std::string& token, const std::string& job_id, int64_t generation) {
    JoinRequest join;
    *join.mutable_context() = RankOf(job_id, generation);
    join.set_host("test-host");
    join.set_timeout_seconds(10);
    JoinResponse joined;
    const grpc::Status status = Workers(token)->Join(Context().get(), join, &joined);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }

  std::string KvValue(const std::string& token, const std::string& job_id, const std::string& key,
                      grpc::Status* status = nullptr) {
    KvGetRequest get;
    *get.mutable_context() = RankOf(job_id, 0);
    get.set_key(key);
    KvGetResponse value;
    grpc::Status s = Workers(token)->KvGet(Context().get(), get, &value);
    if (status != nullptr) *status = s;
    return value.value();
  }

  std::string Submit(const std::string& token) {
    SubmitJobRequest request;
    *request.mutable_spec() = Spec(1, 1);
    SubmitJobResponse response;
    grpc::Status status = Jobs(token)->SubmitJob(Context().get(), request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.job().id();
  }

  std::string dir_;
  mesh::testing::TestPki pki_;
  std::string tokens_;
  std::unique_ptr<CoordinatorServer> server_;
};

TEST_F(AuthRpcTest, MissingTokenIsUnauthenticatedOnEveryService) {
  Start();
  ListJobsRequest list;
  ListJobsResponse jobs;
  EXPECT_THAT(Jobs("")->ListJobs(Context().get(), list, &jobs),
              HasCode(grpc::StatusCode::UNAUTHENTICATED));
  KvGetRequest get;
  get.mutable_context()->set_job_id("adhoc-1");
  get.set_key("k");
  KvGetResponse value;
  EXPECT_THAT(Workers("")->KvGet(Context().get(), get, &value),
              HasCode(grpc::StatusCode::UNAUTHENTICATED));
  RegisterNodeRequest reg;
  reg.set_name("node-1");
  reg.set_slots(1);
  RegisterNodeResponse registered;
  EXPECT_THAT(Nodes("")->RegisterNode(Context().get(), reg, &registered),
              HasCode(grpc::StatusCode::UNAUTHENTICATED));
  GetServerInfoRequest info;
  GetServerInfoResponse info_response;
  EXPECT_THAT(
      AdminService::NewStub(Channel(""))->GetServerInfo(Context().get(), info, &info_response),
      HasCode(grpc::StatusCode::UNAUTHENTICATED));
}

TEST_F(AuthRpcTest, UnknownTokenIsUnauthenticated) {
  Start();
  ListJobsRequest list;
  ListJobsResponse jobs;
  const grpc::Status status =
      Jobs("not-a-known-token-at-all")->ListJobs(Context().get(), list, &jobs);
  EXPECT_THAT(status, HasCode(grpc::StatusCode::UNAUTHENTICATED));
  EXPECT_THAT(status.error_message(), HasSubstr("unknown token"));
}

TEST_F(AuthRpcTest, HealthNeedsNoToken) {
  Start();
  auto health = grpc::health::v1::Health::NewStub(Channel(""));
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  ASSERT_TRUE(health->Check(Context().get(), request, &response).ok());
  EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST_F(AuthRpcTest, SubmittedJobsAreOwnedAndOnlyTheOwnerOrAnAdminControlsThem) {
  Start();
  const std::string job = Submit(kAliceToken);
  GetJobRequest get;
  get.set_job_id(job);
  GetJobResponse got;
  ASSERT_TRUE(Jobs(kBobToken)->GetJob(Context().get(), get, &got).ok()) << "reads are open";
  EXPECT_EQ(got.job().owner(), "alice");

  CancelJobRequest cancel;
  cancel.set_job_id(job);
  CancelJobResponse cancelled;
  const grpc::Status denied = Jobs(kBobToken)->CancelJob(Context().get(), cancel, &cancelled);
  EXPECT_THAT(denied, HasCode(grpc::StatusCode::PERMISSION_DENIED));
  EXPECT_THAT(denied.error_message(), HasSubstr("owner: alice"));
  ASSERT_TRUE(Jobs(kBobToken)->GetJob(Context().get(), get, &got).ok());
  EXPECT_NE(got.job().state(), JOB_STATE_CANCELLED) << "a refused cancel changes nothing";

  // Logs are the owner's too.
  GetLogsRequest logs;
  logs.set_job_id(job);
  auto ctx = Context();
  auto reader = Jobs(kBobToken)->GetLogs(ctx.get(), logs);
  LogChunk chunk;
  while (reader->Read(&chunk)) {
  }
  EXPECT_THAT(reader->Finish(), HasCode(grpc::StatusCode::PERMISSION_DENIED));

  EXPECT_TRUE(Jobs(kAliceToken)->CancelJob(Context().get(), cancel, &cancelled).ok());
  const std::string other = Submit(kAliceToken);
  cancel.set_job_id(other);
  EXPECT_TRUE(Jobs(kAdminToken)->CancelJob(Context().get(), cancel, &cancelled).ok());
}

TEST_F(AuthRpcTest, IdempotencyKeysDoNotCrossOwners) {
  Start();
  SubmitJobRequest request;
  *request.mutable_spec() = Spec(1, 1);
  request.mutable_spec()->set_idempotency_key("nightly");
  SubmitJobResponse first;
  ASSERT_TRUE(Jobs(kAliceToken)->SubmitJob(Context().get(), request, &first).ok());
  SubmitJobResponse second;
  EXPECT_THAT(Jobs(kBobToken)->SubmitJob(Context().get(), request, &second),
              HasCode(grpc::StatusCode::ALREADY_EXISTS));
  EXPECT_TRUE(second.job().id().empty()) << "bob learns nothing of alice's job";
}

TEST_F(AuthRpcTest, AgentsActOnlyForTheirOwnNode) {
  Start();
  RegisterNodeRequest reg;
  reg.set_name("node-2");
  reg.set_address("127.0.0.1");
  reg.set_slots(1);
  RegisterNodeResponse registered;
  EXPECT_THAT(Nodes(kAgentToken)->RegisterNode(Context().get(), reg, &registered),
              HasCode(grpc::StatusCode::PERMISSION_DENIED));
  EXPECT_THAT(Nodes(kAliceToken)->RegisterNode(Context().get(), reg, &registered),
              HasCode(grpc::StatusCode::PERMISSION_DENIED));
  ListNodesRequest list;
  ListNodesResponse nodes;
  ASSERT_TRUE(Jobs(kAdminToken)->ListNodes(Context().get(), list, &nodes).ok());
  EXPECT_EQ(nodes.nodes_size(), 0) << "no node was registered";

  reg.set_name("node-1");
  ASSERT_TRUE(Nodes(kAgentToken)->RegisterNode(Context().get(), reg, &registered).ok());
  NodeHeartbeatRequest beat;
  beat.set_name("node-1");
  beat.set_session_id(registered.session_id());
  NodeHeartbeatResponse ignored;
  EXPECT_TRUE(Nodes(kAgentToken)->NodeHeartbeat(Context().get(), beat, &ignored).ok());
  // An agent token is not a user's: no JobService.
  ListJobsRequest jobs;
  ListJobsResponse page;
  EXPECT_THAT(Jobs(kAgentToken)->ListJobs(Context().get(), jobs, &page),
              HasCode(grpc::StatusCode::PERMISSION_DENIED));
}

// The whole chain: alice submits, the agent's LAUNCH carries the job's worker
// token, and that token reaches its own job's KV and nothing else.
TEST_F(AuthRpcTest, WorkerTokenFromTheLaunchOrderReachesOnlyItsJob) {
  Start();
  MakeAdHocJob("other-job");

  RegisterNodeRequest reg;
  reg.set_name("node-1");
  reg.set_address("127.0.0.1");
  reg.set_slots(2);
  RegisterNodeResponse registered;
  auto agent = Nodes(kAgentToken);
  ASSERT_TRUE(agent->RegisterNode(Context().get(), reg, &registered).ok());
  WatchAssignmentsRequest watch;
  watch.set_name("node-1");
  watch.set_session_id(registered.session_id());
  StreamReader<Assignment> orders(
      [&](grpc::ClientContext* ctx) { return agent->WatchAssignments(ctx, watch); });

  const std::string job = Submit(kAliceToken);
  std::optional<Assignment> launch;
  while ((launch = orders.Next()).has_value() && launch->action() != Assignment::ACTION_LAUNCH) {
  }
  ASSERT_TRUE(launch.has_value()) << "no LAUNCH order";
  ASSERT_EQ(launch->job_id(), job);
  const std::string worker_token = launch->worker_token();
  ASSERT_FALSE(worker_token.empty());

  // Its own job: allowed.
  Join(worker_token, job, launch->generation());
  KvSetRequest set;
  *set.mutable_context() = RankOf(job, launch->generation());
  set.set_key("k");
  set.set_value("v");
  KvSetResponse ignored;
  EXPECT_TRUE(Workers(worker_token)->KvSet(Context().get(), set, &ignored).ok());

  // Another job: every kind of call is refused, and the data is untouched.
  *set.mutable_context() = RankOf("other-job", 0);
  set.set_key("secret");
  set.set_value("overwritten");
  EXPECT_THAT(Workers(worker_token)->KvSet(Context().get(), set, &ignored),
              HasCode(grpc::StatusCode::PERMISSION_DENIED));
  grpc::Status read;
  KvValue(worker_token, "other-job", "secret", &read);
  EXPECT_THAT(read, HasCode(grpc::StatusCode::PERMISSION_DENIED));
  KvWaitRequest wait;
  wait.mutable_context()->set_job_id("other-job");
  wait.add_keys("secret");
  KvWaitResponse waited;
  EXPECT_THAT(Workers(worker_token)->KvWait(Context().get(), wait, &waited),
              HasCode(grpc::StatusCode::PERMISSION_DENIED));
  BarrierRequest barrier;
  barrier.mutable_context()->set_job_id("other-job");
  barrier.set_name("b");
  BarrierResponse passed;
  EXPECT_THAT(Workers(worker_token)->Barrier(Context().get(), barrier, &passed),
              HasCode(grpc::StatusCode::PERMISSION_DENIED));
  GetUniqueIdsRequest ids;
  ids.mutable_context()->set_job_id("other-job");
  ids.add_keys("world");
  GetUniqueIdsResponse got_ids;
  EXPECT_THAT(Workers(worker_token)->GetUniqueIds(Context().get(), ids, &got_ids),
              HasCode(grpc::StatusCode::PERMISSION_DENIED));
  WatchJobRequest watch_job;
  watch_job.mutable_context()->set_job_id("other-job");
  auto ctx = Context();
  auto events = Workers(worker_token)->WatchJob(ctx.get(), watch_job);
  mesh::v1::JobEvent event;
  while (events->Read(&event)) {
  }
  EXPECT_THAT(events->Finish(), HasCode(grpc::StatusCode::PERMISSION_DENIED));
  EXPECT_EQ(KvValue(kAdminToken, "other-job", "secret"), "original");

  // A worker token is no user token either.
  ListJobsRequest list;
  ListJobsResponse page;
  EXPECT_THAT(Jobs(worker_token)->ListJobs(Context().get(), list, &page),
              HasCode(grpc::StatusCode::PERMISSION_DENIED));
  // And bob, a user, cannot reach alice's job data.
  grpc::Status bob_read;
  KvValue(kBobToken, job, "k", &bob_read);
  EXPECT_THAT(bob_read, HasCode(grpc::StatusCode::PERMISSION_DENIED));
}

TEST_F(AuthRpcTest, MutualTlsRejectsClientsWithoutACertificate) {
  Start(/*mtls=*/true);
  GetServerInfoRequest request;
  GetServerInfoResponse response;
  EXPECT_THAT(AdminService::NewStub(Channel(kAdminToken))
                  ->GetServerInfo(Context(absl::Seconds(5)).get(), request, &response),
              HasCode(grpc::StatusCode::UNAVAILABLE));
  EXPECT_TRUE(AdminService::NewStub(Channel(kAdminToken, /*client_cert=*/true))
                  ->GetServerInfo(Context().get(), request, &response)
                  .ok());
}

TEST_F(AuthRpcTest, EditedTokenFileTakesEffectWithoutARestart) {
  Start();
  ListJobsRequest list;
  ListJobsResponse page;
  ASSERT_TRUE(Jobs(kBobToken)->ListJobs(Context().get(), list, &page).ok());
  // Revoke bob (write-then-rename, as a Secret update does).
  std::ofstream(tokens_ + ".new") << "tokens:\n  - {name: ops, role: admin, token: " << kAdminToken
                                  << "}\n";
  std::filesystem::rename(tokens_ + ".new", tokens_);
  // The ticker re-reads the file about once a second.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  grpc::Status status;
  do {
    absl::SleepFor(absl::Milliseconds(100));
    status = Jobs(kBobToken)->ListJobs(Context().get(), list, &page);
  } while (status.ok() && absl::Now() < deadline);
  EXPECT_THAT(status, HasCode(grpc::StatusCode::UNAUTHENTICATED));
  EXPECT_TRUE(Jobs(kAdminToken)->ListJobs(Context().get(), list, &page).ok());
}

TEST(CheckSecurityFlagsTest, PlaintextMustBeAskedForAndTlsMustAuthenticateClients) {
  CoordinatorSecurity none;
  EXPECT_TRUE(CheckSecurityFlags(none, /*insecure=*/true).ok());
  const absl::Status plaintext = CheckSecurityFlags(none, /*insecure=*/false);
  EXPECT_EQ(plaintext.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(plaintext.message()), HasSubstr("--insecure"));

  CoordinatorSecurity tls;
  tls.tls.cert_file = "c.pem";
  tls.tls.key_file = "k.pem";
  EXPECT_EQ(CheckSecurityFlags(tls, /*insecure=*/true).code(), absl::StatusCode::kInvalidArgument);
  const absl::Status anyone = CheckSecurityFlags(tls, /*insecure=*/false);
  EXPECT_EQ(anyone.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(anyone.message()), HasSubstr("--tls-client-ca"));

  CoordinatorSecurity mtls = tls;
  mtls.tls.client_ca_file = "ca.pem";
  EXPECT_TRUE(CheckSecurityFlags(mtls, false).ok());
  CoordinatorSecurity tokens = tls;
  tokens.auth.tokens_file = "tokens.yaml";
  EXPECT_TRUE(CheckSecurityFlags(tokens, false).ok());

  CoordinatorSecurity insecure_tokens;
  insecure_tokens.auth.tokens_file = "tokens.yaml";
  const absl::Status clear = CheckSecurityFlags(insecure_tokens, /*insecure=*/true);
  EXPECT_EQ(clear.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(clear.message()), HasSubstr("clear text"));
}

TEST(CoordinatorServerSecurityTest, TokensWithoutTlsAreRefused) {
  CoordinatorConfig config;
  config.port = 0;
  config.security.auth.tokens_file = "/nonexistent/tokens.yaml";
  auto server = CoordinatorServer::Start(config);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace auth_rpc_test
}  // namespace mesh::coordinator
