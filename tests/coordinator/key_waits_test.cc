#include "coordinator/key_waits.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace mesh::coordinator {
namespace key_waits_test {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Optional;

// A table that counts its lookups.
class CountingTable {
 public:
  const std::string* Find(const std::string& key) {
    ++lookups_;
    auto it = data_.find(key);
    return it == data_.end() ? nullptr : &it->second;
  }
  std::map<std::string, std::string> data_;
  int lookups_ = 0;
};

class KeyWaitIndexTest : public ::testing::Test {
 protected:
  // Sets `key`, then advances every waiter released from it; returns the
  // ids that completed.
  std::vector<uint64_t> Set(const std::string& key, const std::string& value) {
    table_.data_[key] = value;
    std::vector<uint64_t> completed;
    for (uint64_t id : index_.Release(key)) {
      std::optional<std::vector<std::string>> values = Advance(id);
      if (values.has_value()) {
        results_[id] = *values;
        completed.push_back(id);
      }
    }
    return completed;
  }

  // Starts a wait for `keys` as waiter `id`; returns its values when it
  // completes at once.
  std::optional<std::vector<std::string>> Start(uint64_t id, std::vector<std::string> keys) {
    waits_[id].keys = std::move(keys);
    return Advance(id);
  }

  std::optional<std::vector<std::string>> Advance(uint64_t id) {
    return index_.Advance(id, waits_.at(id),
                          [this](const std::string& key) { return table_.Find(key); });
  }

  CountingTable table_;
  KeyWaitIndex index_;
  std::map<uint64_t, KeyWait> waits_;
  std::map<uint64_t, std::vector<std::string>> results_;
};

TEST_F(KeyWaitIndexTest, AWaitForPresentKeysCompletesAtOnceInKeyOrder) {
  table_.data_ = {{"a", "1"}, {"b", "2"}};
  EXPECT_THAT(Start(1, {"b", "a"}), Optional(ElementsAre("2", "1")));
  EXPECT_FALSE(waits_[1].parked);
  EXPECT_EQ(index_.num_parked(), 0u);
  EXPECT_THAT(Start(2, {}), Optional(IsEmpty()));
}

TEST_F(KeyWaitIndexTest, AWaitParksOnOneMissingKeyAtATime) {
  table_.data_ = {{"a", "1"}};
  EXPECT_EQ(Start(1, {"a", "b", "c"}), std::nullopt);
  EXPECT_TRUE(waits_[1].parked);
  EXPECT_EQ(index_.num_parked(), 1u);
  EXPECT_EQ(index_.num_keys(), 1u);
  // Setting a key it is not parked on wakes nothing.
  EXPECT_THAT(Set("c", "3"), IsEmpty());
  EXPECT_EQ(index_.num_parked(), 1u);
  EXPECT_THAT(Set("b", "2"), ElementsAre(1));
  EXPECT_THAT(results_[1], ElementsAre("1", "2", "3"));
  EXPECT_EQ(index_.num_parked(), 0u);
  EXPECT_EQ(index_.num_keys(), 0u);
}

TEST_F(KeyWaitIndexTest, KeysSetInAnyOrderCostLinearLookups) {
  constexpr int kKeys = 1000;
  std::vector<std::string> keys;
  for (int i = 0; i < kKeys; ++i) keys.push_back(absl::StrCat("k", i));

  ASSERT_EQ(Start(1, keys), std::nullopt);
  for (int i = 0; i < kKeys; ++i) Set(keys[i], "v");  // In order: one wake per key.
  ASSERT_TRUE(results_.count(1));
  EXPECT_LE(table_.lookups_, 3 * kKeys + 1);

  table_ = CountingTable();
  ASSERT_EQ(Start(2, keys), std::nullopt);
  for (int i = kKeys - 1; i >= 0; --i) Set(keys[i], "v");  // Reversed: one wake in all.
  ASSERT_TRUE(results_.count(2));
  EXPECT_LE(table_.lookups_, 2 * kKeys + 1);
}

TEST_F(KeyWaitIndexTest, AKeyDeletedAfterItWasPassedSendsTheWaitBackToIt) {
  table_.data_ = {{"a", "1"}};
  ASSERT_EQ(Start(1, {"a", "b"}), std::nullopt);
  table_.data_.erase("a");  // Deleted after the cursor passed it.
  EXPECT_THAT(Set("b", "2"), IsEmpty());
  EXPECT_TRUE(waits_[1].parked);
  EXPECT_THAT(Set("a", "again"), ElementsAre(1));
  EXPECT_THAT(results_[1], ElementsAre("again", "2"));
}

TEST_F(KeyWaitIndexTest, ReleaseHandsOutEveryWaiterOfAKeyInIdOrder) {
  for (uint64_t id : {5, 2, 9}) ASSERT_EQ(Start(id, {"k"}), std::nullopt);
  EXPECT_EQ(index_.num_parked(), 3u);
  EXPECT_EQ(index_.num_keys(), 1u);
  EXPECT_THAT(Set("k", "v"), ElementsAre(2, 5, 9));
  EXPECT_THAT(index_.Release("k"), IsEmpty());
}

TEST_F(KeyWaitIndexTest, UnparkForgetsOneWaiter) {
  ASSERT_EQ(Start(1, {"k"}), std::nullopt);
  ASSERT_EQ(Start(2, {"k"}), std::nullopt);
  index_.Unpark(1, waits_[1]);
  EXPECT_FALSE(waits_[1].parked);
  index_.Unpark(1, waits_[1]);  // Idempotent.
  EXPECT_EQ(index_.num_parked(), 1u);
  EXPECT_THAT(Set("k", "v"), ElementsAre(2));
  index_.Unpark(2, waits_[2]);  // After it completed: a no-op.
  EXPECT_EQ(index_.num_parked(), 0u);
  EXPECT_EQ(index_.num_keys(), 0u);
}

TEST_F(KeyWaitIndexTest, ClearForgetsEverything) {
  ASSERT_EQ(Start(1, {"a"}), std::nullopt);
  ASSERT_EQ(Start(2, {"b"}), std::nullopt);
  index_.Clear();
  EXPECT_EQ(index_.num_parked(), 0u);
  EXPECT_THAT(index_.Release("a"), IsEmpty());
}

}  // namespace key_waits_test
}  // namespace mesh::coordinator
