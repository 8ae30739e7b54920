// mesh-bench dtensor-pack: the bandwidth of DTensor's local pack and unpack
// on a CUDA device, as a fraction of the device's own measured copy
// bandwidth (the physical ceiling for a copy that reads and writes the same
// memory).
//
// A Shard(1) block of a contiguous [rows, 2 * width] float32 tensor split two
// ways is not contiguous: `rows` runs of `width` elements, a row apart.
// Redistribute packs such a block into a contiguous buffer before a
// collective and unpacks received blocks into place after it, both with
// sharding::CopyStrided (cudaMemcpy2D; libmesh/src/sharding/strided_copy.h).
//
//   ceiling  CopyTensor of a contiguous block of the same bytes, device to
//            device (cudaMemcpy)
//   pack     CopyStrided(contiguous buffer <- strided block)
//   unpack   CopyStrided(strided block <- contiguous buffer)
//
// Every call returns once its copy is complete, so each sample is one call's
// wall time; calls of the three kinds alternate after a warm-up. Bandwidth
// is block bytes / time (one direction, as nccl-tests counts a copy).
//
// Without CUDA in the build or without a visible device the result says
// skipped, with the reason, and the subcommand exits 0.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "bench/latency_stats.h"

namespace mesh::bench {

struct DTensorPackOptions {
  // Block sizes in bytes (rounded down to whole rows of `width` floats).
  std::vector<int64_t> sizes = {1 << 20, 16 << 20, 64 << 20};
  // Floats per row of the block (the tensor's rows are twice as wide).
  int64_t width = 1024;
  int iterations = 20;
  int warmup = 3;
  int device = 0;
};

struct DTensorPackRow {
  int64_t bytes = 0;
  int64_t rows = 0;
  LatencyStats copy;  // The ceiling.
  LatencyStats pack;
  LatencyStats unpack;
  double copy_gbps = 0;  // bytes / p50.
  double pack_gbps = 0;
  double unpack_gbps = 0;
  double pack_fraction = 0;  // pack_gbps / copy_gbps.
  double unpack_fraction = 0;
};

struct DTensorPackResult {
  bool skipped = false;
  std::string skip_reason;
  int device = 0;
  std::vector<DTensorPackRow> rows;
};

// Possible errors: INVALID_ARGUMENT for non-positive sizes or counts; the
// errors of Tensor::Empty, CopyTensor and CopyStrided (INTERNAL for CUDA
// failures, RESOURCE_EXHAUSTED when memory runs out); INTERNAL when a
// copied block does not match its source.
absl::StatusOr<DTensorPackResult> RunDTensorPackBench(const DTensorPackOptions& options);

nlohmann::json ToJson(const DTensorPackResult& result);

}  // namespace mesh::bench
