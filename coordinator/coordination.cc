#include "coordinator/coordination.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"

namespace mesh::coordinator {
namespace {

constexpr size_t kUniqueIdBytes = 128;
constexpr int kMaxWorldSize = 1 << 20;
constexpr size_t kMaxDescribeRanks = 4096;
constexpr int kMaxListLimit = 10000;
constexpr int kDefaultListLimit = 1000;
// Missing ranks named in one error message; the rest are counted.
constexpr size_t kMaxNamedRanks = 16;
constexpr absl::Duration kTickInterval = absl::Milliseconds(10);

bool ValidJobId(const std::string& id) {
  if (id.empty() || id.size() > 128) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

std::string Seconds(absl::Duration d) { return absl::StrCat(absl::ToDoubleSeconds(d), "s"); }

std::string QuoteKeys(const std::vector<std::string>& keys) {
  std::vector<std::string> quoted;
  for (size_t i = 0; i < keys.size() && i < kMaxNamedRanks; ++i) {
    quoted.push_back(absl::StrCat("'", keys[i], "'"));
  }
  std::string text = absl::StrJoin(quoted, ", ");
  if (keys.size() > kMaxNamedRanks) {
    absl::StrAppend(&text, " and ", keys.size() - kMaxNamedRanks, " more");
  }
  return text;
}

enum class WaitKind { kJoin, kKvGet, kKvWait, kKvMultiGet, kBarrier, kUniqueIds };

}  // namespace

// Callbacks collected under the lock and run after it is released, so that
// a callback may call back into Coordination. Declare before the MutexLock
// so that destruction order runs them after unlock.
class Coordination::Completions {
 public:
  Completions() = default;
  Completions(const Completions&) = delete;
  ~Completions() { Run(); }

  void Add(absl::AnyInvocable<void() &&> fn) { fns_.push_back(std::move(fn)); }

  template <typename T>
  void Complete(Callback<T>& cb, absl::StatusOr<T> result) {
    Add([cb = std::move(cb), result = std::move(result)]() mutable {
      std::move(cb)(std::move(result));
    });
  }
  void Complete(DoneCallback& cb, absl::Status status) {
    Add([cb = std::move(cb), status = std::move(status)]() mutable {
      std::move(cb)(std::move(status));
    });
  }

  void Run() {
    // Callbacks may add nothing here (they run unlocked and use their own
    // Completions), so one pass is enough.
    std::vector<absl::AnyInvocable<void()&&>> fns = std::move(fns_);
    fns_.clear();
    for (auto& fn : fns) std::move(fn)();
  }

 private:
  std::vector<absl::AnyInvocable<void() &&>> fns_;
};

struct Coordination::Waiter {
  WaitKind kind = WaitKind::kJoin;
  int rank = 0;
  absl::Time deadline;
  absl::Duration timeout;
  std::vector<std::string> keys;  // KV and unique-ID waits.
  std::string barrier;            // Barrier waits.
  Callback<JoinResult> join_done;
  Callback<std::string> get_done;
  DoneCallback wait_done;
  Callback<std::vector<std::string>> values_done;
  Callback<int> barrier_done;

  void Fail(const absl::Status& status, Completions& done) {
    switch (kind) {
      case WaitKind::kJoin:
        done.Complete(join_done, absl::StatusOr<JoinResult>(status));
        break;
      case WaitKind::kKvGet:
        done.Complete(get_done, absl::StatusOr<std::string>(status));
        break;
      case WaitKind::kKvWait:
        done.Complete(wait_done, status);
        break;
      case WaitKind::kKvMultiGet:
      case WaitKind::kUniqueIds:
        done.Complete(values_done, absl::StatusOr<std::vector<std::string>>(status));
        break;
      case WaitKind::kBarrier:
        done.Complete(barrier_done, absl::StatusOr<int>(status));
        break;
    }
  }
};

namespace {

struct Member {
  bool joined = false;
  bool left = false;
  uint64_t incarnation = 0;
  std::string host;
  DeviceInfo device;
  absl::Time last_seen;
  int node_rank = 0;
  int local_rank = 0;
  int local_world_size = 0;
};

// Keys and their waiters. A waiter is registered on one missing key at a
// time; when that key is set it is re-checked and moves on to the next
// missing key, so a wait on k keys costs O(k) in total.
struct KeyTable {
  std::map<std::string, std::string> data;
  int64_t total_bytes = 0;
  absl::flat_hash_map<std::string, std::vector<uint64_t>> waiters;

  const std::string* Find(const std::string& key) const {
    auto it = data.find(key);
    return it == data.end() ? nullptr : &it->second;
  }
};

struct BarrierState {
  bool all = true;
  std::vector<int> participants;  // Sorted; empty when `all`.
  std::vector<char> arrived;      // Indexed by rank.
  int arrived_count = 0;
  int expected = 0;
  absl::Time deadline;
  absl::Duration timeout;
  std::vector<uint64_t> waiters;
  std::optional<absl::Status> result;

  bool Includes(int rank) const {
    return all || std::binary_search(participants.begin(), participants.end(), rank);
  }
};

}  // namespace

struct Coordination::Generation {
  std::string job_id;
  int64_t number = 0;
  const JobLayout* layout = nullptr;  // Owned by the Job.
  std::vector<Member> members;
  int joined = 0;
  bool complete = false;  // Every rank has joined.
  int num_nodes = 0;
  std::string nccl_unique_id;
  KeyTable kv;
  KeyTable ids;
  std::map<std::string, BarrierState> barriers;
  absl::flat_hash_map<uint64_t, Waiter> waiters;
  std::vector<uint64_t> join_waiters;
  absl::flat_hash_map<uint64_t, WatchCallback> watchers;
  std::optional<JobError> error;

  int world_size() const { return layout->world_size; }
  std::string Name() const { return absl::StrCat("job ", job_id, " generation ", number); }
  std::string RankName(int rank) const {
    const Member& m = members[rank];
    return m.joined ? absl::StrCat(rank, " (", m.host, ")") : absl::StrCat(rank, " (not joined)");
  }
};

struct Coordination::Job {
  JobLayout layout;
  std::unique_ptr<Generation> current;
};

absl::Status ValidateOptions(const CoordinationOptions& o) {
  if (o.heartbeat_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("heartbeat_interval must be positive");
  }
  if (o.heartbeat_timeout <= o.heartbeat_interval) {
    return absl::InvalidArgumentError(
        absl::StrCat("heartbeat_timeout (", Seconds(o.heartbeat_timeout),
                     ") must exceed heartbeat_interval (", Seconds(o.heartbeat_interval), ")"));
  }
  if (o.default_wait <= absl::ZeroDuration() || o.max_wait < o.default_wait) {
    return absl::InvalidArgumentError("need 0 < default_wait <= max_wait");
  }
  if (o.kv.max_key_bytes == 0 || o.kv.max_value_bytes == 0 || o.kv.max_total_bytes <= 0 ||
      o.kv.max_keys <= 0) {
    return absl::InvalidArgumentError("KV limits must be positive");
  }
  return absl::OkStatus();
}

Coordination::Coordination(const Clock* clock, CoordinationOptions options)
    : clock_(clock), options_(std::move(options)) {
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

absl::StatusOr<JobInfo> Coordination::CreateJob(JobLayout layout) {
  if (layout.world_size < 1 || layout.world_size > kMaxWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size ", layout.world_size, " is outside 1..", kMaxWorldSize));
  }
  if (layout.mesh_shape.empty()) layout.mesh_shape = {layout.world_size};
  int64_t product = 1;
  for (int64_t dim : layout.mesh_shape) {
    if (dim < 1 || dim > kMaxWorldSize) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh_shape [", absl::StrJoin(layout.mesh_shape, ", "),
                       "] has a dimension outside 1..", kMaxWorldSize));
    }
    product *= dim;
    if (product > kMaxWorldSize) break;
  }
  if (product != layout.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("mesh_shape [", absl::StrJoin(layout.mesh_shape, ", "), "] has product ",
                     product, ", not world_size ", layout.world_size));
  }
  if (layout.mesh_dim_names.empty()) {
    for (size_t i = 0; i < layout.mesh_shape.size(); ++i) {
      layout.mesh_dim_names.push_back(absl::StrCat("dim", i));
    }
  }
  if (layout.mesh_dim_names.size() != layout.mesh_shape.size()) {
    return absl::InvalidArgumentError(absl::StrCat("mesh_dim_names has ",
                                                   layout.mesh_dim_names.size(), " names for a ",
                                                   layout.mesh_shape.size(), "-d mesh"));
  }
  absl::flat_hash_set<std::string> names;
  for (const std::string& name : layout.mesh_dim_names) {
    if (name.empty()) return absl::InvalidArgumentError("mesh_dim_names has an empty name");
    if (!names.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh_dim_names has '", name, "' twice; names must be unique"));
    }
  }

  absl::MutexLock lock(&mu_);
  if (shut_down_) return absl::UnavailableError("coordinator is shutting down");
  if (layout.job_id.empty()) {
    do {
      layout.job_id = absl::StrCat("job-", next_id_++);
    } while (jobs_.contains(layout.job_id));
  } else if (!ValidJobId(layout.job_id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("job id '", layout.job_id, "' must be 1-128 characters of [A-Za-z0-9._-]"));
  }
  if (jobs_.contains(layout.job_id)) {
    return absl::AlreadyExistsError(absl::StrCat("job ", layout.job_id, " already exists"));
  }
  auto job = std::make_unique<Job>();
  job->layout = std::move(layout);
  job->current = std::make_unique<Generation>();
  job->current->job_id = job->layout.job_id;
  job->current->layout = &job->layout;
  job->current->members.resize(job->layout.world_size);
  JobInfo info{job->layout, 0, false};
  jobs_.emplace(job->layout.job_id, std::move(job));
  return info;
}

absl::StatusOr<JobInfo> Coordination::GetJob(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("unknown job '", job_id, "'"));
  const Generation& gen = *it->second->current;
  return JobInfo{it->second->layout, gen.number, gen.error.has_value()};
}

absl::StatusOr<int64_t> Coordination::BumpGeneration(const std::string& job_id,
                                                     const std::string& reason) {
  Completions done;
  absl::MutexLock lock(&mu_);
  if (shut_down_) return absl::UnavailableError("coordinator is shutting down");
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("unknown job '", job_id, "'"));
  Job& job = *it->second;
  Generation& old = *job.current;
  const int64_t next = old.number + 1;
  EndGenerationLocked(old,
                      absl::AbortedError(absl::StrCat(old.Name(), " was superseded by generation ",
                                                      next, ": ", reason)),
                      done);
  job.current = std::make_unique<Generation>();
  job.current->job_id = job_id;
  job.current->number = next;
  job.current->layout = &job.layout;
  job.current->members.resize(job.layout.world_size);
  return next;
}

// ---- Fencing ------------------------------------------------------------------

absl::StatusOr<Coordination::Generation*> Coordination::ResolveLocked(const Caller& caller,
                                                                      bool require_joined,
                                                                      bool allow_failed) {
  if (shut_down_) return absl::UnavailableError("coordinator is shutting down");
  auto it = jobs_.find(caller.job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown job '", caller.job_id, "'"));
  }
  Generation& gen = *it->second->current;
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
  const Member& member = gen.members[caller.rank];
  if (member.joined && member.incarnation != caller.incarnation) {
    return absl::AbortedError(absl::StrCat(
        gen.Name(), ": rank ", caller.rank, " joined as incarnation ", member.incarnation,
        "; this process (incarnation ", caller.incarnation, ") is stale"));
  }
  if (gen.error.has_value() && !allow_failed) return absl::AbortedError(gen.error->message);
  if (require_joined && !member.joined) {
    return absl::FailedPreconditionError(
        absl::StrCat(gen.Name(), ": rank ", caller.rank, " has not joined"));
  }
  return &gen;
}

uint64_t Coordination::AddWaiterLocked(Generation& gen, Waiter waiter) {
  const uint64_t id = next_id_++;
  deadlines_.push(DeadlineEntry{waiter.deadline, gen.job_id, gen.number, id});
  gen.waiters.emplace(id, std::move(waiter));
  ++pending_;
  return id;
}

// ---- Rendezvous ------------------------------------------------------------------

JoinResult Coordination::JoinResultLocked(const Generation& gen, int rank) const {
  const Member& m = gen.members[rank];
  JoinResult r;
  r.rank = rank;
  r.world_size = gen.world_size();
  r.local_rank = m.local_rank;
  r.local_world_size = m.local_world_size;
  r.node_rank = m.node_rank;
  r.num_nodes = gen.num_nodes;
  r.mesh_shape = gen.layout->mesh_shape;
  r.mesh_dim_names = gen.layout->mesh_dim_names;
  r.generation = gen.number;
  r.nccl_unique_id = gen.nccl_unique_id;
  r.heartbeat_interval = options_.heartbeat_interval;
  r.heartbeat_timeout = options_.heartbeat_timeout;
  return r;
}

void Coordination::CompleteJoinLocked(Generation& gen, Completions& done) {
  // Nodes are hosts, ordered by their lowest rank; local ranks follow rank
  // order within a host. Deterministic for a given set of joins.
  absl::flat_hash_map<std::string, std::pair<int, int>> hosts;  // host -> (node, count)
  for (Member& m : gen.members) {
    auto [it, inserted] = hosts.try_emplace(m.host, static_cast<int>(hosts.size()), 0);
    m.node_rank = it->second.first;
    m.local_rank = it->second.second++;
  }
  for (Member& m : gen.members) m.local_world_size = hosts[m.host].second;
  gen.num_nodes = static_cast<int>(hosts.size());
  gen.complete = true;
  // Liveness starts now: ranks waiting in Join were alive by being there.
  const absl::Time now = clock_->Now();
  for (Member& m : gen.members) m.last_seen = now;

  for (uint64_t id : gen.join_waiters) {
    auto it = gen.waiters.find(id);
    if (it == gen.waiters.end()) continue;
    done.Complete(it->second.join_done,
                  absl::StatusOr<JoinResult>(JoinResultLocked(gen, it->second.rank)));
    gen.waiters.erase(it);
    --pending_;
  }
  gen.join_waiters.clear();
}

void Coordination::Join(JoinArgs args, Callback<JoinResult> callback) {
  Completions done;
  absl::MutexLock lock(&mu_);
  auto resolved = ResolveLocked(args.caller, /*require_joined=*/false, /*allow_failed=*/false);
  if (!resolved.ok()) return done.Complete(callback, absl::StatusOr<JoinResult>(resolved.status()));
  Generation& gen = **resolved;
  const int rank = args.caller.rank;
  if (args.host.empty()) {
    return done.Complete(
        callback, absl::StatusOr<JoinResult>(absl::InvalidArgumentError(
                      absl::StrCat(gen.Name(), ": rank ", rank, " joined without a host name"))));
  }
  if (!args.nccl_unique_id.empty()) {
    if (rank != 0) {
      return done.Complete(
          callback,
          absl::StatusOr<JoinResult>(absl::InvalidArgumentError(absl::StrCat(
              gen.Name(), ": only rank 0 may supply the world unique ID; rank ", rank, " did"))));
    }
    if (args.nccl_unique_id.size() != kUniqueIdBytes) {
      return done.Complete(
          callback, absl::StatusOr<JoinResult>(absl::InvalidArgumentError(
                        absl::StrCat(gen.Name(), ": unique ID has ", args.nccl_unique_id.size(),
                                     " bytes; an ncclUniqueId has ", kUniqueIdBytes))));
    }
  }

  Member& member = gen.members[rank];
  if (!member.joined) {
    member.joined = true;
    member.incarnation = args.caller.incarnation;
    member.host = std::move(args.host);
    member.device = std::move(args.device);
    member.last_seen = clock_->Now();
    if (rank == 0) gen.nccl_unique_id = std::move(args.nccl_unique_id);
    ++gen.joined;
  }
  if (gen.complete) {
    return done.Complete(callback, absl::StatusOr<JoinResult>(JoinResultLocked(gen, rank)));
  }
  Waiter waiter;
  waiter.kind = WaitKind::kJoin;
  waiter.rank = rank;
  waiter.timeout = ClampTimeout(args.timeout);
  waiter.deadline = clock_->Now() + waiter.timeout;
  waiter.join_done = std::move(callback);
  gen.join_waiters.push_back(AddWaiterLocked(gen, std::move(waiter)));
  if (gen.joined == gen.world_size()) CompleteJoinLocked(gen, done);
}

absl::StatusOr<std::vector<RankDescription>> Coordination::DescribeRanks(
    const Caller& caller, const std::vector<int>& ranks) {
  absl::MutexLock lock(&mu_);
  auto resolved = ResolveLocked(caller, /*require_joined=*/true, /*allow_failed=*/false);
  if (!resolved.ok()) return resolved.status();
  const Generation& gen = **resolved;
  if (ranks.size() > kMaxDescribeRanks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DescribeRanks takes at most ", kMaxDescribeRanks, " ranks, not ", ranks.size()));
  }
  if (!gen.complete) {
    return absl::FailedPreconditionError(absl::StrCat(gen.Name(), ": rendezvous is not complete; ",
                                                      gen.joined, "/", gen.world_size(),
                                                      " ranks joined"));
  }
  std::vector<RankDescription> out;
  out.reserve(ranks.size());
  for (int r : ranks) {
    if (r < 0 || r >= gen.world_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(gen.Name(), ": rank ", r, " is outside 0..", gen.world_size() - 1));
    }
    const Member& m = gen.members[r];
    out.push_back(RankDescription{r, m.host, m.node_rank, m.local_rank, m.device});
  }
  return out;
}

// ---- Key-value store -----------------------------------------------------------------

namespace {

absl::Status CheckKey(const std::string& key, const KvLimits& limits) {
  if (key.empty()) return absl::InvalidArgumentError("key must not be empty");
  if (key.size() > limits.max_key_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("key of ", key.size(), " bytes exceeds the limit of ", limits.max_key_bytes));
  }
  return absl::OkStatus();
}

// Checks that replacing the keys in `entries` (later entries win) keeps the
// table within its limits.
absl::Status CheckQuota(const KeyTable& table, const KvLimits& limits,
                        const std::vector<std::pair<std::string, std::string>>& entries) {
  std::map<std::string, size_t> final_sizes;
  for (const auto& [key, value] : entries) {
    if (absl::Status s = CheckKey(key, limits); !s.ok()) return s;
    if (value.size() > limits.max_value_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("value of ", value.size(), " bytes for key '", key,
                       "' exceeds the limit of ", limits.max_value_bytes));
    }
    final_sizes[key] = key.size() + value.size();
  }
  int64_t bytes = table.total_bytes;
  int64_t keys = static_cast<int64_t>(table.data.size());
  for (const auto& [key, size] : final_sizes) {
    const std::string* old = table.Find(key);
    if (old == nullptr) {
      ++keys;
    } else {
      bytes -= static_cast<int64_t>(key.size() + old->size());
    }
    bytes += static_cast<int64_t>(size);
  }
  if (keys > limits.max_keys) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the job's store would hold ", keys, " keys; the limit is ", limits.max_keys));
  }
  if (bytes > limits.max_total_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the job's store would hold ", bytes, " bytes; the limit is ", limits.max_total_bytes));
  }
  return absl::OkStatus();
}

void Store(KeyTable& table, const std::string& key, std::string value) {
  auto [it, inserted] = table.data.try_emplace(key);
  if (!inserted) table.total_bytes -= static_cast<int64_t>(key.size() + it->second.size());
  it->second = std::move(value);
  table.total_bytes += static_cast<int64_t>(key.size() + it->second.size());
}

}  // namespace

void Coordination::TryCompleteKeyWaiterLocked(Generation& gen, uint64_t id, Completions& done) {
  auto it = gen.waiters.find(id);
  if (it == gen.waiters.end()) return;
  Waiter& w = it->second;
  KeyTable& table = w.kind == WaitKind::kUniqueIds ? gen.ids : gen.kv;
  std::vector<std::string> values;
  values.reserve(w.keys.size());
  for (const std::string& key : w.keys) {
    const std::string* value = table.Find(key);
    if (value == nullptr) {
      table.waiters[key].push_back(id);
      return;
    }
    values.push_back(*value);
  }
  switch (w.kind) {
    case WaitKind::kKvGet:
      done.Complete(w.get_done, absl::StatusOr<std::string>(std::move(values.front())));
      break;
    case WaitKind::kKvWait:
      done.Complete(w.wait_done, absl::OkStatus());
      break;
    default:
      done.Complete(w.values_done, absl::StatusOr<std::vector<std::string>>(std::move(values)));
      break;
  }
  gen.waiters.erase(it);
  --pending_;
}

void Coordination::WakeKeyWaitersLocked(Generation& gen, bool unique_ids, const std::string& key,
                                        Completions& done) {
  KeyTable& table = unique_ids ? gen.ids : gen.kv;
  auto it = table.waiters.find(key);
  if (it == table.waiters.end()) return;
  std::vector<uint64_t> ids = std::move(it->second);
  table.waiters.erase(it);
  for (uint64_t id : ids) TryCompleteKeyWaiterLocked(gen, id, done);
}

absl::Status Coordination::KvSet(const Caller& caller, const std::string& key, std::string value) {
  std::vector<std::pair<std::string, std::string>> entries;
  entries.emplace_back(key, std::move(value));
  return KvMultiSet(caller, std::move(entries));
}

absl::Status Coordination::KvMultiSet(const Caller& caller,
                                      std::vector<std::pair<std::string, std::string>> entries) {
  Completions done;
  absl::MutexLock lock(&mu_);
  auto resolved = ResolveLocked(caller, true, false);
  if (!resolved.ok()) return resolved.status();
  Generation& gen = **resolved;
  if (absl::Status s = CheckQuota(gen.kv, options_.kv, entries); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(gen.Name(), ": ", s.message()));
  }
  for (auto& [key, value] : entries) {
    Store(gen.kv, key, std::move(value));
    WakeKeyWaitersLocked(gen, false, key, done);
  }
  return absl::OkStatus();
}

void Coordination::KvGet(const Caller& caller, const std::string& key, bool wait,
                         absl::Duration timeout, Callback<std::string> callback) {
  Callback<std::vector<std::string>> adapter =
      [callback = std::move(callback)](absl::StatusOr<std::vector<std::string>> values) mutable {
        if (!values.ok()) return std::move(callback)(values.status());
        std::move(callback)(std::move(values->front()));
      };
  KvMultiGet(caller, {key}, wait, timeout, std::move(adapter));
}

void Coordination::KvMultiGet(const Caller& caller, std::vector<std::string> keys, bool wait,
                              absl::Duration timeout, Callback<std::vector<std::string>> callback) {
  using Result = absl::StatusOr<std::vector<std::string>>;
  Completions done;
  absl::MutexLock lock(&mu_);
  auto resolved = ResolveLocked(caller, true, false);
  if (!resolved.ok()) return done.Complete(callback, Result(resolved.status()));
  Generation& gen = **resolved;
  for (const std::string& key : keys) {
    if (absl::Status s = CheckKey(key, options_.kv); !s.ok()) {
      return done.Complete(callback, Result(s));
    }
  }
  if (!wait) {
    std::vector<std::string> values;
    for (const std::string& key : keys) {
      const std::string* value = gen.kv.Find(key);
      if (value == nullptr) {
        return done.Complete(
            callback,
            Result(absl::NotFoundError(absl::StrCat(gen.Name(), ": key '", key, "' is not set"))));
      }
      values.push_back(*value);
    }
    return done.Complete(callback, Result(std::move(values)));
  }
  Waiter waiter;
  waiter.kind = WaitKind::kKvMultiGet;
  waiter.rank = caller.rank;
  waiter.timeout = ClampTimeout(timeout);
  waiter.deadline = clock_->Now() + waiter.timeout;
  waiter.keys = std::move(keys);
  waiter.values_done = std::move(callback);
  TryCompleteKeyWaiterLocked(gen, AddWaiterLocked(gen, std::move(waiter)), done);
}

void Coordination::KvWait(const Caller& caller, std::vector<std::string> keys,
                          absl::Duration timeout, DoneCallback callback) {
  Callback<std::vector<std::string>> adapter =
      [callback = std::move(callback)](absl::StatusOr<std::vector<std::string>> values) mutable {
        std::move(callback)(values.status());
      };
  KvMultiGet(caller, std::move(keys), /*wait=*/true, timeout, std::move(adapter));
}

absl::StatusOr<int64_t> Coordination::KvAdd(const Caller& caller, const std::string& key,
                                            int64_t delta) {
  Completions done;
  absl::MutexLock lock(&mu_);
  auto resolved = ResolveLocked(caller, true, false);
  if (!resolved.ok()) return resolved.status();
  Generation& gen = **resolved;
  int64_t current = 0;
  if (const std::string* value = gen.kv.Find(key); value != nullptr) {
    if (!absl::SimpleAtoi(*value, &current)) {
      return absl::InvalidArgumentError(
          absl::StrCat(gen.Name(), ": key '", key, "' holds a value that is not a decimal int64"));
    }
  }
  int64_t sum = 0;
  if (__builtin_add_overflow(current, delta, &sum)) {
    return absl::InvalidArgumentError(
        absl::StrCat(gen.Name(), ": adding ", delta, " to key '", key, "' overflows int64"));
  }
  std::vector<std::pair<std::string, std::string>> entries = {{key, absl::StrCat(sum)}};
  if (absl::Status s = CheckQuota(gen.kv, options_.kv, entries); !s.ok()) return s;
  Store(gen.kv, key, std::move(entries[0].second));
  WakeKeyWaitersLocked(gen, false, key, done);
  return sum;
}

absl::StatusOr<CompareSetResult> Coordination::KvCompareSet(const Caller& caller,
                                                            const std::string& key,
                                                            std::optional<std::string> expected,
                                                            std::string desired) {
  Completions done;
  absl::MutexLock lock(&mu_);
  auto resolved = ResolveLocked(caller, true, false);
  if (!resolved.ok()) return resolved.status();
  Generation& gen = **resolved;
  if (absl::Status s = CheckKey(key, options_.kv); !s.ok()) return s;
  const std::string* current = gen.kv.Find(key);
  const bool match =
      expected.has_value() ? (current != nullptr && *current == *expected) : current == nullptr;
  CompareSetResult result;
  if (match) {
    std::vector<std::pair<std::string, std::string>> entries = {{key, desired}};
    if (absl::Status s = CheckQuota(gen.kv, options_.kv, entries); !s.ok()) return s;
    Store(gen.kv, key, std::move(desired));
    WakeKeyWaitersLocked(gen, false, key, done);
    result.swapped = true;
  }
  if (const std::string* now = gen.kv.Find(key); now != nullptr) {
    result.present = true;
    result.value = *now;
  }
  return result;
}

absl::StatusOr<int64_t> Coordination::KvDelete(const Caller& caller, const std::string& key,
                                               bool prefix) {
  absl::MutexLock lock(&mu_);
  auto resolved = ResolveLocked(caller, true, false);
  if (!resolved.ok()) return resolved.status();
  KeyTable& table = (**resolved).kv;
  int64_t deleted = 0;
  auto erase = [&](std::map<std::string, std::string>::iterator it) {
    table.total_bytes -= static_cast<int64_t>(it->first.size() + it->second.size());
    ++deleted;
    return table.data.erase(it);
  };
  if (!prefix) {
    if (auto it = table.data.find(key); it != table.data.end()) erase(it);
    return deleted;
  }
  for (auto it = table.data.lower_bound(key);
       it != table.data.end() && absl::StartsWith(it->first, key);) {
    it = erase(it);
  }
  return deleted;
}

absl::StatusOr<KvListResult> Coordination::KvList(const Caller& caller, const std::string& prefix,
                                                  const std::string& start_after, int limit) {
  if (limit < 0 || limit > kMaxListLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat("list limit ", limit, " is outside 0..", kMaxListLimit));
  }
  if (limit == 0) limit = kDefaultListLimit;
  absl::MutexLock lock(&mu_);
  auto resolved = ResolveLocked(caller, true, false);
  if (!resolved.ok()) return resolved.status();
  const KeyTable& table = (**resolved).kv;
  auto it =
      start_after < prefix ? table.data.lower_bound(prefix) : table.data.upper_bound(start_after);
  KvListResult result;
  for (; it != table.data.end() && absl::StartsWith(it->first, prefix); ++it) {
    if (static_cast<int>(result.keys.size()) == limit) {
      result.truncated = true;
      break;
    }
    result.keys.push_back(it->first);
  }
  return result;
}

absl::StatusOr<KvStats> Coordination::KvNumKeys(const Caller& caller) {
  absl::MutexLock lock(&mu_);
  auto resolved = ResolveLocked(caller, true, false);
  if (!resolved.ok()) return resolved.status();
  const KeyTable& table = (**resolved).kv;
  return KvStats{static_cast<int64_t>(table.data.size()), table.total_bytes};
}

// ---- Barriers ----------------------------------------------------------------------

void Coordination::CompleteBarrierLocked(Generation& gen, const std::string& name,
                                         const absl::Status& status, Completions& done) {
  BarrierState& b = gen.barriers[name];
  b.result = status;
  for (uint64_t id : b.waiters) {
    auto it = gen.waiters.find(id);
    if (it == gen.waiters.end()) continue;
    done.Complete(it->second.barrier_done,
                  status.ok() ? absl::StatusOr<int>(b.expected) : absl::StatusOr<int>(status));
    gen.waiters.erase(it);
    --pending_;
  }
  b.waiters.clear();
}

std::string Coordination::DescribeMissingLocked(const Generation& gen,
                                                const std::vector<int>& missing) const {
  std::vector<std::string> names;
  for (size_t i = 0; i < missing.size() && i < kMaxNamedRanks; ++i) {
    names.push_back(gen.RankName(missing[i]));
  }
  std::string text = absl::StrJoin(names, ", ");
  if (missing.size() > kMaxNamedRanks) {
    absl::StrAppend(&text, " and ", missing.size() - kMaxNamedRanks, " more");
  }
  return text;
}

void Coordination::Barrier(const Caller& caller, const std::string& name, std::vector<int> ranks,
                           absl::Duration timeout, Callback<int> callback) {
  Completions done;
  absl::MutexLock lock(&mu_);
  auto resolved = ResolveLocked(caller, true, false);
  if (!resolved.ok()) return done.Complete(callback, absl::StatusOr<int>(resolved.status()));
  Generation& gen = **resolved;
  auto invalid = [&](const std::string& why) {
    done.Complete(callback, absl::StatusOr<int>(absl::InvalidArgumentError(
                                absl::StrCat(gen.Name(), ": barrier '", name, "': ", why))));
  };
  if (name.empty()) return invalid("the name must not be empty");
  std::sort(ranks.begin(), ranks.end());
  if (std::adjacent_find(ranks.begin(), ranks.end()) != ranks.end()) {
    return invalid("a participant is listed twice");
  }
  if (!ranks.empty() && (ranks.front() < 0 || ranks.back() >= gen.world_size())) {
    return invalid(absl::StrCat("participants must be in 0..", gen.world_size() - 1));
  }
  const bool all = ranks.empty() || static_cast<int>(ranks.size()) == gen.world_size();
  if (all) ranks.clear();
  if (!all && !std::binary_search(ranks.begin(), ranks.end(), caller.rank)) {
    return invalid(absl::StrCat("rank ", caller.rank, " is not a participant"));
  }

  auto [it, created] = gen.barriers.try_emplace(name);
  BarrierState& b = it->second;
  if (created) {
    b.all = all;
    b.participants = ranks;
    b.expected = all ? gen.world_size() : static_cast<int>(ranks.size());
    b.arrived.assign(gen.world_size(), 0);
    b.timeout = ClampTimeout(timeout);
    b.deadline = clock_->Now() + b.timeout;
  } else if (b.result.has_value()) {
    // A late caller gets what everyone got.
    return done.Complete(callback, b.result->ok() ? absl::StatusOr<int>(b.expected)
                                                  : absl::StatusOr<int>(*b.result));
  }

  Waiter waiter;
  waiter.kind = WaitKind::kBarrier;
  waiter.rank = caller.rank;
  waiter.timeout = b.timeout;
  waiter.deadline = b.deadline;
  waiter.barrier = name;
  waiter.barrier_done = std::move(callback);
  b.waiters.push_back(AddWaiterLocked(gen, std::move(waiter)));

  if (!created && (b.all != all || b.participants != ranks)) {
    auto describe = [](bool every, const std::vector<int>& set) {
      return every ? std::string("all ranks") : absl::StrCat("{", absl::StrJoin(set, ","), "}");
    };
    return CompleteBarrierLocked(
        gen, name,
        absl::InvalidArgumentError(
            absl::StrCat(gen.Name(), ": barrier '", name, "': rank ", caller.rank,
                         " passed participants ", describe(all, ranks),
                         " but the barrier was started with ", describe(b.all, b.participants))),
        done);
  }
  if (!b.arrived[caller.rank]) {
    b.arrived[caller.rank] = 1;
    ++b.arrived_count;
  }
  if (b.arrived_count == b.expected) CompleteBarrierLocked(gen, name, absl::OkStatus(), done);
}

// ---- Unique IDs --------------------------------------------------------------------

absl::Status Coordination::PublishUniqueIds(const Caller& caller,
                                            std::vector<std::pair<std::string, std::string>> ids) {
  Completions done;
  absl::MutexLock lock(&mu_);
  auto resolved = ResolveLocked(caller, true, false);
  if (!resolved.ok()) return resolved.status();
  Generation& gen = **resolved;
  for (const auto& [key, id] : ids) {
    if (absl::Status s = CheckKey(key, options_.kv); !s.ok()) return s;
    if (id.size() != kUniqueIdBytes) {
      return absl::InvalidArgumentError(absl::StrCat(gen.Name(), ": unique ID '", key, "' has ",
                                                     id.size(), " bytes; an ncclUniqueId has ",
                                                     kUniqueIdBytes));
    }
    if (const std::string* old = gen.ids.Find(key); old != nullptr && *old != id) {
      return absl::AlreadyExistsError(absl::StrCat(gen.Name(), ": unique ID '", key,
                                                   "' was already published with different bytes"));
    }
  }
  for (auto& [key, id] : ids) {
    if (gen.ids.Find(key) != nullptr) continue;
    Store(gen.ids, key, std::move(id));
    WakeKeyWaitersLocked(gen, true, key, done);
  }
  return absl::OkStatus();
}

void Coordination::GetUniqueIds(const Caller& caller, std::vector<std::string> keys,
                                absl::Duration timeout,
                                Callback<std::vector<std::string>> callback) {
  using Result = absl::StatusOr<std::vector<std::string>>;
  Completions done;
  absl::MutexLock lock(&mu_);
  auto resolved = ResolveLocked(caller, true, false);
  if (!resolved.ok()) return done.Complete(callback, Result(resolved.status()));
  Generation& gen = **resolved;
  for (const std::string& key : keys) {
    if (absl::Status s = CheckKey(key, options_.kv); !s.ok()) {
      return done.Complete(callback, Result(s));
    }
  }
  Waiter waiter;
  waiter.kind = WaitKind::kUniqueIds;
  waiter.rank = caller.rank;
  waiter.timeout = ClampTimeout(timeout);
  waiter.deadline = clock_->Now() + waiter.timeout;
  waiter.keys = std::move(keys);
  waiter.values_done = std::move(callback);
  TryCompleteKeyWaiterLocked(gen, AddWaiterLocked(gen, std::move(waiter)), done);
}

// ---- Liveness and errors -------------------------------------------------------------

void Coordination::EndGenerationLocked(Generation& gen, const absl::Status& status,
                                       Completions& done) {
  for (auto& [id, waiter] : gen.waiters) {
    waiter.Fail(status, done);
    --pending_;
  }
  gen.waiters.clear();
  gen.join_waiters.clear();
  gen.kv.waiters.clear();
  gen.ids.waiters.clear();
  for (auto& [name, barrier] : gen.barriers) {
    if (!barrier.result.has_value()) barrier.result = status;
    barrier.waiters.clear();
  }
  for (auto& [handle, watcher] : gen.watchers) {
    done.Complete(watcher, absl::StatusOr<JobError>(status));
    watch_index_.erase(handle);
    --pending_;
  }
  gen.watchers.clear();
}

void Coordination::FailGenerationLocked(Generation& gen, JobError error, Completions& done) {
  if (gen.error.has_value()) return;  // The first failure is the root cause.
  error.generation = gen.number;
  const std::string who = error.rank >= 0
                              ? absl::StrCat("rank ", error.rank, " (", error.host, ") failed: ")
                              : std::string("failed: ");
  error.message = absl::StrCat(gen.Name(), ": ", who, error.reason);
  gen.error = error;
  // Watchers get the structured error; every pending wait gets ABORTED.
  for (auto& [handle, watcher] : gen.watchers) {
    done.Complete(watcher, absl::StatusOr<JobError>(error));
    watch_index_.erase(handle);
    --pending_;
  }
  gen.watchers.clear();
  EndGenerationLocked(gen, absl::AbortedError(error.message), done);
}

absl::StatusOr<std::optional<JobError>> Coordination::Heartbeat(const Caller& caller) {
  absl::MutexLock lock(&mu_);
  auto resolved = ResolveLocked(caller, true, /*allow_failed=*/true);
  if (!resolved.ok()) return resolved.status();
  Generation& gen = **resolved;
  if (gen.error.has_value()) return gen.error;
  gen.members[caller.rank].last_seen = clock_->Now();
  return std::optional<JobError>();
}

absl::Status Coordination::ReportError(const Caller& caller, const std::string& reason) {
  Completions done;
  absl::MutexLock lock(&mu_);
  auto resolved = ResolveLocked(caller, true, /*allow_failed=*/true);
  if (!resolved.ok()) return resolved.status();
  Generation& gen = **resolved;
  JobError error;
  error.rank = caller.rank;
  error.host = gen.members[caller.rank].host;
  error.reason = reason.empty() ? "reported an error" : reason;
  FailGenerationLocked(gen, std::move(error), done);
  return absl::OkStatus();
}

absl::Status Coordination::Leave(const Caller& caller) {
  Completions done;
  absl::MutexLock lock(&mu_);
  auto resolved = ResolveLocked(caller, true, /*allow_failed=*/true);
  if (!resolved.ok()) return resolved.status();
  Generation& gen = **resolved;
  gen.members[caller.rank].left = true;
  if (gen.error.has_value()) return absl::OkStatus();
  std::vector<std::string> doomed;
  for (auto& [name, b] : gen.barriers) {
    if (!b.result.has_value() && b.Includes(caller.rank) && !b.arrived[caller.rank]) {
      doomed.push_back(name);
    }
  }
  for (const std::string& name : doomed) {
    CompleteBarrierLocked(gen, name,
                          absl::FailedPreconditionError(
                              absl::StrCat(gen.Name(), ": barrier '", name, "': participant rank ",
                                           gen.RankName(caller.rank), " left before arriving")),
                          done);
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Coordination::Watch(const Caller& caller, WatchCallback callback) {
  Completions done;
  absl::MutexLock lock(&mu_);
  auto resolved = ResolveLocked(caller, /*require_joined=*/true, /*allow_failed=*/true);
  if (!resolved.ok()) return resolved.status();
  Generation& gen = **resolved;
  const uint64_t handle = next_id_++;
  if (gen.error.has_value()) {
    done.Complete(callback, absl::StatusOr<JobError>(*gen.error));
    return handle;
  }
  gen.watchers.emplace(handle, std::move(callback));
  watch_index_.emplace(handle, std::make_pair(gen.job_id, gen.number));
  ++pending_;
  return handle;
}

bool Coordination::Unwatch(uint64_t handle) {
  absl::MutexLock lock(&mu_);
  auto it = watch_index_.find(handle);
  if (it == watch_index_.end()) return false;
  auto job = jobs_.find(it->second.first);
  watch_index_.erase(it);
  if (job == jobs_.end()) return false;
  if (job->second->current->watchers.erase(handle) == 0) return false;
  --pending_;
  return true;
}

// ---- Time ---------------------------------------------------------------------------

void Coordination::ExpireWaiterLocked(Generation& gen, uint64_t id, Completions& done) {
  auto it = gen.waiters.find(id);
  if (it == gen.waiters.end()) return;
  Waiter& w = it->second;
  const std::string after = Seconds(w.timeout);
  switch (w.kind) {
    case WaitKind::kBarrier: {
      // Copied: completing the barrier erases `w`.
      const std::string name = w.barrier;
      BarrierState& b = gen.barriers[name];
      std::vector<int> missing;
      for (int r = 0; r < gen.world_size(); ++r) {
        if (b.Includes(r) && !b.arrived[r]) missing.push_back(r);
      }
      return CompleteBarrierLocked(
          gen, name,
          absl::DeadlineExceededError(absl::StrCat(
              gen.Name(), ": barrier '", name, "' timed out after ", after, ": ", b.arrived_count,
              "/", b.expected, " arrived; missing ranks ", DescribeMissingLocked(gen, missing))),
          done);
    }
    case WaitKind::kJoin: {
      std::vector<int> missing;
      for (int r = 0; r < gen.world_size(); ++r) {
        if (!gen.members[r].joined) missing.push_back(r);
      }
      std::vector<std::string> names;
      for (size_t i = 0; i < missing.size() && i < kMaxNamedRanks; ++i) {
        names.push_back(absl::StrCat(missing[i]));
      }
      w.Fail(absl::DeadlineExceededError(
                 absl::StrCat(gen.Name(), ": rank ", w.rank, " timed out after ", after,
                              " waiting for the world to join: ", gen.joined, "/", gen.world_size(),
                              " ranks joined; missing ranks ", absl::StrJoin(names, ", "),
                              missing.size() > kMaxNamedRanks
                                  ? absl::StrCat(" and ", missing.size() - kMaxNamedRanks, " more")
                                  : "")),
             done);
      break;
    }
    default: {
      const bool ids = w.kind == WaitKind::kUniqueIds;
      const KeyTable& table = ids ? gen.ids : gen.kv;
      std::vector<std::string> missing;
      for (const std::string& key : w.keys) {
        if (table.Find(key) == nullptr) missing.push_back(key);
      }
      w.Fail(absl::DeadlineExceededError(
                 absl::StrCat(gen.Name(), ": rank ", w.rank, " waited ", after, " for ",
                              ids ? "unique ID(s) " : "key(s) ", QuoteKeys(missing),
                              ids ? " that nobody published" : " that nobody set")),
             done);
      break;
    }
  }
  gen.waiters.erase(it);
  --pending_;
}

void Coordination::CheckLivenessLocked(Completions& done) {
  const absl::Time now = clock_->Now();
  for (auto& [job_id, job] : jobs_) {
    Generation& gen = *job->current;
    if (!gen.complete || gen.error.has_value()) continue;
    for (int r = 0; r < gen.world_size(); ++r) {
      const Member& m = gen.members[r];
      const absl::Duration silent = now - m.last_seen;
      if (m.left || silent <= options_.heartbeat_timeout) continue;
      JobError error;
      error.rank = r;
      error.host = m.host;
      error.reason = absl::StrCat("no heartbeat for ", Seconds(silent), " (timeout ",
                                  Seconds(options_.heartbeat_timeout), ")");
      FailGenerationLocked(gen, std::move(error), done);
      break;
    }
  }
}

void Coordination::Tick() {
  Completions done;
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  const absl::Time now = clock_->Now();
  while (!deadlines_.empty() && deadlines_.top().deadline <= now) {
    const DeadlineEntry entry = deadlines_.top();
    deadlines_.pop();
    auto job = jobs_.find(entry.job_id);
    if (job == jobs_.end() || job->second->current->number != entry.generation) continue;
    ExpireWaiterLocked(*job->second->current, entry.waiter_id, done);
  }
  if (now >= next_liveness_check_) {
    CheckLivenessLocked(done);
    // Checking a quarter interval apart detects a silent rank within a
    // quarter interval of its timeout.
    next_liveness_check_ = now + std::max(options_.heartbeat_interval / 4, kTickInterval);
  }
}

void Coordination::Shutdown() {
  Completions done;
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  shut_down_ = true;
  const absl::Status status = absl::UnavailableError("coordinator is shutting down");
  for (auto& [job_id, job] : jobs_) EndGenerationLocked(*job->current, status, done);
  deadlines_ = {};
}

size_t Coordination::PendingWaits() const {
  absl::MutexLock lock(&mu_);
  return pending_;
}

}  // namespace mesh::coordinator
