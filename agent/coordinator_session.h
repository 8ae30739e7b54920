// CoordinatorSession: the agent's registration with the coordinator's
// NodeService, kept alive by heartbeats, carrying the WatchAssignments
// stream of orders, and renewed with backoff whenever it breaks.
//
// One session = one successful RegisterNode; each gets a new epoch.
//
//   ┌──▶ REGISTERING ──ok──▶ CONNECTED (heartbeats, orders)
//   │        │ error                │ stream ends, RequestReconnect (an RPC
//   │        ▼                      │ got ABORTED / NOT_FOUND), or no
//   └── backoff (backoff_initial    │ heartbeat succeeded for the
//       doubling to backoff_max,    │ heartbeat_timeout
//       +-20% jitter) ◀─────────────┘
//
// The backoff is reset once a session lasted 5 s or delivered an order.
// Heartbeats go every heartbeat_interval of the RegisterNodeResponse (5 s
// when it gives none), or of the latest NodeHeartbeatResponse that gives
// one (the coordinator lengthens it as the cluster grows), within +-10%;
// a session's first beat comes at a random point of its first interval, so
// agents that registered together do not beat together. Each call gets at
// most an interval (and the RPC timeout), and after a failed one the next
// comes within a second. A heartbeat answered ABORTED or NOT_FOUND, or none
// acknowledged for heartbeat_timeout (3 intervals when none is given),
// ends the session.
//
// Metrics: mesh_agent_connected and mesh_agent_heartbeat_age_seconds (the
// time since the last acknowledged heartbeat or registration; the start
// before the first), kept current at least once a second.
//
// Thread safety: thread-safe. The callbacks run on the session's threads:
// running_workers, on_up and on_order without the session's lock (they may
// call session_id() or RequestReconnect); on_down with it held (it must not
// call back into the session). Ownership: `config`, `client` and `metrics`
// are borrowed and must outlive the session.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/agent_config.h"
#include "agent/agent_metrics.h"
#include "agent/node_client.h"
#include "mesh/v1/job.pb.h"

namespace mesh::agent {

class CoordinatorSession {
 public:
  struct Callbacks {
    // The workers still supervised, listed in each RegisterNodeRequest.
    std::function<std::vector<v1::RunningWorker>()> running_workers;
    // A registration succeeded: the session of `epoch` is about to be
    // announced. Called before any heartbeat, order or on_down of it.
    std::function<void(uint64_t epoch, const std::string& session_id)> on_up;
    // The session of `epoch` is over (stream ended, RequestReconnect, Stop).
    std::function<void(uint64_t epoch)> on_down;
    // Each order of the stream, in stream order, on the session's thread.
    std::function<void(const v1::Assignment& order)> on_order;
  };

  CoordinatorSession(const AgentConfig* config, NodeClient* client, AgentMetrics* metrics,
                     Callbacks callbacks);
  // Calls Stop().
  ~CoordinatorSession();

  CoordinatorSession(const CoordinatorSession&) = delete;
  CoordinatorSession& operator=(const CoordinatorSession&) = delete;

  // Starts registering (retried forever) and heartbeating. Called once.
  void Start();
  // Ends the stream and waits for the session's threads: a call in flight
  // is finished first (NodeClient::CancelAll ends it at once). Idempotent.
  void Stop();

  // Ends the session of `epoch` and registers again; a no-op when that
  // session has already ended. While on_up announces `epoch` (a report sent
  // at once can find the session stale), the session ends as soon as it is
  // up. `why` is logged.
  void RequestReconnect(uint64_t epoch, const std::string& why);

  // The current (or last) session's id; empty before the first.
  std::string session_id() const;
  // Successful registrations so far.
  int registrations() const;

 private:
  void SessionLoop();
  void HeartbeatLoop();
  v1::RegisterNodeRequest MakeRegisterRequest();
  // Ends the session of `epoch` if it is the current one.
  void EndSessionLocked(uint64_t epoch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateHeartbeatAgeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sleeps up to `duration`; returns false when stopping.
  bool SleepUnlessStopping(absl::Duration duration);

  const AgentConfig& config_;
  NodeClient* const client_;
  AgentMetrics* const metrics_;
  const Callbacks callbacks_;

  mutable absl::Mutex mu_;
  absl::CondVar changed_;  // any state below changed
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::string session_id_ ABSL_GUARDED_BY(mu_);
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;  // bumped by each registration
  bool session_ok_ ABSL_GUARDED_BY(mu_) = false;
  // on_up of epoch_ + 1 is running, and why that session was found broken
  // meanwhile (RequestReconnect of it), if it was.
  bool announcing_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<std::string> broken_while_announced_ ABSL_GUARDED_BY(mu_);
  int registrations_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(5);
  absl::Duration heartbeat_timeout_ ABSL_GUARDED_BY(mu_) = absl::Seconds(30);
  // The open WatchAssignments stream, so that a broken session can end it.
  AssignmentStream* watch_ ABSL_GUARDED_BY(mu_) = nullptr;
  // Last acknowledged heartbeat or registration (Start before the first).
  absl::Time last_ack_ ABSL_GUARDED_BY(mu_);

  std::thread session_thread_;
  std::thread heartbeat_thread_;
};

}  // namespace mesh::agent
