#include "cli/output.h"

#include <sstream>

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

namespace mesh::cli {
namespace output_test {

std::string RenderTo(const nlohmann::json& value, OutputFormat format) {
  std::ostringstream out;
  Render(value, format, out);
  return out.str();
}

TEST(Output, ParsesFormats) {
  EXPECT_EQ(*ParseOutputFormat("json"), OutputFormat::kJson);
  EXPECT_EQ(*ParseOutputFormat("YAML"), OutputFormat::kYaml);
  EXPECT_EQ(*ParseOutputFormat("table"), OutputFormat::kTable);
  EXPECT_EQ(ParseOutputFormat("csv").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Output, ObjectAsAlignedKeyValueTable) {
  const nlohmann::json value = {{"a", "x"}, {"long_key", 3}, {"list", {1, 2}}};
  EXPECT_EQ(RenderTo(value, OutputFormat::kTable),
            "a         x\n"
            "list      [1,2]\n"
            "long_key  3\n");
}

TEST(Output, ArrayOfObjectsAsColumns) {
  const nlohmann::json value = nlohmann::json::array(
      {{{"id", "j1"}, {"state", "RUNNING"}}, {{"id", "job-22"}, {"state", nullptr}}});
  EXPECT_EQ(RenderTo(value, OutputFormat::kTable),
            "ID      STATE\n"
            "j1      RUNNING\n"
            "job-22  -\n");
}

TEST(Output, JsonAndYamlCarryTheSameValue) {
  const nlohmann::json value = {
      {"name", "demo"}, {"ranks", 4}, {"ok", true}, {"shape", {2, 2}}, {"ratio", 0.5}};
  EXPECT_EQ(nlohmann::json::parse(RenderTo(value, OutputFormat::kJson)), value);
  const YAML::Node yaml = YAML::Load(RenderTo(value, OutputFormat::kYaml));
  EXPECT_EQ(yaml["name"].as<std::string>(), "demo");
  EXPECT_EQ(yaml["ranks"].as<int>(), 4);
  EXPECT_TRUE(yaml["ok"].as<bool>());
  EXPECT_EQ(yaml["shape"][1].as<int>(), 2);
  EXPECT_DOUBLE_EQ(yaml["ratio"].as<double>(), 0.5);
}

}  // namespace output_test
}  // namespace mesh::cli
