// Helpers for tests/metrics: a local Mesh cluster with every /metrics port
// on (mesh-coordinator --metrics-port 0 --sd-file, two mesh-agents with
// --metrics-port 0 and worker ports), the coordinator's service-discovery
// file read back, external tools (promtool, prometheus, python3) found and
// run with a deadline.
//
// Errors: functions returning absl::Status name what failed: NOT_FOUND for a
// missing tool or file, DEADLINE_EXCEEDED for a wait that ran out (with what
// was seen last), INTERNAL for a malformed SD file or a failed fork.
//
// Thread safety: none; use from the test's thread. Ownership: MetricsCluster
// owns its processes and its temporary directory; its destructor kills the
// processes (Subprocess SIGKILLs their groups) and removes the directory.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "mesh/v1/job.grpc.pb.h"
#include "tests/util/subprocess.h"

namespace mesh::testing {

// The path of `name` from environment variable `env_override` when set,
// else the first executable `name` on $PATH; nullopt when there is none.
std::optional<std::string> FindTool(const std::string& name, const std::string& env_override);

// The loud message of a test that skips because `tool` is missing.
std::string MissingToolMessage(const std::string& tool, const std::string& env_override,
                               const std::string& package);

struct ToolResult {
  int exit_code = -1;  // 128 + signal when killed.
  std::string output;  // stdout and stderr together.
};

// Runs argv (argv[0] a path) with stdin from `stdin_file` (empty:
// /dev/null), collecting its output, for at most `timeout` (then it is
// killed and DEADLINE_EXCEEDED returned).
absl::StatusOr<ToolResult> RunTool(const std::vector<std::string>& argv,
                                   const std::string& stdin_file = "",
                                   absl::Duration timeout = absl::Seconds(60));

// A TCP port on 127.0.0.1 that was free a moment ago (bound with port 0,
// then closed), for programs that cannot report the port they bound.
absl::StatusOr<int> FreePort();

// `n` consecutive ports that were free a moment ago: "first-last", chosen
// at random below the kernel's ephemeral range, where no port-0 bind or
// outgoing connection of a parallel test can take them.
absl::StatusOr<std::string> FreePortRange(int n);

// One target of the coordinator's file service discovery.
struct SdTarget {
  std::string address;  // host:port
  int port = 0;
  std::string component;  // mesh_component: coordinator, agent or worker
  std::string node;       // agents and workers
  std::string job;        // workers: mesh_job
};

// Reads a Prometheus file_sd JSON file.
// Possible errors: NOT_FOUND (no file yet), INTERNAL (not the format).
absl::StatusOr<std::vector<SdTarget>> ReadSdFile(const std::string& path);

// Writes `contents` to `path`. Possible errors: INTERNAL.
absl::Status WriteFile(const std::string& path, const std::string& contents);
absl::StatusOr<std::string> ReadFile(const std::string& path);

// Percent-encodes a URL query value.
std::string UrlEncode(const std::string& value);

// Fetches http://127.0.0.1:port/metrics. Possible errors: the connection's,
// or INTERNAL for a status other than 200.
absl::StatusOr<std::string> Scrape(int port, absl::Duration timeout = absl::Seconds(10));

class MetricsCluster {
 public:
  static constexpr int kAgents = 2;

  // Starts the coordinator and kAgents agents in a new temporary directory
  // and waits until the agents are READY and the SD file lists the
  // coordinator and every agent.
  static absl::StatusOr<std::unique_ptr<MetricsCluster>> Start();
  ~MetricsCluster();

  const std::string& dir() const { return dir_; }
  const std::string& sd_file() const { return sd_file_; }
  const std::string& address() const { return address_; }  // gRPC
  mesh::v1::JobService::Stub& jobs() { return *jobs_; }

  // The SD file's targets of `component` (waits for none).
  absl::StatusOr<std::vector<SdTarget>> Targets(const std::string& component);

  // Submits `spec`; returns the job id.
  absl::StatusOr<std::string> Submit(const mesh::v1::JobSpec& spec);
  // Waits until the job is terminal and returns it.
  absl::StatusOr<mesh::v1::Job> WaitTerminal(const std::string& id, absl::Duration timeout);

  // A job of metrics_worker on every node, one rank per node, held up
  // until Release(); returns its id once every worker wrote its metrics
  // port, and the ports in rank order.
  absl::StatusOr<std::string> StartHeldWorkerJob(const std::string& worker_bin,
                                                 std::vector<int>* worker_ports);
  absl::Status Release();

 private:
  MetricsCluster() = default;
  absl::Status StartProcesses();

  std::string dir_;
  std::string sd_file_;
  std::string address_;
  std::unique_ptr<Subprocess> coordinator_;
  std::vector<std::unique_ptr<Subprocess>> agents_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<mesh::v1::JobService::Stub> jobs_;
};

}  // namespace mesh::testing
