// ServerLag: how far behind its own work the coordinator is, so that
// liveness never blames a rank or a node for the coordinator's delays
// (docs/failure-semantics.md, "The coordinator's own delays").
//
// A heartbeat proves life when the coordinator processes it, not when the
// rank sends it. Two things can separate the two, and both are the
// coordinator's doing:
//
//  * A backlog of requests: a saturated server (a rendezvous of tens of
//    thousands of ranks, a starved CPU) holds heartbeats in its queues. A
//    probe call goes through the server's own request path (its in-process
//    channel: call matching and the callback executor, as every RPC) every
//    probe interval; the probe still unanswered has waited as long as a
//    heartbeat sent with it, and the last answered one took as long as its
//    round trip. Grace() is the larger of the two: every liveness check adds
//    it to its timeout.
//  * A stall of the whole process (SIGSTOP, a VM pause, swapping): nothing
//    runs, heartbeats pile up unread, and time still passes. The ticker
//    wakes every few milliseconds; when it finds it woke late, the lost time
//    is a stall, which the managers forgive: silences that span it are
//    counted without it (Coordination::ForgiveStall,
//    JobManager::ForgiveStall).
//
// Thread safety: thread-safe (a mutex).
#pragma once

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace mesh::coordinator {

class ServerLag {
 public:
  // A probe was sent at `at`; a no-op while another is unanswered.
  void ProbeSent(absl::Time at);
  // The unanswered probe came back at `at` (answered, or failed: either way
  // the server got to it).
  void ProbeAnswered(absl::Time at);
  bool probe_pending() const;

  // How long a heartbeat arriving now may wait before the coordinator
  // processes it: the age of the unanswered probe, or else the last probe's
  // round trip. Zero before any probe.
  absl::Duration Grace(absl::Time now) const;

 private:
  mutable absl::Mutex mu_;
  absl::Time pending_since_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  absl::Duration last_round_trip_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
};

// `lag`'s Grace at `now`, capped at `cap` (a liveness check allows at most
// one more timeout); zero when `lag` is null.
absl::Duration CappedGrace(const ServerLag* lag, absl::Time now, absl::Duration cap);

// The part of a ticker's lateness that counts as a stall: anything beyond
// `expected` plus kStallSlack (scheduling noise on a busy host is not
// forgiven, and need not be: timeouts are seconds).
inline constexpr absl::Duration kStallSlack = absl::Milliseconds(200);
absl::Duration StallOf(absl::Duration since_last_wake, absl::Duration expected);

}  // namespace mesh::coordinator
