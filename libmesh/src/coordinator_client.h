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
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/security.h"
#include "mesh/coordinator_store.h"
#include "mesh/runtime.h"

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
  // When non-empty, every call (the WatchJob stream included) carries the
  // metadata "authorization: Bearer <auth_token>" (MESH_TOKEN). Must be
  // a valid header value (printable ASCII).
  std::string auth_token;
};

// ---- Worker runtime: rendezvous, liveness, failure (mesh/runtime.h) ---------

struct JoinParams {
  // The caller's host; ranks are grouped into nodes by it.
  std::string host;
  // "cpu" or "cuda" (empty: not sent) and the ordinal (-1 for cpu).
  std::string device_kind;
  int device_index = -1;
  // Rank 0 only, optional: the world's 128-byte ncclUniqueId.
  std::string nccl_unique_id;
  // How long the coordinator waits for the whole world.
  absl::Duration timeout = absl::Minutes(5);
};

// JoinResponse, as plain C++.
struct JoinResult {
  int rank = 0;
  int world_size = 0;
  int local_rank = 0;
  int local_world_size = 0;
  int node_rank = 0;
  int num_nodes = 0;
  std::vector<int64_t> mesh_shape;
  std::vector<std::string> mesh_dim_names;
  int64_t generation = 0;
  std::string nccl_unique_id;
  absl::Duration heartbeat_interval;
  absl::Duration heartbeat_timeout;
  int64_t membership_epoch = 0;
  bool in_place = false;
  std::string in_place_dim;
};

// Why the caller's generation failed (mesh.v1.JobError).
struct JobErrorInfo {
  int rank = -1;  // -1 when the cause is not a rank.
  std::string host;
  std::string reason;
  int64_t generation = 0;
  // One line for people, naming the job, generation, rank and host.
  std::string message;
  // The coordinator diagnosed a hang (docs/hangs.md).
  bool hang = false;
};

// What a heartbeat returns.
struct HeartbeatReplyInfo {
  // Set once the caller's generation has failed.
  std::optional<JobErrorInfo> error;
  // The coordinator lacks the members of a group sent without them: send
  // every group's members next time.
  bool send_members = false;
  // In-place recovery: the membership epoch and the ranks lost so far.
  int64_t membership_epoch = 0;
  std::vector<JobErrorInfo> lost;
};

// One AliveRanks round (mesh.v1.AliveRanksResponse).
struct AliveRanksReply {
  int64_t round = 0;
  int64_t membership_epoch = 0;
  std::vector<std::pair<int, uint64_t>> ranks;  // (rank, incarnation), ascending.
};

struct JobEventInfo {
  enum Kind { kWatching, kError };
  Kind kind = kWatching;
  JobErrorInfo error;  // For kError.
};

// An open WatchJob stream.
// Thread safety: Next is called by one thread at a time; Cancel may be
// called from any thread, also while Next blocks.
class JobWatch {
 public:
  virtual ~JobWatch() = default;
  // Blocks for the next event. nullopt when the stream ended with OK (after
  // its ERROR event); the stream's status when it ended otherwise
  // (CANCELLED after Cancel, UNAVAILABLE when the coordinator went away,
  // ABORTED for a generation that had already failed, ...).
  virtual absl::StatusOr<std::optional<JobEventInfo>> Next() = 0;
  // Ends the stream: a blocked or later Next returns CANCELLED.
  virtual void Cancel() = 0;
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

  // ---- Worker runtime (mesh/runtime.h) ----------------------------------
  // Not pure: the defaults return UNIMPLEMENTED, so that fakes serving only
  // the store need not implement them. The gRPC client implements them all.

  // Registers the caller and waits up to params.timeout for the world.
  virtual absl::StatusOr<JoinResult> Join(const JoinParams& params);
  // Sends the caller's collective progress (a group's members only where
  // the report has them). The reply carries the job's error when the
  // caller's generation has failed.
  virtual absl::StatusOr<HeartbeatReplyInfo> Heartbeat(absl::Span<const GroupProgressReport> groups,
                                                       absl::Duration timeout);
  virtual absl::Status ReportError(absl::string_view reason, absl::Duration timeout);
  virtual absl::Status Leave(absl::Duration timeout);
  // Waits up to `timeout` for every live rank to call too.
  virtual absl::StatusOr<AliveRanksReply> AliveRanks(absl::Duration timeout);
  // Opens the stream; its first event is WATCHING once it is live. The call
  // itself has no deadline (it lasts as long as the job); Cancel ends it.
  virtual absl::StatusOr<std::unique_ptr<JobWatch>> WatchJob();

  // The NCCL unique-ID broker: one round trip each, however many ids.
  virtual absl::Status PublishUniqueIds(absl::Span<const std::pair<std::string, std::string>> ids,
                                        absl::Duration timeout);
  // Waits up to `timeout` for every key; ids in the order of `keys`.
  virtual absl::StatusOr<std::vector<std::string>> GetUniqueIds(absl::Span<const std::string> keys,
                                                                absl::Duration timeout);
};

// A plaintext channel to `target` that accepts replies of any size (the
// server's own message limit is the one that counts). gRPC channels are
// lazy: this never fails for an unreachable target.
// A channel to the coordinator at `target` with `security`'s TLS settings
// (its token is ignored: CoordinatorClientOptions.auth_token sends it per
// call). Errors of security::MakeChannel.
absl::StatusOr<std::shared_ptr<grpc::Channel>> NewCoordinatorChannel(
    const std::string& target, const security::ClientSecurity& security = {});

// The TLS settings of a worker's config (no token).
security::ClientSecurity ChannelSecurityOf(const WorkerConfig& config);

// The gRPC client. `channel` must not be null (checked) and may be shared
// with other clients; `target` is only used in messages.
std::shared_ptr<CoordinatorClient> NewGrpcCoordinatorClient(std::shared_ptr<grpc::Channel> channel,
                                                            std::string target,
                                                            RankIdentity identity,
                                                            CoordinatorClientOptions options = {});

// The gRPC client of `targets`: one coordinator's host:port, or the
// comma-separated addresses of its replicas (docs/ha.md), with a channel
// each. A call that gets UNAVAILABLE from one replica (a standby, or one
// that is down) fails, and the next call goes to the next replica, so the
// callers' retries (Join, heartbeats, the stores' waits) find the leader.
// Possible errors: INVALID_ARGUMENT (no address); those of
// NewCoordinatorChannel.
absl::StatusOr<std::shared_ptr<CoordinatorClient>> NewGrpcCoordinatorClient(
    const std::string& targets, const security::ClientSecurity& security, RankIdentity identity,
    CoordinatorClientOptions options = {});

}  // namespace mesh::internal
