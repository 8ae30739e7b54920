// Job isolation on a node, with a real coordinator, a real agent and real
// workers (isolation_probe): a cancel kills a descendant that left its
// worker's session and environment (kill by cgroup); a worker over its
// memory limit is OOM-killed and the root cause says so; a CPU job cannot
// open the node's GPU device nodes and a GPU job only its own; an agent
// that is not root still runs jobs and says that isolation is off.
// Owner accounts across two users' jobs are in secure_cluster_test.cc
// (they need the token file's unix_user, so TLS and tokens).
//
// Every test needs root (cgroups, device nodes, other accounts) and skips
// loudly without it, or without the cgroup hierarchy it needs.
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/util/mesh_cluster.h"
#include "tests/util/proc.h"

namespace mesh {
namespace isolation_test {

using ::testing::HasSubstr;

// The hierarchy the agent uses on this machine (v2, or v1's freezer).
bool HaveCgroups() {
  struct stat st;
  return stat("/sys/fs/cgroup/cgroup.controllers", &st) == 0 ||
         stat("/sys/fs/cgroup/freezer/cgroup.procs", &st) == 0;
}

std::string ReadFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

class IsolationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "job isolation needs a root agent; this test is not root";
    if (!HaveCgroups()) GTEST_SKIP() << "no cgroup v2 or v1 freezer hierarchy on this machine";
    cluster_ = std::make_unique<testing::MeshCluster>(
        testing::MeshClusterBinaries{MESH_COORDINATOR_BIN, MESH_AGENT_BIN}, "mesh-isolation");
    // The probe's pid file and device nodes live here; workers must reach it.
    ASSERT_EQ(chmod(cluster_->dir().c_str(), 0755), 0);
    ASSERT_TRUE(cluster_->StartCoordinator().ok());
  }

  void StartAgent(const std::string& gpus = "none", const std::vector<std::string>& extra = {}) {
    ASSERT_TRUE(cluster_->StartAgent(0, 2, gpus, extra).ok());
    ASSERT_TRUE(testing::WaitUntil([&] { return cluster_->ReadyNodes() == 1; }, absl::Seconds(20)))
        << "the agent did not register";
  }

  v1::JobSpec ProbeSpec(std::vector<std::string> args) {
    v1::JobSpec spec;
    spec.set_name("probe");
    spec.add_command(ISOLATION_PROBE_BIN);
    for (std::string& arg : args) spec.add_command(std::move(arg));
    spec.mutable_nodes()->set_min(1);
    spec.mutable_nodes()->set_max(1);
    spec.set_nproc_per_node(1);
    return spec;
  }

  std::unique_ptr<testing::MeshCluster> cluster_;
};

TEST_F(IsolationTest, CancelKillsADescendantThatLeftItsSessionAndEnvironmentWithinTwoSeconds) {
  StartAgent();
  if (HasFatalFailure()) return;
  const std::string pidfile = cluster_->dir() + "/escaped.pid";
  // Other tests run jobs named job-1 at the same time: a marker of this
  // test's own tells its worker apart.
  const std::string marker = absl::StrCat("MARKER=isolation-test-", getpid());
  v1::JobSpec spec = ProbeSpec({"escape", pidfile});
  (*spec.mutable_env())["MARKER"] = marker.substr(7);
  auto job = testing::SubmitJob(cluster_->jobs(), spec);
  ASSERT_TRUE(job.ok()) << job.status();
  pid_t escaped = 0;
  ASSERT_TRUE(testing::WaitUntil(
      [&] { return absl::SimpleAtoi(ReadFirstLine(pidfile), &escaped) && escaped > 0; },
      absl::Seconds(20)))
      << "the probe did not start its escaped grandchild";
  ASSERT_TRUE(testing::IsAlive(escaped));
  // Escaped for real: another session than its worker's, and an empty
  // environment (no MESH_* marker for the environment scan to find).
  const std::vector<pid_t> workers =
      testing::LiveProcessesWithEnv({"MESH_JOB_ID=" + job->id(), marker});
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_NE(getsid(escaped), getsid(workers[0]));
  EXPECT_EQ(ReadFirstLine(absl::StrCat("/proc/", escaped, "/environ")), "");

  v1::CancelJobRequest cancel;
  cancel.set_job_id(job->id());
  v1::CancelJobResponse response;
  auto context = testing::ContextWithDeadline();
  ASSERT_TRUE(cluster_->jobs().CancelJob(context.get(), cancel, &response).ok());
  const absl::Time cancelled = absl::Now();
  EXPECT_TRUE(testing::WaitUntil([&] { return !testing::IsAlive(escaped); }, absl::Seconds(2)))
      << "pid " << escaped << " (setsid, empty environment, double fork) outlived the cancel";
  std::printf("escaped descendant gone %.0f ms after the cancel\n",
              absl::ToDoubleMilliseconds(absl::Now() - cancelled));
}

TEST_F(IsolationTest, AWorkerOverItsMemoryLimitIsOomKilledAndTheRootCauseSaysSo) {
  StartAgent();
  if (HasFatalFailure()) return;
  v1::JobSpec spec = ProbeSpec({"oom", "1024"});
  spec.set_memory_per_proc_bytes(int64_t{64} << 20);
  auto job = testing::SubmitJob(cluster_->jobs(), spec);
  ASSERT_TRUE(job.ok()) << job.status();
  auto done = cluster_->WaitTerminal(job->id(), absl::Seconds(60));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::JOB_STATE_FAILED);
  EXPECT_TRUE(done->root_cause().oom_killed()) << done->root_cause().DebugString();
  EXPECT_EQ(done->root_cause().signal(), 9);
  EXPECT_THAT(done->root_cause().message(), HasSubstr("killed by the kernel"));
  EXPECT_THAT(done->root_cause().message(), HasSubstr("memory limit 64 MiB"));
  std::printf("root cause: %s\n", done->root_cause().message().c_str());

  // The node and its other jobs are unaffected: the next job runs to the end.
  auto next = testing::SubmitJob(cluster_->jobs(), ProbeSpec({"oom", "16"}));
  ASSERT_TRUE(next.ok()) << next.status();
  auto next_done = cluster_->WaitTerminal(next->id(), absl::Seconds(60));
  ASSERT_TRUE(next_done.ok()) << next_done.status();
  EXPECT_EQ(next_done->state(), v1::JOB_STATE_SUCCEEDED) << next_done->root_cause().message();
}

// Fake GPU device nodes: nvidia0 and nvidia1 with the numbers of /dev/full
// and /dev/zero, which open anywhere unless a device rule forbids them.
class DeviceIsolationTest : public IsolationTest {
 protected:
  void SetUp() override {
    IsolationTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    dev_dir_ = cluster_->dir() + "/dev";
    ASSERT_EQ(mkdir(dev_dir_.c_str(), 0755), 0);
    ASSERT_EQ(mknod((dev_dir_ + "/nvidia0").c_str(), S_IFCHR | 0666, makedev(1, 7)), 0);
    ASSERT_EQ(mknod((dev_dir_ + "/nvidia1").c_str(), S_IFCHR | 0666, makedev(1, 5)), 0);
  }

  std::string dev_dir_;
};

TEST_F(DeviceIsolationTest, ACpuJobOpensNoGpuDeviceAndAGpuJobOnlyItsOwn) {
  StartAgent("0,1", {"--gpu-device-dir", dev_dir_});
  if (HasFatalFailure()) return;
  auto node = testing::GetNode(cluster_->jobs(), "node-0");
  ASSERT_TRUE(node.ok()) << node.status();
  if (!node->isolation().device_confinement()) {
    GTEST_SKIP() << "this node's cgroups cannot confine devices: " << node->isolation().cgroups();
  }

  auto cpu = testing::SubmitJob(cluster_->jobs(), ProbeSpec({"open-gpus", dev_dir_}));
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto cpu_done = cluster_->WaitTerminal(cpu->id(), absl::Seconds(60));
  ASSERT_TRUE(cpu_done.ok()) << cpu_done.status();
  EXPECT_EQ(cpu_done->state(), v1::JOB_STATE_SUCCEEDED)
      << "a CPU job opened a GPU device node: " << cpu_done->root_cause().message();

  v1::JobSpec gpu_spec = ProbeSpec({"open-gpus", dev_dir_});
  gpu_spec.set_gpus_per_proc(1);
  auto gpu = testing::SubmitJob(cluster_->jobs(), gpu_spec);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  auto gpu_done = cluster_->WaitTerminal(gpu->id(), absl::Seconds(60));
  ASSERT_TRUE(gpu_done.ok()) << gpu_done.status();
  EXPECT_EQ(gpu_done->state(), v1::JOB_STATE_SUCCEEDED)
      << "a GPU job could not open its own GPU or opened another: "
      << gpu_done->root_cause().message();
  // The test itself, in no job's cgroup, opens both.
  for (const char* name : {"/nvidia0", "/nvidia1"}) {
    std::ifstream in(dev_dir_ + name);
    EXPECT_TRUE(in.is_open()) << dev_dir_ << name;
  }
}

TEST_F(IsolationTest, AnAgentThatIsNotRootRunsJobsAndSaysIsolationIsOff) {
  std::string why;
  if (!testing::EnsureTestUser("mesh-test-a", &why)) GTEST_SKIP() << why;
  // The agent's work directory must be its own.
  const std::string work = cluster_->dir() + "/agent-0";
  ASSERT_EQ(mkdir(work.c_str(), 0755), 0);
  ASSERT_EQ(std::system(absl::StrCat("chown mesh-test-a '", work, "'").c_str()), 0);
  ASSERT_TRUE(cluster_
                  ->StartAgent(0, 2, "none", {"--cgroups", "none"},
                               {"setpriv", "--reuid=mesh-test-a", "--regid=mesh-test-a",
                                "--init-groups", "--pdeathsig=SIGKILL", "--"})
                  .ok());
  ASSERT_TRUE(testing::WaitUntil([&] { return cluster_->ReadyNodes() == 1; }, absl::Seconds(20)))
      << "the unprivileged agent did not register";
  auto node = testing::GetNode(cluster_->jobs(), "node-0");
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_FALSE(node->isolation().run_as_owner());
  EXPECT_THAT(node->isolation().users(), HasSubstr("not root"));
  EXPECT_EQ(node->isolation().cgroup_version(), "none");
  EXPECT_EQ(node->isolation().kill_mechanism(), "process group + environment scan");

  auto job = testing::SubmitJob(cluster_->jobs(), ProbeSpec({"hold", "0"}));
  ASSERT_TRUE(job.ok()) << job.status();
  auto done = cluster_->WaitTerminal(job->id(), absl::Seconds(60));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->root_cause().message();
}

}  // namespace isolation_test
}  // namespace mesh
