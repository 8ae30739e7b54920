// Private to JobManager's implementation files (job_manager.cc,
// job_queries.cc, job_recovery.cc, job_logs.cc, node_sessions.cc): the
// manager's in-memory records of jobs, nodes and waits, and the Effects a
// locked section leaves to run after unlocking. Every field is guarded by
// the manager's mutex.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/job_manager.h"

namespace mesh::coordinator {

// What every call answers once the manager has shut down.
inline absl::Status ShuttingDown() {
  return absl::UnavailableError("the coordinator is shutting down");
}

// A job's resizes as the store keeps them (JobRecord::resizes), and back.
// "" for none. Possible errors of Decode: DATA_LOSS.
std::string EncodeResizes(const std::vector<mesh::v1::JobResize>& resizes);
absl::StatusOr<std::vector<mesh::v1::JobResize>> DecodeResizes(const std::string& bytes);

// The submission number in a "job-<n>" id (ids are assigned in order); 0
// for any other id.
int64_t JobNumber(const std::string& id);

struct JobManager::Job {
  enum class Rank { kLaunching, kRunning, kSucceeded, kUnaccounted };

  std::string id;
  int64_t number = 0;  // Submission order.
  mesh::v1::JobSpec spec;
  std::string owner;  // The submitting principal; empty: none.
  std::unique_ptr<JobStateMachine> machine;
  int64_t version = 0;  // The store version this process last wrote or read.
  // The latest placement; kept after the job ends so its logs can be found.
  std::optional<Placement> placement;
  bool holds = false;  // The placement is held in scheduler_.
  // Per rank of the current generation, while placed.
  std::vector<Rank> ranks;
  // The pid ReportWorkersStarted gave for each rank; 0 while unknown (not
  // started yet, or since a coordinator restart). Sized with `ranks`.
  std::vector<int32_t> pids;
  // For each kUnaccounted rank, and each kLaunching rank of a RUNNING job
  // (relaunched in place), when it is declared gone; the earliest of them
  // in unaccounted_deadline (InfiniteFuture: none).
  std::vector<absl::Time> gone_at;
  absl::Time unaccounted_deadline = absl::InfiniteFuture();

  // A rank relaunched in place must be reported started by `deadline`.
  void ExpectStartedBy(int rank, absl::Time deadline) {
    if (gone_at.size() != ranks.size()) gone_at.assign(ranks.size(), absl::InfiniteFuture());
    gone_at[rank] = deadline;
    unaccounted_deadline = std::min(unaccounted_deadline, deadline);
  }

  void MarkUnaccounted(int rank, absl::Time deadline) {
    if (gone_at.size() != ranks.size()) gone_at.assign(ranks.size(), absl::InfiniteFuture());
    if (ranks[rank] != Rank::kUnaccounted) gone_at[rank] = deadline;
    ranks[rank] = Rank::kUnaccounted;
    unaccounted_deadline = std::min(unaccounted_deadline, gone_at[rank]);
  }
  // Nodes that took over a lost node's ranks in place during this
  // generation (ReplaceLostNodeInPlaceLocked) and have not reported them
  // started yet: their LAUNCH starts the generation there, not a replace.
  std::set<std::string> replacement_nodes;
  // Nodes whose ranks moved away during this generation: never taken to
  // replace another, since an agent ignores a LAUNCH of a generation it has
  // seen (it killed it).
  std::set<std::string> left_generation;
  std::map<uint64_t, JobStateSink*> watchers;
  // Elastic membership (job_elastic.cc). Every change of the node count,
  // oldest first (stored).
  std::vector<mesh::v1::JobResize> resizes;
  // The most nodes the next placement may take; 0: spec.nodes.max.
  int node_cap = 0;
  // Why the job is being placed again; the reason of the resize, if the
  // placement changes its size.
  std::string replace_reason;
  // The next time Tick looks for nodes to grow on (grow AFTER).
  absl::Time next_grow_check = absl::InfinitePast();
  // The state counted in mesh_coordinator_jobs; nullopt: not counted yet.
  std::optional<JobState> counted;

  JobState state() const { return machine->state(); }
  int64_t generation() const { return machine->generation(); }
};

struct JobManager::Node {
  std::string name;
  std::string address;
  int slots = 0;
  std::vector<mesh::v1::NodeGpu> gpus;
  std::string agent_version;
  bool ready = true;       // READY; false: LOST.
  std::string session_id;  // Empty until the agent registers (again).
  absl::Time last_seen;
  // Silence counts from max(last_seen, this): after Recover, the end of the
  // recovery grace.
  absl::Time silence_from = absl::InfinitePast();
  uint64_t stream = 0;  // Handle of the open WatchAssignments, or 0.
  AssignmentSink* sink = nullptr;
  std::vector<mesh::v1::Assignment> pending;  // Delivered when the stream opens.
  int metrics_port = 0;                       // The agent's /metrics; 0: none.
  mesh::v1::NodeIsolation isolation;          // What the agent enforces.
  metrics::Gauge* heartbeat = nullptr;        // Its last-heartbeat gauge.
};

struct JobManager::Waiter {
  std::string job_id;
  absl::Time deadline;
  Callback<mesh::v1::Job> done;
};

// What a locked section leaves to do after unlocking: callbacks to run, and
// whether a scheduling pass is due (the locked section runs it before
// unlocking).
class JobManager::Effects {
 public:
  void Call(absl::AnyInvocable<void() &&> call) { calls_.push_back(std::move(call)); }
  void Reschedule() { reschedule_ = true; }
  bool TakeReschedule() { return std::exchange(reschedule_, false); }

  // Runs the callbacks; call with no lock held.
  void Run() {
    for (auto& call : calls_) std::move(call)();
    calls_.clear();
  }

 private:
  std::vector<absl::AnyInvocable<void() &&>> calls_;
  bool reschedule_ = false;
};

}  // namespace mesh::coordinator
