// The NVIDIA device nodes of a host and the device rules that confine a
// job to its own GPUs (declared in agent/cgroup.h): the rules a generation's
// cgroup enforces, by device number, whatever path a process opens.
#include <dirent.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "agent/cgroup.h"

namespace mesh::agent {
namespace cgroup_devices {

// The numbers of the character device at `path`; nullopt for anything else
// (a missing node, a directory, a block device).
std::optional<CharDevice> CharDeviceAt(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISCHR(st.st_mode)) return std::nullopt;
  return CharDevice{major(st.st_rdev), static_cast<int64_t>(minor(st.st_rdev))};
}

}  // namespace cgroup_devices

NvidiaDevices FindNvidiaDevices(const std::string& dev_dir) {
  using cgroup_devices::CharDeviceAt;
  NvidiaDevices found;
  if (DIR* d = opendir(dev_dir.c_str()); d != nullptr) {
    while (const dirent* entry = readdir(d)) {
      const std::string name = entry->d_name;
      if (!absl::StartsWith(name, "nvidia")) continue;
      const std::string rest = name.substr(6);
      int index = 0;
      if (!rest.empty() && absl::SimpleAtoi(rest, &index) &&
          rest.find_first_not_of("0123456789") == std::string::npos) {
        if (auto device = CharDeviceAt(dev_dir + "/" + name)) {
          found.gpus.emplace_back(index, *device);
        }
      } else if (name == "nvidiactl" || name == "nvidia-uvm" || name == "nvidia-uvm-tools" ||
                 name == "nvidia-modeset") {
        if (auto device = CharDeviceAt(dev_dir + "/" + name)) found.shared.push_back(*device);
      }
    }
    closedir(d);
  }
  if (DIR* d = opendir((dev_dir + "/nvidia-caps").c_str()); d != nullptr) {
    while (const dirent* entry = readdir(d)) {
      if (auto device = CharDeviceAt(dev_dir + "/nvidia-caps/" + entry->d_name)) {
        found.shared.push_back(*device);
      }
    }
    closedir(d);
  }
  // readdir's order is the file system's: sort, so that rules are stable.
  std::sort(found.gpus.begin(), found.gpus.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::sort(found.shared.begin(), found.shared.end(), [](const CharDevice& a, const CharDevice& b) {
    return std::make_pair(a.major, a.minor) < std::make_pair(b.major, b.minor);
  });
  return found;
}

DeviceRules GpuConfinement(const NvidiaDevices& devices, const std::vector<int>& job_gpu_minors) {
  DeviceRules rules;
  const std::set<int> own(job_gpu_minors.begin(), job_gpu_minors.end());
  // Each node exactly (major:minor), never a whole major: another device
  // may share the major number.
  for (const auto& [index, device] : devices.gpus) {
    if (own.count(index) == 0) rules.deny.push_back(device);
  }
  if (own.empty()) {
    for (const CharDevice& device : devices.shared) rules.deny.push_back(device);
  }
  return rules;
}

}  // namespace mesh::agent
