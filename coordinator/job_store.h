// JobStore: the coordinator's durable state — jobs, their events and node
// records — in one SQLite file (docs/architecture.md decision 6, "durable before
// acknowledged"). See docs/persistence.md.
//
// Every mutating call returns only after its transaction has committed, and
// the database runs with journal_mode=WAL and synchronous=FULL: in WAL mode,
// synchronous=NORMAL syncs the log only at checkpoints, so a power loss can
// take back the last commits, which the coordinator has already acknowledged.
// FULL syncs the log on every commit, so a returned call is on disk.
//
// The store knows nothing of the job proto. A job's spec and root cause are
// opaque bytes (a serialized mesh.v1.JobSpec and its root-cause message), and
// its state is an opaque string ("PENDING", "RUNNING", ...) that the owner's
// state machine validates; the store indexes and compares it, nothing more.
// Likewise a node's state and labels.
//
// Ids: CreateJob names jobs "job-<n>", n = 1, 2, ... from a counter committed
// in the same transaction as the job, so an acknowledged id is never handed
// out again, across restarts and crashes alike.
//
// Events: every job mutation appends one event in the same transaction. A
// job's events are numbered seq = 1, 2, ...; seq equals the job's `version`
// after the mutation that wrote it (CreateJob writes seq 1).
//
// Error contract, common to every call:
//   UNAVAILABLE          the database stayed locked by another connection
//                        for longer than the busy timeout; retry.
//   DATA_LOSS            SQLite found the file corrupt, or not a database.
//   RESOURCE_EXHAUSTED   the disk is full.
//   FAILED_PRECONDITION  the file cannot be opened or written (read-only,
//                        permissions, a missing directory).
//   INTERNAL             any other SQLite failure.
// Messages name the file and carry SQLite's own message. A failed mutation
// has changed nothing.
//
// Thread safety: all methods are thread-safe. One SQLite connection serves
// every call, serialized by one mutex; a call holds it through its commit
// (including the fsync), so writes are serialized, which SQLite requires
// anyway.
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
#include "common/clock.h"
#include "common/metrics.h"

struct sqlite3;

namespace mesh::coordinator {

struct JobStoreOptions {
  // How long a call waits for a lock held by another connection (a backup,
  // the sqlite3 shell) before it fails with UNAVAILABLE.
  absl::Duration busy_timeout = absl::Seconds(5);
};

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
  std::string placement;   // Opaque bytes; empty: none (schema 2).
  std::string owner;       // Who submitted it; empty: unauthenticated (schema 3).
  // 1 at creation; +1 on every UpdateJob. The optimistic-concurrency token.
  int64_t version = 0;
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
  // Preconditions, checked in the transaction: a mismatch is ABORTED.
  std::optional<std::string> expected_state;
  std::optional<int64_t> expected_version;

  std::optional<std::string> state;
  std::optional<std::string> pending_reason;
  std::optional<int64_t> generation;
  std::optional<int64_t> restarts;
  std::optional<std::string> root_cause;
  std::optional<std::string> placement;

  std::string reason;  // The event's reason.
};

struct JobEvent {
  std::string job_id;
  int64_t seq = 0;
  absl::Time time;
  std::string from_state;  // Empty for the creation event.
  std::string to_state;    // Equal to from_state when the state did not change.
  std::string reason;
  int64_t generation = 0;  // The job's generation after the event (schema 2).
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
  absl::Time last_seen;
  std::string labels;  // Opaque bytes.
};

// Commit latency, for metrics. Covers the COMMIT statement of every write
// transaction, which is where the WAL is synced.
struct JobStoreStats {
  int64_t commits = 0;
  int64_t failed_commits = 0;
  double commit_seconds_total = 0;
  double last_commit_seconds = 0;
};

class JobStore {
 public:
  // The schema this build writes. Open migrates older files up to it.
  static constexpr int kSchemaVersion = 3;
  static constexpr int kDefaultPageSize = 100;
  static constexpr int kMaxPageSize = 1000;

  // Opens (creating if absent) the database at `path`, or a private
  // in-memory one for ":memory:" (no WAL, nothing durable: tests only).
  // Migrates the schema to kSchemaVersion. `clock` stamps records and events
  // and must outlive the store.
  // Possible errors: FAILED_PRECONDITION when the file has a schema newer
  // than kSchemaVersion (written by a newer coordinator), when WAL cannot be
  // enabled, or when the file cannot be opened (missing directory,
  // permissions); DATA_LOSS for a corrupt file or one that is not a SQLite
  // database; the common errors.
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& path, const Clock* clock,
                                                        JobStoreOptions options = {});

  ~JobStore();
  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  const std::string& path() const { return path_; }

  // ---- Jobs -------------------------------------------------------------

  // Stores a new job, version 1, with its first event (from "" to `state`),
  // atomically. With an idempotency key already in use, returns that job
  // with existed = true and writes nothing.
  // Possible errors: INVALID_ARGUMENT (empty state); the common errors.
  absl::StatusOr<CreateJobResult> CreateJob(const NewJob& job);

  // Possible errors: NOT_FOUND; the common errors.
  absl::StatusOr<JobRecord> GetJob(const std::string& id) const;

  // Possible errors: INVALID_ARGUMENT (a limit outside 0..kMaxPageSize, a
  // malformed page token); the common errors.
  absl::StatusOr<JobPage> ListJobs(const JobQuery& query) const;

  // Applies `update`, bumps the version and appends one event, in one
  // transaction; returns the job as stored.
  // Possible errors: NOT_FOUND; ABORTED when the job's state or version is
  // not the expected one (the message gives both; nothing is written);
  // INVALID_ARGUMENT (an empty new state); the common errors.
  absl::StatusOr<JobRecord> UpdateJob(const std::string& id, const JobUpdate& update);

  // The job's events in seq order.
  // Possible errors: NOT_FOUND (unknown job); the common errors.
  absl::StatusOr<std::vector<JobEvent>> ListEvents(const std::string& id) const;

  // ---- Nodes ------------------------------------------------------------

  // Inserts the node or replaces every field of the one with its name.
  // Possible errors: INVALID_ARGUMENT (empty name or state, negative slots
  // or GPUs); the common errors.
  absl::Status UpsertNode(const NodeRecord& node);

  // Possible errors: NOT_FOUND; the common errors.
  absl::StatusOr<NodeRecord> GetNode(const std::string& name) const;

  // Every node, ordered by name.
  absl::StatusOr<std::vector<NodeRecord>> ListNodes() const;

  // Sets the node's state; nothing else changes.
  // Possible errors: NOT_FOUND; INVALID_ARGUMENT (empty state); the common
  // errors.
  absl::Status MarkNode(const std::string& name, const std::string& state);

  JobStoreStats stats() const;

  // Records every later commit in mesh_coordinator_store_commit_duration_
  // seconds and failed ones in mesh_coordinator_store_commit_failures_total
  // (docs/metrics.md). `registry` must outlive the store. Call once.
  void SetMetrics(metrics::Registry* registry);

 private:
  class Statement;
  class Transaction;

  JobStore(std::string path, sqlite3* db, const Clock* clock);

  // Configures the connection and migrates the schema; called once by Open.
  absl::Status Init(const JobStoreOptions& options);
  // A Status for SQLite result `rc`, naming the file and `what` was done.
  absl::Status Error(int rc, const std::string& what) const;
  absl::Status ExecLocked(const char* sql) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<JobRecord> GetJobLocked(const std::string& id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status AppendEventLocked(const JobEvent& event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const Clock* const clock_;

  mutable absl::Mutex mu_;
  // Owned; closed by the destructor. Used only with mu_ held, except by Open
  // before the store is shared. (The pointer never changes, so it is not
  // annotated: the annotation would guard the pointer, not the connection.)
  sqlite3* const db_;
  JobStoreStats stats_ ABSL_GUARDED_BY(mu_);
  metrics::Histogram* commit_duration_ ABSL_GUARDED_BY(mu_) = nullptr;
  metrics::Counter* commit_failures_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace mesh::coordinator
