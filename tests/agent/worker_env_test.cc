#include "agent/worker_env.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>

namespace mesh::agent {
namespace worker_env_test {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsSupersetOf;
using ::testing::Not;
using ::testing::Pair;

WorkerAssignment TwoByTwoRank3() {
  WorkerAssignment a;
  a.coordinator = "127.0.0.1:7000";
  a.job_id = "job-42";
  a.generation = 2;
  a.rank = 3;
  a.world_size = 4;
  a.local_rank = 1;
  a.local_world_size = 2;
  a.node_rank = 1;
  a.num_nodes = 2;
  a.node_name = "node-b";
  a.master_addr = "10.0.0.1";
  a.master_port = 29500;
  a.restart_count = 2;
  a.max_restarts = 3;
  return a;
}

TEST(BuildWorkerEnv, CpuJobExactEnvironment) {
  WorkerAssignment a = TwoByTwoRank3();
  a.user_env = {{"FOO", "bar"}, {"PATH", "/opt/bin"}};
  auto env = BuildWorkerEnv(a, {{"PATH", "/usr/bin"}, {"HOME", "/home/u"}});
  ASSERT_TRUE(env.ok()) << env.status();
  // Sorted, complete, and nothing else: the user's PATH wins over the base.
  EXPECT_THAT(*env, ElementsAreArray({
                        "CUDA_VISIBLE_DEVICES=",
                        "FOO=bar",
                        "GROUP_RANK=1",
                        "GROUP_WORLD_SIZE=2",
                        "HOME=/home/u",
                        "LOCAL_RANK=1",
                        "LOCAL_WORLD_SIZE=2",
                        "MASTER_ADDR=10.0.0.1",
                        "MASTER_PORT=29500",
                        "MESH_COORDINATOR=127.0.0.1:7000",
                        "MESH_GENERATION=2",
                        "MESH_JOB_ID=job-42",
                        "MESH_LOCAL_RANK=1",
                        "MESH_LOCAL_WORLD_SIZE=2",
                        "MESH_NODE_NAME=node-b",
                        "MESH_NODE_RANK=1",
                        "MESH_RANK=3",
                        "MESH_WORLD_SIZE=4",
                        "PATH=/opt/bin",
                        "RANK=3",
                        "ROLE_NAME=default",
                        "ROLE_RANK=3",
                        "ROLE_WORLD_SIZE=4",
                        "TORCHELASTIC_MAX_RESTARTS=3",
                        "TORCHELASTIC_RESTART_COUNT=2",
                        "TORCHELASTIC_RUN_ID=job-42",
                        "WORLD_SIZE=4",
                    }));
}

TEST(BuildWorkerEnv, GpuJobGetsItsDevicesAndToken) {
  WorkerAssignment a = TwoByTwoRank3();
  a.gpu_job = true;
  a.gpus = {2, 3};
  a.security.token = "s3cret";
  a.security.ca_file = "/etc/mesh/ca.pem";
  a.security.cert_file = "/etc/mesh/node.pem";
  a.security.key_file = "/etc/mesh/node.key";
  a.security.server_name = "coordinator";
  auto env = BuildWorkerEnv(a, {});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_THAT(*env, Contains("CUDA_VISIBLE_DEVICES=2,3"));
  EXPECT_THAT(*env, Contains("MESH_TOKEN=s3cret"));
  EXPECT_THAT(*env, Contains("MESH_TLS_CA=/etc/mesh/ca.pem"));
  EXPECT_THAT(*env, Contains("MESH_TLS_CERT=/etc/mesh/node.pem"));
  EXPECT_THAT(*env, Contains("MESH_TLS_KEY=/etc/mesh/node.key"));
  EXPECT_THAT(*env, Contains("MESH_TLS_SERVER_NAME=coordinator"));
}

TEST(BuildWorkerEnv, OptionalPartsOmitted) {
  WorkerAssignment a = TwoByTwoRank3();
  a.master_addr.clear();
  auto env = BuildWorkerEnv(a, {});
  ASSERT_TRUE(env.ok()) << env.status();
  for (const std::string& entry : *env) {
    EXPECT_THAT(entry, Not(HasSubstr("MASTER_"))) << entry;
    EXPECT_THAT(entry, Not(HasSubstr("MESH_TOKEN"))) << entry;
    EXPECT_THAT(entry, Not(HasSubstr("MESH_TLS_"))) << entry;
    EXPECT_THAT(entry, Not(HasSubstr("MESH_METRICS_PORT"))) << entry;
  }
}

TEST(BuildWorkerEnv, AgentInstanceMarkerIsGivenWhenSet) {
  WorkerAssignment a = TwoByTwoRank3();
  auto env = BuildWorkerEnv(a, {{"MESH_AGENT_INSTANCE", "inherited"}});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_THAT(*env, Not(Contains(HasSubstr("MESH_AGENT_INSTANCE="))));
  a.agent_instance = "node-a.42.00ff";
  env = BuildWorkerEnv(a, {{"MESH_AGENT_INSTANCE", "inherited"}});
  ASSERT_TRUE(env.ok()) << env.status();
  // The agent's own marker wins over one it inherited (a nested agent).
  EXPECT_THAT(*env, Contains("MESH_AGENT_INSTANCE=node-a.42.00ff"));
  EXPECT_THAT(*env, Not(Contains("MESH_AGENT_INSTANCE=inherited")));
  a.user_env = {{"MESH_AGENT_INSTANCE", "x"}};
  EXPECT_FALSE(BuildWorkerEnv(a, {}).ok());
}

TEST(BuildWorkerEnv, MetricsPortIsGivenWhenSet) {
  WorkerAssignment a = TwoByTwoRank3();
  a.metrics_port = 9517;
  auto env = BuildWorkerEnv(a, {{"MESH_METRICS_PORT", "1"}});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_THAT(*env, Contains("MESH_METRICS_PORT=9517"));
  EXPECT_THAT(*env, Not(Contains("MESH_METRICS_PORT=1")));
  // Agent-set: a job cannot choose it.
  a.user_env = {{"MESH_METRICS_PORT", "80"}};
  env = BuildWorkerEnv(a, {});
  ASSERT_FALSE(env.ok());
  EXPECT_THAT(env.status().message(), HasSubstr("reserved: the agent sets MESH_METRICS_PORT"));
}

TEST(BuildWorkerEnv, BadUserVariablesAreRejected) {
  struct Case {
    std::string name, value, expect;
  } cases[] = {
      {"MESH_RANK", "0", "reserved: the agent sets MESH_RANK"},
      {"MESH_ANYTHING", "x", "reserved: the agent sets MESH_ANYTHING"},
      {"RANK", "0", "reserved: the agent sets RANK"},
      {"MASTER_PORT", "1", "reserved: the agent sets MASTER_PORT"},
      {"CUDA_VISIBLE_DEVICES", "0", "reserved: the agent sets CUDA_VISIBLE_DEVICES"},
      {"LD_PRELOAD", "/x.so",
       "env: LD_PRELOAD: denied on this node: a job may set it only where the node's operator "
       "allows it (mesh-agent --allow-job-env LD_PRELOAD)"},
      {"LD_LIBRARY_PATH", "/x", "(mesh-agent --allow-job-env LD_LIBRARY_PATH)"},
      {"BASH_ENV", "/x", "denied on this node"},
      {"", "x", "the name is empty"},
      {"A=B", "x", "env: A=B: the name contains '='"},
      {std::string("A\0B", 3), "x", "env: A\\000B: the name contains a NUL byte"},
      {"OK", std::string("a\0b", 3), "value of OK contains a NUL"},
  };
  for (const Case& c : cases) {
    WorkerAssignment a = TwoByTwoRank3();
    a.user_env = {{c.name, c.value}};
    auto env = BuildWorkerEnv(a, {});
    ASSERT_FALSE(env.ok()) << c.name;
    EXPECT_EQ(env.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(env.status().message(), HasSubstr(c.expect)) << c.name;
  }
  WorkerAssignment twice = TwoByTwoRank3();
  twice.user_env = {{"X", "1"}, {"X", "2"}};
  auto env = BuildWorkerEnv(twice, {});
  ASSERT_FALSE(env.ok());
  EXPECT_THAT(env.status().message(), HasSubstr("X is set twice"));
}

TEST(BuildWorkerEnv, BaseCannotSmuggleReservedOrRefusedNames) {
  auto env = BuildWorkerEnv(TwoByTwoRank3(),
                            {{"MESH_RANK", "99"}, {"LD_PRELOAD", "/evil.so"}, {"LANG", "C"}});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_THAT(*env, Contains("MESH_RANK=3"));
  EXPECT_THAT(*env, Not(Contains("MESH_RANK=99")));
  EXPECT_THAT(*env, Not(Contains("LD_PRELOAD=/evil.so")));
  EXPECT_THAT(*env, Contains("LANG=C"));
}

TEST(BuildWorkerEnv, InconsistentAssignmentsNameTheField) {
  struct Case {
    void (*mutate)(WorkerAssignment&);
    const char* expect;
  } cases[] = {
      {[](WorkerAssignment& a) { a.rank = 4; }, "rank is 4; it must be in [0, 3]"},
      {[](WorkerAssignment& a) { a.rank = -1; }, "rank is -1"},
      {[](WorkerAssignment& a) { a.world_size = 0; }, "world_size is 0"},
      {[](WorkerAssignment& a) { a.local_rank = 2; }, "local_rank is 2; it must be in [0, 1]"},
      {[](WorkerAssignment& a) { a.local_world_size = 5; }, "local_world_size is 5"},
      {[](WorkerAssignment& a) { a.node_rank = 2; }, "node_rank is 2"},
      {[](WorkerAssignment& a) { a.generation = -1; }, "generation is -1"},
      {[](WorkerAssignment& a) { a.restart_count = -1; }, "restart_count is -1"},
      {[](WorkerAssignment& a) { a.master_port = 0; }, "master_port is 0"},
      {[](WorkerAssignment& a) { a.master_port = 70000; }, "master_port is 70000"},
      {[](WorkerAssignment& a) { a.metrics_port = -1; }, "metrics_port is -1"},
      {[](WorkerAssignment& a) { a.metrics_port = 65536; }, "metrics_port is 65536"},
      {[](WorkerAssignment& a) { a.job_id.clear(); }, "job_id is empty"},
      {[](WorkerAssignment& a) { a.coordinator.clear(); }, "coordinator is empty"},
      {[](WorkerAssignment& a) { a.gpu_job = true; }, "GPU job but no GPUs"},
      {[](WorkerAssignment& a) { a.gpus = {0}; }, "CPU job given GPUs"},
  };
  for (const Case& c : cases) {
    WorkerAssignment a = TwoByTwoRank3();
    c.mutate(a);
    auto env = BuildWorkerEnv(a, {});
    ASSERT_FALSE(env.ok()) << c.expect;
    EXPECT_EQ(env.status().code(), absl::StatusCode::kInvalidArgument) << c.expect;
    EXPECT_THAT(env.status().message(), HasSubstr(c.expect));
  }
}

TEST(BuildWorkerEnv, TokenNeverInErrors) {
  WorkerAssignment a = TwoByTwoRank3();
  a.security.token = "s3cret";
  a.rank = 9;
  auto env = BuildWorkerEnv(a, {});
  ASSERT_FALSE(env.ok());
  EXPECT_THAT(env.status().message(), Not(HasSubstr("s3cret")));
}

TEST(InheritedBaseEnv, CopiesOnlyTheAllowlist) {
  ::setenv("HOME", "/test/home", 1);
  ::setenv("MESH_LAUNCHER_TEST_NOT_INHERITED", "1", 1);
  const auto base = InheritedBaseEnv();
  ASSERT_TRUE(base.count("HOME"));
  EXPECT_EQ(base.at("HOME"), "/test/home");
  EXPECT_EQ(base.count("MESH_LAUNCHER_TEST_NOT_INHERITED"), 0u);
  for (const auto& [name, value] : base) {
    bool listed = false;
    for (const char* const* n = kInheritedEnvNames; *n != nullptr; ++n) listed |= name == *n;
    EXPECT_TRUE(listed) << name;
  }
}

TEST(BuildWorkerEnv, OperatorVariablesSitBetweenTheBaseAndTheJobsAndAllowDeniedNames) {
  WorkerAssignment a = TwoByTwoRank3();
  a.operator_env = {{"NCCL_SOCKET_IFNAME", "eth7"},
                    {"LD_LIBRARY_PATH", "/usr/local/cuda/lib64"},
                    {"PATH", "/opt/node/bin"},
                    {"HTTPS_PROXY", "http://proxy:3128"}};
  a.user_env = {{"HTTPS_PROXY", "http://mine:8080"}};
  auto env = BuildWorkerEnv(a, {{"PATH", "/usr/bin"}, {"HOME", "/root"}});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_THAT(*env,
              IsSupersetOf({"NCCL_SOCKET_IFNAME=eth7", "LD_LIBRARY_PATH=/usr/local/cuda/lib64",
                            "PATH=/opt/node/bin", "HOME=/root", "HTTPS_PROXY=http://mine:8080"}));

  // Each layer wins over the one before: base < operator < job < reserved.
  a.operator_env = {{"HOME", "/operator"}, {"LANG", "C.UTF-8"}, {"LD_PRELOAD", "/opt/hook.so"}};
  a.user_env = {{"LANG", "de_DE.UTF-8"}};
  env = BuildWorkerEnv(a, {{"HOME", "/root"}, {"LANG", "C"}, {"TZ", "UTC"}});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_THAT(*env, IsSupersetOf({"HOME=/operator", "LANG=de_DE.UTF-8", "TZ=UTC",
                                  "LD_PRELOAD=/opt/hook.so"}));
  EXPECT_THAT(*env, Not(Contains("LANG=C")));

  // A denied name in the job's env needs this node's allow list; the error
  // names the variable and the operator's flag.
  a.operator_env.clear();
  a.user_env = {{"LD_LIBRARY_PATH", "/opt/conda/lib"}};
  EXPECT_EQ(BuildWorkerEnv(a, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(BuildWorkerEnv(a, {}).status().message()),
              AllOf(HasSubstr("env: LD_LIBRARY_PATH: "), HasSubstr("this node"),
                    HasSubstr("mesh-agent --allow-job-env LD_LIBRARY_PATH")));
  a.allowed_job_env = {"LD_PRELOAD"};  // Another name allowed is not enough.
  EXPECT_EQ(BuildWorkerEnv(a, {}).status().code(), absl::StatusCode::kInvalidArgument);
  a.allowed_job_env = {"LD_LIBRARY_PATH"};
  env = BuildWorkerEnv(a, {});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_THAT(*env, Contains("LD_LIBRARY_PATH=/opt/conda/lib"));
  // Reserved names stay the agent's, whatever either list says.
  a.user_env = {{"RANK", "0"}};
  a.allowed_job_env = {"LD_LIBRARY_PATH", "RANK"};
  EXPECT_EQ(BuildWorkerEnv(a, {}).status().code(), absl::StatusCode::kInvalidArgument);
  a.user_env.clear();
  a.operator_env = {{"RANK", "9"}};
  env = BuildWorkerEnv(a, {});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_THAT(*env, Contains("RANK=3"));
}

}  // namespace worker_env_test
}  // namespace mesh::agent
