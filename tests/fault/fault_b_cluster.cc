#include "tests/fault/fault_b_cluster.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "tests/util/proc.h"

namespace mesh::fault {
namespace {

using ::mesh::testing::Subprocess;

constexpr absl::Duration kStartTimeout = absl::Seconds(30);
constexpr char kBanner[] = "mesh-coordinator listening on ";

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

// Deletes namespaces "meshfb<pid>x<n>" whose creating pid is gone (a test
// that crashed before its destructors ran).
void DeleteStaleNamespaces() {
  std::string list;
  if (RunShell("ip netns list", &list) != 0) return;
  for (absl::string_view line : absl::StrSplit(list, '\n', absl::SkipEmpty())) {
    const std::string name(line.substr(0, line.find(' ')));
    if (!absl::StartsWith(name, "meshfb")) continue;
    const size_t x = name.find('x');
    int pid = 0;
    if (x == std::string::npos || !absl::SimpleAtoi(name.substr(6, x - 6), &pid)) continue;
    if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) {
      RunShell(absl::StrCat("ip netns del ", name));
    }
  }
}

}  // namespace

int RunShell(const std::string& command, std::string* output) {
  FILE* pipe = popen(absl::StrCat(command, " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  std::string out;
  char buffer[4096];
  size_t n = 0;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  const int status = pclose(pipe);
  if (output != nullptr) *output = out;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// ---- NetnsLink ------------------------------------------------------------

std::optional<std::string> NetnsLink::Unsupported() {
  if (geteuid() != 0) return "network namespaces need root (CAP_NET_ADMIN); running as non-root";
  if (access("/usr/sbin/ip", X_OK) != 0 && access("/sbin/ip", X_OK) != 0 &&
      access("/usr/bin/ip", X_OK) != 0) {
    return "no `ip` command (iproute2) on this machine";
  }
  std::string out;
  const std::string probe = absl::StrCat("meshfb", getpid(), "xprobe");
  if (RunShell(absl::StrCat("ip netns add ", probe), &out) != 0) {
    return absl::StrCat("`ip netns add` failed (no CAP_NET_ADMIN?): ", out);
  }
  RunShell(absl::StrCat("ip netns del ", probe));
  return std::nullopt;
}

absl::StatusOr<std::unique_ptr<NetnsLink>> NetnsLink::Create() {
  DeleteStaleNamespaces();
  static int counter = 0;
  const int n = counter++;
  std::unique_ptr<NetnsLink> link(new NetnsLink());
  link->ns_ = absl::StrCat("meshfb", getpid(), "x", n);
  // Interface names are at most 15 characters.
  const std::string base = absl::StrCat("mfb", getpid() % 1000000, n % 10);
  link->host_dev_ = base + "a";
  link->peer_dev_ = base + "b";
  // 10.213.<a>.<b>/30, from the pid and counter: unique among concurrent
  // runs of these tests on one machine.
  const int block = (getpid() * 4 + n) % 16384;
  const int a = block / 64;
  const int b = (block % 64) * 4;
  link->host_ip_ = absl::StrCat("10.213.", a, ".", b + 1);
  link->peer_ip_ = absl::StrCat("10.213.", a, ".", b + 2);
  const std::string in_ns = absl::StrCat("ip netns exec ", link->ns_, " ");
  for (const std::string& command : {
           absl::StrCat("ip netns add ", link->ns_),
           absl::StrCat("ip link add ", link->host_dev_, " type veth peer name ", link->peer_dev_),
           absl::StrCat("ip link set ", link->peer_dev_, " netns ", link->ns_),
           absl::StrCat("ip addr add ", link->host_ip_, "/30 dev ", link->host_dev_),
           absl::StrCat("ip link set ", link->host_dev_, " up"),
           absl::StrCat(in_ns, "ip addr add ", link->peer_ip_, "/30 dev ", link->peer_dev_),
           absl::StrCat(in_ns, "ip link set ", link->peer_dev_, " up"),
           absl::StrCat(in_ns, "ip link set lo up"),
       }) {
    std::string out;
    if (RunShell(command, &out) != 0) {
      return absl::FailedPreconditionError(absl::StrCat("`", command, "` failed: ", out));
    }
  }
  return link;
}

NetnsLink::~NetnsLink() {
  // Deleting the host end deletes the pair; deleting the namespace after
  // its processes are gone frees it.
  RunShell(absl::StrCat("ip link del ", host_dev_));
  RunShell(absl::StrCat("ip netns del ", ns_));
}

std::vector<std::string> NetnsLink::ExecPrefix() const { return {"ip", "netns", "exec", ns_}; }

absl::Status NetnsLink::Cut() {
  std::string out;
  if (RunShell(absl::StrCat("ip netns exec ", ns_, " ip link set ", peer_dev_, " down"), &out) !=
      0) {
    return absl::InternalError(absl::StrCat("cannot cut ", ns_, ": ", out));
  }
  return absl::OkStatus();
}

absl::Status NetnsLink::Heal() {
  std::string out;
  if (RunShell(absl::StrCat("ip netns exec ", ns_, " ip link set ", peer_dev_, " up"), &out) != 0) {
    return absl::InternalError(absl::StrCat("cannot heal ", ns_, ": ", out));
  }
  return absl::OkStatus();
}

absl::Status NetnsLink::AddLatency(const std::string& delay, const std::string& jitter) {
  std::string out;
  const std::string qdisc = absl::StrCat(" root netem delay ", delay, " ", jitter);
  if (RunShell(absl::StrCat("tc qdisc add dev ", host_dev_, qdisc), &out) != 0) {
    return absl::UnimplementedError(absl::StrCat("tc netem on ", host_dev_, ": ", out));
  }
  if (RunShell(absl::StrCat("ip netns exec ", ns_, " tc qdisc add dev ", peer_dev_, qdisc), &out) !=
      0) {
    return absl::UnimplementedError(absl::StrCat("tc netem on ", peer_dev_, ": ", out));
  }
  return absl::OkStatus();
}

// ---- CpuBurner ------------------------------------------------------------

CpuBurner::CpuBurner(int cores, absl::Duration max_duration) {
  const absl::Time end = absl::Now() + max_duration;
  for (int i = 0; i < cores; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      volatile uint64_t x = 0;
      while (absl::Now() < end) {
        for (int j = 0; j < 1000000; ++j) x = x + j;
      }
      _exit(0);
    }
    if (pid > 0) children_.push_back(pid);
  }
}

CpuBurner::~CpuBurner() {
  for (pid_t pid : children_) kill(pid, SIGKILL);
  for (pid_t pid : children_) waitpid(pid, nullptr, 0);
}

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
  std::vector<std::string> argv = {MESH_COORDINATOR_BIN,
                                   "--insecure",
                                   "--listen",
                                   flags.listen,
                                   "--port",
                                   "0",
                                   "--state-dir",
                                   dir_ + "/state",
                                   "--node-heartbeat-interval",
                                   absl::StrCat(flags.node_heartbeat_interval),
                                   "--node-heartbeat-timeout",
                                   absl::StrCat(flags.node_heartbeat_timeout),
                                   "--kill-grace",
                                   "1",
                                   "--shutdown-grace",
                                   "0.5"};
  if (flags.heartbeat_interval > 0) {
    argv.insert(argv.end(), {"--heartbeat-interval", absl::StrCat(flags.heartbeat_interval),
                             "--heartbeat-timeout", absl::StrCat(flags.heartbeat_timeout)});
  }
  argv.insert(argv.end(), flags.extra.begin(), flags.extra.end());
  absl::StatusOr<Subprocess> process = Subprocess::Start(argv);
  if (!process.ok()) return process.status();
  absl::StatusOr<std::string> line = process->ReadLine(kStartTimeout);
  if (!line.ok()) return line.status();
  if (!absl::StartsWith(*line, kBanner)) {
    return absl::InternalError(absl::StrCat("unexpected first line: ", *line));
  }
  address_ = line->substr(sizeof(kBanner) - 1);
  coordinator_ = std::make_unique<Subprocess>(*std::move(process));
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  channel_ = grpc::CreateCustomChannel(address_, grpc::InsecureChannelCredentials(), args);
  jobs_ = mesh::v1::JobService::NewStub(channel_);
  return absl::OkStatus();
}

int FaultCluster::port() const {
  int port = 0;
  (void)absl::SimpleAtoi(address_.substr(address_.rfind(':') + 1), &port);
  return port;
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
  argv.insert(
      argv.end(),
      {MESH_AGENT_BIN, "--coordinator", flags.coordinator.empty() ? address_ : flags.coordinator,
       "--name", flags.name, "--address", flags.address, "--slots", absl::StrCat(flags.slots),
       "--gpus", "none", "--work-dir", absl::StrCat(dir_, "/agent-", index), "--grace", "1"});
  absl::StatusOr<Subprocess> process = Subprocess::Start(argv);
  if (!process.ok()) return process.status();
  agents_.push_back(std::make_unique<Subprocess>(*std::move(process)));
  return absl::OkStatus();
}

std::unique_ptr<grpc::ClientContext> FaultCluster::Context(absl::Duration timeout) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return context;
}

std::optional<mesh::v1::Node> FaultCluster::GetNode(const std::string& name) {
  mesh::v1::ListNodesRequest request;
  mesh::v1::ListNodesResponse response;
  if (!jobs_->ListNodes(Context().get(), request, &response).ok()) return std::nullopt;
  for (const auto& node : response.nodes()) {
    if (node.name() == name) return node;
  }
  return std::nullopt;
}

int FaultCluster::ReadyNodes() {
  mesh::v1::ListNodesRequest request;
  mesh::v1::ListNodesResponse response;
  if (!jobs_->ListNodes(Context().get(), request, &response).ok()) return -1;
  int ready = 0;
  for (const auto& node : response.nodes()) ready += node.state() == mesh::v1::NODE_STATE_READY;
  return ready;
}

bool FaultCluster::WaitNodeState(const std::string& name, mesh::v1::NodeState state,
                                 absl::Duration timeout) {
  return Eventually(timeout, [&] {
    auto node = GetNode(name);
    return node.has_value() && node->state() == state;
  });
}

mesh::v1::JobSpec FaultCluster::ShellJob(const std::string& script, int nodes, int nproc,
                                         int max_restarts) {
  mesh::v1::JobSpec spec;
  spec.set_name("fault-b");
  spec.add_command("/bin/sh");
  spec.add_command("-c");
  spec.add_command(script);
  spec.mutable_nodes()->set_min(nodes);
  spec.set_nproc_per_node(nproc);
  spec.set_max_restarts(max_restarts);
  (*spec.mutable_env())["MARKER"] = marker_;
  return spec;
}

std::string FaultCluster::Submit(const mesh::v1::JobSpec& spec) {
  mesh::v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  mesh::v1::SubmitJobResponse response;
  const grpc::Status status = jobs_->SubmitJob(Context().get(), request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response.job().id();
}

std::optional<mesh::v1::Job> FaultCluster::Get(const std::string& id) {
  mesh::v1::GetJobRequest request;
  request.set_job_id(id);
  mesh::v1::GetJobResponse response;
  if (!jobs_->GetJob(Context().get(), request, &response).ok()) return std::nullopt;
  return response.job();
}

bool FaultCluster::WaitForState(const std::string& id, mesh::v1::JobState state,
                                absl::Duration timeout) {
  return Eventually(timeout, [&] {
    auto job = Get(id);
    return job.has_value() && job->state() == state;
  });
}

std::optional<mesh::v1::Job> FaultCluster::WaitTerminal(const std::string& id,
                                                        absl::Duration timeout) {
  mesh::v1::WaitJobRequest request;
  request.set_job_id(id);
  request.set_timeout_seconds(absl::ToDoubleSeconds(timeout));
  mesh::v1::WaitJobResponse response;
  const grpc::Status status =
      jobs_->WaitJob(Context(timeout + absl::Seconds(5)).get(), request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  if (!status.ok()) return std::nullopt;
  return response.job();
}

std::vector<pid_t> FaultCluster::Processes(const std::vector<std::string>& entries) const {
  std::vector<std::string> all = {"MARKER=" + marker_};
  all.insert(all.end(), entries.begin(), entries.end());
  return ::mesh::testing::LiveProcessesWithEnv(all);
}

}  // namespace mesh::fault
