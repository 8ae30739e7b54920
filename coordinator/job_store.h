// JobStore: the coordinator's durable state — jobs, their events and node
// records — behind one interface with two backends (docs/persistence.md):
//
//   SqliteJobStore  one SQLite file (coordinator/sqlite_job_store.h), the
//                   embedded default;
//   EtcdJobStore    an etcd v3 cluster under a key prefix
//                   (coordinator/etcd_job_store.h), for coordinator replicas
//                   (docs/ha.md).
//
// OpenJobStore (coordinator/store_url.h) picks one from a --store URL. Both
// pass one conformance suite (tests/coordinator/job_store_conformance_test.cc),
// which holds them to what this header promises:
//
// Durable before acknowledged: a mutating call returns only after its
// change is durable (SQLite: the WAL is fsynced; etcd: a quorum of members
// has it in their logs). A failed mutation has changed nothing.
//
// The store knows nothing of the job proto. A job's spec, root cause and
// placement are opaque bytes, and its state is an opaque string ("PENDING",
// "RUNNING", ...) that the owner's state machine validates; the store
// indexes and compares it, nothing more. Likewise a node's state and labels.
//
// Ids: CreateJob names jobs "job-<n>", n = 1, 2, ... from a counter committed
// together with the job, so an acknowledged id is never handed out again,
// across restarts and crashes alike.
//
// Events: every job mutation appends one event together with it. A job's
// events are numbered seq = 1, 2, ...; seq equals the job's `version` after
// the mutation that wrote it (CreateJob writes seq 1).
//
// Error contract, common to every call and backend:
//   UNAVAILABLE          the store cannot be reached or cannot commit now
//                        (SQLite: locked past the busy timeout; etcd: no
//                        member answers, or no quorum); retry. For an etcd
//                        write that got no answer in time, whether it took
//                        effect is unknown (the message says so; the next
//                        read tells, and an idempotency key makes a retried
//                        CreateJob safe).
//   DATA_LOSS            the stored data is corrupt or not a Mesh store.
//   RESOURCE_EXHAUSTED   the disk (SQLite) or the backend's quota (etcd) is
//                        full, or a record is larger than the backend takes.
//   FAILED_PRECONDITION  the store cannot be opened or written (permissions,
//                        a missing directory, a schema from a newer
//                        version, this replica no longer leads).
//   INTERNAL             any other failure of the backend.
// Messages name the store (Describe()) and carry the backend's own message.
//
// Thread safety: every method of every backend is thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics.h"

namespace mesh::coordinator {

// One stored job.
struct JobRecord {
  std::string id;               // "job-<n>".
  std::string idempotency_key;  // Empty: none.
  std::string name;
  std::string state;
  std::string pending_reason;
  int64_t generation = 0;
  int64_t restarts = 0;
  std::string spec;        // Opaque bytes.
  std::string root_cause;  // Opaque bytes; empty: none.
  std::string placement;   // Opaque bytes; empty: none.
  std::string owner;       // Who submitted it; empty: unauthenticated.
  std::string resizes;     // Opaque bytes; empty: none.
  // 1 at creation; +1 on every UpdateJob. The optimistic-concurrency token.
  int64_t version = 0;
  // Stored to the microsecond.
  absl::Time created_at;
  absl::Time updated_at;
};

struct NewJob {
  // Non-empty: a second CreateJob with the same key creates nothing and
  // returns the first job.
  std::string idempotency_key;
  std::string name;
  std::string state;  // The initial state; must not be empty.
  std::string pending_reason;
  std::string spec;
  std::string owner;               // The submitting principal's name; empty: none.
  std::string reason = "created";  // The first event's reason.
};

struct CreateJobResult {
  JobRecord job;
  // True when the idempotency key named an existing job, which is returned
  // unchanged. The caller decides whether its spec matches the request's.
  bool existed = false;
};

// The fields UpdateJob changes (unset: unchanged), and its preconditions.
struct JobUpdate {
  // Preconditions, checked atomically with the write: a mismatch is ABORTED.
  std::optional<std::string> expected_state;
  std::optional<int64_t> expected_version;

  std::optional<std::string> state;
  std::optional<std::string> pending_reason;
  std::optional<int64_t> generation;
  std::optional<int64_t> restarts;
  std::optional<std::string> root_cause;
  std::optional<std::string> placement;
  std::optional<std::string> resizes;

  std::string reason;  // The event's reason.
};

struct JobEvent {
  std::string job_id;
  int64_t seq = 0;
  absl::Time time;
  std::string from_state;  // Empty for the creation event.
  std::string to_state;    // Equal to from_state when the state did not change.
  std::string reason;
  int64_t generation = 0;  // The job's generation after the event.
};

// Paging is by creation number, so concurrent writes never make a job show
// up twice or shift a page; a job whose state changes between pages is
// filtered by its state when its page is read.
struct JobQuery {
  // Only jobs in one of these states; empty: every state.
  std::vector<std::string> states;
  // From a previous page's next_page_token; empty: the first page.
  std::string page_token;
  // 0: kDefaultPageSize. At most kMaxPageSize.
  int limit = 0;
};

struct JobPage {
  std::vector<JobRecord> jobs;  // In creation order.
  std::string next_page_token;  // Empty on the last page.
};

struct NodeRecord {
  std::string name;
  std::string address;
  int64_t slots = 0;
  int64_t gpus = 0;
  std::string state;
  absl::Time last_seen;  // Stored to the microsecond.
  std::string labels;    // Opaque bytes.
};

// Commit latency, for metrics: every write's commit (SQLite: the COMMIT,
// where the WAL is synced; etcd: the Txn round trip).
struct JobStoreStats {
  int64_t commits = 0;
  int64_t failed_commits = 0;
  double commit_seconds_total = 0;
  double last_commit_seconds = 0;
};

class JobStore {
 public:
  static constexpr int kDefaultPageSize = 100;
  static constexpr int kMaxPageSize = 1000;

  virtual ~JobStore() = default;
  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  // What the store is, for logs and messages: the SQLite file's path, or
  // etcd://<endpoints>/<prefix>.
  virtual std::string Describe() const = 0;

  // ---- Jobs -------------------------------------------------------------

  // Stores a new job, version 1, with its first event (from "" to `state`),
  // atomically. With an idempotency key already in use, returns that job
  // with existed = true and writes nothing.
  // Possible errors: INVALID_ARGUMENT (empty state); the common errors.
  virtual absl::StatusOr<CreateJobResult> CreateJob(const NewJob& job) = 0;

  // Possible errors: NOT_FOUND; the common errors.
  virtual absl::StatusOr<JobRecord> GetJob(const std::string& id) const = 0;

  // Possible errors: INVALID_ARGUMENT (a limit outside 0..kMaxPageSize, a
  // malformed page token); the common errors.
  virtual absl::StatusOr<JobPage> ListJobs(const JobQuery& query) const = 0;

  // Applies `update`, bumps the version and appends one event, atomically;
  // returns the job as stored.
  // Possible errors: NOT_FOUND; ABORTED when the job's state or version is
  // not the expected one (the message gives both; nothing is written);
  // INVALID_ARGUMENT (an empty new state); the common errors.
  virtual absl::StatusOr<JobRecord> UpdateJob(const std::string& id, const JobUpdate& update) = 0;

  // The job's events in seq order.
  // Possible errors: NOT_FOUND (unknown job); the common errors.
  virtual absl::StatusOr<std::vector<JobEvent>> ListEvents(const std::string& id) const = 0;

  // ---- Nodes ------------------------------------------------------------

  // Inserts the node or replaces every field of the one with its name.
  // Possible errors: INVALID_ARGUMENT (empty name or state, negative slots
  // or GPUs); the common errors.
  virtual absl::Status UpsertNode(const NodeRecord& node) = 0;

  // Possible errors: NOT_FOUND; the common errors.
  virtual absl::StatusOr<NodeRecord> GetNode(const std::string& name) const = 0;

  // Every node, ordered by name.
  virtual absl::StatusOr<std::vector<NodeRecord>> ListNodes() const = 0;

  // Sets the node's state; nothing else changes.
  // Possible errors: NOT_FOUND; INVALID_ARGUMENT (empty state); the common
  // errors.
  virtual absl::Status MarkNode(const std::string& name, const std::string& state) = 0;

  // ---- Metrics ----------------------------------------------------------

  JobStoreStats stats() const;

  // Records every later commit in mesh_coordinator_store_commit_duration_
  // seconds and failed ones in mesh_coordinator_store_commit_failures_total
  // (docs/metrics.md). `registry` must outlive the store. Call once.
  void SetMetrics(metrics::Registry* registry);

 protected:
  JobStore() = default;

  // For the backends: counts one commit that took `elapsed`.
  void RecordCommit(absl::Duration elapsed, bool ok);

 private:
  mutable absl::Mutex stats_mu_;
  JobStoreStats stats_ ABSL_GUARDED_BY(stats_mu_);
  metrics::Histogram* commit_duration_ ABSL_GUARDED_BY(stats_mu_) = nullptr;
  metrics::Counter* commit_failures_ ABSL_GUARDED_BY(stats_mu_) = nullptr;
};

// ---- What the backends share ----------------------------------------------
// The argument checks and the record arithmetic every backend applies the
// same way, so that they give the same answers and messages.
namespace job_store {

// INVALID_ARGUMENT for a job without a state.
absl::Status CheckNewJob(const NewJob& job);
// INVALID_ARGUMENT for an update to an empty state.
absl::Status CheckUpdate(const std::string& id, const JobUpdate& update);
// INVALID_ARGUMENT for a node without a name or state, or with negative
// slots or GPUs.
absl::Status CheckNode(const NodeRecord& node);
// INVALID_ARGUMENT for an empty state.
absl::Status CheckNodeState(const std::string& name, const std::string& state);

// A ListJobs page's window: jobs numbered above `after`, at most `limit`.
struct PageWindow {
  int64_t after = 0;
  int limit = 0;
};
// Possible errors: INVALID_ARGUMENT (a limit outside 0..kMaxPageSize, a
// malformed page token).
absl::StatusOr<PageWindow> ParsePage(const JobQuery& query);
// The next_page_token of a page whose last job has creation number `number`.
std::string PageToken(int64_t number);

// "job-<number>"; and back (nullopt for anything else).
std::string JobId(int64_t number);
std::optional<int64_t> JobNumber(const std::string& id);

// The new record: `update` applied to `job` at `now` (rounded to the
// microsecond), its version bumped, and the event that records it.
// Possible errors: ABORTED when a precondition of `update` fails (nothing
// is changed).
absl::Status ApplyUpdate(const JobUpdate& update, absl::Time now, JobRecord* job, JobEvent* event);

// The record CreateJob stores for `job` as job-<number>: version 1,
// created and updated at `now` (rounded to the microsecond).
JobRecord NewJobRecord(const NewJob& job, int64_t number, absl::Time now);

// `time` truncated to whole microseconds, as the stores keep it.
absl::Time ToMicros(absl::Time time);

}  // namespace job_store
}  // namespace mesh::coordinator
