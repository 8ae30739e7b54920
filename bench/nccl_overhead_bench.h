// mesh-bench nccl-overhead: what libmesh's NCCL process group adds to each
// all_reduce, against raw ncclAllReduce on the same device, world size 1,
// small float32 messages (where per-call overhead, not bandwidth, dominates).
//
// Both sides use a non-blocking communicator and call from a non-blocking
// stream (libmesh's side makes its stream current with CudaStreamGuard);
// libmesh's side additionally pays for its stream semantics and its Work.
// With --stream group (NcclStreamMode::kGroupStream, the default) that is
// an event recorded on the caller's stream and waited on by the group
// stream, a completion event, and Work::Wait making the caller's stream wait
// for it; with --stream current (kCurrentStream) only the completion event.
// Two figures per size:
//   pipelined   calls issued back to back in blocks, then one stream sync;
//               per-call time = block time / block size. Host overhead.
//   synchronous one call, then the host waits for it (cudaStreamSynchronize
//               vs SynchronizeWork); per-call latency.
// Blocks of the two sides alternate so that drift hits both alike.
//
// Without NCCL or a CUDA device the result says skipped, with the reason.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "bench/latency_stats.h"
#include "mesh/process_group_nccl.h"

namespace mesh::bench {

struct NcclOverheadOptions {
  // float32 element counts per all_reduce.
  std::vector<int64_t> elements = {1, 256, 4096, 65536};
  // Measured calls per size and side, and unmeasured warm-up calls.
  int iterations = 5000;
  int warmup = 500;
  // Calls per pipelined block (and per alternation of the sides).
  int block = 100;
  // CUDA device ordinal.
  int device = 0;
  // Where libmesh's side runs its ops.
  NcclStreamMode stream_mode = NcclStreamMode::kGroupStream;
};

struct NcclOverheadRow {
  int64_t elements = 0;
  int64_t bytes = 0;
  // Per-call time of pipelined blocks (one sample per block).
  LatencyStats raw_pipelined;
  LatencyStats mesh_pipelined;
  // Per-call latency with a host wait after each call.
  LatencyStats raw_sync;
  LatencyStats mesh_sync;
  double pipelined_ratio = 0;  // mesh p50 / raw p50.
  double sync_ratio = 0;
  // What libmesh adds per pipelined call: mesh p50 - raw p50.
  double pipelined_overhead_us = 0;
};

struct NcclOverheadResult {
  bool skipped = false;
  std::string skip_reason;  // "no CUDA device", "built without NCCL".
  std::string device_name;
  int nccl_version = 0;
  NcclStreamMode stream_mode = NcclStreamMode::kGroupStream;
  std::vector<NcclOverheadRow> rows;
};

// Possible errors: INVALID_ARGUMENT for non-positive counts or sizes;
// CUDA/NCCL failures (INTERNAL, UNAVAILABLE) and the ProcessGroup's errors.
absl::StatusOr<NcclOverheadResult> RunNcclOverheadBench(const NcclOverheadOptions& options);

nlohmann::json ToJson(const NcclOverheadResult& result);

}  // namespace mesh::bench
