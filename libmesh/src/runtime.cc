#include "mesh/runtime.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/coordinator_targets.h"
#include "common/duration_format.h"
#include "libmesh/src/coordinator_client.h"
#include "libmesh/src/progress_group.h"
#include "libmesh/src/runtime_monitor.h"
#include "libmesh/src/worker_metrics.h"
#include "mesh/coordinator_store.h"
#include "mesh/process_group_gloo.h"
#include "mesh/store.h"

namespace mesh {
namespace {

// ---- Configuration --------------------------------------------------------

// Where a value came from, for error messages.
struct Source {
  const char* variable;  // "MESH_RANK"
  const char* option;    // "rank"
};

std::string Describe(const Source& source, bool from_options) {
  return from_options ? absl::StrCat(source.variable, " (from RuntimeOptions::", source.option, ")")
                      : absl::StrCat(source.variable, " (from the environment)");
}

// The raw value: the option when set, else the variable; nullopt when
// neither is set (an empty variable counts as unset).
template <typename T>
std::optional<std::pair<std::string, bool>> Raw(const std::optional<T>& option,
                                                const Source& source, const EnvLookup& env) {
  if (option.has_value()) {
    if constexpr (std::is_same_v<T, std::string>) {
      return std::make_pair(*option, true);
    } else {
      return std::make_pair(absl::StrCat(*option), true);
    }
  }
  if (!env) return std::nullopt;
  std::optional<std::string> value = env(source.variable);
  if (!value.has_value() || value->empty()) return std::nullopt;
  return std::make_pair(*std::move(value), false);
}

absl::Status Missing(const Source& source) {
  return absl::InvalidArgumentError(absl::StrCat(source.variable,
                                                 " is not set: set the environment variable "
                                                 "or RuntimeOptions::",
                                                 source.option));
}

template <typename Int>
absl::StatusOr<std::optional<Int>> ParseInt(const std::optional<Int>& option, const Source& source,
                                            const EnvLookup& env, bool required, Int min, Int max) {
  auto raw = Raw(option, source, env);
  if (!raw.has_value()) {
    if (required) return Missing(source);
    return std::optional<Int>();
  }
  Int value = 0;
  if (!absl::SimpleAtoi(raw->first, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Describe(source, raw->second), " is '", raw->first, "', not an integer"));
  }
  if (value < min || value > max) {
    return absl::InvalidArgumentError(absl::StrCat(Describe(source, raw->second), " is ", value,
                                                   "; it must be in [", min, ", ", max, "]"));
  }
  return std::optional<Int>(value);
}

bool IsPort(absl::string_view text) {
  int port = 0;
  return !text.empty() && text.size() <= 5 && absl::c_all_of(text, absl::ascii_isdigit) &&
         absl::SimpleAtoi(text, &port) && port >= 1 && port <= 65535;
}

// "host:port" or "[v6]:port"; gRPC URIs ("dns:///h:p", "unix:/path",
// "ipv4:...", "ipv6:...") are passed through for tools that need them.
bool IsCoordinatorTarget(absl::string_view target) {
  for (absl::string_view scheme : {"dns:", "unix:", "unix-abstract:", "ipv4:", "ipv6:"}) {
    if (absl::StartsWith(target, scheme)) return target.size() > scheme.size();
  }
  const size_t colon = target.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return false;
  absl::string_view host = target.substr(0, colon);
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return false;
  } else if (absl::StrContains(host, ':')) {
    return false;  // A bare IPv6 address needs brackets.
  }
  for (char c : host) {
    if (absl::ascii_isspace(static_cast<unsigned char>(c)) || c == '/') return false;
  }
  return IsPort(target.substr(colon + 1));
}

bool IsJobId(absl::string_view id) {
  if (id.empty() || id.size() > 128) return false;
  return absl::c_all_of(id, [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

// Printable ASCII without surrounding blanks: what an HTTP/2 header value
// (and gRPC metadata) can carry verbatim.
bool IsHeaderValue(absl::string_view value) {
  if (value.empty() || value.front() == ' ' || value.back() == ' ') return false;
  return absl::c_all_of(value, [](char c) { return c >= 0x20 && c <= 0x7e; });
}

std::string Hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "unknown-host";
  return name;
}

uint64_t RandomIncarnation() {
  std::random_device device;
  uint64_t value = 0;
  while (value == 0) value = (static_cast<uint64_t>(device()) << 32) ^ device();
  return value;
}

absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

}  // namespace

RuntimeBackend GlooBackend(GlooOptions options) {
  RuntimeBackend backend;
  backend.name = "gloo";
  backend.make_factory =
      [options](
          const BackendContext& context) -> absl::StatusOr<std::shared_ptr<ProcessGroupFactory>> {
    GlooOptions gloo = options;
    gloo.group = context.group_options;
    absl::StatusOr<std::unique_ptr<GlooProcessGroupFactory>> factory =
        GlooProcessGroupFactory::Create(context.store, context.join.rank, context.join.world_size,
                                        std::move(gloo));
    if (!factory.ok()) return factory.status();
    return std::shared_ptr<ProcessGroupFactory>(*std::move(factory));
  };
  return backend;
}

std::optional<std::string> ProcessEnv(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

absl::StatusOr<WorkerConfig> ResolveWorkerConfig(const RuntimeOptions& options) {
  static constexpr Source kCoordinator{"MESH_COORDINATOR", "coordinator"};
  static constexpr Source kJobId{"MESH_JOB_ID", "job_id"};
  static constexpr Source kGeneration{"MESH_GENERATION", "generation"};
  static constexpr Source kRank{"MESH_RANK", "rank"};
  static constexpr Source kWorldSize{"MESH_WORLD_SIZE", "world_size"};
  static constexpr Source kLocalRank{"MESH_LOCAL_RANK", "local_rank"};
  static constexpr Source kLocalWorldSize{"MESH_LOCAL_WORLD_SIZE", "local_world_size"};
  static constexpr Source kNodeRank{"MESH_NODE_RANK", "node_rank"};
  static constexpr Source kAuthToken{"MESH_TOKEN", "auth_token"};
  constexpr int kIntMax = std::numeric_limits<int>::max();
  const EnvLookup& env = options.env;
  WorkerConfig config;

  auto coordinator = Raw(options.coordinator, kCoordinator, env);
  if (!coordinator.has_value()) return Missing(kCoordinator);
  const std::vector<std::string> targets = SplitCoordinatorTargets(coordinator->first);
  if (targets.empty() || !absl::c_all_of(targets, IsCoordinatorTarget)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Describe(kCoordinator, coordinator->second), " is '", coordinator->first,
                     "', not host:port (or the replicas' host:port, separated by commas)"));
  }
  config.coordinator = coordinator->first;

  auto job_id = Raw(options.job_id, kJobId, env);
  if (!job_id.has_value()) return Missing(kJobId);
  if (!IsJobId(job_id->first)) {
    return absl::InvalidArgumentError(absl::StrCat(Describe(kJobId, job_id->second), " is '",
                                                   job_id->first,
                                                   "'; a job id is 1 to 128 of [A-Za-z0-9._-]"));
  }
  config.job_id = job_id->first;

  auto generation = ParseInt<int64_t>(options.generation, kGeneration, env, /*required=*/true, 0,
                                      std::numeric_limits<int64_t>::max());
  if (!generation.ok()) return generation.status();
  config.generation = **generation;

  auto world_size = ParseInt<int>(options.world_size, kWorldSize, env, true, 1, kIntMax);
  if (!world_size.ok()) return world_size.status();
  config.world_size = **world_size;

  auto rank = ParseInt<int>(options.rank, kRank, env, true, 0, config.world_size - 1);
  if (!rank.ok()) return rank.status();
  config.rank = **rank;

  auto local_world_size = ParseInt<int>(options.local_world_size, kLocalWorldSize, env,
                                        /*required=*/false, 1, config.world_size);
  if (!local_world_size.ok()) return local_world_size.status();
  config.local_world_size = local_world_size->value_or(-1);

  const int max_local_rank =
      config.local_world_size > 0 ? config.local_world_size - 1 : config.world_size - 1;
  auto local_rank = ParseInt<int>(options.local_rank, kLocalRank, env, false, 0, max_local_rank);
  if (!local_rank.ok()) return local_rank.status();
  config.local_rank = local_rank->value_or(-1);

  auto node_rank =
      ParseInt<int>(options.node_rank, kNodeRank, env, false, 0, config.world_size - 1);
  if (!node_rank.ok()) return node_rank.status();
  config.node_rank = node_rank->value_or(-1);

  auto token = Raw(options.auth_token, kAuthToken, env);
  if (token.has_value() && !token->first.empty()) {
    if (!IsHeaderValue(token->first)) {
      // Never echo a secret.
      return absl::InvalidArgumentError(absl::StrCat(
          Describe(kAuthToken, token->second),
          " contains characters that cannot be sent in a header (printable ASCII only, no "
          "leading or trailing spaces)"));
    }
    config.auth_token = token->first;
  }
  static constexpr Source kTlsCa{"MESH_TLS_CA", "tls_ca"};
  static constexpr Source kTlsCert{"MESH_TLS_CERT", "tls_cert"};
  static constexpr Source kTlsKey{"MESH_TLS_KEY", "tls_key"};
  static constexpr Source kTlsServerName{"MESH_TLS_SERVER_NAME", "tls_server_name"};
  if (auto v = Raw(options.tls_ca, kTlsCa, env)) config.tls_ca = v->first;
  if (auto v = Raw(options.tls_cert, kTlsCert, env)) config.tls_cert = v->first;
  if (auto v = Raw(options.tls_key, kTlsKey, env)) config.tls_key = v->first;
  if (auto v = Raw(options.tls_server_name, kTlsServerName, env)) {
    config.tls_server_name = v->first;
  }
  static constexpr Source kAgentSocket{"MESH_AGENT_SOCKET", "agent_socket"};
  if (auto v = Raw(options.agent_socket, kAgentSocket, env); v.has_value() && !v->first.empty()) {
    if (v->first.front() != '/' || v->first.size() > 107) {
      return absl::InvalidArgumentError(
          absl::StrCat(Describe(kAgentSocket, v->second), " is '", v->first,
                       "', not an absolute Unix socket path of at most 107 bytes"));
    }
    config.agent_socket = v->first;
  }
  // A token is a secret: never sent over plaintext (docs/security.md).
  if (!config.auth_token.empty() && config.tls_ca.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Describe(kAuthToken, token->second), " is set but ", kTlsCa.variable,
                     " is not: a token is never sent in plaintext; give the coordinator's CA"));
  }
  // Files are checked here, so a wrong path fails Init with its name rather
  // than as a handshake error at the first RPC.
  if (absl::Status s = security::ValidateClientSecurity(internal::ChannelSecurityOf(config));
      !s.ok()) {
    return s;
  }
  return config;
}

// ---- Runtime ----------------------------------------------------------------

Runtime::Runtime(RuntimeOptions options, WorkerConfig config)
    : options_(std::move(options)), config_(std::move(config)) {}

Runtime::~Runtime() { (void)Shutdown(); }

absl::StatusOr<std::unique_ptr<Runtime>> Runtime::Init(RuntimeOptions options) {
  absl::StatusOr<WorkerConfig> config = ResolveWorkerConfig(options);
  if (!config.ok()) return config.status();
  if (!options.backend.make_factory) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RuntimeOptions::backend '", options.backend.name, "' has no make_factory hook"));
  }
  for (const auto& [name, value] :
       {std::pair<const char*, absl::Duration>{"join_timeout", options.join_timeout},
        {"rpc_timeout", options.rpc_timeout},
        {"store_timeout", options.store_timeout}}) {
    if (value <= absl::ZeroDuration() || value == absl::InfiniteDuration()) {
      return absl::InvalidArgumentError(absl::StrCat("RuntimeOptions::", name, " is ",
                                                     FormatDurationShort(value),
                                                     "; it must be positive and finite"));
    }
  }
  std::unique_ptr<Runtime> runtime(new Runtime(std::move(options), *std::move(config)));
  if (absl::Status s = runtime->Start(); !s.ok()) return s;
  return runtime;
}

absl::Status Runtime::Start() {
  info_.job_id = config_.job_id;
  info_.generation = config_.generation;
  // The node this rank runs on: what the coordinator groups ranks by. The
  // agent names it (MESH_NODE_NAME), so two agents on one machine are two
  // nodes; without an agent it is the host name.
  info_.host = options_.host;
  if (info_.host.empty() && options_.env) {
    if (std::optional<std::string> node = options_.env("MESH_NODE_NAME"); node.has_value()) {
      info_.host = *node;
    }
  }
  if (info_.host.empty()) info_.host = Hostname();
  info_.incarnation = RandomIncarnation();
  const std::string who =
      absl::StrCat("rank ", config_.rank, " of job ", config_.job_id, " generation ",
                   config_.generation, " (coordinator ", config_.coordinator, ")");

  RankIdentity identity;
  identity.job_id = config_.job_id;
  identity.generation = config_.generation;
  identity.rank = config_.rank;
  identity.incarnation = info_.incarnation;
  internal::CoordinatorClientOptions client_options;
  client_options.auth_token = config_.auth_token;
  // Through the local agent's rank relay when there is one: a Unix socket,
  // which needs no TLS (the token still goes with every call).
  absl::StatusOr<std::shared_ptr<internal::CoordinatorClient>> client =
      config_.agent_socket.empty()
          ? internal::NewGrpcCoordinatorClient(
                config_.coordinator, internal::ChannelSecurityOf(config_), identity, client_options)
          : internal::NewGrpcCoordinatorClient(absl::StrCat("unix:", config_.agent_socket), {},
                                               identity, client_options);
  if (!client.ok()) return client.status();
  client_ = *std::move(client);

  internal::JoinParams join;
  join.host = info_.host;
  join.device_kind = options_.device_kind;
  join.device_index = options_.device_index;
  join.timeout = options_.join_timeout;
  if (config_.rank == 0 && options_.backend.make_world_unique_id) {
    absl::StatusOr<std::string> id = options_.backend.make_world_unique_id();
    if (!id.ok()) {
      return Annotate(id.status(), absl::StrCat(who, ": backend '", options_.backend.name,
                                                "' could not make the world's unique ID"));
    }
    join.nccl_unique_id = *std::move(id);
  }
  // Join is idempotent for one incarnation, so an unreachable coordinator
  // (not up yet, restarting, a network blip; UNAVAILABLE) is retried until
  // the join deadline, and so is CANCELLED, which only the server side
  // gives here: a standby replica that becomes the leader cancels the calls
  // it had. Every other error is final.
  const absl::Time join_deadline = absl::Now() + options_.join_timeout;
  absl::Duration backoff = absl::Milliseconds(50);
  absl::StatusOr<internal::JoinResult> joined;
  while (true) {
    join.timeout = std::max(join_deadline - absl::Now(), absl::Milliseconds(1));
    joined = client_->Join(join);
    const bool transient =
        absl::IsUnavailable(joined.status()) || absl::IsCancelled(joined.status());
    if (joined.ok() || !transient || absl::Now() + backoff >= join_deadline) {
      break;
    }
    absl::SleepFor(backoff);
    backoff = std::min(2 * backoff, absl::Seconds(1));
  }
  if (!joined.ok()) return Annotate(joined.status(), absl::StrCat(who, ": join failed"));

  info_.rank = joined->rank;
  info_.world_size = joined->world_size;
  info_.local_rank = joined->local_rank;
  info_.local_world_size = joined->local_world_size;
  info_.node_rank = joined->node_rank;
  info_.num_nodes = joined->num_nodes;
  info_.mesh_shape = joined->mesh_shape;
  info_.mesh_dim_names = joined->mesh_dim_names;
  info_.heartbeat_interval = joined->heartbeat_interval;
  info_.heartbeat_timeout = joined->heartbeat_timeout;
  info_.membership_epoch = joined->membership_epoch;
  info_.in_place = joined->in_place;
  info_.in_place_dim = joined->in_place_dim;
  info_.world_unique_id = joined->nccl_unique_id;

  // The coordinator is the authority, but a disagreement means the agent and
  // the coordinator see different jobs; going on would corrupt collectives.
  struct Check {
    const char* variable;
    int64_t configured;
    int64_t joined;
  };
  for (const Check& check :
       {Check{"MESH_RANK", config_.rank, joined->rank},
        Check{"MESH_WORLD_SIZE", config_.world_size, joined->world_size},
        Check{"MESH_GENERATION", config_.generation, joined->generation},
        Check{"MESH_LOCAL_RANK", config_.local_rank, joined->local_rank},
        Check{"MESH_LOCAL_WORLD_SIZE", config_.local_world_size, joined->local_world_size},
        Check{"MESH_NODE_RANK", config_.node_rank, joined->node_rank}}) {
    if (check.configured >= 0 && check.configured != check.joined) {
      return AbandonAfterJoin(absl::InvalidArgumentError(
          absl::StrCat(who, ": ", check.variable, " is ", check.configured,
                       " but the coordinator's join reply says ", check.joined)));
    }
  }
  if (info_.heartbeat_interval <= absl::ZeroDuration() ||
      info_.heartbeat_timeout <= absl::ZeroDuration()) {
    return AbandonAfterJoin(absl::InternalError(
        absl::StrCat(who, ": the join reply has no heartbeat interval or timeout")));
  }

  monitor_ = std::make_unique<Monitor>(client_, info_, options_.rpc_timeout, options_.on_failure,
                                       progress_);
  monitor_->StartHeartbeats();
  if (absl::Status s = monitor_->StartWatch(); !s.ok()) {
    return AbandonAfterJoin(Annotate(s, absl::StrCat(who, ": could not watch the job")));
  }

  store_ = std::make_shared<CoordinatorStore>(client_, options_.store_timeout);
  BackendContext context{info_, store_, client_, options_.group_options};
  absl::StatusOr<std::shared_ptr<ProcessGroupFactory>> factory =
      options_.backend.make_factory(context);
  if (!factory.ok()) {
    return AbandonAfterJoin(Annotate(
        factory.status(), absl::StrCat(who, ": backend '", options_.backend.name, "' failed")));
  }
  factory_ = *std::move(factory);
  if (absl::Status s = StartMetrics(); !s.ok()) {
    // Metrics are an aid, never a reason to fail the job.
    std::fprintf(stderr, "mesh: %s: running without metrics: %s\n", who.c_str(),
                 s.ToString().c_str());
  }
  // Outermost, so that an op counts as entered before anything else runs.
  auto outermost = std::make_shared<internal::ProgressProcessGroupFactory>(factory_, progress_);
  monitor_->Track(outermost);
  factory_ = std::move(outermost);
  // A failure that arrived during Init fails Init.
  return monitor_->Arm(factory_);
}

absl::Status Runtime::StartMetrics() {
  std::optional<int> port = options_.metrics_port;
  if (!port.has_value() && options_.env) {
    std::optional<std::string> value = options_.env("MESH_METRICS_PORT");
    if (!value.has_value() || value->empty()) return absl::OkStatus();
    int parsed = 0;
    if (!absl::SimpleAtoi(*value, &parsed)) {
      return absl::InvalidArgumentError(
          absl::StrCat("MESH_METRICS_PORT '", *value, "' is not a port number"));
    }
    port = parsed;
  }
  if (!port.has_value()) return absl::OkStatus();
  if (*port < 0 || *port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("the metrics port ", *port, " is outside 0..65535"));
  }
  absl::StatusOr<std::shared_ptr<internal::WorkerMetricsServer>> server =
      internal::WorkerMetricsServer::Acquire(*port);
  if (!server.ok()) return server.status();
  metrics_server_ = *std::move(server);
  factory_ =
      std::make_shared<internal::MeteredProcessGroupFactory>(factory_, metrics_server_->metrics());
  return absl::OkStatus();
}

int Runtime::metrics_port() const {
  return metrics_server_ != nullptr ? metrics_server_->port() : 0;
}

absl::Status Runtime::AbandonAfterJoin(absl::Status error) {
  // Best effort: peers learn at once rather than after a join or collective
  // timeout. The local failure also makes Shutdown skip Leave.
  (void)client_->ReportError(error.message(), options_.rpc_timeout);
  if (monitor_ == nullptr) {
    monitor_ = std::make_unique<Monitor>(client_, info_, options_.rpc_timeout, nullptr, progress_);
  }
  monitor_->Fail(error);
  return error;
}

absl::Status Runtime::health() const {
  if (monitor_ == nullptr) return absl::FailedPreconditionError("mesh runtime is not running");
  if (absl::Status error = monitor_->error(); !error.ok()) return error;
  absl::MutexLock lock(&mu_);
  if (shut_down_) {
    return absl::FailedPreconditionError(
        absl::StrCat("mesh runtime of rank ", info_.rank, " has shut down"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<ProcessGroup>> Runtime::World() {
  if (absl::Status s = health(); !s.ok()) return s;
  return factory_->World();
}

absl::StatusOr<DeviceMesh> Runtime::InitDeviceMesh(std::vector<int64_t> shape,
                                                   std::vector<std::string> dim_names) {
  if (absl::Status s = health(); !s.ok()) return s;
  DeviceMeshOptions mesh_options;
  {
    absl::MutexLock lock(&mu_);
    mesh_options.name = absl::StrCat("mesh", next_mesh_++);
  }
  return DeviceMesh::Init(factory_, std::move(shape), std::move(dim_names), mesh_options);
}

absl::StatusOr<DeviceMesh> Runtime::InitDeviceMesh() {
  return InitDeviceMesh(info_.mesh_shape, info_.mesh_dim_names);
}

absl::Status Runtime::ReportError(absl::string_view reason) {
  absl::Status sent = client_->ReportError(reason, options_.rpc_timeout);
  if (!sent.ok()) {
    // The coordinator did not get it, so no watch will tell this rank;
    // fail locally, in the coordinator's words as far as possible.
    monitor_->Fail(absl::AbortedError(absl::StrCat("job ", info_.job_id, " generation ",
                                                   info_.generation, ": rank ", info_.rank, " (",
                                                   info_.host, ") failed: ", reason)));
  }
  return sent;
}

absl::StatusOr<AliveRanksResult> Runtime::AliveRanks(absl::Duration timeout) {
  if (absl::Status error = health(); !error.ok()) return error;
  absl::StatusOr<internal::AliveRanksReply> reply = client_->AliveRanks(timeout);
  if (!reply.ok()) return reply.status();
  AliveRanksResult result;
  result.round = reply->round;
  result.membership_epoch = reply->membership_epoch;
  for (const auto& [rank, incarnation] : reply->ranks) {
    result.ranks.push_back(AliveRanksResult::Rank{rank, incarnation});
  }
  return result;
}

int64_t Runtime::membership_epoch() const {
  return monitor_ == nullptr ? info_.membership_epoch
                             : std::max(info_.membership_epoch, monitor_->membership_epoch());
}

absl::Status Runtime::Shutdown() {
  bool hung = false;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return absl::OkStatus();
    shut_down_ = true;
    hung = hung_;
  }
  if (monitor_ == nullptr) return absl::OkStatus();  // Init failed before joining.
  // Threads first: a heartbeat after Leave would look like an error.
  monitor_->Stop();
  if (hung || !monitor_->error().ok()) return absl::OkStatus();
  // Tried again while the coordinator is unreachable (restarting, or its
  // replicas failing over: each try goes to the next replica; a standby
  // that is becoming the leader cancels the calls it had), until
  // rpc_timeout: a rank that finished its work should not fail for that.
  // This thread never cancels its own calls.
  const absl::Time deadline = absl::Now() + options_.rpc_timeout;
  absl::Duration backoff = absl::Milliseconds(50);
  for (;;) {
    absl::Status left = client_->Leave(std::max(deadline - absl::Now(), absl::Milliseconds(1)));
    const bool transient = absl::IsUnavailable(left) || absl::IsCancelled(left);
    if (!transient || absl::Now() + backoff >= deadline) return left;
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(1));
  }
}

absl::Status Runtime::Finish(absl::Status result) {
  if (!result.ok()) {
    // "RESOURCE_EXHAUSTED: CUDA out of memory"; an UNKNOWN code (what a
    // binding makes of a foreign exception) says nothing, so its message
    // goes alone.
    if (health().ok()) {
      (void)ReportError(result.code() == absl::StatusCode::kUnknown ? std::string(result.message())
                                                                    : result.ToString());
    }
    return result;
  }
  absl::Status left = Shutdown();
  if (left.ok()) return left;
  return absl::Status(left.code(), absl::StrCat("shutdown: ", left.message()));
}

void Runtime::SimulateHangForTesting() {
  {
    absl::MutexLock lock(&mu_);
    hung_ = true;
  }
  if (monitor_ != nullptr) monitor_->Stop();
}

}  // namespace mesh
