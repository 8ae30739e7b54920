// WorkerService's node-level batches (JoinBatch, BarrierBatch,
// HeartbeatBatch) through a real in-process server on 127.0.0.1:0: the
// batch-wide checks (one job, at most 4096 entries), replies in request
// order, and each entry handled as its own call would be, with its own
// error code that leaves the other entries alone.
#include <chrono>
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
#include "mesh/v1/worker.grpc.pb.h"

namespace mesh::coordinator {
namespace worker_batch_test {

using ::testing::HasSubstr;
using namespace mesh::v1;  // NOLINT

std::unique_ptr<grpc::ClientContext> Context(int seconds = 30) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
  return ctx;
}

grpc::StatusCode CodeOf(const EntryStatus& status) {
  return static_cast<grpc::StatusCode>(status.code());
}

class WorkerBatchTest : public ::testing::Test {
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
    stub_ = WorkerService::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
    for (const char* job : {"trio", "other"}) {
      JobLayout layout;
      layout.job_id = job;
      layout.world_size = kWorld;
      ASSERT_TRUE(server_->coordination().CreateJob(std::move(layout)).ok());
    }
  }

  static RankContext Rank(int rank, int64_t generation = 0, const std::string& job = "trio") {
    RankContext ctx;
    ctx.set_job_id(job);
    ctx.set_generation(generation);
    ctx.set_rank(rank);
    ctx.set_incarnation(700 + rank);
    return ctx;
  }

  static JoinRequest JoinOf(const RankContext& who, const std::string& host,
                            double timeout_seconds = 20) {
    JoinRequest join;
    *join.mutable_context() = who;
    join.set_host(host);
    join.set_timeout_seconds(timeout_seconds);
    return join;
  }

  static HeartbeatRequest BeatOf(const RankContext& who) {
    HeartbeatRequest beat;
    *beat.mutable_context() = who;
    return beat;
  }

  // Joins ranks 0..kWorld-1 of "trio" at `generation` in one batch.
  void JoinWorld(int64_t generation = 0) {
    JoinBatchRequest request;
    for (int r = 0; r < kWorld; ++r) {
      *request.add_joins() = JoinOf(Rank(r, generation), absl::StrCat("host-", r));
    }
    JoinBatchResponse reply;
    const grpc::Status s = stub_->JoinBatch(Context().get(), request, &reply);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(reply.entries_size(), kWorld);
    for (const JoinBatchEntry& entry : reply.entries()) {
      ASSERT_EQ(CodeOf(entry.status()), grpc::StatusCode::OK) << entry.status().message();
    }
  }

  std::unique_ptr<CoordinatorServer> server_;
  std::unique_ptr<WorkerService::Stub> stub_;
};

// Every rank of the world in one JoinBatch: the batch completes (it does not
// wait on itself), each entry is that rank's own Join reply, in the order of
// the request, not of the ranks.
TEST_F(WorkerBatchTest, AJoinBatchOfTheWholeWorldCompletesInRequestOrder) {
  JoinBatchRequest request;
  *request.add_joins() = JoinOf(Rank(2), "host-b");
  *request.add_joins() = JoinOf(Rank(0), "host-a");
  *request.add_joins() = JoinOf(Rank(1), "host-a");
  JoinBatchResponse reply;
  const grpc::Status s = stub_->JoinBatch(Context().get(), request, &reply);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(reply.entries_size(), 3);
  const int expected_rank[] = {2, 0, 1};
  for (int i = 0; i < 3; ++i) {
    const JoinBatchEntry& entry = reply.entries(i);
    ASSERT_EQ(CodeOf(entry.status()), grpc::StatusCode::OK) << entry.status().message();
    EXPECT_EQ(entry.reply().rank(), expected_rank[i]) << "entry " << i;
    EXPECT_EQ(entry.reply().world_size(), 3);
    EXPECT_EQ(entry.reply().num_nodes(), 2);
    EXPECT_EQ(entry.reply().generation(), 0);
    EXPECT_DOUBLE_EQ(entry.reply().heartbeat_interval_seconds(), 1.0);
  }
  // Ranks 0 and 1 share host-a (node 0, by its lowest rank); rank 2 is alone
  // on host-b (node 1).
  EXPECT_EQ(reply.entries(1).reply().local_rank(), 0);
  EXPECT_EQ(reply.entries(2).reply().local_rank(), 1);
  EXPECT_EQ(reply.entries(1).reply().local_world_size(), 2);
  EXPECT_EQ(reply.entries(1).reply().node_rank(), 0);
  EXPECT_EQ(reply.entries(0).reply().local_rank(), 0);
  EXPECT_EQ(reply.entries(0).reply().local_world_size(), 1);
  EXPECT_EQ(reply.entries(0).reply().node_rank(), 1);
}

// A batch's entries wait for the world as their own Joins would: a batch of
// two ranks completes when the third joins on its own, and ends each entry
// with DEADLINE_EXCEEDED naming the missing rank when it never does (the
// call itself is OK: the outcomes are per entry).
TEST_F(WorkerBatchTest, JoinBatchEntriesWaitForTheWorldLikeSingleJoins) {
  JoinBatchRequest request;
  *request.add_joins() = JoinOf(Rank(0), "host-a");
  *request.add_joins() = JoinOf(Rank(2), "host-a");
  JoinBatchResponse reply;
  grpc::Status batch_status;
  std::thread batch([&] { batch_status = stub_->JoinBatch(Context().get(), request, &reply); });
  for (int i = 0; i < 500 && server_->coordination().PendingWaits() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(server_->coordination().PendingWaits(), 2u);
  JoinResponse single;
  const grpc::Status s = stub_->Join(Context().get(), JoinOf(Rank(1), "host-b"), &single);
  batch.join();
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_TRUE(batch_status.ok()) << batch_status.error_message();
  ASSERT_EQ(reply.entries_size(), 2);
  EXPECT_EQ(CodeOf(reply.entries(0).status()), grpc::StatusCode::OK);
  EXPECT_EQ(reply.entries(0).reply().rank(), 0);
  EXPECT_EQ(CodeOf(reply.entries(1).status()), grpc::StatusCode::OK);
  EXPECT_EQ(reply.entries(1).reply().rank(), 2);
  EXPECT_EQ(reply.entries(1).reply().local_rank(), 1);

  // Job "other": ranks 0 and 1 in a batch, rank 2 never comes.
  JoinBatchRequest partial;
  *partial.add_joins() = JoinOf(Rank(0, 0, "other"), "host-a", 0.3);
  *partial.add_joins() = JoinOf(Rank(1, 0, "other"), "host-a", 0.3);
  JoinBatchResponse timed_out;
  const grpc::Status p = stub_->JoinBatch(Context().get(), partial, &timed_out);
  ASSERT_TRUE(p.ok()) << p.error_message();
  ASSERT_EQ(timed_out.entries_size(), 2);
  for (const JoinBatchEntry& entry : timed_out.entries()) {
    EXPECT_EQ(CodeOf(entry.status()), grpc::StatusCode::DEADLINE_EXCEEDED)
        << entry.status().message();
    EXPECT_THAT(entry.status().message(), HasSubstr("2/3 ranks joined; missing ranks 2"));
    EXPECT_FALSE(entry.has_reply());
  }
}

// All entries of a batch name one job; the whole call is refused otherwise,
// before any entry is acted on.
TEST_F(WorkerBatchTest, ABatchNamingTwoJobsIsInvalidArgument) {
  JoinBatchRequest joins;
  *joins.add_joins() = JoinOf(Rank(0), "host-a");
  *joins.add_joins() = JoinOf(Rank(1, 0, "other"), "host-a");
  JoinBatchResponse join_reply;
  const grpc::Status j = stub_->JoinBatch(Context().get(), joins, &join_reply);
  EXPECT_EQ(j.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << j.error_message();
  EXPECT_THAT(j.error_message(), HasSubstr("entry 1 for 'other'"));
  EXPECT_EQ(join_reply.entries_size(), 0);
  // Nothing was parked: the first entry's Join never ran.
  EXPECT_EQ(server_->coordination().PendingWaits(), 0u);

  BarrierBatchRequest barriers;
  for (const char* job : {"trio", "other"}) {
    BarrierRequest* arrival = barriers.add_arrivals();
    *arrival->mutable_context() = Rank(0, 0, job);
    arrival->set_name("b");
  }
  BarrierBatchResponse barrier_reply;
  EXPECT_EQ(stub_->BarrierBatch(Context().get(), barriers, &barrier_reply).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  HeartbeatBatchRequest beats;
  *beats.add_heartbeats() = BeatOf(Rank(0, 0, "other"));
  *beats.add_heartbeats() = BeatOf(Rank(0));
  HeartbeatBatchResponse beat_reply;
  EXPECT_EQ(stub_->HeartbeatBatch(Context().get(), beats, &beat_reply).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

// At most 4096 entries: 4097 is INVALID_ARGUMENT for every batch RPC, 4096 is
// served.
TEST_F(WorkerBatchTest, MoreThan4096EntriesIsInvalidArgument) {
  HeartbeatBatchRequest beats;
  for (int i = 0; i < 4097; ++i) *beats.add_heartbeats() = BeatOf(Rank(i % kWorld));
  HeartbeatBatchResponse beat_reply;
  const grpc::Status h = stub_->HeartbeatBatch(Context().get(), beats, &beat_reply);
  EXPECT_EQ(h.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << h.error_message();
  EXPECT_THAT(h.error_message(), HasSubstr("4097"));

  JoinBatchRequest joins;
  for (int i = 0; i < 4097; ++i) *joins.add_joins() = JoinOf(Rank(i % kWorld), "host-a");
  JoinBatchResponse join_reply;
  EXPECT_EQ(stub_->JoinBatch(Context().get(), joins, &join_reply).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(server_->coordination().PendingWaits(), 0u);

  BarrierBatchRequest barriers;
  for (int i = 0; i < 4097; ++i) {
    BarrierRequest* arrival = barriers.add_arrivals();
    *arrival->mutable_context() = Rank(i % kWorld);
    arrival->set_name("b");
  }
  BarrierBatchResponse barrier_reply;
  EXPECT_EQ(stub_->BarrierBatch(Context().get(), barriers, &barrier_reply).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  // The limit itself is fine; the ranks have not joined, which each entry
  // says for itself.
  beats.mutable_heartbeats()->RemoveLast();
  ASSERT_EQ(beats.heartbeats_size(), 4096);
  const grpc::Status ok = stub_->HeartbeatBatch(Context().get(), beats, &beat_reply);
  ASSERT_TRUE(ok.ok()) << ok.error_message();
  ASSERT_EQ(beat_reply.entries_size(), 4096);
  EXPECT_EQ(CodeOf(beat_reply.entries(4095).status()), grpc::StatusCode::FAILED_PRECONDITION);
}

// An empty batch is a no-op: OK, no entries.
TEST_F(WorkerBatchTest, AnEmptyBatchIsOkWithNoEntries) {
  JoinBatchResponse join_reply;
  const grpc::Status j = stub_->JoinBatch(Context().get(), JoinBatchRequest(), &join_reply);
  ASSERT_TRUE(j.ok()) << j.error_message();
  EXPECT_EQ(join_reply.entries_size(), 0);
  BarrierBatchResponse barrier_reply;
  const grpc::Status b =
      stub_->BarrierBatch(Context().get(), BarrierBatchRequest(), &barrier_reply);
  ASSERT_TRUE(b.ok()) << b.error_message();
  EXPECT_EQ(barrier_reply.entries_size(), 0);
  HeartbeatBatchResponse beat_reply;
  const grpc::Status h =
      stub_->HeartbeatBatch(Context().get(), HeartbeatBatchRequest(), &beat_reply);
  ASSERT_TRUE(h.ok()) << h.error_message();
  EXPECT_EQ(beat_reply.entries_size(), 0);
}

// An entry for an old generation gets ABORTED and one for a rank outside the
// world INVALID_ARGUMENT, as their single calls would; the other entries of
// the same batch are served as if those were not there.
TEST_F(WorkerBatchTest, ABadEntryGetsItsOwnErrorAndLeavesTheOthersAlone) {
  ASSERT_TRUE(server_->coordination().BumpGeneration("trio", "test restart").ok());
  JoinBatchRequest request;
  *request.add_joins() = JoinOf(Rank(0, 1), "host-a");
  *request.add_joins() = JoinOf(Rank(1, 0), "host-a");  // Old generation.
  *request.add_joins() = JoinOf(Rank(5, 1), "host-a");  // Outside the world of 3.
  *request.add_joins() = JoinOf(Rank(1, 1), "host-a");
  *request.add_joins() = JoinOf(Rank(2, 1), "host-b");
  JoinBatchResponse reply;
  const grpc::Status s = stub_->JoinBatch(Context().get(), request, &reply);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(reply.entries_size(), 5);
  EXPECT_EQ(CodeOf(reply.entries(1).status()), grpc::StatusCode::ABORTED)
      << reply.entries(1).status().message();
  EXPECT_FALSE(reply.entries(1).has_reply());
  EXPECT_EQ(CodeOf(reply.entries(2).status()), grpc::StatusCode::INVALID_ARGUMENT)
      << reply.entries(2).status().message();
  EXPECT_FALSE(reply.entries(2).has_reply());
  for (int i : {0, 3, 4}) {
    ASSERT_EQ(CodeOf(reply.entries(i).status()), grpc::StatusCode::OK)
        << "entry " << i << ": " << reply.entries(i).status().message();
    EXPECT_EQ(reply.entries(i).reply().generation(), 1);
    EXPECT_EQ(reply.entries(i).reply().world_size(), 3);
  }
  EXPECT_EQ(reply.entries(3).reply().rank(), 1);

  HeartbeatBatchRequest beats;
  *beats.add_heartbeats() = BeatOf(Rank(0, 1));
  *beats.add_heartbeats() = BeatOf(Rank(0, 0));  // Old generation.
  *beats.add_heartbeats() = BeatOf(Rank(9, 1));  // Outside the world.
  *beats.add_heartbeats() = BeatOf(Rank(2, 1));
  HeartbeatBatchResponse beat_reply;
  const grpc::Status h = stub_->HeartbeatBatch(Context().get(), beats, &beat_reply);
  ASSERT_TRUE(h.ok()) << h.error_message();
  ASSERT_EQ(beat_reply.entries_size(), 4);
  EXPECT_EQ(CodeOf(beat_reply.entries(0).status()), grpc::StatusCode::OK);
  EXPECT_EQ(CodeOf(beat_reply.entries(1).status()), grpc::StatusCode::ABORTED);
  EXPECT_EQ(CodeOf(beat_reply.entries(2).status()), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(CodeOf(beat_reply.entries(3).status()), grpc::StatusCode::OK);
  EXPECT_FALSE(beat_reply.entries(0).reply().has_error());
}

// Heartbeats of joined ranks are OK entries; once the generation has failed,
// each entry stays OK and carries the error, as a single Heartbeat does.
TEST_F(WorkerBatchTest, AHeartbeatBatchOfJoinedRanksIsOkAndCarriesTheJobError) {
  JoinWorld();
  HeartbeatBatchRequest beats;
  for (int r = 0; r < kWorld; ++r) *beats.add_heartbeats() = BeatOf(Rank(r));
  HeartbeatBatchResponse reply;
  grpc::Status s = stub_->HeartbeatBatch(Context().get(), beats, &reply);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(reply.entries_size(), kWorld);
  for (const HeartbeatBatchEntry& entry : reply.entries()) {
    EXPECT_EQ(CodeOf(entry.status()), grpc::StatusCode::OK) << entry.status().message();
    EXPECT_FALSE(entry.reply().has_error());
  }

  ReportErrorRequest report;
  *report.mutable_context() = Rank(1);
  report.set_reason("boom");
  ReportErrorResponse reported;
  ASSERT_TRUE(stub_->ReportError(Context().get(), report, &reported).ok());
  s = stub_->HeartbeatBatch(Context().get(), beats, &reply);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(reply.entries_size(), kWorld);
  for (const HeartbeatBatchEntry& entry : reply.entries()) {
    EXPECT_EQ(CodeOf(entry.status()), grpc::StatusCode::OK) << entry.status().message();
    ASSERT_TRUE(entry.reply().has_error());
    EXPECT_EQ(entry.reply().error().rank(), 1);
    EXPECT_THAT(entry.reply().error().reason(), HasSubstr("boom"));
  }
}

// Every participant's arrival in one BarrierBatch completes the barrier:
// each entry is OK with participants == world size.
TEST_F(WorkerBatchTest, ABarrierBatchOfAllRanksCompletes) {
  JoinWorld();
  BarrierBatchRequest request;
  for (int r = 0; r < kWorld; ++r) {
    BarrierRequest* arrival = request.add_arrivals();
    *arrival->mutable_context() = Rank(r);
    arrival->set_name("init");
    arrival->set_timeout_seconds(20);
  }
  BarrierBatchResponse reply;
  const grpc::Status s = stub_->BarrierBatch(Context().get(), request, &reply);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(reply.entries_size(), kWorld);
  for (const BarrierBatchEntry& entry : reply.entries()) {
    EXPECT_EQ(CodeOf(entry.status()), grpc::StatusCode::OK) << entry.status().message();
    EXPECT_EQ(entry.reply().participants(), kWorld);
  }
  EXPECT_EQ(server_->coordination().PendingWaits(), 0u);
}

}  // namespace worker_batch_test
}  // namespace mesh::coordinator
