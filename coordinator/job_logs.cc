// JobManager's side of GetLogs: checks the request against the job's
// placement, asks each node that holds selected ranks to upload them
// (UPLOAD_LOGS orders), and hands the request and the agents' uploads to its
// LogRelay, which relays the chunks (log_relay.h; job_manager.h).
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/job_manager.h"
#include "coordinator/job_manager_internal.h"

namespace mesh::coordinator {

using ::mesh::v1::Assignment;

absl::StatusOr<uint64_t> JobManager::StartLogs(const mesh::v1::GetLogsRequest& request,
                                               LogSink* sink) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return ShuttingDown();
  Job* job = FindJobLocked(request.job_id());
  if (job == nullptr) {
    return absl::NotFoundError(absl::StrCat("job ", request.job_id(), " not found"));
  }
  if (!job->placement.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job->id, " has not been placed yet (",
                                                      JobStateName(job->state()),
                                                      "): no node holds its logs"));
  }
  const Placement& placement = *job->placement;
  const int64_t generation = request.generation() == -1 ? job->generation() : request.generation();
  if (generation < 0 || generation > job->generation()) {
    return absl::InvalidArgumentError(
        absl::StrCat("generation ", request.generation(), " is not -1 or 0..", job->generation()));
  }
  if (request.tail() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("tail ", request.tail(), " is negative"));
  }
  std::vector<int> ranks(request.ranks().begin(), request.ranks().end());
  if (ranks.empty()) {
    for (int r = 0; r < placement.world_size; ++r) ranks.push_back(r);
  }
  LogRelay::RanksByNode ranks_by_node;
  for (int rank : ranks) {
    if (rank < 0 || rank >= placement.world_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank, " is outside the world of ", placement.world_size));
    }
    ranks_by_node[placement.ranks[rank].node].insert(rank);
  }
  for (const auto& [name, node_ranks] : ranks_by_node) {
    auto it = nodes_.find(name);
    if (it == nodes_.end() || it->second->sink == nullptr) {
      return absl::UnavailableError(
          absl::StrCat("node ", name, " holding rank ", *node_ranks.begin(), " is not connected"));
    }
  }
  // Registered before the orders go out, so that no agent can attach to a
  // request the relay does not know yet.
  absl::StatusOr<uint64_t> handle = log_relay_.Start(ranks_by_node, sink);
  if (!handle.ok()) return handle.status();
  for (const auto& [name, node_ranks] : ranks_by_node) {
    Assignment order;
    order.set_action(Assignment::ACTION_UPLOAD_LOGS);
    order.set_job_id(job->id);
    order.set_generation(generation);
    order.set_log_request_id(LogRelay::RequestId(*handle));
    for (int rank : node_ranks) order.add_log_ranks(rank);
    order.set_log_tail(request.tail());
    order.set_log_follow(request.follow());
    SendLocked(*nodes_.at(name), order);
  }
  return handle;
}

void JobManager::CancelLogs(uint64_t handle) {
  absl::MutexLock lock(&mu_);
  log_relay_.Cancel(handle);
}

absl::StatusOr<uint64_t> JobManager::AttachUpload(const std::string& name,
                                                  const std::string& session_id,
                                                  const std::string& log_request_id,
                                                  UploadControl* control) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Node*> node = SessionNodeLocked(name, session_id);
  if (!node.ok()) return node.status();
  return log_relay_.Attach(name, log_request_id, control);
}

absl::Status JobManager::UploadChunk(uint64_t upload, const mesh::v1::LogChunk& chunk) {
  absl::MutexLock lock(&mu_);
  return log_relay_.Chunk(upload, chunk);
}

void JobManager::UploadEnded(uint64_t upload, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  log_relay_.UploadEnded(upload, status);
}

}  // namespace mesh::coordinator
