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

#include <cstring>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "agent/cgroup_fs.h"
#include "common/subprocess.h"
#include "tests/util/proc.h"
#include "tests/util/subprocess.h"

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

TEST_P(CgroupTest, KillRankReachesOnlyThatRanksProcesses) {
  auto gen = manager_->CreateGeneration("job-kill-rank", 0, {});
  ASSERT_TRUE(gen.ok()) << gen.status();
  auto rank0 = (*gen)->CreateRank(0, {});
  auto rank1 = (*gen)->CreateRank(1, {});
  ASSERT_TRUE(rank0.ok() && rank1.ok());
  // Rank 0's worker left a grandchild in a session of its own.
  auto worker0 = StartIn(*rank0, {"/bin/sh", "-c",
                                  "(setsid env -i /bin/sh -c 'echo $$; exec sleep 60' &); "
                                  "exec sleep 60"});
  auto worker1 = StartIn(*rank1, {"/bin/sh", "-c", "echo $$; exec sleep 60"});
  ASSERT_TRUE(worker0.ok() && worker1.ok());
  auto pid_of = [](testing::Subprocess& worker) {
    std::string line;
    EXPECT_TRUE(testing::WaitUntil(
        [&] {
          auto got = worker.ReadLine(absl::Milliseconds(100));
          if (got.ok()) line = *got;
          return got.ok();
        },
        absl::Seconds(10)));
    pid_t pid = 0;
    EXPECT_TRUE(absl::SimpleAtoi(line, &pid)) << line;
    return pid;
  };
  const pid_t escaped = pid_of(*worker0);
  const pid_t other = pid_of(*worker1);
  auto killed = (*gen)->KillRank(0, absl::Seconds(2));
  ASSERT_TRUE(killed.ok()) << killed.status();
  EXPECT_GE(*killed, 2);
  EXPECT_TRUE(testing::WaitUntil([&] { return !testing::IsAlive(escaped); }, absl::Seconds(2)));
  worker0->Wait(absl::Seconds(5)).IgnoreError();
  EXPECT_TRUE(testing::IsAlive(other)) << "rank 1 is untouched";
  EXPECT_EQ(*(*gen)->KillRank(7, absl::Seconds(1)), 0) << "a rank never made";
  ASSERT_TRUE((*gen)->KillAll(absl::Seconds(2)).ok());
  worker1->Wait(absl::Seconds(5)).IgnoreError();
  EXPECT_TRUE((*gen)->Remove().ok());
}

TEST_P(CgroupTest, KillAllReachesAnEscapedDescendantAndRemoveCleansUp) {
  auto gen = manager_->CreateGeneration("job-kill", 0, {});
  ASSERT_TRUE(gen.ok()) << gen.status();
  auto dirs = (*gen)->CreateRank(0, {});
  ASSERT_TRUE(dirs.ok()) << dirs.status();
  auto again = (*gen)->CreateRank(0, {});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *dirs);
  // The worker double-forks a grandchild (its parent exits at once, so it
  // is reparented away from the worker) in a new session with an empty
  // environment; the grandchild prints its pid.
  auto worker = StartIn(*dirs, {"/bin/sh", "-c",
                                "(setsid env -i /bin/sh -c 'echo $$; exec sleep 60' &); "
                                "exec sleep 60"});
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
  EXPECT_NE(testing::ParentOf(escaped), worker->pid());
  EXPECT_FALSE((*gen)->Empty());
  EXPECT_EQ((*gen)->Remove().code(), absl::StatusCode::kFailedPrecondition);
  const absl::Time start = absl::Now();
  auto killed = (*gen)->KillAll(absl::Seconds(2));
  ASSERT_TRUE(killed.ok()) << killed.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_GE(*killed, 2);
  EXPECT_TRUE((*gen)->Empty());
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
  auto busy = StartIn(*dirs, {"/bin/sh", "-c",
                              "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; "
                              "echo done; exec sleep 60"});
  ASSERT_TRUE(busy.ok()) << busy.status();
  ASSERT_TRUE(busy->ReadLine(absl::Seconds(30)).ok());
  const CgroupUsage usage = (*gen)->Usage();
  EXPECT_GE(usage.processes, 1);
  if (manager_->capabilities().cpu_usage) {
    EXPECT_GT(usage.cpu_seconds, 0.0);
  }
  if (manager_->capabilities().memory_usage) {
    EXPECT_GT(usage.memory_bytes, 0);
  } else {
    EXPECT_EQ(usage.memory_bytes, 0);
  }
  ASSERT_TRUE((*gen)->KillAll(absl::Seconds(2)).ok());
  busy->Wait(absl::Seconds(5)).IgnoreError();
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
  // One process (perl-base is essential on Debian) fills a 256 MiB string,
  // so the OOM killer's only candidate is the child this test waits for; a
  // pipeline would let the kernel pick among several processes and leave the
  // shell to report the victim's death second-hand.
  auto hog = StartIn(
      *dirs, {"/usr/bin/perl", "-e", "my $x = \"\\0\" x 268435456; print length($x), \"\\n\";"});
  ASSERT_TRUE(hog.ok()) << hog.status();
  auto status = hog->Wait(absl::Seconds(60));
  ASSERT_TRUE(status.ok()) << status.status();
  std::string memory_dir;
  for (const std::string& dir : *dirs) {
    if (GetParam() == "v2" || dir.find("/memory/") != std::string::npos) memory_dir = dir;
  }
  const std::string events =
      memory_dir + (GetParam() == "v2" ? "/memory.events" : "/memory.oom_control");
  EXPECT_EQ(testing::ExitCode(*status), 128 + SIGKILL)
      << events << ": " << cgroup_fs::ReadText(events).value_or("(unreadable)");
  EXPECT_GT((*gen)->OomKills(0), 0)
      << events << ": " << cgroup_fs::ReadText(events).value_or("(unreadable)");
  // The victim is reaped; its cgroup empties once the kernel has torn it down.
  EXPECT_TRUE(testing::WaitUntil([&] { return (*gen)->Empty(); }, absl::Seconds(5)));
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
    auto forks = StartIn(
        *dirs, {"/bin/sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10 11 12; do sleep 5 & done; wait"});
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
    EXPECT_THAT(dirs.status().message(), HasSubstr("pids"));
  }
  CgroupLimits memory;
  memory.memory_bytes = int64_t{32} << 20;
  auto with_memory = (*gen)->CreateRank(1, memory);
  if (manager_->capabilities().memory_limit) {
    EXPECT_TRUE(with_memory.ok()) << with_memory.status();
  } else {
    EXPECT_EQ(with_memory.status().code(), absl::StatusCode::kUnimplemented)
        << with_memory.status();
    EXPECT_THAT(with_memory.status().message(), HasSubstr("memory"));
  }
  (*gen)->KillAll(absl::Seconds(5)).IgnoreError();
  EXPECT_TRUE((*gen)->Remove().ok());
}

// What a process of `dirs` gets opening each of `paths`: "open", or the
// shell's error ("... Operation not permitted").
std::vector<std::string> OpenEach(const std::vector<std::string>& dirs,
                                  const std::vector<std::string>& paths) {
  std::vector<std::string> argv = {
      "/bin/sh", "-c",
      "for f in \"$@\"; do if err=$( (exec 3<\"$f\") 2>&1 ); then echo open; "
      "else echo \"$err\"; fi; done",
      "sh"};
  argv.insert(argv.end(), paths.begin(), paths.end());
  std::vector<std::string> out;
  auto probe = StartIn(dirs, argv);
  if (!probe.ok()) return {probe.status().ToString()};
  for (size_t i = 0; i < paths.size(); ++i) {
    auto line = probe->ReadLine(absl::Seconds(5));
    out.push_back(line.ok() ? *line : line.status().ToString());
  }
  probe->Wait(absl::Seconds(5)).IgnoreError();
  return out;
}

// Fake NVIDIA nodes with the numbers of harmless devices: nvidia0 is
// /dev/full's (1:7), nvidia1 /dev/urandom's (1:9), nvidiactl /dev/zero's
// (1:5). /dev/null (1:3) shares their major and must stay open.
class FakeNvidiaNodes {
 public:
  FakeNvidiaNodes() : dir_(testing::MakeTempDir("mesh-cgroup-dev")) {
    ok_ = mknod((dir_ + "/nvidia0").c_str(), S_IFCHR | 0666, makedev(1, 7)) == 0 &&
          mknod((dir_ + "/nvidia1").c_str(), S_IFCHR | 0666, makedev(1, 9)) == 0 &&
          mknod((dir_ + "/nvidiactl").c_str(), S_IFCHR | 0666, makedev(1, 5)) == 0;
  }
  ~FakeNvidiaNodes() {
    for (const char* name : {"nvidia0", "nvidia1", "nvidiactl"})
      unlink((dir_ + "/" + name).c_str());
    rmdir(dir_.c_str());
  }
  bool ok() const { return ok_; }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  const std::string& dir() const { return dir_; }

 private:
  const std::string dir_;
  bool ok_ = false;
};

TEST_P(CgroupTest, DeviceRulesDenyExactlyTheListedNodes) {
  if (!manager_->capabilities().devices) {
    GTEST_SKIP() << "no device rules here: " << manager_->Describe();
  }
  FakeNvidiaNodes nodes;
  ASSERT_TRUE(nodes.ok()) << "mknod: " << strerror(errno);
  const NvidiaDevices found = FindNvidiaDevices(nodes.dir());
  ASSERT_EQ(found.gpus.size(), 2u);
  ASSERT_EQ(found.shared.size(), 1u);
  const std::vector<std::string> paths = {nodes.Path("nvidia0"), nodes.Path("nvidia1"),
                                          nodes.Path("nvidiactl"), "/dev/null"};
  // Without rules every node opens: the temporary directory allows device
  // nodes, so a refusal below is the cgroup's.
  {
    auto gen = manager_->CreateGeneration("job-dev-free", 0, {});
    ASSERT_TRUE(gen.ok()) << gen.status();
    auto dirs = (*gen)->CreateRank(0, {});
    ASSERT_TRUE(dirs.ok()) << dirs.status();
    EXPECT_THAT(OpenEach(*dirs, paths), ::testing::Each("open"));
  }
  // A CPU job: no NVIDIA node opens (EPERM); /dev/null still does.
  {
    auto gen = manager_->CreateGeneration("job-dev-cpu", 0, GpuConfinement(found, {}));
    ASSERT_TRUE(gen.ok()) << gen.status();
    auto dirs = (*gen)->CreateRank(0, {});
    ASSERT_TRUE(dirs.ok()) << dirs.status();
    const std::vector<std::string> got = OpenEach(*dirs, paths);
    ASSERT_EQ(got.size(), 4u);
    for (int i = 0; i < 3; ++i) EXPECT_THAT(got[i], HasSubstr("Operation not permitted")) << i;
    EXPECT_EQ(got[3], "open");
  }
  // A job on GPU 1: its GPU and the shared node open, GPU 0 does not.
  {
    auto gen = manager_->CreateGeneration("job-dev-gpu", 0, GpuConfinement(found, {1}));
    ASSERT_TRUE(gen.ok()) << gen.status();
    auto dirs = (*gen)->CreateRank(0, {});
    ASSERT_TRUE(dirs.ok()) << dirs.status();
    const std::vector<std::string> got = OpenEach(*dirs, paths);
    ASSERT_EQ(got.size(), 4u);
    EXPECT_THAT(got[0], HasSubstr("Operation not permitted"));
    EXPECT_EQ(got[1], "open");
    EXPECT_EQ(got[2], "open");
    EXPECT_EQ(got[3], "open");
  }
}

TEST_P(CgroupTest, DeviceRulesReachRanksThatAlreadyExist) {
  if (!manager_->capabilities().devices) {
    GTEST_SKIP() << "no device rules here: " << manager_->Describe();
  }
  FakeNvidiaNodes nodes;
  ASSERT_TRUE(nodes.ok()) << "mknod: " << strerror(errno);
  // The same generation made again, with rules, after its rank exists (v1
  // copies a parent's list only when a child is made).
  auto first = manager_->CreateGeneration("job-dev-again", 0, {});
  ASSERT_TRUE(first.ok()) << first.status();
  auto dirs = (*first)->CreateRank(0, {});
  ASSERT_TRUE(dirs.ok()) << dirs.status();
  auto second = manager_->CreateGeneration("job-dev-again", 0,
                                           GpuConfinement(FindNvidiaDevices(nodes.dir()), {}));
  ASSERT_TRUE(second.ok()) << second.status();
  const std::vector<std::string> got = OpenEach(*dirs, {nodes.Path("nvidia0"), "/dev/null"});
  ASSERT_EQ(got.size(), 2u);
  EXPECT_THAT(got[0], HasSubstr("Operation not permitted"));
  EXPECT_EQ(got[1], "open");
}

TEST_P(CgroupTest, AnAgentsSubtreeIsKilledWhenItDies) {
  auto gen = manager_->CreateGeneration("job-watchdog", 0, {});
  ASSERT_TRUE(gen.ok()) << gen.status();
  auto dirs = (*gen)->CreateRank(0, {});
  ASSERT_TRUE(dirs.ok()) << dirs.status();
  auto sleeper = StartIn(*dirs, {"/bin/sleep", "60"});
  ASSERT_TRUE(sleeper.ok()) << sleeper.status();
  // KillAgentCgroups of this process, as the watchdog does for the agent.
  EXPECT_GE(KillAgentCgroups(options_, getpid()), 1);
  EXPECT_TRUE(sleeper->Wait(absl::Seconds(5)).ok());
  for (const std::string& dir : *dirs) EXPECT_FALSE(cgroup_fs::Exists(dir)) << dir;
  // Nothing of an agent that has no subtree.
  EXPECT_EQ(KillAgentCgroups(options_, 4194303), 0);
}

TEST_P(CgroupTest, CreateRemovesStaleSubtreesOfDeadAgentsAndLeavesLiveOnes) {
  // A pid that was alive a moment ago and is not now: a dead agent's.
  auto gone = testing::Subprocess::Start({"/bin/true"});
  ASSERT_TRUE(gone.ok()) << gone.status();
  const pid_t dead_pid = gone->pid();
  ASSERT_TRUE(gone->Wait(absl::Seconds(5)).ok());
  // The live agent is this process, whose manager_ holds a generation with
  // a worker; the dead agent's subtree (same name) holds a worker too.
  auto gen = manager_->CreateGeneration("job-live", 0, {});
  ASSERT_TRUE(gen.ok()) << gen.status();
  auto live_dirs = (*gen)->CreateRank(0, {});
  ASSERT_TRUE(live_dirs.ok()) << live_dirs.status();
  auto live = StartIn(*live_dirs, {"/bin/sleep", "60"});
  ASSERT_TRUE(live.ok()) << live.status();
  const std::string own = absl::StrCat("/mesh-", options_.agent_name, "-", getpid(), "/");
  const std::string dead = absl::StrCat("/mesh-", options_.agent_name, "-", dead_pid, "/");
  std::vector<std::string> dead_dirs;
  for (const std::string& dir : *live_dirs) {
    const size_t at = dir.find(own);
    ASSERT_NE(at, std::string::npos) << dir;
    dead_dirs.push_back(dir.substr(0, at) + dead + dir.substr(at + own.size()));
    ASSERT_TRUE(cgroup_fs::MakeDir(dead_dirs.back()).ok()) << dead_dirs.back();
  }
  auto orphan = StartIn(dead_dirs, {"/bin/sleep", "60"});
  ASSERT_TRUE(orphan.ok()) << orphan.status();

  // A second agent of the same name starts (in this process: same pid, so
  // it shares the live subtree and must leave it alone).
  auto next = CgroupManager::Create(options_);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_TRUE(orphan->Wait(absl::Seconds(2)).ok()) << "the dead agent's worker still runs";
  for (const std::string& dir : dead_dirs) {
    const std::string top = dir.substr(0, dir.find(dead) + dead.size() - 1);
    EXPECT_FALSE(cgroup_fs::Exists(top)) << top;
  }
  EXPECT_TRUE(testing::IsAlive(live->pid()));
  for (const std::string& dir : *live_dirs) EXPECT_TRUE(cgroup_fs::Exists(dir)) << dir;
  EXPECT_FALSE((*gen)->Empty());
  // The second manager goes first; its subtree is busy and stays.
  next->reset();
  for (const std::string& dir : *live_dirs) EXPECT_TRUE(cgroup_fs::Exists(dir)) << dir;
  ASSERT_TRUE((*gen)->KillAll(absl::Seconds(2)).ok());
  live->Wait(absl::Seconds(5)).IgnoreError();
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

TEST(CgroupManagerTest, AutoPicksV2OnlyWhenTheWholeHierarchyIsCgroup2) {
  if (geteuid() != 0) GTEST_SKIP() << "making cgroups needs root";
  CgroupOptions options;
  options.agent_name = "cgroup-test-auto";
  CgroupVersion expected = CgroupVersion::kNone;
  if (IsCgroupMount("/sys/fs/cgroup", 0x63677270)) {
    expected = CgroupVersion::kV2;
  } else if (IsCgroupMount("/sys/fs/cgroup/freezer", 0x27e0eb)) {
    expected = CgroupVersion::kV1;  // a v1 or hybrid host: never the unified one
  }
  auto manager = CgroupManager::Create(options);
  ASSERT_TRUE(manager.ok()) << manager.status();
  EXPECT_EQ((*manager)->version(), expected) << (*manager)->Describe();
  EXPECT_THAT((*manager)->Describe(), HasSubstr(CgroupVersionName(expected)));
}

TEST(CgroupManagerTest, JobIdsMustBeSafeNames) {
  if (geteuid() != 0) GTEST_SKIP() << "making cgroups needs root";
  CgroupOptions options;
  options.agent_name = "cgroup-test-ids";
  auto manager = CgroupManager::Create(options);
  ASSERT_TRUE(manager.ok()) << manager.status();
  if ((*manager)->version() == CgroupVersion::kNone) {
    GTEST_SKIP() << "no cgroups here: " << (*manager)->Describe();
  }
  for (const char* bad : {"", "..", "a/b", "x y"}) {
    EXPECT_EQ((*manager)->CreateGeneration(bad, 0, {}).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
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
