// HangDetector: tells, from the collective progress each rank of one job
// generation sends with its heartbeats, when the job's collectives are hung
// and which rank is the cause (docs/hangs.md).
//
// Every member of a process group numbers the group's collectives 1, 2, ...
// in issue order, so op #n is the same op on every member. A rank *waits* in
// op #n when it entered it (entered >= n) and has completed every op before
// it but not this one (completed == n - 1). The group is hung in op #n when
//   - some member waits in it,
//   - some other member has not entered it (entered < n), as its latest
//     report, received after the waiters started, says, and
//   - a waiter has been waiting for at least the timeout.
// So the clock runs only while a rank waits in an op that another member has
// not entered: ranks that compute for a long time between collectives, all
// of them outside any op, are never flagged. A rank that stopped sending
// heartbeats altogether is the LivenessTracker's to find.
//
// Wait times are the ranks' own durations (how long the op has been
// started, measured on the rank) plus the time since the coordinator
// received that report, so no clock is compared across hosts.
//
// The culprit is a rank that has not entered the op; among several, one
// that waits in no collective of its own (it is stuck outside them) wins
// over one that waits elsewhere (it is a victim of another hang), then the
// lowest rank.
//
// Reports carry each group's members the first time a rank reports it;
// later reports may omit them, and Report says when the detector lacks the
// members of a group (the rank should send them again).
//
// Times come from the owner, which reads its Clock. Thread safety: none; the
// owner's mutex guards every call.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "mesh/v1/worker.pb.h"

namespace mesh::coordinator {

// "all_reduce", "broadcast", ..., "other"; "op" for UNSPECIFIED.
const char* CollectiveKindLabel(v1::CollectiveKind kind);

// One group's progress on one rank, as reported.
struct GroupProgressReport {
  std::string name;
  // Empty when the report omits them.
  std::vector<int> members;
  uint64_t entered = 0;
  uint64_t completed = 0;
  v1::CollectiveKind pending_kind = v1::COLLECTIVE_KIND_UNSPECIFIED;
  v1::CollectiveKind completed_kind = v1::COLLECTIVE_KIND_UNSPECIFIED;
  absl::Duration waiting = absl::ZeroDuration();
  absl::Duration since_completed = absl::ZeroDuration();
};

struct HangDiagnosis {
  // The group, its op, the ranks waiting in it and the ones that never
  // entered it.
  std::string group;
  uint64_t seq = 0;
  v1::CollectiveKind kind = v1::COLLECTIVE_KIND_UNSPECIFIED;
  std::vector<int> waiting;
  std::vector<int> missing;
  // The rank named as the cause (one of `missing`).
  int culprit = -1;
  // How long the longest waiter has waited.
  absl::Duration waited;
  // "hang in group 'tp' (ranks 0-3): ranks 0, 2, 3 have waited 300 s in
  // all_reduce #1734; rank 1 never entered it (last: all_reduce #1733,
  // completed 301 s ago)".
  std::string message;
};

class HangDetector {
 public:
  // Groups per heartbeat (the RPC layer refuses more), and groups tracked
  // per generation: names beyond it are ignored.
  static constexpr int kMaxGroupsPerReport = 4096;
  static constexpr size_t kMaxGroups = 16384;

  // `world_size` >= 1; `timeout` > 0 (checked).
  HangDetector(int world_size, absl::Duration timeout);

  HangDetector(const HangDetector&) = delete;
  HangDetector& operator=(const HangDetector&) = delete;

  absl::Duration timeout() const { return timeout_; }

  // Records `rank`'s latest progress, received at `now`; each group's entry
  // replaces that rank's previous one. Members outside [0, world_size) or a
  // group's members that do not include `rank` are ignored (the group is not
  // judged until valid members arrive). Returns true when some group of the
  // report has no known members: the rank should send them.
  bool Report(int rank, const std::vector<GroupProgressReport>& groups, absl::Time now);

  // The hang with the longest wait at `now`, if any group is hung.
  std::optional<HangDiagnosis> Diagnose(absl::Time now) const;

 private:
  struct Seen {
    uint64_t entered = 0;
    uint64_t completed = 0;
    v1::CollectiveKind pending_kind = v1::COLLECTIVE_KIND_UNSPECIFIED;
    v1::CollectiveKind completed_kind = v1::COLLECTIVE_KIND_UNSPECIFIED;
    absl::Duration waiting;
    absl::Duration since_completed;
    absl::Time received;
  };
  struct Group {
    std::vector<int> members;
    // By world rank.
    absl::flat_hash_map<int, Seen> seen;
  };

  // Whether `rank` waits in some op of any group at `now`.
  bool WaitsAnywhere(int rank) const;
  std::optional<HangDiagnosis> DiagnoseGroup(const std::string& name, const Group& group,
                                             absl::Time now) const;

  const int world_size_;
  const absl::Duration timeout_;
  // Ordered, so that ties between groups resolve the same way every time.
  std::map<std::string, Group> groups_;
};

// "0-3", "0, 2, 3, 5-7": sorted ranks, runs of three or more collapsed.
std::string FormatRankList(std::vector<int> ranks);

}  // namespace mesh::coordinator
