// OrderApplier: carries out the coordinator's LAUNCH and KILL orders on
// this host, one WorkerSupervisor per (job, generation), and turns what
// happens to the workers into reports for the ReportOutbox.
//
// Orders are applied in stream order by one thread (the Agent's order
// thread), which is also the thread that calls ProcessLauncher::Launch
// (PR_SET_PDEATHSIG is per thread). An order for a (job, generation) at or
// below one already launched or killed is a no-op. LAUNCH of a newer
// generation first stops the older ones and waits for their workers to exit
// (at most grace + 5 s), so two generations never hold the same GPUs or
// ports. Once a stopped generation's workers have all exited, what is left
// of it outside their process groups (setsid grandchildren) is killed
// through the StrayKiller.
//
// A generation's life on this host:
//
//   LAUNCHING ──all ranks started──▶ RUNNING ──KILL / newer LAUNCH──▶ STOPPED
//       │ a rank failed to launch      │ every rank exited             │
//       ▼                              ▼ (stays until stopped)         │
//   STOPPED: every rank reported    (exits reported)     every worker exited
//   as a launch error                                                  ▼
//                                                        collected, strays killed
//
// Replace orders (a LAUNCH with Assignment.replace: in-place recovery)
// start ranks again inside the generation that runs, each in place of its
// process that exited: same environment, rank cgroup (made again, same
// directories) and log (appended to, not truncated), a new metrics port.
// A replace applies only to the job's highest generation while it is
// neither stopped nor launching, and only to ranks of it whose exit was
// seen; for a rank whose process still runs, or whose exit has not been
// seen yet, it is a no-op (the coordinator sends it only after the exit
// report reached it), and so is a replace for any other generation: an
// older or stopped one, one never launched here, or a newer one (a replace
// never launches a generation). A rank of a running generation:
//
//   RUNNING ──exit seen (reported)──▶ EXITED ──replace──▶ RELAUNCHING
//      ▲                                ▲                   │    │
//      │                                └─cannot start──────┘    │
//      │                                  (launch error)         │
//      └───────────started (ReportWorkersStarted, new pid)───────┘
//
// An exit of the new process seen while RELAUNCHING is held back until
// after the started report.
//
// Reports: one ReportWorkersStarted per launched generation (and per
// replace order that started a rank), then one
// ReportWorkerExit per worker exit that was not the agent's doing (exits
// seen while the generation is still launching are held back until after
// the started report). The exit records of each job's current generation
// are kept (until a KILL or the next LAUNCH) so that they can be sent again
// to a coordinator that may have lost them (ExitRecords); a rank's records
// are dropped when a replace order starts it again, so that a re-sent old
// exit cannot fail its new process.
//
// Worker metrics ports: with a range configured, each launched rank gets a
// port of it that no other live worker holds, as MESH_METRICS_PORT, handed
// out round-robin so a port just freed is reused last; when every port is
// taken the rank is launched without one (logged).
//
// Thread safety: thread-safe. ApplyLaunch, ApplyKill and
// CollectFinishedGenerations are meant for one thread (they may block for
// grace + 5 s); the queries may be called from any thread. Worker exits
// arrive on the launcher's callback thread.
// Isolation: with a JobIsolation, each LAUNCH's workers run as the account
// it decides, in the generation's cgroup it makes; a generation with a
// cgroup is ended by killing its cgroup (every process in it, whatever
// session or environment it moved to) instead of by the StrayKiller's scan,
// and a worker the kernel killed for memory is reported as such
// (ReportWorkerExitRequest.oom_killed and detail).
//
// Ownership: config, launcher, outbox and metrics are borrowed and must
// outlive the applier; `strays` and `isolation` may be null (nothing is
// looked for; workers run as the agent in no cgroup of their own).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/agent_config.h"
#include "agent/agent_metrics.h"
#include "agent/cgroup.h"
#include "agent/job_isolation.h"
#include "agent/process_launcher.h"
#include "agent/rank_relay.h"
#include "agent/report_outbox.h"
#include "agent/stray_killer.h"
#include "agent/worker_supervisor.h"
#include "mesh/v1/job.pb.h"

namespace mesh::agent {

class OrderApplier {
 public:
  OrderApplier(const AgentConfig* config, ProcessLauncher* launcher, ReportOutbox* outbox,
               AgentMetrics* metrics, StrayKiller* strays, const JobIsolation* isolation = nullptr);
  // Destroys the supervisors, which stop any worker still running; call
  // Shutdown first to wait for them.
  ~OrderApplier();

  OrderApplier(const OrderApplier&) = delete;
  OrderApplier& operator=(const OrderApplier&) = delete;

  // LAUNCH: stops older generations of the job, then starts every rank of
  // the order. `received` is when the order arrived (launch duration
  // metric). A failure to launch is reported as a launch error for every
  // rank of the order, not returned. With order.replace, starts the listed
  // ranks of the running generation again instead (see above); a rank that
  // cannot be started is reported as a launch error for that rank alone.
  void ApplyLaunch(const v1::Assignment& order, absl::Time received);
  // KILL: stops every generation of the job at or below the order's, with
  // the order's grace (AgentConfig.grace when it gives none).
  void ApplyKill(const v1::Assignment& order);
  // Forgets stopped generations whose workers have all exited, and kills
  // their strays; then publishes each job's usage on this node (the
  // mesh_agent_job_* gauges; a job's series go once it has no generation
  // here).
  void CollectFinishedGenerations();

  // Called (on the launcher's callback thread, without locks held) when a
  // stopped generation's last worker has exited, so that the owner calls
  // CollectFinishedGenerations soon rather than at its next tick: what is
  // left in the generation's cgroup dies at once. Set before the first
  // order.
  void set_on_collectable(std::function<void()> callback) { on_collectable_ = std::move(callback); }
  // The agent's rank relay, or null (the default): each launched generation
  // is registered with it before its workers start, and removed once it is
  // collected, and its workers get MESH_AGENT_SOCKET. Set before the first
  // order; borrowed, must outlive the applier.
  void set_relay(RankRelay* relay) { relay_ = relay; }

  // After this, a LAUNCH (one in progress included) starts nothing.
  void BeginShutdown();
  // Stops every worker (SIGTERM, SIGKILL after the grace), waits for them
  // (grace + 5 s at most), kills their strays and forgets every
  // generation. Call once no order is being applied any more.
  void Shutdown();

  // Workers supervised now (launched, exit not yet seen).
  std::vector<v1::RunningWorker> RunningWorkers() const;
  // The exit records of each job's current generation.
  std::vector<v1::ReportWorkerExitRequest> ExitRecords() const;
  // The ranks of a generation this agent still knows; empty when none.
  std::set<int> GenerationRanks(const std::string& job_id, int64_t generation) const;
  // Whether a rank has ended, will not start, or is unknown here: its log
  // will not grow any more. False while its generation is launching.
  bool RankFinished(const std::string& job_id, int64_t generation, int rank) const;

 private:
  struct Generation;
  struct JobRecord;

  // What every rank of one LAUNCH (or replace order) shares.
  struct LaunchContext {
    std::string dir;  // the generation's directory
    std::optional<WorkerCredentials> account;
    // The operator's base env with the account's HOME, USER and LOGNAME.
    std::map<std::string, std::string> base_env;
    std::vector<std::pair<std::string, std::string>> user_env;  // sorted
  };

  // LAUNCH with replace (agent/order_replace.cc).
  void ApplyReplace(const v1::Assignment& order, absl::Time received);
  // The account and the directory of `order`'s workers (made for them) and
  // their base environment. The error's message is the launch error.
  absl::StatusOr<LaunchContext> PrepareLaunchContext(const v1::Assignment& order) const;
  // One rank's launch: its environment (BuildWorkerEnv with the order's
  // fields), log, account and, with `cgroup` (may be null), its rank cgroup.
  // The error's message, naming the rank, is the launch error.
  absl::StatusOr<RankLaunch> MakeRankLaunch(const v1::Assignment& order, const v1::RankLaunch& r,
                                            const LaunchContext& context, int metrics_port,
                                            GenerationCgroup* cgroup) const;
  // AcquireWorkerMetricsPortLocked, logging when the range is used up.
  int AcquireWorkerMetricsPort(const std::string& job_id, int64_t generation, int rank);
  // Reports (and records, for the current generation) that `rank` could
  // not be started.
  void ReportLaunchErrorLocked(JobRecord& job, const std::string& job_id, int64_t generation,
                               int rank, const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void OnRankExit(const RankExit& exit);
  // Records the exit; true when it was the last worker of a stopped
  // generation.
  // `detail`: ExitDetail of the exit ("" when none).
  bool OnRankExitLocked(const RankExit& exit, const std::string& detail)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Kills what is left of each ended generation outside its workers'
  // process groups: its whole cgroup when it has one, else the StrayKiller's
  // scan; call without mu_.
  void KillStrays(const std::vector<std::pair<std::string, std::shared_ptr<Generation>>>& ended);
  std::vector<v1::RunningWorker> RunningWorkersLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateWorkerGaugesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateJobUsageLocked(const std::vector<GpuUsage>& gpu_usage)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A free port of the worker metrics range (marked used), or 0 when the
  // range is off or every port is held by a live worker.
  int AcquireWorkerMetricsPortLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseWorkerMetricsPortLocked(int port) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const AgentConfig& config_;
  ProcessLauncher* const launcher_;
  ReportOutbox* const outbox_;
  AgentMetrics* const metrics_;
  StrayKiller* const strays_;            // May be null.
  const JobIsolation* const isolation_;  // May be null.
  std::function<void()> on_collectable_;
  RankRelay* relay_ = nullptr;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Jobs this agent has seen, by id.
  std::map<std::string, std::unique_ptr<JobRecord>> jobs_ ABSL_GUARDED_BY(mu_);
  // Worker metrics ports held by live workers, and where the round-robin
  // search for the next one starts.
  std::set<int> worker_ports_in_use_ ABSL_GUARDED_BY(mu_);
  // Jobs whose mesh_agent_job_* series exist.
  std::set<std::string> jobs_with_usage_ ABSL_GUARDED_BY(mu_);
  int next_worker_port_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace mesh::agent
