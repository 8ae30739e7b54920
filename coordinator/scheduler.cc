#include "coordinator/scheduler.h"

#include <algorithm>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace mesh::coordinator {
namespace {

// Names listed in a reason before "and N more": enough to act on, short
// enough for a table cell.
constexpr size_t kMaxNamesInReason = 4;

std::string NameList(const std::vector<std::string>& names) {
  if (names.size() <= kMaxNamesInReason) return absl::StrJoin(names, ", ");
  return absl::StrCat(absl::StrJoin(names.begin(), names.begin() + kMaxNamesInReason, ", "),
                      " and ", names.size() - kMaxNamesInReason, " more");
}

std::string Plural(size_t n, absl::string_view one, absl::string_view many) {
  return absl::StrCat(n, " ", n == 1 ? one : many);
}

bool Fits(const NodeView& node, const JobRequest& job) {
  return node.state == NodeState::kReady && node.slots >= job.nproc_per_node &&
         static_cast<int64_t>(node.gpus.size()) >=
             static_cast<int64_t>(job.nproc_per_node) * job.gpus_per_proc;
}

// Why `job` cannot start on `free` (sorted by name), which holds fewer
// fitting nodes than the job needs.
std::string WaitingReason(const JobRequest& job, const std::vector<int>& counts,
                          const std::vector<NodeView>& free) {
  const int gpus_needed = job.nproc_per_node * job.gpus_per_proc;
  std::string reason =
      counts.size() == 1
          ? absl::StrCat("waiting for ", Plural(counts.front(), "node", "nodes"))
          : absl::StrCat("waiting for at least ", Plural(counts.front(), "node", "nodes"),
                         " (up to ", counts.back(), ")");
  absl::StrAppend(&reason, " with ", Plural(job.nproc_per_node, "free slot", "free slots"));
  if (gpus_needed > 0) {
    absl::StrAppend(&reason, " and ", Plural(gpus_needed, "free GPU", "free GPUs"));
  }
  absl::StrAppend(&reason, " each; ");
  if (free.empty()) {
    absl::StrAppend(&reason, "no nodes are registered");
    return reason;
  }
  std::vector<std::string> fit, short_of, lost, draining;
  for (const NodeView& node : free) {
    if (Fits(node, job)) {
      fit.push_back(node.name);
    } else if (node.state == NodeState::kLost) {
      lost.push_back(node.name);
    } else if (node.state == NodeState::kDraining) {
      draining.push_back(node.name);
    } else {
      std::string detail = absl::StrCat(node.name, ": ", node.slots, " slots");
      if (gpus_needed > 0) absl::StrAppend(&detail, ", ", node.gpus.size(), " GPUs");
      short_of.push_back(absl::StrCat(detail, " free"));
    }
  }
  absl::StrAppend(&reason, Plural(fit.size(), "node fits", "nodes fit"));
  if (!fit.empty()) absl::StrAppend(&reason, " (", NameList(fit), ")");
  if (!short_of.empty()) {
    absl::StrAppend(&reason, "; ", short_of.size(), " short of capacity (", NameList(short_of),
                    ")");
  }
  if (!lost.empty()) absl::StrAppend(&reason, "; ", lost.size(), " LOST (", NameList(lost), ")");
  if (!draining.empty()) {
    absl::StrAppend(&reason, "; ", draining.size(), " DRAINING (", NameList(draining), ")");
  }
  return reason;
}

// Takes what `placement` holds out of `free` (sorted by name). Allocations
// on nodes that are gone, or beyond what a node offers (a node that
// re-registered smaller), clamp at zero: they still run, and the node simply
// has nothing left.
void Subtract(const Placement& placement, std::vector<NodeView>& free) {
  for (const RankPlacement& rank : placement.ranks) {
    auto it =
        std::lower_bound(free.begin(), free.end(), rank.node,
                         [](const NodeView& n, const std::string& name) { return n.name < name; });
    if (it == free.end() || it->name != rank.node) continue;
    it->slots = std::max(0, it->slots - 1);
    for (int gpu : rank.gpus) {
      auto g = std::find(it->gpus.begin(), it->gpus.end(), gpu);
      if (g != it->gpus.end()) it->gpus.erase(g);
    }
  }
}

}  // namespace

absl::StatusOr<SchedulePassResult> SchedulePass(absl::Span<const NodeView> nodes,
                                                absl::Span<const JobRequest> pending,
                                                absl::Span<const Placement> running,
                                                const SchedulerOptions& options) {
  std::vector<NodeView> free(nodes.begin(), nodes.end());
  std::sort(free.begin(), free.end(),
            [](const NodeView& a, const NodeView& b) { return a.name < b.name; });
  for (size_t i = 1; i < free.size(); ++i) {
    if (free[i - 1].name == free[i].name) {
      return absl::InvalidArgumentError(absl::StrCat("node '", free[i].name, "' listed twice"));
    }
  }
  for (NodeView& node : free) {
    std::sort(node.gpus.begin(), node.gpus.end());
    if (std::adjacent_find(node.gpus.begin(), node.gpus.end()) != node.gpus.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("node '", node.name, "' lists a GPU index twice"));
    }
  }

  std::set<std::string> running_ids;
  for (const Placement& placement : running) {
    running_ids.insert(placement.job_id);
    Subtract(placement, free);
  }

  std::vector<const JobRequest*> queue;
  for (const JobRequest& job : pending) queue.push_back(&job);
  std::sort(queue.begin(), queue.end(), [](const JobRequest* a, const JobRequest* b) {
    return std::tie(a->sequence, a->job_id) < std::tie(b->sequence, b->job_id);
  });
  for (size_t i = 0; i < queue.size(); ++i) {
    if (i > 0 && queue[i - 1]->job_id == queue[i]->job_id) {
      return absl::InvalidArgumentError(
          absl::StrCat("job '", queue[i]->job_id, "' is pending twice"));
    }
    if (running_ids.count(queue[i]->job_id) > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("job '", queue[i]->job_id, "' is both pending and running"));
    }
  }

  SchedulePassResult result;
  const JobRequest* blocker = nullptr;  // The first job that could not start.
  for (const JobRequest* job : queue) {
    if (absl::Status status = ValidateJobRequest(*job); !status.ok()) {
      result.rejected.push_back({job->job_id, std::move(status)});
      continue;
    }
    if (blocker != nullptr && !options.backfill) {
      result.pending.push_back(
          {job->job_id, absl::StrCat("blocked behind job ", blocker->job_id, " (FIFO)")});
      continue;
    }
    const std::vector<int> counts = AcceptableNodeCounts(*job);
    std::vector<size_t> fitting;
    for (size_t i = 0; i < free.size(); ++i) {
      if (Fits(free[i], *job)) fitting.push_back(i);
    }
    // The largest accepted count that the fitting nodes cover.
    int take = 0;
    for (int count : counts) {
      if (static_cast<size_t>(count) <= fitting.size()) take = count;
    }
    if (take == 0) {
      std::string reason = WaitingReason(*job, counts, free);
      if (blocker != nullptr) {
        absl::StrAppend(&reason, " (backfilling behind job ", blocker->job_id, ")");
      }
      result.pending.push_back({job->job_id, std::move(reason)});
      if (blocker == nullptr) blocker = job;
      continue;
    }
    std::vector<NodeView> chosen;
    for (int i = 0; i < take; ++i) chosen.push_back(free[fitting[i]]);
    absl::StatusOr<Placement> placement = PlaceJob(*job, chosen);
    // Validated, fitting, distinct nodes: PlaceJob has nothing left to reject.
    if (!placement.ok()) {
      result.rejected.push_back({job->job_id, placement.status()});
      continue;
    }
    Subtract(*placement, free);
    result.placements.push_back(*std::move(placement));
  }
  return result;
}

absl::StatusOr<SchedulePassResult> Scheduler::Schedule(absl::Span<const NodeView> nodes,
                                                       absl::Span<const JobRequest> pending) {
  const std::vector<Placement> running = Running();
  absl::StatusOr<SchedulePassResult> result = SchedulePass(nodes, pending, running, options_);
  if (!result.ok()) return result;
  for (const Placement& placement : result->placements) {
    running_.emplace(placement.job_id, placement);
  }
  return result;
}

absl::Status Scheduler::Adopt(Placement placement) {
  if (placement.job_id.empty()) return absl::InvalidArgumentError("placement has no job_id");
  const std::string id = placement.job_id;
  if (!running_.emplace(id, std::move(placement)).second) {
    return absl::AlreadyExistsError(absl::StrCat("job ", id, " already holds an allocation"));
  }
  return absl::OkStatus();
}

absl::Status Scheduler::Release(absl::string_view job_id) {
  auto it = running_.find(job_id);
  if (it == running_.end()) {
    return absl::NotFoundError(absl::StrCat("job ", job_id, " holds no allocation"));
  }
  running_.erase(it);
  return absl::OkStatus();
}

const Placement* Scheduler::Find(absl::string_view job_id) const {
  auto it = running_.find(job_id);
  return it == running_.end() ? nullptr : &it->second;
}

std::vector<Placement> Scheduler::Running() const {
  std::vector<Placement> all;
  all.reserve(running_.size());
  for (const auto& [id, placement] : running_) all.push_back(placement);
  return all;
}

}  // namespace mesh::coordinator
