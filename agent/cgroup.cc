#include "agent/cgroup.h"

#include <dirent.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <set>
#include <utility>

#include <spdlog/spdlog.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "agent/cgroup_bpf.h"
#include "agent/cgroup_fs.h"
#include "agent/cgroup_internal.h"
#include "agent/job_paths.h"

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

// Kills and removes every subtree mesh-<name>-<pid> under the parent in
// `h` whose pid is dead, or whose pid is `only_pid` when that is > 0; a
// subtree of a live agent is never touched (agents of the same name may
// share a host). A v2 leaf mesh-<name>-<pid>-self (where an agent moved
// itself, see CreateV2) is only removed once empty, never killed: it holds
// the agent and the processes it forked for itself, such as its watchdog.
int RemoveAgentSubtrees(const Hierarchy& h, const std::string& name, pid_t only_pid, bool v2,
                        const Hierarchy* freezer) {
  const std::string dir = h.ParentDir();
  const std::string prefix = absl::StrCat("mesh-", name, "-");
  int killed = 0;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return 0;
  std::vector<std::string> victims;
  std::vector<std::string> self_leaves;
  while (const dirent* entry = readdir(d)) {
    const std::string entry_name = entry->d_name;
    if (entry->d_type != DT_DIR || !absl::StartsWith(entry_name, prefix)) continue;
    std::string rest = entry_name.substr(prefix.size());
    const bool self_leaf = absl::EndsWith(rest, "-self");
    if (self_leaf) rest.resize(rest.size() - 5);
    int pid = 0;
    if (!absl::SimpleAtoi(rest, &pid) || pid <= 0) continue;
    const bool chosen = only_pid > 0 ? pid == only_pid : !fs::PidAlive(pid);
    if (!chosen) continue;
    (self_leaf ? self_leaves : victims).push_back(entry_name);
  }
  closedir(d);
  for (const std::string& leaf : self_leaves) {
    rmdir((dir + "/" + leaf).c_str());  // EBUSY while it holds processes: fine.
  }
  for (const std::string& victim : victims) {
    const std::string path = dir + "/" + victim;
    if (v2) {
      killed += fs::KillTreeV2(path);
    } else {
      const std::string freezer_path = freezer != nullptr ? freezer->Base(victim) : "";
      killed += fs::KillTreeV1(path, freezer_path);
    }
    if (!fs::WaitTreeEmpty(path, absl::Now() + absl::Seconds(2))) {
      spdlog::warn("cgroups: processes still in {} 2s after SIGKILL", path);
    }
    if (absl::Status s = fs::RemoveTree(path); !s.ok()) {
      spdlog::warn("cgroups: cannot remove {}: {}", path, std::string(s.message()));
    }
  }
  return killed;
}

// ---------------------------------------------------------------------------

class ManagerImpl final : public CgroupManager {
 public:
  // `controllers`: v2, the controllers enabled for the agent's subtree.
  ManagerImpl(CgroupVersion version, std::vector<Hierarchy> hierarchies, std::string agent_dir,
              CgroupCapabilities can, std::string describe,
              std::vector<std::string> controllers = {})
      : version_(version),
        hierarchies_(std::move(hierarchies)),
        agent_dir_(std::move(agent_dir)),
        can_(can),
        describe_(std::move(describe)),
        controllers_(std::move(controllers)) {}

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
    if (!IsSafeJobId(job_id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("job id \"", job_id, "\" is not a safe cgroup name ([A-Za-z0-9._-])"));
    }
    std::vector<std::string> made;  // removed again when a step fails
    auto fail = [&made](absl::Status status) {
      for (const std::string& gen : made) fs::RemoveTree(gen).IgnoreError();
      return status;
    };
    std::unique_ptr<DeviceProgram> program;
    for (const Hierarchy& h : hierarchies_) {
      const std::string job_dir = absl::StrCat(h.Base(agent_dir_), "/", job_id);
      const std::string gen = absl::StrCat(job_dir, "/gen-", generation);
      const bool existed = fs::Exists(gen);
      if (absl::Status s = fs::MakeDir(gen); !s.ok()) return fail(s);
      if (!existed) made.push_back(gen);
      if (version_ == CgroupVersion::kV2) {
        // Ranks get the controllers this subtree has.
        for (const std::string& dir : {job_dir, gen}) EnableControllers(dir);
        if (!devices.deny.empty()) {
          absl::StatusOr<std::unique_ptr<DeviceProgram>> attached =
              DeviceProgram::Attach(gen, devices.deny);
          if (!attached.ok()) return fail(attached.status());
          program = *std::move(attached);
        }
      } else if (h.controller == "devices" && !devices.deny.empty()) {
        // A v1 cgroup copies its parent's list when it is made: the rules go
        // to the generation before any rank exists, and to the ranks that
        // already do (a generation made again).
        std::vector<std::string> targets = fs::TreeDepthFirst(gen);
        std::reverse(targets.begin(), targets.end());  // the generation first
        for (const std::string& target : targets) {
          for (const CharDevice& device : devices.deny) {
            if (absl::Status s = fs::WriteText(target + "/devices.deny", DenyRuleV1(device));
                !s.ok()) {
              return fail(s);
            }
          }
        }
      }
    }
    return NewGeneration(version_, hierarchies_, agent_dir_, job_id, generation,
                         std::move(program));
  }

 private:
  // v2: the controllers the agent's subtree has, for `dir`'s children.
  void EnableControllers(const std::string& dir) const {
    for (const std::string& controller : controllers_) {
      fs::WriteText(dir + "/cgroup.subtree_control", "+" + controller).IgnoreError();
    }
  }

  const CgroupVersion version_;
  const std::vector<Hierarchy> hierarchies_;
  const std::string agent_dir_;
  const CgroupCapabilities can_;
  const std::string describe_;
  const std::vector<std::string> controllers_;
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
    if (h.controller == "memory") {
      // Kernels before 5.16 let a v1 memory cgroup ignore its children's
      // usage (use_hierarchy 0): a rank's charge would then escape the
      // agent's limits. It must be set before the first child is made.
      const std::string file = h.Base(agent_dir) + "/memory.use_hierarchy";
      if (fs::ReadInteger(file).value_or(1) == 0) {
        if (absl::Status s = fs::WriteText(file, "1"); !s.ok()) {
          spdlog::warn("cgroups: {}", std::string(s.message()));
        }
      }
    }
    names.push_back(h.controller);
    if (h.controller == "memory") can.memory_limit = can.memory_usage = true;
    if (h.controller == "pids") can.pids_limit = true;
    if (h.controller == "devices") can.devices = true;
    if (h.controller == "cpuacct") can.cpu_usage = true;
  }
  // Where the subtree is: one path when every hierarchy has the same
  // parent, else one per parent ("/sys/fs/cgroup/{freezer,pids}/mesh-n1-42,
  // /sys/fs/cgroup/memory/process_api/x/mesh-n1-42").
  std::vector<std::pair<std::string, std::vector<std::string>>> by_parent;
  for (const Hierarchy& h : hierarchies) {
    auto it = std::find_if(by_parent.begin(), by_parent.end(),
                           [&](const auto& group) { return group.first == h.parent; });
    if (it == by_parent.end()) it = by_parent.insert(by_parent.end(), {h.parent, {}});
    it->second.push_back(h.controller);
  }
  std::vector<std::string> places;
  for (const auto& [parent, controllers] : by_parent) {
    const std::string which = by_parent.size() == 1 ? "*"
                              : controllers.size() == 1
                                  ? controllers[0]
                                  : absl::StrCat("{", absl::StrJoin(controllers, ","), "}");
    places.push_back(
        absl::StrCat(options.v1_root, "/", which, parent == "/" ? "" : parent, "/", agent_dir));
  }
  const std::string describe =
      absl::StrCat("cgroup v1 (", absl::StrJoin(names, ", "), ") at ", absl::StrJoin(places, ", "));
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
  const std::string parent_dir = h.ParentDir();
  std::set<std::string> available;
  if (absl::StatusOr<std::string> text = fs::ReadText(parent_dir + "/cgroup.controllers");
      text.ok()) {
    for (absl::string_view name :
         absl::StrSplit(*text, absl::ByAnyChar(" \n"), absl::SkipEmpty())) {
      available.insert(std::string(name));
    }
  }
  std::vector<std::string> wanted;
  for (const char* controller : {"memory", "pids", "cpu"}) {
    if (available.count(controller) > 0) wanted.push_back(controller);
  }
  // The kernel enables controllers for a cgroup's children only while the
  // cgroup itself holds no process (the no-internal-process rule: EBUSY).
  // When the agent is its parent's only process (a systemd unit with
  // Delegate=yes), it moves itself into the leaf <parent>/mesh-<name>-<pid>-self
  // first and stays there; a later agent removes that leaf once it is
  // empty. When other processes share the parent, the agent goes on without
  // the controllers, and Describe says why.
  std::vector<std::string> enabled;
  std::string note;
  std::string refused;  // why the last refused controller was refused
  auto enable_all = [&] {
    enabled.clear();
    for (const std::string& controller : wanted) {
      absl::Status s = fs::WriteText(parent_dir + "/cgroup.subtree_control", "+" + controller);
      if (s.ok()) {
        enabled.push_back(controller);
      } else {
        refused = std::string(s.message());
      }
    }
  };
  enable_all();
  if (enabled.size() < wanted.size() && h.parent != "/") {
    std::vector<pid_t> members;
    if (absl::StatusOr<std::string> procs = fs::ReadText(parent_dir + "/cgroup.procs");
        procs.ok()) {
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
    } else if (!members.empty()) {
      refused = absl::StrCat(refused, " (", parent_dir, " holds ", members.size(),
                             " process(es) and the kernel enables controllers only for a cgroup "
                             "without processes)");
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
  can.devices = DeviceProgram::Supported(base + "/device-probe", &bpf_problem);
  std::vector<std::string> unavailable;  // not in the parent's cgroup.controllers
  std::vector<std::string> not_enabled;  // available, and the kernel refused them
  for (const char* c : {"memory", "pids"}) {
    if (has(c)) continue;
    (available.count(c) > 0 ? not_enabled : unavailable).push_back(c);
  }
  std::string describe = absl::StrCat(
      "cgroup v2 (", enabled.empty() ? std::string("no controllers") : absl::StrJoin(enabled, ", "),
      unavailable.empty() ? ""
                          : absl::StrCat("; no ", absl::StrJoin(unavailable, ", "),
                                         " controller: not in ", parent_dir, "/cgroup.controllers"),
      not_enabled.empty()
          ? ""
          : absl::StrCat("; no ", absl::StrJoin(not_enabled, ", "), " controller: ", refused),
      can.devices ? "; eBPF device rules" : absl::StrCat("; no device rules: ", bpf_problem),
      ") at ", base, note);
  return std::unique_ptr<CgroupManager>(new ManagerImpl(
      CgroupVersion::kV2, std::vector<Hierarchy>{h}, agent_dir, can, std::move(describe), enabled));
}

}  // namespace cgroup_internal

absl::StatusOr<std::unique_ptr<CgroupManager>> CgroupManager::Create(const CgroupOptions& options) {
  if (options.agent_name.empty() ||
      options.agent_name.find_first_not_of(
          "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") !=
          std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("the agent name \"", options.agent_name,
                                                   "\" is not a cgroup name ([A-Za-z0-9._-])"));
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
      return h.has_value() ? cgroup_internal::RemoveAgentSubtrees(*h, options.agent_name, agent_pid,
                                                                  true, nullptr)
                           : 0;
    }
  }
  return 0;
}

}  // namespace mesh::agent
