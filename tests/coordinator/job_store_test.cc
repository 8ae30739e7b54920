#include "coordinator/sqlite_job_store.h"

#include <sqlite3.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "tests/util/status_matchers.h"

namespace mesh::coordinator {
namespace job_store_test {

using ::mesh::testing::IsOk;
using ::mesh::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using Code = absl::StatusCode;

NewJob MakeJob(const std::string& name, const std::string& key = "") {
  NewJob job;
  job.name = name;
  job.idempotency_key = key;
  job.state = "PENDING";
  job.pending_reason = "waiting for 2 nodes";
  job.spec = std::string("spec\0of ", 8) + name;  // Binary-safe: an embedded NUL.
  return job;
}

std::vector<std::string> Ids(const std::vector<JobRecord>& jobs) {
  std::vector<std::string> ids;
  for (const JobRecord& job : jobs) ids.push_back(job.id);
  return ids;
}

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

class JobStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = SqliteJobStore::Open(":memory:", &clock_);
    ASSERT_THAT(store, IsOk());
    store_ = *std::move(store);
  }

  JobRecord Create(const std::string& name, const std::string& key = "") {
    auto result = store_->CreateJob(MakeJob(name, key));
    EXPECT_THAT(result, IsOk());
    return result.ok() ? result->job : JobRecord{};
  }

  FakeClock clock_;
  std::unique_ptr<JobStore> store_;
};

TEST_F(JobStoreTest, CreateThenGetRoundTripsEveryField) {
  auto created = store_->CreateJob(MakeJob("train", "key-1"));
  ASSERT_THAT(created, IsOk());
  EXPECT_FALSE(created->existed);
  const JobRecord& job = created->job;
  EXPECT_EQ(job.id, "job-1");
  EXPECT_EQ(job.version, 1);
  EXPECT_EQ(job.created_at, clock_.Now());

  auto got = store_->GetJob("job-1");
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->id, "job-1");
  EXPECT_EQ(got->idempotency_key, "key-1");
  EXPECT_EQ(got->name, "train");
  EXPECT_EQ(got->state, "PENDING");
  EXPECT_EQ(got->pending_reason, "waiting for 2 nodes");
  EXPECT_EQ(got->spec, MakeJob("train").spec);
  EXPECT_EQ(got->spec.size(), 13u);
  EXPECT_EQ(got->generation, 0);
  EXPECT_EQ(got->restarts, 0);
  EXPECT_EQ(got->root_cause, "");
  EXPECT_EQ(got->version, 1);
  EXPECT_EQ(got->created_at, clock_.Now());
  EXPECT_EQ(got->updated_at, clock_.Now());
}

TEST_F(JobStoreTest, IdsAreSequentialAndUnique) {
  EXPECT_EQ(Create("a").id, "job-1");
  EXPECT_EQ(Create("b").id, "job-2");
  EXPECT_EQ(Create("c").id, "job-3");
}

TEST_F(JobStoreTest, CreateWritesTheFirstEvent) {
  NewJob job = MakeJob("a");
  job.reason = "submitted by alice";
  ASSERT_THAT(store_->CreateJob(job), IsOk());
  auto events = store_->ListEvents("job-1");
  ASSERT_THAT(events, IsOk());
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].job_id, "job-1");
  EXPECT_EQ((*events)[0].seq, 1);
  EXPECT_EQ((*events)[0].time, clock_.Now());
  EXPECT_EQ((*events)[0].from_state, "");
  EXPECT_EQ((*events)[0].to_state, "PENDING");
  EXPECT_EQ((*events)[0].reason, "submitted by alice");
}

TEST_F(JobStoreTest, CreateRejectsAnEmptyStateAndStoresNothing) {
  NewJob job = MakeJob("a");
  job.state = "";
  EXPECT_THAT(store_->CreateJob(job), StatusIs(Code::kInvalidArgument, HasSubstr("state")));
  auto page = store_->ListJobs({});
  ASSERT_THAT(page, IsOk());
  EXPECT_THAT(page->jobs, IsEmpty());
  // The failed call consumed no id.
  EXPECT_EQ(Create("b").id, "job-1");
}

TEST_F(JobStoreTest, SameIdempotencyKeyReturnsTheExistingJob) {
  const JobRecord first = Create("a", "k");
  clock_.Advance(absl::Seconds(5));
  auto again = store_->CreateJob(MakeJob("a-retry", "k"));
  ASSERT_THAT(again, IsOk());
  EXPECT_TRUE(again->existed);
  EXPECT_EQ(again->job.id, first.id);
  EXPECT_EQ(again->job.name, "a");  // The stored job, unchanged.
  EXPECT_EQ(again->job.created_at, first.created_at);

  auto page = store_->ListJobs({});
  ASSERT_THAT(page, IsOk());
  EXPECT_THAT(Ids(page->jobs), ElementsAre("job-1"));
  auto events = store_->ListEvents(first.id);
  ASSERT_THAT(events, IsOk());
  EXPECT_EQ(events->size(), 1u);
  // Another key, and no key at all, make new jobs.
  EXPECT_EQ(Create("b", "other").id, "job-2");
  EXPECT_EQ(Create("c").id, "job-3");
  EXPECT_EQ(Create("d").id, "job-4");
}

TEST_F(JobStoreTest, GetUnknownJobIsNotFound) {
  EXPECT_THAT(store_->GetJob("job-9"), StatusIs(Code::kNotFound, HasSubstr("job-9")));
  EXPECT_THAT(store_->ListEvents("job-9"), StatusIs(Code::kNotFound, HasSubstr("job-9")));
  EXPECT_THAT(store_->UpdateJob("job-9", {}), StatusIs(Code::kNotFound, HasSubstr("job-9")));
}

TEST_F(JobStoreTest, UpdateChangesFieldsBumpsVersionAndAppendsEvent) {
  Create("a");
  clock_.Advance(absl::Seconds(1));
  JobUpdate update;
  update.expected_state = "PENDING";
  update.state = "RUNNING";
  update.pending_reason = "";
  update.generation = 2;
  update.restarts = 1;
  update.root_cause = std::string("rank 3\0", 7);
  update.reason = "scheduled";
  auto updated = store_->UpdateJob("job-1", update);
  ASSERT_THAT(updated, IsOk());
  EXPECT_EQ(updated->version, 2);
  EXPECT_EQ(updated->updated_at, clock_.Now());

  auto got = store_->GetJob("job-1");
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->state, "RUNNING");
  EXPECT_EQ(got->pending_reason, "");
  EXPECT_EQ(got->generation, 2);
  EXPECT_EQ(got->restarts, 1);
  EXPECT_EQ(got->root_cause, std::string("rank 3\0", 7));
  EXPECT_EQ(got->version, 2);
  EXPECT_EQ(got->created_at, clock_.Now() - absl::Seconds(1));
  EXPECT_EQ(got->updated_at, clock_.Now());
  EXPECT_EQ(got->spec, MakeJob("a").spec);  // Untouched.

  // Unset fields stay as they are; the event records an unchanged state.
  JobUpdate note;
  note.reason = "heartbeat from rank 0";
  ASSERT_THAT(store_->UpdateJob("job-1", note), IsOk());
  got = store_->GetJob("job-1");
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->state, "RUNNING");
  EXPECT_EQ(got->generation, 2);
  EXPECT_EQ(got->version, 3);

  auto events = store_->ListEvents("job-1");
  ASSERT_THAT(events, IsOk());
  ASSERT_EQ(events->size(), 3u);
  EXPECT_EQ((*events)[1].seq, 2);
  EXPECT_EQ((*events)[1].from_state, "PENDING");
  EXPECT_EQ((*events)[1].to_state, "RUNNING");
  EXPECT_EQ((*events)[1].reason, "scheduled");
  EXPECT_EQ((*events)[1].time, clock_.Now());
  EXPECT_EQ((*events)[2].seq, 3);
  EXPECT_EQ((*events)[2].from_state, "RUNNING");
  EXPECT_EQ((*events)[2].to_state, "RUNNING");
  // Each event carries the generation the job was left in.
  EXPECT_EQ((*events)[0].generation, 0);
  EXPECT_EQ((*events)[1].generation, 2);
  EXPECT_EQ((*events)[2].generation, 2);
}

TEST_F(JobStoreTest, PlacementRoundTripsAndStaysWhenUnset) {
  Create("a");
  EXPECT_EQ(store_->GetJob("job-1")->placement, "");
  JobUpdate place;
  place.state = "SCHEDULED";
  place.placement = std::string("nodes\0a,b", 10);
  place.reason = "scheduled";
  ASSERT_THAT(store_->UpdateJob("job-1", place), IsOk());
  JobUpdate run;
  run.state = "RUNNING";
  run.reason = "running";
  ASSERT_THAT(store_->UpdateJob("job-1", run), IsOk());
  auto got = store_->GetJob("job-1");
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->placement, std::string("nodes\0a,b", 10));
  auto page = store_->ListJobs({});
  ASSERT_THAT(page, IsOk());
  ASSERT_EQ(page->jobs.size(), 1u);
  EXPECT_EQ(page->jobs[0].placement, std::string("nodes\0a,b", 10));
}

TEST_F(JobStoreTest, UpdateWithWrongExpectedStateIsAbortedAndWritesNothing) {
  Create("a");
  JobUpdate update;
  update.expected_state = "RUNNING";
  update.state = "SUCCEEDED";
  EXPECT_THAT(store_->UpdateJob("job-1", update),
              StatusIs(Code::kAborted, HasSubstr("expected state RUNNING, but it is PENDING")));
  auto got = store_->GetJob("job-1");
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->state, "PENDING");
  EXPECT_EQ(got->version, 1);
  auto events = store_->ListEvents("job-1");
  ASSERT_THAT(events, IsOk());
  EXPECT_EQ(events->size(), 1u);
}

TEST_F(JobStoreTest, UpdateWithStaleVersionIsAborted) {
  Create("a");
  // Two writers read version 1; the first one wins.
  JobUpdate first;
  first.expected_version = 1;
  first.state = "SCHEDULED";
  JobUpdate second;
  second.expected_version = 1;
  second.state = "CANCELLED";
  ASSERT_THAT(store_->UpdateJob("job-1", first), IsOk());
  EXPECT_THAT(store_->UpdateJob("job-1", second),
              StatusIs(Code::kAborted, HasSubstr("expected version 1, but it is 2")));
  auto got = store_->GetJob("job-1");
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->state, "SCHEDULED");
  second.expected_version = 2;
  EXPECT_THAT(store_->UpdateJob("job-1", second), IsOk());
}

TEST_F(JobStoreTest, UpdateRejectsAnEmptyState) {
  Create("a");
  JobUpdate update;
  update.state = "";
  EXPECT_THAT(store_->UpdateJob("job-1", update), StatusIs(Code::kInvalidArgument));
}

TEST_F(JobStoreTest, ConcurrentUpdatesWithExpectedVersionApplyExactlyOnce) {
  Create("a");
  constexpr int kThreads = 4;
  std::vector<absl::Status> results(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      JobUpdate update;
      update.expected_version = 1;
      update.state = absl::StrCat("S", i);
      results[i] = store_->UpdateJob("job-1", update).status();
    });
  }
  for (std::thread& t : threads) t.join();
  int ok = 0;
  for (const absl::Status& status : results) {
    if (status.ok()) {
      ++ok;
    } else {
      EXPECT_THAT(status, StatusIs(Code::kAborted));
    }
  }
  EXPECT_EQ(ok, 1);
  auto got = store_->GetJob("job-1");
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->version, 2);
}

TEST_F(JobStoreTest, ListJobsPagesInCreationOrder) {
  for (int i = 0; i < 7; ++i) Create(absl::StrCat("j", i));
  JobQuery query;
  query.limit = 3;
  std::vector<std::string> seen;
  int pages = 0;
  for (; pages < 10; ++pages) {
    auto page = store_->ListJobs(query);
    ASSERT_THAT(page, IsOk());
    EXPECT_LE(page->jobs.size(), 3u);
    for (const std::string& id : Ids(page->jobs)) seen.push_back(id);
    if (page->next_page_token.empty()) break;
    query.page_token = page->next_page_token;
  }
  EXPECT_EQ(pages, 2);  // Pages 0, 1, 2: 3 + 3 + 1.
  EXPECT_THAT(seen, ElementsAre("job-1", "job-2", "job-3", "job-4", "job-5", "job-6", "job-7"));
}

TEST_F(JobStoreTest, ListJobsExactMultipleHasNoEmptyTrailingPage) {
  for (int i = 0; i < 4; ++i) Create(absl::StrCat("j", i));
  JobQuery query;
  query.limit = 2;
  auto page = store_->ListJobs(query);
  ASSERT_THAT(page, IsOk());
  EXPECT_THAT(Ids(page->jobs), ElementsAre("job-1", "job-2"));
  ASSERT_FALSE(page->next_page_token.empty());
  query.page_token = page->next_page_token;
  page = store_->ListJobs(query);
  ASSERT_THAT(page, IsOk());
  EXPECT_THAT(Ids(page->jobs), ElementsAre("job-3", "job-4"));
  EXPECT_EQ(page->next_page_token, "");
}

TEST_F(JobStoreTest, ListJobsFiltersByStateSet) {
  for (int i = 0; i < 5; ++i) Create(absl::StrCat("j", i));
  const char* states[] = {"RUNNING", "FAILED", "RUNNING", "SUCCEEDED", "PENDING"};
  for (int i = 0; i < 5; ++i) {
    JobUpdate update;
    update.state = states[i];
    ASSERT_THAT(store_->UpdateJob(absl::StrCat("job-", i + 1), update), IsOk());
  }
  JobQuery query;
  query.states = {"RUNNING", "PENDING"};
  auto page = store_->ListJobs(query);
  ASSERT_THAT(page, IsOk());
  EXPECT_THAT(Ids(page->jobs), ElementsAre("job-1", "job-3", "job-5"));

  // Filter and paging together.
  query.limit = 1;
  query.page_token = "";
  std::vector<std::string> seen;
  for (int i = 0; i < 10; ++i) {
    page = store_->ListJobs(query);
    ASSERT_THAT(page, IsOk());
    for (const std::string& id : Ids(page->jobs)) seen.push_back(id);
    if (page->next_page_token.empty()) break;
    query.page_token = page->next_page_token;
  }
  EXPECT_THAT(seen, ElementsAre("job-1", "job-3", "job-5"));

  query = {};
  query.states = {"CANCELLED"};
  page = store_->ListJobs(query);
  ASSERT_THAT(page, IsOk());
  EXPECT_THAT(page->jobs, IsEmpty());
  EXPECT_EQ(page->next_page_token, "");
}

TEST_F(JobStoreTest, ListJobsRejectsBadLimitsAndTokens) {
  JobQuery query;
  query.limit = -1;
  EXPECT_THAT(store_->ListJobs(query), StatusIs(Code::kInvalidArgument, HasSubstr("limit")));
  query.limit = JobStore::kMaxPageSize + 1;
  EXPECT_THAT(store_->ListJobs(query), StatusIs(Code::kInvalidArgument, HasSubstr("limit")));
  query.limit = JobStore::kMaxPageSize;
  EXPECT_THAT(store_->ListJobs(query), IsOk());
  query.page_token = "job-3";
  EXPECT_THAT(store_->ListJobs(query), StatusIs(Code::kInvalidArgument, HasSubstr("token")));
  query.page_token = "-4";
  EXPECT_THAT(store_->ListJobs(query), StatusIs(Code::kInvalidArgument, HasSubstr("token")));
}

TEST_F(JobStoreTest, ListJobsDefaultLimit) {
  for (int i = 0; i < JobStore::kDefaultPageSize + 1; ++i) Create(absl::StrCat("j", i));
  auto page = store_->ListJobs({});
  ASSERT_THAT(page, IsOk());
  EXPECT_EQ(page->jobs.size(), static_cast<size_t>(JobStore::kDefaultPageSize));
  EXPECT_FALSE(page->next_page_token.empty());
}

NodeRecord MakeNode(const std::string& name, absl::Time seen) {
  NodeRecord node;
  node.name = name;
  node.address = absl::StrCat("127.0.0.1:", name.size() + 7000);
  node.slots = 8;
  node.gpus = 4;
  node.state = "READY";
  node.last_seen = seen;
  node.labels = "zone=a";
  return node;
}

TEST_F(JobStoreTest, NodesUpsertGetListMark) {
  ASSERT_THAT(store_->UpsertNode(MakeNode("host-b", clock_.Now())), IsOk());
  ASSERT_THAT(store_->UpsertNode(MakeNode("host-a", clock_.Now())), IsOk());

  auto node = store_->GetNode("host-b");
  ASSERT_THAT(node, IsOk());
  EXPECT_EQ(node->address, "127.0.0.1:7006");
  EXPECT_EQ(node->slots, 8);
  EXPECT_EQ(node->gpus, 4);
  EXPECT_EQ(node->state, "READY");
  EXPECT_EQ(node->last_seen, clock_.Now());
  EXPECT_EQ(node->labels, "zone=a");

  // Upsert replaces every field.
  clock_.Advance(absl::Seconds(3));
  NodeRecord changed = MakeNode("host-b", clock_.Now());
  changed.slots = 2;
  changed.gpus = 0;
  changed.address = "127.0.0.1:9";
  changed.labels = "";
  ASSERT_THAT(store_->UpsertNode(changed), IsOk());
  node = store_->GetNode("host-b");
  ASSERT_THAT(node, IsOk());
  EXPECT_EQ(node->slots, 2);
  EXPECT_EQ(node->gpus, 0);
  EXPECT_EQ(node->address, "127.0.0.1:9");
  EXPECT_EQ(node->labels, "");
  EXPECT_EQ(node->last_seen, clock_.Now());

  ASSERT_THAT(store_->MarkNode("host-b", "LOST"), IsOk());
  node = store_->GetNode("host-b");
  ASSERT_THAT(node, IsOk());
  EXPECT_EQ(node->state, "LOST");
  EXPECT_EQ(node->slots, 2);  // Only the state changed.

  auto nodes = store_->ListNodes();
  ASSERT_THAT(nodes, IsOk());
  ASSERT_EQ(nodes->size(), 2u);
  EXPECT_EQ((*nodes)[0].name, "host-a");
  EXPECT_EQ((*nodes)[0].state, "READY");
  EXPECT_EQ((*nodes)[1].name, "host-b");
  EXPECT_EQ((*nodes)[1].state, "LOST");
}

TEST_F(JobStoreTest, NodeErrors) {
  EXPECT_THAT(store_->GetNode("nope"), StatusIs(Code::kNotFound, HasSubstr("nope")));
  EXPECT_THAT(store_->MarkNode("nope", "LOST"), StatusIs(Code::kNotFound, HasSubstr("nope")));
  NodeRecord node = MakeNode("", clock_.Now());
  EXPECT_THAT(store_->UpsertNode(node), StatusIs(Code::kInvalidArgument));
  node = MakeNode("h", clock_.Now());
  node.slots = -1;
  EXPECT_THAT(store_->UpsertNode(node), StatusIs(Code::kInvalidArgument));
  node = MakeNode("h", clock_.Now());
  node.state = "";
  EXPECT_THAT(store_->UpsertNode(node), StatusIs(Code::kInvalidArgument));
  ASSERT_THAT(store_->UpsertNode(MakeNode("h", clock_.Now())), IsOk());
  EXPECT_THAT(store_->MarkNode("h", ""), StatusIs(Code::kInvalidArgument));
  auto nodes = store_->ListNodes();
  ASSERT_THAT(nodes, IsOk());
  EXPECT_EQ(nodes->size(), 1u);
}

TEST_F(JobStoreTest, StatsCountCommits) {
  const JobStoreStats before = store_->stats();
  Create("a");
  Create("a", "k");
  Create("a", "k");  // Idempotent hit: no commit.
  JobUpdate update;
  update.expected_version = 7;
  EXPECT_THAT(store_->UpdateJob("job-1", update), StatusIs(Code::kAborted));  // No commit.
  ASSERT_THAT(store_->UpsertNode(MakeNode("h", clock_.Now())), IsOk());
  const JobStoreStats after = store_->stats();
  EXPECT_EQ(after.commits - before.commits, 3);
  EXPECT_EQ(after.failed_commits, 0);
  EXPECT_GE(after.commit_seconds_total, after.last_commit_seconds);
  EXPECT_GE(after.last_commit_seconds, 0.0);
}

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
          "ALTER TABLE job_events DROP COLUMN generation;"
          "UPDATE schema_version SET version = 1");
  auto store = SqliteJobStore::Open(dir.db(), &clock);
  ASSERT_THAT(store, IsOk());
  auto job = (*store)->GetJob("job-1");
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ(job->name, "a");
  EXPECT_EQ(job->placement, "");
  EXPECT_EQ(job->owner, "") << "jobs from before schema 3 have no owner";
  auto events = (*store)->ListEvents("job-1");
  ASSERT_THAT(events, IsOk());
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].generation, 0);
  JobUpdate place;
  place.placement = "p";
  place.reason = "placed";
  ASSERT_THAT((*store)->UpdateJob("job-1", place), IsOk());
  EXPECT_EQ((*store)->GetJob("job-1")->placement, "p");
}

TEST(JobStoreFileTest, NewerSchemaIsFailedPrecondition) {
  TempDir dir;
  FakeClock clock;
  ASSERT_THAT(SqliteJobStore::Open(dir.db(), &clock), IsOk());
  RawExec(dir.db(), "UPDATE schema_version SET version = 99");
  EXPECT_THAT(SqliteJobStore::Open(dir.db(), &clock),
              StatusIs(Code::kFailedPrecondition,
                       ::testing::AllOf(HasSubstr("schema version 99"),
                                        HasSubstr("newer than this coordinator supports (3)"),
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
