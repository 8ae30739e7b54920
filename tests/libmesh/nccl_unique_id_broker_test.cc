// The NCCL unique-id broker over a mesh::Store, and the batched exchange
// NewGroups uses when it cannot split: ranks are threads sharing one
// InMemoryStore, each behind a counting wrapper that proves the exchange
// costs one MultiSet and one MultiGet per rank.
#include "backends/nccl/unique_id_broker.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "mesh/in_memory_store.h"

namespace mesh::nccl {
namespace nccl_unique_id_broker_test {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Forwards to another store and counts the calls that reach it.
class CountingStore final : public Store {
 public:
  explicit CountingStore(std::shared_ptr<Store> inner)
      : Store(absl::Seconds(30)), inner_(std::move(inner)) {}

  int calls() const { return calls_.load(); }
  int multi_sets() const { return multi_sets_.load(); }
  int multi_gets() const { return multi_gets_.load(); }

 private:
  absl::Status DoSet(const std::string& key, absl::string_view value) override {
    ++calls_;
    return inner_->Set(key, value);
  }
  absl::StatusOr<std::string> DoGet(const std::string& key, absl::Duration timeout) override {
    ++calls_;
    return inner_->Get(key, timeout);
  }
  absl::StatusOr<std::string> DoTryGet(const std::string& key) override {
    ++calls_;
    return inner_->TryGet(key);
  }
  absl::Status DoWait(absl::Span<const std::string> keys, absl::Duration timeout) override {
    ++calls_;
    return inner_->Wait(keys, timeout);
  }
  absl::StatusOr<int64_t> DoAdd(const std::string& key, int64_t delta) override {
    ++calls_;
    return inner_->Add(key, delta);
  }
  absl::StatusOr<CompareSetResult> DoCompareSet(const std::string& key, absl::string_view expected,
                                                absl::string_view desired) override {
    ++calls_;
    return inner_->CompareSet(key, expected, desired);
  }
  absl::StatusOr<bool> DoDeleteKey(const std::string& key) override {
    ++calls_;
    return inner_->DeleteKey(key);
  }
  absl::StatusOr<int64_t> DoNumKeys() override {
    ++calls_;
    return inner_->NumKeys();
  }
  absl::StatusOr<std::vector<std::string>> DoMultiGet(absl::Span<const std::string> keys,
                                                      absl::Duration timeout) override {
    ++calls_;
    ++multi_gets_;
    return inner_->MultiGet(keys, timeout);
  }
  absl::Status DoMultiSet(absl::Span<const std::string> keys,
                          absl::Span<const std::string> values) override {
    ++calls_;
    ++multi_sets_;
    return inner_->MultiSet(keys, values);
  }

  const std::shared_ptr<Store> inner_;
  std::atomic<int> calls_{0};
  std::atomic<int> multi_sets_{0};
  std::atomic<int> multi_gets_{0};
};

std::string FakeId(absl::string_view tag) {
  std::string id(tag);
  id.resize(kUniqueIdBytes, '.');
  return id;
}

GroupSpec Spec(std::string family, int color, std::vector<int> ranks) {
  GroupSpec spec;
  spec.family = std::move(family);
  spec.color = color;
  spec.global_ranks = std::move(ranks);
  return spec;
}

TEST(UniqueIdKey, ScopesByCallFamilyAndColor) {
  EXPECT_EQ(UniqueIdKey(3, Spec("mesh/tp", 1, {4, 5})), "nccl/uid/3/mesh/tp/1");
  EXPECT_NE(UniqueIdKey(0, Spec("a", 1, {0})), UniqueIdKey(1, Spec("a", 1, {0})));
}

TEST(StoreUniqueIdBroker, PublishesAndFetchesInOneCallEach) {
  auto inner = std::make_shared<InMemoryStore>();
  auto counting = std::make_shared<CountingStore>(inner);
  StoreUniqueIdBroker broker(counting);
  const std::vector<std::pair<std::string, std::string>> ids = {{"k/a", FakeId("a")},
                                                                {"k/b", FakeId("b")}};
  ASSERT_TRUE(broker.Publish(ids).ok());
  EXPECT_EQ(counting->multi_sets(), 1);
  const std::vector<std::string> keys = {"k/b", "k/a"};
  absl::StatusOr<std::vector<std::string>> got = broker.Get(keys, absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(*got, ElementsAre(FakeId("b"), FakeId("a")));
  EXPECT_EQ(counting->multi_gets(), 1);
  EXPECT_EQ(counting->calls(), 2);
}

TEST(StoreUniqueIdBroker, EmptyBatchesMakeNoCalls) {
  auto counting = std::make_shared<CountingStore>(std::make_shared<InMemoryStore>());
  StoreUniqueIdBroker broker(counting);
  EXPECT_TRUE(broker.Publish({}).ok());
  absl::StatusOr<std::vector<std::string>> got = broker.Get({}, absl::Now());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->empty());
  EXPECT_EQ(counting->calls(), 0);
}

TEST(StoreUniqueIdBroker, RejectsIdsOfTheWrongSizeAndStoresNothing) {
  auto inner = std::make_shared<InMemoryStore>();
  StoreUniqueIdBroker broker(inner);
  const std::vector<std::pair<std::string, std::string>> ids = {{"k/a", FakeId("a")},
                                                                {"k/b", "too short"}};
  absl::Status s = broker.Publish(ids);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("'k/b' has 9 bytes, not 128"));
  EXPECT_EQ(*inner->NumKeys(), 0);
}

TEST(StoreUniqueIdBroker, CorruptValuesAreDataLoss) {
  auto inner = std::make_shared<InMemoryStore>();
  ASSERT_TRUE(inner->Set("k/a", "not an id").ok());
  StoreUniqueIdBroker broker(inner);
  const std::vector<std::string> keys = {"k/a"};
  absl::Status s = broker.Get(keys, absl::Now() + absl::Seconds(5)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("'k/a' has 9 bytes"));
}

TEST(StoreUniqueIdBroker, MissingIdsTimeOutNamingTheKey) {
  auto inner = std::make_shared<InMemoryStore>();
  StoreUniqueIdBroker broker(inner);
  const std::vector<std::string> keys = {"nccl/uid/0/mesh/tp/1"};
  absl::Status s = broker.Get(keys, absl::Now() + absl::Milliseconds(50)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("nccl/uid/0/mesh/tp/1"));
  // A deadline already past fails without waiting.
  s = broker.Get(keys, absl::Now() - absl::Seconds(1)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
}

TEST(CallbackUniqueIdBroker, ForwardsBatchesAndChecksWhatComesBack) {
  std::map<std::string, std::string> published;
  int publishes = 0;
  int gets = 0;
  int short_answers = 0;  // When > 0, `get` drops the last id this many times.
  CallbackUniqueIdBroker broker(
      [&](absl::Span<const std::pair<std::string, std::string>> ids) {
        ++publishes;
        for (const auto& [key, id] : ids) published[key] = id;
        return absl::OkStatus();
      },
      [&](absl::Span<const std::string> keys,
          absl::Time) -> absl::StatusOr<std::vector<std::string>> {
        ++gets;
        std::vector<std::string> out;
        for (const std::string& key : keys) out.push_back(published[key]);
        if (short_answers > 0) {
          --short_answers;
          out.pop_back();
        }
        return out;
      });
  EXPECT_TRUE(broker.Publish({}).ok());
  EXPECT_TRUE(broker.Get({}, absl::Now()).ok());
  EXPECT_EQ(publishes + gets, 0) << "empty batches must not reach the transport";

  const std::vector<std::pair<std::string, std::string>> ids = {{"a", FakeId("a")},
                                                                {"b", FakeId("b")}};
  ASSERT_TRUE(broker.Publish(ids).ok());
  const std::vector<std::string> keys = {"b", "a"};
  absl::StatusOr<std::vector<std::string>> got = broker.Get(keys, absl::Now());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(*got, ElementsAre(FakeId("b"), FakeId("a")));
  EXPECT_EQ(publishes, 1);
  EXPECT_EQ(gets, 1);

  const std::vector<std::pair<std::string, std::string>> bad = {{"c", "short"}};
  EXPECT_EQ(broker.Publish(bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(publishes, 1) << "a bad id must not reach the transport";
  const std::vector<std::string> unknown = {"nobody-published-this"};
  EXPECT_EQ(broker.Get(unknown, absl::Now()).status().code(), absl::StatusCode::kDataLoss);
  short_answers = 1;
  EXPECT_EQ(broker.Get(keys, absl::Now()).status().code(), absl::StatusCode::kInternal);
}

// The specs rank `r` of a (2, 4) mesh passes, plus a family of singletons.
std::vector<GroupSpec> MeshSpecs(int r) {
  const int dp_color = r % 4;  // Replicate groups {0,4}, {1,5}, {2,6}, {3,7}.
  const int tp_color = r / 4;  // Shard groups {0..3}, {4..7}.
  std::vector<int> tp;
  for (int i = 0; i < 4; ++i) tp.push_back(tp_color * 4 + i);
  return {Spec("mesh/dp", dp_color, {dp_color, dp_color + 4}), Spec("mesh/tp", tp_color, tp),
          Spec("mesh/solo", r, {r})};
}

TEST(ExchangeUniqueIds, EveryMemberOfAGroupGetsItsLeadersIdInOneRoundTripEach) {
  constexpr int kWorld = 8;
  auto shared = std::make_shared<InMemoryStore>();
  std::vector<std::shared_ptr<CountingStore>> stores;
  for (int r = 0; r < kWorld; ++r) stores.push_back(std::make_shared<CountingStore>(shared));
  std::vector<absl::StatusOr<std::vector<std::string>>> results(kWorld);
  std::vector<int> generated(kWorld, 0);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kWorld; ++r) {
    ranks.emplace_back([&, r] {
      StoreUniqueIdBroker broker(stores[r]);
      auto generate = [&]() -> absl::StatusOr<std::string> {
        return FakeId(absl::StrCat("rank", r, "#", generated[r]++));
      };
      results[r] = ExchangeUniqueIds(MeshSpecs(r), r, /*call=*/7, broker, generate,
                                     absl::Now() + absl::Seconds(20));
    });
  }
  for (std::thread& t : ranks) t.join();

  std::map<std::string, std::string> id_of_group;  // "family/color" -> id.
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
    const std::vector<GroupSpec> specs = MeshSpecs(r);
    ASSERT_EQ(results[r]->size(), specs.size());
    for (size_t i = 0; i < specs.size(); ++i) {
      const std::string& id = (*results[r])[i];
      EXPECT_EQ(id.size(), kUniqueIdBytes);
      const std::string group = absl::StrCat(specs[i].family, "/", specs[i].color);
      auto [it, inserted] = id_of_group.emplace(group, id);
      EXPECT_EQ(it->second, id) << "rank " << r << " disagrees on the id of " << group;
      // The leader (first member) generated it.
      EXPECT_EQ(id.substr(0, 5), absl::StrCat("rank", specs[i].global_ranks.front()));
    }
    // At most one publish and one fetch, whatever the number of families.
    EXPECT_LE(stores[r]->multi_sets(), 1) << "rank " << r;
    EXPECT_LE(stores[r]->multi_gets(), 1) << "rank " << r;
    EXPECT_EQ(stores[r]->calls(), stores[r]->multi_sets() + stores[r]->multi_gets());
  }
  // 4 dp + 2 tp + 8 singleton groups, all different.
  EXPECT_EQ(id_of_group.size(), 14u);
  std::set<std::string> distinct;
  for (const auto& [group, id] : id_of_group) distinct.insert(id);
  EXPECT_EQ(distinct.size(), 14u);
  // Ranks 0..3 lead a dp group and ranks 0 and 4 a tp group: those publish.
  // Rank 0 leads all its groups, so it alone fetches nothing.
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(stores[r]->multi_sets(), r <= 4 ? 1 : 0) << "rank " << r;
    EXPECT_EQ(stores[r]->multi_gets(), r == 0 ? 0 : 1) << "rank " << r;
  }
  // Singleton groups are never brokered.
  EXPECT_EQ(*shared->NumKeys(), 6);
}

TEST(ExchangeUniqueIds, AMissingLeaderTimesOutWithContext) {
  auto store = std::make_shared<InMemoryStore>();
  StoreUniqueIdBroker broker(store);
  const std::vector<GroupSpec> specs = {Spec("mesh/tp", 0, {0, 1})};
  auto generate = []() -> absl::StatusOr<std::string> { return FakeId("x"); };
  absl::Status s = ExchangeUniqueIds(specs, /*world_rank=*/1, /*call=*/2, broker, generate,
                                     absl::Now() + absl::Milliseconds(50))
                       .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 1, NewGroups call 2"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("nccl/uid/2/mesh/tp/0"));
}

TEST(ExchangeUniqueIds, GeneratorFailuresPropagate) {
  StoreUniqueIdBroker broker(std::make_shared<InMemoryStore>());
  const std::vector<GroupSpec> specs = {Spec("mesh/tp", 0, {0, 1})};
  auto failing = []() -> absl::StatusOr<std::string> {
    return absl::UnavailableError("no bootstrap interface");
  };
  absl::Status s =
      ExchangeUniqueIds(specs, 0, 0, broker, failing, absl::Now() + absl::Seconds(1)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("no bootstrap interface"));
  auto wrong_size = []() -> absl::StatusOr<std::string> { return std::string("tiny"); };
  s = ExchangeUniqueIds(specs, 0, 0, broker, wrong_size, absl::Now() + absl::Seconds(1)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
}

}  // namespace nccl_unique_id_broker_test
}  // namespace mesh::nccl
