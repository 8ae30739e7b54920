#include "coordinator/rpc_helpers.h"

#include "common/grpc_status.h"

namespace mesh::coordinator {

absl::Duration EffectiveTimeout(std::chrono::system_clock::time_point deadline,
                                double timeout_seconds, std::chrono::system_clock::time_point now) {
  absl::Duration timeout =
      timeout_seconds > 0 ? absl::Seconds(timeout_seconds) : absl::ZeroDuration();
  if (deadline != std::chrono::system_clock::time_point::max()) {
    absl::Duration left = absl::FromChrono(deadline - now);
    if (left <= absl::ZeroDuration()) left = absl::Nanoseconds(1);
    if (timeout == absl::ZeroDuration() || left < timeout) timeout = left;
  }
  return timeout;
}

absl::Duration EffectiveTimeout(const grpc::CallbackServerContext* ctx, double timeout_seconds) {
  return EffectiveTimeout(ctx->deadline(), timeout_seconds, std::chrono::system_clock::now());
}

grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* ctx,
                                      const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace mesh::coordinator
