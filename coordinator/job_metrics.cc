// JobManager's metrics (docs/metrics.md, "Coordinator"): the families it
// registers, and the job-state gauge it keeps (job_manager.h).
#include <optional>

#include "coordinator/job_manager.h"
#include "coordinator/job_manager_internal.h"
#include "coordinator/job_state.h"

namespace mesh::coordinator {

using ::mesh::v1::JOB_STATE_CANCELLED;
using ::mesh::v1::JOB_STATE_FAILED;
using ::mesh::v1::JOB_STATE_PENDING;
using ::mesh::v1::JOB_STATE_RESTARTING;
using ::mesh::v1::JOB_STATE_RUNNING;
using ::mesh::v1::JOB_STATE_SCHEDULED;
using ::mesh::v1::JOB_STATE_SUCCEEDED;

namespace {
constexpr JobState kAllJobStates[] = {JOB_STATE_PENDING,    JOB_STATE_SCHEDULED, JOB_STATE_RUNNING,
                                      JOB_STATE_RESTARTING, JOB_STATE_SUCCEEDED, JOB_STATE_FAILED,
                                      JOB_STATE_CANCELLED};
}  // namespace

JobManager::Metrics::Metrics(metrics::Registry& registry)
    : jobs(registry.AddGauge("mesh_coordinator_jobs", "Jobs in each state.", {"state"})),
      finished(registry.AddCounter("mesh_coordinator_jobs_finished_total",
                                   "Jobs that reached a terminal state.", {"state"})),
      restarts(registry
                   .AddCounter("mesh_coordinator_job_restarts_total",
                               "Restarts of any job (a worker or node failed with restarts left).")
                   ->Get()),
      in_place_recoveries(
          registry
              .AddCounter("mesh_coordinator_in_place_recoveries_total",
                          "Failed workers relaunched alone, or a lost node's ranks moved to "
                          "a free node, while the others carried on (restart_policy IN_PLACE; "
                          "docs/elastic.md).")
              ->Get()),
      shrinks(registry
                  .AddCounter("mesh_coordinator_job_resizes_total",
                              "Changes of an elastic job's node count (docs/elastic.md).",
                              {"direction"})
                  ->WithLabels({"shrink"})),
      grows(registry
                .AddCounter("mesh_coordinator_job_resizes_total",
                            "Changes of an elastic job's node count (docs/elastic.md).",
                            {"direction"})
                ->WithLabels({"grow"})),
      nodes_ready(registry.AddGauge("mesh_coordinator_nodes", "Nodes in each state.", {"state"})
                      ->WithLabels({"READY"})),
      nodes_lost(registry.AddGauge("mesh_coordinator_nodes", "Nodes in each state.", {"state"})
                     ->WithLabels({"LOST"})),
      node_heartbeat(registry.AddGauge("mesh_coordinator_node_last_heartbeat_timestamp_seconds",
                                       "Unix time of the last heartbeat (or call) of each node.",
                                       {"node"})) {
  // Every state shows, at 0, from the start: a dashboard can tell "none"
  // from "not exported".
  for (JobState state : kAllJobStates) jobs->WithLabels({JobStateName(state)});
  for (JobState state : {JOB_STATE_SUCCEEDED, JOB_STATE_FAILED, JOB_STATE_CANCELLED}) {
    finished->WithLabels({JobStateName(state)});
  }
}

void JobManager::CountJobLocked(Job& job) {
  const JobState state = job.state();
  if (job.counted == state) return;
  if (job.counted.has_value()) metrics_.jobs->WithLabels({JobStateName(*job.counted)})->Decrement();
  metrics_.jobs->WithLabels({JobStateName(state)})->Increment();
  job.counted = state;
}

}  // namespace mesh::coordinator
