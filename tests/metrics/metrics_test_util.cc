#include "tests/metrics/metrics_test_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "tests/common/http_get.h"
#include "tests/util/cluster_queries.h"
#include "tests/util/mesh_cluster.h"
#include "tests/util/proc.h"

namespace mesh::testing {
namespace {

constexpr absl::Duration kStartTimeout = absl::Seconds(30);

std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout = absl::Seconds(10)) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return context;
}

}  // namespace

std::optional<std::string> FindTool(const std::string& name, const std::string& env_override) {
  if (const char* value = std::getenv(env_override.c_str()); value != nullptr && *value != '\0') {
    if (access(value, X_OK) == 0) return std::string(value);
    return std::nullopt;
  }
  const char* path = std::getenv("PATH");
  for (absl::string_view dir :
       absl::StrSplit(path == nullptr ? "/usr/bin:/bin" : path, ':', absl::SkipEmpty())) {
    std::string candidate = absl::StrCat(dir, "/", name);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return std::nullopt;
}

std::string MissingToolMessage(const std::string& tool, const std::string& env_override,
                               const std::string& package) {
  return absl::StrCat(
      "\n*************************************************************************\n", "SKIPPED: '",
      tool, "' was not found on PATH (or in $", env_override,
      "). This test did NOT run. Install Debian's '", package,
      "' package (scripts/install-deps.sh does, without starting its service) or set $",
      env_override, " to the binary.\n",
      "*************************************************************************");
}

absl::StatusOr<ToolResult> RunTool(const std::vector<std::string>& argv,
                                   const std::string& stdin_file, absl::Duration timeout) {
  // sh redirects stdin and joins stderr to the captured stdout, then execs
  // the tool itself (the arguments never pass through the shell's parser).
  std::vector<std::string> shell = {"/bin/sh", "-c",
                                    "exec \"$0\" \"$@\" <\"$MESH_TOOL_STDIN\" 2>&1"};
  shell.insert(shell.end(), argv.begin(), argv.end());
  auto process = Subprocess::Start(
      shell, {absl::StrCat("MESH_TOOL_STDIN=", stdin_file.empty() ? "/dev/null" : stdin_file)});
  if (!process.ok()) return process.status();
  const absl::Time deadline = absl::Now() + timeout;
  ToolResult result;
  for (;;) {
    auto line = process->ReadLine(deadline - absl::Now());
    if (line.ok()) {
      absl::StrAppend(&result.output, *line, "\n");
      continue;
    }
    if (absl::IsOutOfRange(line.status())) break;
    return absl::DeadlineExceededError(absl::StrCat(argv[0], " did not finish within ",
                                                    absl::FormatDuration(timeout),
                                                    "; output so far:\n", result.output));
  }
  auto status = process->Wait(std::max(deadline - absl::Now(), absl::Seconds(1)));
  if (!status.ok()) {
    return absl::DeadlineExceededError(
        absl::StrCat(argv[0], " closed its output but did not exit: ", status.status().message()));
  }
  result.exit_code = WIFEXITED(*status) ? WEXITSTATUS(*status) : 128 + WTERMSIG(*status);
  return result;
}

absl::StatusOr<int> FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("socket failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  if (!ok) return absl::InternalError("cannot bind a free port on 127.0.0.1");
  return static_cast<int>(ntohs(addr.sin_port));
}

namespace {

// The kernel's ephemeral port range (ip_local_port_range); 32768-60999
// when it cannot be read.
std::pair<int, int> EphemeralPorts() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  int high = 0;
  if (in >> low >> high && low > 0 && high >= low) return {low, high};
  return {32768, 60999};
}

bool CanBind(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

absl::StatusOr<std::string> FreePortRange(int n) {
  // Below the ephemeral range: a port bound with port 0 (FreePort) comes
  // from that range, where any test's outgoing connection, or server on
  // port 0, may take it before the worker binds it (a worker then runs
  // without /metrics). Random starts keep parallel tests apart.
  const auto [ephemeral_low, ephemeral_high] = EphemeralPorts();
  const int low = 10000;
  const int high = ephemeral_low > low + n ? ephemeral_low - n : 65535 - n;
  const int start_low = ephemeral_low > low + n ? low : ephemeral_high + 1;
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> pick(start_low, high);
  for (int attempt = 0; attempt < 50; ++attempt) {
    const int first = pick(rng);
    bool all_free = true;
    for (int port = first; port < first + n && all_free; ++port) all_free = CanBind(port);
    if (all_free) return absl::StrCat(first, "-", first + n - 1);
  }
  return absl::InternalError(absl::StrCat("found no ", n, " consecutive free ports"));
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

absl::Status WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::trunc);
  out << contents;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<SdTarget>> ReadSdFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  nlohmann::json groups = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!groups.is_array()) {
    return absl::InternalError(absl::StrCat(path, " is not a JSON array: ", *text));
  }
  std::vector<SdTarget> targets;
  for (const nlohmann::json& group : groups) {
    if (!group.is_object() || !group.contains("targets") || !group["targets"].is_array()) {
      return absl::InternalError(absl::StrCat(path, ": a group without targets: ", group.dump()));
    }
    const nlohmann::json labels = group.value("labels", nlohmann::json::object());
    for (const nlohmann::json& address : group["targets"]) {
      SdTarget target;
      target.address = address.is_string() ? address.get<std::string>() : "";
      const size_t colon = target.address.rfind(':');
      if (colon == std::string::npos ||
          !absl::SimpleAtoi(target.address.substr(colon + 1), &target.port)) {
        return absl::InternalError(absl::StrCat(path, ": bad target ", address.dump()));
      }
      target.component = labels.value("mesh_component", "");
      target.node = labels.value("node", "");
      target.job = labels.value("mesh_job", "");
      targets.push_back(std::move(target));
    }
  }
  return targets;
}

std::string UrlEncode(const std::string& value) {
  std::string out;
  for (unsigned char c : value) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      absl::StrAppend(&out, "%", absl::Hex(c, absl::kZeroPad2));
    }
  }
  return out;
}

absl::StatusOr<std::string> Scrape(int port, absl::Duration timeout) {
  absl::StatusOr<HttpReply> reply = HttpGet(port, "/metrics", timeout);
  if (!reply.ok()) return reply.status();
  if (reply->status != 200) {
    return absl::InternalError(
        absl::StrCat("GET :", port, "/metrics: HTTP ", reply->status, ": ", reply->body));
  }
  return reply->body;
}

// ---------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<MetricsCluster>> MetricsCluster::Start() {
  std::unique_ptr<MetricsCluster> cluster(new MetricsCluster());
  char pattern[] = "/tmp/mesh-metrics-test-XXXXXX";
  if (mkdtemp(pattern) == nullptr) return absl::InternalError("mkdtemp failed");
  cluster->dir_ = pattern;
  cluster->sd_file_ = cluster->dir_ + "/targets.json";
  if (absl::Status s = cluster->StartProcesses(); !s.ok()) return s;
  return cluster;
}

absl::Status MetricsCluster::StartProcesses() {
  // The harness's coordinator and agent command lines (tests/util/
  // mesh_cluster.h), plus the metrics flags under test.
  std::vector<std::string> argv =
      CoordinatorArgv(MESH_COORDINATOR_BIN, "127.0.0.1", 0, dir_ + "/state",
                      absl::Milliseconds(200), absl::Seconds(2));
  argv.insert(argv.end(), {"--metrics-port", "0", "--sd-file", sd_file_});
  absl::StatusOr<StartedCoordinator> coordinator = StartCoordinatorProcess(argv);
  if (!coordinator.ok()) return coordinator.status();
  address_ = coordinator->address;
  coordinator_ = std::move(coordinator->process);
  channel_ = grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
  jobs_ = mesh::v1::JobService::NewStub(channel_);

  for (int i = 0; i < kAgents; ++i) {
    absl::StatusOr<std::string> worker_ports = FreePortRange(2);
    if (!worker_ports.ok()) return worker_ports.status();
    std::vector<std::string> agent_argv =
        AgentArgv(MESH_AGENT_BIN, address_, absl::StrCat("node-", i), "127.0.0.1", 2,
                  absl::StrCat(dir_, "/agent-", i));
    agent_argv.insert(agent_argv.end(), {"--metrics-port", "0", "--metrics-listen", "127.0.0.1",
                                         "--worker-metrics-ports", *worker_ports});
    auto agent = Subprocess::Start(agent_argv);
    if (!agent.ok()) return agent.status();
    agents_.push_back(std::make_unique<Subprocess>(*std::move(agent)));
  }

  // Ready: every agent READY, and the SD file lists the coordinator and
  // every agent with a port.
  std::string seen = "nothing yet";
  const bool ready = WaitUntil(
      [&] {
        mesh::v1::ListNodesResponse nodes;
        if (!jobs_->ListNodes(Context().get(), mesh::v1::ListNodesRequest(), &nodes).ok()) {
          seen = "ListNodes failing";
          return false;
        }
        int ready_nodes = 0;
        for (const auto& node : nodes.nodes()) {
          ready_nodes += node.state() == mesh::v1::NODE_STATE_READY;
        }
        absl::StatusOr<std::vector<SdTarget>> targets = ReadSdFile(sd_file_);
        if (!targets.ok()) {
          seen = absl::StrCat(ready_nodes, " READY nodes; SD file: ", targets.status().message());
          return false;
        }
        int coordinators = 0;
        int agents = 0;
        for (const SdTarget& t : *targets) {
          coordinators += t.component == "coordinator" && t.port > 0;
          agents += t.component == "agent" && t.port > 0;
        }
        seen = absl::StrCat(ready_nodes, " READY nodes; SD file lists ", coordinators,
                            " coordinator(s) and ", agents, " agent(s)");
        return ready_nodes == kAgents && coordinators == 1 && agents == kAgents;
      },
      kStartTimeout);
  if (!ready) {
    return absl::DeadlineExceededError(
        absl::StrCat("cluster not ready after ", absl::FormatDuration(kStartTimeout), ": ", seen));
  }
  return absl::OkStatus();
}

MetricsCluster::~MetricsCluster() {
  agents_.clear();
  coordinator_.reset();
  if (!dir_.empty()) std::system(absl::StrCat("rm -rf '", dir_, "'").c_str());
}

absl::StatusOr<std::vector<SdTarget>> MetricsCluster::Targets(const std::string& component) {
  absl::StatusOr<std::vector<SdTarget>> all = ReadSdFile(sd_file_);
  if (!all.ok()) return all.status();
  std::vector<SdTarget> out;
  for (SdTarget& t : *all) {
    if (t.component == component) out.push_back(std::move(t));
  }
  return out;
}

absl::StatusOr<std::string> MetricsCluster::Submit(const mesh::v1::JobSpec& spec) {
  absl::StatusOr<mesh::v1::Job> job = SubmitJob(*jobs_, spec);
  if (!job.ok()) return job.status();
  return job->id();
}

absl::StatusOr<mesh::v1::Job> MetricsCluster::WaitTerminal(const std::string& id,
                                                           absl::Duration timeout) {
  return testing::WaitTerminal(*jobs_, id, timeout);
}

absl::StatusOr<std::string> MetricsCluster::StartHeldWorkerJob(const std::string& worker_bin,
                                                               std::vector<int>* worker_ports) {
  mesh::v1::JobSpec spec;
  spec.set_name("metrics-worker");
  spec.add_command(worker_bin);
  spec.mutable_nodes()->set_min(kAgents);
  spec.set_nproc_per_node(1);
  (*spec.mutable_env())["METRICS_TEST_DIR"] = dir_;
  absl::StatusOr<std::string> id = Submit(spec);
  if (!id.ok()) return id.status();

  worker_ports->assign(kAgents, 0);
  std::string seen;
  const bool written = WaitUntil(
      [&] {
        for (int rank = 0; rank < kAgents; ++rank) {
          absl::StatusOr<std::string> text =
              ReadFile(absl::StrCat(dir_, "/worker-", rank, ".port"));
          int port = 0;
          if (!text.ok() || !absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &port)) {
            mesh::v1::GetJobRequest request;
            request.set_job_id(*id);
            mesh::v1::GetJobResponse response;
            const grpc::Status status = jobs_->GetJob(Context().get(), request, &response);
            seen = absl::StrCat("rank ", rank, " wrote no port; job ",
                                status.ok() ? mesh::v1::JobState_Name(response.job().state())
                                            : status.error_message());
            return false;
          }
          (*worker_ports)[rank] = port;
        }
        return true;
      },
      absl::Seconds(60));
  if (!written) {
    return absl::DeadlineExceededError(absl::StrCat("metrics_worker job ", *id, ": ", seen));
  }
  return id;
}

absl::Status MetricsCluster::Release() { return WriteFile(dir_ + "/release", "\n"); }

}  // namespace mesh::testing
