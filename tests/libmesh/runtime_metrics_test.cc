// Worker metrics end to end: Runtimes against an in-process coordinator on
// 127.0.0.1:0, ranks as threads with Gloo over loopback, MESH_METRICS_PORT
// given through the environment lookup. The process's /metrics is scraped
// over HTTP after an all-reduce. A busy or malformed port never fails Init.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "mesh/runtime.h"
#include "mesh/tensor.h"
#include "tests/common/http_get.h"
#include "tests/util/in_process_coordinator.h"

namespace mesh {
namespace runtime_metrics_test {

using ::testing::HasSubstr;

class RuntimeMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto coordinator =
        testing::InProcessCoordinator::Start(absl::Milliseconds(100), absl::Seconds(5));
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = *std::move(coordinator);
  }

  void CreateJob(const std::string& id, int world) {
    ASSERT_TRUE(coordinator_->CreateJob(id, world).ok());
  }

  // Options for `rank` whose environment holds only `env`.
  RuntimeOptions Options(const std::string& job, int rank, int world,
                         std::map<std::string, std::string> env) {
    RuntimeOptions options;
    options.env = [env](const std::string& name) -> std::optional<std::string> {
      auto it = env.find(name);
      if (it == env.end()) return std::nullopt;
      return it->second;
    };
    options.coordinator = coordinator_->address();
    options.job_id = job;
    options.generation = 0;
    options.rank = rank;
    options.world_size = world;
    options.host = "host-0";
    options.join_timeout = absl::Seconds(30);
    options.rpc_timeout = absl::Seconds(10);
    options.store_timeout = absl::Seconds(30);
    options.group_options.timeout = absl::Seconds(30);
    GlooOptions gloo;
    gloo.hostname = "127.0.0.1";
    options.backend = GlooBackend(gloo);
    return options;
  }

  std::unique_ptr<testing::InProcessCoordinator> coordinator_;
};

TEST_F(RuntimeMetricsTest, ServesCollectiveMetricsAfterAnAllReduce) {
  constexpr int kWorld = 2;
  constexpr int kElements = 256;
  CreateJob("metrics", kWorld);
  std::vector<int> ports(kWorld, -1);
  std::vector<std::string> scraped(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      absl::StatusOr<std::unique_ptr<Runtime>> runtime =
          Runtime::Init(Options("metrics", r, kWorld, {{"MESH_METRICS_PORT", "0"}}));
      ASSERT_TRUE(runtime.ok()) << "rank " << r << ": " << runtime.status();
      ports[r] = (*runtime)->metrics_port();
      auto world = (*runtime)->World();
      ASSERT_TRUE(world.ok()) << world.status();
      std::vector<float> data(kElements, 1.0f);
      auto work = (*world)->AllReduce(Tensor::Contiguous(data.data(), DType::kFloat32, {kElements}),
                                      ReduceOp::kSum);
      ASSERT_TRUE(work.ok()) << work.status();
      ASSERT_TRUE((*work)->Wait().ok()) << (*work)->status();
      EXPECT_EQ(data[0], 2.0f);
      // Both ranks' all-reduces completed (each waited for the other's
      // data), but rank r's own recording may lag; a barrier after it
      // orders both recordings before either scrape.
      auto barrier = (*world)->Barrier();
      ASSERT_TRUE(barrier.ok());
      ASSERT_TRUE((*barrier)->Wait().ok());
      absl::StatusOr<testing::HttpReply> reply = testing::HttpGet(ports[r], "/metrics");
      ASSERT_TRUE(reply.ok()) << reply.status();
      EXPECT_EQ(reply->status, 200);
      scraped[r] = reply->body;
      auto last = (*world)->Barrier();  // nobody leaves before both scraped
      ASSERT_TRUE(last.ok());
      ASSERT_TRUE((*last)->Wait().ok());
      EXPECT_TRUE((*runtime)->Shutdown().ok());
    });
  }
  for (auto& t : threads) t.join();
  // One process, one /metrics: both ranks share the server.
  ASSERT_GT(ports[0], 0);
  EXPECT_EQ(ports[0], ports[1]);
  for (int r = 0; r < kWorld; ++r) {
    SCOPED_TRACE(absl::StrCat("scraped by rank ", r));
    EXPECT_THAT(scraped[r],
                HasSubstr("mesh_collective_duration_seconds_count{backend=\"gloo\",op=\"all_"
                          "reduce\"} 2"));
    EXPECT_THAT(scraped[r], HasSubstr(absl::StrCat(
                                "mesh_collective_bytes_total{backend=\"gloo\",op=\"all_reduce\"} ",
                                2 * kElements * 4)));
    EXPECT_THAT(scraped[r], HasSubstr("component=\"worker\""));
    EXPECT_THAT(scraped[r], HasSubstr("mesh_redistribute_steps_total{op=\"all_gather\"} 0"));
  }
}

TEST_F(RuntimeMetricsTest, ABusyOrBadPortLeavesTheJobRunningWithoutMetrics) {
  // A listening socket on 0.0.0.0:P makes P busy for the exposer.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int busy = ntohs(addr.sin_port);

  int job = 0;
  for (const std::string& value :
       std::vector<std::string>{absl::StrCat(busy), "not-a-port", "70000"}) {
    const std::string id = absl::StrCat("m", job++);
    CreateJob(id, 1);
    absl::StatusOr<std::unique_ptr<Runtime>> runtime =
        Runtime::Init(Options(id, 0, 1, {{"MESH_METRICS_PORT", value}}));
    ASSERT_TRUE(runtime.ok()) << value << ": " << runtime.status();
    EXPECT_EQ((*runtime)->metrics_port(), 0) << value;
    auto world = (*runtime)->World();
    ASSERT_TRUE(world.ok()) << world.status();
    int64_t x = 5;
    auto work = (*world)->AllReduce(Tensor::Contiguous(&x, DType::kInt64, {1}), ReduceOp::kSum);
    ASSERT_TRUE(work.ok());
    EXPECT_TRUE((*work)->Wait().ok());
    EXPECT_TRUE((*runtime)->Shutdown().ok());
  }
  ::close(fd);
}

}  // namespace runtime_metrics_test
}  // namespace mesh
