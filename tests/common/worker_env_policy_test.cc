#include "common/worker_env_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace mesh {
namespace worker_env_policy_test {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr const char* kDenied[] = {"LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "BASH_ENV", "ENV"};

TEST(WorkerEnvPolicy, OrdinaryNamesAreFine) {
  for (const char* name : {"PATH", "NCCL_DEBUG", "LD_BIND_NOW", "MESHX", "XRANK", "ENVIRONMENT"}) {
    EXPECT_EQ(WorkerEnvNameProblem(name), "") << name;
    EXPECT_FALSE(IsDeniedEnvName(name)) << name;
  }
}

TEST(WorkerEnvPolicy, DeniedNamesSayHowTheOperatorAllowsThem) {
  for (const char* name : kDenied) {
    EXPECT_TRUE(IsDeniedEnvName(name)) << name;
    EXPECT_THAT(WorkerEnvNameProblem(name),
                AllOf(StartsWith(std::string("denied: ") + name), HasSubstr("--allow-job-env"),
                      HasSubstr("mesh-coordinator"), HasSubstr("mesh-agent")))
        << name;
    EXPECT_EQ(WorkerEnvNameProblem(name, {name}), "") << name;
  }
  // Allowing one denied name allows only that one.
  EXPECT_THAT(WorkerEnvNameProblem("LD_PRELOAD", {"LD_LIBRARY_PATH"}), StartsWith("denied: "));
}

TEST(WorkerEnvPolicy, ReservedAndMalformedNamesCannotBeAllowed) {
  for (const char* name : {"MESH_RANK", "MESH_", "RANK", "MASTER_PORT", "CUDA_VISIBLE_DEVICES",
                           "TORCHELASTIC_RUN_ID"}) {
    EXPECT_TRUE(IsAgentSetEnvName(name)) << name;
    EXPECT_THAT(WorkerEnvNameProblem(name, {name}), StartsWith("reserved: ")) << name;
  }
  EXPECT_EQ(WorkerEnvNameProblem("", {""}), "the name is empty");
  EXPECT_EQ(WorkerEnvNameProblem("A=B", {"A=B"}), "the name contains '='");
  EXPECT_EQ(WorkerEnvNameProblem(std::string("A\0B", 3), {std::string("A\0B", 3)}),
            "the name contains a NUL byte");
}

TEST(WorkerEnvPolicy, OnlyDeniedNamesCanBeListedByTheOperator) {
  EXPECT_TRUE(CheckAllowedJobEnv({}).ok());
  EXPECT_TRUE(
      CheckAllowedJobEnv({"LD_LIBRARY_PATH", "LD_PRELOAD", "LD_AUDIT", "BASH_ENV", "ENV"}).ok());
  struct Case {
    std::string name, why;
  } cases[] = {
      {"RANK", "\"RANK\" is set by the agent for each rank and can never be allowed"},
      {"MESH_TOKEN", "\"MESH_TOKEN\" is set by the agent"},
      {"CUDA_VISIBLE_DEVICES", "\"CUDA_VISIBLE_DEVICES\" is set by the agent"},
      {"PATH", "\"PATH\" is not refused by default, so there is nothing to allow"},
      {"LD_LIBRARY_PATHS", "\"LD_LIBRARY_PATHS\" is not refused by default"},
      {"", "\"\" is not a variable name"},
      {"A=B", "\"A=B\" is not a variable name"},
      {" LD_PRELOAD", "\" LD_PRELOAD\" is not a variable name"},
  };
  for (const Case& c : cases) {
    const absl::Status status = CheckAllowedJobEnv({"LD_LIBRARY_PATH", c.name});
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(std::string(status.message()),
                AllOf(StartsWith("--allow-job-env: "), HasSubstr(c.why), HasSubstr("LD_PRELOAD")))
        << c.name;
  }
}

}  // namespace worker_env_policy_test
}  // namespace mesh
