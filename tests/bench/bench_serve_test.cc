// `mesh-bench serve` as a separate process, measured from this one: the
// shape used for the separate-process figures in docs/performance.md.
// Small sizes; asserts behaviour, never a time.
#include <signal.h>
#include <sys/wait.h>

#include <string>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "bench/rendezvous_bench.h"
#include "tests/util/proc.h"
#include "tests/util/subprocess.h"
#include "tests/util/test_pki.h"

namespace mesh::bench {
namespace bench_serve_test {

TEST(BenchServe, ServesARendezvousFromAnotherProcessAndStopsOnSigterm) {
  auto serve = testing::Subprocess::Start({MESH_BENCH_BIN, "serve"});
  ASSERT_TRUE(serve.ok()) << serve.status();
  auto line = serve->ReadLine(absl::Seconds(20));
  ASSERT_TRUE(line.ok()) << line.status();
  absl::string_view address(*line);
  ASSERT_TRUE(absl::ConsumePrefix(&address, "mesh-bench serve listening on ")) << *line;
  ASSERT_TRUE(absl::StartsWith(address, "127.0.0.1:")) << *line;

  RendezvousBenchOptions options;
  options.coordinator = std::string(address);
  options.ranks = 48;
  options.channels = 2;
  options.repeat = 1;
  options.warmup = 0;
  auto result = RunRendezvousBench(options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_FALSE(result->in_process);
  ASSERT_EQ(result->mesh.size(), 1u);
  EXPECT_EQ(result->mesh[0].rank_latency.count, 48);

  serve->Signal(SIGTERM);
  auto status = serve->Wait(absl::Seconds(20));
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 0);
}

TEST(BenchServe, ServesTlsWithTheGivenCertificate) {
  if (!testing::HaveOpenssl()) GTEST_SKIP() << "no openssl binary to make a test PKI";
  const testing::ScratchDir dir("mesh-bench-serve-tls");  // Removed however the test ends.
  auto pki = testing::MakeTestPki(dir / "pki");
  ASSERT_TRUE(pki.ok()) << pki.status();
  auto serve = testing::Subprocess::Start(
      {MESH_BENCH_BIN, "serve", "--tls-cert", pki->server_cert, "--tls-key", pki->server_key});
  ASSERT_TRUE(serve.ok()) << serve.status();
  auto line = serve->ReadLine(absl::Seconds(20));
  ASSERT_TRUE(line.ok()) << line.status();
  absl::string_view address(*line);
  ASSERT_TRUE(absl::ConsumePrefix(&address, "mesh-bench serve listening on ")) << *line;

  RendezvousBenchOptions options;
  options.coordinator = std::string(address);
  options.ranks = 16;
  options.via_agent = true;
  options.ranks_per_node = 8;
  options.tls.ca_file = pki->ca_cert;
  options.repeat = 1;
  options.warmup = 0;
  auto result = RunRendezvousBench(options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->tls);
  EXPECT_EQ(result->mesh[0].rank_latency.count, 16);

  // A plaintext client cannot speak to it.
  options.tls = BenchTls{};
  EXPECT_EQ(RunRendezvousBench(options).status().code(), absl::StatusCode::kUnavailable);

  serve->Signal(SIGTERM);
  auto status = serve->Wait(absl::Seconds(20));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(WIFEXITED(*status));
}

TEST(BenchServe, RefusesACertificateWithoutItsKey) {
  auto serve = testing::Subprocess::Start({MESH_BENCH_BIN, "serve", "--tls-cert", "server.crt"});
  ASSERT_TRUE(serve.ok()) << serve.status();
  auto status = serve->Wait(absl::Seconds(20));
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 2);
}

}  // namespace bench_serve_test
}  // namespace mesh::bench
