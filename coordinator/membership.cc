// Coordination's in-place recovery and AliveRanks (coordination.h, "In-place
// recovery"): with JobLayout::in_place, a rank that dies once the world has
// formed is lost instead of failing its generation, and the membership
// moves to its next epoch; a new process may join as the rank again. The
// AliveRanks rounds give every live rank the same view of who is alive.
//
// Private parts of Coordination, which keeps its state per generation
// (Generation::lost, epoch, alive) under its one mutex.

#include <string>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>
#include "absl/strings/str_cat.h"
#include "coordinator/coordination.h"
#include "coordinator/coordination_internal.h"

namespace mesh::coordinator {

void Coordination::RankFailedLocked(Generation& gen, JobError error, Completions& done) {
  if (gen.layout->in_place && gen.rendezvous.complete() && error.rank >= 0 && !error.hang) {
    LoseRankLocked(gen, std::move(error), done);
    return;
  }
  FailGenerationLocked(gen, std::move(error), done);
}

void Coordination::LoseRankLocked(Generation& gen, JobError error, Completions& done) {
  const int rank = error.rank;
  if (gen.error.has_value() || gen.lost.contains(rank)) return;
  ++gen.epoch;
  metrics_.ranks_lost->Increment();
  error.generation = gen.number;
  error.message =
      absl::StrCat(gen.Name(), ": rank ", rank, " (", error.host, ") failed: ", error.reason,
                   "; the others carry on in membership epoch ", gen.epoch);
  spdlog::warn("{}", error.message);
  const absl::Status lost = absl::AbortedError(error.message);
  gen.liveness.Leave(rank);
  gen.exited.erase(rank);
  // Its own waits end: the process is gone, or fenced out from now on. Its
  // watch is told why, as a failed generation would tell it.
  for (uint64_t id :
       waiters_.IdsInScope(gen.scope, [rank](const Waiter& w) { return w.rank == rank; })) {
    std::optional<Waiter> w = waiters_.Take(id);
    switch (w->kind) {
      case Waiter::Kind::kJoin:
        gen.join_waiters.erase(id);
        break;
      case Waiter::Kind::kKeys:
        gen.Waits(w->space).Unpark(id, w->keys);
        break;
      case Waiter::Kind::kAlive:
        gen.alive.arrived.erase(rank);
        break;
      case Waiter::Kind::kBarrier:
      case Waiter::Kind::kWatch:
        break;
    }
    if (w->kind == Waiter::Kind::kWatch) {
      done.Complete(w->watch_done, absl::StatusOr<JobError>(error));
    } else {
      w->Fail(lost, done);
    }
  }
  // A barrier that waits for it can never complete: it fails for everyone,
  // at once, naming the rank.
  gen.barriers.Withdraw(rank);
  for (const std::string& name : gen.barriers.AwaitingRank(rank)) {
    FinishBarrierLocked(
        gen, name,
        absl::AbortedError(absl::StrCat(gen.Name(), ": barrier '", name, "': participant rank ",
                                        rank, " (", error.host, ") failed: ", error.reason,
                                        " (membership epoch ", gen.epoch, ")")),
        done);
  }
  RecordMembershipLocked(
      gen, MembershipEvent{gen.epoch, clock_->Now(), rank, /*lost=*/true, 0, error.reason});
  gen.lost.emplace(rank, std::move(error));
  MaybeCompleteAliveRoundLocked(gen, done);
}

void Coordination::ReadmitLocked(Generation& gen, int rank) {
  if (gen.lost.erase(rank) == 0) return;
  ++gen.epoch;
  metrics_.ranks_returned->Increment();
  gen.liveness.Return(rank, clock_->Now());
  RecordMembershipLocked(gen, MembershipEvent{gen.epoch, clock_->Now(), rank, /*lost=*/false,
                                              gen.rendezvous.incarnation(rank), ""});
  spdlog::info("{}: rank {} is back (incarnation {}) in membership epoch {}", gen.Name(), rank,
               gen.rendezvous.incarnation(rank), gen.epoch);
}

void Coordination::RecordMembershipLocked(Generation& gen, MembershipEvent event) {
  gen.membership.push_back(std::move(event));
  while (gen.membership.size() > kMaxMembershipEvents) gen.membership.pop_front();
}

void Coordination::WithdrawAliveLocked(Generation& gen, int rank, const absl::Status& status,
                                       Completions& done) {
  auto it = gen.alive.arrived.find(rank);
  if (it == gen.alive.arrived.end()) return;
  std::optional<Waiter> w = waiters_.Take(it->second);
  gen.alive.arrived.erase(it);
  if (w.has_value()) w->Fail(status, done);
}

std::vector<int> Coordination::AliveMissingLocked(const Generation& gen) const {
  std::vector<int> missing;
  for (int rank = 0; rank < gen.world_size(); ++rank) {
    if (!gen.liveness.left(rank) && !gen.alive.arrived.contains(rank)) missing.push_back(rank);
  }
  return missing;
}

void Coordination::MaybeCompleteAliveRoundLocked(Generation& gen, Completions& done) {
  // Every caller is live (a rank that is lost or leaves withdraws), so the
  // round is complete when the callers are as many as the live ranks.
  const int live = gen.world_size() - gen.liveness.num_left();
  if (gen.alive.arrived.empty() || static_cast<int>(gen.alive.arrived.size()) < live) return;
  AliveSet set;
  set.round = ++gen.alive.completed;
  set.membership_epoch = gen.epoch;
  set.ranks.reserve(gen.alive.arrived.size());
  for (const auto& [rank, id] : gen.alive.arrived) {
    set.ranks.push_back(AliveRank{rank, gen.rendezvous.incarnation(rank)});
  }
  for (const auto& [rank, id] : gen.alive.arrived) {
    std::optional<Waiter> w = waiters_.Take(id);
    MESH_CHECK(w.has_value(), "alive.arrived holds only pending waits");
    done.Complete(w->alive_done, absl::StatusOr<AliveSet>(set));
  }
  gen.alive.arrived.clear();
}

void Coordination::AliveRanks(const Caller& caller, absl::Duration timeout,
                              Callback<AliveSet> callback) {
  Completions done;
  absl::MutexLock lock(&mu_);
  auto resolved = ResolveLocked(caller, /*require_joined=*/true, /*allow_failed=*/false);
  if (!resolved.ok()) return done.Complete(callback, absl::StatusOr<AliveSet>(resolved.status()));
  Generation& gen = **resolved;
  if (!gen.rendezvous.complete()) {
    return done.Complete(callback,
                         absl::StatusOr<AliveSet>(absl::FailedPreconditionError(absl::StrCat(
                             gen.Name(),
                             ": AliveRanks before the world "
                             "has formed (",
                             gen.rendezvous.num_joined(), "/", gen.world_size(), " joined)"))));
  }
  if (gen.liveness.left(caller.rank)) {
    return done.Complete(
        callback, absl::StatusOr<AliveSet>(absl::FailedPreconditionError(absl::StrCat(
                      gen.Name(), ": rank ", caller.rank, " has left (Leave); it is not live"))));
  }
  WithdrawAliveLocked(gen, caller.rank,
                      absl::AbortedError(absl::StrCat(gen.Name(), ": rank ", caller.rank,
                                                      " called AliveRanks again, which replaces "
                                                      "this call")),
                      done);
  Waiter waiter;
  waiter.kind = Waiter::Kind::kAlive;
  waiter.rank = caller.rank;
  waiter.timeout = ClampTimeout(timeout);
  waiter.alive_done = std::move(callback);
  const absl::Time deadline = clock_->Now() + waiter.timeout;
  gen.alive.arrived[caller.rank] = AddWaiterLocked(gen, deadline, std::move(waiter));
  MaybeCompleteAliveRoundLocked(gen, done);
}

}  // namespace mesh::coordinator
