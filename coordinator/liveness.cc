#include "coordinator/liveness.h"

#include <algorithm>

#include "common/check.h"

namespace mesh::coordinator {

LivenessTracker::LivenessTracker(int world_size, absl::Duration timeout)
    : timeout_(timeout), nodes_(world_size) {
  MESH_CHECK(world_size >= 1, "LivenessTracker needs a world of at least one rank");
  MESH_CHECK(timeout > absl::ZeroDuration(), "LivenessTracker needs a positive timeout");
}

void LivenessTracker::Unlink(int rank) {
  Node& n = nodes_[rank];
  if (!n.linked) return;
  (n.prev == kNone ? head_ : nodes_[n.prev].next) = n.next;
  (n.next == kNone ? tail_ : nodes_[n.next].prev) = n.prev;
  n.prev = n.next = kNone;
  n.linked = false;
}

void LivenessTracker::PushBack(int rank) {
  Node& n = nodes_[rank];
  n.prev = tail_;
  n.next = kNone;
  (tail_ == kNone ? head_ : nodes_[tail_].next) = rank;
  tail_ = rank;
  n.linked = true;
}

void LivenessTracker::Start(absl::Time now) {
  if (started_) return;
  started_ = true;
  latest_ = std::max(latest_, now);
  // Rank order, so that ranks silent since the start are reported lowest
  // first.
  for (int rank = 0; rank < static_cast<int>(nodes_.size()); ++rank) {
    if (nodes_[rank].left) continue;
    nodes_[rank].last_seen = latest_;
    PushBack(rank);
  }
}

void LivenessTracker::Heartbeat(int rank, absl::Time now) {
  Node& n = nodes_[rank];
  if (!started_ || n.left) return;
  latest_ = std::max(latest_, now);
  n.last_seen = latest_;
  Unlink(rank);
  PushBack(rank);
}

void LivenessTracker::Leave(int rank) {
  if (!nodes_[rank].left) ++num_left_;
  nodes_[rank].left = true;
  Unlink(rank);
}

void LivenessTracker::Return(int rank, absl::Time now) {
  Node& n = nodes_[rank];
  if (!n.left) return;
  n.left = false;
  --num_left_;
  if (!started_) return;
  latest_ = std::max(latest_, now);
  n.last_seen = latest_;
  PushBack(rank);
}

void LivenessTracker::ForgiveStall(absl::Duration stall, absl::Time now) {
  if (stall <= absl::ZeroDuration()) return;
  // The same shift for every rank keeps the list's order; capping at `now`
  // can only make neighbours equal.
  for (int rank = head_; rank != kNone; rank = nodes_[rank].next) {
    Node& n = nodes_[rank];
    n.last_seen = std::min(n.last_seen + stall, std::max(now, n.last_seen));
    latest_ = std::max(latest_, n.last_seen);
  }
}

std::optional<LivenessTracker::Silent> LivenessTracker::FirstDead(absl::Time now) const {
  if (head_ == kNone) return std::nullopt;
  const absl::Duration silent = now - nodes_[head_].last_seen;
  if (silent <= timeout_) return std::nullopt;
  return Silent{head_, silent};
}

}  // namespace mesh::coordinator
