// JobManager's node sessions: agent registration and its reconciliation of
// what the agent runs, heartbeats, the assignment stream, node loss and the
// node list (NodeService; job_manager.h).
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "common/duration_format.h"
#include "common/heartbeat_spread.h"
#include "coordinator/job_manager.h"
#include "coordinator/job_manager_internal.h"

namespace mesh::coordinator {

using ::mesh::v1::Assignment;
using ::mesh::v1::RootCause;

namespace {

// "READY"/"LOST" in the store; the proto enum on the wire.
constexpr const char* kNodeReady = "READY";
constexpr const char* kNodeLost = "LOST";

// Node names follow job ids: [A-Za-z0-9._-]{1,128}.
bool IsValidNodeName(const std::string& name) { return IsValidJobId(name); }

std::string NewSessionId() {
  static thread_local std::mt19937_64 random(std::random_device{}());
  return absl::StrCat(absl::Hex(random(), absl::kZeroPad16), absl::Hex(random(), absl::kZeroPad16));
}

}  // namespace

void JobManager::CountNodesLocked() {
  int ready = 0;
  for (const auto& [name, node] : nodes_) ready += node->ready ? 1 : 0;
  metrics_.nodes_ready->Set(ready);
  metrics_.nodes_lost->Set(static_cast<double>(nodes_.size()) - ready);
}

void JobManager::SeenLocked(Node& node, absl::Time now) {
  node.last_seen = now;
  node.silence_from = absl::InfinitePast();  // Heard from: the recovery grace is over.
  if (node.heartbeat == nullptr) node.heartbeat = metrics_.node_heartbeat->WithLabels({node.name});
  node.heartbeat->Set(absl::ToDoubleSeconds(now - absl::UnixEpoch()));
}

absl::StatusOr<JobManager::Node*> JobManager::SessionNodeLocked(const std::string& name,
                                                                const std::string& session_id) {
  if (shut_down_) return ShuttingDown();
  auto it = nodes_.find(name);
  if (it == nodes_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown node '", name, "': register first"));
  }
  Node& node = *it->second;
  if (node.session_id.empty() || node.session_id != session_id) {
    return absl::AbortedError(
        absl::StrCat("node ", name, ": session ", session_id, " is not current",
                     node.ready ? " (the node registered again)" : " (the node was marked lost)",
                     "; register again"));
  }
  return &node;
}

absl::StatusOr<mesh::v1::RegisterNodeResponse> JobManager::RegisterNode(
    const mesh::v1::RegisterNodeRequest& request) {
  const std::string& name = request.name();
  if (!IsValidNodeName(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("name '", name, "' must be 1-128 characters of [A-Za-z0-9._-]"));
  }
  if (request.address().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("node ", name, ": empty address"));
  }
  if (request.slots() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("node ", name, ": slots ", request.slots(), " must be >= 1"));
  }
  std::set<int> indices;
  for (const auto& gpu : request.gpus()) {
    if (gpu.index() < 0 || !indices.insert(gpu.index()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("node ", name, ": GPU index ", gpu.index(), " is negative or repeated"));
    }
  }
  Effects effects;
  mesh::v1::RegisterNodeResponse response;
  {
    absl::MutexLock lock(&mu_);
    recovered_or_used_ = true;
    if (shut_down_) return ShuttingDown();
    const absl::Time now = clock_->Now();
    mesh::v1::RegisterNodeRequest info;  // What the store keeps besides the columns.
    *info.mutable_gpus() = request.gpus();
    info.set_agent_version(request.agent_version());
    info.set_metrics_port(request.metrics_port());
    *info.mutable_isolation() = request.isolation();
    NodeRecord record;
    record.name = name;
    record.address = request.address();
    record.slots = request.slots();
    record.gpus = request.gpus_size();
    record.state = kNodeReady;
    record.last_seen = now;
    record.labels = info.SerializeAsString();
    if (absl::Status stored = store_->UpsertNode(record); !stored.ok()) return stored;

    std::unique_ptr<Node>& slot = nodes_[name];
    if (slot == nullptr) slot = std::make_unique<Node>();
    Node& node = *slot;
    if (node.sink != nullptr) {
      node.sink->End(absl::AbortedError(absl::StrCat("node ", name, " registered again")));
      assignment_streams_.erase(node.stream);
      node.sink = nullptr;
      node.stream = 0;
    }
    const bool was_lost = !node.ready;
    node.name = name;
    node.address = request.address();
    node.slots = request.slots();
    node.gpus.assign(request.gpus().begin(), request.gpus().end());
    node.agent_version = request.agent_version();
    node.ready = true;
    node.session_id = NewSessionId();
    SeenLocked(node, now);
    node.pending.clear();
    node.metrics_port = request.metrics_port();
    node.isolation = request.isolation();
    CountNodesLocked();
    if (discovery_ != nullptr) {
      // A re-registration replaces what the node ran before; the running
      // list below adds back the workers that still serve metrics.
      discovery_->RemoveNode(name);
      if (node.metrics_port > 0) {
        discovery_->SetAgent(name, ServiceDiscovery::Target(node.address, node.metrics_port));
      }
      FlushDiscoveryLater(effects);
    }
    spdlog::info("node {} registered{}: {} at {}, {} slots, {} GPUs, {} running workers", name,
                 was_lost ? " again after being lost" : "", request.agent_version(),
                 request.address(), request.slots(), request.gpus_size(), request.running_size());

    // Reconcile what the agent runs with what should run there.
    std::set<std::pair<std::string, int64_t>> killed;
    std::map<std::string, std::set<int>> running_here;
    for (const auto& worker : request.running()) {
      Job* job = FindJobLocked(worker.job_id());
      const bool current = job != nullptr && job->holds &&
                           worker.generation() == job->generation() && worker.rank() >= 0 &&
                           worker.rank() < static_cast<int>(job->ranks.size()) &&
                           job->placement->ranks[worker.rank()].node == name;
      if (current) {
        running_here[job->id].insert(worker.rank());
        if (discovery_ != nullptr && worker.metrics_port() > 0) {
          discovery_->SetWorker(job->id, worker.rank(), name,
                                ServiceDiscovery::Target(node.address, worker.metrics_port()));
        }
        continue;
      }
      if (killed.insert({worker.job_id(), worker.generation()}).second) {
        node.pending.push_back(
            KillOrder(worker.job_id(), worker.generation(), "not placed on this node any more"));
      }
    }
    for (auto& [id, job] : jobs_) {
      if (!job->holds) continue;
      const std::set<int>& running = running_here[id];
      bool all_running = true;
      for (const RankPlacement& rank : job->placement->ranks) {
        Job::Rank& status = job->ranks[rank.rank];
        if (rank.node == name) {
          if (running.contains(rank.rank)) {
            if (status != Job::Rank::kSucceeded) status = Job::Rank::kRunning;
          } else if (status == Job::Rank::kRunning || status == Job::Rank::kUnaccounted) {
            // Gone, or exited with a report still on its way: wait for it.
            job->MarkUnaccounted(rank.rank, now + options_.node_heartbeat_timeout);
          }
        }
        all_running =
            all_running && (status == Job::Rank::kRunning || status == Job::Rank::kSucceeded);
      }
      if (all_running) MaybeStartLocked(*job, effects);
    }
    effects.Reschedule();
    while (effects.TakeReschedule()) ScheduleLocked(effects);
    response.set_session_id(node.session_id);
    response.set_heartbeat_interval_seconds(
        absl::ToDoubleSeconds(NodeHeartbeatInterval(options_, nodes_.size())));
    response.set_heartbeat_timeout_seconds(absl::ToDoubleSeconds(options_.node_heartbeat_timeout));
  }
  effects.Run();
  return response;
}

absl::Duration NodeHeartbeatInterval(const JobManagerOptions& o, size_t nodes) {
  return SpreadHeartbeatInterval(static_cast<double>(nodes), o.node_heartbeat_rate,
                                 o.node_heartbeat_interval, o.node_heartbeat_timeout);
}

absl::StatusOr<absl::Duration> JobManager::NodeHeartbeat(const std::string& name,
                                                         const std::string& session_id) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Node*> node = SessionNodeLocked(name, session_id);
  if (!node.ok()) return node.status();
  SeenLocked(**node, clock_->Now());
  return NodeHeartbeatInterval(options_, nodes_.size());
}

absl::StatusOr<uint64_t> JobManager::WatchAssignments(const std::string& name,
                                                      const std::string& session_id,
                                                      AssignmentSink* sink) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Node*> found = SessionNodeLocked(name, session_id);
  if (!found.ok()) return found.status();
  Node& node = **found;
  if (node.sink != nullptr) {
    node.sink->End(absl::AbortedError(
        absl::StrCat("node ", name, ": a newer WatchAssignments replaced this one")));
    assignment_streams_.erase(node.stream);
  }
  const uint64_t handle = next_handle_++;
  node.stream = handle;
  node.sink = sink;
  SeenLocked(node, clock_->Now());
  assignment_streams_.emplace(handle, name);
  for (const Assignment& order : node.pending) sink->Send(order);
  node.pending.clear();
  for (auto& [id, job] : jobs_) {
    if (job->holds) SendLaunchLocked(*job, node);
  }
  return handle;
}

void JobManager::UnwatchAssignments(uint64_t handle) {
  absl::MutexLock lock(&mu_);
  auto it = assignment_streams_.find(handle);
  if (it == assignment_streams_.end()) return;
  auto node = nodes_.find(it->second);
  if (node != nodes_.end() && node->second->stream == handle) {
    node->second->sink = nullptr;
    node->second->stream = 0;
  }
  assignment_streams_.erase(it);
}

std::vector<mesh::v1::Node> JobManager::ListNodes() const {
  absl::MutexLock lock(&mu_);
  std::map<std::string, std::pair<int, int>> used;  // Node → slots, GPUs held.
  std::map<std::string, std::vector<std::string>> jobs_on;
  for (const auto& [id, job] : jobs_) {
    if (!job->holds) continue;
    for (const RankPlacement& rank : job->placement->ranks) {
      used[rank.node].first += 1;
      used[rank.node].second += static_cast<int>(rank.gpus.size());
    }
    for (const std::string& node : job->placement->nodes) jobs_on[node].push_back(id);
  }
  std::vector<mesh::v1::Node> out;
  for (const auto& [name, node] : nodes_) {
    mesh::v1::Node proto;
    proto.set_name(name);
    proto.set_address(node->address);
    proto.set_state(node->ready ? mesh::v1::NODE_STATE_READY : mesh::v1::NODE_STATE_LOST);
    proto.set_slots(node->slots);
    proto.set_free_slots(std::max(0, node->slots - used[name].first));
    for (const auto& gpu : node->gpus) *proto.add_gpus() = gpu;
    proto.set_free_gpus(std::max(0, static_cast<int>(node->gpus.size()) - used[name].second));
    proto.set_agent_version(node->agent_version);
    *proto.mutable_isolation() = node->isolation;
    proto.set_last_seen_unix_ms(absl::ToUnixMillis(node->last_seen));
    proto.set_metrics_port(node->metrics_port);
    for (const std::string& id : jobs_on[name]) proto.add_jobs(id);
    out.push_back(std::move(proto));
  }
  return out;
}

void JobManager::NodeLostLocked(Node& node, const std::string& why, Effects& effects) {
  node.ready = false;
  node.session_id.clear();
  ++stats_.nodes_lost;
  CountNodesLocked();
  if (discovery_ != nullptr) {
    discovery_->RemoveNode(node.name);
    FlushDiscoveryLater(effects);
  }
  spdlog::warn("node {} lost: {}", node.name, why);
  if (absl::Status marked = store_->MarkNode(node.name, kNodeLost); !marked.ok()) {
    spdlog::error("node {}: cannot store LOST: {}", node.name, marked.ToString());
  }
  if (node.sink != nullptr) {
    node.sink->End(absl::AbortedError(
        absl::StrCat("node ", node.name, " was marked lost: ", why, "; register again")));
    assignment_streams_.erase(node.stream);
    node.sink = nullptr;
    node.stream = 0;
  }
  for (auto& [id, job] : jobs_) {
    if (!job->holds) continue;
    const auto& nodes = job->placement->nodes;
    if (std::find(nodes.begin(), nodes.end(), node.name) == nodes.end()) continue;
    RootCause cause;
    cause.set_rank(-1);
    cause.set_node(node.name);
    cause.set_host(node.address);
    cause.set_generation(job->generation());
    cause.set_message(absl::StrCat("node ", node.name, " lost: ", why));
    NodeOfJobLostLocked(*job, std::move(cause), effects);
  }
  // Log requests waiting on it cannot complete.
  log_relay_.NodeLost(node.name);
  effects.Reschedule();
}

// Tick's part: READY nodes silent for node_heartbeat_timeout (counted from
// the end of the recovery grace after Recover) are LOST.
void JobManager::SetServerLag(const ServerLag* lag) {
  absl::MutexLock lock(&mu_);
  server_lag_ = lag;
}

void JobManager::ForgiveStall(absl::Duration stall) {
  if (stall <= absl::ZeroDuration()) return;
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  for (auto& [name, node] : nodes_) {
    const absl::Time from = std::max(node->last_seen, node->silence_from);
    node->silence_from = std::min(from + stall, std::max(now, from));
  }
}

void JobManager::ExpireSilentNodesLocked(absl::Time now, Effects& effects) {
  // A heartbeat sent now may wait this long in the server's own backlog.
  const absl::Duration grace = CappedGrace(server_lag_, now, options_.node_heartbeat_timeout);
  std::vector<Node*> silent;
  for (auto& [name, node] : nodes_) {
    if (node->ready && now - grace - std::max(node->last_seen, node->silence_from) >
                           options_.node_heartbeat_timeout) {
      silent.push_back(node.get());
    }
  }
  // Every silent node is down before any job is decided on: an elastic job
  // counts the nodes it has left, and a node lost in the same pass is not
  // one of them.
  for (Node* node : silent) node->ready = false;
  for (Node* node : silent) {
    NodeLostLocked(
        *node,
        absl::StrCat("no heartbeat for ", FormatDurationShort(absl::Trunc(
                                              now - node->last_seen, absl::Milliseconds(100)))),
        effects);
  }
}

}  // namespace mesh::coordinator
