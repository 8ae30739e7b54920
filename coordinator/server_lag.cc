#include "coordinator/server_lag.h"

#include <algorithm>

namespace mesh::coordinator {

void ServerLag::ProbeSent(absl::Time at) {
  absl::MutexLock lock(&mu_);
  if (pending_since_ == absl::InfiniteFuture()) pending_since_ = at;
}

void ServerLag::ProbeAnswered(absl::Time at) {
  absl::MutexLock lock(&mu_);
  if (pending_since_ == absl::InfiniteFuture()) return;
  last_round_trip_ = std::max(absl::ZeroDuration(), at - pending_since_);
  pending_since_ = absl::InfiniteFuture();
}

bool ServerLag::probe_pending() const {
  absl::MutexLock lock(&mu_);
  return pending_since_ != absl::InfiniteFuture();
}

absl::Duration ServerLag::Grace(absl::Time now) const {
  absl::MutexLock lock(&mu_);
  if (pending_since_ != absl::InfiniteFuture()) {
    return std::max(last_round_trip_, now - pending_since_);
  }
  return last_round_trip_;
}

absl::Duration CappedGrace(const ServerLag* lag, absl::Time now, absl::Duration cap) {
  return lag == nullptr ? absl::ZeroDuration() : std::min(lag->Grace(now), cap);
}

absl::Duration StallOf(absl::Duration since_last_wake, absl::Duration expected) {
  const absl::Duration late = since_last_wake - expected;
  return late > kStallSlack ? late : absl::ZeroDuration();
}

}  // namespace mesh::coordinator
