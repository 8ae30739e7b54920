// Helpers shared by the NCCL seam tests (nccl_seam_test.cc,
// nccl_membership_test.cc): factory options for a fake NCCL, a unique-ID
// broker over a map, and a CUDA tensor view the fake never dereferences.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "backends/nccl/unique_id_broker.h"
#include "mesh/process_group_nccl.h"
#include "mesh/tensor.h"

namespace mesh::nccl::nccl_seam_test {

inline NcclProcessGroupFactoryOptions Options(int world_size = 1) {
  NcclProcessGroupFactoryOptions options;
  options.world_rank = 0;
  options.world_size = world_size;
  options.world_unique_id.assign(kNcclUniqueIdBytes, '\x5a');
  options.device = Device::Cuda(0);
  options.init_timeout = absl::Seconds(10);
  options.group_creation = NcclGroupCreation::kSplit;
  options.watchdog_interval = absl::Milliseconds(2);
  options.destroy_timeout = absl::Seconds(5);
  options.group_options.timeout = absl::Seconds(30);
  return options;
}

// Polls `done` until it holds or 10 s pass (the watchdog runs every 2 ms).
inline bool Eventually(const std::function<bool()>& done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return done();
}

// A CUDA tensor view the fake never dereferences.
struct FakeDeviceBuffer {
  std::vector<float> host = std::vector<float>(16, 1.0f);
  Tensor tensor() {
    return Tensor::Contiguous(host.data(), DType::kFloat32, {16}, Device::Cuda(0));
  }
};

// A broker over a map, as the coordinator's would be after every root (or
// group leader) has published: Get answers at once, DEADLINE_EXCEEDED naming
// what is missing. It records what was published and asked for.
class MapBroker final : public NcclUniqueIdBroker {
 public:
  absl::Status Publish(absl::Span<const std::pair<std::string, std::string>> ids) override {
    for (const auto& [key, id] : ids) {
      published.push_back(key);
      map[key] = id;
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<std::string>> Get(absl::Span<const std::string> keys,
                                               absl::Time) override {
    std::vector<std::string> out;
    for (const std::string& key : keys) {
      fetched.push_back(key);
      auto it = map.find(key);
      if (it == map.end()) return absl::DeadlineExceededError(absl::StrCat("'", key, "' missing"));
      out.push_back(it->second);
    }
    return out;
  }
  std::map<std::string, std::string> map;
  std::vector<std::string> published;
  std::vector<std::string> fetched;  // Every key asked for, in order.
};

inline std::string IdBytes(char fill) { return std::string(kNcclUniqueIdBytes, fill); }

inline std::string IdOf(const ncclUniqueId& id) {
  return std::string(id.internal, sizeof(id.internal));
}

}  // namespace mesh::nccl::nccl_seam_test
