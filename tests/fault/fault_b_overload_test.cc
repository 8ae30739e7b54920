// Reliability scenario 11: 10,000 idle watch streams (WorkerService.WatchJob)
// and 10,000 blocked KV waiters (KvGet with wait on a missing key) against
// one real mesh-coordinator process.
//
//   AdminService.CreateJob (world 10,001) ─▶ all ranks Join ─▶ RSS before
//   ─▶ ranks 1..10,000: WatchJob (each sees WATCHING) + KvGet("never", wait)
//   ─▶ pending_waits >= 10,000 ─▶ RSS holding; rank 0 and a node heartbeat
//      in a loop for 5 s, p99 latency measured ─▶ rank 0 sets the key: every
//      KvGet returns it ─▶ cancel the watches ─▶ every call accounted for.
//
// Expected: the coordinator's memory stays bounded (asserted: < 50 KiB per
// pending call, a generous bound; the figure is printed), and heartbeats are
// still served within their interval (p99 below it). The client shares 8
// channels and uses the callback API, so the test needs no thread per call.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "mesh/v1/admin.grpc.pb.h"
#include "mesh/v1/job.grpc.pb.h"
#include "mesh/v1/worker.grpc.pb.h"
#include "tests/common/http_get.h"
#include "tests/util/fault_cluster.h"

namespace mesh::fault {
namespace fault_b_overload_test {

constexpr int kWaiters = 10'000;
constexpr int kWorld = kWaiters + 1;
constexpr int kChannels = 8;
constexpr absl::Duration kStepTimeout = absl::Seconds(180);
// Rank heartbeats every 1 s (the coordinator's default); the timeout is
// long so the 10,000 silent ranks stay alive while they wait.
constexpr double kRankInterval = 1;
constexpr double kNodeInterval = 0.5;
constexpr double kMaxBytesPerCall = 50 * 1024;

int64_t VmRssBytes(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) != 0) continue;
    std::vector<std::string> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t kib = 0;
    if (parts.size() >= 2 && absl::SimpleAtoi(parts[1], &kib)) return kib * 1024;
  }
  return -1;
}

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

// mesh_coordinator_pending_waits from /metrics; -1 when unreadable.
double PendingWaits(int metrics_port) {
  auto reply = ::mesh::testing::HttpGet(metrics_port, "/metrics");
  if (!reply.ok()) return -1;
  for (absl::string_view line : absl::StrSplit(reply->body, '\n')) {
    if (!absl::StartsWith(line, "mesh_coordinator_pending_waits ")) continue;
    double value = 0;
    if (absl::SimpleAtod(line.substr(line.find(' ') + 1), &value)) return value;
  }
  return -1;
}

// Counts completions of many async calls and lets the test wait for them.
class Tally {
 public:
  void Done(bool ok) {
    absl::MutexLock lock(&mu_);
    ++(ok ? ok_ : failed_);
  }
  void Event() {
    absl::MutexLock lock(&mu_);
    ++events_;
  }
  // Waits until ok + failed (or events, with `events`) reaches `n`.
  bool WaitFor(int n, absl::Duration timeout, bool events = false) {
    absl::MutexLock lock(&mu_);
    auto reached = [&] { return (events ? events_ : ok_ + failed_) >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
  }
  int ok() const {
    absl::MutexLock lock(&mu_);
    return ok_;
  }
  int failed() const {
    absl::MutexLock lock(&mu_);
    return failed_;
  }
  int done() const {
    absl::MutexLock lock(&mu_);
    return ok_ + failed_;
  }

 private:
  mutable absl::Mutex mu_;
  int ok_ = 0;
  int failed_ = 0;
  int events_ = 0;
};

// One WatchJob stream: counts its WATCHING event, then reads on until the
// stream ends.
class Watch final : public grpc::ClientReadReactor<v1::JobEvent> {
 public:
  Watch(v1::WorkerService::Stub* stub, const v1::RankContext& rank, Tally* live, Tally* ended)
      : live_(live), ended_(ended) {
    *request_.mutable_context() = rank;
    stub->async()->WatchJob(&context_, &request_, this);
    StartRead(&event_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows.
    if (event_.kind() == v1::JobEvent::WATCHING) live_->Event();
    StartRead(&event_);
  }
  void OnDone(const grpc::Status& status) override {
    // Cancelled by the test is the expected end.
    ended_->Done(status.error_code() == grpc::StatusCode::CANCELLED);
  }
  void Cancel() { context_.TryCancel(); }

 private:
  grpc::ClientContext context_;
  v1::WatchJobRequest request_;
  v1::JobEvent event_;
  Tally* const live_;
  Tally* const ended_;
};

struct Latencies {
  std::vector<double> ms;
  double P99() {
    std::sort(ms.begin(), ms.end());
    return ms.empty() ? 0 : ms[std::min(ms.size() - 1, ms.size() * 99 / 100)];
  }
  double Max() { return ms.empty() ? 0 : *std::max_element(ms.begin(), ms.end()); }
};

TEST(OverloadTest, TwentyThousandIdleCallsKeepMemoryBoundedAndHeartbeatsServed) {
  FaultCluster cluster;
  const int metrics_port = FreePort();
  ASSERT_GT(metrics_port, 0);
  CoordinatorFlags flags;
  flags.node_heartbeat_interval = kNodeInterval;
  flags.node_heartbeat_timeout = 30;
  flags.heartbeat_interval = kRankInterval;
  flags.heartbeat_timeout = 600;
  flags.extra = {"--metrics-port",   absl::StrCat(metrics_port),
                 "--metrics-listen", "127.0.0.1",
                 "--max-wait",       "3600"};
  ASSERT_TRUE(cluster.StartCoordinator(flags).ok());
  const pid_t coordinator = cluster.coordinator().pid();

  std::vector<std::unique_ptr<v1::WorkerService::Stub>> stubs;
  for (int i = 0; i < kChannels; ++i) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // A connection each.
    args.SetInt("grpc.channel_id", i);
    stubs.push_back(v1::WorkerService::NewStub(
        grpc::CreateCustomChannel(cluster.address(), grpc::InsecureChannelCredentials(), args)));
  }
  auto stub_of = [&](int rank) { return stubs[static_cast<size_t>(rank) % stubs.size()].get(); };

  v1::CreateJobRequest create;
  create.set_world_size(kWorld);
  v1::CreateJobResponse created;
  auto admin = v1::AdminService::NewStub(cluster.channel());
  ASSERT_TRUE(admin->CreateJob(cluster.Context().get(), create, &created).ok());
  auto rank_context = [&](int rank) {
    v1::RankContext context;
    context.set_job_id(created.job_id());
    context.set_generation(created.generation());
    context.set_rank(rank);
    context.set_incarnation(static_cast<uint64_t>(rank) + 1);
    return context;
  };

  // Everybody joins (one world of 10,001, completed by the last join).
  {
    Tally joins;
    std::vector<std::unique_ptr<v1::JoinRequest>> requests(kWorld);
    std::vector<std::unique_ptr<v1::JoinResponse>> responses(kWorld);
    std::vector<std::unique_ptr<grpc::ClientContext>> contexts(kWorld);
    for (int rank = 0; rank < kWorld; ++rank) {
      requests[rank] = std::make_unique<v1::JoinRequest>();
      *requests[rank]->mutable_context() = rank_context(rank);
      requests[rank]->set_host(absl::StrCat("host-", rank / 8));
      requests[rank]->set_timeout_seconds(absl::ToDoubleSeconds(kStepTimeout));
      responses[rank] = std::make_unique<v1::JoinResponse>();
      contexts[rank] = std::make_unique<grpc::ClientContext>();
      stub_of(rank)->async()->Join(contexts[rank].get(), requests[rank].get(),
                                   responses[rank].get(),
                                   [&joins](grpc::Status s) { joins.Done(s.ok()); });
    }
    ASSERT_TRUE(joins.WaitFor(kWorld, kStepTimeout + absl::Seconds(30)));
    ASSERT_EQ(joins.ok(), kWorld) << joins.failed() << " joins failed";
  }
  // A node that heartbeats, for NodeHeartbeat latency.
  auto nodes = v1::NodeService::NewStub(cluster.channel());
  v1::RegisterNodeRequest reg;
  reg.set_name("probe");
  reg.set_address("127.0.0.1");
  reg.set_slots(1);
  v1::RegisterNodeResponse registered;
  ASSERT_TRUE(nodes->RegisterNode(cluster.Context().get(), reg, &registered).ok());

  absl::SleepFor(absl::Seconds(1));  // Let the allocator settle.
  const int64_t rss_before = VmRssBytes(coordinator);
  ASSERT_GT(rss_before, 0);

  // 10,000 watches and 10,000 blocked gets, from ranks 1..10,000.
  Tally live;
  Tally watches_ended;
  Tally gets;
  std::vector<std::unique_ptr<Watch>> watches;
  watches.reserve(kWaiters);
  struct Get {
    grpc::ClientContext context;
    v1::KvGetRequest request;
    v1::KvGetResponse response;
  };
  std::vector<std::unique_ptr<Get>> pending_gets(kWaiters);
  std::atomic<int> wrong_values{0};
  // Whatever happens below, no call may outlive its reactor or buffers:
  // cancel everything still in flight and wait for it (bounded).
  int started = 0;
  struct Cleanup {
    std::function<void()> run;
    ~Cleanup() { run(); }
  } cleanup{[&] {
    for (int i = 0; i < started; ++i) {
      watches[i]->Cancel();
      pending_gets[i]->context.TryCancel();
    }
    watches_ended.WaitFor(started, absl::Seconds(60));
    gets.WaitFor(started, absl::Seconds(60));
  }};
  const absl::Time load_start = absl::Now();
  for (int i = 0; i < kWaiters; ++i) {
    const int rank = i + 1;
    watches.push_back(
        std::make_unique<Watch>(stub_of(rank), rank_context(rank), &live, &watches_ended));
    auto& get = pending_gets[i];
    get = std::make_unique<Get>();
    *get->request.mutable_context() = rank_context(rank);
    get->request.set_key("never-set-until-the-end");
    get->request.set_wait(true);
    get->request.set_timeout_seconds(absl::ToDoubleSeconds(kStepTimeout));
    Get* raw = get.get();
    stub_of(rank)->async()->KvGet(&raw->context, &raw->request, &raw->response,
                                  [raw, &gets, &wrong_values](grpc::Status s) {
                                    if (s.ok() && raw->response.value() != "released") {
                                      ++wrong_values;
                                    }
                                    gets.Done(s.ok());
                                  });
    started = i + 1;
  }
  ASSERT_TRUE(live.WaitFor(kWaiters, kStepTimeout, /*events=*/true)) << "not every watch is live";
  ASSERT_TRUE(FaultCluster::Eventually(kStepTimeout,
                                       [&] { return PendingWaits(metrics_port) >= kWaiters; }))
      << "pending waits: " << PendingWaits(metrics_port);
  const double setup_s = absl::ToDoubleSeconds(absl::Now() - load_start);
  EXPECT_EQ(gets.done(), 0) << "a blocked get returned early";
  EXPECT_EQ(watches_ended.done(), 0) << "a watch ended early";

  // Heartbeats under the load: rank 0 and the node, every 100 ms for 5 s.
  Latencies rank_beats;
  Latencies node_beats;
  const absl::Time loop_end = absl::Now() + absl::Seconds(5);
  while (absl::Now() < loop_end) {
    v1::HeartbeatRequest beat;
    *beat.mutable_context() = rank_context(0);
    v1::HeartbeatResponse beat_reply;
    absl::Time t0 = absl::Now();
    grpc::Status s = stub_of(0)->Heartbeat(cluster.Context().get(), beat, &beat_reply);
    rank_beats.ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_FALSE(beat_reply.has_error()) << beat_reply.error().message();

    v1::NodeHeartbeatRequest node_beat;
    node_beat.set_name("probe");
    node_beat.set_session_id(registered.session_id());
    v1::NodeHeartbeatResponse node_reply;
    t0 = absl::Now();
    s = nodes->NodeHeartbeat(cluster.Context().get(), node_beat, &node_reply);
    node_beats.ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
    EXPECT_TRUE(s.ok()) << s.error_message();
    absl::SleepFor(absl::Milliseconds(100));
  }
  const int64_t rss_holding = VmRssBytes(coordinator);
  const double per_call = static_cast<double>(rss_holding - rss_before) / (2 * kWaiters);

  // Release: the key is set, every get returns it; the watches are
  // cancelled by their clients.
  v1::KvSetRequest set;
  *set.mutable_context() = rank_context(0);
  set.set_key("never-set-until-the-end");
  set.set_value("released");
  v1::KvSetResponse set_reply;
  const absl::Time release_start = absl::Now();
  ASSERT_TRUE(stub_of(0)->KvSet(cluster.Context().get(), set, &set_reply).ok());
  ASSERT_TRUE(gets.WaitFor(kWaiters, kStepTimeout));
  const double release_s = absl::ToDoubleSeconds(absl::Now() - release_start);
  for (auto& watch : watches) watch->Cancel();
  ASSERT_TRUE(watches_ended.WaitFor(kWaiters, kStepTimeout));
  absl::SleepFor(absl::Seconds(1));
  const int64_t rss_after = VmRssBytes(coordinator);

  std::printf(
      "fault-b overload: %d watches + %d blocked gets live in %.1f s; coordinator RSS %.1f MiB "
      "before, %.1f MiB holding (%.0f bytes per pending call), %.1f MiB after release; "
      "Heartbeat p99 %.1f ms (max %.1f, interval %.0f ms); NodeHeartbeat p99 %.1f ms (max %.1f, "
      "interval %.0f ms); %d gets released in %.2f s\n",
      kWaiters, kWaiters, setup_s, rss_before / 1048576.0, rss_holding / 1048576.0, per_call,
      rss_after / 1048576.0, rank_beats.P99(), rank_beats.Max(), kRankInterval * 1000,
      node_beats.P99(), node_beats.Max(), kNodeInterval * 1000, gets.ok(), release_s);

  EXPECT_EQ(gets.ok(), kWaiters) << gets.failed() << " gets failed";
  EXPECT_EQ(wrong_values.load(), 0);
  EXPECT_EQ(watches_ended.ok(), kWaiters) << watches_ended.failed() << " watches ended otherwise";
  EXPECT_LT(per_call, kMaxBytesPerCall);
  EXPECT_LT(rank_beats.P99(), kRankInterval * 1000);
  EXPECT_LT(node_beats.P99(), kNodeInterval * 1000);
  EXPECT_GE(rank_beats.ms.size(), 10u);
}

}  // namespace fault_b_overload_test
}  // namespace mesh::fault
