// Every limit of docs/limits.md through a real in-process CoordinatorServer
// on 127.0.0.1:0 and real gRPC stubs, with small configured limits: exactly
// the limit succeeds, the limit plus one fails with the documented code and
// a message that names the limit, and what was stored before is intact
// afterwards (KV keys with their values and the store's totals, jobs with
// their specs).
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "coordinator/coordinator_server.h"
#include "mesh/v1/admin.grpc.pb.h"
#include "mesh/v1/job.grpc.pb.h"
#include "mesh/v1/worker.grpc.pb.h"
#include "tests/util/in_process_coordinator.h"

namespace mesh::coordinator {
namespace limits_test {

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using namespace mesh::v1;  // NOLINT

// The small limits every test runs under (see Start).
constexpr int kMaxMessageBytes = 64 << 10;
constexpr size_t kMaxKeyBytes = 32;
constexpr size_t kMaxValueBytes = 1024;
constexpr int64_t kMaxKeys = 8;
constexpr int64_t kMaxTotalBytes = 4096;
constexpr int64_t kMaxBarriers = 4;
constexpr int64_t kMaxUniqueIds = 3;
constexpr int64_t kMaxKeysPerRequest = 5;
constexpr int64_t kMaxWorldSize = 8;
constexpr int kMaxEnvVars = 4;
constexpr int64_t kMaxEnvBytes = 64;
constexpr int kMaxArgvCount = 4;
constexpr int64_t kMaxArgvBytes = 64;
constexpr int kMaxLabels = 2;
constexpr int kMaxIdempotencyKeyBytes = 16;
constexpr int64_t kMaxPendingJobs = 3;

std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout = absl::Seconds(10)) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return context;
}

// The code, and a message that names the limit: "... limit of N" (or "the
// limit is N", the KV store's words) and the thing limited.
MATCHER_P3(LimitError, code, what, limit, "") {
  const grpc::Status& status = arg;
  *result_listener << "status " << status.error_code() << ": " << status.error_message();
  const std::string n = absl::StrCat(limit);
  return status.error_code() == code &&
         ::testing::Value(
             status.error_message(),
             AllOf(HasSubstr(what), AnyOf(HasSubstr("limit of " + n), HasSubstr("limit is " + n))));
}

class LimitsTest : public ::testing::Test {
 protected:
  // Starts the server with the small limits, after `tweak` has adjusted them.
  void Start(const std::function<void(CoordinatorConfig&)>& tweak = {}) {
    CoordinatorConfig config = mesh::testing::InProcessCoordinator::DefaultConfig();
    config.max_message_bytes = kMaxMessageBytes;
    CoordinationOptions& c = config.coordination;
    c.kv.max_key_bytes = kMaxKeyBytes;
    c.kv.max_value_bytes = kMaxValueBytes;
    c.kv.max_keys = kMaxKeys;
    c.kv.max_total_bytes = kMaxTotalBytes;
    c.max_barriers = kMaxBarriers;
    c.max_unique_ids = kMaxUniqueIds;
    c.max_keys_per_request = kMaxKeysPerRequest;
    JobSpecLimits& spec = config.jobs.spec_limits;
    spec.max_world_size = kMaxWorldSize;
    spec.max_env_count = kMaxEnvVars;
    spec.max_env_bytes = kMaxEnvBytes;
    spec.max_argv_count = kMaxArgvCount;
    spec.max_argv_bytes = kMaxArgvBytes;
    spec.max_labels = kMaxLabels;
    spec.max_idempotency_key_bytes = kMaxIdempotencyKeyBytes;
    config.jobs.max_pending_jobs = 100;
    if (tweak) tweak(config);
    auto server = mesh::testing::InProcessCoordinator::Start(config);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    // The client sends whatever it is given; the server's limit is what is
    // under test.
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(-1);
    args.SetMaxReceiveMessageSize(-1);
    channel_ =
        grpc::CreateCustomChannel(server_->address(), grpc::InsecureChannelCredentials(), args);
    workers_ = WorkerService::NewStub(channel_);
    admin_ = AdminService::NewStub(channel_);
    jobs_ = JobService::NewStub(channel_);
  }

  // Creates a one-rank job and joins it; returns the rank's context.
  RankContext JoinedRank(const std::string& job_id) {
    CreateJobRequest create;
    create.set_job_id(job_id);
    create.set_world_size(1);
    CreateJobResponse created;
    grpc::Status status = admin_->CreateJob(Context().get(), create, &created);
    EXPECT_TRUE(status.ok()) << status.error_message();
    RankContext rank;
    rank.set_job_id(job_id);
    rank.set_generation(0);
    rank.set_rank(0);
    rank.set_incarnation(7);
    JoinRequest join;
    *join.mutable_context() = rank;
    join.set_host("host-a");
    join.set_timeout_seconds(10);
    JoinResponse joined;
    status = workers_->Join(Context().get(), join, &joined);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return rank;
  }

  grpc::Status Set(const RankContext& rank, const std::string& key, const std::string& value) {
    KvSetRequest request;
    *request.mutable_context() = rank;
    request.set_key(key);
    request.set_value(value);
    KvSetResponse response;
    return workers_->KvSet(Context().get(), request, &response);
  }

  // The value of `key`, or "<error: ...>".
  std::string Get(const RankContext& rank, const std::string& key) {
    KvGetRequest request;
    *request.mutable_context() = rank;
    request.set_key(key);
    KvGetResponse response;
    const grpc::Status status = workers_->KvGet(Context().get(), request, &response);
    return status.ok() ? response.value() : "<error: " + status.error_message() + ">";
  }

  std::pair<int64_t, int64_t> NumKeysAndBytes(const RankContext& rank) {
    KvNumKeysRequest request;
    *request.mutable_context() = rank;
    KvNumKeysResponse response;
    const grpc::Status status = workers_->KvNumKeys(Context().get(), request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return {response.num_keys(), response.total_bytes()};
  }

  grpc::Status MultiSet(const RankContext& rank,
                        const std::vector<std::pair<std::string, std::string>>& entries) {
    KvMultiSetRequest request;
    *request.mutable_context() = rank;
    for (const auto& [key, value] : entries) {
      KeyValue* entry = request.add_entries();
      entry->set_key(key);
      entry->set_value(value);
    }
    KvMultiSetResponse response;
    return workers_->KvMultiSet(Context().get(), request, &response);
  }

  grpc::Status Barrier(const RankContext& rank, const std::string& name) {
    BarrierRequest request;
    *request.mutable_context() = rank;
    request.set_name(name);
    request.set_timeout_seconds(10);
    BarrierResponse response;
    return workers_->Barrier(Context().get(), request, &response);
  }

  grpc::Status Publish(const RankContext& rank, const std::vector<std::string>& keys) {
    PublishUniqueIdsRequest request;
    *request.mutable_context() = rank;
    for (const std::string& key : keys) (*request.mutable_ids())[key] = IdFor(key);
    PublishUniqueIdsResponse response;
    return workers_->PublishUniqueIds(Context().get(), request, &response);
  }

  static std::string IdFor(const std::string& key) {
    std::string id(128, '\0');
    for (size_t i = 0; i < id.size(); ++i) id[i] = key[i % key.size()];
    return id;
  }

  // A valid spec a test changes one field of: one node, one process.
  static JobSpec BaseSpec() {
    JobSpec spec;
    spec.add_command("/bin/true");
    spec.mutable_nodes()->set_min(1);
    spec.set_nproc_per_node(1);
    return spec;
  }

  grpc::Status Submit(const JobSpec& spec, SubmitJobResponse* response) {
    SubmitJobRequest request;
    *request.mutable_spec() = spec;
    return jobs_->SubmitJob(Context().get(), request, response);
  }

  std::vector<Job> ListJobs() {
    ListJobsRequest request;
    ListJobsResponse response;
    const grpc::Status status = jobs_->ListJobs(Context().get(), request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return {response.jobs().begin(), response.jobs().end()};
  }

  std::unique_ptr<mesh::testing::InProcessCoordinator> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<WorkerService::Stub> workers_;
  std::unique_ptr<AdminService::Stub> admin_;
  std::unique_ptr<JobService::Stub> jobs_;
};

// ---- gRPC message size -------------------------------------------------------------

TEST_F(LimitsTest, MessageOfMaxBytesPassesOneMoreIsResourceExhaustedAndServingGoesOn) {
  // Values as large as messages, so the message limit is the one hit.
  Start([](CoordinatorConfig& config) {
    config.coordination.kv.max_value_bytes = 1 << 20;
    config.coordination.kv.max_total_bytes = 4 << 20;
  });
  const RankContext rank = JoinedRank("msg");
  ASSERT_TRUE(Set(rank, "small", "kept").ok());

  // A KvSet request of exactly `bytes` on the wire (the value's length
  // prefix grows with it, hence the loop).
  auto request_of = [&](size_t bytes) {
    KvSetRequest request;
    *request.mutable_context() = rank;
    request.set_key("big");
    std::string value(bytes - request.ByteSizeLong(), 'v');
    request.set_value(value);
    while (request.ByteSizeLong() > bytes) {
      value.resize(value.size() - (request.ByteSizeLong() - bytes));
      request.set_value(value);
    }
    EXPECT_EQ(request.ByteSizeLong(), bytes);
    return request;
  };
  KvSetResponse response;
  const KvSetRequest at_limit = request_of(kMaxMessageBytes);
  grpc::Status status = workers_->KvSet(Context().get(), at_limit, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();

  const KvSetRequest over = request_of(kMaxMessageBytes + 1);
  status = workers_->KvSet(Context().get(), over, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  // gRPC's words: "Received message larger than max (65537 vs. 65536)".
  EXPECT_THAT(status.error_message(), HasSubstr(absl::StrCat(kMaxMessageBytes)));

  // The server serves on, on the same channel, with everything stored.
  EXPECT_EQ(Get(rank, "small"), "kept");
  EXPECT_EQ(Get(rank, "big"), at_limit.value());
  EXPECT_EQ(NumKeysAndBytes(rank).first, 2);
}

// ---- KV store --------------------------------------------------------------------------

TEST_F(LimitsTest, KvKeyBytes) {
  Start();
  const RankContext rank = JoinedRank("kv-key");
  const std::string key(kMaxKeyBytes, 'k');
  ASSERT_TRUE(Set(rank, key, "v").ok());
  EXPECT_THAT(Set(rank, key + "k", "w"),
              LimitError(grpc::StatusCode::RESOURCE_EXHAUSTED, "key of 33 bytes", kMaxKeyBytes));
  // Every call that takes a key checks it the same way.
  KvGetRequest get;
  *get.mutable_context() = rank;
  get.set_key(key + "k");
  KvGetResponse got;
  EXPECT_THAT(workers_->KvGet(Context().get(), get, &got),
              LimitError(grpc::StatusCode::RESOURCE_EXHAUSTED, "key of 33 bytes", kMaxKeyBytes));
  EXPECT_EQ(Get(rank, key), "v");
  EXPECT_EQ(NumKeysAndBytes(rank), std::make_pair(int64_t{1}, int64_t{kMaxKeyBytes + 1}));
}

TEST_F(LimitsTest, KvValueBytesAndMultiSetIsAllOrNothing) {
  Start();
  const RankContext rank = JoinedRank("kv-value");
  const std::string value(kMaxValueBytes, 'v');
  ASSERT_TRUE(Set(rank, "a", value).ok());
  EXPECT_THAT(Set(rank, "a", value + "v"), LimitError(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                                      "value of 1025 bytes", kMaxValueBytes));
  // One entry over the limit: none of the call's entries is stored.
  EXPECT_THAT(MultiSet(rank, {{"b", "fine"}, {"c", value + "v"}}),
              LimitError(grpc::StatusCode::RESOURCE_EXHAUSTED, "key 'c'", kMaxValueBytes));
  EXPECT_EQ(Get(rank, "a"), value);
  EXPECT_THAT(Get(rank, "b"), HasSubstr("not set"));
  EXPECT_EQ(NumKeysAndBytes(rank), std::make_pair(int64_t{1}, int64_t{1 + kMaxValueBytes}));
}

TEST_F(LimitsTest, KvKeyCountQuotaIsNotConsumedByAFailedCall) {
  Start();
  const RankContext rank = JoinedRank("kv-keys");
  for (int i = 0; i < kMaxKeys; ++i) ASSERT_TRUE(Set(rank, absl::StrCat("k", i), "v").ok());
  const auto full = NumKeysAndBytes(rank);
  EXPECT_EQ(full.first, kMaxKeys);
  EXPECT_THAT(Set(rank, "one-more", "v"),
              LimitError(grpc::StatusCode::RESOURCE_EXHAUSTED, "keys", kMaxKeys));
  EXPECT_THAT(MultiSet(rank, {{"k0", "new"}, {"other", "v"}}),
              LimitError(grpc::StatusCode::RESOURCE_EXHAUSTED, "keys", kMaxKeys));
  EXPECT_EQ(NumKeysAndBytes(rank), full);
  for (int i = 0; i < kMaxKeys; ++i) EXPECT_EQ(Get(rank, absl::StrCat("k", i)), "v") << i;
  // At the limit, existing keys can still be replaced, and a delete makes room.
  EXPECT_TRUE(Set(rank, "k0", "w").ok());
  EXPECT_EQ(Get(rank, "k0"), "w");
  KvDeleteRequest del;
  *del.mutable_context() = rank;
  del.set_key("k7");
  KvDeleteResponse deleted;
  ASSERT_TRUE(workers_->KvDelete(Context().get(), del, &deleted).ok());
  EXPECT_TRUE(Set(rank, "one-more", "v").ok());
}

TEST_F(LimitsTest, KvTotalBytesQuota) {
  Start();
  const RankContext rank = JoinedRank("kv-bytes");
  // Four entries of 2 + 1022 bytes: exactly kMaxTotalBytes.
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(Set(rank, absl::StrCat("k", i), std::string(1022, 'a' + i)).ok());
  }
  EXPECT_EQ(NumKeysAndBytes(rank), std::make_pair(int64_t{4}, kMaxTotalBytes));
  EXPECT_THAT(Set(rank, "k4", ""),
              LimitError(grpc::StatusCode::RESOURCE_EXHAUSTED, "bytes", kMaxTotalBytes));
  // Growing an existing value counts the growth only.
  EXPECT_THAT(Set(rank, "k0", std::string(1023, 'z')),
              LimitError(grpc::StatusCode::RESOURCE_EXHAUSTED, "bytes", kMaxTotalBytes));
  EXPECT_EQ(NumKeysAndBytes(rank), std::make_pair(int64_t{4}, kMaxTotalBytes));
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(Get(rank, absl::StrCat("k", i)), std::string(1022, 'a' + i));
  // Same size again: fits.
  EXPECT_TRUE(Set(rank, "k0", std::string(1022, 'z')).ok());
}

TEST_F(LimitsTest, KeysPerRequest) {
  Start();
  const RankContext rank = JoinedRank("batch");
  std::vector<std::pair<std::string, std::string>> entries;
  std::vector<std::string> keys;
  for (int i = 0; i < kMaxKeysPerRequest; ++i) {
    entries.emplace_back(absl::StrCat("k", i), absl::StrCat("v", i));
    keys.push_back(absl::StrCat("k", i));
  }
  ASSERT_TRUE(MultiSet(rank, entries).ok());
  const auto stored = NumKeysAndBytes(rank);
  auto over = entries;
  over.emplace_back("k5", "v5");
  EXPECT_THAT(MultiSet(rank, over),
              LimitError(grpc::StatusCode::INVALID_ARGUMENT, "6 keys", kMaxKeysPerRequest));
  EXPECT_EQ(NumKeysAndBytes(rank), stored);
  EXPECT_THAT(Get(rank, "k5"), HasSubstr("not set"));

  std::vector<std::string> over_keys = keys;
  over_keys.push_back("k5");
  // KvMultiGet, KvWait and GetUniqueIds: refused at once, nothing parked.
  KvMultiGetRequest multi_get;
  *multi_get.mutable_context() = rank;
  for (const std::string& key : keys) multi_get.add_keys(key);
  KvMultiGetResponse values;
  ASSERT_TRUE(workers_->KvMultiGet(Context().get(), multi_get, &values).ok());
  EXPECT_EQ(values.values(4), "v4");
  multi_get.add_keys("k5");
  multi_get.set_wait(true);
  EXPECT_THAT(workers_->KvMultiGet(Context().get(), multi_get, &values),
              LimitError(grpc::StatusCode::INVALID_ARGUMENT, "6 keys", kMaxKeysPerRequest));

  KvWaitRequest wait;
  *wait.mutable_context() = rank;
  for (const std::string& key : keys) wait.add_keys(key);
  wait.set_timeout_seconds(10);
  KvWaitResponse waited;
  ASSERT_TRUE(workers_->KvWait(Context().get(), wait, &waited).ok());
  wait.add_keys("k5");
  EXPECT_THAT(workers_->KvWait(Context().get(), wait, &waited),
              LimitError(grpc::StatusCode::INVALID_ARGUMENT, "6 keys", kMaxKeysPerRequest));

  GetUniqueIdsRequest get_ids;
  *get_ids.mutable_context() = rank;
  for (const std::string& key : over_keys) get_ids.add_keys(key);
  get_ids.set_timeout_seconds(10);
  GetUniqueIdsResponse ids;
  EXPECT_THAT(workers_->GetUniqueIds(Context().get(), get_ids, &ids),
              LimitError(grpc::StatusCode::INVALID_ARGUMENT, "6 keys", kMaxKeysPerRequest));
  EXPECT_THAT(Publish(rank, over_keys),
              LimitError(grpc::StatusCode::INVALID_ARGUMENT, "6 keys", kMaxKeysPerRequest));
  EXPECT_EQ(server_->coordination().PendingWaits(), 0u);
  for (int i = 0; i < kMaxKeysPerRequest; ++i) {
    EXPECT_EQ(Get(rank, absl::StrCat("k", i)), absl::StrCat("v", i));
  }
}

// ---- Barriers and unique IDs -------------------------------------------------------------

TEST_F(LimitsTest, BarrierNameBytes) {
  Start();
  const RankContext rank = JoinedRank("barrier-name");
  const std::string name(kMaxKeyBytes, 'b');
  EXPECT_TRUE(Barrier(rank, name).ok());
  EXPECT_THAT(Barrier(rank, name + "b"),
              LimitError(grpc::StatusCode::RESOURCE_EXHAUSTED, "name of 33 bytes", kMaxKeyBytes));
  EXPECT_TRUE(Barrier(rank, name).ok());  // Completed; its result is cached.
}

TEST_F(LimitsTest, BarriersPerGeneration) {
  Start();
  const RankContext rank = JoinedRank("barriers");
  for (int i = 0; i < kMaxBarriers; ++i) {
    ASSERT_TRUE(Barrier(rank, absl::StrCat("b", i)).ok()) << i;
  }
  EXPECT_THAT(Barrier(rank, "one-more"),
              LimitError(grpc::StatusCode::RESOURCE_EXHAUSTED, "barrier 'one-more'", kMaxBarriers));
  // The barriers there are still answer.
  for (int i = 0; i < kMaxBarriers; ++i) EXPECT_TRUE(Barrier(rank, absl::StrCat("b", i)).ok());
  // The KV store is a separate quota, untouched.
  EXPECT_EQ(NumKeysAndBytes(rank).first, 0);
}

TEST_F(LimitsTest, UniqueIdsPerGeneration) {
  Start();
  const RankContext rank = JoinedRank("ids");
  ASSERT_TRUE(Publish(rank, {"g0", "g1"}).ok());
  ASSERT_TRUE(Publish(rank, {"g2"}).ok());
  // All or nothing: g1 again is fine, but g3 and g4 are one too many.
  EXPECT_THAT(Publish(rank, {"g1", "g3", "g4"}),
              LimitError(grpc::StatusCode::RESOURCE_EXHAUSTED, "unique IDs", kMaxUniqueIds));
  EXPECT_THAT(Publish(rank, {"g3"}),
              LimitError(grpc::StatusCode::RESOURCE_EXHAUSTED, "unique IDs", kMaxUniqueIds));
  EXPECT_TRUE(Publish(rank, {"g0", "g1", "g2"}).ok());  // Same bytes: no-op.

  GetUniqueIdsRequest request;
  *request.mutable_context() = rank;
  for (const char* key : {"g0", "g1", "g2"}) request.add_keys(key);
  request.set_timeout_seconds(10);
  GetUniqueIdsResponse response;
  ASSERT_TRUE(workers_->GetUniqueIds(Context().get(), request, &response).ok());
  ASSERT_EQ(response.ids_size(), 3);
  EXPECT_EQ(response.ids(2), IdFor("g2"));
}

// ---- Job spec caps and the queue -----------------------------------------------------------

struct SpecCap {
  std::string name;
  // The base spec at the limit (plus = 0) or one over it (plus = 1).
  std::function<void(JobSpec&, int plus)> apply;
  std::string field;  // Named in the error.
  int64_t limit;
};

TEST_F(LimitsTest, EverySpecCapAcceptsItsLimitAndRejectsOneMore) {
  Start();
  const std::vector<SpecCap> caps = {
      {"world size",
       [](JobSpec& s, int plus) { s.set_nproc_per_node(static_cast<int>(kMaxWorldSize) + plus); },
       "spec.nproc_per_node", kMaxWorldSize},
      {"env vars",
       [](JobSpec& s, int plus) {
         for (int i = 0; i < kMaxEnvVars + plus; ++i)
           (*s.mutable_env())[absl::StrCat("V", i)] = "x";
       },
       "spec.env", kMaxEnvVars},
      {"env bytes",
       [](JobSpec& s, int plus) {
         (*s.mutable_env())["E"] = std::string(kMaxEnvBytes - 1 + plus, 'e');
       },
       "spec.env", kMaxEnvBytes},
      {"argv count",
       [](JobSpec& s, int plus) {
         for (int i = 1; i < kMaxArgvCount + plus; ++i) s.add_command(absl::StrCat("a", i));
       },
       "spec.command", kMaxArgvCount},
      {"argv bytes",
       [](JobSpec& s, int plus) {
         s.add_command(std::string(kMaxArgvBytes - s.command(0).size() + plus, 'a'));
       },
       "spec.command", kMaxArgvBytes},
      {"labels",
       [](JobSpec& s, int plus) {
         for (int i = 0; i < kMaxLabels + plus; ++i)
           (*s.mutable_labels())[absl::StrCat("l", i)] = "";
       },
       "spec.labels", kMaxLabels},
      {"idempotency key bytes",
       [](JobSpec& s, int plus) {
         s.set_idempotency_key(std::string(kMaxIdempotencyKeyBytes + plus, 'i'));
       },
       "spec.idempotency_key", kMaxIdempotencyKeyBytes},
  };
  std::vector<std::pair<std::string, JobSpec>> accepted;  // id, spec sent.
  for (const SpecCap& cap : caps) {
    SCOPED_TRACE(cap.name);
    JobSpec at_limit = BaseSpec();
    cap.apply(at_limit, 0);
    SubmitJobResponse response;
    grpc::Status status = Submit(at_limit, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    accepted.emplace_back(response.job().id(), at_limit);

    JobSpec over = BaseSpec();
    cap.apply(over, 1);
    EXPECT_THAT(Submit(over, &response),
                LimitError(grpc::StatusCode::INVALID_ARGUMENT, cap.field, cap.limit));
  }
  // The job name's length is a fixed rule, not a flag: 1..128 characters.
  JobSpec named = BaseSpec();
  named.set_name(std::string(128, 'n'));
  SubmitJobResponse response;
  ASSERT_TRUE(Submit(named, &response).ok());
  accepted.emplace_back(response.job().id(), named);
  named.set_name(std::string(129, 'n'));
  const grpc::Status long_name = Submit(named, &response);
  EXPECT_EQ(long_name.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(long_name.error_message(), AllOf(HasSubstr("spec.name"), HasSubstr("1..128")));

  // Only the accepted jobs are stored, each with the spec it was sent.
  const std::vector<Job> jobs = ListJobs();
  ASSERT_EQ(jobs.size(), accepted.size());
  for (const auto& [id, sent] : accepted) {
    GetJobRequest get;
    get.set_job_id(id);
    GetJobResponse got;
    ASSERT_TRUE(jobs_->GetJob(Context().get(), get, &got).ok()) << id;
    const JobSpec& spec = got.job().spec();
    EXPECT_EQ(spec.nproc_per_node(), sent.nproc_per_node()) << id;
    EXPECT_EQ(spec.command_size(), sent.command_size()) << id;
    EXPECT_EQ(spec.command(spec.command_size() - 1), sent.command(sent.command_size() - 1)) << id;
    EXPECT_EQ(spec.env_size(), sent.env_size()) << id;
    for (const auto& [name, value] : sent.env()) EXPECT_EQ(spec.env().at(name), value) << id;
    EXPECT_EQ(spec.labels_size(), sent.labels_size()) << id;
    EXPECT_EQ(spec.idempotency_key(), sent.idempotency_key()) << id;
    EXPECT_EQ(spec.name(), sent.name()) << id;
    EXPECT_EQ(got.job().state(), JOB_STATE_PENDING) << id;  // No nodes: queued.
  }
}

TEST_F(LimitsTest, PendingJobsQueue) {
  Start([](CoordinatorConfig& config) { config.jobs.max_pending_jobs = kMaxPendingJobs; });
  std::vector<std::string> ids;
  for (int i = 0; i < kMaxPendingJobs; ++i) {
    JobSpec spec = BaseSpec();
    spec.set_idempotency_key(absl::StrCat("p", i));
    SubmitJobResponse response;
    ASSERT_TRUE(Submit(spec, &response).ok()) << i;
    ids.push_back(response.job().id());
  }
  JobSpec one_more = BaseSpec();
  one_more.set_idempotency_key("p-more");
  SubmitJobResponse response;
  EXPECT_THAT(Submit(one_more, &response),
              LimitError(grpc::StatusCode::RESOURCE_EXHAUSTED, "pending", kMaxPendingJobs));
  ASSERT_EQ(ListJobs().size(), static_cast<size_t>(kMaxPendingJobs));

  // A resubmit of a stored key is the same job, not a new one: answered.
  JobSpec again = BaseSpec();
  again.set_idempotency_key("p1");
  grpc::Status status = Submit(again, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(response.deduplicated());
  EXPECT_EQ(response.job().id(), ids[1]);

  // A job leaving the queue makes room.
  CancelJobRequest cancel;
  cancel.set_job_id(ids[0]);
  CancelJobResponse cancelled;
  ASSERT_TRUE(jobs_->CancelJob(Context().get(), cancel, &cancelled).ok());
  status = Submit(one_more, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  const std::vector<Job> jobs = ListJobs();
  EXPECT_EQ(jobs.size(), static_cast<size_t>(kMaxPendingJobs + 1));
  for (const Job& job : jobs) {
    EXPECT_EQ(job.spec().command(0), "/bin/true");
  }
}

}  // namespace limits_test
}  // namespace mesh::coordinator
