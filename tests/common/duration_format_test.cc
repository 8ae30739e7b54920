#include "common/duration_format.h"

#include <gtest/gtest.h>

namespace mesh {
namespace duration_format_test {

TEST(FormatDurationShortTest, RoundsToWhatAReaderNeeds) {
  EXPECT_EQ(FormatDurationShort(absl::Seconds(4.05485)), "4.05 s");
  EXPECT_EQ(FormatDurationShort(absl::Seconds(10.0428)), "10.04 s");
  EXPECT_EQ(FormatDurationShort(absl::Seconds(4)), "4 s");
  EXPECT_EQ(FormatDurationShort(absl::Seconds(0.5)), "500 ms");
  EXPECT_EQ(FormatDurationShort(absl::Microseconds(12500)), "12.5 ms");
  EXPECT_EQ(FormatDurationShort(absl::Nanoseconds(850'400)), "850 us");
  EXPECT_EQ(FormatDurationShort(absl::Nanoseconds(1'234)), "1.23 us");
  EXPECT_EQ(FormatDurationShort(absl::Seconds(150)), "2 min 30 s");
  EXPECT_EQ(FormatDurationShort(absl::Minutes(5)), "5 min");
  EXPECT_EQ(FormatDurationShort(absl::Minutes(185)), "3 h 5 min");
  EXPECT_EQ(FormatDurationShort(absl::Hours(2)), "2 h");
}

TEST(FormatDurationShortTest, EdgesCarryIntoTheNextUnit) {
  EXPECT_EQ(FormatDurationShort(absl::ZeroDuration()), "0 s");
  EXPECT_EQ(FormatDurationShort(absl::Nanoseconds(999'700)), "1 ms");
  EXPECT_EQ(FormatDurationShort(absl::Microseconds(999'700)), "1 s");
  EXPECT_EQ(FormatDurationShort(absl::Seconds(59.999)), "1 min");
  EXPECT_EQ(FormatDurationShort(absl::Seconds(3599.6)), "1 h");
  EXPECT_EQ(FormatDurationShort(absl::Seconds(-4.05485)), "-4.05 s");
  EXPECT_EQ(FormatDurationShort(absl::InfiniteDuration()), "forever");
  EXPECT_EQ(FormatDurationShort(-absl::InfiniteDuration()), "-forever");
}

}  // namespace duration_format_test
}  // namespace mesh
