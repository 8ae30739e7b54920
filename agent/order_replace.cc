// OrderApplier's replace orders (a LAUNCH with Assignment.replace): ranks
// of the generation that runs started again, each in place of its process
// that exited (in-place recovery). agent/order_applier.h says what is
// applied and what is a no-op.
#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/order_applier.h"
#include "agent/order_applier_internal.h"

namespace mesh::agent {

void OrderApplier::ApplyReplace(const v1::Assignment& order, absl::Time received) {
  const std::string& job_id = order.job_id();
  const int64_t generation = order.generation();
  std::shared_ptr<Generation> rec;
  // The ranks to start again, in the order's order.
  std::vector<const v1::RankLaunch*> targets;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    auto job = jobs_.find(job_id);
    const int64_t highest = job == jobs_.end() ? -1 : job->second->highest;
    if (job == jobs_.end() || generation > highest) {
      // Not a launch of that generation: a LAUNCH without replace is.
      spdlog::warn(
          "replace order for job {} generation {} ignored: this node runs no such generation "
          "(highest {}); a replace only starts ranks again inside a running generation",
          job_id, generation, highest);
      return;
    }
    if (generation < highest) {
      spdlog::info(
          "replace order for job {} generation {} ignored: the job's newest generation here is {}",
          job_id, generation, highest);
      return;
    }
    auto found = job->second->generations.find(generation);
    if (found == job->second->generations.end() || found->second->stopped ||
        found->second->launching) {
      spdlog::info("replace order for job {} generation {} ignored: the generation is stopped",
                   job_id, generation);
      return;
    }
    rec = found->second;
    std::set<int> seen;
    for (const v1::RankLaunch& r : order.ranks()) {
      const int rank = r.rank();
      if (!seen.insert(rank).second) continue;
      if (rec->ranks.count(rank) == 0) {
        spdlog::warn(
            "replace order for job {} generation {}: rank {} is not one of its ranks on this "
            "node; ignoring it",
            job_id, generation, rank);
        continue;
      }
      // Still running, or exited without the exit seen yet: the coordinator
      // sends a replace only after the exit report reached it, so this is a
      // duplicate (or replayed) order, and the rank's process is the one it
      // asked for.
      if (rec->exited.count(rank) == 0) {
        auto pid = rec->running.find(rank);
        spdlog::debug(
            "replace order for job {} generation {}: rank {} still runs (pid {}); nothing to do",
            job_id, generation, rank, pid == rec->running.end() ? -1 : pid->second);
        continue;
      }
      targets.push_back(&r);
    }
  }
  if (targets.empty()) return;
  std::vector<int> target_ranks;
  for (const v1::RankLaunch* r : targets) target_ranks.push_back(r->rank());
  spdlog::info("LAUNCH (replace) job {} generation {}: rank(s) {} again{}{}", job_id, generation,
               absl::StrJoin(target_ranks, ", "), order.reason().empty() ? "" : "; ",
               order.reason());

  auto fail = [&](int rank, const std::string& why) {
    spdlog::error("cannot start job {} generation {} rank {} again: {}", job_id, generation, rank,
                  why);
    absl::MutexLock lock(&mu_);
    ReportLaunchErrorLocked(*jobs_[job_id], job_id, generation, rank, why);
  };
  absl::StatusOr<LaunchContext> context = order.command().empty()
                                              ? absl::InvalidArgumentError("the command is empty")
                                              : PrepareLaunchContext(order);
  if (!context.ok()) {
    for (int rank : target_ranks) fail(rank, std::string(context.status().message()));
    return;
  }

  // The ranks started, with their pid and metrics port (0: none).
  struct Started {
    int rank;
    pid_t pid;
    int port;
  };
  std::vector<Started> started;
  for (const v1::RankLaunch* r : targets) {
    const int rank = r->rank();
    // What the earlier process left in the rank's cgroup (children in a
    // session of their own) goes first: it would share the new process's
    // limits, and may hold its memory, GPU or ports.
    if (rec->cgroup != nullptr) {
      absl::StatusOr<int> killed = rec->cgroup->KillRank(rank, config_.grace + kStopMargin);
      if (!killed.ok()) {
        spdlog::warn("job {} generation {} rank {}: {}", job_id, generation, rank,
                     std::string(killed.status().message()));
      } else if (*killed > 0) {
        spdlog::info(
            "job {} generation {} rank {}: killed {} process(es) its earlier process "
            "left behind",
            job_id, generation, rank, *killed);
      }
    }
    const int port = AcquireWorkerMetricsPort(job_id, generation, rank);
    absl::StatusOr<RankLaunch> launch =
        MakeRankLaunch(order, *r, *context, port, rec->cgroup.get());
    if (!launch.ok()) {
      {
        absl::MutexLock lock(&mu_);
        if (port != 0) ReleaseWorkerMetricsPortLocked(port);
      }
      fail(rank, std::string(launch.status().message()));
      continue;
    }
    // After the earlier process's output, which may hold why it failed.
    launch->spec.append_log = true;
    const int64_t oom_kills = rec->cgroup != nullptr ? rec->cgroup->OomKills(rank) : 0;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) {
        if (port != 0) ReleaseWorkerMetricsPortLocked(port);
        break;
      }
      rec->exited.erase(rank);
      rec->relaunching.insert(rank);  // its exit is held until the started report
      if (port != 0) rec->metrics_ports[rank] = port;
      rec->oom_kills_before[rank] = oom_kills;
      // The earlier process's exit is no longer the rank's news: re-sent
      // after a coordinator restart, it would fail the new process.
      JobRecord& job = *jobs_[job_id];
      job.exits.erase(std::remove_if(job.exits.begin(), job.exits.end(),
                                     [&](const v1::ReportWorkerExitRequest& e) {
                                       return e.generation() == generation && e.rank() == rank;
                                     }),
                      job.exits.end());
    }
    absl::StatusOr<pid_t> pid = rec->supervisor->Relaunch(*std::move(launch));
    if (pid.ok()) {
      started.push_back({rank, *pid, port});
      continue;
    }
    {
      absl::MutexLock lock(&mu_);
      rec->relaunching.erase(rank);
      rec->exited.insert(rank);
      // No exit will come for a process that never started.
      if (auto held = rec->metrics_ports.find(rank); held != rec->metrics_ports.end()) {
        ReleaseWorkerMetricsPortLocked(held->second);
        rec->metrics_ports.erase(held);
      }
    }
    fail(rank, std::string(pid.status().message()));
  }
  if (started.empty()) return;

  absl::MutexLock lock(&mu_);
  v1::ReportWorkersStartedRequest report;
  report.set_job_id(job_id);
  report.set_generation(generation);
  for (const Started& s : started) {
    rec->relaunching.erase(s.rank);
    // Its exit may have been seen already (held below).
    if (rec->exited.count(s.rank) == 0) rec->running[s.rank] = s.pid;
    v1::RunningWorker* w = report.add_workers();
    w->set_job_id(job_id);
    w->set_generation(generation);
    w->set_rank(s.rank);
    w->set_pid(s.pid);
    if (s.port != 0) w->set_metrics_port(s.port);
  }
  const double count = static_cast<double>(started.size());
  metrics_->launches->Increment(count);
  // As for any launch (docs/metrics.md: ranks launched for a generation > 0).
  if (generation > 0) metrics_->restarts->Increment(count);
  metrics_->launch_duration->Observe(absl::ToDoubleSeconds(absl::Now() - received));
  UpdateWorkerGaugesLocked();
  spdlog::info("job {} generation {}: started {} worker(s) again", job_id, generation,
               started.size());
  outbox_->Enqueue(std::move(report));
  for (v1::ReportWorkerExitRequest& held : rec->held) outbox_->Enqueue(std::move(held));
  rec->held.clear();
}

}  // namespace mesh::agent
