// Precedence: flag > environment > config file > default.
#include "common/flags.h"

#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace mesh {
namespace flags_test {

using ::testing::HasSubstr;

class FlagsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = ::testing::TempDir() + "/mesh_flags_test_" + std::to_string(getpid()) + ".yaml";
    unsetenv("MESH_TEST_PORT");
    app_.add_option("--port", port_)->envname("MESH_TEST_PORT");
    app_.add_option("--log-format", format_)->check(CLI::IsMember({"text", "json"}));
    app_.add_option("--peers", peers_);
    app_.add_option("--config", config_);
  }
  void TearDown() override {
    unlink(path_.c_str());
    unsetenv("MESH_TEST_PORT");
  }

  void WriteConfig(const std::string& text) { std::ofstream(path_) << text; }

  void Parse(std::vector<std::string> args) {
    args.insert(args.begin(), "prog");
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    app_.parse(static_cast<int>(argv.size()), argv.data());
  }

  CLI::App app_;
  std::string path_;
  int port_ = 7450;  // The default.
  std::string format_ = "text";
  std::vector<std::string> peers_;
  std::string config_;
};

TEST_F(FlagsTest, ConfigFileBeatsDefault) {
  WriteConfig("port: 9000\nlog_format: json\npeers: [a, b]\n");
  Parse({});
  ASSERT_TRUE(ApplyConfigFile(app_, path_).ok());
  EXPECT_EQ(port_, 9000);
  EXPECT_EQ(format_, "json");
  EXPECT_EQ(peers_, (std::vector<std::string>{"a", "b"}));
}

TEST_F(FlagsTest, EnvironmentBeatsConfigFile) {
  WriteConfig("port: 9000\n");
  setenv("MESH_TEST_PORT", "9100", 1);
  Parse({});
  ASSERT_TRUE(ApplyConfigFile(app_, path_).ok());
  EXPECT_EQ(port_, 9100);
}

TEST_F(FlagsTest, FlagBeatsEnvironmentAndConfigFile) {
  WriteConfig("port: 9000\n");
  setenv("MESH_TEST_PORT", "9100", 1);
  Parse({"--port", "9200"});
  ASSERT_TRUE(ApplyConfigFile(app_, path_).ok());
  EXPECT_EQ(port_, 9200);
}

TEST_F(FlagsTest, UnknownKeyIsRejectedAndNothingChanges) {
  WriteConfig("port: 9000\nprot: 1\n");
  Parse({});
  const absl::Status status = ApplyConfigFile(app_, path_);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("unknown option 'prot'"));
  EXPECT_EQ(port_, 7450);
}

TEST_F(FlagsTest, ValueAnOptionRejectsIsInvalidArgument) {
  WriteConfig("log-format: xml\n");
  Parse({});
  const absl::Status status = ApplyConfigFile(app_, path_);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("log-format"));
}

TEST_F(FlagsTest, MalformedYamlAndMissingFileAreClearErrors) {
  WriteConfig("port: [1, 2\n");
  Parse({});
  EXPECT_EQ(ApplyConfigFile(app_, path_).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ApplyConfigFile(app_, path_ + ".missing").code(), absl::StatusCode::kNotFound);
  WriteConfig("- just\n- a list\n");
  EXPECT_EQ(ApplyConfigFile(app_, path_).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(FlagsTest, EmptyFileSetsNothing) {
  WriteConfig("");
  Parse({});
  EXPECT_TRUE(ApplyConfigFile(app_, path_).ok());
  EXPECT_EQ(port_, 7450);
}

}  // namespace flags_test
}  // namespace mesh
