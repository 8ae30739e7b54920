// Over 800 lines on purpose: JobManager's behaviour, one section per
// concern (options, submit, scheduling and launch, failures and restarts,
// cancel, WaitJob, WatchJobState, node loss, nodes and sessions, recovery),
// all on the fixture of job_manager_fixture.h. Elastic membership is in
// job_manager_elastic_test.cc.

// Unit tests for JobManager (coordinator/job_manager.h), written against its
// header contract. Everything runs on one thread with a FakeClock: time moves
// only through clock_.Advance() followed by Tick(), agents are played by the
// test (RegisterNode, a recording WatchAssignments sink, reports), and no
// process is ever started.
#include <limits>

#include "tests/coordinator/job_manager_fixture.h"

namespace mesh::coordinator {
namespace job_manager_test {

// ---- Options --------------------------------------------------------------------

TEST(JobManagerOptionsTest, DefaultsAreValid) {
  EXPECT_THAT(ValidateJobManagerOptions(JobManagerOptions{}), IsOk());
}

TEST(JobManagerOptionsTest, ZeroHeartbeatTimeoutIsInvalid) {
  JobManagerOptions options;
  options.node_heartbeat_timeout = absl::ZeroDuration();
  EXPECT_THAT(ValidateJobManagerOptions(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("node_heartbeat_timeout")));
}

TEST(JobManagerOptionsTest, NegativeRecoveryGraceIsInvalid) {
  JobManagerOptions options;
  options.node_recovery_grace = absl::Seconds(-1);
  EXPECT_THAT(ValidateJobManagerOptions(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("node_recovery_grace")));
  options.node_recovery_grace = absl::ZeroDuration();
  EXPECT_THAT(ValidateJobManagerOptions(options), IsOk());
}

TEST(JobManagerOptionsTest, BadSpecLimitsAreInvalid) {
  JobManagerOptions options;
  options.spec_limits.working_dir_root = "relative";
  EXPECT_THAT(ValidateJobManagerOptions(options), StatusIs(absl::StatusCode::kInvalidArgument));
}

// ---- Submit -----------------------------------------------------------------------

struct InvalidSpecCase {
  const char* name;
  void (*mutate)(v1::JobSpec&);
  const char* field;  // The path the error must start with.
};

class SubmitInvalidSpecTest : public JobManagerTest,
                              public ::testing::WithParamInterface<InvalidSpecCase> {};

TEST_P(SubmitInvalidSpecTest, IsInvalidArgumentNamingTheFieldAndStoresNothing) {
  AddTwoNodes();
  v1::JobSpec spec = Spec();
  GetParam().mutate(spec);

  EXPECT_THAT(manager().Submit(spec), StatusIs(absl::StatusCode::kInvalidArgument,
                                               ::testing::StartsWith(GetParam().field)));

  absl::StatusOr<v1::ListJobsResponse> listed = manager().ListJobs({});
  ASSERT_THAT(listed, IsOk());
  EXPECT_THAT(listed->jobs(), IsEmpty());
  absl::StatusOr<JobPage> stored = store_->ListJobs({});
  ASSERT_THAT(stored, IsOk());
  EXPECT_THAT(stored->jobs, IsEmpty());
  EXPECT_THAT(a_->orders->messages(), IsEmpty());
  EXPECT_EQ(manager().stats().jobs_submitted, 0);
}

INSTANTIATE_TEST_SUITE_P(
    EachClass, SubmitInvalidSpecTest,
    ::testing::Values(
        InvalidSpecCase{"BadName", [](v1::JobSpec& s) { s.set_name("no spaces"); }, "spec.name"},
        InvalidSpecCase{"BadLabelKey", [](v1::JobSpec& s) { (*s.mutable_labels())[""] = "x"; },
                        "spec.labels"},
        InvalidSpecCase{"NoCommand", [](v1::JobSpec& s) { s.clear_command(); }, "spec.command"},
        InvalidSpecCase{"NulInCommand",
                        [](v1::JobSpec& s) { s.set_command(1, std::string("a\0b", 3)); },
                        "spec.command[1]"},
        InvalidSpecCase{"DeniedEnv",
                        [](v1::JobSpec& s) { (*s.mutable_env())["LD_PRELOAD"] = "/x.so"; },
                        "spec.env[\"LD_PRELOAD\"]"},
        InvalidSpecCase{"ReservedEnv", [](v1::JobSpec& s) { (*s.mutable_env())["RANK"] = "0"; },
                        "spec.env[\"RANK\"]"},
        InvalidSpecCase{"RelativeWorkingDir", [](v1::JobSpec& s) { s.set_working_dir("data/x"); },
                        "spec.working_dir"},
        // The fixture's root is /data: the options' limits apply.
        InvalidSpecCase{"WorkingDirOutsideRoot",
                        [](v1::JobSpec& s) { s.set_working_dir("/data/../etc"); },
                        "spec.working_dir"},
        InvalidSpecCase{"ZeroNodes", [](v1::JobSpec& s) { s.mutable_nodes()->set_min(0); },
                        "spec.nodes"},
        InvalidSpecCase{"ZeroProcs", [](v1::JobSpec& s) { s.set_nproc_per_node(0); },
                        "spec.nproc_per_node"},
        InvalidSpecCase{"NegativeGpus", [](v1::JobSpec& s) { s.set_gpus_per_proc(-1); },
                        "spec.gpus_per_proc"},
        InvalidSpecCase{"MeshDoesNotMatchWorld", [](v1::JobSpec& s) { s.set_mesh_shape(0, 3); },
                        "spec.mesh_shape"},
        InvalidSpecCase{"DimNamesDoNotMatch",
                        [](v1::JobSpec& s) { s.mutable_mesh_dim_names()->RemoveLast(); },
                        "spec.mesh_dim_names"},
        InvalidSpecCase{"NegativeRestarts", [](v1::JobSpec& s) { s.set_max_restarts(-1); },
                        "spec.max_restarts"},
        InvalidSpecCase{"NegativeDeadline", [](v1::JobSpec& s) { s.set_deadline_seconds(-1); },
                        "spec.deadline_seconds"},
        InvalidSpecCase{"UnprintableKey", [](v1::JobSpec& s) { s.set_idempotency_key("k\x01"); },
                        "spec.idempotency_key"}),
    [](const ::testing::TestParamInfo<InvalidSpecCase>& info) { return info.param.name; });

TEST_F(JobManagerTest, SubmitWithoutNodesIsPendingNamingTheMissingCapacity) {
  absl::StatusOr<v1::SubmitJobResponse> response = manager().Submit(Spec());
  ASSERT_THAT(response, IsOk());
  EXPECT_FALSE(response->deduplicated());
  const v1::Job& job = response->job();
  EXPECT_FALSE(job.id().empty());
  EXPECT_EQ(job.state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(job.pending_reason(), HasSubstr("waiting for 2 nodes"));
  EXPECT_EQ(job.generation(), 0);
  EXPECT_THAT(job.nodes(), IsEmpty());
  // The stored spec is the normalized one.
  EXPECT_EQ(job.spec().working_dir(), "/data/jobs/gpt");
  EXPECT_EQ(job.spec().nodes().max(), 2);

  // Durable before acknowledged: the store has it.
  absl::StatusOr<JobRecord> stored = store_->GetJob(job.id());
  ASSERT_THAT(stored, IsOk());
  EXPECT_EQ(stored->state, "PENDING");

  const v1::Job got = Job(job.id());
  EXPECT_THAT(EventStates(got), ElementsAre(v1::JOB_STATE_PENDING));
  EXPECT_EQ(got.events(0).from(), v1::JOB_STATE_UNSPECIFIED);
  EXPECT_EQ(manager().stats().jobs_submitted, 1);
}

TEST_F(JobManagerTest, SubmitWithTheSameIdempotencyKeyReturnsTheSameJob) {
  v1::JobSpec spec = Spec();
  spec.set_idempotency_key("lr-sweep-3");
  absl::StatusOr<v1::SubmitJobResponse> first = manager().Submit(spec);
  ASSERT_THAT(first, IsOk());
  EXPECT_FALSE(first->deduplicated());

  absl::StatusOr<v1::SubmitJobResponse> second = manager().Submit(spec);
  ASSERT_THAT(second, IsOk());
  EXPECT_TRUE(second->deduplicated());
  EXPECT_EQ(second->job().id(), first->job().id());

  absl::StatusOr<v1::ListJobsResponse> listed = manager().ListJobs({});
  ASSERT_THAT(listed, IsOk());
  EXPECT_THAT(listed->jobs(), SizeIs(1));
}

TEST_F(JobManagerTest, SubmitWithTheSameKeyAndAnotherSpecIsAlreadyExists) {
  v1::JobSpec spec = Spec();
  spec.set_idempotency_key("lr-sweep-3");
  ASSERT_THAT(manager().Submit(spec), IsOk());

  spec.add_command("--epochs=2");
  EXPECT_THAT(manager().Submit(spec), StatusIs(absl::StatusCode::kAlreadyExists));
  absl::StatusOr<v1::ListJobsResponse> listed = manager().ListJobs({});
  ASSERT_THAT(listed, IsOk());
  EXPECT_THAT(listed->jobs(), SizeIs(1));
}

TEST_F(JobManagerTest, GetJobOfAnUnknownJobIsNotFound) {
  EXPECT_THAT(manager().GetJob("job-404"), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(JobManagerTest, ListJobsIsNewestFirstWithoutEventsAndFiltersByState) {
  AddTwoNodes();
  const std::string first = Submit(Spec());  // Takes both nodes.
  const std::string second = Submit(Spec());
  const std::string third = Submit(Spec());

  absl::StatusOr<v1::ListJobsResponse> all = manager().ListJobs({});
  ASSERT_THAT(all, IsOk());
  std::vector<std::string> ids;
  for (const v1::Job& job : all->jobs()) {
    ids.push_back(job.id());
    EXPECT_THAT(job.events(), IsEmpty());
  }
  EXPECT_THAT(ids, ElementsAre(third, second, first));

  v1::ListJobsRequest pending;
  pending.add_states(v1::JOB_STATE_PENDING);
  absl::StatusOr<v1::ListJobsResponse> filtered = manager().ListJobs(pending);
  ASSERT_THAT(filtered, IsOk());
  ASSERT_THAT(filtered->jobs(), SizeIs(2));
  EXPECT_EQ(filtered->jobs(0).id(), third);
  EXPECT_EQ(filtered->jobs(1).id(), second);
}

TEST_F(JobManagerTest, ListJobsPagesAndFiltersByLabel) {
  v1::JobSpec labelled = Spec();
  (*labelled.mutable_labels())["team"] = "ml";
  const std::string first = Submit(labelled);
  const std::string second = Submit(Spec());
  const std::string third = Submit(labelled);

  v1::ListJobsRequest request;
  request.set_page_size(2);
  absl::StatusOr<v1::ListJobsResponse> page = manager().ListJobs(request);
  ASSERT_THAT(page, IsOk());
  ASSERT_THAT(page->jobs(), SizeIs(2));
  EXPECT_EQ(page->jobs(0).id(), third);
  EXPECT_EQ(page->jobs(1).id(), second);
  ASSERT_FALSE(page->next_page_token().empty());
  request.set_page_token(page->next_page_token());
  page = manager().ListJobs(request);
  ASSERT_THAT(page, IsOk());
  ASSERT_THAT(page->jobs(), SizeIs(1));
  EXPECT_EQ(page->jobs(0).id(), first);
  EXPECT_TRUE(page->next_page_token().empty());

  v1::ListJobsRequest by_label;
  (*by_label.mutable_labels())["team"] = "ml";
  absl::StatusOr<v1::ListJobsResponse> ml = manager().ListJobs(by_label);
  ASSERT_THAT(ml, IsOk());
  ASSERT_THAT(ml->jobs(), SizeIs(2));
  EXPECT_EQ(ml->jobs(0).id(), third);
  EXPECT_EQ(ml->jobs(1).id(), first);
}

TEST_F(JobManagerTest, ListJobsRejectsABadPageSizeOrToken) {
  v1::ListJobsRequest request;
  request.set_page_size(-1);
  EXPECT_THAT(manager().ListJobs(request), StatusIs(absl::StatusCode::kInvalidArgument));
  request.set_page_size(0);
  request.set_page_token("not a token");
  EXPECT_THAT(manager().ListJobs(request), StatusIs(absl::StatusCode::kInvalidArgument));
}

// ---- Scheduling and launch ---------------------------------------------------------

TEST_F(JobManagerTest, PlacedJobIsScheduledAndEachNodeGetsItsRanks) {
  AddTwoNodes();
  const std::string id = Submit(Spec());

  const v1::Job job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_THAT(job.nodes(), ElementsAre("node-a", "node-b"));
  EXPECT_THAT(job.pending_reason(), IsEmpty());
  EXPECT_THAT(EventStates(job), ElementsAre(v1::JOB_STATE_PENDING, v1::JOB_STATE_SCHEDULED));

  for (int node_rank = 0; node_rank < 2; ++node_rank) {
    const Agent& agent = node_rank == 0 ? *a_ : *b_;
    SCOPED_TRACE(agent.name);
    ASSERT_THAT(agent.orders->messages(), SizeIs(1));
    const v1::Assignment& launch = agent.orders->messages()[0];
    EXPECT_EQ(launch.action(), kLaunch);
    EXPECT_EQ(launch.job_id(), id);
    EXPECT_EQ(launch.generation(), 0);
    const int base = 2 * node_rank;
    EXPECT_THAT(RanksOf(launch), ElementsAre(Pair(base, 0), Pair(base + 1, 1)));
    for (const v1::RankLaunch& rank : launch.ranks()) EXPECT_THAT(rank.gpus(), IsEmpty());
    EXPECT_EQ(launch.world_size(), 4);
    EXPECT_EQ(launch.node_rank(), node_rank);
    EXPECT_EQ(launch.num_nodes(), 2);
    EXPECT_EQ(launch.local_world_size(), 2);
    EXPECT_EQ(launch.master_addr(), a_->address);
    EXPECT_GT(launch.master_port(), 0);
    EXPECT_THAT(launch.command(), ElementsAre("/usr/bin/python3", "train.py", "--lr=3e-4"));
    EXPECT_EQ(launch.working_dir(), "/data/jobs/gpt");
    ASSERT_EQ(launch.env().size(), 1u);
    EXPECT_EQ(launch.env().at("NCCL_DEBUG"), "WARN");
    EXPECT_EQ(launch.restart_count(), 0);
    EXPECT_FALSE(launch.gpu_job());
  }

  absl::StatusOr<JobInfo> info = coordination_->GetJob(id);
  ASSERT_THAT(info, IsOk());
  EXPECT_EQ(info->generation, 0);
  EXPECT_EQ(info->layout.world_size, 4);
  EXPECT_THAT(info->layout.mesh_shape, ElementsAre(2, 2));
  EXPECT_THAT(info->layout.mesh_dim_names, ElementsAre("dp", "tp"));

  const v1::Node a = NodeInfo("node-a");
  EXPECT_EQ(a.free_slots(), 0);
  EXPECT_THAT(a.jobs(), ElementsAre(id));

  absl::StatusOr<JobRecord> stored = store_->GetJob(id);
  ASSERT_THAT(stored, IsOk());
  EXPECT_EQ(stored->state, "SCHEDULED");
}

TEST_F(JobManagerTest, GpuJobGetsItsGpusPerLocalRank) {
  Agent& gpu = AddAgent("node-g", /*slots=*/2, /*gpus=*/4);
  v1::JobSpec spec = Spec(/*nodes=*/1, /*nproc=*/2);
  spec.set_gpus_per_proc(2);
  const std::string id = Submit(spec);
  ASSERT_EQ(StateOf(id), v1::JOB_STATE_SCHEDULED);

  ASSERT_THAT(gpu.orders->messages(), SizeIs(1));
  const v1::Assignment& launch = gpu.orders->messages()[0];
  EXPECT_TRUE(launch.gpu_job());
  ASSERT_EQ(launch.ranks_size(), 2);
  EXPECT_THAT(launch.ranks(0).gpus(), ElementsAre(0, 1));
  EXPECT_THAT(launch.ranks(1).gpus(), ElementsAre(2, 3));
  EXPECT_EQ(NodeInfo("node-g").free_gpus(), 0);
}

TEST_F(JobManagerTest, OrdersNotYetDeliveredComeFirstOnConnect) {
  // node-b registers but opens its order stream only after the job was
  // placed on it.
  a_ = &AddAgent("node-a");
  auto b = std::make_unique<Agent>();
  b->name = "node-b";
  b->address = "10.0.0.2";
  ASSERT_THAT(Register(*b), IsOk());
  b_ = b.get();
  agents_.push_back(std::move(b));

  const std::string id = Submit(Spec());
  ASSERT_EQ(StateOf(id), v1::JOB_STATE_SCHEDULED);
  ASSERT_THAT(Watch(*b_), IsOk());
  ASSERT_THAT(b_->orders->messages(), SizeIs(1));
  EXPECT_EQ(b_->orders->messages()[0].action(), kLaunch);
  EXPECT_THAT(RanksOf(b_->orders->messages()[0]), ElementsAre(Pair(2, 0), Pair(3, 1)));

  // node-a reconnects before reporting its ranks running: LAUNCH again.
  ASSERT_THAT(Watch(*a_), IsOk());
  ASSERT_THAT(a_->orders->messages(), SizeIs(1));
  EXPECT_THAT(RanksOf(a_->orders->messages()[0]), ElementsAre(Pair(0, 0), Pair(1, 1)));
}

TEST_F(JobManagerTest, FifoJobsWaitBehindTheHeadAndStartWhenCapacityFrees) {
  AddTwoNodes();
  const std::string small = Submit(Spec(/*nodes=*/1, /*nproc=*/2));   // Takes node-a.
  const std::string big = Submit(Spec(/*nodes=*/2, /*nproc=*/2));     // Needs both.
  const std::string behind = Submit(Spec(/*nodes=*/1, /*nproc=*/2));  // Would fit node-b.

  EXPECT_EQ(StateOf(small), v1::JOB_STATE_SCHEDULED);
  const v1::Job big_job = Job(big);
  EXPECT_EQ(big_job.state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(big_job.pending_reason(), HasSubstr("waiting for 2 nodes"));
  const v1::Job behind_job = Job(behind);
  EXPECT_EQ(behind_job.state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(behind_job.pending_reason(), HasSubstr(absl::StrCat("blocked behind job ", big)));
  EXPECT_THAT(b_->orders->messages(), IsEmpty());

  // The small job ends: the big one starts, the one behind still waits.
  ASSERT_THAT(Started(*a_, small, 0, {0, 1}), IsOk());
  ASSERT_THAT(Exited(*a_, small, 0, 0, 0), IsOk());
  ASSERT_THAT(Exited(*a_, small, 0, 1, 0), IsOk());
  EXPECT_EQ(StateOf(small), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(StateOf(big), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(StateOf(behind), v1::JOB_STATE_PENDING);

  // The big one is cancelled: the one behind starts on node-a.
  ASSERT_THAT(manager().Cancel(big, "make room"), IsOk());
  const v1::Job started = Job(behind);
  EXPECT_EQ(started.state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_THAT(started.nodes(), ElementsAre("node-a"));
}

TEST_F(JobManagerTest, JobRunsOnlyOnceEveryRankHasStarted) {
  AddTwoNodes();
  const std::string id = Submit(Spec());
  ASSERT_THAT(Started(*a_, id, 0, {0, 1}), IsOk());
  EXPECT_EQ(StateOf(id), v1::JOB_STATE_SCHEDULED);
  ASSERT_THAT(Started(*b_, id, 0, {2}), IsOk());
  EXPECT_EQ(StateOf(id), v1::JOB_STATE_SCHEDULED);
  ASSERT_THAT(Started(*b_, id, 0, {3}), IsOk());
  EXPECT_EQ(StateOf(id), v1::JOB_STATE_RUNNING);
  EXPECT_THAT(EventStates(Job(id)),
              ElementsAre(v1::JOB_STATE_PENDING, v1::JOB_STATE_SCHEDULED, v1::JOB_STATE_RUNNING));
}

TEST_F(JobManagerTest, AllRanksExitingZeroSucceedsKillsAndReleases) {
  AddTwoNodes();
  const std::string id = RunJob();
  ASSERT_THAT(Exited(*a_, id, 0, 0, 0), IsOk());
  ASSERT_THAT(Exited(*a_, id, 0, 1, 0), IsOk());
  ASSERT_THAT(Exited(*b_, id, 0, 2, 0), IsOk());
  EXPECT_EQ(StateOf(id), v1::JOB_STATE_RUNNING);
  ASSERT_THAT(Exited(*b_, id, 0, 3, 0), IsOk());

  const v1::Job job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_FALSE(job.has_root_cause());
  for (const Agent* agent : {a_, b_}) {
    SCOPED_TRACE(agent->name);
    EXPECT_THAT(ActionsOf(agent->orders->messages()),
                ElementsAre(Pair(kLaunch, 0), Pair(kKill, 0)));
    const v1::Assignment& kill = agent->orders->messages().back();
    EXPECT_EQ(kill.job_id(), id);
    EXPECT_DOUBLE_EQ(kill.grace_period_seconds(), absl::ToDoubleSeconds(kKillGrace));
    const v1::Node node = NodeInfo(agent->name);
    EXPECT_EQ(node.free_slots(), 2);
    EXPECT_THAT(node.jobs(), IsEmpty());
  }
  EXPECT_THAT(coordination_->GetJob(id), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(manager().stats().jobs_succeeded, 1);
  absl::StatusOr<JobRecord> stored = store_->GetJob(id);
  ASSERT_THAT(stored, IsOk());
  EXPECT_EQ(stored->state, "SUCCEEDED");
}

// The token file's account of the owner (docs/security.md) and the spec's
// limits travel in every LAUNCH; an agent running as root acts on them.
TEST_F(JobManagerTest, LaunchCarriesTheOwnersUnixAccountAndTheLimits) {
  std::vector<std::string> asked;
  unix_account_ =
      [&asked](absl::string_view owner) -> std::optional<JobManagerOptions::UnixAccount> {
    asked.emplace_back(owner);
    if (owner == "alice") return JobManagerOptions::UnixAccount{"alice-unix", false};
    if (owner == "ops") return JobManagerOptions::UnixAccount{"root", true};
    return std::nullopt;
  };
  manager_.reset();
  CreateManager();
  Agent& node = AddAgent("node-a", /*slots=*/8);  // room for the four 2-rank jobs

  struct Case {
    std::string owner;
    std::string unix_user;
    bool allow_root;
  };
  for (const Case& c : {Case{"alice", "alice-unix", false}, Case{"ops", "root", true},
                        Case{"bob", "", false}, Case{"", "", false}}) {
    SCOPED_TRACE(absl::StrCat("owner '", c.owner, "'"));
    v1::JobSpec spec = Spec(/*nodes=*/1, /*nproc=*/2);
    spec.set_memory_per_proc_bytes(int64_t{512} << 20);
    spec.set_max_pids(256);
    const size_t before = node.orders->messages().size();
    absl::StatusOr<v1::SubmitJobResponse> submitted = manager().Submit(spec, c.owner);
    ASSERT_THAT(submitted, IsOk());
    const std::string id = submitted->job().id();
    ASSERT_EQ(StateOf(id), v1::JOB_STATE_SCHEDULED);
    ASSERT_THAT(node.orders->messages(), SizeIs(before + 1));
    const v1::Assignment& launch = node.orders->messages().back();
    ASSERT_EQ(launch.action(), kLaunch);
    EXPECT_EQ(launch.job_id(), id);
    EXPECT_EQ(launch.owner(), c.owner);
    EXPECT_EQ(launch.unix_user(), c.unix_user);
    EXPECT_EQ(launch.allow_root(), c.allow_root);
    EXPECT_EQ(launch.memory_per_proc_bytes(), int64_t{512} << 20);
    EXPECT_EQ(launch.max_pids(), 256);
  }
  // An unowned job is not looked up at all: no name could stand for it.
  EXPECT_THAT(asked, ElementsAre("alice", "ops", "bob"));
}

TEST_F(JobManagerTest, LaunchWithoutAnAccountLookupCarriesNone) {
  Agent& node = AddAgent("node-a");
  absl::StatusOr<v1::SubmitJobResponse> submitted =
      manager().Submit(Spec(/*nodes=*/1, /*nproc=*/2), "alice");
  ASSERT_THAT(submitted, IsOk());
  ASSERT_THAT(node.orders->messages(), SizeIs(1));
  const v1::Assignment& launch = node.orders->messages()[0];
  EXPECT_EQ(launch.owner(), "alice");
  EXPECT_THAT(launch.unix_user(), IsEmpty());
  EXPECT_FALSE(launch.allow_root());
  EXPECT_EQ(launch.memory_per_proc_bytes(), 0);
  EXPECT_EQ(launch.max_pids(), 0);
}

// ---- Failures and restarts --------------------------------------------------------

// A worker that hangs exits nothing; the rendezvous notices (here: the rank
// reports an error) and the job restarts with that rank as the root cause.
TEST_F(JobManagerTest, RendezvousFailureRestartsTheJobNamingTheRank) {
  AddTwoNodes();
  const std::string id = RunJob(SpecWithRestarts(1));
  for (int rank = 0; rank < 4; ++rank) {
    JoinArgs join;
    join.caller = Caller{id, 0, rank, 100u + rank};
    join.host = rank < 2 ? "node-a" : "node-b";
    coordination_->Join(std::move(join), [](absl::StatusOr<JoinResult>) {});
  }
  ASSERT_THAT(coordination_->ReportError(Caller{id, 0, 3, 103}, "CUDA error: an illegal access"),
              IsOk());

  const v1::Job job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(job.generation(), 1);
  ASSERT_TRUE(job.has_root_cause());
  EXPECT_EQ(job.root_cause().rank(), 3);
  EXPECT_EQ(job.root_cause().node(), "node-b");
  EXPECT_THAT(job.root_cause().message(), HasSubstr("illegal access"));
  // The failed generation's workers are killed, the next one launched.
  EXPECT_THAT(ActionsOf(b_->orders->messages()),
              ElementsAre(Pair(kLaunch, 0), Pair(kKill, 0), Pair(kLaunch, 1)));
}

// Ranks 0-2 wait in all_reduce #3 of "world"; rank 3 heartbeats but stays
// after #2. After the job's hang timeout the coordinator fails the
// generation naming rank 3, and on_hang decides what the job does.
class JobManagerHangTest : public JobManagerTest,
                           public ::testing::WithParamInterface<v1::HangPolicy> {
 protected:
  // Runs the job into the hang; returns its id.
  std::string HangJob(v1::HangPolicy policy) {
    AddTwoNodes();
    v1::JobSpec spec = SpecWithRestarts(2);
    spec.set_hang_timeout_seconds(30);
    spec.set_on_hang(policy);
    const std::string id = RunJob(spec);
    for (int rank = 0; rank < 4; ++rank) {
      JoinArgs join;
      join.caller = Caller{id, 0, rank, 100u + rank};
      join.host = rank < 2 ? "node-a" : "node-b";
      coordination_->Join(std::move(join), [](absl::StatusOr<JoinResult>) {});
    }
    for (int second = 1; second <= 35; ++second) {
      clock_.Advance(absl::Seconds(1));
      for (int rank = 0; rank < 4; ++rank) {
        GroupProgressReport report;
        report.name = "world";
        report.members = {0, 1, 2, 3};
        report.entered = rank == 3 ? 2 : 3;
        report.completed = 2;
        report.pending_kind =
            rank == 3 ? v1::COLLECTIVE_KIND_UNSPECIFIED : v1::COLLECTIVE_KIND_ALL_REDUCE;
        report.completed_kind = v1::COLLECTIVE_KIND_ALL_REDUCE;
        report.waiting = rank == 3 ? absl::ZeroDuration() : absl::Seconds(second);
        report.since_completed = absl::Seconds(second);
        EXPECT_THAT(coordination_->Heartbeat(Caller{id, 0, rank, 100u + rank}, {report}), IsOk());
      }
      coordination_->Tick();
      if (Job(id).has_root_cause()) return id;
    }
    return id;
  }
};

TEST_P(JobManagerHangTest, AHangIsTheRootCauseAndOnHangDecidesRestartOrFail) {
  const v1::HangPolicy policy = GetParam();
  const std::string id = HangJob(policy);
  const v1::Job job = Job(id);
  ASSERT_TRUE(job.has_root_cause());
  EXPECT_TRUE(job.root_cause().hang());
  EXPECT_EQ(job.root_cause().rank(), 3);
  EXPECT_EQ(job.root_cause().node(), "node-b");
  EXPECT_THAT(job.root_cause().message(),
              HasSubstr("rank 3 (node node-b) hung: hang in group 'world' (ranks 0-3): ranks "
                        "0-2 have waited 30 s in all_reduce #3; rank 3 never entered it"));
  EXPECT_EQ(job.spec().hang_timeout_seconds(), 30);
  if (policy == v1::HANG_POLICY_FAIL) {
    EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
    EXPECT_EQ(job.restarts(), 0);
    EXPECT_THAT(job.events(job.events_size() - 1).reason(),
                HasSubstr("not restarted: on_hang is FAIL"));
  } else {
    EXPECT_EQ(job.state(), v1::JOB_STATE_SCHEDULED);
    EXPECT_EQ(job.generation(), 1);
    EXPECT_EQ(job.restarts(), 1);
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, JobManagerHangTest,
                         ::testing::Values(v1::HANG_POLICY_RESTART, v1::HANG_POLICY_FAIL));

TEST_F(JobManagerTest, SpecDefaultsToAFiveMinuteHangTimeoutAndRestart) {
  AddTwoNodes();
  const v1::Job job = Job(RunJob());
  EXPECT_EQ(job.spec().hang_timeout_seconds(), 300);
  EXPECT_EQ(job.spec().on_hang(), v1::HANG_POLICY_RESTART);
}

// A rank that exits 0 without leaving its rendezvous while a peer waits at
// a barrier: the peer's wait ends at once, naming the rank, and the job
// fails (here: restarts) with it as the root cause. Ranks that never join
// (plain scripts) are unaffected: AllRanksExitingZeroSucceedsKillsAndReleases.
TEST_F(JobManagerTest, ExitZeroWithoutLeaveEndsAPeersBarrierNamingTheRank) {
  AddTwoNodes();
  const std::string id = RunJob(SpecWithRestarts(1));
  for (int rank = 0; rank < 4; ++rank) {
    JoinArgs join;
    join.caller = Caller{id, 0, rank, 100u + rank};
    join.host = rank < 2 ? "node-a" : "node-b";
    coordination_->Join(std::move(join), [](absl::StatusOr<JoinResult>) {});
  }
  std::optional<absl::StatusOr<int>> barrier;
  coordination_->Barrier(Caller{id, 0, 0, 100}, "step", {}, absl::Minutes(5),
                         [&](absl::StatusOr<int> result) { barrier = std::move(result); });
  ASSERT_FALSE(barrier.has_value());
  // Rank 3 left cleanly and exited: not a failure.
  ASSERT_THAT(coordination_->Leave(Caller{id, 0, 3, 103}), IsOk());
  ASSERT_THAT(Exited(*b_, id, 0, 3, 0), IsOk());
  // The barrier included rank 3, which left before arriving: that barrier
  // fails (FAILED_PRECONDITION), the job does not.
  ASSERT_TRUE(barrier.has_value());
  EXPECT_THAT(*barrier, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(StateOf(id), v1::JOB_STATE_RUNNING);

  barrier.reset();
  coordination_->Barrier(Caller{id, 0, 0, 100}, "first-three", {0, 1, 2}, absl::Minutes(5),
                         [&](absl::StatusOr<int> result) { barrier = std::move(result); });
  ASSERT_FALSE(barrier.has_value());
  // Rank 2 exits 0 without Leave.
  ASSERT_THAT(Exited(*b_, id, 0, 2, 0), IsOk());
  ASSERT_TRUE(barrier.has_value());
  EXPECT_THAT(*barrier, StatusIs(absl::StatusCode::kAborted,
                                 AllOf(HasSubstr("rank 2 (node-b)"),
                                       HasSubstr("exited with code 0 before the job finished"))));
  const v1::Job job = Job(id);
  EXPECT_EQ(job.generation(), 1);
  ASSERT_TRUE(job.has_root_cause());
  EXPECT_EQ(job.root_cause().rank(), 2);
  EXPECT_THAT(job.root_cause().message(), HasSubstr("exited with code 0 before the job finished"));
}

TEST_F(JobManagerTest, FailedRankRestartsTheJobKillThenLaunch) {
  AddTwoNodes();
  const std::string id = RunJob(SpecWithRestarts(1));
  ASSERT_THAT(Exited(*b_, id, 0, 2, 3), IsOk());

  const v1::Job job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(job.generation(), 1);
  EXPECT_EQ(job.restarts(), 1);
  EXPECT_THAT(EventStates(job),
              ElementsAre(v1::JOB_STATE_PENDING, v1::JOB_STATE_SCHEDULED, v1::JOB_STATE_RUNNING,
                          v1::JOB_STATE_RESTARTING, v1::JOB_STATE_SCHEDULED));
  EXPECT_EQ(job.events(3).generation(), 1);
  EXPECT_EQ(job.events(4).generation(), 1);
  ASSERT_TRUE(job.has_root_cause());
  const v1::RootCause& cause = job.root_cause();
  EXPECT_EQ(cause.rank(), 2);
  EXPECT_EQ(cause.node(), "node-b");
  EXPECT_EQ(cause.host(), b_->address);
  EXPECT_EQ(cause.generation(), 0);
  ASSERT_EQ(cause.termination_case(), v1::RootCause::kExitCode);
  EXPECT_EQ(cause.exit_code(), 3);
  EXPECT_THAT(cause.message(), AllOf(HasSubstr("rank 2"), HasSubstr("node-b")));

  // Each node: KILL of generation 0, then LAUNCH of generation 1, in that
  // order (the agent applies them in order).
  for (const Agent* agent : {a_, b_}) {
    SCOPED_TRACE(agent->name);
    EXPECT_THAT(ActionsOf(agent->orders->messages()),
                ElementsAre(Pair(kLaunch, 0), Pair(kKill, 0), Pair(kLaunch, 1)));
    EXPECT_EQ(agent->orders->messages().back().restart_count(), 1);
  }
  EXPECT_THAT(RanksOf(b_->orders->messages().back()), ElementsAre(Pair(2, 0), Pair(3, 1)));

  absl::StatusOr<JobInfo> info = coordination_->GetJob(id);
  ASSERT_THAT(info, IsOk());
  EXPECT_EQ(info->generation, 1);
  EXPECT_EQ(manager().stats().restarts, 1);

  // The new generation runs and succeeds.
  ASSERT_THAT(Started(*a_, id, 1, {0, 1}), IsOk());
  ASSERT_THAT(Started(*b_, id, 1, {2, 3}), IsOk());
  EXPECT_EQ(StateOf(id), v1::JOB_STATE_RUNNING);
  for (int rank = 0; rank < 4; ++rank) {
    ASSERT_THAT(Exited(rank < 2 ? *a_ : *b_, id, 1, rank, 0), IsOk());
  }
  EXPECT_EQ(StateOf(id), v1::JOB_STATE_SUCCEEDED);
}

TEST_F(JobManagerTest, FailureWhileScheduledAlsoRestarts) {
  AddTwoNodes();
  const std::string id = Submit(SpecWithRestarts(1));
  ASSERT_THAT(Started(*a_, id, 0, {0, 1}), IsOk());
  ASSERT_THAT(Exited(*a_, id, 0, 1, 1), IsOk());
  const v1::Job job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(job.generation(), 1);
  EXPECT_EQ(job.root_cause().rank(), 1);
}

TEST_F(JobManagerTest, SignalIsRecordedInTheRootCause) {
  AddTwoNodes();
  const std::string id = RunJob(SpecWithRestarts(1));
  ASSERT_THAT(Signaled(*a_, id, 0, 1, 9), IsOk());

  const v1::Job job = Job(id);
  EXPECT_EQ(job.generation(), 1);
  const v1::RootCause& cause = job.root_cause();
  EXPECT_EQ(cause.rank(), 1);
  EXPECT_EQ(cause.node(), "node-a");
  ASSERT_EQ(cause.termination_case(), v1::RootCause::kSignal);
  EXPECT_EQ(cause.signal(), 9);
  EXPECT_THAT(cause.message(), HasSubstr("signal 9"));
}

TEST_F(JobManagerTest, LaunchErrorIsAFailure) {
  AddTwoNodes();
  const std::string id = Submit(SpecWithRestarts(1));
  ASSERT_THAT(LaunchFailed(*b_, id, 0, 3, "execve /usr/bin/python3: No such file or directory"),
              IsOk());

  const v1::Job job = Job(id);
  EXPECT_EQ(job.generation(), 1);
  EXPECT_EQ(job.restarts(), 1);
  const v1::RootCause& cause = job.root_cause();
  EXPECT_EQ(cause.rank(), 3);
  EXPECT_EQ(cause.node(), "node-b");
  EXPECT_THAT(cause.message(), HasSubstr("No such file or directory"));
}

TEST_F(JobManagerTest, OnlyTheFirstFailureOfAGenerationIsTheRootCause) {
  AddTwoNodes();
  const std::string id = RunJob(SpecWithRestarts(2));
  ASSERT_THAT(Exited(*b_, id, 0, 2, 3), IsOk());
  // Rank 0 dies of the KILL: a report for generation 0, now stale.
  ASSERT_THAT(Signaled(*a_, id, 0, 0, 15), IsOk());

  const v1::Job job = Job(id);
  EXPECT_EQ(job.generation(), 1);
  EXPECT_EQ(job.restarts(), 1);
  EXPECT_EQ(job.root_cause().rank(), 2);
  EXPECT_EQ(job.root_cause().exit_code(), 3);
}

TEST_F(JobManagerTest, StaleReportsAreAcceptedIgnoredAndCounted) {
  AddTwoNodes();
  const std::string id = RunJob(SpecWithRestarts(1));
  ASSERT_THAT(Exited(*b_, id, 0, 2, 3), IsOk());
  ASSERT_EQ(Job(id).generation(), 1);
  const size_t events = Job(id).events_size();

  EXPECT_THAT(Exited(*b_, id, 0, 3, 1), IsOk());
  EXPECT_THAT(Started(*a_, id, 0, {0, 1}), IsOk());
  EXPECT_THAT(Exited(*a_, id, 0, 0, 0), IsOk());

  const v1::Job job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(job.generation(), 1);
  EXPECT_EQ(job.restarts(), 1);
  EXPECT_EQ(static_cast<size_t>(job.events_size()), events);
  EXPECT_EQ(job.root_cause().rank(), 2);
  EXPECT_GE(manager().stats().stale_reports, 1);
  EXPECT_EQ(manager().stats().restarts, 1);
}

TEST_F(JobManagerTest, ReportsForUnknownJobsAreIgnored) {
  AddTwoNodes();
  EXPECT_THAT(Exited(*a_, "job-404", 0, 0, 1), IsOk());
  EXPECT_THAT(Started(*a_, "job-404", 0, {0}), IsOk());
}

TEST_F(JobManagerTest, ReportsForARankOutsideTheWorldAreInvalid) {
  AddTwoNodes();
  const std::string id = RunJob();
  EXPECT_THAT(Exited(*b_, id, 0, 4, 1), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Started(*b_, id, 0, {-1}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(StateOf(id), v1::JOB_STATE_RUNNING);
}

TEST_F(JobManagerTest, ExhaustedRestartsFailTheJobNamingRankAndSignal) {
  AddTwoNodes();
  const std::string id = RunJob(SpecWithRestarts(1));
  JobWait wait;
  manager().WaitJob(id, absl::Seconds(30), wait.Done());
  ASSERT_FALSE(wait.fired());

  ASSERT_THAT(Exited(*b_, id, 0, 2, 1), IsOk());
  ASSERT_THAT(Started(*a_, id, 1, {0, 1}), IsOk());
  ASSERT_THAT(Started(*b_, id, 1, {2, 3}), IsOk());
  ASSERT_THAT(Signaled(*b_, id, 1, 3, 9), IsOk());

  const v1::Job job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(job.generation(), 1);
  EXPECT_EQ(job.restarts(), 1);
  const v1::RootCause& cause = job.root_cause();
  EXPECT_EQ(cause.rank(), 3);
  EXPECT_EQ(cause.node(), "node-b");
  EXPECT_EQ(cause.generation(), 1);
  EXPECT_EQ(cause.signal(), 9);
  EXPECT_THAT(cause.message(), AllOf(HasSubstr("rank 3"), HasSubstr("signal 9")));

  ASSERT_TRUE(wait.fired());
  EXPECT_EQ(wait.calls(), 1);
  ASSERT_THAT(wait.result(), IsOk());
  EXPECT_EQ(wait.result()->state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(wait.result()->root_cause().rank(), 3);
  EXPECT_FALSE(wait.result()->events().empty());

  for (const Agent* agent : {a_, b_}) {
    SCOPED_TRACE(agent->name);
    EXPECT_EQ(ActionsOf(agent->orders->messages()).back(), std::make_pair(kKill, int64_t{1}));
    EXPECT_EQ(NodeInfo(agent->name).free_slots(), 2);
  }
  EXPECT_THAT(coordination_->GetJob(id), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(manager().stats().jobs_failed, 1);
}

TEST_F(JobManagerTest, NoRestartsFailsOnTheFirstFailure) {
  AddTwoNodes();
  const std::string id = RunJob(SpecWithRestarts(0));
  ASSERT_THAT(Exited(*a_, id, 0, 0, 2), IsOk());
  const v1::Job job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(job.generation(), 0);
  EXPECT_EQ(job.root_cause().exit_code(), 2);
  // A later exit of the failed job changes nothing.
  EXPECT_THAT(Exited(*b_, id, 0, 2, 0), IsOk());
  EXPECT_EQ(StateOf(id), v1::JOB_STATE_FAILED);
}

// ---- Cancel -------------------------------------------------------------------------

TEST_F(JobManagerTest, CancelPendingJob) {
  a_ = &AddAgent("node-a");  // Too small for the job.
  const std::string id = Submit(Spec());
  ASSERT_EQ(StateOf(id), v1::JOB_STATE_PENDING);

  absl::StatusOr<v1::Job> cancelled = manager().Cancel(id, "not needed");
  ASSERT_THAT(cancelled, IsOk());
  EXPECT_EQ(cancelled->state(), v1::JOB_STATE_CANCELLED);
  const v1::Job job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_CANCELLED);
  EXPECT_THAT(job.events().rbegin()->reason(), HasSubstr("not needed"));
  EXPECT_THAT(job.pending_reason(), IsEmpty());
  EXPECT_THAT(a_->orders->messages(), IsEmpty());
  absl::StatusOr<JobRecord> stored = store_->GetJob(id);
  ASSERT_THAT(stored, IsOk());
  EXPECT_EQ(stored->state, "CANCELLED");
  EXPECT_EQ(manager().stats().jobs_cancelled, 1);
}

TEST_F(JobManagerTest, CancelRunningJobKillsEveryNode) {
  AddTwoNodes();
  const std::string id = RunJob();
  absl::StatusOr<v1::Job> cancelled = manager().Cancel(id, "user asked");
  ASSERT_THAT(cancelled, IsOk());
  EXPECT_EQ(cancelled->state(), v1::JOB_STATE_CANCELLED);

  for (const Agent* agent : {a_, b_}) {
    SCOPED_TRACE(agent->name);
    EXPECT_THAT(ActionsOf(agent->orders->messages()),
                ElementsAre(Pair(kLaunch, 0), Pair(kKill, 0)));
    EXPECT_EQ(NodeInfo(agent->name).free_slots(), 2);
  }
  EXPECT_THAT(coordination_->GetJob(id), StatusIs(absl::StatusCode::kNotFound));
  // Exits of the killed workers change nothing.
  EXPECT_THAT(Signaled(*a_, id, 0, 0, 15), IsOk());
  EXPECT_EQ(StateOf(id), v1::JOB_STATE_CANCELLED);
}

TEST_F(JobManagerTest, CancelTerminalJobReturnsItUnchanged) {
  const std::string id = Submit(Spec());
  ASSERT_THAT(manager().Cancel(id, "first"), IsOk());
  const v1::Job before = Job(id);

  clock_.Advance(absl::Seconds(3));
  absl::StatusOr<v1::Job> again = manager().Cancel(id, "second");
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(again->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(again->update_time_unix_ms(), before.update_time_unix_ms());
  const v1::Job after = Job(id);
  EXPECT_EQ(after.events_size(), before.events_size());
  EXPECT_EQ(manager().stats().jobs_cancelled, 1);
}

TEST_F(JobManagerTest, CancelUnknownJobIsNotFound) {
  EXPECT_THAT(manager().Cancel("job-404", "x"), StatusIs(absl::StatusCode::kNotFound));
}

// ---- WaitJob -------------------------------------------------------------------------

TEST_F(JobManagerTest, WaitJobCompletesWhenTheJobEnds) {
  const std::string id = Submit(Spec());
  JobWait wait;
  manager().WaitJob(id, absl::Seconds(30), wait.Done());
  EXPECT_FALSE(wait.fired());
  ASSERT_THAT(manager().Cancel(id, "done"), IsOk());
  ASSERT_TRUE(wait.fired());
  ASSERT_THAT(wait.result(), IsOk());
  EXPECT_EQ(wait.result()->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_THAT(EventStates(*wait.result()),
              ElementsAre(v1::JOB_STATE_PENDING, v1::JOB_STATE_CANCELLED));

  // Later ticks never call it again.
  clock_.Advance(absl::Minutes(2));
  manager().Tick();
  EXPECT_EQ(wait.calls(), 1);
}

TEST_F(JobManagerTest, WaitJobOnATerminalJobCompletesAtOnce) {
  const std::string id = Submit(Spec());
  ASSERT_THAT(manager().Cancel(id, "done"), IsOk());
  JobWait wait;
  manager().WaitJob(id, absl::Seconds(30), wait.Done());
  ASSERT_TRUE(wait.fired());
  ASSERT_THAT(wait.result(), IsOk());
  EXPECT_EQ(wait.result()->state(), v1::JOB_STATE_CANCELLED);
}

TEST_F(JobManagerTest, WaitJobCallbackMayCallBackIntoTheManager) {
  const std::string id = Submit(Spec());
  JobState seen = v1::JOB_STATE_UNSPECIFIED;
  manager().WaitJob(id, absl::Seconds(30), [&](absl::StatusOr<v1::Job> job) {
    ASSERT_THAT(job, IsOk());
    // Runs without the manager's mutex: calling in must not deadlock.
    absl::StatusOr<v1::Job> again = manager().GetJob(job->id());
    ASSERT_THAT(again, IsOk());
    seen = again->state();
  });
  ASSERT_THAT(manager().Cancel(id, "done"), IsOk());
  EXPECT_EQ(seen, v1::JOB_STATE_CANCELLED);
}

TEST_F(JobManagerTest, WaitJobOnAnUnknownJobIsNotFound) {
  JobWait wait;
  manager().WaitJob("job-404", absl::Seconds(30), wait.Done());
  ASSERT_TRUE(wait.fired());
  EXPECT_THAT(wait.result(), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(JobManagerTest, WaitJobTimesOut) {
  const std::string id = Submit(Spec());
  JobWait wait;
  manager().WaitJob(id, absl::Seconds(5), wait.Done());
  clock_.Advance(absl::Seconds(4));
  manager().Tick();
  EXPECT_FALSE(wait.fired());
  clock_.Advance(absl::Seconds(2));
  manager().Tick();
  ASSERT_TRUE(wait.fired());
  EXPECT_THAT(wait.result(), StatusIs(absl::StatusCode::kDeadlineExceeded));
  // The job is untouched.
  EXPECT_EQ(StateOf(id), v1::JOB_STATE_PENDING);
}

TEST_F(JobManagerTest, WaitJobWithoutOrAboveTheCapWaitsMaxWait) {
  const std::string id = Submit(Spec());
  JobWait unset;
  JobWait too_long;
  manager().WaitJob(id, absl::ZeroDuration(), unset.Done());
  manager().WaitJob(id, absl::Hours(5), too_long.Done());
  clock_.Advance(kMaxWait - absl::Seconds(1));
  manager().Tick();
  EXPECT_FALSE(unset.fired());
  EXPECT_FALSE(too_long.fired());
  clock_.Advance(absl::Seconds(2));
  manager().Tick();
  ASSERT_TRUE(unset.fired());
  ASSERT_TRUE(too_long.fired());
  EXPECT_THAT(unset.result(), StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(too_long.result(), StatusIs(absl::StatusCode::kDeadlineExceeded));
}

TEST_F(JobManagerTest, WaitJobEndsUnavailableOnShutdown) {
  const std::string id = Submit(Spec());
  JobWait wait;
  manager().WaitJob(id, absl::Seconds(30), wait.Done());
  manager().Shutdown();
  ASSERT_TRUE(wait.fired());
  EXPECT_THAT(wait.result(), StatusIs(absl::StatusCode::kUnavailable));
}

// ---- WatchJobState --------------------------------------------------------------------

TEST_F(JobManagerTest, WatchJobStateReplaysThenStreamsThenEndsOk) {
  AddTwoNodes();
  const std::string id = Submit(Spec());
  StateSink* sink = Keep<StateSink>();
  ASSERT_THAT(manager().WatchJobState(id, /*replay=*/true, sink), IsOk());
  std::vector<JobState> seen;
  for (const auto& message : sink->messages()) seen.push_back(message.event().to());
  EXPECT_THAT(seen, ElementsAre(v1::JOB_STATE_PENDING, v1::JOB_STATE_SCHEDULED));
  EXPECT_FALSE(sink->ended());

  ASSERT_THAT(Started(*a_, id, 0, {0, 1}), IsOk());
  ASSERT_THAT(Started(*b_, id, 0, {2, 3}), IsOk());
  for (int rank = 0; rank < 4; ++rank) {
    ASSERT_THAT(Exited(rank < 2 ? *a_ : *b_, id, 0, rank, 0), IsOk());
  }

  seen.clear();
  for (const auto& message : sink->messages()) {
    seen.push_back(message.event().to());
    EXPECT_EQ(message.job().id(), id);
    EXPECT_THAT(message.job().events(), IsEmpty());
  }
  EXPECT_THAT(seen, ElementsAre(v1::JOB_STATE_PENDING, v1::JOB_STATE_SCHEDULED,
                                v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED));
  // Live transitions carry the job right after them.
  ASSERT_THAT(sink->messages(), SizeIs(4));
  EXPECT_EQ(sink->messages()[2].job().state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(sink->messages()[3].job().state(), v1::JOB_STATE_SUCCEEDED);
  ASSERT_TRUE(sink->ended());
  EXPECT_THAT(sink->status(), IsOk());
}

// WatchJobStateResponse.job is "the job right after" the event (job.proto),
// for replayed events too: a replayed PENDING event carries state PENDING.
TEST_F(JobManagerTest, ReplayedEventsCarryTheJobAsItWasRightAfterThem) {
  AddTwoNodes();
  const std::string id = RunJob();
  StateSink* sink = Keep<StateSink>();
  ASSERT_THAT(manager().WatchJobState(id, /*replay=*/true, sink), IsOk());
  ASSERT_THAT(sink->messages(), SizeIs(3));
  for (const auto& message : sink->messages()) {
    EXPECT_EQ(message.job().state(), message.event().to())
        << "replayed event " << message.event().ShortDebugString();
    EXPECT_EQ(message.job().generation(), message.event().generation());
  }
}

TEST_F(JobManagerTest, WatchJobStateWithoutReplayGetsOnlyNewTransitions) {
  const std::string id = Submit(Spec());
  StateSink* sink = Keep<StateSink>();
  ASSERT_THAT(manager().WatchJobState(id, /*replay=*/false, sink), IsOk());
  EXPECT_THAT(sink->messages(), IsEmpty());
  ASSERT_THAT(manager().Cancel(id, "bye"), IsOk());
  ASSERT_THAT(sink->messages(), SizeIs(1));
  EXPECT_EQ(sink->messages()[0].event().from(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(sink->messages()[0].event().to(), v1::JOB_STATE_CANCELLED);
  EXPECT_THAT(sink->messages()[0].event().reason(), HasSubstr("bye"));
  ASSERT_TRUE(sink->ended());
  EXPECT_THAT(sink->status(), IsOk());
}

TEST_F(JobManagerTest, WatchJobStateOfATerminalJobReplaysAndEnds) {
  const std::string id = Submit(Spec());
  ASSERT_THAT(manager().Cancel(id, "bye"), IsOk());
  StateSink* sink = Keep<StateSink>();
  ASSERT_THAT(manager().WatchJobState(id, /*replay=*/true, sink), IsOk());
  EXPECT_THAT(sink->messages(), SizeIs(2));
  ASSERT_TRUE(sink->ended());
  EXPECT_THAT(sink->status(), IsOk());
}

TEST_F(JobManagerTest, UnwatchJobStateStopsDelivery) {
  const std::string id = Submit(Spec());
  StateSink* sink = Keep<StateSink>();
  absl::StatusOr<uint64_t> handle = manager().WatchJobState(id, /*replay=*/false, sink);
  ASSERT_THAT(handle, IsOk());
  manager().UnwatchJobState(*handle);
  ASSERT_THAT(manager().Cancel(id, "bye"), IsOk());
  EXPECT_THAT(sink->messages(), IsEmpty());
  EXPECT_FALSE(sink->ended());
  manager().UnwatchJobState(*handle);  // Twice: a no-op.
}

TEST_F(JobManagerTest, WatchJobStateOfAnUnknownJobIsNotFound) {
  StateSink* sink = Keep<StateSink>();
  EXPECT_THAT(manager().WatchJobState("job-404", true, sink),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_FALSE(sink->ended());
}

// ---- Node loss -------------------------------------------------------------------------

TEST_F(JobManagerTest, SilentNodeIsLostAndItsJobRestartsPendingWithoutIt) {
  AddTwoNodes();
  const std::string id = RunJob(SpecWithRestarts(1));

  // Only node-b heartbeats.
  AdvanceWithHeartbeats(kHeartbeatTimeout + absl::Seconds(1), {b_});

  EXPECT_EQ(NodeInfo("node-a").state(), v1::NODE_STATE_LOST);
  EXPECT_EQ(NodeInfo("node-b").state(), v1::NODE_STATE_READY);
  EXPECT_EQ(manager().stats().nodes_lost, 1);

  const v1::Job job = Job(id);
  EXPECT_EQ(job.generation(), 1);
  EXPECT_EQ(job.restarts(), 1);
  // The restart needs two nodes and only one is left.
  EXPECT_EQ(job.state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(EventStates(job),
              ElementsAre(v1::JOB_STATE_PENDING, v1::JOB_STATE_SCHEDULED, v1::JOB_STATE_RUNNING,
                          v1::JOB_STATE_RESTARTING, v1::JOB_STATE_PENDING));
  EXPECT_FALSE(job.pending_reason().empty());
  const v1::RootCause& cause = job.root_cause();
  EXPECT_EQ(cause.rank(), -1);
  EXPECT_EQ(cause.node(), "node-a");
  EXPECT_THAT(cause.message(), HasSubstr("node-a"));
  EXPECT_EQ(cause.generation(), 0);

  // node-b was told to kill generation 0 and nothing else; node-b's slots
  // are free again.
  EXPECT_THAT(ActionsOf(b_->orders->messages()), ElementsAre(Pair(kLaunch, 0), Pair(kKill, 0)));
  EXPECT_EQ(NodeInfo("node-b").free_slots(), 2);
  EXPECT_THAT(OrdersWith(a_->orders->messages(), kLaunch), SizeIs(1));

  // node-a comes back: the job is placed again at generation 1.
  ASSERT_THAT(Register(*a_), IsOk());
  ASSERT_THAT(Watch(*a_), IsOk());
  EXPECT_EQ(NodeInfo("node-a").state(), v1::NODE_STATE_READY);
  const v1::Job again = Job(id);
  EXPECT_EQ(again.state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(again.generation(), 1);
  const std::vector<v1::Assignment> a_launches = OrdersWith(a_->orders->messages(), kLaunch);
  ASSERT_THAT(a_launches, SizeIs(1));
  EXPECT_EQ(a_launches[0].generation(), 1);
  EXPECT_EQ(ActionsOf(b_->orders->messages()).back(), std::make_pair(kLaunch, int64_t{1}));
}

TEST_F(JobManagerTest, SilentNodeFailsAJobWithoutRestarts) {
  AddTwoNodes();
  const std::string id = RunJob(SpecWithRestarts(0));
  AdvanceWithHeartbeats(kHeartbeatTimeout + absl::Seconds(1), {a_});

  const v1::Job job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(job.root_cause().rank(), -1);
  EXPECT_EQ(job.root_cause().node(), "node-b");
  EXPECT_EQ(ActionsOf(a_->orders->messages()).back(), std::make_pair(kKill, int64_t{0}));
  EXPECT_THAT(coordination_->GetJob(id), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(JobManagerTest, HeartbeatsWithinTheTimeoutKeepNodesReady) {
  AddTwoNodes();
  const std::string id = RunJob();
  AdvanceWithHeartbeats(3 * kHeartbeatTimeout, {a_, b_});
  EXPECT_EQ(NodeInfo("node-a").state(), v1::NODE_STATE_READY);
  EXPECT_EQ(NodeInfo("node-b").state(), v1::NODE_STATE_READY);
  EXPECT_EQ(StateOf(id), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(manager().stats().nodes_lost, 0);
}

TEST_F(JobManagerTest, NeitherTheCoordinatorsStallNorItsBacklogLosesANode) {
  AddTwoNodes();
  const std::string id = RunJob(SpecWithRestarts(0));
  // The coordinator stops for three timeouts; the ticker forgives the stall
  // before the next check.
  clock_.Advance(3 * kHeartbeatTimeout);
  manager().ForgiveStall(3 * kHeartbeatTimeout);
  manager().Tick();
  EXPECT_EQ(NodeInfo("node-b").state(), v1::NODE_STATE_READY);

  // Then its own backlog holds node-b's heartbeats (the probe waits).
  ServerLag lag;
  manager().SetServerLag(&lag);
  lag.ProbeSent(clock_.Now());
  AdvanceWithHeartbeats(kHeartbeatTimeout + absl::Seconds(5), {a_});
  EXPECT_EQ(NodeInfo("node-b").state(), v1::NODE_STATE_READY);
  EXPECT_EQ(StateOf(id), v1::JOB_STATE_RUNNING);

  // The backlog clears and node-b is still silent: LOST, as it would be.
  lag.ProbeAnswered(clock_.Now());
  lag.ProbeSent(clock_.Now());
  lag.ProbeAnswered(clock_.Now());
  AdvanceWithHeartbeats(absl::Seconds(5), {a_});
  EXPECT_EQ(NodeInfo("node-b").state(), v1::NODE_STATE_LOST);
  EXPECT_EQ(StateOf(id), v1::JOB_STATE_FAILED);
  manager().SetServerLag(nullptr);
}

// ---- Nodes and sessions ----------------------------------------------------------------

TEST(NodeHeartbeatIntervalTest, GrowsWithTheClusterWithinAThirdOfTheTimeout) {
  JobManagerOptions o;  // 2 s, 15 s timeout, 2048 heartbeats a second.
  EXPECT_EQ(NodeHeartbeatInterval(o, 0), absl::Seconds(2));
  EXPECT_EQ(NodeHeartbeatInterval(o, 1), absl::Seconds(2));
  EXPECT_EQ(NodeHeartbeatInterval(o, 4096), absl::Seconds(2));
  EXPECT_EQ(NodeHeartbeatInterval(o, 8192), absl::Seconds(4));
  EXPECT_EQ(NodeHeartbeatInterval(o, 16384), absl::Seconds(5));  // 15 s / 3
  EXPECT_EQ(NodeHeartbeatInterval(o, 1000000), absl::Seconds(5));
  o.node_heartbeat_rate = 0;  // Off.
  EXPECT_EQ(NodeHeartbeatInterval(o, 1000000), absl::Seconds(2));
  // A timeout under three intervals never shortens the interval.
  o.node_heartbeat_rate = 1;
  o.node_heartbeat_timeout = absl::Seconds(3);
  EXPECT_EQ(NodeHeartbeatInterval(o, 100), absl::Seconds(2));
}

TEST(JobManagerOptionsTest, NodeHeartbeatRateMustBeZeroOrPositiveAndFinite) {
  for (double rate :
       {-1.0, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    JobManagerOptions options;
    options.node_heartbeat_rate = rate;
    EXPECT_THAT(ValidateJobManagerOptions(options),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("node_heartbeat_rate")))
        << rate;
  }
  JobManagerOptions off;
  off.node_heartbeat_rate = 0;
  EXPECT_THAT(ValidateJobManagerOptions(off), IsOk());
}

TEST_F(JobManagerTest, RegisterNodeTellsTheHeartbeatAndListsTheNode) {
  Agent agent;
  agent.name = "node-a";
  agent.address = "10.0.0.1";
  agent.slots = 4;
  agent.gpus = 2;
  absl::StatusOr<v1::RegisterNodeResponse> response =
      manager().RegisterNode(RegisterRequest(agent));
  ASSERT_THAT(response, IsOk());
  EXPECT_FALSE(response->session_id().empty());
  EXPECT_DOUBLE_EQ(response->heartbeat_interval_seconds(),
                   absl::ToDoubleSeconds(kHeartbeatInterval));
  EXPECT_DOUBLE_EQ(response->heartbeat_timeout_seconds(), absl::ToDoubleSeconds(kHeartbeatTimeout));

  const std::vector<v1::Node> nodes = manager().ListNodes();
  ASSERT_THAT(nodes, SizeIs(1));
  EXPECT_EQ(nodes[0].name(), "node-a");
  EXPECT_EQ(nodes[0].address(), "10.0.0.1");
  EXPECT_EQ(nodes[0].state(), v1::NODE_STATE_READY);
  EXPECT_EQ(nodes[0].slots(), 4);
  EXPECT_EQ(nodes[0].free_slots(), 4);
  EXPECT_THAT(nodes[0].gpus(), SizeIs(2));
  EXPECT_EQ(nodes[0].free_gpus(), 2);
  EXPECT_EQ(nodes[0].agent_version(), "0.1.0");
  EXPECT_EQ(nodes[0].last_seen_unix_ms(), absl::ToUnixMillis(clock_.Now()));
}

TEST_F(JobManagerTest, ListNodesIsOrderedByName) {
  AddAgent("node-c");
  AddAgent("node-a");
  AddAgent("node-b");
  std::vector<std::string> names;
  for (const v1::Node& node : manager().ListNodes()) names.push_back(node.name());
  EXPECT_THAT(names, ElementsAre("node-a", "node-b", "node-c"));
}

TEST_F(JobManagerTest, RegisterNodeRejectsBadRequests) {
  Agent good;
  good.name = "node-a";
  good.address = "10.0.0.1";
  good.gpus = 2;

  v1::RegisterNodeRequest no_name = RegisterRequest(good);
  no_name.set_name("");
  EXPECT_THAT(manager().RegisterNode(no_name), StatusIs(absl::StatusCode::kInvalidArgument));
  v1::RegisterNodeRequest bad_name = RegisterRequest(good);
  bad_name.set_name("node a/../b");
  EXPECT_THAT(manager().RegisterNode(bad_name), StatusIs(absl::StatusCode::kInvalidArgument));
  v1::RegisterNodeRequest no_slots = RegisterRequest(good);
  no_slots.set_slots(0);
  EXPECT_THAT(manager().RegisterNode(no_slots), StatusIs(absl::StatusCode::kInvalidArgument));
  v1::RegisterNodeRequest no_address = RegisterRequest(good);
  no_address.set_address("");
  EXPECT_THAT(manager().RegisterNode(no_address), StatusIs(absl::StatusCode::kInvalidArgument));
  v1::RegisterNodeRequest twice = RegisterRequest(good);
  twice.mutable_gpus(1)->set_index(0);
  EXPECT_THAT(manager().RegisterNode(twice), StatusIs(absl::StatusCode::kInvalidArgument));

  EXPECT_THAT(manager().ListNodes(), IsEmpty());
}

TEST_F(JobManagerTest, SessionCallsOfAnUnknownNodeAreNotFound) {
  EXPECT_THAT(manager().NodeHeartbeat("ghost", "s"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(manager().WatchAssignments("ghost", "s", Keep<OrderSink>()),
              StatusIs(absl::StatusCode::kNotFound));
  Agent ghost;
  ghost.name = "ghost";
  ghost.session = "s";
  EXPECT_THAT(Exited(ghost, "job-1", 0, 0, 0), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(Started(ghost, "job-1", 0, {0}), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(JobManagerTest, ReRegistrationReplacesTheSession) {
  Agent& a = AddAgent("node-a");
  Agent old = a;
  EXPECT_THAT(Heartbeat(a), IsOk());
  ASSERT_THAT(Register(a), IsOk());
  EXPECT_NE(a.session, old.session);

  EXPECT_THAT(Heartbeat(a), IsOk());
  EXPECT_THAT(Heartbeat(old), StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT(manager().WatchAssignments(old.name, old.session, Keep<OrderSink>()),
              StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT(Started(old, "job-1", 0, {0}), StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT(Exited(old, "job-1", 0, 0, 0), StatusIs(absl::StatusCode::kAborted));
  Agent made_up = a;
  made_up.session = "made-up";
  EXPECT_THAT(Heartbeat(made_up), StatusIs(absl::StatusCode::kAborted));
}

TEST_F(JobManagerTest, ANewOrderStreamEndsTheOldOneWithAborted) {
  Agent& a = AddAgent("node-a");
  OrderSink* first = a.orders;
  ASSERT_THAT(Watch(a), IsOk());
  ASSERT_TRUE(first->ended());
  EXPECT_THAT(first->status(), StatusIs(absl::StatusCode::kAborted));
  EXPECT_FALSE(a.orders->ended());

  const std::string id = Submit(Spec(/*nodes=*/1, /*nproc=*/2));
  EXPECT_EQ(StateOf(id), v1::JOB_STATE_SCHEDULED);
  EXPECT_THAT(first->messages(), IsEmpty());
  EXPECT_THAT(a.orders->messages(), SizeIs(1));
}

TEST_F(JobManagerTest, UnwatchAssignmentsStopsDelivery) {
  Agent& a = AddAgent("node-a");
  manager().UnwatchAssignments(a.watch);
  const std::string id = Submit(Spec(/*nodes=*/1, /*nproc=*/2));
  EXPECT_EQ(StateOf(id), v1::JOB_STATE_SCHEDULED);
  EXPECT_THAT(a.orders->messages(), IsEmpty());
  EXPECT_FALSE(a.orders->ended());
}

TEST_F(JobManagerTest, ReRegistrationKillsWorkersOfJobsNoLongerPlacedThere) {
  AddTwoNodes();
  const std::string id = RunJob();
  ASSERT_THAT(manager().Cancel(id, "stop"), IsOk());

  // node-b restarts and still supervises rank 2 of the cancelled job, and a
  // worker of a job the coordinator never heard of.
  ASSERT_THAT(Register(*b_, {Worker(id, 0, 2), Worker("job-999", 0, 0)}), IsOk());
  ASSERT_THAT(Watch(*b_), IsOk());
  const std::vector<v1::Assignment> kills = OrdersWith(b_->orders->messages(), kKill);
  std::vector<std::string> killed;
  for (const v1::Assignment& kill : kills) {
    killed.push_back(kill.job_id());
    EXPECT_GE(kill.generation(), 0);
  }
  EXPECT_THAT(killed, ::testing::UnorderedElementsAre(id, "job-999"));
  EXPECT_THAT(OrdersWith(b_->orders->messages(), kLaunch), IsEmpty());
  EXPECT_EQ(StateOf(id), v1::JOB_STATE_CANCELLED);
}

TEST_F(JobManagerTest, ReRegistrationWithoutAPlacedRankFailsItAfterTheTimeout) {
  AddTwoNodes();
  const std::string id = RunJob(SpecWithRestarts(0));
  // node-b's agent restarted and lost rank 3 (it lists only rank 2).
  ASSERT_THAT(Register(*b_, {Worker(id, 0, 2)}), IsOk());
  ASSERT_THAT(Watch(*b_), IsOk());
  EXPECT_THAT(OrdersWith(b_->orders->messages(), kKill), IsEmpty());

  AdvanceWithHeartbeats(kHeartbeatTimeout - absl::Seconds(1), {a_, b_});
  EXPECT_EQ(StateOf(id), v1::JOB_STATE_RUNNING);
  AdvanceWithHeartbeats(absl::Seconds(2), {a_, b_});
  const v1::Job job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(job.root_cause().node(), "node-b");
  EXPECT_THAT(job.root_cause().message(), HasSubstr("rank 3"));
}

// ---- Recovery --------------------------------------------------------------------------

TEST_F(JobManagerTest, RecoverTwiceOrAfterUseIsFailedPrecondition) {
  EXPECT_THAT(manager().Recover(), IsOk());
  EXPECT_THAT(manager().Recover(), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(JobManagerTest, RecoverAfterSubmitIsFailedPrecondition) {
  Submit(Spec());
  EXPECT_THAT(manager().Recover(), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(JobManagerTest, RecoveredRunningJobKeepsRunningWhenItsAgentsReturn) {
  UseFileStore();
  AddTwoNodes();
  const std::string id = RunJob(SpecWithRestarts(2));
  // One restart first, so the recovered generation is not 0.
  ASSERT_THAT(Exited(*a_, id, 0, 1, 1), IsOk());
  ASSERT_THAT(Started(*a_, id, 1, {0, 1}), IsOk());
  ASSERT_THAT(Started(*b_, id, 1, {2, 3}), IsOk());
  const v1::Job before = Job(id);
  ASSERT_EQ(before.state(), v1::JOB_STATE_RUNNING);
  ASSERT_EQ(before.generation(), 1);

  RestartCoordinator();

  const v1::Job after = Job(id);
  EXPECT_EQ(after.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(after.generation(), 1);
  EXPECT_EQ(after.restarts(), 1);
  EXPECT_THAT(after.nodes(), ElementsAre("node-a", "node-b"));
  EXPECT_EQ(after.events_size(), before.events_size());
  EXPECT_EQ(after.root_cause().rank(), 1);
  absl::StatusOr<v1::ListJobsResponse> listed = manager().ListJobs({});
  ASSERT_THAT(listed, IsOk());
  ASSERT_THAT(listed->jobs(), SizeIs(1));
  EXPECT_EQ(listed->jobs(0).id(), id);
  std::vector<std::string> names;
  for (const v1::Node& node : manager().ListNodes()) names.push_back(node.name());
  EXPECT_THAT(names, ElementsAre("node-a", "node-b"));

  absl::StatusOr<JobInfo> info = coordination_->GetJob(id);
  ASSERT_THAT(info, IsOk());
  EXPECT_EQ(info->generation, 1);
  EXPECT_EQ(info->layout.world_size, 4);

  // The old sessions died with the old coordinator; the agents come back and
  // list what they run.
  EXPECT_THAT(Heartbeat(*a_), ::testing::Not(IsOk()));
  ASSERT_THAT(Register(*a_, {Worker(id, 1, 0), Worker(id, 1, 1)}), IsOk());
  ASSERT_THAT(Register(*b_, {Worker(id, 1, 2), Worker(id, 1, 3)}), IsOk());
  ASSERT_THAT(Watch(*a_), IsOk());
  ASSERT_THAT(Watch(*b_), IsOk());
  EXPECT_THAT(OrdersWith(a_->orders->messages(), kKill), IsEmpty());
  EXPECT_THAT(OrdersWith(b_->orders->messages(), kKill), IsEmpty());

  // Past the reconnect window, with heartbeats: nothing is unaccounted.
  AdvanceWithHeartbeats(kHeartbeatTimeout + absl::Seconds(5), {a_, b_});
  EXPECT_EQ(StateOf(id), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Job(id).generation(), 1);

  for (int rank = 0; rank < 4; ++rank) {
    ASSERT_THAT(Exited(rank < 2 ? *a_ : *b_, id, 1, rank, 0), IsOk());
  }
  EXPECT_EQ(StateOf(id), v1::JOB_STATE_SUCCEEDED);
  EXPECT_THAT(coordination_->GetJob(id), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(JobManagerTest, RecoveredJobAcceptsExitsReSentAfterReconnect) {
  UseFileStore();
  AddTwoNodes();
  const std::string id = RunJob();
  RestartCoordinator();

  // node-a's workers finished while the coordinator was down: it lists
  // nothing and re-sends their exits.
  ASSERT_THAT(Register(*a_), IsOk());
  ASSERT_THAT(Register(*b_, {Worker(id, 0, 2), Worker(id, 0, 3)}), IsOk());
  ASSERT_THAT(Exited(*a_, id, 0, 0, 0), IsOk());
  ASSERT_THAT(Exited(*a_, id, 0, 1, 0), IsOk());
  AdvanceWithHeartbeats(kHeartbeatTimeout + absl::Seconds(5), {a_, b_});
  EXPECT_EQ(StateOf(id), v1::JOB_STATE_RUNNING);
  ASSERT_THAT(Exited(*b_, id, 0, 2, 0), IsOk());
  ASSERT_THAT(Exited(*b_, id, 0, 3, 0), IsOk());
  EXPECT_EQ(StateOf(id), v1::JOB_STATE_SUCCEEDED);
}

// The coordinator died right after acknowledging a submit: node-a got its
// LAUNCH and runs its ranks, node-b's LAUNCH was lost with the process. The
// recovered SCHEDULED job sends node-b its LAUNCH again when node-b watches,
// and runs; nothing is declared gone.
TEST_F(JobManagerTest, RecoveredScheduledJobRelaunchesRanksWhoseLaunchWasLost) {
  UseFileStore();
  AddTwoNodes();
  const std::string id = Submit(SpecWithRestarts(0));
  ASSERT_EQ(StateOf(id), v1::JOB_STATE_SCHEDULED);
  RestartCoordinator();
  ASSERT_EQ(StateOf(id), v1::JOB_STATE_SCHEDULED);

  ASSERT_THAT(Register(*a_, {Worker(id, 0, 0), Worker(id, 0, 1)}), IsOk());
  ASSERT_THAT(Watch(*a_), IsOk());
  ASSERT_THAT(Register(*b_), IsOk());
  ASSERT_THAT(Watch(*b_), IsOk());
  // node-a runs its ranks already: no order. node-b: its LAUNCH, again.
  EXPECT_THAT(ActionsOf(a_->orders->messages()), IsEmpty());
  ASSERT_THAT(ActionsOf(b_->orders->messages()), ElementsAre(Pair(kLaunch, 0)));
  std::vector<int> ranks;
  for (const auto& rank : b_->orders->messages().back().ranks()) ranks.push_back(rank.rank());
  EXPECT_THAT(ranks, ElementsAre(2, 3));

  AdvanceWithHeartbeats(kHeartbeatTimeout + absl::Seconds(5), {a_, b_});
  EXPECT_EQ(StateOf(id), v1::JOB_STATE_SCHEDULED);
  ASSERT_THAT(Started(*b_, id, 0, {2, 3}), IsOk());
  EXPECT_EQ(StateOf(id), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Job(id).generation(), 0);
}

TEST_F(JobManagerTest, RecoveredJobFailsWhenAnAgentNeverReturns) {
  UseFileStore();
  AddTwoNodes();
  const std::string id = RunJob(SpecWithRestarts(0));
  RestartCoordinator();

  ASSERT_THAT(Register(*a_, {Worker(id, 0, 0), Worker(id, 0, 1)}), IsOk());
  ASSERT_THAT(Watch(*a_), IsOk());
  // Recovered nodes count as READY while their agents may still reconnect:
  // for the recovery grace plus one heartbeat timeout, so that agents slow
  // to reconnect after a restart fail nothing.
  EXPECT_EQ(NodeInfo("node-b").state(), v1::NODE_STATE_READY);
  AdvanceWithHeartbeats(kRecoveryGrace + kHeartbeatTimeout - absl::Seconds(1), {a_});
  EXPECT_EQ(StateOf(id), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(NodeInfo("node-b").state(), v1::NODE_STATE_READY);

  AdvanceWithHeartbeats(absl::Seconds(2), {a_});
  const v1::Job job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(job.root_cause().node(), "node-b");
  EXPECT_THAT(job.root_cause().message(), HasSubstr("node-b"));
  EXPECT_EQ(NodeInfo("node-b").state(), v1::NODE_STATE_LOST);
  EXPECT_EQ(ActionsOf(a_->orders->messages()).back(), std::make_pair(kKill, int64_t{0}));
}

// Each rank has its own window to be accounted for after its node registers
// again without it: node-b re-registering later gets its own full window, not
// what is left of node-a's.
TEST_F(JobManagerTest, UnaccountedRanksEachGetTheirOwnWindow) {
  AddTwoNodes();
  const std::string id = RunJob(SpecWithRestarts(0));
  // node-a's agent reconnects without rank 1 (its exit report is on its way).
  ASSERT_THAT(Register(*a_, {Worker(id, 0, 0)}), IsOk());
  ASSERT_THAT(Watch(*a_), IsOk());
  AdvanceWithHeartbeats(kHeartbeatTimeout / 2, {a_, b_});
  // node-b's reconnects later without rank 3; rank 1's report arrives.
  ASSERT_THAT(Register(*b_, {Worker(id, 0, 2)}), IsOk());
  ASSERT_THAT(Watch(*b_), IsOk());
  ASSERT_THAT(Exited(*a_, id, 0, 1, 0), IsOk());
  // Past node-a's window, inside node-b's: nothing is judged yet.
  AdvanceWithHeartbeats(kHeartbeatTimeout / 2 + absl::Seconds(1), {a_, b_});
  EXPECT_EQ(StateOf(id), v1::JOB_STATE_RUNNING);
  // Rank 3 never shows up: its own window ends, and the job fails naming it.
  AdvanceWithHeartbeats(kHeartbeatTimeout / 2, {a_, b_});
  const v1::Job job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(job.root_cause().rank(), 3);
}

// A KILL for a node that registered but has not opened its order stream yet
// is delivered when the stream opens.
TEST_F(JobManagerTest, KillIsDeliveredWhenTheStreamOpensLater) {
  AddTwoNodes();
  const std::string id = RunJob();
  manager().UnwatchAssignments(b_->watch);
  ASSERT_THAT(manager().Cancel(id, "stop"), IsOk());
  ASSERT_THAT(Watch(*b_), IsOk());
  EXPECT_THAT(ActionsOf(b_->orders->messages()), ElementsAre(Pair(kKill, 0)));
}

TEST_F(JobManagerTest, RecoveredPendingJobIsScheduledWhenNodesRegister) {
  UseFileStore();
  const std::string id = Submit(Spec());
  RestartCoordinator();
  EXPECT_EQ(StateOf(id), v1::JOB_STATE_PENDING);
  AddTwoNodes();
  EXPECT_EQ(StateOf(id), v1::JOB_STATE_SCHEDULED);
  EXPECT_THAT(OrdersWith(a_->orders->messages(), kLaunch), SizeIs(1));
  // New ids never reuse the recovered one.
  EXPECT_NE(Submit(Spec()), id);
}

TEST_F(JobManagerTest, RecoveredNodesTakeNoNewJobsUntilTheyRegister) {
  UseFileStore();
  AddTwoNodes();
  RestartCoordinator();
  const std::string id = Submit(Spec(/*nodes=*/1, /*nproc=*/2));
  EXPECT_EQ(StateOf(id), v1::JOB_STATE_PENDING);
  ASSERT_THAT(Register(*b_), IsOk());
  ASSERT_THAT(Watch(*b_), IsOk());
  const v1::Job job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_THAT(job.nodes(), ElementsAre("node-b"));
}

TEST_F(JobManagerTest, RecoverReportsAnUndecodableJobAndLoadsTheOthers) {
  UseFileStore();
  const std::string good = Submit(Spec());
  NewJob bad;
  bad.name = "bad";
  bad.state = "RUNNING";
  bad.spec = std::string("\x0a\xff\xff", 3);  // A truncated JobSpec.
  absl::StatusOr<CreateJobResult> created = store_->CreateJob(bad);
  ASSERT_THAT(created, IsOk());
  const std::string bad_id = created->job.id;

  RestartCoordinator(/*recover=*/false);
  EXPECT_THAT(manager().Recover(), StatusIs(absl::StatusCode::kDataLoss, HasSubstr(bad_id)));
  EXPECT_EQ(StateOf(good), v1::JOB_STATE_PENDING);
  EXPECT_THAT(manager().GetJob(bad_id), StatusIs(absl::StatusCode::kNotFound));
}

// ---- Deadline --------------------------------------------------------------------------

TEST_F(JobManagerTest, DeadlineFailsAPendingJob) {
  v1::JobSpec spec = Spec();
  spec.set_deadline_seconds(60);
  const std::string id = Submit(spec);
  clock_.Advance(absl::Seconds(59));
  manager().Tick();
  EXPECT_EQ(StateOf(id), v1::JOB_STATE_PENDING);
  clock_.Advance(absl::Seconds(2));
  manager().Tick();
  const v1::Job job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(job.root_cause().rank(), -1);
  EXPECT_THAT(job.root_cause().message(), HasSubstr("deadline"));
}

TEST_F(JobManagerTest, DeadlineFailsARunningJobAndKillsIt) {
  AddTwoNodes();
  v1::JobSpec spec = SpecWithRestarts(3);
  spec.set_deadline_seconds(60);
  const std::string id = RunJob(spec);
  AdvanceWithHeartbeats(absl::Seconds(61), {a_, b_});

  const v1::Job job = Job(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(job.restarts(), 0);
  EXPECT_THAT(job.root_cause().message(), HasSubstr("deadline"));
  for (const Agent* agent : {a_, b_}) {
    EXPECT_THAT(ActionsOf(agent->orders->messages()),
                ElementsAre(Pair(kLaunch, 0), Pair(kKill, 0)));
  }
  EXPECT_THAT(coordination_->GetJob(id), StatusIs(absl::StatusCode::kNotFound));
}

// ---- Logs relay ------------------------------------------------------------------------

class JobManagerLogsTest : public JobManagerTest {
 protected:
  void SetUp() override {
    JobManagerTest::SetUp();
    AddTwoNodes();
    job_ = RunJob();
  }

  v1::GetLogsRequest Request(const std::vector<int>& ranks, int tail = 10, bool follow = true) {
    v1::GetLogsRequest request;
    request.set_job_id(job_);
    for (int rank : ranks) request.add_ranks(rank);
    request.set_generation(-1);
    request.set_tail(tail);
    request.set_follow(follow);
    return request;
  }

  // The agent's one UPLOAD_LOGS order (a failure when there is not exactly one).
  v1::Assignment UploadOrder(const Agent& agent) {
    const std::vector<v1::Assignment> orders = OrdersWith(agent.orders->messages(), kUploadLogs);
    EXPECT_THAT(orders, SizeIs(1)) << agent.name;
    return orders.empty() ? v1::Assignment() : orders.back();
  }

  absl::StatusOr<uint64_t> Attach(const Agent& agent, const std::string& request_id,
                                  UploadControl* control) {
    return manager().AttachUpload(agent.name, agent.session, request_id, control);
  }

  std::string job_;
};

TEST_F(JobManagerLogsTest, RelaysChunksFromEveryNodeAndEndsAfterEveryEof) {
  ChunkSink* sink = Keep<ChunkSink>();
  ASSERT_THAT(manager().StartLogs(Request({1, 2}, /*tail=*/10, /*follow=*/true), sink), IsOk());

  const v1::Assignment order_a = UploadOrder(*a_);
  const v1::Assignment order_b = UploadOrder(*b_);
  for (const v1::Assignment* order : {&order_a, &order_b}) {
    EXPECT_EQ(order->job_id(), job_);
    EXPECT_EQ(order->generation(), 0);
    EXPECT_FALSE(order->log_request_id().empty());
    EXPECT_EQ(order->log_tail(), 10);
    EXPECT_TRUE(order->log_follow());
  }
  EXPECT_THAT(order_a.log_ranks(), ElementsAre(1));
  EXPECT_THAT(order_b.log_ranks(), ElementsAre(2));

  FakeUploadControl& control_a = *Keep<FakeUploadControl>();
  FakeUploadControl& control_b = *Keep<FakeUploadControl>();
  absl::StatusOr<uint64_t> up_a = Attach(*a_, order_a.log_request_id(), &control_a);
  absl::StatusOr<uint64_t> up_b = Attach(*b_, order_b.log_request_id(), &control_b);
  ASSERT_THAT(up_a, IsOk());
  ASSERT_THAT(up_b, IsOk());

  ASSERT_THAT(manager().UploadChunk(*up_a, Chunk(1, "step 1\n")), IsOk());
  ASSERT_THAT(manager().UploadChunk(*up_b, Chunk(2, "step 1 on b\n")), IsOk());
  ASSERT_THAT(manager().UploadChunk(*up_a, Chunk(1, "step 2\n", /*eof=*/true)), IsOk());
  EXPECT_FALSE(sink->ended());
  ASSERT_THAT(manager().UploadChunk(*up_b, Chunk(2, "", /*eof=*/true)), IsOk());

  std::vector<std::pair<int, std::string>> got;
  for (const v1::LogChunk& chunk : sink->messages()) got.emplace_back(chunk.rank(), chunk.data());
  EXPECT_THAT(got, ElementsAre(Pair(1, "step 1\n"), Pair(2, "step 1 on b\n"), Pair(1, "step 2\n"),
                               Pair(2, "")));
  ASSERT_TRUE(sink->ended());
  EXPECT_THAT(sink->status(), IsOk());

  manager().UploadEnded(*up_a, absl::OkStatus());
  manager().UploadEnded(*up_b, absl::OkStatus());
}

// Uploads that delivered every rank end by themselves: when the request ends
// OK, the manager aborts none of them (only early ends cut uploads short).
TEST_F(JobManagerLogsTest, FinishedUploadsAreNotAbortedWhenTheRequestEndsOk) {
  ChunkSink* sink = Keep<ChunkSink>();
  ASSERT_THAT(manager().StartLogs(Request({1, 2}), sink), IsOk());
  FakeUploadControl& control_a = *Keep<FakeUploadControl>();
  FakeUploadControl& control_b = *Keep<FakeUploadControl>();
  absl::StatusOr<uint64_t> up_a = Attach(*a_, UploadOrder(*a_).log_request_id(), &control_a);
  absl::StatusOr<uint64_t> up_b = Attach(*b_, UploadOrder(*b_).log_request_id(), &control_b);
  ASSERT_THAT(up_a, IsOk());
  ASSERT_THAT(up_b, IsOk());
  ASSERT_THAT(manager().UploadChunk(*up_a, Chunk(1, "a\n", /*eof=*/true)), IsOk());
  ASSERT_THAT(manager().UploadChunk(*up_b, Chunk(2, "b\n", /*eof=*/true)), IsOk());
  ASSERT_TRUE(sink->ended());
  EXPECT_THAT(sink->status(), IsOk());

  EXPECT_EQ(control_a.aborts(), 0) << control_a.status();
  EXPECT_EQ(control_b.aborts(), 0) << control_b.status();
  manager().UploadEnded(*up_a, absl::OkStatus());
  manager().UploadEnded(*up_b, absl::OkStatus());
}

TEST_F(JobManagerLogsTest, NodeThatNeverAttachesEndsTheRequestUnavailable) {
  ChunkSink* sink = Keep<ChunkSink>();
  ASSERT_THAT(manager().StartLogs(Request({}), sink), IsOk());
  FakeUploadControl& control_a = *Keep<FakeUploadControl>();
  ASSERT_THAT(Attach(*a_, UploadOrder(*a_).log_request_id(), &control_a), IsOk());
  UploadOrder(*b_);  // Never attaches.

  clock_.Advance(kLogAttachTimeout - absl::Seconds(1));
  manager().Tick();
  EXPECT_FALSE(sink->ended());
  clock_.Advance(absl::Seconds(2));
  manager().Tick();
  ASSERT_TRUE(sink->ended());
  EXPECT_THAT(sink->status(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("node-b")));
}

TEST_F(JobManagerLogsTest, BrokenUploadEndsTheRequestUnavailable) {
  ChunkSink* sink = Keep<ChunkSink>();
  ASSERT_THAT(manager().StartLogs(Request({0}), sink), IsOk());
  EXPECT_THAT(OrdersWith(b_->orders->messages(), kUploadLogs), IsEmpty());
  FakeUploadControl& control = *Keep<FakeUploadControl>();
  absl::StatusOr<uint64_t> upload = Attach(*a_, UploadOrder(*a_).log_request_id(), &control);
  ASSERT_THAT(upload, IsOk());
  manager().UploadEnded(*upload, absl::UnavailableError("connection reset"));
  ASSERT_TRUE(sink->ended());
  EXPECT_THAT(sink->status(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("node-a")));
}

TEST_F(JobManagerLogsTest, CancelLogsAbortsTheUploads) {
  ChunkSink* sink = Keep<ChunkSink>();
  absl::StatusOr<uint64_t> handle = manager().StartLogs(Request({0}), sink);
  ASSERT_THAT(handle, IsOk());
  FakeUploadControl& control = *Keep<FakeUploadControl>();
  absl::StatusOr<uint64_t> upload = Attach(*a_, UploadOrder(*a_).log_request_id(), &control);
  ASSERT_THAT(upload, IsOk());
  ASSERT_THAT(manager().UploadChunk(*upload, Chunk(0, "hello\n")), IsOk());

  manager().CancelLogs(*handle);
  EXPECT_EQ(control.aborts(), 1);
  const size_t delivered = sink->messages().size();
  EXPECT_THAT(manager().UploadChunk(*upload, Chunk(0, "more\n")),
              StatusIs(absl::StatusCode::kCancelled));
  EXPECT_EQ(sink->messages().size(), delivered);
  manager().UploadEnded(*upload, absl::CancelledError("aborted"));
  EXPECT_EQ(control.aborts(), 1);
}

TEST_F(JobManagerLogsTest, AttachAndChunkErrors) {
  ChunkSink* sink = Keep<ChunkSink>();
  ASSERT_THAT(manager().StartLogs(Request({0}), sink), IsOk());
  const std::string request_id = UploadOrder(*a_).log_request_id();
  FakeUploadControl& control = *Keep<FakeUploadControl>();

  EXPECT_THAT(Attach(*a_, "no-such-request", &control), StatusIs(absl::StatusCode::kNotFound));
  // node-b holds no selected rank: it was not asked.
  EXPECT_THAT(Attach(*b_, request_id, &control), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(manager().AttachUpload("node-a", "stale", request_id, &control),
              StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT(manager().AttachUpload("ghost", "s", request_id, &control),
              StatusIs(absl::StatusCode::kNotFound));

  absl::StatusOr<uint64_t> upload = Attach(*a_, request_id, &control);
  ASSERT_THAT(upload, IsOk());
  EXPECT_THAT(manager().UploadChunk(*upload, Chunk(1, "not asked\n")),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(sink->messages(), IsEmpty());
}

TEST_F(JobManagerLogsTest, StartLogsRejectsBadRequests) {
  ChunkSink* sink = Keep<ChunkSink>();
  EXPECT_THAT(manager().StartLogs(Request({4}), sink),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(manager().StartLogs(Request({-1}), sink),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(manager().StartLogs(Request({0}, /*tail=*/-1), sink),
              StatusIs(absl::StatusCode::kInvalidArgument));
  v1::GetLogsRequest future = Request({0});
  future.set_generation(1);
  EXPECT_THAT(manager().StartLogs(future, sink), StatusIs(absl::StatusCode::kInvalidArgument));
  v1::GetLogsRequest below = Request({0});
  below.set_generation(-2);
  EXPECT_THAT(manager().StartLogs(below, sink), StatusIs(absl::StatusCode::kInvalidArgument));
  v1::GetLogsRequest unknown = Request({0});
  unknown.set_job_id("job-404");
  EXPECT_THAT(manager().StartLogs(unknown, sink), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_FALSE(sink->ended());
  EXPECT_THAT(OrdersWith(a_->orders->messages(), kUploadLogs), IsEmpty());
}

TEST_F(JobManagerLogsTest, StartLogsOfANeverPlacedJobIsFailedPrecondition) {
  const std::string pending = Submit(Spec());  // The nodes are busy.
  ASSERT_EQ(StateOf(pending), v1::JOB_STATE_PENDING);
  v1::GetLogsRequest request = Request({});
  request.set_job_id(pending);
  EXPECT_THAT(manager().StartLogs(request, Keep<ChunkSink>()),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(JobManagerLogsTest, StartLogsWhenAHoldingNodeIsNotConnectedIsUnavailable) {
  manager().UnwatchAssignments(b_->watch);
  EXPECT_THAT(manager().StartLogs(Request({3}), Keep<ChunkSink>()),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("node-b")));
  // Ranks held by a connected node still work.
  EXPECT_THAT(manager().StartLogs(Request({0}), Keep<ChunkSink>()), IsOk());
}

TEST_F(JobManagerLogsTest, LogsOfAFinishedJobStayReadable) {
  for (int rank = 0; rank < 4; ++rank) {
    ASSERT_THAT(Exited(rank < 2 ? *a_ : *b_, job_, 0, rank, 0), IsOk());
  }
  ASSERT_EQ(StateOf(job_), v1::JOB_STATE_SUCCEEDED);
  EXPECT_THAT(manager().StartLogs(Request({0}, 0, false), Keep<ChunkSink>()), IsOk());
  EXPECT_EQ(UploadOrder(*a_).generation(), 0);
}

// ---- Shutdown --------------------------------------------------------------------------

TEST_F(JobManagerTest, ShutdownEndsEveryStreamAndLaterCallsAreUnavailable) {
  AddTwoNodes();
  const std::string id = RunJob();
  StateSink* states = Keep<StateSink>();
  ASSERT_THAT(manager().WatchJobState(id, false, states), IsOk());
  ChunkSink* logs = Keep<ChunkSink>();
  v1::GetLogsRequest request;
  request.set_job_id(id);
  request.set_generation(-1);
  ASSERT_THAT(manager().StartLogs(request, logs), IsOk());
  JobWait wait;
  manager().WaitJob(id, absl::Seconds(30), wait.Done());

  manager().Shutdown();

  for (const auto* sink : {a_->orders, b_->orders}) {
    ASSERT_TRUE(sink->ended());
    EXPECT_THAT(sink->status(), StatusIs(absl::StatusCode::kUnavailable));
  }
  ASSERT_TRUE(states->ended());
  EXPECT_THAT(states->status(), StatusIs(absl::StatusCode::kUnavailable));
  ASSERT_TRUE(logs->ended());
  EXPECT_THAT(logs->status(), StatusIs(absl::StatusCode::kUnavailable));
  ASSERT_TRUE(wait.fired());
  EXPECT_THAT(wait.result(), StatusIs(absl::StatusCode::kUnavailable));

  EXPECT_THAT(manager().Submit(Spec()), StatusIs(absl::StatusCode::kUnavailable));
  Agent c;
  c.name = "node-c";
  c.address = "10.0.0.3";
  EXPECT_THAT(manager().RegisterNode(RegisterRequest(c)), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(manager().WatchAssignments(a_->name, a_->session, Keep<OrderSink>()),
              StatusIs(absl::StatusCode::kUnavailable));
  JobWait late;
  manager().WaitJob(id, absl::Seconds(30), late.Done());
  ASSERT_TRUE(late.fired());
  EXPECT_THAT(late.result(), StatusIs(absl::StatusCode::kUnavailable));

  manager().Shutdown();  // Idempotent.
  manager().Tick();
}

TEST_F(JobManagerTest, TickIntervalIsPositive) {
  EXPECT_GT(manager().TickInterval(), absl::ZeroDuration());
}

}  // namespace job_manager_test
}  // namespace mesh::coordinator
