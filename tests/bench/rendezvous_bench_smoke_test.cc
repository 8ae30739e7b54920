// Smoke only: small sizes, asserts the harness works and reports what it
// should; never asserts a time.
#include "bench/rendezvous_bench.h"

#include <gtest/gtest.h>

#include "tests/util/proc.h"
#include "tests/util/test_pki.h"

namespace mesh::bench {
namespace rendezvous_bench_smoke_test {

void ExpectRound(const RoundResult& round, int ranks, size_t steps) {
  EXPECT_EQ(round.rank_latency.count, ranks);
  ASSERT_EQ(round.step_s.size(), steps);
  // Steps finish in order, and the round ends with the last one.
  for (size_t s = 1; s < steps; ++s) EXPECT_LE(round.step_s[s - 1], round.step_s[s]);
  EXPECT_DOUBLE_EQ(round.step_s.back(), round.total_s);
  EXPECT_GT(round.total_s, 0);
  EXPECT_LE(round.rank_latency.max_us, round.total_s * 1e6 + 1);
}

TEST(RendezvousBenchSmoke, RendezvousesEveryRankAgainstAnInProcessCoordinator) {
  RendezvousBenchOptions options;
  options.ranks = 64;
  options.channels = 3;
  options.repeat = 2;
  options.warmup = 1;
  options.round_timeout = absl::Seconds(30);
  auto result = RunRendezvousBench(options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->in_process);
  EXPECT_EQ(result->ranks, 64);
  EXPECT_EQ(result->channels, 3);
  ASSERT_EQ(result->mesh.size(), 2u);
  ASSERT_EQ(result->baseline.size(), 2u);
  for (const RoundResult& round : result->mesh) ExpectRound(round, 64, MeshStepNames().size());
  for (const RoundResult& round : result->baseline) {
    ExpectRound(round, 64, BaselineStepNames().size());
  }
  EXPECT_GT(result->ratio, 0);
  // The median of the two rounds' own ratios.
  EXPECT_DOUBLE_EQ(result->ratio, (result->mesh[0].total_s / result->baseline[0].total_s +
                                   result->mesh[1].total_s / result->baseline[1].total_s) /
                                      2);
  EXPECT_GT(result->mesh_p99_us, 0);
  EXPECT_GE(result->mesh_p99_us, result->mesh_p50_us);
  EXPECT_GT(result->process.threads, 0);
  EXPECT_GT(result->process.rss_bytes, 0);

  const nlohmann::json json = ToJson(*result);
  EXPECT_EQ(json["benchmark"], "rendezvous");
  EXPECT_EQ(json["ranks"], 64);
  EXPECT_EQ(json["rounds"], 2);
  EXPECT_EQ(json["mesh"]["rounds"].size(), 2u);
  EXPECT_TRUE(json["mesh"]["step_s"].contains("unique_id"));
  EXPECT_TRUE(json["baseline_health_check"]["step_s"].contains("check3"));
  EXPECT_EQ(json["mesh"]["rounds"][0]["rank_latency"]["count"], 64);
  EXPECT_GE(json["process"]["peak_rss_bytes"].get<int64_t>(),
            json["process"]["rss_bytes"].get<int64_t>());
}

TEST(RendezvousBenchSmoke, CreatesJobsThroughAdminServiceOnARemoteCoordinator) {
  auto server = StartBenchCoordinator();
  ASSERT_TRUE(server.ok()) << server.status();
  RendezvousBenchOptions options;
  options.coordinator = (*server)->address();
  // Not a multiple of the 8 ranks per simulated host, so the last host is
  // short and Join's local_world_size check sees it.
  options.ranks = 37;
  options.channels = 2;
  options.repeat = 1;
  options.warmup = 0;
  options.grpc_deadlines = true;
  auto result = RunRendezvousBench(options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_FALSE(result->in_process);
  EXPECT_EQ(result->coordinator, (*server)->address());
  ASSERT_EQ(result->mesh.size(), 1u);
  ExpectRound(result->mesh[0], 37, MeshStepNames().size());
  // Every rank's waits completed; none is left behind on the server.
  EXPECT_EQ((*server)->coordination().PendingWaits(), 0u);
}

TEST(RendezvousBenchSmoke, ASingleRankRendezvousesWithItself) {
  RendezvousBenchOptions options;
  options.ranks = 1;
  options.channels = 1;
  options.repeat = 1;
  options.warmup = 0;
  auto result = RunRendezvousBench(options);
  ASSERT_TRUE(result.ok()) << result.status();
  ExpectRound(result->mesh[0], 1, MeshStepNames().size());
}

TEST(RendezvousBenchSmoke, EachRankOnItsOwnConnection) {
  RendezvousBenchOptions options;
  options.ranks = 24;
  options.connection_per_rank = true;
  options.repeat = 1;
  options.warmup = 0;
  auto result = RunRendezvousBench(options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->channels, 24);
  ASSERT_EQ(result->mesh.size(), 1u);
  ExpectRound(result->mesh[0], 24, MeshStepNames().size());
  // A client end and a server end per connection, in this one process.
  EXPECT_GE(result->process.open_fds, 48);
}

class RendezvousBenchTlsSmoke : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::HaveOpenssl()) GTEST_SKIP() << "no openssl binary to make a test PKI";
    auto pki = testing::MakeTestPki(dir_ / "pki");
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_ = *std::move(pki);
  }
  // One measured round of `ranks` ranks over TLS.
  RendezvousBenchOptions TlsOptions(int ranks) const {
    RendezvousBenchOptions options;
    options.ranks = ranks;
    options.tls = Tls();
    options.repeat = 1;
    options.warmup = 0;
    return options;
  }
  BenchTls Tls() const {
    BenchTls tls;
    tls.ca_file = pki_.ca_cert;
    tls.cert_file = pki_.server_cert;
    tls.key_file = pki_.server_key;
    return tls;
  }

  const testing::ScratchDir dir_{"mesh-bench-tls"};  // Removed with the fixture.
  testing::TestPki pki_;
};

TEST_F(RendezvousBenchTlsSmoke, EachRankItsOwnTlsConnection) {
  RendezvousBenchOptions options = TlsOptions(16);
  options.connection_per_rank = true;
  auto result = RunRendezvousBench(options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->tls);
  EXPECT_EQ(result->channels, 16);
  EXPECT_GT(result->connect_s, 0);
  ASSERT_EQ(result->mesh.size(), 1u);
  ExpectRound(result->mesh[0], 16, MeshStepNames().size());
  const nlohmann::json json = ToJson(*result);
  EXPECT_EQ(json["tls"], true);
  EXPECT_GT(json["connect_s"].get<double>(), 0);
}

TEST_F(RendezvousBenchTlsSmoke, ThroughAgentsOverTls) {
  RendezvousBenchOptions options = TlsOptions(20);
  options.via_agent = true;
  options.ranks_per_node = 8;
  auto result = RunRendezvousBench(options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->tls);
  EXPECT_EQ(result->channels, 3);  // 8 + 8 + 4 ranks.
  ASSERT_EQ(result->mesh.size(), 1u);
  ExpectRound(result->mesh[0], 20, MeshStepNames().size());
}

TEST_F(RendezvousBenchTlsSmoke, ACoordinatorOutsideTheCaIsUnavailable) {
  RendezvousBenchOptions options = TlsOptions(2);
  options.channels = 1;
  options.tls.cert_file = pki_.other_server_cert;
  options.tls.key_file = pki_.other_server_key;
  EXPECT_EQ(RunRendezvousBench(options).status().code(), absl::StatusCode::kUnavailable);
}

TEST(RendezvousBenchSmoke, RejectsIncompleteTlsOptions) {
  RendezvousBenchOptions options;
  options.ranks = 2;
  options.tls.cert_file = "server.crt";
  options.tls.key_file = "server.key";
  auto no_ca = RunRendezvousBench(options);
  EXPECT_EQ(no_ca.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(no_ca.status().message().find("--tls-ca"), std::string::npos) << no_ca.status();

  options.tls = BenchTls{};
  options.tls.ca_file = "ca.crt";
  auto no_server_files = RunRendezvousBench(options);
  EXPECT_EQ(no_server_files.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(no_server_files.status().message().find("--tls-cert"), std::string::npos)
      << no_server_files.status();

  options.coordinator = "127.0.0.1:1";
  options.tls.cert_file = "server.crt";
  options.tls.key_file = "server.key";
  auto remote_with_server_files = RunRendezvousBench(options);
  EXPECT_EQ(remote_with_server_files.status().code(), absl::StatusCode::kInvalidArgument);

  // A CA file that cannot be read is reported as such, before connecting.
  options.tls.cert_file.clear();
  options.tls.key_file.clear();
  options.tls.ca_file = "/nonexistent/ca.crt";
  EXPECT_EQ(RunRendezvousBench(options).status().code(), absl::StatusCode::kNotFound);
}

TEST(RendezvousBenchSmoke, RejectsBadOptionsAndUnreachableCoordinators) {
  RendezvousBenchOptions bad;
  bad.ranks = 0;
  EXPECT_EQ(RunRendezvousBench(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad.ranks = 4;
  bad.channels = 0;
  EXPECT_EQ(RunRendezvousBench(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad.channels = 1;
  bad.repeat = 0;
  EXPECT_EQ(RunRendezvousBench(bad).status().code(), absl::StatusCode::kInvalidArgument);

  RendezvousBenchOptions nowhere;
  nowhere.coordinator = "127.0.0.1:1";
  nowhere.ranks = 2;
  EXPECT_EQ(RunRendezvousBench(nowhere).status().code(), absl::StatusCode::kUnavailable);
}

TEST(RendezvousBenchSmoke, ReadsProcessStats) {
  const ProcessStats stats = ReadProcessStats();
  EXPECT_GE(stats.threads, 1);
  EXPECT_GT(stats.rss_bytes, 0);
  EXPECT_GE(stats.peak_rss_bytes, stats.rss_bytes);
  EXPECT_GE(stats.open_fds, 3);  // stdin, stdout, stderr at least.
  EXPECT_GT(ProcessCpuSeconds(), 0);
}

}  // namespace rendezvous_bench_smoke_test
}  // namespace mesh::bench
