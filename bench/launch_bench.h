// mesh-bench launch: how long Mesh takes from a SubmitJob reply to every
// rank of an N-process CPU job having joined, against torchrun starting N
// trivial Python workers that join a gloo process group.
//
// Mesh half. A real mesh-coordinator and one mesh-agent (--slots N) run as
// child processes, started with cli/cluster.h's RunClusterUp on a thread of
// their own (their PR_SET_PDEATHSIG is tied to it). After one unmeasured
// job, each round:
//
//   SubmitJob(1 node x N procs, mesh-bench-launch-worker) ──reply── t0
//     coordinator: SCHEDULED ─ order ─▶ agent: fork/exec N workers ─▶ RUNNING
//     each worker: WorkerService.Join ── completes once all N joined ── t_r
//   launch = max_r(t_r) - t0            (then WaitJob until SUCCEEDED)
//
// The workers (bench/launch_worker.cc) write their times to files in a
// per-round temp dir named by the job env LAUNCH_BENCH_OUT (MESH_* is
// reserved for the agent). Everything runs on one host, so one clock.
//
// torchrun half (skipped, with a reason, when python3 cannot import torch
// or torchrun is not on PATH). Each round:
//
//   t0 ── spawn torchrun --standalone --nproc_per_node N launch_worker.py
//     each worker: import torch; init_process_group("gloo") ── t_r
//   launch = max_r(t_r) - t0            (then torchrun exits 0)
//
// The two halves are what a user waits for in each system: Mesh's clock
// starts once the job is accepted (the client is already running), torchrun's
// when the launcher is spawned (it is the client). Rounds alternate the two,
// so drift on a shared machine hits both alike; the ratio is of medians.
//
// Every wait has a deadline (options.round_timeout, options.start_timeout);
// every child is stopped and reaped and the temp dir removed on every path.
//
// Thread safety: RunLaunchBench runs one bench at a time per process.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace mesh::bench {

inline constexpr const char* kLaunchWorkerBinary = "mesh-bench-launch-worker";
inline constexpr const char* kLaunchWorkerScript = "launch_worker.py";

struct LaunchBenchOptions {
  // Ranks per job (processes on the one local node), >= 1.
  int nproc = 8;
  // Measured rounds of each half, >= 1; and unmeasured warm-up rounds first.
  int rounds = 5;
  int warmup = 1;
  // Binaries; empty: found like `meshctl cluster up` does (next to
  // mesh-bench, the build tree, PATH). The worker defaults to
  // mesh-bench-launch-worker next to mesh-bench.
  std::string coordinator_bin;
  std::string agent_bin;
  std::string worker_bin;
  // The torchrun worker; empty: launch_worker.py next to mesh-bench (the
  // build copies it there), else the source tree's bench/.
  std::string torch_worker;
  // Skip the torchrun half.
  bool no_torchrun = false;
  // Bound on one round of either half, and on starting the cluster.
  absl::Duration round_timeout = absl::Seconds(60);
  absl::Duration start_timeout = absl::Seconds(30);
};

// One Mesh round. Times are seconds from t0, the SubmitJob reply.
struct MeshLaunchRound {
  std::string job_id;
  double submit_rpc_s = 0;  // SubmitJob's own latency (before t0).
  double launch_s = 0;      // Until the last rank's Join returned.
  // The job's SCHEDULED and RUNNING events (coordinator clock, ms
  // resolution, so they may read slightly negative); -1 when absent.
  double scheduled_s = -1;
  double running_s = -1;
  // When the first and the last worker's main() began.
  double first_main_s = 0;
  double last_main_s = 0;
  double succeeded_s = 0;  // When WaitJob returned SUCCEEDED.
};

// One torchrun round. Times are seconds from spawning torchrun.
struct TorchLaunchRound {
  double launch_s = 0;  // Until the last rank's init_process_group returned.
  double first_main_s = 0;
  double last_main_s = 0;
  double exited_s = 0;  // When torchrun exited.
};

struct LaunchBenchResult {
  int nproc = 0;
  double load_average = 0;  // When the run started (/proc/loadavg).
  std::string coordinator;  // The child coordinator's address.
  std::vector<MeshLaunchRound> mesh;
  double mesh_median_s = 0;
  // The torchrun half ran (else torch_skip_reason says why).
  bool torchrun_ran = false;
  std::string torchrun_skip_reason;
  std::vector<TorchLaunchRound> torchrun;
  double torchrun_median_s = 0;
  // torchrun_median_s / mesh_median_s; 0 when torchrun did not run.
  double ratio = 0;
};

// The goals: Mesh under 0.3 s, and at least 5x faster than torchrun.
inline constexpr double kLaunchGoalSeconds = 0.3;
inline constexpr double kLaunchGoalRatio = 5.0;

// Why the torchrun half cannot run ("" when it can): torchrun is not on
// `path_env`, or `python3 -c "import torch"` fails (runs python3, with a
// deadline).
std::string TorchrunUnavailableReason(const std::string& path_env);

// Runs the benchmark. Possible errors: INVALID_ARGUMENT for bad options;
// NOT_FOUND for a binary that cannot be found (naming where it looked and
// the flag); UNAVAILABLE when the cluster does not come up (with the tail of
// its diagnostics); DEADLINE_EXCEEDED when a round does not finish in time;
// INTERNAL when a job does not SUCCEED, a worker writes no or a bad time,
// or torchrun fails (naming the job, the ranks or the exit status, and the
// logs kept for reading).
absl::StatusOr<LaunchBenchResult> RunLaunchBench(const LaunchBenchOptions& options);

nlohmann::json ToJson(const LaunchBenchResult& result);

// The human-readable report `mesh-bench launch` prints.
std::string FormatLaunchReport(const LaunchBenchResult& result, int warmup);

}  // namespace mesh::bench
