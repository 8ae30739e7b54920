#include "cli/cluster_readiness.h"

#include <algorithm>
#include <set>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/admin_client.h"
#include "common/grpc_status.h"
#include "mesh/v1/job.grpc.pb.h"

namespace mesh::cli {
namespace {

class GrpcNodeLister final : public NodeLister {
 public:
  explicit GrpcNodeLister(const std::string& address)
      : stub_(mesh::v1::JobService::NewStub(MakeChannel(address))) {}

  absl::StatusOr<mesh::v1::ListNodesResponse> ListNodes(absl::Duration timeout) override {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    mesh::v1::ListNodesResponse response;
    const grpc::Status status = stub_->ListNodes(&context, {}, &response);
    if (!status.ok()) return FromGrpcStatus(status);
    return response;
  }

 private:
  std::unique_ptr<mesh::v1::JobService::Stub> stub_;
};

}  // namespace

std::unique_ptr<NodeLister> MakeGrpcNodeLister(const std::string& address) {
  return std::make_unique<GrpcNodeLister>(address);
}

std::vector<std::string> MissingReadyNodes(const mesh::v1::ListNodesResponse& nodes,
                                           const std::vector<std::string>& expected) {
  std::set<std::string> ready;
  for (const mesh::v1::Node& node : nodes.nodes()) {
    if (node.state() == mesh::v1::NODE_STATE_READY) ready.insert(node.name());
  }
  std::vector<std::string> missing;
  for (const std::string& name : expected) {
    if (!ready.contains(name)) missing.push_back(name);
  }
  return missing;
}

absl::Status WaitUntilNodesReady(NodeLister& lister, const std::vector<std::string>& expected,
                                 absl::Time deadline, absl::Duration poll_interval,
                                 const Clock& clock, absl::FunctionRef<bool(absl::Duration)> wait) {
  std::vector<std::string> missing = expected;
  absl::Status last_error = absl::OkStatus();
  while (true) {
    const absl::Duration left = deadline - clock.Now();
    if (left > absl::ZeroDuration()) {
      auto nodes = lister.ListNodes(std::min(left, absl::Seconds(2)));
      if (nodes.ok()) {
        missing = MissingReadyNodes(*nodes, expected);
        if (missing.empty()) return absl::OkStatus();
        last_error = absl::OkStatus();
      } else if (absl::IsUnimplemented(nodes.status())) {
        return nodes.status();
      } else {
        last_error = nodes.status();
      }
    }
    if (clock.Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          expected.size() - missing.size(), "/", expected.size(),
          " agents READY when the deadline passed; missing: ", absl::StrJoin(missing, ", "),
          last_error.ok() ? ""
                          : absl::StrCat(" (last ListNodes error: ", last_error.ToString(), ")")));
    }
    if (!wait(std::min(poll_interval, deadline - clock.Now()))) {
      return absl::CancelledError("stopped while waiting for the agents");
    }
  }
}

}  // namespace mesh::cli
