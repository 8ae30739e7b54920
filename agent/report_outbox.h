// ReportOutbox: the agent's worker reports (ReportWorkersStarted,
// ReportWorkerExit) queued until the coordinator acknowledges them, and
// sent in order by one thread.
//
// A report is sent only while a session is up (SessionUp), with that
// session's id. What happens to the report at the head of the queue:
//
//   queued ──session up──▶ sending ──OK, or refused for good──▶ dropped
//     ▲                     │   │    (any code but those below; logged)
//     │   UNAVAILABLE,      │   │
//     ├── DEADLINE_EXCEEDED,┘   │ ABORTED / NOT_FOUND (session gone):
//     │   RESOURCE_EXHAUSTED,   │ on_session_error(epoch, why), then wait
//     │   CANCELLED, UNKNOWN,   │ for a session of another epoch
//     │   INTERNAL: retried     │
//     │   after a backoff       │
//     └─────────────────────────┘
//
// The backoff starts at AgentConfig.backoff_initial, doubles up to
// backoff_max and is reset by every acknowledged report. Reports are never
// dropped for a lost session: they go out again with the next one.
//
// Thread safety: thread-safe; on_session_error runs on the outbox's thread
// without the outbox's lock held, so it may call back into the outbox.
// Ownership: `client` and `config` are borrowed and must outlive the
// outbox.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/agent_config.h"
#include "agent/node_client.h"
#include "mesh/v1/job.pb.h"

namespace mesh::agent {

class ReportOutbox {
 public:
  // Called when the coordinator answered a report with a session error:
  // the session of `epoch` is broken. `why` names the call and the status.
  using SessionErrorCallback = std::function<void(uint64_t epoch, const std::string& why)>;

  ReportOutbox(const AgentConfig* config, NodeClient* client,
               SessionErrorCallback on_session_error);
  // Calls Stop().
  ~ReportOutbox();

  ReportOutbox(const ReportOutbox&) = delete;
  ReportOutbox& operator=(const ReportOutbox&) = delete;

  // Starts the sending thread. Called once.
  void Start();
  // Ends the sending thread and waits for it: a call in flight is finished
  // first (NodeClient::CancelAll ends it at once). Queued reports are kept
  // and never sent. Idempotent.
  void Stop();

  // Queue a report. name and session_id are filled at send time.
  void Enqueue(v1::ReportWorkersStartedRequest report);
  void Enqueue(v1::ReportWorkerExitRequest report);
  // Queues `report` unless an exit of the same (job, generation, rank) is
  // already queued; returns whether it queued it.
  bool EnqueueExitUnlessQueued(const v1::ReportWorkerExitRequest& report);

  // Sessions: reports go out while one is up. SessionDown for an epoch
  // other than the current one is ignored.
  void SessionUp(uint64_t epoch, const std::string& session_id);
  void SessionDown(uint64_t epoch);

  // Reports queued (not yet acknowledged or dropped).
  size_t size() const;

 private:
  // Exactly one of the two requests is set.
  struct Report {
    uint64_t id = 0;
    std::optional<v1::ReportWorkersStartedRequest> started;
    std::optional<v1::ReportWorkerExitRequest> exit;
  };

  void EnqueueLocked(Report report) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Loop();
  absl::Status Send(const Report& report, const std::string& session_id);
  // Sleeps up to `duration`; returns false when stopping.
  bool SleepUnlessStopping(absl::Duration duration);

  const AgentConfig& config_;
  NodeClient* const client_;
  const SessionErrorCallback on_session_error_;

  mutable absl::Mutex mu_;
  absl::CondVar changed_;  // the queue, the session or stopping_ changed
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<Report> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool session_up_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::string session_id_ ABSL_GUARDED_BY(mu_);

  std::thread thread_;
};

}  // namespace mesh::agent
