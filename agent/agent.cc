#include "agent/agent.h"

#include <filesystem>
#include <optional>
#include <utility>

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "agent/grpc_node_client.h"
#include "agent/replica_node_client.h"
#include "common/check.h"
#include "common/coordinator_targets.h"
#include "common/security.h"

namespace mesh::agent {

Agent::Agent(AgentConfig config, ProcessLauncher* launcher, metrics::Registry* metrics,
             StrayKiller* strays, const JobIsolation* isolation)
    : config_(std::move(config)),
      launcher_(launcher),
      strays_(strays),
      isolation_(isolation),
      metrics_(metrics != nullptr ? *metrics : metrics::NoopRegistry()) {
  metrics_.slots->Set(config_.slots);
  metrics_.gpus->Set(static_cast<double>(config_.gpus.size()));
  metrics_.workers_running->Set(0);
  metrics_.workers_stopping->Set(0);
  metrics_.connected->Set(0);
  metrics_.heartbeat_age->Set(0);
}

Agent::Agent(AgentConfig config, std::unique_ptr<NodeClient> client, ProcessLauncher* launcher,
             metrics::Registry* metrics, StrayKiller* strays, const JobIsolation* isolation)
    : Agent(std::move(config), launcher, metrics, strays, isolation) {
  MESH_CHECK(client != nullptr, "Agent needs a NodeClient");
  client_ = std::move(client);
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
  }
  if (client_ == nullptr) {
    GrpcNodeClientOptions options;
    options.backoff_initial = config_.backoff_initial;
    options.backoff_max = config_.backoff_max;
    // Several coordinator replicas (docs/ha.md): one channel each, calls
    // to the one that leads.
    std::vector<std::string> targets = SplitCoordinatorTargets(config_.coordinator);
    std::vector<std::unique_ptr<NodeClient>> clients;
    for (const std::string& target : targets) {
      absl::StatusOr<std::unique_ptr<NodeClient>> client =
          NewGrpcNodeClient(target, config_.security, options);
      if (!client.ok()) return client.status();
      clients.push_back(*std::move(client));
    }
    if (clients.empty()) return absl::InvalidArgumentError("coordinator is empty");
    client_ = clients.size() == 1 ? std::move(clients.front())
                                  : NewReplicaNodeClient(std::move(targets), std::move(clients));
  }
  outbox_ = std::make_unique<ReportOutbox>(
      &config_, client_.get(),
      [this](uint64_t epoch, const std::string& why) { session_->RequestReconnect(epoch, why); });
  applier_ = std::make_unique<OrderApplier>(&config_, launcher_, outbox_.get(), &metrics_, strays_,
                                            isolation_);
  if (config_.rank_relay) {
    std::error_code ignored;  // A failure shows as the relay's own.
    std::filesystem::create_directories(config_.work_dir, ignored);
    RankRelayOptions relay;
    relay.socket_path = config_.relay_socket.empty()
                            ? (std::filesystem::path(config_.work_dir) / "relay.sock").string()
                            : config_.relay_socket;
    relay.coordinator = config_.coordinator;
    relay.security = config_.security;
    relay.rank_calls = metrics_.relay_rank_calls;
    relay.coordinator_calls = metrics_.relay_coordinator_calls;
    absl::StatusOr<std::unique_ptr<RankRelay>> started = RankRelay::Start(std::move(relay));
    if (started.ok()) {
      relay_ = *std::move(started);
      applier_->set_relay(relay_.get());
      spdlog::info("rank relay on {}", relay_->target());
    } else if (!config_.relay_socket.empty()) {
      return started.status();
    } else {
      // The default place did not work (a work dir too deep for a Unix
      // socket path, say): workers call the coordinator directly.
      spdlog::warn("no rank relay ({}); workers call the coordinator directly",
                   std::string(started.status().message()));
    }
  }
  applier_->set_on_collectable([this] {
    absl::MutexLock lock(&mu_);
    collect_now_ = true;
    orders_changed_.SignalAll();
  });
  CoordinatorSession::Callbacks callbacks;
  callbacks.running_workers = [this] { return applier_->RunningWorkers(); };
  callbacks.on_up = [this](uint64_t epoch, const std::string& session_id) {
    OnSessionUp(epoch, session_id);
  };
  callbacks.on_down = [this](uint64_t epoch) { outbox_->SessionDown(epoch); };
  callbacks.on_order = [this](const v1::Assignment& order) { Dispatch(order); };
  session_ = std::make_unique<CoordinatorSession>(&config_, client_.get(), &metrics_,
                                                  std::move(callbacks));
  uploader_ = std::make_unique<LogUploader>(&config_, client_.get(), applier_.get(),
                                            [this] { return session_->session_id(); });
  order_thread_ = std::thread([this] { OrderLoop(); });
  outbox_->Start();
  session_->Start();
  return absl::OkStatus();
}

void Agent::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (!started_ || stopping_) return;
    stopping_ = true;
    orders_changed_.SignalAll();
  }
  metrics_.connected->Set(0);
  // Start failed before making the parts: there is nothing to stop.
  if (session_ == nullptr) return;
  // Every call in flight ends now, and every later one fails at once.
  client_->CancelAll();
  applier_->BeginShutdown();
  // The order thread first: after it no LAUNCH starts anything.
  if (order_thread_.joinable()) order_thread_.join();
  session_->Stop();
  outbox_->Stop();
  uploader_->Stop();
  applier_->Shutdown();
  if (relay_ != nullptr) relay_->Shutdown();
}

std::string Agent::session_id() const {
  return session_ != nullptr ? session_->session_id() : std::string();
}

int Agent::registrations() const { return session_ != nullptr ? session_->registrations() : 0; }

std::vector<v1::RunningWorker> Agent::RunningWorkers() const {
  return applier_ != nullptr ? applier_->RunningWorkers() : std::vector<v1::RunningWorker>();
}

void Agent::OnSessionUp(uint64_t epoch, const std::string& session_id) {
  // The coordinator may have lost the exit records of the jobs' current
  // generations; a duplicate is a no-op there. Queued before the outbox
  // learns of the session, so none goes out twice from this agent.
  for (const v1::ReportWorkerExitRequest& record : applier_->ExitRecords()) {
    outbox_->EnqueueExitUnlessQueued(record);
  }
  outbox_->SessionUp(epoch, session_id);
}

void Agent::Dispatch(const v1::Assignment& order) {
  switch (order.action()) {
    // Uploads queue behind the orders before them too: an upload sent right
    // after a LAUNCH must find the launched ranks' log files.
    case v1::Assignment::ACTION_LAUNCH:
    case v1::Assignment::ACTION_KILL:
    case v1::Assignment::ACTION_UPLOAD_LOGS: {
      absl::MutexLock lock(&mu_);
      orders_.push_back(PendingOrder{order, absl::Now()});
      orders_changed_.SignalAll();
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
      while (!stopping_ && orders_.empty() && !collect_now_) {
        if (orders_changed_.WaitWithDeadline(&mu_, deadline) && absl::Now() >= deadline) break;
      }
      if (stopping_) return;
      collect_now_ = false;
      if (!orders_.empty()) {
        pending = std::move(orders_.front());
        orders_.pop_front();
      }
    }
    if (pending.has_value()) {
      const v1::Assignment& order = pending->order;
      switch (order.action()) {
        case v1::Assignment::ACTION_LAUNCH:
          applier_->ApplyLaunch(order, pending->received);
          break;
        case v1::Assignment::ACTION_KILL:
          applier_->ApplyKill(order);
          break;
        default:
          uploader_->Start(order);  // Returns at once: the upload has its own thread.
          break;
      }
    }
    applier_->CollectFinishedGenerations();
  }
}

}  // namespace mesh::agent
