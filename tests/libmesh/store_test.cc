// mesh::Store: one behavioural suite run against every implementation
// (InMemoryStore, PrefixStore over an InMemoryStore, CoordinatorStore
// against an in-process coordinator on 127.0.0.1:0), then what is specific
// to each: namespacing, fencing by generation and incarnation, limits,
// shutdown.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "libmesh/src/coordinator_client.h"
#include "mesh/coordinator_store.h"
#include "mesh/in_memory_store.h"
#include "mesh/prefix_store.h"
#include "mesh/store.h"
#include "mesh/v1/worker.grpc.pb.h"
#include "tests/util/in_process_coordinator.h"
#include "tests/util/status_matchers.h"

namespace mesh {
namespace store_test {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

// How long a call that must time out waits.
constexpr absl::Duration kShortTimeout = absl::Milliseconds(200);
// How long a call that must succeed may wait; far beyond what it needs.
constexpr absl::Duration kLongTimeout = absl::Seconds(30);
// Value limit configured on every store under test.
constexpr size_t kMaxValueBytes = 4096;
// Concurrent Add: threads x adds each.
constexpr int kAddThreads = 8;
constexpr int kAddsPerThread = 100;
// Bounded polling for "a waiter is parked".
constexpr int kPollAttempts = 1000;
constexpr auto kPollInterval = std::chrono::milliseconds(5);

constexpr char kJob[] = "store-test";
constexpr uint64_t kIncarnation = 0x5eed;

using ::mesh::testing::IsOk;
using ::mesh::testing::StatusIs;

// Every byte value, NULs included, and some more NULs at both ends.
std::string BinaryValue() {
  std::string value(1, '\0');
  for (int b = 0; b < 256; ++b) value.push_back(static_cast<char>(b));
  value.append(3, '\0');
  return value;
}

// ---- Harnesses: one store under test and the means to break it -------------

class Harness {
 public:
  virtual ~Harness() = default;
  virtual std::shared_ptr<Store> store() = 0;
  // Makes the store unavailable: InMemoryStore::Shutdown, or the
  // coordinator shutting down.
  virtual void Shutdown() = 0;
  // Calls parked in a blocking wait, as far as the backend can tell.
  virtual int NumBlocked() = 0;
};

InMemoryStoreOptions TestOptions() {
  InMemoryStoreOptions options;
  options.timeout = kLongTimeout;
  options.max_value_bytes = kMaxValueBytes;
  return options;
}

class InMemoryHarness : public Harness {
 public:
  InMemoryHarness() : store_(std::make_shared<InMemoryStore>(TestOptions())) {}
  std::shared_ptr<Store> store() override { return store_; }
  void Shutdown() override { store_->Shutdown(); }
  int NumBlocked() override { return store_->NumBlocked(); }

 private:
  std::shared_ptr<InMemoryStore> store_;
};

class PrefixHarness : public Harness {
 public:
  PrefixHarness()
      : base_(std::make_shared<InMemoryStore>(TestOptions())),
        store_(std::make_shared<PrefixStore>("group", base_)) {}
  std::shared_ptr<Store> store() override { return store_; }
  void Shutdown() override { base_->Shutdown(); }
  int NumBlocked() override { return base_->NumBlocked(); }

 private:
  std::shared_ptr<InMemoryStore> base_;
  std::shared_ptr<PrefixStore> store_;
};

// Joins `rank` of `job` through the raw stub, as the worker runtime will.
absl::Status JoinRank(const std::string& address, const std::string& job, int rank,
                      uint64_t incarnation) {
  auto stub =
      v1::WorkerService::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  v1::JoinRequest request;
  request.mutable_context()->set_job_id(job);
  request.mutable_context()->set_generation(0);
  request.mutable_context()->set_rank(rank);
  request.mutable_context()->set_incarnation(incarnation);
  request.set_host("127.0.0.1");
  request.set_timeout_seconds(absl::ToDoubleSeconds(kLongTimeout));
  v1::JoinResponse response;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + kLongTimeout));
  const grpc::Status status = stub->Join(&ctx, request, &response);
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

class CoordinatorHarness : public Harness {
 public:
  // A coordinator with `world_size`-rank job kJob; rank 0 joined when the
  // world is 1.
  static absl::StatusOr<std::unique_ptr<CoordinatorHarness>> Start(int world_size = 1) {
    coordinator::CoordinatorConfig config = ::mesh::testing::InProcessCoordinator::DefaultConfig();
    // No test here heartbeats; keep joined ranks alive throughout.
    config.coordination.heartbeat_interval = absl::Seconds(1);
    config.coordination.heartbeat_timeout = absl::Minutes(10);
    config.coordination.kv.max_value_bytes = kMaxValueBytes;
    auto coordinator = ::mesh::testing::InProcessCoordinator::Start(config);
    if (!coordinator.ok()) return coordinator.status();
    auto harness =
        std::unique_ptr<CoordinatorHarness>(new CoordinatorHarness(*std::move(coordinator)));
    if (absl::Status s = harness->coordinator_->CreateJob(kJob, world_size); !s.ok()) return s;
    if (world_size == 1) {
      if (absl::Status s = JoinRank(harness->address(), kJob, 0, kIncarnation); !s.ok()) return s;
      auto store = harness->NewStore(RankIdentity{kJob, 0, 0, kIncarnation});
      if (!store.ok()) return store.status();
      harness->store_ = *std::move(store);
    }
    return harness;
  }

  absl::StatusOr<std::shared_ptr<Store>> NewStore(RankIdentity identity) {
    CoordinatorStoreOptions options;
    options.address = address();
    options.identity = std::move(identity);
    options.timeout = kLongTimeout;
    auto store = CoordinatorStore::Create(options);
    if (!store.ok()) return store.status();
    return std::shared_ptr<Store>(*std::move(store));
  }

  std::string address() const { return coordinator_->address(); }
  coordinator::CoordinatorServer& server() { return coordinator_->server(); }

  std::shared_ptr<Store> store() override { return store_; }
  void Shutdown() override { coordinator_->Stop(absl::Seconds(1)); }
  int NumBlocked() override {
    return static_cast<int>(coordinator_->coordination().PendingWaits());
  }

 private:
  explicit CoordinatorHarness(std::unique_ptr<::mesh::testing::InProcessCoordinator> coordinator)
      : coordinator_(std::move(coordinator)) {}

  std::unique_ptr<::mesh::testing::InProcessCoordinator> coordinator_;
  std::shared_ptr<Store> store_;
};

struct StoreKind {
  const char* name;
  std::function<absl::StatusOr<std::unique_ptr<Harness>>()> make;
};

const StoreKind kKinds[] = {
    {"InMemory",
     []() -> absl::StatusOr<std::unique_ptr<Harness>> {
       return std::make_unique<InMemoryHarness>();
     }},
    {"PrefixOverInMemory",
     []() -> absl::StatusOr<std::unique_ptr<Harness>> {
       return std::make_unique<PrefixHarness>();
     }},
    {"Coordinator",
     []() -> absl::StatusOr<std::unique_ptr<Harness>> {
       auto harness = CoordinatorHarness::Start();
       if (!harness.ok()) return harness.status();
       return std::unique_ptr<Harness>(*std::move(harness));
     }},
};

class StoreTest : public ::testing::TestWithParam<StoreKind> {
 protected:
  void SetUp() override {
    auto harness = GetParam().make();
    ASSERT_THAT(harness, IsOk());
    harness_ = *std::move(harness);
    store_ = harness_->store();
  }

  // Polls until `n` calls are parked; false if that never happens.
  bool AwaitBlocked(int n) {
    for (int i = 0; i < kPollAttempts; ++i) {
      if (harness_->NumBlocked() >= n) return true;
      std::this_thread::sleep_for(kPollInterval);
    }
    return false;
  }

  std::unique_ptr<Harness> harness_;
  std::shared_ptr<Store> store_;
};

TEST_P(StoreTest, SetGetTryGetAndOverwrite) {
  ASSERT_THAT(store_->Set("k", "v1"), IsOk());
  EXPECT_EQ(store_->Get("k").value_or("<error>"), "v1");
  EXPECT_EQ(store_->TryGet("k").value_or("<error>"), "v1");
  ASSERT_THAT(store_->Set("k", "v2"), IsOk());
  EXPECT_EQ(store_->Get("k", kShortTimeout).value_or("<error>"), "v2");
  ASSERT_THAT(store_->Set("empty", ""), IsOk());
  EXPECT_EQ(store_->TryGet("empty").value_or("<error>"), "");
}

TEST_P(StoreTest, TryGetOfAbsentKeyIsNotFoundNamingTheKey) {
  EXPECT_THAT(store_->TryGet("nobody-set-this"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("nobody-set-this")));
}

TEST_P(StoreTest, BlockingGetIsReleasedBySetFromAnotherThread) {
  absl::StatusOr<std::string> got = absl::UnknownError("not run");
  std::atomic<bool> returned{false};
  std::thread getter([&] {
    got = store_->Get("late", kLongTimeout);
    returned = true;
  });
  ASSERT_TRUE(AwaitBlocked(1));
  EXPECT_FALSE(returned) << "Get returned before the key was set";
  ASSERT_THAT(store_->Set("late", "here"), IsOk());
  getter.join();
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(*got, "here");
}

TEST_P(StoreTest, BlockingWaitAndMultiGetAreReleasedByAdd) {
  absl::Status waited = absl::UnknownError("not run");
  absl::StatusOr<std::vector<std::string>> got = absl::UnknownError("not run");
  ASSERT_THAT(store_->Set("a", "1"), IsOk());
  std::thread waiter([&] { waited = store_->Wait({"a", "counter"}, kLongTimeout); });
  std::thread multi_getter([&] { got = store_->MultiGet({"counter", "a"}, kLongTimeout); });
  ASSERT_TRUE(AwaitBlocked(2));
  ASSERT_THAT(store_->Add("counter", 5), IsOk());
  waiter.join();
  multi_getter.join();
  EXPECT_THAT(waited, IsOk());
  ASSERT_THAT(got, IsOk());
  EXPECT_THAT(*got, ElementsAre("5", "1"));
}

TEST_P(StoreTest, GetTimesOutNamingTheKey) {
  const absl::Time start = absl::Now();
  EXPECT_THAT(store_->Get("never-set", kShortTimeout),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("never-set")));
  // It waited rather than failing at once (a lower bound only).
  EXPECT_GE(absl::Now() - start, kShortTimeout / 2);
}

TEST_P(StoreTest, DefaultTimeoutAppliesToCallsThatGiveNone) {
  ASSERT_THAT(store_->SetTimeout(kShortTimeout), IsOk());
  EXPECT_EQ(store_->timeout(), kShortTimeout);
  EXPECT_THAT(store_->Get("never-set"),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("never-set")));
  EXPECT_THAT(store_->Wait({"never-set"}), StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(store_->MultiGet({"never-set"}), StatusIs(absl::StatusCode::kDeadlineExceeded));
}

TEST_P(StoreTest, WaitAndMultiGetTimeOutNamingOnlyTheMissingKeys) {
  ASSERT_THAT(store_->Set("present", "x"), IsOk());
  const absl::Status waited = store_->Wait({"present", "missing-1"}, kShortTimeout);
  EXPECT_THAT(waited, StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("missing-1")));
  EXPECT_THAT(std::string(waited.message()), Not(HasSubstr("present")));
  EXPECT_THAT(store_->MultiGet({"missing-2", "present"}, kShortTimeout),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("missing-2")));
  EXPECT_THAT(store_->Wait({"present"}, kShortTimeout), IsOk());
  // Empty lists succeed at once.
  EXPECT_THAT(store_->Wait({}, kShortTimeout), IsOk());
  auto none = store_->MultiGet({}, kShortTimeout);
  ASSERT_THAT(none, IsOk());
  EXPECT_TRUE(none->empty());
}

TEST_P(StoreTest, AddCountsFromZeroAndRejectsNonIntegers) {
  EXPECT_EQ(store_->Add("n", 5).value_or(-1), 5);
  EXPECT_EQ(store_->Add("n", -7).value_or(-1), -2);
  EXPECT_EQ(store_->Add("n", 0).value_or(-1), -2);
  EXPECT_EQ(store_->TryGet("n").value_or("<error>"), "-2");
  ASSERT_THAT(store_->Set("text", "abc"), IsOk());
  EXPECT_THAT(store_->Add("text", 1), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(store_->TryGet("text").value_or("<error>"), "abc");
  ASSERT_THAT(store_->Set("big", "9223372036854775807"), IsOk());
  EXPECT_THAT(store_->Add("big", 1), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(store_->TryGet("big").value_or("<error>"), "9223372036854775807");
}

TEST_P(StoreTest, ConcurrentAddsGiveExactTotalsAndDistinctResults) {
  std::vector<std::vector<int64_t>> seen(kAddThreads);
  std::vector<absl::Status> errors(kAddThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kAddThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kAddsPerThread; ++i) {
        auto value = store_->Add("counter", 1);
        if (!value.ok()) {
          errors[t] = value.status();
          return;
        }
        seen[t].push_back(*value);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  std::vector<int64_t> all;
  for (int t = 0; t < kAddThreads; ++t) {
    EXPECT_THAT(errors[t], IsOk()) << "thread " << t;
    all.insert(all.end(), seen[t].begin(), seen[t].end());
  }
  // Atomic adds hand out every value from 1 to the total exactly once.
  std::sort(all.begin(), all.end());
  std::vector<int64_t> expected(kAddThreads * kAddsPerThread);
  for (size_t i = 0; i < expected.size(); ++i) expected[i] = static_cast<int64_t>(i) + 1;
  EXPECT_EQ(all, expected);
  EXPECT_EQ(store_->TryGet("counter").value_or("<error>"),
            absl::StrCat(kAddThreads * kAddsPerThread));
}

TEST_P(StoreTest, CompareSetFollowsC10dRules) {
  // Empty `expected` matches an absent key: creates it.
  auto r = store_->CompareSet("k", "", "v1");
  ASSERT_THAT(r, IsOk());
  EXPECT_TRUE(r->swapped);
  EXPECT_TRUE(r->present);
  EXPECT_EQ(r->value, "v1");
  // Matching value: swaps.
  r = store_->CompareSet("k", "v1", "v2");
  ASSERT_THAT(r, IsOk());
  EXPECT_TRUE(r->swapped);
  EXPECT_EQ(r->value, "v2");
  EXPECT_EQ(store_->TryGet("k").value_or("<error>"), "v2");
  // Mismatch: unchanged, and the current value is reported.
  r = store_->CompareSet("k", "v1", "v3");
  ASSERT_THAT(r, IsOk());
  EXPECT_FALSE(r->swapped);
  EXPECT_TRUE(r->present);
  EXPECT_EQ(r->value, "v2");
  // Empty `expected` does not match a non-empty value.
  r = store_->CompareSet("k", "", "v4");
  ASSERT_THAT(r, IsOk());
  EXPECT_FALSE(r->swapped);
  EXPECT_EQ(r->value, "v2");
  // Non-empty `expected` never matches an absent key, which stays absent.
  r = store_->CompareSet("absent", "something", "v");
  ASSERT_THAT(r, IsOk());
  EXPECT_FALSE(r->swapped);
  EXPECT_FALSE(r->present);
  EXPECT_EQ(r->value, "");
  EXPECT_THAT(store_->TryGet("absent"), StatusIs(absl::StatusCode::kNotFound));
  // Empty `expected` matches a key that holds "" (c10d compares values).
  ASSERT_THAT(store_->Set("blank", ""), IsOk());
  r = store_->CompareSet("blank", "", "filled");
  ASSERT_THAT(r, IsOk());
  EXPECT_TRUE(r->swapped);
  EXPECT_EQ(store_->TryGet("blank").value_or("<error>"), "filled");
}

TEST_P(StoreTest, CompareSetReleasesWaiters) {
  absl::StatusOr<std::string> got = absl::UnknownError("not run");
  std::thread getter([&] { got = store_->Get("leader", kLongTimeout); });
  ASSERT_TRUE(AwaitBlocked(1));
  ASSERT_THAT(store_->CompareSet("leader", "", "rank-0"), IsOk());
  getter.join();
  EXPECT_EQ(got.value_or("<error>"), "rank-0");
}

TEST_P(StoreTest, DeleteKeyAndNumKeys) {
  EXPECT_EQ(store_->NumKeys().value_or(-1), 0);
  ASSERT_THAT(store_->Set("a", "1"), IsOk());
  ASSERT_THAT(store_->Set("b", "2"), IsOk());
  ASSERT_THAT(store_->Add("c", 3), IsOk());
  EXPECT_EQ(store_->NumKeys().value_or(-1), 3);
  EXPECT_EQ(store_->DeleteKey("b").value_or(false), true);
  EXPECT_EQ(store_->DeleteKey("b").value_or(true), false);
  EXPECT_THAT(store_->TryGet("b"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(store_->NumKeys().value_or(-1), 2);
  // A deleted key can be set again, and a Get waits for that.
  ASSERT_THAT(store_->DeleteKey("a"), IsOk());
  EXPECT_THAT(store_->Get("a", kShortTimeout), StatusIs(absl::StatusCode::kDeadlineExceeded));
  ASSERT_THAT(store_->Set("a", "again"), IsOk());
  EXPECT_EQ(store_->Get("a", kShortTimeout).value_or("<error>"), "again");
}

TEST_P(StoreTest, MultiSetAndMultiGetKeepOrderAndLastDuplicateWins) {
  const std::vector<std::string> keys = {"x", "y", "z", "x"};
  const std::vector<std::string> values = {"1", "2", "3", "4"};
  ASSERT_THAT(store_->MultiSet(keys, values), IsOk());
  auto got = store_->MultiGet({"z", "x", "y"}, kShortTimeout);
  ASSERT_THAT(got, IsOk());
  EXPECT_THAT(*got, ElementsAre("3", "4", "2"));
  EXPECT_THAT(store_->MultiSet({"a", "b"}, {"only one"}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(store_->TryGet("a"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(store_->MultiSet({}, {}), IsOk());
}

TEST_P(StoreTest, BinaryValuesWithNulBytesRoundTrip) {
  const std::string value = BinaryValue();
  ASSERT_EQ(value.size(), 260u);
  ASSERT_THAT(store_->Set("bin", value), IsOk());
  EXPECT_EQ(store_->Get("bin", kShortTimeout).value_or("<error>"), value);
  EXPECT_EQ(store_->TryGet("bin").value_or("<error>"), value);
  const std::string other = std::string("\0\0x\0", 4);
  ASSERT_THAT(store_->MultiSet({"bin2", "bin3"}, {other, value}), IsOk());
  auto got = store_->MultiGet({"bin3", "bin2"}, kShortTimeout);
  ASSERT_THAT(got, IsOk());
  EXPECT_THAT(*got, ElementsAre(value, other));
  // Compared byte for byte, not as C strings: a prefix up to the NUL must
  // not match.
  auto r = store_->CompareSet("bin2", std::string("\0\0x", 3), "no");
  ASSERT_THAT(r, IsOk());
  EXPECT_FALSE(r->swapped);
  r = store_->CompareSet("bin2", other, value);
  ASSERT_THAT(r, IsOk());
  EXPECT_TRUE(r->swapped);
  EXPECT_EQ(store_->TryGet("bin2").value_or("<error>"), value);
}

TEST_P(StoreTest, BadArgumentsAreInvalidArgument) {
  EXPECT_THAT(store_->Set("", "v"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(store_->Get(""), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(store_->TryGet(""), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(store_->Add("", 1), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(store_->CompareSet("", "", "v"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(store_->DeleteKey(""), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(store_->Wait({"ok", ""}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(store_->MultiGet({""}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(store_->MultiSet({""}, {"v"}), StatusIs(absl::StatusCode::kInvalidArgument));
  for (absl::Duration bad : {absl::ZeroDuration(), -absl::Seconds(1), absl::InfiniteDuration()}) {
    EXPECT_THAT(store_->Get("k", bad), StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(store_->Wait({"k"}, bad), StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(store_->MultiGet({"k"}, bad), StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(store_->SetTimeout(bad), StatusIs(absl::StatusCode::kInvalidArgument));
  }
  EXPECT_EQ(store_->timeout(), kLongTimeout);
  EXPECT_EQ(store_->NumKeys().value_or(-1), 0);
}

TEST_P(StoreTest, OversizedValuesAreResourceExhaustedAndStoreNothing) {
  const std::string big(kMaxValueBytes + 1, 'x');
  EXPECT_THAT(store_->Set("big", big),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("big")));
  EXPECT_THAT(store_->TryGet("big"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(store_->MultiSet({"small", "big"}, {"ok", big}),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(store_->TryGet("small"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(store_->CompareSet("big", "", big), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(store_->TryGet("big"), StatusIs(absl::StatusCode::kNotFound));
  // At the limit is fine.
  EXPECT_THAT(store_->Set("big", std::string(kMaxValueBytes, 'x')), IsOk());
}

TEST_P(StoreTest, ShutdownFailsBlockedAndLaterCallsWithUnavailable) {
  absl::StatusOr<std::string> got = absl::UnknownError("not run");
  std::thread getter([&] { got = store_->Get("never-set", kLongTimeout); });
  ASSERT_TRUE(AwaitBlocked(1));
  const absl::Time start = absl::Now();
  harness_->Shutdown();
  getter.join();
  EXPECT_THAT(got, StatusIs(absl::StatusCode::kUnavailable));
  // Released by the shutdown, not by its 30 s timeout.
  EXPECT_LT(absl::Now() - start, kLongTimeout);
  EXPECT_THAT(store_->Set("k", "v"), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(store_->TryGet("k"), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(store_->Get("k", kShortTimeout), StatusIs(absl::StatusCode::kUnavailable));
}

INSTANTIATE_TEST_SUITE_P(AllStores, StoreTest, ::testing::ValuesIn(kKinds),
                         [](const ::testing::TestParamInfo<StoreKind>& info) {
                           return std::string(info.param.name);
                         });

// ---- InMemoryStore -------------------------------------------------------------

TEST(InMemoryStoreTest, KeyLimitsAreResourceExhausted) {
  InMemoryStoreOptions options;
  options.max_keys = 2;
  options.max_key_bytes = 8;
  InMemoryStore store(options);
  ASSERT_THAT(store.Set("a", "1"), IsOk());
  ASSERT_THAT(store.Add("b", 1), IsOk());
  EXPECT_THAT(store.Set("c", "3"), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(store.Add("c", 1), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(store.CompareSet("c", "", "3"), StatusIs(absl::StatusCode::kResourceExhausted));
  // Replacing existing keys needs no new slot.
  EXPECT_THAT(store.MultiSet({"a", "b"}, {"x", "y"}), IsOk());
  EXPECT_THAT(store.MultiSet({"a", "c"}, {"x", "y"}),
              StatusIs(absl::StatusCode::kResourceExhausted));
  ASSERT_THAT(store.DeleteKey("b"), IsOk());
  EXPECT_THAT(store.Set("too-long-key", "v"), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(store.Set("c", "3"), IsOk());
  EXPECT_EQ(store.NumKeys().value_or(-1), 2);
}

TEST(InMemoryStoreTest, DestructorReleasesBlockedCallsWithUnavailable) {
  auto store = std::make_unique<InMemoryStore>(TestOptions());
  InMemoryStore* raw = store.get();
  std::vector<absl::Status> results(3, absl::UnknownError("not run"));
  std::vector<std::thread> waiters;
  waiters.emplace_back([&] { results[0] = raw->Get("k", kLongTimeout).status(); });
  waiters.emplace_back([&] { results[1] = raw->Wait({"k"}, kLongTimeout); });
  waiters.emplace_back([&] { results[2] = raw->MultiGet({"k"}, kLongTimeout).status(); });
  for (int i = 0; i < kPollAttempts && raw->NumBlocked() < 3; ++i) {
    std::this_thread::sleep_for(kPollInterval);
  }
  ASSERT_EQ(raw->NumBlocked(), 3);
  store.reset();  // Returns only once the three have left the store.
  for (auto& t : waiters) t.join();
  for (const absl::Status& s : results) {
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("shut down")));
  }
}

// ---- PrefixStore -------------------------------------------------------------

TEST(PrefixStoreTest, KeysLiveUnderThePrefixInTheBase) {
  auto base = std::make_shared<InMemoryStore>(TestOptions());
  auto a = std::make_shared<PrefixStore>("a", base);
  PrefixStore b("b", base);
  PrefixStore nested("c", a);
  ASSERT_THAT(a->Set("k", "in a"), IsOk());
  ASSERT_THAT(nested.Set("k", "in a/c"), IsOk());
  EXPECT_EQ(base->TryGet("a/k").value_or("<error>"), "in a");
  EXPECT_EQ(base->TryGet("a/c/k").value_or("<error>"), "in a/c");
  EXPECT_EQ(a->TryGet("c/k").value_or("<error>"), "in a/c");
  EXPECT_THAT(b.TryGet("k"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("b/k")));
  ASSERT_THAT(b.MultiSet({"k"}, {"in b"}), IsOk());
  EXPECT_EQ(a->TryGet("k").value_or("<error>"), "in a");
  EXPECT_EQ(b.TryGet("k").value_or("<error>"), "in b");
  EXPECT_EQ(b.DeleteKey("k").value_or(false), true);
  EXPECT_EQ(a->TryGet("k").value_or("<error>"), "in a");
  // Errors name the full key.
  EXPECT_THAT(b.Get("missing", kShortTimeout),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("'b/missing'")));
}

TEST(PrefixStoreTest, NumKeysCountsTheWholeBaseStoreAsC10dDoes) {
  auto base = std::make_shared<InMemoryStore>(TestOptions());
  PrefixStore a("a", base);
  PrefixStore b("b", base);
  ASSERT_THAT(a.Set("k1", "1"), IsOk());
  ASSERT_THAT(a.Set("k2", "2"), IsOk());
  ASSERT_THAT(base->Set("outside", "3"), IsOk());
  EXPECT_EQ(a.NumKeys().value_or(-1), 3);
  EXPECT_EQ(b.NumKeys().value_or(-1), 3);
}

TEST(PrefixStoreTest, TimeoutStartsAsTheBasesAndIsItsOwn) {
  auto base = std::make_shared<InMemoryStore>(TestOptions());
  PrefixStore a("a", base);
  EXPECT_EQ(a.timeout(), kLongTimeout);
  ASSERT_THAT(a.SetTimeout(kShortTimeout), IsOk());
  EXPECT_EQ(base->timeout(), kLongTimeout);
  EXPECT_THAT(a.Get("never-set"), StatusIs(absl::StatusCode::kDeadlineExceeded));
}

TEST(PrefixStoreTest, KeepsItsBaseAlive) {
  auto base = std::make_shared<InMemoryStore>(TestOptions());
  std::weak_ptr<InMemoryStore> weak = base;
  PrefixStore a("a", std::move(base));
  EXPECT_FALSE(weak.expired());
  EXPECT_THAT(a.Set("k", "v"), IsOk());
}

// ---- CoordinatorStore ----------------------------------------------------------

TEST(CoordinatorStoreTest, CreateRejectsBadOptions) {
  CoordinatorStoreOptions good;
  good.address = "127.0.0.1:1";
  good.identity = RankIdentity{kJob, 0, 0, kIncarnation};
  EXPECT_THAT(CoordinatorStore::Create(good), IsOk());
  auto bad = good;
  bad.address = "";
  EXPECT_THAT(CoordinatorStore::Create(bad), StatusIs(absl::StatusCode::kInvalidArgument));
  bad = good;
  bad.identity.job_id = "";
  EXPECT_THAT(CoordinatorStore::Create(bad), StatusIs(absl::StatusCode::kInvalidArgument));
  bad = good;
  bad.identity.rank = -1;
  EXPECT_THAT(CoordinatorStore::Create(bad), StatusIs(absl::StatusCode::kInvalidArgument));
  bad = good;
  bad.timeout = absl::ZeroDuration();
  EXPECT_THAT(CoordinatorStore::Create(bad), StatusIs(absl::StatusCode::kInvalidArgument));
  bad = good;
  bad.rpc_margin = -absl::Seconds(1);
  EXPECT_THAT(CoordinatorStore::Create(bad), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(CoordinatorStoreTest, UnreachableCoordinatorIsUnavailableNamingTheAddress) {
  auto harness = CoordinatorHarness::Start();
  ASSERT_THAT(harness, IsOk());
  const std::string address = (*harness)->address();
  (*harness)->Shutdown();
  // A fresh channel to the now closed port fails fast; no wait-for-ready.
  auto store = (*harness)->NewStore(RankIdentity{kJob, 0, 0, kIncarnation});
  ASSERT_THAT(store, IsOk());
  EXPECT_THAT((*store)->Set("k", "v"),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr(address)));
  EXPECT_THAT((*store)->Get("k", kShortTimeout), StatusIs(absl::StatusCode::kUnavailable));
}

TEST(CoordinatorStoreTest, StaleGenerationIsAbortedForPendingAndLaterCalls) {
  auto harness = CoordinatorHarness::Start();
  ASSERT_THAT(harness, IsOk());
  CoordinatorHarness& h = **harness;
  std::shared_ptr<Store> store = h.store();
  ASSERT_THAT(store->Set("k", "v"), IsOk());
  absl::StatusOr<std::string> got = absl::UnknownError("not run");
  std::thread getter([&] { got = store->Get("never-set", kLongTimeout); });
  for (int i = 0; i < kPollAttempts && h.server().coordination().PendingWaits() < 1; ++i) {
    std::this_thread::sleep_for(kPollInterval);
  }
  ASSERT_EQ(h.server().coordination().PendingWaits(), 1u);
  ASSERT_THAT(h.server().coordination().BumpGeneration(kJob, "test restart"), IsOk());
  getter.join();
  EXPECT_THAT(got, StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT(store->Set("k", "v"), StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT(store->TryGet("k"), StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT(store->Add("n", 1), StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT(store->NumKeys(), StatusIs(absl::StatusCode::kAborted));
}

TEST(CoordinatorStoreTest, OtherIncarnationOfAJoinedRankIsAborted) {
  auto harness = CoordinatorHarness::Start();
  ASSERT_THAT(harness, IsOk());
  auto impostor = (*harness)->NewStore(RankIdentity{kJob, 0, 0, kIncarnation + 1});
  ASSERT_THAT(impostor, IsOk());
  EXPECT_THAT((*impostor)->Set("k", "v"), StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT((*harness)->store()->TryGet("k"), StatusIs(absl::StatusCode::kNotFound));
}

TEST(CoordinatorStoreTest, UnjoinedRankIsFailedPreconditionAndUnknownJobIsNotFound) {
  auto harness = CoordinatorHarness::Start(/*world_size=*/2);
  ASSERT_THAT(harness, IsOk());
  auto unjoined = (*harness)->NewStore(RankIdentity{kJob, 0, 1, kIncarnation});
  ASSERT_THAT(unjoined, IsOk());
  EXPECT_THAT((*unjoined)->Set("k", "v"), StatusIs(absl::StatusCode::kFailedPrecondition));
  auto stranger = (*harness)->NewStore(RankIdentity{"no-such-job", 0, 0, kIncarnation});
  ASSERT_THAT(stranger, IsOk());
  EXPECT_THAT((*stranger)->Set("k", "v"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no-such-job")));
}

TEST(CoordinatorStoreTest, RanksOfOneGenerationShareKeys) {
  auto harness = CoordinatorHarness::Start(/*world_size=*/2);
  ASSERT_THAT(harness, IsOk());
  CoordinatorHarness& h = **harness;
  // Join blocks until the whole world has joined, so the ranks join at once.
  std::vector<absl::Status> joined(2, absl::UnknownError("not run"));
  std::vector<std::thread> joiners;
  for (int r = 0; r < 2; ++r) {
    joiners.emplace_back([&, r] { joined[r] = JoinRank(h.address(), kJob, r, kIncarnation + r); });
  }
  for (auto& t : joiners) t.join();
  ASSERT_THAT(joined[0], IsOk());
  ASSERT_THAT(joined[1], IsOk());
  auto rank0 = h.NewStore(RankIdentity{kJob, 0, 0, kIncarnation});
  auto rank1 = h.NewStore(RankIdentity{kJob, 0, 1, kIncarnation + 1});
  ASSERT_THAT(rank0, IsOk());
  ASSERT_THAT(rank1, IsOk());
  absl::StatusOr<std::string> got = absl::UnknownError("not run");
  std::thread reader([&] { got = (*rank1)->Get("addr/0", kLongTimeout); });
  ASSERT_THAT((*rank0)->Set("addr/0", BinaryValue()), IsOk());
  reader.join();
  EXPECT_EQ(got.value_or("<error>"), BinaryValue());
  EXPECT_EQ((*rank0)->Add("arrived", 1).value_or(-1), 1);
  EXPECT_EQ((*rank1)->Add("arrived", 1).value_or(-1), 2);
}

// A client whose waiting calls fail the way gRPC does when the transport's
// deadline fires before the coordinator answers, and which records the
// CompareSet calls it gets.
class DeadlineFakeClient final : public internal::CoordinatorClient {
 public:
  const RankIdentity& identity() const override { return identity_; }
  const std::string& target() const override { return target_; }

  absl::Status KvSet(absl::string_view, absl::string_view, absl::Duration) override {
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> KvGet(absl::string_view, bool, absl::Duration) override {
    return TransportDeadline();
  }
  absl::StatusOr<int64_t> KvAdd(absl::string_view, int64_t, absl::Duration) override { return 0; }
  absl::StatusOr<internal::KvCompareSetReply> KvCompareSet(absl::string_view,
                                                           std::optional<std::string> expected,
                                                           absl::string_view desired,
                                                           absl::Duration) override {
    compare_set_expected.push_back(expected);
    // The key holds "": "absent" does not match, "" does.
    internal::KvCompareSetReply reply;
    reply.present = true;
    if (expected.has_value() && expected->empty()) {
      reply.swapped = true;
      reply.value = std::string(desired);
    }
    return reply;
  }
  absl::StatusOr<int64_t> KvDelete(absl::string_view, bool, absl::Duration) override { return 0; }
  absl::StatusOr<internal::KvListReply> KvList(absl::string_view, absl::string_view, int,
                                               absl::Duration) override {
    return internal::KvListReply{};
  }
  absl::StatusOr<internal::KvStatsReply> KvNumKeys(absl::Duration) override {
    return internal::KvStatsReply{};
  }
  absl::Status KvWait(absl::Span<const std::string>, absl::Duration) override {
    return TransportDeadline();
  }
  absl::StatusOr<std::vector<std::string>> KvMultiGet(absl::Span<const std::string>, bool,
                                                      absl::Duration) override {
    return TransportDeadline();
  }
  absl::Status KvMultiSet(absl::Span<const std::string>, absl::Span<const std::string>,
                          absl::Duration) override {
    return absl::OkStatus();
  }

  std::vector<std::optional<std::string>> compare_set_expected;

 private:
  static absl::Status TransportDeadline() {
    return absl::DeadlineExceededError("WorkerService.KvGet to fake:1: Deadline Exceeded");
  }

  const RankIdentity identity_{kJob, 0, 0, kIncarnation};
  const std::string target_ = "fake:1";
};

TEST(CoordinatorStoreTest, TransportDeadlineStillNamesTheKeys) {
  CoordinatorStore store(std::make_shared<DeadlineFakeClient>(), kShortTimeout);
  EXPECT_THAT(store.Get("slow-key"),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       AllOf(HasSubstr("'slow-key'"), HasSubstr("Deadline Exceeded"))));
  EXPECT_THAT(store.Wait({"k1", "k2"}),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("'k1', 'k2'")));
  EXPECT_THAT(store.MultiGet({"k3"}),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("'k3'")));
}

TEST(CoordinatorStoreTest, EmptyExpectedTriesAbsentThenEmpty) {
  auto client = std::make_shared<DeadlineFakeClient>();
  CoordinatorStore store(client, kShortTimeout);
  auto r = store.CompareSet("k", "", "v");
  ASSERT_THAT(r, IsOk());
  EXPECT_TRUE(r->swapped);
  ASSERT_EQ(client->compare_set_expected.size(), 2u);
  EXPECT_EQ(client->compare_set_expected[0], std::nullopt);
  EXPECT_EQ(client->compare_set_expected[1], std::optional<std::string>(""));
  // A non-empty expected is sent as is, in one call.
  client->compare_set_expected.clear();
  ASSERT_THAT(store.CompareSet("k", "old", "v"), IsOk());
  ASSERT_EQ(client->compare_set_expected.size(), 1u);
  EXPECT_EQ(client->compare_set_expected[0], std::optional<std::string>("old"));
}

}  // namespace store_test
}  // namespace mesh
