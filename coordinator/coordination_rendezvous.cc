// Coordination's rendezvous and barriers (coordination.h, "Rendezvous" and
// "Barriers"): Join and the world it completes, a newer process taking a
// rank (SupersedeLocked), DescribeRanks, and named barriers over the
// generation's BarrierTable. Private parts of Coordination, under its one
// mutex; the records are in coordination_internal.h.

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/check.h"
#include "coordinator/barrier_table.h"
#include "coordinator/coordination.h"
#include "coordinator/coordination_internal.h"
#include "coordinator/rendezvous.h"

namespace mesh::coordinator {

// ---- Rendezvous ------------------------------------------------------------------

JoinResult Coordination::JoinResultLocked(const Generation& gen, int rank) const {
  const Rendezvous::Placement placement = gen.rendezvous.placement(rank);
  JoinResult r;
  r.rank = rank;
  r.world_size = gen.world_size();
  r.local_rank = placement.local_rank;
  r.local_world_size = placement.local_world_size;
  r.node_rank = placement.node_rank;
  r.num_nodes = gen.rendezvous.num_nodes();
  r.mesh_shape = gen.layout->mesh_shape;
  r.mesh_dim_names = gen.layout->mesh_dim_names;
  r.generation = gen.number;
  r.nccl_unique_id = gen.rendezvous.world_unique_id();
  r.heartbeat_interval = RankHeartbeatInterval(options_, gen.world_size());
  r.heartbeat_timeout = options_.heartbeat_timeout;
  r.membership_epoch = gen.epoch;
  r.in_place = gen.layout->in_place;
  r.in_place_dim = gen.layout->in_place_dim;
  return r;
}

void Coordination::CompleteJoinLocked(Generation& gen, Completions& done) {
  // Liveness starts now: ranks waiting in Join were alive by being there.
  const absl::Time now = clock_->Now();
  gen.liveness.Start(now);
  if (gen.first_join.has_value()) {
    metrics_.rendezvous_duration->Observe(absl::ToDoubleSeconds(now - *gen.first_join));
  }
  for (uint64_t id : gen.join_waiters) {
    std::optional<Waiter> w = waiters_.Take(id);
    MESH_CHECK(w.has_value(), "join_waiters holds only pending waits");
    done.Complete(w->join_done, absl::StatusOr<JoinResult>(JoinResultLocked(gen, w->rank)));
  }
  gen.join_waiters.clear();
}

void Coordination::Join(JoinArgs args, Callback<JoinResult> callback) {
  using Result = absl::StatusOr<JoinResult>;
  Completions done;
  absl::MutexLock lock(&mu_);
  auto resolved = ResolveLocked(args.caller, /*require_joined=*/false, /*allow_failed=*/false,
                                /*check_incarnation=*/false);
  if (!resolved.ok()) return done.Complete(callback, Result(resolved.status()));
  Generation& gen = **resolved;
  const int rank = args.caller.rank;
  if (gen.rendezvous.superseded(rank, args.caller.incarnation)) {
    // A newer process replaced this one: it may not take the rank back.
    return done.Complete(
        callback, Result(absl::AbortedError(absl::StrCat(
                      gen.Name(), ": rank ", rank, " (incarnation ", args.caller.incarnation,
                      ") was superseded by a newer process of the same rank; this one is stale"))));
  }
  if (auto lost = gen.lost.find(rank);
      lost != gen.lost.end() && gen.rendezvous.incarnation(rank) == args.caller.incarnation) {
    // The process that was lost may not come back as itself.
    return done.Complete(callback, Result(absl::AbortedError(lost->second.message)));
  }
  if (gen.rendezvous.joined(rank) && gen.rendezvous.incarnation(rank) != args.caller.incarnation) {
    // A malformed join must not displace the process that holds the rank.
    if (absl::Status s = Rendezvous::CheckJoin(rank, args.host, args.nccl_unique_id); !s.ok()) {
      return done.Complete(callback, Result(gen.Annotate(s)));
    }
    if (absl::Status s = SupersedeLocked(gen, args.caller, args.host, args.device, done); !s.ok()) {
      return done.Complete(callback, Result(s));
    }
  }
  const bool was_complete = gen.rendezvous.complete();
  if (!gen.first_join.has_value()) gen.first_join = clock_->Now();
  const absl::StatusOr<bool> completed =
      gen.rendezvous.Join(rank, args.caller.incarnation, std::move(args.host),
                          std::move(args.device), std::move(args.nccl_unique_id));
  if (!completed.ok()) return done.Complete(callback, Result(gen.Annotate(completed.status())));
  if (was_complete) return done.Complete(callback, Result(JoinResultLocked(gen, rank)));

  Waiter waiter;
  waiter.kind = Waiter::Kind::kJoin;
  waiter.rank = rank;
  waiter.timeout = ClampTimeout(args.timeout);
  waiter.join_done = std::move(callback);
  const absl::Time deadline = clock_->Now() + waiter.timeout;
  gen.join_waiters.insert(AddWaiterLocked(gen, deadline, std::move(waiter)));
  if (*completed) {
    CompleteJoinLocked(gen, done);
  } else {
    FailIfRankExitedLocked(gen, done);
  }
}

absl::Status Coordination::SupersedeLocked(Generation& gen, const Caller& caller,
                                           const std::string& host, const DeviceInfo& device,
                                           Completions& done) {
  const int rank = caller.rank;
  const uint64_t old = gen.rendezvous.incarnation(rank);
  if (gen.rendezvous.complete() && gen.layout->in_place) {
    // In-place recovery: the older process is lost (unless it already is),
    // and the newer one takes the rank in the next membership epoch.
    if (!gen.lost.contains(rank)) {
      JobError error;
      error.rank = rank;
      error.host = gen.rendezvous.host(rank);
      error.reason = absl::StrCat("was replaced: a new process (incarnation ", caller.incarnation,
                                  ") joined as the rank");
      LoseRankLocked(gen, std::move(error), done);
    }
    gen.rendezvous.SetIncarnation(rank, caller.incarnation);
    gen.rendezvous.Rehost(rank, host, device);
    ReadmitLocked(gen, rank);
    return absl::OkStatus();
  }
  if (gen.rendezvous.complete()) {
    // The world formed with the older process: every peer's groups hold it,
    // so the generation cannot go on. The newer process owns the rank from
    // now on, which fences the older one out of its next call.
    gen.rendezvous.SetIncarnation(rank, caller.incarnation);
    JobError error;
    error.rank = rank;
    error.host = host.empty() ? gen.rendezvous.host(rank) : host;
    error.reason = absl::StrCat("was restarted: a new process (incarnation ", caller.incarnation,
                                ") joined after the world had formed with incarnation ", old,
                                ", so its peers' groups are stale");
    FailGenerationLocked(gen, std::move(error), done);
    return absl::AbortedError(gen.error->message);
  }
  // Before the world is complete nothing depends on the older process yet:
  // its waits end, and the newer one joins in its place.
  const absl::Status superseded =
      absl::AbortedError(absl::StrCat(gen.Name(), ": rank ", rank, " (incarnation ", old,
                                      ") was superseded by a newer process (incarnation ",
                                      caller.incarnation, ") that joined as the same rank"));
  for (uint64_t id :
       waiters_.IdsInScope(gen.scope, [rank](const Waiter& w) { return w.rank == rank; })) {
    std::optional<Waiter> w = waiters_.Take(id);
    if (w->kind == Waiter::Kind::kJoin) gen.join_waiters.erase(id);
    w->Fail(superseded, done);
  }
  // Its barrier arrivals go too: the newer process arrives for itself.
  gen.barriers.Withdraw(rank);
  gen.rendezvous.Unjoin(rank);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<RankDescription>> Coordination::DescribeRanks(
    const Caller& caller, const std::vector<int>& ranks) {
  absl::MutexLock lock(&mu_);
  auto resolved = ResolveLocked(caller, /*require_joined=*/true, /*allow_failed=*/false);
  if (!resolved.ok()) return resolved.status();
  const Generation& gen = **resolved;
  absl::StatusOr<std::vector<RankDescription>> described = gen.rendezvous.Describe(ranks);
  if (!described.ok()) return gen.Annotate(described.status());
  return described;
}

// ---- Barriers ----------------------------------------------------------------------

void Coordination::FinishBarrierLocked(Generation& gen, const std::string& name,
                                       const absl::Status& status, Completions& done) {
  const BarrierTable::Barrier& barrier = *gen.barriers.Find(name);
  const int expected = barrier.expected();
  if (status.ok()) {
    // Opened by the first arrival with deadline = then + timeout.
    const absl::Time opened = barrier.deadline() - barrier.timeout();
    metrics_.barrier_wait->Observe(
        absl::ToDoubleSeconds(std::max(absl::ZeroDuration(), clock_->Now() - opened)));
  } else if (absl::IsDeadlineExceeded(status)) {
    metrics_.barrier_timeouts->Increment();
  }
  for (uint64_t id : gen.barriers.Finish(name, status)) {
    // Absent: the wait whose deadline finished the barrier; ExpireLocked
    // ends that one.
    std::optional<Waiter> w = waiters_.Take(id);
    if (!w.has_value()) continue;
    done.Complete(w->barrier_done,
                  status.ok() ? absl::StatusOr<int>(expected) : absl::StatusOr<int>(status));
  }
}

void Coordination::Barrier(const Caller& caller, const std::string& name, std::vector<int> ranks,
                           absl::Duration timeout, Callback<int> callback) {
  using Result = absl::StatusOr<int>;
  Completions done;
  absl::MutexLock lock(&mu_);
  auto resolved = ResolveLocked(caller, true, false);
  if (!resolved.ok()) return done.Complete(callback, Result(resolved.status()));
  Generation& gen = **resolved;
  auto invalid = [&](absl::string_view why) {
    done.Complete(callback, Result(absl::InvalidArgumentError(
                                absl::StrCat(gen.Name(), ": barrier '", name, "': ", why))));
  };
  if (name.empty()) return invalid("the name must not be empty");
  auto exhausted = [&](absl::string_view why) {
    // An over-long name is shown cut, not echoed whole.
    const std::string shown =
        name.size() > 64 ? absl::StrCat(name.substr(0, 64), "...") : std::string(name);
    done.Complete(callback, Result(absl::ResourceExhaustedError(
                                absl::StrCat(gen.Name(), ": barrier '", shown, "': ", why))));
  };
  // The name is stored (and echoed in messages) as a KV key would be.
  if (name.size() > options_.kv.max_key_bytes) {
    return exhausted(absl::StrCat("name of ", name.size(), " bytes exceeds the limit of ",
                                  options_.kv.max_key_bytes));
  }
  absl::StatusOr<std::vector<int>> participants =
      gen.barriers.NormalizeParticipants(std::move(ranks), caller.rank);
  if (!participants.ok()) return invalid(participants.status().message());
  if (gen.barriers.Find(name) == nullptr &&
      static_cast<int64_t>(gen.barriers.size()) >= options_.max_barriers) {
    return exhausted(absl::StrCat("a new barrier would make ", gen.barriers.size() + 1,
                                  ", over the limit of ", options_.max_barriers,
                                  " per generation"));
  }

  bool created = false;
  BarrierTable::Barrier& b =
      gen.barriers.Open(name, *participants, clock_->Now(), ClampTimeout(timeout), &created);
  if (b.result().has_value()) {
    // A late caller gets what everyone got.
    return done.Complete(callback, b.result()->ok() ? Result(b.expected()) : Result(*b.result()));
  }
  Waiter waiter;
  waiter.kind = Waiter::Kind::kBarrier;
  waiter.rank = caller.rank;
  waiter.timeout = b.timeout();
  waiter.barrier = name;
  waiter.barrier_done = std::move(callback);
  b.AddWaiter(AddWaiterLocked(gen, b.deadline(), std::move(waiter)));

  if (b.participants() != *participants) {
    return FinishBarrierLocked(
        gen, name,
        absl::InvalidArgumentError(absl::StrCat(
            gen.Name(), ": barrier '", name, "': rank ", caller.rank, " passed participants ",
            BarrierTable::DescribeParticipants(*participants), " but the barrier was started with ",
            BarrierTable::DescribeParticipants(b.participants()))),
        done);
  }
  // In-place recovery: a participant that is lost will never arrive.
  for (const auto& [rank, lost] : gen.lost) {
    if (!b.Includes(rank) || b.arrived(rank)) continue;
    return FinishBarrierLocked(
        gen, name,
        absl::AbortedError(absl::StrCat(gen.Name(), ": barrier '", name, "': participant rank ",
                                        rank, " (", lost.host, ") failed: ", lost.reason,
                                        "; it was lost before the barrier opened")),
        done);
  }
  if (b.Arrive(caller.rank)) {
    FinishBarrierLocked(gen, name, absl::OkStatus(), done);
  } else {
    FailIfRankExitedLocked(gen, done);
  }
}

}  // namespace mesh::coordinator
