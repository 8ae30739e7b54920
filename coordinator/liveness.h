// LivenessTracker: when each rank of one job generation last showed signs of
// life, and which rank, if any, has been silent for longer than the
// heartbeat timeout.
//
// Tracking starts when the world is complete (Start): ranks waiting in Join
// are alive by being there, and before that nobody is expected to heartbeat.
// A rank that left cleanly (Leave) is no longer tracked.
//
//   NOT STARTED ──Start(now)──▶ TRACKING (Heartbeat, Leave, FirstDead)
//
// Ranks are kept in order of their last heartbeat (a doubly linked list
// threaded through a vector), so Heartbeat, Leave and FirstDead are O(1)
// whatever the world size: the longest-silent rank is always at the front. Times passed in are
// clamped to be non-decreasing, so a wall clock that steps back cannot break that order (it can
// only make a heartbeat count as slightly later than it was).
//
// A rank is dead when it has been silent for strictly longer than the
// timeout: a heartbeat exactly at the timeout still counts.
//
// Times come from the owner's Clock, passed in, so the tracker itself reads
// no clock. Thread safety: none; the owner's mutex guards every call.
#pragma once

#include <optional>
#include <vector>

#include "absl/time/time.h"

namespace mesh::coordinator {

class LivenessTracker {
 public:
  struct Silent {
    int rank = -1;
    absl::Duration silent;  // How long it has been silent.
  };

  // `world_size` >= 1 and `timeout` > 0 (checked).
  LivenessTracker(int world_size, absl::Duration timeout);

  LivenessTracker(const LivenessTracker&) = delete;
  LivenessTracker& operator=(const LivenessTracker&) = delete;

  bool started() const { return started_; }
  absl::Duration timeout() const { return timeout_; }

  // Starts tracking: every rank that has not left counts as seen at `now`.
  // A second Start is a no-op.
  void Start(absl::Time now);

  // Records a sign of life of `rank` at `now`. A no-op before Start and for
  // a rank that left.
  void Heartbeat(int rank, absl::Time now);

  // `rank` left cleanly and is no longer tracked. Idempotent; valid before
  // Start too.
  void Leave(int rank);
  bool left(int rank) const { return nodes_[rank].left; }
  // Ranks that have left (and not returned).
  int num_left() const { return num_left_; }
  // A rank that left (a lost rank, with in-place recovery) is tracked again,
  // seen at `now` once tracking has started. A no-op for a rank that has
  // not left.
  void Return(int rank, absl::Time now);

  // The coordinator stalled for `stall` (coordinator/server_lag.h): that
  // time does not count towards any rank's silence. Every tracked rank's
  // last sign of life moves `stall` later, but not past `now`. O(ranks);
  // a no-op for a stall <= 0.
  void ForgiveStall(absl::Duration stall, absl::Time now);

  // The longest-silent tracked rank when it has been silent for longer than
  // the timeout at `now`; nullopt before Start or when every rank is within
  // its timeout. Among ranks last seen at the same instant, the one seen
  // first wins; ranks silent since Start go lowest rank first.
  std::optional<Silent> FirstDead(absl::Time now) const;

 private:
  static constexpr int kNone = -1;

  struct Node {
    absl::Time last_seen;
    int prev = kNone;
    int next = kNone;
    bool linked = false;
    bool left = false;
  };

  void Unlink(int rank);
  void PushBack(int rank);

  const absl::Duration timeout_;
  bool started_ = false;
  std::vector<Node> nodes_;
  int head_ = kNone;  // Least recently seen.
  int tail_ = kNone;  // Most recently seen.
  absl::Time latest_ = absl::InfinitePast();
  int num_left_ = 0;
};

}  // namespace mesh::coordinator
