#include "coordinator/scheduler.h"

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/util/status_matchers.h"

namespace mesh::coordinator {
namespace scheduler_test {

using ::mesh::testing::IsOk;
using ::mesh::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using Code = absl::StatusCode;

NodeView Node(std::string name, int slots, int gpus = 0, NodeState state = NodeState::kReady) {
  NodeView node;
  node.address = name + ".example";
  node.name = std::move(name);
  node.slots = slots;
  for (int g = 0; g < gpus; ++g) node.gpus.push_back(g);
  node.state = state;
  return node;
}

JobRequest Job(std::string id, int64_t sequence, int nodes, int nproc, int gpus_per_proc = 0) {
  JobRequest job;
  job.job_id = std::move(id);
  job.sequence = sequence;
  job.nodes_min = nodes;
  job.nproc_per_node = nproc;
  job.gpus_per_proc = gpus_per_proc;
  return job;
}

std::vector<std::string> PlacedIds(const SchedulePassResult& result) {
  std::vector<std::string> ids;
  for (const Placement& placement : result.placements) ids.push_back(placement.job_id);
  return ids;
}

TEST(SchedulerTest, GangJobGetsAllItsNodesOrNone) {
  const std::vector<NodeView> nodes = {Node("node-a", 4), Node("node-b", 4), Node("node-c", 2)};
  absl::StatusOr<SchedulePassResult> result = SchedulePass(nodes, {Job("big", 1, 3, 4)}, {});
  ASSERT_THAT(result, IsOk());
  EXPECT_THAT(result->placements, IsEmpty());
  ASSERT_EQ(result->pending.size(), 1u);
  EXPECT_EQ(result->pending[0].job_id, "big");
  EXPECT_EQ(result->pending[0].reason,
            "waiting for 3 nodes with 4 free slots each; 2 nodes fit (node-a, node-b); "
            "1 short of capacity (node-c: 2 slots free)");

  // Once the third node is big enough, the job takes all three at once.
  const std::vector<NodeView> bigger = {Node("node-a", 4), Node("node-b", 4), Node("node-c", 4)};
  result = SchedulePass(bigger, {Job("big", 1, 3, 4)}, {});
  ASSERT_THAT(result, IsOk());
  ASSERT_EQ(result->placements.size(), 1u);
  EXPECT_THAT(result->placements[0].nodes, ElementsAre("node-a", "node-b", "node-c"));
  EXPECT_THAT(result->pending, IsEmpty());
}

TEST(SchedulerTest, MinMaxTakesAsManyNodesAsAreAvailableUpToMax) {
  JobRequest job = Job("elastic", 1, 2, 2);
  job.nodes_max = 4;
  std::vector<NodeView> nodes = {Node("n1", 2), Node("n2", 2), Node("n3", 2), Node("n4", 1),
                                 Node("n5", 2, 0, NodeState::kLost)};
  absl::StatusOr<SchedulePassResult> result = SchedulePass(nodes, {job}, {});
  ASSERT_THAT(result, IsOk());
  ASSERT_EQ(result->placements.size(), 1u);
  EXPECT_THAT(result->placements[0].nodes, ElementsAre("n1", "n2", "n3"));
  EXPECT_EQ(result->placements[0].world_size, 6);

  nodes = {Node("n1", 2), Node("n2", 2), Node("n3", 2), Node("n4", 2), Node("n5", 2)};
  result = SchedulePass(nodes, {job}, {});
  ASSERT_THAT(result, IsOk());
  ASSERT_EQ(result->placements.size(), 1u);
  EXPECT_THAT(result->placements[0].nodes, ElementsAre("n1", "n2", "n3", "n4"));

  nodes = {Node("n1", 2), Node("n2", 1)};
  result = SchedulePass(nodes, {job}, {});
  ASSERT_THAT(result, IsOk());
  EXPECT_THAT(result->placements, IsEmpty());
  ASSERT_EQ(result->pending.size(), 1u);
  EXPECT_THAT(result->pending[0].reason,
              HasSubstr("waiting for at least 2 nodes (up to 4) with 2 free slots each; "
                        "1 node fits (n1)"));
}

TEST(SchedulerTest, CapacityShrinksAsJobsArePlacedInOnePass) {
  const std::vector<NodeView> nodes = {Node("node-a", 4), Node("node-b", 4)};
  absl::StatusOr<SchedulePassResult> result =
      SchedulePass(nodes, {Job("j1", 1, 1, 4), Job("j2", 2, 1, 4), Job("j3", 3, 1, 1)}, {});
  ASSERT_THAT(result, IsOk());
  ASSERT_THAT(PlacedIds(*result), ElementsAre("j1", "j2"));
  EXPECT_THAT(result->placements[0].nodes, ElementsAre("node-a"));
  EXPECT_THAT(result->placements[1].nodes, ElementsAre("node-b"));
  ASSERT_EQ(result->pending.size(), 1u);
  EXPECT_EQ(result->pending[0].reason,
            "waiting for 1 node with 1 free slot each; 0 nodes fit; "
            "2 short of capacity (node-a: 0 slots free, node-b: 0 slots free)");
}

TEST(SchedulerTest, SmallJobsShareANodeUntilItIsFull) {
  const std::vector<NodeView> nodes = {Node("node-a", 8, 8), Node("node-b", 8, 8)};
  absl::StatusOr<SchedulePassResult> result = SchedulePass(
      nodes, {Job("j1", 1, 1, 2, 2), Job("j2", 2, 1, 2, 2), Job("j3", 3, 1, 2, 2)}, {});
  ASSERT_THAT(result, IsOk());
  ASSERT_THAT(PlacedIds(*result), ElementsAre("j1", "j2", "j3"));
  // First fitting node by name, GPUs taken in ascending order.
  EXPECT_THAT(result->placements[0].nodes, ElementsAre("node-a"));
  EXPECT_THAT(result->placements[0].ranks[1].gpus, ElementsAre(2, 3));
  EXPECT_THAT(result->placements[1].nodes, ElementsAre("node-a"));
  EXPECT_THAT(result->placements[1].ranks[0].gpus, ElementsAre(4, 5));
  EXPECT_THAT(result->placements[1].ranks[1].gpus, ElementsAre(6, 7));
  EXPECT_THAT(result->placements[2].nodes, ElementsAre("node-b"));
  EXPECT_THAT(result->placements[2].ranks[0].gpus, ElementsAre(0, 1));
}

TEST(SchedulerTest, GpuShortageIsInTheReason) {
  const std::vector<NodeView> nodes = {Node("node-a", 8, 2)};
  absl::StatusOr<SchedulePassResult> result = SchedulePass(nodes, {Job("j", 1, 1, 2, 2)}, {});
  ASSERT_THAT(result, IsOk());
  ASSERT_EQ(result->pending.size(), 1u);
  EXPECT_EQ(result->pending[0].reason,
            "waiting for 1 node with 2 free slots and 4 free GPUs each; 0 nodes fit; "
            "1 short of capacity (node-a: 8 slots, 2 GPUs free)");
}

TEST(SchedulerTest, FifoHeadBlocksLaterJobsUnlessBackfillIsOn) {
  const std::vector<NodeView> nodes = {Node("node-a", 4), Node("node-b", 4)};
  const std::vector<JobRequest> jobs = {Job("head", 1, 3, 4), Job("small", 2, 1, 1),
                                        Job("small2", 3, 1, 1)};
  absl::StatusOr<SchedulePassResult> result = SchedulePass(nodes, jobs, {});
  ASSERT_THAT(result, IsOk());
  EXPECT_THAT(result->placements, IsEmpty());
  ASSERT_EQ(result->pending.size(), 3u);
  EXPECT_THAT(result->pending[0].reason, HasSubstr("waiting for 3 nodes"));
  EXPECT_EQ(result->pending[1], (PendingJob{"small", "blocked behind job head (FIFO)"}));
  EXPECT_EQ(result->pending[2], (PendingJob{"small2", "blocked behind job head (FIFO)"}));

  result = SchedulePass(nodes, jobs, {}, SchedulerOptions{.backfill = true});
  ASSERT_THAT(result, IsOk());
  EXPECT_THAT(PlacedIds(*result), ElementsAre("small", "small2"));
  ASSERT_EQ(result->pending.size(), 1u);
  EXPECT_EQ(result->pending[0].job_id, "head");
}

TEST(SchedulerTest, SubmissionOrderNotInputOrderDecides) {
  const std::vector<NodeView> nodes = {Node("node-a", 4)};
  absl::StatusOr<SchedulePassResult> result =
      SchedulePass(nodes, {Job("late", 7, 1, 4), Job("early", 3, 1, 4)}, {});
  ASSERT_THAT(result, IsOk());
  EXPECT_THAT(PlacedIds(*result), ElementsAre("early"));
  ASSERT_EQ(result->pending.size(), 1u);
  EXPECT_EQ(result->pending[0].job_id, "late");
}

TEST(SchedulerTest, LostAndDrainingNodesAreNeverChosen) {
  const std::vector<NodeView> nodes = {Node("node-a", 8, 0, NodeState::kLost),
                                       Node("node-b", 8, 0, NodeState::kDraining),
                                       Node("node-c", 8)};
  absl::StatusOr<SchedulePassResult> result = SchedulePass(nodes, {Job("one", 1, 1, 2)}, {});
  ASSERT_THAT(result, IsOk());
  ASSERT_EQ(result->placements.size(), 1u);
  EXPECT_THAT(result->placements[0].nodes, ElementsAre("node-c"));

  result = SchedulePass(nodes, {Job("two", 1, 2, 2)}, {});
  ASSERT_THAT(result, IsOk());
  EXPECT_THAT(result->placements, IsEmpty());
  ASSERT_EQ(result->pending.size(), 1u);
  EXPECT_EQ(result->pending[0].reason,
            "waiting for 2 nodes with 2 free slots each; 1 node fits (node-c); "
            "1 LOST (node-a); 1 DRAINING (node-b)");
}

TEST(SchedulerTest, RunningAllocationsHoldTheirCapacity) {
  const std::vector<NodeView> nodes = {Node("node-a", 4, 4), Node("node-b", 4, 4)};
  absl::StatusOr<SchedulePassResult> first = SchedulePass(nodes, {Job("r", 1, 1, 2, 1)}, {});
  ASSERT_THAT(first, IsOk());
  ASSERT_EQ(first->placements.size(), 1u);
  // node-a has 2 slots and GPUs 2, 3 left: a 2 x 1-GPU job still fits there,
  // a 3-proc job goes to node-b.
  absl::StatusOr<SchedulePassResult> result =
      SchedulePass(nodes, {Job("fits", 2, 1, 2, 1), Job("bigger", 3, 1, 3, 1)}, first->placements);
  ASSERT_THAT(result, IsOk());
  ASSERT_THAT(PlacedIds(*result), ElementsAre("fits", "bigger"));
  EXPECT_THAT(result->placements[0].nodes, ElementsAre("node-a"));
  EXPECT_THAT(result->placements[0].ranks[0].gpus, ElementsAre(2));
  EXPECT_THAT(result->placements[0].ranks[1].gpus, ElementsAre(3));
  EXPECT_THAT(result->placements[1].nodes, ElementsAre("node-b"));
}

TEST(SchedulerTest, ReleaseReturnsCapacity) {
  Scheduler scheduler;
  const std::vector<NodeView> nodes = {Node("node-a", 4, 2)};
  absl::StatusOr<SchedulePassResult> result =
      scheduler.Schedule(nodes, {Job("j1", 1, 1, 2, 1), Job("j2", 2, 1, 2, 1)});
  ASSERT_THAT(result, IsOk());
  EXPECT_THAT(PlacedIds(*result), ElementsAre("j1"));
  ASSERT_NE(scheduler.Find("j1"), nullptr);
  EXPECT_EQ(scheduler.Find("j2"), nullptr);

  // Still held: j2 keeps waiting on a second pass.
  result = scheduler.Schedule(nodes, {Job("j2", 2, 1, 2, 1)});
  ASSERT_THAT(result, IsOk());
  EXPECT_THAT(result->placements, IsEmpty());
  EXPECT_THAT(result->pending[0].reason, HasSubstr("node-a: 2 slots, 0 GPUs free"));

  ASSERT_THAT(scheduler.Release("j1"), IsOk());
  EXPECT_THAT(scheduler.Release("j1"), StatusIs(Code::kNotFound));
  result = scheduler.Schedule(nodes, {Job("j2", 2, 1, 2, 1)});
  ASSERT_THAT(result, IsOk());
  ASSERT_THAT(PlacedIds(*result), ElementsAre("j2"));
  EXPECT_THAT(result->placements[0].ranks[0].gpus, ElementsAre(0));
  ASSERT_EQ(scheduler.Running().size(), 1u);
  EXPECT_EQ(scheduler.Running()[0].job_id, "j2");
}

TEST(SchedulerTest, AdoptedAllocationsCountAsRunning) {
  Scheduler before;
  const std::vector<NodeView> nodes = {Node("node-a", 2), Node("node-b", 2)};
  absl::StatusOr<SchedulePassResult> result = before.Schedule(nodes, {Job("old", 1, 1, 2)});
  ASSERT_THAT(result, IsOk());
  ASSERT_EQ(result->placements.size(), 1u);

  // A restarted coordinator adopts what its records say is running.
  Scheduler after;
  ASSERT_THAT(after.Adopt(result->placements[0]), IsOk());
  EXPECT_THAT(after.Adopt(result->placements[0]), StatusIs(Code::kAlreadyExists));
  EXPECT_THAT(after.Adopt(Placement{}), StatusIs(Code::kInvalidArgument));
  result = after.Schedule(nodes, {Job("new", 2, 1, 2)});
  ASSERT_THAT(result, IsOk());
  ASSERT_EQ(result->placements.size(), 1u);
  EXPECT_THAT(result->placements[0].nodes, ElementsAre("node-b"));
  // And a pending job cannot also be running.
  EXPECT_THAT(after.Schedule(nodes, {Job("old", 3, 1, 1)}),
              StatusIs(Code::kInvalidArgument, HasSubstr("both pending and running")));
}

TEST(SchedulerTest, InvalidRequestIsRejectedWithoutBlockingOthers) {
  const std::vector<NodeView> nodes = {Node("node-a", 4)};
  JobRequest bad = Job("bad", 1, 1, 4);
  bad.mesh_shape = {3};
  absl::StatusOr<SchedulePassResult> result = SchedulePass(nodes, {bad, Job("ok", 2, 1, 4)}, {});
  ASSERT_THAT(result, IsOk());
  ASSERT_EQ(result->rejected.size(), 1u);
  EXPECT_EQ(result->rejected[0].job_id, "bad");
  EXPECT_THAT(result->rejected[0].status,
              StatusIs(Code::kInvalidArgument, HasSubstr("mesh_shape")));
  EXPECT_THAT(PlacedIds(*result), ElementsAre("ok"));
}

TEST(SchedulerTest, ReasonWhenNoNodesAreRegistered) {
  absl::StatusOr<SchedulePassResult> result = SchedulePass({}, {Job("j", 1, 1, 1)}, {});
  ASSERT_THAT(result, IsOk());
  ASSERT_EQ(result->pending.size(), 1u);
  EXPECT_EQ(result->pending[0].reason,
            "waiting for 1 node with 1 free slot each; no nodes are registered");
}

TEST(SchedulerTest, MeshJobOnAMinMaxRangeTakesTheCountItsMeshNeeds) {
  JobRequest job = Job("mesh", 1, 1, 4);
  job.nodes_max = 4;
  job.mesh_shape = {2, 4};
  job.mesh_dim_names = {"dp", "tp"};
  const std::vector<NodeView> nodes = {Node("n1", 4), Node("n2", 4), Node("n3", 4)};
  absl::StatusOr<SchedulePassResult> result = SchedulePass(nodes, {job}, {});
  ASSERT_THAT(result, IsOk());
  ASSERT_EQ(result->placements.size(), 1u);
  EXPECT_THAT(result->placements[0].nodes, ElementsAre("n1", "n2"));
  EXPECT_EQ(result->placements[0].node_local_dims, 1);
}

TEST(SchedulerTest, BadInputsAreInvalidArgument) {
  EXPECT_THAT(SchedulePass({Node("x", 1), Node("x", 2)}, {}, {}),
              StatusIs(Code::kInvalidArgument, HasSubstr("'x' listed twice")));
  EXPECT_THAT(SchedulePass({Node("x", 1)}, {Job("j", 1, 1, 1), Job("j", 2, 1, 1)}, {}),
              StatusIs(Code::kInvalidArgument, HasSubstr("'j' is pending twice")));
  NodeView doubled = Node("g", 2, 2);
  doubled.gpus = {1, 1};
  EXPECT_THAT(SchedulePass({doubled}, {}, {}),
              StatusIs(Code::kInvalidArgument, HasSubstr("'g' lists a GPU index twice")));
}

TEST(SchedulerTest, SameInputsInAnyOrderGiveTheSameDecisions) {
  std::vector<NodeView> nodes;
  for (int i = 0; i < 8; ++i) {
    nodes.push_back(Node("node-" + std::to_string(i), 4 + i % 3, 4 + 2 * (i % 2),
                         i == 5 ? NodeState::kLost : NodeState::kReady));
  }
  std::vector<JobRequest> jobs = {Job("a", 1, 2, 2, 1), Job("b", 2, 1, 4, 1), Job("c", 3, 3, 4, 2),
                                  Job("d", 4, 1, 1), Job("e", 5, 2, 1)};
  jobs[0].mesh_shape = {2, 2};
  jobs[3].nodes_max = 3;
  const SchedulerOptions options{.backfill = true};
  absl::StatusOr<SchedulePassResult> first = SchedulePass(nodes, jobs, {}, options);
  ASSERT_THAT(first, IsOk());
  ASSERT_FALSE(first->placements.empty());
  ASSERT_FALSE(first->pending.empty());
  std::mt19937 rng(7);
  for (int round = 0; round < 20; ++round) {
    std::shuffle(nodes.begin(), nodes.end(), rng);
    for (NodeView& node : nodes) std::shuffle(node.gpus.begin(), node.gpus.end(), rng);
    std::shuffle(jobs.begin(), jobs.end(), rng);
    absl::StatusOr<SchedulePassResult> again = SchedulePass(nodes, jobs, {}, options);
    ASSERT_THAT(again, IsOk());
    EXPECT_EQ(again->placements, first->placements) << "round " << round;
    EXPECT_EQ(again->pending, first->pending) << "round " << round;
  }
}

}  // namespace scheduler_test
}  // namespace mesh::coordinator
