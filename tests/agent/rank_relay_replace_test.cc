// RankRelay (agent/rank_relay.h) and in-place recovery: a rank is lost and a
// new process (another incarnation) joins as it, through the same relay.
// As in rank_relay_test.cc: an in-process coordinator on 127.0.0.1:0, a
// relay on a Unix socket in a temp dir, and ranks as WorkerService stubs on
// the relay's socket. Every call has a deadline, so every wait here is
// bounded.
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "agent/rank_relay.h"
#include "mesh/v1/worker.grpc.pb.h"
#include "tests/agent/rank_relay_test_util.h"
#include "tests/util/in_process_coordinator.h"
#include "tests/util/proc.h"
#include "tests/util/status_matchers.h"

namespace mesh::agent {
namespace rank_relay_replace_test {

using ::mesh::testing::InProcessCoordinator;
using ::mesh::testing::IsOk;
using ::mesh::testing::ScratchDir;
using ::mesh::testing::WaitUntil;
using ::testing::HasSubstr;
using namespace mesh::v1;  // NOLINT: the test names many message types.

constexpr char kJob[] = "replace-job";
// The incarnation of the process that replaces rank 2.
constexpr uint64_t kNewIncarnation = 0xfeed0002;

// The first process of `rank`, or the one of `incarnation`.
RankContext Rank(int rank, uint64_t incarnation = 0) {
  RankContext ctx;
  ctx.set_job_id(kJob);
  ctx.set_generation(0);
  ctx.set_rank(rank);
  ctx.set_incarnation(incarnation != 0 ? incarnation : 9000 + rank);
  return ctx;
}

std::unique_ptr<grpc::ClientContext> Context(absl::Duration deadline = absl::Seconds(30)) {
  return ::mesh::agent::testing::CallContext("", deadline);
}

std::unique_ptr<WorkerService::Stub> StubOf(const RankRelay& relay) {
  return ::mesh::agent::testing::RelayStub(relay);
}

// Runs `call(i)` for each i < n, each on its own thread; returns the
// statuses in order.
std::vector<grpc::Status> OnThreads(int n, const std::function<grpc::Status(int)>& call) {
  std::vector<grpc::Status> statuses(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) threads.emplace_back([&, i] { statuses[i] = call(i); });
  for (std::thread& t : threads) t.join();
  return statuses;
}

// One WatchJob call through a relay, read on a thread of its own until the
// stream ends (at the latest when its 30 s deadline passes, or on Stop).
class Watch {
 public:
  Watch(const RankRelay& relay, const RankContext& who) : stub_(StubOf(relay)), ctx_(Context()) {
    WatchJobRequest request;
    *request.mutable_context() = who;
    reader_ = stub_->WatchJob(ctx_.get(), request);
    thread_ = std::thread([this] {
      JobEvent event;
      while (reader_->Read(&event)) {
        absl::MutexLock lock(&mu_);
        events_.push_back(event);
      }
      const grpc::Status end = reader_->Finish();
      absl::MutexLock lock(&mu_);
      end_ = end;
    });
  }
  ~Watch() { Stop(); }

  // Whether `n` events came within 10 s.
  bool WaitForEvents(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return events_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
  }
  // Whether the stream ended within 10 s.
  bool WaitForEnd() {
    absl::MutexLock lock(&mu_);
    auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return end_.has_value(); };
    return mu_.AwaitWithTimeout(absl::Condition(&ended), absl::Seconds(10));
  }
  std::vector<JobEvent> events() const {
    absl::MutexLock lock(&mu_);
    return events_;
  }
  std::optional<grpc::Status> end() const {
    absl::MutexLock lock(&mu_);
    return end_;
  }
  // Cancels the call and joins the reader. Idempotent.
  void Stop() {
    ctx_->TryCancel();
    if (thread_.joinable()) thread_.join();
  }

 private:
  const std::unique_ptr<WorkerService::Stub> stub_;
  const std::unique_ptr<grpc::ClientContext> ctx_;
  std::unique_ptr<grpc::ClientReader<JobEvent>> reader_;
  mutable absl::Mutex mu_;
  std::vector<JobEvent> events_ ABSL_GUARDED_BY(mu_);
  std::optional<grpc::Status> end_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

class RankRelayReplaceTest : public ::testing::Test {
 protected:
  // A coordinator whose heartbeat timeout is long: only what a test does
  // loses a rank. Heartbeats every 100 ms, so the relay flushes every 50 ms.
  void StartCoordinator() {
    auto coordinator = InProcessCoordinator::Start(absl::Milliseconds(100), absl::Seconds(60));
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = *std::move(coordinator);
  }

  // A job of `world_size` ranks, all local to one relay (node-a) and joined
  // through it; null (with the failure recorded) when a step fails. The
  // batch window is long (10 s): a Join or barrier arrival that waited for
  // it would show in the time a test takes.
  RankRelay* JoinedJob(int world_size, bool in_place) {
    coordinator::JobLayout layout;
    layout.job_id = kJob;
    layout.world_size = world_size;
    layout.in_place = in_place;
    EXPECT_THAT(coordinator_->CreateJob(std::move(layout)), IsOk());
    RankRelayOptions options;
    options.socket_path = dir_ / "node-a.sock";
    options.coordinator = coordinator_->address();
    options.batch_window = absl::Seconds(10);
    auto relay = RankRelay::Start(std::move(options));
    EXPECT_THAT(relay, IsOk());
    if (!relay.ok()) return nullptr;
    relay_ = *std::move(relay);
    std::vector<int> ranks;
    for (int r = 0; r < world_size; ++r) ranks.push_back(r);
    relay_->AddGeneration(kJob, 0, ranks, "");
    const std::vector<grpc::Status> joined = OnThreads(world_size, [&](int rank) {
      JoinResponse reply;
      return StubOf(*relay_)->Join(Context().get(), JoinOf(Rank(rank)), &reply);
    });
    for (int r = 0; r < world_size; ++r) {
      if (!joined[r].ok()) {
        ADD_FAILURE() << "rank " << r << "'s Join: " << joined[r].error_message();
        return nullptr;
      }
    }
    return relay_.get();
  }

  static JoinRequest JoinOf(const RankContext& who) {
    JoinRequest join;
    *join.mutable_context() = who;
    join.set_host("node-a");
    join.set_timeout_seconds(20);
    return join;
  }

  grpc::Status Heartbeat(const RankContext& who, HeartbeatResponse* reply) {
    HeartbeatRequest request;
    *request.mutable_context() = who;
    return StubOf(*relay_)->Heartbeat(Context(absl::Seconds(5)).get(), request, reply);
  }

  grpc::Status ReportError(const RankContext& who, const std::string& reason) {
    ReportErrorRequest report;
    *report.mutable_context() = who;
    report.set_reason(reason);
    ReportErrorResponse reported;
    return StubOf(*relay_)->ReportError(Context().get(), report, &reported);
  }

  void WaitForFlushesToStop() { ::mesh::agent::testing::WaitForFlushesToStop(*relay_); }

  void TearDown() override {
    relay_.reset();
    if (coordinator_ != nullptr) coordinator_->Stop();
  }

  const ScratchDir dir_{"rank-relay-replace"};  // First: outlives the socket in it.
  std::unique_ptr<InProcessCoordinator> coordinator_;
  std::unique_ptr<RankRelay> relay_;
};

// Three local ranks of an in-place job, joined and watching through one
// relay; the shared upstream watch is opened in rank 2's name. Rank 2
// reports an error and is lost. Its own watch gets the ERROR; ranks 0 and 1
// keep watching (the relay opens the stream again in another's name), and
// the relay has the coordinator's refusal of rank 2's process for its
// heartbeats. A new process joins as rank 2 through the same relay: its Join
// goes up at once (no wait for the batch window) and is readmitted, and
// nothing the relay kept for the old process reaches it: its heartbeats are
// OK from the first, then carry epoch 2 and no lost rank. AliveRanks gives
// every rank all three, rank 2 with its new incarnation; a barrier of all
// three passes; KV and WatchJob work for it; the old process stays fenced
// out; and the job never fails.
TEST_F(RankRelayReplaceTest, ANewProcessOfALostRankCarriesOnThroughTheRelay) {
  StartCoordinator();
  RankRelay* relay = JoinedJob(3, /*in_place=*/true);
  ASSERT_NE(relay, nullptr);
  const RankContext old2 = Rank(2);
  const RankContext new2 = Rank(2, kNewIncarnation);

  Watch watch2(*relay, old2);  // First: the upstream stream is in its name.
  ASSERT_TRUE(watch2.WaitForEvents(1));
  Watch watch0(*relay, Rank(0));
  Watch watch1(*relay, Rank(1));
  ASSERT_TRUE(watch0.WaitForEvents(1));
  ASSERT_TRUE(watch1.WaitForEvents(1));
  EXPECT_EQ(relay->stats().watches, 1);

  // Rank 2 is lost; its own watch hears why.
  ASSERT_TRUE(ReportError(old2, "CUDA error: an illegal memory access").ok());
  ASSERT_TRUE(watch2.WaitForEnd()) << "rank 2's watch did not end once it was lost";
  {
    const std::vector<JobEvent> events = watch2.events();
    ASSERT_EQ(events.size(), 2u);
    EXPECT_EQ(events[0].kind(), JobEvent::WATCHING);
    EXPECT_EQ(events[1].kind(), JobEvent::ERROR);
    EXPECT_EQ(events[1].error().rank(), 2);
    EXPECT_THAT(events[1].error().message(), HasSubstr("membership epoch 1"));
    EXPECT_TRUE(watch2.end()->ok()) << watch2.end()->error_message();
  }
  // The others' stream was opened again, in another rank's name.
  EXPECT_TRUE(WaitUntil([&] { return relay->stats().watches == 2; }, absl::Seconds(10)));

  // The old process heartbeats (every 50 ms, at most 5 s) until the relay
  // holds the coordinator's refusal of it: the answer a new process of the
  // rank must not be handed.
  grpc::Status old_beat;
  for (int i = 0; i < 100 && old_beat.ok(); ++i) {
    HeartbeatResponse reply;
    old_beat = Heartbeat(old2, &reply);
    if (old_beat.ok()) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(old_beat.error_code(), grpc::StatusCode::ABORTED) << old_beat.error_message();

  // The new process joins: readmitted at once, in the next epoch, without
  // waiting out the 10 s batch window for the ranks that joined long ago.
  const int64_t join_batches = relay->stats().join_batches;
  const absl::Time join_start = absl::Now();
  JoinResponse joined;
  const grpc::Status join = StubOf(*relay)->Join(Context().get(), JoinOf(new2), &joined);
  const absl::Duration join_took = absl::Now() - join_start;
  ASSERT_TRUE(join.ok()) << join.error_message();
  EXPECT_LT(join_took, absl::Seconds(5));
  EXPECT_EQ(joined.rank(), 2);
  EXPECT_EQ(joined.world_size(), 3);
  EXPECT_EQ(joined.membership_epoch(), 2);
  EXPECT_EQ(relay->stats().join_batches, join_batches + 1);

  // Its heartbeats: OK from the first (it has never been refused), and
  // within 5 s the coordinator's answer for it: epoch 2, no one lost.
  HeartbeatResponse beat;
  int failed_beats = 0;
  bool saw_error = false;
  for (int i = 0; i < 100; ++i) {
    HeartbeatResponse reply;
    const grpc::Status s = Heartbeat(new2, &reply);
    if (!s.ok()) {
      ADD_FAILURE() << "the new process's heartbeat failed: " << s.error_message();
      ++failed_beats;
    }
    saw_error = saw_error || reply.has_error();
    beat = reply;
    if (s.ok() && reply.membership_epoch() == 2) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(failed_beats, 0);
  EXPECT_FALSE(saw_error);
  EXPECT_EQ(beat.membership_epoch(), 2);
  EXPECT_EQ(beat.lost_ranks_size(), 0);

  // Every rank agrees on who is alive: all three, rank 2 as its new process.
  const std::vector<RankContext> everyone = {Rank(0), Rank(1), new2};
  std::vector<AliveRanksResponse> alive(3);
  const std::vector<grpc::Status> alive_status = OnThreads(3, [&](int i) {
    AliveRanksRequest request;
    *request.mutable_context() = everyone[i];
    request.set_timeout_seconds(20);
    return StubOf(*relay)->AliveRanks(Context().get(), request, &alive[i]);
  });
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(alive_status[i].ok()) << "rank " << i << ": " << alive_status[i].error_message();
    EXPECT_EQ(alive[i].membership_epoch(), 2);
    ASSERT_EQ(alive[i].ranks_size(), 3) << "rank " << i;
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(alive[i].ranks(r).rank(), r);
      EXPECT_EQ(alive[i].ranks(r).incarnation(), everyone[r].incarnation());
    }
  }

  // A barrier of all three passes, in one batch.
  const int64_t barrier_batches = relay->stats().barrier_batches;
  const std::vector<grpc::Status> barrier = OnThreads(3, [&](int i) {
    BarrierRequest request;
    *request.mutable_context() = everyone[i];
    request.set_name("recovered");
    request.set_timeout_seconds(20);
    BarrierResponse reply;
    return StubOf(*relay)->Barrier(Context().get(), request, &reply);
  });
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(barrier[i].ok()) << "rank " << i << ": " << barrier[i].error_message();
  }
  EXPECT_EQ(relay->stats().barrier_batches, barrier_batches + 1);

  // KV: a value the new process sets, rank 0 reads.
  KvSetRequest set;
  *set.mutable_context() = new2;
  set.set_key("rank2/addr");
  set.set_value("10.0.0.3:29500");
  KvSetResponse set_reply;
  const grpc::Status set_status = StubOf(*relay)->KvSet(Context().get(), set, &set_reply);
  ASSERT_TRUE(set_status.ok()) << set_status.error_message();
  KvGetRequest get;
  *get.mutable_context() = Rank(0);
  get.set_key("rank2/addr");
  KvGetResponse got;
  const grpc::Status get_status = StubOf(*relay)->KvGet(Context().get(), get, &got);
  ASSERT_TRUE(get_status.ok()) << get_status.error_message();
  EXPECT_EQ(got.value(), "10.0.0.3:29500");

  // The new process watches too, on the stream the others have.
  Watch watch_new(*relay, new2);
  ASSERT_TRUE(watch_new.WaitForEvents(1));
  EXPECT_EQ(watch_new.events()[0].kind(), JobEvent::WATCHING);
  EXPECT_EQ(relay->stats().watches, 2);

  // The old process is fenced out, as the coordinator says.
  KvGetRequest stale_get = get;
  *stale_get.mutable_context() = old2;
  KvGetResponse stale_got;
  EXPECT_EQ(StubOf(*relay)->KvGet(Context().get(), stale_get, &stale_got).error_code(),
            grpc::StatusCode::ABORTED);
  HeartbeatResponse stale_beat;
  EXPECT_EQ(Heartbeat(old2, &stale_beat).error_code(), grpc::StatusCode::ABORTED);

  // Ranks 0 and 1 never heard rank 2's loss as an error of their job.
  for (const Watch* watch : {&watch0, &watch1, &watch_new}) {
    const std::vector<JobEvent> events = watch->events();
    ASSERT_EQ(events.size(), 1u);
    EXPECT_EQ(events[0].kind(), JobEvent::WATCHING);
    EXPECT_FALSE(watch->end().has_value()) << watch->end()->error_message();
  }
  EXPECT_FALSE(coordinator_->JobFailed(kJob));
  watch0.Stop();
  watch1.Stop();
  watch_new.Stop();
  WaitForFlushesToStop();
}

// A lost process whose watch shares the stream opened in rank 0's name
// hears of its loss there too: once the coordinator refuses its heartbeat
// (ABORTED), the relay ends its watch with that status, as the coordinator
// would end the process's own watch. Rank 0's watch goes on.
TEST_F(RankRelayReplaceTest, ALostProcessHearsItOnAWatchItDoesNotOpen) {
  StartCoordinator();
  RankRelay* relay = JoinedJob(3, /*in_place=*/true);
  ASSERT_NE(relay, nullptr);
  Watch watch0(*relay, Rank(0));  // First: the upstream stream is in its name.
  ASSERT_TRUE(watch0.WaitForEvents(1));
  Watch watch2(*relay, Rank(2));
  ASSERT_TRUE(watch2.WaitForEvents(1));

  ASSERT_TRUE(ReportError(Rank(2), "CUDA error: an illegal memory access").ok());
  grpc::Status beat;
  for (int i = 0; i < 100 && beat.ok(); ++i) {
    HeartbeatResponse reply;
    beat = Heartbeat(Rank(2), &reply);
    if (beat.ok()) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(beat.error_code(), grpc::StatusCode::ABORTED) << beat.error_message();
  ASSERT_TRUE(watch2.WaitForEnd()) << "the lost process's watch did not end";
  EXPECT_EQ(watch2.end()->error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(watch2.end()->error_message(), HasSubstr("illegal memory access"));
  EXPECT_EQ(watch2.events().size(), 1u);

  const std::vector<JobEvent> events = watch0.events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind(), JobEvent::WATCHING);
  EXPECT_FALSE(watch0.end().has_value());
  EXPECT_EQ(relay->stats().watches, 1);
  EXPECT_FALSE(coordinator_->JobFailed(kJob));
  watch0.Stop();
  WaitForFlushesToStop();
}

// A unique-ID fetch goes up in the name of the first rank that asked. When
// that rank is lost while it waits, its wait ends (ABORTED), but the others
// still wait: the relay fetches again in the next waiter's name, and rank 0
// gets the ID rank 1 publishes afterwards.
TEST_F(RankRelayReplaceTest, AFetchInTheNameOfALostRankGoesOnForTheOthers) {
  StartCoordinator();
  RankRelay* relay = JoinedJob(3, /*in_place=*/true);
  ASSERT_NE(relay, nullptr);
  auto get = [&](const RankContext& who, GetUniqueIdsResponse* reply) {
    GetUniqueIdsRequest request;
    *request.mutable_context() = who;
    request.add_keys("late");
    request.set_timeout_seconds(20);
    return StubOf(*relay)->GetUniqueIds(Context().get(), request, reply);
  };
  grpc::Status lost_status, waiting_status;
  GetUniqueIdsResponse lost_reply, waiting_reply;
  std::thread rank2([&] { lost_status = get(Rank(2), &lost_reply); });
  const bool fetching =
      WaitUntil([&] { return relay->stats().unique_id_fetches == 1; }, absl::Seconds(10));
  const int64_t served = relay->stats().served;
  std::thread rank0([&] { waiting_status = get(Rank(0), &waiting_reply); });
  const bool waiting =
      WaitUntil([&] { return relay->stats().served == served + 1; }, absl::Seconds(10));
  const grpc::Status reported = ReportError(Rank(2), "NCCL error: unhandled system error");
  rank2.join();
  const bool refetched =
      WaitUntil([&] { return relay->stats().unique_id_fetches == 2; }, absl::Seconds(10));
  PublishUniqueIdsRequest publish;
  *publish.mutable_context() = Rank(1);
  (*publish.mutable_ids())["late"] = std::string(128, 'z');
  PublishUniqueIdsResponse published;
  const grpc::Status p = StubOf(*relay)->PublishUniqueIds(Context().get(), publish, &published);
  rank0.join();

  ASSERT_TRUE(fetching);
  ASSERT_TRUE(waiting);
  ASSERT_TRUE(reported.ok()) << reported.error_message();
  EXPECT_EQ(lost_status.error_code(), grpc::StatusCode::ABORTED) << lost_status.error_message();
  EXPECT_TRUE(refetched) << "the relay did not fetch again for rank 0";
  ASSERT_TRUE(p.ok()) << p.error_message();
  ASSERT_TRUE(waiting_status.ok()) << waiting_status.error_message();
  ASSERT_EQ(waiting_reply.ids_size(), 1);
  EXPECT_EQ(waiting_reply.ids(0), std::string(128, 'z'));
  EXPECT_FALSE(coordinator_->JobFailed(kJob));
}

// Without in-place recovery, an error of the rank in whose name the shared
// watch was opened fails the generation: every local watcher gets the
// coordinator's ERROR naming it (the others through a stream opened again
// in rank 0's name, which the coordinator answers with the same error).
TEST_F(RankRelayReplaceTest, TheGenerationsErrorReachesEveryWatcherWhenItNamesTheOpener) {
  StartCoordinator();
  RankRelay* relay = JoinedJob(2, /*in_place=*/false);
  ASSERT_NE(relay, nullptr);
  Watch watch1(*relay, Rank(1));  // First: the upstream stream is in its name.
  ASSERT_TRUE(watch1.WaitForEvents(1));
  Watch watch0(*relay, Rank(0));
  ASSERT_TRUE(watch0.WaitForEvents(1));

  ASSERT_TRUE(ReportError(Rank(1), "out of memory").ok());
  for (Watch* watch : {&watch1, &watch0}) {
    ASSERT_TRUE(watch->WaitForEnd());
    const std::vector<JobEvent> events = watch->events();
    ASSERT_EQ(events.size(), 2u);
    EXPECT_EQ(events[0].kind(), JobEvent::WATCHING);
    EXPECT_EQ(events[1].kind(), JobEvent::ERROR);
    EXPECT_EQ(events[1].error().rank(), 1);
    EXPECT_THAT(events[1].error().reason(), HasSubstr("out of memory"));
    EXPECT_TRUE(watch->end()->ok()) << watch->end()->error_message();
  }
  EXPECT_TRUE(coordinator_->JobFailed(kJob));
  EXPECT_EQ(relay->stats().watches, 2);

  // A watcher that comes later gets the error at once, without a stream.
  Watch late(*relay, Rank(0));
  ASSERT_TRUE(late.WaitForEnd());
  ASSERT_EQ(late.events().size(), 2u);
  EXPECT_EQ(late.events()[1].error().rank(), 1);
  EXPECT_EQ(relay->stats().watches, 2);
}

}  // namespace rank_relay_replace_test
}  // namespace mesh::agent
