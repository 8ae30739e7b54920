// A peer process that dies mid-job must fail the survivor's collective
// promptly through the transport itself (TCP: the socket closes; shared
// memory: the peer's pid is gone), long before the heartbeat timeout or the
// op timeout (both 60 s here). Ranks are real processes
// (gloo_peer_death_worker) against an in-process coordinator.
#include <sys/wait.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "tests/util/in_process_coordinator.h"
#include "tests/util/subprocess.h"

namespace mesh {
namespace gloo_peer_death_test {

using ::testing::HasSubstr;

class GlooPeerDeathTest : public ::testing::TestWithParam<bool> {};

TEST_P(GlooPeerDeathTest, SurvivorFailsPromptlyNotAtTheTimeout) {
  const bool shm = GetParam();
  auto coordinator = testing::InProcessCoordinator::Start(absl::Seconds(1), absl::Seconds(60));
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  ASSERT_TRUE((*coordinator)->CreateJob("death", 2).ok());

  std::vector<testing::Subprocess> ranks;
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> argv = {GLOO_PEER_DEATH_WORKER_BIN};
    if (shm) argv.push_back("--shm");
    auto worker = testing::Subprocess::Start(
        argv, {absl::StrCat("MESH_COORDINATOR=", (*coordinator)->address()), "MESH_JOB_ID=death",
               "MESH_GENERATION=0", absl::StrCat("MESH_RANK=", r), "MESH_WORLD_SIZE=2"});
    ASSERT_TRUE(worker.ok()) << worker.status();
    ranks.push_back(*std::move(worker));
  }
  // Reap rank 1 as an agent would; a zombie still answers kill(pid, 0).
  absl::StatusOr<int> dead = ranks[1].Wait(absl::Seconds(30));
  ASSERT_TRUE(dead.ok()) << dead.status();
  ASSERT_TRUE(WIFEXITED(*dead) && WEXITSTATUS(*dead) == 7) << "wait status " << *dead;

  absl::StatusOr<std::string> line = ranks[0].ReadLine(absl::Seconds(30));
  ASSERT_TRUE(line.ok()) << line.status();
  absl::StatusOr<int> survivor = ranks[0].Wait(absl::Seconds(30));
  ASSERT_TRUE(survivor.ok()) << survivor.status();
  std::printf("%s survivor: %s\n", shm ? "shm" : "tcp", line->c_str());
  EXPECT_TRUE(WIFEXITED(*survivor) && WEXITSTATUS(*survivor) == 0) << *line;
  EXPECT_THAT(*line, HasSubstr("rank 0: failed after"));
  EXPECT_THAT(*line, HasSubstr("UNAVAILABLE"));
  // "failed after <ms> ms": well under the 60 s timeouts.
  const size_t at = line->find("after ") + 6;
  int64_t ms = 0;
  ASSERT_TRUE(absl::SimpleAtoi(line->substr(at, line->find(" ms") - at), &ms)) << *line;
  EXPECT_LT(ms, 10'000) << *line;
  (*coordinator)->Stop();
}

INSTANTIATE_TEST_SUITE_P(Transports, GlooPeerDeathTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("shm") : std::string("tcp");
                         });

}  // namespace gloo_peer_death_test
}  // namespace mesh
