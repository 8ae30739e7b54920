// Agent: one mesh-agent's logic. It registers its node with the
// coordinator's NodeService (protos/mesh/v1/job.proto), heartbeats, applies
// the orders of its WatchAssignments stream (launch, kill, upload logs),
// supervises the workers through a ProcessLauncher, and reports their starts
// and exits. docs/agent.md describes the behaviour for operators.
//
// Session lifecycle (one session = one successful RegisterNode):
//
//   ┌──▶ REGISTERING ──ok──▶ CONNECTED (heartbeats, orders, reports)
//   │        │ error                │ stream ends, or an RPC gets ABORTED /
//   │        ▼                      │ NOT_FOUND, or no heartbeat succeeded
//   └── backoff (100 ms doubling    │ for heartbeat_timeout
//       to 1 s, with jitter) ◀──────┘
//
// Running workers are never touched by a session change: a coordinator
// restart must not kill jobs. The new registration lists every worker still
// supervised, reports not yet acknowledged are sent again with the new
// session, and so are the exit records of each job's current generation
// (the coordinator may have lost them; it treats duplicates as no-ops).
//
// Orders: LAUNCH and KILL are applied in stream order by one long-lived
// thread, which is also the thread that calls ProcessLauncher::Launch
// (PR_SET_PDEATHSIG is per thread). An order for a (job, generation) at or
// below one already launched or killed is a no-op. Once a stopped
// generation's workers have all exited, what is left of it outside their
// process groups (setsid grandchildren) is killed through the StrayKiller. LAUNCH of a newer
// generation first stops the older one and waits for its workers to exit
// (at most grace + 5 s). UPLOAD_LOGS is ordered the same way (so it finds the
// log files of a LAUNCH just before it), then runs on its own bounded thread.
//
// Metrics (docs/metrics.md, "Agent"): recorded into the registry given to
// the constructor (NoopRegistry by default). The agent's own /metrics port
// is the binary's business; the Agent only registers it (metrics_port).
// With a worker metrics port range, each launched rank gets a port of it
// that no other live worker of this agent holds, as MESH_METRICS_PORT, and
// the agent reports it in RunningWorker.metrics_port; ports are handed out
// round-robin so a port just freed is reused last. When every port of the
// range is taken, the rank is launched without one (logged).
//
// Thread safety: Start and Shutdown from one thread; everything else is
// internal. Ownership: the launcher and the registry are borrowed and must
// outlive the Agent.
#pragma once

#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/agent_metrics.h"
#include "agent/nvml.h"
#include "agent/process_launcher.h"
#include "agent/stray_killer.h"
#include "agent/worker_supervisor.h"
#include "common/metrics.h"
#include "common/security.h"
#include "mesh/v1/job.grpc.pb.h"

namespace mesh::agent {

struct AgentConfig {
  // host:port of the coordinator; also each worker's MESH_COORDINATOR.
  std::string coordinator = "127.0.0.1:7450";
  // TLS files and the agent's own token (common/security.h). Workers get
  // the TLS files too, but never this token: each job's workers get that
  // job's worker token instead.
  security::ClientSecurity security;
  // Node name (RegisterNodeRequest.name) and the address workers here are
  // reachable at (MASTER_ADDR when rank 0 runs here).
  std::string name;
  std::string address;
  int slots = 1;
  std::vector<GpuDevice> gpus;
  // Logs go to <work_dir>/jobs/<job>/gen-<g>/rank-<r>.log (stdout and
  // stderr together). That directory is also a worker's working directory
  // when its job names none.
  std::string work_dir;
  // Per-rank log cap; the launcher rotates to "<log>.1" beyond it.
  int64_t log_max_bytes = int64_t{64} << 20;
  // SIGTERM -> SIGKILL when stopping workers (a KILL order may give its own).
  absl::Duration grace = absl::Seconds(10);
  // Deadline of every unary RPC.
  absl::Duration rpc_timeout = absl::Seconds(10);
  // Deadline of an UploadLogs stream without / with follow.
  absl::Duration upload_timeout = absl::Minutes(5);
  absl::Duration follow_upload_timeout = absl::Hours(24);
  // Re-registration backoff: initial, doubling up to max, each with +-20%
  // jitter. Reset once a session lasted 5 s or delivered an order. The max
  // also caps gRPC's own reconnect backoff, so that a restarted coordinator
  // is found within about max of serving: a connection attempt a second to a
  // coordinator that is down costs nothing, and a few seconds of needless
  // waiting after it is back can cost the node its liveness.
  absl::Duration backoff_initial = absl::Milliseconds(100);
  absl::Duration backoff_max = absl::Seconds(1);
  // How often a followed log is polled for new output.
  absl::Duration log_poll_interval = absl::Milliseconds(100);
  // UPLOAD_LOGS orders served at once; more are refused with a log line.
  int max_uploads = 16;
  // Layer 1 of each worker's environment (InheritedBaseEnv() in the binary).
  std::map<std::string, std::string> base_env;
  // Port of this agent's /metrics (RegisterNodeRequest.metrics_port); 0:
  // none. The binary starts the exposer and puts the bound port here.
  int metrics_port = 0;
  // Ports given to workers as MESH_METRICS_PORT, first..last inclusive;
  // first = 0: none (workers expose no metrics).
  int worker_metrics_port_first = 0;
  int worker_metrics_port_last = 0;
  // This agent's instance marker, given to every worker as
  // MESH_AGENT_INSTANCE (agent/stray_killer.h); empty: none.
  std::string instance;
};

class Agent {
 public:
  // `launcher`, `metrics` and `strays` must outlive the Agent; null
  // `metrics` means metrics::NoopRegistry(); null `strays`: processes that
  // left their worker's group are not looked for.
  Agent(AgentConfig config, ProcessLauncher* launcher, metrics::Registry* metrics = nullptr,
        StrayKiller* strays = nullptr);
  // Calls Shutdown().
  ~Agent();

  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Starts the agent's threads and returns; registration happens in the
  // background, retried forever.
  // Possible errors: FAILED_PRECONDITION when called twice; INVALID_ARGUMENT
  // for an empty name, coordinator or work_dir, or slots < 1.
  absl::Status Start();

  // Stops every worker (SIGTERM, SIGKILL after the grace), waits for them
  // (grace + 5 s at most), ends the session and joins every thread.
  // Idempotent.
  void Shutdown();

  // Introspection for tests and logs.
  std::string session_id() const;
  int registrations() const;
  // Workers supervised now (launched, exit not yet seen).
  std::vector<v1::RunningWorker> RunningWorkers() const;

 private:
  struct Generation;
  struct JobRecord;
  struct Report;
  struct Upload;
  struct PendingOrder {
    v1::Assignment order;
    absl::Time received;
  };

  // Threads.
  void SessionLoop();
  void HeartbeatLoop();
  void OutboxLoop();
  void OrderLoop();

  // Orders.
  void Dispatch(const v1::Assignment& order);
  void ApplyLaunch(const v1::Assignment& order, absl::Time received);
  void ApplyKill(const v1::Assignment& order);
  void OnRankExit(const RankExit& exit);
  void CollectFinishedGenerations();
  // Kills what is left of each (job, generation) outside its workers'
  // process groups; call without mu_.
  void KillStrays(const std::vector<std::pair<std::string, int64_t>>& generations);

  // Logs.
  void StartUpload(const v1::Assignment& order);
  void RunUpload(const v1::Assignment& order);
  bool RankFinished(const std::string& job_id, int64_t generation, int rank) const;
  std::string GenerationDir(const std::string& job_id, int64_t generation) const;
  std::string LogPath(const std::string& job_id, int64_t generation, int rank) const;

  // Session helpers.
  void RequestReconnect(uint64_t epoch, const std::string& why);
  void EnqueueReportLocked(Report report) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ResendExitRecordsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<v1::RunningWorker> RunningWorkersLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Metrics helpers.
  void UpdateWorkerGaugesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetConnectedLocked(bool connected) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateHeartbeatAgeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A free port of the worker metrics range (marked used), or 0 when the
  // range is off or every port is held by a live worker.
  int AcquireWorkerMetricsPortLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseWorkerMetricsPortLocked(int port) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sleeps up to `duration`; returns false when the agent is stopping.
  bool SleepUnlessStopping(absl::Duration duration);
  // Registers a context so Shutdown can cancel it; unregistered by the
  // returned guard's destructor.
  class ContextGuard;

  const AgentConfig config_;
  ProcessLauncher* const launcher_;
  StrayKiller* const strays_;  // May be null.
  AgentMetrics metrics_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::NodeService::Stub> stub_;

  mutable absl::Mutex mu_;
  absl::CondVar changed_;  // any state below changed
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  // Session.
  std::string session_id_ ABSL_GUARDED_BY(mu_);
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;  // bumped by each registration
  bool session_ok_ ABSL_GUARDED_BY(mu_) = false;
  int registrations_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(5);
  absl::Duration heartbeat_timeout_ ABSL_GUARDED_BY(mu_) = absl::Seconds(30);
  grpc::ClientContext* watch_context_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::set<grpc::ClientContext*> contexts_ ABSL_GUARDED_BY(mu_);  // in flight

  // Reports waiting for acknowledgement, sent in order.
  std::deque<Report> outbox_ ABSL_GUARDED_BY(mu_);
  uint64_t next_report_id_ ABSL_GUARDED_BY(mu_) = 1;

  // Last acknowledged heartbeat or registration (the agent's start before
  // the first), for mesh_agent_heartbeat_age_seconds.
  absl::Time last_ack_ ABSL_GUARDED_BY(mu_);

  // Orders waiting for the order thread, with the time each arrived.
  std::deque<PendingOrder> orders_ ABSL_GUARDED_BY(mu_);

  // Worker metrics ports held by live workers, and where the round-robin
  // search for the next one starts.
  std::set<int> worker_ports_in_use_ ABSL_GUARDED_BY(mu_);
  int next_worker_port_ ABSL_GUARDED_BY(mu_) = 0;

  // Jobs this agent has seen, by id.
  std::map<std::string, std::unique_ptr<JobRecord>> jobs_ ABSL_GUARDED_BY(mu_);

  // Log uploads.
  std::list<std::unique_ptr<Upload>> uploads_ ABSL_GUARDED_BY(mu_);
  int active_uploads_ ABSL_GUARDED_BY(mu_) = 0;

  std::thread session_thread_;
  std::thread heartbeat_thread_;
  std::thread outbox_thread_;
  std::thread order_thread_;
};

}  // namespace mesh::agent
