// Coordinator replicas on etcd (docs/ha.md), with the real binaries, in
// make test (the fixture: ha_fixture.h):
// - a leader paused (SIGSTOP) past its lease: the standby takes over, and
//   the old leader, resumed, exits 3 without having written;
// - etcd losing quorum: writes fail with UNAVAILABLE, and resume by
//   themselves when the members are back;
// - bad start-ups: a malformed URL (exit 2), no etcd (exit 1, quickly), a
//   prefix that holds other data, a certificate without its key.
// The kill -9 failovers under load are in ha_failover_test.cc (test-slow).
#include "tests/integration/ha_fixture.h"

namespace mesh::testing {
namespace ha_test {

TEST_F(HaTest, PausedLeaderIsDeposedAndStepsDownWithoutWriting) {
  StartCoordinator(0);
  ASSERT_EQ(Leader(), 0);
  StartCoordinator(1);
  // What docs/ha.md promises of a standby, as any client sees it: every RPC
  // is UNAVAILABLE naming the leader, in the message and in the trailing
  // metadata "mesh-leader", and its health is NOT_SERVING.
  ASSERT_TRUE(WaitUntil(
      [&] {
        grpc::ClientContext context;
        context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
        v1::ListJobsRequest request;
        v1::ListJobsResponse response;
        const grpc::Status status = Jobs(1)->ListJobs(&context, request, &response);
        const auto& trailers = context.GetServerTrailingMetadata();
        const auto leader = trailers.find("mesh-leader");
        return status.error_code() == grpc::StatusCode::UNAVAILABLE &&
               absl::StrContains(status.error_message(),
                                 absl::StrCat("the leader is at ", addresses_[0])) &&
               leader != trailers.end() &&
               std::string(leader->second.data(), leader->second.size()) == addresses_[0];
      },
      absl::Seconds(10)))
      << "the standby did not name the leader";
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    grpc::health::v1::HealthCheckRequest request;
    grpc::health::v1::HealthCheckResponse response;
    ASSERT_TRUE(grpc::health::v1::Health::NewStub(NewPrivateChannel(addresses_[1]))
                    ->Check(&context, request, &response)
                    .ok());
    EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  }
  EXPECT_EQ(Metric(1, "mesh_coordinator_leader"), 0);
  EXPECT_EQ(Metric(0, "mesh_coordinator_leader"), 1);
  EXPECT_EQ(Metric(0, "mesh_coordinator_failovers_total"), 0)
      << "the first leader took over from no one";
  coordinators_[0]->Signal(SIGSTOP);
  // The standby takes over once the paused leader's lease expires.
  const absl::Time paused = absl::Now();
  ASSERT_TRUE(WaitUntil([&] { return Leader(absl::Seconds(3)) == 1; }, absl::Seconds(15)));
  std::printf("takeover from a paused leader (lease %s s): %s\n", kLease,
              absl::FormatDuration(absl::Now() - paused).c_str());
  // What a dashboard sees: the new leader leads, in a later term, after a
  // failover (docs/metrics.md).
  EXPECT_EQ(Metric(1, "mesh_coordinator_leader"), 1);
  EXPECT_EQ(Metric(1, "mesh_coordinator_failovers_total"), 1);
  EXPECT_GT(Metric(1, "mesh_coordinator_leader_term").value_or(0), 0);
  grpc::ClientContext context;
  v1::SubmitJobRequest request;
  *request.mutable_spec() = TrueSpec("after-pause");
  v1::SubmitJobResponse response;
  ASSERT_TRUE(Jobs(1)->SubmitJob(&context, request, &response).ok());

  coordinators_[0]->Signal(SIGCONT);
  absl::StatusOr<int> exited = coordinators_[0]->Wait(absl::Seconds(15));
  ASSERT_TRUE(exited.ok()) << "the deposed leader did not step down";
  EXPECT_TRUE(WIFEXITED(*exited) && WEXITSTATUS(*exited) == 3) << *exited;
  EXPECT_EQ(Leader(), 1);
  // One job, as the new leader wrote it.
  v1::ListJobsRequest list;
  grpc::ClientContext list_context;
  v1::ListJobsResponse listed;
  ASSERT_TRUE(Jobs(1)->ListJobs(&list_context, list, &listed).ok());
  ASSERT_EQ(listed.jobs_size(), 1);
  EXPECT_EQ(listed.jobs(0).id(), response.job().id());
}

TEST_F(HaTest, EtcdQuorumLossRefusesWritesUntilItComesBack) {
  StartCoordinator(0);
  ASSERT_EQ(Leader(), 0);
  // One member down: nothing stops.
  ASSERT_TRUE(etcd_->Kill(2).ok());
  auto submit = [&](const std::string& key) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(15)));
    v1::SubmitJobRequest request;
    *request.mutable_spec() = TrueSpec(key);
    v1::SubmitJobResponse response;
    return Jobs(0)->SubmitJob(&context, request, &response);
  };
  EXPECT_TRUE(submit("one-down").ok());
  // Two down: no quorum; writes are refused with UNAVAILABLE, reads of
  // the coordinator's own state still answer.
  ASSERT_TRUE(etcd_->Kill(1).ok());
  const grpc::Status refused = submit("no-quorum");
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
  // Back: writes resume by themselves, with the same leader.
  ASSERT_TRUE(etcd_->Restart(1).ok());
  ASSERT_TRUE(etcd_->Restart(2).ok());
  EXPECT_TRUE(WaitUntil([&] { return submit("back").ok(); }, absl::Seconds(30)));
  EXPECT_EQ(Leader(), 0);
}

class HaStartTest : public HaTest {};

TEST_F(HaStartTest, BadStoresFailClearly) {
  // A malformed URL: a usage error.
  CommandOutput bad_url = RunMerged(
      {MESH_COORDINATOR_BIN, "--insecure", "--port", "0", "--store", "etcd://127.0.0.1:2379"},
      absl::Seconds(20));
  EXPECT_EQ(bad_url.code, 2) << bad_url.output;
  EXPECT_THAT(bad_url.output, HasSubstr("key prefix"));

  // Nothing listens: exit 1 within the connect timeout, naming the endpoint.
  absl::StatusOr<int> nothing = FreePort();
  ASSERT_TRUE(nothing.ok());
  const absl::Time start = absl::Now();
  CommandOutput unreachable = RunMerged(
      {MESH_COORDINATOR_BIN, "--insecure", "--port", "0", "--store",
       absl::StrCat("etcd://127.0.0.1:", *nothing, "/mesh"), "--etcd-connect-timeout", "1"},
      absl::Seconds(20));
  EXPECT_EQ(unreachable.code, 1) << unreachable.output;
  EXPECT_THAT(unreachable.output, HasSubstr(absl::StrCat("127.0.0.1:", *nothing)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));

  // A prefix that holds someone else's keys.
  CommandOutput put = RunMerged(
      {"/usr/bin/etcdctl", "--endpoints", etcd_->endpoint_list(), "put", "/theirs/config", "x"},
      absl::Seconds(20));
  ASSERT_EQ(put.code, 0) << put.output;
  CommandOutput foreign = RunMerged({MESH_COORDINATOR_BIN, "--insecure", "--port", "0", "--store",
                                     absl::StrCat("etcd://", etcd_->endpoint_list(), "/theirs")},
                                    absl::Seconds(20));
  EXPECT_EQ(foreign.code, 1) << foreign.output;
  EXPECT_THAT(foreign.output, HasSubstr("not a Mesh store"));

  // TLS: a certificate without its key.
  CommandOutput tls =
      RunMerged({MESH_COORDINATOR_BIN, "--insecure", "--port", "0", "--store", store_, "--etcd-ca",
                 "/etc/hostname", "--etcd-cert", "/etc/hostname"},
                absl::Seconds(20));
  EXPECT_EQ(tls.code, 1) << tls.output;
  EXPECT_THAT(tls.output, HasSubstr("certificate and its key go together"));
}

}  // namespace ha_test
}  // namespace mesh::testing
