// KeyWaitIndex: waits for lists of keys, parked on the keys they still miss.
//
// One mechanism for every "complete once these keys are set" wait (blocking
// KV gets, KvWait, KvMultiGet, GetUniqueIds), whatever table the keys live
// in: the owner passes a lookup into that table.
//
// A waiter for k keys is parked on one missing key at a time. When that key
// is set, the owner Releases it and Advances the waiter, which moves on past
// every key now present and parks on the next missing one, or completes. A
// cursor remembers how far it got, so a wait on k keys costs O(k) lookups in
// total however the keys arrive (plus a re-check of all k when it
// completes, so that a key deleted meanwhile sends it back to waiting).
//
// Invariant: a waiter is parked at most once, and only while it is pending;
// Unpark it when it ends any other way (deadline), Clear when its scope
// ends.
//
// Thread safety: none. The owner's mutex guards every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"

namespace mesh::coordinator {

// The state of one waiter's wait, kept by the owner with the waiter.
struct KeyWait {
  std::vector<std::string> keys;
  // keys[0, next) were present when last looked at.
  size_t next = 0;
  // Whether the waiter is parked, on keys[next].
  bool parked = false;
};

class KeyWaitIndex {
 public:
  // The value of a key, or null when it is not set.
  using Lookup = absl::FunctionRef<const std::string*(const std::string&)>;

  KeyWaitIndex() = default;
  KeyWaitIndex(const KeyWaitIndex&) = delete;
  KeyWaitIndex& operator=(const KeyWaitIndex&) = delete;

  // Moves the wait of waiter `id` forward. Returns the values of all its
  // keys, in order, when every key is present (the waiter is then not
  // parked); otherwise parks it on the first missing key and returns
  // nullopt.
  std::optional<std::vector<std::string>> Advance(uint64_t id, KeyWait& wait, Lookup find);

  // Unparks and returns the waiters parked on `key`, in id order. Call when
  // `key` is set, then Advance each that is still pending.
  std::vector<uint64_t> Release(const std::string& key);

  // Unparks waiter `id` if `wait` is parked.
  void Unpark(uint64_t id, KeyWait& wait);

  // Forgets every parked waiter (their scope ended).
  void Clear();

  // Waiters parked, and keys with at least one parked waiter.
  size_t num_parked() const { return num_parked_; }
  size_t num_keys() const { return parked_.size(); }

 private:
  // Ordered sets: Release hands out ids in registration order, and Unpark is
  // O(log n) when many ranks wait on one key.
  absl::flat_hash_map<std::string, absl::btree_set<uint64_t>> parked_;
  size_t num_parked_ = 0;
};

}  // namespace mesh::coordinator
