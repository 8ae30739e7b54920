// mesh-bench progress: what collective progress tracking (mesh/progress.h,
// docs/hangs.md) adds to each collective on the host.
//
// Two groups of one rank run the same null collective: an all_reduce whose
// backend returns a Work that is already complete, so nothing but the call
// path is timed. The baseline calls that group directly; the measured path
// goes through ProgressProcessGroup, the decorator the Runtime puts around
// every group (Enter, Attach, the wrapped Work, Complete on Wait). Calls
// alternate between the two in batches; each figure is the median over the
// batches, in ns per call (issue + Wait). A heartbeat-style Snapshot of the
// group runs between batches, as the heartbeat thread would.
//
// Possible errors: INVALID_ARGUMENT for non-positive counts.
// Thread safety: RunProgressBench is not meant to run twice at once.
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace mesh::bench {

struct ProgressBenchOptions {
  int64_t calls = 2'000'000;  // Measured calls of each path, over all batches.
  int batches = 20;
};

struct ProgressBenchResult {
  double tracked_ns = 0;   // Through ProgressProcessGroup.
  double baseline_ns = 0;  // The inner group alone.
  double added_ns = 0;     // tracked - baseline.
  double ratio = 0;
  double load_average = 0;
};

absl::StatusOr<ProgressBenchResult> RunProgressBench(const ProgressBenchOptions& options);

nlohmann::json ToJson(const ProgressBenchResult& result);

}  // namespace mesh::bench
