#include "agent/worker_env_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "tests/util/proc.h"

namespace mesh::agent {
namespace worker_env_file_test {

using ::mesh::testing::ScratchDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;

TEST(WorkerEnvFile, ParsesNameValueLinesLiterally) {
  auto entries = ParseWorkerEnvFile(
      "# NCCL on this node\n"
      "\n"
      "   # indented comment\n"
      "  \t \n"
      "NCCL_SOCKET_IFNAME=eth0\r\n"
      "LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH\n"
      "QUOTED=\"a b\" \n"
      "SINGLE='x'\n"
      "TILDE=~/bin\n"
      "BACKSLASH=a\\nb\n"
      "EMPTY=\n"
      "EQUALS=a=b\n"
      "HASH=a # not a comment\n"
      "  INDENTED= v \n"
      "_under_9=1",  // No final newline.
      "worker.env");
  ASSERT_TRUE(entries.ok()) << entries.status();
  EXPECT_THAT(*entries,
              ElementsAre(Pair("NCCL_SOCKET_IFNAME", "eth0"),
                          Pair("LD_LIBRARY_PATH", "/usr/local/cuda/lib64:$LD_LIBRARY_PATH"),
                          Pair("QUOTED", "\"a b\" "), Pair("SINGLE", "'x'"), Pair("TILDE", "~/bin"),
                          Pair("BACKSLASH", "a\\nb"), Pair("EMPTY", ""), Pair("EQUALS", "a=b"),
                          Pair("HASH", "a # not a comment"), Pair("INDENTED", " v "),
                          Pair("_under_9", "1")));
}

TEST(WorkerEnvFile, EmptyOrCommentsOnlyIsNoVariables) {
  for (const char* text : {"", "\n\n", "# nothing yet\n"}) {
    auto entries = ParseWorkerEnvFile(text, "worker.env");
    ASSERT_TRUE(entries.ok()) << entries.status();
    EXPECT_THAT(*entries, IsEmpty());
  }
}

TEST(WorkerEnvFile, DeniedNamesAreTheOperatorsToSet) {
  auto entries = ParseWorkerEnvFile(
      "LD_LIBRARY_PATH=/opt/cuda/lib64\nLD_PRELOAD=/opt/hook.so\nLD_AUDIT=a\nBASH_ENV=/b\nENV=/e\n",
      "worker.env");
  ASSERT_TRUE(entries.ok()) << entries.status();
  EXPECT_EQ(entries->size(), 5u);
}

TEST(WorkerEnvFile, BadLinesNameTheFileAndLine) {
  struct Case {
    std::string text, expect;
  } cases[] = {
      {"A=1\nnot a pair\n", "worker.env:2: expected NAME=VALUE"},
      {"=x\n", "worker.env:1: \"\" is not a variable name"},
      {"MY VAR=x\n", "worker.env:1: \"MY VAR\" is not a variable name"},
      {"A =x\n", "worker.env:1: \"A \" is not a variable name"},
      {"9LIVES=x\n", "worker.env:1: \"9LIVES\" is not a variable name"},
      {"A-B=x\n", "worker.env:1: \"A-B\" is not a variable name"},
      {"export A=1\n", "worker.env:1: \"export\": the file is NAME=VALUE lines"},
      {"RANK=1\n", "worker.env:1: RANK: reserved"},
      {"MESH_TOKEN=x\n", "worker.env:1: MESH_TOKEN: reserved"},
      {"MASTER_ADDR=x\n", "worker.env:1: MASTER_ADDR: reserved"},
      {"CUDA_VISIBLE_DEVICES=0\n", "worker.env:1: CUDA_VISIBLE_DEVICES: reserved"},
      {"A=1\n# c\n\nA=2\n", "worker.env:4: A is set twice (first on line 1)"},
      {std::string("A=x\0y\n", 6), "worker.env:1: the value contains a NUL byte"},
  };
  for (const Case& c : cases) {
    auto entries = ParseWorkerEnvFile(c.text, "worker.env");
    EXPECT_EQ(entries.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(std::string(entries.status().message()), HasSubstr(c.expect)) << c.text;
  }
}

class ReadWorkerEnvFileTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& name, const std::string& text) {
    return dir_.Write(name, text);
  }

  const ScratchDir dir_{"worker_env_file_test"};
};

TEST_F(ReadWorkerEnvFileTest, ReadsAndParsesTheFile) {
  auto entries = ReadWorkerEnvFile(Write("worker.env", "# node\nNCCL_IB_HCA=mlx5_0\n"));
  ASSERT_TRUE(entries.ok()) << entries.status();
  EXPECT_THAT(*entries, ElementsAre(Pair("NCCL_IB_HCA", "mlx5_0")));

  const std::string bad = Write("bad.env", "A=1\nRANK=0\n");
  EXPECT_THAT(std::string(ReadWorkerEnvFile(bad).status().message()),
              HasSubstr(absl::StrCat(bad, ":2: RANK")));
}

TEST_F(ReadWorkerEnvFileTest, UnreadableFilesSayWhy) {
  auto missing = ReadWorkerEnvFile(dir_ / "missing.env");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr(dir_ / "missing.env"));

  auto directory = ReadWorkerEnvFile(dir_.path());
  EXPECT_EQ(directory.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(directory.status().message()), HasSubstr("not a regular file"));

  auto huge = ReadWorkerEnvFile(Write("huge.env", std::string((1 << 20) + 1, '#')));
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(huge.status().message()), HasSubstr("over the limit"));

  if (geteuid() != 0) {  // root reads anything
    const std::string secret = Write("secret.env", "A=1\n");
    ASSERT_EQ(chmod(secret.c_str(), 0), 0);
    EXPECT_EQ(ReadWorkerEnvFile(secret).status().code(), absl::StatusCode::kPermissionDenied);
  }
}

}  // namespace worker_env_file_test
}  // namespace mesh::agent
