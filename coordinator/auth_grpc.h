// The gRPC side of coordinator/auth.h: the auth metadata processor that
// checks bearer tokens on every call, and CallAuthorizer, which the service
// adapters ask before they touch a job or a node.
//
// Flow of one call on a TLS listener with token auth on:
//   1. TokenAuthProcessor::Process sees the call's metadata. A present but
//      unknown or malformed "authorization" header ends the call with
//      UNAUTHENTICATED before any handler runs. A call without the header
//      passes, so that grpc.health.v1 and reflection stay open to probes.
//   2. The handler calls CallAuthorizer (e.g. JobData(ctx, job_id)), which
//      maps the header to a Principal again (one SHA-256, sub-microsecond:
//      cheaper and safer than per-connection state, which gRPC shares across
//      every call of a connection) and applies the rules of auth.h. No
//      header: UNAUTHENTICATED. Wrong rights: PERMISSION_DENIED.
//
// With auth off (CallAuthorizer constructed with a null Authenticator:
// --insecure, or mTLS without a token file, where the certificate is the
// credential) every check passes and the caller counts as an admin.
//
// Thread safety: both classes are thread-safe; the Authenticator and the
// owner lookup must outlive them.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"

#include <grpcpp/security/auth_metadata_processor.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/server_callback.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/grpc_status.h"
#include "coordinator/auth.h"

namespace mesh::coordinator {

// "authorization" header value -> token, or "" when absent or not Bearer.
std::string BearerToken(absl::string_view header);

class TokenAuthProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenAuthProcessor(const Authenticator* authenticator) : authenticator_(authenticator) {}

  // Token checks are CPU-only and short: run inline on the call's thread.
  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

 private:
  const Authenticator* const authenticator_;
};

class CallAuthorizer {
 public:
  // The owner of a JobService job (auth.h), nullopt for others.
  using OwnerLookup = std::function<std::optional<std::string>(absl::string_view job_id)>;

  // `authenticator` null: auth off, every check passes.
  CallAuthorizer(const Authenticator* authenticator, OwnerLookup owner_of)
      : authenticator_(authenticator), owner_of_(std::move(owner_of)) {}

  bool enabled() const { return authenticator_ != nullptr; }

  // Who is calling. With auth off: Principal{kAdmin, "anonymous"}.
  // UNAUTHENTICATED without a valid token.
  absl::StatusOr<Principal> Caller(const grpc::ServerContextBase& ctx) const;

  // The checks of auth.h, for the calling principal.
  absl::Status JobData(const grpc::ServerContextBase& ctx, absl::string_view job_id) const;
  // A WorkerService call: INVALID_ARGUMENT when it names no job (its
  // RankContext is missing), else JobData.
  absl::Status WorkerCall(const grpc::ServerContextBase& ctx, absl::string_view job_id) const;
  absl::Status JobClient(const grpc::ServerContextBase& ctx) const;
  absl::Status JobControl(const grpc::ServerContextBase& ctx, absl::string_view job_id) const;
  absl::Status Node(const grpc::ServerContextBase& ctx, absl::string_view node) const;

  // The name a submitted job is owned by: the caller's name ("" with auth
  // off). Errors of Caller.
  absl::StatusOr<std::string> OwnerName(const grpc::ServerContextBase& ctx) const;

  // The token a job's workers get (empty with auth off).
  std::string MintWorkerToken(absl::string_view job_id) const;

 private:
  const Authenticator* const authenticator_;
  const OwnerLookup owner_of_;
};

// A server-streaming reactor that finishes at once with `status` (a refused
// call) and deletes itself when gRPC is done with it.
template <typename Message>
grpc::ServerWriteReactor<Message>* RejectedStream(const absl::Status& status) {
  class Rejected final : public grpc::ServerWriteReactor<Message> {
   public:
    explicit Rejected(const absl::Status& status) { this->Finish(ToGrpcStatus(status)); }
    void OnDone() override { delete this; }
  };
  return new Rejected(status);
}

}  // namespace mesh::coordinator
