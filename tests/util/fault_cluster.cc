#include "tests/util/fault_cluster.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/util/mesh_cluster.h"
#include "tests/util/proc.h"

namespace mesh::fault {
namespace {

using ::mesh::testing::ShellQuote;
using ::mesh::testing::Subprocess;

}  // namespace

// ---- FaultCluster ---------------------------------------------------------

FaultCluster::FaultCluster() {
  char pattern[] = "/tmp/mesh-fault-b-XXXXXX";
  const char* dir = mkdtemp(pattern);
  dir_ = dir == nullptr ? "/tmp/mesh-fault-b-fallback" : dir;
  marker_ = absl::StrCat("fault-b-", getpid(), "-", absl::ToUnixNanos(absl::Now()));
}

FaultCluster::~FaultCluster() {
  // A stopped agent would not die of SIGKILL any later, but SIGCONT first
  // keeps its reaper watchdog's view simple.
  for (auto& agent : agents_) {
    if (agent != nullptr) agent->Signal(SIGCONT);
  }
  agents_.clear();
  coordinator_.reset();
  // Nothing tagged with our marker may survive the cluster.
  for (pid_t pid : Processes()) kill(pid, SIGKILL);
  RunShell(absl::StrCat("rm -rf ", ShellQuote(dir_)));
}

absl::Status FaultCluster::StartCoordinator(const CoordinatorFlags& flags) {
  std::vector<std::string> argv = testing::CoordinatorArgv(
      MESH_COORDINATOR_BIN, flags.listen, /*port=*/0, dir_ + "/state",
      absl::Seconds(flags.node_heartbeat_interval), absl::Seconds(flags.node_heartbeat_timeout));
  if (flags.heartbeat_interval > 0) {
    argv.insert(argv.end(), {"--heartbeat-interval", absl::StrCat(flags.heartbeat_interval),
                             "--heartbeat-timeout", absl::StrCat(flags.heartbeat_timeout)});
  }
  argv.insert(argv.end(), flags.extra.begin(), flags.extra.end());
  absl::StatusOr<testing::StartedCoordinator> started = testing::StartCoordinatorProcess(argv);
  if (!started.ok()) return started.status();
  address_ = started->address;
  port_ = started->port;
  coordinator_ = std::move(started->process);
  channel_ = testing::NewPrivateChannel(address_);
  jobs_ = mesh::v1::JobService::NewStub(channel_);
  return absl::OkStatus();
}

std::string FaultCluster::agent_log(int index) const {
  return absl::StrCat(dir_, "/agent-", index, ".stderr");
}

std::string FaultCluster::ReadAgentLog(int index) const {
  std::ifstream in(agent_log(index));
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

absl::Status FaultCluster::StartAgent(const AgentFlags& flags) {
  const int index = static_cast<int>(agents_.size());
  // `exec` keeps the pid: the Subprocess is the agent itself (after `ip
  // netns exec`, which execs too).
  std::vector<std::string> argv = {
      "/bin/sh", "-c", absl::StrCat("exec \"$@\" 2>>", ShellQuote(agent_log(index))), "sh"};
  if (flags.netns != nullptr) {
    for (const std::string& part : flags.netns->ExecPrefix()) argv.push_back(part);
  }
  for (std::string& part : testing::AgentArgv(
           MESH_AGENT_BIN, flags.coordinator.empty() ? address_ : flags.coordinator, flags.name,
           flags.address, flags.slots, absl::StrCat(dir_, "/agent-", index))) {
    argv.push_back(std::move(part));
  }
  absl::StatusOr<Subprocess> process = Subprocess::Start(argv);
  if (!process.ok()) return process.status();
  agents_.push_back(std::make_unique<Subprocess>(*std::move(process)));
  return absl::OkStatus();
}

mesh::v1::JobSpec FaultCluster::ShellJob(const std::string& script, int nodes, int nproc,
                                         int max_restarts) {
  mesh::v1::JobSpec spec = testing::ShellJobSpec(script, nodes, nproc, marker_);
  spec.set_name("fault-b");
  spec.set_max_restarts(max_restarts);
  return spec;
}

std::string FaultCluster::Submit(const mesh::v1::JobSpec& spec) {
  absl::StatusOr<mesh::v1::Job> job = testing::SubmitJob(*jobs_, spec);
  EXPECT_TRUE(job.ok()) << job.status();
  return job.ok() ? job->id() : std::string();
}

absl::StatusOr<mesh::v1::Job> FaultCluster::WaitTerminal(const std::string& id,
                                                         absl::Duration timeout) {
  absl::StatusOr<mesh::v1::Job> job = testing::WaitTerminal(*jobs_, id, timeout);
  EXPECT_TRUE(job.ok()) << job.status();
  return job;
}

std::vector<pid_t> FaultCluster::Processes(const std::vector<std::string>& entries) const {
  std::vector<std::string> all = {"MARKER=" + marker_};
  all.insert(all.end(), entries.begin(), entries.end());
  return ::mesh::testing::LiveProcessesWithEnv(all);
}

}  // namespace mesh::fault
