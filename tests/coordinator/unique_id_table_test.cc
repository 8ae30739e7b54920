#include "coordinator/unique_id_table.h"

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/util/status_matchers.h"

namespace mesh::coordinator {
namespace unique_id_table_test {

using ::mesh::testing::IsOk;
using ::mesh::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using Code = absl::StatusCode;

// A binary 128-byte ID.
std::string Id(char fill) {
  std::string id(kUniqueIdBytes, fill);
  id[0] = '\0';
  id[kUniqueIdBytes - 1] = '\xff';
  return id;
}

TEST(UniqueIdTableTest, PublishReturnsTheNewKeysAndFindReturnsTheBytes) {
  UniqueIdTable table(/*max_key_bytes=*/16);
  const absl::StatusOr<std::vector<std::string>> added =
      table.Publish({{"world", Id('w')}, {"pp0", Id('p')}});
  ASSERT_THAT(added, IsOk());
  EXPECT_THAT(*added, ElementsAre("world", "pp0"));
  ASSERT_NE(table.Find("world"), nullptr);
  EXPECT_EQ(*table.Find("world"), Id('w'));
  EXPECT_EQ(table.Find("absent"), nullptr);
  EXPECT_EQ(table.size(), 2u);
}

TEST(UniqueIdTableTest, RepublishingTheSameBytesIsANoOp) {
  UniqueIdTable table(16);
  ASSERT_THAT(table.Publish({{"g", Id('a')}}), IsOk());
  const absl::StatusOr<std::vector<std::string>> again =
      table.Publish({{"g", Id('a')}, {"h", Id('h')}, {"h", Id('h')}});
  ASSERT_THAT(again, IsOk());
  EXPECT_THAT(*again, ElementsAre("h"));  // Only what is new, once.
  EXPECT_EQ(table.size(), 2u);
}

TEST(UniqueIdTableTest, DifferentBytesForAPublishedKeyAreRejectedAndNothingChanges) {
  UniqueIdTable table(16);
  ASSERT_THAT(table.Publish({{"g", Id('a')}}), IsOk());
  EXPECT_THAT(table.Publish({{"new", Id('n')}, {"g", Id('b')}}),
              StatusIs(Code::kAlreadyExists, HasSubstr("'g'")));
  EXPECT_EQ(*table.Find("g"), Id('a'));
  EXPECT_EQ(table.Find("new"), nullptr) << "a rejected call published part of its IDs";
}

TEST(UniqueIdTableTest, MaxIdsIsAQuotaOnNewKeysAllOrNothing) {
  UniqueIdTable table(16, /*max_ids=*/2);
  ASSERT_THAT(table.Publish({{"a", Id('a')}, {"b", Id('b')}}), IsOk());
  // Republishing is not new; one new key over the quota fails the call.
  EXPECT_THAT(table.Publish({{"a", Id('a')}, {"c", Id('c')}}),
              StatusIs(Code::kResourceExhausted, HasSubstr("over the limit of 2")));
  EXPECT_EQ(table.Find("c"), nullptr);
  EXPECT_THAT(table.Publish({{"a", Id('a')}, {"b", Id('b')}}), IsOk());
  EXPECT_EQ(table.size(), 2u);
}

TEST(UniqueIdTableTest, OneKeyWithTwoIdsInOneCallIsRejected) {
  UniqueIdTable table(16);
  EXPECT_THAT(table.Publish({{"g", Id('a')}, {"g", Id('b')}}), StatusIs(Code::kAlreadyExists));
  EXPECT_EQ(table.Find("g"), nullptr);
}

TEST(UniqueIdTableTest, AnIdOfTheWrongSizeIsInvalid) {
  UniqueIdTable table(16);
  for (const size_t size : {size_t{0}, kUniqueIdBytes - 1, kUniqueIdBytes + 1}) {
    EXPECT_THAT(table.Publish({{"ok", Id('o')}, {"g", std::string(size, 'x')}}),
                StatusIs(Code::kInvalidArgument))
        << size;
  }
  EXPECT_EQ(table.size(), 0u);
}

TEST(UniqueIdTableTest, KeysFollowTheKvKeyRules) {
  UniqueIdTable table(/*max_key_bytes=*/4);
  EXPECT_THAT(table.CheckKey("abcd"), IsOk());
  EXPECT_THAT(table.CheckKey("abcde"), StatusIs(Code::kResourceExhausted));
  EXPECT_THAT(table.CheckKey(""), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(table.Publish({{"abcde", Id('x')}}), StatusIs(Code::kResourceExhausted));
  EXPECT_THAT(table.Publish({{"", Id('x')}}), StatusIs(Code::kInvalidArgument));
  const absl::StatusOr<std::vector<std::string>> none = table.Publish({});
  ASSERT_THAT(none, IsOk());
  EXPECT_THAT(*none, IsEmpty());
}

}  // namespace unique_id_table_test
}  // namespace mesh::coordinator
