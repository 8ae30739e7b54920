#include "backends/nccl/nccl_watchdog.h"

#include "backends/nccl/nccl_group.h"
#include "common/check.h"

namespace mesh::nccl {

Watchdog::Watchdog(absl::Duration interval) : interval_(interval) {
  MESH_CHECK(interval > absl::ZeroDuration(), "the NCCL watchdog interval must be positive");
  thread_ = std::thread([this] { Run(); });
}

Watchdog::~Watchdog() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void Watchdog::Watch(std::weak_ptr<GroupCore> core) {
  absl::MutexLock lock(&mu_);
  cores_.push_back(std::move(core));
}

void Watchdog::Run() {
  for (;;) {
    std::vector<std::shared_ptr<GroupCore>> live;
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stop_), interval_);
      if (stop_) return;
      live.reserve(cores_.size());
      std::erase_if(cores_, [&live](const std::weak_ptr<GroupCore>& weak) {
        std::shared_ptr<GroupCore> core = weak.lock();
        if (core == nullptr) return true;
        live.push_back(std::move(core));
        return false;
      });
    }
    // Outside mu_: a tick may abort a group, which can take a while, and
    // Watch must not wait for that.
    const absl::Time now = absl::Now();
    for (const std::shared_ptr<GroupCore>& core : live) core->WatchdogTick(now);
  }
}

}  // namespace mesh::nccl
