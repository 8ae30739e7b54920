// JobManager: the coordinator's side of submit → schedule → launch →
// supervise → report. It owns every job and node record in memory, keeps
// them durable in a JobStore, places jobs with the Scheduler, creates each
// placed job in Coordination (so its workers can rendezvous), sends orders to
// the agents, and turns their reports into state transitions.
// docs/jobs.md and docs/agent.md describe the protocol; job_state.h draws
// the state machine.
//
// A job's life, as the manager drives it:
//
//   Submit: validate (INVALID_ARGUMENT, nothing stored) → normalize → commit
//     to the store → PENDING → a scheduling pass → reply.
//   Scheduling pass (after every submit, job end, node registration or loss):
//     the Scheduler places PENDING jobs in FIFO order, gang-style. A placed
//     job goes SCHEDULED (placement committed), is created in Coordination
//     at its generation, and every node of the placement gets a LAUNCH order
//     with its ranks.
//   ReportWorkersStarted: when every rank of the generation runs → RUNNING.
//   ReportWorkerExit: exit 0 marks the rank done; when all are done →
//     SUCCEEDED. Any other end (a code, a signal, a launch error) is a
//     failure: the first one of a generation becomes the root cause, and the
//     job restarts (RESTARTING, generation + 1, KILL of the old generation
//     and, right after, LAUNCH of the new one on the same nodes, whose agents
//     apply them in order) or, with no restarts left, FAILED. Reports for an
//     older generation are accepted and ignored.
//   Node loss (no heartbeat for node_heartbeat_timeout): the node is LOST and
//     each live job on it fails as above, the node named in the cause
//     (rank -1). A restart that needs a lost node goes back to PENDING and
//     is placed again. An elastic job (nodes.min < nodes.max) with at least
//     nodes.min of its nodes left is resized instead: the same restart
//     without counting one (job_elastic.cc, docs/elastic.md).
//   Growing (spec.grow): ON_RESTART places every restart on up to
//     nodes.max nodes; AFTER restarts a job that has run that long at its
//     size onto free nodes, when no job is PENDING (Tick).
//   Rendezvous failure: Coordination fails a generation when a joined rank
//     misses its heartbeats or reports an error (a hung worker exits
//     nothing); the manager hears of it through Coordination's failure
//     listener and fails the job the same way, that rank as the root cause.
//   Cancel: CANCELLED, KILL to every node of the placement.
//   Any terminal state: KILL to every node of the placement (the agents
//     forget the job; log files stay), resources released, the job removed
//     from Coordination, waiters and watchers told.
//   Deadline (spec.deadline_seconds): FAILED, naming the deadline.
//
// Durability: every transition is committed (JobStore::UpdateJob, with the
// version the manager last wrote as its precondition) before anyone is told
// of it. Submit and Cancel reply only after their commit; when the commit
// fails they return its error and the job is as it was. A transition caused
// by an agent's report or the clock is applied in memory even when its
// commit fails (the world has already changed: a worker did exit); the
// failure is logged and counted, and the next successful write of that job
// stores its whole current state.
//
// Recovery (after a crash or restart): Recover() loads every stored job and
// node. Placed live jobs hold their nodes again at their stored generation;
// their ranks are accounted for as the agents re-register (RegisterNode) and
// report, and a rank still unaccounted node_heartbeat_timeout +
// node_recovery_grace after Recover fails its job. docs/failure-semantics.md,
// section "Job recovery protocol", describes the whole protocol.
//
// Streams (WatchJobState, GetLogs, WatchAssignments) deliver to a
// StreamSink (stream_sink.h); GetLogs goes through the manager's LogRelay
// (log_relay.h), which it calls with its mutex held. The manager calls a
// sink with its own mutex held, in order:
// Send() any number of times, then End() exactly once, after which it never
// touches the sink again. A sink must not block and must not call into the
// manager from Send/End. Its owner calls the matching Unwatch/Cancel before
// destroying it (a no-op once End has run); after that returns the manager
// never calls it again.
//
// Metrics (docs/metrics.md, "Coordinator"): jobs by state, jobs finished,
// restarts, nodes by state and each node's last heartbeat, recorded as
// they change. Service discovery: agents with a metrics port are targets
// while READY, workers with one from ReportWorkersStarted (or a
// registration's running list) until they exit, their generation ends or
// their node is lost; the file is flushed after the mutex is released.
//
// Thread safety: thread-safe; one mutex guards everything, and store commits
// happen under it (they are short: one fsync). Callbacks (WaitJob) run after
// the mutex is released and may call back in.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "coordinator/coordination.h"
#include "coordinator/job_spec.h"
#include "coordinator/job_state.h"
#include "coordinator/job_store.h"
#include "coordinator/log_relay.h"
#include "coordinator/rank_placement.h"
#include "coordinator/scheduler.h"
#include "coordinator/service_discovery.h"
#include "coordinator/stream_sink.h"
#include "mesh/v1/job.pb.h"

namespace mesh::coordinator {

struct JobManagerOptions {
  // Caps and the working-directory root applied to every submitted spec.
  JobSpecLimits spec_limits;
  SchedulerOptions scheduler;
  // Agents heartbeat this often (told at registration); a node silent for
  // the timeout is LOST.
  absl::Duration node_heartbeat_interval = absl::Seconds(2);
  absl::Duration node_heartbeat_timeout = absl::Seconds(15);
  // Node heartbeats a second the coordinator plans for from all agents
  // together: with more nodes than that many per node_heartbeat_interval,
  // each node is told a longer interval, nodes / rate, and at most a third
  // of node_heartbeat_timeout (NodeHeartbeatInterval). The RegisterNode and
  // NodeHeartbeat replies carry it, so agents that registered early follow
  // the cluster's growth. The timeout is unchanged. 0: always
  // node_heartbeat_interval.
  double node_heartbeat_rate = 2048;
  // After a restart (Recover), recovered nodes get this long on top of
  // node_heartbeat_timeout to register again before they are LOST, and so
  // do the unaccounted ranks of their jobs: right after a restart, agents
  // may take seconds to reconnect (their channels back off; a loaded host
  // retries TCP handshakes), and a job must not fail for that.
  absl::Duration node_recovery_grace = absl::Seconds(10);
  // SIGTERM → SIGKILL grace in KILL orders.
  absl::Duration kill_grace = absl::Seconds(10);
  // Cap on a WaitJob timeout (and the wait used when none is given).
  absl::Duration max_wait = absl::Hours(1);
  // A node told to upload logs must open its UploadLogs stream within this.
  // Longer than kill_grace: an agent applies orders in order, and an upload
  // queued behind a restart waits for the old workers to stop.
  absl::Duration log_attach_timeout = absl::Seconds(30);
  // Jobs waiting to be placed (PENDING) at once. A submit beyond it gets
  // RESOURCE_EXHAUSTED and stores nothing; it may succeed once jobs start
  // or end. A resubmit of a stored idempotency key is not a new job and is
  // always answered.
  int64_t max_pending_jobs = 10'000;
  // Mints the token a job's workers get in their LAUNCH order
  // (Assignment.worker_token, docs/security.md); null: no tokens (the
  // coordinator runs without token authentication).
  std::function<std::string(absl::string_view job_id)> mint_worker_token;
  // The Unix account of a job owner (the token file's unix_user and
  // allow_root), put in each LAUNCH order (Assignment.unix_user,
  // allow_root); null, or nullopt for an owner: none (an agent running as
  // root then refuses the job).
  struct UnixAccount {
    std::string unix_user;
    bool allow_root = false;
  };
  std::function<std::optional<UnixAccount>(absl::string_view owner)> unix_account;
};

// Possible errors: INVALID_ARGUMENT naming the bad field.
absl::Status ValidateJobManagerOptions(const JobManagerOptions& options);

// Stream sinks; see the file comment for the rules. LogSink and
// UploadControl (GetLogs and UploadLogs) come from log_relay.h.
using JobStateSink = StreamSink<mesh::v1::WatchJobStateResponse>;
using AssignmentSink = StreamSink<mesh::v1::Assignment>;

// Counters for metrics and tests.
struct JobManagerStats {
  int64_t jobs_submitted = 0;
  int64_t jobs_succeeded = 0;
  int64_t jobs_failed = 0;
  int64_t jobs_cancelled = 0;
  int64_t restarts = 0;
  int64_t nodes_lost = 0;
  int64_t store_failures = 0;  // Commits that failed after a transition.
  int64_t stale_reports = 0;   // Reports for an older generation or a replaced process.
};

// The heartbeat interval agents are told with `nodes` nodes known: the
// options' interval, or nodes / node_heartbeat_rate where that is longer,
// capped at a third of the timeout (never below the interval).
absl::Duration NodeHeartbeatInterval(const JobManagerOptions& options, size_t nodes);

class JobManager {
 public:
  // `clock`, `store` and `coordination` must outlive the manager.
  // `options` must pass ValidateJobManagerOptions (checked). The manager is
  // `coordination`'s failure listener until it is destroyed; destroy it only
  // once nothing drives `coordination` any more (no Tick, no RPC).
  // `metrics` (null: record nothing) and `discovery` (null: none) must
  // outlive the manager.
  JobManager(const Clock* clock, JobStore* store, Coordination* coordination,
             JobManagerOptions options, metrics::Registry* metrics = nullptr,
             ServiceDiscovery* discovery = nullptr);
  ~JobManager();

  JobManager(const JobManager&) = delete;
  JobManager& operator=(const JobManager&) = delete;

  const JobManagerOptions& options() const { return options_; }

  // Loads stored jobs and nodes; see "Recovery". Call once, before serving.
  // Possible errors: the store's (its read failed; nothing is loaded);
  // FAILED_PRECONDITION when called twice or after other calls changed
  // state; DATA_LOSS when a stored job cannot be decoded (the message names
  // it; the others are loaded).
  absl::Status Recover();

  // ---- JobService --------------------------------------------------------

  // Possible errors: INVALID_ARGUMENT naming the field (nothing stored);
  // ALREADY_EXISTS when the idempotency key names a job with a different
  // spec; RESOURCE_EXHAUSTED when max_pending_jobs jobs are PENDING
  // (nothing stored); UNAVAILABLE after Shutdown; the store's errors
  // (nothing stored). `owner` is the submitting principal's name
  // (docs/security.md; empty without token authentication); a matching
  // idempotency key of another owner's job is ALREADY_EXISTS too.
  absl::StatusOr<mesh::v1::SubmitJobResponse> Submit(mesh::v1::JobSpec spec,
                                                     std::string owner = {});

  // The owner of a job this manager holds; nullopt for any other job id
  // (ad-hoc rendezvous jobs, unknown ids). For authorization.
  std::optional<std::string> OwnerOf(absl::string_view job_id) const;

  // The job with its events. Possible errors: NOT_FOUND.
  absl::StatusOr<mesh::v1::Job> GetJob(const std::string& job_id) const;

  // Newest first, without events. Possible errors: INVALID_ARGUMENT for a
  // bad page size, page token or state.
  absl::StatusOr<mesh::v1::ListJobsResponse> ListJobs(
      const mesh::v1::ListJobsRequest& request) const;

  // Possible errors: NOT_FOUND; the store's (the job is unchanged).
  absl::StatusOr<mesh::v1::Job> Cancel(const std::string& job_id, const std::string& reason);

  // Calls `done` once with the job (with events) when it is terminal (at
  // once if it already is), or DEADLINE_EXCEEDED after `timeout` (<= 0 or
  // above max_wait: max_wait), or NOT_FOUND, or UNAVAILABLE on Shutdown.
  // `done` runs without the manager's mutex, possibly inside this call.
  void WaitJob(const std::string& job_id, absl::Duration timeout, Callback<mesh::v1::Job> done);

  // Streams the job's transitions; with `replay`, first every recorded one.
  // Ends with OK after the terminal transition (at once after the replay
  // when the job is already terminal), UNAVAILABLE on Shutdown.
  // Returns a handle for UnwatchJobState. Possible errors: NOT_FOUND.
  absl::StatusOr<uint64_t> WatchJobState(const std::string& job_id, bool replay,
                                         JobStateSink* sink);
  void UnwatchJobState(uint64_t handle);

  // Relays a GetLogs request: tells every node that holds a selected rank to
  // upload it, and passes their chunks to `sink` as they arrive. Ends with
  // OK once every selected rank has sent its eof chunk; UNAVAILABLE when a
  // node does not attach within log_attach_timeout or its upload breaks off
  // (naming the node); UNAVAILABLE on Shutdown. Returns a handle for
  // CancelLogs. Possible errors: NOT_FOUND; INVALID_ARGUMENT (a rank outside
  // the world, a negative tail, a generation < -1 or above the current);
  // FAILED_PRECONDITION when the job has never been placed; UNAVAILABLE
  // when a node holding selected ranks is not connected (naming it).
  absl::StatusOr<uint64_t> StartLogs(const mesh::v1::GetLogsRequest& request, LogSink* sink);
  // The reader went away: aborts the request's uploads.
  void CancelLogs(uint64_t handle);

  // Every node, by name.
  std::vector<mesh::v1::Node> ListNodes() const;

  // ---- NodeService --------------------------------------------------------

  // Registers (or re-registers) a node and reconciles what it runs: workers
  // of jobs no longer placed on it get KILL orders, workers of jobs placed
  // on it are accounted for. Returns a fresh session.
  // Possible errors: INVALID_ARGUMENT (empty or malformed name, slots < 1,
  // empty address, a GPU index given twice); UNAVAILABLE after Shutdown;
  // the store's.
  absl::StatusOr<mesh::v1::RegisterNodeResponse> RegisterNode(
      const mesh::v1::RegisterNodeRequest& request);

  // Returns the interval the node heartbeats at from now on
  // (NodeHeartbeatInterval for the nodes known now).
  // Possible errors: NOT_FOUND (unknown node), ABORTED (stale session).
  absl::StatusOr<absl::Duration> NodeHeartbeat(const std::string& name,
                                               const std::string& session_id);

  // The node's order stream. A newer stream for the node replaces this one
  // (which ends with ABORTED). On connect, orders not yet delivered come
  // first (LAUNCH of ranks that have not reported running, KILL of stray
  // workers found at registration). Returns a handle for
  // UnwatchAssignments. Possible errors: NOT_FOUND, ABORTED (as above),
  // UNAVAILABLE after Shutdown.
  absl::StatusOr<uint64_t> WatchAssignments(const std::string& name, const std::string& session_id,
                                            AssignmentSink* sink);
  void UnwatchAssignments(uint64_t handle);

  // Possible errors: NOT_FOUND, ABORTED (session); INVALID_ARGUMENT (a rank
  // outside the world). Stale generations and unknown jobs are accepted and
  // ignored (the agent cannot do anything else with them).
  absl::Status ReportWorkersStarted(const mesh::v1::ReportWorkersStartedRequest& request);
  absl::Status ReportWorkerExit(const mesh::v1::ReportWorkerExitRequest& request);

  // One UploadLogs call: Attach with its first message, then Chunk per
  // message, then End when the agent closes it (or the call breaks).
  // AttachUpload's errors: NOT_FOUND (node or request), ABORTED (session),
  // FAILED_PRECONDITION (the request did not ask this node). UploadChunk's:
  // CANCELLED once the request has ended (its reader went away: finish the
  // call), INVALID_ARGUMENT for a rank the request did not ask this node.
  // `control` must stay valid until UploadEnded has returned.
  absl::StatusOr<uint64_t> AttachUpload(const std::string& name, const std::string& session_id,
                                        const std::string& log_request_id, UploadControl* control);
  absl::Status UploadChunk(uint64_t upload, const mesh::v1::LogChunk& chunk);
  void UploadEnded(uint64_t upload, const absl::Status& status);

  // ---- Time and shutdown ----------------------------------------------------

  // Node loss, unaccounted ranks, job deadlines, WaitJob timeouts and log
  // attach timeouts. Call about every TickInterval().
  void Tick();
  absl::Duration TickInterval() const;

  // Node liveness allows for the coordinator's own delays, as
  // Coordination's does (server_lag.h): `lag` (not owned, may be null)
  // gives the grace added to node_heartbeat_timeout, at most another
  // node_heartbeat_timeout; a stall does not count towards any node's
  // silence.
  void SetServerLag(const ServerLag* lag);
  void ForgiveStall(absl::Duration stall);

  // Ends every stream and wait with UNAVAILABLE; later calls fail with
  // UNAVAILABLE. Idempotent.
  void Shutdown();

  JobManagerStats stats() const;

 private:
  struct Job;
  struct Node;
  struct Waiter;
  class Effects;
  struct Metrics {
    explicit Metrics(metrics::Registry& registry);
    metrics::Family<metrics::Gauge>* jobs;
    metrics::Family<metrics::Counter>* finished;
    metrics::Counter* restarts;
    metrics::Counter* in_place_recoveries;
    metrics::Counter* shrinks;
    metrics::Counter* grows;
    metrics::Gauge* nodes_ready;
    metrics::Gauge* nodes_lost;
    metrics::Family<metrics::Gauge>* node_heartbeat;
  };

  // Moves the job's count in mesh_coordinator_jobs to its current state.
  void CountJobLocked(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Recounts mesh_coordinator_nodes (nodes are few; called on changes).
  void CountNodesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A heartbeat (or any call) from `node` at `now`.
  void SeenLocked(Node& node, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Flushes the service-discovery file after unlock.
  void FlushDiscoveryLater(Effects& effects);

  // Coordination's failure listener.
  void GenerationFailed(const std::string& job_id, const JobError& error);
  struct ListenerToken {
    absl::Mutex mu;
    JobManager* manager ABSL_GUARDED_BY(mu) = nullptr;
  };
  std::shared_ptr<ListenerToken> listener_token_;

  mesh::v1::Assignment KillOrder(const std::string& job_id, int64_t generation,
                                 const std::string& reason) const;
  JobUpdate UpdateOfLocked(const Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeStartLocked(Job& job, Effects& effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Job* FindJobLocked(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const Job* FindJobLocked(const std::string& job_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Node*> SessionNodeLocked(const std::string& name, const std::string& session_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  mesh::v1::Job JobProtoLocked(const Job& job, bool with_events) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status PersistLocked(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AfterTransitionLocked(Job& job, Effects& effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ScheduleLocked(Effects& effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LaunchLocked(Job& job, Effects& effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendLaunchLocked(Job& job, Node& node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendKillLocked(const Job& job, const std::string& node, int64_t generation,
                      const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendLocked(Node& node, const mesh::v1::Assignment& order) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `no_restart`: a reason to fail the job even with restarts left.
  void FailJobLocked(Job& job, mesh::v1::RootCause cause, Effects& effects,
                     absl::string_view no_restart = "") ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishJobLocked(Job& job, Effects& effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A worker of `job` on `node` failed as `cause` says (`launch_error`: it
  // could not be started). With restart_policy IN_PLACE, the job RUNNING,
  // restarts left and Coordination agreeing that the others can carry on
  // (LoseRankInPlace), relaunches the rank alone at the same generation (a
  // replace LAUNCH), counts a restart and returns true; not once another
  // rank has exited 0 (it would not rebuild with the new process). A report
  // for a rank
  // being relaunched already, other than a launch error, is a duplicate:
  // true, and nothing changes. Else changes nothing and returns false: fail
  // the job as usual.
  bool RecoverInPlaceLocked(Job& job, Node& node, const mesh::v1::RootCause& cause,
                            bool launch_error, Effects& effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The relaunch of `ranks` of a RUNNING IN_PLACE job on `node` once
  // Coordination lost them: counts the restart (RecoverInPlace with
  // `cause`, the metrics), stores and publishes the job, marks the ranks
  // launching with InPlaceStartTimeout to report them started, and sends
  // the node its LAUNCH.
  void RelaunchInPlaceLocked(Job& job, mesh::v1::RootCause cause, const std::vector<int>& ranks,
                             Node& node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // How long an agent has to report a rank relaunched in place as started
  // before the job restarts as a whole: its kill grace (what the replaced
  // process left is killed first) plus a node heartbeat timeout.
  absl::Duration InPlaceStartTimeout() const {
    return options_.kill_grace + options_.node_heartbeat_timeout;
  }
  // The restart of a job whose machine has just entered RESTARTING (its
  // generation bumped): kills the old generation, then relaunches on the
  // same nodes or places the job again (up to NodeCapLocked nodes).
  void RelaunchLocked(Job& job, const std::string& why, Effects& effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Elastic membership (job_elastic.cc; docs/elastic.md). A node of `job`
  // was lost: a job that recovers in place moves the node's ranks to a free
  // node (ReplaceLostNodeInPlaceLocked) when it can; else an elastic job
  // with at least nodes.min of its nodes left resizes without counting a
  // restart; any other job fails as for a worker failure.
  void NodeOfJobLostLocked(Job& job, mesh::v1::RootCause cause, Effects& effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // With restart_policy IN_PLACE, the job RUNNING, restarts left, no rank
  // exited 0, no other node of the job lost, a replica along in_place_dim
  // left whole, and a READY node outside the job (and not one that left its
  // generation) with room for the lost node's ranks: Coordination loses
  // those ranks in place (LoseRankInPlace, once the world has formed), the
  // placement moves them to that node (the lost node's place, node rank and
  // local ranks), a restart is counted and the node gets a LAUNCH of the
  // running generation for them; the others carry on. Returns true then;
  // else returns false: restart the job as a whole. (A rank Coordination
  // refuses to lose after others were lost also returns false.)
  bool ReplaceLostNodeInPlaceLocked(Job& job, const mesh::v1::RootCause& cause, Effects& effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The most nodes the job's next placement may take under spec.grow.
  int NodeCapLocked(const Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `job` now has `placement`. When that changes its node count, records a
  // resize and returns a line for the event ("resized from 4 to 3 nodes:
  // ..."); else "".
  std::string PlacedLocked(Job& job, Placement placement) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tick's part: RUNNING jobs with grow AFTER take free nodes.
  void GrowJobsLocked(absl::Time now, Effects& effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<NodeView> NodeViewsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  JobRequest RequestOfLocked(const Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NodeLostLocked(Node& node, const std::string& why, Effects& effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tick's parts: silent nodes are lost; late WaitJob calls time out.
  void ExpireSilentNodesLocked(absl::Time now, Effects& effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireWaitersLocked(absl::Time now, Effects& effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NotifyWatchersLocked(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Clock* const clock_;
  JobStore* const store_;
  Coordination* const coordination_;
  const JobManagerOptions options_;
  const Metrics metrics_;
  ServiceDiscovery* const discovery_;  // May be null.

  mutable absl::Mutex mu_;
  const ServerLag* server_lag_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  bool recovered_or_used_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::unique_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<Node>> nodes_ ABSL_GUARDED_BY(mu_);
  Scheduler scheduler_ ABSL_GUARDED_BY(mu_);
  uint64_t next_handle_ ABSL_GUARDED_BY(mu_) = 1;
  // Handles of streams and waits, to find their owner.
  std::map<uint64_t, std::string> state_watch_jobs_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::string> assignment_streams_ ABSL_GUARDED_BY(mu_);
  // GetLogs requests and the agents' uploads for them.
  LogRelay log_relay_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::unique_ptr<Waiter>> waiters_ ABSL_GUARDED_BY(mu_);
  JobManagerStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mesh::coordinator
