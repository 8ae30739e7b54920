// The cgroup module against the real hierarchies of this machine: v1 (the
// controllers mounted separately) and v2, also on a hybrid host's
// controller-less /sys/fs/cgroup/unified. Real processes join the cgroups
// the way the launcher makes them (a pre-exec write of "0" to cgroup.procs).
// Each test skips, saying why, without root or the hierarchy it needs.
#include "agent/cgroup.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "agent/cgroup_fs.h"
#include "common/subprocess.h"
#include "tests/util/subprocess.h"
#include "tests/util/proc.h"

namespace mesh::agent {
namespace cgroup_test {

using ::testing::HasSubstr;

bool IsCgroupMount(const std::string& path, long magic) {
  struct statfs st;
  return statfs(path.c_str(), &st) == 0 && st.f_type == magic;
}

// Starts `argv` inside `dirs` (their cgroup.procs opened before fork).
absl::StatusOr<testing::Subprocess> StartIn(const std::vector<std::string>& dirs,
                                            std::vector<std::string> argv) {
  std::vector<int> fds;
  for (const std::string& dir : dirs) {
    const int fd = open((dir + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return absl::InternalError("open cgroup.procs");
    fds.push_back(fd);
  }
  SpawnOptions options;
  options.argv = std::move(argv);
  options.group = SpawnOptions::Group::kNewSession;
  options.pre_exec = [&fds] {
    for (int fd : fds) {
      if (write(fd, "0", 1) != 1) return errno;
    }
    return 0;
  };
  absl::StatusOr<testing::Subprocess> process = testing::Subprocess::Spawn(options);
  for (int fd : fds) close(fd);
  return process;
}

class CgroupTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "making cgroups needs root";
    options_.agent_name = absl::StrCat("cgroup-test-", GetParam());
    if (GetParam() == "v1") {
      if (!IsCgroupMount("/sys/fs/cgroup/freezer", 0x27e0eb)) {
        GTEST_SKIP() << "no cgroup v1 freezer hierarchy at /sys/fs/cgroup/freezer";
      }
      options_.mode = CgroupOptions::Mode::kV1;
    } else {
      // A v2 host, or a hybrid host's unified hierarchy.
      options_.mode = CgroupOptions::Mode::kV2;
      for (const char* root : {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"}) {
        if (IsCgroupMount(root, 0x63677270)) {
          options_.v2_root = root;
          break;
        }
      }
      if (options_.v2_root == "/sys/fs/cgroup" && !IsCgroupMount("/sys/fs/cgroup", 0x63677270)) {
        GTEST_SKIP() << "no cgroup v2 hierarchy at /sys/fs/cgroup or /sys/fs/cgroup/unified";
      }
    }
    auto manager = CgroupManager::Create(options_);
    ASSERT_TRUE(manager.ok()) << manager.status();
    manager_ = *std::move(manager);
    std::printf("%s\n", manager_->Describe().c_str());
  }

  CgroupOptions options_;
  std::unique_ptr<CgroupManager> manager_;
};

TEST_P(CgroupTest, KillAllReachesAnEscapedDescendantAndRemoveCleansUp) {
  auto gen = manager_->CreateGeneration("job-kill", 0, {});
  ASSERT_TRUE(gen.ok()) << gen.status();
  auto dirs = (*gen)->CreateRank(0, {});
  ASSERT_TRUE(dirs.ok()) << dirs.status();
  // The worker starts a grandchild in a new session with an empty
  // environment, prints its pid and waits.
  auto worker = StartIn(*dirs, {"/bin/sh", "-c",
                                "setsid env -i /bin/sh -c 'echo $$; exec sleep 60' & wait"});
  ASSERT_TRUE(worker.ok()) << worker.status();
  std::string line;
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        auto got = worker->ReadLine(absl::Milliseconds(100));
        if (got.ok()) line = *got;
        return got.ok();
      },
      absl::Seconds(10)));
  pid_t escaped = 0;
  ASSERT_TRUE(absl::SimpleAtoi(line, &escaped)) << line;
  EXPECT_FALSE((*gen)->Empty());
  EXPECT_EQ((*gen)->Remove().code(), absl::StatusCode::kFailedPrecondition);
  auto killed = (*gen)->KillAll(absl::Seconds(5));
  ASSERT_TRUE(killed.ok()) << killed.status();
  EXPECT_GE(*killed, 2);
  EXPECT_TRUE(testing::WaitUntil([&] { return !testing::IsAlive(escaped); }, absl::Seconds(2)));
  worker->Wait(absl::Seconds(5)).IgnoreError();
  EXPECT_TRUE((*gen)->Empty());
  EXPECT_TRUE((*gen)->Remove().ok());
  for (const std::string& dir : *dirs) EXPECT_FALSE(cgroup_fs::Exists(dir)) << dir;
}

TEST_P(CgroupTest, UsageCountsTheGenerationsProcesses) {
  auto gen = manager_->CreateGeneration("job-usage", 3, {});
  ASSERT_TRUE(gen.ok()) << gen.status();
  auto dirs = (*gen)->CreateRank(1, {});
  ASSERT_TRUE(dirs.ok()) << dirs.status();
  auto busy = StartIn(*dirs, {"/bin/sh", "-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"});
  ASSERT_TRUE(busy.ok()) << busy.status();
  ASSERT_TRUE(busy->Wait(absl::Seconds(30)).ok());
  if (manager_->capabilities().cpu_usage) {
    EXPECT_GT((*gen)->Usage().cpu_seconds, 0.0);
  }
  EXPECT_EQ((*gen)->OomKills(1), 0);
  EXPECT_TRUE((*gen)->Remove().ok());
}

TEST_P(CgroupTest, MemoryLimitOomKillsAndIsCounted) {
  if (!manager_->capabilities().memory_limit) {
    GTEST_SKIP() << "no memory controller here: " << manager_->Describe();
  }
  auto gen = manager_->CreateGeneration("job-oom", 0, {});
  ASSERT_TRUE(gen.ok()) << gen.status();
  CgroupLimits limits;
  limits.memory_bytes = int64_t{32} << 20;
  auto dirs = (*gen)->CreateRank(0, limits);
  ASSERT_TRUE(dirs.ok()) << dirs.status();
  // tail -n 1 holds a line without a newline whole: 256 MiB of zeros.
  auto hog = StartIn(*dirs, {"/bin/sh", "-c", "head -c 268435456 /dev/zero | tail -n 1 >/dev/null"});
  ASSERT_TRUE(hog.ok()) << hog.status();
  auto status = hog->Wait(absl::Seconds(60));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_GT((*gen)->OomKills(0), 0);
  EXPECT_TRUE((*gen)->Remove().ok());
}

TEST_P(CgroupTest, LimitsTheNodeCannotEnforceAreUnimplemented) {
  auto gen = manager_->CreateGeneration("job-limits", 0, {});
  ASSERT_TRUE(gen.ok()) << gen.status();
  CgroupLimits limits;
  limits.max_pids = 8;
  auto dirs = (*gen)->CreateRank(0, limits);
  if (manager_->capabilities().pids_limit) {
    ASSERT_TRUE(dirs.ok()) << dirs.status();
    // A fork bomb in miniature stops at the limit; the kernel counts it.
    auto forks = StartIn(*dirs, {"/bin/sh", "-c",
                                 "for i in 1 2 3 4 5 6 7 8 9 10 11 12; do sleep 5 & done; wait"});
    ASSERT_TRUE(forks.ok()) << forks.status();
    std::string pids_dir;
    for (const std::string& dir : *dirs) {
      if (GetParam() == "v2" || dir.find("/pids/") != std::string::npos) pids_dir = dir;
    }
    EXPECT_TRUE(testing::WaitUntil(
        [&] { return cgroup_fs::ReadKeyedValue(pids_dir + "/pids.events", "max").value_or(0) > 0; },
        absl::Seconds(10)));
    EXPECT_LE(cgroup_fs::ReadInteger(pids_dir + "/pids.current").value_or(0), 8);
    (*gen)->KillAll(absl::Seconds(5)).IgnoreError();
    forks->Wait(absl::Seconds(10)).IgnoreError();
  } else {
    EXPECT_EQ(dirs.status().code(), absl::StatusCode::kUnimplemented) << dirs.status();
  }
  (*gen)->KillAll(absl::Seconds(5)).IgnoreError();
  EXPECT_TRUE((*gen)->Remove().ok());
}

TEST_P(CgroupTest, DeviceRulesDenyExactlyTheListedNodes) {
  if (!manager_->capabilities().devices) {
    GTEST_SKIP() << "no device rules here: " << manager_->Describe();
  }
  const std::string dev = testing::MakeTempDir("mesh-cgroup-dev");
  ASSERT_EQ(mknod((dev + "/nvidia0").c_str(), S_IFCHR | 0666, makedev(1, 7)), 0);
  ASSERT_EQ(mknod((dev + "/nvidiactl").c_str(), S_IFCHR | 0666, makedev(1, 5)), 0);
  const NvidiaDevices found = FindNvidiaDevices(dev);
  ASSERT_EQ(found.gpus.size(), 1u);
  ASSERT_EQ(found.shared.size(), 1u);
  // A CPU job: both denied; /dev/null (1:3) still opens.
  auto gen = manager_->CreateGeneration("job-dev", 0, GpuConfinement(found, {}));
  ASSERT_TRUE(gen.ok()) << gen.status();
  auto dirs = (*gen)->CreateRank(0, {});
  ASSERT_TRUE(dirs.ok()) << dirs.status();
  auto probe = StartIn(*dirs, {"/bin/sh", "-c",
                               absl::StrCat("(exec 3<", dev, "/nvidia0) 2>/dev/null && echo gpu-open || echo gpu-denied; ",
                                            "(exec 3<", dev, "/nvidiactl) 2>/dev/null && echo ctl-open || echo ctl-denied; ",
                                            "(exec 3</dev/null) && echo null-open")});
  ASSERT_TRUE(probe.ok()) << probe.status();
  std::string out;
  for (int i = 0; i < 3; ++i) {
    auto line = probe->ReadLine(absl::Seconds(10));
    ASSERT_TRUE(line.ok()) << line.status() << " after " << out;
    out += *line + " ";
  }
  EXPECT_EQ(out, "gpu-denied ctl-denied null-open ");
  probe->Wait(absl::Seconds(5)).IgnoreError();
  EXPECT_TRUE((*gen)->Remove().ok());
  std::system(absl::StrCat("rm -rf '", dev, "'").c_str());
}

TEST_P(CgroupTest, AnAgentsSubtreeIsKilledWhenItDiesAndStaleOnesAtTheNextStart) {
  // A stand-in for a dead agent's subtree: pid 2^22 - 1 is above any pid.
  CgroupOptions dead = options_;
  const pid_t no_pid = 4194303;
  auto gen = manager_->CreateGeneration("job-stale", 0, {});
  ASSERT_TRUE(gen.ok()) << gen.status();
  auto dirs = (*gen)->CreateRank(0, {});
  ASSERT_TRUE(dirs.ok()) << dirs.status();
  auto sleeper = StartIn(*dirs, {"/bin/sleep", "60"});
  ASSERT_TRUE(sleeper.ok()) << sleeper.status();
  // KillAgentCgroups of this process (as the watchdog does for the agent).
  EXPECT_GE(KillAgentCgroups(options_, getpid()), 1);
  EXPECT_TRUE(sleeper->Wait(absl::Seconds(5)).ok());
  EXPECT_EQ(KillAgentCgroups(dead, no_pid), 0);
  (*gen).reset();
}

INSTANTIATE_TEST_SUITE_P(Versions, CgroupTest, ::testing::Values("v1", "v2"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

TEST(CgroupManagerTest, NoneModeAndBadNames) {
  CgroupOptions options;
  options.agent_name = "n1";
  options.mode = CgroupOptions::Mode::kNone;
  auto none = CgroupManager::Create(options);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ((*none)->version(), CgroupVersion::kNone);
  EXPECT_THAT((*none)->Describe(), HasSubstr("--cgroups=none"));
  EXPECT_EQ((*none)->CreateGeneration("j", 0, {}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  options.agent_name = "bad/name";
  EXPECT_EQ(CgroupManager::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.agent_name = "n1";
  options.mode = CgroupOptions::Mode::kV2;
  options.v2_root = "/nonexistent";
  EXPECT_EQ(CgroupManager::Create(options).status().code(), absl::StatusCode::kFailedPrecondition);
  options.mode = CgroupOptions::Mode::kV1;
  options.v1_root = "/nonexistent";
  EXPECT_EQ(CgroupManager::Create(options).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(GpuConfinementTest, CpuJobsOpenNothingAndGpuJobsTheirOwn) {
  NvidiaDevices devices;
  devices.gpus = {{0, {195, 0}}, {1, {195, 1}}, {2, {195, 2}}};
  devices.shared = {{195, 255}, {509, 0}};
  EXPECT_THAT(GpuConfinement(devices, {}).deny,
              ::testing::ElementsAre(CharDevice{195, 0}, CharDevice{195, 1}, CharDevice{195, 2},
                                     CharDevice{195, 255}, CharDevice{509, 0}));
  EXPECT_THAT(GpuConfinement(devices, {1}).deny,
              ::testing::ElementsAre(CharDevice{195, 0}, CharDevice{195, 2}));
  EXPECT_TRUE(GpuConfinement(devices, {0, 1, 2}).deny.empty());
  EXPECT_TRUE(FindNvidiaDevices("/nonexistent").gpus.empty());
}

}  // namespace cgroup_test
}  // namespace mesh::agent
