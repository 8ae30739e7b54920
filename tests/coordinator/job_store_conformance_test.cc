// The JobStore conformance suite (coordinator/job_store.h): every case runs
// against each backend, SQLite (in memory) and etcd (a real member started
// by this binary, tests/util/etcd_cluster.h), and holds it to what the
// interface promises. Without etcd installed the etcd cases are skipped,
// saying so.
//
// Each etcd case gets a key prefix of its own on the binary's one etcd
// cluster, so that cases never see each other's keys.
//
// After the shared suite, EtcdJobStoreTest checks what only the etcd
// backend has: its prefix and schema keys, fencing, several coordinators on
// one prefix, etcd's request size limit and a member that stops answering.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/etcd_client.h"
#include "coordinator/etcd_job_store.h"
#include "coordinator/job_store.h"
#include "coordinator/sqlite_job_store.h"
#include "tests/coordinator/job_store_records.h"
#include "tests/util/etcd_cluster.h"
#include "tests/util/proc.h"
#include "tests/util/status_matchers.h"

namespace mesh::coordinator {
namespace job_store_conformance_test {

using job_store_records::MakeJob;
using job_store_records::MakeNode;
using ::mesh::testing::EtcdCluster;
using ::mesh::testing::IsOk;
using ::mesh::testing::StatusIs;
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using Code = absl::StatusCode;

// What a call to a store that does not answer may fail with: it timed out,
// or it found no endpoint.
MATCHER(IsTimeoutOrUnavailable, "is DEADLINE_EXCEEDED or UNAVAILABLE") {
  const absl::Status status = ::mesh::testing::GetStatus(arg);
  *result_listener << "status is " << status;
  return status.code() == Code::kDeadlineExceeded || status.code() == Code::kUnavailable;
}

// ---- The shared etcd cluster ------------------------------------------------

// The binary's one etcd cluster: started by the first case that needs it,
// stopped (and its temp dir removed) when every case has run.
class EtcdEnvironment : public ::testing::Environment {
 public:
  void TearDown() override { cluster_.reset(); }

  // The cluster, or FAILED_PRECONDITION when etcd is not installed (the
  // caller skips), or why it did not start (the caller fails). A start that
  // failed is not retried: every later case fails with the same message.
  absl::StatusOr<EtcdCluster*> Get() {
    if (cluster_ != nullptr) return cluster_.get();
    if (!start_error_.ok()) return start_error_;
    std::string why;
    if (!EtcdCluster::Available(&why)) {
      start_error_ = absl::FailedPreconditionError(why);
      return start_error_;
    }
    absl::StatusOr<std::unique_ptr<EtcdCluster>> cluster = EtcdCluster::Start();
    if (!cluster.ok()) {
      start_error_ = absl::UnavailableError(
          absl::StrCat("the shared etcd cluster did not start: ", cluster.status().ToString()));
      return start_error_;
    }
    cluster_ = *std::move(cluster);
    return cluster_.get();
  }

 private:
  std::unique_ptr<EtcdCluster> cluster_;
  absl::Status start_error_;
};

EtcdEnvironment* const kSharedEtcd =
    static_cast<EtcdEnvironment*>(::testing::AddGlobalTestEnvironment(new EtcdEnvironment));

// A prefix no other case of this binary uses.
std::string NextPrefix() {
  static std::atomic<int> next{0};
  return absl::StrCat("/conformance/", ++next);
}

absl::StatusOr<std::shared_ptr<EtcdClient>> ConnectTo(
    const EtcdCluster& cluster, absl::Duration call_timeout = absl::Seconds(5)) {
  EtcdClientOptions options;
  options.endpoints = cluster.endpoints();
  options.call_timeout = call_timeout;
  options.connect_timeout = absl::Seconds(5);
  return EtcdClient::Connect(options);
}

absl::StatusOr<std::unique_ptr<EtcdJobStore>> OpenEtcdStore(const EtcdCluster& cluster,
                                                            const std::string& prefix,
                                                            const Clock* clock) {
  absl::StatusOr<std::shared_ptr<EtcdClient>> client = ConnectTo(cluster);
  if (!client.ok()) return client.status();
  return EtcdJobStore::Open(*std::move(client), prefix, clock);
}

// ---- Records ----------------------------------------------------------------

std::vector<std::string> Ids(const std::vector<JobRecord>& jobs) {
  std::vector<std::string> ids;
  for (const JobRecord& job : jobs) ids.push_back(job.id);
  return ids;
}

// "job-<first>" ... "job-<last>".
std::vector<std::string> IdRange(int first, int last) {
  std::vector<std::string> ids;
  for (int i = first; i <= last; ++i) ids.push_back(absl::StrCat("job-", i));
  return ids;
}

// Every job, page by page (at most 100 pages).
absl::StatusOr<std::vector<std::string>> AllIds(const JobStore& store, int limit) {
  JobQuery query;
  query.limit = limit;
  std::vector<std::string> ids;
  for (int pages = 0; pages < 100; ++pages) {
    absl::StatusOr<JobPage> page = store.ListJobs(query);
    if (!page.ok()) return page.status();
    for (const JobRecord& job : page->jobs) ids.push_back(job.id);
    if (page->next_page_token.empty()) return ids;
    query.page_token = page->next_page_token;
  }
  return absl::InternalError("ListJobs still had pages after 100");
}

// `size` bytes of every value, NULs included, in no repeating short pattern.
std::string BinaryBlob(size_t size) {
  std::string blob(size, '\0');
  uint32_t x = 2463534242u;
  for (size_t i = 0; i < size; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    blob[i] = static_cast<char>(x & 0xff);
  }
  return blob;
}

// Where two byte strings first differ, for a failure message that does not
// print half a megabyte.
std::string Mismatch(const std::string& want, const std::string& got) {
  if (want == got) return "equal";
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  return absl::StrCat("want ", want.size(), " bytes, got ", got.size(), "; first difference at ",
                      i);
}

// ---- The conformance suite ----------------------------------------------------

class JobStoreConformanceTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "sqlite") {
      auto store = SqliteJobStore::Open(":memory:", &clock_);
      ASSERT_THAT(store, IsOk());
      store_ = *std::move(store);
      return;
    }
    absl::StatusOr<EtcdCluster*> cluster = kSharedEtcd->Get();
    if (cluster.status().code() == Code::kFailedPrecondition) {
      GTEST_SKIP() << "etcd backend not tested: " << cluster.status().message();
    }
    ASSERT_THAT(cluster, IsOk());
    etcd_ = *cluster;
    prefix_ = NextPrefix();
    auto store = OpenEtcdStore(*etcd_, prefix_, &clock_);
    ASSERT_THAT(store, IsOk()) << "etcd log:\n" << etcd_->log(0);
    store_ = *std::move(store);
  }

  void TearDown() override {
    if (HasFailure() && etcd_ != nullptr) {
      const std::string log = etcd_->log(0);
      std::cerr << "The etcd member's log ends:\n"
                << (log.size() > 3000 ? log.substr(log.size() - 3000) : log) << "\n";
    }
  }

  JobRecord Create(const std::string& name, const std::string& key = "") {
    auto result = store_->CreateJob(MakeJob(name, key));
    EXPECT_THAT(result, IsOk());
    return result.ok() ? result->job : JobRecord{};
  }

  FakeClock clock_;
  EtcdCluster* etcd_ = nullptr;  // Null for SQLite.
  std::string prefix_;
  std::unique_ptr<JobStore> store_;
};

TEST_P(JobStoreConformanceTest, CreateThenGetRoundTripsEveryField) {
  NewJob new_job = MakeJob("train", "key-1");
  new_job.owner = "alice";
  auto created = store_->CreateJob(new_job);
  ASSERT_THAT(created, IsOk());
  EXPECT_FALSE(created->existed);
  const JobRecord& job = created->job;
  EXPECT_EQ(job.id, "job-1");
  EXPECT_EQ(job.version, 1);
  EXPECT_EQ(job.created_at, clock_.Now());
  EXPECT_EQ(job.owner, "alice");

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
  EXPECT_EQ(got->placement, "");
  EXPECT_EQ(got->owner, "alice");
  EXPECT_EQ(got->version, 1);
  EXPECT_EQ(got->created_at, clock_.Now());
  EXPECT_EQ(got->updated_at, clock_.Now());
}

TEST_P(JobStoreConformanceTest, TimesAreStoredToTheMicrosecond) {
  clock_.Advance(absl::Nanoseconds(1234567));  // 1234.567 us.
  auto created = store_->CreateJob(MakeJob("a"));
  ASSERT_THAT(created, IsOk());
  const absl::Time micros = job_store::ToMicros(clock_.Now());
  EXPECT_EQ(created->job.created_at, micros);
  auto got = store_->GetJob("job-1");
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->created_at, micros);
  EXPECT_EQ(got->updated_at, micros);
  auto events = store_->ListEvents("job-1");
  ASSERT_THAT(events, IsOk());
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].time, micros);
}

TEST_P(JobStoreConformanceTest, IdsAreSequentialAndUnique) {
  EXPECT_EQ(Create("a").id, "job-1");
  EXPECT_EQ(Create("b").id, "job-2");
  EXPECT_EQ(Create("c").id, "job-3");
}

TEST_P(JobStoreConformanceTest, CreateWritesTheFirstEvent) {
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

TEST_P(JobStoreConformanceTest, CreateRejectsAnEmptyStateAndStoresNothing) {
  NewJob job = MakeJob("a");
  job.state = "";
  EXPECT_THAT(store_->CreateJob(job), StatusIs(Code::kInvalidArgument, HasSubstr("state")));
  auto page = store_->ListJobs({});
  ASSERT_THAT(page, IsOk());
  EXPECT_THAT(page->jobs, IsEmpty());
  // The failed call consumed no id.
  EXPECT_EQ(Create("b").id, "job-1");
}

TEST_P(JobStoreConformanceTest, SameIdempotencyKeyReturnsTheExistingJob) {
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

TEST_P(JobStoreConformanceTest, GetUnknownJobIsNotFound) {
  EXPECT_THAT(store_->GetJob("job-9"), StatusIs(Code::kNotFound, HasSubstr("job-9")));
  EXPECT_THAT(store_->ListEvents("job-9"), StatusIs(Code::kNotFound, HasSubstr("job-9")));
  EXPECT_THAT(store_->UpdateJob("job-9", {}), StatusIs(Code::kNotFound, HasSubstr("job-9")));
  // Ids that are no job id at all are unknown jobs too, not a crash.
  EXPECT_THAT(store_->GetJob("job-x"), StatusIs(Code::kNotFound));
  EXPECT_THAT(store_->GetJob(""), StatusIs(Code::kNotFound));
}

TEST_P(JobStoreConformanceTest, UpdateChangesFieldsBumpsVersionAndAppendsEvent) {
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

// The opaque blobs a job carries besides its spec: where it runs and the
// history of its sizes.
TEST_P(JobStoreConformanceTest, PlacementAndResizesRoundTripAndStayWhenUnset) {
  Create("a");
  EXPECT_EQ(store_->GetJob("job-1")->placement, "");
  EXPECT_EQ(store_->GetJob("job-1")->resizes, "");
  JobUpdate place;
  place.state = "SCHEDULED";
  place.placement = std::string("nodes\0a,b", 10);
  place.resizes = std::string(
      "4\0"
      "3",
      3);
  place.reason = "scheduled";
  ASSERT_THAT(store_->UpdateJob("job-1", place), IsOk());
  JobUpdate run;
  run.state = "RUNNING";
  run.reason = "running";
  ASSERT_THAT(store_->UpdateJob("job-1", run), IsOk());
  auto got = store_->GetJob("job-1");
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->placement, std::string("nodes\0a,b", 10));
  EXPECT_EQ(got->resizes, std::string("4\0"
                                      "3",
                                      3));
  auto page = store_->ListJobs({});
  ASSERT_THAT(page, IsOk());
  ASSERT_EQ(page->jobs.size(), 1u);
  EXPECT_EQ(page->jobs[0].placement, std::string("nodes\0a,b", 10));
  EXPECT_EQ(page->jobs[0].resizes, std::string("4\0"
                                               "3",
                                               3));
}

TEST_P(JobStoreConformanceTest, UpdateWithWrongExpectedStateIsAbortedAndWritesNothing) {
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

TEST_P(JobStoreConformanceTest, UpdateWithStaleVersionIsAborted) {
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

TEST_P(JobStoreConformanceTest, UpdateRejectsAnEmptyState) {
  Create("a");
  JobUpdate update;
  update.state = "";
  EXPECT_THAT(store_->UpdateJob("job-1", update), StatusIs(Code::kInvalidArgument));
  auto got = store_->GetJob("job-1");
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->version, 1);
}

TEST_P(JobStoreConformanceTest, ConcurrentUpdatesWithExpectedVersionApplyExactlyOnce) {
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
  auto events = store_->ListEvents("job-1");
  ASSERT_THAT(events, IsOk());
  EXPECT_EQ(events->size(), 2u);
}

// Updates without preconditions all apply: none is lost to a concurrent one
// (the etcd backend reads again and retries when its Txn loses a race).
TEST_P(JobStoreConformanceTest, ConcurrentUnconditionalUpdatesAllApply) {
  Create("a");
  constexpr int kThreads = 8;
  constexpr int kEach = 5;
  std::vector<absl::Status> results(kThreads * kEach);
  std::vector<std::thread> threads;
  absl::Notification go;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      go.WaitForNotification();
      for (int i = 0; i < kEach; ++i) {
        JobUpdate update;
        update.reason = absl::StrCat("t", t, "-", i);
        results[t * kEach + i] = store_->UpdateJob("job-1", update).status();
      }
    });
  }
  go.Notify();
  for (std::thread& t : threads) t.join();
  for (const absl::Status& status : results) EXPECT_THAT(status, IsOk());
  auto got = store_->GetJob("job-1");
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->version, 1 + kThreads * kEach);
  auto events = store_->ListEvents("job-1");
  ASSERT_THAT(events, IsOk());
  ASSERT_EQ(events->size(), static_cast<size_t>(1 + kThreads * kEach));
  for (size_t i = 0; i < events->size(); ++i) EXPECT_EQ((*events)[i].seq, int64_t(i) + 1);
}

TEST_P(JobStoreConformanceTest, ListJobsPagesInCreationOrder) {
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

// Creation order is numeric, not the ids' string order: job-10 after job-9.
TEST_P(JobStoreConformanceTest, ListJobsOrdersNumbersPastOneDigit) {
  for (int i = 0; i < 12; ++i) Create(absl::StrCat("j", i));
  auto ids = AllIds(*store_, 5);
  ASSERT_THAT(ids, IsOk());
  EXPECT_THAT(*ids, ElementsAreArray(IdRange(1, 12)));
}

TEST_P(JobStoreConformanceTest, ListJobsExactMultipleHasNoEmptyTrailingPage) {
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

TEST_P(JobStoreConformanceTest, ListJobsFiltersByStateSet) {
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

TEST_P(JobStoreConformanceTest, ListJobsRejectsBadLimitsAndTokens) {
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

TEST_P(JobStoreConformanceTest, ListJobsDefaultLimit) {
  for (int i = 0; i < JobStore::kDefaultPageSize + 1; ++i) Create(absl::StrCat("j", i));
  auto page = store_->ListJobs({});
  ASSERT_THAT(page, IsOk());
  EXPECT_EQ(page->jobs.size(), static_cast<size_t>(JobStore::kDefaultPageSize));
  EXPECT_FALSE(page->next_page_token.empty());
  JobQuery rest;
  rest.page_token = page->next_page_token;
  page = store_->ListJobs(rest);
  ASSERT_THAT(page, IsOk());
  EXPECT_THAT(Ids(page->jobs), ElementsAre(absl::StrCat("job-", JobStore::kDefaultPageSize + 1)));
  EXPECT_EQ(page->next_page_token, "");
}

TEST_P(JobStoreConformanceTest, NodesUpsertGetListMark) {
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

TEST_P(JobStoreConformanceTest, NodeErrors) {
  EXPECT_THAT(store_->GetNode("nope"), StatusIs(Code::kNotFound, HasSubstr("nope")));
  EXPECT_THAT(store_->MarkNode("nope", "LOST"), StatusIs(Code::kNotFound, HasSubstr("nope")));
  NodeRecord node = MakeNode("", clock_.Now());
  EXPECT_THAT(store_->UpsertNode(node), StatusIs(Code::kInvalidArgument));
  node = MakeNode("h", clock_.Now());
  node.slots = -1;
  EXPECT_THAT(store_->UpsertNode(node), StatusIs(Code::kInvalidArgument));
  node = MakeNode("h", clock_.Now());
  node.gpus = -1;
  EXPECT_THAT(store_->UpsertNode(node), StatusIs(Code::kInvalidArgument));
  node = MakeNode("h", clock_.Now());
  node.state = "";
  EXPECT_THAT(store_->UpsertNode(node), StatusIs(Code::kInvalidArgument));
  ASSERT_THAT(store_->UpsertNode(MakeNode("h", clock_.Now())), IsOk());
  EXPECT_THAT(store_->MarkNode("h", ""), StatusIs(Code::kInvalidArgument));
  auto nodes = store_->ListNodes();
  ASSERT_THAT(nodes, IsOk());
  EXPECT_EQ(nodes->size(), 1u);
  EXPECT_EQ(store_->GetNode("h")->state, "READY");
}

TEST_P(JobStoreConformanceTest, StatsCountCommits) {
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

// ---- What the old suite did not check -------------------------------------------

// Eight submitters retry one request at once: one job, one id for all.
TEST_P(JobStoreConformanceTest, ConcurrentCreatesWithOneKeyMakeOneJob) {
  constexpr int kThreads = 8;
  std::vector<absl::StatusOr<CreateJobResult>> results(kThreads, absl::UnknownError("did not run"));
  std::vector<std::thread> threads;
  absl::Notification go;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      go.WaitForNotification();
      results[i] = store_->CreateJob(MakeJob(absl::StrCat("try-", i), "the-key"));
    });
  }
  go.Notify();
  for (std::thread& t : threads) t.join();

  int created = 0;
  std::string winner;
  for (int i = 0; i < kThreads; ++i) {
    ASSERT_THAT(results[i], IsOk()) << "thread " << i;
    EXPECT_EQ(results[i]->job.id, "job-1") << "thread " << i;
    EXPECT_EQ(results[i]->job.idempotency_key, "the-key");
    EXPECT_EQ(results[i]->job.version, 1);
    if (!results[i]->existed) {
      ++created;
      winner = results[i]->job.name;
    }
  }
  EXPECT_EQ(created, 1);
  // Everyone got the winner's record.
  for (int i = 0; i < kThreads; ++i) EXPECT_EQ(results[i]->job.name, winner) << "thread " << i;

  auto ids = AllIds(*store_, 100);
  ASSERT_THAT(ids, IsOk());
  EXPECT_THAT(*ids, ElementsAre("job-1"));
  auto events = store_->ListEvents("job-1");
  ASSERT_THAT(events, IsOk());
  EXPECT_EQ(events->size(), 1u);
  // The losers consumed no id.
  EXPECT_EQ(Create("next").id, "job-2");
}

// Concurrent creates without a key: every one succeeds, with its own id,
// and the ids are 1..n with no gap (a lost race costs no number).
TEST_P(JobStoreConformanceTest, ConcurrentCreatesGetDistinctIdsWithoutGaps) {
  constexpr int kThreads = 8;
  constexpr int kEach = 8;
  std::vector<std::vector<absl::StatusOr<CreateJobResult>>> results(kThreads);
  std::vector<std::thread> threads;
  absl::Notification go;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      go.WaitForNotification();
      for (int i = 0; i < kEach; ++i) {
        results[t].push_back(store_->CreateJob(MakeJob(absl::StrCat("t", t, "-", i))));
      }
    });
  }
  go.Notify();
  for (std::thread& t : threads) t.join();

  std::vector<int64_t> numbers;
  for (int t = 0; t < kThreads; ++t) {
    int64_t last = 0;
    for (const absl::StatusOr<CreateJobResult>& result : results[t]) {
      ASSERT_THAT(result, IsOk()) << "thread " << t;
      EXPECT_FALSE(result->existed);
      std::optional<int64_t> number = job_store::JobNumber(result->job.id);
      ASSERT_TRUE(number.has_value()) << result->job.id;
      // One thread's jobs are numbered in the order it made them.
      EXPECT_GT(*number, last) << "thread " << t;
      last = *number;
      numbers.push_back(*number);
    }
  }
  std::sort(numbers.begin(), numbers.end());
  std::vector<int64_t> want;
  for (int i = 1; i <= kThreads * kEach; ++i) want.push_back(i);
  EXPECT_EQ(numbers, want);

  auto ids = AllIds(*store_, JobStore::kMaxPageSize);
  ASSERT_THAT(ids, IsOk());
  EXPECT_THAT(*ids, ElementsAreArray(IdRange(1, kThreads * kEach)));
  EXPECT_EQ(Create("next").id, absl::StrCat("job-", kThreads * kEach + 1));
}

// A large spec (a job with a big inline environment) round-trips byte for
// byte through create, get, list and an update that leaves it alone.
TEST_P(JobStoreConformanceTest, LargeSpecRoundTrips) {
  const std::string spec = BinaryBlob(512 * 1024);
  NewJob job = MakeJob("big");
  job.spec = spec;
  auto created = store_->CreateJob(job);
  ASSERT_THAT(created, IsOk());
  EXPECT_EQ(Mismatch(spec, created->job.spec), "equal");

  auto got = store_->GetJob(created->job.id);
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(Mismatch(spec, got->spec), "equal");

  JobUpdate update;
  update.state = "RUNNING";
  update.root_cause = BinaryBlob(1000);
  update.reason = "scheduled";
  auto updated = store_->UpdateJob(created->job.id, update);
  ASSERT_THAT(updated, IsOk());
  EXPECT_EQ(Mismatch(spec, updated->spec), "equal");

  auto page = store_->ListJobs({});
  ASSERT_THAT(page, IsOk());
  ASSERT_EQ(page->jobs.size(), 1u);
  EXPECT_EQ(Mismatch(spec, page->jobs[0].spec), "equal");
  EXPECT_EQ(page->jobs[0].state, "RUNNING");
  EXPECT_EQ(Mismatch(BinaryBlob(1000), page->jobs[0].root_cause), "equal");
}

// A job's history through many updates: every event kept, in seq order
// (past 9 and 99, where a string sort would go wrong), each recording the
// state it left and the one it entered.
TEST_P(JobStoreConformanceTest, EventsSurviveManyUpdatesInOrder) {
  constexpr int kUpdates = 250;
  const absl::Time start = clock_.Now();
  Create("a");
  const char* states[] = {"SCHEDULED", "RUNNING", "RESTARTING", "RUNNING", "PENDING"};
  for (int i = 1; i <= kUpdates; ++i) {
    clock_.Advance(absl::Milliseconds(1));
    JobUpdate update;
    update.state = states[i % 5];
    update.generation = i / 10;
    update.reason = absl::StrCat("update ", i);
    auto updated = store_->UpdateJob("job-1", update);
    ASSERT_THAT(updated, IsOk()) << "update " << i;
    ASSERT_EQ(updated->version, i + 1);
  }
  // Another job's events are not mixed in.
  Create("b");

  auto events = store_->ListEvents("job-1");
  ASSERT_THAT(events, IsOk());
  ASSERT_EQ(events->size(), static_cast<size_t>(kUpdates + 1));
  std::string previous_state = "";
  for (int i = 0; i <= kUpdates; ++i) {
    const JobEvent& event = (*events)[i];
    SCOPED_TRACE(absl::StrCat("event ", i));
    EXPECT_EQ(event.job_id, "job-1");
    EXPECT_EQ(event.seq, i + 1);
    EXPECT_EQ(event.from_state, previous_state);
    EXPECT_EQ(event.to_state, i == 0 ? "PENDING" : states[i % 5]);
    EXPECT_EQ(event.reason, i == 0 ? "created" : absl::StrCat("update ", i));
    EXPECT_EQ(event.generation, i / 10);
    EXPECT_EQ(event.time, start + absl::Milliseconds(i));
    previous_state = event.to_state;
  }
  auto got = store_->GetJob("job-1");
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->version, kUpdates + 1);
  auto other = store_->ListEvents("job-2");
  ASSERT_THAT(other, IsOk());
  EXPECT_EQ(other->size(), 1u);
}

// A client pages through the jobs while another creates more: no job shows
// up twice, none is skipped, and every page continues where the last one
// ended.
TEST_P(JobStoreConformanceTest, ListJobsPagingIsStableWhileJobsAreCreated) {
  constexpr int kBefore = 20;
  constexpr int kDuring = 60;
  for (int i = 0; i < kBefore; ++i) Create(absl::StrCat("before-", i));

  std::atomic<int> created{0};
  absl::Status writer_status;
  absl::Notification go;
  std::thread writer([&] {
    go.WaitForNotification();
    for (int i = 0; i < kDuring; ++i) {
      auto result = store_->CreateJob(MakeJob(absl::StrCat("during-", i)));
      if (!result.ok()) {
        writer_status = result.status();
        return;
      }
      created.fetch_add(1);
    }
  });
  go.Notify();

  JobQuery query;
  query.limit = 3;
  std::vector<std::string> seen;
  int pages = 0;
  absl::Status reader_status;
  for (; pages < 200; ++pages) {
    auto page = store_->ListJobs(query);
    if (!page.ok()) {
      reader_status = page.status();
      break;
    }
    if (page->jobs.size() > 3u) {
      reader_status = absl::InternalError(absl::StrCat("page of ", page->jobs.size()));
      break;
    }
    for (const JobRecord& job : page->jobs) seen.push_back(job.id);
    if (page->next_page_token.empty()) break;
    query.page_token = page->next_page_token;
  }
  writer.join();
  ASSERT_THAT(writer_status, IsOk());
  ASSERT_THAT(reader_status, IsOk());
  ASSERT_LT(pages, 200);

  // What the reader saw: job-1 .. job-k in order, once each, k >= kBefore.
  ASSERT_GE(seen.size(), static_cast<size_t>(kBefore));
  EXPECT_THAT(seen, ElementsAreArray(IdRange(1, static_cast<int>(seen.size()))))
      << "while " << created.load() << " jobs were created concurrently";

  auto all = AllIds(*store_, 7);
  ASSERT_THAT(all, IsOk());
  EXPECT_THAT(*all, ElementsAreArray(IdRange(1, kBefore + kDuring)));
}

INSTANTIATE_TEST_SUITE_P(Backends, JobStoreConformanceTest, ::testing::Values("sqlite", "etcd"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// ---- The etcd backend alone ---------------------------------------------------------

class EtcdJobStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<EtcdCluster*> cluster = kSharedEtcd->Get();
    if (cluster.status().code() == Code::kFailedPrecondition) {
      GTEST_SKIP() << "etcd backend not tested: " << cluster.status().message();
    }
    ASSERT_THAT(cluster, IsOk());
    etcd_ = *cluster;
    prefix_ = NextPrefix();
    auto client = ConnectTo(*etcd_);
    ASSERT_THAT(client, IsOk());
    client_ = *std::move(client);
  }

  absl::StatusOr<std::unique_ptr<EtcdJobStore>> Open(const std::string& prefix) {
    return EtcdJobStore::Open(client_, prefix, &clock_);
  }

  // Every key under the prefix, with its mod revision: what "nothing was
  // written" is checked against.
  std::vector<std::pair<std::string, int64_t>> Keys() {
    std::vector<std::pair<std::string, int64_t>> keys;
    auto range = client_->Range(prefix_ + "/", EtcdClient::PrefixEnd(prefix_ + "/"));
    EXPECT_THAT(range, IsOk());
    if (range.ok()) {
      for (const EtcdKeyValue& kv : range->kvs) keys.emplace_back(kv.key, kv.mod_revision);
    }
    return keys;
  }

  absl::Status Put(const std::string& key, const std::string& value) {
    EtcdTxn txn;
    txn.Put(key, value);
    absl::StatusOr<EtcdTxnResult> result = client_->Txn(txn);
    if (!result.ok()) return result.status();
    if (!result->succeeded) return absl::InternalError("a Txn without compares failed");
    return absl::OkStatus();
  }

  FakeClock clock_;
  EtcdCluster* etcd_ = nullptr;
  std::string prefix_;
  std::shared_ptr<EtcdClient> client_;
};

TEST_F(EtcdJobStoreTest, DescribeNamesTheEndpointsAndPrefix) {
  auto store = Open(prefix_);
  ASSERT_THAT(store, IsOk());
  EXPECT_THAT((*store)->Describe(),
              AllOf(HasSubstr("etcd://"), HasSubstr(etcd_->endpoint_list()), HasSubstr(prefix_)));
  EXPECT_EQ((*store)->prefix(), prefix_);
}

TEST_F(EtcdJobStoreTest, OpenWritesTheSchemaUnderAnEmptyPrefix) {
  ASSERT_THAT(Open(prefix_), IsOk());
  auto schema = client_->Get(prefix_ + "/schema");
  ASSERT_THAT(schema, IsOk());
  ASSERT_TRUE(schema->has_value()) << "no " << prefix_ << "/schema after Open";
  EXPECT_EQ((*schema)->value, std::to_string(EtcdJobStore::kSchemaVersion));
  // Reopening keeps the jobs and the counter.
  {
    auto store = Open(prefix_);
    ASSERT_THAT(store, IsOk());
    ASSERT_THAT((*store)->CreateJob(MakeJob("a")), IsOk());
  }
  auto store = Open(prefix_);
  ASSERT_THAT(store, IsOk());
  EXPECT_THAT((*store)->GetJob("job-1"), IsOk());
  auto next = (*store)->CreateJob(MakeJob("b"));
  ASSERT_THAT(next, IsOk());
  EXPECT_EQ(next->job.id, "job-2");
}

TEST_F(EtcdJobStoreTest, NewerSchemaIsFailedPrecondition) {
  ASSERT_THAT(Put(prefix_ + "/schema", "99"), IsOk());
  EXPECT_THAT(Open(prefix_),
              StatusIs(Code::kFailedPrecondition, AllOf(HasSubstr("99"), HasSubstr(prefix_))));
  // Nothing was written over it.
  auto schema = client_->Get(prefix_ + "/schema");
  ASSERT_THAT(schema, IsOk());
  ASSERT_TRUE(schema->has_value());
  EXPECT_EQ((*schema)->value, "99");
}

TEST_F(EtcdJobStoreTest, UnreadableSchemaIsDataLoss) {
  ASSERT_THAT(Put(prefix_ + "/schema", "one"), IsOk());
  EXPECT_THAT(Open(prefix_), StatusIs(Code::kDataLoss, HasSubstr(prefix_)));
}

TEST_F(EtcdJobStoreTest, ForeignKeysWithoutASchemaAreFailedPrecondition) {
  ASSERT_THAT(Put(prefix_ + "/registry/pods/default/web-0", "not mesh"), IsOk());
  EXPECT_THAT(Open(prefix_), StatusIs(Code::kFailedPrecondition, HasSubstr(prefix_)));
  const auto keys = Keys();
  ASSERT_EQ(keys.size(), 1u) << "Open wrote into a foreign prefix";
  EXPECT_EQ(keys[0].first, prefix_ + "/registry/pods/default/web-0");
}

// "/p" and "/p2" (or "/p-x") share their first bytes but are different
// prefixes: a store sees only the keys under "<prefix>/".
TEST_F(EtcdJobStoreTest, PrefixesThatShareLeadingBytesAreSeparate) {
  ASSERT_THAT(Put(prefix_ + "-other/foreign", "x"), IsOk());
  ASSERT_THAT(Put(prefix_ + "2", "x"), IsOk());
  auto store = Open(prefix_);
  ASSERT_THAT(store, IsOk()) << "keys beside the prefix, not under it, made Open fail";
  ASSERT_THAT((*store)->CreateJob(MakeJob("a")), IsOk());

  auto sibling = Open(prefix_ + "0");
  ASSERT_THAT(sibling, IsOk());
  auto page = (*sibling)->ListJobs({});
  ASSERT_THAT(page, IsOk());
  EXPECT_THAT(page->jobs, IsEmpty());
  auto created = (*sibling)->CreateJob(MakeJob("b"));
  ASSERT_THAT(created, IsOk());
  EXPECT_EQ(created->job.id, "job-1");
  EXPECT_EQ((*store)->GetJob("job-1")->name, "a");
}

TEST_F(EtcdJobStoreTest, MalformedPrefixIsInvalidArgument) {
  for (const std::string& prefix :
       {std::string(""), std::string("/"), std::string("mesh"), std::string("/mesh/"),
        std::string("/a b"), std::string("/a//b"), std::string("//a"), std::string("/a/\xc3\xa9"),
        std::string("/a\0b", 4)}) {
    EXPECT_THAT(Open(prefix), StatusIs(Code::kInvalidArgument)) << "prefix '" << prefix << "'";
  }
  for (const char* suffix : {"/x", "/x.y_z-W9/sub"}) {
    EXPECT_THAT(Open(prefix_ + suffix), IsOk()) << "prefix '" << prefix_ + suffix << "'";
  }
}

TEST_F(EtcdJobStoreTest, NothingListeningIsUnavailableWithinTheConnectTimeout) {
  // A port nothing listens on: bound, read, closed.
  int port = 0;
  {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    port = ntohs(addr.sin_port);
    ::close(fd);
  }
  EtcdClientOptions options;
  options.endpoints = {absl::StrCat("127.0.0.1:", port)};
  options.connect_timeout = absl::Seconds(1);
  options.call_timeout = absl::Seconds(1);
  const absl::Time start = absl::Now();
  absl::Status status;
  absl::StatusOr<std::shared_ptr<EtcdClient>> client = EtcdClient::Connect(options);
  if (client.ok()) {
    status = EtcdJobStore::Open(*client, prefix_, &clock_).status();
  } else {
    status = client.status();
  }
  const absl::Duration took = absl::Now() - start;
  EXPECT_THAT(status, StatusIs(Code::kUnavailable, HasSubstr(absl::StrCat(port))));
  EXPECT_LT(took, absl::Seconds(3)) << "with a 1 s connect timeout";
}

// A fence on a key that does not exist (this replica's election key is
// gone): every write fails, and none of it reaches etcd.
TEST_F(EtcdJobStoreTest, FenceOnAMissingKeyStopsEveryWrite) {
  auto opened = Open(prefix_);
  ASSERT_THAT(opened, IsOk());
  EtcdJobStore& store = **opened;
  ASSERT_THAT(store.CreateJob(MakeJob("a")), IsOk());
  ASSERT_THAT(store.UpsertNode(MakeNode("h", clock_.Now())), IsOk());
  const auto before = Keys();

  store.SetFence(prefix_ + "-election/leader", 12345);
  EXPECT_THAT(store.CreateJob(MakeJob("b")), StatusIs(Code::kFailedPrecondition));
  EXPECT_THAT(store.CreateJob(MakeJob("c", "key")), StatusIs(Code::kFailedPrecondition));
  JobUpdate update;
  update.state = "RUNNING";
  EXPECT_THAT(store.UpdateJob("job-1", update), StatusIs(Code::kFailedPrecondition));
  EXPECT_THAT(store.UpsertNode(MakeNode("h2", clock_.Now())), StatusIs(Code::kFailedPrecondition));
  EXPECT_THAT(store.MarkNode("h", "LOST"), StatusIs(Code::kFailedPrecondition));
  EXPECT_EQ(Keys(), before) << "a fenced write changed etcd";

  // Reads still work.
  auto job = store.GetJob("job-1");
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ(job->state, "PENDING");
  EXPECT_EQ(job->version, 1);

  // Clearing the fence lets writes through, and the fenced creates used no id.
  store.SetFence("", 0);
  auto created = store.CreateJob(MakeJob("d"));
  ASSERT_THAT(created, IsOk());
  EXPECT_EQ(created->job.id, "job-2");
}

// The fence as the coordinator uses it: writes pass while the election key
// is the one this replica created, and fail once another replica has
// re-created it.
TEST_F(EtcdJobStoreTest, FenceFollowsTheElectionKeysCreateRevision) {
  const std::string election = prefix_ + "-election/leader";
  ASSERT_THAT(Put(election, "replica-a"), IsOk());
  auto key = client_->Get(election);
  ASSERT_THAT(key, IsOk());
  ASSERT_TRUE(key->has_value());
  auto opened = Open(prefix_);
  ASSERT_THAT(opened, IsOk());
  EtcdJobStore& store = **opened;
  store.SetFence(election, (*key)->create_revision);
  ASSERT_THAT(store.CreateJob(MakeJob("a")), IsOk());
  // Another value, same key: the create revision holds, so does the fence.
  ASSERT_THAT(Put(election, "replica-a, renewed"), IsOk());
  ASSERT_THAT(store.CreateJob(MakeJob("b")), IsOk());

  // Replica B takes over: the key is deleted and created again.
  EtcdTxn take_over;
  take_over.Delete(election);
  ASSERT_THAT(client_->Txn(take_over), IsOk());
  ASSERT_THAT(Put(election, "replica-b"), IsOk());
  const auto before = Keys();
  EXPECT_THAT(store.CreateJob(MakeJob("c")), StatusIs(Code::kFailedPrecondition));
  JobUpdate update;
  update.state = "CANCELLED";
  EXPECT_THAT(store.UpdateJob("job-1", update), StatusIs(Code::kFailedPrecondition));
  EXPECT_EQ(Keys(), before);
}

// Two coordinators (replicas, or an old and a new leader) on one prefix see
// one store: jobs, ids, idempotency keys, versions and nodes.
TEST_F(EtcdJobStoreTest, TwoStoresOnOnePrefixShareTheirState) {
  auto a = Open(prefix_);
  ASSERT_THAT(a, IsOk());
  auto other_client = ConnectTo(*etcd_);
  ASSERT_THAT(other_client, IsOk());
  auto b = EtcdJobStore::Open(*other_client, prefix_, &clock_);
  ASSERT_THAT(b, IsOk());

  auto created = (*a)->CreateJob(MakeJob("from-a", "k"));
  ASSERT_THAT(created, IsOk());
  auto seen = (*b)->GetJob(created->job.id);
  ASSERT_THAT(seen, IsOk());
  EXPECT_EQ(seen->name, "from-a");
  EXPECT_EQ(seen->spec, MakeJob("from-a").spec);

  auto again = (*b)->CreateJob(MakeJob("from-b", "k"));
  ASSERT_THAT(again, IsOk());
  EXPECT_TRUE(again->existed);
  EXPECT_EQ(again->job.id, "job-1");
  auto second = (*b)->CreateJob(MakeJob("from-b"));
  ASSERT_THAT(second, IsOk());
  EXPECT_EQ(second->job.id, "job-2");

  JobUpdate update;
  update.expected_version = 1;
  update.state = "RUNNING";
  ASSERT_THAT((*a)->UpdateJob("job-2", update), IsOk());
  EXPECT_THAT((*b)->UpdateJob("job-2", update),
              StatusIs(Code::kAborted, HasSubstr("expected version 1, but it is 2")));
  EXPECT_EQ((*b)->GetJob("job-2")->state, "RUNNING");

  ASSERT_THAT((*a)->UpsertNode(MakeNode("host-a", clock_.Now())), IsOk());
  ASSERT_THAT((*b)->MarkNode("host-a", "LOST"), IsOk());
  EXPECT_EQ((*a)->GetNode("host-a")->state, "LOST");

  // Both create at once: distinct ids, no gaps.
  constexpr int kEach = 10;
  std::vector<absl::Status> results(2 * kEach);
  std::thread on_a([&] {
    for (int i = 0; i < kEach; ++i) results[i] = (*a)->CreateJob(MakeJob("a")).status();
  });
  std::thread on_b([&] {
    for (int i = 0; i < kEach; ++i) results[kEach + i] = (*b)->CreateJob(MakeJob("b")).status();
  });
  on_a.join();
  on_b.join();
  for (const absl::Status& status : results) EXPECT_THAT(status, IsOk());
  auto ids_a = AllIds(**a, 6);
  auto ids_b = AllIds(**b, 1000);
  ASSERT_THAT(ids_a, IsOk());
  ASSERT_THAT(ids_b, IsOk());
  EXPECT_THAT(*ids_a, ElementsAreArray(IdRange(1, 2 + 2 * kEach)));
  EXPECT_EQ(*ids_a, *ids_b);
}

// etcd takes requests up to --max-request-bytes (1.5 MiB by default): a
// larger record is RESOURCE_EXHAUSTED, and nothing of it is stored.
TEST_F(EtcdJobStoreTest, RecordOverEtcdsLimitIsResourceExhausted) {
  auto store = Open(prefix_);
  ASSERT_THAT(store, IsOk());
  const auto before = Keys();
  NewJob job = MakeJob("huge");
  job.spec = BinaryBlob(2 * 1024 * 1024);
  EXPECT_THAT((*store)->CreateJob(job), StatusIs(Code::kResourceExhausted));
  EXPECT_EQ(Keys(), before);
  auto created = (*store)->CreateJob(MakeJob("small"));
  ASSERT_THAT(created, IsOk());
  EXPECT_EQ(created->job.id, "job-1");

  // An update that would make the record too large fails the same way.
  JobUpdate update;
  update.root_cause = BinaryBlob(2 * 1024 * 1024);
  EXPECT_THAT((*store)->UpdateJob("job-1", update), StatusIs(Code::kResourceExhausted));
  EXPECT_EQ((*store)->GetJob("job-1")->version, 1);
}

// Reads `id` through `store` until it answers, for at most `timeout`: a
// client reconnects to a member that came back by itself, after a backoff.
absl::StatusOr<JobRecord> GetWhenBack(const JobStore& store, const std::string& id,
                                      absl::Duration timeout) {
  absl::StatusOr<JobRecord> job = absl::UnknownError("not read");
  ::mesh::testing::WaitUntil(
      [&] {
        job = store.GetJob(id);
        return job.ok();
      },
      timeout);
  return job;
}

// A member that stops answering (SIGSTOP) makes calls fail within the
// client's call timeout, and the store works again once it answers.
TEST_F(EtcdJobStoreTest, StalledMemberFailsCallsInTimeAndRecovers) {
  auto client = ConnectTo(*etcd_, /*call_timeout=*/absl::Seconds(1));
  ASSERT_THAT(client, IsOk());
  auto opened = EtcdJobStore::Open(*client, prefix_, &clock_);
  ASSERT_THAT(opened, IsOk());
  EtcdJobStore& store = **opened;
  ASSERT_THAT(store.CreateJob(MakeJob("before")), IsOk());

  ASSERT_THAT(etcd_->Pause(0), IsOk());
  {
    absl::Cleanup resume = [&] { EXPECT_THAT(etcd_->Resume(0), IsOk()); };
    absl::Time start = absl::Now();
    EXPECT_THAT(store.GetJob("job-1"), IsTimeoutOrUnavailable());
    EXPECT_LT(absl::Now() - start, absl::Seconds(3)) << "with a 1 s call timeout";
    start = absl::Now();
    EXPECT_THAT(store.CreateJob(MakeJob("during")), IsTimeoutOrUnavailable());
    EXPECT_LT(absl::Now() - start, absl::Seconds(3)) << "with a 1 s call timeout";
  }
  // Whether the stalled create took effect is unknown to the caller; the
  // next read tells, and the store goes on either way.
  EXPECT_THAT(GetWhenBack(store, "job-1", absl::Seconds(10)), IsOk());
  auto after = store.CreateJob(MakeJob("after"));
  ASSERT_THAT(after, IsOk());
  EXPECT_THAT(after->job.id, AnyOf("job-2", "job-3"));
}

// A member killed and restarted on its data has kept every acknowledged
// write, and a store whose client failed calls while it was down works
// again once it is back, by itself.
TEST_F(EtcdJobStoreTest, KilledMemberRestartsWithItsData) {
  auto client = ConnectTo(*etcd_, /*call_timeout=*/absl::Seconds(1));
  ASSERT_THAT(client, IsOk());
  auto opened = EtcdJobStore::Open(*client, prefix_, &clock_);
  ASSERT_THAT(opened, IsOk());
  EtcdJobStore& store = **opened;
  for (int i = 0; i < 5; ++i) ASSERT_THAT(store.CreateJob(MakeJob("before")), IsOk());
  JobUpdate update;
  update.state = "RUNNING";
  ASSERT_THAT(store.UpdateJob("job-5", update), IsOk());

  ASSERT_THAT(etcd_->Kill(0), IsOk());
  const absl::Time start = absl::Now();
  EXPECT_THAT(store.GetJob("job-1"), IsTimeoutOrUnavailable());
  EXPECT_THAT(store.CreateJob(MakeJob("while-down")), IsTimeoutOrUnavailable());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "two calls with a 1 s call timeout";
  ASSERT_THAT(etcd_->Restart(0), IsOk());

  // The store whose client saw the member die works again once it is back
  // (gRPC reconnects by itself after a backoff of at most 1 s)...
  auto job = GetWhenBack(store, "job-5", absl::Seconds(10));
  EXPECT_THAT(job.status(), IsOk()) << "the client did not reconnect within 10 s of the restart";
  // ... and the member kept every acknowledged write, as a fresh client sees.
  auto fresh = OpenEtcdStore(*etcd_, prefix_, &clock_);
  ASSERT_THAT(fresh, IsOk());
  job = (*fresh)->GetJob("job-5");
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ(job->state, "RUNNING");
  EXPECT_EQ(job->version, 2);
  auto ids = AllIds(**fresh, 100);
  ASSERT_THAT(ids, IsOk());
  EXPECT_THAT(*ids, ElementsAreArray(IdRange(1, 5)));
  // The old store goes on from there (once it reconnected, if only through
  // the fresh client's connection).
  EXPECT_THAT(GetWhenBack(store, "job-5", absl::Seconds(10)), IsOk());
  auto next = store.CreateJob(MakeJob("after-restart"));
  ASSERT_THAT(next, IsOk());
  EXPECT_EQ(next->job.id, "job-6");
}

// Against a cluster of three: the client moves on to another member when
// the one it used dies, the store keeps working while a quorum is up,
// fails in time without one, and works again once a quorum is back.
TEST(EtcdJobStoreClusterTest, ThreeMembersSurviveTheLossOfOne) {
  std::string why;
  if (!EtcdCluster::Available(&why)) GTEST_SKIP() << "etcd backend not tested: " << why;
  auto cluster = EtcdCluster::Start(3);
  ASSERT_THAT(cluster, IsOk());
  EtcdCluster& etcd = **cluster;
  ASSERT_EQ(etcd.endpoints().size(), 3u);
  EtcdClientOptions options;
  options.endpoints = etcd.endpoints();
  options.call_timeout = absl::Seconds(2);
  auto client = EtcdClient::Connect(options);
  ASSERT_THAT(client, IsOk());
  FakeClock clock;
  auto opened = EtcdJobStore::Open(*client, "/three", &clock);
  ASSERT_THAT(opened, IsOk());
  EtcdJobStore& store = **opened;
  ASSERT_THAT(store.CreateJob(MakeJob("a")), IsOk());

  // The client starts on the first member that answered: member 0.
  ASSERT_THAT(etcd.Kill(0), IsOk());
  auto created = store.CreateJob(MakeJob("b"));
  EXPECT_THAT(created.status(), IsOk()) << "with two of three members up";
  EXPECT_THAT(store.GetJob("job-1").status(), IsOk());

  ASSERT_THAT(etcd.Kill(1), IsOk());
  const absl::Time start = absl::Now();
  EXPECT_THAT(store.CreateJob(MakeJob("c")), IsTimeoutOrUnavailable()) << "without a quorum";
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "with a 2 s call timeout";

  ASSERT_THAT(etcd.Restart(1), IsOk()) << etcd.log(1);
  auto after = GetWhenBack(store, "job-1", absl::Seconds(10));
  EXPECT_THAT(after.status(), IsOk());
  auto next = store.CreateJob(MakeJob("d"));
  ASSERT_THAT(next.status(), IsOk());
  // "c" may or may not have been committed once the quorum came back.
  EXPECT_THAT(next->job.id, AnyOf("job-3", "job-4"));
}

}  // namespace job_store_conformance_test
}  // namespace mesh::coordinator
