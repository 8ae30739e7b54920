// Coordination: the worker-facing state of the coordinator — jobs and their
// generations, rendezvous (Join), the key-value store, barriers, the NCCL
// unique-ID broker, liveness and error propagation.
//
// Plain C++: no gRPC types. Time comes from an injected Clock, and time-based
// work (deadlines, heartbeat timeouts) happens in Tick(), which the server
// calls every TickInterval() and tests call after advancing a FakeClock.
//
// Waiting operations never block a thread. They take a callback that runs
// exactly once: with the result, or with an error when the wait's deadline
// passes (DEADLINE_EXCEEDED), the generation fails (ABORTED, naming the
// culprit) or is superseded (ABORTED), or the service shuts down
// (UNAVAILABLE). A callback runs on the thread of whichever call completes it
// (possibly the calling thread, before the call returns), never under an
// internal lock, so it may call back into Coordination; it must not block.
//
// Scope and fencing: every worker operation names a Caller (job, generation,
// rank, incarnation). Errors common to all worker operations:
//   UNAVAILABLE          the service is shut down.
//   NOT_FOUND            unknown job.
//   INVALID_ARGUMENT     rank outside [0, world_size).
//   ABORTED              generation older than the job's current one; an
//                        incarnation other than the one that holds that
//                        rank (a newer process replaced this one; Join
//                        excepted); or the generation has failed (the message
//                        names the failed rank, its host and the reason),
//                        also once the job has moved to its next generation
//                        or been removed (the last 4096 removed jobs whose
//                        final generation failed are remembered for this).
//   FAILED_PRECONDITION  generation newer than the job's current one; or (for
//                        everything but Join) the rank has not joined.
// Every error message starts with "job <id> generation <n>: " once the
// caller has resolved to a generation.
//
// Generation lifecycle:
//
//   ACTIVE ──rank dies / ReportError──▶ FAILED ──BumpGeneration──▶ (next ACTIVE)
//     └─────────────────BumpGeneration──────────────────────────▶ (next ACTIVE)
//
// In-place recovery (JobLayout::in_place, membership.cc): once the world
// has formed, a rank that dies (missed heartbeats, ReportError, RankExited,
// a new process joining as it) does not fail the generation. It is *lost*:
// the membership moves to its next epoch, the rank's own waits end with
// ABORTED naming why, barriers still waiting for it fail with ABORTED for
// every participant, and its later calls are refused. A new process (another
// incarnation) may Join as the rank again: it is back at once, in the next
// epoch. A hang still fails the generation. AliveRanks gives every live rank
// the same view of who is alive.
//
// Rendezvous state, keys, barriers and IDs live in memory and belong to one
// generation: a new generation starts empty, and nothing survives a
// coordinator restart.
//
// Structure: each concept is a class of its own, none of them thread-safe,
// all owned per generation and guarded by the one mutex here:
//   job_layout.h       JobLayout and its validation
//   rendezvous.h       Rendezvous: who joined, the node topology
//   liveness.h         LivenessTracker: heartbeats, the first dead rank
//   kv_table.h         KvTable: keys, values, limits and quotas
//   barrier_table.h    BarrierTable: named barriers, their participants
//   unique_id_table.h  UniqueIdTable: published NCCL unique IDs
//   key_waits.h        KeyWaitIndex: waits for lists of keys, in any table
//   waiter_registry.h  WaiterRegistry: every pending wait, its deadline
// Coordination itself does fencing (ResolveLocked), turns the classes'
// results into callbacks, and runs those after unlocking. Its definitions
// are split by concern, as the sections below name: coordination.cc (core,
// jobs, fencing), coordination_rendezvous.cc, coordination_kv.cc,
// coordination_liveness.cc and membership.cc; the private records are in
// coordination_internal.h.
//
// Metrics (docs/metrics.md, "Coordinator"): KV calls by op, rendezvous
// durations, barrier waits and timeouts, unique IDs published are recorded
// as they happen; the KV key/byte totals and pending waits are gauges
// sampled by Tick() about once a second (of the injected clock), so no
// call pays for summing them.
//
// Thread safety: all methods are thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "coordinator/hang_detector.h"  // GroupProgressReport
#include "coordinator/job_layout.h"     // JobLayout
#include "coordinator/kv_table.h"       // KvLimits, CompareSetResult, KvListResult, KvStats
#include "coordinator/rendezvous.h"     // DeviceInfo, RankDescription
#include "coordinator/server_lag.h"
#include "coordinator/waiter_registry.h"

namespace mesh::coordinator {

struct CoordinationOptions {
  // Ranks heartbeat this often; a rank silent for longer than the timeout is
  // declared dead and fails its generation.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration heartbeat_timeout = absl::Seconds(10);
  // Large jobs heartbeat less often, so that their heartbeats alone cannot
  // saturate the coordinator: a job's ranks are told an interval long enough
  // that they send at most this many heartbeats a second in all (world size
  // / rate), never shorter than heartbeat_interval and never longer than a
  // third of heartbeat_timeout (RankHeartbeatInterval). The timeout, and so
  // how soon a silent rank is declared dead, does not change. 0 tells every
  // job heartbeat_interval.
  double rank_heartbeat_rate = 8192;
  // Wait used when a request gives no timeout, and the cap on any wait.
  absl::Duration default_wait = absl::Minutes(5);
  absl::Duration max_wait = absl::Hours(1);
  KvLimits kv;
  // Per generation: barriers created (a finished one still counts, as its
  // result is kept for late callers) and unique IDs published. Barrier names
  // follow the KV key rules (kv.max_key_bytes). RESOURCE_EXHAUSTED beyond.
  int64_t max_barriers = 100'000;
  int64_t max_unique_ids = 100'000;
  // Keys (or entries) in one KvWait, KvMultiGet, KvMultiSet, GetUniqueIds or
  // PublishUniqueIds request: each parks or checks that many keys under the
  // one mutex. INVALID_ARGUMENT beyond: the request can never succeed.
  int64_t max_keys_per_request = 100'000;
};

// Possible errors of Validate: INVALID_ARGUMENT naming the bad field.
absl::Status ValidateOptions(const CoordinationOptions& options);

// The heartbeat interval a job of `world_size` ranks is told in its Join
// replies (see CoordinationOptions::rank_heartbeat_rate): 1 s up to 8192
// ranks with the defaults, 2 s at 16384, and 3.33 s (a third of the 10 s
// timeout) from 27307 ranks on.
absl::Duration RankHeartbeatInterval(const CoordinationOptions& options, int world_size);

// A rank lost or back in a generation with in-place recovery, and the
// membership epoch that began with it.
struct MembershipEvent {
  int64_t epoch = 0;
  absl::Time time;
  int rank = 0;
  bool lost = false;         // Else: a new process joined as the rank.
  uint64_t incarnation = 0;  // When back: the new process's.
  std::string reason;        // When lost: why.
};

struct JobInfo {
  JobLayout layout;  // Normalized: shape and names filled in.
  int64_t generation = 0;
  bool failed = false;  // The current generation has failed.
  // In-place recovery: the current generation's membership epoch and its
  // changes, oldest first (the latest kMaxMembershipEvents).
  int64_t membership_epoch = 0;
  std::vector<MembershipEvent> membership;
};

// The membership changes a generation keeps for GetJob.
inline constexpr size_t kMaxMembershipEvents = 1000;

// Identity of a worker process; see RankContext in worker.proto.
struct Caller {
  std::string job_id;
  int64_t generation = 0;
  int rank = 0;
  uint64_t incarnation = 0;
};

struct JoinArgs {
  Caller caller;
  std::string host;
  DeviceInfo device;
  // Rank 0 only, optional: 128 bytes.
  std::string nccl_unique_id;
  // <= 0 means CoordinationOptions::default_wait.
  absl::Duration timeout = absl::ZeroDuration();
};

struct JoinResult {
  int rank = 0;
  int world_size = 0;
  int local_rank = 0;
  int local_world_size = 0;
  int node_rank = 0;
  int num_nodes = 0;
  std::vector<int64_t> mesh_shape;
  std::vector<std::string> mesh_dim_names;
  int64_t generation = 0;
  std::string nccl_unique_id;
  absl::Duration heartbeat_interval;
  absl::Duration heartbeat_timeout;
  // The membership epoch (in-place recovery; 0 otherwise).
  int64_t membership_epoch = 0;
  bool in_place = false;
  std::string in_place_dim;
};

// Why a generation failed.
struct JobError {
  int rank = -1;  // -1 when the cause is not a rank.
  std::string host;
  std::string reason;
  int64_t generation = 0;
  // "job j1 generation 0: rank 3 (host-b) failed: missed heartbeats ..."
  std::string message;
  // A diagnosed hang (hang_detector.h): `rank` never entered the collective
  // its peers wait in; `reason` is the diagnosis.
  bool hang = false;
};

// What a heartbeat returns.
struct HeartbeatReply {
  // The generation's error once it has failed.
  std::optional<JobError> error;
  // The caller reported a group whose members the coordinator lacks; it
  // should send members with every group next time.
  bool send_members = false;
  // In-place recovery: the membership epoch, and every rank lost so far
  // that has not come back, ascending by rank.
  int64_t membership_epoch = 0;
  std::vector<JobError> lost;
};

// One live rank, as AliveRanks reports it.
struct AliveRank {
  int rank = 0;
  uint64_t incarnation = 0;

  friend bool operator==(const AliveRank&, const AliveRank&) = default;
};

// What one AliveRanks round gives every caller alike.
struct AliveSet {
  int64_t round = 0;             // 1, 2, ... per generation.
  int64_t membership_epoch = 0;  // When the round completed.
  std::vector<AliveRank> ranks;  // Ascending by rank.
};

template <typename T>
using Callback = absl::AnyInvocable<void(absl::StatusOr<T>) &&>;
using DoneCallback = absl::AnyInvocable<void(absl::Status) &&>;

// Called once: with the JobError when the watched generation fails, or with
// UNAVAILABLE on shutdown, or ABORTED when the generation is superseded.
using WatchCallback = absl::AnyInvocable<void(absl::StatusOr<JobError>) &&>;

// Told of every generation that fails (a rank's missed heartbeats, a
// ReportError), once per generation, after the lock is released.
using FailureListener = std::function<void(const std::string& job_id, const JobError& error)>;

class Coordination {
 public:
  // `clock` must outlive this object. `options` must pass ValidateOptions
  // (checked: a bad value is a programmer error). `metrics` (null: record
  // nothing) must outlive this object.
  Coordination(const Clock* clock, CoordinationOptions options,
               metrics::Registry* metrics = nullptr);
  ~Coordination();

  Coordination(const Coordination&) = delete;
  Coordination& operator=(const Coordination&) = delete;

  const CoordinationOptions& options() const { return options_; }

  // ---- Jobs (coordination.cc) ---------------------------------------------

  // Creates a job at `generation` (0 for a new job; the stored generation
  // when a restarted coordinator re-creates a job that was running).
  // Errors: INVALID_ARGUMENT (bad id, world size, shape or names, negative
  // generation), ALREADY_EXISTS (id in use), UNAVAILABLE (shut down).
  absl::StatusOr<JobInfo> CreateJob(JobLayout layout, int64_t generation = 0);

  // After a restart or failover of the coordinator (JobManager::Recover):
  // the ranks of `job_id` at `generation` may have formed their world with
  // the previous coordinator and be running past rendezvous, which this one
  // does not remember. Each such rank is re-attached by its first call (a
  // heartbeat, a KV call, ...) instead of being refused as "has not
  // joined": it joins with the incarnation it calls with, on host
  // hosts[rank], and once every rank is back the world counts as formed
  // (liveness starts). A process that calls Join is a new one and joins as
  // usual. Re-attached ranks have no device description. Errors: NOT_FOUND;
  // INVALID_ARGUMENT (not one host per rank, or an empty one);
  // FAILED_PRECONDITION (the job is at another generation).
  absl::Status AllowReattach(const std::string& job_id, int64_t generation,
                             std::vector<std::string> hosts);

  // Forgets a job whose workers are done (it ended, or will be re-created
  // with another layout). Every pending wait and watch of its current
  // generation ends with ABORTED naming `reason`, and later calls for it get
  // NOT_FOUND. Errors: NOT_FOUND.
  absl::Status RemoveJob(const std::string& job_id, const std::string& reason);

  // Registers the one FailureListener (replacing any earlier one). It runs on
  // the thread that detected the failure (Tick, a ReportError call), with no
  // lock held; it may call back into Coordination.
  void SetFailureListener(FailureListener listener);

  // Errors: NOT_FOUND.
  absl::StatusOr<JobInfo> GetJob(const std::string& job_id) const;

  // Moves the job to its next generation, which starts empty. Every pending
  // wait and watch of the old generation ends with ABORTED naming `reason`.
  // Returns the new generation. Errors: NOT_FOUND, UNAVAILABLE.
  absl::StatusOr<int64_t> BumpGeneration(const std::string& job_id, const std::string& reason);

  // ---- Rendezvous (coordination_rendezvous.cc) ---------------------------

  // Registers the caller and completes once the whole world of the
  // generation has joined. Re-joining with the same incarnation is
  // idempotent (it waits again, or completes at once when the world is
  // complete). A different incarnation of a joined rank is a restarted
  // process, and it wins (SupersedeLocked): before the world is complete it
  // takes the rank and the older process's waits end with ABORTED; after,
  // the generation fails naming the rank, and this Join gets that ABORTED
  // (with in-place recovery, the older process is lost instead and this
  // Join completes at once, in the next membership epoch; so does a new
  // process joining as a lost rank, while the lost process itself gets
  // ABORTED).
  // Extra errors: INVALID_ARGUMENT for an empty host or a unique ID that is not 128
  // bytes or comes from a rank other than 0; DEADLINE_EXCEEDED with k/n
  // joined and the missing ranks.
  void Join(JoinArgs args, Callback<JoinResult> done);

  // Host, node and device of joined ranks, in the order given (at most 4096).
  // Extra errors: INVALID_ARGUMENT (bad rank, too many), FAILED_PRECONDITION
  // (a rank has not joined).
  absl::StatusOr<std::vector<RankDescription>> DescribeRanks(const Caller& caller,
                                                             const std::vector<int>& ranks);

  // ---- Key-value store, scoped to (job, generation) (coordination_kv.cc) ---
  // Keys and limits as in kv_table.h: an empty key (an empty prefix is
  // fine) is INVALID_ARGUMENT; a limit (key or value size, key count, total
  // bytes) is RESOURCE_EXHAUSTED and leaves stored data unchanged. A
  // KvWait, KvMultiGet or KvMultiSet naming more than max_keys_per_request
  // keys is INVALID_ARGUMENT, and nothing is stored or parked.

  absl::Status KvSet(const Caller& caller, const std::string& key, std::string value);
  // wait=false: NOT_FOUND at once when absent. wait=true: waits for the key.
  void KvGet(const Caller& caller, const std::string& key, bool wait, absl::Duration timeout,
             Callback<std::string> done);
  // Atomic add to a decimal int64 value (absent = 0); returns the new value.
  // Extra errors: INVALID_ARGUMENT when the value is not a decimal int64, or
  // the sum overflows.
  absl::StatusOr<int64_t> KvAdd(const Caller& caller, const std::string& key, int64_t delta);
  // Stores `desired` if the key holds `expected` (nullopt: if it is absent).
  // A `desired` over the value size limit fails whether or not it matches.
  absl::StatusOr<CompareSetResult> KvCompareSet(const Caller& caller, const std::string& key,
                                                std::optional<std::string> expected,
                                                std::string desired);
  // Deletes the key, or every key with the prefix; returns how many.
  absl::StatusOr<int64_t> KvDelete(const Caller& caller, const std::string& key, bool prefix);
  // Keys with `prefix` greater than `start_after`, sorted; at most `limit`
  // (1..10000; 0 means 1000).
  absl::StatusOr<KvListResult> KvList(const Caller& caller, const std::string& prefix,
                                      const std::string& start_after, int limit);
  absl::StatusOr<KvStats> KvNumKeys(const Caller& caller);
  // Completes once every key is set.
  void KvWait(const Caller& caller, std::vector<std::string> keys, absl::Duration timeout,
              DoneCallback done);
  // Values in key order; wait as in KvGet.
  void KvMultiGet(const Caller& caller, std::vector<std::string> keys, bool wait,
                  absl::Duration timeout, Callback<std::vector<std::string>> done);
  // All or nothing.
  absl::Status KvMultiSet(const Caller& caller,
                          std::vector<std::pair<std::string, std::string>> entries);

  // ---- Barriers (coordination_rendezvous.cc) -------------------------------

  // Completes, for every participant alike, once all of `ranks` (empty: the
  // world) have arrived; the result is the participant count. The first
  // caller's timeout sets the deadline. A completed barrier's result is
  // cached for late callers. Extra errors: INVALID_ARGUMENT (a participant
  // set that differs from the first caller's, fails the barrier for all; a
  // caller outside the set; bad ranks); DEADLINE_EXCEEDED naming k/n arrived
  // and the missing ranks with their hosts; ABORTED at once when the
  // generation fails; FAILED_PRECONDITION when a participant that has not
  // arrived leaves cleanly; RESOURCE_EXHAUSTED for a name over
  // kv.max_key_bytes, or a new barrier beyond max_barriers.
  void Barrier(const Caller& caller, const std::string& name, std::vector<int> ranks,
               absl::Duration timeout, Callback<int> done);

  // ---- NCCL unique-ID broker (coordination_kv.cc) ----------------------------

  // Publishes 128-byte IDs under group keys, all or none. Same bytes again:
  // no-op. Keys follow the KV key rules. Extra errors: INVALID_ARGUMENT
  // (size; more than max_keys_per_request IDs), ALREADY_EXISTS (different
  // bytes than published, or than given for the same key in this call),
  // RESOURCE_EXHAUSTED (the generation would hold more than max_unique_ids).
  absl::Status PublishUniqueIds(const Caller& caller,
                                std::vector<std::pair<std::string, std::string>> ids);
  // Completes with the IDs, in key order, once all are published. The same
  // wait as KvMultiGet's, over the ID table: DEADLINE_EXCEEDED names the IDs
  // nobody published; INVALID_ARGUMENT for more than max_keys_per_request.
  void GetUniqueIds(const Caller& caller, std::vector<std::string> keys, absl::Duration timeout,
                    Callback<std::vector<std::string>> done);

  // ---- Liveness and errors (coordination_liveness.cc) ------------------------

  // Records that the caller is alive. Returns the generation's JobError when
  // it has failed (the call itself succeeds then).
  absl::StatusOr<std::optional<JobError>> Heartbeat(const Caller& caller);
  // The same, with the caller's collective progress for hang diagnosis
  // (hang_detector.h). When a rank has waited for the job's hang_timeout in
  // a collective that another member of its group has not entered, Tick
  // fails the generation naming that member (JobError::hang). Extra errors:
  // INVALID_ARGUMENT for more than HangDetector::kMaxGroupsPerReport groups.
  absl::StatusOr<HeartbeatReply> Heartbeat(const Caller& caller,
                                           const std::vector<GroupProgressReport>& groups);

  // Fails the caller's generation, naming the caller and `reason` (with
  // in-place recovery, once the world has formed: the caller is lost
  // instead). A no-op when the generation has already failed.
  absl::Status ReportError(const Caller& caller, const std::string& reason);

  // An agreement on who is alive, like a barrier among the live ranks:
  // completes, for every caller of the round alike, once every rank that has
  // joined and is neither lost nor gone (Leave) has called. A rank lost or
  // gone during the round is no longer waited for, and is not in the
  // result, so every caller gets the same set even when ranks die during
  // the call. A rank that calls again before the round completes replaces
  // its earlier call (which ends with ABORTED). Without in-place recovery
  // a death fails the generation, and the round with it.
  // Extra errors: FAILED_PRECONDITION before the world has formed;
  // DEADLINE_EXCEEDED naming k/n live ranks arrived and the missing ones
  // (the caller leaves the round); ABORTED when the generation fails or the
  // caller is lost.
  void AliveRanks(const Caller& caller, absl::Duration timeout, Callback<AliveSet> done);

  // Clean exit of a rank: it is no longer expected to heartbeat. Barriers
  // still waiting for it fail with FAILED_PRECONDITION; an AliveRanks round
  // no longer waits for it.
  absl::Status Leave(const Caller& caller);

  // The agent saw `rank` of `job_id` at `generation` exit while its job was
  // still running (exit code 0 included), and `reason` says how ("exited
  // with code 0 before the job finished"). A rank that left cleanly (Leave),
  // or one of a generation nobody has joined (a worker that does not use
  // rendezvous), is no concern here: a no-op. Otherwise the rank will never
  // arrive anywhere again:
  //   - if any other rank of the generation is waiting (in Join, a barrier, a
  //     key or unique-ID wait), the generation fails at once, naming the rank,
  //     its host and `reason`, so those waits end with ABORTED now instead of
  //     at their deadlines;
  //   - else the generation is left running (the peers may be finishing and
  //     need nothing more from it) until a rank parks a wait that does not
  //     complete at once (Join, a barrier, a key or ID wait): then it fails
  //     the same way. If the rank's missed heartbeats come first, `reason`
  //     is the cause named, not the silence.
  // With in-place recovery, once the world has formed, the rank is lost at
  // once instead.
  // Not from a worker: no fencing by incarnation. A generation other than the
  // current one, an unknown job, or a failed generation: a no-op (the
  // report is late). Errors: INVALID_ARGUMENT (rank outside the world).
  absl::Status RankExited(const std::string& job_id, int64_t generation, int rank,
                          const std::string& reason);

  // For the job manager's in-place recovery: like RankExited, but only for
  // a job whose layout is in_place, at `generation`, after its world has
  // formed and while it has not failed. Then `rank` is lost (unless it
  // already is: a ReportError or missed heartbeats may have come first) and
  // the result is true: the caller may start a new process as the rank.
  // Otherwise nothing changes and the result is false (the caller fails the
  // generation as for any exit). A rank that left (Leave) is false too.
  // Errors: INVALID_ARGUMENT (rank outside the world).
  absl::StatusOr<bool> LoseRankInPlace(const std::string& job_id, int64_t generation, int rank,
                                       const std::string& reason);

  // Subscribes to the caller's generation. `done` runs once (see
  // WatchCallback); at once if the generation has already failed. Returns a
  // handle for Unwatch. Errors: as for every worker operation, except that a
  // failed generation is delivered through `done`, not returned.
  absl::StatusOr<uint64_t> Watch(const Caller& caller, WatchCallback done);

  // Drops a subscription whose callback has not run; then it never runs.
  // Returns whether it was dropped.
  bool Unwatch(uint64_t handle);

  // ---- Time and shutdown (coordination_liveness.cc) --------------------------

  // Expires waits whose deadline has passed and declares silent ranks dead:
  // silent for longer than heartbeat_timeout plus the server's grace
  // (SetServerLag), which never exceeds another heartbeat_timeout.
  void Tick();

  // Liveness allows for the coordinator's own delays (server_lag.h): `lag`
  // (not owned; must outlive this object, or be null: no grace) gives the
  // grace added to the heartbeat timeout.
  void SetServerLag(const ServerLag* lag);
  // The coordinator stalled for `stall`: it does not count towards any
  // rank's silence (LivenessTracker::ForgiveStall).
  void ForgiveStall(absl::Duration stall);
  // How often Tick should run for deadlines to be honored promptly.
  absl::Duration TickInterval() const;

  // Ends every pending wait and watch with UNAVAILABLE; later calls fail
  // with UNAVAILABLE. Idempotent.
  void Shutdown();

  // Waits and watches currently pending (for metrics and tests).
  size_t PendingWaits() const;

 private:
  struct Job;
  struct Generation;
  // The families of docs/metrics.md this class records; children resolved
  // once, so recording is one virtual call.
  struct Metrics {
    explicit Metrics(metrics::Registry& registry);
    metrics::Family<metrics::Counter>* kv_operations;
    metrics::Counter* kv_set;
    metrics::Counter* kv_get;
    metrics::Counter* kv_add;
    metrics::Counter* kv_compare_set;
    metrics::Counter* kv_delete;
    metrics::Counter* kv_list;
    metrics::Counter* kv_wait;
    metrics::Counter* kv_multi_get;
    metrics::Counter* kv_multi_set;
    metrics::Gauge* kv_keys;
    metrics::Gauge* kv_bytes;
    metrics::Histogram* rendezvous_duration;
    metrics::Histogram* barrier_wait;
    metrics::Counter* barrier_timeouts;
    metrics::Counter* unique_ids;
    metrics::Gauge* pending_waits;
    metrics::Counter* hangs;
    metrics::Counter* ranks_lost;
    metrics::Counter* ranks_returned;
  };
  struct Waiter;
  class Completions;
  // The tables a key wait can wait on.
  enum class KeySpace { kKv, kUniqueIds };

  // Resolves caller to its live generation, applying every fencing rule.
  // `require_joined`: the rank must have joined with this incarnation.
  // `allow_failed`: a failed generation resolves instead of giving ABORTED.
  // `check_incarnation`: a joined rank held by another incarnation gives
  // ABORTED (Join handles a newer process itself, see SupersedeLocked).
  // Re-attaches `caller` to `gen` (AllowReattach) when it may; whether it
  // did.
  bool ReattachLocked(Generation& gen, const Caller& caller) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Generation*> ResolveLocked(const Caller& caller, bool require_joined,
                                            bool allow_failed, bool check_incarnation = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A Join of `caller.rank` by a process other than the one that joined as
  // it: the newer process takes the rank. Before the world is complete the
  // older one's pending waits end with ABORTED and its join is forgotten;
  // after, the generation fails naming the rank (its peers' communicators
  // hold the older process), or with in-place recovery the older process
  // is lost and the newer one, on `host` with `device`, is back. Returns the
  // status the Join gets: OK to go on joining, or ABORTED.
  absl::Status SupersedeLocked(Generation& gen, const Caller& caller, const std::string& host,
                               const DeviceInfo& device, Completions& done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Duration ClampTimeout(absl::Duration timeout) const;
  // KvMultiSet and KvMultiGet without counting the call (KvSet, KvGet and
  // KvWait count as themselves).
  absl::Status SetEntries(const Caller& caller,
                          std::vector<std::pair<std::string, std::string>> entries);
  void GetKeys(const Caller& caller, std::vector<std::string> keys, bool wait,
               absl::Duration timeout, Callback<std::vector<std::string>> done);
  // Samples the gauges (KV totals, pending waits).
  void UpdateGaugesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ---- In-place recovery and AliveRanks (membership.cc; the exit-report
  // helpers ExitReportTargetLocked and LoseExitedRankLocked:
  // coordination_liveness.cc) ----
  // A rank failed (error.rank >= 0): with in-place recovery and a formed
  // world it is lost, else the generation fails.
  void RankFailedLocked(Generation& gen, JobError error, Completions& done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // For RankExited and LoseRankInPlace: the current generation of `job_id`
  // when it is `generation` and has not failed, else null (a late report).
  // INVALID_ARGUMENT for a rank outside its world.
  absl::StatusOr<Generation*> ExitReportTargetLocked(const std::string& job_id, int64_t generation,
                                                     int rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Loses `rank`, whose process exited as `reason` says (empty: "exited
  // before the job finished"), in place.
  void LoseExitedRankLocked(Generation& gen, int rank, const std::string& reason, Completions& done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends to gen.membership, dropping the oldest beyond the cap.
  void RecordMembershipLocked(Generation& gen, MembershipEvent event)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LoseRankLocked(Generation& gen, JobError error, Completions& done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A new process joined as `rank`, which was lost: it is back.
  void ReadmitLocked(Generation& gen, int rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends `rank`'s call in the AliveRanks round, if any, with `status`.
  void WithdrawAliveLocked(Generation& gen, int rank, const absl::Status& status, Completions& done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Completes the round once every live rank has called.
  void MaybeCompleteAliveRoundLocked(Generation& gen, Completions& done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Live ranks that have not called in this round, ascending.
  std::vector<int> AliveMissingLocked(const Generation& gen) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::unique_ptr<Generation> NewGenerationLocked(const Job& job, int64_t number)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Registers a wait of `gen` that expires once `deadline` has passed.
  uint64_t AddWaiterLocked(Generation& gen, absl::Time deadline, Waiter waiter)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Generations end: every pending wait of `gen` gets `status`, except that
  // watches get `*error` when it is given.
  void EndGenerationLocked(Generation& gen, const absl::Status& status, const JobError* error,
                           Completions& done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailGenerationLocked(Generation& gen, JobError error, Completions& done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A rank of `gen` exited without leaving (RankExited) and a wait has just
  // been parked, or is parked: fails `gen` naming the lowest such rank.
  void FailIfRankExitedLocked(Generation& gen, Completions& done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void CompleteJoinLocked(Generation& gen, Completions& done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  JoinResult JoinResultLocked(const Generation& gen, int rank) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The one code path for "complete once these keys of `space` are set".
  void WaitForKeysLocked(Generation& gen, KeySpace space, int rank, std::vector<std::string> keys,
                         absl::Duration timeout, Callback<std::vector<std::string>> callback,
                         Completions& done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AdvanceKeyWaiterLocked(Generation& gen, uint64_t waiter_id, Completions& done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `key` of `space` was just set: wakes the waiters parked on it.
  void KeySetLocked(Generation& gen, KeySpace space, const std::string& key, Completions& done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void FinishBarrierLocked(Generation& gen, const std::string& name, const absl::Status& status,
                           Completions& done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Ends `waiter` (taken from waiters_ as `id`) whose deadline passed.
  void ExpireLocked(uint64_t id, Waiter waiter, Completions& done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CheckLivenessLocked(absl::Time now, Completions& done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CheckHangsLocked(absl::Time now, Completions& done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Clock* const clock_;
  const CoordinationOptions options_;
  const Metrics metrics_;

  mutable absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  FailureListener failure_listener_ ABSL_GUARDED_BY(mu_);
  uint64_t next_job_number_ ABSL_GUARDED_BY(mu_) = 1;
  // Every pending wait and watch of every job; scoped by generation. Empty
  // once Shutdown has run, so its destruction after jobs_ (reverse order of
  // declaration) ends nothing; a Waiter points into its generation.
  WaiterRegistry<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::unique_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  // The failure of removed jobs whose last generation had failed, for late
  // callers of that generation (ABORTED with the failure, not NOT_FOUND);
  // the most recent kMaxFailedRemoved jobs, oldest first in the deque.
  static constexpr size_t kMaxFailedRemoved = 4096;
  absl::flat_hash_map<std::string, JobError> failed_removed_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> failed_removed_order_ ABSL_GUARDED_BY(mu_);
  absl::Time next_liveness_check_ ABSL_GUARDED_BY(mu_);
  const ServerLag* server_lag_ ABSL_GUARDED_BY(mu_) = nullptr;
  // Whether the last liveness check held back a death for the grace alone
  // (logged once per episode).
  bool grace_held_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time next_hang_check_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time next_gauge_update_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace mesh::coordinator
