// The process machinery the multi-rank benchmarks share (mesh-bench
// collectives, mesh-bench redistribute): a parent that runs N local worker
// processes against an in-process coordinator, and a worker's way into a
// Gloo world through that coordinator.
//
// Parent. RunBenchWorkers starts a coordinator on 127.0.0.1:0, creates an
// N-rank job on it and re-executes a binary (the bench itself, in worker
// mode) once per rank with the arguments `args` gives. Rank 0's stdout is
// read line by line: each line starting with kRowPrefix carries one JSON
// row, handed to `on_row`; other lines and the other ranks' stdout are
// dropped (stderr is inherited, so errors show). Workers get
// PR_SET_PDEATHSIG (SIGKILL) and check getppid() after it, so none outlives
// the parent; the parent SIGKILLs the rest when one fails.
//
// Worker. ConnectBenchWorker joins the job (no heartbeats: the coordinator is
// told to keep bench workers for the whole run) and rendezvouses a Gloo
// world through the coordinator's key-value store (CoordinatorStore),
// exactly as a worker of a real job does.
//
// Thread safety: the functions are independent; on_row is called on the
// calling thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "mesh/process_group_gloo.h"

namespace mesh::bench {

// The line prefix rank 0 writes before each JSON row on stdout.
inline constexpr char kRowPrefix[] = "MESH_BENCH_ROW ";

struct BenchWorkersOptions {
  int nproc = 2;
  // The job is "<job_prefix>-<pid>".
  std::string job_prefix = "bench";
  // The whole run, after which the parent kills the workers.
  absl::Duration deadline = absl::Minutes(30);
};

// argv (argv[0] a path) for `rank`, given the coordinator's address and the
// job's name.
using WorkerArgsFn = std::function<std::vector<std::string>(
    int rank, const std::string& coordinator, const std::string& job)>;

// Runs the workers to completion (see the file comment). `on_row` returning
// an error stops the run with that error.
// Possible errors: INVALID_ARGUMENT for nproc < 1; UNAVAILABLE when the
// coordinator or a worker cannot be started; INTERNAL naming the worker that
// failed and how, or a malformed row; DEADLINE_EXCEEDED past `deadline`.
absl::Status RunBenchWorkers(const BenchWorkersOptions& options, const WorkerArgsFn& args,
                             const std::function<absl::Status(const nlohmann::json&)>& on_row);

// Writes one row for the parent on stdout (rank 0 only calls it).
void EmitRow(const nlohmann::json& row);

// The worker side: joins `job` at `coordinator` as `rank` of `nproc` and
// creates a Gloo factory over the coordinator's store (`gloo.group.timeout`
// bounds every op; `timeout` the join and the rendezvous).
// Possible errors: those of the join, CoordinatorStore::Create and
// GlooProcessGroupFactory::Create.
absl::StatusOr<std::unique_ptr<GlooProcessGroupFactory>> ConnectBenchWorker(
    const std::string& coordinator, const std::string& job, int rank, int nproc,
    const GlooOptions& gloo, absl::Duration timeout);

}  // namespace mesh::bench
