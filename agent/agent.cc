#include "agent/agent.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <random>
#include <system_error>
#include <utility>

#include <spdlog/spdlog.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "agent/log_tail.h"
#include "agent/worker_env.h"
#include "common/duration_format.h"
#include "common/version.h"

namespace mesh::agent {
namespace {

// Largest LogChunk.data sent (the proto's contract: chunks <= 64 KiB).
constexpr size_t kMaxChunkData = 64 * 1024;
// A followed upload with nothing to send writes an empty message this often,
// so it learns that the coordinator ended the call.
constexpr absl::Duration kUploadKeepalive = absl::Seconds(5);
// Extra time, beyond the grace, that stopping a generation may take.
constexpr absl::Duration kStopMargin = absl::Seconds(5);
// A session that lasted this long resets the re-registration backoff.
constexpr absl::Duration kStableSession = absl::Seconds(5);

// Job ids become directory names; the coordinator allows
// [A-Za-z0-9._-]{1,128}, and the agent checks again rather than trust a
// path component from the wire.
bool IsSafeJobId(const std::string& id) {
  if (id.empty() || id.size() > 128 || id == "." || id == "..") return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

std::string Describe(const grpc::Status& status) {
  return absl::StrCat(absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())),
                      ": ", status.error_message());
}

bool IsSessionError(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::ABORTED ||
         status.error_code() == grpc::StatusCode::NOT_FOUND;
}

// Errors worth retrying as they are; anything else means the coordinator
// refuses the report and will keep refusing it.
bool IsTransient(const grpc::Status& status) {
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::INTERNAL:
      return true;
    default:
      return false;
  }
}

void SetDeadline(grpc::ClientContext& context, absl::Duration timeout) {
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

// Wraps the agent's launcher for one generation: records the pid of each
// launch in order (WorkerSupervisor::Start launches its ranks in the order
// given, so pid i belongs to rank i), and lets a KILL order override the
// grace the supervisor was built with.
class RecordingLauncher final : public ProcessLauncher {
 public:
  explicit RecordingLauncher(ProcessLauncher* inner) : inner_(inner) {}

  absl::StatusOr<pid_t> Launch(const LaunchSpec& spec, ExitCallback on_exit) override {
    absl::StatusOr<pid_t> pid = inner_->Launch(spec, std::move(on_exit));
    if (pid.ok()) {
      absl::MutexLock lock(&mu_);
      pids_.push_back(*pid);
    }
    return pid;
  }
  absl::Status Signal(pid_t pid, int signal) override { return inner_->Signal(pid, signal); }
  absl::Status Terminate(pid_t pid, absl::Duration grace) override {
    {
      absl::MutexLock lock(&mu_);
      if (grace_override_.has_value()) grace = *grace_override_;
    }
    return inner_->Terminate(pid, grace);
  }

  std::vector<pid_t> pids() const {
    absl::MutexLock lock(&mu_);
    return pids_;
  }
  void OverrideGrace(absl::Duration grace) {
    absl::MutexLock lock(&mu_);
    grace_override_ = grace;
  }

 private:
  ProcessLauncher* const inner_;
  mutable absl::Mutex mu_;
  std::vector<pid_t> pids_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Duration> grace_override_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

// A report waiting for the coordinator's acknowledgement: exactly one of
// the two requests is set. name and session_id are filled at send time.
struct Agent::Report {
  uint64_t id = 0;
  std::optional<v1::ReportWorkersStartedRequest> started;
  std::optional<v1::ReportWorkerExitRequest> exit;
};

// The workers of one (job, generation). The maps are guarded by Agent::mu_;
// recorder and supervisor are set before the record is shared and are
// thread-safe themselves. Destroyed only outside Agent::mu_ (the
// supervisor's destructor waits for exit callbacks, which take mu_).
struct Agent::Generation {
  int64_t generation = 0;
  std::set<int> ranks;           // every rank of the LAUNCH
  std::map<int, pid_t> running;  // launched, exit not yet seen
  std::set<int> exited;
  // MESH_METRICS_PORT of each rank given one, until its exit is seen.
  std::map<int, int> metrics_ports;
  bool launching = true;  // Start() in progress: exits are held back
  bool stopped = false;   // killed or replaced: collected once empty
  // Exit reports that arrived while launching; sent after the started one.
  std::vector<Report> held;
  std::unique_ptr<RecordingLauncher> recorder;   // outlives supervisor
  std::unique_ptr<WorkerSupervisor> supervisor;  // declared last: destroyed first
};

struct Agent::JobRecord {
  // Highest generation launched or killed; LAUNCH at or below it is a no-op.
  int64_t highest = -1;
  std::map<int64_t, std::shared_ptr<Generation>> generations;
  // Exit records of the current generation, kept until a KILL, re-sent
  // after every re-registration.
  int64_t exits_generation = -1;
  std::vector<v1::ReportWorkerExitRequest> exits;
};

struct Agent::Upload {
  std::thread thread;
  bool done = false;  // guarded by Agent::mu_
};

// Lets Shutdown and RequestReconnect cancel a call in flight.
class Agent::ContextGuard {
 public:
  ContextGuard(Agent* agent, grpc::ClientContext* context) : agent_(agent), context_(context) {
    absl::MutexLock lock(&agent_->mu_);
    if (agent_->stopping_) context_->TryCancel();
    agent_->contexts_.insert(context_);
  }
  ~ContextGuard() {
    absl::MutexLock lock(&agent_->mu_);
    agent_->contexts_.erase(context_);
  }
  ContextGuard(const ContextGuard&) = delete;
  ContextGuard& operator=(const ContextGuard&) = delete;

 private:
  Agent* const agent_;
  grpc::ClientContext* const context_;
};

Agent::Agent(AgentConfig config, ProcessLauncher* launcher, metrics::Registry* metrics,
             StrayKiller* strays)
    : config_(std::move(config)),
      launcher_(launcher),
      strays_(strays),
      metrics_(metrics != nullptr ? *metrics : metrics::NoopRegistry()) {
  metrics_.slots->Set(config_.slots);
  metrics_.gpus->Set(static_cast<double>(config_.gpus.size()));
  metrics_.workers_running->Set(0);
  metrics_.workers_stopping->Set(0);
  metrics_.connected->Set(0);
  metrics_.heartbeat_age->Set(0);
}

Agent::~Agent() { Shutdown(); }

absl::Status Agent::Start() {
  if (config_.name.empty()) return absl::InvalidArgumentError("agent name is empty");
  if (config_.coordinator.empty()) return absl::InvalidArgumentError("coordinator is empty");
  if (config_.work_dir.empty()) return absl::InvalidArgumentError("work_dir is empty");
  if (config_.slots < 1) {
    return absl::InvalidArgumentError(absl::StrCat("slots must be >= 1, got ", config_.slots));
  }
  if (config_.metrics_port < 0 || config_.metrics_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics_port must be in 0..65535, got ", config_.metrics_port));
  }
  if (config_.worker_metrics_port_first != 0 &&
      (config_.worker_metrics_port_first < 1 ||
       config_.worker_metrics_port_first > config_.worker_metrics_port_last ||
       config_.worker_metrics_port_last > 65535)) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker metrics ports ", config_.worker_metrics_port_first, "-",
                     config_.worker_metrics_port_last, " are not a range within 1..65535"));
  }
  if (absl::Status s = security::ValidateClientSecurity(config_.security); !s.ok()) return s;
  {
    absl::MutexLock lock(&mu_);
    if (started_) return absl::FailedPreconditionError("agent already started");
    started_ = true;
    last_ack_ = absl::Now();
    next_worker_port_ = config_.worker_metrics_port_first;
  }
  grpc::ChannelArguments args;
  // gRPC's own reconnect backoff grows to 2 minutes by default, and a
  // RegisterNode made while the channel waits out that backoff waits for
  // the next connection attempt, however soon the coordinator is back.
  // Keep it at the agent's re-registration pace (at most backoff_max, 1 s
  // by default) so a restarted coordinator is found within about a second.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(config_.backoff_initial)));
  // Despite its name, gRPC uses this as the minimum time one connection
  // attempt (TCP connect and HTTP/2 handshake) gets before it is abandoned.
  // At backoff_initial (100 ms) attempts to a restarted coordinator on a
  // loaded host were cut short again and again ("tcp handshaker shutdown");
  // 1 s lets a handshake finish there and still retries a stalled attempt
  // soon.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(config_.backoff_max)));
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      security::MakeChannel(config_.coordinator, config_.security, args);
  if (!channel.ok()) return channel.status();
  channel_ = *std::move(channel);
  stub_ = v1::NodeService::NewStub(channel_);
  order_thread_ = std::thread([this] { OrderLoop(); });
  outbox_thread_ = std::thread([this] { OutboxLoop(); });
  heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });
  session_thread_ = std::thread([this] { SessionLoop(); });
  return absl::OkStatus();
}

void Agent::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (!started_ || stopping_) return;
    stopping_ = true;
    for (grpc::ClientContext* context : contexts_) context->TryCancel();
    SetConnectedLocked(false);
    changed_.SignalAll();
  }
  // The order thread first: after it no LAUNCH starts anything.
  for (std::thread* t : {&order_thread_, &session_thread_, &heartbeat_thread_, &outbox_thread_}) {
    if (t->joinable()) t->join();
  }
  std::list<std::unique_ptr<Upload>> uploads;
  std::vector<std::shared_ptr<Generation>> generations;
  std::vector<std::pair<std::string, int64_t>> ended;
  {
    absl::MutexLock lock(&mu_);
    uploads.swap(uploads_);
    for (auto& [id, job] : jobs_) {
      for (auto& [g, rec] : job->generations) {
        rec->stopped = true;
        generations.push_back(rec);
        ended.emplace_back(id, g);
      }
    }
    UpdateWorkerGaugesLocked();
  }
  for (auto& upload : uploads) upload->thread.join();
  for (auto& rec : generations) rec->supervisor->Stop();
  for (auto& rec : generations) {
    if (absl::Status s = rec->supervisor->WaitAllExited(config_.grace + kStopMargin); !s.ok()) {
      spdlog::warn("shutdown: {}", std::string(s.message()));
    }
  }
  KillStrays(ended);
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, job] : jobs_) job->generations.clear();
    UpdateWorkerGaugesLocked();
  }
  generations.clear();  // destroys the supervisors, outside mu_
}

std::string Agent::session_id() const {
  absl::MutexLock lock(&mu_);
  return session_id_;
}

int Agent::registrations() const {
  absl::MutexLock lock(&mu_);
  return registrations_;
}

std::vector<v1::RunningWorker> Agent::RunningWorkers() const {
  absl::MutexLock lock(&mu_);
  return RunningWorkersLocked();
}

std::vector<v1::RunningWorker> Agent::RunningWorkersLocked() const {
  std::vector<v1::RunningWorker> running;
  for (const auto& [id, job] : jobs_) {
    for (const auto& [g, rec] : job->generations) {
      for (const auto& [rank, pid] : rec->running) {
        v1::RunningWorker& w = running.emplace_back();
        w.set_job_id(id);
        w.set_generation(g);
        w.set_rank(rank);
        w.set_pid(pid);
        if (auto port = rec->metrics_ports.find(rank); port != rec->metrics_ports.end()) {
          w.set_metrics_port(port->second);
        }
      }
    }
  }
  return running;
}

void Agent::UpdateWorkerGaugesLocked() {
  size_t running = 0;
  size_t stopping = 0;
  for (const auto& [id, job] : jobs_) {
    for (const auto& [g, rec] : job->generations) {
      (rec->stopped ? stopping : running) += rec->running.size();
    }
  }
  metrics_.workers_running->Set(static_cast<double>(running));
  metrics_.workers_stopping->Set(static_cast<double>(stopping));
}

void Agent::SetConnectedLocked(bool connected) { metrics_.connected->Set(connected ? 1 : 0); }

void Agent::UpdateHeartbeatAgeLocked() {
  metrics_.heartbeat_age->Set(absl::ToDoubleSeconds(absl::Now() - last_ack_));
}

int Agent::AcquireWorkerMetricsPortLocked() {
  const int first = config_.worker_metrics_port_first;
  const int last = config_.worker_metrics_port_last;
  if (first == 0) return 0;
  const int count = last - first + 1;
  for (int i = 0; i < count; ++i) {
    const int port = first + (next_worker_port_ - first + i) % count;
    if (worker_ports_in_use_.insert(port).second) {
      next_worker_port_ = port == last ? first : port + 1;
      return port;
    }
  }
  return 0;
}

void Agent::ReleaseWorkerMetricsPortLocked(int port) { worker_ports_in_use_.erase(port); }

bool Agent::SleepUnlessStopping(absl::Duration duration) {
  absl::MutexLock lock(&mu_);
  const absl::Time deadline = absl::Now() + duration;
  while (!stopping_) {
    if (changed_.WaitWithDeadline(&mu_, deadline) && absl::Now() >= deadline) break;
  }
  return !stopping_;
}

void Agent::RequestReconnect(uint64_t epoch, const std::string& why) {
  absl::MutexLock lock(&mu_);
  if (epoch != epoch_ || !session_ok_) return;  // already being handled
  spdlog::warn("session {} broken ({}); re-registering", session_id_, why);
  session_ok_ = false;
  SetConnectedLocked(false);
  if (watch_context_ != nullptr) watch_context_->TryCancel();
  changed_.SignalAll();
}

// ---------------------------------------------------------------------------
// Session: register, watch, re-register.
// ---------------------------------------------------------------------------

void Agent::SessionLoop() {
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<double> jitter(0.8, 1.2);
  absl::Duration backoff = config_.backoff_initial;
  auto wait_backoff = [&] {
    const bool go_on = SleepUnlessStopping(backoff * jitter(rng));
    backoff = std::min(backoff * 2, config_.backoff_max);
    return go_on;
  };
  for (;;) {
    v1::RegisterNodeRequest request;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      request.set_name(config_.name);
      request.set_address(config_.address);
      request.set_slots(config_.slots);
      for (const GpuDevice& gpu : config_.gpus) {
        v1::NodeGpu* g = request.add_gpus();
        g->set_index(gpu.index);
        g->set_uuid(gpu.uuid);
        g->set_model(gpu.model);
        g->set_memory_bytes(gpu.memory_bytes);
      }
      request.set_agent_version(kVersion);
      request.set_metrics_port(config_.metrics_port);
      for (v1::RunningWorker& w : RunningWorkersLocked()) *request.add_running() = std::move(w);
    }
    v1::RegisterNodeResponse response;
    grpc::Status status;
    {
      grpc::ClientContext context;
      SetDeadline(context, config_.rpc_timeout);
      // Wait for a connection rather than fail fast while the channel is in
      // TRANSIENT_FAILURE: a connection attempt makes progress only while
      // some thread polls for it, and without a waiting RPC that is gRPC's
      // backup poller, every 5 s. Failing fast, the agent re-registered up
      // to 5 s after a restarted coordinator was serving (its SETTINGS frame
      // sat unread, and each attempt timed out as "tcp handshaker
      // shutdown"); waiting, this thread drives the handshake and the call
      // goes through as soon as the coordinator accepts.
      context.set_wait_for_ready(true);
      ContextGuard guard(this, &context);
      status = stub_->RegisterNode(&context, request, &response);
    }
    if (!status.ok()) {
      spdlog::warn("RegisterNode to {} failed ({}); retrying", config_.coordinator,
                   Describe(status));
      if (!wait_backoff()) return;
      continue;
    }
    uint64_t epoch = 0;
    {
      absl::MutexLock lock(&mu_);
      session_id_ = response.session_id();
      epoch = ++epoch_;
      session_ok_ = true;
      ++registrations_;
      last_ack_ = absl::Now();
      SetConnectedLocked(true);
      UpdateHeartbeatAgeLocked();
      heartbeat_interval_ = response.heartbeat_interval_seconds() > 0
                                ? absl::Seconds(response.heartbeat_interval_seconds())
                                : absl::Seconds(5);
      heartbeat_timeout_ = response.heartbeat_timeout_seconds() > 0
                               ? absl::Seconds(response.heartbeat_timeout_seconds())
                               : 3 * heartbeat_interval_;
      ResendExitRecordsLocked();
      changed_.SignalAll();
    }
    spdlog::info("registered as {} with {} (session {}, {} running workers)", config_.name,
                 config_.coordinator, response.session_id(), request.running_size());

    const absl::Time opened = absl::Now();
    bool got_order = false;
    grpc::Status end;
    {
      grpc::ClientContext context;
      v1::WatchAssignmentsRequest watch;
      watch.set_name(config_.name);
      watch.set_session_id(response.session_id());
      {
        // No deadline: the stream lives as long as the session. A silent
        // coordinator is caught by the heartbeats, which cancel it.
        absl::MutexLock lock(&mu_);
        watch_context_ = &context;
        contexts_.insert(&context);
        if (stopping_ || !session_ok_ || epoch_ != epoch) context.TryCancel();
      }
      std::unique_ptr<grpc::ClientReader<v1::Assignment>> reader =
          stub_->WatchAssignments(&context, watch);
      v1::Assignment order;
      while (reader->Read(&order)) {
        got_order = true;
        Dispatch(order);
      }
      end = reader->Finish();
      absl::MutexLock lock(&mu_);
      watch_context_ = nullptr;
      contexts_.erase(&context);
      if (epoch_ == epoch) {
        session_ok_ = false;
        SetConnectedLocked(false);
      }
      changed_.SignalAll();
      if (stopping_) return;
    }
    spdlog::warn("assignment stream of session {} ended ({}); re-registering",
                 response.session_id(), Describe(end));
    if (got_order || absl::Now() - opened >= kStableSession) backoff = config_.backoff_initial;
    if (!wait_backoff()) return;
  }
}

void Agent::HeartbeatLoop() {
  uint64_t seen_epoch = 0;
  absl::Time last_ok = absl::Now();
  for (;;) {
    v1::NodeHeartbeatRequest request;
    uint64_t epoch = 0;
    absl::Duration timeout;
    {
      absl::MutexLock lock(&mu_);
      // Wakes at least once a second to keep the heartbeat age current, in
      // a session or not.
      while (!stopping_ && !session_ok_) {
        UpdateHeartbeatAgeLocked();
        changed_.WaitWithTimeout(&mu_, absl::Seconds(1));
      }
      if (stopping_) return;
      epoch = epoch_;
      if (epoch != seen_epoch) {
        seen_epoch = epoch;
        last_ok = absl::Now();
      }
      timeout = heartbeat_timeout_;
      const absl::Time deadline = absl::Now() + heartbeat_interval_;
      while (!stopping_ && session_ok_ && epoch_ == epoch) {
        UpdateHeartbeatAgeLocked();
        const absl::Time wake = std::min(deadline, absl::Now() + absl::Seconds(1));
        if (changed_.WaitWithDeadline(&mu_, wake) && absl::Now() >= deadline) break;
      }
      if (stopping_) return;
      if (!session_ok_ || epoch_ != epoch) continue;
      request.set_name(config_.name);
      request.set_session_id(session_id_);
    }
    v1::NodeHeartbeatResponse response;
    grpc::Status status;
    {
      grpc::ClientContext context;
      SetDeadline(context, config_.rpc_timeout);
      ContextGuard guard(this, &context);
      status = stub_->NodeHeartbeat(&context, request, &response);
    }
    if (status.ok()) {
      last_ok = absl::Now();
      absl::MutexLock lock(&mu_);
      last_ack_ = last_ok;
      UpdateHeartbeatAgeLocked();
    } else if (IsSessionError(status)) {
      RequestReconnect(epoch, absl::StrCat("heartbeat: ", Describe(status)));
    } else if (absl::Now() - last_ok > timeout) {
      RequestReconnect(epoch, absl::StrCat("no heartbeat acknowledged for ",
                                           FormatDurationShort(absl::Now() - last_ok),
                                           "; last: ", Describe(status)));
    } else {
      spdlog::debug("heartbeat failed ({})", Describe(status));
    }
  }
}

// ---------------------------------------------------------------------------
// Reports.
// ---------------------------------------------------------------------------

void Agent::EnqueueReportLocked(Report report) {
  report.id = next_report_id_++;
  outbox_.push_back(std::move(report));
  changed_.SignalAll();
}

void Agent::ResendExitRecordsLocked() {
  for (const auto& [id, job] : jobs_) {
    for (const v1::ReportWorkerExitRequest& record : job->exits) {
      const bool queued = std::any_of(outbox_.begin(), outbox_.end(), [&](const Report& r) {
        return r.exit.has_value() && r.exit->job_id() == record.job_id() &&
               r.exit->generation() == record.generation() && r.exit->rank() == record.rank();
      });
      if (queued) continue;
      Report report;
      report.exit = record;
      EnqueueReportLocked(std::move(report));
    }
  }
}

void Agent::OutboxLoop() {
  absl::Duration backoff = config_.backoff_initial;
  for (;;) {
    Report report;
    uint64_t epoch = 0;
    std::string session;
    {
      absl::MutexLock lock(&mu_);
      while (!stopping_ && (outbox_.empty() || !session_ok_)) changed_.Wait(&mu_);
      if (stopping_) return;
      report = outbox_.front();
      epoch = epoch_;
      session = session_id_;
    }
    grpc::Status status;
    {
      grpc::ClientContext context;
      SetDeadline(context, config_.rpc_timeout);
      ContextGuard guard(this, &context);
      if (report.started.has_value()) {
        v1::ReportWorkersStartedRequest request = *report.started;
        request.set_name(config_.name);
        request.set_session_id(session);
        v1::ReportWorkersStartedResponse response;
        status = stub_->ReportWorkersStarted(&context, request, &response);
      } else {
        v1::ReportWorkerExitRequest request = *report.exit;
        request.set_name(config_.name);
        request.set_session_id(session);
        v1::ReportWorkerExitResponse response;
        status = stub_->ReportWorkerExit(&context, request, &response);
      }
    }
    const char* what = report.started.has_value() ? "ReportWorkersStarted" : "ReportWorkerExit";
    if (status.ok() || !(IsSessionError(status) || IsTransient(status))) {
      if (!status.ok()) {
        spdlog::error("coordinator refused {} ({}); dropping it", what, Describe(status));
      }
      absl::MutexLock lock(&mu_);
      if (!outbox_.empty() && outbox_.front().id == report.id) outbox_.pop_front();
      backoff = config_.backoff_initial;
      continue;
    }
    if (IsSessionError(status)) {
      RequestReconnect(epoch, absl::StrCat(what, ": ", Describe(status)));
      absl::MutexLock lock(&mu_);
      while (!stopping_ && epoch_ == epoch) changed_.Wait(&mu_);
      continue;
    }
    spdlog::debug("{} failed ({}); retrying", what, Describe(status));
    if (!SleepUnlessStopping(backoff)) return;
    backoff = std::min(backoff * 2, config_.backoff_max);
  }
}

// ---------------------------------------------------------------------------
// Orders.
// ---------------------------------------------------------------------------

void Agent::Dispatch(const v1::Assignment& order) {
  switch (order.action()) {
    // Uploads queue behind the orders before them too: an upload sent right
    // after a LAUNCH must find the launched ranks' log files.
    case v1::Assignment::ACTION_LAUNCH:
    case v1::Assignment::ACTION_KILL:
    case v1::Assignment::ACTION_UPLOAD_LOGS: {
      absl::MutexLock lock(&mu_);
      orders_.push_back(PendingOrder{order, absl::Now()});
      changed_.SignalAll();
      return;
    }
    default:
      spdlog::warn("ignoring order with unknown action {} for job {}",
                   static_cast<int>(order.action()), order.job_id());
  }
}

void Agent::OrderLoop() {
  for (;;) {
    std::optional<PendingOrder> pending;
    {
      absl::MutexLock lock(&mu_);
      // Wakes at least once a second to collect stopped generations.
      const absl::Time deadline = absl::Now() + absl::Seconds(1);
      while (!stopping_ && orders_.empty()) {
        if (changed_.WaitWithDeadline(&mu_, deadline) && absl::Now() >= deadline) break;
      }
      if (stopping_) return;
      if (!orders_.empty()) {
        pending = std::move(orders_.front());
        orders_.pop_front();
      }
    }
    if (pending.has_value()) {
      const v1::Assignment* order = &pending->order;
      switch (order->action()) {
        case v1::Assignment::ACTION_LAUNCH:
          ApplyLaunch(*order, pending->received);
          break;
        case v1::Assignment::ACTION_KILL:
          ApplyKill(*order);
          break;
        default:
          StartUpload(*order);  // Returns at once: the upload has its own thread.
          break;
      }
    }
    CollectFinishedGenerations();
  }
}

void Agent::CollectFinishedGenerations() {
  std::vector<std::shared_ptr<Generation>> finished;
  std::vector<std::pair<std::string, int64_t>> ended;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, job] : jobs_) {
      for (auto it = job->generations.begin(); it != job->generations.end();) {
        const Generation& rec = *it->second;
        if (rec.stopped && !rec.launching && rec.running.empty()) {
          ended.emplace_back(id, it->first);
          finished.push_back(std::move(it->second));
          it = job->generations.erase(it);
        } else {
          ++it;
        }
      }
    }
  }
  KillStrays(ended);
  // `finished` goes out of scope here, outside mu_.
}

void Agent::KillStrays(const std::vector<std::pair<std::string, int64_t>>& generations) {
  if (strays_ == nullptr) return;
  for (const auto& [job_id, generation] : generations) {
    if (const int killed = strays_->KillStrays(job_id, generation); killed > 0) {
      spdlog::warn(
          "job {} generation {}: killed {} process(es) that had left their worker's "
          "process group",
          job_id, generation, killed);
    }
  }
}

std::string Agent::GenerationDir(const std::string& job_id, int64_t generation) const {
  return absl::StrCat(config_.work_dir, "/jobs/", job_id, "/gen-", generation);
}

std::string Agent::LogPath(const std::string& job_id, int64_t generation, int rank) const {
  return absl::StrCat(GenerationDir(job_id, generation), "/rank-", rank, ".log");
}

void Agent::ApplyLaunch(const v1::Assignment& order, absl::Time received) {
  const std::string& job_id = order.job_id();
  const int64_t generation = order.generation();
  std::vector<std::shared_ptr<Generation>> older;
  {
    absl::MutexLock lock(&mu_);
    std::unique_ptr<JobRecord>& job = jobs_[job_id];
    if (job == nullptr) job = std::make_unique<JobRecord>();
    if (generation <= job->highest) {
      spdlog::debug("LAUNCH of job {} generation {}: already applied (highest {})", job_id,
                    generation, job->highest);
      return;
    }
    job->highest = generation;
    for (auto& [g, rec] : job->generations) {
      rec->stopped = true;
      older.push_back(rec);
    }
    job->exits.clear();
    job->exits_generation = generation;
    UpdateWorkerGaugesLocked();
  }
  spdlog::info("LAUNCH job {} generation {}: {} rank(s){}{}", job_id, generation,
               order.ranks_size(), order.reason().empty() ? "" : "; ", order.reason());
  // A restart: the old generation goes first, so two generations never
  // hold the same GPUs or ports.
  for (auto& rec : older) rec->supervisor->Stop();
  for (auto& rec : older) {
    if (absl::Status s = rec->supervisor->WaitAllExited(config_.grace + kStopMargin); !s.ok()) {
      spdlog::warn("launching job {} generation {} anyway: {}", job_id, generation,
                   std::string(s.message()));
    }
  }
  older.clear();
  CollectFinishedGenerations();

  std::vector<int> ranks;
  for (const v1::RankLaunch& r : order.ranks()) ranks.push_back(r.rank());
  // MESH_METRICS_PORT of each rank, held until the rank's exit is seen (or
  // the launch fails).
  std::map<int, int> metrics_ports;
  auto fail_all = [&](const std::string& why) {
    spdlog::error("cannot launch job {} generation {}: {}", job_id, generation, why);
    absl::MutexLock lock(&mu_);
    for (const auto& [rank, port] : metrics_ports) ReleaseWorkerMetricsPortLocked(port);
    metrics_ports.clear();
    JobRecord& job = *jobs_[job_id];
    for (int rank : ranks) {
      metrics_.worker_exits->WithLabels({kLaunchErrorReason})->Increment();
      v1::ReportWorkerExitRequest exit;
      exit.set_job_id(job_id);
      exit.set_generation(generation);
      exit.set_rank(rank);
      exit.set_launch_error(why);
      exit.set_time_unix_ms(absl::ToUnixMillis(absl::Now()));
      if (job.exits_generation == generation) job.exits.push_back(exit);
      Report report;
      report.exit = std::move(exit);
      EnqueueReportLocked(std::move(report));
    }
  };
  if (ranks.empty()) {
    spdlog::warn("LAUNCH of job {} generation {} lists no ranks; nothing to do", job_id,
                 generation);
    return;
  }
  if (!IsSafeJobId(job_id)) return fail_all(absl::StrCat("job id '", job_id, "' is not valid"));
  if (order.command().empty()) return fail_all("the command is empty");
  const std::string dir = GenerationDir(job_id, generation);
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) return fail_all(absl::StrCat("cannot create ", dir, ": ", error.message()));

  std::vector<std::pair<std::string, std::string>> user_env(order.env().begin(), order.env().end());
  std::sort(user_env.begin(), user_env.end());
  std::vector<RankLaunch> launches;
  for (const v1::RankLaunch& r : order.ranks()) {
    WorkerAssignment assignment;
    assignment.coordinator = config_.coordinator;
    assignment.security = config_.security;
    assignment.security.token = order.worker_token();
    assignment.job_id = job_id;
    assignment.generation = generation;
    assignment.rank = r.rank();
    assignment.world_size = order.world_size();
    assignment.local_rank = r.local_rank();
    assignment.local_world_size = order.local_world_size();
    assignment.node_rank = order.node_rank();
    assignment.num_nodes = order.num_nodes();
    assignment.node_name = config_.name;
    assignment.master_addr = order.master_addr();
    assignment.master_port = order.master_port();
    assignment.restart_count = order.restart_count();
    assignment.max_restarts = order.max_restarts();
    assignment.gpu_job = order.gpu_job();
    assignment.gpus.assign(r.gpus().begin(), r.gpus().end());
    assignment.agent_instance = config_.instance;
    assignment.user_env = user_env;
    {
      absl::MutexLock lock(&mu_);
      assignment.metrics_port = AcquireWorkerMetricsPortLocked();
    }
    if (assignment.metrics_port != 0) {
      metrics_ports[r.rank()] = assignment.metrics_port;
    } else if (config_.worker_metrics_port_first != 0) {
      spdlog::warn(
          "job {} generation {} rank {}: every worker metrics port ({}-{}) is taken; "
          "launching it without one",
          job_id, generation, r.rank(), config_.worker_metrics_port_first,
          config_.worker_metrics_port_last);
    }
    absl::StatusOr<std::vector<std::string>> env = BuildWorkerEnv(assignment, config_.base_env);
    if (!env.ok()) return fail_all(absl::StrCat("rank ", r.rank(), ": ", env.status().message()));
    RankLaunch launch;
    launch.rank = r.rank();
    launch.spec.argv.assign(order.command().begin(), order.command().end());
    launch.spec.env = std::move(*env);
    launch.spec.working_dir = order.working_dir().empty() ? dir : order.working_dir();
    launch.spec.stdout_log = LogPath(job_id, generation, r.rank());
    launch.spec.max_log_bytes = config_.log_max_bytes;
    launches.push_back(std::move(launch));
  }

  auto rec = std::make_shared<Generation>();
  rec->generation = generation;
  rec->ranks.insert(ranks.begin(), ranks.end());
  rec->metrics_ports = metrics_ports;
  rec->recorder = std::make_unique<RecordingLauncher>(launcher_);
  SupervisorOptions options;
  options.grace = config_.grace;
  rec->supervisor =
      std::make_unique<WorkerSupervisor>(rec->recorder.get(), job_id, generation, options,
                                         [this](const RankExit& exit) { OnRankExit(exit); });
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      for (const auto& [rank, port] : metrics_ports) ReleaseWorkerMetricsPortLocked(port);
      return;
    }
    jobs_[job_id]->generations[generation] = rec;
  }
  // From here the ports belong to `rec`: OnRankExit releases each.
  metrics_ports.clear();
  const absl::Status started = rec->supervisor->Start(std::move(launches));
  if (!started.ok()) {
    {
      absl::MutexLock lock(&mu_);
      rec->launching = false;
      rec->stopped = true;
      rec->held.clear();  // every rank is reported as a launch error instead
      // Ranks whose exit was not seen (never started) give their ports back.
      for (const auto& [rank, port] : rec->metrics_ports) ReleaseWorkerMetricsPortLocked(port);
      rec->metrics_ports.clear();
      UpdateWorkerGaugesLocked();
    }
    return fail_all(std::string(started.message()));
  }
  const std::vector<pid_t> pids = rec->recorder->pids();
  absl::MutexLock lock(&mu_);
  rec->launching = false;
  v1::ReportWorkersStartedRequest report;
  report.set_job_id(job_id);
  report.set_generation(generation);
  for (size_t i = 0; i < ranks.size() && i < pids.size(); ++i) {
    if (rec->exited.count(ranks[i]) == 0) rec->running[ranks[i]] = pids[i];
    v1::RunningWorker* w = report.add_workers();
    w->set_job_id(job_id);
    w->set_generation(generation);
    w->set_rank(ranks[i]);
    w->set_pid(pids[i]);
    if (auto port = rec->metrics_ports.find(ranks[i]); port != rec->metrics_ports.end()) {
      w->set_metrics_port(port->second);
    }
  }
  metrics_.launches->Increment(static_cast<double>(pids.size()));
  if (generation > 0) metrics_.restarts->Increment(static_cast<double>(pids.size()));
  metrics_.launch_duration->Observe(absl::ToDoubleSeconds(absl::Now() - received));
  UpdateWorkerGaugesLocked();
  spdlog::info("job {} generation {}: started {} worker(s)", job_id, generation, pids.size());
  Report started_report;
  started_report.started = std::move(report);
  EnqueueReportLocked(std::move(started_report));
  for (Report& held : rec->held) EnqueueReportLocked(std::move(held));
  rec->held.clear();
}

void Agent::ApplyKill(const v1::Assignment& order) {
  const std::string& job_id = order.job_id();
  std::vector<std::shared_ptr<Generation>> victims;
  {
    absl::MutexLock lock(&mu_);
    std::unique_ptr<JobRecord>& job = jobs_[job_id];
    if (job == nullptr) job = std::make_unique<JobRecord>();
    job->highest = std::max(job->highest, order.generation());
    for (auto& [g, rec] : job->generations) {
      if (g > order.generation()) continue;
      rec->stopped = true;
      victims.push_back(rec);
    }
    if (job->exits_generation <= order.generation()) job->exits.clear();
    UpdateWorkerGaugesLocked();
  }
  const absl::Duration grace = order.grace_period_seconds() > 0
                                   ? absl::Seconds(order.grace_period_seconds())
                                   : config_.grace;
  spdlog::info("KILL job {} generations <= {} ({} on this node, grace {}){}{}", job_id,
               order.generation(), victims.size(), FormatDurationShort(grace),
               order.reason().empty() ? "" : ": ", order.reason());
  for (auto& rec : victims) {
    rec->recorder->OverrideGrace(grace);
    rec->supervisor->Stop();
  }
}

void Agent::OnRankExit(const RankExit& exit) {
  absl::MutexLock lock(&mu_);
  JobRecord* job = nullptr;
  Generation* rec = nullptr;
  if (auto it = jobs_.find(exit.job_id); it != jobs_.end()) {
    job = it->second.get();
    if (auto g = job->generations.find(exit.generation); g != job->generations.end()) {
      rec = g->second.get();
    }
  }
  if (rec != nullptr) {
    rec->running.erase(exit.rank);
    rec->exited.insert(exit.rank);
    if (auto port = rec->metrics_ports.find(exit.rank); port != rec->metrics_ports.end()) {
      ReleaseWorkerMetricsPortLocked(port->second);
      rec->metrics_ports.erase(port);
    }
  }
  metrics_.worker_exits->WithLabels({WorkerExitReason(exit.exit)})->Increment();
  UpdateWorkerGaugesLocked();
  changed_.SignalAll();
  if (exit.stopped) return;  // the agent's doing, not the job's failure
  spdlog::info("job {} generation {} rank {} (pid {}) ended: {}", exit.job_id, exit.generation,
               exit.rank, exit.exit.pid, exit.exit.ToString());
  v1::ReportWorkerExitRequest request;
  request.set_job_id(exit.job_id);
  request.set_generation(exit.generation);
  request.set_rank(exit.rank);
  if (exit.exit.exited()) {
    request.set_exit_code(exit.exit.exit_code);
  } else {
    request.set_signal(exit.exit.signal);
  }
  request.set_time_unix_ms(absl::ToUnixMillis(absl::Now()));
  if (job != nullptr && job->exits_generation == exit.generation) job->exits.push_back(request);
  Report report;
  report.exit = std::move(request);
  if (rec != nullptr && rec->launching) {
    rec->held.push_back(std::move(report));
  } else {
    EnqueueReportLocked(std::move(report));
  }
}

// ---------------------------------------------------------------------------
// Log uploads.
// ---------------------------------------------------------------------------

void Agent::StartUpload(const v1::Assignment& order) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  // Join the uploads that finished: each sets `done` under mu_ as its last
  // step, so the join below waits only for the thread to return.
  for (auto it = uploads_.begin(); it != uploads_.end();) {
    if ((*it)->done) {
      (*it)->thread.join();
      it = uploads_.erase(it);
    } else {
      ++it;
    }
  }
  if (active_uploads_ >= config_.max_uploads) {
    spdlog::warn("refusing log upload {} for job {}: {} uploads already running",
                 order.log_request_id(), order.job_id(), active_uploads_);
    return;
  }
  ++active_uploads_;
  auto upload = std::make_unique<Upload>();
  Upload* raw = upload.get();
  raw->thread = std::thread([this, order, raw] {
    RunUpload(order);
    absl::MutexLock lock(&mu_);
    --active_uploads_;
    raw->done = true;
    changed_.SignalAll();
  });
  uploads_.push_back(std::move(upload));
}

bool Agent::RankFinished(const std::string& job_id, int64_t generation, int rank) const {
  absl::MutexLock lock(&mu_);
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) return true;
  auto gen = job->second->generations.find(generation);
  if (gen == job->second->generations.end()) return true;
  const Generation& rec = *gen->second;
  if (rec.ranks.count(rank) == 0) return true;
  if (rec.launching) return false;
  return rec.running.count(rank) == 0;
}

void Agent::RunUpload(const v1::Assignment& order) {
  const std::string& job_id = order.job_id();
  const int64_t generation = order.generation();
  const bool follow = order.log_follow();
  v1::UploadLogsRequest header;
  header.set_name(config_.name);
  header.set_job_id(job_id);
  header.set_log_request_id(order.log_request_id());
  std::set<int> ranks(order.log_ranks().begin(), order.log_ranks().end());
  {
    absl::MutexLock lock(&mu_);
    header.set_session_id(session_id_);
    if (ranks.empty()) {
      if (auto job = jobs_.find(job_id); job != jobs_.end()) {
        if (auto gen = job->second->generations.find(generation);
            gen != job->second->generations.end()) {
          ranks = gen->second->ranks;
        }
      }
    }
  }
  if (order.log_ranks().empty() && IsSafeJobId(job_id)) {
    // Logs outlive the agent's memory of a generation (a KILL, a restart of
    // the agent): the directory is the record.
    std::error_code error;
    for (const auto& entry :
         std::filesystem::directory_iterator(GenerationDir(job_id, generation), error)) {
      absl::string_view name = entry.path().filename().native();
      int rank = 0;
      if (absl::ConsumePrefix(&name, "rank-") && absl::ConsumeSuffix(&name, ".log") &&
          absl::SimpleAtoi(name, &rank) && rank >= 0) {
        ranks.insert(rank);
      }
    }
  }

  grpc::ClientContext context;
  SetDeadline(context, follow ? config_.follow_upload_timeout : config_.upload_timeout);
  ContextGuard guard(this, &context);
  v1::UploadLogsResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::UploadLogsRequest>> writer =
      stub_->UploadLogs(&context, &response);
  bool header_sent = false;
  auto send = [&](const v1::LogChunk* chunk) {
    v1::UploadLogsRequest message;
    if (!header_sent) {
      message = header;
      header_sent = true;
    }
    if (chunk != nullptr) *message.mutable_chunk() = *chunk;
    return writer->Write(message);
  };
  auto stopping = [&] {
    absl::MutexLock lock(&mu_);
    return stopping_;
  };

  // Every selected rank is read round-robin, so a follow shows all ranks as
  // they write, not one rank after another.
  struct RankLog {
    int rank = 0;
    std::unique_ptr<LogTail> tail;  // Null: no log (sent as missing).
    bool done = false;
  };
  std::vector<RankLog> logs;
  for (int rank : ranks) {
    RankLog log;
    log.rank = rank;
    absl::StatusOr<std::unique_ptr<LogTail>> tail =
        IsSafeJobId(job_id) ? LogTail::Open(LogPath(job_id, generation, rank), order.log_tail())
                            : absl::NotFoundError("bad job id");
    if (tail.ok()) {
      log.tail = *std::move(tail);
    } else if (!absl::IsNotFound(tail.status())) {
      spdlog::warn("log upload: {}", std::string(tail.status().message()));
    }
    logs.push_back(std::move(log));
  }
  auto send_eof = [&](RankLog& log) {
    log.done = true;
    v1::LogChunk eof;
    eof.set_rank(log.rank);
    eof.set_generation(generation);
    eof.set_eof(true);
    if (log.tail == nullptr) {
      eof.set_missing(true);
    } else {
      eof.set_offset(log.tail->offset());
    }
    return send(&eof);
  };

  bool ok = true;
  absl::Time last_write = absl::Now();
  size_t left = logs.size();
  while (ok && left > 0) {
    if (stopping()) {
      ok = false;
      break;
    }
    bool progressed = false;
    for (RankLog& log : logs) {
      if (log.done) continue;
      if (log.tail == nullptr) {
        ok = send_eof(log);
        --left;
        if (!ok) break;
        continue;
      }
      // Checked before reading: the launcher reports an exit only after the
      // worker's output is in the file, so reading after this sees it all.
      const bool finished = !follow || RankFinished(job_id, generation, log.rank);
      absl::StatusOr<LogPiece> piece = log.tail->Read(kMaxChunkData, finished);
      if (!piece.ok()) {
        spdlog::warn("log upload: {}", std::string(piece.status().message()));
        ok = send_eof(log);
        --left;
        if (!ok) break;
        continue;
      }
      if (!piece->data.empty()) {
        v1::LogChunk chunk;
        chunk.set_rank(log.rank);
        chunk.set_generation(generation);
        chunk.set_stream(v1::LogChunk::STREAM_STDOUT);
        chunk.set_data(std::move(piece->data));
        chunk.set_offset(piece->offset);
        chunk.set_truncated(piece->truncated);
        if (!(ok = send(&chunk))) break;
        last_write = absl::Now();
        progressed = true;
        if (follow || !log.tail->past_open_end()) continue;
      } else if (follow && !(finished && log.tail->at_end())) {
        continue;
      }
      ok = send_eof(log);
      --left;
      if (!ok) break;
    }
    if (!ok || left == 0 || progressed) continue;
    if (absl::Now() - last_write >= kUploadKeepalive) {
      if (!(ok = send(nullptr))) break;
      last_write = absl::Now();
    }
    SleepUnlessStopping(config_.log_poll_interval);
  }
  if (ok && !header_sent) ok = send(nullptr);  // no ranks: the header alone
  if (ok) writer->WritesDone();
  const grpc::Status status = writer->Finish();
  if (!status.ok()) {
    spdlog::info("log upload {} for job {} generation {} ended early: {}", order.log_request_id(),
                 job_id, generation, Describe(status));
  }
}

}  // namespace mesh::agent
