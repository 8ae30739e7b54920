// WaiterRegistry<W>: an owner's pending waits, by id, grouped by scope, with
// a min-heap of their deadlines.
//
// W is the owner's record of one wait (what it waits for, and the callback
// that ends it). A wait is registered once (Add) and ends exactly once, when
// the owner takes it back out:
//
//   Take(id)          it completed, or was dropped;
//   TakeExpired(now)  its deadline passed;
//   TakeScope(scope)  everything it belongs to ended (a job generation).
//
// Whatever ends a wait removes it from every index here, so size() is the
// number of pending waits. Ids are never 0 and never reused, so a stale id
// names nothing.
//
// The heap drops the entries of waits that ended early lazily; once those
// outnumber the live ones it is rebuilt, so memory stays O(pending waits)
// however many waits complete long before their deadline. A wait with an
// infinite deadline (a watch) never enters the heap.
//
// Thread safety: none. The owner's mutex guards every call.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/time/time.h"

namespace mesh::coordinator {

template <typename W>
class WaiterRegistry {
 public:
  WaiterRegistry() = default;
  WaiterRegistry(const WaiterRegistry&) = delete;
  WaiterRegistry& operator=(const WaiterRegistry&) = delete;

  // An id that no wait will ever have, for a handle that must not collide
  // with one (say a watch whose callback ran at once).
  uint64_t ReserveId() { return next_id_++; }

  // Registers `waiter` in `scope`, to expire once `deadline` has passed
  // (absl::InfiniteFuture(): never). Returns its id.
  uint64_t Add(uint64_t scope, absl::Time deadline, W waiter);

  // The pending wait `id`, or null. Valid until the next Add or Take*.
  W* Find(uint64_t id);

  // Ends the pending wait `id`; nullopt when there is none.
  std::optional<W> Take(uint64_t id);

  // Ends every pending wait of `scope`, in id (registration) order.
  std::vector<std::pair<uint64_t, W>> TakeScope(uint64_t scope);

  // Ends the pending wait with the earliest deadline if that is <= `now`
  // (equal deadlines: lowest id first); nullopt when none has passed.
  std::optional<std::pair<uint64_t, W>> TakeExpired(absl::Time now);

  // Pending waits.
  size_t size() const { return waiters_.size(); }
  // Whether some waiter of `scope` satisfies `pred(const W&)`. O(waiters of
  // the scope).
  template <typename Pred>
  bool AnyInScope(uint64_t scope, Pred pred) const {
    auto it = scopes_.find(scope);
    if (it == scopes_.end()) return false;
    for (uint64_t id : it->second) {
      if (pred(waiters_.at(id).waiter)) return true;
    }
    return false;
  }
  // The ids of the waits of `scope` that satisfy `pred(const W&)`, for the
  // owner to Take. O(waiters of the scope).
  template <typename Pred>
  std::vector<uint64_t> IdsInScope(uint64_t scope, Pred pred) const {
    std::vector<uint64_t> ids;
    auto it = scopes_.find(scope);
    if (it == scopes_.end()) return ids;
    for (uint64_t id : it->second) {
      if (pred(waiters_.at(id).waiter)) ids.push_back(id);
    }
    return ids;
  }
  bool empty() const { return waiters_.empty(); }
  // Heap entries, live or not (for tests of the memory bound).
  size_t heap_size() const { return heap_.size(); }

 private:
  // Garbage tolerated in the heap beyond one entry per live timed wait.
  static constexpr size_t kHeapSlack = 64;

  struct Entry {
    uint64_t scope;
    absl::Time deadline;
    W waiter;
  };
  struct HeapEntry {
    absl::Time deadline;
    uint64_t id;
    // std::push_heap builds a max-heap; this order puts the earliest
    // deadline, then the lowest id, on top.
    bool operator<(const HeapEntry& other) const {
      return deadline != other.deadline ? deadline > other.deadline : id > other.id;
    }
  };

  // Removes `it` from every index but the heap.
  W Erase(typename absl::flat_hash_map<uint64_t, Entry>::iterator it);
  void MaybeCompact();

  uint64_t next_id_ = 1;
  absl::flat_hash_map<uint64_t, Entry> waiters_;
  absl::flat_hash_map<uint64_t, absl::flat_hash_set<uint64_t>> scopes_;
  std::vector<HeapEntry> heap_;
  size_t timed_ = 0;  // Live waits with a finite deadline.
};

// ---- Implementation ------------------------------------------------------

template <typename W>
uint64_t WaiterRegistry<W>::Add(uint64_t scope, absl::Time deadline, W waiter) {
  const uint64_t id = next_id_++;
  waiters_.emplace(id, Entry{scope, deadline, std::move(waiter)});
  scopes_[scope].insert(id);
  if (deadline != absl::InfiniteFuture()) {
    heap_.push_back(HeapEntry{deadline, id});
    std::push_heap(heap_.begin(), heap_.end());
    ++timed_;
  }
  return id;
}

template <typename W>
W* WaiterRegistry<W>::Find(uint64_t id) {
  auto it = waiters_.find(id);
  return it == waiters_.end() ? nullptr : &it->second.waiter;
}

template <typename W>
W WaiterRegistry<W>::Erase(typename absl::flat_hash_map<uint64_t, Entry>::iterator it) {
  const uint64_t id = it->first;
  auto scope = scopes_.find(it->second.scope);
  scope->second.erase(id);
  if (scope->second.empty()) scopes_.erase(scope);
  if (it->second.deadline != absl::InfiniteFuture()) --timed_;
  W waiter = std::move(it->second.waiter);
  waiters_.erase(it);
  return waiter;
}

template <typename W>
std::optional<W> WaiterRegistry<W>::Take(uint64_t id) {
  auto it = waiters_.find(id);
  if (it == waiters_.end()) return std::nullopt;
  W waiter = Erase(it);
  MaybeCompact();
  return waiter;
}

template <typename W>
std::vector<std::pair<uint64_t, W>> WaiterRegistry<W>::TakeScope(uint64_t scope) {
  std::vector<std::pair<uint64_t, W>> taken;
  auto it = scopes_.find(scope);
  if (it == scopes_.end()) return taken;
  std::vector<uint64_t> ids(it->second.begin(), it->second.end());
  std::sort(ids.begin(), ids.end());
  taken.reserve(ids.size());
  for (uint64_t id : ids) taken.emplace_back(id, Erase(waiters_.find(id)));
  MaybeCompact();
  return taken;
}

template <typename W>
std::optional<std::pair<uint64_t, W>> WaiterRegistry<W>::TakeExpired(absl::Time now) {
  while (!heap_.empty() && heap_.front().deadline <= now) {
    const uint64_t id = heap_.front().id;
    std::pop_heap(heap_.begin(), heap_.end());
    heap_.pop_back();
    auto it = waiters_.find(id);
    if (it == waiters_.end()) continue;  // Ended early.
    return std::make_pair(id, Erase(it));
  }
  return std::nullopt;
}

template <typename W>
void WaiterRegistry<W>::MaybeCompact() {
  if (heap_.size() <= 2 * timed_ + kHeapSlack) return;
  std::vector<HeapEntry> live;
  live.reserve(timed_);
  for (const HeapEntry& entry : heap_) {
    if (waiters_.contains(entry.id)) live.push_back(entry);
  }
  heap_ = std::move(live);
  std::make_heap(heap_.begin(), heap_.end());
}

}  // namespace mesh::coordinator
