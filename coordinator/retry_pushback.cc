#include "coordinator/retry_pushback.h"

namespace mesh::coordinator {
namespace {

class NoClientRetryInterceptor final : public grpc::experimental::Interceptor {
 public:
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS) &&
        methods->GetSendStatus().error_code() == grpc::StatusCode::UNAVAILABLE) {
      methods->GetSendTrailingMetadata()->emplace(kRetryPushbackKey, kNoRetryPushback);
    }
    methods->Proceed();
  }
};

}  // namespace

grpc::experimental::Interceptor* NoClientRetryInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo*) {
  return new NoClientRetryInterceptor();
}

}  // namespace mesh::coordinator
