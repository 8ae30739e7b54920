#include "libmesh/src/coordinator_client.h"

#include <utility>

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>
#include <grpcpp/support/status.h>
#include <grpcpp/support/sync_stream.h>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/coordinator_targets.h"
#include "mesh/v1/worker.grpc.pb.h"

namespace mesh::internal {
namespace {

namespace v1 = ::mesh::v1;

// Both enums are the canonical google.rpc.Code values, which is what makes
// the static_cast in ToAbslStatus a faithful mapping.
static_assert(static_cast<int>(absl::StatusCode::kUnavailable) ==
              static_cast<int>(grpc::StatusCode::UNAVAILABLE));
static_assert(static_cast<int>(absl::StatusCode::kAborted) ==
              static_cast<int>(grpc::StatusCode::ABORTED));
static_assert(static_cast<int>(absl::StatusCode::kUnauthenticated) ==
              static_cast<int>(grpc::StatusCode::UNAUTHENTICATED));

// libmesh does not link mesh_common (whose FromGrpcStatus does the same) so
// that workers carry only what they need; hence this local copy, which also
// names the call.
absl::Status ToAbslStatus(const grpc::Status& status, absl::string_view rpc,
                          const std::string& target) {
  if (status.ok()) return absl::OkStatus();
  const int code = static_cast<int>(status.error_code());
  const absl::StatusCode absl_code =
      code > 0 && code <= static_cast<int>(absl::StatusCode::kUnauthenticated)
          ? static_cast<absl::StatusCode>(code)
          : absl::StatusCode::kUnknown;
  return absl::Status(
      absl_code, absl::StrCat("WorkerService.", rpc, " to ", target, ": ", status.error_message()));
}

template <typename Request, typename Response>
using SyncMethod = grpc::Status (v1::WorkerService::Stub::*)(grpc::ClientContext*, const Request&,
                                                             Response*);

// Heartbeats send mesh::CollectiveKind as the proto enum, value for value.
static_assert(static_cast<int>(CollectiveKind::kAllReduce) == v1::COLLECTIVE_KIND_ALL_REDUCE &&
              static_cast<int>(CollectiveKind::kBroadcast) == v1::COLLECTIVE_KIND_BROADCAST &&
              static_cast<int>(CollectiveKind::kReduce) == v1::COLLECTIVE_KIND_REDUCE &&
              static_cast<int>(CollectiveKind::kAllGather) == v1::COLLECTIVE_KIND_ALL_GATHER &&
              static_cast<int>(CollectiveKind::kReduceScatter) ==
                  v1::COLLECTIVE_KIND_REDUCE_SCATTER &&
              static_cast<int>(CollectiveKind::kAllToAll) == v1::COLLECTIVE_KIND_ALL_TO_ALL &&
              static_cast<int>(CollectiveKind::kBarrier) == v1::COLLECTIVE_KIND_BARRIER &&
              static_cast<int>(CollectiveKind::kOther) == v1::COLLECTIVE_KIND_OTHER &&
              kNumCollectiveKinds == 9);

JobErrorInfo FromProto(const v1::JobError& error) {
  JobErrorInfo info;
  info.rank = error.rank();
  info.host = error.host();
  info.reason = error.reason();
  info.generation = error.generation();
  info.message = error.message();
  info.hang = error.hang();
  return info;
}

// A server-streaming WatchJob call on gRPC's synchronous API: the caller's
// reader thread blocks in Read; Cancel is ClientContext::TryCancel, which
// gRPC allows from any thread.
class GrpcJobWatch final : public JobWatch {
 public:
  explicit GrpcJobWatch(std::string target) : target_(std::move(target)) {}

  ~GrpcJobWatch() override {
    if (reader == nullptr || finished_) return;
    // A stream must be finished before it is destroyed.
    context.TryCancel();
    v1::JobEvent ignored;
    while (reader->Read(&ignored)) {
    }
    (void)reader->Finish();
  }

  absl::StatusOr<std::optional<JobEventInfo>> Next() override {
    if (finished_) return final_status_;
    v1::JobEvent event;
    while (reader->Read(&event)) {
      if (event.kind() == v1::JobEvent::WATCHING) {
        return std::optional<JobEventInfo>(JobEventInfo{JobEventInfo::kWatching, {}});
      }
      if (event.kind() == v1::JobEvent::ERROR) {
        return std::optional<JobEventInfo>(
            JobEventInfo{JobEventInfo::kError, FromProto(event.error())});
      }
      // An unknown kind from a newer server: skip it.
    }
    finished_ = true;
    final_status_ = ToAbslStatus(reader->Finish(), "WatchJob", target_);
    if (final_status_.ok()) return std::optional<JobEventInfo>();
    return final_status_;
  }

  void Cancel() override { context.TryCancel(); }

  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader;

 private:
  const std::string target_;
  // Touched only by the thread calling Next (and the destructor).
  bool finished_ = false;
  absl::Status final_status_;
};

class GrpcCoordinatorClient final : public CoordinatorClient {
 public:
  // channels[i] reaches replicas[i]: one of each for a single coordinator.
  GrpcCoordinatorClient(const std::vector<std::shared_ptr<grpc::Channel>>& channels,
                        std::vector<std::string> replicas, std::string target,
                        RankIdentity identity, CoordinatorClientOptions options)
      : target_(std::move(target)),
        identity_(std::move(identity)),
        options_(options),
        replicas_(std::move(replicas)) {
    for (const auto& channel : channels) stubs_.push_back(v1::WorkerService::NewStub(channel));
    MESH_CHECK(stubs_.size() == replicas_.size(), "one channel per coordinator replica");
  }

  const RankIdentity& identity() const override { return identity_; }
  const std::string& target() const override { return target_; }

  absl::Status KvSet(absl::string_view key, absl::string_view value,
                     absl::Duration timeout) override {
    v1::KvSetRequest request;
    request.set_key(std::string(key));
    request.set_value(std::string(value));
    v1::KvSetResponse response;
    return Call("KvSet", &v1::WorkerService::Stub::KvSet, request, &response, timeout);
  }

  absl::StatusOr<std::string> KvGet(absl::string_view key, bool wait,
                                    absl::Duration timeout) override {
    v1::KvGetRequest request;
    request.set_key(std::string(key));
    request.set_wait(wait);
    request.set_timeout_seconds(absl::ToDoubleSeconds(timeout));
    v1::KvGetResponse response;
    absl::Status s = Call("KvGet", &v1::WorkerService::Stub::KvGet, request, &response, timeout);
    if (!s.ok()) return s;
    return std::move(*response.mutable_value());
  }

  absl::StatusOr<int64_t> KvAdd(absl::string_view key, int64_t delta,
                                absl::Duration timeout) override {
    v1::KvAddRequest request;
    request.set_key(std::string(key));
    request.set_delta(delta);
    v1::KvAddResponse response;
    absl::Status s = Call("KvAdd", &v1::WorkerService::Stub::KvAdd, request, &response, timeout);
    if (!s.ok()) return s;
    return response.value();
  }

  absl::StatusOr<KvCompareSetReply> KvCompareSet(absl::string_view key,
                                                 std::optional<std::string> expected,
                                                 absl::string_view desired,
                                                 absl::Duration timeout) override {
    v1::KvCompareSetRequest request;
    request.set_key(std::string(key));
    if (expected.has_value()) request.set_expected(*std::move(expected));
    request.set_desired(std::string(desired));
    v1::KvCompareSetResponse response;
    absl::Status s =
        Call("KvCompareSet", &v1::WorkerService::Stub::KvCompareSet, request, &response, timeout);
    if (!s.ok()) return s;
    KvCompareSetReply reply;
    reply.swapped = response.swapped();
    reply.present = response.present();
    reply.value = std::move(*response.mutable_value());
    return reply;
  }

  absl::StatusOr<int64_t> KvDelete(absl::string_view key, bool prefix,
                                   absl::Duration timeout) override {
    v1::KvDeleteRequest request;
    request.set_key(std::string(key));
    request.set_prefix(prefix);
    v1::KvDeleteResponse response;
    absl::Status s =
        Call("KvDelete", &v1::WorkerService::Stub::KvDelete, request, &response, timeout);
    if (!s.ok()) return s;
    return response.deleted();
  }

  absl::StatusOr<KvListReply> KvList(absl::string_view prefix, absl::string_view start_after,
                                     int limit, absl::Duration timeout) override {
    v1::KvListRequest request;
    request.set_prefix(std::string(prefix));
    request.set_start_after(std::string(start_after));
    request.set_limit(limit);
    v1::KvListResponse response;
    absl::Status s = Call("KvList", &v1::WorkerService::Stub::KvList, request, &response, timeout);
    if (!s.ok()) return s;
    KvListReply reply;
    reply.keys.assign(std::make_move_iterator(response.mutable_keys()->begin()),
                      std::make_move_iterator(response.mutable_keys()->end()));
    reply.truncated = response.truncated();
    return reply;
  }

  absl::StatusOr<KvStatsReply> KvNumKeys(absl::Duration timeout) override {
    v1::KvNumKeysRequest request;
    v1::KvNumKeysResponse response;
    absl::Status s =
        Call("KvNumKeys", &v1::WorkerService::Stub::KvNumKeys, request, &response, timeout);
    if (!s.ok()) return s;
    return KvStatsReply{response.num_keys(), response.total_bytes()};
  }

  absl::Status KvWait(absl::Span<const std::string> keys, absl::Duration timeout) override {
    v1::KvWaitRequest request;
    request.mutable_keys()->Add(keys.begin(), keys.end());
    request.set_timeout_seconds(absl::ToDoubleSeconds(timeout));
    v1::KvWaitResponse response;
    return Call("KvWait", &v1::WorkerService::Stub::KvWait, request, &response, timeout);
  }

  absl::StatusOr<std::vector<std::string>> KvMultiGet(absl::Span<const std::string> keys, bool wait,
                                                      absl::Duration timeout) override {
    v1::KvMultiGetRequest request;
    request.mutable_keys()->Add(keys.begin(), keys.end());
    request.set_wait(wait);
    request.set_timeout_seconds(absl::ToDoubleSeconds(timeout));
    v1::KvMultiGetResponse response;
    absl::Status s =
        Call("KvMultiGet", &v1::WorkerService::Stub::KvMultiGet, request, &response, timeout);
    if (!s.ok()) return s;
    if (response.values_size() != static_cast<int>(keys.size())) {
      return absl::InternalError(absl::StrCat("WorkerService.KvMultiGet to ", target_,
                                              ": asked for ", keys.size(), " keys, got ",
                                              response.values_size(), " values"));
    }
    return std::vector<std::string>(std::make_move_iterator(response.mutable_values()->begin()),
                                    std::make_move_iterator(response.mutable_values()->end()));
  }

  absl::Status KvMultiSet(absl::Span<const std::string> keys, absl::Span<const std::string> values,
                          absl::Duration timeout) override {
    MESH_CHECK(keys.size() == values.size(), "KvMultiSet needs one value per key");
    v1::KvMultiSetRequest request;
    for (size_t i = 0; i < keys.size(); ++i) {
      v1::KeyValue* entry = request.add_entries();
      entry->set_key(keys[i]);
      entry->set_value(values[i]);
    }
    v1::KvMultiSetResponse response;
    return Call("KvMultiSet", &v1::WorkerService::Stub::KvMultiSet, request, &response, timeout);
  }

  // ---- Worker runtime ------------------------------------------------------

  absl::StatusOr<JoinResult> Join(const JoinParams& params) override {
    v1::JoinRequest request;
    request.set_host(params.host);
    if (!params.device_kind.empty()) {
      request.mutable_device()->set_kind(params.device_kind);
      request.mutable_device()->set_index(params.device_index);
    }
    request.set_nccl_unique_id(params.nccl_unique_id);
    request.set_timeout_seconds(absl::ToDoubleSeconds(params.timeout));
    v1::JoinResponse response;
    absl::Status s =
        Call("Join", &v1::WorkerService::Stub::Join, request, &response, params.timeout);
    if (!s.ok()) return s;
    JoinResult result;
    result.rank = response.rank();
    result.world_size = response.world_size();
    result.local_rank = response.local_rank();
    result.local_world_size = response.local_world_size();
    result.node_rank = response.node_rank();
    result.num_nodes = response.num_nodes();
    result.mesh_shape.assign(response.mesh_shape().begin(), response.mesh_shape().end());
    result.mesh_dim_names.assign(response.mesh_dim_names().begin(),
                                 response.mesh_dim_names().end());
    result.generation = response.generation();
    result.nccl_unique_id = std::move(*response.mutable_nccl_unique_id());
    result.heartbeat_interval = absl::Seconds(response.heartbeat_interval_seconds());
    result.heartbeat_timeout = absl::Seconds(response.heartbeat_timeout_seconds());
    result.membership_epoch = response.membership_epoch();
    result.in_place = response.in_place();
    result.in_place_dim = response.in_place_dim();
    return result;
  }

  absl::StatusOr<HeartbeatReplyInfo> Heartbeat(absl::Span<const GroupProgressReport> groups,
                                               absl::Duration timeout) override {
    v1::HeartbeatRequest request;
    request.mutable_groups()->Reserve(static_cast<int>(groups.size()));
    for (const GroupProgressReport& group : groups) {
      v1::GroupProgress* g = request.add_groups();
      g->set_name(group.name);
      g->mutable_members()->Add(group.members.begin(), group.members.end());
      g->set_entered(group.progress.entered);
      g->set_completed(group.progress.completed);
      g->set_pending_kind(static_cast<v1::CollectiveKind>(group.progress.pending_kind));
      g->set_completed_kind(static_cast<v1::CollectiveKind>(group.progress.completed_kind));
      g->set_waiting_ms(absl::ToInt64Milliseconds(group.progress.waiting));
      g->set_since_completed_ms(absl::ToInt64Milliseconds(group.progress.since_completed));
    }
    v1::HeartbeatResponse response;
    absl::Status s =
        Call("Heartbeat", &v1::WorkerService::Stub::Heartbeat, request, &response, timeout);
    if (!s.ok()) return s;
    HeartbeatReplyInfo reply;
    if (response.has_error()) reply.error = FromProto(response.error());
    reply.send_members = response.send_members();
    reply.membership_epoch = response.membership_epoch();
    for (const v1::JobError& lost : response.lost_ranks()) reply.lost.push_back(FromProto(lost));
    return reply;
  }

  absl::StatusOr<AliveRanksReply> AliveRanks(absl::Duration timeout) override {
    v1::AliveRanksRequest request;
    request.set_timeout_seconds(absl::ToDoubleSeconds(timeout));
    v1::AliveRanksResponse response;
    absl::Status s =
        Call("AliveRanks", &v1::WorkerService::Stub::AliveRanks, request, &response, timeout);
    if (!s.ok()) return s;
    AliveRanksReply reply;
    reply.round = response.round();
    reply.membership_epoch = response.membership_epoch();
    for (const v1::AliveRank& rank : response.ranks()) {
      reply.ranks.emplace_back(rank.rank(), rank.incarnation());
    }
    return reply;
  }

  absl::Status ReportError(absl::string_view reason, absl::Duration timeout) override {
    v1::ReportErrorRequest request;
    request.set_reason(std::string(reason));
    v1::ReportErrorResponse response;
    return Call("ReportError", &v1::WorkerService::Stub::ReportError, request, &response, timeout);
  }

  absl::Status Leave(absl::Duration timeout) override {
    v1::LeaveRequest request;
    v1::LeaveResponse response;
    return Call("Leave", &v1::WorkerService::Stub::Leave, request, &response, timeout);
  }

  absl::StatusOr<std::unique_ptr<JobWatch>> WatchJob() override {
    auto watch = std::make_unique<GrpcJobWatch>(target_);
    AddAuthorization(watch->context);
    v1::WatchJobRequest request;
    FillContext(request.mutable_context());
    watch->reader = stubs_[replicas_.current()]->WatchJob(&watch->context, request);
    return watch;
  }

  absl::Status PublishUniqueIds(absl::Span<const std::pair<std::string, std::string>> ids,
                                absl::Duration timeout) override {
    v1::PublishUniqueIdsRequest request;
    for (const auto& [key, id] : ids) (*request.mutable_ids())[key] = id;
    v1::PublishUniqueIdsResponse response;
    return Call("PublishUniqueIds", &v1::WorkerService::Stub::PublishUniqueIds, request, &response,
                timeout);
  }

  absl::StatusOr<std::vector<std::string>> GetUniqueIds(absl::Span<const std::string> keys,
                                                        absl::Duration timeout) override {
    v1::GetUniqueIdsRequest request;
    request.mutable_keys()->Add(keys.begin(), keys.end());
    request.set_timeout_seconds(absl::ToDoubleSeconds(timeout));
    v1::GetUniqueIdsResponse response;
    absl::Status s =
        Call("GetUniqueIds", &v1::WorkerService::Stub::GetUniqueIds, request, &response, timeout);
    if (!s.ok()) return s;
    if (response.ids_size() != static_cast<int>(keys.size())) {
      return absl::InternalError(absl::StrCat("WorkerService.GetUniqueIds to ", target_,
                                              ": asked for ", keys.size(), " ids, got ",
                                              response.ids_size()));
    }
    return std::vector<std::string>(std::make_move_iterator(response.mutable_ids()->begin()),
                                    std::make_move_iterator(response.mutable_ids()->end()));
  }

 private:
  // The one path every unary RPC takes: identity, deadline, status mapping.
  template <typename Request, typename Response>
  absl::Status Call(absl::string_view rpc, SyncMethod<Request, Response> method, Request& request,
                    Response* response, absl::Duration timeout) {
    v1::RankContext* context = request.mutable_context();
    context->set_job_id(identity_.job_id);
    context->set_generation(identity_.generation);
    context->set_rank(identity_.rank);
    context->set_incarnation(identity_.incarnation);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout + options_.deadline_margin));
    AddAuthorization(ctx);
    // Several replicas (docs/ha.md): UNAVAILABLE from one (a standby, or
    // one that is down) sends the caller's next try to the next one.
    const size_t replica = replicas_.current();
    absl::Status status = ToAbslStatus((stubs_[replica].get()->*method)(&ctx, request, response),
                                       rpc, replicas_.target(replica));
    if (absl::IsUnavailable(status) && replicas_.size() > 1) replicas_.Rotate(replica);
    return status;
  }

  void AddAuthorization(grpc::ClientContext& ctx) const {
    if (!options_.auth_token.empty()) {
      ctx.AddMetadata("authorization", absl::StrCat("Bearer ", options_.auth_token));
    }
  }

  void FillContext(v1::RankContext* context) const {
    context->set_job_id(identity_.job_id);
    context->set_generation(identity_.generation);
    context->set_rank(identity_.rank);
    context->set_incarnation(identity_.incarnation);
  }

  const std::string target_;
  const RankIdentity identity_;
  const CoordinatorClientOptions options_;
  LeaderTracker replicas_;
  // Generated stubs are thread-safe. One per replica, as replicas_.
  std::vector<std::unique_ptr<v1::WorkerService::Stub>> stubs_;
};

}  // namespace

namespace {
absl::Status NotImplemented(absl::string_view rpc) {
  return absl::UnimplementedError(absl::StrCat("this CoordinatorClient does not implement ", rpc));
}
}  // namespace

absl::StatusOr<JoinResult> CoordinatorClient::Join(const JoinParams&) {
  return NotImplemented("Join");
}
absl::StatusOr<HeartbeatReplyInfo> CoordinatorClient::Heartbeat(
    absl::Span<const GroupProgressReport>, absl::Duration) {
  return NotImplemented("Heartbeat");
}
absl::Status CoordinatorClient::ReportError(absl::string_view, absl::Duration) {
  return NotImplemented("ReportError");
}
absl::Status CoordinatorClient::Leave(absl::Duration) { return NotImplemented("Leave"); }
absl::StatusOr<AliveRanksReply> CoordinatorClient::AliveRanks(absl::Duration) {
  return NotImplemented("AliveRanks");
}
absl::StatusOr<std::unique_ptr<JobWatch>> CoordinatorClient::WatchJob() {
  return NotImplemented("WatchJob");
}
absl::Status CoordinatorClient::PublishUniqueIds(
    absl::Span<const std::pair<std::string, std::string>>, absl::Duration) {
  return NotImplemented("PublishUniqueIds");
}
absl::StatusOr<std::vector<std::string>> CoordinatorClient::GetUniqueIds(
    absl::Span<const std::string>, absl::Duration) {
  return NotImplemented("GetUniqueIds");
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> NewCoordinatorChannel(
    const std::string& target, const security::ClientSecurity& security) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  // gRPC's own reconnect backoff grows to 2 minutes: after a long
  // coordinator restart, Runtime::Init's Join retries (every <= 1 s) would
  // keep failing on a channel that is not trying to connect. Reconnect at
  // the Join retry's pace instead, and give each attempt (TCP connect and
  // HTTP/2 handshake; GRPC_ARG_MIN_RECONNECT_BACKOFF_MS is that minimum,
  // despite its name) time enough on a loaded host.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 1000);
  // One DNS name for several replicas: calls reach the leader through it.
  AddCoordinatorChannelArgs(target, &args);
  security::ClientSecurity channel_security = security;
  channel_security.token.clear();
  return security::MakeChannel(target, channel_security, std::move(args));
}

security::ClientSecurity ChannelSecurityOf(const WorkerConfig& config) {
  security::ClientSecurity security;
  security.ca_file = config.tls_ca;
  security.cert_file = config.tls_cert;
  security.key_file = config.tls_key;
  security.server_name = config.tls_server_name;
  return security;
}

std::shared_ptr<CoordinatorClient> NewGrpcCoordinatorClient(std::shared_ptr<grpc::Channel> channel,
                                                            std::string target,
                                                            RankIdentity identity,
                                                            CoordinatorClientOptions options) {
  MESH_CHECK(channel != nullptr, "NewGrpcCoordinatorClient needs a channel");
  std::vector<std::string> replicas = {target};
  return std::make_shared<GrpcCoordinatorClient>(
      std::vector<std::shared_ptr<grpc::Channel>>{std::move(channel)}, std::move(replicas),
      std::move(target), std::move(identity), options);
}

absl::StatusOr<std::shared_ptr<CoordinatorClient>> NewGrpcCoordinatorClient(
    const std::string& targets, const security::ClientSecurity& security, RankIdentity identity,
    CoordinatorClientOptions options) {
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::string> replicas = SplitCoordinatorTargets(targets);
  for (const std::string& target : replicas) {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
        NewCoordinatorChannel(target, security);
    if (!channel.ok()) return channel.status();
    channels.push_back(*std::move(channel));
  }
  if (channels.empty()) return absl::InvalidArgumentError("no coordinator address");
  return std::shared_ptr<CoordinatorClient>(std::make_shared<GrpcCoordinatorClient>(
      channels, std::move(replicas), targets, std::move(identity), options));
}

}  // namespace mesh::internal
