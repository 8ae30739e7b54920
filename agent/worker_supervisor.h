// WorkerSupervisor: the workers of one (job, generation) on this host. It
// launches them through a ProcessLauncher, reports each exit with its rank,
// and stops them all (SIGTERM to each process group, SIGKILL after a grace)
// on cancel or restart. A restart is a new supervisor for generation G+1
// after the old one has stopped.
//
//   Start ──▶ RUNNING ──every worker exited──▶ DONE
//               │                               ▲
//               │ Stop() / destructor           │
//               ▼                               │
//            STOPPING ──every worker exited─────┘
//
// Exits reported after Stop() carry stopped = true: they are the agent's
// doing, not a failure of the job.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
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
// thread, once per launched rank, one call at a time, and never after the
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
