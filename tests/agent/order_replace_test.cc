// OrderApplier's replace orders (Assignment.replace, agent/order_replace.cc)
// against a FakeLauncher that never forks, a ReportOutbox over a NodeClient
// that records the reports, and fake cgroups: a rank whose process exited
// is started again inside its running generation, and every other replace
// is a no-op.
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/agent_config.h"
#include "agent/agent_metrics.h"
#include "agent/cgroup.h"
#include "agent/job_isolation.h"
#include "agent/node_client.h"
#include "agent/order_applier.h"
#include "agent/report_outbox.h"
#include "tests/agent/fake_launcher.h"
#include "tests/common/test_metrics.h"
#include "tests/util/proc.h"

namespace mesh::agent {

using testing::EnvValue;
namespace order_replace_test {

using ::mesh::agent::testing::FakeLauncher;
using ::mesh::testing::WaitUntil;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::SizeIs;

constexpr absl::Duration kTimeout = absl::Seconds(10);

// Records the reports the outbox sends; the outbox sends nothing else.
class RecordingNodeClient final : public NodeClient {
 public:
  std::vector<v1::ReportWorkersStartedRequest> started() const {
    absl::MutexLock lock(&mu_);
    return started_;
  }
  std::vector<v1::ReportWorkerExitRequest> exits() const {
    absl::MutexLock lock(&mu_);
    return exits_;
  }

  absl::StatusOr<v1::RegisterNodeResponse> RegisterNode(const v1::RegisterNodeRequest&,
                                                        absl::Duration) override {
    return absl::UnimplementedError("not in this test");
  }
  absl::StatusOr<v1::NodeHeartbeatResponse> NodeHeartbeat(const v1::NodeHeartbeatRequest&,
                                                          absl::Duration) override {
    return absl::UnimplementedError("not in this test");
  }
  absl::Status ReportWorkersStarted(const v1::ReportWorkersStartedRequest& request,
                                    absl::Duration) override {
    absl::MutexLock lock(&mu_);
    started_.push_back(request);
    return absl::OkStatus();
  }
  absl::Status ReportWorkerExit(const v1::ReportWorkerExitRequest& request,
                                absl::Duration) override {
    absl::MutexLock lock(&mu_);
    exits_.push_back(request);
    return absl::OkStatus();
  }
  std::unique_ptr<AssignmentStream> WatchAssignments(const v1::WatchAssignmentsRequest&) override {
    return nullptr;
  }
  std::unique_ptr<LogUploadStream> UploadLogs(absl::Duration) override { return nullptr; }
  void CancelAll() override {}

 private:
  mutable absl::Mutex mu_;
  std::vector<v1::ReportWorkersStartedRequest> started_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::ReportWorkerExitRequest> exits_ ABSL_GUARDED_BY(mu_);
};

// Cgroups in memory: each generation's rank cgroups made (in order) and
// the OOM kill count of each rank, which the test sets.
struct CgroupRecord {
  absl::Mutex mu;
  std::vector<int> ranks_made ABSL_GUARDED_BY(mu);
  std::vector<int> ranks_killed ABSL_GUARDED_BY(mu);
  std::map<int, int64_t> oom_kills ABSL_GUARDED_BY(mu);
};

class FakeGenerationCgroup final : public GenerationCgroup {
 public:
  FakeGenerationCgroup(std::shared_ptr<CgroupRecord> record, std::string dir)
      : record_(std::move(record)), dir_(std::move(dir)) {}

  absl::StatusOr<std::vector<std::string>> CreateRank(int rank, const CgroupLimits&) override {
    absl::MutexLock lock(&record_->mu);
    record_->ranks_made.push_back(rank);
    return std::vector<std::string>{absl::StrCat(dir_, "/rank-", rank)};
  }
  absl::StatusOr<int> KillAll(absl::Duration) override { return 0; }
  absl::StatusOr<int> KillRank(int rank, absl::Duration) override {
    absl::MutexLock lock(&record_->mu);
    record_->ranks_killed.push_back(rank);
    return 0;
  }
  bool Empty() const override { return true; }
  int64_t OomKills(int rank) const override {
    absl::MutexLock lock(&record_->mu);
    auto it = record_->oom_kills.find(rank);
    return it == record_->oom_kills.end() ? 0 : it->second;
  }
  CgroupUsage Usage() const override { return {}; }
  absl::Status Remove() override { return absl::OkStatus(); }

 private:
  const std::shared_ptr<CgroupRecord> record_;
  const std::string dir_;
};

class FakeCgroupManager final : public CgroupManager {
 public:
  CgroupVersion version() const override { return CgroupVersion::kV2; }
  CgroupCapabilities capabilities() const override {
    CgroupCapabilities can;
    can.kill = can.memory_limit = can.pids_limit = true;
    return can;
  }
  std::string Describe() const override { return "fake cgroups"; }
  absl::StatusOr<std::unique_ptr<GenerationCgroup>> CreateGeneration(const std::string& job_id,
                                                                     int64_t generation,
                                                                     const DeviceRules&) override {
    return std::make_unique<FakeGenerationCgroup>(
        record_, absl::StrCat("/fake-cgroup/", job_id, "/gen-", generation));
  }
  CgroupRecord& record() { return *record_; }

 private:
  const std::shared_ptr<CgroupRecord> record_ = std::make_shared<CgroupRecord>();
};

v1::Assignment Launch(const std::string& job, int64_t generation, std::vector<int> ranks) {
  v1::Assignment order;
  order.set_action(v1::Assignment::ACTION_LAUNCH);
  order.set_job_id(job);
  order.set_generation(generation);
  order.add_command("/opt/train");
  order.set_world_size(*std::max_element(ranks.begin(), ranks.end()) + 1);
  order.set_local_world_size(static_cast<int32_t>(ranks.size()));
  order.set_num_nodes(1);
  order.set_worker_token("token-of-job");
  order.set_restart_count(2);
  order.set_max_restarts(5);
  order.set_memory_per_proc_bytes(int64_t{1} << 30);
  for (size_t i = 0; i < ranks.size(); ++i) {
    v1::RankLaunch* rank = order.add_ranks();
    rank->set_rank(ranks[i]);
    rank->set_local_rank(static_cast<int32_t>(i));
  }
  return order;
}

// `launch` again as a replace order for `ranks` of it (all when empty).
v1::Assignment Replace(const v1::Assignment& launch, std::vector<int> ranks = {}) {
  v1::Assignment order = launch;
  order.set_replace(true);
  order.set_reason("rank failed; in-place recovery");
  if (ranks.empty()) return order;
  order.clear_ranks();
  for (const v1::RankLaunch& r : launch.ranks()) {
    if (std::find(ranks.begin(), ranks.end(), r.rank()) != ranks.end()) *order.add_ranks() = r;
  }
  return order;
}

class OrderReplaceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    work_dir_ = ::mesh::testing::MakeTempDir("mesh-order-replace-test");
    config_.coordinator = "coordinator.invalid:7450";  // never dialled
    config_.name = "node-a";
    config_.work_dir = work_dir_;
    config_.grace = absl::Seconds(1);
    config_.rpc_timeout = absl::Seconds(2);
    config_.backoff_initial = absl::Milliseconds(10);
    config_.backoff_max = absl::Milliseconds(50);
    config_.base_env = {{"PATH", "/usr/bin:/bin"}};
    config_.worker_metrics_port_first = 9400;
    config_.worker_metrics_port_last = 9409;
    JobIsolationOptions options;
    options.run_as_owner = false;  // the workers run as the test
    absl::StatusOr<std::unique_ptr<JobIsolation>> isolation =
        JobIsolation::Create(options, &cgroups_);
    ASSERT_TRUE(isolation.ok()) << isolation.status();
    isolation_ = *std::move(isolation);
    outbox_ =
        std::make_unique<ReportOutbox>(&config_, &client_, [](uint64_t, const std::string&) {});
    outbox_->Start();
    outbox_->SessionUp(1, "session-1");
    applier_ = std::make_unique<OrderApplier>(&config_, &launcher_, outbox_.get(), &metrics_,
                                              /*strays=*/nullptr, isolation_.get());
  }
  void TearDown() override {
    if (applier_ != nullptr) applier_->Shutdown();
    applier_.reset();
    if (outbox_ != nullptr) outbox_->Stop();
    outbox_.reset();
    std::filesystem::remove_all(work_dir_);
  }

  void Apply(const v1::Assignment& order) { applier_->ApplyLaunch(order, absl::Now()); }

  // Waits until `n` started reports (exit reports) have been sent.
  bool WaitStarted(size_t n) {
    return WaitUntil([&] { return client_.started().size() >= n; }, kTimeout);
  }
  bool WaitExits(size_t n) {
    return WaitUntil([&] { return client_.exits().size() >= n; }, kTimeout);
  }

  // Applies a first LAUNCH and waits for its started report; pids by rank.
  std::map<int, pid_t> LaunchAndWait(const v1::Assignment& order) {
    const size_t before = client_.started().size();
    Apply(order);
    std::map<int, pid_t> pids;
    if (!WaitStarted(before + 1)) return pids;
    const v1::ReportWorkersStartedRequest report = client_.started()[before];
    for (const v1::RunningWorker& w : report.workers()) pids[w.rank()] = w.pid();
    return pids;
  }
  // Makes `pid` exit and waits for its exit report (the `n`th).
  void ExitAndWait(pid_t pid, size_t n, int code, int signal = 0) {
    launcher_.Exit(pid, code, signal);
    ASSERT_TRUE(WaitExits(n)) << "no exit report for pid " << pid;
  }
  // Reports go out in the order they were queued: once a later report is
  // sent, an earlier one would have been too. A fresh job's LAUNCH is such
  // a later report; the count of started reports before it.
  size_t StartedBeforeMarker() {
    Apply(Launch(absl::StrCat("marker-", ++markers_), 0, {9}));
    EXPECT_TRUE(WaitUntil(
        [&] {
          for (const auto& report : client_.started()) {
            if (report.job_id() == absl::StrCat("marker-", markers_)) return true;
          }
          return false;
        },
        kTimeout));
    return client_.started().size() - 1;
  }
  std::map<int, pid_t> Running(const std::string& job_id) const {
    std::map<int, pid_t> running;
    for (const v1::RunningWorker& w : applier_->RunningWorkers()) {
      if (w.job_id() == job_id) running[w.rank()] = static_cast<pid_t>(w.pid());
    }
    return running;
  }

  FakeLauncher launcher_;  // first: outlives what it launched for
  metrics::testing::TestRegistry registry_;
  AgentMetrics metrics_{registry_};
  RecordingNodeClient client_;
  FakeCgroupManager cgroups_;
  AgentConfig config_;
  std::string work_dir_;
  std::unique_ptr<JobIsolation> isolation_;
  std::unique_ptr<ReportOutbox> outbox_;
  std::unique_ptr<OrderApplier> applier_;
  int markers_ = 0;
};

TEST_F(OrderReplaceTest, AnExitedRankIsStartedAgainAndReportedLikeAFirstLaunch) {
  const v1::Assignment launch = Launch("job-1", 3, {0, 1});
  const std::map<int, pid_t> first = LaunchAndWait(launch);
  ASSERT_THAT(first, SizeIs(2));
  ExitAndWait(first.at(1), 1, /*code=*/1);
  EXPECT_EQ(Running("job-1"), (std::map<int, pid_t>{{0, first.at(0)}}));

  Apply(Replace(launch, {1}));
  ASSERT_TRUE(WaitStarted(2));
  const v1::ReportWorkersStartedRequest report = client_.started()[1];
  EXPECT_EQ(report.job_id(), "job-1");
  EXPECT_EQ(report.generation(), 3);
  ASSERT_THAT(report.workers(), SizeIs(1));
  const v1::RunningWorker& again = report.workers(0);
  EXPECT_EQ(again.rank(), 1);
  EXPECT_EQ(again.generation(), 3);
  const pid_t pid = static_cast<pid_t>(again.pid());
  EXPECT_NE(pid, first.at(0));
  EXPECT_NE(pid, first.at(1));
  EXPECT_EQ(launcher_.launched(), 3u);
  EXPECT_EQ(Running("job-1"), (std::map<int, pid_t>{{0, first.at(0)}, {1, pid}}));

  // Launched as the first time: the order's fields, the same log (added
  // to, not truncated), the rank's cgroup made again, a metrics port.
  const auto procs = launcher_.procs();
  const LaunchSpec& before = procs.at(first.at(1)).spec;
  const LaunchSpec& spec = procs.at(pid).spec;
  EXPECT_EQ(spec.argv, before.argv);
  EXPECT_EQ(spec.stdout_log, absl::StrCat(work_dir_, "/jobs/job-1/gen-3/rank-1.log"));
  EXPECT_EQ(spec.stdout_log, before.stdout_log);
  EXPECT_FALSE(before.append_log);
  EXPECT_TRUE(spec.append_log);
  EXPECT_EQ(spec.max_log_bytes, before.max_log_bytes);
  EXPECT_THAT(spec.cgroup_dirs, ElementsAre("/fake-cgroup/job-1/gen-3/rank-1"));
  {
    absl::MutexLock lock(&cgroups_.record().mu);
    EXPECT_THAT(cgroups_.record().ranks_made, ElementsAre(0, 1, 1));
    // What the earlier process left in the rank's cgroup is killed first.
    EXPECT_THAT(cgroups_.record().ranks_killed, ElementsAre(1));
  }
  EXPECT_EQ(EnvValue(spec, "MESH_RANK"), "1");
  EXPECT_EQ(EnvValue(spec, "MESH_GENERATION"), "3");
  EXPECT_EQ(EnvValue(spec, "MESH_JOB_ID"), "job-1");
  EXPECT_EQ(EnvValue(spec, "MESH_TOKEN"), "token-of-job");
  EXPECT_EQ(EnvValue(spec, "TORCHELASTIC_RESTART_COUNT"), "2");
  EXPECT_NE(again.metrics_port(), 0);
  EXPECT_EQ(EnvValue(spec, "MESH_METRICS_PORT"), absl::StrCat(again.metrics_port()));
  // Every other variable is the first process's.
  std::vector<std::string> env_before = before.env;
  std::vector<std::string> env_now = spec.env;
  auto drop_port = [](std::vector<std::string>& env) {
    env.erase(
        std::remove_if(env.begin(), env.end(),
                       [](const std::string& e) { return e.rfind("MESH_METRICS_PORT=", 0) == 0; }),
        env.end());
  };
  drop_port(env_before);
  drop_port(env_now);
  EXPECT_EQ(env_now, env_before);

  EXPECT_EQ(registry_.CounterValue("mesh_agent_launches_total"), 3);
  // Generation 3's two ranks, and the replacement.
  EXPECT_EQ(registry_.CounterValue("mesh_agent_restarts_total"), 3);
  EXPECT_EQ(registry_.GaugeValue("mesh_agent_workers", {"running"}), 2);

  // Its exit is reported as usual.
  ExitAndWait(pid, 2, 0, SIGSEGV);
  const v1::ReportWorkerExitRequest exit = client_.exits()[1];
  EXPECT_EQ(exit.job_id(), "job-1");
  EXPECT_EQ(exit.generation(), 3);
  EXPECT_EQ(exit.rank(), 1);
  EXPECT_EQ(exit.signal(), SIGSEGV);
  EXPECT_EQ(Running("job-1"), (std::map<int, pid_t>{{0, first.at(0)}}));
  EXPECT_EQ(registry_.GaugeValue("mesh_agent_workers", {"running"}), 1);
}

TEST_F(OrderReplaceTest, AReplaceForARankStillRunningOrADuplicateIsANoOp) {
  const v1::Assignment launch = Launch("job-1", 0, {0, 1});
  const std::map<int, pid_t> first = LaunchAndWait(launch);
  ASSERT_THAT(first, SizeIs(2));

  // Neither rank has exited.
  Apply(Replace(launch));
  EXPECT_EQ(launcher_.launched(), 2u);

  ExitAndWait(first.at(1), 1, 1);
  Apply(Replace(launch));  // both listed: rank 0 still runs, rank 1 starts
  ASSERT_TRUE(WaitStarted(2));
  ASSERT_THAT(client_.started()[1].workers(), SizeIs(1));
  const pid_t pid = static_cast<pid_t>(client_.started()[1].workers(0).pid());
  EXPECT_EQ(launcher_.launched(), 3u);

  // The same order again, replayed or sent twice: the replacement runs.
  Apply(Replace(launch, {1}));
  Apply(Replace(launch));
  EXPECT_EQ(launcher_.launched(), 3u);
  EXPECT_EQ(StartedBeforeMarker(), 2u);  // no started report for them
  EXPECT_EQ(Running("job-1"), (std::map<int, pid_t>{{0, first.at(0)}, {1, pid}}));
  EXPECT_EQ(launcher_.events().size(), 4u);  // 4 launches, nothing terminated
}

TEST_F(OrderReplaceTest, AReplaceForAnotherGenerationOrAStoppedOneIsANoOp) {
  const v1::Assignment gen0 = Launch("job-1", 0, {0});
  const std::map<int, pid_t> first = LaunchAndWait(gen0);
  ExitAndWait(first.at(0), 1, 1);
  // A restart to generation 1: generation 0 is older from now on.
  const v1::Assignment gen1 = Launch("job-1", 1, {0});
  const std::map<int, pid_t> second = LaunchAndWait(gen1);
  ExitAndWait(second.at(0), 2, 1);
  Apply(Replace(gen0));
  EXPECT_EQ(launcher_.launched(), 2u);

  // A newer generation: a replace is not a launch of it ...
  const v1::Assignment gen4 = Launch("job-1", 4, {0});
  Apply(Replace(gen4));
  EXPECT_EQ(launcher_.launched(), 2u);
  // ... and never launched, it can still be launched by a LAUNCH.
  EXPECT_THAT(applier_->GenerationRanks("job-1", 4), IsEmpty());

  // A job or generation this node never ran.
  Apply(Replace(Launch("job-never", 0, {0})));
  Apply(Replace(Launch("job-1", 2, {0})));
  EXPECT_EQ(launcher_.launched(), 2u);
  EXPECT_THAT(applier_->GenerationRanks("job-never", 0), IsEmpty());

  // A generation stopped by KILL, before and after it is collected.
  v1::Assignment kill;
  kill.set_action(v1::Assignment::ACTION_KILL);
  kill.set_job_id("job-1");
  kill.set_generation(1);
  applier_->ApplyKill(kill);
  Apply(Replace(gen1));
  applier_->CollectFinishedGenerations();
  Apply(Replace(gen1));
  EXPECT_EQ(launcher_.launched(), 2u);
  EXPECT_EQ(StartedBeforeMarker(), 2u);

  // The replace of generation 4 did not count as launching it.
  EXPECT_THAT(LaunchAndWait(gen4), SizeIs(1));
  EXPECT_EQ(launcher_.launched(), 4u);  // marker, then generation 4
}

TEST_F(OrderReplaceTest, TheEarlierExitLeavesTheReSentRecordsOnceTheRankStartsAgain) {
  const v1::Assignment launch = Launch("job-1", 0, {0, 1});
  const std::map<int, pid_t> first = LaunchAndWait(launch);
  ExitAndWait(first.at(0), 1, 7);
  ExitAndWait(first.at(1), 2, 1);
  // Kept for a coordinator that restarts (Agent::OnSessionUp sends
  // ExitRecords again with each new session).
  std::vector<v1::ReportWorkerExitRequest> records = applier_->ExitRecords();
  ASSERT_THAT(records, SizeIs(2));

  Apply(Replace(launch, {1}));
  ASSERT_TRUE(WaitStarted(2));
  // Rank 1's old exit would fail its new process if sent again; rank 0's
  // stays.
  records = applier_->ExitRecords();
  ASSERT_THAT(records, SizeIs(1));
  EXPECT_EQ(records[0].rank(), 0);
  EXPECT_EQ(records[0].exit_code(), 7);

  // The new process's own exit is kept as any other.
  const pid_t pid = static_cast<pid_t>(client_.started()[1].workers(0).pid());
  ExitAndWait(pid, 3, 3);
  records = applier_->ExitRecords();
  ASSERT_THAT(records, SizeIs(2));
  EXPECT_EQ(records[1].rank(), 1);
  EXPECT_EQ(records[1].exit_code(), 3);
}

TEST_F(OrderReplaceTest, AnOomKillOfTheEarlierProcessIsNotTheReplacements) {
  const v1::Assignment launch = Launch("job-1", 0, {0});
  const std::map<int, pid_t> first = LaunchAndWait(launch);
  {
    absl::MutexLock lock(&cgroups_.record().mu);
    cgroups_.record().oom_kills[0] = 1;
  }
  ExitAndWait(first.at(0), 1, 0, SIGKILL);
  EXPECT_TRUE(client_.exits()[0].oom_killed());

  Apply(Replace(launch));
  ASSERT_TRUE(WaitStarted(2));
  const pid_t pid = static_cast<pid_t>(client_.started()[1].workers(0).pid());
  ExitAndWait(pid, 2, 0, SIGKILL);  // killed, but not by the kernel for memory
  EXPECT_FALSE(client_.exits()[1].oom_killed());
}

TEST_F(OrderReplaceTest, KillAndShutdownStopTheReplacement) {
  const v1::Assignment launch = Launch("job-1", 0, {0, 1});
  const std::map<int, pid_t> first = LaunchAndWait(launch);
  ExitAndWait(first.at(1), 1, 1);
  Apply(Replace(launch, {1}));
  ASSERT_TRUE(WaitStarted(2));
  const pid_t pid = static_cast<pid_t>(client_.started()[1].workers(0).pid());

  v1::Assignment kill;
  kill.set_action(v1::Assignment::ACTION_KILL);
  kill.set_job_id("job-1");
  kill.set_generation(0);
  kill.set_grace_period_seconds(2);
  applier_->ApplyKill(kill);
  const auto procs = launcher_.procs();
  ASSERT_TRUE(procs.at(pid).terminated.has_value());
  EXPECT_EQ(*procs.at(pid).terminated, absl::Seconds(2));
  EXPECT_TRUE(procs.at(first.at(0)).terminated.has_value());
  EXPECT_TRUE(WaitUntil([&] { return applier_->RunningWorkers().empty(); }, kTimeout));
  // Exits the agent caused are not reported.
  EXPECT_EQ(StartedBeforeMarker(), 2u);
  EXPECT_THAT(client_.exits(), SizeIs(1));
}

TEST_F(OrderReplaceTest, ARankThatCannotStartAgainIsALaunchErrorForItAlone) {
  const v1::Assignment launch = Launch("job-1", 0, {0, 1});
  const std::map<int, pid_t> first = LaunchAndWait(launch);
  ExitAndWait(first.at(1), 1, 1);
  launcher_.FailLaunches(absl::NotFoundError("cannot execute '/opt/train': not found"));
  Apply(Replace(launch));
  ASSERT_TRUE(WaitExits(2));
  const v1::ReportWorkerExitRequest exit = client_.exits()[1];
  EXPECT_EQ(exit.rank(), 1);
  EXPECT_THAT(exit.launch_error(), ::testing::HasSubstr("rank 1: cannot execute '/opt/train'"));
  // Rank 0 runs on; rank 1 stays exited, its launch error the record kept.
  EXPECT_EQ(Running("job-1"), (std::map<int, pid_t>{{0, first.at(0)}}));
  const std::vector<v1::ReportWorkerExitRequest> records = applier_->ExitRecords();
  ASSERT_THAT(records, SizeIs(1));
  EXPECT_EQ(records[0].rank(), 1);
  EXPECT_FALSE(records[0].launch_error().empty());
  EXPECT_FALSE(applier_->RankFinished("job-1", 0, 0));
  EXPECT_TRUE(applier_->RankFinished("job-1", 0, 1));
  EXPECT_EQ(client_.started().size(), 1u);
}

}  // namespace order_replace_test
}  // namespace mesh::agent
