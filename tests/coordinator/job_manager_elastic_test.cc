// JobManager's elastic membership (docs/elastic.md), on the fixture of
// job_manager_fixture.h: a lost node shrinks an elastic job without counting
// a restart, spec.grow decides when it takes more nodes, and every change of
// its node count is recorded in Job.resizes, across coordinator restarts.
#include "tests/coordinator/job_manager_fixture.h"

namespace mesh::coordinator {
namespace job_manager_test {
namespace {

// nodes MIN:MAX × 2 processes, mesh (-1, 2) named dp, tp.
v1::JobSpec ElasticSpec(int min, int max, v1::GrowPolicy grow = v1::GROW_POLICY_NEVER,
                        int64_t grow_after_seconds = 0) {
  v1::JobSpec spec = Spec(min, 2);
  spec.mutable_nodes()->set_max(max);
  spec.set_mesh_shape(0, -1);
  spec.set_grow(grow);
  spec.set_grow_after_seconds(grow_after_seconds);
  return spec;
}

std::vector<std::string> NodesOf(const v1::Job& job) {
  return std::vector<std::string>(job.nodes().begin(), job.nodes().end());
}

class JobManagerElasticTest : public JobManagerTest {
 protected:
  // Registers node-a, node-b, ... (2 slots each).
  void AddNodes(int n) {
    for (int i = 0; i < n; ++i) {
      nodes_.push_back(
          &AddAgent(absl::StrCat("node-", std::string(1, static_cast<char>('a' + i)))));
    }
  }

  // Reports every rank of the job's current generation started on its node.
  void StartAll(const std::string& id) {
    const v1::Job job = Job(id);
    for (int n = 0; n < job.nodes_size(); ++n) {
      Agent* agent = Find(job.nodes(n));
      ASSERT_NE(agent, nullptr) << job.nodes(n);
      EXPECT_THAT(Started(*agent, id, job.generation(), {2 * n, 2 * n + 1}), IsOk());
    }
    EXPECT_EQ(StateOf(id), v1::JOB_STATE_RUNNING);
  }

  Agent* Find(const std::string& name) {
    for (Agent* agent : nodes_) {
      if (agent->name == name) return agent;
    }
    return nullptr;
  }

  // Every registered node but `lost` heartbeats until `lost` is LOST.
  void Lose(const std::string& lost) {
    std::vector<Agent*> alive;
    for (Agent* agent : nodes_) {
      if (agent->name != lost && agent->watch != 0) alive.push_back(agent);
    }
    AdvanceWithHeartbeats(kHeartbeatTimeout + absl::Seconds(1), alive);
    ASSERT_EQ(NodeInfo(lost).state(), v1::NODE_STATE_LOST);
    Find(lost)->watch = 0;
  }

  // `name` registers again and opens its order stream.
  void Return(const std::string& name) {
    Agent* agent = Find(name);
    ASSERT_THAT(Register(*agent), IsOk());
    ASSERT_THAT(Watch(*agent), IsOk());
  }

  std::vector<Agent*> Alive() {
    std::vector<Agent*> alive;
    for (Agent* agent : nodes_) {
      if (agent->watch != 0) alive.push_back(agent);
    }
    return alive;
  }

  std::vector<Agent*> nodes_;
};

TEST_F(JobManagerElasticTest, LostNodeShrinksTheJobWithoutCountingARestart) {
  AddNodes(4);
  // No restarts at all: only a membership change can keep this job alive.
  const std::string id = Submit(ElasticSpec(2, 4));
  EXPECT_THAT(NodesOf(Job(id)), ElementsAre("node-a", "node-b", "node-c", "node-d"));
  StartAll(id);

  Lose("node-d");

  const v1::Job job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(job.generation(), 1);
  EXPECT_EQ(job.restarts(), 0);
  EXPECT_EQ(manager().stats().restarts, 0);
  EXPECT_THAT(NodesOf(job), ElementsAre("node-a", "node-b", "node-c"));
  EXPECT_THAT(EventStates(job), ElementsAre(v1::JOB_STATE_PENDING, v1::JOB_STATE_SCHEDULED,
                                            v1::JOB_STATE_RUNNING, v1::JOB_STATE_RESTARTING,
                                            v1::JOB_STATE_PENDING, v1::JOB_STATE_SCHEDULED));
  EXPECT_THAT(job.events(3).reason(),
              AllOf(HasSubstr("node node-d lost"), HasSubstr("3 of 4 nodes left"),
                    HasSubstr("not counted as a restart")));
  EXPECT_THAT(job.events(5).reason(), HasSubstr("resized from 4 to 3 nodes"));
  // The lost node is the root cause.
  EXPECT_EQ(job.root_cause().rank(), -1);
  EXPECT_EQ(job.root_cause().node(), "node-d");
  EXPECT_EQ(job.root_cause().generation(), 0);

  ASSERT_EQ(job.resizes_size(), 1);
  EXPECT_EQ(job.resizes(0).from_nodes(), 4);
  EXPECT_EQ(job.resizes(0).to_nodes(), 3);
  EXPECT_EQ(job.resizes(0).generation(), 1);
  EXPECT_THAT(job.resizes(0).reason(), HasSubstr("node node-d lost"));
  EXPECT_EQ(job.resizes(0).time_unix_ms(), absl::ToUnixMillis(clock_.Now()));

  // World size and mesh are derived again: 3 nodes × 2 = 6 ranks, (3, 2).
  absl::StatusOr<JobInfo> info = coordination_->GetJob(id);
  ASSERT_THAT(info, IsOk());
  EXPECT_EQ(info->generation, 1);
  EXPECT_EQ(info->layout.world_size, 6);
  EXPECT_THAT(info->layout.mesh_shape, ElementsAre(3, 2));
  EXPECT_THAT(info->layout.mesh_dim_names, ElementsAre("dp", "tp"));
  for (Agent* agent : {Find("node-a"), Find("node-b"), Find("node-c")}) {
    const std::vector<v1::Assignment> launches = OrdersWith(agent->orders->messages(), kLaunch);
    ASSERT_THAT(launches, SizeIs(2)) << agent->name;
    EXPECT_EQ(launches[1].generation(), 1);
    EXPECT_EQ(launches[1].world_size(), 6);
    EXPECT_EQ(launches[1].num_nodes(), 3);
    // The agent kills generation 0 before it launches generation 1.
    EXPECT_THAT(ActionsOf(agent->orders->messages()),
                ElementsAre(Pair(kLaunch, 0), Pair(kKill, 0), Pair(kLaunch, 1)));
  }
  StartAll(id);
}

TEST_F(JobManagerElasticTest, LosingNodesBelowMinIsAFailureThatCounts) {
  AddNodes(2);
  v1::JobSpec spec = ElasticSpec(2, 4);
  spec.set_max_restarts(1);
  const std::string id = Submit(spec);
  StartAll(id);

  Lose("node-b");

  // One node left of the two needed: a failure, counted, and the job waits.
  const v1::Job job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(job.generation(), 1);
  EXPECT_EQ(job.restarts(), 1);
  EXPECT_THAT(job.pending_reason(), HasSubstr("node-b"));
  EXPECT_THAT(job.resizes(), IsEmpty());
}

TEST_F(JobManagerElasticTest, LosingNodesBelowMinWithoutRestartsFailsTheJob) {
  AddNodes(2);
  const std::string id = Submit(ElasticSpec(2, 3));
  StartAll(id);
  Lose("node-a");
  const v1::Job job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(job.root_cause().node(), "node-a");
}

TEST_F(JobManagerElasticTest, NodesLostInOnePassAreCountedTogether) {
  AddNodes(4);
  v1::JobSpec spec = ElasticSpec(3, 4);
  spec.set_max_restarts(1);
  const std::string id = Submit(spec);
  StartAll(id);
  // node-c and node-d fall silent together: 2 nodes left, below MIN 3.
  AdvanceWithHeartbeats(kHeartbeatTimeout + absl::Seconds(1), {Find("node-a"), Find("node-b")});
  const v1::Job job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(job.restarts(), 1) << "a failure, not a resize";
  EXPECT_THAT(job.resizes(), IsEmpty());
}

TEST_F(JobManagerElasticTest, OneJobGrowsPerPassAndNoJobIsKilledForAnothersGrowth) {
  // Job A on node-a, node-b; job B on node-c, node-d; then one node frees.
  AddNodes(2);
  const std::string a = Submit(ElasticSpec(2, 4, v1::GROW_POLICY_AFTER, 60));
  StartAll(a);
  nodes_.push_back(&AddAgent("node-c"));
  nodes_.push_back(&AddAgent("node-d"));
  const std::string b = Submit(ElasticSpec(2, 4, v1::GROW_POLICY_AFTER, 60));
  EXPECT_THAT(NodesOf(Job(b)), ElementsAre("node-c", "node-d"));
  StartAll(b);
  nodes_.push_back(&AddAgent("node-e"));

  AdvanceWithHeartbeats(absl::Seconds(65), Alive());

  // A grew onto the free node; B's trial did not count A's nodes as free,
  // so B still runs, untouched.
  EXPECT_THAT(NodesOf(Job(a)), ElementsAre("node-a", "node-b", "node-e"));
  EXPECT_EQ(Job(a).generation(), 1);
  EXPECT_EQ(Job(b).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Job(b).generation(), 0);
  EXPECT_THAT(NodesOf(Job(b)), ElementsAre("node-c", "node-d"));
}

TEST_F(JobManagerElasticTest, AfterARestartAWaitingJobKeepsItsSizeCap) {
  UseFileStore();
  AddNodes(2);
  v1::JobSpec spec = ElasticSpec(2, 4);
  spec.set_max_restarts(1);
  const std::string id = Submit(spec);
  EXPECT_THAT(NodesOf(Job(id)), SizeIs(2));
  StartAll(id);
  Lose("node-b");  // One left of MIN 2: a failure; the job waits.
  ASSERT_EQ(StateOf(id), v1::JOB_STATE_PENDING);

  RestartCoordinator();
  for (Agent* agent : nodes_) Return(agent->name);
  nodes_.push_back(&AddAgent("node-c"));
  nodes_.push_back(&AddAgent("node-d"));
  // grow NEVER: at most the two nodes it had, with four free.
  EXPECT_EQ(StateOf(id), v1::JOB_STATE_SCHEDULED);
  EXPECT_THAT(NodesOf(Job(id)), SizeIs(2));
}

TEST_F(JobManagerElasticTest, AFreeNodeReplacesTheLostOneAtTheSameSize) {
  AddNodes(3);
  v1::JobSpec spec = ElasticSpec(1, 2);
  const std::string id = Submit(spec);
  EXPECT_THAT(NodesOf(Job(id)), ElementsAre("node-a", "node-b"));
  StartAll(id);

  Lose("node-a");

  const v1::Job job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(job.restarts(), 0);
  EXPECT_THAT(NodesOf(job), ElementsAre("node-b", "node-c"));
  EXPECT_THAT(job.resizes(), IsEmpty()) << "the same size is no resize";
}

TEST_F(JobManagerElasticTest, GrowNeverKeepsAShrunkJobSmallWhenTheNodeReturns) {
  AddNodes(3);
  v1::JobSpec spec = ElasticSpec(2, 3);
  spec.set_max_restarts(1);
  const std::string id = Submit(spec);
  StartAll(id);
  Lose("node-c");
  StartAll(id);

  Return("node-c");
  AdvanceWithHeartbeats(absl::Hours(1), Alive());

  const v1::Job job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.generation(), 1);
  EXPECT_THAT(NodesOf(job), ElementsAre("node-a", "node-b"));
  EXPECT_THAT(job.resizes(), SizeIs(1));
  // A failure restarts it on the nodes it has, with node-c free.
  ASSERT_THAT(Exited(*Find("node-a"), id, 1, 0, 3), IsOk());
  const v1::Job restarted = Job(id);
  EXPECT_EQ(restarted.state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(restarted.generation(), 2);
  EXPECT_THAT(NodesOf(restarted), ElementsAre("node-a", "node-b"));
}

TEST_F(JobManagerElasticTest, GrowAfterTakesFreeNodesOnceTheJobHasRunThatLong) {
  AddNodes(3);
  const std::string id = Submit(ElasticSpec(2, 3, v1::GROW_POLICY_AFTER, 600));
  StartAll(id);
  Lose("node-c");
  StartAll(id);  // Generation 1 runs on two nodes from now.
  const absl::Time running = clock_.Now();

  Return("node-c");
  AdvanceWithHeartbeats(absl::Seconds(595), Alive());
  EXPECT_EQ(Job(id).generation(), 1) << "not yet 600 s at this size";
  EXPECT_LT(clock_.Now() - running, absl::Seconds(600));

  AdvanceWithHeartbeats(absl::Seconds(10), Alive());

  const v1::Job job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(job.generation(), 2);
  EXPECT_EQ(job.restarts(), 0);
  EXPECT_THAT(NodesOf(job), ElementsAre("node-a", "node-b", "node-c"));
  ASSERT_EQ(job.resizes_size(), 2);
  EXPECT_EQ(job.resizes(1).from_nodes(), 2);
  EXPECT_EQ(job.resizes(1).to_nodes(), 3);
  EXPECT_EQ(job.resizes(1).generation(), 2);
  EXPECT_THAT(job.resizes(1).reason(), HasSubstr("grow after 600s at 2 nodes: 1 more node free"));
  EXPECT_EQ(job.root_cause().node(), "node-c") << "growing is no failure";
  // The old generation is killed (with the usual grace) before the new one
  // starts on every node.
  EXPECT_THAT(ActionsOf(Find("node-a")->orders->messages()),
              ElementsAre(Pair(kLaunch, 0), Pair(kKill, 0), Pair(kLaunch, 1), Pair(kKill, 1),
                          Pair(kLaunch, 2)));
  EXPECT_THAT(ActionsOf(Find("node-c")->orders->messages()), ElementsAre(Pair(kLaunch, 2)));
  absl::StatusOr<JobInfo> info = coordination_->GetJob(id);
  ASSERT_THAT(info, IsOk());
  EXPECT_EQ(info->layout.world_size, 6);
  StartAll(id);
}

TEST_F(JobManagerElasticTest, GrowAfterLeavesFreeNodesToAJobWaitingToBePlaced) {
  AddNodes(3);
  const std::string id = Submit(ElasticSpec(2, 3, v1::GROW_POLICY_AFTER, 60));
  StartAll(id);
  Lose("node-c");
  StartAll(id);
  // A job that needs two nodes waits; node-c alone cannot start it.
  const std::string waiting = Submit(Spec(2, 2));
  EXPECT_EQ(StateOf(waiting), v1::JOB_STATE_PENDING);

  Return("node-c");
  AdvanceWithHeartbeats(absl::Minutes(10), Alive());
  EXPECT_EQ(Job(id).generation(), 1);
  EXPECT_THAT(NodesOf(Job(id)), SizeIs(2));

  // Once nothing waits, the job grows.
  ASSERT_THAT(manager().Cancel(waiting, "not needed"), IsOk());
  AdvanceWithHeartbeats(absl::Seconds(5), Alive());
  EXPECT_EQ(Job(id).generation(), 2);
  EXPECT_THAT(NodesOf(Job(id)), SizeIs(3));
}

TEST_F(JobManagerElasticTest, GrowAfterDoesNothingWithoutFreeNodes) {
  AddNodes(2);
  const std::string id = Submit(ElasticSpec(2, 4, v1::GROW_POLICY_AFTER, 1));
  StartAll(id);
  AdvanceWithHeartbeats(absl::Minutes(5), Alive());
  const v1::Job job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.generation(), 0);
  EXPECT_THAT(job.resizes(), IsEmpty());
  // Its nodes are still held: another job does not fit.
  EXPECT_EQ(StateOf(Submit(Spec(1, 1))), v1::JOB_STATE_PENDING);
}

TEST_F(JobManagerElasticTest, GrowOnRestartTakesFreeNodesAtTheNextFailure) {
  AddNodes(2);
  v1::JobSpec spec = ElasticSpec(2, 4, v1::GROW_POLICY_ON_RESTART);
  spec.set_max_restarts(1);
  const std::string id = Submit(spec);
  StartAll(id);
  nodes_.push_back(&AddAgent("node-c"));
  EXPECT_EQ(Job(id).generation(), 0) << "a running job does not grow on its own";

  ASSERT_THAT(Exited(*Find("node-b"), id, 0, 3, 1), IsOk());

  const v1::Job job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(job.generation(), 1);
  EXPECT_EQ(job.restarts(), 1) << "the failure counts";
  EXPECT_THAT(NodesOf(job), ElementsAre("node-a", "node-b", "node-c"));
  ASSERT_EQ(job.resizes_size(), 1);
  EXPECT_EQ(job.resizes(0).from_nodes(), 2);
  EXPECT_EQ(job.resizes(0).to_nodes(), 3);
  EXPECT_THAT(job.resizes(0).reason(), HasSubstr("rank 3"));
}

TEST_F(JobManagerElasticTest, GrowNeverRestartsAFailureOnTheSameNodes) {
  AddNodes(3);
  v1::JobSpec spec = ElasticSpec(1, 2);
  spec.set_max_restarts(1);
  const std::string id = Submit(spec);
  StartAll(id);
  ASSERT_THAT(Exited(*Find("node-a"), id, 0, 1, 1), IsOk());
  const v1::Job job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_THAT(NodesOf(job), ElementsAre("node-a", "node-b"));
  EXPECT_THAT(job.resizes(), IsEmpty());
}

TEST_F(JobManagerElasticTest, ResizesSurviveACoordinatorRestart) {
  UseFileStore();
  AddNodes(3);
  const std::string id = Submit(ElasticSpec(2, 3));
  StartAll(id);
  Lose("node-b");
  const v1::Job before = Job(id);
  ASSERT_EQ(before.resizes_size(), 1);

  RestartCoordinator();

  const v1::Job after = Job(id);
  ASSERT_EQ(after.resizes_size(), 1);
  EXPECT_EQ(after.resizes(0).SerializeAsString(), before.resizes(0).SerializeAsString());
  EXPECT_EQ(after.restarts(), 0);
  EXPECT_EQ(after.generation(), 1);
}

TEST_F(JobManagerElasticTest, SubmitNormalizesGrowToNever) {
  AddNodes(1);
  v1::JobSpec spec = Spec(1, 2);
  spec.clear_grow();
  EXPECT_EQ(Job(Submit(spec)).spec().grow(), v1::GROW_POLICY_NEVER);
}

TEST_F(JobManagerElasticTest, SubmitRejectsAGrowPolicyOnAFixedSizeNamingTheField) {
  v1::JobSpec spec = Spec(2, 2);
  spec.set_grow(v1::GROW_POLICY_ON_RESTART);
  EXPECT_THAT(manager().Submit(spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("spec.grow"), HasSubstr("fixed at 2 nodes"))));
  EXPECT_THAT(manager().ListJobs({})->jobs(), IsEmpty());
}

}  // namespace
}  // namespace job_manager_test
}  // namespace mesh::coordinator
