// Shared between the cgroup manager (agent/cgroup.cc) and its generations
// (agent/cgroup_generation.cc): where a hierarchy is, and how a generation
// is made. Private to the cgroup module.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/cgroup.h"
#include "agent/cgroup_bpf.h"

namespace mesh::agent::cgroup_internal {

// One mounted hierarchy: where it is, and the agent's parent in it.
struct Hierarchy {
  std::string controller;  // v1 controller name; "" for v2
  std::string mount;       // e.g. /sys/fs/cgroup/memory
  std::string parent;      // e.g. /process_api/x (relative to the mount)
  // The parent's directory, e.g. /sys/fs/cgroup/memory/process_api/x.
  std::string ParentDir() const { return absl::StrCat(mount, parent == "/" ? "" : parent); }
  // The agent's subtree, e.g. <ParentDir>/mesh-n1-4242.
  std::string Base(const std::string& agent_dir) const {
    return absl::StrCat(ParentDir(), "/", agent_dir);
  }
};

// "c 195:0 rwm", or "c 195:* rwm" for every minor: a v1 devices.deny line.
std::string DenyRuleV1(const CharDevice& device);

// The generation <agent_dir>/<job>/gen-<generation> in each of
// `hierarchies` (v2: one; v1: the freezer first), whose directories the
// manager already made. `program` (v2 device rules) may be null.
std::unique_ptr<GenerationCgroup> NewGeneration(CgroupVersion version,
                                                std::vector<Hierarchy> hierarchies,
                                                std::string agent_dir, std::string job,
                                                int64_t generation,
                                                std::unique_ptr<DeviceProgram> program);

}  // namespace mesh::agent::cgroup_internal
