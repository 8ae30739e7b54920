// Store: the key-value store ranks rendezvous through.
//
// The interface follows PyTorch's c10d::Store (set/get/add/compareSet/wait/
// multiGet/multiSet/deleteKey/numKeys), with two differences: errors are
// absl::Status values instead of exceptions, and every blocking call has a
// finite timeout (the store's default unless the call gives one), because a
// rank that waits forever for a peer that died is a hang, not an error.
//
// Implementations:
//   InMemoryStore     (mesh/in_memory_store.h)    one process; tests.
//   PrefixStore       (mesh/prefix_store.h)       a namespace inside another store.
//   CoordinatorStore  (mesh/coordinator_store.h)  the coordinator's store for one
//                                                 (job, generation), over gRPC.
//
// Keys are non-empty byte strings; values are arbitrary byte strings (NUL
// bytes included). A key's value is readable by every user of the store as
// soon as the call that wrote it returns.
//
// Errors every operation may return:
//   INVALID_ARGUMENT    an empty key, a timeout that is not positive and
//                       finite, or MultiSet lists of different lengths.
//   UNAVAILABLE         the store is shut down or unreachable; retrying the
//                       call later may succeed.
// and, from a CoordinatorStore, those of mesh.v1.WorkerService:
//   ABORTED             the caller's generation is stale or has failed, or
//                       another process joined as its rank (incarnation); the
//                       caller must stop using this store.
//   FAILED_PRECONDITION the rank has not joined its generation yet.
//   NOT_FOUND           unknown job.
//   RESOURCE_EXHAUSTED  a key, value or per-generation quota limit was hit;
//                       nothing was stored.
//   DEADLINE_EXCEEDED   the call's RPC deadline passed.
// Operation-specific errors are listed with each method.
//
// Thread safety: every method of every Store is thread-safe; one Store may
// be shared by all threads of a process.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace mesh {

// Outcome of Store::CompareSet.
struct CompareSetResult {
  // Whether `desired` was stored.
  bool swapped = false;
  // Whether the key exists after the call.
  bool present = false;
  // The key's value after the call; empty when it is absent.
  std::string value;
};

class Store {
 public:
  // c10d's default store timeout.
  static constexpr absl::Duration kDefaultTimeout = absl::Minutes(5);

  virtual ~Store() = default;

  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // The timeout of blocking calls that give none (Get, Wait, MultiGet), and
  // the RPC deadline budget of a remote store's other calls.
  absl::Duration timeout() const;
  // Possible errors: INVALID_ARGUMENT when `timeout` is not positive and
  // finite; the old timeout is kept then.
  absl::Status SetTimeout(absl::Duration timeout);

  // Stores `value` under `key`, replacing any value, and releases every
  // call blocked on the key.
  absl::Status Set(absl::string_view key, absl::string_view value);

  // Returns the key's value, blocking until it is set.
  // Possible errors: DEADLINE_EXCEEDED naming the key when it is not set
  // within the timeout.
  absl::StatusOr<std::string> Get(absl::string_view key);
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout);

  // Returns the key's value without blocking.
  // Possible errors: NOT_FOUND naming the key when it is not set.
  absl::StatusOr<std::string> TryGet(absl::string_view key);

  // Blocks until every key is set. An empty list succeeds at once.
  // Possible errors: DEADLINE_EXCEEDED naming the keys still missing.
  absl::Status Wait(absl::Span<const std::string> keys);
  absl::Status Wait(absl::Span<const std::string> keys, absl::Duration timeout);

  // Atomically adds `delta` to the key's value, read as a decimal int64 (an
  // absent key counts as 0), stores the sum in decimal and returns it. Like
  // Set, it releases calls blocked on the key, which is what makes Add
  // usable as a counter barrier.
  // Possible errors: INVALID_ARGUMENT when the value is not a decimal int64
  // or the sum overflows int64; the value is unchanged then.
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta);

  // Atomically stores `desired` when the key's value equals `expected`, with
  // c10d's rule for absent keys: an empty `expected` also matches an absent
  // key (so CompareSet(k, "", v) creates k), and a non-empty `expected`
  // never matches an absent key. The result says whether the swap happened
  // and what the key holds afterwards.
  //
  // c10d's compareSet returns a single string; it equals
  //   swapped ? desired : (present ? value : expected)
  // (for an absent key and a non-empty `expected`, c10d returns `expected`
  // although the key holds nothing; `present` tells that case apart here).
  absl::StatusOr<CompareSetResult> CompareSet(absl::string_view key, absl::string_view expected,
                                              absl::string_view desired);

  // Removes the key; returns whether it existed. Calls blocked on the key
  // keep waiting for a later Set.
  absl::StatusOr<bool> DeleteKey(absl::string_view key);

  // Number of keys in the store. For a PrefixStore, see prefix_store.h.
  absl::StatusOr<int64_t> NumKeys();

  // Values of `keys`, in order, blocking until all are set. An empty list
  // returns an empty vector at once.
  // Possible errors: DEADLINE_EXCEEDED naming the keys still missing.
  absl::StatusOr<std::vector<std::string>> MultiGet(absl::Span<const std::string> keys);
  absl::StatusOr<std::vector<std::string>> MultiGet(absl::Span<const std::string> keys,
                                                    absl::Duration timeout);

  // Stores values[i] under keys[i], all or nothing (on error nothing is
  // stored); a key listed twice gets its last value.
  absl::Status MultiSet(absl::Span<const std::string> keys, absl::Span<const std::string> values);

 protected:
  // `timeout` must be positive and finite (checked: a bad default timeout
  // is a programmer error).
  explicit Store(absl::Duration timeout);

  // DEADLINE_EXCEEDED naming `missing`; shared by implementations so that
  // timeouts read alike.
  static absl::Status KeyTimeoutError(absl::Span<const std::string> missing,
                                      absl::Duration timeout);

 private:
  // The public methods validate their arguments (non-empty keys, a positive
  // finite timeout, matching MultiSet lengths, non-empty key lists) and fill
  // in the default timeout before calling these, so implementations see
  // only valid input. One code path per operation: the timeout-less
  // overloads go through the same Do* call.
  virtual absl::Status DoSet(const std::string& key, absl::string_view value) = 0;
  virtual absl::StatusOr<std::string> DoGet(const std::string& key, absl::Duration timeout) = 0;
  virtual absl::StatusOr<std::string> DoTryGet(const std::string& key) = 0;
  virtual absl::Status DoWait(absl::Span<const std::string> keys, absl::Duration timeout) = 0;
  virtual absl::StatusOr<int64_t> DoAdd(const std::string& key, int64_t delta) = 0;
  virtual absl::StatusOr<CompareSetResult> DoCompareSet(const std::string& key,
                                                        absl::string_view expected,
                                                        absl::string_view desired) = 0;
  virtual absl::StatusOr<bool> DoDeleteKey(const std::string& key) = 0;
  virtual absl::StatusOr<int64_t> DoNumKeys() = 0;
  virtual absl::StatusOr<std::vector<std::string>> DoMultiGet(absl::Span<const std::string> keys,
                                                              absl::Duration timeout) = 0;
  virtual absl::Status DoMultiSet(absl::Span<const std::string> keys,
                                  absl::Span<const std::string> values) = 0;

  // absl::Duration is not trivially copyable into std::atomic; nanoseconds
  // cover 292 years, far beyond any sensible timeout.
  std::atomic<int64_t> timeout_ns_;
};

}  // namespace mesh
