// One job generation's cgroups: its rank cgroups and their limits, kill by
// cgroup, usage, OOM counts, removal. The manager (agent/cgroup.cc) made
// the generation's directories and applied its device rules.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include <spdlog/spdlog.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "agent/cgroup_fs.h"
#include "agent/cgroup_internal.h"
#include "common/errno_text.h"

namespace mesh::agent::cgroup_internal {

namespace fs = cgroup_fs;

std::string DenyRuleV1(const CharDevice& device) {
  return device.minor < 0 ? absl::StrCat("c ", device.major, ":* rwm")
                          : absl::StrCat("c ", device.major, ":", device.minor, " rwm");
}

// Thread safety: the directories are fixed at construction; removed_ is
// guarded by mu_; concurrent calls meet only in the file system.
class GenerationImpl final : public GenerationCgroup {
 public:
  GenerationImpl(CgroupVersion version, std::vector<Hierarchy> hierarchies, std::string agent_dir,
                 std::string job, int64_t generation, std::unique_ptr<DeviceProgram> program)
      : version_(version),
        hierarchies_(std::move(hierarchies)),
        agent_dir_(std::move(agent_dir)),
        job_(std::move(job)),
        generation_(generation),
        program_(std::move(program)) {}

  ~GenerationImpl() override {
    {
      absl::MutexLock lock(&mu_);
      if (removed_) return;
    }
    if (absl::StatusOr<int> killed = KillAll(absl::Seconds(5)); !killed.ok()) {
      spdlog::warn("cgroups: {}", std::string(killed.status().message()));
    }
    if (absl::Status s = Remove(); !s.ok()) {
      spdlog::warn("cgroups: {}", std::string(s.message()));
    }
  }

  absl::StatusOr<std::vector<std::string>> CreateRank(int rank,
                                                      const CgroupLimits& limits) override {
    std::vector<std::string> dirs;
    for (const Hierarchy& h : hierarchies_) {
      const std::string dir = RankDir(h, rank);
      if (absl::Status s = fs::MakeDir(dir); !s.ok()) return s;
      dirs.push_back(dir);
    }
    if (limits.memory_bytes > 0) {
      const Hierarchy* memory = Find("memory");
      const std::string file =
          version_ == CgroupVersion::kV2 ? "memory.max" : "memory.limit_in_bytes";
      if (memory == nullptr || !fs::Exists(RankDir(*memory, rank) + "/" + file)) {
        return absl::UnimplementedError(
            absl::StrCat(Name(), " rank ", rank, ": a memory limit of ", limits.memory_bytes,
                         " bytes was asked and this node's cgroups have no memory controller (no ",
                         file, " in ", dirs[0], ")"));
      }
      const std::string bytes = absl::StrCat(limits.memory_bytes);
      if (absl::Status s = fs::WriteText(RankDir(*memory, rank) + "/" + file, bytes); !s.ok()) {
        return s;
      }
      // No way around the limit through swap: v1 memory+swap, v2 swap.
      if (version_ == CgroupVersion::kV1) {
        const std::string memsw = RankDir(*memory, rank) + "/memory.memsw.limit_in_bytes";
        if (fs::Exists(memsw)) fs::WriteText(memsw, bytes).IgnoreError();
      } else {
        const std::string swap = RankDir(*memory, rank) + "/memory.swap.max";
        if (fs::Exists(swap)) fs::WriteText(swap, "0").IgnoreError();
      }
    }
    if (limits.max_pids > 0) {
      const Hierarchy* pids = Find("pids");
      if (pids == nullptr || !fs::Exists(RankDir(*pids, rank) + "/pids.max")) {
        return absl::UnimplementedError(absl::StrCat(
            Name(), " rank ", rank, ": a limit of ", limits.max_pids,
            " processes was asked and this node's cgroups have no pids controller (no pids.max in ",
            dirs[0], ")"));
      }
      if (absl::Status s =
              fs::WriteText(RankDir(*pids, rank) + "/pids.max", absl::StrCat(limits.max_pids));
          !s.ok()) {
        return s;
      }
    }
    absl::MutexLock lock(&mu_);
    removed_ = false;  // a rank made after Remove is removed again
    return dirs;
  }

  absl::StatusOr<int> KillAll(absl::Duration timeout) override {
    return KillTree(GenDir(hierarchies_[0]), timeout);  // v2's only one, or v1's freezer
  }

  absl::StatusOr<int> KillRank(int rank, absl::Duration timeout) override {
    return KillTree(RankDir(hierarchies_[0], rank), timeout);
  }

  bool Empty() const override {
    const std::string dir = GenDir(hierarchies_[0]);
    if (version_ == CgroupVersion::kV2 &&
        fs::ReadKeyedValue(dir + "/cgroup.events", "populated").value_or(1) == 0) {
      return true;
    }
    // Zombies stay listed until reaped: count only live processes.
    for (pid_t pid : fs::TreePids(dir)) {
      if (fs::PidAlive(pid)) return false;
    }
    return true;
  }

  int64_t OomKills(int rank) const override {
    const Hierarchy* memory = Find("memory");
    if (memory == nullptr) return 0;
    const std::string file =
        version_ == CgroupVersion::kV2 ? "memory.events" : "memory.oom_control";
    return fs::ReadKeyedValue(RankDir(*memory, rank) + "/" + file, "oom_kill").value_or(0);
  }

  CgroupUsage Usage() const override {
    CgroupUsage usage;
    if (version_ == CgroupVersion::kV2) {
      const std::string dir = GenDir(hierarchies_[0]);
      usage.cpu_seconds =
          static_cast<double>(fs::ReadKeyedValue(dir + "/cpu.stat", "usage_usec").value_or(0)) /
          1e6;
      usage.memory_bytes = fs::ReadInteger(dir + "/memory.current").value_or(0);
      usage.processes = fs::ReadInteger(dir + "/pids.current")
                            .value_or(static_cast<int64_t>(fs::TreePids(dir).size()));
      return usage;
    }
    if (const Hierarchy* cpu = Find("cpuacct")) {
      usage.cpu_seconds =
          static_cast<double>(fs::ReadInteger(GenDir(*cpu) + "/cpuacct.usage").value_or(0)) / 1e9;
    }
    if (const Hierarchy* memory = Find("memory")) {
      usage.memory_bytes = fs::ReadInteger(GenDir(*memory) + "/memory.usage_in_bytes").value_or(0);
    }
    if (const Hierarchy* pids = Find("pids")) {
      usage.processes = fs::ReadInteger(GenDir(*pids) + "/pids.current").value_or(0);
    } else {
      usage.processes = static_cast<int64_t>(fs::TreePids(GenDir(hierarchies_[0])).size());
    }
    return usage;
  }

  absl::Status Remove() override {
    if (!Empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          Name(), " still has processes in ", GenDir(hierarchies_[0]), "; KillAll first"));
    }
    absl::Status first = absl::OkStatus();
    for (const Hierarchy& h : hierarchies_) {
      // Ranks, then the generation.
      if (absl::Status s = fs::RemoveTree(GenDir(h)); !s.ok() && first.ok()) first = s;
      // The job's directory goes once its last generation is gone; another
      // generation of the job may still be there (ENOTEMPTY, EBUSY).
      const std::string job_dir = JobDir(h);
      if (rmdir(job_dir.c_str()) != 0) {
        const int err = errno;
        if (err != ENOENT && err != ENOTEMPTY && err != EBUSY && first.ok()) {
          first =
              absl::InternalError(absl::StrCat("removing cgroup ", job_dir, ": ", ErrnoText(err)));
        }
      }
    }
    if (first.ok()) {
      absl::MutexLock lock(&mu_);
      removed_ = true;
    }
    return first;
  }

 private:
  // SIGKILLs every process under `dir` and waits until it is empty.
  absl::StatusOr<int> KillTree(const std::string& dir, absl::Duration timeout) {
    if (!fs::Exists(dir)) return 0;
    // The freeze waits at most a second, and never longer than the caller.
    const absl::Duration freeze_wait = std::min(timeout, absl::Seconds(1));
    const int killed = version_ == CgroupVersion::kV2 ? fs::KillTreeV2(dir, freeze_wait)
                                                      : fs::KillTreeV1(dir, dir, freeze_wait);
    if (!fs::WaitTreeEmpty(dir, absl::Now() + timeout)) {
      return absl::DeadlineExceededError(
          absl::StrCat(Name(), ": ", fs::TreePids(dir).size(), " process(es) still in ", dir, " ",
                       absl::FormatDuration(timeout), " after SIGKILL (", killed,
                       " signalled); a task in uninterruptible sleep (D state)?"));
    }
    return killed;
  }

  std::string Name() const { return absl::StrCat("job ", job_, " generation ", generation_); }
  std::string JobDir(const Hierarchy& h) const {
    return absl::StrCat(h.Base(agent_dir_), "/", job_);
  }
  std::string GenDir(const Hierarchy& h) const {
    return absl::StrCat(JobDir(h), "/gen-", generation_);
  }
  std::string RankDir(const Hierarchy& h, int rank) const {
    return absl::StrCat(GenDir(h), "/rank-", rank);
  }
  // The hierarchy of a v1 controller; v2's only one for any controller.
  const Hierarchy* Find(const std::string& controller) const {
    for (const Hierarchy& h : hierarchies_) {
      if (version_ == CgroupVersion::kV2 || h.controller == controller) return &h;
    }
    return nullptr;
  }

  const CgroupVersion version_;
  const std::vector<Hierarchy> hierarchies_;
  const std::string agent_dir_;
  const std::string job_;
  const int64_t generation_;
  // v2 device rules, or null. The kernel keeps an attached program while
  // its cgroup exists; the fd is kept as well so that the program's
  // lifetime visibly matches the generation's.
  const std::unique_ptr<DeviceProgram> program_;
  mutable absl::Mutex mu_;
  bool removed_ ABSL_GUARDED_BY(mu_) = false;
};

std::unique_ptr<GenerationCgroup> NewGeneration(CgroupVersion version,
                                                std::vector<Hierarchy> hierarchies,
                                                std::string agent_dir, std::string job,
                                                int64_t generation,
                                                std::unique_ptr<DeviceProgram> program) {
  return std::make_unique<GenerationImpl>(version, std::move(hierarchies), std::move(agent_dir),
                                          std::move(job), generation, std::move(program));
}

}  // namespace mesh::agent::cgroup_internal
