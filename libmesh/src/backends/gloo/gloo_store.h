// GlooStore: gloo's rendezvous store interface over any mesh::Store
// (internal to libmesh).
//
// gloo::rendezvous::Context::connectFullMesh exchanges transport addresses
// through a gloo::rendezvous::Store; this adapter lets it use a
// CoordinatorStore (or, in tests, an InMemoryStore), usually through a
// PrefixStore per process group so that groups never share keys.
//
// gloo 0.5's interface is set / get / wait(keys) / wait(keys, timeout); it
// has no add or multi-get, so neither is adapted.
//
// Timeouts: wait(keys, timeout) waits for `timeout`; gloo's kNoTimeout (0)
// and wait(keys) use the mesh store's default timeout, since a mesh store
// never waits forever. get(key) blocks for up to the mesh store's default
// timeout (gloo's own stores block in get too).
//
// Errors: gloo reports errors by throwing, and this adapter runs inside
// gloo's calls, so a failed Status becomes an exception whose what() keeps
// the operation, the key(s), the absl code and the full message, e.g.
//   mesh store: get 'pg0/1': DEADLINE_EXCEEDED: timed out after 30s waiting
//   for key(s) 'pg0/1'
// Codes that mean the store could not deliver (DEADLINE_EXCEEDED,
// UNAVAILABLE, ABORTED, CANCELLED, RESOURCE_EXHAUSTED, NOT_FOUND, DATA_LOSS,
// INTERNAL, UNKNOWN) throw StoreIoException, a gloo::IoException, as gloo's
// own stores do on I/O failures and timeouts. Codes that mean the call or the
// caller's state is wrong (INVALID_ARGUMENT, FAILED_PRECONDITION,
// OUT_OF_RANGE, UNIMPLEMENTED, ALREADY_EXISTS, PERMISSION_DENIED,
// UNAUTHENTICATED) throw StoreEnforceNotMet, a gloo::EnforceNotMet, as a
// failed GLOO_ENFORCE does. Both carry the original absl::Status, so the
// code that called into gloo can turn the exception back into a Status.
//
// Batching: gloo 0.5's connectFullMesh has each member set "rank_<rank>" (its
// host name) and "<rank>" (its addresses), then get the host names of the
// lower ranks and wait for and get "<i>" of every peer, one key at a time:
// O(n) store round trips per member, O(n^2) coordinator RPCs per group of
// n. Given the group size, the adapter serves the first read of a key of
// either family with one blocking MultiGet of that whole family and answers
// the rest from a local cache, so each member costs two sets and two
// MultiGets whatever n is. Other keys go straight to the store.
//
// Thread safety: thread-safe (mesh stores are; the cache has its own mutex).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/store.h>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "mesh/store.h"

namespace mesh::gloo_backend {

class StoreIoException final : public ::gloo::IoException {
 public:
  StoreIoException(const std::string& what, absl::Status status)
      : ::gloo::IoException(what), status_(std::move(status)) {}
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

class StoreEnforceNotMet final : public ::gloo::EnforceNotMet {
 public:
  StoreEnforceNotMet(const char* file, int line, const std::string& what, absl::Status status)
      : ::gloo::EnforceNotMet(file, line, "status.ok()", what), status_(std::move(status)) {}
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

// Does nothing for OK; otherwise throws the exception described above, its
// message "mesh store: <operation>: <status.ToString()>".
void ThrowIfError(const absl::Status& status, const std::string& operation);

class GlooStore final : public ::gloo::rendezvous::Store {
 public:
  // `store` must not be null (checked); it is shared so that it outlives
  // every gloo object holding this adapter.
  // `group_size` > 0 turns on batching (see above) for keys "0".."size-1".
  explicit GlooStore(std::shared_ptr<mesh::Store> store, int group_size = 0);
  ~GlooStore() override;

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  const std::shared_ptr<mesh::Store>& store() const { return store_; }

 private:
  // True when every key is a member rank and batching is on; then the
  // member keys are fetched (once) and cached, waiting up to `timeout`.
  bool ServeFromCache(const std::vector<std::string>& keys, absl::Duration timeout);

  const std::shared_ptr<mesh::Store> store_;
  const int group_size_;
  absl::Mutex mu_;
  // Key families ("" and "rank_") already fetched whole.
  absl::flat_hash_set<std::string> fetched_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::string> cache_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mesh::gloo_backend
