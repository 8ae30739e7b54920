// mesh-bench collectives: bus bandwidth of the Gloo backend's collectives, in
// the manner of nccl-tests.
//
// One driver, one descriptor per collective (bytes per size, buffers, the
// bus-bandwidth factor, how to run and check it). For every op and every
// size from min_bytes to max_bytes (multiplied by `factor`), each rank runs
// `warmup` untimed iterations, then issues `iterations` ops back to back and
// waits for the last; the time per op is the slowest rank's average.
//
//   algbw = bytes / time
//   busbw = algbw * 2(n-1)/n  all_reduce
//           algbw * (n-1)/n   all_gather, reduce_scatter, all_to_all
//           algbw             broadcast
//
// "bytes" is nccl-tests' size: the all-reduce and broadcast buffer, the
// all-gather output, the reduce-scatter input, the all-to-all buffer. Counts
// are rounded down to a multiple of the process count where the op splits
// the buffer.
//
// Processes (bench/bench_workers.h). The parent starts a coordinator
// in-process on 127.0.0.1:0, creates an n-rank job on it and re-executes
// the mesh-bench binary n times (worker mode). Each worker joins the job,
// rendezvouses its Gloo world through the coordinator's key-value store,
// exactly as a worker of a real job does, and runs the sizes. Rank 0
// streams one JSON row per size to the parent over its stdout.
//
// With `check`, each size runs once more on fresh deterministic data and
// every element is compared with the reference (small integers, exact in
// every dtype): the row's "wrong" counts mismatches over all ranks.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bench/bench_workers.h"
#include "mesh/dtype.h"
#include "mesh/process_group_gloo.h"

namespace mesh::bench {

struct CollectivesBenchOptions {
  int64_t min_bytes = 64 * 1024;
  int64_t max_bytes = 64 * 1024 * 1024;
  int factor = 4;
  int iterations = 20;
  int warmup = 5;
  bool check = false;
  int nproc = 2;
  // Any of all_reduce, all_gather, reduce_scatter, all_to_all, broadcast.
  std::vector<std::string> ops = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                  "broadcast"};
  DType dtype = DType::kFloat32;
  GlooAllreduceAlgorithm allreduce_algorithm = GlooAllreduceAlgorithm::kAuto;
  // Address the workers' Gloo sockets bind to.
  std::string hostname = "127.0.0.1";
  // GlooOptions::shared_memory (libmesh's default on one host); the bench
  // measures TCP unless --shm, so that both rows can be compared.
  bool shared_memory = false;
  // GlooOptions::batch_device_thread (libmesh's default: on). Off only to
  // compare with the behaviour before it existed.
  bool batch_device_thread = true;
  // Gloo's per-op timeout, and the rendezvous timeout.
  absl::Duration timeout = absl::Seconds(120);
  // The whole run, after which the parent kills the workers.
  absl::Duration deadline = absl::Minutes(30);
  // The mesh-bench binary to re-execute; empty means /proc/self/exe.
  std::string executable;
};

struct CollectivesRow {
  std::string op;
  int64_t bytes = 0;
  int64_t count = 0;  // Elements of the buffer `bytes` measures.
  double time_us = 0;
  double algbw_gbps = 0;
  double busbw_gbps = 0;
  int64_t wrong = -1;     // -1: not checked.
  std::string algorithm;  // all_reduce only: "ring" or "bcube".
};

struct CollectivesBenchResult {
  int nproc = 0;
  std::string dtype;
  std::vector<CollectivesRow> rows;
};

// The parent: starts the coordinator and the workers, collects rank 0's
// rows. `on_row` (may be empty) sees each row as it arrives.
// Possible errors: INVALID_ARGUMENT for bad options (sizes, factor < 2,
// unknown op, nproc < 1); UNAVAILABLE when the coordinator or a worker cannot
// be started; INTERNAL naming the worker that failed and how;
// DEADLINE_EXCEEDED past `deadline`.
absl::StatusOr<CollectivesBenchResult> RunCollectivesBench(
    const CollectivesBenchOptions& options,
    const std::function<void(const CollectivesRow&)>& on_row = nullptr);

// A worker (what the re-executed binary runs): joins `job` at `coordinator`
// as `rank`, runs every size and, on rank 0, passes each row to `emit`.
// Possible errors: those of the join, the rendezvous and the collectives.
absl::Status RunCollectivesWorker(const CollectivesBenchOptions& options, int rank,
                                  const std::string& coordinator, const std::string& job,
                                  const std::function<void(const CollectivesRow&)>& emit);

// Validates options as RunCollectivesBench does.
absl::Status ValidateCollectivesOptions(const CollectivesBenchOptions& options);

nlohmann::json ToJson(const CollectivesRow& row);
absl::StatusOr<CollectivesRow> RowFromJson(const nlohmann::json& json);
nlohmann::json ToJson(const CollectivesBenchOptions& options, const CollectivesBenchResult& result);

// nccl-tests-style table lines.
std::string CollectivesHeader(const CollectivesBenchOptions& options);
std::string FormatRow(const CollectivesRow& row, const std::string& dtype);

}  // namespace mesh::bench
