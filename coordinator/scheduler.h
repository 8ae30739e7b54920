// Scheduler: which pending jobs start now, on which nodes — gang, FIFO,
// deterministic. The coordinator fills NodeView and JobRequest from its
// records, runs a pass whenever something changes (a submit, a job ending, a
// node registering, draining or being lost), and turns each Placement into
// assignments for the agents. docs/scheduling.md has the rules and examples.
//
// One pass (SchedulePass):
//
//  1. Capacity: each node's slots and GPUs, less what the `running`
//     allocations on it hold. Only READY nodes take jobs.
//  2. Jobs are considered in submission order (JobRequest::sequence, then
//     job_id), whatever order they are passed in.
//  3. Gang: a job gets every node it needs at once or none. A node fits a
//     job when it has nproc_per_node free slots and nproc_per_node *
//     gpus_per_proc free GPUs; a job with nodes MIN:MAX takes as many
//     fitting nodes as it accepts, up to MAX, and waits below MIN. Among the
//     fitting nodes it takes the first ones by name, and PlaceJob lays the
//     ranks out on them (placement.h). What it takes is gone for the jobs
//     after it in the same pass.
//  4. FIFO without backfill (the default): once a job cannot start, every
//     job after it waits too, "blocked behind job <id> (FIFO)", so small
//     jobs cannot starve a large one at the head. With backfill on, later
//     jobs that fit in what is left start anyway; that keeps nodes busy but
//     can delay the head indefinitely (there is no reservation), so it is
//     off by default.
//  5. A request that can never run as asked (ValidateJobRequest fails) is
//     rejected with that status and blocks nobody; the coordinator should
//     fail it. A request that fits no node *now* (even one larger than the
//     whole cluster) waits, because nodes may register later.
//
// Every pending job gets a reason a person can act on, e.g.
//   "waiting for 2 nodes with 4 free slots and 8 free GPUs each; 1 node fits
//    (node-a); 1 short of capacity (node-b: 2 slots, 8 GPUs free); 1 LOST
//    (node-c)"
//
// The result depends only on the inputs' contents, never on their order, the
// time or anything else, so a restarted coordinator recomputes the same
// decisions from the same records.
//
// Thread safety: SchedulePass is a pure function. Scheduler is not
// thread-safe; its owner's mutex guards every call.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "coordinator/rank_placement.h"

namespace mesh::coordinator {

struct SchedulerOptions {
  // Let jobs behind a blocked one start when they fit (see above).
  bool backfill = false;
};

struct PendingJob {
  std::string job_id;
  std::string reason;

  friend bool operator==(const PendingJob&, const PendingJob&) = default;
};

struct RejectedJob {
  std::string job_id;
  absl::Status status;  // INVALID_ARGUMENT from ValidateJobRequest.
};

struct SchedulePassResult {
  // Jobs that start now, in submission order.
  std::vector<Placement> placements;
  // Jobs that wait, in submission order, each with its reason.
  std::vector<PendingJob> pending;
  // Jobs that can never run as asked, in submission order.
  std::vector<RejectedJob> rejected;
};

// One scheduling pass; see the file comment.
// Possible errors (INVALID_ARGUMENT): two nodes with one name; a node that
// lists a GPU index twice; two pending jobs with one id; a pending job that
// is also in `running`.
absl::StatusOr<SchedulePassResult> SchedulePass(absl::Span<const NodeView> nodes,
                                                absl::Span<const JobRequest> pending,
                                                absl::Span<const Placement> running,
                                                const SchedulerOptions& options = {});

// SchedulePass plus the bookkeeping of what runs where: placements made by
// Schedule are held until Release, and adopted ones (a coordinator
// reconciling after a restart) count the same.
class Scheduler {
 public:
  explicit Scheduler(SchedulerOptions options = {}) : options_(options) {}

  // Runs a pass against the allocations held and holds the new placements.
  // Possible errors: those of SchedulePass.
  absl::StatusOr<SchedulePassResult> Schedule(absl::Span<const NodeView> nodes,
                                              absl::Span<const JobRequest> pending);

  // Holds an allocation made before (by an earlier coordinator process).
  // Possible errors: ALREADY_EXISTS when the job already holds one;
  // INVALID_ARGUMENT for an empty job_id.
  absl::Status Adopt(Placement placement);

  // Returns the job's nodes, slots and GPUs to the pool.
  // Possible errors: NOT_FOUND when the job holds nothing.
  absl::Status Release(absl::string_view job_id);

  // The job's allocation, or null; valid until the next non-const call.
  const Placement* Find(absl::string_view job_id) const;
  // Every allocation held, by job id.
  std::vector<Placement> Running() const;

 private:
  SchedulerOptions options_;
  std::map<std::string, Placement, std::less<>> running_;
};

}  // namespace mesh::coordinator
