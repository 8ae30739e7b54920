// JobManager's elastic membership (docs/elastic.md): a job that recovers in
// place moves a lost node's ranks to a free node while the others carry on,
// a lost node shrinks an elastic job instead of counting as a failure,
// spec.grow decides when the job takes more nodes, and every change of its
// node count is recorded.
// The rest of the restart path is in job_manager.cc (RelaunchLocked).

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"
#include "coordinator/job_manager.h"
#include "coordinator/job_manager_internal.h"
#include "spdlog/spdlog.h"

namespace mesh::coordinator {
namespace {

using ::mesh::v1::JOB_STATE_PENDING;
using ::mesh::v1::JOB_STATE_RUNNING;
using ::mesh::v1::JOB_STATE_SCHEDULED;
using ::mesh::v1::RootCause;

// How often a job waiting to grow looks for free nodes.
constexpr absl::Duration kGrowCheckInterval = absl::Seconds(1);

const char* Nodes(int n) { return n == 1 ? "node" : "nodes"; }

// Whether some replica along the mesh dim `dim` (the ranks that share a
// coordinate along it) has every rank `running` and off `lost_node`: the
// survivors can only carry on, and hand the state to the moved ranks, from
// a whole replica.
bool HasWholeReplica(const Placement& placement, const std::vector<bool>& running,
                     const std::string& dim, const std::string& lost_node) {
  const auto at = std::find(placement.mesh_dim_names.begin(), placement.mesh_dim_names.end(), dim);
  if (at == placement.mesh_dim_names.end() || running.size() != placement.ranks.size()) {
    return false;
  }
  const size_t d = static_cast<size_t>(at - placement.mesh_dim_names.begin());
  int64_t inner = 1;  // Ranks per step along dim d (row-major).
  for (size_t i = d + 1; i < placement.mesh_shape.size(); ++i) inner *= placement.mesh_shape[i];
  const int64_t replicas = placement.mesh_shape[d];
  std::vector<bool> whole(static_cast<size_t>(replicas), true);
  for (const RankPlacement& r : placement.ranks) {
    const int64_t replica = (r.rank / inner) % replicas;
    if (r.node == lost_node || !running[static_cast<size_t>(r.rank)]) {
      whole[static_cast<size_t>(replica)] = false;
    }
  }
  return std::find(whole.begin(), whole.end(), true) != whole.end();
}

}  // namespace

std::string EncodeResizes(const std::vector<mesh::v1::JobResize>& resizes) {
  if (resizes.empty()) return "";
  mesh::v1::Job holder;
  for (const mesh::v1::JobResize& resize : resizes) *holder.add_resizes() = resize;
  return holder.SerializeAsString();
}

absl::StatusOr<std::vector<mesh::v1::JobResize>> DecodeResizes(const std::string& bytes) {
  mesh::v1::Job holder;
  if (!holder.ParseFromString(bytes)) return absl::DataLossError("unreadable resizes");
  return std::vector<mesh::v1::JobResize>(holder.resizes().begin(), holder.resizes().end());
}

int JobManager::NodeCapLocked(const Job& job) const {
  const int max = job.spec.nodes().max();
  if (job.spec.grow() == mesh::v1::GROW_POLICY_ON_RESTART) return max;
  if (!job.placement.has_value()) return max;
  return std::min(max, static_cast<int>(job.placement->nodes.size()));
}

bool JobManager::ReplaceLostNodeInPlaceLocked(Job& job, const RootCause& cause, Effects& effects) {
  if (job.spec.restart_policy() != mesh::v1::RESTART_POLICY_IN_PLACE ||
      job.state() != JOB_STATE_RUNNING || !job.holds || !job.placement.has_value() ||
      job.machine->restarts() >= job.machine->max_restarts()) {
    return false;
  }
  // A rank that already finished will not rebuild a mesh with the new
  // processes, which would wait for it.
  if (std::any_of(job.ranks.begin(), job.ranks.end(),
                  [](Job::Rank r) { return r == Job::Rank::kSucceeded; })) {
    return false;
  }
  const Placement& placement = *job.placement;
  const auto lost_at = std::find(placement.nodes.begin(), placement.nodes.end(), cause.node());
  if (lost_at == placement.nodes.end()) return false;
  // Nodes lost in the same pass are decided together, as a restart: moving
  // one and restarting for the other would count two restarts for one event.
  for (const std::string& name : placement.nodes) {
    auto it = nodes_.find(name);
    if (name != cause.node() && (it == nodes_.end() || !it->second->ready)) return false;
  }
  std::vector<bool> running;
  for (Job::Rank r : job.ranks) running.push_back(r == Job::Rank::kRunning);
  if (!HasWholeReplica(placement, running, job.spec.in_place_dim(), cause.node())) return false;
  const size_t node_rank = static_cast<size_t>(lost_at - placement.nodes.begin());
  std::vector<int> moved;
  for (const RankPlacement& r : placement.ranks) {
    if (r.node == cause.node()) moved.push_back(r.rank);
  }
  if (moved.empty()) return false;

  // A READY node outside the job with room for one node's worth of its
  // ranks: a trial pass against every allocation held, this job's included.
  // Not a node that held this generation before: its agent ignores a
  // LAUNCH of a generation it has seen.
  std::vector<NodeView> views = NodeViewsLocked();
  std::erase_if(views, [&](const NodeView& v) {
    return std::find(placement.nodes.begin(), placement.nodes.end(), v.name) !=
               placement.nodes.end() ||
           job.left_generation.contains(v.name);
  });
  JobRequest request;
  request.job_id = absl::StrCat(job.id, "/replacement");
  request.sequence = job.number;
  request.nproc_per_node = placement.nproc_per_node;
  request.gpus_per_proc = job.spec.gpus_per_proc();
  absl::StatusOr<SchedulePassResult> trial = SchedulePass(views, {request}, scheduler_.Running());
  if (!trial.ok() || trial->placements.empty()) return false;
  const Placement& spare = trial->placements.front();
  auto node = nodes_.find(spare.nodes.front());
  if (node == nodes_.end()) return false;

  // Coordination decides whether the others can carry on: only once the
  // world has formed and while the generation has not failed. A later rank
  // refused (it left) ends in a restart of the whole job, by the caller.
  for (int rank : moved) {
    absl::StatusOr<bool> lost =
        coordination_->LoseRankInPlace(job.id, job.generation(), rank, cause.message());
    if (!lost.ok() || !*lost) return false;
  }

  Placement moved_placement = placement;
  moved_placement.nodes[node_rank] = spare.nodes.front();
  moved_placement.node_addresses[node_rank] = spare.node_addresses.front();
  for (int rank : moved) {
    RankPlacement& r = moved_placement.ranks[rank];
    r.node = spare.nodes.front();
    r.gpus = spare.ranks[r.local_rank].gpus;
  }
  MESH_CHECK(scheduler_.Release(job.id).ok(), "a job that holds has an allocation");
  MESH_CHECK(scheduler_.Adopt(moved_placement).ok(), "the allocation was just released");
  job.placement = std::move(moved_placement);
  job.replacement_nodes.insert(node->first);
  job.left_generation.insert(cause.node());

  RootCause recovered = cause;
  recovered.set_message(absl::StrCat(cause.message(), "; its ", moved.size(),
                                     moved.size() == 1 ? " rank moves" : " ranks move", " to node ",
                                     node->first));
  RelaunchInPlaceLocked(job, std::move(recovered), moved, *node->second);
  effects.Reschedule();
  return true;
}

void JobManager::NodeOfJobLostLocked(Job& job, RootCause cause, Effects& effects) {
  if (ReplaceLostNodeInPlaceLocked(job, cause, effects)) return;
  const int min = job.spec.nodes().min();
  const bool elastic = min < job.spec.nodes().max();
  const bool placed = job.state() == JOB_STATE_SCHEDULED || job.state() == JOB_STATE_RUNNING;
  int left = 0;
  for (const std::string& name : job.placement->nodes) {
    auto it = nodes_.find(name);
    left += it != nodes_.end() && it->second->ready;
  }
  if (!elastic || !placed || left < min) {
    FailJobLocked(job, std::move(cause), effects);
    return;
  }
  const int before = static_cast<int>(job.placement->nodes.size());
  const std::string why = cause.message();
  const std::string reason =
      absl::StrCat(why, "; ", left, " of ", before, " nodes left (at least ", min,
                   " needed): placing again, a membership change that is not counted as a restart");
  if (absl::Status resized = job.machine->Resize(std::move(cause), reason); !resized.ok()) {
    spdlog::info("job {}: ignoring a lost node: {}", job.id, resized.ToString());
    return;
  }
  spdlog::warn("job {}: {}", job.id, reason);
  RelaunchLocked(job, why, effects);
}

std::string JobManager::PlacedLocked(Job& job, Placement placement) {
  const int before = job.placement.has_value() ? static_cast<int>(job.placement->nodes.size()) : 0;
  const int after = static_cast<int>(placement.nodes.size());
  job.placement = std::move(placement);
  const std::string why = std::exchange(job.replace_reason, "");
  job.node_cap = 0;
  if (before == 0 || before == after) return "";
  mesh::v1::JobResize resize;
  resize.set_time_unix_ms(absl::ToUnixMillis(clock_->Now()));
  resize.set_generation(job.generation());
  resize.set_from_nodes(before);
  resize.set_to_nodes(after);
  resize.set_reason(why.empty() ? "placed again" : why);
  (after < before ? metrics_.shrinks : metrics_.grows)->Increment();
  const std::string line = absl::StrCat("resized from ", before, " to ", after, " ", Nodes(after),
                                        ": ", resize.reason());
  spdlog::warn("job {}: {}", job.id, line);
  job.resizes.push_back(std::move(resize));
  return line;
}

void JobManager::GrowJobsLocked(absl::Time now, Effects& effects) {
  // Jobs waiting to be placed come first: growing never takes their nodes.
  for (const auto& [id, job] : jobs_) {
    if (job->state() == JOB_STATE_PENDING) return;
  }
  for (auto& [id, job] : jobs_) {
    if (!job->holds || job->state() != JOB_STATE_RUNNING) continue;
    if (job->spec.grow() != mesh::v1::GROW_POLICY_AFTER) continue;
    const int nodes_now = static_cast<int>(job->placement->nodes.size());
    const int max = job->spec.nodes().max();
    if (nodes_now >= max) continue;
    // The RUNNING event is the last one while the job runs.
    const absl::Duration after = absl::Seconds(job->spec.grow_after_seconds());
    const absl::Time running_since = job->machine->events().back().time;
    if (now - running_since < after || now < job->next_grow_check) continue;
    job->next_grow_check = now + kGrowCheckInterval;

    // Would a placement without the job's own hold give it more nodes? A
    // trial pass against everyone else's allocations; nothing is held.
    std::vector<Placement> others = scheduler_.Running();
    std::erase_if(others, [&](const Placement& p) { return p.job_id == job->id; });
    JobRequest request = RequestOfLocked(*job);
    request.nodes_min = nodes_now + 1;
    request.nodes_max = max;
    absl::StatusOr<SchedulePassResult> trial = SchedulePass(NodeViewsLocked(), {request}, others);
    const int could = trial.ok() && !trial->placements.empty()
                          ? static_cast<int>(trial->placements.front().nodes.size())
                          : 0;
    if (could == 0) continue;

    const std::string why = absl::StrCat("grow after ", job->spec.grow_after_seconds(), "s at ",
                                         nodes_now, " ", Nodes(nodes_now), ": ", could - nodes_now,
                                         " more ", Nodes(could - nodes_now), " free");
    if (absl::Status resized = job->machine->Resize(std::nullopt, why); !resized.ok()) {
      spdlog::error("job {}: cannot grow: {}", id, resized.ToString());
      continue;
    }
    spdlog::info("job {}: {}", id, why);
    job->node_cap = max;
    RelaunchLocked(*job, why, effects);
    // The job is PENDING now and its nodes are free: another job's trial
    // would count them. One grow per pass; the next Tick may grow another.
    return;
  }
}

}  // namespace mesh::coordinator
