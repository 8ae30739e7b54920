#include "coordinator/rpc_metrics.h"

#include <google/protobuf/descriptor.h>

#include <chrono>
#include <utility>

#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"

namespace mesh::coordinator {
namespace {

class RpcMetricsInterceptor final : public grpc::experimental::Interceptor {
 public:
  RpcMetricsInterceptor(metrics::Family<metrics::Histogram>* duration, std::string service,
                        std::string method)
      : duration_(duration),
        service_(std::move(service)),
        method_(std::move(method)),
        start_(std::chrono::steady_clock::now()) {}

  ~RpcMetricsInterceptor() override {
    if (!recorded_) Record("CANCELLED");
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      Record(StatusCodeName(methods->GetSendStatus().error_code()));
    }
    methods->Proceed();
  }

 private:
  void Record(const char* code) {
    recorded_ = true;
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start_;
    duration_->WithLabels({service_, method_, code})->Observe(elapsed.count());
  }

  metrics::Family<metrics::Histogram>* const duration_;
  const std::string service_;
  const std::string method_;
  const std::chrono::steady_clock::time_point start_;
  bool recorded_ = false;
};

}  // namespace

const char* StatusCodeName(grpc::StatusCode code) {
  static constexpr const char* kNames[] = {"OK",
                                           "CANCELLED",
                                           "UNKNOWN",
                                           "INVALID_ARGUMENT",
                                           "DEADLINE_EXCEEDED",
                                           "NOT_FOUND",
                                           "ALREADY_EXISTS",
                                           "PERMISSION_DENIED",
                                           "RESOURCE_EXHAUSTED",
                                           "FAILED_PRECONDITION",
                                           "ABORTED",
                                           "OUT_OF_RANGE",
                                           "UNIMPLEMENTED",
                                           "INTERNAL",
                                           "UNAVAILABLE",
                                           "DATA_LOSS",
                                           "UNAUTHENTICATED"};
  const int index = static_cast<int>(code);
  if (index < 0 || index >= static_cast<int>(std::size(kNames))) return "UNKNOWN";
  return kNames[index];
}

RpcMetricsInterceptorFactory::RpcMetricsInterceptorFactory(metrics::Registry* registry)
    : duration_(registry->AddHistogram(
          "mesh_coordinator_rpc_duration_seconds",
          "Server-side latency of every RPC (waits included), by gRPC status code name.",
          {"service", "method", "code"}, metrics::LatencyBuckets())) {}

grpc::experimental::Interceptor* RpcMetricsInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  // "/mesh.v1.JobService/SubmitJob" → service "mesh.v1.JobService", method
  // "SubmitJob", if the descriptor pool knows it.
  const absl::string_view full = info->method() == nullptr ? "" : info->method();
  std::string service = "unknown";
  std::string method = "unknown";
  const size_t slash = full.rfind('/');
  if (full.size() > 1 && full[0] == '/' && slash != absl::string_view::npos && slash > 1) {
    const std::string dotted = absl::StrReplaceAll(full.substr(1), {{"/", "."}});
    if (google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(dotted) != nullptr) {
      service = std::string(full.substr(1, slash - 1));
      method = std::string(full.substr(slash + 1));
    }
  }
  return new RpcMetricsInterceptor(duration_, std::move(service), std::move(method));
}

}  // namespace mesh::coordinator
