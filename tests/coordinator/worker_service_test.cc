// WorkerService through a real in-process server on 127.0.0.1:0, with ranks
// as threads: the full start-up path, and a rank dying mid-barrier.
#include <atomic>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <gtest/gtest.h>

#include "coordinator/coordinator_server.h"
#include "mesh/v1/admin.grpc.pb.h"
#include "mesh/v1/worker.grpc.pb.h"

namespace mesh::coordinator {
namespace worker_service_test {

using ::testing::HasSubstr;
using namespace mesh::v1;  // NOLINT

constexpr int kRanks = 64;

std::unique_ptr<grpc::ClientContext> Context(int seconds = 30) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
  return ctx;
}

class WorkerServiceTest : public ::testing::Test {
 protected:
  void StartServer(absl::Duration interval, absl::Duration timeout,
                   double rank_heartbeat_rate = CoordinationOptions().rank_heartbeat_rate) {
    CoordinatorConfig config;
    config.port = 0;
    config.coordination.heartbeat_interval = interval;
    config.coordination.heartbeat_timeout = timeout;
    config.coordination.rank_heartbeat_rate = rank_heartbeat_rate;
    auto server = CoordinatorServer::Start(config);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    stub_ = WorkerService::NewStub(channel_);
    auto admin = AdminService::NewStub(channel_);
    CreateJobRequest create;
    create.set_job_id("train");
    create.set_world_size(kRanks);
    create.add_mesh_shape(8);
    create.add_mesh_shape(8);
    create.add_mesh_dim_names("dp");
    create.add_mesh_dim_names("tp");
    CreateJobResponse created;
    ASSERT_TRUE(admin->CreateJob(Context().get(), create, &created).ok());
  }

  RankContext Rank(int rank) {
    RankContext ctx;
    ctx.set_job_id("train");
    ctx.set_generation(0);
    ctx.set_rank(rank);
    ctx.set_incarnation(1000 + rank);
    return ctx;
  }

  std::unique_ptr<CoordinatorServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<WorkerService::Stub> stub_;
};

TEST_F(WorkerServiceTest, SixtyFourRanksJoinExchangeKeysBarrierAndShareUniqueIds) {
  StartServer(absl::Seconds(1), absl::Seconds(30));
  const std::string world_id(128, '\x5a');
  std::vector<grpc::Status> statuses(kRanks);
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      auto fail = [&](const std::string& what, const grpc::Status& s) {
        errors[r] = what + ": " + s.error_message();
        statuses[r] = s;
      };
      JoinRequest join;
      *join.mutable_context() = Rank(r);
      join.set_host("host-" + std::to_string(r / 8));
      if (r == 0) join.set_nccl_unique_id(world_id);
      join.set_timeout_seconds(30);
      JoinResponse joined;
      if (auto s = stub_->Join(Context().get(), join, &joined); !s.ok()) return fail("join", s);
      if (joined.world_size() != kRanks || joined.nccl_unique_id() != world_id ||
          joined.local_world_size() != 8 || joined.local_rank() != r % 8 ||
          joined.node_rank() != r / 8 || joined.num_nodes() != 8 ||
          joined.mesh_dim_names(1) != "tp") {
        return fail("join reply", grpc::Status(grpc::StatusCode::INTERNAL, joined.DebugString()));
      }
      // Each rank publishes its address and reads its right neighbour's.
      KvSetRequest set;
      *set.mutable_context() = Rank(r);
      set.set_key("addr/" + std::to_string(r));
      set.set_value("10.0.0." + std::to_string(r));
      KvSetResponse set_reply;
      if (auto s = stub_->KvSet(Context().get(), set, &set_reply); !s.ok()) return fail("set", s);
      KvGetRequest get;
      *get.mutable_context() = Rank(r);
      get.set_key("addr/" + std::to_string((r + 1) % kRanks));
      get.set_wait(true);
      get.set_timeout_seconds(30);
      KvGetResponse got;
      if (auto s = stub_->KvGet(Context().get(), get, &got); !s.ok()) return fail("get", s);
      if (got.value() != "10.0.0." + std::to_string((r + 1) % kRanks)) {
        return fail("get value", grpc::Status(grpc::StatusCode::INTERNAL, got.value()));
      }
      BarrierRequest barrier;
      *barrier.mutable_context() = Rank(r);
      barrier.set_name("init");
      barrier.set_timeout_seconds(30);
      BarrierResponse passed;
      if (auto s = stub_->Barrier(Context().get(), barrier, &passed); !s.ok()) {
        return fail("barrier", s);
      }
      // The first rank of each tp group publishes that group's ID.
      const std::string group = "tp/" + std::to_string(r / 8);
      if (r % 8 == 0) {
        PublishUniqueIdsRequest publish;
        *publish.mutable_context() = Rank(r);
        (*publish.mutable_ids())[group] = std::string(128, static_cast<char>('a' + r / 8));
        PublishUniqueIdsResponse published;
        if (auto s = stub_->PublishUniqueIds(Context().get(), publish, &published); !s.ok()) {
          return fail("publish", s);
        }
      }
      GetUniqueIdsRequest ids;
      *ids.mutable_context() = Rank(r);
      ids.add_keys(group);
      ids.set_timeout_seconds(30);
      GetUniqueIdsResponse id_reply;
      if (auto s = stub_->GetUniqueIds(Context().get(), ids, &id_reply); !s.ok()) {
        return fail("unique ids", s);
      }
      if (id_reply.ids(0) != std::string(128, static_cast<char>('a' + r / 8))) {
        return fail("unique id value", grpc::Status(grpc::StatusCode::INTERNAL, "mismatch"));
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r)
    EXPECT_TRUE(statuses[r].ok()) << "rank " << r << ": " << errors[r];
  EXPECT_EQ(server_->coordination().PendingWaits(), 0u);
}

// The Join reply's interval is the job's (RankHeartbeatInterval): 64 ranks
// at 16 heartbeats a second in all are told 4 s, within a third of the 30 s
// timeout; the timeout itself is unchanged.
TEST_F(WorkerServiceTest, JoinRepliesGiveALargeJobALongerHeartbeatInterval) {
  StartServer(absl::Seconds(1), absl::Seconds(30), /*rank_heartbeat_rate=*/16);
  std::vector<JoinResponse> replies(kRanks);
  std::vector<grpc::Status> statuses(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      JoinRequest join;
      *join.mutable_context() = Rank(r);
      join.set_host("host-" + std::to_string(r / 8));
      join.set_timeout_seconds(30);
      statuses[r] = stub_->Join(Context().get(), join, &replies[r]);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << r << ": " << statuses[r].error_message();
    EXPECT_DOUBLE_EQ(replies[r].heartbeat_interval_seconds(), 4.0) << r;
    EXPECT_DOUBLE_EQ(replies[r].heartbeat_timeout_seconds(), 30.0) << r;
  }
}

TEST_F(WorkerServiceTest, ARankKilledMidBarrierIsNamedToEveryOtherRank) {
  StartServer(absl::Milliseconds(100), absl::Milliseconds(600));
  constexpr int kVictim = 13;
  std::atomic<bool> stop_heartbeats{false};
  std::vector<grpc::Status> statuses(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      JoinRequest join;
      *join.mutable_context() = Rank(r);
      join.set_host(r == kVictim ? "host-victim" : "host-" + std::to_string(r / 8));
      JoinResponse joined;
      statuses[r] = stub_->Join(Context().get(), join, &joined);
      if (!statuses[r].ok() || r == kVictim) return;  // The victim dies silently here.
      // Heartbeat in the background while blocked in the barrier.
      std::thread beat([&, r] {
        for (int i = 0; i < 100 && !stop_heartbeats; ++i) {
          HeartbeatRequest hb;
          *hb.mutable_context() = Rank(r);
          HeartbeatResponse reply;
          (void)stub_->Heartbeat(Context().get(), hb, &reply);
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
      });
      BarrierRequest barrier;
      *barrier.mutable_context() = Rank(r);
      barrier.set_name("step-1");
      barrier.set_timeout_seconds(60);  // Far beyond the heartbeat timeout.
      BarrierResponse passed;
      statuses[r] = stub_->Barrier(Context(60).get(), barrier, &passed);
      stop_heartbeats = true;
      beat.join();
    });
  }
  const absl::Time start = absl::Now();
  for (auto& t : threads) t.join();
  // Bounded by the heartbeat timeout, not the 60 s barrier deadline.
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  for (int r = 0; r < kRanks; ++r) {
    if (r == kVictim) continue;
    EXPECT_EQ(statuses[r].error_code(), grpc::StatusCode::ABORTED) << "rank " << r;
    EXPECT_THAT(statuses[r].error_message(), HasSubstr("rank 13 (host-victim)")) << "rank " << r;
    EXPECT_THAT(statuses[r].error_message(), HasSubstr("no heartbeat")) << "rank " << r;
  }
}

TEST_F(WorkerServiceTest, ShutdownEndsPendingJoinsAndWatchesWithUnavailable) {
  StartServer(absl::Seconds(1), absl::Seconds(30));
  // Ranks 1 and 2 of 64 join; their joins wait for the rest of the world.
  // Rank 1 also watches (a watch needs a joined rank).
  std::vector<std::thread> joiners;
  for (int r : {1, 2}) {
    joiners.emplace_back([&, r] {
      JoinRequest join;
      *join.mutable_context() = Rank(r);
      join.set_host("host-b");
      JoinResponse joined;
      const grpc::Status s = stub_->Join(Context().get(), join, &joined);
      EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
    });
  }
  for (int i = 0; i < 500 && server_->coordination().PendingWaits() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(server_->coordination().PendingWaits(), 2u);
  grpc::ClientContext watch_ctx;
  WatchJobRequest watch;
  *watch.mutable_context() = Rank(1);
  auto reader = stub_->WatchJob(&watch_ctx, watch);
  mesh::v1::JobEvent event;  // Not coordinator::JobEvent (job_store.h).
  ASSERT_TRUE(reader->Read(&event));
  EXPECT_EQ(event.kind(), mesh::v1::JobEvent::WATCHING);

  ASSERT_EQ(server_->coordination().PendingWaits(), 3u);
  // Shutdown ends both joins and the watch with UNAVAILABLE.
  server_->Shutdown(absl::Seconds(2));
  for (auto& t : joiners) t.join();
  EXPECT_FALSE(reader->Read(&event));
  const grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
}

// Incarnation fencing over the wire, with two live processes for one rank:
// the newer one wins (RankContext.incarnation in worker.proto).
class IncarnationRpcTest : public WorkerServiceTest {
 protected:
  void SetUp() override {
    StartServer(absl::Seconds(1), absl::Seconds(30));
    CreateJobRequest create;
    create.set_job_id("pair");
    create.set_world_size(2);
    CreateJobResponse created;
    ASSERT_TRUE(AdminService::NewStub(channel_)->CreateJob(Context().get(), create, &created).ok());
  }

  static RankContext Process(int rank, uint64_t incarnation) {
    RankContext ctx;
    ctx.set_job_id("pair");
    ctx.set_rank(rank);
    ctx.set_incarnation(incarnation);
    return ctx;
  }

  grpc::Status Join(const RankContext& who, const std::string& host) {
    JoinRequest join;
    *join.mutable_context() = who;
    join.set_host(host);
    join.set_timeout_seconds(20);
    JoinResponse joined;
    return stub_->Join(Context().get(), join, &joined);
  }

  grpc::Status Set(const RankContext& who, const std::string& value) {
    KvSetRequest set;
    *set.mutable_context() = who;
    set.set_key("k");
    set.set_value(value);
    KvSetResponse reply;
    return stub_->KvSet(Context().get(), set, &reply);
  }

  grpc::Status Heartbeat(const RankContext& who, HeartbeatResponse* reply) {
    HeartbeatRequest beat;
    *beat.mutable_context() = who;
    return stub_->Heartbeat(Context().get(), beat, reply);
  }

  void WaitForPendingWaits(size_t n) {
    for (int i = 0; i < 500 && server_->coordination().PendingWaits() < n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_EQ(server_->coordination().PendingWaits(), n);
  }
};

TEST_F(IncarnationRpcTest, ACallWithoutItsRankContextIsInvalidArgument) {
  KvSetRequest set;  // No context.
  set.set_key("k");
  set.set_value("v");
  KvSetResponse reply;
  const grpc::Status s = stub_->KvSet(Context().get(), set, &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("RankContext"));
  JoinRequest join;
  join.set_host("h");
  JoinResponse joined;
  EXPECT_EQ(stub_->Join(Context().get(), join, &joined).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(IncarnationRpcTest, ANewerProcessTakesItsRankBeforeTheWorldForms) {
  grpc::Status old_join;
  std::thread old_process([&] { old_join = Join(Process(1, 111), "host-old"); });
  WaitForPendingWaits(1);
  grpc::Status new_join;
  std::thread new_process([&] { new_join = Join(Process(1, 222), "host-new"); });
  old_process.join();  // Superseded at once, not left waiting.
  EXPECT_EQ(old_join.error_code(), grpc::StatusCode::ABORTED) << old_join.error_message();
  EXPECT_THAT(old_join.error_message(), HasSubstr("superseded by a newer process"));

  ASSERT_TRUE(Join(Process(0, 100), "host-0").ok());
  new_process.join();
  ASSERT_TRUE(new_join.ok()) << new_join.error_message();
  // The older process is fenced out of every call; the newer one works.
  const grpc::Status stale = Set(Process(1, 111), "old");
  EXPECT_EQ(stale.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(stale.error_message(), HasSubstr("is fenced out"));
  EXPECT_TRUE(Set(Process(1, 222), "new").ok());
  HeartbeatResponse beat;
  EXPECT_EQ(Heartbeat(Process(1, 111), &beat).error_code(), grpc::StatusCode::ABORTED);
  EXPECT_TRUE(Heartbeat(Process(1, 222), &beat).ok());
  EXPECT_FALSE(beat.has_error());
}

TEST_F(IncarnationRpcTest, ANewerProcessAfterTheWorldFormedEndsTheGenerationNamingItsRank) {
  std::thread rank0([&] { EXPECT_TRUE(Join(Process(0, 100), "host-0").ok()); });
  ASSERT_TRUE(Join(Process(1, 111), "host-1").ok());
  rank0.join();
  // The older process of rank 1 is live: it watches its job.
  grpc::ClientContext watch_ctx;
  WatchJobRequest watch;
  *watch.mutable_context() = Process(1, 111);
  auto reader = stub_->WatchJob(&watch_ctx, watch);
  mesh::v1::JobEvent event;
  ASSERT_TRUE(reader->Read(&event));
  ASSERT_EQ(event.kind(), mesh::v1::JobEvent::WATCHING);

  const grpc::Status restarted = Join(Process(1, 222), "host-1");
  EXPECT_EQ(restarted.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(restarted.error_message(), HasSubstr("rank 1 (host-1) failed: was restarted"));
  // The older process hears it in its watch, and is fenced out after.
  ASSERT_TRUE(reader->Read(&event));
  EXPECT_EQ(event.kind(), mesh::v1::JobEvent::ERROR);
  EXPECT_EQ(event.error().rank(), 1);
  HeartbeatResponse beat;
  const grpc::Status stale = Heartbeat(Process(1, 111), &beat);
  EXPECT_EQ(stale.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(stale.error_message(), HasSubstr("is fenced out"));
  // The peer is told too, naming the rank.
  ASSERT_TRUE(Heartbeat(Process(0, 100), &beat).ok());
  ASSERT_TRUE(beat.has_error());
  EXPECT_EQ(beat.error().rank(), 1);
}

// Hang diagnosis through the RPCs a client written from worker.proto uses:
// progress in HeartbeatRequest.groups, members only once (send_members asks
// again), and the JobError with hang = true once a rank has waited in a
// collective the other never entered for the job's hang timeout.
class HangRpcTest : public WorkerServiceTest {
 protected:
  void SetUp() override {
    StartServer(absl::Milliseconds(100), absl::Seconds(30));
    CreateJobRequest create;
    create.set_job_id("hang");
    create.set_world_size(2);
    create.set_hang_timeout_seconds(1);
    CreateJobResponse created;
    ASSERT_TRUE(AdminService::NewStub(channel_)->CreateJob(Context().get(), create, &created).ok());
    std::vector<std::thread> joins;
    for (int r = 0; r < 2; ++r) {
      joins.emplace_back([this, r] {
        JoinRequest join;
        *join.mutable_context() = Who(r);
        join.set_host(absl::StrCat("host-", r));
        join.set_timeout_seconds(20);
        JoinResponse joined;
        EXPECT_TRUE(stub_->Join(Context().get(), join, &joined).ok());
      });
    }
    for (auto& t : joins) t.join();
  }

  static RankContext Who(int rank) {
    RankContext ctx;
    ctx.set_job_id("hang");
    ctx.set_rank(rank);
    ctx.set_incarnation(500 + rank);
    return ctx;
  }

  grpc::Status Beat(int rank, const std::vector<GroupProgress>& groups, HeartbeatResponse* reply) {
    HeartbeatRequest beat;
    *beat.mutable_context() = Who(rank);
    for (const GroupProgress& g : groups) *beat.add_groups() = g;
    return stub_->Heartbeat(Context().get(), beat, reply);
  }
};

TEST_F(HangRpcTest, HeartbeatProgressDiagnosesTheRankThatNeverEnteredTheOp) {
  GroupProgress waiting;
  waiting.set_name("world");
  waiting.set_entered(6);
  waiting.set_completed(5);
  waiting.set_pending_kind(COLLECTIVE_KIND_ALL_REDUCE);
  waiting.set_completed_kind(COLLECTIVE_KIND_ALL_REDUCE);
  GroupProgress idle = waiting;
  idle.set_entered(5);
  idle.set_pending_kind(COLLECTIVE_KIND_UNSPECIFIED);

  // Without members the coordinator cannot judge the group, and says so.
  HeartbeatResponse reply;
  ASSERT_TRUE(Beat(0, {waiting}, &reply).ok());
  EXPECT_TRUE(reply.send_members());
  waiting.add_members(0);
  waiting.add_members(1);
  idle.add_members(0);
  idle.add_members(1);

  const absl::Time start = absl::Now();
  bool diagnosed = false;
  while (!diagnosed && absl::Now() - start < absl::Seconds(20)) {
    const int64_t ms = absl::ToInt64Milliseconds(absl::Now() - start);
    waiting.set_waiting_ms(ms);
    idle.set_since_completed_ms(ms);
    ASSERT_TRUE(Beat(0, {waiting}, &reply).ok());
    EXPECT_FALSE(reply.send_members());
    waiting.clear_members();
    HeartbeatResponse other;
    ASSERT_TRUE(Beat(1, {idle}, &other).ok());
    idle.clear_members();
    diagnosed = reply.has_error() || other.has_error();
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(diagnosed) << "no diagnosis within 20 s of a 1 s hang timeout";
  EXPECT_GE(absl::Now() - start, absl::Seconds(1));
  ASSERT_TRUE(Beat(0, {}, &reply).ok());
  ASSERT_TRUE(reply.has_error());
  EXPECT_TRUE(reply.error().hang());
  EXPECT_EQ(reply.error().rank(), 1);
  EXPECT_EQ(reply.error().host(), "host-1");
  EXPECT_THAT(reply.error().reason(),
              HasSubstr("hang in group 'world' (ranks 0, 1): rank 0 has waited"));
  EXPECT_THAT(reply.error().reason(), HasSubstr("in all_reduce #6; rank 1 never entered it"));
}

TEST_F(HangRpcTest, TooManyGroupsIsInvalidArgumentAndANegativeTimeoutIsRefused) {
  HeartbeatRequest beat;
  *beat.mutable_context() = Who(0);
  for (int i = 0; i <= 4096; ++i) beat.add_groups()->set_name(absl::StrCat("g", i));
  HeartbeatResponse reply;
  EXPECT_EQ(stub_->Heartbeat(Context().get(), beat, &reply).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  CreateJobRequest create;
  create.set_job_id("bad");
  create.set_world_size(1);
  create.set_hang_timeout_seconds(-1);
  CreateJobResponse created;
  EXPECT_EQ(
      AdminService::NewStub(channel_)->CreateJob(Context().get(), create, &created).error_code(),
      grpc::StatusCode::INVALID_ARGUMENT);
}

}  // namespace worker_service_test
}  // namespace mesh::coordinator
