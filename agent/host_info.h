// HostInfo: what an agent registers for its host — name, slots and GPUs.
//
// Discovery reads the OS (host name, the CPUs this process may run on);
// explicit options override what it finds, as the operator knows best.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mesh::agent {

struct HostInfo {
  std::string hostname;
  // CPUs this process may run on (sched_getaffinity), at least 1.
  int cpu_count = 1;
  // Worker processes this host accepts at once.
  int slots = 1;
  // CUDA device ordinals workers may be given (CUDA_VISIBLE_DEVICES values).
  std::vector<int> gpus;
};

struct HostOptions {
  // Overrides the host name; empty means gethostname().
  std::string hostname;
  // Slots to offer; 0 means one per CPU.
  int slots = 0;
  // GPU list as given to --gpus: "" (none), "0,1,3", or "0-3".
  std::string gpus;
};

// Parses a GPU list: comma-separated ordinals and inclusive ranges
// ("0,2-3" -> {0,2,3}). Whitespace around items is allowed.
// Possible errors: INVALID_ARGUMENT for a malformed item, a negative or
// reversed range, an ordinal above 1023, or a duplicate.
absl::StatusOr<std::vector<int>> ParseGpuList(absl::string_view text);

// Number of CPUs this process may run on; falls back to the online CPU count
// and never returns less than 1.
int AvailableCpuCount();

// Builds the host record from the OS and `options`.
// Possible errors: INVALID_ARGUMENT for negative slots or a bad GPU list.
absl::StatusOr<HostInfo> DiscoverHost(const HostOptions& options);

// One-line JSON rendering, as printed by `mesh-agent --discover`.
std::string HostInfoToJson(const HostInfo& info);

}  // namespace mesh::agent
