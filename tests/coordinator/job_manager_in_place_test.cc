// JobManager's in-place recovery (spec.restart_policy IN_PLACE;
// docs/elastic.md, "In-place recovery"), on the fixture of
// job_manager_fixture.h: once every rank has joined its generation in
// Coordination, a failed worker is relaunched alone at the same generation
// (a LAUNCH with replace for that rank only), the restart is counted, and
// the generation's membership moves to its next epoch. Before the world has
// formed, outside RUNNING, after an exit 0, or with no restarts left, the
// job restarts or fails as under GROUP.
#include <csignal>
#include <ostream>

#include "tests/common/test_metrics.h"
#include "tests/coordinator/job_manager_fixture.h"

namespace mesh::coordinator {
namespace job_manager_test {
namespace {

using ::testing::Not;

constexpr char kInPlaceRecoveries[] = "mesh_coordinator_in_place_recoveries_total";
constexpr char kJobRestarts[] = "mesh_coordinator_job_restarts_total";

// Spec() (2 nodes × 2 processes, mesh (2, 2) named dp, tp) whose failed
// workers are relaunched in place; in_place_dim is left for Submit to
// normalize to "dp".
v1::JobSpec InPlaceSpec(int max_restarts = 2) {
  v1::JobSpec spec = SpecWithRestarts(max_restarts);
  spec.set_restart_policy(v1::RESTART_POLICY_IN_PLACE);
  return spec;
}

// What a Join callback was called with. The state is shared with the
// callback so that a late call never writes into a dead frame.
class JoinReply {
 public:
  Callback<JoinResult> Done() {
    return [state = state_](absl::StatusOr<JoinResult> result) {
      ++state->calls;
      state->result = std::move(result);
    };
  }
  bool fired() const { return state_->calls > 0; }
  const absl::StatusOr<JoinResult>& get() const { return *state_->result; }

 private:
  struct State {
    int calls = 0;
    std::optional<absl::StatusOr<JoinResult>> result;
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

// The first process of each rank: incarnation 100 + rank.
uint64_t FirstIncarnation(int rank) { return 100u + static_cast<uint64_t>(rank); }

// (rank, kind, epoch, incarnation) of each membership change, oldest first.
struct Change {
  int rank;
  v1::MembershipChange::Kind kind;
  int64_t epoch;
  uint64_t incarnation;
  bool operator==(const Change&) const = default;
  friend std::ostream& operator<<(std::ostream& os, const Change& c) {
    return os << "{rank " << c.rank << ", " << v1::MembershipChange::Kind_Name(c.kind) << ", epoch "
              << c.epoch << ", incarnation " << c.incarnation << "}";
  }
};

std::vector<Change> ChangesOf(const v1::Job& job) {
  std::vector<Change> out;
  for (const v1::MembershipChange& c : job.membership()) {
    out.push_back(Change{c.rank(), c.kind(), c.epoch(), c.incarnation()});
  }
  return out;
}

class JobManagerInPlaceTest : public JobManagerTest {
 protected:
  void SetUp() override {
    JobManagerTest::SetUp();
    // The fixture's manager again, recording into registry_ (UseFileStore
    // and RestartCoordinator make one without).
    manager_.reset();
    manager_ = std::make_unique<JobManager>(&clock_, store_.get(), coordination_.get(),
                                            TestOptions(), &registry_);
  }

  void TearDown() override {
    JobManagerTest::TearDown();
    manager_.reset();  // Before registry_, which it records into.
  }

  // Rank `rank` of generation 0 of `id` joins Coordination as `incarnation`
  // from its node.
  JoinReply JoinRank(const std::string& id, int rank, uint64_t incarnation) {
    JoinReply reply;
    JoinArgs args;
    args.caller = Caller{id, 0, rank, incarnation};
    args.host = rank < 2 ? "node-a" : "node-b";
    coordination_->Join(std::move(args), reply.Done());
    return reply;
  }

  // Each of `ranks` joins generation 0 as its first process.
  std::vector<JoinReply> JoinRanks(const std::string& id, const std::vector<int>& ranks) {
    std::vector<JoinReply> replies;
    for (int rank : ranks) replies.push_back(JoinRank(id, rank, FirstIncarnation(rank)));
    return replies;
  }

  // The 2 × 2 job of `spec` on node-a and node-b, RUNNING at generation 0,
  // with its world formed in Coordination (every rank joined).
  std::string RunAndFormWorld(v1::JobSpec spec) {
    AddTwoNodes();
    const std::string id = RunJob(std::move(spec));
    const std::vector<JoinReply> replies = JoinRanks(id, {0, 1, 2, 3});
    for (int rank = 0; rank < 4; ++rank) {
      EXPECT_TRUE(replies[rank].fired()) << rank;
      if (replies[rank].fired()) {
        EXPECT_THAT(replies[rank].get(), IsOk()) << rank;
      }
    }
    return id;
  }

  double Count(const std::string& name) const { return registry_.CounterValue(name); }

  // Every registered agent not in `alive` falls silent until it is LOST.
  void LoseAllBut(const std::vector<Agent*>& alive) {
    AdvanceWithHeartbeats(kHeartbeatTimeout + absl::Seconds(1), alive);
  }

  // The job restarted as a whole once more (generation 1), with `restarts`
  // counted in all, `recoveries` of them in place. Returns the job.
  v1::Job ExpectWholeRestart(const std::string& id, int restarts, int recoveries) {
    const v1::Job job = Job(id);
    EXPECT_EQ(job.generation(), 1);
    EXPECT_EQ(job.restarts(), restarts);
    EXPECT_EQ(Count(kInPlaceRecoveries), recoveries);
    return job;
  }

  // node-c registers, free; then node-b is LOST while node-a and node-c
  // heartbeat. Returns node-c.
  Agent* LoseNodeBWithNodeCFree() {
    Agent* c = &AddAgent("node-c");
    LoseAllBut({a_, c});
    return c;
  }

  // The 2 × 2 job of RunJob restarted as a whole after one failure at
  // generation 0: generation 1 is scheduled with one restart counted, and
  // both nodes got a KILL of generation 0 and a plain LAUNCH of 1.
  void ExpectRestartedAsAWhole(const v1::Job& job) {
    EXPECT_EQ(job.state(), v1::JOB_STATE_SCHEDULED);
    EXPECT_EQ(job.generation(), 1);
    EXPECT_EQ(job.restarts(), 1);
    EXPECT_THAT(EventStates(job),
                ElementsAre(v1::JOB_STATE_PENDING, v1::JOB_STATE_SCHEDULED, v1::JOB_STATE_RUNNING,
                            v1::JOB_STATE_RESTARTING, v1::JOB_STATE_SCHEDULED));
    for (const Agent* agent : {a_, b_}) {
      SCOPED_TRACE(agent->name);
      EXPECT_THAT(ActionsOf(agent->orders->messages()),
                  ElementsAre(Pair(kLaunch, 0), Pair(kKill, 0), Pair(kLaunch, 1)));
      EXPECT_FALSE(agent->orders->messages().back().replace());
    }
  }

  // The membership epoch of `id`'s generation in Coordination; -1 (and a
  // test failure) when it has no such job.
  int64_t EpochOf(const std::string& id) {
    absl::StatusOr<JobInfo> info = coordination_->GetJob(id);
    EXPECT_THAT(info, IsOk());
    return info.ok() ? info->membership_epoch : -1;
  }

  metrics::testing::TestRegistry registry_;
};

TEST_F(JobManagerInPlaceTest, FailedRankIsRelaunchedAloneAtTheSameGeneration) {
  const std::string id = RunAndFormWorld(InPlaceSpec());
  const int events_before = Job(id).events_size();

  ASSERT_THAT(Exited(*a_, id, 0, 1, 1), IsOk());

  const v1::Job job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.generation(), 0);
  EXPECT_EQ(job.restarts(), 1);
  ASSERT_EQ(job.events_size(), events_before + 1);
  const v1::JobStateEvent& event = job.events(job.events_size() - 1);
  EXPECT_EQ(event.from(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(event.to(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(event.generation(), 0);
  EXPECT_THAT(event.reason(), AllOf(HasSubstr("rank 1 (node node-a) exited with code 1"),
                                    HasSubstr("relaunched in place"), HasSubstr("restart 1 of 2")));
  ASSERT_TRUE(job.has_root_cause());
  EXPECT_EQ(job.root_cause().rank(), 1);
  EXPECT_EQ(job.root_cause().exit_code(), 1);
  EXPECT_EQ(job.root_cause().generation(), 0);

  // node-a: a second LAUNCH of generation 0, replacing rank 1 only; nothing
  // is killed, and node-b hears nothing.
  ASSERT_THAT(ActionsOf(a_->orders->messages()), ElementsAre(Pair(kLaunch, 0), Pair(kLaunch, 0)));
  const v1::Assignment& first = a_->orders->messages()[0];
  const v1::Assignment& relaunch = a_->orders->messages()[1];
  EXPECT_FALSE(first.replace());
  EXPECT_TRUE(relaunch.replace());
  EXPECT_EQ(relaunch.job_id(), id);
  EXPECT_THAT(RanksOf(relaunch), ElementsAre(Pair(1, 1)));
  EXPECT_EQ(relaunch.world_size(), 4);
  EXPECT_EQ(relaunch.restart_count(), 1);
  EXPECT_EQ(relaunch.master_port(), first.master_port());
  EXPECT_THAT(relaunch.command(), ElementsAre("/usr/bin/python3", "train.py", "--lr=3e-4"));
  EXPECT_THAT(ActionsOf(b_->orders->messages()), ElementsAre(Pair(kLaunch, 0)));
  EXPECT_THAT(OrdersWith(a_->orders->messages(), kKill), IsEmpty());
  EXPECT_THAT(OrdersWith(b_->orders->messages(), kKill), IsEmpty());

  // Coordination lost the rank: membership epoch 1; the generation goes on.
  absl::StatusOr<JobInfo> info = coordination_->GetJob(id);
  ASSERT_THAT(info, IsOk());
  EXPECT_EQ(info->generation, 0);
  EXPECT_FALSE(info->failed);
  EXPECT_EQ(info->membership_epoch, 1);
  ASSERT_THAT(info->membership, SizeIs(1));
  EXPECT_EQ(info->membership[0].rank, 1);
  EXPECT_TRUE(info->membership[0].lost);
  EXPECT_EQ(info->membership[0].epoch, 1);
  EXPECT_THAT(info->membership[0].reason, HasSubstr("exited with code 1"));
  // The survivors are still members.
  EXPECT_THAT(coordination_->Heartbeat(Caller{id, 0, 0, FirstIncarnation(0)}), IsOk());

  // GetJob shows the change.
  EXPECT_THAT(ChangesOf(job), ElementsAre(Change{1, v1::MembershipChange::KIND_LOST, 1, 0}));
  EXPECT_THAT(job.membership(0).reason(), HasSubstr("rank 1 (node node-a) exited with code 1"));
  EXPECT_EQ(job.membership(0).time_unix_ms(), absl::ToUnixMillis(clock_.Now()));

  EXPECT_EQ(Count(kInPlaceRecoveries), 1);
  EXPECT_EQ(Count(kJobRestarts), 1);

  // The agent starts the new process: the job stays RUNNING.
  clock_.Advance(absl::Seconds(3));
  ASSERT_THAT(Started(*a_, id, 0, {1}), IsOk());
  EXPECT_EQ(StateOf(id), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Job(id).events_size(), events_before + 1);

  // It joins as rank 1 with a new incarnation: back, in epoch 2.
  const JoinReply back = JoinRank(id, 1, 201);
  ASSERT_TRUE(back.fired());
  ASSERT_THAT(back.get(), IsOk());
  EXPECT_EQ(back.get()->rank, 1);
  EXPECT_EQ(back.get()->generation, 0);
  EXPECT_EQ(back.get()->membership_epoch, 2);
  EXPECT_TRUE(back.get()->in_place);
  EXPECT_EQ(back.get()->in_place_dim, "dp");
  const v1::Job rejoined = Job(id);
  EXPECT_THAT(ChangesOf(rejoined),
              ElementsAre(Change{1, v1::MembershipChange::KIND_LOST, 1, 0},
                          Change{1, v1::MembershipChange::KIND_RETURNED, 2, 201}));
  EXPECT_EQ(rejoined.membership(1).time_unix_ms(), absl::ToUnixMillis(clock_.Now()));
  EXPECT_EQ(EpochOf(id), 2);
  EXPECT_EQ(rejoined.restarts(), 1);

  // Every rank finishes: the job succeeds at generation 0.
  for (int rank = 0; rank < 4; ++rank) {
    ASSERT_THAT(Exited(rank < 2 ? *a_ : *b_, id, 0, rank, 0), IsOk());
  }
  const v1::Job done = Job(id);
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done.generation(), 0);
  EXPECT_EQ(done.restarts(), 1);
}

TEST_F(JobManagerInPlaceTest, JoinRepliesCarryThePolicyAndItsDimension) {
  v1::JobSpec spec = InPlaceSpec();
  spec.set_in_place_dim("tp");
  AddTwoNodes();
  const std::string id = RunJob(std::move(spec));
  EXPECT_EQ(Job(id).spec().in_place_dim(), "tp");
  absl::StatusOr<JobInfo> info = coordination_->GetJob(id);
  ASSERT_THAT(info, IsOk());
  EXPECT_TRUE(info->layout.in_place);
  EXPECT_EQ(info->layout.in_place_dim, "tp");
  const std::vector<JoinReply> replies = JoinRanks(id, {0, 1, 2, 3});
  for (int rank = 0; rank < 4; ++rank) {
    ASSERT_TRUE(replies[rank].fired()) << rank;
    ASSERT_THAT(replies[rank].get(), IsOk()) << rank;
    EXPECT_TRUE(replies[rank].get()->in_place) << rank;
    EXPECT_EQ(replies[rank].get()->in_place_dim, "tp") << rank;
    EXPECT_EQ(replies[rank].get()->membership_epoch, 0) << rank;
  }
}

TEST_F(JobManagerInPlaceTest, AnExitOfTheReplacedProcessAfterItsReplacementStartedIsIgnored) {
  const std::string id = RunAndFormWorld(InPlaceSpec(2));
  // The first process of rank 1 has pid 1001 (the fixture's Started).
  v1::ReportWorkerExitRequest first = ExitRequest(*a_, id, 0, 1);
  first.set_exit_code(1);
  first.set_pid(1001);
  ASSERT_THAT(manager().ReportWorkerExit(first), IsOk());
  EXPECT_EQ(Job(id).restarts(), 1);
  // Its replacement starts as pid 2001.
  v1::ReportWorkersStartedRequest started;
  started.set_name(a_->name);
  started.set_session_id(a_->session);
  started.set_job_id(id);
  started.set_generation(0);
  v1::RunningWorker* worker = started.add_workers();
  *worker = Worker(id, 0, 1);
  worker->set_pid(2001);
  ASSERT_THAT(manager().ReportWorkersStarted(started), IsOk());
  // The first process's exit again (re-sent after a reconnect): ignored.
  ASSERT_THAT(manager().ReportWorkerExit(first), IsOk());
  EXPECT_EQ(Job(id).restarts(), 1);
  EXPECT_EQ(Count(kInPlaceRecoveries), 1);
  EXPECT_EQ(manager().stats().stale_reports, 1);
  // The replacement's own failure counts.
  v1::ReportWorkerExitRequest second = first;
  second.set_pid(2001);
  ASSERT_THAT(manager().ReportWorkerExit(second), IsOk());
  EXPECT_EQ(Job(id).restarts(), 2);
  EXPECT_EQ(Count(kInPlaceRecoveries), 2);
}

TEST_F(JobManagerInPlaceTest, AReplacementNeverReportedStartedRestartsTheWholeJob) {
  const std::string id = RunAndFormWorld(InPlaceSpec(2));
  ASSERT_THAT(Exited(*a_, id, 0, 1, 1), IsOk());
  ASSERT_EQ(Job(id).generation(), 0);
  // The agent never reports the new rank 1 started (it could not carry out
  // the order): past the kill grace and a node heartbeat timeout, the job
  // restarts as a whole instead of leaving the others waiting.
  AdvanceWithHeartbeats(kKillGrace + kHeartbeatTimeout + absl::Seconds(5), {a_, b_});
  const v1::Job job = Job(id);
  EXPECT_EQ(job.generation(), 1);
  EXPECT_EQ(job.restarts(), 2);
  EXPECT_THAT(job.root_cause().message(),
              HasSubstr("rank 1 (node node-a) was relaunched in place, but its agent did not "
                        "report it started within"));
}

TEST_F(JobManagerInPlaceTest, AReplacementReportedStartedInTimeKeepsTheJobRunning) {
  const std::string id = RunAndFormWorld(InPlaceSpec(2));
  ASSERT_THAT(Exited(*a_, id, 0, 1, 1), IsOk());
  ASSERT_THAT(Started(*a_, id, 0, {1}), IsOk());
  AdvanceWithHeartbeats(kKillGrace + kHeartbeatTimeout + absl::Seconds(5), {a_, b_});
  const v1::Job job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.generation(), 0);
  EXPECT_EQ(job.restarts(), 1);
}

// ---- A lost node's ranks move to a free node ------------------------------------

// node-b (ranks 2 and 3) is lost while node-c is free: both ranks move to
// node-c in place, in node-b's place of the job; node-a carries on.
TEST_F(JobManagerInPlaceTest, ALostNodesRanksMoveToAFreeNodeWhileTheOthersCarryOn) {
  const std::string id = RunAndFormWorld(InPlaceSpec(2));
  Agent* c = &AddAgent("node-c");
  const int events_before = Job(id).events_size();

  LoseAllBut({a_, c});
  ASSERT_EQ(NodeInfo("node-b").state(), v1::NODE_STATE_LOST);

  const v1::Job job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.generation(), 0);
  EXPECT_EQ(job.restarts(), 1);
  EXPECT_THAT(job.nodes(), ElementsAre("node-a", "node-c"));
  ASSERT_EQ(job.events_size(), events_before + 1);
  EXPECT_THAT(job.events(job.events_size() - 1).reason(),
              AllOf(HasSubstr("node node-b lost"), HasSubstr("its 2 ranks move to node node-c"),
                    HasSubstr("relaunched in place, restart 1 of 2")));
  EXPECT_EQ(job.root_cause().node(), "node-b");
  EXPECT_EQ(Count(kInPlaceRecoveries), 1);
  EXPECT_EQ(Count(kJobRestarts), 1);

  // node-c starts generation 0 for ranks 2 and 3 (local ranks 0 and 1 of
  // node rank 1): a plain LAUNCH, since the generation never ran there.
  ASSERT_THAT(ActionsOf(c->orders->messages()), ElementsAre(Pair(kLaunch, 0)));
  const v1::Assignment& launch = c->orders->messages()[0];
  EXPECT_FALSE(launch.replace());
  EXPECT_THAT(RanksOf(launch), ElementsAre(Pair(2, 0), Pair(3, 1)));
  EXPECT_EQ(launch.node_rank(), 1);
  EXPECT_EQ(launch.world_size(), 4);
  EXPECT_EQ(launch.num_nodes(), 2);
  EXPECT_EQ(launch.restart_count(), 1);
  // node-a hears nothing new, and nothing is killed.
  EXPECT_THAT(ActionsOf(a_->orders->messages()), ElementsAre(Pair(kLaunch, 0)));

  // Coordination lost both ranks; rank 0 is still a member.
  absl::StatusOr<JobInfo> info = coordination_->GetJob(id);
  ASSERT_THAT(info, IsOk());
  EXPECT_FALSE(info->failed);
  EXPECT_EQ(info->membership_epoch, 2);
  EXPECT_THAT(ChangesOf(job), ElementsAre(Change{2, v1::MembershipChange::KIND_LOST, 1, 0},
                                          Change{3, v1::MembershipChange::KIND_LOST, 2, 0}));
  EXPECT_THAT(coordination_->Heartbeat(Caller{id, 0, 0, FirstIncarnation(0)}), IsOk());

  // node-c reports them started, and they join from node-c as new processes.
  ASSERT_THAT(Started(*c, id, 0, {2, 3}), IsOk());
  for (int rank : {2, 3}) {
    JoinReply reply;
    JoinArgs args;
    args.caller = Caller{id, 0, rank, 300u + static_cast<uint64_t>(rank)};
    args.host = "node-c";
    coordination_->Join(std::move(args), reply.Done());
    ASSERT_TRUE(reply.fired()) << rank;
    ASSERT_THAT(reply.get(), IsOk()) << rank;
    EXPECT_EQ(reply.get()->generation, 0);
  }
  EXPECT_EQ(EpochOf(id), 4);
  AdvanceWithHeartbeats(kKillGrace + kHeartbeatTimeout + absl::Seconds(5), {a_, c});
  EXPECT_EQ(StateOf(id), v1::JOB_STATE_RUNNING);

  // The generation runs on node-c now: a later failure there is replaced in
  // place by node-c, like any other.
  ASSERT_THAT(Exited(*c, id, 0, 3, 1), IsOk());
  ASSERT_THAT(ActionsOf(c->orders->messages()), ElementsAre(Pair(kLaunch, 0), Pair(kLaunch, 0)));
  EXPECT_TRUE(c->orders->messages()[1].replace());
  EXPECT_THAT(RanksOf(c->orders->messages()[1]), ElementsAre(Pair(3, 1)));
  EXPECT_EQ(Job(id).restarts(), 2);
}

TEST_F(JobManagerInPlaceTest, ALostNodeWithNoFreeNodeRestartsTheWholeJob) {
  const std::string id = RunAndFormWorld(InPlaceSpec(2));
  LoseAllBut({a_});
  ExpectWholeRestart(id, 1, 0);
  EXPECT_THAT(OrdersWith(a_->orders->messages(), kKill), SizeIs(1));
}

TEST_F(JobManagerInPlaceTest, ALostNodeBeforeTheWorldFormedRestartsTheWholeJob) {
  AddTwoNodes();
  const std::string id = RunJob(InPlaceSpec(2));
  Agent* c = LoseNodeBWithNodeCFree();
  const v1::Job job = Job(id);
  EXPECT_EQ(job.generation(), 1);
  EXPECT_EQ(Count(kInPlaceRecoveries), 0);
  // node-c takes node-b's place in generation 1, as a restart places it.
  ASSERT_THAT(c->orders->messages(), Not(IsEmpty()));
  for (const v1::Assignment& order : c->orders->messages()) EXPECT_EQ(order.generation(), 1);
}

// A GPU job's ranks move only to a node with their GPUs free (node-c has one
// GPU for two ranks of one GPU each; node-d has four), and take that node's.
TEST_F(JobManagerInPlaceTest, AGpuJobsRanksMoveToANodeWithTheirGpusFree) {
  a_ = &AddAgent("node-a", /*slots=*/2, /*gpus=*/2);
  b_ = &AddAgent("node-b", /*slots=*/2, /*gpus=*/2);
  v1::JobSpec spec = InPlaceSpec(2);
  spec.set_gpus_per_proc(1);
  const std::string id = RunJob(spec);
  for (JoinReply& reply : JoinRanks(id, {0, 1, 2, 3})) ASSERT_TRUE(reply.fired());
  Agent* c = &AddAgent("node-c", /*slots=*/2, /*gpus=*/1);
  Agent* d = &AddAgent("node-d", /*slots=*/2, /*gpus=*/4);

  LoseAllBut({a_, c, d});
  const v1::Job job = Job(id);
  EXPECT_EQ(job.generation(), 0);
  EXPECT_THAT(job.nodes(), ElementsAre("node-a", "node-d"));
  EXPECT_THAT(c->orders->messages(), IsEmpty());
  ASSERT_THAT(ActionsOf(d->orders->messages()), ElementsAre(Pair(kLaunch, 0)));
  const v1::Assignment& launch = d->orders->messages()[0];
  EXPECT_TRUE(launch.gpu_job());
  ASSERT_EQ(launch.ranks_size(), 2);
  EXPECT_THAT(launch.ranks(0).gpus(), ElementsAre(0));
  EXPECT_THAT(launch.ranks(1).gpus(), ElementsAre(1));
  EXPECT_EQ(NodeInfo("node-d").free_gpus(), 2);
}

// The moved placement is stored: a restarted coordinator finds ranks 2 and
// 3 on node-c, takes node-c's reports for them, and the job finishes.
TEST_F(JobManagerInPlaceTest, AMovedPlacementSurvivesACoordinatorRestart) {
  UseFileStore();
  const std::string id = RunAndFormWorld(InPlaceSpec(2));
  Agent* c = LoseNodeBWithNodeCFree();
  ASSERT_THAT(Started(*c, id, 0, {2, 3}), IsOk());
  ASSERT_THAT(Job(id).nodes(), ElementsAre("node-a", "node-c"));

  RestartCoordinator();
  ASSERT_FALSE(HasFatalFailure());
  const v1::Job after = Job(id);
  EXPECT_EQ(after.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(after.generation(), 0);
  EXPECT_EQ(after.restarts(), 1);
  EXPECT_THAT(after.nodes(), ElementsAre("node-a", "node-c"));

  ASSERT_THAT(Register(*a_, {Worker(id, 0, 0), Worker(id, 0, 1)}), IsOk());
  ASSERT_THAT(Register(*c, {Worker(id, 0, 2), Worker(id, 0, 3)}), IsOk());
  ASSERT_THAT(Watch(*a_), IsOk());
  ASSERT_THAT(Watch(*c), IsOk());
  EXPECT_THAT(OrdersWith(a_->orders->messages(), kKill), IsEmpty());
  EXPECT_THAT(OrdersWith(c->orders->messages(), kKill), IsEmpty());
  for (int rank = 0; rank < 4; ++rank) {
    ASSERT_THAT(Exited(rank < 2 ? *a_ : *c, id, 0, rank, 0), IsOk()) << rank;
  }
  EXPECT_EQ(StateOf(id), v1::JOB_STATE_SUCCEEDED);
}

// With in_place_dim tp, the replicas are ranks {0, 2} and {1, 3}: node-b's
// loss breaks both, so no survivor could hand the moved ranks the state.
TEST_F(JobManagerInPlaceTest, ALostNodeThatBreaksEveryReplicaRestartsTheWholeJob) {
  v1::JobSpec spec = InPlaceSpec(2);
  spec.set_in_place_dim("tp");
  const std::string id = RunAndFormWorld(spec);
  Agent* c = LoseNodeBWithNodeCFree();
  ExpectWholeRestart(id, 1, 0);
  ASSERT_THAT(c->orders->messages(), Not(IsEmpty()));
  for (const v1::Assignment& order : c->orders->messages()) EXPECT_EQ(order.generation(), 1);
}

// Both nodes lost in one pass (node-c free): one whole restart, counted
// once, and nothing moved.
TEST_F(JobManagerInPlaceTest, NodesLostInOnePassRestartTheJobOnce) {
  const std::string id = RunAndFormWorld(InPlaceSpec(2));
  Agent* c = &AddAgent("node-c");
  LoseAllBut({c});
  const v1::Job job = ExpectWholeRestart(id, 1, 0);
}

// node-b's ranks moved to node-c; node-b comes back, then node-c is lost.
// node-b's agent killed generation 0 and would ignore a LAUNCH of it, so it
// is not taken: the job restarts as a whole.
TEST_F(JobManagerInPlaceTest, ANodeThatLeftTheGenerationIsNotTakenAgain) {
  const std::string id = RunAndFormWorld(InPlaceSpec(2));
  Agent* c = LoseNodeBWithNodeCFree();
  ASSERT_THAT(Job(id).nodes(), ElementsAre("node-a", "node-c"));
  ASSERT_THAT(Started(*c, id, 0, {2, 3}), IsOk());
  ASSERT_THAT(Register(*b_), IsOk());
  ASSERT_THAT(Watch(*b_), IsOk());
  ASSERT_EQ(NodeInfo("node-b").state(), v1::NODE_STATE_READY);

  LoseAllBut({a_, b_});
  ExpectWholeRestart(id, 2, 1);
  ASSERT_THAT(OrdersWith(b_->orders->messages(), kLaunch), Not(IsEmpty()));
  for (const v1::Assignment& order : OrdersWith(b_->orders->messages(), kLaunch)) {
    EXPECT_NE(order.generation(), 0) << order.DebugString();
  }
}

// The new node cannot start the moved ranks and says so for each: the job
// restarts as a whole once, not once per rank.
TEST_F(JobManagerInPlaceTest, ALaunchErrorOnTheNewNodeRestartsTheWholeJobOnce) {
  const std::string id = RunAndFormWorld(InPlaceSpec(3));
  Agent* c = LoseNodeBWithNodeCFree();
  ASSERT_EQ(Job(id).restarts(), 1);
  ASSERT_THAT(LaunchFailed(*c, id, 0, 2, "no memory cgroup"), IsOk());
  ASSERT_THAT(LaunchFailed(*c, id, 0, 3, "no memory cgroup"), IsOk());
  const v1::Job job = ExpectWholeRestart(id, 2, 1);
}

TEST_F(JobManagerInPlaceTest, AMovedRankNeverReportedStartedRestartsTheWholeJob) {
  const std::string id = RunAndFormWorld(InPlaceSpec(2));
  Agent* c = LoseNodeBWithNodeCFree();
  ASSERT_EQ(Job(id).generation(), 0);
  AdvanceWithHeartbeats(kKillGrace + kHeartbeatTimeout + absl::Seconds(5), {a_, c});
  const v1::Job job = Job(id);
  EXPECT_EQ(job.generation(), 1);
  EXPECT_EQ(job.restarts(), 2);
  EXPECT_THAT(job.root_cause().message(), HasSubstr("did not report it started within"));
}

TEST_F(JobManagerInPlaceTest, AGroupJobsLostNodeIsNotMovedInPlace) {
  const std::string id = RunAndFormWorld(SpecWithRestarts(2));
  Agent* c = LoseNodeBWithNodeCFree();
  EXPECT_EQ(Job(id).generation(), 1);
  EXPECT_EQ(Count(kInPlaceRecoveries), 0);
  ASSERT_THAT(c->orders->messages(), Not(IsEmpty()));
  for (const v1::Assignment& order : c->orders->messages()) EXPECT_EQ(order.generation(), 1);
}

TEST_F(JobManagerInPlaceTest, AFailureAfterAnotherRankFinishedRestartsTheWholeJob) {
  const std::string id = RunAndFormWorld(InPlaceSpec(2));
  // Rank 0 is done; rank 1 fails: a new rank 1 could not rebuild a mesh
  // with a rank that has exited, so the job restarts as a whole.
  ASSERT_THAT(Exited(*a_, id, 0, 0, 0), IsOk());
  ASSERT_THAT(Exited(*a_, id, 0, 1, 1), IsOk());
  const v1::Job job = ExpectWholeRestart(id, 1, 0);
}

TEST_F(JobManagerInPlaceTest, ARepeatedExitReportOfTheReplacedProcessCountsOnce) {
  const std::string id = RunAndFormWorld(InPlaceSpec(2));
  ASSERT_THAT(Exited(*a_, id, 0, 1, 1), IsOk());
  EXPECT_EQ(Job(id).restarts(), 1);
  // The agent sends the same exit again (it re-sends its exits after a
  // reconnect) before the replacement has started: nothing changes.
  ASSERT_THAT(Exited(*a_, id, 0, 1, 1), IsOk());
  ASSERT_THAT(Signaled(*a_, id, 0, 1, SIGKILL), IsOk());
  const v1::Job job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.restarts(), 1);
  EXPECT_EQ(OrdersWith(a_->orders->messages(), kLaunch).size(), 2u) << "the first and one replace";
  EXPECT_EQ(Count(kInPlaceRecoveries), 1);
  EXPECT_EQ(manager().stats().restarts, 1);
  // The replacement failing to start is a new failure: it counts.
  ASSERT_THAT(LaunchFailed(*a_, id, 0, 1, "exec: no such file"), IsOk());
  EXPECT_EQ(Job(id).restarts(), 2);
  EXPECT_EQ(Count(kInPlaceRecoveries), 2);
  EXPECT_EQ(OrdersWith(a_->orders->messages(), kLaunch).size(), 3u);
}

TEST_F(JobManagerInPlaceTest, EachRelaunchCountsAndExhaustedRestartsFailTheJob) {
  const std::string id = RunAndFormWorld(InPlaceSpec(/*max_restarts=*/2));

  ASSERT_THAT(Exited(*a_, id, 0, 1, 1), IsOk());
  ASSERT_EQ(Job(id).restarts(), 1);

  // Second failure, on the other node: the second and last restart.
  ASSERT_THAT(Signaled(*b_, id, 0, 2, SIGKILL), IsOk());
  v1::Job job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.generation(), 0);
  EXPECT_EQ(job.restarts(), 2);
  EXPECT_THAT(job.events(job.events_size() - 1).reason(),
              AllOf(HasSubstr("rank 2 (node node-b) was killed by signal 9 (SIGKILL)"),
                    HasSubstr("relaunched in place, restart 2 of 2")));
  EXPECT_EQ(job.root_cause().rank(), 2);
  EXPECT_EQ(job.root_cause().signal(), SIGKILL);
  ASSERT_THAT(ActionsOf(b_->orders->messages()), ElementsAre(Pair(kLaunch, 0), Pair(kLaunch, 0)));
  EXPECT_TRUE(b_->orders->messages()[1].replace());
  EXPECT_THAT(RanksOf(b_->orders->messages()[1]), ElementsAre(Pair(2, 0)));
  EXPECT_EQ(b_->orders->messages()[1].restart_count(), 2);
  EXPECT_THAT(ActionsOf(a_->orders->messages()), ElementsAre(Pair(kLaunch, 0), Pair(kLaunch, 0)));
  EXPECT_THAT(ChangesOf(job), ElementsAre(Change{1, v1::MembershipChange::KIND_LOST, 1, 0},
                                          Change{2, v1::MembershipChange::KIND_LOST, 2, 0}));
  EXPECT_EQ(Count(kInPlaceRecoveries), 2);

  // Third failure: no restarts left, so the job fails as it would under
  // GROUP, naming the rank, and every node is told to kill generation 0.
  ASSERT_THAT(Exited(*a_, id, 0, 0, 3), IsOk());
  job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(job.generation(), 0);
  EXPECT_EQ(job.restarts(), 2);
  const v1::JobStateEvent& last = job.events(job.events_size() - 1);
  EXPECT_EQ(last.from(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(last.to(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(last.reason(), AllOf(HasSubstr("rank 0 (node node-a) exited with code 3"),
                                   HasSubstr("no restarts left (max_restarts 2)")));
  ASSERT_TRUE(job.has_root_cause());
  EXPECT_EQ(job.root_cause().rank(), 0);
  EXPECT_EQ(job.root_cause().exit_code(), 3);
  EXPECT_THAT(ActionsOf(a_->orders->messages()),
              ElementsAre(Pair(kLaunch, 0), Pair(kLaunch, 0), Pair(kKill, 0)));
  EXPECT_THAT(ActionsOf(b_->orders->messages()),
              ElementsAre(Pair(kLaunch, 0), Pair(kLaunch, 0), Pair(kKill, 0)));
  EXPECT_THAT(coordination_->GetJob(id), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(Count(kInPlaceRecoveries), 2);
  EXPECT_EQ(Count(kJobRestarts), 2);
}

TEST_F(JobManagerInPlaceTest, ReplacementThatFailsBeforeRejoiningIsRelaunchedAgain) {
  const std::string id = RunAndFormWorld(InPlaceSpec(/*max_restarts=*/2));
  ASSERT_THAT(Exited(*a_, id, 0, 1, 1), IsOk());
  // The new process could not be started: the rank is still lost, and is
  // replaced again with the next restart; the membership does not move.
  ASSERT_THAT(LaunchFailed(*a_, id, 0, 1, "exec: No such file or directory"), IsOk());

  const v1::Job job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.generation(), 0);
  EXPECT_EQ(job.restarts(), 2);
  EXPECT_THAT(job.events(job.events_size() - 1).reason(),
              AllOf(HasSubstr("could not be started"), HasSubstr("restart 2 of 2")));
  const std::vector<v1::Assignment> launches = OrdersWith(a_->orders->messages(), kLaunch);
  ASSERT_THAT(launches, SizeIs(3));
  EXPECT_TRUE(launches[2].replace());
  EXPECT_THAT(RanksOf(launches[2]), ElementsAre(Pair(1, 1)));
  EXPECT_THAT(ChangesOf(job), ElementsAre(Change{1, v1::MembershipChange::KIND_LOST, 1, 0}));
  EXPECT_EQ(EpochOf(id), 1);
  EXPECT_EQ(Count(kInPlaceRecoveries), 2);
}

TEST_F(JobManagerInPlaceTest, ExitOfARankCoordinationHadAlreadyLostRelaunchesIt) {
  const std::string id = RunAndFormWorld(InPlaceSpec());
  // The process reports its own error first: Coordination loses it (the
  // others carry on), and the job does not change.
  ASSERT_THAT(coordination_->ReportError(Caller{id, 0, 3, FirstIncarnation(3)},
                                         "CUDA error: an illegal memory access"),
              IsOk());
  ASSERT_EQ(EpochOf(id), 1);
  EXPECT_EQ(Job(id).restarts(), 0);
  EXPECT_THAT(ActionsOf(b_->orders->messages()), ElementsAre(Pair(kLaunch, 0)));

  // Then it exits: relaunched in place, with no second loss.
  ASSERT_THAT(Exited(*b_, id, 0, 3, 1), IsOk());
  const v1::Job job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.generation(), 0);
  EXPECT_EQ(job.restarts(), 1);
  ASSERT_THAT(ActionsOf(b_->orders->messages()), ElementsAre(Pair(kLaunch, 0), Pair(kLaunch, 0)));
  EXPECT_TRUE(b_->orders->messages()[1].replace());
  EXPECT_THAT(RanksOf(b_->orders->messages()[1]), ElementsAre(Pair(3, 1)));
  EXPECT_THAT(ChangesOf(job), ElementsAre(Change{3, v1::MembershipChange::KIND_LOST, 1, 0}));
  EXPECT_THAT(job.membership(0).reason(), HasSubstr("illegal memory access"));
  EXPECT_EQ(Count(kInPlaceRecoveries), 1);
}

TEST_F(JobManagerInPlaceTest, FailureBeforeTheWorldFormedRestartsTheWholeJob) {
  AddTwoNodes();
  const std::string id = RunJob(InPlaceSpec());
  // Rank 3 has not joined yet: the others wait for it.
  const std::vector<JoinReply> replies = JoinRanks(id, {0, 1, 2});
  for (const JoinReply& reply : replies) ASSERT_FALSE(reply.fired());

  ASSERT_THAT(Exited(*a_, id, 0, 1, 1), IsOk());

  const v1::Job job = Job(id);
  ExpectRestartedAsAWhole(job);
  EXPECT_THAT(job.events(3).reason(), Not(HasSubstr("relaunched in place")));
  EXPECT_THAT(RanksOf(a_->orders->messages().back()), ElementsAre(Pair(0, 0), Pair(1, 1)));
  // The waits of the old generation end.
  for (const JoinReply& reply : replies) {
    ASSERT_TRUE(reply.fired());
    EXPECT_THAT(reply.get(), Not(IsOk()));
  }
  absl::StatusOr<JobInfo> info = coordination_->GetJob(id);
  ASSERT_THAT(info, IsOk());
  EXPECT_EQ(info->generation, 1);
  EXPECT_EQ(info->membership_epoch, 0);
  EXPECT_THAT(info->membership, IsEmpty());
  EXPECT_THAT(job.membership(), IsEmpty());
  EXPECT_EQ(Count(kInPlaceRecoveries), 0);
  EXPECT_EQ(Count(kJobRestarts), 1);
}

// Coordination would let the others carry on (every rank joined), but the
// job is not RUNNING yet: not every agent reported its ranks started.
TEST_F(JobManagerInPlaceTest, FailureWhileScheduledRestartsTheWholeJob) {
  AddTwoNodes();
  const std::string id = Submit(InPlaceSpec());
  ASSERT_THAT(Started(*a_, id, 0, {0, 1}), IsOk());
  const std::vector<JoinReply> replies = JoinRanks(id, {0, 1, 2, 3});
  for (const JoinReply& reply : replies) ASSERT_TRUE(reply.fired());
  ASSERT_EQ(StateOf(id), v1::JOB_STATE_SCHEDULED);

  ASSERT_THAT(Exited(*a_, id, 0, 1, 1), IsOk());

  const v1::Job job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(job.generation(), 1);
  EXPECT_EQ(job.restarts(), 1);
  EXPECT_THAT(ActionsOf(a_->orders->messages()),
              ElementsAre(Pair(kLaunch, 0), Pair(kKill, 0), Pair(kLaunch, 1)));
  absl::StatusOr<JobInfo> info = coordination_->GetJob(id);
  ASSERT_THAT(info, IsOk());
  EXPECT_EQ(info->generation, 1);
  EXPECT_EQ(Count(kInPlaceRecoveries), 0);
}

TEST_F(JobManagerInPlaceTest, GroupJobWithItsWorldFormedStillRestartsTheWholeJob) {
  const std::string id = RunAndFormWorld(SpecWithRestarts(2));
  // The default policy, normalized; Coordination's layout is not in place.
  EXPECT_EQ(Job(id).spec().restart_policy(), v1::RESTART_POLICY_GROUP);
  EXPECT_EQ(Job(id).spec().in_place_dim(), "");
  absl::StatusOr<JobInfo> before = coordination_->GetJob(id);
  ASSERT_THAT(before, IsOk());
  EXPECT_FALSE(before->layout.in_place);

  ASSERT_THAT(Exited(*a_, id, 0, 1, 1), IsOk());

  const v1::Job job = Job(id);
  ExpectRestartedAsAWhole(job);
  EXPECT_THAT(job.membership(), IsEmpty());
  EXPECT_EQ(Count(kInPlaceRecoveries), 0);
  EXPECT_EQ(Count(kJobRestarts), 1);
}

TEST_F(JobManagerInPlaceTest, JoinRepliesOfAGroupJobAreNotInPlace) {
  AddTwoNodes();
  const std::string id = RunJob(SpecWithRestarts(2));
  const std::vector<JoinReply> replies = JoinRanks(id, {0, 1, 2, 3});
  for (int rank = 0; rank < 4; ++rank) {
    ASSERT_TRUE(replies[rank].fired()) << rank;
    ASSERT_THAT(replies[rank].get(), IsOk()) << rank;
    EXPECT_FALSE(replies[rank].get()->in_place) << rank;
    EXPECT_EQ(replies[rank].get()->in_place_dim, "") << rank;
  }
}

TEST_F(JobManagerInPlaceTest, ExitZeroOfOneRankIsNotARecovery) {
  const std::string id = RunAndFormWorld(InPlaceSpec());

  ASSERT_THAT(Exited(*a_, id, 0, 1, 0), IsOk());

  const v1::Job job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.generation(), 0);
  EXPECT_EQ(job.restarts(), 0);
  EXPECT_THAT(EventStates(job),
              ElementsAre(v1::JOB_STATE_PENDING, v1::JOB_STATE_SCHEDULED, v1::JOB_STATE_RUNNING));
  EXPECT_FALSE(job.has_root_cause());
  // Nothing is relaunched or killed.
  EXPECT_THAT(ActionsOf(a_->orders->messages()), ElementsAre(Pair(kLaunch, 0)));
  EXPECT_THAT(ActionsOf(b_->orders->messages()), ElementsAre(Pair(kLaunch, 0)));
  EXPECT_EQ(Count(kInPlaceRecoveries), 0);
  EXPECT_EQ(Count(kJobRestarts), 0);
  // It did not Leave, so its peers no longer count on it (Coordination
  // loses it), but no new process replaces it.
  EXPECT_THAT(ChangesOf(job), ElementsAre(Change{1, v1::MembershipChange::KIND_LOST, 1, 0}));
  EXPECT_THAT(job.membership(0).reason(), HasSubstr("exited with code 0"));

  for (int rank : {0, 2, 3}) {
    ASSERT_THAT(Exited(rank < 2 ? *a_ : *b_, id, 0, rank, 0), IsOk());
  }
  EXPECT_EQ(StateOf(id), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(Job(id).restarts(), 0);
}

// An in-place recovery counts a restart without a new generation: the
// stored job (restarts 1 at generation 0) must load again.
TEST_F(JobManagerInPlaceTest, CoordinatorRestartRestoresRestartsBeyondTheGeneration) {
  UseFileStore();
  const std::string id = RunAndFormWorld(InPlaceSpec());
  ASSERT_THAT(Exited(*a_, id, 0, 1, 1), IsOk());
  ASSERT_THAT(Started(*a_, id, 0, {1}), IsOk());
  const v1::Job before = Job(id);
  ASSERT_EQ(before.state(), v1::JOB_STATE_RUNNING);
  ASSERT_EQ(before.restarts(), 1);
  ASSERT_EQ(before.generation(), 0);

  RestartCoordinator();
  ASSERT_FALSE(HasFatalFailure());

  const v1::Job after = Job(id);
  EXPECT_EQ(after.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(after.generation(), 0);
  EXPECT_EQ(after.restarts(), 1);
  EXPECT_EQ(after.spec().restart_policy(), v1::RESTART_POLICY_IN_PLACE);
  ASSERT_EQ(after.events_size(), before.events_size());
  const v1::JobStateEvent& event = after.events(after.events_size() - 1);
  EXPECT_EQ(event.from(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(event.to(), v1::JOB_STATE_RUNNING);
  EXPECT_THAT(event.reason(), HasSubstr("relaunched in place"));
  EXPECT_EQ(after.root_cause().rank(), 1);
  // The membership lived in the old coordinator's memory.
  EXPECT_THAT(after.membership(), IsEmpty());
  absl::StatusOr<JobInfo> info = coordination_->GetJob(id);
  ASSERT_THAT(info, IsOk());
  EXPECT_EQ(info->generation, 0);
  EXPECT_TRUE(info->layout.in_place);
  EXPECT_EQ(info->layout.in_place_dim, "dp");

  // The agents come back with every rank running, and the job finishes.
  ASSERT_THAT(Register(*a_, {Worker(id, 0, 0), Worker(id, 0, 1)}), IsOk());
  ASSERT_THAT(Register(*b_, {Worker(id, 0, 2), Worker(id, 0, 3)}), IsOk());
  ASSERT_THAT(Watch(*a_), IsOk());
  ASSERT_THAT(Watch(*b_), IsOk());
  EXPECT_THAT(a_->orders->messages(), IsEmpty());
  EXPECT_THAT(b_->orders->messages(), IsEmpty());
  for (int rank = 0; rank < 4; ++rank) {
    ASSERT_THAT(Exited(rank < 2 ? *a_ : *b_, id, 0, rank, 0), IsOk());
  }
  EXPECT_EQ(StateOf(id), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(Job(id).restarts(), 1);
}

}  // namespace
}  // namespace job_manager_test
}  // namespace mesh::coordinator
