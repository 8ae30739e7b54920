// Agent: one mesh-agent's logic. It registers its node with the
// coordinator's NodeService (protos/mesh/v1/job.proto), heartbeats, applies
// the orders of its WatchAssignments stream (launch, kill, upload logs),
// supervises the workers through a ProcessLauncher, and reports their starts
// and exits. docs/agent.md describes the behaviour for operators.
//
// The Agent composes one part per concern and owns the thread that applies
// orders:
//
//   NodeClient          agent/node_client.h     the calls to the coordinator
//   CoordinatorSession  agent/coordinator_session.h
//                                               register, heartbeat, watch,
//                                               re-register with backoff
//   ReportOutbox        agent/report_outbox.h   started/exit reports until
//                                               acknowledged
//   OrderApplier        agent/order_applier.h   LAUNCH and KILL onto
//                                               WorkerSupervisors
//   LogUploader         agent/log_uploader.h    UPLOAD_LOGS
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
// Orders: the session's thread queues LAUNCH, KILL and UPLOAD_LOGS in
// stream order; one long-lived thread takes them in that order and hands
// LAUNCH and KILL to the OrderApplier (so it is also the thread that calls
// ProcessLauncher::Launch: PR_SET_PDEATHSIG is per thread) and UPLOAD_LOGS
// to the LogUploader (ordered the same way, so it finds the log files of a
// LAUNCH just before it; the upload then runs on its own bounded thread).
// At least once a second it also collects stopped generations whose
// workers have all exited.
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
// Thread safety: Start and Shutdown from one thread; the accessors from any
// thread once Start has returned (before it, from the thread that calls
// Start); everything else is internal. Ownership: the launcher, the
// registry and the stray killer are borrowed and must outlive the Agent; a
// NodeClient given to the constructor is owned.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/agent_config.h"
#include "agent/agent_metrics.h"
#include "agent/coordinator_session.h"
#include "agent/log_uploader.h"
#include "agent/node_client.h"
#include "agent/order_applier.h"
#include "agent/process_launcher.h"
#include "agent/rank_relay.h"
#include "agent/report_outbox.h"
#include "agent/stray_killer.h"
#include "common/metrics.h"
#include "mesh/v1/job.pb.h"

namespace mesh::agent {

class Agent {
 public:
  // Talks to config.coordinator over gRPC (agent/grpc_node_client.h; the
  // channel is made by Start). `launcher`, `metrics` and `strays` must
  // outlive the Agent; null `metrics` means metrics::NoopRegistry(); null
  // `strays`: processes that left their worker's group are not looked for.
  // `isolation` (may be null: workers run as the agent, in no cgroup of
  // their own) must outlive the Agent too.
  Agent(AgentConfig config, ProcessLauncher* launcher, metrics::Registry* metrics = nullptr,
        StrayKiller* strays = nullptr, const JobIsolation* isolation = nullptr);
  // Talks to the coordinator through `client` (not null) instead, for
  // tests; config.coordinator is then only each worker's MESH_COORDINATOR.
  Agent(AgentConfig config, std::unique_ptr<NodeClient> client, ProcessLauncher* launcher,
        metrics::Registry* metrics = nullptr, StrayKiller* strays = nullptr,
        const JobIsolation* isolation = nullptr);
  // Calls Shutdown().
  ~Agent();

  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Starts the agent's threads and returns; registration happens in the
  // background, retried forever.
  // Possible errors: FAILED_PRECONDITION when called twice; INVALID_ARGUMENT
  // for an empty name, coordinator or work_dir, slots < 1, a metrics port
  // outside 0..65535 or a worker metrics port range that is not one; the
  // errors of security::ValidateClientSecurity and, without a client given
  // to the constructor, of security::MakeChannel.
  absl::Status Start();

  // Stops every worker (SIGTERM, SIGKILL after the grace), waits for them
  // (grace + 5 s at most), ends the session and joins every thread.
  // Idempotent.
  void Shutdown();

  // Introspection for tests and logs; empty (0) before Start.
  std::string session_id() const;
  int registrations() const;
  // Workers supervised now (launched, exit not yet seen).
  std::vector<v1::RunningWorker> RunningWorkers() const;

 private:
  struct PendingOrder {
    v1::Assignment order;
    absl::Time received;
  };

  // CoordinatorSession callbacks.
  void OnSessionUp(uint64_t epoch, const std::string& session_id);
  void Dispatch(const v1::Assignment& order);
  // The order thread.
  void OrderLoop();

  const AgentConfig config_;
  ProcessLauncher* const launcher_;
  StrayKiller* const strays_;            // May be null.
  const JobIsolation* const isolation_;  // May be null.
  AgentMetrics metrics_;

  // The parts, in dependency order (each uses only those above it). The
  // client is given to the constructor or made by Start; the others are
  // made by Start and never reset. Shutdown cancels the client's calls,
  // then stops the order thread, the session, the outbox, the uploads and
  // last the workers.
  std::unique_ptr<NodeClient> client_;
  // Made by Start when config.rank_relay is on (null if it could not listen
  // at the default place); outlives the applier, which registers each
  // generation with it.
  std::unique_ptr<RankRelay> relay_;
  std::unique_ptr<ReportOutbox> outbox_;
  std::unique_ptr<OrderApplier> applier_;
  std::unique_ptr<CoordinatorSession> session_;
  std::unique_ptr<LogUploader> uploader_;

  mutable absl::Mutex mu_;
  absl::CondVar orders_changed_;  // orders_ or stopping_ changed
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // A stopped generation's workers have all exited: collect it now.
  bool collect_now_ ABSL_GUARDED_BY(mu_) = false;
  // Orders waiting for the order thread, with the time each arrived.
  std::deque<PendingOrder> orders_ ABSL_GUARDED_BY(mu_);

  std::thread order_thread_;
};

}  // namespace mesh::agent
