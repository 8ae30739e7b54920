// `mesh-bench serve` as a separate process, measured from this one: the
// shape used for the separate-process figures in docs/performance.md.
// Small sizes; asserts behaviour, never a time.
#include <signal.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "bench/rendezvous_bench.h"
#include "tests/util/subprocess.h"

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

}  // namespace bench_serve_test
}  // namespace mesh::bench
