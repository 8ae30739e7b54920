// Runtime: a worker process's connection to its job, as torch.distributed's
// init_process_group plus torchrun's environment, with failure propagation.
//
//   absl::StatusOr<std::unique_ptr<mesh::Runtime>> rt = mesh::Runtime::Init();
//   auto mesh = (*rt)->InitDeviceMesh({2, 4}, {"dp", "tp"});
//   ... collectives on mesh->GetGroup("tp") ...
//   (*rt)->Shutdown();
//
// Init reads the worker environment the agent sets (docs/runtime.md has the
// full contract):
//
//   MESH_COORDINATOR       host:port of the coordinator        required
//   MESH_JOB_ID            the job                             required
//   MESH_GENERATION        the job's generation (>= 0)         required
//   MESH_RANK              this worker's rank                  required
//   MESH_WORLD_SIZE        number of ranks                     required
//   MESH_LOCAL_RANK        rank among the host's workers       optional, cross-checked
//   MESH_LOCAL_WORLD_SIZE  number of workers on the host       optional, cross-checked
//   MESH_NODE_RANK         index of the host                   optional, cross-checked
//   MESH_NODE_NAME         the node, as the coordinator groups optional; default: the
//                          ranks (the agent's name)                host name
//   MESH_TOKEN             sent as "authorization: Bearer <t>" optional
//   MESH_TLS_CA            PEM CA that verifies the            optional; unset:
//                          coordinator (TLS)                       plaintext
//   MESH_TLS_CERT/_KEY     client certificate and key (mTLS)   optional, with the CA
//   MESH_TLS_SERVER_NAME   name checked in the server's cert   optional
//   MESH_METRICS_PORT      serve Prometheus /metrics on        optional; unset: no
//                          0.0.0.0:port (0: a free port)           metrics
//   MESH_AGENT_SOCKET      the local agent's Unix socket: every optional; unset: the
//                          WorkerService call goes through its     coordinator directly
//                          rank relay (docs/rendezvous.md)
//
// A field set in RuntimeOptions wins over its variable. Then Init:
//   1. picks a random incarnation (fences out a stale process with this rank);
//   2. on rank 0, asks the backend for the world's unique ID (NCCL), if it
//      has one;
//   3. joins through the coordinator (one RPC that waits for the whole world,
//      bounded by join_timeout, and is retried while the coordinator is
//      unreachable) and cross-checks the reply with the configuration;
//   4. starts heartbeats at the interval the join reply gives;
//   5. opens the job's WatchJob stream and waits until it is live;
//   6. makes the backend's ProcessGroupFactory over the coordinator's store;
//   7. with MESH_METRICS_PORT, serves the worker metrics of docs/metrics.md
//      and wraps the factory so that every group records its collectives.
//      Metrics never fail a job: a malformed or busy port is logged to
//      stderr and the Runtime runs without them. A process serves one
//      /metrics: Runtimes of one process (ranks as threads) share it.
//
// Lifecycle:
//
//   Init ──▶ RUNNING ──job error (watch, heartbeat reply, lost coordinator)──▶ FAILED
//              │                                                              │
//              └──────────── Shutdown() / destructor ──▶ SHUT_DOWN ◀──────────┘
//
// Failure is loud, not a hang. When the coordinator reports the job's error
// (a peer missed its heartbeats, exited, or called ReportError), the
// Runtime aborts every process group made through it, with an ABORTED
// status whose message is the coordinator's and names the failed rank and
// its host ("job j1 generation 0: rank 3 (host-b) failed: ..."). Pending
// and future collectives fail with it within about a heartbeat interval.
// If the coordinator itself cannot be reached for longer than the heartbeat
// timeout, the Runtime fails the same way with UNAVAILABLE: without it no
// failure could be propagated. health() then reports the error, and
// options.on_failure (if set) is called once.
//
// In-place recovery (JoinInfo::in_place, docs/elastic.md): a peer's loss is
// not the job's failure. The Runtime stays healthy; when a heartbeat reply
// first names a lost rank, it aborts every group made through it that
// includes that rank (ABORTED, naming the loss), and no other.
// mesh::ElasticMesh (mesh/elastic_mesh.h) rebuilds the mesh without it.
//
// Thread safety: all methods are thread-safe. InitDeviceMesh, World() (the
// first call) and DeviceMesh::Flatten are collective: every rank makes them
// in the same order.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "mesh/device_mesh.h"
#include "mesh/process_group.h"
#include "mesh/process_group_gloo.h"
#include "mesh/process_group_nccl.h"
#include "mesh/progress.h"

namespace mesh {

class Store;

namespace internal {
class CoordinatorClient;
class WorkerMetricsServer;
}  // namespace internal

// Who this worker is, after the environment and the options are merged.
struct WorkerConfig {
  std::string coordinator;
  std::string job_id;
  int64_t generation = 0;
  int rank = 0;
  int world_size = 0;
  // -1 when not given; then the coordinator's answer is taken as is.
  int local_rank = -1;
  int local_world_size = -1;
  int node_rank = -1;
  // Empty when not given.
  std::string auth_token;
  // TLS to the coordinator (docs/security.md); tls_ca empty: plaintext.
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_server_name;
  // The local agent's rank relay (MESH_AGENT_SOCKET, a Unix socket path);
  // empty: calls go to `coordinator`.
  std::string agent_socket;
};

// Looks up an environment variable; nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
// std::getenv.
std::optional<std::string> ProcessEnv(const std::string& name);

// What the coordinator said at Join, as checked against the configuration.
struct JoinInfo {
  std::string job_id;
  int64_t generation = 0;
  int rank = 0;
  int world_size = 0;
  int local_rank = 0;
  int local_world_size = 0;
  int node_rank = 0;
  int num_nodes = 0;
  // The job's mesh, outermost first; InitDeviceMesh() without arguments
  // builds it.
  std::vector<int64_t> mesh_shape;
  std::vector<std::string> mesh_dim_names;
  // This process's host name and incarnation as sent in the Join.
  std::string host;
  uint64_t incarnation = 0;
  absl::Duration heartbeat_interval;
  absl::Duration heartbeat_timeout;
  // The world's unique ID (128 bytes) when rank 0's backend supplied one.
  std::string world_unique_id;
  // The membership epoch at the join (in-place recovery, docs/elastic.md;
  // 0 otherwise).
  int64_t membership_epoch = 0;
  // The job recovers in place (docs/elastic.md): a rank that dies after
  // the world formed is lost, and the others carry on (mesh/elastic_mesh.h).
  bool in_place = false;
  // With in_place: the mesh dimension the job names for dropping replicas
  // (JobSpec.in_place_dim); empty when not named.
  std::string in_place_dim;
};

// One agreement on the live ranks of the generation (Runtime::AliveRanks).
struct AliveRanksResult {
  struct Rank {
    int rank = 0;
    uint64_t incarnation = 0;  // The process that holds it.
  };
  int64_t round = 0;             // 1, 2, ... per generation.
  int64_t membership_epoch = 0;  // When the round completed.
  std::vector<Rank> ranks;       // Ascending by rank.
};

// What a backend's factory is made from.
struct BackendContext {
  JoinInfo join;
  // The coordinator's key-value store for this rank's (job, generation).
  std::shared_ptr<Store> store;
  // The RPC client, for backends inside libmesh that use the coordinator's
  // unique-ID broker (PublishUniqueIds / GetUniqueIds).
  std::shared_ptr<internal::CoordinatorClient> coordinator;
  ProcessGroupOptions group_options;
};

// A collective backend, as a pair of hooks; see GlooBackend() and the NCCL
// backend's own header.
struct RuntimeBackend {
  // "gloo", "nccl"; for messages.
  std::string name;
  // Rank 0 only, before Join, when set: the world communicator's unique ID
  // (e.g. 128 bytes from ncclGetUniqueId), which the coordinator hands to
  // every rank in its join reply (JoinInfo::world_unique_id).
  std::function<absl::StatusOr<std::string>()> make_world_unique_id;
  // After Join: the factory every group of this Runtime is made with.
  // Required.
  std::function<absl::StatusOr<std::shared_ptr<ProcessGroupFactory>>(const BackendContext&)>
      make_factory;
};

// CPU collectives over Gloo (mesh/process_group_gloo.h), rendezvousing
// through the coordinator's store. `options.group` is replaced by
// RuntimeOptions::group_options; set `options.hostname` (e.g. "127.0.0.1")
// or `options.iface` to choose the address peers connect to.
RuntimeBackend GlooBackend(GlooOptions options = {});

// GPU collectives over NCCL (mesh/process_group_nccl.h). Rank 0 generates the
// world ncclUniqueId before Join; the coordinator hands it to every rank, so
// the world communicator costs no extra round trip. Per-dim groups are split
// from it (ncclCommSplit) or, where split is unavailable, get unique IDs
// through the coordinator's broker (PublishUniqueIds/GetUniqueIds): one
// publish and one wait per NewGroups call, whatever the number of groups.
// In builds without NCCL the factory fails with UNIMPLEMENTED.
struct NcclBackendOptions {
  // The GPU of this rank; unset means NcclDefaultDeviceIndex's choice.
  std::optional<int> device_index;
  NcclGroupCreation group_creation = NcclGroupCreation::kAuto;
  // Where ops run: each group's own stream (overlapping the caller's later
  // work) or the caller's current stream (lighter on the host).
  NcclStreamMode stream_mode = NcclStreamMode::kGroupStream;
  // Bound on creating one batch of communicators.
  absl::Duration init_timeout = absl::Minutes(5);
  // The world communicator from several roots, one per ranks_per_root
  // ranks (NcclProcessGroupFactoryOptions): by default where the world is
  // larger than that and NCCL is >= 2.23. The roots' unique IDs go through
  // the coordinator's unique-ID broker, scoped to the generation.
  NcclWorldInit world_init = NcclWorldInit::kAuto;
  int ranks_per_root = 1024;
};
RuntimeBackend NcclBackend(NcclBackendOptions options = {});

// The CUDA ordinal a rank drives when NcclBackendOptions::device_index is
// unset: cuda:<local_rank> when the process sees at least one device per
// local rank (all of the host's GPUs are visible, as under torchrun), else
// cuda:0 (CUDA_VISIBLE_DEVICES already narrowed the process to its own GPUs,
// as the Mesh agent does for a job with gpus_per_proc).
int NcclDefaultDeviceIndex(int local_rank, int local_world_size, int visible_devices);

struct RuntimeOptions {
  // Each field overrides its environment variable (see the top of this file);
  // unset fields are read from the environment.
  std::optional<std::string> coordinator;      // MESH_COORDINATOR
  std::optional<std::string> job_id;           // MESH_JOB_ID
  std::optional<int64_t> generation;           // MESH_GENERATION
  std::optional<int> rank;                     // MESH_RANK
  std::optional<int> world_size;               // MESH_WORLD_SIZE
  std::optional<int> local_rank;               // MESH_LOCAL_RANK
  std::optional<int> local_world_size;         // MESH_LOCAL_WORLD_SIZE
  std::optional<int> node_rank;                // MESH_NODE_RANK
  std::optional<std::string> auth_token;       // MESH_TOKEN
  std::optional<std::string> tls_ca;           // MESH_TLS_CA
  std::optional<std::string> tls_cert;         // MESH_TLS_CERT
  std::optional<std::string> tls_key;          // MESH_TLS_KEY
  std::optional<std::string> tls_server_name;  // MESH_TLS_SERVER_NAME
  std::optional<std::string> agent_socket;     // MESH_AGENT_SOCKET
  std::optional<int> metrics_port;             // MESH_METRICS_PORT
  // Where unset fields come from; null reads nothing (every required field
  // must then be set), which is what tests running ranks as threads want.
  EnvLookup env = ProcessEnv;

  // Sent in the Join: the node this rank runs on, which the coordinator
  // groups ranks by. Empty means MESH_NODE_NAME, else gethostname().
  std::string host;
  // The device this rank drives, for the coordinator's records: "cpu" or
  // "cuda" and the ordinal (-1 for cpu).
  std::string device_kind = "cpu";
  int device_index = -1;

  // How long Join waits for the whole world.
  absl::Duration join_timeout = absl::Minutes(5);
  // The deadline of the runtime's other RPCs (WatchJob's first event,
  // Heartbeat, ReportError, Leave). Leave, at Finish and Shutdown, is tried
  // again while the coordinator is unavailable, within this deadline.
  absl::Duration rpc_timeout = absl::Seconds(30);
  // Default timeout of the store's blocking calls.
  absl::Duration store_timeout = absl::Minutes(5);
  // Options of every process group.
  ProcessGroupOptions group_options;

  RuntimeBackend backend = GlooBackend();

  // Called once, from a runtime thread, when the job fails (with the status
  // the groups were aborted with). Must not call Shutdown or destroy the
  // Runtime.
  std::function<void(const absl::Status&)> on_failure;
};

// Merges `options` and the environment (options.env) into a WorkerConfig.
// Possible errors: INVALID_ARGUMENT naming the variable (and saying whether
// the value came from RuntimeOptions or the environment) when a required
// value is missing or a value is malformed or out of range: a coordinator
// that is not host:port, a job id outside [A-Za-z0-9._-]{1,128}, a negative
// generation, a rank outside [0, world size), a world size < 1, a local rank
// outside [0, local world size), a local world size outside
// [1, world size], a negative node rank, a token with characters that
// cannot go in a header.
absl::StatusOr<WorkerConfig> ResolveWorkerConfig(const RuntimeOptions& options);

class Runtime {
 public:
  // Possible errors: those of ResolveWorkerConfig; the Join's (NOT_FOUND for
  // an unknown job, ABORTED for a stale generation or a failed one,
  // DEADLINE_EXCEEDED naming the ranks that did not join, UNAVAILABLE when
  // the coordinator cannot be reached); INVALID_ARGUMENT when the join reply
  // contradicts the configuration (e.g. MESH_WORLD_SIZE); the backend's
  // errors. A rank that fails after joining reports its error to the
  // coordinator, so that its peers fail promptly too.
  static absl::StatusOr<std::unique_ptr<Runtime>> Init(RuntimeOptions options = {});

  // Shutdown().
  ~Runtime();

  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  const JoinInfo& info() const { return info_; }
  int rank() const { return info_.rank; }
  int world_size() const { return info_.world_size; }

  // The coordinator's key-value store for this rank's (job, generation).
  const std::shared_ptr<Store>& store() const { return store_; }
  // The factory every group of this Runtime comes from; the Runtime aborts
  // all of its groups when the job fails.
  const std::shared_ptr<ProcessGroupFactory>& process_group_factory() const { return factory_; }

  // The collective progress of this Runtime's groups, sent with every
  // heartbeat for hang diagnosis (mesh/progress.h, docs/hangs.md). Every
  // group made through process_group_factory() is tracked already; a
  // caller that runs collectives through another library (the torch hook
  // of the Python package) adds its own groups here.
  const std::shared_ptr<ProgressRegistry>& progress() const { return progress_; }

  // The port this process serves /metrics on (see MESH_METRICS_PORT); 0
  // when it serves none.
  int metrics_port() const;

  // The group of all ranks. The first call is collective.
  // Possible errors: the job's error once it failed; the backend's.
  absl::StatusOr<std::shared_ptr<ProcessGroup>> World();

  // Collective: init_device_mesh over the world. The meshes of one Runtime
  // are numbered ("mesh0", "mesh1", ...) so their groups never collide.
  // Possible errors: the job's error once it failed; those of
  // DeviceMesh::Init.
  absl::StatusOr<DeviceMesh> InitDeviceMesh(std::vector<int64_t> shape,
                                            std::vector<std::string> dim_names = {});
  // The job's own mesh (JoinInfo::mesh_shape / mesh_dim_names).
  absl::StatusOr<DeviceMesh> InitDeviceMesh();

  // OK while the job runs; the job's error once it failed (ABORTED naming
  // the failed rank, or UNAVAILABLE for a lost coordinator); after Shutdown,
  // FAILED_PRECONDITION unless the job had failed before.
  absl::Status health() const;

  // Fails the job's generation on purpose, naming this rank and `reason`:
  // every rank (this one included) sees the job's error and aborts its
  // groups. Possible errors: the RPC's (then this rank still fails
  // locally with `reason`).
  absl::Status ReportError(absl::string_view reason);

  // Collective among the live ranks: returns, to every caller alike, the
  // ranks alive once each of them has called, with the process holding
  // each (WorkerService.AliveRanks; JAX's GetAliveTasks). A rank that dies
  // during the call is neither waited for nor listed, so the survivors of a
  // job with in-place recovery agree on who carries on (docs/elastic.md).
  // Without in-place recovery a death fails the job, and this call with it.
  // Possible errors: the job's error once it failed; DEADLINE_EXCEEDED
  // naming the live ranks that did not call within `timeout`; the RPC's.
  absl::StatusOr<AliveRanksResult> AliveRanks(absl::Duration timeout = absl::Minutes(5));

  // The membership epoch as of the latest heartbeat (in-place recovery:
  // one more each time a rank is lost or comes back; 0 otherwise).
  int64_t membership_epoch() const;

  // Leaves the job cleanly (so the coordinator does not declare this rank
  // dead) and stops the heartbeat and watch threads. Idempotent. Groups made
  // earlier stay usable while someone holds them, but a peer's failure no
  // longer aborts them; finish all collectives first, as with
  // torch.distributed.destroy_process_group. Possible errors: the Leave
  // RPC's (the threads stop anyway); none once the job has failed, since
  // then there is nothing to leave.
  absl::Status Shutdown();

  // The usual end of a worker, with `result` its own outcome:
  //   OK     -> Shutdown(); returns its status, prefixed "shutdown: ".
  //   error  -> ReportError(result) (its code and message; the message
  //             alone for UNKNOWN) unless the job has already failed (a
  //             peer's failure is already the job's error, and reporting it
  //             again would only blame this rank); returns `result`.
  // So `return (*rt)->Finish(Train(**rt)).ok() ? 0 : 1;` ends a worker.
  absl::Status Finish(absl::Status result);

  // Tests only: behaves as if this process hung — heartbeats and the watch
  // stop, nothing is sent to the coordinator, and the groups are left as
  // they are. The destructor then skips Leave.
  void SimulateHangForTesting();

 private:
  class Monitor;

  Runtime(RuntimeOptions options, WorkerConfig config);

  // Init after the configuration is known: Join, watch, heartbeats, factory.
  absl::Status Start();
  // MESH_METRICS_PORT: the process's metrics server and the metered
  // factory. An error means "no metrics", never a failed Init.
  absl::Status StartMetrics();
  // After a failure past Join: tells the coordinator (best effort) so that
  // peers fail at once instead of waiting for this rank, and fails locally.
  absl::Status AbandonAfterJoin(absl::Status error);

  const RuntimeOptions options_;
  const WorkerConfig config_;
  // Set by Start, then read-only.
  JoinInfo info_;
  std::shared_ptr<internal::CoordinatorClient> client_;
  std::shared_ptr<Store> store_;
  std::shared_ptr<ProcessGroupFactory> factory_;
  const std::shared_ptr<ProgressRegistry> progress_ = std::make_shared<ProgressRegistry>();
  // Shared with the process's other Runtimes; null without metrics.
  std::shared_ptr<internal::WorkerMetricsServer> metrics_server_;

  mutable absl::Mutex mu_;
  int next_mesh_ ABSL_GUARDED_BY(mu_) = 0;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  bool hung_ ABSL_GUARDED_BY(mu_) = false;

  // Heartbeats, the watch and the job's error; declared last so that its
  // threads stop before the members above go away.
  std::unique_ptr<Monitor> monitor_;
};

}  // namespace mesh
