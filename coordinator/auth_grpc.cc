#include "coordinator/auth_grpc.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "common/grpc_status.h"

namespace mesh::coordinator {
namespace {

constexpr char kAuthorizationHeader[] = "authorization";

// The call's "authorization" value, or "" when it has none.
absl::string_view AuthorizationOf(const grpc::ServerContextBase& ctx) {
  const auto& metadata = ctx.client_metadata();
  auto it = metadata.find(kAuthorizationHeader);
  if (it == metadata.end()) return {};
  return absl::string_view(it->second.data(), it->second.size());
}

}  // namespace

std::string BearerToken(absl::string_view header) {
  constexpr absl::string_view kScheme = "bearer ";
  if (header.size() <= kScheme.size()) return {};
  if (!absl::EqualsIgnoreCase(header.substr(0, kScheme.size()), kScheme)) return {};
  return std::string(absl::StripAsciiWhitespace(header.substr(kScheme.size())));
}

grpc::Status TokenAuthProcessor::Process(const InputMetadata& auth_metadata, grpc::AuthContext*,
                                         OutputMetadata*, OutputMetadata*) {
  auto it = auth_metadata.find(kAuthorizationHeader);
  if (it == auth_metadata.end()) return grpc::Status::OK;  // The handler decides.
  const std::string token = BearerToken(absl::string_view(it->second.data(), it->second.size()));
  if (token.empty()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "the authorization header is not \"Bearer <token>\"");
  }
  absl::StatusOr<Principal> principal = authenticator_->Authenticate(token);
  if (!principal.ok()) return ToGrpcStatus(principal.status());
  return grpc::Status::OK;
}

absl::StatusOr<Principal> CallAuthorizer::Caller(const grpc::ServerContextBase& ctx) const {
  if (authenticator_ == nullptr) return Principal{Role::kAdmin, "anonymous"};
  const absl::string_view header = AuthorizationOf(ctx);
  if (header.empty()) {
    return absl::UnauthenticatedError(
        "no credentials: this coordinator needs a token (MESH_TOKEN or --token-file)");
  }
  const std::string token = BearerToken(header);
  if (token.empty()) {
    return absl::UnauthenticatedError("the authorization header is not \"Bearer <token>\"");
  }
  return authenticator_->Authenticate(token);
}

absl::Status CallAuthorizer::JobData(const grpc::ServerContextBase& ctx,
                                     absl::string_view job_id) const {
  if (!enabled()) return absl::OkStatus();
  absl::StatusOr<Principal> caller = Caller(ctx);
  if (!caller.ok()) return caller.status();
  if (caller->role == Role::kAdmin) return absl::OkStatus();
  return AuthorizeJobData(*caller, job_id, owner_of_(job_id));
}

absl::Status CallAuthorizer::WorkerCall(const grpc::ServerContextBase& ctx,
                                        absl::string_view job_id) const {
  // Who calls is settled first (UNAUTHENTICATED stays the answer to a caller
  // without a token); then a forgotten RankContext reads as what it is, not
  // as an unknown job or someone else's.
  if (enabled()) {
    if (absl::StatusOr<Principal> caller = Caller(ctx); !caller.ok()) return caller.status();
  }
  if (job_id.empty()) {
    return absl::InvalidArgumentError(
        "the request names no job: its RankContext (job_id, generation, rank, incarnation) is "
        "missing or has an empty job_id");
  }
  return JobData(ctx, job_id);
}

absl::Status CallAuthorizer::JobClient(const grpc::ServerContextBase& ctx) const {
  if (!enabled()) return absl::OkStatus();
  absl::StatusOr<Principal> caller = Caller(ctx);
  if (!caller.ok()) return caller.status();
  return AuthorizeJobClient(*caller);
}

absl::Status CallAuthorizer::JobControl(const grpc::ServerContextBase& ctx,
                                        absl::string_view job_id) const {
  if (!enabled()) return absl::OkStatus();
  absl::StatusOr<Principal> caller = Caller(ctx);
  if (!caller.ok()) return caller.status();
  if (caller->role == Role::kAdmin) return absl::OkStatus();
  return AuthorizeJobControl(*caller, job_id, owner_of_(job_id));
}

absl::Status CallAuthorizer::Node(const grpc::ServerContextBase& ctx,
                                  absl::string_view node) const {
  if (!enabled()) return absl::OkStatus();
  absl::StatusOr<Principal> caller = Caller(ctx);
  if (!caller.ok()) return caller.status();
  return AuthorizeNode(*caller, node);
}

absl::StatusOr<std::string> CallAuthorizer::OwnerName(const grpc::ServerContextBase& ctx) const {
  if (!enabled()) return std::string();
  absl::StatusOr<Principal> caller = Caller(ctx);
  if (!caller.ok()) return caller.status();
  return std::move(caller->name);
}

std::string CallAuthorizer::MintWorkerToken(absl::string_view job_id) const {
  if (!enabled()) return {};
  return authenticator_->MintWorkerToken(job_id);
}

}  // namespace mesh::coordinator
