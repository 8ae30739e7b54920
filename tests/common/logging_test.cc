#include "common/logging.h"

#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <nlohmann/json.hpp>

namespace mesh {
namespace logging_test {

using ::testing::HasSubstr;

TEST(Logging, ParsesFormatsAndLevels) {
  EXPECT_EQ(*ParseLogFormat("json"), LogFormat::kJson);
  EXPECT_EQ(*ParseLogFormat("TEXT"), LogFormat::kText);
  EXPECT_EQ(ParseLogFormat("xml").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*ParseLogLevel("debug"), spdlog::level::debug);
  EXPECT_EQ(*ParseLogLevel("warning"), spdlog::level::warn);
  EXPECT_EQ(ParseLogLevel("loud").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Logging, JsonLinesAreValidJsonEvenForHostileMessages) {
  std::ostringstream captured;
  LogOptions options;
  options.format = LogFormat::kJson;
  options.component = "coordinator";
  options.host = "host-a";
  auto logger = MakeLogger(options, std::make_shared<spdlog::sinks::ostream_sink_mt>(captured));
  logger->warn("rank {} said \"{}\"\n\t\x01 done", 3, "quote");
  logger->flush();

  const std::string text = captured.str();
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  EXPECT_EQ(text.find('\n'), text.size() - 1) << "one line per record";
  const nlohmann::json line = nlohmann::json::parse(text);
  EXPECT_EQ(line["level"], "warning");
  EXPECT_EQ(line["component"], "coordinator");
  EXPECT_EQ(line["host"], "host-a");
  EXPECT_EQ(line["msg"], "rank 3 said \"quote\"\n\t\x01 done");
  EXPECT_THAT(line["ts"].get<std::string>(), HasSubstr("T"));
  EXPECT_TRUE(line.contains("pid"));
}

TEST(Logging, TextFormatShowsComponentAndRespectsLevel) {
  std::ostringstream captured;
  LogOptions options;
  options.component = "agent";
  options.level = spdlog::level::warn;
  auto logger = MakeLogger(options, std::make_shared<spdlog::sinks::ostream_sink_mt>(captured));
  logger->info("hidden");
  logger->error("shown {}", 1);
  logger->flush();
  EXPECT_THAT(captured.str(), HasSubstr("agent: shown 1"));
  EXPECT_THAT(captured.str(), ::testing::Not(HasSubstr("hidden")));
}

}  // namespace logging_test
}  // namespace mesh
