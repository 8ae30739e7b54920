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
namespace {

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

}  // namespace
}  // namespace mesh::gloo_backend
