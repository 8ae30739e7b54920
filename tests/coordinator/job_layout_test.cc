#include "coordinator/job_layout.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/util/status_matchers.h"

namespace mesh::coordinator {
namespace job_layout_test {

using ::mesh::testing::IsOk;
using ::mesh::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Code = absl::StatusCode;

JobLayout Layout(int world, std::vector<int64_t> shape = {}, std::vector<std::string> names = {}) {
  JobLayout layout;
  layout.world_size = world;
  layout.mesh_shape = std::move(shape);
  layout.mesh_dim_names = std::move(names);
  return layout;
}

TEST(JobLayoutTest, DefaultsAreAFlatMeshWithNumberedNames) {
  JobLayout layout = Layout(8);
  ASSERT_THAT(NormalizeJobLayout(layout), IsOk());
  EXPECT_THAT(layout.mesh_shape, ElementsAre(8));
  EXPECT_THAT(layout.mesh_dim_names, ElementsAre("dim0"));

  layout = Layout(8, {2, 4});
  ASSERT_THAT(NormalizeJobLayout(layout), IsOk());
  EXPECT_THAT(layout.mesh_dim_names, ElementsAre("dim0", "dim1"));

  layout = Layout(8, {2, 4}, {"dp", "tp"});
  ASSERT_THAT(NormalizeJobLayout(layout), IsOk());
  EXPECT_THAT(layout.mesh_dim_names, ElementsAre("dp", "tp"));
}

TEST(JobLayoutTest, WorldSizeMustBeInRange) {
  for (int world : {0, -1, kMaxWorldSize + 1}) {
    JobLayout layout = Layout(world);
    EXPECT_THAT(NormalizeJobLayout(layout), StatusIs(Code::kInvalidArgument)) << world;
  }
  JobLayout largest = Layout(kMaxWorldSize);
  EXPECT_THAT(NormalizeJobLayout(largest), IsOk());
}

TEST(JobLayoutTest, TheShapeMustMultiplyToTheWorldSize) {
  JobLayout layout = Layout(4, {2, 3});
  EXPECT_THAT(NormalizeJobLayout(layout), StatusIs(Code::kInvalidArgument, HasSubstr("6")));
  layout = Layout(4, {-2, -2});
  EXPECT_THAT(NormalizeJobLayout(layout), StatusIs(Code::kInvalidArgument));
  layout = Layout(4, {0, 4});
  EXPECT_THAT(NormalizeJobLayout(layout), StatusIs(Code::kInvalidArgument));
  // A product far beyond any world neither overflows nor passes.
  layout = Layout(4, {kMaxWorldSize, kMaxWorldSize, kMaxWorldSize, kMaxWorldSize});
  EXPECT_THAT(NormalizeJobLayout(layout), StatusIs(Code::kInvalidArgument, HasSubstr("over")));
  layout = Layout(4, {4, 1, 1});
  EXPECT_THAT(NormalizeJobLayout(layout), IsOk());
}

TEST(JobLayoutTest, DimNamesMustBeOnePerDimUniqueAndNonEmpty) {
  for (const std::vector<std::string>& names :
       {std::vector<std::string>{"dp"}, std::vector<std::string>{"dp", "dp"},
        std::vector<std::string>{"dp", ""}, std::vector<std::string>{"a", "b", "c"}}) {
    JobLayout layout = Layout(4, {2, 2}, names);
    EXPECT_THAT(NormalizeJobLayout(layout), StatusIs(Code::kInvalidArgument)) << names.size();
  }
}

TEST(JobLayoutTest, JobIds) {
  EXPECT_TRUE(IsValidJobId("Az09._-"));
  EXPECT_TRUE(IsValidJobId(std::string(128, 'x')));
  EXPECT_FALSE(IsValidJobId(""));
  EXPECT_FALSE(IsValidJobId(std::string(129, 'x')));
  EXPECT_FALSE(IsValidJobId("has space"));
  EXPECT_FALSE(IsValidJobId("a/b"));
  EXPECT_FALSE(IsValidJobId("caf\xc3\xa9"));
}

}  // namespace job_layout_test
}  // namespace mesh::coordinator
