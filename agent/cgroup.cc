#include "agent/cgroup.h"

#include <dirent.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include <spdlog/spdlog.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "agent/cgroup_bpf.h"
#include "agent/cgroup_fs.h"

namespace mesh::agent {

const char* CgroupVersionName(CgroupVersion version) {
  switch (version) {
    case CgroupVersion::kV1:
      return "v1";
    case CgroupVersion::kV2:
      return "v2";
    case CgroupVersion::kNone:
      break;
  }
  return "none";
}

namespace cgroup_internal {

namespace fs = cgroup_fs;

// One mounted hierarchy: where it is, and the agent's subtree in it.
struct Hierarchy {
  std::string controller;  // v1 controller name; "" for v2
  std::string mount;       // e.g. /sys/fs/cgroup/memory
  std::string parent;      // e.g. /process_api/x (relative to the mount)
  std::string Base(const std::string& agent_dir) const {
    return absl::StrCat(mount, parent == "/" ? "" : parent, "/", agent_dir);
  }
};

bool IsFsType(const std::string& path, int64_t magic) {
  struct statfs st;
  return statfs(path.c_str(), &st) == 0 && static_cast<int64_t>(st.f_type) == magic;
}

std::string AgentDir(const std::string& name, pid_t pid) {
  return absl::StrCat("mesh-", name, "-", pid);
}

// The v1 hierarchies the manager uses, freezer first (required).
std::vector<Hierarchy> FindV1(const CgroupOptions& options) {
  std::vector<Hierarchy> found;
  for (const char* controller : {"freezer", "memory", "pids", "devices", "cpuacct"}) {
    const std::string mount = absl::StrCat(options.v1_root, "/", controller);
    if (!IsFsType(mount, CGROUP_SUPER_MAGIC)) continue;
    Hierarchy h;
    h.controller = controller;
    h.mount = mount;
    if (!options.parent.empty()) {
      h.parent = options.parent;
    } else {
      h.parent = fs::OwnCgroup(controller).value_or("/");
    }
    found.push_back(std::move(h));
  }
  if (found.empty() || found[0].controller != "freezer") return {};
  return found;
}

std::optional<Hierarchy> FindV2(const CgroupOptions& options) {
  if (!IsFsType(options.v2_root, CGROUP2_SUPER_MAGIC)) return std::nullopt;
  Hierarchy h;
  h.mount = options.v2_root;
  h.parent = !options.parent.empty() ? options.parent : fs::OwnCgroup("").value_or("/");
  return h;
}

CgroupVersion Detect(const CgroupOptions& options) {
  switch (options.mode) {
    case CgroupOptions::Mode::kNone:
      return CgroupVersion::kNone;
    case CgroupOptions::Mode::kV1:
      return CgroupVersion::kV1;
    case CgroupOptions::Mode::kV2:
      return CgroupVersion::kV2;
    case CgroupOptions::Mode::kAuto:
      break;
  }
  // The whole of /sys/fs/cgroup as cgroup2 is a v2 host; a hybrid host keeps
  // its controllers in v1 hierarchies.
  if (IsFsType(options.v2_root, CGROUP2_SUPER_MAGIC) &&
      fs::Exists(options.v2_root + "/cgroup.subtree_control") &&
      !IsFsType(options.v1_root + "/freezer", CGROUP_SUPER_MAGIC)) {
    return CgroupVersion::kV2;
  }
  if (IsFsType(options.v1_root + "/freezer", CGROUP_SUPER_MAGIC)) return CgroupVersion::kV1;
  return CgroupVersion::kNone;
}

// Kills and removes every subtree mesh-<name>-<pid>[-self] under `dir`
// whose pid is dead, or whose pid is `only_pid` when that is > 0.
int RemoveAgentSubtrees(const Hierarchy& h, const std::string& name, pid_t only_pid, bool v2,
                        const Hierarchy* freezer) {
  const std::string dir = absl::StrCat(h.mount, h.parent == "/" ? "" : h.parent);
  const std::string prefix = absl::StrCat("mesh-", name, "-");
  int killed = 0;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return 0;
  std::vector<std::string> victims;
  while (const dirent* entry = readdir(d)) {
    const std::string entry_name = entry->d_name;
    if (!absl::StartsWith(entry_name, prefix)) continue;
    std::string rest = entry_name.substr(prefix.size());
    if (absl::EndsWith(rest, "-self")) rest.resize(rest.size() - 5);
    int pid = 0;
    if (!absl::SimpleAtoi(rest, &pid) || pid <= 0) continue;
    const bool chosen = only_pid > 0 ? pid == only_pid : !fs::PidAlive(pid);
    if (chosen) victims.push_back(entry_name);
  }
  closedir(d);
  for (const std::string& victim : victims) {
    const std::string path = dir + "/" + victim;
    if (v2) {
      killed += fs::KillTreeV2(path);
    } else {
      const std::string freezer_path = freezer != nullptr ? freezer->Base(victim) : "";
      killed += fs::KillTreeV1(path, freezer_path);
    }
    fs::WaitTreeEmpty(path, absl::Now() + absl::Seconds(2));
    if (absl::Status s = fs::RemoveTree(path); !s.ok()) {
      spdlog::warn("cgroups: cannot remove {}: {}", path, std::string(s.message()));
    }
  }
  return killed;
}

// ---------------------------------------------------------------------------

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
    bool removed;
    {
      absl::MutexLock lock(&mu_);
      removed = removed_;
    }
    if (removed) return;
    if (absl::StatusOr<int> killed = KillAll(absl::Seconds(5)); !killed.ok()) {
      spdlog::warn("cgroups: job {} generation {}: {}", job_, generation_,
                   std::string(killed.status().message()));
    }
    if (absl::Status s = Remove(); !s.ok()) {
      spdlog::warn("cgroups: job {} generation {}: {}", job_, generation_, std::string(s.message()));
    }
  }

  std::string JobDir(const Hierarchy& h) const { return absl::StrCat(h.Base(agent_dir_), "/", job_); }
  std::string GenDir(const Hierarchy& h) const {
    return absl::StrCat(JobDir(h), "/gen-", generation_);
  }
  std::string RankDir(const Hierarchy& h, int rank) const {
    return absl::StrCat(GenDir(h), "/rank-", rank);
  }
  const Hierarchy* Find(const std::string& controller) const {
    for (const Hierarchy& h : hierarchies_) {
      if (version_ == CgroupVersion::kV2 || h.controller == controller) return &h;
    }
    return nullptr;
  }

  absl::StatusOr<std::vector<std::string>> CreateRank(int rank, const CgroupLimits& limits) override {
    std::vector<std::string> dirs;
    for (const Hierarchy& h : hierarchies_) {
      const std::string dir = RankDir(h, rank);
      if (absl::Status s = fs::MakeDir(dir); !s.ok()) return s;
      dirs.push_back(dir);
    }
    if (limits.memory_bytes > 0) {
      const Hierarchy* memory = Find("memory");
      const std::string file = version_ == CgroupVersion::kV2 ? "memory.max" : "memory.limit_in_bytes";
      if (memory == nullptr || !fs::Exists(RankDir(*memory, rank) + "/" + file)) {
        return absl::UnimplementedError("no memory controller for this job's cgroup");
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
        return absl::UnimplementedError("no pids controller for this job's cgroup");
      }
      if (absl::Status s =
              fs::WriteText(RankDir(*pids, rank) + "/pids.max", absl::StrCat(limits.max_pids));
          !s.ok()) {
        return s;
      }
    }
    absl::MutexLock lock(&mu_);
    ranks_.insert(rank);
    return dirs;
  }

  absl::StatusOr<int> KillAll(absl::Duration timeout) override {
    const Hierarchy& main = hierarchies_[0];  // v2's only one, or v1's freezer
    const std::string dir = GenDir(main);
    if (!fs::Exists(dir)) return 0;
    const int killed = version_ == CgroupVersion::kV2 ? fs::KillTreeV2(dir)
                                                      : fs::KillTreeV1(dir, dir);
    if (!fs::WaitTreeEmpty(dir, absl::Now() + timeout)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "processes of job ", job_, " generation ", generation_, " still in ", dir, " after ",
          absl::FormatDuration(timeout)));
    }
    return killed;
  }

  bool Empty() const override {
    for (pid_t pid : fs::TreePids(GenDir(hierarchies_[0]))) {
      if (fs::PidAlive(pid)) return false;
    }
    return true;
  }

  int64_t OomKills(int rank) const override {
    const Hierarchy* memory = Find("memory");
    if (memory == nullptr) return 0;
    if (version_ == CgroupVersion::kV2) {
      return fs::ReadKeyedValue(RankDir(*memory, rank) + "/memory.events", "oom_kill").value_or(0);
    }
    return fs::ReadKeyedValue(RankDir(*memory, rank) + "/memory.oom_control", "oom_kill")
        .value_or(0);
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
          "job ", job_, " generation ", generation_, " still has processes in its cgroup"));
    }
    absl::Status first = absl::OkStatus();
    for (const Hierarchy& h : hierarchies_) {
      if (absl::Status s = fs::RemoveTree(GenDir(h)); !s.ok() && first.ok()) first = s;
      rmdir(JobDir(h).c_str());  // Fails while another generation is there: fine.
    }
    if (first.ok()) {
      absl::MutexLock lock(&mu_);
      removed_ = true;
    }
    return first;
  }

 private:
  const CgroupVersion version_;
  const std::vector<Hierarchy> hierarchies_;
  const std::string agent_dir_;
  const std::string job_;
  const int64_t generation_;
  const std::unique_ptr<DeviceProgram> program_;  // v2 device rules; may be null
  mutable absl::Mutex mu_;
  std::set<int> ranks_ ABSL_GUARDED_BY(mu_);
  bool removed_ ABSL_GUARDED_BY(mu_) = false;
};

class ManagerImpl final : public CgroupManager {
 public:
  ManagerImpl(CgroupVersion version, std::vector<Hierarchy> hierarchies, std::string agent_dir,
              CgroupCapabilities can, std::string describe)
      : version_(version),
        hierarchies_(std::move(hierarchies)),
        agent_dir_(std::move(agent_dir)),
        can_(can),
        describe_(std::move(describe)) {}

  ~ManagerImpl() override {
    // Generations are gone by now (their owners destroyed them); what is
    // left is the agent's own, empty subtree.
    for (const Hierarchy& h : hierarchies_) {
      if (absl::Status s = fs::RemoveTree(h.Base(agent_dir_)); !s.ok()) {
        spdlog::debug("cgroups: {}", std::string(s.message()));
      }
    }
  }

  CgroupVersion version() const override { return version_; }
  CgroupCapabilities capabilities() const override { return can_; }
  std::string Describe() const override { return describe_; }

  absl::StatusOr<std::unique_ptr<GenerationCgroup>> CreateGeneration(
      const std::string& job_id, int64_t generation, const DeviceRules& devices) override {
    if (version_ == CgroupVersion::kNone) {
      return absl::FailedPreconditionError(absl::StrCat("no cgroups: ", describe_));
    }
    if (!devices.deny.empty() && !can_.devices) {
      return absl::UnimplementedError(
          absl::StrCat("device rules asked, and this node cannot enforce them: ", describe_));
    }
    std::unique_ptr<DeviceProgram> program;
    for (const Hierarchy& h : hierarchies_) {
      const std::string gen = absl::StrCat(h.Base(agent_dir_), "/", job_id, "/gen-", generation);
      if (absl::Status s = fs::MakeDir(gen); !s.ok()) return s;
      if (version_ == CgroupVersion::kV2) {
        // Ranks get the controllers this subtree has.
        for (const std::string& dir : {absl::StrCat(h.Base(agent_dir_), "/", job_id), gen}) {
          EnableControllers(dir);
        }
        if (!devices.deny.empty()) {
          absl::StatusOr<std::unique_ptr<DeviceProgram>> attached =
              DeviceProgram::Attach(gen, devices.deny);
          if (!attached.ok()) return attached.status();
          program = *std::move(attached);
        }
      } else if (h.controller == "devices") {
        // Children copy their parent's list when made: rules go first.
        for (const CharDevice& device : devices.deny) {
          const std::string rule =
              device.minor < 0 ? absl::StrCat("c ", device.major, ":* rwm")
                               : absl::StrCat("c ", device.major, ":", device.minor, " rwm");
          if (absl::Status s = fs::WriteText(gen + "/devices.deny", rule); !s.ok()) return s;
        }
      }
    }
    return std::unique_ptr<GenerationCgroup>(new GenerationImpl(
        version_, hierarchies_, agent_dir_, job_id, generation, std::move(program)));
  }

  // v2: the controllers the agent's subtree has, for `dir`'s children.
  void EnableControllers(const std::string& dir) const {
    for (const std::string& controller : controllers_) {
      fs::WriteText(dir + "/cgroup.subtree_control", "+" + controller).IgnoreError();
    }
  }

  std::vector<std::string> controllers_;  // v2: enabled for the subtree

 private:
  const CgroupVersion version_;
  const std::vector<Hierarchy> hierarchies_;
  const std::string agent_dir_;
  const CgroupCapabilities can_;
  const std::string describe_;
};

std::unique_ptr<CgroupManager> NoneManager(std::string why) {
  return std::make_unique<ManagerImpl>(CgroupVersion::kNone, std::vector<Hierarchy>{}, "",
                                       CgroupCapabilities{}, absl::StrCat("none (", why, ")"));
}

absl::StatusOr<std::unique_ptr<CgroupManager>> CreateV1(const CgroupOptions& options) {
  std::vector<Hierarchy> hierarchies = FindV1(options);
  if (hierarchies.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("no cgroup v1 freezer hierarchy at ", options.v1_root, "/freezer"));
  }
  const std::string agent_dir = AgentDir(options.agent_name, getpid());
  int stale = 0;
  for (const Hierarchy& h : hierarchies) {
    stale += RemoveAgentSubtrees(h, options.agent_name, 0, false, &hierarchies[0]);
  }
  if (stale > 0) spdlog::warn("cgroups: killed {} process(es) left by an earlier agent", stale);
  CgroupCapabilities can;
  can.kill = true;
  std::vector<std::string> names;
  for (const Hierarchy& h : hierarchies) {
    if (absl::Status s = fs::MakeDir(h.Base(agent_dir)); !s.ok()) return s;
    names.push_back(h.controller);
    if (h.controller == "memory") can.memory_limit = can.memory_usage = true;
    if (h.controller == "pids") can.pids_limit = true;
    if (h.controller == "devices") can.devices = true;
    if (h.controller == "cpuacct") can.cpu_usage = true;
  }
  const std::string describe =
      absl::StrCat("cgroup v1 (", absl::StrJoin(names, ", "), ") at ", options.v1_root, "/*",
                   hierarchies[0].parent == "/" ? "" : hierarchies[0].parent, "/", agent_dir);
  return std::unique_ptr<CgroupManager>(
      new ManagerImpl(CgroupVersion::kV1, std::move(hierarchies), agent_dir, can, describe));
}

absl::StatusOr<std::unique_ptr<CgroupManager>> CreateV2(const CgroupOptions& options) {
  std::optional<Hierarchy> found = FindV2(options);
  if (!found.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("no cgroup v2 hierarchy at ", options.v2_root));
  }
  Hierarchy h = *found;
  const std::string agent_dir = AgentDir(options.agent_name, getpid());
  const int stale = RemoveAgentSubtrees(h, options.agent_name, 0, true, nullptr);
  if (stale > 0) spdlog::warn("cgroups: killed {} process(es) left by an earlier agent", stale);
  const std::string parent_dir = absl::StrCat(h.mount, h.parent == "/" ? "" : h.parent);
  std::set<std::string> available;
  if (absl::StatusOr<std::string> text = fs::ReadText(parent_dir + "/cgroup.controllers");
      text.ok()) {
    for (absl::string_view name : absl::StrSplit(*text, absl::ByAnyChar(" \n"), absl::SkipEmpty())) {
      available.insert(std::string(name));
    }
  }
  std::vector<std::string> wanted;
  for (const char* controller : {"memory", "pids", "cpu"}) {
    if (available.count(controller) > 0) wanted.push_back(controller);
  }
  // The kernel enables controllers for a cgroup's children only while the
  // cgroup itself holds no process. When the agent is its parent's only
  // process (a systemd unit with Delegate=yes), it moves into a leaf first.
  std::vector<std::string> enabled;
  std::string note;
  auto enable_all = [&] {
    enabled.clear();
    for (const std::string& controller : wanted) {
      if (fs::WriteText(parent_dir + "/cgroup.subtree_control", "+" + controller).ok()) {
        enabled.push_back(controller);
      }
    }
  };
  enable_all();
  if (enabled.size() < wanted.size() && h.parent != "/") {
    std::vector<pid_t> members;
    if (absl::StatusOr<std::string> procs = fs::ReadText(parent_dir + "/cgroup.procs"); procs.ok()) {
      for (absl::string_view line : absl::StrSplit(*procs, '\n', absl::SkipEmpty())) {
        int pid = 0;
        if (absl::SimpleAtoi(line, &pid)) members.push_back(pid);
      }
    }
    if (members.size() == 1 && members[0] == getpid()) {
      const std::string leaf = absl::StrCat(parent_dir, "/", agent_dir, "-self");
      if (fs::MakeDir(leaf).ok() && fs::WriteText(leaf + "/cgroup.procs", "0").ok()) {
        note = absl::StrCat("; the agent moved itself to ", leaf);
        enable_all();
      }
    }
  }
  const std::string base = h.Base(agent_dir);
  if (absl::Status s = fs::MakeDir(base); !s.ok()) return s;
  for (const std::string& controller : enabled) {
    fs::WriteText(base + "/cgroup.subtree_control", "+" + controller).IgnoreError();
  }
  CgroupCapabilities can;
  can.kill = true;
  can.cpu_usage = true;  // cpu.stat is always there
  const auto has = [&](const char* c) {
    return std::find(enabled.begin(), enabled.end(), c) != enabled.end();
  };
  can.memory_limit = can.memory_usage = has("memory");
  can.pids_limit = has("pids");
  std::string bpf_problem;
  can.devices = DeviceProgram::Supported(&bpf_problem);
  std::vector<std::string> missing;
  for (const char* c : {"memory", "pids"}) {
    if (!has(c)) missing.push_back(c);
  }
  std::string describe = absl::StrCat(
      "cgroup v2 (", enabled.empty() ? std::string("no controllers") : absl::StrJoin(enabled, ", "),
      missing.empty() ? "" : absl::StrCat("; no ", absl::StrJoin(missing, ", "), " controller"),
      can.devices ? "; eBPF device rules" : absl::StrCat("; no device rules: ", bpf_problem),
      ") at ", base, note);
  auto manager = std::make_unique<ManagerImpl>(CgroupVersion::kV2, std::vector<Hierarchy>{h},
                                               agent_dir, can, std::move(describe));
  manager->controllers_ = enabled;
  return std::unique_ptr<CgroupManager>(std::move(manager));
}

}  // namespace cgroup_internal

absl::StatusOr<std::unique_ptr<CgroupManager>> CgroupManager::Create(const CgroupOptions& options) {
  if (options.agent_name.empty() ||
      options.agent_name.find_first_not_of(
          "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the agent name \"", options.agent_name, "\" is not a cgroup name ([A-Za-z0-9._-])"));
  }
  switch (cgroup_internal::Detect(options)) {
    case CgroupVersion::kNone:
      return cgroup_internal::NoneManager(options.mode == CgroupOptions::Mode::kNone
                                              ? "mesh-agent --cgroups=none"
                                              : "no cgroup v2 or v1 freezer hierarchy found");
    case CgroupVersion::kV1:
      return cgroup_internal::CreateV1(options);
    case CgroupVersion::kV2:
      return cgroup_internal::CreateV2(options);
  }
  return cgroup_internal::NoneManager("unknown");
}

int KillAgentCgroups(const CgroupOptions& options, pid_t agent_pid) {
  using cgroup_internal::Hierarchy;
  switch (cgroup_internal::Detect(options)) {
    case CgroupVersion::kNone:
      return 0;
    case CgroupVersion::kV1: {
      std::vector<Hierarchy> hierarchies = cgroup_internal::FindV1(options);
      int killed = 0;
      for (const Hierarchy& h : hierarchies) {
        killed += cgroup_internal::RemoveAgentSubtrees(h, options.agent_name, agent_pid, false,
                                                       &hierarchies[0]);
      }
      return killed;
    }
    case CgroupVersion::kV2: {
      std::optional<Hierarchy> h = cgroup_internal::FindV2(options);
      return h.has_value() ? cgroup_internal::RemoveAgentSubtrees(*h, options.agent_name,
                                                                  agent_pid, true, nullptr)
                           : 0;
    }
  }
  return 0;
}

NvidiaDevices FindNvidiaDevices(const std::string& dev_dir) {
  NvidiaDevices found;
  auto char_device = [](const std::string& path) -> std::optional<CharDevice> {
    struct stat st;
    if (stat(path.c_str(), &st) != 0 || !S_ISCHR(st.st_mode)) return std::nullopt;
    return CharDevice{major(st.st_rdev), static_cast<int64_t>(minor(st.st_rdev))};
  };
  if (DIR* d = opendir(dev_dir.c_str()); d != nullptr) {
    while (const dirent* entry = readdir(d)) {
      const std::string name = entry->d_name;
      if (!absl::StartsWith(name, "nvidia")) continue;
      const std::string rest = name.substr(6);
      int index = 0;
      if (!rest.empty() && absl::SimpleAtoi(rest, &index) &&
          rest.find_first_not_of("0123456789") == std::string::npos) {
        if (auto device = char_device(dev_dir + "/" + name)) found.gpus.emplace_back(index, *device);
      } else if (name == "nvidiactl" || name == "nvidia-uvm" || name == "nvidia-uvm-tools" ||
                 name == "nvidia-modeset") {
        if (auto device = char_device(dev_dir + "/" + name)) found.shared.push_back(*device);
      }
    }
    closedir(d);
  }
  if (DIR* d = opendir((dev_dir + "/nvidia-caps").c_str()); d != nullptr) {
    while (const dirent* entry = readdir(d)) {
      if (auto device = char_device(dev_dir + "/nvidia-caps/" + entry->d_name)) {
        found.shared.push_back(*device);
      }
    }
    closedir(d);
  }
  std::sort(found.gpus.begin(), found.gpus.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  return found;
}

DeviceRules GpuConfinement(const NvidiaDevices& devices, const std::vector<int>& job_gpu_minors) {
  DeviceRules rules;
  const std::set<int> own(job_gpu_minors.begin(), job_gpu_minors.end());
  for (const auto& [minor, device] : devices.gpus) {
    if (own.count(minor) == 0) rules.deny.push_back(device);
  }
  if (own.empty()) {
    for (const CharDevice& device : devices.shared) rules.deny.push_back(device);
  }
  return rules;
}

}  // namespace mesh::agent
