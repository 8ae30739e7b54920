#include "coordinator/job_spec.h"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tests/util/status_matchers.h"

namespace mesh::coordinator {
namespace job_spec_test {

using ::mesh::testing::IsOk;
using ::mesh::testing::StatusIs;
using ::mesh::v1::JobSpec;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using Code = absl::StatusCode;

// A valid spec: 2 nodes × 4 processes, CPU.
JobSpec Valid() {
  JobSpec spec;
  spec.set_name("train");
  spec.add_command("/usr/bin/python3");
  spec.add_command("train.py");
  spec.mutable_nodes()->set_min(2);
  spec.set_nproc_per_node(4);
  return spec;
}

// Expects INVALID_ARGUMENT whose message starts with `field` + ": ".
MATCHER_P(RejectsField, field, "") {
  const absl::Status status = arg;
  *result_listener << "status is " << status;
  return status.code() == absl::StatusCode::kInvalidArgument &&
         absl::StartsWith(status.message(), absl::StrCat(field, ": "));
}

TEST(JobSpecTest, ValidSpecPasses) {
  EXPECT_THAT(ValidateJobSpec(Valid(), JobSpecLimits{}), IsOk());
}

TEST(JobSpecTest, DefaultLimitsAreValid) {
  EXPECT_THAT(ValidateJobSpecLimits(JobSpecLimits{}), IsOk());
  JobSpecLimits limits;
  limits.working_dir_root = "data";
  EXPECT_THAT(ValidateJobSpecLimits(limits),
              StatusIs(Code::kInvalidArgument, StartsWith("working_dir_root: ")));
  limits = JobSpecLimits{};
  limits.max_env_count = 0;
  EXPECT_THAT(ValidateJobSpecLimits(limits),
              StatusIs(Code::kInvalidArgument, StartsWith("max_env_count: ")));
}

TEST(JobSpecTest, Name) {
  JobSpec spec = Valid();
  spec.set_name("");
  EXPECT_THAT(ValidateJobSpec(spec, {}), IsOk());
  spec.set_name(std::string(128, 'a'));
  EXPECT_THAT(ValidateJobSpec(spec, {}), IsOk());
  spec.set_name(std::string(129, 'a'));
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.name"));
  spec.set_name("a b");
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.name"));
}

TEST(JobSpecTest, Labels) {
  JobSpec spec = Valid();
  (*spec.mutable_labels())["team/ml"] = "vision";
  EXPECT_THAT(ValidateJobSpec(spec, {}), IsOk());
  (*spec.mutable_labels())[""] = "x";
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.labels[\"\"]"));

  spec = Valid();
  (*spec.mutable_labels())["a b"] = "x";
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.labels[\"a b\"]"));

  spec = Valid();
  (*spec.mutable_labels())[std::string(63, 'k')] = "x";
  EXPECT_THAT(ValidateJobSpec(spec, {}), IsOk());
  (*spec.mutable_labels())[std::string(64, 'k')] = "x";
  EXPECT_THAT(ValidateJobSpec(spec, {}),
              RejectsField(absl::StrCat("spec.labels[\"", std::string(64, 'k'), "\"]")));

  spec = Valid();
  (*spec.mutable_labels())["k"] = std::string("a\0b", 3);
  EXPECT_THAT(ValidateJobSpec(spec, {}),
              StatusIs(Code::kInvalidArgument, HasSubstr("spec.labels[\"k\"]: value contains a "
                                                         "NUL")));

  spec = Valid();
  (*spec.mutable_labels())["k"] = std::string(256, 'v');
  EXPECT_THAT(ValidateJobSpec(spec, {}), IsOk());
  (*spec.mutable_labels())["k"] = std::string(257, 'v');
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.labels[\"k\"]"));
}

TEST(JobSpecTest, LabelCountAtAndOverLimit) {
  JobSpecLimits limits;
  limits.max_labels = 3;
  JobSpec spec = Valid();
  for (int i = 0; i < 3; ++i) (*spec.mutable_labels())[absl::StrCat("k", i)] = "v";
  EXPECT_THAT(ValidateJobSpec(spec, limits), IsOk());
  (*spec.mutable_labels())["k3"] = "v";
  EXPECT_THAT(ValidateJobSpec(spec, limits),
              StatusIs(Code::kInvalidArgument, "spec.labels: 4 labels, over the limit of 3"));
}

TEST(JobSpecTest, Command) {
  JobSpec spec = Valid();
  spec.clear_command();
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.command"));

  spec = Valid();
  spec.set_command(0, "");
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.command[0]"));

  spec = Valid();
  spec.add_command(std::string("--x=\0y", 6));
  EXPECT_THAT(ValidateJobSpec(spec, {}),
              StatusIs(Code::kInvalidArgument, "spec.command[2]: contains a NUL byte"));

  // Shell syntax is just bytes: nothing interprets it.
  spec = Valid();
  spec.add_command("$(rm -rf /); echo *");
  EXPECT_THAT(ValidateJobSpec(spec, {}), IsOk());
}

TEST(JobSpecTest, ArgvCountAndBytesAtAndOverLimit) {
  JobSpecLimits limits;
  limits.max_argv_count = 3;
  JobSpec spec = Valid();  // 2 args.
  spec.add_command("c");
  EXPECT_THAT(ValidateJobSpec(spec, limits), IsOk());
  spec.add_command("d");
  EXPECT_THAT(ValidateJobSpec(spec, limits),
              StatusIs(Code::kInvalidArgument, "spec.command: 4 arguments, over the limit of 3"));

  limits = JobSpecLimits{};
  spec = Valid();  // "/usr/bin/python3" + "train.py" = 24 bytes.
  limits.max_argv_bytes = 24;
  EXPECT_THAT(ValidateJobSpec(spec, limits), IsOk());
  limits.max_argv_bytes = 23;
  EXPECT_THAT(ValidateJobSpec(spec, limits),
              StatusIs(Code::kInvalidArgument,
                       "spec.command: 24 bytes of arguments, over the limit of 23"));
}

TEST(JobSpecTest, EnvNamesRejected) {
  const std::vector<std::string> bad = {"",
                                        std::string("A\0B", 3),
                                        "A=B",
                                        "ROLE_RANK",
                                        "LD_PRELOAD",
                                        "LD_LIBRARY_PATH",
                                        "LD_AUDIT",
                                        "BASH_ENV",
                                        "ENV",
                                        "MESH_JOB_ID",
                                        "MESH_",
                                        "RANK",
                                        "LOCAL_RANK",
                                        "WORLD_SIZE",
                                        "LOCAL_WORLD_SIZE",
                                        "GROUP_RANK",
                                        "MASTER_ADDR",
                                        "MASTER_PORT",
                                        "TORCHELASTIC_RESTART_COUNT"};
  for (const std::string& name : bad) {
    JobSpec spec = Valid();
    (*spec.mutable_env())[name] = "1";
    EXPECT_THAT(ValidateJobSpec(spec, {}),
                RejectsField(absl::StrCat("spec.env[\"", absl::CHexEscape(name), "\"]")))
        << absl::CHexEscape(name);
  }
}

TEST(JobSpecTest, EnvMessagesSayWhy) {
  JobSpec spec = Valid();
  (*spec.mutable_env())["LD_PRELOAD"] = "/tmp/evil.so";
  EXPECT_THAT(
      ValidateJobSpec(spec, {}),
      StatusIs(Code::kInvalidArgument, AllOf(StartsWith("spec.env[\"LD_PRELOAD\"]: denied: "),
                                             HasSubstr("dynamic loader"))));
  spec = Valid();
  (*spec.mutable_env())["RANK"] = "0";
  EXPECT_THAT(ValidateJobSpec(spec, {}),
              StatusIs(Code::kInvalidArgument, HasSubstr("reserved: the agent sets RANK")));
}

TEST(JobSpecTest, EnvAcceptsOrdinaryNamesAndLookalikes) {
  JobSpec spec = Valid();
  for (const char* name : {"NCCL_DEBUG", "OMP_NUM_THREADS", "PYTHONPATH", "MY_RANK", "LD_BIND_NOW",
                           "MESHY", "CUDA_VISIBLE_DEVICESX"}) {
    (*spec.mutable_env())[name] = "1";
  }
  EXPECT_THAT(ValidateJobSpec(spec, {}), IsOk());
}

// The agent sets CUDA_VISIBLE_DEVICES for every rank (empty for a CPU job,
// which must not touch GPUs given to other jobs), so no job may set it.
TEST(JobSpecTest, CudaVisibleDevicesIsReservedForEveryJob) {
  JobSpec spec = Valid();
  (*spec.mutable_env())["CUDA_VISIBLE_DEVICES"] = "";
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.env[\"CUDA_VISIBLE_DEVICES\"]"));
  spec.set_gpus_per_proc(1);
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.env[\"CUDA_VISIBLE_DEVICES\"]"));
}

// The coordinator and the agent share one rule: every name the agent sets
// is refused in a spec, so an accepted spec is never refused at launch.
TEST(JobSpecTest, EveryNameTheAgentSetsIsRejected) {
  for (const char* name : {"GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "ROLE_NAME",
                           "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "MESH_TOKEN"}) {
    JobSpec spec = Valid();
    (*spec.mutable_env())[name] = "1";
    EXPECT_THAT(ValidateJobSpec(spec, {}),
                StatusIs(Code::kInvalidArgument,
                         HasSubstr(std::string("reserved: the agent sets ") + name)))
        << name;
  }
}

TEST(JobSpecTest, EnvValueWithNul) {
  JobSpec spec = Valid();
  (*spec.mutable_env())["X"] = std::string("a\0b", 3);
  EXPECT_THAT(ValidateJobSpec(spec, {}),
              StatusIs(Code::kInvalidArgument, "spec.env[\"X\"]: value contains a NUL byte"));
}

TEST(JobSpecTest, EnvErrorsReportTheFirstKeyInByteOrder) {
  JobSpec spec = Valid();
  (*spec.mutable_env())["RANK"] = "1";
  (*spec.mutable_env())["LD_PRELOAD"] = "x";
  (*spec.mutable_env())["WORLD_SIZE"] = "1";
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.env[\"LD_PRELOAD\"]"));
}

TEST(JobSpecTest, EnvCountAndBytesAtAndOverLimit) {
  JobSpecLimits limits;
  limits.max_env_count = 2;
  JobSpec spec = Valid();
  (*spec.mutable_env())["A"] = "1";
  (*spec.mutable_env())["B"] = "22";
  EXPECT_THAT(ValidateJobSpec(spec, limits), IsOk());
  (*spec.mutable_env())["C"] = "3";
  EXPECT_THAT(ValidateJobSpec(spec, limits),
              StatusIs(Code::kInvalidArgument, "spec.env: 3 variables, over the limit of 2"));

  limits = JobSpecLimits{};
  spec.mutable_env()->erase("C");  // "A1" + "B22" = 5 bytes.
  limits.max_env_bytes = 5;
  EXPECT_THAT(ValidateJobSpec(spec, limits), IsOk());
  limits.max_env_bytes = 4;
  EXPECT_THAT(ValidateJobSpec(spec, limits),
              StatusIs(Code::kInvalidArgument,
                       "spec.env: 5 bytes of names and values, over the limit of 4"));
}

TEST(JobSpecTest, WorkingDir) {
  JobSpecLimits limits;
  limits.working_dir_root = "/data/jobs/";
  JobSpec spec = Valid();
  for (const char* ok :
       {"/data/jobs", "/data/jobs/a", "/data/jobs/a/../b", "/data//jobs/./c/", "/data/x/../jobs"}) {
    spec.set_working_dir(ok);
    EXPECT_THAT(ValidateJobSpec(spec, limits), IsOk()) << ok;
  }
  for (const char* bad : {"/data/jobs/..", "/data/jobs/a/../../x", "/data/jobsx", "/etc",
                          "/data/jobs/../../../../etc", "/"}) {
    spec.set_working_dir(bad);
    EXPECT_THAT(ValidateJobSpec(spec, limits),
                StatusIs(Code::kInvalidArgument,
                         AllOf(StartsWith("spec.working_dir: "), HasSubstr("outside"))))
        << bad;
  }
  spec.set_working_dir("data/jobs/a");
  EXPECT_THAT(ValidateJobSpec(spec, limits),
              StatusIs(Code::kInvalidArgument,
                       AllOf(StartsWith("spec.working_dir: "), HasSubstr("relative"))));
  spec.set_working_dir(std::string("/data/jobs/a\0b", 14));
  EXPECT_THAT(ValidateJobSpec(spec, limits),
              StatusIs(Code::kInvalidArgument, "spec.working_dir: contains a NUL byte"));
  spec.set_working_dir("");
  EXPECT_THAT(ValidateJobSpec(spec, limits), IsOk());
}

TEST(JobSpecTest, NormalizeAbsolutePath) {
  EXPECT_EQ(NormalizeAbsolutePath("/").value(), "/");
  EXPECT_EQ(NormalizeAbsolutePath("/..").value(), "/");
  EXPECT_EQ(NormalizeAbsolutePath("/a/./b/../c//").value(), "/a/c");
  EXPECT_EQ(NormalizeAbsolutePath("/a/../../b").value(), "/b");
  EXPECT_EQ(NormalizeAbsolutePath("/a/..b").value(), "/a/..b");
  EXPECT_THAT(NormalizeAbsolutePath("a/b"), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(NormalizeAbsolutePath(""), StatusIs(Code::kInvalidArgument));
}

TEST(JobSpecTest, Nodes) {
  JobSpec spec = Valid();
  spec.mutable_nodes()->set_min(0);
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.nodes.min"));
  spec.mutable_nodes()->set_min(-1);
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.nodes.min"));
  spec.mutable_nodes()->set_min(4);
  spec.mutable_nodes()->set_max(2);
  EXPECT_THAT(ValidateJobSpec(spec, {}),
              StatusIs(Code::kInvalidArgument, "spec.nodes: min 4 is greater than max 2"));
  spec.mutable_nodes()->set_max(4);
  EXPECT_THAT(ValidateJobSpec(spec, {}), IsOk());
}

TEST(JobSpecTest, NprocAndGpus) {
  JobSpec spec = Valid();
  spec.set_nproc_per_node(0);
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.nproc_per_node"));
  spec = Valid();
  spec.set_gpus_per_proc(-1);
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.gpus_per_proc"));
  spec.set_gpus_per_proc(8);
  EXPECT_THAT(ValidateJobSpec(spec, {}), IsOk());
}

TEST(JobSpecTest, WorldSizeAtAndOverLimitUsesMaxNodes) {
  JobSpecLimits limits;
  limits.max_world_size = 16;
  JobSpec spec = Valid();  // 4 per node.
  spec.mutable_nodes()->set_min(1);
  spec.mutable_nodes()->set_max(4);
  EXPECT_THAT(ValidateJobSpec(spec, limits), IsOk());
  spec.mutable_nodes()->set_max(5);
  EXPECT_THAT(
      ValidateJobSpec(spec, limits),
      StatusIs(Code::kInvalidArgument, AllOf(StartsWith("spec.nproc_per_node: "),
                                             HasSubstr("20 ranks"), HasSubstr("limit of 16"))));
}

TEST(JobSpecTest, FixedMeshShape) {
  JobSpec spec = Valid();  // 2 × 4 = 8 ranks.
  spec.add_mesh_shape(2);
  spec.add_mesh_shape(4);
  EXPECT_THAT(ValidateJobSpec(spec, {}), IsOk());
  spec.set_mesh_shape(1, 3);
  EXPECT_THAT(ValidateJobSpec(spec, {}),
              StatusIs(Code::kInvalidArgument,
                       AllOf(StartsWith("spec.mesh_shape: "), HasSubstr("6 ranks"))));
  spec.set_mesh_shape(1, 0);
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.mesh_shape[1]"));
  spec.set_mesh_shape(1, -2);
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.mesh_shape[1]"));
  spec.set_mesh_shape(1, 1 << 30);
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.mesh_shape"));
  // Products that would overflow int64 are caught, not wrapped.
  spec.set_mesh_shape(0, std::numeric_limits<int64_t>::max());
  spec.set_mesh_shape(1, std::numeric_limits<int64_t>::max());
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.mesh_shape"));
  spec.set_mesh_shape(0, 4);
  spec.set_mesh_shape(1, std::numeric_limits<int64_t>::max() / 2);
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.mesh_shape"));
}

TEST(JobSpecTest, WildcardMeshShape) {
  JobSpec spec = Valid();  // 2 nodes × 4.
  spec.add_mesh_shape(-1);
  spec.add_mesh_shape(4);
  EXPECT_THAT(ValidateJobSpec(spec, {}), IsOk());
  spec.set_mesh_shape(1, 8);  // 8 divides the world of 8.
  EXPECT_THAT(ValidateJobSpec(spec, {}), IsOk());
  spec.set_mesh_shape(1, 3);
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.mesh_shape"));
  spec.set_mesh_shape(1, -1);
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.mesh_shape[1]"));
}

TEST(JobSpecTest, NodeRangeNeedsAWildcardThatDividesNproc) {
  JobSpec spec = Valid();
  spec.mutable_nodes()->set_min(2);
  spec.mutable_nodes()->set_max(4);
  spec.add_mesh_shape(2);
  spec.add_mesh_shape(4);
  EXPECT_THAT(
      ValidateJobSpec(spec, {}),
      StatusIs(Code::kInvalidArgument, AllOf(StartsWith("spec.mesh_shape: "), HasSubstr("-1"))));
  spec.set_mesh_shape(0, -1);
  EXPECT_THAT(ValidateJobSpec(spec, {}), IsOk());
  spec.set_mesh_shape(1, 8);  // Fits 2 and 4 nodes but not 3.
  EXPECT_THAT(ValidateJobSpec(spec, {}),
              StatusIs(Code::kInvalidArgument,
                       AllOf(StartsWith("spec.mesh_shape: "), HasSubstr("nproc_per_node"))));
  spec.clear_mesh_shape();  // Default [-1] always fits.
  EXPECT_THAT(ValidateJobSpec(spec, {}), IsOk());
}

TEST(JobSpecTest, MeshDimNames) {
  JobSpec spec = Valid();
  spec.add_mesh_shape(2);
  spec.add_mesh_shape(4);
  spec.add_mesh_dim_names("dp");
  EXPECT_THAT(ValidateJobSpec(spec, {}),
              StatusIs(Code::kInvalidArgument, "spec.mesh_dim_names: 1 names for a 2-d mesh"));
  spec.add_mesh_dim_names("");
  EXPECT_THAT(ValidateJobSpec(spec, {}),
              StatusIs(Code::kInvalidArgument, "spec.mesh_dim_names[1]: is empty"));
  spec.set_mesh_dim_names(1, "dp");
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.mesh_dim_names[1]"));
  spec.set_mesh_dim_names(1, "tp");
  EXPECT_THAT(ValidateJobSpec(spec, {}), IsOk());

  spec = Valid();  // Default 1-d mesh takes one name.
  spec.add_mesh_dim_names("ranks");
  EXPECT_THAT(ValidateJobSpec(spec, {}), IsOk());
  spec.add_mesh_dim_names("more");
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.mesh_dim_names"));
}

TEST(JobSpecTest, RestartsAndDeadline) {
  JobSpec spec = Valid();
  spec.set_max_restarts(-1);
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.max_restarts"));
  spec = Valid();
  spec.set_deadline_seconds(-1);
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.deadline_seconds"));
  spec.set_deadline_seconds(0);
  spec.set_max_restarts(0);
  EXPECT_THAT(ValidateJobSpec(spec, {}), IsOk());
}

TEST(JobSpecTest, HangTimeoutAndPolicy) {
  JobSpec spec = Valid();
  spec.set_hang_timeout_seconds(-1);
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.hang_timeout_seconds"));
  spec.set_hang_timeout_seconds(kMaxHangTimeoutSeconds + 1);
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.hang_timeout_seconds"));
  spec.set_hang_timeout_seconds(kMaxHangTimeoutSeconds);
  EXPECT_THAT(ValidateJobSpec(spec, {}), IsOk());
  spec.set_on_hang(static_cast<mesh::v1::HangPolicy>(7));
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.on_hang"));

  // Normalized: 0 and UNSPECIFIED become what is in force.
  spec = Valid();
  EXPECT_EQ(HangTimeout(spec), absl::Seconds(300));
  NormalizeJobSpec({}, spec);
  EXPECT_EQ(spec.hang_timeout_seconds(), kDefaultHangTimeoutSeconds);
  EXPECT_EQ(spec.on_hang(), mesh::v1::HANG_POLICY_RESTART);
  spec.set_hang_timeout_seconds(60);
  spec.set_on_hang(mesh::v1::HANG_POLICY_FAIL);
  NormalizeJobSpec({}, spec);
  EXPECT_EQ(HangTimeout(spec), absl::Seconds(60));
  EXPECT_EQ(spec.on_hang(), mesh::v1::HANG_POLICY_FAIL);
}

TEST(JobSpecTest, MemoryPerProcIsNoneOrOneMiBToSixteenTiB) {
  for (int64_t ok : {int64_t{0}, int64_t{1} << 20, int64_t{8} << 30, int64_t{16} << 40}) {
    JobSpec spec = Valid();
    spec.set_memory_per_proc_bytes(ok);
    EXPECT_THAT(ValidateJobSpec(spec, {}), IsOk()) << ok;
  }
  for (int64_t bad : {int64_t{-1}, int64_t{1}, (int64_t{1} << 20) - 1, (int64_t{16} << 40) + 1,
                      std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()}) {
    JobSpec spec = Valid();
    spec.set_memory_per_proc_bytes(bad);
    EXPECT_THAT(ValidateJobSpec(spec, {}),
                StatusIs(Code::kInvalidArgument,
                         StartsWith(absl::StrCat("spec.memory_per_proc_bytes: ", bad,
                                                 " is outside 1 MiB (1048576) .. 16 TiB "
                                                 "(17592186044416); 0: no limit"))))
        << bad;
  }
}

TEST(JobSpecTest, MaxPidsIsNoneOrOneToTheKernelsCeiling) {
  for (int64_t ok : {int64_t{0}, int64_t{1}, int64_t{4096}, kMaxPidsLimit}) {
    JobSpec spec = Valid();
    spec.set_max_pids(ok);
    EXPECT_THAT(ValidateJobSpec(spec, {}), IsOk()) << ok;
  }
  for (int64_t bad : {int64_t{-1}, kMaxPidsLimit + 1, std::numeric_limits<int64_t>::max()}) {
    JobSpec spec = Valid();
    spec.set_max_pids(bad);
    EXPECT_THAT(
        ValidateJobSpec(spec, {}),
        StatusIs(Code::kInvalidArgument,
                 absl::StrCat("spec.max_pids: ", bad, " is outside 0..4194304 (0: no limit)")))
        << bad;
  }
}

TEST(JobSpecTest, LimitsAreKeptByNormalize) {
  JobSpec spec = Valid();
  spec.set_memory_per_proc_bytes(int64_t{8} << 30);
  spec.set_max_pids(4096);
  NormalizeJobSpec({}, spec);
  EXPECT_EQ(spec.memory_per_proc_bytes(), int64_t{8} << 30);
  EXPECT_EQ(spec.max_pids(), 4096);
  spec = Valid();
  NormalizeJobSpec({}, spec);  // 0 stays 0: no limit, not a default.
  EXPECT_EQ(spec.memory_per_proc_bytes(), 0);
  EXPECT_EQ(spec.max_pids(), 0);
}

TEST(JobSpecTest, RestFieldsAreReportedInFieldOrder) {
  JobSpec spec = Valid();
  spec.set_max_pids(-1);
  spec.set_memory_per_proc_bytes(1);
  spec.set_on_hang(static_cast<mesh::v1::HangPolicy>(7));
  spec.set_hang_timeout_seconds(-1);
  spec.set_idempotency_key("a\nb");
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.idempotency_key"));
  spec.clear_idempotency_key();
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.hang_timeout_seconds"));
  spec.clear_hang_timeout_seconds();
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.on_hang"));
  spec.clear_on_hang();
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.memory_per_proc_bytes"));
  spec.clear_memory_per_proc_bytes();
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.max_pids"));
}

TEST(JobSpecTest, GrowNeedsAnElasticJobAndAfterNeedsADelay) {
  JobSpec elastic = Valid();
  elastic.mutable_nodes()->set_min(1);
  elastic.mutable_nodes()->set_max(4);
  elastic.clear_mesh_shape();
  elastic.clear_mesh_dim_names();
  for (mesh::v1::GrowPolicy ok : {mesh::v1::GROW_POLICY_UNSPECIFIED, mesh::v1::GROW_POLICY_NEVER,
                                  mesh::v1::GROW_POLICY_ON_RESTART}) {
    JobSpec spec = elastic;
    spec.set_grow(ok);
    EXPECT_THAT(ValidateJobSpec(spec, {}), IsOk()) << GrowPolicyName(ok);
  }
  JobSpec spec = elastic;
  spec.set_grow(mesh::v1::GROW_POLICY_AFTER);
  EXPECT_THAT(
      ValidateJobSpec(spec, {}),
      StatusIs(Code::kInvalidArgument,
               "spec.grow_after_seconds: 0 is outside 1..604800 (grow AFTER needs a delay)"));
  spec.set_grow_after_seconds(kMaxGrowAfterSeconds + 1);
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.grow_after_seconds"));
  spec.set_grow_after_seconds(600);
  EXPECT_THAT(ValidateJobSpec(spec, {}), IsOk());
  spec.set_grow(mesh::v1::GROW_POLICY_ON_RESTART);
  EXPECT_THAT(ValidateJobSpec(spec, {}),
              StatusIs(Code::kInvalidArgument,
                       "spec.grow_after_seconds: 600 is set, but spec.grow is ON_RESTART; only "
                       "AFTER takes a delay"));
  spec.set_grow(static_cast<mesh::v1::GrowPolicy>(9));
  EXPECT_THAT(ValidateJobSpec(spec, {}),
              StatusIs(Code::kInvalidArgument,
                       "spec.grow: 9 is not a GrowPolicy (NEVER, ON_RESTART or AFTER)"));

  // A fixed size cannot grow.
  JobSpec fixed = Valid();
  fixed.set_grow(mesh::v1::GROW_POLICY_AFTER);
  fixed.set_grow_after_seconds(60);
  EXPECT_THAT(ValidateJobSpec(fixed, {}),
              StatusIs(Code::kInvalidArgument,
                       StartsWith("spec.grow: AFTER needs nodes MIN:MAX with MIN < MAX, but the "
                                  "job's size is fixed at")));
  fixed.set_grow(mesh::v1::GROW_POLICY_NEVER);
  fixed.clear_grow_after_seconds();
  EXPECT_THAT(ValidateJobSpec(fixed, {}), IsOk());

  // Normalized: UNSPECIFIED is NEVER; the others stay.
  spec = elastic;
  NormalizeJobSpec({}, spec);
  EXPECT_EQ(spec.grow(), mesh::v1::GROW_POLICY_NEVER);
  spec = elastic;
  spec.set_grow(mesh::v1::GROW_POLICY_ON_RESTART);
  NormalizeJobSpec({}, spec);
  EXPECT_EQ(spec.grow(), mesh::v1::GROW_POLICY_ON_RESTART);
}

TEST(JobSpecTest, RestartPolicyIsGroupOrInPlaceAndOnlyInPlaceTakesADim) {
  JobSpec spec = Valid();
  for (mesh::v1::RestartPolicy ok :
       {mesh::v1::RESTART_POLICY_UNSPECIFIED, mesh::v1::RESTART_POLICY_GROUP}) {
    spec.set_restart_policy(ok);
    EXPECT_THAT(ValidateJobSpec(spec, {}), IsOk()) << RestartPolicyName(ok);
  }
  spec.set_restart_policy(static_cast<mesh::v1::RestartPolicy>(7));
  EXPECT_THAT(ValidateJobSpec(spec, {}),
              StatusIs(Code::kInvalidArgument,
                       "spec.restart_policy: 7 is not a RestartPolicy (GROUP or IN_PLACE)"));
  spec.set_restart_policy(static_cast<mesh::v1::RestartPolicy>(-1));
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.restart_policy"));

  for (mesh::v1::RestartPolicy group :
       {mesh::v1::RESTART_POLICY_UNSPECIFIED, mesh::v1::RESTART_POLICY_GROUP}) {
    spec.set_restart_policy(group);
    spec.set_in_place_dim("dp");
    EXPECT_THAT(ValidateJobSpec(spec, {}),
                StatusIs(Code::kInvalidArgument,
                         "spec.in_place_dim: \"dp\" is set, but spec.restart_policy is GROUP; "
                         "only IN_PLACE takes a dimension"))
        << RestartPolicyName(group);
  }
  EXPECT_EQ(RestartPolicyName(mesh::v1::RESTART_POLICY_IN_PLACE), "IN_PLACE");
  EXPECT_EQ(RestartPolicyName(static_cast<mesh::v1::RestartPolicy>(7)), "UNKNOWN(7)");
}

TEST(JobSpecTest, InPlaceNeedsAMeshDimensionToDropReplicasAlong) {
  // Mesh (2, 4) named dp, tp.
  JobSpec named = Valid();
  named.add_mesh_shape(2);
  named.add_mesh_shape(4);
  named.add_mesh_dim_names("dp");
  named.add_mesh_dim_names("tp");
  named.set_restart_policy(mesh::v1::RESTART_POLICY_IN_PLACE);
  EXPECT_THAT(ValidateJobSpec(named, {}), IsOk());  // Along "dp", the default.
  JobSpec spec = named;
  spec.set_in_place_dim("dp");
  EXPECT_THAT(ValidateJobSpec(spec, {}), IsOk());
  spec.set_in_place_dim("tp");
  EXPECT_THAT(ValidateJobSpec(spec, {}), IsOk());
  spec.set_in_place_dim("pp");
  EXPECT_THAT(
      ValidateJobSpec(spec, {}),
      StatusIs(Code::kInvalidArgument, AllOf(StartsWith("spec.in_place_dim: "), HasSubstr("\"pp\""),
                                             HasSubstr("its dimensions: dp, tp"))));

  // Default names dim0, dim1 and no in_place_dim: the policy is at fault,
  // and the message lists what there is.
  spec = Valid();
  spec.add_mesh_shape(2);
  spec.add_mesh_shape(4);
  spec.set_restart_policy(mesh::v1::RESTART_POLICY_IN_PLACE);
  EXPECT_THAT(ValidateJobSpec(spec, {}),
              StatusIs(Code::kInvalidArgument,
                       AllOf(StartsWith("spec.restart_policy: "), HasSubstr("\"dp\""),
                             HasSubstr("its dimensions: dim0, dim1"), HasSubstr("in_place_dim"))));
  spec.set_in_place_dim("dim0");
  EXPECT_THAT(ValidateJobSpec(spec, {}), IsOk());
  spec.set_in_place_dim("dim2");
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.in_place_dim"));

  // The default 1-d mesh is named "world".
  spec = Valid();
  spec.set_restart_policy(mesh::v1::RESTART_POLICY_IN_PLACE);
  EXPECT_THAT(ValidateJobSpec(spec, {}),
              StatusIs(Code::kInvalidArgument, AllOf(StartsWith("spec.restart_policy: "),
                                                     HasSubstr("its dimensions: world"))));
  spec.set_in_place_dim("world");
  EXPECT_THAT(ValidateJobSpec(spec, {}), IsOk());

  // A dimension of size 1 has no replica to drop, named or defaulted.
  spec = named;
  spec.set_mesh_shape(0, 1);
  spec.set_mesh_shape(1, 8);
  EXPECT_THAT(ValidateJobSpec(spec, {}),
              StatusIs(Code::kInvalidArgument,
                       "spec.restart_policy: mesh dimension \"dp\" has size 1 with 2 nodes: it "
                       "has no replica to drop"));
  spec.set_in_place_dim("dp");
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.in_place_dim"));
  spec.set_in_place_dim("tp");
  EXPECT_THAT(ValidateJobSpec(spec, {}), IsOk());

  // A wildcard dimension takes what the nodes give it.
  spec = named;
  spec.mutable_nodes()->set_max(4);
  spec.set_mesh_shape(0, -1);
  EXPECT_THAT(ValidateJobSpec(spec, {}), IsOk());
  // ... which may be 1 even at the most nodes: (-1, 8) on 2 nodes of 4.
  spec = named;
  spec.set_mesh_shape(0, -1);
  spec.set_mesh_shape(1, 8);
  EXPECT_THAT(ValidateJobSpec(spec, {}),
              StatusIs(Code::kInvalidArgument, HasSubstr("\"dp\" has size 1 with 2 nodes")));
  // A world of one has no replica to drop either.
  spec = Valid();
  spec.mutable_nodes()->set_min(1);
  spec.set_nproc_per_node(1);
  spec.set_restart_policy(mesh::v1::RESTART_POLICY_IN_PLACE);
  spec.set_in_place_dim("world");
  EXPECT_THAT(ValidateJobSpec(spec, {}),
              StatusIs(Code::kInvalidArgument,
                       AllOf(StartsWith("spec.in_place_dim: "), HasSubstr("size 1 with 1 node"))));
}

TEST(JobSpecTest, NormalizeFillsTheRestartPolicyAndTheInPlaceDim) {
  JobSpec spec = Valid();
  NormalizeJobSpec({}, spec);
  EXPECT_EQ(spec.restart_policy(), mesh::v1::RESTART_POLICY_GROUP);
  EXPECT_EQ(spec.in_place_dim(), "");
  EXPECT_THAT(ValidateJobSpec(spec, {}), IsOk());

  spec = Valid();
  spec.add_mesh_shape(2);
  spec.add_mesh_shape(4);
  spec.add_mesh_dim_names("dp");
  spec.add_mesh_dim_names("tp");
  spec.set_restart_policy(mesh::v1::RESTART_POLICY_IN_PLACE);
  NormalizeJobSpec({}, spec);
  EXPECT_EQ(spec.restart_policy(), mesh::v1::RESTART_POLICY_IN_PLACE);
  EXPECT_EQ(spec.in_place_dim(), "dp");
  // Idempotent, and the result still validates.
  const std::string once = spec.SerializeAsString();
  NormalizeJobSpec({}, spec);
  EXPECT_EQ(spec.SerializeAsString(), once);
  EXPECT_THAT(ValidateJobSpec(spec, {}), IsOk());

  // A named dimension stays.
  spec.set_in_place_dim("tp");
  NormalizeJobSpec({}, spec);
  EXPECT_EQ(spec.in_place_dim(), "tp");
}

TEST(JobSpecTest, TheOperatorMayAllowDeniedEnvNamesOnly) {
  JobSpec spec = Valid();
  (*spec.mutable_env())["LD_LIBRARY_PATH"] = "/opt/conda/lib";
  EXPECT_THAT(
      ValidateJobSpec(spec, {}),
      StatusIs(Code::kInvalidArgument, AllOf(StartsWith("spec.env[\"LD_LIBRARY_PATH\"]: denied: "),
                                             HasSubstr("--allow-job-env"))));
  JobSpecLimits limits;
  limits.allowed_job_env = {"LD_LIBRARY_PATH"};
  ASSERT_THAT(ValidateJobSpecLimits(limits), IsOk());
  EXPECT_THAT(ValidateJobSpec(spec, limits), IsOk());
  NormalizeJobSpec(limits, spec);
  EXPECT_EQ(spec.env().at("LD_LIBRARY_PATH"), "/opt/conda/lib");
  // Only the names listed.
  (*spec.mutable_env())["LD_PRELOAD"] = "/x.so";
  EXPECT_THAT(ValidateJobSpec(spec, limits), RejectsField("spec.env[\"LD_PRELOAD\"]"));

  // A list naming anything but denied names is itself invalid.
  for (const char* name : {"RANK", "MESH_TOKEN", "CUDA_VISIBLE_DEVICES", "PATH", "", "A=B"}) {
    limits.allowed_job_env = {"LD_LIBRARY_PATH", name};
    EXPECT_THAT(ValidateJobSpecLimits(limits),
                StatusIs(Code::kInvalidArgument, StartsWith("allowed_job_env: --allow-job-env: ")))
        << name;
  }
}

TEST(JobSpecTest, IdempotencyKeyAtAndOverLimit) {
  JobSpecLimits limits;
  limits.max_idempotency_key_bytes = 8;
  JobSpec spec = Valid();
  spec.set_idempotency_key("abcd-123");
  EXPECT_THAT(ValidateJobSpec(spec, limits), IsOk());
  spec.set_idempotency_key("abcd-1234");
  EXPECT_THAT(
      ValidateJobSpec(spec, limits),
      StatusIs(Code::kInvalidArgument, "spec.idempotency_key: 9 bytes, over the limit of 8"));
  spec.set_idempotency_key("a\nb");
  EXPECT_THAT(ValidateJobSpec(spec, limits), RejectsField("spec.idempotency_key"));
}

TEST(JobSpecTest, FirstBadFieldInFieldOrderIsReported) {
  JobSpec spec = Valid();
  spec.set_max_restarts(-1);
  spec.set_nproc_per_node(0);
  (*spec.mutable_env())["RANK"] = "0";
  EXPECT_THAT(ValidateJobSpec(spec, {}), RejectsField("spec.env[\"RANK\"]"));
}

TEST(JobSpecTest, NormalizeFillsDefaults) {
  JobSpecLimits limits;
  JobSpec spec = Valid();
  spec.set_working_dir("/home/u/./run/../exp/");
  NormalizeJobSpec(limits, spec);
  EXPECT_EQ(spec.nodes().max(), 2);
  EXPECT_THAT(spec.mesh_shape(), ElementsAre(-1));
  EXPECT_THAT(spec.mesh_dim_names(), ElementsAre("world"));
  EXPECT_EQ(spec.working_dir(), "/home/u/exp");
  // Idempotent, and the result still validates.
  const std::string once = spec.SerializeAsString();
  NormalizeJobSpec(limits, spec);
  EXPECT_EQ(spec.SerializeAsString(), once);
  EXPECT_THAT(ValidateJobSpec(spec, limits), IsOk());

  spec = Valid();
  spec.add_mesh_shape(2);
  spec.add_mesh_shape(4);
  NormalizeJobSpec(limits, spec);
  EXPECT_THAT(spec.mesh_dim_names(), ElementsAre("dim0", "dim1"));
}

TEST(JobSpecTest, ResolveMeshShape) {
  JobSpec spec = Valid();
  spec.mutable_nodes()->set_min(1);
  spec.mutable_nodes()->set_max(3);
  spec.add_mesh_shape(-1);
  spec.add_mesh_shape(2);
  ASSERT_THAT(ValidateJobSpec(spec, {}), IsOk());
  EXPECT_THAT(ResolveMeshShape(spec, 1).value(), ElementsAre(2, 2));
  EXPECT_THAT(ResolveMeshShape(spec, 3).value(), ElementsAre(6, 2));
  EXPECT_THAT(ResolveMeshShape(spec, 4), StatusIs(Code::kInvalidArgument));
  EXPECT_THAT(ResolveMeshShape(spec, 0), StatusIs(Code::kInvalidArgument));

  spec = Valid();  // Default shape, fixed 2 nodes.
  EXPECT_THAT(ResolveMeshShape(spec, 2).value(), ElementsAre(8));
  spec.add_mesh_shape(2);
  spec.add_mesh_shape(4);
  EXPECT_THAT(ResolveMeshShape(spec, 2).value(), ElementsAre(2, 4));
}

}  // namespace job_spec_test
}  // namespace mesh::coordinator
