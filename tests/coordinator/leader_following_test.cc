// One coordinator target that stands for several replicas (a DNS name with
// several records; here an ipv4: list, which takes the same path in gRPC):
// the clients' channels (AddCoordinatorChannelArgs, through
// cli::MakeChannel) reach the leader whichever address answers first, over
// real gRPC to a CoordinatorServer and a StandbyServer on 127.0.0.1.
#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <grpcpp/generic/async_generic_service.h>

#include <atomic>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/admin_client.h"
#include "common/coordinator_targets.h"
#include "coordinator/coordinator_server.h"
#include "coordinator/retry_pushback.h"
#include "coordinator/standby_server.h"
#include "mesh/v1/job.grpc.pb.h"

namespace mesh::coordinator {
namespace leader_following_test {

using ::testing::HasSubstr;

class LeaderFollowingTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    CoordinatorConfig config;
    config.listen_host = "127.0.0.1";
    config.port = 0;
    absl::StatusOr<std::unique_ptr<CoordinatorServer>> leader = CoordinatorServer::Start(config);
    ASSERT_TRUE(leader.ok()) << leader.status();
    leader_ = *std::move(leader);
    absl::StatusOr<std::unique_ptr<StandbyServer>> standby =
        StandbyServer::Start("127.0.0.1", 0, grpc::InsecureServerCredentials());
    ASSERT_TRUE(standby.ok()) << standby.status();
    standby_ = *std::move(standby);
    standby_->SetLeader(absl::StrCat("127.0.0.1:", leader_->port()));
    const std::string s = absl::StrCat("127.0.0.1:", standby_->port());
    const std::string l = absl::StrCat("127.0.0.1:", leader_->port());
    // The parameter: whether the standby's address comes first.
    target_ = GetParam() ? absl::StrCat("ipv4:", s, ",", l) : absl::StrCat("ipv4:", l, ",", s);
  }

 public:
  static grpc::Status ListJobs(const std::shared_ptr<grpc::Channel>& channel) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    context.set_wait_for_ready(true);
    v1::ListJobsRequest request;
    v1::ListJobsResponse response;
    return v1::JobService::NewStub(channel)->ListJobs(&context, request, &response);
  }

 protected:
  std::unique_ptr<CoordinatorServer> leader_;
  std::unique_ptr<StandbyServer> standby_;
  std::string target_;
};

TEST_P(LeaderFollowingTest, EveryCallReachesTheLeaderThroughOneTarget) {
  ASSERT_TRUE(MayNameSeveralReplicas(target_));
  std::shared_ptr<grpc::Channel> channel = cli::MakeChannel(target_);
  for (int i = 0; i < 20; ++i) {
    const grpc::Status status = ListJobs(channel);
    ASSERT_TRUE(status.ok()) << "call " << i << ": " << status.error_message();
  }
}

TEST_P(LeaderFollowingTest, APlainChannelStaysOnTheFirstAddress) {
  // What the arguments change: gRPC's default (pick_first, no retries)
  // sends every call to the first address that connects.
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel(target_, grpc::InsecureChannelCredentials());
  const grpc::Status status = ListJobs(channel);
  if (GetParam()) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_THAT(status.error_message(), HasSubstr("standby"));
  } else {
    EXPECT_TRUE(status.ok()) << status.error_message();
  }
}

// A server whose every call ends UNAVAILABLE at once, counting the calls;
// with the leader's interceptor (NoClientRetryInterceptorFactory) or not.
class Refuser {
 public:
  explicit Refuser(bool as_the_leader) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterCallbackGenericService(&service_);
    if (as_the_leader) {
      std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
      creators.push_back(std::make_unique<NoClientRetryInterceptorFactory>());
      builder.experimental().SetInterceptorCreators(std::move(creators));
    }
    server_ = builder.BuildAndStart();
  }
  ~Refuser() { server_->Shutdown(); }
  int port() const { return port_; }
  int calls() const { return service_.calls; }

 private:
  struct Service final : grpc::CallbackGenericService {
    std::atomic<int> calls{0};
    grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
      ++calls;
      class Reactor final : public grpc::ServerGenericBidiReactor {
       public:
        Reactor() { Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "no quorum")); }
        void OnDone() override { delete this; }
      };
      return new Reactor();
    }
  };
  Service service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

TEST(LeaderUnavailable, IsNotRetriedByTheClientsChannelAStandbysIs) {
  for (const bool as_the_leader : {true, false}) {
    SCOPED_TRACE(as_the_leader ? "the leader's UNAVAILABLE" : "a standby's UNAVAILABLE");
    Refuser a(as_the_leader);
    Refuser b(as_the_leader);
    const std::string target = absl::StrCat("ipv4:127.0.0.1:", a.port(), ",127.0.0.1:", b.port());
    const grpc::Status status = LeaderFollowingTest::ListJobs(cli::MakeChannel(target));
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
    // The channel's retry policy allows 5 attempts in all.
    EXPECT_EQ(a.calls() + b.calls(), as_the_leader ? 1 : 5);
  }
}

INSTANTIATE_TEST_SUITE_P(StandbyFirstOrLast, LeaderFollowingTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "StandbyFirst" : "LeaderFirst";
                         });

}  // namespace leader_following_test
}  // namespace mesh::coordinator
