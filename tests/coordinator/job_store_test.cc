// What is SQLite's own in the SqliteJobStore: the file, its WAL, its
// permissions, schema migrations and corrupt files. What every JobStore
// backend must do is tested for each in job_store_conformance_test.cc.
#include "coordinator/sqlite_job_store.h"

#include <sqlite3.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "tests/coordinator/job_store_records.h"
#include "tests/util/status_matchers.h"

namespace mesh::coordinator {
namespace job_store_test {

using job_store_records::MakeJob;
using job_store_records::MakeNode;
using ::mesh::testing::IsOk;
using ::mesh::testing::StatusIs;
using ::testing::HasSubstr;
using Code = absl::StatusCode;

// A fresh directory per test, removed with its files.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = ::testing::TempDir() + "job_store_test.XXXXXX";
    char* dir = mkdtemp(tmpl.data());
    EXPECT_NE(dir, nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    for (const char* suffix : {"", "-wal", "-shm", "-journal"}) {
      unlink(absl::StrCat(path_, "/state.db", suffix).c_str());
    }
    unlink(absl::StrCat(path_, "/garbage.db").c_str());
    rmdir(path_.c_str());
  }
  std::string db() const { return path_ + "/state.db"; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// ---- On-disk behaviour -------------------------------------------------------

// Every job's spec and environment is in the database: 0600, with its WAL
// and shared-memory files, even under a permissive umask; a file an older
// version made 0644 is tightened when opened.
TEST(JobStoreFileTest, DatabaseAndItsWalAreReadableByTheOwnerAlone) {
  TempDir dir;
  FakeClock clock;
  auto mode = [](const std::string& path) {
    struct stat st {};
    EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
    return st.st_mode & 0777;
  };
  const mode_t old_umask = ::umask(022);
  {
    auto store = SqliteJobStore::Open(dir.db(), &clock);
    ASSERT_THAT(store, IsOk());
    ASSERT_THAT((*store)->CreateJob(MakeJob("a", "k")), IsOk());
    EXPECT_EQ(mode(dir.db()), 0600u);
    EXPECT_EQ(mode(dir.db() + "-wal"), 0600u);
    EXPECT_EQ(mode(dir.db() + "-shm"), 0600u);
  }
  ASSERT_EQ(::chmod(dir.db().c_str(), 0644), 0);
  {
    auto store = SqliteJobStore::Open(dir.db(), &clock);
    ASSERT_THAT(store, IsOk());
    EXPECT_EQ(mode(dir.db()), 0600u);
    EXPECT_THAT((*store)->GetJob("job-1"), IsOk());
  }
  ::umask(old_umask);
}

TEST(JobStoreFileTest, UsesWalAndSurvivesReopen) {
  TempDir dir;
  FakeClock clock;
  {
    auto store = SqliteJobStore::Open(dir.db(), &clock);
    ASSERT_THAT(store, IsOk());
    ASSERT_EQ((*store)->CreateJob(MakeJob("a", "k")).value().job.id, "job-1");
    ASSERT_THAT((*store)->UpsertNode(MakeNode("h", clock.Now())), IsOk());
    // The log exists while the store is open: WAL mode is on.
    EXPECT_EQ(access((dir.db() + "-wal").c_str(), F_OK), 0);
  }
  {
    auto store = SqliteJobStore::Open(dir.db(), &clock);
    ASSERT_THAT(store, IsOk());
    auto job = (*store)->GetJob("job-1");
    ASSERT_THAT(job, IsOk());
    EXPECT_EQ(job->name, "a");
    EXPECT_THAT((*store)->GetNode("h"), IsOk());
    // Ids continue after a restart; the key still deduplicates.
    EXPECT_EQ((*store)->CreateJob(MakeJob("b")).value().job.id, "job-2");
    auto again = (*store)->CreateJob(MakeJob("a", "k"));
    ASSERT_THAT(again, IsOk());
    EXPECT_TRUE(again->existed);
    EXPECT_EQ(again->job.id, "job-1");
  }
  // The pragmas as a fresh connection sees them: journal mode persists in
  // the file.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(dir.db().c_str(), &db), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &stmt, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(stmt), SQLITE_ROW);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0)), "wal");
  sqlite3_finalize(stmt);
  sqlite3_close(db);
}

// Runs `sql` on the file with a plain connection.
void RawExec(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* error = nullptr;
  EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error), SQLITE_OK)
      << (error ? error : "");
  sqlite3_free(error);
  sqlite3_close(db);
}

TEST(JobStoreFileTest, Version1FileIsMigratedWithItsJobsIntact) {
  TempDir dir;
  FakeClock clock;
  {
    auto store = SqliteJobStore::Open(dir.db(), &clock);
    ASSERT_THAT(store, IsOk());
    ASSERT_EQ((*store)->CreateJob(MakeJob("a", "k")).value().job.id, "job-1");
  }
  // Take the file back to what a version-1 coordinator wrote.
  RawExec(dir.db(),
          "ALTER TABLE jobs DROP COLUMN placement;"
          "ALTER TABLE jobs DROP COLUMN owner;"
          "ALTER TABLE jobs DROP COLUMN resizes;"
          "ALTER TABLE job_events DROP COLUMN generation;"
          "UPDATE schema_version SET version = 1");
  auto store = SqliteJobStore::Open(dir.db(), &clock);
  ASSERT_THAT(store, IsOk());
  auto job = (*store)->GetJob("job-1");
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ(job->name, "a");
  EXPECT_EQ(job->placement, "");
  EXPECT_EQ(job->owner, "") << "jobs from before schema 3 have no owner";
  EXPECT_EQ(job->resizes, "") << "jobs from before schema 4 have no resizes";
  auto events = (*store)->ListEvents("job-1");
  ASSERT_THAT(events, IsOk());
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].generation, 0);
  JobUpdate place;
  place.placement = "p";
  place.reason = "placed";
  place.resizes = "r";
  ASSERT_THAT((*store)->UpdateJob("job-1", place), IsOk());
  EXPECT_EQ((*store)->GetJob("job-1")->placement, "p");
  EXPECT_EQ((*store)->GetJob("job-1")->resizes, "r");
}

TEST(JobStoreFileTest, NewerSchemaIsFailedPrecondition) {
  TempDir dir;
  FakeClock clock;
  ASSERT_THAT(SqliteJobStore::Open(dir.db(), &clock), IsOk());
  RawExec(dir.db(), "UPDATE schema_version SET version = 99");
  EXPECT_THAT(SqliteJobStore::Open(dir.db(), &clock),
              StatusIs(Code::kFailedPrecondition,
                       ::testing::AllOf(HasSubstr("schema version 99"),
                                        HasSubstr("newer than this coordinator supports (4)"),
                                        HasSubstr(dir.db()))));
}

TEST(JobStoreFileTest, CurrentSchemaVersionIsRecorded) {
  TempDir dir;
  FakeClock clock;
  ASSERT_THAT(SqliteJobStore::Open(dir.db(), &clock), IsOk());
  // Reopening at the same version migrates nothing (a rerun of version 1's
  // CREATE TABLEs would fail).
  ASSERT_THAT(SqliteJobStore::Open(dir.db(), &clock), IsOk());
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(dir.db().c_str(), &db), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT version FROM schema_version", -1, &stmt, nullptr),
            SQLITE_OK);
  ASSERT_EQ(sqlite3_step(stmt), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(stmt, 0), SqliteJobStore::kSchemaVersion);
  EXPECT_EQ(sqlite3_step(stmt), SQLITE_DONE);  // Exactly one row.
  sqlite3_finalize(stmt);
  sqlite3_close(db);
}

TEST(JobStoreFileTest, NotADatabaseIsDataLoss) {
  TempDir dir;
  const std::string path = dir.path() + "/garbage.db";
  {
    std::ofstream out(path, std::ios::binary);
    for (int i = 0; i < 512; ++i) out << "this is not a database file ";
  }
  FakeClock clock;
  EXPECT_THAT(
      SqliteJobStore::Open(path, &clock),
      StatusIs(Code::kDataLoss, ::testing::AllOf(HasSubstr(path), HasSubstr("not a database"))));
}

TEST(JobStoreFileTest, CorruptPagesAreDataLoss) {
  TempDir dir;
  FakeClock clock;
  {
    auto store = SqliteJobStore::Open(dir.db(), &clock);
    ASSERT_THAT(store, IsOk());
    for (int i = 0; i < 50; ++i) ASSERT_THAT((*store)->CreateJob(MakeJob("j")), IsOk());
  }  // Closing the last connection checkpoints the log into the file.
  // Keep the 100-byte header and page 1's start; overwrite the rest.
  {
    std::fstream file(dir.db(), std::ios::binary | std::ios::in | std::ios::out);
    ASSERT_TRUE(file.good());
    file.seekp(0, std::ios::end);
    const std::streamoff size = file.tellp();
    ASSERT_GT(size, 4096);
    file.seekp(200);
    const std::string junk(static_cast<size_t>(size - 200), '\xA5');
    file.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  auto store = SqliteJobStore::Open(dir.db(), &clock);
  if (store.ok()) {
    // Opening may get by on the header; reading the jobs cannot.
    EXPECT_THAT((*store)->ListJobs({}), StatusIs(Code::kDataLoss, HasSubstr("malformed")));
  } else {
    EXPECT_THAT(store, StatusIs(Code::kDataLoss, HasSubstr(dir.db())));
  }
}

TEST(JobStoreFileTest, MissingDirectoryIsFailedPrecondition) {
  FakeClock clock;
  EXPECT_THAT(SqliteJobStore::Open("/nonexistent-mesh-dir/sub/state.db", &clock),
              StatusIs(Code::kFailedPrecondition, HasSubstr("unable to open")));
}

}  // namespace job_store_test
}  // namespace mesh::coordinator
