// SqliteJobStore: the JobStore (coordinator/job_store.h) in one SQLite file,
// the coordinator's embedded default (docs/persistence.md).
//
// Every mutating call returns only after its transaction has committed, and
// the database runs with journal_mode=WAL and synchronous=FULL: in WAL mode,
// synchronous=NORMAL syncs the log only at checkpoints, so a power loss can
// take back the last commits, which the coordinator has already acknowledged.
// FULL syncs the log on every commit, so a returned call is on disk.
//
// Errors, in the terms of job_store.h's common contract:
//   UNAVAILABLE          the database stayed locked by another connection
//                        for longer than the busy timeout; retry.
//   DATA_LOSS            SQLite found the file corrupt, or not a database.
//   RESOURCE_EXHAUSTED   the disk is full.
//   FAILED_PRECONDITION  the file cannot be opened or written (read-only,
//                        permissions, a missing directory).
//   INTERNAL             any other SQLite failure.
// Messages name the file and carry SQLite's own message.
//
// Thread safety: one SQLite connection serves every call, serialized by one
// mutex; a call holds it through its commit (including the fsync), so writes
// are serialized, which SQLite requires anyway.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/job_store.h"

struct sqlite3;

namespace mesh::coordinator {

struct JobStoreOptions {
  // How long a call waits for a lock held by another connection (a backup,
  // the sqlite3 shell) before it fails with UNAVAILABLE.
  absl::Duration busy_timeout = absl::Seconds(5);
};

class SqliteJobStore final : public JobStore {
 public:
  // The schema this build writes. Open migrates older files up to it.
  static constexpr int kSchemaVersion = 4;

  // Opens (creating if absent) the database at `path`, or a private
  // in-memory one for ":memory:" (no WAL, nothing durable: tests and
  // coordinators without a state directory). Migrates the schema to
  // kSchemaVersion. `clock` stamps records and events and must outlive the
  // store.
  // Possible errors: FAILED_PRECONDITION when the file has a schema newer
  // than kSchemaVersion (written by a newer coordinator), when WAL cannot be
  // enabled, or when the file cannot be opened (missing directory,
  // permissions); DATA_LOSS for a corrupt file or one that is not a SQLite
  // database; the common errors.
  static absl::StatusOr<std::unique_ptr<SqliteJobStore>> Open(const std::string& path,
                                                              const Clock* clock,
                                                              JobStoreOptions options = {});

  ~SqliteJobStore() override;

  const std::string& path() const { return path_; }
  std::string Describe() const override { return path_; }

  absl::StatusOr<CreateJobResult> CreateJob(const NewJob& job) override;
  absl::StatusOr<JobRecord> GetJob(const std::string& id) const override;
  absl::StatusOr<JobPage> ListJobs(const JobQuery& query) const override;
  absl::StatusOr<JobRecord> UpdateJob(const std::string& id, const JobUpdate& update) override;
  absl::StatusOr<std::vector<JobEvent>> ListEvents(const std::string& id) const override;
  absl::Status UpsertNode(const NodeRecord& node) override;
  absl::StatusOr<NodeRecord> GetNode(const std::string& name) const override;
  absl::StatusOr<std::vector<NodeRecord>> ListNodes() const override;
  absl::Status MarkNode(const std::string& name, const std::string& state) override;

 private:
  class Statement;
  class Transaction;

  SqliteJobStore(std::string path, sqlite3* db, const Clock* clock);

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
};

}  // namespace mesh::coordinator
