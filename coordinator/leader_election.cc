#include "coordinator/leader_election.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace mesh::coordinator {

LeaderElection::LeaderElection(std::shared_ptr<EtcdClient> client, LeaderElectionOptions options)
    : client_(std::move(client)), options_(std::move(options)) {}

LeaderElection::~LeaderElection() {
  const bool leading = [&] {
    absl::MutexLock lock(&mu_);
    return term_.lease != 0;
  }();
  Stop();
  if (leading) Resign().IgnoreError();
}

void LeaderElection::Stop() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (renewer_.joinable() && renewer_.get_id() != std::this_thread::get_id()) renewer_.join();
}

std::string LeaderElection::leader() const {
  absl::MutexLock lock(&mu_);
  return leader_;
}

absl::StatusOr<LeaderTerm> LeaderElection::Campaign(
    const std::function<void(const std::string&)>& on_leader) {
  // How long one wait for the key to change lasts: it also bounds how late
  // Stop() is noticed and how late this replica's own lease is renewed.
  const absl::Duration renew_every = std::max(absl::Milliseconds(100), options_.lease_ttl / 3);
  const absl::Duration slice = std::min(absl::Seconds(1), renew_every);
  const absl::Duration retry =
      std::max(absl::Milliseconds(50), std::min(slice, options_.lease_ttl / 10));
  std::string seen = "\x01";  // Not an address: the first look always reports.
  bool warned_own_address = false;
  bool saw_other_leader = false;
  int64_t lease = 0;
  absl::Time renew_at = absl::InfinitePast();
  while (!stop_.HasBeenNotified()) {
    // A lease of our own, granted once and renewed while we wait, so that
    // winning needs only the Txn.
    if (lease == 0) {
      absl::StatusOr<int64_t> granted = client_->LeaseGrant(options_.lease_ttl);
      if (granted.ok()) {
        lease = *granted;
        renew_at = absl::Now() + renew_every;
      }
    } else if (absl::Now() >= renew_at) {
      if (!client_->LeaseKeepAlive(lease).ok()) {
        lease = 0;  // Expired (or etcd is away): a new one next round.
        continue;
      }
      renew_at = absl::Now() + renew_every;
    }
    bool txn_answered = false;
    if (lease != 0) {
      EtcdTxn txn;
      txn.IfCreateRevision(options_.key, 0).Put(options_.key, options_.address, lease);
      absl::StatusOr<EtcdTxnResult> won = client_->Txn(txn);
      txn_answered = won.ok();
      if (won.ok() && won->succeeded) {
        LeaderTerm term{won->revision, lease, saw_other_leader};
        {
          absl::MutexLock lock(&mu_);
          term_ = term;
          leader_ = options_.address;
        }
        // Renew from this moment: the lease was last renewed up to
        // TTL/3 ago, and the caller's start-up (the store's recovery read)
        // must not eat into what is left of it.
        renewer_ = std::thread([this, term] { RenewLoop(term); });
        return term;
      }
    }
    absl::StatusOr<EtcdRangeResult> holder = client_->Range(options_.key, "", 1);
    if (!holder.ok()) {
      stop_.WaitForNotificationWithTimeout(retry);
      continue;
    }
    const EtcdKeyValue* held = holder->kvs.empty() ? nullptr : &holder->kvs.front();
    const std::string address = held != nullptr ? held->value : "";
    if (held != nullptr && address == options_.address && held->lease != lease &&
        !warned_own_address) {
      // This replica's previous process (restarted at once after a crash),
      // or a second replica configured with this address: either way the
      // key frees itself when that lease expires.
      spdlog::warn(
          "leader election: {} holds this replica's own address {} under another lease: "
          "waiting for it to expire (a previous process of this replica; if it stays, two "
          "coordinators are configured with one --advertise address)",
          options_.key, address);
      warned_own_address = true;
    }
    if (!address.empty() && address != options_.address) saw_other_leader = true;
    if (address != seen) {
      seen = address;
      {
        absl::MutexLock lock(&mu_);
        leader_ = address;
      }
      if (on_leader) on_leader(address);
    }
    if (held == nullptr) {
      // Free: the Txn lost a race (try again now), or it could not be
      // asked (no lease, or etcd refused it: try again shortly).
      if (!txn_answered) stop_.WaitForNotificationWithTimeout(retry);
      continue;
    }
    // Held: sleep on a watch of the key until it changes, so that this
    // replica campaigns the moment the holder's lease expires or it resigns.
    const absl::Duration wait =
        std::max(absl::ZeroDuration(), std::min(slice, renew_at - absl::Now()));
    absl::StatusOr<bool> changed = client_->WaitForChange(options_.key, holder->revision, wait);
    if (!changed.ok()) stop_.WaitForNotificationWithTimeout(retry);
  }
  if (lease != 0) client_->LeaseRevoke(lease).IgnoreError();
  return absl::CancelledError("leader election stopped");
}

void LeaderElection::KeepLeading(std::function<void(const std::string& reason)> on_lost) {
  std::string reason;
  {
    absl::MutexLock lock(&mu_);
    if (!lost_) {
      on_lost_ = std::move(on_lost);
      return;
    }
    reason = lost_reason_;
  }
  // Lost before anyone listened (during the caller's start-up).
  if (on_lost) on_lost(reason);
}

void LeaderElection::RenewLoop(LeaderTerm term) {
  const absl::Duration period = std::max(absl::Milliseconds(100), options_.lease_ttl / 3);
  // The first renewal at once, then every period.
  for (absl::Duration wait = absl::ZeroDuration(); !stop_.WaitForNotificationWithTimeout(wait);
       wait = period) {
    absl::StatusOr<absl::Duration> renewed = client_->LeaseKeepAlive(term.lease);
    std::string lost;
    if (!renewed.ok()) {
      // Only etcd's word that the lease is gone ends the term; an
      // unreachable etcd cannot expire it either.
      if (renewed.status().code() == absl::StatusCode::kNotFound) {
        lost = absl::StrCat("the lease expired (", renewed.status().message(), ")");
      }
    } else {
      absl::StatusOr<std::optional<EtcdKeyValue>> holder = client_->Get(options_.key);
      if (holder.ok() &&
          (!holder->has_value() || (*holder)->create_revision != term.create_revision)) {
        lost = holder->has_value()
                   ? absl::StrCat("the election key now belongs to ", (*holder)->value, " (term ",
                                  (*holder)->create_revision, ")")
                   : "the election key was deleted";
      }
    }
    if (!lost.empty()) {
      std::function<void(const std::string&)> on_lost;
      {
        absl::MutexLock lock(&mu_);
        term_ = LeaderTerm{};
        leader_.clear();
        lost_ = true;
        lost_reason_ = lost;
        on_lost = std::move(on_lost_);
      }
      if (on_lost) on_lost(lost);
      return;
    }
  }
}

absl::Status LeaderElection::Resign() {
  Stop();  // No renewal, and no report of the loss that follows.
  int64_t lease = 0;
  {
    absl::MutexLock lock(&mu_);
    lease = term_.lease;
    term_ = LeaderTerm{};
    leader_.clear();
  }
  if (lease == 0) return absl::OkStatus();
  return client_->LeaseRevoke(lease);
}

}  // namespace mesh::coordinator
