// Over 800 lines on purpose: this is the one class that serializes every
// coordination call under one mutex (jobs, fencing, rendezvous, the KV
// store, barriers, unique IDs, liveness), and its methods share that lock
// and the generation records. Each table's logic lives in its own file
// (kv_table, barrier_table, rendezvous, unique_id_table, liveness); what is
// left here is the locking, fencing and waking around them, one section per
// concern.

#include "coordinator/coordination.h"

#include "coordinator/coordination_internal.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <spdlog/spdlog.h>

#include "absl/algorithm/container.h"
#include "absl/container/btree_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"
#include "common/duration_format.h"
#include "coordinator/barrier_table.h"
#include "coordinator/key_waits.h"
#include "coordinator/liveness.h"
#include "coordinator/unique_id_table.h"

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

absl::Status UnavailableShutDown() {
  return absl::UnavailableError("coordinator is shutting down");
}

}  // namespace

absl::Status ValidateOptions(const CoordinationOptions& o) {
  if (o.heartbeat_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("heartbeat_interval must be positive");
  }
  if (o.heartbeat_timeout <= o.heartbeat_interval) {
    return absl::InvalidArgumentError(absl::StrCat(
        "heartbeat_timeout (", FormatDurationShort(o.heartbeat_timeout),
        ") must exceed heartbeat_interval (", FormatDurationShort(o.heartbeat_interval), ")"));
  }
  if (!(o.rank_heartbeat_rate >= 0) || std::isinf(o.rank_heartbeat_rate)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank_heartbeat_rate must be 0 (off) or a positive number of heartbeats a second, not ",
        o.rank_heartbeat_rate));
  }
  if (o.default_wait <= absl::ZeroDuration() || o.max_wait < o.default_wait) {
    return absl::InvalidArgumentError("need 0 < default_wait <= max_wait");
  }
  for (auto [value, name] :
       {std::pair{o.max_barriers, "max_barriers"}, std::pair{o.max_unique_ids, "max_unique_ids"},
        std::pair{o.max_keys_per_request, "max_keys_per_request"}}) {
    if (value < 1) {
      return absl::InvalidArgumentError(absl::StrCat(name, " must be positive, not ", value));
    }
  }
  return ValidateKvLimits(o.kv);
}

absl::Duration RankHeartbeatInterval(const CoordinationOptions& o, int world_size) {
  if (o.rank_heartbeat_rate <= 0 || world_size <= 0) return o.heartbeat_interval;
  const absl::Duration spread = absl::Seconds(world_size / o.rank_heartbeat_rate);
  const absl::Duration longest = std::max(o.heartbeat_interval, o.heartbeat_timeout / 3);
  return std::clamp(spread, o.heartbeat_interval, longest);
}

namespace {

// INVALID_ARGUMENT when a request names more keys than one request may.
absl::Status CheckKeysPerRequest(size_t count, int64_t limit) {
  if (static_cast<int64_t>(count) <= limit) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(count, " keys in one request, over the limit of ", limit, " per request"));
}

}  // namespace

Coordination::Metrics::Metrics(metrics::Registry& registry)
    : kv_operations(registry.AddCounter("mesh_coordinator_kv_operations_total",
                                        "KV calls, by operation.", {"op"})),
      kv_set(kv_operations->WithLabels({"set"})),
      kv_get(kv_operations->WithLabels({"get"})),
      kv_add(kv_operations->WithLabels({"add"})),
      kv_compare_set(kv_operations->WithLabels({"compare_set"})),
      kv_delete(kv_operations->WithLabels({"delete"})),
      kv_list(kv_operations->WithLabels({"list"})),
      kv_wait(kv_operations->WithLabels({"wait"})),
      kv_multi_get(kv_operations->WithLabels({"multi_get"})),
      kv_multi_set(kv_operations->WithLabels({"multi_set"})),
      kv_keys(registry
                  .AddGauge("mesh_coordinator_kv_keys",
                            "Keys stored in the KV store, all live generations.")
                  ->Get()),
      kv_bytes(registry
                   .AddGauge("mesh_coordinator_kv_bytes",
                             "Bytes of keys and values stored in the KV store.")
                   ->Get()),
      rendezvous_duration(
          registry
              .AddHistogram("mesh_coordinator_rendezvous_duration_seconds",
                            "From a generation's first Join to its rendezvous completing.", {},
                            metrics::LatencyBuckets())
              ->Get()),
      barrier_wait(registry
                       .AddHistogram("mesh_coordinator_barrier_wait_seconds",
                                     "From a barrier's first arrival to its release.", {},
                                     metrics::LatencyBuckets())
                       ->Get()),
      barrier_timeouts(registry
                           .AddCounter("mesh_coordinator_barrier_timeouts_total",
                                       "Barriers that ended with DEADLINE_EXCEEDED.")
                           ->Get()),
      unique_ids(registry
                     .AddCounter("mesh_coordinator_unique_ids_brokered_total",
                                 "Unique IDs (NCCL) published.")
                     ->Get()),
      pending_waits(registry
                        .AddGauge("mesh_coordinator_pending_waits",
                                  "Worker calls waiting (joins, gets, barriers, ID waits, "
                                  "watches).")
                        ->Get()),
      hangs(registry
                .AddCounter("mesh_coordinator_hangs_total",
                            "Job generations failed because their collectives hung (a rank "
                            "waited past the hang timeout in a collective another rank never "
                            "entered).")
                ->Get()),
      ranks_lost(registry
                     .AddCounter("mesh_coordinator_ranks_lost_total",
                                 "Ranks lost by jobs with in-place recovery: their generations "
                                 "went on without them (docs/elastic.md).")
                     ->Get()),
      ranks_returned(registry
                         .AddCounter("mesh_coordinator_ranks_returned_total",
                                     "New processes that joined as a lost rank of a job with "
                                     "in-place recovery.")
                         ->Get()) {}

Coordination::Coordination(const Clock* clock, CoordinationOptions options,
                           metrics::Registry* metrics)
    : clock_(clock),
      options_(std::move(options)),
      metrics_(metrics != nullptr ? *metrics : metrics::NoopRegistry()) {
  const absl::Status valid = ValidateOptions(options_);
  MESH_CHECK(valid.ok(), std::string(valid.message()).c_str());
  next_liveness_check_ = clock_->Now();
}

Coordination::~Coordination() { Shutdown(); }

absl::Duration Coordination::TickInterval() const { return kTickInterval; }

absl::Duration Coordination::ClampTimeout(absl::Duration timeout) const {
  if (timeout <= absl::ZeroDuration()) return options_.default_wait;
  return std::min(timeout, options_.max_wait);
}

// ---- Jobs -------------------------------------------------------------------

std::unique_ptr<Coordination::Generation> Coordination::NewGenerationLocked(const Job& job,
                                                                            int64_t number) {
  return std::make_unique<Generation>(job.layout, number, waiters_.ReserveId(), options_);
}

absl::StatusOr<JobInfo> Coordination::CreateJob(JobLayout layout, int64_t generation) {
  if (absl::Status s = NormalizeJobLayout(layout); !s.ok()) return s;
  if (generation < 0) {
    return absl::InvalidArgumentError(absl::StrCat("generation ", generation, " is negative"));
  }
  absl::MutexLock lock(&mu_);
  if (shut_down_) return UnavailableShutDown();
  if (layout.job_id.empty()) {
    do {
      layout.job_id = absl::StrCat("adhoc-", next_job_number_++);
    } while (jobs_.contains(layout.job_id));
  } else if (!IsValidJobId(layout.job_id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("job id '", layout.job_id, "' must be 1-128 characters of [A-Za-z0-9._-]"));
  }
  if (jobs_.contains(layout.job_id)) {
    return absl::AlreadyExistsError(absl::StrCat("job ", layout.job_id, " already exists"));
  }
  auto job = std::make_unique<Job>();
  job->layout = std::move(layout);
  job->current = NewGenerationLocked(*job, generation);
  // Re-created (placed again after a failure): the failure stays known to
  // late callers of its generation, now through the job.
  if (auto failed = failed_removed_.find(job->layout.job_id); failed != failed_removed_.end()) {
    job->previous_error = std::move(failed->second);
    failed_removed_.erase(failed);
  }
  JobInfo info;
  info.layout = job->layout;
  info.generation = generation;
  jobs_.emplace(job->layout.job_id, std::move(job));
  return info;
}

absl::StatusOr<JobInfo> Coordination::GetJob(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("unknown job '", job_id, "'"));
  const Generation& gen = *it->second->current;
  JobInfo info;
  info.layout = it->second->layout;
  info.generation = gen.number;
  info.failed = gen.error.has_value();
  info.membership_epoch = gen.epoch;
  info.membership.assign(gen.membership.begin(), gen.membership.end());
  return info;
}

absl::Status Coordination::RemoveJob(const std::string& job_id, const std::string& reason) {
  Completions done;
  std::unique_ptr<Job> removed;  // Destroyed after unlock, with what it holds.
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("unknown job '", job_id, "'"));
  EndGenerationLocked(
      *it->second->current,
      absl::AbortedError(absl::StrCat(it->second->current->Name(), " was removed: ", reason)),
      /*error=*/nullptr, done);
  if (const std::optional<JobError>& error = it->second->current->error; error.has_value()) {
    // A rank that calls in after its job failed and ended (a peer's exit
    // ended the job before this rank's next call) learns why, like the
    // ranks that were waiting: ABORTED naming the culprit, not NOT_FOUND.
    // Bounded by the deque (an id may be in it twice when its job was
    // re-created and failed again; evicting the older entry then forgets the
    // newer failure early, which only costs a late caller the detail).
    while (failed_removed_order_.size() >= kMaxFailedRemoved) {
      failed_removed_.erase(failed_removed_order_.front());
      failed_removed_order_.pop_front();
    }
    failed_removed_.insert_or_assign(job_id, *error);
    failed_removed_order_.push_back(job_id);
  }
  removed = std::move(it->second);
  jobs_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Coordination::BumpGeneration(const std::string& job_id,
                                                     const std::string& reason) {
  Completions done;
  std::unique_ptr<Generation> old;  // Destroyed after unlock, with what it holds.
  absl::MutexLock lock(&mu_);
  if (shut_down_) return UnavailableShutDown();
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("unknown job '", job_id, "'"));
  Job& job = *it->second;
  const int64_t next = job.current->number + 1;
  EndGenerationLocked(
      *job.current,
      absl::AbortedError(
          absl::StrCat(job.current->Name(), " was superseded by generation ", next, ": ", reason)),
      /*error=*/nullptr, done);
  job.previous_error = job.current->error;
  old = std::exchange(job.current, NewGenerationLocked(job, next));
  return next;
}

// ---- Fencing ------------------------------------------------------------------

absl::StatusOr<Coordination::Generation*> Coordination::ResolveLocked(const Caller& caller,
                                                                      bool require_joined,
                                                                      bool allow_failed,
                                                                      bool check_incarnation) {
  if (shut_down_) return UnavailableShutDown();
  if (caller.job_id.empty()) {
    return absl::InvalidArgumentError(
        "the request names no job: its RankContext (job_id, generation, rank, incarnation) is "
        "missing or has an empty job_id");
  }
  auto it = jobs_.find(caller.job_id);
  if (it == jobs_.end()) {
    auto failed = failed_removed_.find(caller.job_id);
    if (failed != failed_removed_.end() && failed->second.generation == caller.generation) {
      return absl::AbortedError(failed->second.message);
    }
    return absl::NotFoundError(absl::StrCat("unknown job '", caller.job_id, "'"));
  }
  Generation& gen = *it->second->current;
  if (const std::optional<JobError>& previous = it->second->previous_error;
      previous.has_value() && previous->generation == caller.generation) {
    return absl::AbortedError(previous->message);
  }
  if (caller.generation < gen.number) {
    return absl::AbortedError(absl::StrCat("job ", caller.job_id, ": generation ",
                                           caller.generation,
                                           " is stale; the job is at generation ", gen.number));
  }
  if (caller.generation > gen.number) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", caller.job_id, ": generation ", caller.generation,
                     " does not exist yet; the job is at generation ", gen.number));
  }
  if (caller.rank < 0 || caller.rank >= gen.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(gen.Name(), ": rank ", caller.rank, " is outside 0..", gen.world_size() - 1));
  }
  bool joined = gen.rendezvous.joined(caller.rank);
  if (!joined && require_joined && ReattachLocked(gen, caller)) joined = true;
  if (check_incarnation && joined &&
      gen.rendezvous.incarnation(caller.rank) != caller.incarnation) {
    return absl::AbortedError(absl::StrCat(
        gen.Name(), ": rank ", caller.rank, " is held by incarnation ",
        gen.rendezvous.incarnation(caller.rank), "; this process (incarnation ", caller.incarnation,
        ") is fenced out: a newer process joined as this rank, or this one never did"));
  }
  if (gen.error.has_value() && !allow_failed) return absl::AbortedError(gen.error->message);
  if (require_joined && joined) {
    if (auto lost = gen.lost.find(caller.rank); lost != gen.lost.end()) {
      return absl::AbortedError(lost->second.message);
    }
  }
  if (require_joined && !joined) {
    return absl::FailedPreconditionError(
        absl::StrCat(gen.Name(), ": rank ", caller.rank, " has not joined"));
  }
  return &gen;
}

bool Coordination::ReattachLocked(Generation& gen, const Caller& caller) {
  // Not while anyone waits in Join: a rank joining afresh means the world
  // is forming anew, and then every rank must join.
  if (gen.reattach_hosts.empty() || gen.error.has_value() || !gen.join_waiters.empty() ||
      gen.rendezvous.superseded(caller.rank, caller.incarnation)) {
    return false;
  }
  absl::StatusOr<bool> completed =
      gen.rendezvous.Join(caller.rank, caller.incarnation, gen.reattach_hosts[caller.rank],
                          DeviceInfo{}, /*world_unique_id=*/"");
  if (!completed.ok()) return false;
  spdlog::info("{}: rank {} re-attached (incarnation {})", gen.Name(), caller.rank,
               caller.incarnation);
  if (*completed) gen.liveness.Start(clock_->Now());
  return true;
}

absl::Status Coordination::AllowReattach(const std::string& job_id, int64_t generation,
                                         std::vector<std::string> hosts) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("unknown job '", job_id, "'"));
  Generation& gen = *it->second->current;
  if (gen.number != generation) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " is at generation ", gen.number, ", not ", generation));
  }
  if (static_cast<int>(hosts.size()) != gen.world_size() ||
      absl::c_any_of(hosts, [](const std::string& h) { return h.empty(); })) {
    return absl::InvalidArgumentError(absl::StrCat(
        gen.Name(), ": re-attaching needs one host per rank (", gen.world_size(), ")"));
  }
  gen.reattach_hosts = std::move(hosts);
  return absl::OkStatus();
}

uint64_t Coordination::AddWaiterLocked(Generation& gen, absl::Time deadline, Waiter waiter) {
  waiter.gen = &gen;
  return waiters_.Add(gen.scope, deadline, std::move(waiter));
}

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

// ---- Waiting for keys (KV store and unique IDs alike) ------------------------------

void Coordination::WaitForKeysLocked(Generation& gen, KeySpace space, int rank,
                                     std::vector<std::string> keys, absl::Duration timeout,
                                     Callback<std::vector<std::string>> callback,
                                     Completions& done) {
  for (const std::string& key : keys) {
    if (absl::Status s = gen.CheckKey(space, key); !s.ok()) {
      return done.Complete(callback, absl::StatusOr<std::vector<std::string>>(gen.Annotate(s)));
    }
  }
  Waiter waiter;
  waiter.kind = Waiter::Kind::kKeys;
  waiter.rank = rank;
  waiter.timeout = ClampTimeout(timeout);
  waiter.space = space;
  waiter.keys.keys = std::move(keys);
  waiter.values_done = std::move(callback);
  const absl::Time deadline = clock_->Now() + waiter.timeout;
  const uint64_t id = AddWaiterLocked(gen, deadline, std::move(waiter));
  AdvanceKeyWaiterLocked(gen, id, done);
  if (waiters_.Find(id) != nullptr) FailIfRankExitedLocked(gen, done);
}

void Coordination::AdvanceKeyWaiterLocked(Generation& gen, uint64_t id, Completions& done) {
  Waiter* w = waiters_.Find(id);
  if (w == nullptr) return;
  const KeySpace space = w->space;
  std::optional<std::vector<std::string>> values = gen.Waits(space).Advance(
      id, w->keys, [&gen, space](const std::string& key) { return gen.Find(space, key); });
  if (!values.has_value()) return;  // Parked on a missing key.
  std::optional<Waiter> taken = waiters_.Take(id);
  done.Complete(taken->values_done, absl::StatusOr<std::vector<std::string>>(std::move(*values)));
}

void Coordination::KeySetLocked(Generation& gen, KeySpace space, const std::string& key,
                                Completions& done) {
  for (uint64_t id : gen.Waits(space).Release(key)) AdvanceKeyWaiterLocked(gen, id, done);
}

// ---- Key-value store -----------------------------------------------------------------

absl::Status Coordination::KvSet(const Caller& caller, const std::string& key, std::string value) {
  metrics_.kv_set->Increment();
  std::vector<std::pair<std::string, std::string>> entries;
  entries.emplace_back(key, std::move(value));
  return SetEntries(caller, std::move(entries));
}

absl::Status Coordination::KvMultiSet(const Caller& caller,
                                      std::vector<std::pair<std::string, std::string>> entries) {
  metrics_.kv_multi_set->Increment();
  return SetEntries(caller, std::move(entries));
}

absl::Status Coordination::SetEntries(const Caller& caller,
                                      std::vector<std::pair<std::string, std::string>> entries) {
  Completions done;
  absl::MutexLock lock(&mu_);
  auto resolved = ResolveLocked(caller, true, false);
  if (!resolved.ok()) return resolved.status();
  Generation& gen = **resolved;
  if (absl::Status s = CheckKeysPerRequest(entries.size(), options_.max_keys_per_request);
      !s.ok()) {
    return gen.Annotate(s);
  }
  std::vector<std::string> keys;
  keys.reserve(entries.size());
  for (const auto& entry : entries) keys.push_back(entry.first);
  if (absl::Status s = gen.kv.Set(std::move(entries)); !s.ok()) return gen.Annotate(s);
  for (const std::string& key : keys) KeySetLocked(gen, KeySpace::kKv, key, done);
  return absl::OkStatus();
}

void Coordination::KvGet(const Caller& caller, const std::string& key, bool wait,
                         absl::Duration timeout, Callback<std::string> callback) {
  metrics_.kv_get->Increment();
  Callback<std::vector<std::string>> adapter =
      [callback = std::move(callback)](absl::StatusOr<std::vector<std::string>> values) mutable {
        if (!values.ok()) return std::move(callback)(values.status());
        std::move(callback)(std::move(values->front()));
      };
  GetKeys(caller, {key}, wait, timeout, std::move(adapter));
}

void Coordination::KvWait(const Caller& caller, std::vector<std::string> keys,
                          absl::Duration timeout, DoneCallback callback) {
  metrics_.kv_wait->Increment();
  Callback<std::vector<std::string>> adapter =
      [callback = std::move(callback)](absl::StatusOr<std::vector<std::string>> values) mutable {
        std::move(callback)(values.status());
      };
  GetKeys(caller, std::move(keys), /*wait=*/true, timeout, std::move(adapter));
}

void Coordination::KvMultiGet(const Caller& caller, std::vector<std::string> keys, bool wait,
                              absl::Duration timeout, Callback<std::vector<std::string>> callback) {
  metrics_.kv_multi_get->Increment();
  GetKeys(caller, std::move(keys), wait, timeout, std::move(callback));
}

void Coordination::GetKeys(const Caller& caller, std::vector<std::string> keys, bool wait,
                           absl::Duration timeout, Callback<std::vector<std::string>> callback) {
  using Result = absl::StatusOr<std::vector<std::string>>;
  Completions done;
  absl::MutexLock lock(&mu_);
  auto resolved = ResolveLocked(caller, true, false);
  if (!resolved.ok()) return done.Complete(callback, Result(resolved.status()));
  Generation& gen = **resolved;
  if (absl::Status s = CheckKeysPerRequest(keys.size(), options_.max_keys_per_request); !s.ok()) {
    return done.Complete(callback, Result(gen.Annotate(s)));
  }
  if (!wait) {
    Result values = gen.kv.Get(keys);
    return done.Complete(callback,
                         values.ok() ? std::move(values) : Result(gen.Annotate(values.status())));
  }
  WaitForKeysLocked(gen, KeySpace::kKv, caller.rank, std::move(keys), timeout, std::move(callback),
                    done);
}

absl::StatusOr<int64_t> Coordination::KvAdd(const Caller& caller, const std::string& key,
                                            int64_t delta) {
  metrics_.kv_add->Increment();
  Completions done;
  absl::MutexLock lock(&mu_);
  auto resolved = ResolveLocked(caller, true, false);
  if (!resolved.ok()) return resolved.status();
  Generation& gen = **resolved;
  absl::StatusOr<int64_t> sum = gen.kv.Add(key, delta);
  if (!sum.ok()) return gen.Annotate(sum.status());
  KeySetLocked(gen, KeySpace::kKv, key, done);
  return sum;
}

absl::StatusOr<CompareSetResult> Coordination::KvCompareSet(const Caller& caller,
                                                            const std::string& key,
                                                            std::optional<std::string> expected,
                                                            std::string desired) {
  metrics_.kv_compare_set->Increment();
  Completions done;
  absl::MutexLock lock(&mu_);
  auto resolved = ResolveLocked(caller, true, false);
  if (!resolved.ok()) return resolved.status();
  Generation& gen = **resolved;
  absl::StatusOr<CompareSetResult> result = gen.kv.CompareSet(key, expected, std::move(desired));
  if (!result.ok()) return gen.Annotate(result.status());
  if (result->swapped) KeySetLocked(gen, KeySpace::kKv, key, done);
  return result;
}

absl::StatusOr<int64_t> Coordination::KvDelete(const Caller& caller, const std::string& key,
                                               bool prefix) {
  metrics_.kv_delete->Increment();
  absl::MutexLock lock(&mu_);
  auto resolved = ResolveLocked(caller, true, false);
  if (!resolved.ok()) return resolved.status();
  return (**resolved).kv.Delete(key, prefix);
}

absl::StatusOr<KvListResult> Coordination::KvList(const Caller& caller, const std::string& prefix,
                                                  const std::string& start_after, int limit) {
  metrics_.kv_list->Increment();
  const absl::StatusOr<int> page = KvTable::ListLimit(limit);
  if (!page.ok()) return page.status();
  absl::MutexLock lock(&mu_);
  auto resolved = ResolveLocked(caller, true, false);
  if (!resolved.ok()) return resolved.status();
  return (**resolved).kv.List(prefix, start_after, *page);
}

absl::StatusOr<KvStats> Coordination::KvNumKeys(const Caller& caller) {
  absl::MutexLock lock(&mu_);
  auto resolved = ResolveLocked(caller, true, false);
  if (!resolved.ok()) return resolved.status();
  return (**resolved).kv.Stats();
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

// ---- Unique IDs --------------------------------------------------------------------

absl::Status Coordination::PublishUniqueIds(const Caller& caller,
                                            std::vector<std::pair<std::string, std::string>> ids) {
  Completions done;
  absl::MutexLock lock(&mu_);
  auto resolved = ResolveLocked(caller, true, false);
  if (!resolved.ok()) return resolved.status();
  Generation& gen = **resolved;
  if (absl::Status s = CheckKeysPerRequest(ids.size(), options_.max_keys_per_request); !s.ok()) {
    return gen.Annotate(s);
  }
  absl::StatusOr<std::vector<std::string>> added = gen.ids.Publish(std::move(ids));
  if (!added.ok()) return gen.Annotate(added.status());
  metrics_.unique_ids->Increment(static_cast<double>(added->size()));
  for (const std::string& key : *added) KeySetLocked(gen, KeySpace::kUniqueIds, key, done);
  return absl::OkStatus();
}

void Coordination::GetUniqueIds(const Caller& caller, std::vector<std::string> keys,
                                absl::Duration timeout,
                                Callback<std::vector<std::string>> callback) {
  Completions done;
  absl::MutexLock lock(&mu_);
  auto resolved = ResolveLocked(caller, true, false);
  if (!resolved.ok()) {
    return done.Complete(callback, absl::StatusOr<std::vector<std::string>>(resolved.status()));
  }
  if (absl::Status s = CheckKeysPerRequest(keys.size(), options_.max_keys_per_request); !s.ok()) {
    return done.Complete(callback,
                         absl::StatusOr<std::vector<std::string>>((*resolved)->Annotate(s)));
  }
  WaitForKeysLocked(**resolved, KeySpace::kUniqueIds, caller.rank, std::move(keys), timeout,
                    std::move(callback), done);
}

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
