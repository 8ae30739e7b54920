// JobManager::Recover: rebuilds the manager's jobs and nodes from the
// store after a coordinator restart (job_manager.h, "Recovery").
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "coordinator/job_manager.h"
#include "coordinator/job_manager_internal.h"

namespace mesh::coordinator {

using ::mesh::v1::JOB_STATE_PENDING;
using ::mesh::v1::JOB_STATE_RESTARTING;
using ::mesh::v1::JOB_STATE_RUNNING;
using ::mesh::v1::JOB_STATE_SCHEDULED;
using ::mesh::v1::RootCause;

namespace {

absl::StatusOr<JobState> ParseJobState(const std::string& name) {
  for (int value = mesh::v1::JobState_MIN; value <= mesh::v1::JobState_MAX; ++value) {
    const auto state = static_cast<JobState>(value);
    if (mesh::v1::JobState_IsValid(value) && JobStateName(state) == name) return state;
  }
  return absl::DataLossError(absl::StrCat("unknown job state '", name, "'"));
}

}  // namespace

absl::Status JobManager::Recover() {
  Effects effects;
  absl::Status result;
  {
    absl::MutexLock lock(&mu_);
    if (recovered_or_used_) {
      return absl::FailedPreconditionError("Recover must be the first call, and only once");
    }
    recovered_or_used_ = true;
    if (shut_down_) return ShuttingDown();
    const absl::Time now = clock_->Now();

    absl::StatusOr<std::vector<NodeRecord>> nodes = store_->ListNodes();
    if (!nodes.ok()) return nodes.status();
    for (const NodeRecord& record : *nodes) {
      auto node = std::make_unique<Node>();
      node->name = record.name;
      node->address = record.address;
      node->slots = static_cast<int>(record.slots);
      mesh::v1::RegisterNodeRequest info;
      if (!record.labels.empty() && info.ParseFromString(record.labels)) {
        node->gpus.assign(info.gpus().begin(), info.gpus().end());
        node->agent_version = info.agent_version();
        node->metrics_port = info.metrics_port();
        node->isolation = info.isolation();
      }
      // Every node gets the recovery grace and one heartbeat timeout to come
      // back.
      node->ready = true;
      node->last_seen = now;
      node->silence_from = now + options_.node_recovery_grace;
      nodes_.emplace(record.name, std::move(node));
    }

    std::vector<JobRecord> records;
    JobQuery query;
    query.limit = JobStore::kMaxPageSize;
    for (;;) {
      absl::StatusOr<JobPage> page = store_->ListJobs(query);
      if (!page.ok()) return page.status();
      for (JobRecord& record : page->jobs) records.push_back(std::move(record));
      if (page->next_page_token.empty()) break;
      query.page_token = page->next_page_token;
    }
    for (JobRecord& record : records) {
      absl::Status loaded = [&]() -> absl::Status {
        auto job = std::make_unique<Job>();
        job->id = record.id;
        job->number = JobNumber(record.id);
        job->version = record.version;
        job->owner = record.owner;
        if (!job->spec.ParseFromString(record.spec)) {
          return absl::DataLossError(absl::StrCat("job ", record.id, ": unreadable spec"));
        }
        absl::StatusOr<JobState> state = ParseJobState(record.state);
        if (!state.ok()) return state.status();
        RestoredJobState stored;
        stored.state = *state;
        stored.pending_reason = record.pending_reason;
        stored.generation = record.generation;
        stored.restarts = static_cast<int>(record.restarts);
        stored.create_time = record.created_at;
        stored.update_time = record.updated_at;
        if (!record.root_cause.empty()) {
          if (!stored.root_cause.ParseFromString(record.root_cause)) {
            return absl::DataLossError(absl::StrCat("job ", record.id, ": unreadable root cause"));
          }
          stored.has_root_cause = true;
        }
        absl::StatusOr<std::vector<JobEvent>> events = store_->ListEvents(record.id);
        if (!events.ok()) return events.status();
        for (const JobEvent& event : *events) {
          JobEventRecord restored;
          restored.time = event.time;
          if (!event.from_state.empty()) {
            absl::StatusOr<JobState> from = ParseJobState(event.from_state);
            if (from.ok()) restored.from = *from;
          }
          absl::StatusOr<JobState> to = ParseJobState(event.to_state);
          if (to.ok()) restored.to = *to;
          restored.reason = event.reason;
          restored.generation = event.generation;
          stored.events.push_back(std::move(restored));
        }
        auto machine = JobStateMachine::Restore(record.id, job->spec.max_restarts(),
                                                absl::Seconds(job->spec.deadline_seconds()),
                                                std::move(stored), *clock_);
        if (!machine.ok()) return machine.status();
        job->machine = *std::move(machine);
        if (!record.resizes.empty()) {
          absl::StatusOr<std::vector<mesh::v1::JobResize>> resizes = DecodeResizes(record.resizes);
          if (!resizes.ok()) {
            return absl::DataLossError(
                absl::StrCat("job ", record.id, ": ", resizes.status().message()));
          }
          job->resizes = *std::move(resizes);
        }
        if (!record.placement.empty()) {
          absl::StatusOr<Placement> placement = DecodePlacement(record.placement);
          if (!placement.ok()) {
            return absl::DataLossError(
                absl::StrCat("job ", record.id, ": ", placement.status().message()));
          }
          job->placement = *std::move(placement);
          // A job waiting to be placed again keeps its grow policy's cap.
          if (job->state() == JOB_STATE_PENDING) job->node_cap = NodeCapLocked(*job);
        }
        jobs_.emplace(job->id, std::move(job));
        return absl::OkStatus();
      }();
      if (!loaded.ok()) {
        spdlog::error("recovery: {}", loaded.ToString());
        if (result.ok()) result = loaded;
      }
    }

    // Placed live jobs hold their nodes again and wait for their agents.
    int placed = 0;
    for (auto& [id, job] : jobs_) {
      const JobState state = job->state();
      if (state != JOB_STATE_SCHEDULED && state != JOB_STATE_RUNNING &&
          state != JOB_STATE_RESTARTING) {
        continue;
      }
      if (!job->placement.has_value()) {
        RootCause cause;
        cause.set_rank(-1);
        cause.set_message("its placement was lost in a coordinator restart");
        (void)job->machine->Fail(std::move(cause));
        AfterTransitionLocked(*job, effects);
        continue;
      }
      if (absl::Status adopted = scheduler_.Adopt(*job->placement); !adopted.ok()) {
        spdlog::error("recovery: job {}: {}", id, adopted.ToString());
      }
      job->holds = true;
      ++placed;
      if (state == JOB_STATE_RESTARTING) {
        // The coordinator stopped between the restart and the relaunch.
        (void)job->machine->Schedule(
            absl::StrCat("relaunching generation ", job->generation(), " after a restart"));
        (void)PersistLocked(*job);
        LaunchLocked(*job, effects);
        continue;
      }
      LaunchLocked(*job, effects);  // Creates the rendezvous; no node is connected yet.
      // SCHEDULED: not every rank had reported running, and a LAUNCH order
      // may have died with the old process before it reached its agent. Its
      // ranks stay "launching": each node's LAUNCH is sent again when its
      // agent opens its assignment stream (an agent ignores a LAUNCH of a
      // generation it has already launched, and lists what it runs when it
      // registers, which marks those ranks running first). A node that never
      // comes back is lost after its heartbeat timeout, failing the job.
      if (state == JOB_STATE_SCHEDULED) continue;
      // RUNNING: its ranks may be past rendezvous with the old coordinator;
      // they re-attach with their next call instead of failing.
      std::vector<std::string> hosts;
      for (const RankPlacement& rank : job->placement->ranks) hosts.push_back(rank.node);
      if (absl::Status s = coordination_->AllowReattach(id, job->generation(), std::move(hosts));
          !s.ok()) {
        spdlog::warn("recovery: job {}: its ranks cannot re-attach: {}", id, s.ToString());
      }
      for (int rank = 0; rank < job->placement->world_size; ++rank) {
        job->MarkUnaccounted(rank,
                             now + options_.node_recovery_grace + options_.node_heartbeat_timeout);
      }
    }
    spdlog::info("recovered {} jobs ({} placed) and {} nodes from {}", jobs_.size(), placed,
                 nodes_.size(), store_->Describe());
    for (auto& [id, job] : jobs_) CountJobLocked(*job);
    CountNodesLocked();
    ScheduleLocked(effects);
    while (effects.TakeReschedule()) ScheduleLocked(effects);
  }
  effects.Run();
  return result;
}

}  // namespace mesh::coordinator
