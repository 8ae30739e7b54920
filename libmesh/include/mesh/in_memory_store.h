// InMemoryStore: a Store that lives in one process, for tests and for
// single-process multi-rank runs (ranks as threads).
//
// Blocking calls wait on the store's mutex with a deadline (no polling), and
// are released by the Set, Add, CompareSet or MultiSet that completes them,
// by their timeout (DEADLINE_EXCEEDED), or by Shutdown (UNAVAILABLE).
//
// Optional limits mirror the coordinator's KV limits, so code that must
// handle RESOURCE_EXHAUSTED can be tested without a coordinator.
//
// Lifecycle:
//
//   SERVING ──Shutdown() / ~InMemoryStore()──▶ SHUT_DOWN
//
// After Shutdown every call fails with UNAVAILABLE and every blocked call
// returns UNAVAILABLE at once. The destructor shuts down, then waits until
// the calls that were blocked in the store have returned; calls that start
// after the destructor has started are the caller's bug, as for any object.
//
// Errors: those of mesh::Store (store.h) that do not need a coordinator:
// INVALID_ARGUMENT, UNAVAILABLE (shut down), DEADLINE_EXCEEDED, NOT_FOUND
// (TryGet), RESOURCE_EXHAUSTED (a limit in InMemoryStoreOptions; nothing is
// stored then).
//
// Thread safety: thread-safe.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "mesh/store.h"

namespace mesh {

struct InMemoryStoreOptions {
  // Default timeout of blocking calls; positive and finite.
  absl::Duration timeout = Store::kDefaultTimeout;
  // Largest key and value, and most keys, the store accepts. Unlimited by
  // default.
  size_t max_key_bytes = std::numeric_limits<size_t>::max();
  size_t max_value_bytes = std::numeric_limits<size_t>::max();
  int64_t max_keys = std::numeric_limits<int64_t>::max();
};

class InMemoryStore final : public Store {
 public:
  // `options.timeout` must be positive and finite (checked).
  explicit InMemoryStore(InMemoryStoreOptions options = {});
  ~InMemoryStore() override;

  // Fails every blocked and later call with UNAVAILABLE. Idempotent.
  void Shutdown();

  // Calls blocked in Get, Wait or MultiGet right now (for tests that must
  // know a waiter is parked before they act).
  int NumBlocked() const;

 private:
  absl::Status DoSet(const std::string& key, absl::string_view value) override;
  absl::StatusOr<std::string> DoGet(const std::string& key, absl::Duration timeout) override;
  absl::StatusOr<std::string> DoTryGet(const std::string& key) override;
  absl::Status DoWait(absl::Span<const std::string> keys, absl::Duration timeout) override;
  absl::StatusOr<int64_t> DoAdd(const std::string& key, int64_t delta) override;
  absl::StatusOr<CompareSetResult> DoCompareSet(const std::string& key, absl::string_view expected,
                                                absl::string_view desired) override;
  absl::StatusOr<bool> DoDeleteKey(const std::string& key) override;
  absl::StatusOr<int64_t> DoNumKeys() override;
  absl::StatusOr<std::vector<std::string>> DoMultiGet(absl::Span<const std::string> keys,
                                                      absl::Duration timeout) override;
  absl::Status DoMultiSet(absl::Span<const std::string> keys,
                          absl::Span<const std::string> values) override;

  // Waits until every key is set, then returns their values (or just OK
  // when `values` is null). The one blocking path behind Get, Wait and
  // MultiGet.
  absl::Status AwaitKeysLocked(absl::Span<const std::string> keys, absl::Duration timeout,
                               std::vector<std::string>* values) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckOpenLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // RESOURCE_EXHAUSTED when the key or value is over its size limit.
  absl::Status CheckSizes(const std::string& key, absl::string_view value) const;
  // RESOURCE_EXHAUSTED when `new_keys` more keys would exceed max_keys.
  absl::Status CheckKeyCountLocked(int64_t new_keys) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Stores the value; the caller has checked the limits.
  void StoreLocked(const std::string& key, std::string value) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HasAllLocked(absl::Span<const std::string> keys) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const InMemoryStoreOptions options_;

  mutable absl::Mutex mu_;
  std::map<std::string, std::string, std::less<>> data_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  // Calls blocked in AwaitKeysLocked; the destructor waits for zero.
  int blocked_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace mesh
