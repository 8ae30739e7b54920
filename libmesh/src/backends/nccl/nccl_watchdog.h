// The NCCL watchdog: one thread per factory that runs GroupCore::WatchdogTick
// on every live group each `interval`. Private to libmesh; compiled only when
// MESH_HAVE_NCCL.
//
// It holds groups weakly, and a GroupCore's destructor makes no blocking
// call, so the thread never owns a group's teardown. The factory and every
// NcclGroup hold the Watchdog; the destructor, which runs on one of their
// threads (never the watchdog's own), stops and joins the thread.
//
// Thread safety: Watch may be called from any thread.
#pragma once

#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace mesh::nccl {

class GroupCore;

class Watchdog {
 public:
  // `interval` must be positive (checked).
  explicit Watchdog(absl::Duration interval);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Starts watching `core` until it is destroyed.
  void Watch(std::weak_ptr<GroupCore> core);

 private:
  void Run();

  const absl::Duration interval_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::weak_ptr<GroupCore>> cores_ ABSL_GUARDED_BY(mu_);
  // Last: starts once the members above exist.
  std::thread thread_;
};

}  // namespace mesh::nccl
