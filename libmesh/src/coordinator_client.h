// CoordinatorClient: libmesh's side of mesh.v1.WorkerService (internal).
//
// One object per worker process: it holds the channel to the coordinator and
// the process's RankIdentity, fills the RankContext of every request, gives
// every call a deadline and converts grpc::Status to absl::Status. Stores,
// and later the worker runtime (Join, Heartbeat, WatchJob, ReportError,
// Leave, the unique-ID broker), are built on it.
//
// It is an interface so that runtime unit tests can use a hand-written fake;
// NewGrpcCoordinatorClient returns the real one. Adding an RPC means one
// virtual here and, in the gRPC client, one method built on its generic
// unary-call helper (see coordinator_client.cc).
//
// Timeouts. Each method takes the caller's timeout. For a waiting call (a
// KvGet with wait, KvWait, a KvMultiGet with wait) it is how long the
// coordinator waits; for every call, the gRPC deadline is the timeout plus
// the client's deadline margin, so the coordinator's timeout, whose message
// names what was missing, normally fires before the transport's.
//
// Errors. Codes pass through unchanged (UNAVAILABLE stays UNAVAILABLE, and
// so on); the message is the server's or the transport's, prefixed with
// "WorkerService.<Rpc> to <target>: ". A code outside the canonical range
// becomes UNKNOWN. Method-specific errors are those of the RPC in
// protos/mesh/v1/worker.proto.
//
// Thread safety: implementations must be thread-safe; the gRPC one is.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "mesh/coordinator_store.h"

namespace grpc {
class Channel;
}  // namespace grpc

namespace mesh::internal {

struct KvCompareSetReply {
  bool swapped = false;
  bool present = false;  // Whether the key exists after the call.
  std::string value;     // Its value after the call; empty when absent.
};

struct KvListReply {
  std::vector<std::string> keys;  // Lexicographic order.
  bool truncated = false;         // More keys match; continue after keys.back().
};

struct KvStatsReply {
  int64_t num_keys = 0;
  int64_t total_bytes = 0;  // Keys plus values, as counted against the quota.
};

struct CoordinatorClientOptions {
  // Added to each call's timeout to form its gRPC deadline.
  absl::Duration deadline_margin = absl::Seconds(2);
};

class CoordinatorClient {
 public:
  virtual ~CoordinatorClient() = default;

  virtual const RankIdentity& identity() const = 0;
  // The coordinator's gRPC target, as given.
  virtual const std::string& target() const = 0;

  // ---- Key-value store of the caller's (job, generation) ----------------

  virtual absl::Status KvSet(absl::string_view key, absl::string_view value,
                             absl::Duration timeout) = 0;
  // wait=false: NOT_FOUND at once when the key is absent.
  virtual absl::StatusOr<std::string> KvGet(absl::string_view key, bool wait,
                                            absl::Duration timeout) = 0;
  virtual absl::StatusOr<int64_t> KvAdd(absl::string_view key, int64_t delta,
                                        absl::Duration timeout) = 0;
  // `expected` nullopt: the swap happens only when the key is absent.
  virtual absl::StatusOr<KvCompareSetReply> KvCompareSet(absl::string_view key,
                                                         std::optional<std::string> expected,
                                                         absl::string_view desired,
                                                         absl::Duration timeout) = 0;
  // Deletes the key, or with `prefix` every key starting with it; returns
  // how many were removed.
  virtual absl::StatusOr<int64_t> KvDelete(absl::string_view key, bool prefix,
                                           absl::Duration timeout) = 0;
  // `limit`: 0 means the server's default (1000); at most 10000.
  virtual absl::StatusOr<KvListReply> KvList(absl::string_view prefix,
                                             absl::string_view start_after, int limit,
                                             absl::Duration timeout) = 0;
  virtual absl::StatusOr<KvStatsReply> KvNumKeys(absl::Duration timeout) = 0;
  virtual absl::Status KvWait(absl::Span<const std::string> keys, absl::Duration timeout) = 0;
  virtual absl::StatusOr<std::vector<std::string>> KvMultiGet(absl::Span<const std::string> keys,
                                                              bool wait,
                                                              absl::Duration timeout) = 0;
  // keys.size() must equal values.size() (checked).
  virtual absl::Status KvMultiSet(absl::Span<const std::string> keys,
                                  absl::Span<const std::string> values, absl::Duration timeout) = 0;
};

// A plaintext channel to `target` that accepts replies of any size (the
// server's own message limit is the one that counts). gRPC channels are
// lazy: this never fails for an unreachable target.
std::shared_ptr<grpc::Channel> NewCoordinatorChannel(const std::string& target);

// The gRPC client. `channel` must not be null (checked) and may be shared
// with other clients; `target` is only used in messages.
std::shared_ptr<CoordinatorClient> NewGrpcCoordinatorClient(std::shared_ptr<grpc::Channel> channel,
                                                            std::string target,
                                                            RankIdentity identity,
                                                            CoordinatorClientOptions options = {});

}  // namespace mesh::internal
