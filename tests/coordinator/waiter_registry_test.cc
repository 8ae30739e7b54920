#include "coordinator/waiter_registry.h"

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/time/time.h"

namespace mesh::coordinator {
namespace waiter_registry_test {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// Move-only, like the callbacks real waiters hold.
struct Wait {
  std::unique_ptr<std::string> name;
};
Wait W(const std::string& name) { return Wait{std::make_unique<std::string>(name)}; }

const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);
absl::Time At(int seconds) { return kT0 + absl::Seconds(seconds); }

// Names of everything TakeExpired hands out at `now`, in order.
std::vector<std::string> Expire(WaiterRegistry<Wait>& registry, absl::Time now) {
  std::vector<std::string> names;
  while (std::optional<std::pair<uint64_t, Wait>> e = registry.TakeExpired(now)) {
    names.push_back(*e->second.name);
  }
  return names;
}

TEST(WaiterRegistryTest, AddFindAndTakeEachWaitOnce) {
  WaiterRegistry<Wait> registry;
  const uint64_t a = registry.Add(/*scope=*/1, At(10), W("a"));
  const uint64_t b = registry.Add(1, At(10), W("b"));
  EXPECT_NE(a, 0u);
  EXPECT_NE(a, b);
  EXPECT_EQ(registry.size(), 2u);
  ASSERT_NE(registry.Find(a), nullptr);
  EXPECT_EQ(*registry.Find(a)->name, "a");

  std::optional<Wait> taken = registry.Take(a);
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(*taken->name, "a");
  EXPECT_EQ(registry.Find(a), nullptr);
  EXPECT_FALSE(registry.Take(a).has_value());
  EXPECT_EQ(registry.size(), 1u);
}

TEST(WaiterRegistryTest, ReservedIdsNeverNameAWait) {
  WaiterRegistry<Wait> registry;
  std::set<uint64_t> ids;
  for (int i = 0; i < 100; ++i) {
    EXPECT_TRUE(ids.insert(registry.ReserveId()).second);
    EXPECT_TRUE(ids.insert(registry.Add(1, At(1), W("w"))).second);
  }
  // Half the ids are reserved: exactly the other half name a wait.
  int found = 0;
  for (uint64_t id : ids) found += registry.Find(id) != nullptr ? 1 : 0;
  EXPECT_EQ(found, 100);
  EXPECT_EQ(registry.size(), 100u);
}

TEST(WaiterRegistryTest, ExpiryGoesByDeadlineThenRegistrationOrder) {
  WaiterRegistry<Wait> registry;
  registry.Add(1, At(30), W("late"));
  registry.Add(1, At(10), W("early-1"));
  registry.Add(2, At(20), W("middle"));
  registry.Add(1, At(10), W("early-2"));
  EXPECT_THAT(Expire(registry, At(9)), IsEmpty());
  EXPECT_THAT(Expire(registry, At(10)), ElementsAre("early-1", "early-2"));
  EXPECT_THAT(Expire(registry, At(25)), ElementsAre("middle"));
  EXPECT_EQ(registry.size(), 1u);
  EXPECT_THAT(Expire(registry, At(100)), ElementsAre("late"));
  EXPECT_TRUE(registry.empty());
}

TEST(WaiterRegistryTest, AWaitThatEndedEarlyNeverExpires) {
  WaiterRegistry<Wait> registry;
  const uint64_t gone = registry.Add(1, At(10), W("gone"));
  registry.Add(1, At(10), W("stays"));
  ASSERT_TRUE(registry.Take(gone).has_value());
  EXPECT_THAT(Expire(registry, At(10)), ElementsAre("stays"));
}

TEST(WaiterRegistryTest, AnInfiniteDeadlineNeverExpiresAndTakesNoHeapEntry) {
  WaiterRegistry<Wait> registry;
  const uint64_t watch = registry.Add(1, absl::InfiniteFuture(), W("watch"));
  EXPECT_EQ(registry.heap_size(), 0u);
  EXPECT_THAT(Expire(registry, absl::InfiniteFuture()), IsEmpty());
  EXPECT_NE(registry.Find(watch), nullptr);
  EXPECT_TRUE(registry.Take(watch).has_value());
}

TEST(WaiterRegistryTest, TakeScopeEndsExactlyThatScopeInRegistrationOrder) {
  WaiterRegistry<Wait> registry;
  registry.Add(7, At(10), W("7a"));
  registry.Add(8, At(10), W("8a"));
  registry.Add(7, absl::InfiniteFuture(), W("7b"));
  const uint64_t early = registry.Add(7, At(10), W("7c"));
  ASSERT_TRUE(registry.Take(early).has_value());
  registry.Add(7, At(5), W("7d"));

  std::vector<std::string> names;
  for (auto& [id, wait] : registry.TakeScope(7)) names.push_back(*wait.name);
  EXPECT_THAT(names, ElementsAre("7a", "7b", "7d"));
  EXPECT_EQ(registry.size(), 1u);
  EXPECT_THAT(registry.TakeScope(7), IsEmpty());
  EXPECT_THAT(Expire(registry, At(100)), ElementsAre("8a"));
}

TEST(WaiterRegistryTest, TheHeapStaysProportionalToPendingWaits) {
  WaiterRegistry<Wait> registry;
  // A few long waits that stay, and many that complete long before their
  // deadline (a busy KV store with blocking gets).
  for (int i = 0; i < 10; ++i) registry.Add(1, At(3600), W("long"));
  for (int i = 0; i < 100000; ++i) {
    const uint64_t id = registry.Add(1, At(3600), W("short"));
    ASSERT_TRUE(registry.Take(id).has_value());
    ASSERT_LE(registry.heap_size(), 2 * registry.size() + 64 + 1) << i;
  }
  EXPECT_EQ(registry.size(), 10u);
  EXPECT_EQ(Expire(registry, At(3600)).size(), 10u);
}

}  // namespace waiter_registry_test
}  // namespace mesh::coordinator
