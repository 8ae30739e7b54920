#include "agent/host_info.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace mesh::agent {
namespace host_info_test {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST(ParseGpuList, ListsAndRanges) {
  EXPECT_THAT(*ParseGpuList(""), IsEmpty());
  EXPECT_THAT(*ParseGpuList("  "), IsEmpty());
  EXPECT_THAT(*ParseGpuList("3"), ElementsAre(3));
  EXPECT_THAT(*ParseGpuList("0,1,3"), ElementsAre(0, 1, 3));
  EXPECT_THAT(*ParseGpuList("0-3"), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(*ParseGpuList(" 4 , 0-1 "), ElementsAre(4, 0, 1));
}

TEST(ParseGpuList, BadInputNamesTheProblem) {
  struct Case {
    const char* text;
    const char* expect;
  } cases[] = {
      {"a", "bad GPU ordinal 'a'"}, {"1,,2", "empty item"},           {"-1", "bad GPU ordinal ''"},
      {"3-1", "reversed range"},    {"0,0", "appears twice"},         {"0-2,1", "appears twice"},
      {"1024", "0..1023"},          {"1.5", "bad GPU ordinal '1.5'"},
  };
  for (const Case& c : cases) {
    auto result = ParseGpuList(c.text);
    ASSERT_FALSE(result.ok()) << c.text;
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(result.status().message(), HasSubstr(c.expect)) << c.text;
  }
}

TEST(DiscoverHost, DefaultsComeFromTheOs) {
  auto info = DiscoverHost({});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_FALSE(info->hostname.empty());
  EXPECT_GE(info->cpu_count, 1);
  EXPECT_EQ(info->cpu_count, AvailableCpuCount());
  EXPECT_EQ(info->slots, info->cpu_count);
  EXPECT_THAT(info->gpus, IsEmpty());
}

TEST(DiscoverHost, OptionsOverrideDiscovery) {
  HostOptions options;
  options.hostname = "gpu-node-7";
  options.slots = 8;
  options.gpus = "0-7";
  auto info = DiscoverHost(options);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->hostname, "gpu-node-7");
  EXPECT_EQ(info->slots, 8);
  EXPECT_EQ(info->gpus.size(), 8u);

  const auto json = nlohmann::json::parse(HostInfoToJson(*info));
  EXPECT_EQ(json["hostname"], "gpu-node-7");
  EXPECT_EQ(json["slots"], 8);
  EXPECT_EQ(json["gpus"].size(), 8u);
}

TEST(DiscoverHost, RejectsBadOptions) {
  HostOptions negative;
  negative.slots = -1;
  EXPECT_EQ(DiscoverHost(negative).status().code(), absl::StatusCode::kInvalidArgument);
  HostOptions bad_gpus;
  bad_gpus.gpus = "x";
  EXPECT_EQ(DiscoverHost(bad_gpus).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace host_info_test
}  // namespace mesh::agent
