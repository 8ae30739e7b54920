// examples/dtensor_redistribute as four real processes, started with only
// MESH_* variables (as an agent would start them) against an in-process
// coordinator on 127.0.0.1:0: they join, build a (2, 2) mesh over Gloo,
// distribute a tensor as (S(0), R), redistribute it to (R, S(1)), check
// every shard and FullTensor themselves, and exit 0 with "rank R: ok".
//
// The example checks values itself; this test checks that every rank got
// there, that rank 0 printed the plan the planner should make (a local
// slice over tp, then an all_gather of the smaller shards over dp), and
// that nobody
// reported an error to the coordinator.
#include <sys/wait.h>

#include <iostream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "tests/util/in_process_coordinator.h"
#include "tests/util/subprocess.h"

namespace mesh {
namespace dtensor_example_test {

using ::testing::Contains;
using ::testing::HasSubstr;

constexpr int kWorld = 4;
// Far beyond what four tiny processes need; a bound, not a performance check.
constexpr absl::Duration kLineTimeout = absl::Seconds(60);
constexpr absl::Duration kExitTimeout = absl::Seconds(30);

class DTensorExampleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto coordinator =
        ::mesh::testing::InProcessCoordinator::Start(absl::Milliseconds(100), absl::Seconds(5));
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = *std::move(coordinator);
  }

  // Runs the example as a 4-rank job `job` with `args`; returns each rank's
  // stdout lines after asserting that every rank exited 0.
  std::vector<std::vector<std::string>> RunExample(const std::string& job,
                                                   const std::vector<std::string>& args) {
    EXPECT_TRUE(coordinator_->CreateJob(job, kWorld, {2, 2}, {"dp", "tp"}).ok());
    std::vector<::mesh::testing::Subprocess> workers;
    for (int r = 0; r < kWorld; ++r) {
      std::vector<std::string> argv = {MESH_DTENSOR_EXAMPLE_BIN, "--gloo-host", "127.0.0.1"};
      argv.insert(argv.end(), args.begin(), args.end());
      auto worker = ::mesh::testing::Subprocess::Start(
          argv,
          {absl::StrCat("MESH_COORDINATOR=", coordinator_->address()),
           absl::StrCat("MESH_JOB_ID=", job), "MESH_GENERATION=0", absl::StrCat("MESH_RANK=", r),
           absl::StrCat("MESH_WORLD_SIZE=", kWorld), absl::StrCat("MESH_LOCAL_RANK=", r % 2),
           "MESH_LOCAL_WORLD_SIZE=2", absl::StrCat("MESH_NODE_RANK=", r / 2),
           // Two nodes on this one machine, as two agents would say: the
           // coordinator groups ranks by node name.
           absl::StrCat("MESH_NODE_NAME=node-", r / 2)});
      EXPECT_TRUE(worker.ok()) << worker.status();
      if (!worker.ok()) return {};
      workers.push_back(*std::move(worker));
    }
    std::vector<std::vector<std::string>> lines(kWorld);
    for (int r = 0; r < kWorld; ++r) {
      SCOPED_TRACE(absl::StrCat("rank ", r));
      while (true) {
        absl::StatusOr<std::string> line = workers[r].ReadLine(kLineTimeout);
        if (!line.ok()) {
          EXPECT_EQ(line.status().code(), absl::StatusCode::kOutOfRange) << line.status();
          break;
        }
        lines[r].push_back(*line);
      }
      absl::StatusOr<int> status = workers[r].Wait(kExitTimeout);
      EXPECT_TRUE(status.ok()) << status.status();
      if (status.ok()) {
        EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "wait status " << *status;
      }
      EXPECT_THAT(lines[r], Contains(absl::StrCat("rank ", r, ": ok")));
    }
    EXPECT_FALSE(coordinator_->JobFailed(job));
    return lines;
  }

  std::unique_ptr<::mesh::testing::InProcessCoordinator> coordinator_;
};

std::string Joined(const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& line : lines) absl::StrAppend(&text, line, "\n");
  return text;
}

TEST_F(DTensorExampleTest, EvenTensorRedistributesOnATwoByTwoMesh) {
  // 8 x 6 float32: (S(0), R) holds [4, 6] per rank, (R, S(1)) holds [8, 3].
  const auto lines = RunExample("dtensor-even", {});
  ASSERT_EQ(lines.size(), static_cast<size_t>(kWorld));
  const std::string plan = Joined(lines[0]);
  std::cout << "rank 0 printed:\n" << plan;
  EXPECT_THAT(plan, HasSubstr("plan [S(0), R] -> [R, S(1)]"));
  // The planner slices over tp first (free), so that dp's all_gather moves
  // a [4, 3] shard (48 B) instead of a [4, 6] one (96 B, dims in order).
  const size_t slice = plan.find("mesh dim 1: R -> S(1)");
  const size_t gather = plan.find("mesh dim 0: S(0) -> R");
  ASSERT_NE(slice, std::string::npos) << plan;
  ASSERT_NE(gather, std::string::npos) << plan;
  EXPECT_LT(slice, gather) << plan;
  EXPECT_THAT(plan.substr(slice, gather - slice), HasSubstr("local_slice"));
  EXPECT_THAT(plan.substr(gather), HasSubstr("all_gather"));
  EXPECT_THAT(plan.substr(gather), HasSubstr("48 B/rank"));
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_THAT(lines[r],
                Contains(HasSubstr(absl::StrCat("rank ", r, ": coordinate (", r / 2, ", ", r % 2,
                                                "): [4, 6] -> "
                                                "[8, 3]"))));
  }
}

TEST_F(DTensorExampleTest, UnevenTensorFollowsTheChunkRule) {
  // 5 x 3: dp chunks rows 3 + 2, tp chunks columns 2 + 1.
  const auto lines = RunExample("dtensor-uneven", {"--rows", "5", "--cols", "3"});
  ASSERT_EQ(lines.size(), static_cast<size_t>(kWorld));
  const char* const before[] = {"[3, 3]", "[3, 3]", "[2, 3]", "[2, 3]"};
  const char* const after[] = {"[5, 2]", "[5, 1]", "[5, 2]", "[5, 1]"};
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_THAT(lines[r],
                Contains(HasSubstr(absl::StrCat("rank ", r, ": coordinate (", r / 2, ", ", r % 2,
                                                "): ", before[r], " -> ", after[r]))));
  }
}

}  // namespace dtensor_example_test
}  // namespace mesh
