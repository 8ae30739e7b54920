// Coordination's key spaces (coordination.h, "Key-value store" and "NCCL
// unique-ID broker"): the one wait path for keys of either space
// (WaitForKeysLocked), the KV store calls over the generation's KvTable and
// the unique-ID broker over its UniqueIdTable. Private parts of
// Coordination, under its one mutex; the records are in
// coordination_internal.h.

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/coordination.h"
#include "coordinator/coordination_internal.h"
#include "coordinator/key_waits.h"
#include "coordinator/kv_table.h"
#include "coordinator/unique_id_table.h"

namespace mesh::coordinator {
namespace {

// INVALID_ARGUMENT when a request names more keys than one request may.
absl::Status CheckKeysPerRequest(size_t count, int64_t limit) {
  if (static_cast<int64_t>(count) <= limit) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(count, " keys in one request, over the limit of ", limit, " per request"));
}

}  // namespace

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

}  // namespace mesh::coordinator
