// EtcdClient: the few etcd v3 calls the coordinator makes (KV Range and
// Txn, Watch, Lease), over stubs generated at build time from etcd's own .proto
// files as Debian ships them (protos/CMakeLists.txt). No HTTP gateway, no
// hand-written wire format.
//
// Endpoints: one channel per "host:port", tried in turn. A call goes to the
// endpoint that answered last; when that one is unreachable (UNAVAILABLE
// from gRPC, not from etcd) it moves on to the next, within the call's one
// deadline. Any member serves any call: etcd forwards writes to its leader.
//
// Retries and writes: each call first waits (a share of its deadline) for
// its endpoint's connection; one that does not connect is skipped, since
// nothing was sent. A Txn that fails in transit may or may not have been
// applied, so the client retries it on another endpoint only when it was
// never sent; otherwise it returns
// the error (UNAVAILABLE or DEADLINE_EXCEEDED), and callers whose Txn
// compares revisions can tell from a read whether it took effect.
//
// Errors: UNAVAILABLE (no endpoint reachable; etcd without quorum or
// leader; no answer within the call timeout, which is how etcd treats a
// request it cannot serve: for a Txn the message then says its outcome is
// unknown); RESOURCE_EXHAUSTED
// (a request over etcd's size limit, or etcd's space quota is full);
// UNAUTHENTICATED / PERMISSION_DENIED (TLS or etcd auth); INVALID_ARGUMENT
// (a request etcd refuses as malformed); INTERNAL otherwise. Messages name
// the endpoint and carry etcd's own message.
//
// Thread safety: thread-safe; calls run concurrently.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace mesh::coordinator {

struct EtcdClientOptions {
  // "host:port" of each member; at least one.
  std::vector<std::string> endpoints;
  // TLS: a CA file turns it on (the members' certificates must chain to it);
  // a certificate and key, both or neither, authenticate this client.
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  // Each call's deadline, retries on other endpoints included.
  absl::Duration call_timeout = absl::Seconds(5);
  // How long Connect waits for the first member to answer.
  absl::Duration connect_timeout = absl::Seconds(10);
};

struct EtcdKeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;
};

struct EtcdRangeResult {
  std::vector<EtcdKeyValue> kvs;
  bool more = false;  // More keys matched than `limit`.
  int64_t revision = 0;
};

// A transaction: if every compare holds, the puts and deletes, atomically.
class EtcdTxn {
 public:
  enum class Target { kModRevision, kCreateRevision, kValue };
  struct Compare {
    std::string key;
    Target target = Target::kModRevision;
    int64_t revision = 0;  // kModRevision, kCreateRevision; 0: the key is absent.
    std::string value;     // kValue.
  };
  struct Op {
    std::string key;
    std::string value;
    int64_t lease = 0;
    bool is_delete = false;
  };

  // The key's mod (create) revision is `revision`; 0: the key does not exist.
  EtcdTxn& IfModRevision(std::string key, int64_t revision);
  EtcdTxn& IfCreateRevision(std::string key, int64_t revision);
  EtcdTxn& IfValue(std::string key, std::string value);
  EtcdTxn& Put(std::string key, std::string value, int64_t lease = 0);
  EtcdTxn& Delete(std::string key);

  const std::vector<Compare>& compares() const { return compares_; }
  const std::vector<Op>& ops() const { return ops_; }

 private:
  std::vector<Compare> compares_;
  std::vector<Op> ops_;
};

struct EtcdTxnResult {
  bool succeeded = false;  // Every compare held, and the ops were applied.
  int64_t revision = 0;    // The store's revision after the Txn.
};

class EtcdClient {
 public:
  // Makes the channels and waits until one member answers (etcd's
  // Maintenance.Status), for at most options.connect_timeout.
  // Possible errors: INVALID_ARGUMENT (no endpoints, a malformed one, a
  // certificate without its key); FAILED_PRECONDITION (a TLS file that
  // cannot be read); UNAVAILABLE (no member answered: the message names
  // each endpoint and its last error).
  static absl::StatusOr<std::shared_ptr<EtcdClient>> Connect(EtcdClientOptions options);

  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // "host1:2379,host2:2379".
  std::string endpoints() const;
  bool tls() const;

  // The value of `key`; nullopt when it does not exist.
  absl::StatusOr<std::optional<EtcdKeyValue>> Get(const std::string& key) const;

  // Keys in [key, range_end) in key order, at most `limit` (0: no limit).
  absl::StatusOr<EtcdRangeResult> Range(const std::string& key, const std::string& range_end,
                                        int64_t limit = 0) const;

  // The range_end that makes Range cover every key starting with `prefix`.
  static std::string PrefixEnd(const std::string& prefix);

  absl::StatusOr<EtcdTxnResult> Txn(const EtcdTxn& txn) const;

  // ---- Watch --------------------------------------------------------------

  // Waits until `key` changes after store revision `revision` (a put or a
  // delete with a higher revision), for at most `timeout`: true when it
  // did (or etcd compacted that history away, so the caller must read the
  // key again), false when the timeout passed first. A change made between
  // the caller's read at `revision` and this call is reported at once:
  // the watch starts at revision + 1. One Watch stream on the current
  // endpoint, closed before returning.
  // Possible errors: UNAVAILABLE (the endpoint cannot be reached; no
  // failover to another one here, the caller simply asks again); those of
  // etcd, as in the header comment.
  absl::StatusOr<bool> WaitForChange(const std::string& key, int64_t revision,
                                     absl::Duration timeout) const;

  // ---- Leases -------------------------------------------------------------

  // A new lease of `ttl` (whole seconds, at least 1); its id.
  absl::StatusOr<int64_t> LeaseGrant(absl::Duration ttl) const;
  // Renews `lease` once; its remaining TTL. NOT_FOUND when it has expired.
  absl::StatusOr<absl::Duration> LeaseKeepAlive(int64_t lease) const;
  // Revokes `lease`, deleting the keys attached to it.
  absl::Status LeaseRevoke(int64_t lease) const;

 private:
  struct Endpoint;
  explicit EtcdClient(EtcdClientOptions options);

  // Runs `call` on the current endpoint, and on the others while an
  // endpoint is unreachable, within one call_timeout deadline. `idempotent`
  // calls are retried on any transport error; the others only when the
  // request cannot have been sent.
  template <typename Call>
  absl::Status Run(const char* what, bool idempotent, Call call) const;

  const EtcdClientOptions options_;
  std::vector<std::unique_ptr<Endpoint>> endpoints_;
  // The endpoint that answered last.
  mutable std::atomic<size_t> current_{0};
};

}  // namespace mesh::coordinator
