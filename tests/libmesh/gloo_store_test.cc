// GlooStore: gloo's rendezvous over mesh stores. Ranks are threads; each
// builds a real gloo context over the TCP transport on 127.0.0.1 through
// the adapter, then runs a real allreduce. Failures must surface as gloo
// exceptions that keep the store's message.
#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "libmesh/src/backends/gloo/gloo_store.h"
#include "mesh/in_memory_store.h"
#include "mesh/prefix_store.h"

namespace mesh::gloo_backend {
namespace gloo_store_test {

using ::testing::AllOf;
using ::testing::HasSubstr;

// Rendezvous and collectives that must succeed get this long.
constexpr std::chrono::milliseconds kGlooTimeout = std::chrono::seconds(30);
// A wait that must time out.
constexpr std::chrono::milliseconds kShortWait = std::chrono::milliseconds(200);
constexpr absl::Duration kShortTimeout = absl::Milliseconds(200);

// One store for the whole binary, as one coordinator generation is shared by
// every process group of a job; each test gets its own PrefixStore in it.
std::shared_ptr<InMemoryStore> SharedStore() {
  static auto* store = new std::shared_ptr<InMemoryStore>(std::make_shared<InMemoryStore>());
  return *store;
}

// Unique per test run, so that --gtest_repeat never finds the addresses an
// earlier run published under the same prefix.
std::string TestPrefix() {
  static std::atomic<int> runs{0};
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return absl::StrCat(info->test_suite_name(), ".", info->name(), "#", runs++);
}

std::shared_ptr<::gloo::transport::Device> LoopbackDevice() {
  ::gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  return ::gloo::transport::tcp::CreateDevice(attr);
}

struct AllreduceCase {
  int world_size;
  size_t elements;
};

class GlooAllreduceTest : public ::testing::TestWithParam<AllreduceCase> {};

TEST_P(GlooAllreduceTest, RanksRendezvousThroughTheAdapterAndSum) {
  const int world = GetParam().world_size;
  const size_t n = GetParam().elements;
  const std::string prefix = TestPrefix();
  auto store = std::make_shared<GlooStore>(std::make_shared<PrefixStore>(prefix, SharedStore()));
  std::vector<std::vector<double>> data(world);
  std::vector<std::string> errors(world);
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      try {
        auto device = LoopbackDevice();
        auto context = std::make_shared<::gloo::rendezvous::Context>(r, world);
        context->setTimeout(kGlooTimeout);
        context->connectFullMesh(*store, device);
        data[r].resize(n);
        for (size_t i = 0; i < n; ++i) data[r][i] = 1000.0 * r + static_cast<double>(i);
        ::gloo::AllreduceOptions opts(context);
        opts.setOutput(data[r].data(), n);
        opts.setReduceFunction(
            static_cast<void (*)(void*, const void*, const void*, size_t)>(&::gloo::sum<double>));
        ::gloo::allreduce(opts);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  // sum over r of (1000 r + i) = 1000 w(w-1)/2 + w i; exact in double.
  const double rank_sum = 1000.0 * world * (world - 1) / 2;
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    ASSERT_EQ(data[r].size(), n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(data[r][i], rank_sum + world * static_cast<double>(i))
          << "rank " << r << " element " << i;
    }
  }
  // Every rank published its addresses under the test's prefix.
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(SharedStore()->TryGet(absl::StrCat(prefix, "/", r)).ok()) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(WorldsAndSizes, GlooAllreduceTest,
                         ::testing::Values(AllreduceCase{2, 1}, AllreduceCase{2, 1000},
                                           AllreduceCase{3, 7}, AllreduceCase{3, 1009},
                                           AllreduceCase{4, 3}, AllreduceCase{4, 4096}),
                         [](const ::testing::TestParamInfo<AllreduceCase>& info) {
                           return absl::StrCat("world", info.param.world_size, "_n",
                                               info.param.elements);
                         });

// ---- Batching --------------------------------------------------------------------

// Counts the calls that reach the underlying store.
class CountingStore final : public Store {
 public:
  explicit CountingStore(std::shared_ptr<Store> base) : Store(base->timeout()), base_(base) {}
  std::atomic<int> sets{0}, gets{0}, waits{0}, multi_gets{0};

 private:
  absl::Status DoSet(const std::string& key, absl::string_view value) override {
    ++sets;
    return base_->Set(key, value);
  }
  absl::StatusOr<std::string> DoGet(const std::string& key, absl::Duration timeout) override {
    ++gets;
    return base_->Get(key, timeout);
  }
  absl::StatusOr<std::string> DoTryGet(const std::string& key) override {
    ++gets;
    return base_->TryGet(key);
  }
  absl::Status DoWait(absl::Span<const std::string> keys, absl::Duration timeout) override {
    ++waits;
    return base_->Wait(keys, timeout);
  }
  absl::StatusOr<int64_t> DoAdd(const std::string& key, int64_t delta) override {
    return base_->Add(key, delta);
  }
  absl::StatusOr<CompareSetResult> DoCompareSet(const std::string& key, absl::string_view expected,
                                                absl::string_view desired) override {
    return base_->CompareSet(key, expected, desired);
  }
  absl::StatusOr<bool> DoDeleteKey(const std::string& key) override {
    return base_->DeleteKey(key);
  }
  absl::StatusOr<int64_t> DoNumKeys() override { return base_->NumKeys(); }
  absl::StatusOr<std::vector<std::string>> DoMultiGet(absl::Span<const std::string> keys,
                                                      absl::Duration timeout) override {
    ++multi_gets;
    return base_->MultiGet(keys, timeout);
  }
  absl::Status DoMultiSet(absl::Span<const std::string> keys,
                          absl::Span<const std::string> values) override {
    return base_->MultiSet(keys, values);
  }

  std::shared_ptr<Store> base_;
};

// With the group size, a member's whole rendezvous is two sets and two
// MultiGets, however many peers it has (gloo alone would wait and get per
// peer), and the mesh it builds still works.
TEST(GlooStoreTest, GroupSizeBatchesTheRendezvousIntoConstantRoundTrips) {
  constexpr int kWorld = 5;
  constexpr size_t kElements = 64;
  auto shared = std::make_shared<PrefixStore>(TestPrefix(), SharedStore());
  std::vector<std::shared_ptr<CountingStore>> counters;
  for (int r = 0; r < kWorld; ++r) counters.push_back(std::make_shared<CountingStore>(shared));
  std::vector<std::vector<float>> data(kWorld, std::vector<float>(kElements));
  std::vector<std::string> errors(kWorld);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kWorld; ++r) {
    ranks.emplace_back([&, r] {
      try {
        GlooStore store(counters[r], kWorld);
        auto context = std::make_shared<::gloo::rendezvous::Context>(r, kWorld);
        context->setTimeout(kGlooTimeout);
        auto device = LoopbackDevice();
        context->connectFullMesh(store, device);
        for (size_t i = 0; i < kElements; ++i) data[r][i] = static_cast<float>(r + 1);
        ::gloo::AllreduceOptions opts(context);
        opts.setOutput(data[r].data(), kElements);
        opts.setReduceFunction(
            static_cast<void (*)(void*, const void*, const void*, size_t)>(&::gloo::sum<float>));
        ::gloo::allreduce(opts);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(data[r][0], 15.0f) << "rank " << r;
    // "rank_<r>" (host name) and "<r>" (addresses); one MultiGet per family
    // read (rank 0 reads no lower rank's host name).
    EXPECT_EQ(counters[r]->sets.load(), 2) << "rank " << r;
    EXPECT_EQ(counters[r]->multi_gets.load(), r == 0 ? 1 : 2) << "rank " << r;
    EXPECT_EQ(counters[r]->gets.load(), 0) << "rank " << r;
    EXPECT_EQ(counters[r]->waits.load(), 0) << "rank " << r;
  }
}

TEST(GlooStoreTest, KeysThatAreNotMemberRanksBypassTheBatch) {
  auto counter =
      std::make_shared<CountingStore>(std::make_shared<PrefixStore>(TestPrefix(), SharedStore()));
  GlooStore store(counter, 2);
  store.set("other", {'x'});
  store.set("7", {'y'});  // Outside 0..1.
  EXPECT_EQ(store.get("other"), std::vector<char>{'x'});
  EXPECT_EQ(store.get("7"), std::vector<char>{'y'});
  EXPECT_EQ(counter->gets.load(), 2);
  EXPECT_EQ(counter->multi_gets.load(), 0);
}

// ---- Errors ----------------------------------------------------------------------

std::shared_ptr<PrefixStore> ShortTimeoutStore() {
  auto store = std::make_shared<PrefixStore>(TestPrefix(), SharedStore());
  EXPECT_TRUE(store->SetTimeout(kShortTimeout).ok());
  return store;
}

TEST(GlooStoreTest, SetGetAndWaitRoundTripBinaryBytes) {
  GlooStore store(std::make_shared<PrefixStore>(TestPrefix(), SharedStore()));
  const std::vector<char> bytes = {'\0', 'a', '\0', '\xff', '\0'};
  store.set("k", bytes);
  store.wait({"k"});
  store.wait({"k"}, kShortWait);
  EXPECT_EQ(store.get("k"), bytes);
  store.set("empty", {});
  EXPECT_TRUE(store.get("empty").empty());
}

TEST(GlooStoreTest, GetTimeoutIsAGlooIoExceptionNamingTheKey) {
  auto base = ShortTimeoutStore();
  const std::string prefix = base->prefix();
  GlooStore store(base);
  try {
    store.get("missing-key");
    FAIL() << "get of a key nobody set returned";
  } catch (const ::gloo::IoException& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("get 'missing-key'"), HasSubstr("DEADLINE_EXCEEDED"),
                                HasSubstr(absl::StrCat("'", prefix, "/missing-key'"))));
    const auto* typed = dynamic_cast<const StoreIoException*>(&e);
    ASSERT_NE(typed, nullptr);
    EXPECT_EQ(typed->status().code(), absl::StatusCode::kDeadlineExceeded);
  }
}

TEST(GlooStoreTest, WaitRespectsGloosTimeoutAndNamesMissingKeys) {
  // The store's own default is long; gloo's timeout argument must win.
  GlooStore store(std::make_shared<PrefixStore>(TestPrefix(), SharedStore()));
  store.set("here", {'x'});
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(
      {
        try {
          store.wait({"here", "absent"}, kShortWait);
        } catch (const ::gloo::IoException& e) {
          EXPECT_THAT(e.what(), HasSubstr("absent"));
          throw;
        }
      },
      ::gloo::IoException);
  EXPECT_LT(std::chrono::steady_clock::now() - start, kGlooTimeout);
}

TEST(GlooStoreTest, CallerErrorsAreEnforceNotMet) {
  GlooStore unprefixed(std::make_shared<InMemoryStore>());
  try {
    unprefixed.set("", {'x'});  // Empty keys are INVALID_ARGUMENT.
    FAIL() << "set with an empty key returned";
  } catch (const ::gloo::EnforceNotMet& e) {
    EXPECT_THAT(e.what(), HasSubstr("INVALID_ARGUMENT"));
    const auto* typed = dynamic_cast<const StoreEnforceNotMet*>(&e);
    ASSERT_NE(typed, nullptr);
    EXPECT_EQ(typed->status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(GlooStoreTest, ShutDownStoreIsAGlooIoException) {
  auto base = std::make_shared<InMemoryStore>();
  GlooStore store(base);
  base->Shutdown();
  EXPECT_THROW(store.set("k", {'x'}), ::gloo::IoException);
  EXPECT_THROW(store.get("k"), ::gloo::IoException);
}

TEST(GlooStoreTest, MissingPeerFailsConnectFullMeshWithTheStoresMessage) {
  // Rank 0 of 2 alone: gloo's wait for rank 1's address times out in the
  // adapter, and the exception reaches connectFullMesh's caller.
  auto base = ShortTimeoutStore();
  const std::string prefix = base->prefix();
  GlooStore store(base);
  auto device = LoopbackDevice();
  auto context = std::make_shared<::gloo::rendezvous::Context>(0, 2);
  context->setTimeout(kShortWait);
  try {
    context->connectFullMesh(store, device);
    FAIL() << "connectFullMesh without a peer returned";
  } catch (const ::gloo::IoException& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("DEADLINE_EXCEEDED"), HasSubstr(prefix)));
  }
}

}  // namespace gloo_store_test
}  // namespace mesh::gloo_backend
