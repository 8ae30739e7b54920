// The fixture of the coordinator-replica tests (docs/ha.md): 3 etcd members
// (Debian's etcd-server, started on 127.0.0.1 ports picked free; the tests
// skip, saying why, without it), up to 2 mesh-coordinator replicas with a
// 2 s leader lease on ports picked up front, and agents given both
// coordinator addresses. ha_test.cc and ha_failover_test.cc hold the cases.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/coordinator_targets.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "mesh/v1/job.grpc.pb.h"
#include "tests/metrics/metrics_test_util.h"
#include "tests/util/cluster_queries.h"
#include "tests/util/etcd_cluster.h"
#include "tests/util/mesh_cluster.h"
#include "tests/util/proc.h"
#include "tests/util/subprocess.h"

namespace mesh::testing {
namespace ha_test {

using ::testing::HasSubstr;

inline constexpr char kLease[] = "2";

class HaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!EtcdCluster::Available(&why)) GTEST_SKIP() << why;
    absl::StatusOr<std::unique_ptr<EtcdCluster>> etcd = EtcdCluster::Start(3);
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = *std::move(etcd);
    store_ = absl::StrCat("etcd://", etcd_->endpoint_list(), "/ha");
    for (int i = 0; i < 2; ++i) {
      absl::StatusOr<int> port = FreePort();
      ASSERT_TRUE(port.ok()) << port.status();
      ports_.push_back(*port);
      addresses_.push_back(absl::StrCat("127.0.0.1:", *port));
      absl::StatusOr<int> metrics_port = FreePort();
      ASSERT_TRUE(metrics_port.ok()) << metrics_port.status();
      metrics_ports_.push_back(*metrics_port);
    }
  }

  std::vector<std::string> CoordinatorArgv(int i) const {
    return {MESH_COORDINATOR_BIN,
            "--insecure",
            "--listen",
            "127.0.0.1",
            "--port",
            absl::StrCat(ports_[i]),
            "--store",
            store_,
            "--leader-lease",
            kLease,
            "--heartbeat-interval",
            "0.2",
            "--heartbeat-timeout",
            "10",
            "--node-heartbeat-interval",
            "0.2",
            "--node-heartbeat-timeout",
            "5",
            "--kill-grace",
            "1",
            "--shutdown-grace",
            "0.2",
            "--etcd-timeout",
            "1.5",
            "--metrics-port",
            absl::StrCat(metrics_ports_[i]),
            "--log-level",
            "info"};
  }

  // The value of the unlabelled sample `name` on replica `i`'s /metrics;
  // nullopt when it cannot be scraped or has no such sample.
  std::optional<double> Metric(int i, const std::string& name) {
    absl::StatusOr<std::string> body = Scrape(metrics_ports_[i]);
    if (!body.ok()) return std::nullopt;
    for (absl::string_view line : absl::StrSplit(*body, '\n')) {
      double value = 0;
      if (absl::ConsumePrefix(&line, name) && absl::ConsumePrefix(&line, " ") &&
          absl::SimpleAtod(line, &value)) {
        return value;
      }
    }
    return std::nullopt;
  }

  void StartCoordinator(int i) {
    absl::StatusOr<StartedCoordinator> started = StartCoordinatorProcess(CoordinatorArgv(i));
    ASSERT_TRUE(started.ok()) << started.status();
    if (static_cast<int>(coordinators_.size()) <= i) coordinators_.resize(i + 1);
    coordinators_[i] = std::move(started->process);
  }

  // The index of the replica that leads, by its health; -1 if none does
  // within `timeout`.
  int Leader(absl::Duration timeout = absl::Seconds(15)) {
    absl::StatusOr<std::string> leader = FindLeader(
        addresses_,
        [](const std::string& target) -> absl::StatusOr<std::shared_ptr<grpc::Channel>> {
          return NewPrivateChannel(target);
        },
        absl::Now() + timeout);
    if (!leader.ok()) return -1;
    return *leader == addresses_[0] ? 0 : 1;
  }

  std::string AllCoordinators() const { return absl::StrJoin(addresses_, ","); }

  void StartAgent(int i, int slots) {
    std::vector<std::string> argv =
        AgentArgv(MESH_AGENT_BIN, AllCoordinators(), absl::StrCat("node-", i), "127.0.0.1", slots,
                  absl::StrCat(dir_.path(), "/agent-", i));
    absl::StatusOr<Subprocess> agent = Subprocess::Start(argv);
    ASSERT_TRUE(agent.ok()) << agent.status();
    agents_.push_back(std::make_unique<Subprocess>(*std::move(agent)));
  }

  // JobService of replica `i`.
  std::unique_ptr<v1::JobService::Stub> Jobs(int i) {
    return v1::JobService::NewStub(NewPrivateChannel(addresses_[i]));
  }

  void KillCoordinator(int i) {
    coordinators_[i]->Signal(SIGKILL);
    ASSERT_TRUE(coordinators_[i]->Wait(absl::Seconds(10)).ok());
  }

  // Ready nodes as the leader sees them.
  int ReadyNodes() {
    const int leader = Leader();
    if (leader < 0) return -1;
    return ::mesh::testing::ReadyNodes(*Jobs(leader)).value_or(-1);
  }

  // The job as the current leader has it.
  std::optional<v1::Job> GetJob(const std::string& id) {
    const int leader = Leader();
    if (leader < 0) return std::nullopt;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    v1::GetJobRequest request;
    request.set_job_id(id);
    v1::GetJobResponse response;
    if (!Jobs(leader)->GetJob(&context, request, &response).ok()) return std::nullopt;
    return response.job();
  }

  const ScratchDir dir_{"ha_test"};
  std::unique_ptr<EtcdCluster> etcd_;
  std::string store_;
  std::vector<int> ports_;
  std::vector<int> metrics_ports_;
  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<Subprocess>> coordinators_;
  std::vector<std::unique_ptr<Subprocess>> agents_;
};

inline v1::JobSpec TrueSpec(const std::string& key) {
  v1::JobSpec spec;
  spec.set_name(key);
  spec.set_idempotency_key(key);
  spec.add_command("/bin/true");
  spec.mutable_nodes()->set_min(1);
  spec.set_nproc_per_node(1);
  return spec;
}

}  // namespace ha_test
}  // namespace mesh::testing
