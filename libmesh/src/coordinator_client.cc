#include "libmesh/src/coordinator_client.h"

#include <utility>

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>
#include <grpcpp/support/status.h>

#include "absl/strings/str_cat.h"
#include "common/check.h"
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

class GrpcCoordinatorClient final : public CoordinatorClient {
 public:
  GrpcCoordinatorClient(std::shared_ptr<grpc::Channel> channel, std::string target,
                        RankIdentity identity, CoordinatorClientOptions options)
      : target_(std::move(target)),
        identity_(std::move(identity)),
        options_(options),
        stub_(v1::WorkerService::NewStub(channel)) {}

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
    return ToAbslStatus((stub_.get()->*method)(&ctx, request, response), rpc, target_);
  }

  const std::string target_;
  const RankIdentity identity_;
  const CoordinatorClientOptions options_;
  // Generated stubs are thread-safe.
  const std::unique_ptr<v1::WorkerService::Stub> stub_;
};

}  // namespace

std::shared_ptr<grpc::Channel> NewCoordinatorChannel(const std::string& target) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

std::shared_ptr<CoordinatorClient> NewGrpcCoordinatorClient(std::shared_ptr<grpc::Channel> channel,
                                                            std::string target,
                                                            RankIdentity identity,
                                                            CoordinatorClientOptions options) {
  MESH_CHECK(channel != nullptr, "NewGrpcCoordinatorClient needs a channel");
  return std::make_shared<GrpcCoordinatorClient>(std::move(channel), std::move(target),
                                                 std::move(identity), options);
}

}  // namespace mesh::internal
