#include "agent/coordinator_session.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <random>
#include <utility>

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "common/duration_format.h"
#include "common/version.h"

namespace mesh::agent {
namespace {

// A session that lasted this long resets the re-registration backoff.
constexpr absl::Duration kStableSession = absl::Seconds(5);

}  // namespace

CoordinatorSession::CoordinatorSession(const AgentConfig* config, NodeClient* client,
                                       AgentMetrics* metrics, Callbacks callbacks)
    : config_(*config), client_(client), metrics_(metrics), callbacks_(std::move(callbacks)) {}

CoordinatorSession::~CoordinatorSession() { Stop(); }

void CoordinatorSession::Start() {
  {
    absl::MutexLock lock(&mu_);
    last_ack_ = absl::Now();
  }
  heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });
  session_thread_ = std::thread([this] { SessionLoop(); });
}

void CoordinatorSession::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (watch_ != nullptr) watch_->Cancel();
    metrics_->connected->Set(0);
    changed_.SignalAll();
  }
  for (std::thread* t : {&session_thread_, &heartbeat_thread_}) {
    if (t->joinable()) t->join();
  }
}

std::string CoordinatorSession::session_id() const {
  absl::MutexLock lock(&mu_);
  return session_id_;
}

int CoordinatorSession::registrations() const {
  absl::MutexLock lock(&mu_);
  return registrations_;
}

void CoordinatorSession::UpdateHeartbeatAgeLocked() {
  metrics_->heartbeat_age->Set(absl::ToDoubleSeconds(absl::Now() - last_ack_));
}

bool CoordinatorSession::SleepUnlessStopping(absl::Duration duration) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stopping_), duration);
  return !stopping_;
}

void CoordinatorSession::RequestReconnect(uint64_t epoch, const std::string& why) {
  absl::MutexLock lock(&mu_);
  if (announcing_ && epoch == epoch_ + 1) {
    // on_up of this session is still running: the session ends once it is up.
    broken_while_announced_ = why;
    return;
  }
  if (epoch != epoch_ || !session_ok_) return;  // already being handled
  spdlog::warn("session {} broken ({}); re-registering", session_id_, why);
  EndSessionLocked(epoch);
  if (watch_ != nullptr) watch_->Cancel();
}

void CoordinatorSession::EndSessionLocked(uint64_t epoch) {
  if (epoch != epoch_ || !session_ok_) return;
  session_ok_ = false;
  metrics_->connected->Set(0);
  if (callbacks_.on_down) callbacks_.on_down(epoch);
  changed_.SignalAll();
}

v1::RegisterNodeRequest CoordinatorSession::MakeRegisterRequest() {
  v1::RegisterNodeRequest request;
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
  *request.mutable_isolation() = config_.isolation;
  if (callbacks_.running_workers) {
    for (v1::RunningWorker& w : callbacks_.running_workers()) {
      *request.add_running() = std::move(w);
    }
  }
  return request;
}

void CoordinatorSession::SessionLoop() {
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<double> jitter(0.8, 1.2);
  absl::Duration backoff = config_.backoff_initial;
  auto wait_backoff = [&] {
    const bool go_on = SleepUnlessStopping(backoff * jitter(rng));
    backoff = std::min(backoff * 2, config_.backoff_max);
    return go_on;
  };
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    const v1::RegisterNodeRequest request = MakeRegisterRequest();
    absl::StatusOr<v1::RegisterNodeResponse> response =
        client_->RegisterNode(request, config_.rpc_timeout);
    if (!response.ok()) {
      spdlog::warn("RegisterNode to {} failed ({}); retrying", config_.coordinator,
                   response.status().ToString());
      if (!wait_backoff()) return;
      continue;
    }
    uint64_t epoch = 0;
    {
      absl::MutexLock lock(&mu_);
      epoch = epoch_ + 1;
      announcing_ = true;
      broken_while_announced_.reset();
    }
    // Only this thread bumps the epoch, so `epoch` is the next one.
    if (callbacks_.on_up) callbacks_.on_up(epoch, response->session_id());
    {
      absl::MutexLock lock(&mu_);
      session_id_ = response->session_id();
      epoch_ = epoch;
      session_ok_ = true;
      announcing_ = false;
      ++registrations_;
      last_ack_ = absl::Now();
      metrics_->connected->Set(1);
      UpdateHeartbeatAgeLocked();
      heartbeat_interval_ = response->heartbeat_interval_seconds() > 0
                                ? absl::Seconds(response->heartbeat_interval_seconds())
                                : absl::Seconds(5);
      heartbeat_timeout_ = response->heartbeat_timeout_seconds() > 0
                               ? absl::Seconds(response->heartbeat_timeout_seconds())
                               : 3 * heartbeat_interval_;
      changed_.SignalAll();
    }
    spdlog::info("registered as {} with {} (session {}, {} running workers)", config_.name,
                 config_.coordinator, response->session_id(), request.running_size());
    {
      // A report sent as on_up announced the session may have found it
      // stale already: end it now, as RequestReconnect would have.
      absl::MutexLock lock(&mu_);
      if (broken_while_announced_.has_value()) {
        spdlog::warn("session {} broken ({}); re-registering", session_id_,
                     *broken_while_announced_);
        EndSessionLocked(epoch);
      }
    }

    const absl::Time opened = absl::Now();
    bool got_order = false;
    absl::Status end;
    {
      v1::WatchAssignmentsRequest watch;
      watch.set_name(config_.name);
      watch.set_session_id(response->session_id());
      // No deadline: the stream lives as long as the session. A silent
      // coordinator is caught by the heartbeats, which cancel it.
      std::unique_ptr<AssignmentStream> stream = client_->WatchAssignments(watch);
      {
        absl::MutexLock lock(&mu_);
        watch_ = stream.get();
        if (stopping_ || !session_ok_ || epoch_ != epoch) stream->Cancel();
      }
      for (;;) {
        absl::StatusOr<std::optional<v1::Assignment>> order = stream->Next();
        if (!order.ok()) {
          end = order.status();
          break;
        }
        if (!order->has_value()) break;
        got_order = true;
        if (callbacks_.on_order) callbacks_.on_order(**order);
      }
      absl::MutexLock lock(&mu_);
      watch_ = nullptr;
      EndSessionLocked(epoch);
      changed_.SignalAll();
      if (stopping_) return;
    }
    spdlog::warn("assignment stream of session {} ended ({}); re-registering",
                 response->session_id(), end.ToString());
    if (got_order || absl::Now() - opened >= kStableSession) backoff = config_.backoff_initial;
    if (!wait_backoff()) return;
  }
}

void CoordinatorSession::HeartbeatLoop() {
  uint64_t seen_epoch = 0;
  absl::Time last_ok = absl::Now();
  bool last_failed = false;
  // Agents that registered together (after a coordinator restart) would
  // otherwise beat together: the first beat of a session comes at a random
  // point of the interval, and each later one within +-10% of it.
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<double> first(0.0, 1.0);
  std::uniform_real_distribution<double> jitter(0.9, 1.1);
  for (;;) {
    v1::NodeHeartbeatRequest request;
    uint64_t epoch = 0;
    absl::Duration timeout;
    absl::Duration call_timeout;
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
      double spread = jitter(rng);
      if (epoch != seen_epoch) {
        seen_epoch = epoch;
        last_ok = absl::Now();
        last_failed = false;
        spread = first(rng);
      }
      timeout = heartbeat_timeout_;
      // After a failed beat the next comes within a second, however long
      // the interval has grown: the timeout leaves room for few beats. Each
      // call gets at most an interval (and the RPC timeout), so that one
      // hung call does not eat the room of the next.
      const absl::Duration wait = last_failed ? std::min(heartbeat_interval_, absl::Seconds(1))
                                              : heartbeat_interval_ * spread;
      call_timeout = std::min(config_.rpc_timeout, std::max(heartbeat_interval_, absl::Seconds(1)));
      const absl::Time deadline = absl::Now() + wait;
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
    const absl::StatusOr<v1::NodeHeartbeatResponse> reply =
        client_->NodeHeartbeat(request, call_timeout);
    const absl::Status status = reply.status();
    last_failed = !status.ok();
    if (status.ok()) {
      last_ok = absl::Now();
      absl::MutexLock lock(&mu_);
      last_ack_ = last_ok;
      UpdateHeartbeatAgeLocked();
      // The coordinator lengthens the interval as the cluster grows; 0 is an
      // older coordinator's reply.
      if (reply->heartbeat_interval_seconds() > 0 && epoch_ == epoch) {
        heartbeat_interval_ = absl::Seconds(reply->heartbeat_interval_seconds());
      }
    } else if (IsSessionError(status)) {
      RequestReconnect(epoch, absl::StrCat("heartbeat: ", status.ToString()));
    } else if (absl::Now() - last_ok > timeout) {
      RequestReconnect(epoch, absl::StrCat("no heartbeat acknowledged for ",
                                           FormatDurationShort(absl::Now() - last_ok),
                                           "; last: ", status.ToString()));
    } else {
      spdlog::debug("heartbeat failed ({})", status.ToString());
    }
  }
}

}  // namespace mesh::agent
