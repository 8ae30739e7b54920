#include "coordinator/kv_table.h"

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/util/status_matchers.h"

namespace mesh::coordinator {
namespace kv_table_test {

using ::mesh::testing::IsOk;
using ::mesh::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using Code = absl::StatusCode;

// Small limits, so that each can be reached exactly.
KvLimits SmallLimits() {
  KvLimits limits;
  limits.max_key_bytes = 8;
  limits.max_value_bytes = 16;
  limits.max_total_bytes = 40;
  limits.max_keys = 3;
  return limits;
}

// Everything observable about a table: its entries in order, and its stats.
struct Snapshot {
  std::vector<std::pair<std::string, std::string>> entries;
  int64_t num_keys = 0;
  int64_t total_bytes = 0;

  bool operator==(const Snapshot& other) const {
    return entries == other.entries && num_keys == other.num_keys &&
           total_bytes == other.total_bytes;
  }
};

Snapshot Snap(const KvTable& table) {
  Snapshot snap;
  for (const std::string& key : table.List("", "", KvTable::kMaxListLimit).keys) {
    snap.entries.emplace_back(key, *table.Find(key));
  }
  const KvStats stats = table.Stats();
  snap.num_keys = stats.num_keys;
  snap.total_bytes = stats.total_bytes;
  return snap;
}

void PrintTo(const Snapshot& snap, std::ostream* os) {
  *os << snap.num_keys << " keys, " << snap.total_bytes << " bytes:";
  for (const auto& [key, value] : snap.entries) *os << " " << key << "=" << value;
}

TEST(KvLimitsTest, ValidateRejectsZeroOrNegativeLimits) {
  EXPECT_THAT(ValidateKvLimits(KvLimits()), IsOk());
  EXPECT_THAT(ValidateKvLimits(SmallLimits()), IsOk());
  for (int field = 0; field < 4; ++field) {
    KvLimits bad = SmallLimits();
    if (field == 0) bad.max_key_bytes = 0;
    if (field == 1) bad.max_value_bytes = 0;
    if (field == 2) bad.max_total_bytes = 0;
    if (field == 3) bad.max_keys = -1;
    EXPECT_THAT(ValidateKvLimits(bad), StatusIs(Code::kInvalidArgument)) << field;
  }
}

// ---- Key size limit ------------------------------------------------------------

TEST(KvTableTest, AKeyAtTheSizeLimitIsAcceptedAndOneByteMoreIsExhausted) {
  KvTable table(SmallLimits());
  const std::string at_limit(8, 'k'), over(9, 'k');
  EXPECT_THAT(table.CheckKey(at_limit), IsOk());
  EXPECT_THAT(table.CheckKey(over), StatusIs(Code::kResourceExhausted, HasSubstr("9 bytes")));

  ASSERT_THAT(table.Set(at_limit, "v"), IsOk());
  const Snapshot before = Snap(table);
  EXPECT_THAT(table.Set(over, "v"), StatusIs(Code::kResourceExhausted));
  EXPECT_THAT(table.Add(over, 1), StatusIs(Code::kResourceExhausted));
  EXPECT_THAT(table.CompareSet(over, std::nullopt, "v"), StatusIs(Code::kResourceExhausted));
  EXPECT_THAT(table.Get({over}), StatusIs(Code::kResourceExhausted));
  EXPECT_EQ(Snap(table), before);
  EXPECT_EQ(table.Find(over), nullptr);
}

TEST(KvTableTest, AnEmptyKeyIsInvalid) {
  KvTable table(SmallLimits());
  EXPECT_THAT(table.CheckKey(""), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(table.Set("", "v"), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(table.Add("", 1), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(table.CompareSet("", std::nullopt, "v"), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(table.Get({""}), StatusIs(Code::kInvalidArgument));
  EXPECT_EQ(table.Stats().num_keys, 0);
}

// ---- Value size limit ------------------------------------------------------------

TEST(KvTableTest, AValueAtTheSizeLimitIsAcceptedAndOneByteMoreIsExhausted) {
  KvTable table(SmallLimits());
  ASSERT_THAT(table.Set("k", "old"), IsOk());
  const Snapshot before = Snap(table);
  const std::string at_limit(16, 'v'), over(17, 'v');

  EXPECT_THAT(table.Set("k", over), StatusIs(Code::kResourceExhausted, HasSubstr("17 bytes")));
  EXPECT_THAT(table.Set("new", over), StatusIs(Code::kResourceExhausted));
  EXPECT_THAT(table.CompareSet("k", "old", over), StatusIs(Code::kResourceExhausted));
  EXPECT_EQ(Snap(table), before);

  EXPECT_THAT(table.Set("k", at_limit), IsOk());
  ASSERT_NE(table.Find("k"), nullptr);
  EXPECT_EQ(*table.Find("k"), at_limit);
}

TEST(KvTableTest, AnEmptyValueIsAValue) {
  KvTable table(SmallLimits());
  ASSERT_THAT(table.Set("k", ""), IsOk());
  ASSERT_NE(table.Find("k"), nullptr);
  EXPECT_EQ(*table.Find("k"), "");
  EXPECT_EQ(table.Stats().total_bytes, 1);
}

TEST(KvTableTest, CompareSetRejectsAnOversizedValueEvenWhenItWouldNotSwap) {
  KvTable table(SmallLimits());
  ASSERT_THAT(table.Set("k", "current"), IsOk());
  const Snapshot before = Snap(table);
  EXPECT_THAT(table.CompareSet("k", "something else", std::string(17, 'v')),
              StatusIs(Code::kResourceExhausted));
  EXPECT_EQ(Snap(table), before);
}

// ---- Total bytes quota -------------------------------------------------------------

TEST(KvTableTest, TotalBytesExactlyAtTheQuotaFitAndOneMoreIsExhausted) {
  KvLimits limits = SmallLimits();
  limits.max_keys = 100;  // Only the byte quota binds here.
  KvTable table(limits);
  ASSERT_THAT(table.Set("a", std::string(15, 'a')), IsOk());  // 16 bytes
  ASSERT_THAT(table.Set("b", std::string(15, 'b')), IsOk());  // 32 bytes
  EXPECT_EQ(table.Stats().total_bytes, 32);

  // A new key one byte over: 32 + 9 = 41.
  Snapshot before = Snap(table);
  EXPECT_THAT(table.Set("c", std::string(8, 'c')),
              StatusIs(Code::kResourceExhausted, HasSubstr("41 bytes")));
  EXPECT_THAT(table.Add("c", 12345678), StatusIs(Code::kResourceExhausted));  // "c" + 8 digits
  EXPECT_THAT(table.CompareSet("c", std::nullopt, std::string(8, 'c')),
              StatusIs(Code::kResourceExhausted));
  EXPECT_EQ(Snap(table), before);

  // Exactly at the quota: 32 + 8 = 40.
  ASSERT_THAT(table.Set("c", std::string(7, 'c')), IsOk());
  EXPECT_EQ(table.Stats().total_bytes, 40);

  // Growing an existing value by one byte goes over; the old value stays.
  before = Snap(table);
  EXPECT_THAT(table.Set("c", std::string(8, 'c')), StatusIs(Code::kResourceExhausted));
  EXPECT_THAT(table.CompareSet("c", std::string(7, 'c'), std::string(8, 'c')),
              StatusIs(Code::kResourceExhausted));
  EXPECT_EQ(Snap(table), before);

  // Same-size replacement and shrinking are fine at the quota.
  EXPECT_THAT(table.Set("a", std::string(15, 'z')), IsOk());
  EXPECT_THAT(table.Set("a", "small"), IsOk());
  EXPECT_EQ(table.Stats().total_bytes, 40 - 10);
}

// ---- Key count quota -------------------------------------------------------------

TEST(KvTableTest, KeyCountExactlyAtTheQuotaFitsAndOneMoreIsExhausted) {
  KvTable table(SmallLimits());
  for (const char* key : {"a", "b", "c"}) ASSERT_THAT(table.Set(key, "1"), IsOk()) << key;
  EXPECT_EQ(table.Stats().num_keys, 3);

  const Snapshot before = Snap(table);
  EXPECT_THAT(table.Set("d", "1"), StatusIs(Code::kResourceExhausted, HasSubstr("4 keys")));
  EXPECT_THAT(table.Add("d", 1), StatusIs(Code::kResourceExhausted));
  EXPECT_THAT(table.CompareSet("d", std::nullopt, "1"), StatusIs(Code::kResourceExhausted));
  EXPECT_EQ(Snap(table), before);

  // Overwriting, adding to or swapping an existing key adds no key.
  EXPECT_THAT(table.Set("a", "2"), IsOk());
  EXPECT_THAT(table.Add("b", 1), IsOk());
  EXPECT_THAT(table.CompareSet("c", "1", "9"), IsOk());
  EXPECT_EQ(table.Stats().num_keys, 3);

  // Deleting makes room for exactly one more.
  ASSERT_EQ(table.Delete("b", /*prefix=*/false), 1);
  EXPECT_THAT(table.Set("d", "1"), IsOk());
  EXPECT_THAT(table.Set("e", "1"), StatusIs(Code::kResourceExhausted));
}

// ---- Multi-set: all or nothing ------------------------------------------------------

TEST(KvTableTest, AFailedMultiSetLeavesEverythingUnchanged) {
  KvTable table(SmallLimits());
  ASSERT_THAT(table.Set("a", "old"), IsOk());
  ASSERT_THAT(table.Set("b", "old"), IsOk());
  const Snapshot before = Snap(table);

  struct Case {
    const char* what;
    KvTable::Entries entries;
    Code code;
  };
  const std::vector<Case> cases = {
      {"the last value too long",
       {{"a", "new"}, {"c", std::string(17, 'v')}},
       Code::kResourceExhausted},
      {"a key too long", {{"a", "new"}, {std::string(9, 'k'), "v"}}, Code::kResourceExhausted},
      {"an empty key", {{"a", "new"}, {"", "v"}}, Code::kInvalidArgument},
      {"one key too many", {{"a", "new"}, {"c", "v"}, {"d", "v"}}, Code::kResourceExhausted},
      {"one byte too many",  // 4 + (8 + 16) + (1 + 12) = 41
       {{"a", "new"}, {"cccccccc", std::string(16, 'v')}, {"b", std::string(12, 'v')}},
       Code::kResourceExhausted},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(table.Set(c.entries), StatusIs(c.code)) << c.what;
    EXPECT_EQ(Snap(table), before) << c.what;
  }
  // One byte less fits, and every entry lands.
  EXPECT_THAT(
      table.Set({{"a", "new"}, {"cccccccc", std::string(16, 'v')}, {"b", std::string(11, 'v')}}),
      IsOk());
  EXPECT_EQ(table.Stats().total_bytes, 40);
  EXPECT_EQ(*table.Find("a"), "new");
  EXPECT_EQ(*table.Find("b"), std::string(11, 'v'));
}

TEST(KvTableTest, MultiSetCountsOnlyTheFinalStateOfEachKey) {
  KvTable table(SmallLimits());
  ASSERT_THAT(table.Set("a", std::string(15, 'a')), IsOk());  // 16
  ASSERT_THAT(table.Set("b", std::string(15, 'b')), IsOk());  // 32
  // Alone, "c" = 15 bytes would make 48; shrinking "a" in the same call
  // makes room: 2 + 16 + 16 = 34.
  EXPECT_THAT(table.Set({{"c", std::string(15, 'c')}, {"a", "a"}}), IsOk());
  EXPECT_EQ(table.Stats().total_bytes, 2 + 16 + 16);
  // A key given twice counts once, at its last value.
  EXPECT_THAT(table.Set({{"b", std::string(16, 'x')}, {"b", "y"}}), IsOk());
  ASSERT_NE(table.Find("b"), nullptr);
  EXPECT_EQ(*table.Find("b"), "y");
  EXPECT_EQ(table.Stats().num_keys, 3);
  EXPECT_EQ(table.Stats().total_bytes, 2 + 2 + 16);
}

TEST(KvTableTest, AnEmptyMultiSetIsANoOp) {
  KvTable table(SmallLimits());
  EXPECT_THAT(table.Set(KvTable::Entries{}), IsOk());
  EXPECT_EQ(table.Stats().num_keys, 0);
}

// ---- Operations ------------------------------------------------------------------------

TEST(KvTableTest, GetReturnsValuesInKeyOrderOrNamesTheFirstAbsentKey) {
  KvTable table(SmallLimits());
  ASSERT_THAT(table.Set({{"a", "1"}, {"b", "2"}}), IsOk());
  const absl::StatusOr<std::vector<std::string>> values = table.Get({"b", "a", "b"});
  ASSERT_THAT(values, IsOk());
  EXPECT_THAT(*values, ElementsAre("2", "1", "2"));
  EXPECT_THAT(table.Get({"a", "x", "y"}), StatusIs(Code::kNotFound, HasSubstr("'x'")));
  const absl::StatusOr<std::vector<std::string>> none = table.Get({});
  ASSERT_THAT(none, IsOk());
  EXPECT_THAT(*none, IsEmpty());
}

TEST(KvTableTest, AddCountsFromZeroAndRejectsNonIntegersAndOverflow) {
  KvTable table(KvLimits{});
  EXPECT_EQ(table.Add("n", 5), absl::StatusOr<int64_t>(5));
  EXPECT_EQ(table.Add("n", -7), absl::StatusOr<int64_t>(-2));
  ASSERT_NE(table.Find("n"), nullptr);
  EXPECT_EQ(*table.Find("n"), "-2");

  ASSERT_THAT(table.Set("text", "abc"), IsOk());
  EXPECT_THAT(table.Add("text", 1), StatusIs(Code::kInvalidArgument, HasSubstr("'text'")));
  EXPECT_EQ(*table.Find("text"), "abc");

  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  ASSERT_THAT(table.Add("big", kMax), IsOk());
  EXPECT_THAT(table.Add("big", 1), StatusIs(Code::kInvalidArgument, HasSubstr("overflow")));
  EXPECT_EQ(*table.Find("big"), std::to_string(kMax));
  ASSERT_THAT(table.Add("small", std::numeric_limits<int64_t>::min()), IsOk());
  EXPECT_THAT(table.Add("small", -1), StatusIs(Code::kInvalidArgument));
}

TEST(KvTableTest, CompareSetSwapsOnlyOnAMatch) {
  KvTable table(KvLimits{});
  absl::StatusOr<CompareSetResult> r = table.CompareSet("k", std::nullopt, "first");
  ASSERT_THAT(r, IsOk());
  EXPECT_TRUE(r->swapped);
  EXPECT_TRUE(r->present);
  EXPECT_EQ(r->value, "first");

  r = table.CompareSet("k", std::nullopt, "second");  // Present: no swap.
  ASSERT_THAT(r, IsOk());
  EXPECT_FALSE(r->swapped);
  EXPECT_EQ(r->value, "first");

  r = table.CompareSet("k", "wrong", "second");
  ASSERT_THAT(r, IsOk());
  EXPECT_FALSE(r->swapped);
  EXPECT_EQ(r->value, "first");

  r = table.CompareSet("k", "first", "second");
  ASSERT_THAT(r, IsOk());
  EXPECT_TRUE(r->swapped);
  EXPECT_EQ(r->value, "second");

  r = table.CompareSet("absent", "anything", "x");
  ASSERT_THAT(r, IsOk());
  EXPECT_FALSE(r->swapped);
  EXPECT_FALSE(r->present);
  EXPECT_EQ(table.Find("absent"), nullptr);
}

TEST(KvTableTest, DeleteRemovesAKeyOrAPrefixAndReleasesItsBytes) {
  KvTable table(KvLimits{});
  ASSERT_THAT(table.Set({{"a/1", "x"}, {"a/2", "yy"}, {"ab", "z"}, {"b", "w"}}), IsOk());
  EXPECT_EQ(table.Delete("a", /*prefix=*/false), 0);
  EXPECT_EQ(table.Delete("a/", /*prefix=*/true), 2);
  EXPECT_EQ(table.Stats().num_keys, 2);
  EXPECT_EQ(table.Stats().total_bytes, 3 + 2);
  EXPECT_EQ(table.Delete("b", /*prefix=*/false), 1);
  EXPECT_EQ(table.Delete("b", /*prefix=*/false), 0);
  EXPECT_EQ(table.Delete("", /*prefix=*/true), 1);
  EXPECT_EQ(table.Stats().num_keys, 0);
  EXPECT_EQ(table.Stats().total_bytes, 0);
}

TEST(KvTableTest, ListPagesThroughAPrefixInOrder) {
  KvTable table(KvLimits{});
  ASSERT_THAT(table.Set({{"p/c", ""}, {"p/a", ""}, {"p/b", ""}, {"q", ""}, {"o", ""}}), IsOk());
  KvListResult page = table.List("p/", "", 2);
  EXPECT_THAT(page.keys, ElementsAre("p/a", "p/b"));
  EXPECT_TRUE(page.truncated);
  page = table.List("p/", page.keys.back(), 2);
  EXPECT_THAT(page.keys, ElementsAre("p/c"));
  EXPECT_FALSE(page.truncated);
  // Exactly `limit` keys left: not truncated.
  page = table.List("p/", "p/a", 2);
  EXPECT_THAT(page.keys, ElementsAre("p/b", "p/c"));
  EXPECT_FALSE(page.truncated);
  // start_after before the prefix starts at the prefix.
  EXPECT_THAT(table.List("p/", "a", 10).keys, ElementsAre("p/a", "p/b", "p/c"));
  EXPECT_THAT(table.List("", "", 10).keys, ElementsAre("o", "p/a", "p/b", "p/c", "q"));
}

TEST(KvTableTest, ListLimitDefaultsZeroAndRejectsOutOfRange) {
  EXPECT_EQ(KvTable::ListLimit(0), absl::StatusOr<int>(KvTable::kDefaultListLimit));
  EXPECT_EQ(KvTable::ListLimit(1), absl::StatusOr<int>(1));
  EXPECT_EQ(KvTable::ListLimit(KvTable::kMaxListLimit),
            absl::StatusOr<int>(KvTable::kMaxListLimit));
  EXPECT_THAT(KvTable::ListLimit(KvTable::kMaxListLimit + 1), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(KvTable::ListLimit(-1), StatusIs(Code::kInvalidArgument));
}

TEST(KvTableTest, StatsCountKeyAndValueBytes) {
  KvTable table(KvLimits{});
  ASSERT_THAT(table.Set("key", "value"), IsOk());
  ASSERT_THAT(table.Set("k2", "v"), IsOk());
  EXPECT_EQ(table.Stats().num_keys, 2);
  EXPECT_EQ(table.Stats().total_bytes, 8 + 3);
  ASSERT_THAT(table.Set("key", "v"), IsOk());
  EXPECT_EQ(table.Stats().total_bytes, 4 + 3);
}

}  // namespace kv_table_test
}  // namespace mesh::coordinator
