// mesh-bench redistribute: what mesh::Redistribute (mesh/dtensor.h) costs
// over the raw collectives it is made of, on the Gloo backend.
//
// For each transition and each global tensor size, every rank alternates a
// Redistribute of a DTensor and the same communication done by hand on the
// mesh's groups, with preallocated buffers:
//
//   transition          mesh        raw baseline (the same bytes)
//   S(0) -> R           (n)         AllGather
//   P(sum) -> R         (n)         AllReduce (in place)
//   P(sum) -> S(0)      (n)         ReduceScatter
//   S(0) -> S(1)        (n)         AllToAll
//   [S(0), S(1)] ->     (2, n/2)    the raw collectives of the steps its plan
//     [R, R]                        takes, one after the other
//
// The baseline of every row is built from the plan PlanRedistribute makes
// (one raw collective per non-local step, on that step's group, sized from
// the layout before the step); for the 1-D rows the plan must be the single
// step the table names, or the worker fails. So the ratio is Redistribute's
// overhead (planning or the plan cache, allocating the result, packing and
// unpacking shards, copies) over the communication itself.
//
// A third side, the floor, adds to the raw collectives, serially, the local
// copies that the change of layout needs whoever makes it: S(0) -> S(1)
// must gather each peer's strided column block into a contiguous message
// (Gloo sends contiguous ranges), and an all_gather along dim 1 must scatter
// the blocks it receives into strided places (this rank's own piece is left
// out: the collective copies it already). For rows that need none it equals
// the raw side. Redistribute / floor is the overhead over that work done
// one after the other; Redistribute overlaps the copies with the transfers,
// so it can come out below 1.
//
// Timing: `warmup` untimed rounds, then `iterations` rounds; in each, the
// ranks meet at a barrier before each side, and a side's time is the slowest
// rank's. Round i starts with side i mod 3 (Redistribute, raw, floor), so no
// side always follows another. Rows report the median over rounds of each
// side (ratio: their quotient) and the median of the rounds' own quotients
// (paired_ratio; floor_ratio against the floor). Each row first checks one
// Redistribute's local result against the global tensor ("wrong" counts
// mismatched elements over all ranks).
//
// Tensors are float32 [rows, cols] with rows the largest power of two at
// most sqrt(elements), so sizes that are powers of two give square-ish
// shapes whose dims every mesh dim of a power-of-two world divides.
//
// Processes: bench/bench_workers.h, one job per world size in `nprocs`.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace mesh::bench {

struct RedistributeBenchOptions {
  // Global tensor bytes, one row per size and transition.
  std::vector<int64_t> sizes = {int64_t{16} << 20, int64_t{64} << 20};
  // World sizes; the 2-D row runs for even worlds of at least 4.
  std::vector<int> nprocs = {2, 4};
  // Any of s0_r, p_r, p_s0, s0_s1, s0s1_rr (RedistributeCaseNames()).
  std::vector<std::string> cases = {"s0_r", "p_r", "p_s0", "s0_s1", "s0s1_rr"};
  int iterations = 10;
  int warmup = 3;
  // Address the workers' Gloo sockets bind to.
  std::string hostname = "127.0.0.1";
  // GlooOptions::shared_memory; off by default, as for `collectives`.
  bool shared_memory = false;
  // Gloo's per-op timeout, and the join and rendezvous timeout.
  absl::Duration timeout = absl::Seconds(120);
  // Each world size's run, after which the parent kills its workers.
  absl::Duration deadline = absl::Minutes(30);
  // The mesh-bench binary to re-execute; empty means /proc/self/exe.
  std::string executable;
};

struct RedistributeRow {
  std::string case_name;   // "s0_r"
  std::string transition;  // "S(0) -> R"
  std::string mesh;        // "(4)", "(2, 2)"
  int nproc = 0;
  std::vector<int64_t> shape;  // The global tensor's.
  int64_t bytes = 0;           // Its bytes.
  // The plan's steps: "all_gather", or "all_gather(dp) + all_gather(tp)".
  std::string plan;
  int64_t plan_bytes_per_rank = 0;  // RedistributePlan::bytes_per_rank.
  double redistribute_us = 0;       // Median.
  double raw_us = 0;                // Median.
  double ratio = 0;                 // redistribute_us / raw_us.
  // The median over rounds of that round's Redistribute / raw: the two
  // sides of a round run back to back, so a load change between rounds
  // (this machine is shared) moves both.
  double paired_ratio = 0;
  // The floor: the raw collectives plus the local copies the layout change
  // needs whoever does it (packing strided all_to_all pieces, unpacking an
  // all_gather along a dim with something before it), by hand. Equal to the
  // raw side (layout_copies false) for rows that need none.
  double floor_us = 0;     // Median.
  double floor_ratio = 0;  // Median over rounds of Redistribute / floor.
  bool layout_copies = false;
  int64_t wrong = 0;
};

struct RedistributeBenchResult {
  std::vector<RedistributeRow> rows;
};

// "s0_r", "p_r", "p_s0", "s0_s1", "s0s1_rr".
std::vector<std::string> RedistributeCaseNames();

// Possible errors (INVALID_ARGUMENT): no sizes or a size below 4 bytes, no
// world sizes or one below 1, an unknown case, iterations < 1, warmup < 0,
// a timeout <= 0.
absl::Status ValidateRedistributeOptions(const RedistributeBenchOptions& options);

// The parent: one job of worker processes per world size; `on_row` (may be
// empty) sees each row as it arrives.
// Possible errors: those of ValidateRedistributeOptions and RunBenchWorkers
// (a worker's own error is on its stderr, which is inherited).
absl::StatusOr<RedistributeBenchResult> RunRedistributeBench(
    const RedistributeBenchOptions& options,
    const std::function<void(const RedistributeRow&)>& on_row = nullptr);

// A worker: joins `job` as `rank` of `nproc`, runs every case and size, and
// on rank 0 passes each row to `emit`.
// Possible errors: INVALID_ARGUMENT for a size whose shape the mesh does not
// divide; INTERNAL when a 1-D plan is not the expected single step, or a
// result is wrong; those of the join, the rendezvous, the DTensor calls and
// the collectives.
absl::Status RunRedistributeWorker(const RedistributeBenchOptions& options, int nproc, int rank,
                                   const std::string& coordinator, const std::string& job,
                                   const std::function<void(const RedistributeRow&)>& emit);

nlohmann::json ToJson(const RedistributeRow& row);
absl::StatusOr<RedistributeRow> RedistributeRowFromJson(const nlohmann::json& json);
nlohmann::json ToJson(const RedistributeBenchOptions& options,
                      const RedistributeBenchResult& result);

// A markdown table: the header (with the run's settings) and one line per row.
std::string RedistributeHeader(const RedistributeBenchOptions& options);
std::string FormatRow(const RedistributeRow& row);

}  // namespace mesh::bench
