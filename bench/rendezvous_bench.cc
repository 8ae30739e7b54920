#include "bench/rendezvous_bench.h"
#include "bench/rendezvous_internal.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <thread>
#include <utility>

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/check.h"
#include "common/grpc_status.h"
#include "common/security.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "mesh/v1/admin.grpc.pb.h"
#include "mesh/v1/worker.grpc.pb.h"

namespace mesh::bench {

// ---- Shared helpers --------------------------------------------------------------

absl::StatusOr<std::vector<std::shared_ptr<grpc::Channel>>> MakeConnections(
    const std::string& address, int count, const BenchTls& tls) {
  security::ClientSecurity client;
  client.ca_file = tls.ca_file;
  client.server_name = tls.server_name;
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      security::MakeChannelCredentials(client);
  if (!credentials.ok()) return credentials.status();
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  channels.reserve(count);
  for (int i = 0; i < count; ++i) {
    grpc::ChannelArguments args;
    // Channels with equal arguments share one subchannel, hence one TCP
    // connection; an argument that differs per channel gives each its own.
    args.SetInt("mesh.bench.connection", i);
    // The server's limit applies; the client adds none of its own.
    args.SetMaxReceiveMessageSize(-1);
    if (tls.enabled() && !tls.server_name.empty()) args.SetSslTargetNameOverride(tls.server_name);
    channels.push_back(grpc::CreateCustomChannel(address, *credentials, args));
  }
  return channels;
}

std::vector<std::shared_ptr<grpc::Channel>> MakeConnections(const std::string& address, int count) {
  auto channels = MakeConnections(address, count, BenchTls{});
  MESH_CHECK(channels.ok(), "plaintext credentials cannot fail");
  return *std::move(channels);
}

absl::Status Connect(const std::vector<std::shared_ptr<grpc::Channel>>& channels,
                     absl::Duration timeout) {
  const auto deadline = std::chrono::system_clock::now() + absl::ToChronoNanoseconds(timeout);
  // In waves: a wave's connections start at once, then each is waited for.
  // One storm of 16384 TLS handshakes outlasts gRPC's 20 s connect deadline
  // on this kind of machine, and the hosts of a cluster come up over time.
  constexpr size_t kWave = 1024;
  for (size_t i = 0; i < channels.size(); ++i) {
    if (i % kWave == 0) {
      for (size_t j = i; j < std::min(channels.size(), i + kWave); ++j) {
        channels[j]->GetState(/*try_to_connect=*/true);
      }
    }
    grpc_connectivity_state state = channels[i]->GetState(/*try_to_connect=*/true);
    while (state != GRPC_CHANNEL_READY) {
      // A refused connection shows as TRANSIENT_FAILURE at once; waiting out
      // the reconnect backoff would only delay the same answer.
      if (state == GRPC_CHANNEL_TRANSIENT_FAILURE || state == GRPC_CHANNEL_SHUTDOWN) {
        return absl::UnavailableError(
            absl::StrCat("connection ", i, " of ", channels.size(), " failed"));
      }
      if (!channels[i]->WaitForStateChange(state, deadline)) {
        return absl::UnavailableError(absl::StrCat("connection ", i, " of ", channels.size(),
                                                   " did not connect within ",
                                                   absl::FormatDuration(timeout)));
      }
      state = channels[i]->GetState(/*try_to_connect=*/true);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<coordinator::CoordinatorServer>> StartBenchCoordinator(
    bool ranks_heartbeat, const BenchTls& tls) {
  coordinator::CoordinatorConfig config;
  config.port = 0;
  if (!tls.cert_file.empty()) {
    config.security.tls.cert_file = tls.cert_file;
    config.security.tls.key_file = tls.key_file;
  }
  if (!ranks_heartbeat) {
    // With the default 10 s timeout, a held wait of ranks that never
    // heartbeat would fail its generation for missed heartbeats.
    config.coordination.heartbeat_timeout = absl::Hours(1);
    config.coordination.max_wait = absl::Hours(2);
  }
  return coordinator::CoordinatorServer::Start(config);
}

namespace {

// "   1234 kB" -> bytes; 0 when malformed.
int64_t ParseKiB(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  absl::ConsumeSuffix(&text, "kB");
  int64_t kib = 0;
  return absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &kib) ? kib * 1024 : 0;
}

}  // namespace

ProcessStats ReadProcessStats() {
  ProcessStats stats;
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    absl::string_view view(line);
    if (absl::ConsumePrefix(&view, "Threads:")) {
      (void)absl::SimpleAtoi(absl::StripAsciiWhitespace(view), &stats.threads);
    } else if (absl::ConsumePrefix(&view, "VmRSS:")) {
      stats.rss_bytes = ParseKiB(view);
    } else if (absl::ConsumePrefix(&view, "VmHWM:")) {
      stats.peak_rss_bytes = ParseKiB(view);
    }
  }
  std::error_code error;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", error);
       !error && it != std::filesystem::directory_iterator(); it.increment(error)) {
    ++stats.open_fds;
  }
  return stats;
}

double ProcessCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

double LoadAverage() {
  std::ifstream file("/proc/loadavg");
  double load = -1;
  if (!(file >> load)) return -1;
  return load;
}

nlohmann::json ToJson(const ProcessStats& stats) {
  return {{"threads", stats.threads},
          {"rss_bytes", stats.rss_bytes},
          {"peak_rss_bytes", stats.peak_rss_bytes},
          {"open_fds", stats.open_fds}};
}

// ---- rendezvous ------------------------------------------------------------------------

namespace {

using namespace rendezvous_internal;  // NOLINT: the rounds share these.

// The coordinator's round: see the diagram in the header.
class MeshRound {
 public:
  MeshRound(const std::vector<std::unique_ptr<WorkerService::Stub>>& stubs, int ranks, JobSpec job,
            absl::Duration timeout, bool grpc_deadlines)
      : stubs_(stubs),
        ranks_(ranks),
        job_(std::move(job)),
        timeout_(timeout),
        deadline_(RoundDeadline(timeout, grpc_deadlines)),
        state_(ranks, kMeshSteps) {}

  absl::StatusOr<RoundResult> Run() {
    state_.Start();
    std::thread heartbeats([this] { HeartbeatLoop(); });
    for (int r = 0; r < ranks_; ++r) {
      state_.RankStarted(r);
      StartJoin(r);
    }
    state_.Wait(timeout_ + absl::Seconds(60));
    round_over_.Notify();
    heartbeats.join();
    // Every heartbeat answered, then every rank leaves (so the coordinator
    // stops tracking the generation): no call may outlive the round.
    calls_.Drain();
    for (int r = 0; r < ranks_; ++r) StartLeave(r);
    calls_.Drain();
    return calls_.Outcome(state_);
  }

 private:
  using JoinCall = Call<v1::JoinRequest, v1::JoinResponse>;
  using BarrierCall = Call<v1::BarrierRequest, v1::BarrierResponse>;
  using PublishCall = Call<v1::PublishUniqueIdsRequest, v1::PublishUniqueIdsResponse>;
  using GetIdsCall = Call<v1::GetUniqueIdsRequest, v1::GetUniqueIdsResponse>;

  WorkerService::StubInterface::async_interface* Stub(int rank) const {
    return stubs_[static_cast<size_t>(rank) % stubs_.size()]->async();
  }

  void FillContext(int rank, v1::RankContext* context) const {
    context->set_job_id(job_.job_id);
    context->set_generation(job_.generation);
    context->set_rank(rank);
    context->set_incarnation(Incarnation(rank));
  }
  static uint64_t Incarnation(int rank) {
    return (static_cast<uint64_t>(rank) + 1) * 0x9E3779B97F4A7C15ull;
  }
  double TimeoutSeconds() const { return absl::ToDoubleSeconds(timeout_); }

  void StartJoin(int rank) {
    auto* call = new JoinCall(rank, deadline_);
    FillContext(rank, call->request.mutable_context());
    call->request.set_host(absl::StrCat("host-", rank / kRanksPerHost));
    call->request.set_timeout_seconds(TimeoutSeconds());
    if (rank == 0) call->request.set_nccl_unique_id(job_.world_id);
    Stub(rank)->Join(&call->context, &call->request, &call->response,
                     [this, call](grpc::Status s) { OnJoin(std::unique_ptr<JoinCall>(call), s); });
  }

  // Returns what is wrong with the reply, or "" when it is right.
  std::string CheckJoin(const JoinCall& call, const grpc::Status& status) const {
    if (!status.ok()) return CallFailed("Join", status);
    const int rank = call.rank;
    const v1::JoinResponse& r = call.response;
    const int host = rank / kRanksPerHost;
    const int hosts = (ranks_ + kRanksPerHost - 1) / kRanksPerHost;
    const int on_host = std::min(kRanksPerHost, ranks_ - host * kRanksPerHost);
    if (r.rank() != rank || r.world_size() != ranks_ || r.generation() != job_.generation ||
        r.node_rank() != host || r.num_nodes() != hosts || r.local_rank() != rank % kRanksPerHost ||
        r.local_world_size() != on_host) {
      return absl::StrCat("Join replied rank ", r.rank(), " of ", r.world_size(), ", generation ",
                          r.generation(), ", node ", r.node_rank(), " of ", r.num_nodes(),
                          ", local ", r.local_rank(), " of ", r.local_world_size(),
                          "; expected rank ", rank, " of ", ranks_, ", generation ",
                          job_.generation, ", node ", host, " of ", hosts, ", local ",
                          rank % kRanksPerHost, " of ", on_host);
    }
    if (r.nccl_unique_id() != job_.world_id) {
      return absl::StrCat("Join replied a ", r.nccl_unique_id().size(),
                          "-byte world unique ID that differs from rank 0's");
    }
    return "";
  }

  // Each On* callback frees its call before it ends the rank's chain or
  // starts the next call, so that no call outlives its round.
  void OnJoin(std::unique_ptr<JoinCall> call, const grpc::Status& status) {
    const int rank = call->rank;
    const std::string wrong = CheckJoin(*call, status);
    if (wrong.empty()) {
      // As libmesh's Runtime does: heartbeat at the interval Join gave.
      const absl::Duration interval = absl::Seconds(call->response.heartbeat_interval_seconds());
      int64_t expected = 0;
      interval_ns_.compare_exchange_strong(expected, absl::ToInt64Nanoseconds(interval));
      timeout_ns_.store(
          absl::ToInt64Nanoseconds(absl::Seconds(call->response.heartbeat_timeout_seconds())));
      joined_[rank].store(true, std::memory_order_release);
    }
    call.reset();
    if (!wrong.empty()) return state_.Fail(rank, wrong);
    state_.StepDone(rank, kJoin);
    StartBarrier(rank);
  }

  void StartBarrier(int rank) {
    auto* call = new BarrierCall(rank, deadline_);
    FillContext(rank, call->request.mutable_context());
    call->request.set_name(kBarrierName);
    call->request.set_timeout_seconds(TimeoutSeconds());
    Stub(rank)->Barrier(
        &call->context, &call->request, &call->response,
        [this, call](grpc::Status s) { OnBarrier(std::unique_ptr<BarrierCall>(call), s); });
  }

  void OnBarrier(std::unique_ptr<BarrierCall> call, const grpc::Status& status) {
    const int rank = call->rank;
    std::string wrong;
    if (!status.ok()) {
      wrong = CallFailed("Barrier", status);
    } else if (call->response.participants() != ranks_) {
      wrong = absl::StrCat("Barrier replied ", call->response.participants(), " participants, not ",
                           ranks_);
    }
    call.reset();
    if (!wrong.empty()) return state_.Fail(rank, wrong);
    state_.StepDone(rank, kBarrier);
    // Rank 0 publishes only after the barrier, so the other ranks' gets
    // really wait for it, as they would for a communicator's ID.
    rank == 0 ? StartPublish(rank) : StartGetIds(rank);
  }

  void StartPublish(int rank) {
    auto* call = new PublishCall(rank, deadline_);
    FillContext(rank, call->request.mutable_context());
    (*call->request.mutable_ids())[kGroupKey] = job_.group_id;
    Stub(rank)->PublishUniqueIds(
        &call->context, &call->request, &call->response,
        [this, call](grpc::Status s) { OnPublish(std::unique_ptr<PublishCall>(call), s); });
  }

  void OnPublish(std::unique_ptr<PublishCall> call, const grpc::Status& status) {
    const int rank = call->rank;
    call.reset();
    if (!status.ok()) return state_.Fail(rank, CallFailed("PublishUniqueIds", status));
    StartGetIds(rank);
  }

  void StartGetIds(int rank) {
    auto* call = new GetIdsCall(rank, deadline_);
    FillContext(rank, call->request.mutable_context());
    call->request.add_keys(kGroupKey);
    call->request.set_timeout_seconds(TimeoutSeconds());
    Stub(rank)->GetUniqueIds(
        &call->context, &call->request, &call->response,
        [this, call](grpc::Status s) { OnGetIds(std::unique_ptr<GetIdsCall>(call), s); });
  }

  void OnGetIds(std::unique_ptr<GetIdsCall> call, const grpc::Status& status) {
    const int rank = call->rank;
    std::string wrong;
    if (!status.ok()) {
      wrong = CallFailed("GetUniqueIds", status);
    } else if (call->response.ids_size() != 1 || call->response.ids(0) != job_.group_id) {
      wrong = absl::StrCat("GetUniqueIds replied ", call->response.ids_size(),
                           " ID(s) that differ from the published one");
    }
    call.reset();
    if (!wrong.empty()) return state_.Fail(rank, wrong);
    state_.StepDone(rank, kUniqueId);
    state_.RankDone();
  }

  // ---- Heartbeats, and the Leave at the end --------------------------------

  using HeartbeatCall = Call<v1::HeartbeatRequest, v1::HeartbeatResponse>;
  using LeaveCall = Call<v1::LeaveRequest, v1::LeaveResponse>;
  static constexpr int kHeartbeatSlices = 10;

  // Every joined rank heartbeats once per interval, spread over it in
  // kHeartbeatSlices (ranks are not in step, any more than real ones are),
  // until the round is over.
  void HeartbeatLoop() {
    for (int slice = 0; !round_over_.HasBeenNotified(); slice = (slice + 1) % kHeartbeatSlices) {
      const int64_t interval_ns = interval_ns_.load();
      const absl::Duration step = interval_ns == 0
                                      ? absl::Milliseconds(10)
                                      : absl::Nanoseconds(interval_ns) / kHeartbeatSlices;
      if (round_over_.WaitForNotificationWithTimeout(step)) return;
      if (interval_ns == 0) continue;
      for (int r = slice; r < ranks_; r += kHeartbeatSlices) {
        if (joined_[r].load(std::memory_order_acquire)) StartHeartbeat(r);
      }
    }
  }

  void StartHeartbeat(int rank) {
    // Bounded like the Runtime's: a heartbeat slower than the timeout is as
    // good as lost.
    const auto deadline =
        std::chrono::system_clock::now() + std::chrono::nanoseconds(timeout_ns_.load());
    auto* call = new HeartbeatCall(rank, deadline);
    FillContext(rank, call->request.mutable_context());
    calls_.Started(/*heartbeat=*/true);
    Stub(rank)->Heartbeat(
        &call->context, &call->request, &call->response,
        [this, call](grpc::Status s) { OnHeartbeat(std::unique_ptr<HeartbeatCall>(call), s); });
  }

  void OnHeartbeat(std::unique_ptr<HeartbeatCall> call, const grpc::Status& status) {
    if (status.ok() && call->response.has_error()) {
      // The generation failed: a rank was declared dead (or failed) while
      // every simulated rank heartbeats on time.
      calls_.HeartbeatFoundFailure(absl::StrCat(
          "rank ", call->rank,
          "'s heartbeat found its generation failed: ", call->response.error().message()));
    }
    call.reset();
    // A heartbeat lost in transit is transient for a Runtime (it retries at
    // the next beat): counted.
    calls_.Done(/*failed_in_transit=*/!status.ok());
  }

  void StartLeave(int rank) {
    auto* call = new LeaveCall(rank, std::chrono::system_clock::now() + std::chrono::seconds(60));
    FillContext(rank, call->request.mutable_context());
    calls_.Started(/*heartbeat=*/false);
    Stub(rank)->Leave(&call->context, &call->request, &call->response, [this, call](grpc::Status) {
      delete call;
      calls_.Done();
    });
  }

  const std::vector<std::unique_ptr<WorkerService::Stub>>& stubs_;
  const int ranks_;
  const JobSpec job_;
  const absl::Duration timeout_;
  const std::optional<std::chrono::system_clock::time_point> deadline_;
  RoundState state_;

  std::unique_ptr<std::atomic<bool>[]> joined_ = std::make_unique<std::atomic<bool>[]>(ranks_);
  std::atomic<int64_t> interval_ns_{0};
  std::atomic<int64_t> timeout_ns_{0};
  absl::Notification round_over_;
  RoundCalls calls_;
};

constexpr int kBaselineCalls = 3;

// The baseline: as many callers, each making kBaselineCalls sequential
// health checks, the floor for moving that many calls through gRPC.
class BaselineRound {
 public:
  BaselineRound(const std::vector<std::unique_ptr<HealthStub>>& stubs, int ranks,
                absl::Duration timeout, bool grpc_deadlines)
      : stubs_(stubs),
        ranks_(ranks),
        timeout_(timeout),
        deadline_(RoundDeadline(timeout, grpc_deadlines)),
        state_(ranks, kBaselineCalls) {}

  absl::StatusOr<RoundResult> Run() {
    state_.Start();
    for (int r = 0; r < ranks_; ++r) {
      state_.RankStarted(r);
      StartCheck(r, 0);
    }
    state_.Wait(timeout_ + absl::Seconds(60));
    if (absl::Status s = state_.status(); !s.ok()) return s;
    return state_.Result();
  }

 private:
  using CheckCall =
      Call<grpc::health::v1::HealthCheckRequest, grpc::health::v1::HealthCheckResponse>;

  void StartCheck(int rank, int step) {
    auto* call = new CheckCall(rank, deadline_);
    call->step = step;
    stubs_[static_cast<size_t>(rank) % stubs_.size()]->async()->Check(
        &call->context, &call->request, &call->response,
        [this, call](grpc::Status s) { OnCheck(std::unique_ptr<CheckCall>(call), s); });
  }

  void OnCheck(std::unique_ptr<CheckCall> call, const grpc::Status& status) {
    const int rank = call->rank;
    const int step = call->step;
    std::string wrong;
    if (!status.ok()) {
      wrong = CallFailed("Health.Check", status);
    } else if (call->response.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
      wrong = "Health.Check replied other than SERVING";
    }
    call.reset();
    if (!wrong.empty()) return state_.Fail(rank, wrong);
    state_.StepDone(rank, step);
    if (step + 1 < kBaselineCalls) return StartCheck(rank, step + 1);
    state_.RankDone();
  }

  const std::vector<std::unique_ptr<HealthStub>>& stubs_;
  const int ranks_;
  const absl::Duration timeout_;
  const std::optional<std::chrono::system_clock::time_point> deadline_;
  RoundState state_;
};

absl::Status ValidateOptions(const RendezvousBenchOptions& o) {
  if (o.ranks < 1 || o.ranks > kMaxRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat("ranks must be in 1..", kMaxRanks, "; got ", o.ranks));
  }
  if (o.via_agent && (o.ranks_per_node < 1 || o.ranks_per_node > 4096)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ranks per node must be in 1..4096; got ", o.ranks_per_node));
  }
  if (o.via_agent && o.connection_per_rank) {
    return absl::InvalidArgumentError(
        "--via-agent gives each simulated agent a connection; --connection-per-rank does not "
        "apply");
  }
  if (!o.connection_per_rank && !o.via_agent && (o.channels < 1 || o.channels > 1024)) {
    return absl::InvalidArgumentError(
        absl::StrCat("channels must be in 1..1024; got ", o.channels));
  }
  if (!o.tls.enabled() && (!o.tls.cert_file.empty() || !o.tls.key_file.empty())) {
    return absl::InvalidArgumentError(
        "a TLS certificate and key need the CA that verifies them (--tls-ca)");
  }
  if (o.tls.enabled() && o.coordinator.empty() &&
      (o.tls.cert_file.empty() || o.tls.key_file.empty())) {
    return absl::InvalidArgumentError(
        "TLS with an in-process coordinator needs its certificate and key (--tls-cert, "
        "--tls-key; scripts/bench-pki.sh writes a set)");
  }
  if (!o.coordinator.empty() && (!o.tls.cert_file.empty() || !o.tls.key_file.empty())) {
    return absl::InvalidArgumentError(
        "--tls-cert and --tls-key are the in-process coordinator's; against --coordinator give "
        "only --tls-ca");
  }
  if (o.repeat < 1 || o.warmup < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("need repeat >= 1 and warmup >= 0; got ", o.repeat, " and ", o.warmup));
  }
  if (o.round_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the round timeout must be positive");
  }
  return absl::OkStatus();
}

}  // namespace

const std::vector<std::string>& MeshStepNames() {
  static const auto* names = new std::vector<std::string>{"join", "barrier", "unique_id"};
  return *names;
}

const std::vector<std::string>& BaselineStepNames() {
  static const auto* names = new std::vector<std::string>{"check1", "check2", "check3"};
  return *names;
}

namespace {

// Raises this process's descriptor soft limit to its hard limit, and says
// whether `needed` descriptors (plus a margin for everything else) fit.
absl::Status ReserveDescriptors(int64_t needed) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return absl::InternalError("getrlimit failed");
  if (limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
    getrlimit(RLIMIT_NOFILE, &limit);
  }
  const int64_t margin = 256;
  if (limit.rlim_cur != RLIM_INFINITY && static_cast<int64_t>(limit.rlim_cur) < needed + margin) {
    return absl::ResourceExhaustedError(
        absl::StrCat(needed, " connections need ", needed + margin,
                     " descriptors; this process may open ", limit.rlim_cur,
                     " (ulimit -Hn). Run the coordinator as its own process (--coordinator, "
                     "mesh-bench serve) to halve the need, or raise the limit"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RendezvousBenchResult> RunRendezvousBench(const RendezvousBenchOptions& given) {
  if (absl::Status s = ValidateOptions(given); !s.ok()) return s;
  RendezvousBenchOptions options = given;
  if (options.via_agent) {
    options.channels = (options.ranks + options.ranks_per_node - 1) / options.ranks_per_node;
    const int64_t needed = int64_t{options.channels} * (options.coordinator.empty() ? 2 : 1);
    if (absl::Status s = ReserveDescriptors(needed); !s.ok()) return s;
  } else if (options.connection_per_rank) {
    options.channels = options.ranks;
    // A client and, in process, a server end per connection.
    const int64_t needed = int64_t{options.channels} * (options.coordinator.empty() ? 2 : 1);
    if (absl::Status s = ReserveDescriptors(needed); !s.ok()) return s;
  }

  // Declared first so that it outlives the channels and every call.
  std::unique_ptr<coordinator::CoordinatorServer> server;
  RendezvousBenchResult result;
  result.coordinator = options.coordinator;
  result.ranks = options.ranks;
  result.channels = options.channels;
  result.via_agent = options.via_agent;
  result.ranks_per_node = options.via_agent ? options.ranks_per_node : 0;
  result.grpc_deadlines = options.grpc_deadlines;
  result.tls = options.tls.enabled();
  result.load_average = LoadAverage();
  if (result.coordinator.empty()) {
    auto started = StartBenchCoordinator(/*ranks_heartbeat=*/true, options.tls);
    if (!started.ok()) return started.status();
    server = *std::move(started);
    result.coordinator = server->address();
    result.in_process = true;
  }

  auto made = MakeConnections(result.coordinator, options.channels, options.tls);
  if (!made.ok()) return made.status();
  const std::vector<std::shared_ptr<grpc::Channel>> channels = *std::move(made);
  // 10 s, and more for thousands of connections (a connection per rank),
  // and more again for their TLS handshakes.
  const absl::Duration connect_timeout = std::max(
      absl::Seconds(10), absl::Milliseconds(options.tls.enabled() ? 20 : 5) * options.channels);
  const absl::Time connect_start = absl::Now();
  if (absl::Status s = Connect(channels, connect_timeout); !s.ok()) {
    return absl::UnavailableError(
        absl::StrCat("coordinator ", result.coordinator, ": ", s.message()));
  }
  result.connect_s = absl::ToDoubleSeconds(absl::Now() - connect_start);
  std::vector<std::unique_ptr<WorkerService::Stub>> workers;
  std::vector<std::unique_ptr<HealthStub>> health;
  for (const auto& channel : channels) {
    workers.push_back(WorkerService::NewStub(channel));
    health.push_back(grpc::health::v1::Health::NewStub(channel));
  }
  auto admin = v1::AdminService::NewStub(channels.front());

  auto create_job = [&](uint32_t round) -> absl::StatusOr<JobSpec> {
    JobSpec job;
    job.world_id = MakeUniqueId(2 * round + 1);
    job.group_id = MakeUniqueId(2 * round + 2);
    if (server != nullptr) {
      coordinator::JobLayout layout;
      layout.world_size = options.ranks;
      auto info = server->coordination().CreateJob(std::move(layout));
      if (!info.ok()) return info.status();
      job.job_id = info->layout.job_id;
      job.generation = info->generation;
      return job;
    }
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::CreateJobRequest request;
    request.set_world_size(options.ranks);
    v1::CreateJobResponse response;
    if (grpc::Status s = admin->CreateJob(&context, request, &response); !s.ok()) {
      return FromGrpcStatus(s);
    }
    job.job_id = response.job_id();
    job.generation = response.generation();
    return job;
  };

  const int rounds = options.warmup + options.repeat;
  for (int round = 0; round < rounds; ++round) {
    const bool measured = round >= options.warmup;
    auto baseline =
        BaselineRound(health, options.ranks, options.round_timeout, options.grpc_deadlines).Run();
    if (!baseline.ok()) {
      return absl::Status(baseline.status().code(), absl::StrCat("baseline round ", round, ": ",
                                                                 baseline.status().message()));
    }
    auto job = create_job(static_cast<uint32_t>(round));
    if (!job.ok()) return job.status();
    const std::string job_id = job->job_id;
    auto mesh = options.via_agent ? RunNodeRound(workers, options.ranks, options.ranks_per_node,
                                                 *std::move(job), options.round_timeout)
                                  : MeshRound(workers, options.ranks, *std::move(job),
                                              options.round_timeout, options.grpc_deadlines)
                                        .Run();
    if (!mesh.ok()) {
      return absl::Status(mesh.status().code(),
                          absl::StrCat("job ", job_id, ": ", mesh.status().message()));
    }
    if (measured) {
      result.baseline.push_back(*std::move(baseline));
      result.mesh.push_back(*std::move(mesh));
    }
  }

  auto median_of = [](const std::vector<RoundResult>& rounds, auto field) {
    std::vector<double> values;
    for (const RoundResult& r : rounds) values.push_back(field(r));
    return Median(std::move(values));
  };
  auto steps_of = [&](const std::vector<RoundResult>& rounds, auto member) {
    std::vector<double> steps;
    for (size_t s = 0; s < (rounds.front().*member).size(); ++s) {
      steps.push_back(
          median_of(rounds, [s, member](const RoundResult& r) { return (r.*member)[s]; }));
    }
    return steps;
  };
  result.mesh_total_s = median_of(result.mesh, [](const RoundResult& r) { return r.total_s; });
  result.baseline_total_s =
      median_of(result.baseline, [](const RoundResult& r) { return r.total_s; });
  auto ratio_of = [&](auto field) {
    std::vector<double> ratios;
    for (size_t i = 0; i < result.mesh.size(); ++i) {
      ratios.push_back(field(result.mesh[i]) / field(result.baseline[i]));
    }
    return Median(std::move(ratios));
  };
  result.ratio = ratio_of([](const RoundResult& r) { return r.total_s; });
  result.mesh_cpu_s = median_of(result.mesh, [](const RoundResult& r) { return r.cpu_s; });
  result.baseline_cpu_s = median_of(result.baseline, [](const RoundResult& r) { return r.cpu_s; });
  result.cpu_ratio = ratio_of([](const RoundResult& r) { return r.cpu_s; });
  result.p50_ratio = ratio_of([](const RoundResult& r) { return r.rank_latency.p50_us; });
  result.p99_ratio = ratio_of([](const RoundResult& r) { return r.rank_latency.p99_us; });
  result.mesh_p50_us =
      median_of(result.mesh, [](const RoundResult& r) { return r.rank_latency.p50_us; });
  result.mesh_p99_us =
      median_of(result.mesh, [](const RoundResult& r) { return r.rank_latency.p99_us; });
  result.baseline_p50_us =
      median_of(result.baseline, [](const RoundResult& r) { return r.rank_latency.p50_us; });
  result.baseline_p99_us =
      median_of(result.baseline, [](const RoundResult& r) { return r.rank_latency.p99_us; });
  result.mesh_step_s = steps_of(result.mesh, &RoundResult::step_s);
  result.mesh_step_first_s = steps_of(result.mesh, &RoundResult::step_first_s);
  result.baseline_step_s = steps_of(result.baseline, &RoundResult::step_s);
  result.baseline_step_first_s = steps_of(result.baseline, &RoundResult::step_first_s);
  result.process = ReadProcessStats();
  return result;
}

nlohmann::json ToJson(const RendezvousBenchResult& result) {
  auto rounds = [](const std::vector<RoundResult>& list, const std::vector<std::string>& names) {
    nlohmann::json out = nlohmann::json::array();
    for (const RoundResult& r : list) {
      nlohmann::json steps;
      for (size_t s = 0; s < names.size() && s < r.step_s.size(); ++s) {
        steps[names[s]] = r.step_s[s];
      }
      nlohmann::json round = {{"total_s", r.total_s},
                              {"cpu_s", r.cpu_s},
                              {"step_s", steps},
                              {"rank_latency", ToJson(r.rank_latency)}};
      if (r.heartbeats > 0) {
        round["heartbeats"] = r.heartbeats;
        round["heartbeat_errors"] = r.heartbeat_errors;
      }
      out.push_back(std::move(round));
    }
    return out;
  };
  auto steps = [](const std::vector<double>& values, const std::vector<std::string>& names) {
    nlohmann::json out;
    for (size_t s = 0; s < names.size() && s < values.size(); ++s) out[names[s]] = values[s];
    return out;
  };
  return {{"benchmark", "rendezvous"},
          {"coordinator", result.coordinator},
          {"in_process", result.in_process},
          {"ranks", result.ranks},
          {"channels", result.channels},
          {"via_agent", result.via_agent},
          {"ranks_per_node", result.ranks_per_node},
          {"grpc_deadlines", result.grpc_deadlines},
          {"tls", result.tls},
          {"connect_s", result.connect_s},
          {"load_average", result.load_average},
          {"rounds", result.mesh.size()},
          {"mesh",
           {{"total_s", result.mesh_total_s},
            {"cpu_s", result.mesh_cpu_s},
            {"p50_us", result.mesh_p50_us},
            {"p99_us", result.mesh_p99_us},
            {"step_s", steps(result.mesh_step_s, MeshStepNames())},
            {"step_first_s", steps(result.mesh_step_first_s, MeshStepNames())},
            {"rounds", rounds(result.mesh, MeshStepNames())}}},
          {"baseline_health_check",
           {{"total_s", result.baseline_total_s},
            {"cpu_s", result.baseline_cpu_s},
            {"p50_us", result.baseline_p50_us},
            {"p99_us", result.baseline_p99_us},
            {"step_s", steps(result.baseline_step_s, BaselineStepNames())},
            {"step_first_s", steps(result.baseline_step_first_s, BaselineStepNames())},
            {"rounds", rounds(result.baseline, BaselineStepNames())}}},
          {"ratio", result.ratio},
          {"cpu_ratio", result.cpu_ratio},
          {"p50_ratio", result.p50_ratio},
          {"p99_ratio", result.p99_ratio},
          {"process", ToJson(result.process)}};
}

}  // namespace mesh::bench
