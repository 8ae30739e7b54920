// CoordinatorStore: the coordinator's key-value store for one
// (job, generation), reached over gRPC (mesh.v1.WorkerService, Kv* calls).
//
// This is the store ranks of a job rendezvous through: Gloo contexts, ad-hoc
// exchanges between ranks, counters. Keys are shared by every rank of the
// job's current generation and vanish when the job moves to its next
// generation (a restart) or the coordinator restarts; they are not durable.
//
// Identity and fencing. Every call carries the caller's RankIdentity. The
// rank must have joined its generation (WorkerService.Join) before it uses
// the store; until then calls fail with FAILED_PRECONDITION. Once the job's
// generation has moved on or failed, or another process has joined as this
// rank (a different incarnation), every call fails with ABORTED: the process
// is stale and must stop, not retry.
//
// Blocking. Calls block the calling thread (a worker's own thread; the
// coordinator holds no thread for a waiting call). Get, Wait and MultiGet
// wait on the coordinator for up to their timeout and fail with
// DEADLINE_EXCEEDED naming the missing keys. Every call also carries a gRPC
// deadline of its timeout (the store's default for calls that take none)
// plus `rpc_margin`, so a lost coordinator cannot hang a rank.
//
// Errors: gRPC status codes map one to one onto absl codes, message kept
// and prefixed with the RPC and the coordinator's address. See store.h for
// their meaning; in short, UNAVAILABLE (coordinator unreachable or shutting
// down; retry), ABORTED (stale; stop), RESOURCE_EXHAUSTED (a KV limit of the
// coordinator: key size, value size, keys or bytes per generation; nothing
// stored), FAILED_PRECONDITION (not joined), NOT_FOUND (unknown job;
// TryGet of an absent key), INVALID_ARGUMENT, DEADLINE_EXCEEDED.
//
// CompareSet follows c10d's rule that an empty `expected` also matches an
// absent key. The wire call distinguishes "absent" from "empty", so a
// CompareSet with an empty `expected` on a key that holds "" takes a second
// round trip; each round trip is atomic on the coordinator.
//
// Connection. The channel is created lazily (gRPC's default): Create does
// not contact the coordinator, and calls fail fast with UNAVAILABLE while it
// cannot be reached (no wait-for-ready). The channel is insecure (plaintext
// h2c) for now.
//
// Thread safety: thread-safe. Calls from different threads run concurrently
// over one HTTP/2 channel.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "mesh/store.h"

namespace mesh {

namespace internal {
class CoordinatorClient;
}  // namespace internal

// Who is calling: the identity a worker process was started with (the
// MESH_JOB_ID, MESH_GENERATION and MESH_RANK environment variables) and the
// random incarnation it picked for itself.
struct RankIdentity {
  std::string job_id;
  int64_t generation = 0;
  int rank = 0;
  // Chosen once per process; a restarted process picks a new one, which
  // fences out its stale predecessor.
  uint64_t incarnation = 0;
};

struct CoordinatorStoreOptions {
  // The coordinator, as a gRPC target: "host:port", "dns:///host:port", ...
  std::string address;
  RankIdentity identity;
  // Default timeout of Get, Wait and MultiGet, and the deadline budget of
  // every other call. Positive and finite.
  absl::Duration timeout = Store::kDefaultTimeout;
  // Added to a call's timeout to form its gRPC deadline, so that the
  // coordinator's own timeout (whose message names the missing keys) fires
  // first. Non-negative.
  absl::Duration rpc_margin = absl::Seconds(2);
  // Credentials (docs/security.md): a bearer token sent with every call, and
  // TLS files (tls_ca empty: plaintext), as MESH_TOKEN and MESH_TLS_* in
  // mesh/runtime.h.
  std::string auth_token;
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_server_name;
};

class CoordinatorStore final : public Store {
 public:
  // Creates a store with its own channel to `options.address`.
  // Possible errors: INVALID_ARGUMENT for an empty address or job id, a
  // negative rank or generation, a timeout that is not positive and finite,
  // or a negative margin, and the errors of the TLS settings (a token
  // without a CA, an unreadable file).
  static absl::StatusOr<std::unique_ptr<CoordinatorStore>> Create(
      const CoordinatorStoreOptions& options);

  // For libmesh internals: a store over an existing client, sharing its
  // channel and identity with the rest of the worker runtime. `client` must
  // not be null and `timeout` must be positive and finite (checked).
  CoordinatorStore(std::shared_ptr<internal::CoordinatorClient> client, absl::Duration timeout);
  ~CoordinatorStore() override;

  const RankIdentity& identity() const;
  // The coordinator's address, as given.
  const std::string& address() const;

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

  // The RPC layer (stub, channel, identity); opaque here so that this header
  // exposes no gRPC or protobuf type.
  const std::shared_ptr<internal::CoordinatorClient> client_;
};

}  // namespace mesh
