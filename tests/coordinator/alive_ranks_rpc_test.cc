// In-place recovery and WorkerService.AliveRanks through a real in-process
// server on 127.0.0.1:0, as a client written from the protos sees them:
// AdminService.CreateJob with in_place, a rank lost while its peers wait in
// AliveRanks, the membership epoch and lost ranks in Heartbeat replies, a
// new process joining as the lost rank, and the errors the RPC documents.
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator_server.h"
#include "mesh/v1/admin.grpc.pb.h"
#include "mesh/v1/worker.grpc.pb.h"

namespace mesh::coordinator {
namespace alive_ranks_rpc_test {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace mesh::v1;  // NOLINT

std::unique_ptr<grpc::ClientContext> Context(int seconds = 30) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
  return ctx;
}

std::vector<int> RanksOf(const AliveRanksResponse& reply) {
  std::vector<int> ranks;
  for (const mesh::v1::AliveRank& r : reply.ranks()) ranks.push_back(r.rank());
  return ranks;
}

class AliveRanksRpcTest : public ::testing::Test {
 protected:
  static constexpr int kWorld = 3;

  void SetUp() override {
    CoordinatorConfig config;
    config.port = 0;
    config.coordination.heartbeat_interval = absl::Seconds(1);
    config.coordination.heartbeat_timeout = absl::Seconds(30);
    auto server = CoordinatorServer::Start(config);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    auto channel = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    workers_ = WorkerService::NewStub(channel);
    admin_ = AdminService::NewStub(channel);
  }

  // Creates `job` over AdminService and joins every rank.
  void StartJob(const std::string& job, bool in_place) {
    CreateJobRequest create;
    create.set_job_id(job);
    create.set_world_size(kWorld);
    create.set_in_place(in_place);
    CreateJobResponse created;
    const grpc::Status s = admin_->CreateJob(Context().get(), create, &created);
    ASSERT_TRUE(s.ok()) << s.error_message();
    std::vector<std::future<grpc::Status>> joins;
    for (int r = 0; r < kWorld; ++r) {
      joins.push_back(std::async(std::launch::async, [this, job, r] {
        JoinRequest join;
        *join.mutable_context() = Rank(job, r);
        join.set_host(absl::StrCat("host-", r));
        join.set_timeout_seconds(20);
        JoinResponse reply;
        return workers_->Join(Context().get(), join, &reply);
      }));
    }
    for (auto& join : joins) {
      const grpc::Status s = join.get();
      ASSERT_TRUE(s.ok()) << s.error_message();
    }
  }

  RankContext Rank(const std::string& job, int rank, uint64_t incarnation = 0) {
    RankContext ctx;
    ctx.set_job_id(job);
    ctx.set_generation(0);
    ctx.set_rank(rank);
    ctx.set_incarnation(incarnation != 0 ? incarnation : 900 + rank);
    return ctx;
  }

  std::future<std::pair<grpc::Status, AliveRanksResponse>> AliveAsync(const RankContext& who,
                                                                      double timeout = 20) {
    return std::async(std::launch::async, [this, who, timeout] {
      AliveRanksRequest request;
      *request.mutable_context() = who;
      request.set_timeout_seconds(timeout);
      AliveRanksResponse reply;
      grpc::Status s = workers_->AliveRanks(Context().get(), request, &reply);
      return std::make_pair(s, reply);
    });
  }

  std::unique_ptr<CoordinatorServer> server_;
  std::unique_ptr<WorkerService::Stub> workers_;
  std::unique_ptr<AdminService::Stub> admin_;
};

TEST_F(AliveRanksRpcTest, ARankLostDuringTheCallIsLeftOutAndThePeersCarryOn) {
  StartJob("ip", /*in_place=*/true);
  auto a = AliveAsync(Rank("ip", 0));
  auto b = AliveAsync(Rank("ip", 1));
  ASSERT_EQ(a.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout)
      << "the round waits for rank 2";

  ReportErrorRequest report;
  *report.mutable_context() = Rank("ip", 2);
  report.set_reason("CUDA error: an illegal memory access");
  ReportErrorResponse reported;
  ASSERT_TRUE(workers_->ReportError(Context().get(), report, &reported).ok());

  const auto [a_status, a_reply] = a.get();
  const auto [b_status, b_reply] = b.get();
  ASSERT_TRUE(a_status.ok()) << a_status.error_message();
  ASSERT_TRUE(b_status.ok()) << b_status.error_message();
  EXPECT_THAT(RanksOf(a_reply), ElementsAre(0, 1));
  EXPECT_EQ(a_reply.ranks(1).incarnation(), 901u);
  EXPECT_EQ(a_reply.round(), 1);
  EXPECT_EQ(a_reply.membership_epoch(), 1);
  EXPECT_EQ(a_reply.SerializeAsString(), b_reply.SerializeAsString());

  // The survivors' heartbeats name the lost rank; the generation goes on.
  HeartbeatRequest beat;
  *beat.mutable_context() = Rank("ip", 0);
  HeartbeatResponse beat_reply;
  ASSERT_TRUE(workers_->Heartbeat(Context().get(), beat, &beat_reply).ok());
  EXPECT_FALSE(beat_reply.has_error());
  EXPECT_EQ(beat_reply.membership_epoch(), 1);
  ASSERT_EQ(beat_reply.lost_ranks_size(), 1);
  EXPECT_EQ(beat_reply.lost_ranks(0).rank(), 2);
  EXPECT_THAT(beat_reply.lost_ranks(0).message(), HasSubstr("illegal memory access"));
  // The lost process is fenced out.
  *beat.mutable_context() = Rank("ip", 2);
  const grpc::Status fenced = workers_->Heartbeat(Context().get(), beat, &beat_reply);
  EXPECT_EQ(fenced.error_code(), grpc::StatusCode::ABORTED);

  // A new process joins as rank 2 at once, in epoch 2, and is counted again.
  JoinRequest join;
  *join.mutable_context() = Rank("ip", 2, /*incarnation=*/4242);
  join.set_host("host-9");
  join.set_timeout_seconds(5);
  JoinResponse joined;
  const grpc::Status rejoin = workers_->Join(Context().get(), join, &joined);
  ASSERT_TRUE(rejoin.ok()) << rejoin.error_message();
  EXPECT_EQ(joined.membership_epoch(), 2);
  std::vector<std::future<std::pair<grpc::Status, AliveRanksResponse>>> round2;
  round2.push_back(AliveAsync(Rank("ip", 0)));
  round2.push_back(AliveAsync(Rank("ip", 1)));
  round2.push_back(AliveAsync(Rank("ip", 2, 4242)));
  for (auto& call : round2) {
    const auto [status, reply] = call.get();
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_THAT(RanksOf(reply), ElementsAre(0, 1, 2));
    EXPECT_EQ(reply.ranks(2).incarnation(), 4242u);
    EXPECT_EQ(reply.round(), 2);
  }
}

TEST_F(AliveRanksRpcTest, WithoutInPlaceADeathFailsTheCallNamingTheRank) {
  StartJob("plain", /*in_place=*/false);
  auto a = AliveAsync(Rank("plain", 0));
  ReportErrorRequest report;
  *report.mutable_context() = Rank("plain", 1);
  report.set_reason("boom");
  ReportErrorResponse reported;
  ASSERT_TRUE(workers_->ReportError(Context().get(), report, &reported).ok());
  const auto [status, reply] = a.get();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(status.error_message(), HasSubstr("rank 1 (host-1) failed: boom"));
}

TEST_F(AliveRanksRpcTest, AMissingRankMakesTheCallTimeOutNamingIt) {
  StartJob("slow", /*in_place=*/true);
  auto a = AliveAsync(Rank("slow", 0), /*timeout=*/0.3);
  auto b = AliveAsync(Rank("slow", 1), /*timeout=*/0.3);
  const auto [status, reply] = a.get();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_THAT(status.error_message(), HasSubstr("missing ranks"));
  EXPECT_THAT(status.error_message(), HasSubstr("2 (host-2)"));
  (void)b.get();
}

TEST_F(AliveRanksRpcTest, BeforeTheWorldHasFormedItIsFailedPrecondition) {
  CreateJobRequest create;
  create.set_job_id("early");
  create.set_world_size(2);
  create.set_in_place(true);
  CreateJobResponse created;
  ASSERT_TRUE(admin_->CreateJob(Context().get(), create, &created).ok());
  // Rank 0 joins (in the background: its Join waits for rank 1).
  auto join = std::async(std::launch::async, [this] {
    JoinRequest request;
    *request.mutable_context() = Rank("early", 0);
    request.set_host("host-0");
    request.set_timeout_seconds(1);
    JoinResponse reply;
    return workers_->Join(Context().get(), request, &reply);
  });
  grpc::Status status;
  for (int i = 0; i < 50; ++i) {
    auto call = AliveAsync(Rank("early", 0), 1);
    status = call.get().first;
    if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION &&
        status.error_message().find("has not joined") == std::string::npos) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("before the world has formed"));
  (void)join.get();
}

}  // namespace
}  // namespace alive_ranks_rpc_test
}  // namespace mesh::coordinator
