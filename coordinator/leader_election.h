// LeaderElection: which coordinator replica leads, decided by etcd
// (docs/ha.md). No consensus of our own: a replica leads while it holds the
// election key, which it created in a Txn that required the key to be absent
// and which is attached to its lease. The lease expires when the replica
// stops renewing it (a crash, a pause, a partition from etcd), etcd deletes
// the key, and another replica's Txn then succeeds.
//
// The term is the key's create revision: unique to one holding of the key,
// and what EtcdJobStore::SetFence compares, so that every write of a
// replica is conditional on its term still being the current one. A leader
// that wakes from a pause after its lease expired cannot write; its next
// renewal finds the lease gone and it reports the loss (then the coordinator
// exits and its supervisor starts it again, as a follower).
//
// While etcd is unreachable or has no quorum, leases cannot expire either
// (etcd extends them when it elects a new leader of its own), so the leader
// keeps leading and its writes fail with UNAVAILABLE until etcd is back; it
// steps down only when etcd says its lease or key is gone.
//
// Thread safety: Campaign, KeepLeading and Resign are called by one owner
// thread, in that order; Stop and leader() from any thread. The renewal
// runs on a thread of its own from the moment Campaign wins; on_lost is
// called at most once.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "coordinator/etcd_client.h"

namespace mesh::coordinator {

struct LeaderElectionOptions {
  // The election key, e.g. "<store prefix>/leader".
  std::string key;
  // What this replica writes there: the address clients should use to reach
  // it, which followers hand out.
  std::string address;
  // The lease's time to live: how long after a leader stops renewing (a
  // crash, a pause) another replica can take over. At least 1 s (etcd
  // rounds up to its own minimum, 1.5 times its election timeout).
  absl::Duration lease_ttl = absl::Seconds(5);
};

// One holding of the election key.
struct LeaderTerm {
  int64_t create_revision = 0;  // The fence (EtcdJobStore::SetFence).
  int64_t lease = 0;
  // Another replica held the key while this one campaigned: this term is a
  // failover, not the first leader of an empty store.
  bool took_over = false;
};

class LeaderElection {
 public:
  LeaderElection(std::shared_ptr<EtcdClient> client, LeaderElectionOptions options);
  // Stops the renewal thread and resigns if leading.
  ~LeaderElection();
  LeaderElection(const LeaderElection&) = delete;
  LeaderElection& operator=(const LeaderElection&) = delete;

  // Blocks until this replica leads; returns its term. While the key is
  // held, it waits on an etcd Watch of the key, so that it campaigns as
  // soon as the holder's lease expires or the holder resigns; each wait
  // lasts at most min(1 s, lease_ttl / 3), when it renews its own lease.
  // It calls `on_leader` with the current leader's address whenever that
  // changes ("" while none holds the key). etcd being unreachable is waited out,
  // and so is the key held under this replica's own address by another
  // lease (its previous process, restarted at once after a crash), which
  // is logged.
  // Possible errors: CANCELLED after Stop() (noticed within one wait).
  absl::StatusOr<LeaderTerm> Campaign(const std::function<void(const std::string&)>& on_leader);

  // Once Campaign has won, a thread renews the lease at once and then every
  // lease_ttl / 3, until Stop or Resign. KeepLeading names who hears, once,
  // with the reason, when etcd says the lease expired or the key no longer
  // belongs to this term; a loss before KeepLeading is reported by it, on
  // the caller's thread, otherwise on the renewal thread.
  void KeepLeading(std::function<void(const std::string& reason)> on_lost);

  // Gives up the leadership at once (stops the renewals, then revokes the
  // lease, which deletes the key), so that a follower takes over without
  // waiting for the TTL. No on_lost follows.
  absl::Status Resign();

  // Ends Campaign (CANCELLED) and the renewal thread; no on_lost follows.
  void Stop();

  // The leader's address as last seen ("" when none, or not yet looked).
  std::string leader() const;

 private:
  void RenewLoop(LeaderTerm term);

  const std::shared_ptr<EtcdClient> client_;
  const LeaderElectionOptions options_;

  absl::Notification stop_;
  mutable absl::Mutex mu_;
  std::string leader_ ABSL_GUARDED_BY(mu_);
  LeaderTerm term_ ABSL_GUARDED_BY(mu_);
  std::function<void(const std::string&)> on_lost_ ABSL_GUARDED_BY(mu_);
  bool lost_ ABSL_GUARDED_BY(mu_) = false;
  std::string lost_reason_ ABSL_GUARDED_BY(mu_);
  std::thread renewer_;
};

}  // namespace mesh::coordinator
