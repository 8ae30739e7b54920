// Shared between the OrderApplier's first launches (agent/order_applier.cc)
// and its replace orders (agent/order_replace.cc): the records it keeps per
// job and per generation. Private to the order applier.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/cgroup.h"
#include "agent/order_applier.h"
#include "agent/process_launcher.h"
#include "agent/worker_supervisor.h"
#include "mesh/v1/job.pb.h"

namespace mesh::agent {

// Extra time, beyond the grace, that stopping a generation (or what a
// rank's earlier process left behind) may take.
inline constexpr absl::Duration kStopMargin = absl::Seconds(5);

// Not in an anonymous namespace: OrderApplier::Generation holds one, and
// GCC rejects (-Wsubobject-linkage) a class with external linkage holding a
// member of an anonymous-namespace type once the class is not in the main
// file, as in a unity build.
namespace order_applier_internal {

// Wraps the agent's launcher for one generation: records the pid of each
// launch in order (WorkerSupervisor::Start launches its ranks in the order
// given, so pid i belongs to rank i), and lets a KILL order override the
// grace the supervisor was built with.
class RecordingLauncher final : public ProcessLauncher {
 public:
  explicit RecordingLauncher(ProcessLauncher* inner) : inner_(inner) {}

  absl::StatusOr<pid_t> Launch(const LaunchSpec& spec, ExitCallback on_exit) override {
    absl::StatusOr<pid_t> pid = inner_->Launch(spec, std::move(on_exit));
    if (pid.ok()) {
      absl::MutexLock lock(&mu_);
      pids_.push_back(*pid);
    }
    return pid;
  }
  absl::Status Signal(pid_t pid, int signal) override { return inner_->Signal(pid, signal); }
  absl::Status Terminate(pid_t pid, absl::Duration grace) override {
    {
      absl::MutexLock lock(&mu_);
      if (grace_override_.has_value()) grace = *grace_override_;
    }
    return inner_->Terminate(pid, grace);
  }

  std::vector<pid_t> pids() const {
    absl::MutexLock lock(&mu_);
    return pids_;
  }
  void OverrideGrace(absl::Duration grace) {
    absl::MutexLock lock(&mu_);
    grace_override_ = grace;
  }

 private:
  ProcessLauncher* const inner_;
  mutable absl::Mutex mu_;
  std::vector<pid_t> pids_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Duration> grace_override_ ABSL_GUARDED_BY(mu_);
};

}  // namespace order_applier_internal

// The workers of one (job, generation). The maps are guarded by
// OrderApplier::mu_; recorder and supervisor are set before the record is
// shared and are thread-safe themselves. Destroyed only outside
// OrderApplier::mu_ (the supervisor's destructor waits for exit callbacks,
// which take mu_).
//
// A rank is in `running` while its process runs and in `exited` once that
// process's exit is seen; while a replace order starts it again it is in
// `relaunching` (and in `exited` again only if the new process exits, or
// cannot be started).
struct OrderApplier::Generation {
  int64_t generation = 0;
  std::set<int> ranks;           // every rank of the LAUNCH
  std::map<int, pid_t> running;  // launched, exit not yet seen
  std::set<int> exited;
  // MESH_METRICS_PORT of each rank given one, until its exit is seen.
  std::map<int, int> metrics_ports;
  bool launching = true;  // Start() in progress: exits are held back
  bool stopped = false;   // killed or replaced: collected once empty
  // Ranks a replace order is starting again now: their exits are held back
  // too, until their started report is queued.
  std::set<int> relaunching;
  // Exit reports that arrived while launching or relaunching; sent after
  // the started report.
  std::vector<v1::ReportWorkerExitRequest> held;
  // The generation's cgroup (null without one) and each rank's memory limit
  // (0: none), for OOM reports. The cgroup outlives the supervisor.
  std::unique_ptr<GenerationCgroup> cgroup;
  int64_t memory_limit = 0;
  // The rank cgroup's OOM kill count when a replace started the rank again:
  // only kills above it are the new process's.
  std::map<int, int64_t> oom_kills_before;
  std::vector<int> gpus;  // GPUs of this node its ranks hold
  std::unique_ptr<order_applier_internal::RecordingLauncher> recorder;  // outlives supervisor
  std::unique_ptr<WorkerSupervisor> supervisor;  // declared last: destroyed first
};

struct OrderApplier::JobRecord {
  // Highest generation launched or killed; LAUNCH at or below it is a no-op
  // (a replace order is applied to it alone).
  int64_t highest = -1;
  std::map<int64_t, std::shared_ptr<Generation>> generations;
  // Exit records of the current generation, kept until a KILL, re-sent
  // after every re-registration. A rank's records go once a replace order
  // starts it again.
  int64_t exits_generation = -1;
  std::vector<v1::ReportWorkerExitRequest> exits;
};

}  // namespace mesh::agent
