// Job spec files and the value syntaxes submit's flags share with them.
#include "cli/job_spec_file.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "cli/job_json.h"

namespace mesh::cli {
namespace job_spec_file_test {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

constexpr const char* kYaml = R"(# A two-node HSDP job.
name: train-7b
labels:
  team: research
  run: "7"
command: [python, train.py, --lr, "0.1"]
env:
  NCCL_DEBUG: INFO
  BATCH: 32
working_dir: /data/runs
nodes: "1:4"
nproc_per_node: 8
gpus_per_proc: 1
mesh_shape: [2, -1]
mesh_dim_names: [dp, tp]
max_restarts: 3
deadline: 10m
hang_timeout: 15m
on_hang: fail
idempotency_key: nightly-2024-05-01
memory_per_proc: 8GiB
max_pids: 4096
restart_policy: in_place
in_place_dim: dp
)";

void ExpectFullSpec(const mesh::v1::JobSpec& spec) {
  EXPECT_EQ(spec.name(), "train-7b");
  EXPECT_THAT(spec.labels(), UnorderedElementsAre(Pair("team", "research"), Pair("run", "7")));
  EXPECT_THAT(spec.command(), ElementsAre("python", "train.py", "--lr", "0.1"));
  EXPECT_THAT(spec.env(), UnorderedElementsAre(Pair("NCCL_DEBUG", "INFO"), Pair("BATCH", "32")));
  EXPECT_EQ(spec.working_dir(), "/data/runs");
  EXPECT_EQ(spec.nodes().min(), 1);
  EXPECT_EQ(spec.nodes().max(), 4);
  EXPECT_EQ(spec.nproc_per_node(), 8);
  EXPECT_EQ(spec.gpus_per_proc(), 1);
  EXPECT_THAT(spec.mesh_shape(), ElementsAre(2, -1));
  EXPECT_THAT(spec.mesh_dim_names(), ElementsAre("dp", "tp"));
  EXPECT_EQ(spec.max_restarts(), 3);
  EXPECT_EQ(spec.deadline_seconds(), 600);
  EXPECT_EQ(spec.hang_timeout_seconds(), 900);
  EXPECT_EQ(spec.on_hang(), mesh::v1::HANG_POLICY_FAIL);
  EXPECT_EQ(spec.idempotency_key(), "nightly-2024-05-01");
  EXPECT_EQ(spec.memory_per_proc_bytes(), int64_t{8} << 30);
  EXPECT_EQ(spec.max_pids(), 4096);
  EXPECT_EQ(spec.restart_policy(), mesh::v1::RESTART_POLICY_IN_PLACE);
  EXPECT_EQ(spec.in_place_dim(), "dp");
}

TEST(JobSpecFileTest, ByteSizesTakeBinaryUnits) {
  EXPECT_EQ(ParseByteSize("1073741824").value(), int64_t{1} << 30);
  EXPECT_EQ(ParseByteSize("100B").value(), 100);
  EXPECT_EQ(ParseByteSize("64K").value(), 64 << 10);
  EXPECT_EQ(ParseByteSize("512MiB").value(), int64_t{512} << 20);
  EXPECT_EQ(ParseByteSize("8gib").value(), int64_t{8} << 30);
  EXPECT_EQ(ParseByteSize("2T").value(), int64_t{2} << 40);
  EXPECT_EQ(ParseByteSize("8 GiB").value(), int64_t{8} << 30);
  EXPECT_EQ(ParseByteSize(" 16TiB ").value(), int64_t{16} << 40);
  EXPECT_EQ(ParseByteSize("0").value(), 0);
  EXPECT_EQ(ParseByteSize("8388607T").value(), int64_t{8388607} << 40);  // The largest.
  for (const char* bad : {"", "GiB", "1.5GiB", "8GB", "8mb", "-1M", "+1M", "8 Gibibytes",
                          "8388608T", "99999999999999T", "8 G iB", "0x10"}) {
    auto parsed = ParseByteSize(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("KiB, MiB, GiB")) << bad;
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(absl::StrCat("\"", bad, "\"")))
        << bad;
  }
  EXPECT_THAT(std::string(ParseByteSize("8GB").status().message()),
              HasSubstr("GB is ambiguous: write GiB"));
  EXPECT_THAT(std::string(ParseByteSize("512mb").status().message()),
              HasSubstr("mb is ambiguous: write MiB"));
  EXPECT_THAT(std::string(ParseByteSize("1.5GiB").status().message()),
              HasSubstr("whole numbers only"));
  EXPECT_THAT(std::string(ParseByteSize("8388608T").status().message()), HasSubstr("too large"));
  EXPECT_EQ(FormatByteSize(int64_t{8} << 30), "8GiB");
  EXPECT_EQ(FormatByteSize(1536 << 10), "1536KiB");
  EXPECT_EQ(FormatByteSize(100), "100B");
}

TEST(JobSpecFileTest, ParsesEveryFieldFromYaml) {
  auto spec = ParseJobSpec(kYaml, "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ExpectFullSpec(*spec);
}

TEST(JobSpecFileTest, ParsesEveryFieldFromJsonIncludingTabs) {
  const std::string json =
      "{\n\t\"name\": \"train-7b\",\n\t\"labels\": {\"team\": \"research\", \"run\": \"7\"},\n"
      "\t\"command\": [\"python\", \"train.py\", \"--lr\", \"0.1\"],\n"
      "\t\"env\": {\"NCCL_DEBUG\": \"INFO\", \"BATCH\": 32},\n"
      "\t\"working_dir\": \"/data/runs\", \"nodes\": {\"min\": 1, \"max\": 4},\n"
      "\t\"nproc_per_node\": 8, \"gpus_per_proc\": 1, \"mesh_shape\": [2, -1],\n"
      "\t\"mesh_dim_names\": [\"dp\", \"tp\"], \"max_restarts\": 3, \"deadline\": 600,\n"
      "\t\"hang_timeout\": 900, \"on_hang\": \"FAIL\",\n"
      "\t\"memory_per_proc\": \"8GiB\", \"max_pids\": 4096,\n"
      "\t\"restart_policy\": \"IN_PLACE\", \"in_place_dim\": \"dp\",\n"
      "\t\"idempotency_key\": \"nightly-2024-05-01\"\n}\n";
  auto spec = ParseJobSpec(json, "job.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ExpectFullSpec(*spec);
}

TEST(JobSpecFileTest, NodesAsAPlainCount) {
  auto spec = ParseJobSpec("nodes: 2\ncommand: [x]\n", "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->nodes().min(), 2);
  EXPECT_EQ(spec->nodes().max(), 2);
}

TEST(JobSpecFileTest, UnknownKeyIsAnErrorWithItsLine) {
  auto spec = ParseJobSpec("name: a\ncommand: [x]\nnprocs: 4\n", "job.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr("job.yaml:3:1"));
  EXPECT_THAT(spec.status().message(), HasSubstr("unknown key \"nprocs\""));
  EXPECT_THAT(spec.status().message(), HasSubstr("nproc_per_node"));  // Lists the known keys.
}

struct BadCase {
  std::string text;
  std::string where;  // "FILE:LINE:COL: KEY" prefix expected in the message.
  std::string why;
};

class BadFieldTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadFieldTest, NamesFileLineAndField) {
  auto spec = ParseJobSpec(GetParam().text, "job.yaml");
  ASSERT_FALSE(spec.ok()) << GetParam().text;
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr(GetParam().where));
  EXPECT_THAT(spec.status().message(), HasSubstr(GetParam().why));
}

INSTANTIATE_TEST_SUITE_P(
    EachField, BadFieldTest,
    ::testing::Values(
        BadCase{"command: [x]\nnodes: two\n", "job.yaml:2:8: nodes", "expected N or"},
        BadCase{"nodes: 1:x\n", "job.yaml:1:8: nodes", "MIN:MAX"},
        BadCase{"nodes: {min: 1, most: 2}\n", "job.yaml:1:17: nodes", "unknown key \"most\""},
        BadCase{"nproc_per_node: eight\n", "job.yaml:1:17: nproc_per_node", "expected an integer"},
        BadCase{"gpus_per_proc: [1]\n", "job.yaml:1:16: gpus_per_proc", "got a list"},
        BadCase{"max_restarts: 1.5\n", "job.yaml:1:15: max_restarts", "expected an integer"},
        BadCase{"command: python train.py\n", "job.yaml:1:10: command", "got a string"},
        BadCase{"command: [python, [a]]\n", "job.yaml:1:19: command[1]", "expected a string"},
        BadCase{"mesh_shape: [2, x]\n", "job.yaml:1:17: mesh_shape[1]", "expected an integer"},
        BadCase{"mesh_shape: 4\n", "job.yaml:1:13: mesh_shape", "list of integers"},
        BadCase{"mesh_dim_names: dp\n", "job.yaml:1:17: mesh_dim_names", "list of strings"},
        BadCase{"env: [A=1]\n", "job.yaml:1:6: env", "expected a mapping"},
        BadCase{"env:\n  A:\n", "job.yaml:2:3: env[\"A\"]", "nothing (null)"},
        BadCase{"labels: x\n", "job.yaml:1:9: labels", "expected a mapping"},
        BadCase{"name: [a]\n", "job.yaml:1:7: name", "expected a string"},
        BadCase{"deadline: soon\n", "job.yaml:1:11: deadline", "expected a duration"},
        BadCase{"deadline: -5s\n", "job.yaml:1:11: deadline", "negative"},
        BadCase{"hang_timeout: 0\n", "job.yaml:1:15: hang_timeout", "must be positive"},
        BadCase{"hang_timeout: [1]\n", "job.yaml:1:15: hang_timeout", "expected a duration"},
        BadCase{"on_hang: sometimes\n", "job.yaml:1:10: on_hang", "restart or fail"},
        BadCase{"grow: later\n", "job.yaml:1:7: grow", "never, on_restart or after:DURATION"},
        BadCase{"grow: [after]\n", "job.yaml:1:7: grow", "expected never, on_restart or"},
        BadCase{"grow: {after: soon}\n", "job.yaml:1:7: grow", "positive delay"},
        BadCase{"restart_policy: solo\n", "job.yaml:1:17: restart_policy",
                "'solo' is not a restart policy: group or in_place"},
        BadCase{"restart_policy: [in_place]\n", "job.yaml:1:17: restart_policy",
                "expected a string, got a list"},
        BadCase{"in_place_dim: [dp]\n", "job.yaml:1:15: in_place_dim",
                "expected a string, got a list"},
        BadCase{"in_place_dim: \"\"\n", "job.yaml:1:15: in_place_dim", "name of a mesh dimension"},
        BadCase{"memory_per_proc: lots\n", "job.yaml:1:18: memory_per_proc", "512MiB"},
        BadCase{"memory_per_proc: [1]\n", "job.yaml:1:18: memory_per_proc", "expected a size"},
        BadCase{"max_pids: many\n", "job.yaml:1:11: max_pids", "number of processes"},
        BadCase{"name: a\nname: b\n", "job.yaml:2:1: name", "duplicate key"},
        BadCase{"- a\n- b\n", "job.yaml:1:1", "expected a mapping of job fields"},
        BadCase{"", "job.yaml", "expected a mapping of job fields"},
        BadCase{"name: [unclosed\n", "job.yaml:", "not valid YAML or JSON"}));

TEST(JobSpecFileTest, GrowIsAWordOrADelayAfter) {
  auto never = ParseJobSpec("nodes: 2:4\ngrow: never\n", "job.yaml");
  ASSERT_TRUE(never.ok()) << never.status();
  EXPECT_EQ(never->grow(), mesh::v1::GROW_POLICY_NEVER);
  auto on_restart = ParseJobSpec("nodes: 2:4\ngrow: ON_RESTART\n", "job.yaml");
  ASSERT_TRUE(on_restart.ok()) << on_restart.status();
  EXPECT_EQ(on_restart->grow(), mesh::v1::GROW_POLICY_ON_RESTART);
  for (const char* text : {"grow:\n  after: 10m\n", "grow: {after: 600}\n", "grow: after 10m\n",
                           "grow: after:10m\n"}) {
    auto after = ParseJobSpec(text, "job.yaml");
    ASSERT_TRUE(after.ok()) << text << after.status();
    EXPECT_EQ(after->grow(), mesh::v1::GROW_POLICY_AFTER) << text;
    EXPECT_EQ(after->grow_after_seconds(), 600) << text;
  }
}

TEST(JobSpecFileTest, RestartPolicyIsGroupOrInPlaceWithADimension) {
  auto in_place = ParseJobSpec("restart_policy: in_place\nin_place_dim: dp\n", "job.yaml");
  ASSERT_TRUE(in_place.ok()) << in_place.status();
  EXPECT_EQ(in_place->restart_policy(), mesh::v1::RESTART_POLICY_IN_PLACE);
  EXPECT_EQ(in_place->in_place_dim(), "dp");
  // Case-insensitive, and the dimension is optional (the coordinator's
  // default is dp).
  for (const char* text : {"restart_policy: IN_PLACE\n", "restart_policy: In-Place\n",
                           "{\"restart_policy\": \"in_place\"}\n"}) {
    auto spec = ParseJobSpec(text, "job.yaml");
    ASSERT_TRUE(spec.ok()) << text << spec.status();
    EXPECT_EQ(spec->restart_policy(), mesh::v1::RESTART_POLICY_IN_PLACE) << text;
    EXPECT_EQ(spec->in_place_dim(), "") << text;
  }
  auto group = ParseJobSpec("restart_policy: Group\n", "job.yaml");
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ(group->restart_policy(), mesh::v1::RESTART_POLICY_GROUP);
  // Unset stays UNSPECIFIED: the coordinator's default applies.
  auto neither = ParseJobSpec("name: a\n", "job.yaml");
  ASSERT_TRUE(neither.ok()) << neither.status();
  EXPECT_EQ(neither->restart_policy(), mesh::v1::RESTART_POLICY_UNSPECIFIED);
  // Whether the mesh has the dimension is the coordinator's to judge.
  auto other_dim = ParseJobSpec("restart_policy: in_place\nin_place_dim: replica\n", "job.yaml");
  ASSERT_TRUE(other_dim.ok()) << other_dim.status();
  EXPECT_EQ(other_dim->in_place_dim(), "replica");

  EXPECT_EQ(ParseRestartPolicy(" group ").value(), mesh::v1::RESTART_POLICY_GROUP);
  for (const char* bad : {"", "inplace", "RESTART_POLICY_GROUP", "unspecified"}) {
    EXPECT_EQ(ParseRestartPolicy(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(RestartPolicyText(mesh::v1::RESTART_POLICY_UNSPECIFIED), "group");
  EXPECT_EQ(RestartPolicyText(mesh::v1::RESTART_POLICY_IN_PLACE), "in_place");
}

TEST(JobSpecFileTest, UnknownKeyListsTheRestartPolicyKeys) {
  auto spec = ParseJobSpec("restart: in_place\n", "job.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("restart_policy, in_place_dim"));
}

TEST(JobSpecFileTest, MissingFileIsNotFoundNamingIt) {
  auto spec = ReadJobSpecFile("/nonexistent/job.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(spec.status().message(), HasSubstr("/nonexistent/job.yaml"));
}

TEST(JobSpecFileTest, ValueSyntaxes) {
  EXPECT_EQ(*ParseDurationSeconds("90s"), 90);
  EXPECT_EQ(*ParseDurationSeconds("10m"), 600);
  EXPECT_EQ(*ParseDurationSeconds("1h30m"), 5400);
  EXPECT_EQ(*ParseDurationSeconds("90"), 90);
  EXPECT_EQ(*ParseDurationSeconds("1.5"), 2);  // Rounded up: never shorter than asked.
  EXPECT_EQ(*ParseDurationSeconds("0"), 0);
  EXPECT_FALSE(ParseDurationSeconds("-1").ok());
  EXPECT_FALSE(ParseDurationSeconds("inf").ok());
  EXPECT_FALSE(ParseDurationSeconds("").ok());

  EXPECT_EQ(ParseNodeCount("3")->max(), 3);
  EXPECT_EQ(ParseNodeCount("2:5")->min(), 2);
  EXPECT_EQ(ParseNodeCount("2:5")->max(), 5);
  EXPECT_FALSE(ParseNodeCount("2:").ok());
  EXPECT_FALSE(ParseNodeCount("1:2:3").ok());

  EXPECT_THAT(*ParseMeshShape("2,-1"), ElementsAre(2, -1));
  EXPECT_FALSE(ParseMeshShape("2,,2").ok());

  EXPECT_EQ(ParseKeyValue("A=b=c")->second, "b=c");
  EXPECT_EQ(ParseKeyValue("A=")->second, "");
  EXPECT_FALSE(ParseKeyValue("=x").ok());
  EXPECT_FALSE(ParseKeyValue("A").ok());
}

TEST(JobSpecFileTest, EnvNamesAreCheckedWithTheWorkersRule) {
  mesh::v1::JobSpec spec;
  (*spec.mutable_env())["OK_NAME"] = "1";
  // Denied names go to the coordinator, whose operator may allow them.
  (*spec.mutable_env())["LD_PRELOAD"] = "x.so";
  EXPECT_TRUE(CheckEnvNames(spec).ok());
  (*spec.mutable_env())["RANK"] = "1";
  (*spec.mutable_env())["MESH_RANK"] = "1";
  const absl::Status status = CheckEnvNames(spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("env[\"MESH_RANK\"]"));  // First in byte order.
}

}  // namespace job_spec_file_test
}  // namespace mesh::cli
