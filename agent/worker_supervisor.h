// WorkerSupervisor: the workers of one (job, generation) on this host. It
// launches them through a ProcessLauncher, reports each exit with its rank,
// and stops them all (SIGTERM to each process group, SIGKILL after a grace)
// on cancel or restart. A restart of the whole job is a new supervisor for
// generation G+1 after the old one has stopped; a rank whose process exited
// may instead be started again inside the same supervisor (Relaunch: the
// in-place recovery of one rank, Assignment.replace).
//
//            Relaunch(a rank whose process exited)
//               ┌───┐
//               ▼   │
//   Start ──▶ RUNNING ──every worker exited──▶ DONE
//               │  ▲                            │
//               │  └──────Relaunch(a rank)──────┘
//               │ Stop() / destructor
//               ▼
//            STOPPING ──every worker exited──▶ STOPPED
//
// Relaunch is refused in STOPPING and STOPPED.
//
// Each rank runs one process at a time:
//
//   running ──its process exited (taken off running, passed to on_exit)──▶
//   exited ──Relaunch──▶ running
//
// Exits reported after Stop() carry stopped = true: they are the agent's
// doing, not a failure of the job. A relaunched rank is a worker like any
// other: its exit goes to on_exit, Stop() terminates it and WaitAllExited
// waits for it.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/process_launcher.h"

namespace mesh::agent {

struct RankLaunch {
  int rank = 0;
  LaunchSpec spec;
};

struct RankExit {
  std::string job_id;
  int64_t generation = 0;
  int rank = 0;
  ExitInfo exit;
  // True when the exit followed Stop() (cancel, restart, agent shutdown).
  bool stopped = false;
};

using RankExitCallback = std::function<void(const RankExit&)>;

struct SupervisorOptions {
  // Time between SIGTERM and SIGKILL when stopping.
  absl::Duration grace = absl::Seconds(10);
};

// Thread safety: thread-safe. `on_exit` runs on the launcher's callback
// thread, once per launched process (a relaunched rank's included), one
// call at a time, and never after the
// destructor has returned; it may call Stop() and running() but must
// not destroy the supervisor.
class WorkerSupervisor {
 public:
  // `launcher` must outlive this supervisor.
  WorkerSupervisor(ProcessLauncher* launcher, std::string job_id, int64_t generation,
                   SupervisorOptions options, RankExitCallback on_exit);
  // Stops every worker still running (the launcher carries out the SIGKILL
  // after the grace) and drops their later exit reports.
  ~WorkerSupervisor();

  WorkerSupervisor(const WorkerSupervisor&) = delete;
  WorkerSupervisor& operator=(const WorkerSupervisor&) = delete;

  // Launches every rank, in order. Either all are running or none is: when
  // one fails to launch, those already started are stopped.
  // Possible errors: FAILED_PRECONDITION when called twice or after Stop();
  // INVALID_ARGUMENT for no ranks or a rank given twice; otherwise the
  // launcher's error for the first rank that failed, its message prefixed
  // with the job, generation and rank.
  absl::Status Start(std::vector<RankLaunch> ranks);

  // Starts `rank` again, in place of its process that has exited (its exit
  // was taken off the running workers; on_exit may still be delivering it).
  // Returns the new pid. Allowed in RUNNING and DONE, so the supervisor is
  // running again afterwards.
  // Possible errors: FAILED_PRECONDITION after Stop(), or while the rank's
  // process still runs (or its exit has not been seen yet); INVALID_ARGUMENT
  // for a rank that Start did not launch; otherwise the launcher's error,
  // its message prefixed with the job, generation and rank (the rank then
  // stays exited).
  absl::StatusOr<pid_t> Relaunch(RankLaunch rank);

  // SIGTERM to every running worker's process group now, SIGKILL after the
  // grace. Idempotent; returns at once.
  void Stop();

  // Workers launched and not yet reported exited.
  int running() const;

  // Waits until every launched worker has exited and its exit has been
  // passed to on_exit.
  // Possible errors: DEADLINE_EXCEEDED naming the ranks still running.
  absl::Status WaitAllExited(absl::Duration timeout) const;

 private:
  struct State;
  std::shared_ptr<State> state_;  // shared with the launcher's callbacks
};

}  // namespace mesh::agent
