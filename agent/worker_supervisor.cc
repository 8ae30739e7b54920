#include "agent/worker_supervisor.h"

#include <map>
#include <set>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/duration_format.h"

namespace mesh::agent {

// Shared with every exit callback, so a callback that fires after the
// supervisor is gone finds `closed` and does nothing.
struct WorkerSupervisor::State {
  ProcessLauncher* launcher;
  std::string job_id;
  int64_t generation;
  SupervisorOptions options;
  RankExitCallback on_exit;

  mutable absl::Mutex mu;
  bool started ABSL_GUARDED_BY(mu) = false;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  // Every rank Start launched: the ranks Relaunch may start again.
  std::set<int> ranks ABSL_GUARDED_BY(mu);
  std::map<int, pid_t> running ABSL_GUARDED_BY(mu);  // rank -> pid
  // Exits that arrived while Start was still recording the rank's pid.
  std::set<int> exited_early ABSL_GUARDED_BY(mu);
  // Exits taken off `running` whose on_exit call has not returned yet.
  int delivering ABSL_GUARDED_BY(mu) = 0;
  // Signalled when `running` empties and `delivering` drops. A CondVar
  // rather than Mutex::Await, so that the wait condition is evaluated by
  // the waiter (TSan cannot follow Debian's uninstrumented Abseil otherwise).
  absl::CondVar changed;

  // Serializes on_exit calls against destruction.
  absl::Mutex callback_mu;  // taken before `mu` when on_exit calls Stop()
  bool closed ABSL_GUARDED_BY(callback_mu) = false;

  void StopLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    stopping = true;
    for (const auto& [rank, pid] : running) {
      // NOT_FOUND means it exited in the meantime; its report is on the way.
      launcher->Terminate(pid, options.grace).IgnoreError();
    }
  }

  // Rank prefix of every message about this generation.
  std::string Name(int rank) const {
    return absl::StrCat("job ", job_id, " generation ", generation, " rank ", rank);
  }

  // Launches one rank and records its pid; the launcher's error, prefixed
  // with the rank, when it cannot. Called with `mu` held across the launch,
  // so an exit callback for a worker that dies at once waits until its pid
  // is recorded.
  static absl::StatusOr<pid_t> LaunchLocked(const std::shared_ptr<State>& state, RankLaunch& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) {
    const int rank = r.rank;
    std::weak_ptr<State> weak = state;
    auto on_exit = [weak, rank](const ExitInfo& exit) {
      std::shared_ptr<State> s = weak.lock();
      if (s == nullptr) return;
      RankExit report{s->job_id, s->generation, rank, exit, false};
      {
        absl::MutexLock lock(&s->mu);
        if (s->running.erase(rank) == 0) s->exited_early.insert(rank);
        report.stopped = s->stopping;
        ++s->delivering;
      }
      {
        // Not under `mu`, so the callback may call Stop(); under
        // `callback_mu`, so it never runs once the destructor set `closed`.
        absl::MutexLock lock(&s->callback_mu);
        if (!s->closed && s->on_exit) s->on_exit(report);
      }
      absl::MutexLock lock(&s->mu);
      --s->delivering;
      s->changed.SignalAll();
    };
    absl::StatusOr<pid_t> pid = state->launcher->Launch(r.spec, std::move(on_exit));
    if (!pid.ok()) {
      return absl::Status(pid.status().code(),
                          absl::StrCat(state->Name(rank), ": ", pid.status().message()));
    }
    if (state->exited_early.erase(rank) == 0) state->running.emplace(rank, *pid);
    return pid;
  }
};

WorkerSupervisor::WorkerSupervisor(ProcessLauncher* launcher, std::string job_id,
                                   int64_t generation, SupervisorOptions options,
                                   RankExitCallback on_exit)
    : state_(std::make_shared<State>()) {
  state_->launcher = launcher;
  state_->job_id = std::move(job_id);
  state_->generation = generation;
  state_->options = options;
  state_->on_exit = std::move(on_exit);
}

WorkerSupervisor::~WorkerSupervisor() {
  {
    absl::MutexLock lock(&state_->mu);
    state_->StopLocked();
  }
  // Waits for an on_exit call in progress; none starts after this.
  absl::MutexLock lock(&state_->callback_mu);
  state_->closed = true;
}

absl::Status WorkerSupervisor::Start(std::vector<RankLaunch> ranks) {
  std::shared_ptr<State> state = state_;
  // Held across the launches, so an exit callback for a worker that dies at
  // once waits until its pid is recorded.
  absl::MutexLock lock(&state->mu);
  if (state->started || state->stopping) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", state->job_id, " generation ", state->generation,
        state->stopping ? ": supervisor already stopped" : ": workers already started"));
  }
  if (ranks.empty()) return absl::InvalidArgumentError("no ranks to launch");
  std::set<int> seen;
  for (const RankLaunch& r : ranks) {
    if (!seen.insert(r.rank).second) {
      return absl::InvalidArgumentError(absl::StrCat(state->Name(r.rank), " is listed twice"));
    }
  }
  state->started = true;
  for (RankLaunch& r : ranks) {
    absl::StatusOr<pid_t> pid = State::LaunchLocked(state, r);
    if (!pid.ok()) {
      state->StopLocked();
      return pid.status();
    }
    state->ranks.insert(r.rank);
  }
  return absl::OkStatus();
}

absl::StatusOr<pid_t> WorkerSupervisor::Relaunch(RankLaunch rank) {
  std::shared_ptr<State> state = state_;
  absl::MutexLock lock(&state->mu);
  if (state->stopping) {
    return absl::FailedPreconditionError(
        absl::StrCat(state->Name(rank.rank), ": supervisor already stopped"));
  }
  if (state->ranks.count(rank.rank) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(state->Name(rank.rank), " was never launched here"));
  }
  if (auto it = state->running.find(rank.rank); it != state->running.end()) {
    return absl::FailedPreconditionError(absl::StrCat(state->Name(rank.rank), " still runs (pid ",
                                                      it->second, "); its exit was not seen"));
  }
  // A failed launch leaves the rank exited and the others as they are.
  return State::LaunchLocked(state, rank);
}

void WorkerSupervisor::Stop() {
  absl::MutexLock lock(&state_->mu);
  state_->StopLocked();
}

int WorkerSupervisor::running() const {
  absl::MutexLock lock(&state_->mu);
  return static_cast<int>(state_->running.size());
}

absl::Status WorkerSupervisor::WaitAllExited(absl::Duration timeout) const {
  absl::MutexLock lock(&state_->mu);
  const absl::Time deadline = absl::Now() + timeout;
  while (!state_->running.empty() || state_->delivering > 0) {
    if (state_->changed.WaitWithDeadline(&state_->mu, deadline) && absl::Now() >= deadline) break;
  }
  if (state_->running.empty() && state_->delivering == 0) return absl::OkStatus();
  std::vector<int> ranks;
  for (const auto& [rank, pid] : state_->running) ranks.push_back(rank);
  return absl::DeadlineExceededError(
      absl::StrCat("job ", state_->job_id, " generation ", state_->generation, ": ", ranks.size(),
                   " worker(s) still running after ", FormatDurationShort(timeout), ": ranks ",
                   absl::StrJoin(ranks, ", ")));
}

}  // namespace mesh::agent
