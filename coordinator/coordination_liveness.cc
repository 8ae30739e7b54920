// Coordination's liveness and time (coordination.h, "Liveness and errors"
// and "Time and shutdown"): heartbeats, reported errors, leaving, exit
// reports, watches, the end of a generation, and Tick, which expires waits
// and checks for silent and hung ranks; then shutdown. Private parts of
// Coordination, under its one mutex; the records are in
// coordination_internal.h.

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"
#include "common/duration_format.h"
#include "coordinator/barrier_table.h"
#include "coordinator/coordination.h"
#include "coordinator/coordination_internal.h"
#include "coordinator/hang_detector.h"
#include "coordinator/liveness.h"
#include "coordinator/server_lag.h"

namespace mesh::coordinator {
namespace {

constexpr absl::Duration kTickInterval = absl::Milliseconds(10);
// Ranks or keys named in one error message; the rest are counted.
constexpr size_t kMaxNamed = 16;

// "a, b, c and 5 more": the first kMaxNamed items, formatted by `name`.
template <typename T, typename Name>
std::string NameSome(const std::vector<T>& items, Name name) {
  std::vector<std::string> names;
  for (size_t i = 0; i < items.size() && i < kMaxNamed; ++i) names.push_back(name(items[i]));
  std::string text = absl::StrJoin(names, ", ");
  if (items.size() > kMaxNamed) absl::StrAppend(&text, " and ", items.size() - kMaxNamed, " more");
  return text;
}

}  // namespace

// ---- Liveness and errors -------------------------------------------------------------

void Coordination::EndGenerationLocked(Generation& gen, const absl::Status& status,
                                       const JobError* error, Completions& done) {
  for (auto& [id, waiter] : waiters_.TakeScope(gen.scope)) {
    if (waiter.kind == Waiter::Kind::kWatch && error != nullptr) {
      done.Complete(waiter.watch_done, absl::StatusOr<JobError>(*error));
    } else {
      waiter.Fail(status, done);
    }
  }
  // Every index of those waits is now stale.
  gen.join_waiters.clear();
  gen.kv_waits.Clear();
  gen.id_waits.Clear();
  gen.barriers.FinishAll(status);
  gen.alive.arrived.clear();
}

void Coordination::FailGenerationLocked(Generation& gen, JobError error, Completions& done) {
  if (gen.error.has_value()) return;  // The first failure is the root cause.
  error.generation = gen.number;
  const std::string who = error.rank >= 0
                              ? absl::StrCat("rank ", error.rank, " (", error.host, ") failed: ")
                              : std::string("failed: ");
  error.message = absl::StrCat(gen.Name(), ": ", who, error.reason);
  gen.error = std::move(error);
  if (failure_listener_) {
    done.Add([listener = failure_listener_, job_id = gen.job_id, failure = *gen.error] {
      listener(job_id, failure);
    });
  }
  // Watchers get the structured error; every pending wait gets ABORTED.
  EndGenerationLocked(gen, absl::AbortedError(gen.error->message), &*gen.error, done);
}

void Coordination::SetFailureListener(FailureListener listener) {
  absl::MutexLock lock(&mu_);
  failure_listener_ = std::move(listener);
}

absl::StatusOr<std::optional<JobError>> Coordination::Heartbeat(const Caller& caller) {
  absl::StatusOr<HeartbeatReply> reply = Heartbeat(caller, {});
  if (!reply.ok()) return reply.status();
  return std::move(reply->error);
}

absl::StatusOr<HeartbeatReply> Coordination::Heartbeat(
    const Caller& caller, const std::vector<GroupProgressReport>& groups) {
  if (groups.size() > static_cast<size_t>(HangDetector::kMaxGroupsPerReport)) {
    return absl::InvalidArgumentError(absl::StrCat("a heartbeat reports ", groups.size(),
                                                   " groups; at most ",
                                                   HangDetector::kMaxGroupsPerReport));
  }
  absl::MutexLock lock(&mu_);
  auto resolved = ResolveLocked(caller, true, /*allow_failed=*/true);
  if (!resolved.ok()) return resolved.status();
  Generation& gen = **resolved;
  HeartbeatReply reply;
  if (gen.error.has_value()) {
    reply.error = gen.error;
    return reply;
  }
  const absl::Time now = clock_->Now();
  gen.liveness.Heartbeat(caller.rank, now);
  if (!groups.empty()) reply.send_members = gen.hangs.Report(caller.rank, groups, now);
  reply.membership_epoch = gen.epoch;
  for (const auto& [rank, lost] : gen.lost) reply.lost.push_back(lost);
  return reply;
}

absl::Status Coordination::ReportError(const Caller& caller, const std::string& reason) {
  Completions done;
  absl::MutexLock lock(&mu_);
  auto resolved = ResolveLocked(caller, true, /*allow_failed=*/true);
  if (!resolved.ok()) return resolved.status();
  Generation& gen = **resolved;
  JobError error;
  error.rank = caller.rank;
  error.host = gen.rendezvous.host(caller.rank);
  error.reason = reason.empty() ? "reported an error" : reason;
  RankFailedLocked(gen, std::move(error), done);
  return absl::OkStatus();
}

absl::Status Coordination::Leave(const Caller& caller) {
  Completions done;
  absl::MutexLock lock(&mu_);
  auto resolved = ResolveLocked(caller, true, /*allow_failed=*/true);
  if (!resolved.ok()) return resolved.status();
  Generation& gen = **resolved;
  gen.liveness.Leave(caller.rank);
  if (gen.error.has_value()) return absl::OkStatus();
  WithdrawAliveLocked(gen, caller.rank,
                      absl::FailedPreconditionError(absl::StrCat(
                          gen.Name(), ": rank ", caller.rank, " left during its AliveRanks call")),
                      done);
  MaybeCompleteAliveRoundLocked(gen, done);
  for (const std::string& name : gen.barriers.AwaitingRank(caller.rank)) {
    FinishBarrierLocked(gen, name,
                        absl::FailedPreconditionError(absl::StrCat(
                            gen.Name(), ": barrier '", name, "': participant rank ",
                            gen.rendezvous.RankName(caller.rank), " left before arriving")),
                        done);
  }
  return absl::OkStatus();
}

absl::StatusOr<Coordination::Generation*> Coordination::ExitReportTargetLocked(
    const std::string& job_id, int64_t generation, int rank) {
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) return nullptr;
  Generation& gen = *job->second->current;
  if (gen.number != generation || gen.error.has_value()) return nullptr;
  if (rank < 0 || rank >= gen.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(gen.Name(), ": rank ", rank, " is outside the world of ", gen.world_size()));
  }
  return &gen;
}

void Coordination::LoseExitedRankLocked(Generation& gen, int rank, const std::string& reason,
                                        Completions& done) {
  JobError error;
  error.rank = rank;
  error.host = gen.rendezvous.host(rank);
  error.reason = reason.empty() ? "exited before the job finished" : reason;
  LoseRankLocked(gen, std::move(error), done);
}

absl::Status Coordination::RankExited(const std::string& job_id, int64_t generation, int rank,
                                      const std::string& reason) {
  Completions done;
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Generation*> target = ExitReportTargetLocked(job_id, generation, rank);
  if (!target.ok()) return target.status();
  if (*target == nullptr) return absl::OkStatus();
  Generation& gen = **target;
  if (gen.liveness.left(rank) || gen.rendezvous.num_joined() == 0) return absl::OkStatus();
  if (gen.layout->in_place && gen.rendezvous.complete()) {
    // Its peers carry on without it: lose it now.
    LoseExitedRankLocked(gen, rank, reason, done);
    return absl::OkStatus();
  }
  gen.exited.emplace(rank, reason.empty() ? "exited before the job finished" : reason);
  // A peer parked on anything (its own watch aside) may be waiting for this
  // rank, which will never come: end those waits now.
  const bool waiting = waiters_.AnyInScope(
      gen.scope, [](const Waiter& w) { return w.kind != Waiter::Kind::kWatch; });
  if (waiting) FailIfRankExitedLocked(gen, done);
  return absl::OkStatus();
}

absl::StatusOr<bool> Coordination::LoseRankInPlace(const std::string& job_id, int64_t generation,
                                                   int rank, const std::string& reason) {
  Completions done;
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Generation*> target = ExitReportTargetLocked(job_id, generation, rank);
  if (!target.ok()) return target.status();
  if (*target == nullptr) return false;
  Generation& gen = **target;
  if (!gen.layout->in_place || !gen.rendezvous.complete()) return false;
  if (gen.lost.contains(rank)) return true;
  if (gen.liveness.left(rank)) return false;
  LoseExitedRankLocked(gen, rank, reason, done);
  return true;
}

void Coordination::FailIfRankExitedLocked(Generation& gen, Completions& done) {
  if (gen.exited.empty() || gen.error.has_value()) return;
  const auto& [rank, reason] = *gen.exited.begin();
  JobError error;
  error.rank = rank;
  error.host = gen.rendezvous.joined(rank) ? gen.rendezvous.host(rank) : std::string();
  error.reason = reason;
  RankFailedLocked(gen, std::move(error), done);
}

absl::StatusOr<uint64_t> Coordination::Watch(const Caller& caller, WatchCallback callback) {
  Completions done;
  absl::MutexLock lock(&mu_);
  auto resolved = ResolveLocked(caller, /*require_joined=*/true, /*allow_failed=*/true);
  if (!resolved.ok()) return resolved.status();
  Generation& gen = **resolved;
  if (gen.error.has_value()) {
    done.Complete(callback, absl::StatusOr<JobError>(*gen.error));
    // A handle like any other, so that Unwatch of it is a clean false.
    return waiters_.ReserveId();
  }
  Waiter waiter;
  waiter.kind = Waiter::Kind::kWatch;
  waiter.rank = caller.rank;
  waiter.watch_done = std::move(callback);
  // A watch lasts as long as its generation: no deadline.
  return AddWaiterLocked(gen, absl::InfiniteFuture(), std::move(waiter));
}

bool Coordination::Unwatch(uint64_t handle) {
  std::optional<Waiter> dropped;  // Its callback is destroyed after unlock.
  absl::MutexLock lock(&mu_);
  const Waiter* w = waiters_.Find(handle);
  if (w == nullptr || w->kind != Waiter::Kind::kWatch) return false;
  dropped = waiters_.Take(handle);
  return true;
}

// ---- Time ---------------------------------------------------------------------------

absl::Duration Coordination::TickInterval() const { return kTickInterval; }

void Coordination::ExpireLocked(uint64_t id, Waiter w, Completions& done) {
  Generation& gen = *w.gen;
  const std::string after = FormatDurationShort(w.timeout);
  switch (w.kind) {
    case Waiter::Kind::kBarrier: {
      const BarrierTable::Barrier& b = *gen.barriers.Find(w.barrier);
      const absl::Status status = absl::DeadlineExceededError(absl::StrCat(
          gen.Name(), ": barrier '", w.barrier, "' timed out after ", after, ": ",
          b.arrived_count(), "/", b.expected(), " arrived; missing ranks ",
          NameSome(b.Missing(), [&gen](int rank) { return gen.rendezvous.RankName(rank); })));
      // Every participant's wait has this deadline: finish them all now.
      FinishBarrierLocked(gen, w.barrier, status, done);
      return w.Fail(status, done);
    }
    case Waiter::Kind::kJoin:
      gen.join_waiters.erase(id);
      return w.Fail(
          absl::DeadlineExceededError(absl::StrCat(
              gen.Name(), ": rank ", w.rank, " timed out after ", after,
              " waiting for the world to join: ", gen.rendezvous.num_joined(), "/",
              gen.world_size(), " ranks joined; missing ranks ",
              NameSome(gen.rendezvous.Missing(), [](int rank) { return absl::StrCat(rank); }))),
          done);
    case Waiter::Kind::kKeys: {
      gen.Waits(w.space).Unpark(id, w.keys);
      std::vector<std::string> missing;
      for (const std::string& key : w.keys.keys) {
        if (gen.Find(w.space, key) == nullptr) missing.push_back(key);
      }
      const bool ids = w.space == KeySpace::kUniqueIds;
      return w.Fail(
          absl::DeadlineExceededError(absl::StrCat(
              gen.Name(), ": rank ", w.rank, " waited ", after, " for ",
              ids ? "unique ID(s) " : "key(s) ",
              NameSome(missing, [](const std::string& key) { return absl::StrCat("'", key, "'"); }),
              ids ? " that nobody published" : " that nobody set")),
          done);
    }
    case Waiter::Kind::kWatch:
      MESH_CHECK(false, "a watch has no deadline");
    case Waiter::Kind::kAlive: {
      // Counted with the caller, which then leaves the round.
      const std::vector<int> missing = AliveMissingLocked(gen);
      const size_t called = gen.alive.arrived.size();
      auto arrived = gen.alive.arrived.find(w.rank);
      if (arrived != gen.alive.arrived.end() && arrived->second == id) {
        gen.alive.arrived.erase(arrived);
      }
      return w.Fail(absl::DeadlineExceededError(absl::StrCat(
                        gen.Name(), ": AliveRanks round ", gen.alive.completed + 1,
                        " timed out after ", after, " for rank ", w.rank, ": ", called, "/",
                        called + missing.size(), " live ranks called; missing ranks ",
                        NameSome(missing, [&gen](int r) { return gen.rendezvous.RankName(r); }))),
                    done);
    }
  }
}

void Coordination::SetServerLag(const ServerLag* lag) {
  absl::MutexLock lock(&mu_);
  server_lag_ = lag;
}

void Coordination::ForgiveStall(absl::Duration stall) {
  if (stall <= absl::ZeroDuration()) return;
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  for (auto& [job_id, job] : jobs_) job->current->liveness.ForgiveStall(stall, now);
  spdlog::warn(
      "the coordinator stalled for {} (paused, or starved of CPU): heartbeat silences do not "
      "count that time",
      FormatDurationShort(stall));
}

void Coordination::CheckLivenessLocked(absl::Time now, Completions& done) {
  // A heartbeat sent now may wait this long in the server's own backlog.
  const absl::Duration grace = CappedGrace(server_lag_, now, options_.heartbeat_timeout);
  bool held = false;
  for (auto& [job_id, job] : jobs_) {
    Generation& gen = *job->current;
    // With in-place recovery every silent rank is lost in turn; otherwise
    // the first one fails the generation.
    while (!gen.error.has_value()) {
      std::optional<LivenessTracker::Silent> dead = gen.liveness.FirstDead(now - grace);
      if (!dead.has_value()) {
        held = held || (grace > absl::ZeroDuration() && gen.liveness.FirstDead(now).has_value());
        break;
      }
      dead->silent += grace;
      JobError error;
      error.rank = dead->rank;
      error.host = gen.rendezvous.host(dead->rank);
      auto exited = gen.exited.find(dead->rank);
      error.reason =
          exited != gen.exited.end()
              ? exited->second
              : absl::StrCat("no heartbeat for ", FormatDurationShort(dead->silent), " (timeout ",
                             FormatDurationShort(options_.heartbeat_timeout), ")");
      RankFailedLocked(gen, std::move(error), done);
    }
  }
  if (held && !grace_held_) {
    spdlog::warn(
        "a rank has been silent past the heartbeat timeout, but the coordinator's own backlog "
        "({}) may hold its heartbeats: not declared dead yet",
        FormatDurationShort(grace));
  }
  grace_held_ = held;
}

void Coordination::CheckHangsLocked(absl::Time now, Completions& done) {
  for (auto& [job_id, job] : jobs_) {
    Generation& gen = *job->current;
    if (gen.error.has_value()) continue;
    std::optional<HangDiagnosis> hang = gen.hangs.Diagnose(now);
    if (!hang.has_value()) continue;
    metrics_.hangs->Increment();
    JobError error;
    error.rank = hang->culprit;
    error.host = gen.rendezvous.host(hang->culprit);
    error.reason = hang->message;
    error.hang = true;
    FailGenerationLocked(gen, std::move(error), done);
  }
}

void Coordination::Tick() {
  Completions done;
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  const absl::Time now = clock_->Now();
  while (std::optional<std::pair<uint64_t, Waiter>> expired = waiters_.TakeExpired(now)) {
    ExpireLocked(expired->first, std::move(expired->second), done);
  }
  if (now >= next_liveness_check_) {
    CheckLivenessLocked(now, done);
    // Checking a quarter interval apart detects a silent rank within a
    // quarter interval of its timeout.
    next_liveness_check_ = now + std::max(options_.heartbeat_interval / 4, kTickInterval);
  }
  if (now >= next_hang_check_) {
    // Twice a heartbeat interval: a hang is diagnosed within about one
    // interval of its timeout once the reports show it.
    CheckHangsLocked(now, done);
    next_hang_check_ = now + std::max(options_.heartbeat_interval / 2, kTickInterval);
  }
  if (now >= next_gauge_update_) {
    UpdateGaugesLocked();
    next_gauge_update_ = now + absl::Seconds(1);
  }
}

void Coordination::UpdateGaugesLocked() {
  int64_t keys = 0;
  int64_t bytes = 0;
  for (const auto& [job_id, job] : jobs_) {
    const KvStats stats = job->current->kv.Stats();
    keys += stats.num_keys;
    bytes += stats.total_bytes;
  }
  metrics_.kv_keys->Set(static_cast<double>(keys));
  metrics_.kv_bytes->Set(static_cast<double>(bytes));
  metrics_.pending_waits->Set(static_cast<double>(waiters_.size()));
}

void Coordination::Shutdown() {
  Completions done;
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  shut_down_ = true;
  for (auto& [job_id, job] : jobs_) {
    EndGenerationLocked(*job->current, UnavailableShutDown(), /*error=*/nullptr, done);
  }
  MESH_CHECK(waiters_.empty(), "every wait belongs to a current generation");
  UpdateGaugesLocked();
}

size_t Coordination::PendingWaits() const {
  absl::MutexLock lock(&mu_);
  return waiters_.size();
}

}  // namespace mesh::coordinator
