// JobManager's handling of what agents report about their workers:
// ReportWorkersStarted (SCHEDULED → RUNNING) and ReportWorkerExit (a rank
// done, the job succeeded, or a failure with its root cause: relaunched in
// place under restart_policy IN_PLACE, else the job restarts or fails;
// job_manager.h).
#include <algorithm>
#include <string>
#include <utility>

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "coordinator/job_manager.h"
#include "coordinator/job_manager_internal.h"
#include "coordinator/worker_exit_message.h"

namespace mesh::coordinator {

using ::mesh::v1::JOB_STATE_SCHEDULED;
using ::mesh::v1::RootCause;

absl::Status JobManager::ReportWorkersStarted(
    const mesh::v1::ReportWorkersStartedRequest& request) {
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Node*> node = SessionNodeLocked(request.name(), request.session_id());
    if (!node.ok()) return node.status();
    SeenLocked(**node, clock_->Now());
    Job* job = FindJobLocked(request.job_id());
    if (job == nullptr || !job->holds || request.generation() != job->generation()) {
      if (job != nullptr && request.generation() < job->generation()) ++stats_.stale_reports;
      return absl::OkStatus();
    }
    for (const auto& worker : request.workers()) {
      if (worker.rank() < 0 || worker.rank() >= static_cast<int>(job->ranks.size()) ||
          job->placement->ranks[worker.rank()].node != request.name()) {
        return absl::InvalidArgumentError(absl::StrCat("job ", job->id, ": rank ", worker.rank(),
                                                       " is not placed on node ", request.name()));
      }
    }
    if (job->pids.size() != job->ranks.size()) job->pids.assign(job->ranks.size(), 0);
    // The generation runs there now: later orders for its ranks replace.
    job->replacement_nodes.erase(request.name());
    for (const auto& worker : request.workers()) {
      Job::Rank& status = job->ranks[worker.rank()];
      if (status != Job::Rank::kSucceeded) status = Job::Rank::kRunning;
      job->pids[worker.rank()] = worker.pid();
      if (discovery_ != nullptr && worker.metrics_port() > 0) {
        discovery_->SetWorker(job->id, worker.rank(), request.name(),
                              ServiceDiscovery::Target((*node)->address, worker.metrics_port()));
        FlushDiscoveryLater(effects);
      }
    }
    MaybeStartLocked(*job, effects);
    while (effects.TakeReschedule()) ScheduleLocked(effects);
  }
  effects.Run();
  return absl::OkStatus();
}

absl::Status JobManager::ReportWorkerExit(const mesh::v1::ReportWorkerExitRequest& request) {
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Node*> found = SessionNodeLocked(request.name(), request.session_id());
    if (!found.ok()) return found.status();
    Node& node = **found;
    SeenLocked(node, clock_->Now());
    Job* job = FindJobLocked(request.job_id());
    if (job == nullptr || !job->holds || request.generation() != job->generation()) {
      if (job != nullptr && request.generation() < job->generation()) ++stats_.stale_reports;
      return absl::OkStatus();
    }
    const int rank = request.rank();
    if (rank < 0 || rank >= static_cast<int>(job->ranks.size()) ||
        job->placement->ranks[rank].node != node.name) {
      return absl::InvalidArgumentError(
          absl::StrCat("job ", job->id, ": rank ", rank, " is not placed on node ", node.name));
    }
    // The rank is held by another process than the one that ended (it was
    // relaunched in place since): a late or re-sent report, not news.
    if (request.pid() > 0 && static_cast<size_t>(rank) < job->pids.size() && job->pids[rank] > 0 &&
        job->pids[rank] != request.pid()) {
      ++stats_.stale_reports;
      return absl::OkStatus();
    }
    using Termination = mesh::v1::ReportWorkerExitRequest::TerminationCase;
    const Termination how = request.termination_case();
    if (discovery_ != nullptr) {
      discovery_->RemoveWorker(job->id, rank);
      FlushDiscoveryLater(effects);
    }
    if (how == Termination::kExitCode && request.exit_code() == 0) {
      job->ranks[rank] = Job::Rank::kSucceeded;
      const bool all = std::all_of(job->ranks.begin(), job->ranks.end(),
                                   [](Job::Rank r) { return r == Job::Rank::kSucceeded; });
      if (all) {
        if (job->state() == JOB_STATE_SCHEDULED) {
          (void)job->machine->Start("every rank ran");
          (void)PersistLocked(*job);
          NotifyWatchersLocked(*job);
        }
        (void)job->machine->Succeed(absl::StrCat("all ", job->ranks.size(), " ranks exited 0"));
        spdlog::info("job {} succeeded", job->id);
        AfterTransitionLocked(*job, effects);
      } else {
        // Peers still run and may be waiting for this rank (a barrier, a
        // key): unless it left its rendezvous cleanly, Coordination ends
        // their waits now, naming it, instead of at their deadlines. After
        // unlock: the failure listener calls back into this manager.
        effects.Call(
            [coordination = coordination_, id = job->id, generation = request.generation(), rank] {
              (void)coordination->RankExited(
                  id, generation, rank,
                  "exited with code 0 before the job finished (without leaving: no "
                  "Runtime::Shutdown)");
            });
      }
    } else {
      RootCause cause;
      cause.set_rank(rank);
      cause.set_node(node.name);
      cause.set_host(node.address);
      cause.set_generation(request.generation());
      switch (how) {
        case Termination::kExitCode:
          cause.set_exit_code(request.exit_code());
          break;
        case Termination::kSignal:
          cause.set_signal(request.signal());
          break;
        case Termination::kLaunchError:
          break;
        default:
          return absl::InvalidArgumentError(
              "ReportWorkerExit needs an exit_code, a signal or a launch_error");
      }
      // With what the agent knows beyond the status: an OOM kill in the
      // rank's cgroup, the dynamic loader's message for exit code 127.
      cause.set_oom_killed(request.oom_killed());
      cause.set_message(
          WorkerExitMessage(absl::StrCat("rank ", rank, " (node ", node.name, ")"), request));
      if (!RecoverInPlaceLocked(*job, node, cause, how == Termination::kLaunchError, effects)) {
        FailJobLocked(*job, std::move(cause), effects);
      }
    }
    while (effects.TakeReschedule()) ScheduleLocked(effects);
  }
  effects.Run();
  return absl::OkStatus();
}

bool JobManager::RecoverInPlaceLocked(Job& job, Node& node, const mesh::v1::RootCause& cause,
                                      bool launch_error, Effects& effects) {
  (void)effects;
  if (job.spec.restart_policy() != mesh::v1::RESTART_POLICY_IN_PLACE ||
      job.state() != mesh::v1::JOB_STATE_RUNNING) {
    return false;
  }
  // The rank is being relaunched already: this is the replaced process's
  // exit again (an agent re-sends its exits after a reconnect), not a new
  // failure. Only the replacement failing to start is one.
  if (job.ranks[cause.rank()] == Job::Rank::kLaunching && !launch_error) return true;
  // A node that took over a lost node's ranks and cannot start them: one
  // restart of the whole job, not one per rank it reports.
  if (launch_error && job.replacement_nodes.contains(node.name)) return false;
  if (job.machine->restarts() >= job.machine->max_restarts()) return false;
  // A rank that already finished will not rebuild a mesh with the new
  // process, which would wait for it: the job restarts as a whole instead.
  if (std::any_of(job.ranks.begin(), job.ranks.end(),
                  [](Job::Rank r) { return r == Job::Rank::kSucceeded; })) {
    return false;
  }
  // Coordination decides whether the others can carry on: only once the
  // world has formed and while the generation has not failed.
  absl::StatusOr<bool> lost =
      coordination_->LoseRankInPlace(job.id, cause.generation(), cause.rank(), cause.message());
  if (!lost.ok() || !*lost) return false;
  RelaunchInPlaceLocked(job, cause, {cause.rank()}, node);
  return true;
}

void JobManager::RelaunchInPlaceLocked(Job& job, mesh::v1::RootCause cause,
                                       const std::vector<int>& ranks, Node& node) {
  const absl::Status recovered = job.machine->RecoverInPlace(std::move(cause));
  MESH_CHECK(recovered.ok(), "RUNNING with restarts left recovers in place");
  metrics_.in_place_recoveries->Increment();
  metrics_.restarts->Increment();
  ++stats_.restarts;
  spdlog::warn("job {}: {}", job.id, job.machine->events().back().reason);
  (void)PersistLocked(job);
  NotifyWatchersLocked(job);
  // An order the agent cannot carry out must not leave the others waiting
  // for the ranks for ever: unreported by then, the job restarts as a whole.
  const absl::Time deadline = clock_->Now() + InPlaceStartTimeout();
  for (int rank : ranks) {
    job.ranks[rank] = Job::Rank::kLaunching;
    if (static_cast<size_t>(rank) < job.pids.size()) job.pids[rank] = 0;
    job.ExpectStartedBy(rank, deadline);
  }
  SendLaunchLocked(job, node);
}

}  // namespace mesh::coordinator
