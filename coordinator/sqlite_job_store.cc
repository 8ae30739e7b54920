#include "coordinator/sqlite_job_store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iterator>
#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"

// File-local; #undef'd at the end.
#define JOB_STORE_RETURN_IF_ERROR(expr) \
  do {                                  \
    absl::Status _status = (expr);      \
    if (!_status.ok()) return _status;  \
  } while (false)

namespace mesh::coordinator {
namespace {

// Schema migrations: kMigrations[v - 1] takes a file from version v - 1 to
// v. Append only; never edit a released step, since files in the field have
// already run it.
//
// Times are Unix microseconds. jobs.number is the creation order (the
// paging cursor) and the n of the id "job-<n>".
constexpr const char* kMigrations[] = {
    // Version 1.
    R"sql(
CREATE TABLE counters (
  name  TEXT PRIMARY KEY,
  value INTEGER NOT NULL
);
INSERT INTO counters (name, value) VALUES ('job', 0);

CREATE TABLE jobs (
  id              TEXT PRIMARY KEY,
  number          INTEGER NOT NULL UNIQUE,
  idempotency_key TEXT UNIQUE,
  name            TEXT NOT NULL,
  state           TEXT NOT NULL,
  pending_reason  TEXT NOT NULL,
  generation      INTEGER NOT NULL,
  restarts        INTEGER NOT NULL,
  spec            BLOB NOT NULL,
  root_cause      BLOB,
  version         INTEGER NOT NULL,
  created_at      INTEGER NOT NULL,
  updated_at      INTEGER NOT NULL
);
CREATE INDEX jobs_by_state ON jobs (state, number);

CREATE TABLE job_events (
  job_id     TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
  seq        INTEGER NOT NULL,
  time       INTEGER NOT NULL,
  from_state TEXT NOT NULL,
  to_state   TEXT NOT NULL,
  reason     TEXT NOT NULL,
  PRIMARY KEY (job_id, seq)
) WITHOUT ROWID;

CREATE TABLE nodes (
  name      TEXT PRIMARY KEY,
  address   TEXT NOT NULL,
  slots     INTEGER NOT NULL,
  gpus      INTEGER NOT NULL,
  state     TEXT NOT NULL,
  last_seen INTEGER NOT NULL,
  labels    BLOB
);
)sql",
    // Version 2: where a job runs (an opaque placement), and the generation
    // each event left the job in.
    R"sql(
ALTER TABLE jobs ADD COLUMN placement BLOB;
ALTER TABLE job_events ADD COLUMN generation INTEGER NOT NULL DEFAULT 0;
)sql",
    // Version 3: who submitted the job (the authenticated principal's name;
    // empty for jobs submitted without authentication).
    R"sql(
ALTER TABLE jobs ADD COLUMN owner TEXT NOT NULL DEFAULT '';
)sql",
    // Version 4: the history of an elastic job's sizes (opaque).
    R"sql(
ALTER TABLE jobs ADD COLUMN resizes BLOB;
)sql",
};
static_assert(std::size(kMigrations) == SqliteJobStore::kSchemaVersion,
              "one migration per schema version");

constexpr const char* kJobColumns =
    "id, idempotency_key, name, state, pending_reason, generation, restarts, spec, root_cause, "
    "version, created_at, updated_at, number, placement, owner, resizes";
constexpr const char* kNodeColumns = "name, address, slots, gpus, state, last_seen, labels";

absl::StatusCode CodeFor(int rc) {
  // Growing the WAL index (-shm) on a full disk is an I/O error to SQLite,
  // but the same "no space" to the caller.
  if (rc == SQLITE_IOERR_SHMSIZE) return absl::StatusCode::kResourceExhausted;
  switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return absl::StatusCode::kUnavailable;
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return absl::StatusCode::kDataLoss;
    case SQLITE_FULL:
      return absl::StatusCode::kResourceExhausted;
    case SQLITE_CANTOPEN:
    case SQLITE_PERM:
    case SQLITE_READONLY:
    case SQLITE_AUTH:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kInternal;
  }
}

int64_t Micros(absl::Time t) { return absl::ToUnixMicros(t); }
absl::Time FromMicros(int64_t us) { return absl::FromUnixMicros(us); }

}  // namespace

// A prepared statement; finalized on destruction. Bind indexes are 1-based
// and column indexes 0-based, as in SQLite. A bad index is a programmer
// error.
class SqliteJobStore::Statement {
 public:
  Statement(const SqliteJobStore& store, const std::string& sql) : store_(store) {
    rc_ = sqlite3_prepare_v2(store.db_, sql.c_str(), static_cast<int>(sql.size()), &stmt_, nullptr);
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  void Bind(int i, int64_t value) { Check(sqlite3_bind_int64(stmt_, i, value)); }
  void Bind(int i, const std::string& text) {
    Check(
        sqlite3_bind_text(stmt_, i, text.data(), static_cast<int>(text.size()), SQLITE_TRANSIENT));
  }
  void BindBlob(int i, const std::string& bytes) {
    Check(sqlite3_bind_blob(stmt_, i, bytes.data(), static_cast<int>(bytes.size()),
                            SQLITE_TRANSIENT));
  }
  // Empty binds NULL: the column's "none".
  void BindOrNull(int i, const std::string& text, bool blob) {
    if (text.empty()) {
      Check(sqlite3_bind_null(stmt_, i));
    } else if (blob) {
      BindBlob(i, text);
    } else {
      Bind(i, text);
    }
  }

  // True when a row is ready, false when done.
  absl::StatusOr<bool> Step(const char* what) {
    if (rc_ != SQLITE_OK) return store_.Error(rc_, what);
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return store_.Error(rc, what);
  }
  // Steps a statement that returns no rows.
  absl::Status Run(const char* what) {
    absl::StatusOr<bool> row = Step(what);
    if (!row.ok()) return row.status();
    MESH_CHECK(!*row, "statement returned a row where none was expected");
    return absl::OkStatus();
  }

  int64_t Int(int col) const { return sqlite3_column_int64(stmt_, col); }
  // TEXT and BLOB alike; NULL reads as empty.
  std::string Bytes(int col) const {
    const void* data = sqlite3_column_blob(stmt_, col);
    const int size = sqlite3_column_bytes(stmt_, col);
    return data == nullptr ? std::string() : std::string(static_cast<const char*>(data), size);
  }

 private:
  void Check(int rc) { MESH_CHECK(rc_ != SQLITE_OK || rc == SQLITE_OK, "sqlite3_bind failed"); }

  const SqliteJobStore& store_;
  sqlite3_stmt* stmt_ = nullptr;
  int rc_ = SQLITE_OK;
};

// A write transaction: BEGIN IMMEDIATE takes the write lock up front, so a
// transaction never fails half-way for lack of it. Rolls back on destruction
// unless committed.
class SqliteJobStore::Transaction {
 public:
  explicit Transaction(SqliteJobStore& store) : store_(store) {}
  ~Transaction() {
    // A failed COMMIT can leave the transaction open (BUSY) or have rolled
    // it back already (I/O errors); only an open one needs the ROLLBACK.
    if (begun_ && !sqlite3_get_autocommit(store_.db_)) {
      sqlite3_exec(store_.db_, "ROLLBACK", nullptr, nullptr, nullptr);
    }
  }
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;

  absl::Status Begin() {
    const int rc = sqlite3_exec(store_.db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr);
    if (rc != SQLITE_OK) return store_.Error(rc, "begin transaction");
    begun_ = true;
    return absl::OkStatus();
  }

  absl::Status Commit() {
    // Wall time, not the injected clock: this measures the disk.
    const absl::Time start = absl::Now();
    const int rc = sqlite3_exec(store_.db_, "COMMIT", nullptr, nullptr, nullptr);
    store_.RecordCommit(absl::Now() - start, rc == SQLITE_OK);
    if (rc != SQLITE_OK) return store_.Error(rc, "commit");
    begun_ = false;
    return absl::OkStatus();
  }

 private:
  SqliteJobStore& store_;
  bool begun_ = false;
};

absl::StatusOr<std::unique_ptr<SqliteJobStore>> SqliteJobStore::Open(const std::string& path,
                                                                     const Clock* clock,
                                                                     JobStoreOptions options) {
  MESH_CHECK(clock != nullptr, "JobStore needs a clock");
  if (path != ":memory:" && !absl::StartsWith(path, "file:")) {
    // Every job's spec and environment is in here: readable by the
    // coordinator's user alone. SQLite gives the -wal and -shm files it
    // creates the database's mode; ones an older version left are tightened.
    if (const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600); fd >= 0) {
      ::fchmod(fd, 0600);
      ::close(fd);
    }
    for (const char* suffix : {"-wal", "-shm"}) ::chmod((path + suffix).c_str(), 0600);
  }
  sqlite3* db = nullptr;
  // NOMUTEX: our own mutex serializes every use of the connection.
  const int rc = sqlite3_open_v2(
      path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  // The store owns `db` from here, even when the open failed: SQLite hands
  // back a handle to close (and to read the error from) in that case too.
  std::unique_ptr<SqliteJobStore> store(new SqliteJobStore(path, db, clock));
  if (db == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("job store '", path, "': out of memory opening the database"));
  }
  if (rc != SQLITE_OK) return store->Error(rc, "open");
  JOB_STORE_RETURN_IF_ERROR(store->Init(options));
  return store;
}

SqliteJobStore::SqliteJobStore(std::string path, sqlite3* db, const Clock* clock)
    : path_(std::move(path)), clock_(clock), db_(db) {}

SqliteJobStore::~SqliteJobStore() { sqlite3_close_v2(db_); }

absl::Status SqliteJobStore::Error(int rc, const std::string& what) const {
  // sqlite3_errmsg describes the connection's last failure, which is `rc`'s
  // as long as the caller asks right away (it holds mu_).
  // The generic text for `rc` adds to it only when the two differ.
  const std::string message = sqlite3_errmsg(db_);
  const std::string generic = sqlite3_errstr(rc);
  return absl::Status(CodeFor(rc),
                      absl::StrCat("job store '", path_, "': ", what, ": ", message,
                                   message == generic ? "" : absl::StrCat(" (", generic, ")")));
}

absl::Status SqliteJobStore::ExecLocked(const char* sql) const {
  const int rc = sqlite3_exec(db_, sql, nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) return Error(rc, sql);
  return absl::OkStatus();
}

absl::Status SqliteJobStore::Init(const JobStoreOptions& options) {
  absl::MutexLock lock(&mu_);
  sqlite3_extended_result_codes(db_, 1);
  sqlite3_busy_timeout(
      db_, static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(options.busy_timeout), 0,
                                                std::numeric_limits<int>::max())));

  // The first statement reads the file: a non-database fails here, with
  // SQLITE_NOTADB.
  {
    Statement wal(*this, "PRAGMA journal_mode=WAL");
    absl::StatusOr<bool> row = wal.Step("enable WAL");
    if (!row.ok()) return row.status();
    const std::string mode = *row ? wal.Bytes(0) : "";
    // An in-memory database has no file to log to; it reports "memory".
    if (mode != "wal" && !(path_ == ":memory:" && mode == "memory")) {
      return absl::FailedPreconditionError(
          absl::StrCat("job store '", path_, "': cannot enable WAL (journal mode is '", mode,
                       "'); the file system may not support shared memory"));
    }
  }
  // Not a default in WAL mode; see the header for why FULL.
  JOB_STORE_RETURN_IF_ERROR(ExecLocked("PRAGMA synchronous=FULL"));
  // Per connection, and a no-op inside a transaction: set before any.
  JOB_STORE_RETURN_IF_ERROR(ExecLocked("PRAGMA foreign_keys=ON"));

  Transaction tx(*this);
  JOB_STORE_RETURN_IF_ERROR(tx.Begin());
  JOB_STORE_RETURN_IF_ERROR(
      ExecLocked("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)"));
  int64_t version = 0;
  bool has_row = false;
  {
    Statement select(*this, "SELECT version FROM schema_version");
    absl::StatusOr<bool> row = select.Step("read schema version");
    if (!row.ok()) return row.status();
    has_row = *row;
    if (has_row) version = select.Int(0);
  }
  if (version > kSchemaVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("job store '", path_, "': schema version ", version,
                     " is newer than this coordinator supports (", kSchemaVersion,
                     "); run a newer mesh-coordinator, or restore a backup made by this version"));
  }
  if (version < 0) {
    return absl::DataLossError(
        absl::StrCat("job store '", path_, "': invalid schema version ", version));
  }
  if (version == kSchemaVersion) return absl::OkStatus();  // Read only: rolls back.
  for (int64_t v = version + 1; v <= kSchemaVersion; ++v) {
    JOB_STORE_RETURN_IF_ERROR(ExecLocked(kMigrations[v - 1]));
  }
  {
    Statement set(*this, has_row ? "UPDATE schema_version SET version = ?1"
                                 : "INSERT INTO schema_version (version) VALUES (?1)");
    set.Bind(1, int64_t{kSchemaVersion});
    JOB_STORE_RETURN_IF_ERROR(set.Run("write schema version"));
  }
  return tx.Commit();
}

namespace {

// Reads kJobColumns.
JobRecord ReadJob(const auto& row) {
  JobRecord job;
  job.id = row.Bytes(0);
  job.idempotency_key = row.Bytes(1);
  job.name = row.Bytes(2);
  job.state = row.Bytes(3);
  job.pending_reason = row.Bytes(4);
  job.generation = row.Int(5);
  job.restarts = row.Int(6);
  job.spec = row.Bytes(7);
  job.root_cause = row.Bytes(8);
  job.version = row.Int(9);
  job.created_at = FromMicros(row.Int(10));
  job.updated_at = FromMicros(row.Int(11));
  job.placement = row.Bytes(13);
  job.owner = row.Bytes(14);
  job.resizes = row.Bytes(15);
  return job;
}

// Reads kNodeColumns.
NodeRecord ReadNode(const auto& row) {
  NodeRecord node;
  node.name = row.Bytes(0);
  node.address = row.Bytes(1);
  node.slots = row.Int(2);
  node.gpus = row.Int(3);
  node.state = row.Bytes(4);
  node.last_seen = FromMicros(row.Int(5));
  node.labels = row.Bytes(6);
  return node;
}

}  // namespace

absl::StatusOr<JobRecord> SqliteJobStore::GetJobLocked(const std::string& id) const {
  Statement select(*this, absl::StrCat("SELECT ", kJobColumns, " FROM jobs WHERE id = ?1"));
  select.Bind(1, id);
  absl::StatusOr<bool> row = select.Step("read job");
  if (!row.ok()) return row.status();
  if (!*row) return absl::NotFoundError(absl::StrCat("job ", id, " not found"));
  return ReadJob(select);
}

absl::Status SqliteJobStore::AppendEventLocked(const JobEvent& event) {
  Statement insert(*this,
                   "INSERT INTO job_events (job_id, seq, time, from_state, to_state, reason, "
                   "generation) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)");
  insert.Bind(1, event.job_id);
  insert.Bind(2, event.seq);
  insert.Bind(3, Micros(event.time));
  insert.Bind(4, event.from_state);
  insert.Bind(5, event.to_state);
  insert.Bind(6, event.reason);
  insert.Bind(7, event.generation);
  return insert.Run("append job event");
}

absl::StatusOr<CreateJobResult> SqliteJobStore::CreateJob(const NewJob& job) {
  JOB_STORE_RETURN_IF_ERROR(job_store::CheckNewJob(job));
  absl::MutexLock lock(&mu_);
  Transaction tx(*this);
  JOB_STORE_RETURN_IF_ERROR(tx.Begin());

  if (!job.idempotency_key.empty()) {
    Statement select(*this, "SELECT id FROM jobs WHERE idempotency_key = ?1");
    select.Bind(1, job.idempotency_key);
    absl::StatusOr<bool> row = select.Step("look up idempotency key");
    if (!row.ok()) return row.status();
    if (*row) {
      absl::StatusOr<JobRecord> existing = GetJobLocked(select.Bytes(0));
      if (!existing.ok()) return existing.status();
      return CreateJobResult{*std::move(existing), /*existed=*/true};
    }
  }

  int64_t number = 0;
  {
    Statement next(*this,
                   "UPDATE counters SET value = value + 1 WHERE name = 'job' RETURNING value");
    absl::StatusOr<bool> row = next.Step("allocate job id");
    if (!row.ok()) return row.status();
    if (!*row) return absl::DataLossError(absl::StrCat("job store '", path_, "': no job counter"));
    number = next.Int(0);
  }

  // Rounded to what the column holds, so that the returned record equals a
  // later GetJob.
  const absl::Time now = FromMicros(Micros(clock_->Now()));
  JobRecord record = job_store::NewJobRecord(job, number, now);
  {
    Statement insert(*this, absl::StrCat("INSERT INTO jobs (", kJobColumns,
                                         ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, "
                                         "?11, ?12, ?13, ?14, ?15, ?16)"));
    insert.Bind(1, record.id);
    insert.BindOrNull(2, record.idempotency_key, /*blob=*/false);
    insert.Bind(3, record.name);
    insert.Bind(4, record.state);
    insert.Bind(5, record.pending_reason);
    insert.Bind(6, record.generation);
    insert.Bind(7, record.restarts);
    insert.BindBlob(8, record.spec);
    insert.BindOrNull(9, record.root_cause, /*blob=*/true);
    insert.Bind(10, record.version);
    insert.Bind(11, Micros(now));
    insert.Bind(12, Micros(now));
    insert.Bind(13, number);
    insert.BindOrNull(14, record.placement, /*blob=*/true);
    insert.Bind(15, record.owner);
    insert.BindOrNull(16, record.resizes, /*blob=*/true);
    JOB_STORE_RETURN_IF_ERROR(insert.Run("insert job"));
  }
  JOB_STORE_RETURN_IF_ERROR(AppendEventLocked(
      JobEvent{record.id, /*seq=*/1, now, /*from_state=*/"", record.state, job.reason}));
  JOB_STORE_RETURN_IF_ERROR(tx.Commit());
  return CreateJobResult{std::move(record), /*existed=*/false};
}

absl::StatusOr<JobRecord> SqliteJobStore::GetJob(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  return GetJobLocked(id);
}

absl::StatusOr<JobPage> SqliteJobStore::ListJobs(const JobQuery& query) const {
  absl::StatusOr<job_store::PageWindow> window = job_store::ParsePage(query);
  if (!window.ok()) return window.status();
  const int limit = window->limit;
  const int64_t after = window->after;

  std::string sql = absl::StrCat("SELECT ", kJobColumns, " FROM jobs WHERE number > ?1");
  if (!query.states.empty()) {
    absl::StrAppend(&sql, " AND state IN (");
    for (size_t i = 0; i < query.states.size(); ++i) {
      absl::StrAppend(&sql, i == 0 ? "" : ", ", "?", i + 3);
    }
    absl::StrAppend(&sql, ")");
  }
  // One row past the page tells whether another page follows.
  absl::StrAppend(&sql, " ORDER BY number LIMIT ?2");

  absl::MutexLock lock(&mu_);
  Statement select(*this, sql);
  select.Bind(1, after);
  select.Bind(2, int64_t{limit} + 1);
  for (size_t i = 0; i < query.states.size(); ++i) {
    select.Bind(static_cast<int>(i) + 3, query.states[i]);
  }
  JobPage page;
  int64_t last_number = 0;
  for (;;) {
    absl::StatusOr<bool> row = select.Step("list jobs");
    if (!row.ok()) return row.status();
    if (!*row) break;
    if (static_cast<int>(page.jobs.size()) == limit) {
      page.next_page_token = job_store::PageToken(last_number);
      break;
    }
    page.jobs.push_back(ReadJob(select));
    last_number = select.Int(12);
  }
  return page;
}

absl::StatusOr<JobRecord> SqliteJobStore::UpdateJob(const std::string& id,
                                                    const JobUpdate& update) {
  JOB_STORE_RETURN_IF_ERROR(job_store::CheckUpdate(id, update));
  absl::MutexLock lock(&mu_);
  Transaction tx(*this);
  JOB_STORE_RETURN_IF_ERROR(tx.Begin());
  absl::StatusOr<JobRecord> current = GetJobLocked(id);
  if (!current.ok()) return current.status();
  JobRecord job = *std::move(current);
  JobEvent event;
  JOB_STORE_RETURN_IF_ERROR(job_store::ApplyUpdate(update, clock_->Now(), &job, &event));
  {
    Statement set(*this,
                  "UPDATE jobs SET state = ?1, pending_reason = ?2, generation = ?3, "
                  "restarts = ?4, root_cause = ?5, version = ?6, updated_at = ?7, placement = ?9, "
                  "resizes = ?10 WHERE id = ?8");
    set.Bind(1, job.state);
    set.Bind(2, job.pending_reason);
    set.Bind(3, job.generation);
    set.Bind(4, job.restarts);
    set.BindOrNull(5, job.root_cause, /*blob=*/true);
    set.Bind(6, job.version);
    set.Bind(7, Micros(job.updated_at));
    set.Bind(8, id);
    set.BindOrNull(9, job.placement, /*blob=*/true);
    set.BindOrNull(10, job.resizes, /*blob=*/true);
    JOB_STORE_RETURN_IF_ERROR(set.Run("update job"));
  }
  JOB_STORE_RETURN_IF_ERROR(AppendEventLocked(event));
  JOB_STORE_RETURN_IF_ERROR(tx.Commit());
  return job;
}

absl::StatusOr<std::vector<JobEvent>> SqliteJobStore::ListEvents(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  {
    Statement exists(*this, "SELECT 1 FROM jobs WHERE id = ?1");
    exists.Bind(1, id);
    absl::StatusOr<bool> row = exists.Step("read job");
    if (!row.ok()) return row.status();
    if (!*row) return absl::NotFoundError(absl::StrCat("job ", id, " not found"));
  }
  Statement select(*this,
                   "SELECT seq, time, from_state, to_state, reason, generation FROM job_events "
                   "WHERE job_id = ?1 ORDER BY seq");
  select.Bind(1, id);
  std::vector<JobEvent> events;
  for (;;) {
    absl::StatusOr<bool> row = select.Step("list job events");
    if (!row.ok()) return row.status();
    if (!*row) break;
    events.push_back(JobEvent{id, select.Int(0), FromMicros(select.Int(1)), select.Bytes(2),
                              select.Bytes(3), select.Bytes(4), select.Int(5)});
  }
  return events;
}

absl::Status SqliteJobStore::UpsertNode(const NodeRecord& node) {
  JOB_STORE_RETURN_IF_ERROR(job_store::CheckNode(node));
  absl::MutexLock lock(&mu_);
  Transaction tx(*this);
  JOB_STORE_RETURN_IF_ERROR(tx.Begin());
  Statement upsert(*this, absl::StrCat("INSERT INTO nodes (", kNodeColumns,
                                       ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) "
                                       "ON CONFLICT (name) DO UPDATE SET address = ?2, "
                                       "slots = ?3, gpus = ?4, state = ?5, last_seen = ?6, "
                                       "labels = ?7"));
  upsert.Bind(1, node.name);
  upsert.Bind(2, node.address);
  upsert.Bind(3, node.slots);
  upsert.Bind(4, node.gpus);
  upsert.Bind(5, node.state);
  upsert.Bind(6, Micros(node.last_seen));
  upsert.BindOrNull(7, node.labels, /*blob=*/true);
  JOB_STORE_RETURN_IF_ERROR(upsert.Run("upsert node"));
  return tx.Commit();
}

absl::StatusOr<NodeRecord> SqliteJobStore::GetNode(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  Statement select(*this, absl::StrCat("SELECT ", kNodeColumns, " FROM nodes WHERE name = ?1"));
  select.Bind(1, name);
  absl::StatusOr<bool> row = select.Step("read node");
  if (!row.ok()) return row.status();
  if (!*row) return absl::NotFoundError(absl::StrCat("node ", name, " not found"));
  return ReadNode(select);
}

absl::StatusOr<std::vector<NodeRecord>> SqliteJobStore::ListNodes() const {
  absl::MutexLock lock(&mu_);
  Statement select(*this, absl::StrCat("SELECT ", kNodeColumns, " FROM nodes ORDER BY name"));
  std::vector<NodeRecord> nodes;
  for (;;) {
    absl::StatusOr<bool> row = select.Step("list nodes");
    if (!row.ok()) return row.status();
    if (!*row) break;
    nodes.push_back(ReadNode(select));
  }
  return nodes;
}

absl::Status SqliteJobStore::MarkNode(const std::string& name, const std::string& state) {
  JOB_STORE_RETURN_IF_ERROR(job_store::CheckNodeState(name, state));
  absl::MutexLock lock(&mu_);
  Transaction tx(*this);
  JOB_STORE_RETURN_IF_ERROR(tx.Begin());
  Statement set(*this, "UPDATE nodes SET state = ?1 WHERE name = ?2");
  set.Bind(1, state);
  set.Bind(2, name);
  JOB_STORE_RETURN_IF_ERROR(set.Run("mark node"));
  if (sqlite3_changes(db_) == 0) {
    return absl::NotFoundError(absl::StrCat("node ", name, " not found"));
  }
  return tx.Commit();
}

}  // namespace mesh::coordinator

#undef JOB_STORE_RETURN_IF_ERROR
