// meshctl's job commands run in-process against FakeJobService on
// 127.0.0.1:0: what they send, what they print, and how they exit.
#include <stdlib.h>

#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "cli/admin_client.h"
#include "cli/job_client.h"
#include "cli/job_json.h"
#include "cli/meshctl.h"
#include "tests/cli/fake_job_service.h"
#include "tests/cli/run_meshctl.h"

namespace mesh::cli {
namespace job_commands_test {

using ::mesh::cli::testing::FakeJobServer;
using ::mesh::cli::testing::LogScript;
using ::mesh::v1::Job;
using ::mesh::v1::JobState;
using ::mesh::v1::LogChunk;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

Job MakeJob(const std::string& id, JobState state, int64_t generation = 0) {
  Job job;
  job.set_id(id);
  job.set_state(state);
  job.set_generation(generation);
  job.set_restarts(static_cast<int32_t>(generation));
  job.mutable_spec()->set_name("train");
  job.mutable_spec()->add_command("python");
  job.mutable_spec()->add_command("train.py");
  job.mutable_spec()->set_nproc_per_node(4);
  job.mutable_spec()->set_max_restarts(2);
  job.mutable_spec()->mutable_nodes()->set_min(2);
  job.mutable_spec()->mutable_nodes()->set_max(2);
  job.mutable_spec()->add_mesh_shape(2);
  job.mutable_spec()->add_mesh_shape(4);
  job.mutable_spec()->add_mesh_dim_names("dp");
  job.mutable_spec()->add_mesh_dim_names("tp");
  (*job.mutable_spec()->mutable_labels())["team"] = "research";
  job.set_create_time_unix_ms(1700000000000);
  job.set_update_time_unix_ms(1700000000500);
  if (state != mesh::v1::JOB_STATE_PENDING) {
    job.add_nodes("node-a");
    job.add_nodes("node-b");
  }
  return job;
}

LogChunk Chunk(int32_t rank, const std::string& data, int64_t offset = 0, bool eof = false,
               int64_t generation = 0) {
  LogChunk chunk;
  chunk.set_rank(rank);
  chunk.set_generation(generation);
  chunk.set_stream(LogChunk::STREAM_STDOUT);
  chunk.set_data(data);
  chunk.set_offset(offset);
  chunk.set_eof(eof);
  return chunk;
}

class JobCommandsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    unsetenv("MESH_COORDINATOR");
    ASSERT_TRUE(server_.ok());
  }

  // meshctl --coordinator <fake> --timeout 5 ARGS...
  Result Run(std::vector<std::string> args) {
    args.insert(args.begin(), {"--coordinator", server_.address(), "--timeout", "5"});
    return Meshctl(std::move(args));
  }

  // The job `id` answers GetJob with `states` in turn (the last one stays).
  void ScriptJob(const std::vector<Job>& states) {
    auto fake = server_.service().Lock();
    for (const Job& job : states) fake->jobs[job.id()].push_back(job);
  }

  // `job` is what every GetJob of its id returns from now on.
  void Rescript(const Job& job) {
    server_.service().Lock()->jobs.erase(job.id());
    ScriptJob({job});
  }

  FakeJobServer server_;
};

// ---------------------------------------------------------------------------
// submit
// ---------------------------------------------------------------------------

TEST_F(JobCommandsTest, SubmitMergesFileFlagsAndArgvIntoTheSpec) {
  const std::string path = ::testing::TempDir() + "/submit_job.yaml";
  {
    std::ofstream file(path);
    file << "name: from-file\nlabels: {team: research}\ncommand: [file-command]\n"
            "env: {A: '1', B: '2'}\nnodes: 2\nnproc_per_node: 8\nmax_restarts: 1\n";
  }
  server_.service().Lock()->submit_response.emplace();
  *server_.service().Lock()->submit_response->mutable_job() =
      MakeJob("job-1", mesh::v1::JOB_STATE_PENDING);

  const Result r = Run({"submit",    "-f",           path,    "--name",
                        "from-flag", "--env",        "B=3",   "--env",
                        "C=x=y",     "--label",      "run=7", "--nodes",
                        "1:4",       "--mesh-shape", "2,-1",  "--dim-names",
                        "dp,tp",     "--deadline",   "10m",   "--hang-timeout",
                        "2m",        "--on-hang",    "fail",  "--memory-per-proc",
                        "512MiB",    "--max-pids",   "100",   "--idempotency-key",
                        "k1",        "--parsable",   "--",    "python",
                        "train.py",  "--lr",         "0.1"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(r.out, "job-1\n");  // --parsable: the id and nothing else.

  auto fake = server_.service().Lock();
  ASSERT_EQ(fake->submits.size(), 1u);
  const mesh::v1::JobSpec& spec = fake->submits[0].spec();
  EXPECT_EQ(spec.name(), "from-flag");
  EXPECT_THAT(spec.command(), ElementsAre("python", "train.py", "--lr", "0.1"));
  EXPECT_THAT(spec.env(), UnorderedElementsAre(Pair("A", "1"), Pair("B", "3"), Pair("C", "x=y")));
  EXPECT_THAT(spec.labels(), UnorderedElementsAre(Pair("team", "research"), Pair("run", "7")));
  EXPECT_EQ(spec.nodes().min(), 1);
  EXPECT_EQ(spec.nodes().max(), 4);
  EXPECT_EQ(spec.nproc_per_node(), 8);  // From the file: no flag overrode it.
  EXPECT_EQ(spec.max_restarts(), 1);
  EXPECT_THAT(spec.mesh_shape(), ElementsAre(2, -1));
  EXPECT_THAT(spec.mesh_dim_names(), ElementsAre("dp", "tp"));
  EXPECT_EQ(spec.deadline_seconds(), 600);
  EXPECT_EQ(spec.hang_timeout_seconds(), 120);
  EXPECT_EQ(spec.on_hang(), mesh::v1::HANG_POLICY_FAIL);
  EXPECT_EQ(spec.memory_per_proc_bytes(), int64_t{512} << 20);
  EXPECT_EQ(spec.max_pids(), 100);
  EXPECT_EQ(spec.idempotency_key(), "k1");
  EXPECT_TRUE(fake->log_requests.empty());  // --parsable neither follows nor waits.
  EXPECT_TRUE(fake->waits.empty());
}

TEST_F(JobCommandsTest, SubmitWithoutAFileDefaultsToOneNodeOneProcess) {
  server_.service().Lock()->submit_response.emplace();
  *server_.service().Lock()->submit_response->mutable_job() =
      MakeJob("job-1", mesh::v1::JOB_STATE_PENDING);
  const Result r = Run({"submit", "--no-wait", "--", "/bin/echo", "hi"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(r.out, "job-1\n");
  auto fake = server_.service().Lock();
  ASSERT_EQ(fake->submits.size(), 1u);
  EXPECT_EQ(fake->submits[0].spec().nodes().min(), 1);
  EXPECT_EQ(fake->submits[0].spec().nproc_per_node(), 1);
  EXPECT_THAT(fake->submits[0].spec().command(), ElementsAre("/bin/echo", "hi"));
}

TEST_F(JobCommandsTest, SubmitNoWaitJsonIsTheJobObject) {
  server_.service().Lock()->submit_response.emplace();
  *server_.service().Lock()->submit_response->mutable_job() =
      MakeJob("job-1", mesh::v1::JOB_STATE_PENDING);
  const Result r = Run({"-o", "json", "submit", "--no-wait", "--", "x"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const auto json = nlohmann::json::parse(r.out);
  EXPECT_EQ(json["id"], "job-1");
  EXPECT_EQ(json["state"], "PENDING");
  EXPECT_EQ(json["deduplicated"], false);
  EXPECT_TRUE(json["world_size"].is_null());  // Not placed yet.
}

TEST_F(JobCommandsTest, SubmitWithoutACommandIsAUsageErrorAndSendsNothing) {
  const Result r = Run({"submit", "--name", "x"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("no command"));
  EXPECT_TRUE(server_.service().Lock()->submits.empty());
}

TEST_F(JobCommandsTest, SubmitWithBadClientSideInputIsAUsageError) {
  EXPECT_EQ(Run({"submit", "--nodes", "two", "--", "x"}).code, kExitUsage);
  EXPECT_EQ(Run({"submit", "--deadline", "soon", "--", "x"}).code, kExitUsage);
  EXPECT_EQ(Run({"submit", "--hang-timeout", "0", "--", "x"}).code, kExitUsage);
  EXPECT_EQ(Run({"submit", "--on-hang", "maybe", "--", "x"}).code, kExitUsage);
  const Result memory = Run({"submit", "--memory-per-proc", "8GB", "--", "x"});
  EXPECT_EQ(memory.code, kExitUsage);
  EXPECT_THAT(memory.err, HasSubstr("--memory-per-proc"));
  EXPECT_EQ(Run({"submit", "--mesh-shape", "2,a", "--", "x"}).code, kExitUsage);
  EXPECT_EQ(Run({"submit", "--label", "novalue", "--", "x"}).code, kExitUsage);
  const Result env = Run({"submit", "--env", "MESH_RANK=3", "--", "x"});
  EXPECT_EQ(env.code, kExitUsage);
  EXPECT_THAT(env.err, HasSubstr("env[\"MESH_RANK\"]"));
  const Result file = Run({"submit", "-f", "/nonexistent/job.yaml", "--", "x"});
  EXPECT_EQ(file.code, kExitUsage);
  EXPECT_THAT(file.err, HasSubstr("/nonexistent/job.yaml"));
  EXPECT_TRUE(server_.service().Lock()->submits.empty());
}

TEST_F(JobCommandsTest, SubmitRefusedByTheServerExits4WithItsMessage) {
  server_.service().Lock()->submit_error =
      grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "spec.nodes: min 4 is greater than max 2");
  const Result r = Run({"submit", "--nodes", "4:2", "--", "x"});
  EXPECT_EQ(r.code, kExitRefused);
  EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT: spec.nodes: min 4 is greater than max 2"));
}

struct ResultCase {
  JobState state;
  int exit_code;
};

class SubmitResultTest : public JobCommandsTest,
                         public ::testing::WithParamInterface<ResultCase> {};

TEST_P(SubmitResultTest, FollowsLogsThenExitsWithTheJobsResult) {
  Job final_job = MakeJob("job-1", GetParam().state);
  if (GetParam().state == mesh::v1::JOB_STATE_FAILED) {
    final_job.mutable_root_cause()->set_rank(3);
    final_job.mutable_root_cause()->set_node("node-b");
    final_job.mutable_root_cause()->set_signal(9);
  }
  {
    auto fake = server_.service().Lock();
    fake->submit_response.emplace();
    *fake->submit_response->mutable_job() = MakeJob("job-1", mesh::v1::JOB_STATE_PENDING);
    fake->log_scripts.push_back(
        LogScript{{Chunk(0, "hello\n"), Chunk(1, "world\n", 0, /*eof=*/true)}});
  }
  ScriptJob({MakeJob("job-1", mesh::v1::JOB_STATE_RUNNING), final_job});

  const Result r = Run({"submit", "--", "python", "train.py"});
  EXPECT_EQ(r.code, GetParam().exit_code) << r.err;
  EXPECT_EQ(r.out, "[rank 0] hello\n[rank 1] world\n");
  EXPECT_THAT(r.err, HasSubstr("job job-1 " + JobStateName(GetParam().state)));
  if (GetParam().state == mesh::v1::JOB_STATE_FAILED) {
    EXPECT_THAT(r.err, HasSubstr("rank 3 on node-b killed by signal 9 (SIGKILL)"));
  }
  auto fake = server_.service().Lock();
  ASSERT_EQ(fake->log_requests.size(), 1u);
  EXPECT_TRUE(fake->log_requests[0].follow());
  EXPECT_EQ(fake->log_requests[0].generation(), 0);
}

INSTANTIATE_TEST_SUITE_P(EachResult, SubmitResultTest,
                         ::testing::Values(ResultCase{mesh::v1::JOB_STATE_SUCCEEDED, kExitOk},
                                           ResultCase{mesh::v1::JOB_STATE_FAILED, kExitFailed},
                                           ResultCase{mesh::v1::JOB_STATE_CANCELLED,
                                                      kExitJobCancelled}));

TEST_F(JobCommandsTest, SubmitNoLogsWaitsForTheResult) {
  {
    auto fake = server_.service().Lock();
    fake->submit_response.emplace();
    *fake->submit_response->mutable_job() = MakeJob("job-1", mesh::v1::JOB_STATE_PENDING);
    fake->wait_result = MakeJob("job-1", mesh::v1::JOB_STATE_FAILED);
  }
  const Result r = Run({"submit", "--no-logs", "--", "x"});
  EXPECT_EQ(r.code, kExitFailed) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_TRUE(server_.service().Lock()->log_requests.empty());
  EXPECT_EQ(server_.service().Lock()->waits.size(), 1u);
}

// ---------------------------------------------------------------------------
// logs
// ---------------------------------------------------------------------------

TEST_F(JobCommandsTest, LogsPrefixRanksAndBufferPartialLines) {
  server_.service().Lock()->log_scripts.push_back(LogScript{{
      Chunk(0, "a\npar", 0), Chunk(1, "x\n", 0), Chunk(0, "tial\n", 5),
      Chunk(1, "last", 2, /*eof=*/true),  // A finished rank's final line without '\n'.
      Chunk(0, "tail", 10),               // Still partial when the stream ends.
  }});
  const Result r = Run({"logs", "job-1", "--rank", "0,1", "--tail", "5"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(r.out, "[rank 0] a\n[rank 1] x\n[rank 0] partial\n[rank 1] last\n[rank 0] tail\n");
  auto fake = server_.service().Lock();
  ASSERT_EQ(fake->log_requests.size(), 1u);
  EXPECT_THAT(fake->log_requests[0].ranks(), ElementsAre(0, 1));
  EXPECT_EQ(fake->log_requests[0].tail(), 5);
  EXPECT_EQ(fake->log_requests[0].generation(), -1);
  EXPECT_FALSE(fake->log_requests[0].follow());
}

TEST_F(JobCommandsTest, LogsWithoutPrefixAndMissingRanks) {
  LogChunk missing;
  missing.set_rank(2);
  missing.set_eof(true);
  missing.set_missing(true);
  server_.service().Lock()->log_scripts.push_back(
      LogScript{{Chunk(0, "one\ntwo\n", 0, true), missing}});
  const Result r = Run({"logs", "job-1", "--no-prefix", "--generation", "3"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(r.out, "one\ntwo\n");
  EXPECT_THAT(r.err, HasSubstr("no log for rank 2"));
  EXPECT_EQ(server_.service().Lock()->log_requests[0].generation(), 3);
}

TEST_F(JobCommandsTest, LogsOfAnUnplacedJobIsRefused) {
  server_.service().Lock()->log_scripts.push_back(
      LogScript{{}, grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "job-1 not placed yet")});
  const Result r = Run({"logs", "job-1"});
  EXPECT_EQ(r.code, kExitRefused);
  EXPECT_THAT(r.err, HasSubstr("not placed yet"));
}

TEST_F(JobCommandsTest, FollowCrossesAGenerationChange) {
  {
    auto fake = server_.service().Lock();
    fake->log_scripts.push_back(LogScript{{Chunk(0, "gen0\n", 0, true, 0)}});
    fake->log_scripts.push_back(LogScript{{Chunk(0, "gen1\n", 0, true, 1)}});
  }
  Job restarted = MakeJob("job-1", mesh::v1::JOB_STATE_RUNNING, 1);
  ScriptJob({MakeJob("job-1", mesh::v1::JOB_STATE_RUNNING, 0), restarted,
             MakeJob("job-1", mesh::v1::JOB_STATE_SUCCEEDED, 1)});
  const Result r = Run({"logs", "-f", "job-1"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(r.out, "[rank 0] gen0\n[rank 0] gen1\n");
  EXPECT_THAT(r.err, HasSubstr("--- generation 1 (restart 1) ---"));
  auto fake = server_.service().Lock();
  ASSERT_EQ(fake->log_requests.size(), 2u);
  EXPECT_EQ(fake->log_requests[0].generation(), 0);
  EXPECT_EQ(fake->log_requests[1].generation(), 1);
  EXPECT_TRUE(fake->log_requests[1].follow());
}

TEST_F(JobCommandsTest, FollowResumesADroppedStreamWithoutRepeats) {
  {
    auto fake = server_.service().Lock();
    // The first stream ends early; the second replays from the start.
    fake->log_scripts.push_back(LogScript{{Chunk(0, "a\nb\n", 0)}});
    fake->log_scripts.push_back(LogScript{{Chunk(0, "a\nb\nc\n", 0, true)}});
  }
  ScriptJob({MakeJob("job-1", mesh::v1::JOB_STATE_RUNNING),
             MakeJob("job-1", mesh::v1::JOB_STATE_RUNNING),
             MakeJob("job-1", mesh::v1::JOB_STATE_SUCCEEDED)});
  const Result r = Run({"logs", "-f", "job-1"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(r.out, "[rank 0] a\n[rank 0] b\n[rank 0] c\n");
  EXPECT_EQ(server_.service().Lock()->log_requests.size(), 2u);
}

TEST_F(JobCommandsTest, FollowWaitsForPlacement) {
  {
    auto fake = server_.service().Lock();
    fake->log_scripts.push_back(
        LogScript{{}, grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "not placed")});
    fake->log_scripts.push_back(LogScript{{Chunk(0, "up\n", 0, true)}});
    mesh::v1::WatchJobStateResponse scheduled;
    scheduled.mutable_event()->set_from(mesh::v1::JOB_STATE_PENDING);
    scheduled.mutable_event()->set_to(mesh::v1::JOB_STATE_SCHEDULED);
    fake->watch_events.push_back(scheduled);
  }
  ScriptJob({MakeJob("job-1", mesh::v1::JOB_STATE_PENDING),
             MakeJob("job-1", mesh::v1::JOB_STATE_SCHEDULED),
             MakeJob("job-1", mesh::v1::JOB_STATE_SUCCEEDED)});
  const Result r = Run({"logs", "-f", "job-1"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(r.out, "[rank 0] up\n");
  auto fake = server_.service().Lock();
  ASSERT_EQ(fake->watches.size(), 1u);
  EXPECT_TRUE(fake->watches[0].replay());
}

// ---------------------------------------------------------------------------
// list, status, describe, nodes
// ---------------------------------------------------------------------------

TEST_F(JobCommandsTest, ListSendsFiltersAndPrintsTheJsonShape) {
  {
    auto fake = server_.service().Lock();
    mesh::v1::ListJobsResponse page;
    *page.add_jobs() = MakeJob("job-2", mesh::v1::JOB_STATE_RUNNING);
    page.set_next_page_token("t2");
    fake->pages[""] = page;
  }
  const Result r = Run({"-o", "json", "list", "--state", "running", "--state", "pending,failed",
                        "-l", "team=research", "--limit", "5"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const auto json = nlohmann::json::parse(r.out);
  ASSERT_EQ(json["jobs"].size(), 1u);
  EXPECT_EQ(json["jobs"][0]["id"], "job-2");
  EXPECT_EQ(json["jobs"][0]["state"], "RUNNING");
  EXPECT_EQ(json["jobs"][0]["world_size"], 8);
  EXPECT_FALSE(json["jobs"][0].contains("events"));
  EXPECT_EQ(json["next_page_token"], "t2");
  auto fake = server_.service().Lock();
  ASSERT_EQ(fake->lists.size(), 1u);
  EXPECT_THAT(fake->lists[0].states(),
              ElementsAre(mesh::v1::JOB_STATE_RUNNING, mesh::v1::JOB_STATE_PENDING,
                          mesh::v1::JOB_STATE_FAILED));
  EXPECT_THAT(fake->lists[0].labels(), UnorderedElementsAre(Pair("team", "research")));
  EXPECT_EQ(fake->lists[0].page_size(), 5);
}

TEST_F(JobCommandsTest, ListAllFollowsPagesAndTableHasTheColumns) {
  {
    auto fake = server_.service().Lock();
    mesh::v1::ListJobsResponse first, second;
    *first.add_jobs() = MakeJob("job-2", mesh::v1::JOB_STATE_RUNNING);
    first.set_next_page_token("t2");
    *second.add_jobs() = MakeJob("job-1", mesh::v1::JOB_STATE_PENDING);
    fake->pages[""] = first;
    fake->pages["t2"] = second;
  }
  const Result json = Run({"-o", "json", "list", "--all"});
  ASSERT_EQ(json.code, kExitOk) << json.err;
  const auto parsed = nlohmann::json::parse(json.out);
  ASSERT_EQ(parsed["jobs"].size(), 2u);
  EXPECT_EQ(parsed["jobs"][1]["id"], "job-1");
  EXPECT_EQ(parsed["next_page_token"], "");

  const Result table = Run({"list", "--all"});
  ASSERT_EQ(table.code, kExitOk) << table.err;
  EXPECT_THAT(table.out, ::testing::StartsWith("ID "));
  for (const char* column : {"NAME", "STATE", "GEN", "RESTARTS", "NODES", "AGE"}) {
    EXPECT_THAT(table.out, HasSubstr(column));
  }
  EXPECT_THAT(table.out, HasSubstr("node-a,node-b"));
}

TEST_F(JobCommandsTest, ListWithABadStateIsAUsageError) {
  const Result r = Run({"list", "--state", "sleeping"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("sleeping"));
}

TEST_F(JobCommandsTest, StatusAndDescribeJson) {
  Job job = MakeJob("job-1", mesh::v1::JOB_STATE_FAILED, 1);
  job.set_owner("alice");
  job.mutable_root_cause()->set_rank(3);
  job.mutable_root_cause()->set_node("node-b");
  job.mutable_root_cause()->set_host("10.0.0.7");
  job.mutable_root_cause()->set_generation(1);
  job.mutable_root_cause()->set_exit_code(2);
  auto* event = job.add_events();
  event->set_time_unix_ms(1700000000000);
  event->set_from(mesh::v1::JOB_STATE_UNSPECIFIED);
  event->set_to(mesh::v1::JOB_STATE_PENDING);
  event->set_reason("submitted");
  ScriptJob({job});

  const Result status = Run({"-o", "json", "status", "job-1"});
  ASSERT_EQ(status.code, kExitOk) << status.err;
  const auto s = nlohmann::json::parse(status.out);
  for (const char* key :
       {"id", "name", "owner", "state", "pending_reason", "generation", "restarts", "max_restarts",
        "nodes", "world_size", "create_time", "update_time", "labels", "command", "mesh_shape",
        "mesh_dim_names", "root_cause"}) {
    EXPECT_TRUE(s.contains(key)) << key;
  }
  EXPECT_FALSE(s.contains("events"));
  EXPECT_FALSE(s.contains("spec"));
  EXPECT_EQ(s["state"], "FAILED");
  EXPECT_EQ(s["owner"], "alice");
  EXPECT_EQ(s["create_time"], "2023-11-14T22:13:20.000Z");
  EXPECT_EQ(s["nodes"], nlohmann::json({"node-a", "node-b"}));
  EXPECT_EQ(s["mesh_shape"], nlohmann::json({2, 4}));
  EXPECT_EQ(s["root_cause"]["rank"], 3);
  EXPECT_EQ(s["root_cause"]["exit_code"], 2);
  EXPECT_TRUE(s["root_cause"]["signal"].is_null());
  EXPECT_EQ(s["root_cause"]["message"],
            "rank 3 on node-b (10.0.0.7) exited with code 2 in generation 1");

  const Result describe = Run({"-o", "json", "describe", "job-1"});
  ASSERT_EQ(describe.code, kExitOk) << describe.err;
  const auto d = nlohmann::json::parse(describe.out);
  ASSERT_EQ(d["events"].size(), 1u);
  EXPECT_EQ(d["events"][0]["to"], "PENDING");
  EXPECT_EQ(d["events"][0]["from"], "UNSPECIFIED");
  EXPECT_EQ(d["events"][0]["reason"], "submitted");
  EXPECT_EQ(d["events"][0]["time"], "2023-11-14T22:13:20.000Z");
  EXPECT_EQ(d["spec"]["nproc_per_node"], 4);
  EXPECT_EQ(d["spec"]["nodes"]["min"], 2);
}

TEST_F(JobCommandsTest, DescribeTableShowsTheRootCauseInOneLine) {
  Job job = MakeJob("job-1", mesh::v1::JOB_STATE_FAILED, 1);
  job.mutable_root_cause()->set_rank(3);
  job.mutable_root_cause()->set_node("node-b");
  job.mutable_root_cause()->set_generation(1);
  job.mutable_root_cause()->set_signal(9);
  job.set_owner("alice");
  ScriptJob({job});
  const Result r = Run({"describe", "job-1"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, ::testing::ContainsRegex("Owner: +alice"));
  EXPECT_THAT(r.out, HasSubstr("rank 3 on node-b killed by signal 9 (SIGKILL) in generation 1"));
  EXPECT_THAT(r.out, HasSubstr("python train.py"));
  EXPECT_THAT(r.out, HasSubstr("Events:"));
}

// The per-worker limits: describe shows them in a row (not at all when
// neither is set), the JSON spec carries them in bytes and as a count.
TEST_F(JobCommandsTest, DescribeShowsTheLimitsAndJsonCarriesThem) {
  Job job = MakeJob("job-1", mesh::v1::JOB_STATE_RUNNING);
  Rescript(job);
  const Result none = Run({"describe", "job-1"});
  ASSERT_EQ(none.code, kExitOk) << none.err;
  EXPECT_THAT(none.out, Not(HasSubstr("Limits:")));
  const auto none_json = nlohmann::json::parse(Run({"-o", "json", "describe", "job-1"}).out);
  EXPECT_EQ(none_json["spec"]["memory_per_proc_bytes"], 0);
  EXPECT_EQ(none_json["spec"]["max_pids"], 0);

  job.mutable_spec()->set_memory_per_proc_bytes(int64_t{8} << 30);
  job.mutable_spec()->set_max_pids(4096);
  Rescript(job);
  const Result both = Run({"describe", "job-1"});
  ASSERT_EQ(both.code, kExitOk) << both.err;
  EXPECT_THAT(both.out, ::testing::ContainsRegex("Limits: +memory per proc 8GiB, max pids 4096"));
  const auto json = nlohmann::json::parse(Run({"-o", "json", "describe", "job-1"}).out);
  EXPECT_EQ(json["spec"]["memory_per_proc_bytes"], int64_t{8} << 30);
  EXPECT_EQ(json["spec"]["max_pids"], 4096);

  job.mutable_spec()->set_max_pids(0);
  Rescript(job);
  EXPECT_THAT(Run({"describe", "job-1"}).out,
              ::testing::ContainsRegex("Limits: +memory per proc 8GiB, max pids none"));
}

// An elastic job: describe shows its grow policy and every resize with its
// reason; JSON carries both.
TEST_F(JobCommandsTest, DescribeShowsTheGrowPolicyAndEachResize) {
  Job job = MakeJob("job-1", mesh::v1::JOB_STATE_RUNNING, 2);
  job.mutable_spec()->mutable_nodes()->set_min(2);
  job.mutable_spec()->mutable_nodes()->set_max(4);
  job.mutable_spec()->set_grow(mesh::v1::GROW_POLICY_AFTER);
  job.mutable_spec()->set_grow_after_seconds(600);
  mesh::v1::JobResize* shrink = job.add_resizes();
  shrink->set_generation(1);
  shrink->set_from_nodes(4);
  shrink->set_to_nodes(3);
  shrink->set_reason("node node-d lost: no heartbeat for 15s");
  mesh::v1::JobResize* grow = job.add_resizes();
  grow->set_generation(2);
  grow->set_from_nodes(3);
  grow->set_to_nodes(4);
  grow->set_reason("grow after 600s at 3 nodes: 1 more node free");
  Rescript(job);
  const Result r = Run({"describe", "job-1"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, ::testing::ContainsRegex("Nodes wanted: +2:4 \\(grow: after 10m\\)"));
  EXPECT_THAT(r.out, HasSubstr("Resizes:"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("1 +4 -> 3 +node node-d lost: no heartbeat for 15s"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("2 +3 -> 4 +grow after 600s"));
  const auto json = nlohmann::json::parse(Run({"-o", "json", "describe", "job-1"}).out);
  EXPECT_EQ(json["spec"]["grow"], "after 10m");
  ASSERT_EQ(json["resizes"].size(), 2u);
  EXPECT_EQ(json["resizes"][0]["from_nodes"], 4);
  EXPECT_EQ(json["resizes"][0]["to_nodes"], 3);
  EXPECT_EQ(json["resizes"][1]["generation"], 2);

  // A job that never resized has no section, and an empty list in JSON.
  Rescript(MakeJob("job-1", mesh::v1::JOB_STATE_RUNNING));
  EXPECT_THAT(Run({"describe", "job-1"}).out, Not(HasSubstr("Resizes:")));
  EXPECT_TRUE(nlohmann::json::parse(Run({"-o", "json", "status", "job-1"}).out)["resizes"].empty());
}

TEST_F(JobCommandsTest, SubmitTakesAGrowPolicy) {
  server_.service().Lock()->submit_response.emplace();
  *server_.service().Lock()->submit_response->mutable_job() =
      MakeJob("job-1", mesh::v1::JOB_STATE_PENDING);
  ASSERT_EQ(Run({"submit", "--no-wait", "--nodes", "2:4", "--grow", "after:10m", "--", "x"}).code,
            kExitOk);
  ASSERT_EQ(Run({"submit", "--no-wait", "--nodes", "2:4", "--grow", "on_restart", "--", "x"}).code,
            kExitOk);
  const auto submits = server_.service().Lock()->submits;
  ASSERT_EQ(submits.size(), 2u);
  EXPECT_EQ(submits[0].spec().grow(), mesh::v1::GROW_POLICY_AFTER);
  EXPECT_EQ(submits[0].spec().grow_after_seconds(), 600);
  EXPECT_EQ(submits[1].spec().grow(), mesh::v1::GROW_POLICY_ON_RESTART);
  const Result bad = Run({"submit", "--grow", "sometimes", "--", "x"});
  EXPECT_EQ(bad.code, kExitUsage);
  EXPECT_THAT(bad.err, HasSubstr("--grow: 'sometimes' is not a grow policy"));
  EXPECT_EQ(Run({"submit", "--grow", "after:0s", "--", "x"}).code, kExitUsage);
}

// In-place recovery: describe shows the restart policy beside the restarts
// and every membership change of the generation; JSON carries both.
TEST_F(JobCommandsTest, DescribeShowsTheRestartPolicyAndEachMembershipChange) {
  Job job = MakeJob("job-1", mesh::v1::JOB_STATE_RUNNING, 0);
  job.mutable_spec()->set_restart_policy(mesh::v1::RESTART_POLICY_IN_PLACE);
  job.mutable_spec()->set_in_place_dim("dp");
  mesh::v1::MembershipChange* lost = job.add_membership();
  lost->set_epoch(1);
  lost->set_time_unix_ms(1700000001000);
  lost->set_rank(5);
  lost->set_kind(mesh::v1::MembershipChange::KIND_LOST);
  lost->set_reason("rank 5 (node node-b) exited with code 1");
  mesh::v1::MembershipChange* returned = job.add_membership();
  returned->set_epoch(2);
  returned->set_time_unix_ms(1700000004000);
  returned->set_rank(5);
  returned->set_kind(mesh::v1::MembershipChange::KIND_RETURNED);
  returned->set_incarnation(7);
  Rescript(job);
  const Result r = Run({"describe", "job-1"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, ::testing::ContainsRegex("Generation: +0 \\(restarts 0/2\\)\n"
                                              "Restart policy: +in_place \\(dim dp\\)\n"));
  EXPECT_THAT(r.out, HasSubstr("Membership:"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("  TIME +EPOCH +RANK +CHANGE +DETAIL"));
  EXPECT_THAT(r.out,
              ::testing::ContainsRegex("2023-11-14T22:13:21.000Z +1 +5 +LOST +rank 5 \\(node "
                                       "node-b\\) exited with code 1"));
  EXPECT_THAT(r.out,
              ::testing::ContainsRegex("2023-11-14T22:13:24.000Z +2 +5 +RETURNED +incarnation 7"));
  // The table follows the events, in the order the coordinator gave.
  EXPECT_LT(r.out.find("Events:"), r.out.find("Membership:"));
  EXPECT_LT(r.out.find("LOST"), r.out.find("RETURNED"));

  const auto json = nlohmann::json::parse(Run({"-o", "json", "describe", "job-1"}).out);
  EXPECT_EQ(json["spec"]["restart_policy"], "in_place");
  EXPECT_EQ(json["spec"]["in_place_dim"], "dp");
  ASSERT_EQ(json["membership"].size(), 2u);
  EXPECT_EQ(json["membership"][0],
            nlohmann::json({{"epoch", 1},
                            {"time", "2023-11-14T22:13:21.000Z"},
                            {"rank", 5},
                            {"kind", "LOST"},
                            {"incarnation", 0},
                            {"reason", "rank 5 (node node-b) exited with code 1"}}));
  EXPECT_EQ(json["membership"][1]["kind"], "RETURNED");
  EXPECT_EQ(json["membership"][1]["incarnation"], 7);
  EXPECT_EQ(json["membership"][1]["epoch"], 2);
  // status carries the list too, as it does resizes.
  EXPECT_EQ(nlohmann::json::parse(Run({"-o", "json", "status", "job-1"}).out)["membership"].size(),
            2u);
  // status (the short view) has no policy line and no table.
  const Result status = Run({"status", "job-1"});
  EXPECT_THAT(status.out, Not(HasSubstr("Restart policy:")));
  EXPECT_THAT(status.out, Not(HasSubstr("Membership:")));

  // A group job (or one from a server older than the field): "group", no
  // dimension, no section, and an empty list in JSON.
  Rescript(MakeJob("job-1", mesh::v1::JOB_STATE_RUNNING));
  const Result group = Run({"describe", "job-1"});
  EXPECT_THAT(group.out, ::testing::ContainsRegex("Restart policy: +group\n"));
  EXPECT_THAT(group.out, Not(HasSubstr("Membership:")));
  const auto group_json = nlohmann::json::parse(Run({"-o", "json", "describe", "job-1"}).out);
  EXPECT_EQ(group_json["spec"]["restart_policy"], "group");
  EXPECT_EQ(group_json["spec"]["in_place_dim"], "");
  EXPECT_TRUE(group_json["membership"].empty());
  EXPECT_TRUE(group_json["membership"].is_array());
}

TEST_F(JobCommandsTest, SubmitTakesARestartPolicyAndDimension) {
  server_.service().Lock()->submit_response.emplace();
  *server_.service().Lock()->submit_response->mutable_job() =
      MakeJob("job-1", mesh::v1::JOB_STATE_PENDING);
  const std::string path = ::testing::TempDir() + "/in_place_job.yaml";
  {
    std::ofstream file(path);
    file << "command: [x]\nrestart_policy: in_place\nin_place_dim: replica\n";
  }
  ASSERT_EQ(Run({"submit", "--no-wait", "--restart-policy", "in_place", "--in-place-dim", "dp",
                 "--", "x"})
                .code,
            kExitOk);
  ASSERT_EQ(Run({"submit", "--no-wait", "--restart-policy", "GROUP", "--", "x"}).code, kExitOk);
  ASSERT_EQ(Run({"submit", "--no-wait", "--", "x"}).code, kExitOk);
  ASSERT_EQ(Run({"submit", "--no-wait", "-f", path}).code, kExitOk);
  // Flags override the file's keys.
  ASSERT_EQ(
      Run({"submit", "--no-wait", "-f", path, "--restart-policy", "group", "--in-place-dim", "dp"})
          .code,
      kExitOk);
  const auto submits = server_.service().Lock()->submits;
  ASSERT_EQ(submits.size(), 5u);
  EXPECT_EQ(submits[0].spec().restart_policy(), mesh::v1::RESTART_POLICY_IN_PLACE);
  EXPECT_EQ(submits[0].spec().in_place_dim(), "dp");
  EXPECT_EQ(submits[1].spec().restart_policy(), mesh::v1::RESTART_POLICY_GROUP);
  EXPECT_EQ(submits[1].spec().in_place_dim(), "");
  // Neither given: left to the coordinator's default.
  EXPECT_EQ(submits[2].spec().restart_policy(), mesh::v1::RESTART_POLICY_UNSPECIFIED);
  EXPECT_EQ(submits[3].spec().restart_policy(), mesh::v1::RESTART_POLICY_IN_PLACE);
  EXPECT_EQ(submits[3].spec().in_place_dim(), "replica");
  EXPECT_EQ(submits[4].spec().restart_policy(), mesh::v1::RESTART_POLICY_GROUP);
  EXPECT_EQ(submits[4].spec().in_place_dim(), "dp");

  const Result bad = Run({"submit", "--restart-policy", "solo", "--", "x"});
  EXPECT_EQ(bad.code, kExitUsage);
  EXPECT_THAT(bad.err,
              HasSubstr("--restart-policy: 'solo' is not a restart policy: group or in_place"));
  const Result empty_dim =
      Run({"submit", "--restart-policy", "in_place", "--in-place-dim", "", "--", "x"});
  EXPECT_EQ(empty_dim.code, kExitUsage);
  EXPECT_THAT(empty_dim.err, HasSubstr("--in-place-dim: expected the name of a mesh dimension"));
  EXPECT_EQ(server_.service().Lock()->submits.size(), 5u);  // Nothing was sent.
}

// An OOM kill: the coordinator's message says it, and JSON has oom_killed.
TEST_F(JobCommandsTest, AnOomKillIsShownAsTheRootCause) {
  Job job = MakeJob("job-1", mesh::v1::JOB_STATE_FAILED, 1);
  mesh::v1::RootCause* cause = job.mutable_root_cause();
  cause->set_rank(3);
  cause->set_node("node-b");
  cause->set_generation(1);
  cause->set_signal(9);
  cause->set_oom_killed(true);
  cause->set_message(
      "rank 3 (node node-b) was killed by the kernel: out of memory (memory limit 8 GiB)");
  Rescript(job);
  const Result table = Run({"status", "job-1"});
  ASSERT_EQ(table.code, kExitOk) << table.err;
  EXPECT_THAT(table.out, HasSubstr("rank 3 (node node-b) was killed by the kernel: out of memory "
                                   "(memory limit 8 GiB)"));
  const auto json = nlohmann::json::parse(Run({"-o", "json", "status", "job-1"}).out);
  EXPECT_EQ(json["root_cause"]["oom_killed"], true);
  EXPECT_EQ(json["root_cause"]["signal_name"], "SIGKILL");

  // Without the server's message (an older coordinator), the composed line
  // still says it.
  cause->clear_message();
  Rescript(job);
  EXPECT_THAT(Run({"describe", "job-1"}).out,
              HasSubstr("rank 3 on node-b killed by signal 9 (SIGKILL) in generation 1: killed by "
                        "the kernel, out of memory"));
  cause->set_oom_killed(false);
  Rescript(job);
  const auto plain = nlohmann::json::parse(Run({"-o", "json", "status", "job-1"}).out);
  EXPECT_EQ(plain["root_cause"]["oom_killed"], false);
}

// A job that restarted after a failure and runs again shows that failure as
// its last one, with the restart, not as the root cause of its state.
TEST_F(JobCommandsTest, StatusOfARecoveredJobLabelsTheFailureAsRestartedFrom) {
  Job job = MakeJob("job-1", mesh::v1::JOB_STATE_RUNNING, 1);
  job.mutable_root_cause()->set_rank(-1);
  job.mutable_root_cause()->set_node("node-b");
  job.mutable_root_cause()->set_generation(0);
  job.mutable_root_cause()->set_message("node node-b lost: no heartbeat for 10 s");
  // The same record once the job has FAILED (the fake answers in order).
  Job failed = job;
  failed.set_state(mesh::v1::JOB_STATE_FAILED);
  failed.mutable_root_cause()->set_generation(1);
  ScriptJob({job, failed});
  Result r = Run({"status", "job-1"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, ::testing::ContainsRegex("State: +RUNNING"));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("Root cause:")));
  EXPECT_THAT(r.out, ::testing::ContainsRegex(
                         "Last failure: +node node-b lost: no heartbeat for 10 s \\(restarted as "
                         "generation 1\\)"));

  // Once FAILED, the same record is the root cause.
  r = Run({"status", "job-1"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, ::testing::ContainsRegex("Root cause: +node node-b lost"));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("Last failure:")));
}

TEST_F(JobCommandsTest, UnknownJobIsRefused) {
  const Result r = Run({"status", "nope"});
  EXPECT_EQ(r.code, kExitRefused);
  EXPECT_THAT(r.err, HasSubstr("NOT_FOUND"));
}

TEST_F(JobCommandsTest, NodesJsonAndTable) {
  {
    auto fake = server_.service().Lock();
    auto* node = fake->nodes.add_nodes();
    node->set_name("node-a");
    node->set_address("10.0.0.5");
    node->set_state(mesh::v1::NODE_STATE_READY);
    node->set_slots(8);
    node->set_free_slots(4);
    node->set_free_gpus(1);
    node->add_gpus()->set_index(0);
    node->add_gpus()->set_index(1);
    node->add_jobs("job-1");
    node->set_last_seen_unix_ms(1700000000000);
  }
  const Result json = Run({"-o", "json", "nodes"});
  ASSERT_EQ(json.code, kExitOk) << json.err;
  const auto parsed = nlohmann::json::parse(json.out);
  ASSERT_EQ(parsed["nodes"].size(), 1u);
  const auto& node = parsed["nodes"][0];
  EXPECT_EQ(node["name"], "node-a");
  EXPECT_EQ(node["state"], "READY");
  EXPECT_EQ(node["free_slots"], 4);
  EXPECT_EQ(node["gpus"].size(), 2u);
  EXPECT_EQ(node["jobs"], nlohmann::json({"job-1"}));
  EXPECT_EQ(node["last_seen"], "2023-11-14T22:13:20.000Z");

  EXPECT_EQ(node["isolation"]["run_as_owner"], false);

  const Result table = Run({"nodes"});
  ASSERT_EQ(table.code, kExitOk) << table.err;
  EXPECT_THAT(table.out, HasSubstr("NAME    STATE  ADDRESS   SLOTS  FREE  GPUS  JOBS   ISOLATION  "
                                   "LAST-SEEN"));
  // An agent that reports no isolation (older than the field): "-".
  EXPECT_THAT(table.out, HasSubstr("node-a  READY  10.0.0.5  8      4     1/2   job-1  -"));
  EXPECT_EQ(table.err, "");
}

TEST_F(JobCommandsTest, NodesShowIsolationAndWarnWhereItIsOff) {
  {
    auto fake = server_.service().Lock();
    auto* on = fake->nodes.add_nodes();
    on->set_name("node-a");
    on->set_state(mesh::v1::NODE_STATE_READY);
    on->mutable_isolation()->set_run_as_owner(true);
    on->mutable_isolation()->set_users("workers run as their owner's account");
    on->mutable_isolation()->set_cgroup_version("v1");
    on->mutable_isolation()->set_kill_mechanism("cgroup");
    on->mutable_isolation()->set_memory_limit(true);
    auto* off = fake->nodes.add_nodes();
    off->set_name("node-b");
    off->set_state(mesh::v1::NODE_STATE_READY);
    off->mutable_isolation()->set_users("off: the agent runs as uid 1000, not root");
    off->mutable_isolation()->set_cgroup_version("none");
    off->mutable_isolation()->set_kill_mechanism("process group + environment scan");
  }
  const Result table = Run({"nodes"});
  ASSERT_EQ(table.code, kExitOk) << table.err;
  EXPECT_THAT(table.out, HasSubstr("owner-uid,cgroup-v1"));
  EXPECT_THAT(table.out, HasSubstr("agent-uid,no-cgroup"));
  EXPECT_EQ(table.err,
            "meshctl: node node-b: job isolation is off: the agent runs as uid 1000, not root\n");

  const Result json = Run({"-o", "json", "nodes"});
  ASSERT_EQ(json.code, kExitOk) << json.err;
  const auto parsed = nlohmann::json::parse(json.out);
  EXPECT_EQ(parsed["nodes"][0]["isolation"]["run_as_owner"], true);
  EXPECT_EQ(parsed["nodes"][0]["isolation"]["cgroup_version"], "v1");
  EXPECT_EQ(parsed["nodes"][0]["isolation"]["kill_mechanism"], "cgroup");
  EXPECT_EQ(parsed["nodes"][0]["isolation"]["memory_limit"], true);
  EXPECT_EQ(parsed["nodes"][1]["isolation"]["users"], "off: the agent runs as uid 1000, not root");
}

// ---------------------------------------------------------------------------
// cancel, wait
// ---------------------------------------------------------------------------

TEST_F(JobCommandsTest, CancelSendsTheReason) {
  const Result r = Run({"cancel", "job-1", "--reason", "wrong data"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(r.out, "job job-1 CANCELLED\n");
  auto fake = server_.service().Lock();
  ASSERT_EQ(fake->cancels.size(), 1u);
  EXPECT_EQ(fake->cancels[0].job_id(), "job-1");
  EXPECT_EQ(fake->cancels[0].reason(), "wrong data");
}

TEST_F(JobCommandsTest, CancelOfAFinishedJobSaysSo) {
  server_.service().Lock()->cancel_result = MakeJob("job-1", mesh::v1::JOB_STATE_SUCCEEDED);
  const Result r = Run({"-o", "json", "cancel", "job-1"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["state"], "SUCCEEDED");
  EXPECT_THAT(r.err, HasSubstr("nothing to cancel"));
}

TEST_F(JobCommandsTest, WaitExitsWithTheResult) {
  server_.service().Lock()->wait_result = MakeJob("job-1", mesh::v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(Run({"wait", "job-1"}).code, kExitOk);
  server_.service().Lock()->wait_result = MakeJob("job-1", mesh::v1::JOB_STATE_FAILED);
  EXPECT_EQ(Run({"wait", "job-1"}).code, kExitFailed);
  server_.service().Lock()->wait_result = MakeJob("job-1", mesh::v1::JOB_STATE_CANCELLED);
  const Result r = Run({"-o", "json", "wait", "job-1"});
  EXPECT_EQ(r.code, kExitJobCancelled);
  EXPECT_EQ(nlohmann::json::parse(r.out)["state"], "CANCELLED");
}

TEST_F(JobCommandsTest, WaitReissuesUntilItsTimeoutThenExits6) {
  {
    auto fake = server_.service().Lock();
    fake->wait_hold_cap = absl::Milliseconds(300);  // The server's maximum wait.
  }
  ScriptJob({MakeJob("job-1", mesh::v1::JOB_STATE_RUNNING)});
  const absl::Time start = absl::Now();
  const Result r = Run({"wait", "job-1", "--timeout", "1s"});
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(r.code, kExitWaitTimeout) << r.err;
  EXPECT_THAT(r.err, HasSubstr("not finished after 1 s"));
  EXPECT_THAT(r.err, HasSubstr("RUNNING"));
  EXPECT_GE(took, absl::Milliseconds(900));
  EXPECT_LT(took, absl::Seconds(4));
  auto fake = server_.service().Lock();
  EXPECT_GE(fake->waits.size(), 3u);
  EXPECT_LE(fake->waits[0].timeout_seconds(), 1.0);
  EXPECT_GT(fake->waits[0].timeout_seconds(), 0.0);
}

// ---------------------------------------------------------------------------
// usage and reachability
// ---------------------------------------------------------------------------

TEST_F(JobCommandsTest, UsageErrorsExit2) {
  EXPECT_EQ(Run({"status"}).code, kExitUsage);
  EXPECT_EQ(Run({"describe"}).code, kExitUsage);
  EXPECT_EQ(Run({"logs"}).code, kExitUsage);
  EXPECT_EQ(Run({"logs", "job-1", "--rank", "-1"}).code, kExitUsage);
  EXPECT_EQ(Run({"cancel"}).code, kExitUsage);
  EXPECT_EQ(Run({"wait"}).code, kExitUsage);
  EXPECT_EQ(Run({"wait", "job-1", "--timeout", "soon"}).code, kExitUsage);
  EXPECT_EQ(Run({"list", "--limit", "5000"}).code, kExitUsage);
  EXPECT_EQ(Run({"list", "-l", "novalue"}).code, kExitUsage);
  auto fake = server_.service().Lock();
  EXPECT_EQ(fake->get_job_calls, 0);
  EXPECT_TRUE(fake->waits.empty());
  EXPECT_TRUE(fake->lists.empty());
}

TEST_F(JobCommandsTest, UnreachableCoordinatorExits3) {
  const std::string address = server_.address();
  server_.Stop();
  for (std::vector<std::string> command : {std::vector<std::string>{"status", "job-1"},
                                           {"list"},
                                           {"nodes"},
                                           {"logs", "-f", "job-1"},
                                           {"wait", "job-1", "--timeout", "5s"},
                                           {"submit", "--", "x"}}) {
    command.insert(command.begin(), {"--coordinator", address, "--timeout", "1"});
    const Result r = Meshctl(command);
    EXPECT_EQ(r.code, kExitUnreachable) << command[4] << ": " << r.err;
    // What failed and what to check, not gRPC's transport text.
    EXPECT_THAT(r.err, HasSubstr(absl::StrCat("cannot reach the coordinator at ", address,
                                              " (UNAVAILABLE: connection refused): is it "
                                              "running? set "
                                              "--coordinator or MESH_COORDINATOR")));
    EXPECT_THAT(r.err, Not(HasSubstr("failed to connect to all addresses")));
  }
}

// ---------------------------------------------------------------------------
// JobClient streams stop on request.
// ---------------------------------------------------------------------------

TEST_F(JobCommandsTest, GetLogsStopsWhenTheCallbackSaysSo) {
  server_.service().Lock()->log_scripts.push_back(
      LogScript{{Chunk(0, "a\n"), Chunk(0, "b\n", 2)}, grpc::Status::OK, /*hold_open=*/true});
  JobClient client(MakeChannel(server_.address()));
  mesh::v1::GetLogsRequest request;
  request.set_job_id("job-1");
  int chunks = 0;
  const absl::Status status = client.GetLogs(
      request,
      [&](const LogChunk&) {
        ++chunks;
        return false;
      },
      nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(chunks, 1);
}

TEST_F(JobCommandsTest, GetLogsEndsWhenCancelledFromAnotherThread) {
  server_.service().Lock()->log_scripts.push_back(
      LogScript{{Chunk(0, "a\n")}, grpc::Status::OK, /*hold_open=*/true});
  JobClient client(MakeChannel(server_.address()));
  mesh::v1::GetLogsRequest request;
  request.set_job_id("job-1");
  StreamCanceller canceller;
  absl::Notification first;
  std::thread stopper([&] {
    // Bounded: the first chunk arrives at once from the in-process fake.
    if (first.WaitForNotificationWithTimeout(absl::Seconds(10))) canceller.Cancel();
  });
  const absl::Status status = client.GetLogs(
      request,
      [&](const LogChunk&) {
        if (!first.HasBeenNotified()) first.Notify();
        return true;
      },
      &canceller);
  stopper.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled);
  // Sticky: a stream started after Cancel ends at once.
  EXPECT_EQ(client
                .GetLogs(
                    request, [](const LogChunk&) { return true; }, &canceller)
                .code(),
            absl::StatusCode::kCancelled);
}

}  // namespace job_commands_test
}  // namespace mesh::cli
